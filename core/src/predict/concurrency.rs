//! The concurrency-aware predictor: isolated latency stretched by a learned
//! slowdown curve of the number of overlapping queries, per cluster size.
//!
//! For each size it keeps a bounded buffer of recent executions. A fit
//! computes each one's log slowdown against the current isolated estimate,
//! takes the median per neighbour bin, and makes the curve monotone
//! (pool-adjacent-violators, weighted by bin counts): more neighbours never
//! predict a faster query. Predictions interpolate the curve in
//! `log(1 + neighbours)`; sizes without data use the nearest size that has
//! some. Censored executions enter with their lower bound, which keeps
//! overload from looking cheaper than it is.
//!
//! # Properties
//!
//! - (A) For a fixed template and size, the prediction never decreases as
//!   the neighbour count grows.
//! - (B) With no concurrency data, predictions equal the isolated estimate
//!   times a prior curve `1 + neighbours / 2`.
//! - (C) Memory is bounded by `per_size_window` executions per size.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::model::{Rpu, TemplateId};
use crate::predict::isolated::{IsolatedConfig, IsolatedEstimator};
use crate::predict::{LatencyPredictor, Observation};
use crate::time::Duration;
use crate::stats::median;

/// Neighbour bins: inclusive upper bounds.
const BIN_UPPER: [u32; 15] = [0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, u32::MAX];

fn bin_of(neighbours: u32) -> usize {
    BIN_UPPER.iter().position(|&upper| neighbours <= upper).expect("the last bin is unbounded")
}

/// Predictor settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// The isolated estimator's settings.
    pub isolated: IsolatedConfig,
    /// Executions kept per size for fitting the slowdown curve.
    pub per_size_window: usize,
    /// Observations between refits.
    pub refit_every: u64,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig { isolated: IsolatedConfig::default(), per_size_window: 8_192, refit_every: 256 }
    }
}

/// A fitted curve: `(log(1 + neighbours), log slowdown)` points, increasing.
#[derive(Clone, Debug, Default, PartialEq)]
struct Curve {
    points: Vec<(f64, f64)>,
}

impl Curve {
    fn log_slowdown(&self, neighbours: u32) -> f64 {
        let x = f64::from(neighbours).ln_1p();
        match self.points.as_slice() {
            [] => (1.0 + f64::from(neighbours) / 2.0).ln(),
            [only] => only.1,
            points => {
                if x <= points[0].0 {
                    return points[0].1;
                }
                for pair in points.windows(2) {
                    let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
                    if x <= x1 {
                        return y0 + (y1 - y0) * (x - x0) / (x1 - x0).max(1e-12);
                    }
                }
                points[points.len() - 1].1
            }
        }
    }
}

/// See the module docs.
#[derive(Clone, Debug)]
pub struct ConcurrencyAware {
    config: ConcurrencyConfig,
    isolated: IsolatedEstimator,
    executions: BTreeMap<Rpu, VecDeque<Observation>>,
    curves: BTreeMap<Rpu, Curve>,
    observations: u64,
}

impl ConcurrencyAware {
    /// An untrained predictor.
    pub fn new(config: ConcurrencyConfig) -> Self {
        let isolated = IsolatedEstimator::new(config.isolated.clone());
        ConcurrencyAware { config, isolated, executions: BTreeMap::new(), curves: BTreeMap::new(), observations: 0 }
    }

