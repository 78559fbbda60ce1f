//! Isolated latency per template and size, learned online.
//!
//! For each `(template, size)` the estimator keeps the logs of its most
//! recent isolated executions (no overlapping query) in a bounded window,
//! and separately those of lightly loaded ones (at most
//! `light_neighbours_max` neighbours), used only while no isolated one is
//! known. The estimate is the window's median: robust to the heavy tails of
//! real executions.
//!
//! Sizes it has not seen for a template are scaled from the nearest size it
//! has seen with a size-scaling exponent α (`ℓ(s) = ℓ(s₀)·(s₀/s)^α`), fitted
//! as the median over templates seen at two sizes. Templates never seen at
//! all get the median estimate of all templates at that size, or a prior.
//!
//! # Properties
//!
//! - (A) Estimates are positive and finite.
//! - (B) With one size's window full of the same value, the estimate there
//!   is that value.
//! - (C) Memory is bounded: at most `window` samples per key and kind.
//! - (D) A censored observation never lowers an estimate.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::model::{Rpu, TemplateId};
use crate::predict::Observation;
use crate::time::Duration;
use crate::recency::RecentKeys;
use crate::stats::{median, push_bounded};

/// Estimator settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct IsolatedConfig {
    /// Samples kept per key and kind.
    pub window: usize,
    /// Executions with at most this many neighbours count as lightly
    /// loaded.
    pub light_neighbours_max: u32,
    /// α before any template has been seen at two sizes.
    pub default_size_exponent: f64,
    /// Isolated latency at 16 RPU assumed before anything is observed.
    pub prior_latency_16: Duration,
    /// Observations between refits of α.
    pub refit_every: u64,
    /// Templates kept; the least recently seen beyond it is forgotten (a
    /// client chooses templates, so this bounds the memory they take).
    pub templates_max: usize,
}

