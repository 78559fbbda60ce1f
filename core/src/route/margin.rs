//! Calibrated predictions for the SLO-aware router: it decides whether a
//! query meets its SLO on a latency **quantile**, not on the point
//! estimate, and the quantile adapts so that the violations it predicts
//! track the violations that happen.
//!
//! The router's predictor gives a point estimate. Around it, this keeps the
//! log residuals `ln(actual / predicted)` of the last `window` executions
//! the router placed and saw finish (the prediction being the one made at
//! placement, as a new query's is: its error includes the neighbours that
//! came later), all together and by the load the prediction was made at (the neighbour count, in four
//! buckets: a packed cluster's predictions miss by more). The margin factor
//! is the residuals' `quantile`-th quantile, exponentiated, from the
//! prediction's load bucket once it has `min_samples` residuals, else from
//! all: a query "meets its SLO" when `predicted × factor ≤ SLO`.
//!
//! The same residuals give each placement's **miss probability**
//! ([`SloMargin::miss_probability`]): the share of residuals that would
//! carry the query past its SLO. The router adds them up into expected
//! violations, so that a placement that brings a running query close to
//! its SLO counts for something before it crosses it.
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
//! - (E) A miss probability lies in `[0, 1]`, never decreases as the
//!   prediction grows, and is 0 or 1 until the margin applies.
//! - (D) Deterministic: the same completions in the same order give the same
//!   factor.
//! - (F) A miss probability is exactly the share of the spread's residuals
//!   above `ln(slo / predicted)` (the shortcuts past either end of the
//!   spread, with and without the log, and the search by blocks instead of
//!   bisection, change only how fast it is found).

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

/// How far past `e^residual` a ratio must lie for its log to be surely on
/// that side of the residual: far more than `exp`'s and `ln`'s rounding
/// (an ulp or so, below 1e-13 for any residual under 500 in size).
const RATIO_SURE: f64 = 1e-9;

/// Residuals per block of a spread's search index.
const BLOCK: usize = 16;

/// A window of log residuals, in arrival order and sorted.
#[derive(Clone, Debug)]
struct Spread {
    in_order: VecDeque<f64>,
    sorted: Vec<f64>,
    /// Every [`BLOCK`]-th of `sorted`, the last of each full block: a
    /// search scans these, then one block, instead of bisecting (each
    /// step of a bisection waits on the load before it).
    block_ends: Vec<f64>,
    /// A ratio at or above this has its log surely at or above every
    /// residual ([`RATIO_SURE`] past `e^highest`); NaN while empty.
    ratio_clear_of_all: f64,
    /// A ratio below this has its log surely below every residual; NaN
    /// while empty.
    ratio_short_of_all: f64,
}

impl Default for Spread {
    fn default() -> Self {
        Spread { in_order: VecDeque::new(), sorted: Vec::new(), block_ends: Vec::new(), ratio_clear_of_all: f64::NAN, ratio_short_of_all: f64::NAN }
    }
}

impl Spread {
    fn push(&mut self, residual: f64, window: usize) {
        let full = self.in_order.len() >= window.max(1);
        self.in_order.push_back(residual);
        let insert_at = self.sorted.partition_point(|&r| r < residual);
        let oldest = if full { self.in_order.pop_front() } else { None };
        match oldest {
            Some(oldest) => {
                // The oldest leaves and the newest enters: only the
                // residuals between the two places move, by one, and only
                // the blocks holding them change their last residual.
                let removed_at = self.sorted.partition_point(|&r| r < oldest);
                let insert_at = if removed_at < insert_at { insert_at - 1 } else { insert_at };
                let (low, high) = (removed_at.min(insert_at), removed_at.max(insert_at));
                if removed_at < insert_at {
                    self.sorted.copy_within(removed_at + 1..=insert_at, removed_at);
                } else {
                    self.sorted.copy_within(insert_at..removed_at, insert_at + 1);
                }
                self.sorted[insert_at] = residual;
                for block in low / BLOCK..=high / BLOCK {
                    if let Some(end) = self.block_ends.get_mut(block) {
                        *end = self.sorted[block * BLOCK + BLOCK - 1];
                    }
                }
            }
            None => {
                self.sorted.insert(insert_at, residual);
                self.block_ends.clear();
                self.block_ends.extend(self.sorted.chunks_exact(BLOCK).map(|block| block[BLOCK - 1]));
            }
        }
        let (lowest, highest) = (self.sorted[0], self.sorted[self.sorted.len() - 1]);
        self.ratio_clear_of_all = highest.exp() * (1.0 + RATIO_SURE);
        self.ratio_short_of_all = lowest.exp() * (1.0 - RATIO_SURE);
    }

