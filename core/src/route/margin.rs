//! Calibrated predictions for the SLO-aware router: it decides whether a
//! query meets its SLO on a latency **quantile**, not on the point
//! estimate, and the quantile adapts so that the violations it predicts
//! track the violations that happen.
//!
//! The router's predictor gives a point estimate. Around it, this keeps the
//! log residuals `ln(actual / predicted)` of the last `window` executions
//! the router placed and saw finish (the prediction being the query's last
//! guarded one, which counts every neighbour placed with it). The margin
//! factor is the residuals' `quantile`-th quantile, exponentiated: a query
//! "meets its SLO" when `predicted × factor ≤ SLO`.
//!
//! The quantile itself is steered by what happens: per finished query, the
//! gap between "it missed" and "it was predicted, at placement, to miss" is
//! smoothed; while misses outrun the predictions by more than `tolerance`,
//! the quantile steps up (placements turn more cautious and spread load);
//! while predictions outrun the misses, it steps down (the router packs
//! queries more cheaply). Realised VR then tracks predicted VR.
//!
//! # Properties
//!
//! - (A) Until `min_samples` residuals are in, the factor is 1: the point
//!   estimate decides.
//! - (B) The quantile stays within `[quantile_min, quantile_max]`, and the
//!   factor is the residuals' quantile at it.
//! - (C) The quantile rises only while the smoothed gap (misses minus
//!   predicted misses) is above `tolerance`, and falls only while it is
//!   below `−tolerance`; an unpredicted miss never lowers the gap, and a
//!   false alarm never raises it.
//! - (D) Deterministic: the same completions in the same order give the same
//!   factor.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::time::Duration;

/// The margin's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MarginConfig {
    /// Residuals kept.
    pub window: usize,
    /// Residuals before the margin applies.
    pub min_samples: usize,
    /// The quantile it starts at.
    pub quantile_start: f64,
    /// The lowest quantile.
    pub quantile_min: f64,
    /// The highest quantile.
    pub quantile_max: f64,
    /// Step up per finished query while misses outrun predictions.
    pub step_up: f64,
    /// Step down per finished query while predictions outrun misses.
    pub step_down: f64,
    /// The gap (realised − predicted miss rate) tolerated either way.
    pub tolerance: f64,
    /// Weight of each finished query in the smoothed gap.
    pub gap_smoothing: f64,
}

impl Default for MarginConfig {
    fn default() -> Self {
        MarginConfig {
            window: 512,
            min_samples: 32,
            quantile_start: 0.6,
            quantile_min: 0.5,
            quantile_max: 0.95,
            step_up: 0.02,
            step_down: 0.005,
            tolerance: 0.01,
            gap_smoothing: 1.0 / 64.0,
        }
    }
}

/// What the margin has learned, for reports and the admin API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarginState {
    /// The quantile decisions are made at.
    pub quantile: f64,
    /// The factor on the point estimate.
    pub factor: f64,
    /// Residuals held.
    pub samples: usize,
    /// Finished queries seen.
    pub finished: u64,
    /// Of which predicted, at placement, to miss their SLO.
    pub predicted_misses: u64,
    /// Of which missed.
    pub realised_misses: u64,
}

impl MarginState {
    /// Predicted misses over finished queries.
    pub fn predicted_violation_rate(&self) -> f64 {
        self.predicted_misses as f64 / self.finished.max(1) as f64
    }

    /// Realised misses over finished queries.
    pub fn realised_violation_rate(&self) -> f64 {
        self.realised_misses as f64 / self.finished.max(1) as f64
    }
}

/// The adaptive margin. See the module docs.
#[derive(Clone, Debug)]
pub struct SloMargin {
    config: MarginConfig,
    log_residuals: VecDeque<f64>,
    quantile: f64,
    factor: f64,
    gap: f64,
    finished: u64,
    predicted_misses: u64,
    realised_misses: u64,
}

impl Default for SloMargin {
    fn default() -> Self {
        SloMargin::new(MarginConfig::default())
    }
}

impl SloMargin {
    /// A margin with `config`, nothing learned.
    pub fn new(config: MarginConfig) -> Self {
        let quantile = config.quantile_start.clamp(config.quantile_min, config.quantile_max);
        SloMargin { config, log_residuals: VecDeque::new(), quantile, factor: 1.0, gap: 0.0, finished: 0, predicted_misses: 0, realised_misses: 0 }
    }

    /// The factor on the point estimate.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// `predicted` at the decision quantile.
    pub fn at_quantile(&self, predicted: Duration) -> Duration {
        predicted.mul_f64(self.factor)
    }

    /// The state.
    pub fn state(&self) -> MarginState {
        MarginState {
            quantile: self.quantile,
            factor: self.factor,
            samples: self.log_residuals.len(),
            finished: self.finished,
            predicted_misses: self.predicted_misses,
            realised_misses: self.realised_misses,
        }
    }