impl Default for IsolatedConfig {
    fn default() -> Self {
        IsolatedConfig {
            window: 64,
            light_neighbours_max: 2,
            default_size_exponent: 0.8,
            prior_latency_16: Duration::from_secs(3),
            refit_every: 64,
            templates_max: 10_000,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Samples {
    isolated: VecDeque<f64>,
    light: VecDeque<f64>,
    /// The largest censored lower bound seen in isolation, log seconds.
    censored_floor: Option<f64>,
    /// The estimate, recomputed on each observation so that predictions
    /// (the router's hot path) only read it.
    estimate: Option<f64>,
}

impl Samples {
    fn estimate_log(&self) -> Option<f64> {
        self.estimate
    }

    fn refresh(&mut self) {
        let source = if self.isolated.is_empty() { &self.light } else { &self.isolated };
        self.estimate = (!source.is_empty()).then(|| {
            let center = median(&source.iter().copied().collect::<Vec<_>>());
            self.censored_floor.map_or(center, |floor| center.max(floor))
        });
    }
}

/// The estimator. See the module docs.
#[derive(Clone, Debug)]
pub struct IsolatedEstimator {
    config: IsolatedConfig,
    samples: HashMap<(TemplateId, Rpu), Samples>,
    /// The sizes each template has samples at, ascending.
    sizes_by_template: HashMap<TemplateId, Vec<Rpu>>,
    /// The templates with samples, least recently seen first out.
    templates: RecentKeys<TemplateId>,
    size_exponent: f64,
    observations: u64,
}

impl IsolatedEstimator {
    /// An empty estimator.
    pub fn new(config: IsolatedConfig) -> Self {
        let size_exponent = config.default_size_exponent;
        let templates = RecentKeys::new(config.templates_max);
        IsolatedEstimator { config, samples: HashMap::new(), sizes_by_template: HashMap::new(), templates, size_exponent, observations: 0 }
    }

    /// Templates forgotten to stay within `templates_max`.
    pub fn templates_evicted(&self) -> u64 {
        self.templates.evicted()
    }

    /// Templates with samples now.
    pub fn templates_held(&self) -> usize {
        self.sizes_by_template.len()
    }

    /// The current size-scaling exponent α.
    pub fn size_exponent(&self) -> f64 {
        self.size_exponent
    }

    /// Learns from one execution.
    pub fn observe(&mut self, observation: &Observation) {
        let log_latency = observation.latency.as_secs_f64().max(1e-6).ln();
        let bound = self.config.window.max(1);
        if let Some(forgotten) = self.templates.touch(&observation.template) {
            for size in self.sizes_by_template.remove(&forgotten).unwrap_or_default() {
                self.samples.remove(&(forgotten, size));
            }
        }
        let entry = self.samples.entry((observation.template, observation.size)).or_default();
        if observation.censored {
            if observation.neighbours == 0 {
                entry.censored_floor = Some(entry.censored_floor.map_or(log_latency, |f| f.max(log_latency)));
            }
        } else if observation.neighbours == 0 {
            push_bounded(&mut entry.isolated, log_latency, bound);
        } else if observation.neighbours <= self.config.light_neighbours_max {
            push_bounded(&mut entry.light, log_latency, bound);
        }
        entry.refresh();
        let sizes = self.sizes_by_template.entry(observation.template).or_default();
        if let Err(position) = sizes.binary_search(&observation.size) {
            sizes.insert(position, observation.size);
        }
        self.observations += 1;
        if self.observations % self.config.refit_every.max(1) == 0 {
            self.refit_size_exponent();
        }
    }

    /// Refits α from templates estimated at two or more sizes.
    pub fn refit_size_exponent(&mut self) {
        let mut by_template: HashMap<TemplateId, Vec<(f64, f64)>> = HashMap::new();
        for ((template, size), samples) in &self.samples {
            if let Some(log_latency) = samples.estimate_log() {
                by_template.entry(*template).or_default().push((f64::from(size.0).ln(), log_latency));
            }
        }
        let mut exponents = Vec::new();
        for points in by_template.values() {
            for (i, &(log_size_a, log_latency_a)) in points.iter().enumerate() {
                for &(log_size_b, log_latency_b) in &points[i + 1..] {
                    if (log_size_a - log_size_b).abs() > 1e-9 {
                        exponents.push((log_latency_a - log_latency_b) / (log_size_b - log_size_a));
                    }
                }
            }
        }
        if !exponents.is_empty() {
            self.size_exponent = median(&exponents).clamp(0.0, 1.5);
        }
    }

    fn scaled(&self, log_latency: f64, from: Rpu, to: Rpu) -> f64 {
        log_latency + self.size_exponent * (f64::from(from.0.max(1)).ln() - f64::from(to.0.max(1)).ln())
    }

    /// The template's estimate at `size`, if the template was ever seen.
    fn template_log(&self, template: TemplateId, size: Rpu) -> Option<f64> {
        if let Some(log_latency) = self.samples.get(&(template, size)).and_then(Samples::estimate_log) {
            return Some(log_latency);
        }
        let target = f64::from(size.0.max(1)).ln();
        self.sizes_by_template
            .get(&template)?
            .iter()
            .filter_map(|s| self.samples.get(&(template, *s)).and_then(Samples::estimate_log).map(|l| (*s, l)))
            .min_by(|(a, _), (b, _)| {
                let da = (f64::from(a.0.max(1)).ln() - target).abs();
                let db = (f64::from(b.0.max(1)).ln() - target).abs();
                da.total_cmp(&db).then(a.cmp(b))
            })
            .map(|(from, log_latency)| self.scaled(log_latency, from, size))
    }

    /// Predicted isolated latency of `template` on `size`.
    pub fn estimate(&self, template: TemplateId, size: Rpu) -> Duration {
        let log_latency = self.template_log(template, size).unwrap_or_else(|| {
            let known: Vec<f64> = self.sizes_by_template.keys().filter_map(|&t| self.template_log(t, size)).collect();
            if known.is_empty() {
                self.scaled(self.config.prior_latency_16.as_secs_f64().ln(), Rpu(16), size)
            } else {
                median(&known)
            }
        });
        Duration::from_secs_f64(log_latency.exp().clamp(1e-6, 1e7))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn obs(template: u32, size: u32, neighbours: u32, latency_s: f64, censored: bool) -> Observation {
        Observation { template: TemplateId(template), size: Rpu(size), neighbours, latency: Duration::from_secs_f64(latency_s), censored }
    }

    #[test]
    fn estimate_is_the_median_of_isolated_executions() {
        let mut e = IsolatedEstimator::new(IsolatedConfig::default());
        for latency in [9.0, 10.0, 11.0, 100.0, 1.0] {
            e.observe(&obs(1, 16, 0, latency, false));
        }
        assert!((e.estimate(TemplateId(1), Rpu(16)).as_secs_f64() - 10.0).abs() < 1e-3);
    }

    #[test]
    fn lightly_loaded_executions_count_only_until_an_isolated_one_arrives() {
        let mut e = IsolatedEstimator::new(IsolatedConfig::default());
        e.observe(&obs(1, 16, 2, 20.0, false));
        assert!((e.estimate(TemplateId(1), Rpu(16)).as_secs_f64() - 20.0).abs() < 1e-3);
        e.observe(&obs(1, 16, 0, 12.0, false));
        assert!((e.estimate(TemplateId(1), Rpu(16)).as_secs_f64() - 12.0).abs() < 1e-3);
        e.observe(&obs(1, 16, 9, 500.0, false));
        assert!((e.estimate(TemplateId(1), Rpu(16)).as_secs_f64() - 12.0).abs() < 1e-3);
    }

    #[test]
    fn size_exponent_is_fitted_and_used_for_unseen_sizes() {
        let mut e = IsolatedEstimator::new(IsolatedConfig { refit_every: 1, ..IsolatedConfig::default() });
        for t in 1..=5 {
            let base = f64::from(t) * 4.0;
            e.observe(&obs(t, 16, 0, base, false));
            e.observe(&obs(t, 32, 0, base / 2.0, false));
        }
        assert!((e.size_exponent() - 1.0).abs() < 1e-9);
        e.observe(&obs(9, 16, 0, 8.0, false));
        assert!((e.estimate(TemplateId(9), Rpu(64)).as_secs_f64() - 2.0).abs() < 1e-3);
    }

    #[test]
    fn unseen_templates_get_the_median_of_known_ones() {
        let mut e = IsolatedEstimator::new(IsolatedConfig::default());
        assert!((e.estimate(TemplateId(1), Rpu(16)).as_secs_f64() - 3.0).abs() < 1e-3, "the prior before any data");
        for (t, latency) in [(1, 1.0), (2, 4.0), (3, 16.0)] {
            e.observe(&obs(t, 16, 0, latency, false));
        }
        assert!((e.estimate(TemplateId(77), Rpu(16)).as_secs_f64() - 4.0).abs() < 1e-3);
    }

    proptest! {
        #[test]
        fn censored_observations_never_lower_an_estimate(latencies in prop::collection::vec(0.1f64..100.0, 1..20), bound in 0.1f64..200.0) {
            let mut e = IsolatedEstimator::new(IsolatedConfig::default());
            for &l in &latencies {
                e.observe(&obs(1, 16, 0, l, false));
            }
            let before = e.estimate(TemplateId(1), Rpu(16));
            e.observe(&obs(1, 16, 0, bound, true));
            let after = e.estimate(TemplateId(1), Rpu(16));
            prop_assert!(after >= before);
            prop_assert!(after.as_secs_f64().is_finite() && after > Duration::ZERO);
        }

        #[test]
        fn windows_stay_bounded(n in 1usize..500) {
            let mut e = IsolatedEstimator::new(IsolatedConfig { window: 16, ..IsolatedConfig::default() });
            for i in 0..n {
                e.observe(&obs(1, 16, (i % 3) as u32, 1.0 + i as f64, false));
            }
            let samples = &e.samples[&(TemplateId(1), Rpu(16))];
            prop_assert!(samples.isolated.len() <= 16 && samples.light.len() <= 16);
        }

        #[test]
        fn client_chosen_templates_stay_bounded_and_the_recent_ones_keep_their_estimates(templates in prop::collection::vec(0u32..1_000, 1..400)) {
            let mut e = IsolatedEstimator::new(IsolatedConfig { templates_max: 8, ..IsolatedConfig::default() });
            for (i, &t) in templates.iter().enumerate() {
                e.observe(&obs(t, 16 << (i % 2), 0, 1.0 + f64::from(t), false));
                prop_assert!(e.templates_held() <= 8);
                prop_assert!(e.samples.len() <= 16);
            }
            let last = *templates.last().unwrap();
            prop_assert!(e.samples.contains_key(&(TemplateId(last), Rpu(16 << ((templates.len() - 1) % 2)))));
        }
    }
}