    fn len(&self) -> usize {
        self.sorted.len()
    }

    fn quantile(&self, q: f64) -> f64 {
        self.sorted[((self.sorted.len() - 1) as f64 * q).round() as usize]
    }

    /// The share of residuals above `(numerator / denominator).ln()`, for
    /// a positive `denominator`.
    fn share_above_log_of(&self, numerator: f64, denominator: f64) -> f64 {
        // Most ratios a router asks about lie well past either end (a
        // prediction far within its SLO, or far past it): answered without
        // the division or the log, as they would be (the ends' slack is
        // far wider than the product's rounding).
        if numerator >= denominator * self.ratio_clear_of_all {
            return 0.0;
        }
        if numerator < denominator * self.ratio_short_of_all {
            return 1.0;
        }
        self.share_above((numerator / denominator).ln())
    }

    /// The share of residuals above `threshold`.
    fn share_above(&self, threshold: f64) -> f64 {
        // Past either end, answered without the search.
        match (self.sorted.first(), self.sorted.last()) {
            (_, Some(&highest)) if highest <= threshold => return 0.0,
            (Some(&lowest), _) if lowest > threshold => return 1.0,
            _ => {}
        }
        // The residuals at or below the threshold are a prefix of `sorted`:
        // the full blocks whose last one is, then part of the next block.
        let blocks = self.block_ends.iter().filter(|&&r| r <= threshold).count();
        let start = blocks * BLOCK;
        let within = start + self.sorted[start..(start + BLOCK).min(self.sorted.len())].iter().filter(|&&r| r <= threshold).count();
        (self.sorted.len() - within) as f64 / self.sorted.len() as f64
    }
}

/// Load buckets of the spread, by the neighbour count a prediction was
/// made at (inclusive upper bounds): a packed cluster's predictions miss by
/// more than an idle one's.
const LOAD_BUCKET_UPPER: [u32; 4] = [0, 2, 6, u32::MAX];

fn load_bucket(neighbours: u32) -> usize {
    LOAD_BUCKET_UPPER.iter().position(|&upper| neighbours <= upper).expect("the last bucket is unbounded")
}