    /// Learns from one finished query: its last point prediction, what it
    /// took, whether that is only a lower bound (timed out), whether it was
    /// predicted at placement to miss, and whether it missed.
    pub fn handle_finished(&mut self, predicted: Duration, actual: Duration, censored: bool, predicted_miss: bool, missed: bool) {
        self.finished += 1;
        self.predicted_misses += u64::from(predicted_miss);
        self.realised_misses += u64::from(missed);
        let w = self.config.gap_smoothing;
        self.gap = (1.0 - w) * self.gap + w * (f64::from(u8::from(missed)) - f64::from(u8::from(predicted_miss)));
        if self.gap > self.config.tolerance {
            self.quantile = (self.quantile + self.config.step_up).min(self.config.quantile_max);
        } else if self.gap < -self.config.tolerance {
            self.quantile = (self.quantile - self.config.step_down).max(self.config.quantile_min);
        }
        let (p, a) = (predicted.as_secs_f64(), actual.as_secs_f64());
        // A censored run is a lower bound; keep it (it only makes the
        // margin more cautious) unless it says nothing.
        if p > 0.0 && a > 0.0 && (!censored || a > p) {
            if self.log_residuals.len() == self.config.window {
                self.log_residuals.pop_front();
            }
            self.log_residuals.push_back((a / p).ln());
        }
        self.refresh();
    }

    fn refresh(&mut self) {
        if self.log_residuals.len() < self.config.min_samples.max(1) {
            self.factor = 1.0;
            return;
        }
        let mut values: Vec<f64> = self.log_residuals.iter().copied().collect();
        let rank = ((values.len() - 1) as f64 * self.quantile).round() as usize;
        let (_, value, _) = values.select_nth_unstable_by(rank, f64::total_cmp);
        self.factor = value.exp();
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn the_point_estimate_decides_until_enough_residuals() {
        let mut margin = SloMargin::default();
        for _ in 0..31 {
            margin.handle_finished(s(10.0), s(20.0), false, false, false);
        }
        assert_eq!(margin.factor(), 1.0);
        margin.handle_finished(s(10.0), s(20.0), false, false, false);
        assert!((margin.factor() - 2.0).abs() < 1e-9, "{}", margin.factor());
    }

    #[test]
    fn unpredicted_misses_raise_the_quantile_and_false_alarms_lower_it() {
        let mut margin = SloMargin::default();
        let start = margin.state().quantile;
        for i in 0..200 {
            // Residuals spread between 0.5× and 2×.
            let actual = 5.0 + 15.0 * f64::from(i % 10) / 9.0;
            margin.handle_finished(s(10.0), s(actual), false, false, i % 4 == 0);
        }
        let raised = margin.state();
        assert!(raised.quantile > start && raised.factor > 1.5, "{raised:?}");
        for i in 0..400 {
            let actual = 5.0 + 15.0 * f64::from(i % 10) / 9.0;
            margin.handle_finished(s(10.0), s(actual), false, true, false);
        }
        let lowered = margin.state();
        assert!(lowered.quantile < raised.quantile && lowered.factor < raised.factor, "{lowered:?}");
        assert_eq!(lowered.finished, 600);
    }

    proptest! {
        #[test]
        fn quantile_stays_in_bounds_and_responds_in_the_right_direction(
            events in prop::collection::vec((0.1f64..100.0, 0.1f64..100.0, any::<bool>(), any::<bool>()), 1..300),
        ) {
            let mut margin = SloMargin::default();
            let mut twin = SloMargin::default();
            let config = MarginConfig::default();
            for &(predicted, actual, predicted_miss, missed) in &events {
                let (before, gap_before) = (margin.state().quantile, margin.gap);
                margin.handle_finished(s(predicted), s(actual), false, predicted_miss, missed);
                twin.handle_finished(s(predicted), s(actual), false, predicted_miss, missed);
                let (after, gap) = (margin.state().quantile, margin.gap);
                // (B)
                prop_assert!((config.quantile_min..=config.quantile_max).contains(&after));
                // (C)
                if after > before {
                    prop_assert!(gap > config.tolerance);
                }
                if after < before {
                    prop_assert!(gap < -config.tolerance);
                }
                if missed && !predicted_miss {
                    prop_assert!(gap >= gap_before - 1e-12);
                }
                if predicted_miss && !missed {
                    prop_assert!(gap <= gap_before + 1e-12);
                }
                // (A)
                if margin.state().samples < config.min_samples {
                    prop_assert_eq!(margin.factor(), 1.0);
                }
            }
            // (D)
            prop_assert_eq!(margin.factor(), twin.factor());
        }
    }
}