    /// Refits the isolated size exponent and every size's slowdown curve.
    pub fn fit(&mut self) {
        self.isolated.refit_size_exponent();
        let mut curves = BTreeMap::new();
        for (size, executions) in &self.executions {
            let mut bins: Vec<Vec<f64>> = vec![Vec::new(); BIN_UPPER.len()];
            for e in executions {
                let isolated = self.isolated.estimate(e.template, e.size).as_secs_f64();
                let log_slowdown = (e.latency.as_secs_f64().max(1e-6) / isolated).ln();
                bins[bin_of(e.neighbours)].push(log_slowdown);
            }
            // (x, y, weight) per non-empty bin, then pool adjacent violators.
            let mut blocks: Vec<(f64, f64, f64)> = Vec::new();
            for (index, values) in bins.iter().enumerate() {
                if values.is_empty() {
                    continue;
                }
                let lower = if index == 0 { 0 } else { BIN_UPPER[index - 1] + 1 };
                let upper = BIN_UPPER[index].min(lower.saturating_mul(2).max(lower + 1));
                let x = (f64::from(lower) + f64::from(upper)) / 2.0;
                blocks.push((x.ln_1p(), median(values), values.len() as f64));
                while blocks.len() >= 2 && blocks[blocks.len() - 2].1 > blocks[blocks.len() - 1].1 {
                    let (x1, y1, w1) = blocks.pop().expect("two blocks");
                    let (x0, y0, w0) = blocks.pop().expect("two blocks");
                    let w = w0 + w1;
                    blocks.push(((x0 * w0 + x1 * w1) / w, (y0 * w0 + y1 * w1) / w, w));
                }
            }
            curves.insert(*size, Curve { points: blocks.into_iter().map(|(x, y, _)| (x, y)).collect() });
        }
        self.curves = curves;
    }

    fn curve(&self, size: Rpu) -> Option<&Curve> {
        if let Some(curve) = self.curves.get(&size) {
            return Some(curve);
        }
        let target = f64::from(size.0.max(1)).ln();
        self.curves
            .iter()
            .min_by(|(a, _), (b, _)| {
                let da = (f64::from(a.0.max(1)).ln() - target).abs();
                let db = (f64::from(b.0.max(1)).ln() - target).abs();
                da.total_cmp(&db).then(a.cmp(b))
            })
            .map(|(_, curve)| curve)
    }
}

impl LatencyPredictor for ConcurrencyAware {
    fn name(&self) -> &str {
        "concurrency-aware"
    }

    fn observe(&mut self, observation: &Observation) {
        self.isolated.observe(observation);
        let window = self.executions.entry(observation.size).or_default();
        if window.len() == self.config.per_size_window.max(1) {
            window.pop_front();
        }
        window.push_back(*observation);
        self.observations += 1;
        if self.observations % self.config.refit_every.max(1) == 0 {
            self.fit();
        }
    }

    fn isolated(&self, template: TemplateId, size: Rpu) -> Duration {
        self.isolated.estimate(template, size)
    }

    fn predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> Duration {
        let isolated = self.isolated.estimate(template, size);
        let log_slowdown = self.curve(size).map_or_else(|| Curve::default().log_slowdown(neighbours), |c| c.log_slowdown(neighbours));
        isolated.mul_f64(log_slowdown.exp())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn obs(template: u32, size: u32, neighbours: u32, latency_s: f64) -> Observation {
        Observation { template: TemplateId(template), size: Rpu(size), neighbours, latency: Duration::from_secs_f64(latency_s), censored: false }
    }

    #[test]
    fn learns_how_latency_stretches_with_neighbours() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for t in 1..=20 {
            let base = f64::from(t);
            p.observe(&obs(t, 16, 0, base));
            for n in [1, 4, 16] {
                p.observe(&obs(t, 16, n, base * (1.0 + f64::from(n))));
            }
        }
        p.fit();
        let alone = p.predict(TemplateId(3), Rpu(16), 0).as_secs_f64();
        let crowded = p.predict(TemplateId(3), Rpu(16), 16).as_secs_f64();
        assert!((alone - 3.0).abs() < 0.05, "{alone}");
        assert!((crowded / alone - 17.0).abs() < 1.0, "{crowded}");
    }

    #[test]
    fn without_concurrency_data_the_prior_curve_applies() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        p.observe(&obs(1, 16, 0, 2.0));
        assert!((p.predict(TemplateId(1), Rpu(16), 4).as_secs_f64() - 2.0 * 3.0).abs() < 1e-3);
    }

    proptest! {
        #[test]
        fn predictions_never_fall_as_neighbours_grow(points in prop::collection::vec((1u32..5, 0u32..200, 0.1f64..500.0), 1..300)) {
            let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
            for &(t, n, l) in &points {
                p.observe(&obs(t, 16, n, l));
            }
            p.fit();
            let mut last = Duration::ZERO;
            for n in 0..300 {
                let predicted = p.predict(TemplateId(1), Rpu(16), n);
                prop_assert!(predicted + Duration::from_micros(1) >= last, "n={} {} < {}", n, predicted, last);
                last = predicted;
            }
        }
    }
}