/// The adaptive margin. See the module docs.
#[derive(Clone, Debug)]
pub struct SloMargin {
    config: MarginConfig,
    /// Every residual.
    global: Spread,
    /// The same by load bucket; a bucket with too few falls back to
    /// `global`.
    by_load: [Spread; LOAD_BUCKET_UPPER.len()],
    quantile: f64,
    /// [`SloMargin::factor`] by load bucket, kept current by every update:
    /// the router asks for it for every running query of every candidate,
    /// which computed the same quantile and `exp` each time.
    factors: [f64; LOAD_BUCKET_UPPER.len()],
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
        let factors = [1.0; LOAD_BUCKET_UPPER.len()];
        SloMargin { config, global: Spread::default(), by_load: Default::default(), quantile, factors, gap: 0.0, finished: 0, predicted_misses: 0, realised_misses: 0 }
    }

    /// Recomputes [`SloMargin::factors`] after the spreads or the quantile
    /// changed.
    fn refresh_factors(&mut self) {
        for (bucket, &upper) in LOAD_BUCKET_UPPER.iter().enumerate() {
            self.factors[bucket] = self.spread(upper).map_or(1.0, |spread| spread.quantile(self.quantile).exp());
        }
    }

    /// The spread that applies to a prediction made at `neighbours`, if
    /// any has enough residuals.
    fn spread(&self, neighbours: u32) -> Option<&Spread> {
        let enough = self.config.min_samples.max(1);
        let bucket = &self.by_load[load_bucket(neighbours)];
        if bucket.len() >= enough {
            Some(bucket)
        } else if self.global.len() >= enough {
            Some(&self.global)
        } else {
            None
        }
    }

    /// The factor on a point estimate made at `neighbours`: the spread's
    /// residual at the decision quantile, exponentiated; 1 until the margin
    /// applies.
    pub fn factor(&self, neighbours: u32) -> f64 {
        self.factors[load_bucket(neighbours)]
    }

    /// `predicted` (made at `neighbours`) at the decision quantile.
    pub fn at_quantile(&self, predicted: Duration, neighbours: u32) -> Duration {
        predicted.mul_f64(self.factor(neighbours))
    }

    /// The probability that a query predicted (point estimate, at
    /// `neighbours`) at `predicted` takes longer than `slo`: the share of
    /// residuals that would carry it past, once the margin applies; before,
    /// 1 if the point estimate is past the SLO and 0 if not.
    pub fn miss_probability(&self, predicted: Duration, slo: Duration, neighbours: u32) -> f64 {
        let Some(spread) = self.spread(neighbours) else { return f64::from(u8::from(predicted > slo)) };
        if predicted == Duration::ZERO {
            return 0.0;
        }
        spread.share_above_log_of(slo.as_micros() as f64, predicted.as_micros() as f64)
    }

    /// Residuals it keeps (all loads together).
    pub fn window(&self) -> usize {
        self.config.window
    }

    /// The state.
    pub fn state(&self) -> MarginState {
        MarginState {
            quantile: self.quantile,
            factor: if self.global.len() >= self.config.min_samples.max(1) { self.global.quantile(self.quantile).exp() } else { 1.0 },
            samples: self.global.len(),
            finished: self.finished,
            predicted_misses: self.predicted_misses,
            realised_misses: self.realised_misses,
        }
    }

    /// Learns the spread alone from a past execution (a warm start from the
    /// execution log): its point prediction now at `neighbours`, and what
    /// it took. The miss counts and the quantile are left as they are.
    pub fn handle_past_execution(&mut self, predicted: Duration, actual: Duration, neighbours: u32) {
        self.push_residual(predicted, actual, false, neighbours);
        self.refresh_factors();
    }

    /// Learns from one finished query: its last point prediction and the
    /// neighbour count it was made at, what it took, whether that is only a
    /// lower bound (timed out), whether it was predicted at placement to
    /// miss, and whether it missed.
    pub fn handle_finished(&mut self, predicted: Duration, neighbours: u32, actual: Duration, censored: bool, predicted_miss: bool, missed: bool) {
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
        self.push_residual(predicted, actual, censored, neighbours);
        self.refresh_factors();
    }

    fn push_residual(&mut self, predicted: Duration, actual: Duration, censored: bool, neighbours: u32) {
        let (p, a) = (predicted.as_secs_f64(), actual.as_secs_f64());
        // A censored run is a lower bound; keep it (it only makes the
        // margin more cautious) unless it says nothing.
        if p > 0.0 && a > 0.0 && (!censored || a > p) {
            let residual = (a / p).ln();
            self.global.push(residual, self.config.window);
            self.by_load[load_bucket(neighbours)].push(residual, self.config.window / 2);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Denominators (microseconds) a ratio is asked with in the tests.
    const DENOMINATORS: [f64; 4] = [1.0, 37_501.0, 1e6, 3.3e9];

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn the_point_estimate_decides_until_enough_residuals() {
        let mut margin = SloMargin::default();
        for _ in 0..31 {
            margin.handle_finished(s(10.0), 0, s(20.0), false, false, false);
        }
        assert_eq!(margin.factor(0), 1.0);
        margin.handle_finished(s(10.0), 0, s(20.0), false, false, false);
        assert!((margin.factor(0) - 2.0).abs() < 1e-9, "{}", margin.factor(0));
        assert!((margin.factor(9) - 2.0).abs() < 1e-9, "a bucket with too few residuals falls back to all of them");
    }

    #[test]
    fn unpredicted_misses_raise_the_quantile_and_false_alarms_lower_it() {
        let mut margin = SloMargin::default();
        let start = margin.state().quantile;
        for i in 0..200 {
            // Residuals spread between 0.5× and 2×.
            let actual = 5.0 + 15.0 * f64::from(i % 10) / 9.0;
            margin.handle_finished(s(10.0), 0, s(actual), false, false, i % 4 == 0);
        }
        let raised = margin.state();
        assert!(raised.quantile > start && raised.factor > 1.5, "{raised:?}");
        for i in 0..400 {
            let actual = 5.0 + 15.0 * f64::from(i % 10) / 9.0;
            margin.handle_finished(s(10.0), 0, s(actual), false, true, false);
        }
        let lowered = margin.state();
        assert!(lowered.quantile < raised.quantile && lowered.factor < raised.factor, "{lowered:?}");
        assert_eq!(lowered.finished, 600);
    }

    proptest! {
        #[test]
        fn the_share_above_a_threshold_is_the_share_of_residuals_above_it(
            residuals in prop::collection::vec(prop_oneof![-3.0f64..3.0, Just(0.0), Just(0.5)], 1..700),
            window in 1usize..600,
            thresholds in prop::collection::vec(prop_oneof![-4.0f64..4.0, Just(0.0), Just(0.5), Just(f64::NEG_INFINITY), Just(f64::NAN)], 1..40),
        ) {
            let mut spread = Spread::default();
            for (pushed, &residual) in residuals.iter().enumerate() {
                spread.push(residual, window);
                let mut sorted: Vec<f64> = spread.in_order.iter().copied().collect();
                sorted.sort_by(f64::total_cmp);
                prop_assert_eq!(spread.sorted.iter().map(|r| r.to_bits()).collect::<Vec<_>>(), sorted.iter().map(|r| r.to_bits()).collect::<Vec<_>>());
                let ends: Vec<f64> = sorted.chunks_exact(BLOCK).map(|block| block[BLOCK - 1]).collect();
                prop_assert_eq!(&spread.block_ends, &ends);
                // (F), after every push, thresholds inside the spread and
                // past either end alike.
                for &threshold in &thresholds {
                    let within = spread.in_order.iter().filter(|&&r| r <= threshold).count();
                    let share = (spread.len() - within) as f64 / spread.len() as f64;
                    prop_assert_eq!(spread.share_above(threshold).to_bits(), share.to_bits(), "after {} pushes, threshold {}", pushed + 1, threshold);
                }
                // ... and asked by a ratio's two terms, as its log would be.
                for ratio in thresholds.iter().map(|t| t.exp()).chain([0.0, f64::INFINITY, f64::NAN]) {
                    for denominator in DENOMINATORS {
                        let numerator = ratio * denominator;
                        prop_assert_eq!(spread.share_above_log_of(numerator, denominator).to_bits(), spread.share_above((numerator / denominator).ln()).to_bits(), "{} / {}", numerator, denominator);
                    }
                }
            }
            // Ratios a hair from each end's exponential, where the
            // shortcut must hand over to the log.
            let ends = [spread.sorted[0], spread.sorted[spread.len() - 1]];
            for ratio in ends.iter().flat_map(|&r| [1.0, 1.0 + 1e-15, 1.0 - 1e-15, 1.0 + 2e-9, 1.0 - 2e-9].map(|f| r.exp() * f)) {
                for denominator in DENOMINATORS {
                    let numerator = ratio * denominator;
                    prop_assert_eq!(spread.share_above_log_of(numerator, denominator).to_bits(), spread.share_above((numerator / denominator).ln()).to_bits(), "{} / {}", numerator, denominator);
                }
            }
        }

        #[test]
        fn quantile_stays_in_bounds_and_responds_in_the_right_direction(
            events in prop::collection::vec((0.1f64..100.0, 0.1f64..100.0, any::<bool>(), any::<bool>(), 0u32..12), 1..300),
        ) {
            let mut margin = SloMargin::default();
            let mut twin = SloMargin::default();
            let config = MarginConfig::default();
            for &(predicted, actual, predicted_miss, missed, neighbours) in &events {
                let (before, gap_before) = (margin.state().quantile, margin.gap);
                margin.handle_finished(s(predicted), neighbours, s(actual), false, predicted_miss, missed);
                twin.handle_finished(s(predicted), neighbours, s(actual), false, predicted_miss, missed);
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
                    prop_assert_eq!(margin.factor(neighbours), 1.0);
                }
                // (B): the kept factor is the spread's quantile at every load.
                for load in 0..12 {
                    let fresh = margin.spread(load).map_or(1.0, |spread| spread.quantile(margin.quantile).exp());
                    prop_assert_eq!(margin.factor(load), fresh);
                }
            }
            // (D)
            prop_assert_eq!(margin.factor(3), twin.factor(3));
            // (E)
            let mut last = 0.0;
            for predicted in [0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 200.0] {
                let p = margin.miss_probability(s(predicted), s(10.0), 1);
                prop_assert!((0.0..=1.0).contains(&p) && p >= last);
                if margin.state().samples < config.min_samples {
                    prop_assert!(p == 0.0 || p == 1.0);
                }
                last = p;
            }
        }
    }
}
