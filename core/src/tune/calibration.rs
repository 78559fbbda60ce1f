//! What the planner's warehouse learns about the cluster beyond the
//! predictor's curve, from observed executions: the admission queue and
//! the spread of latencies around the predictions.
//!
//! **Admission.** A warehouse's workload manager executes at most a few
//! queries at once per cluster and queues the rest in arrival order
//! (Redshift's WLM slots). That queue, not processor sharing, is what makes
//! a short query late behind long ones, so a planner that shares the
//! cluster among all its queries is optimistic exactly where SLOs are
//! tight. The warehouse reports how long each query queued before it
//! started; a query placed while `n` others were on its cluster queues only
//! if `n` is at least the slot count `k`. [`AdmissionModel::learn`] takes,
//! for each size, the `k` whose rule "queued iff `n ≥ k`" misclassifies the
//! fewest placements, or no limit if that rule does better still (short
//! queries that skip the queue and queries whose neighbours were about to
//! finish are the rule's honest errors). The planner has no short-query
//! lane: one learned from those skips was tried and measured worse (see
//! `slogate eval planner-fidelity`).
//!
//! **Residuals.** The router places a query where its predicted latency
//! just fits the SLO at the lowest cost, so a planner that runs every query
//! at exactly its prediction sees those placements all succeed, while in
//! the warehouse about half of them run long. [`ResidualModel::learn`]
//! keeps the quantiles of `actual / predicted` over executions that had
//! their cluster to themselves from arrival to finish (so neither the queue
//! nor a neighbour's slowdown, which the planner models, is counted twice:
//! with every execution that merely started alone, the spread came out
//! wider and the planner pessimistic, see `slogate eval
//! planner-fidelity`); the planner's warehouse
//! stretches each query's work by a factor drawn from them, a pure function
//! of the query's id.
//!
//! # Properties
//!
//! - (A) A size with fewer than [`MIN_QUEUED`] queued placements is
//!   unlimited: the planner's warehouse then shares the cluster among all
//!   its queries.
//! - (B) A learned slot count is at least 1, and no other count (nor no
//!   limit) misclassifies fewer of its size's placements.
//! - (C) Samples are order-independent: any permutation learns the same
//!   model.
//! - (D) With no residuals learned every factor is 1; otherwise every
//!   factor lies between the smallest and largest residual observed, and
//!   the same query id always draws the same factor.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{QueryId, Rpu};
use crate::predict::LatencyPredictor;
use crate::reservoir::ExecutionRecord;
use crate::time::Duration;

/// One observed placement: on a cluster of `size` with `neighbours` others
/// placed there, the query queued for `queued` before it started.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdmissionSample {
    /// The cluster's size.
    pub size: Rpu,
    /// Queries on the cluster when it was placed.
    pub neighbours: u32,
    /// From placement to start.
    pub queued: Duration,
}

/// A placement that queued at least this long counts as queued (a
/// workload manager's bookkeeping takes a few milliseconds even with a
/// free slot).
pub const QUEUED_AT_LEAST: Duration = Duration::from_millis(500);

/// Queued placements a size needs before it can have a limit.
pub const MIN_QUEUED: usize = 8;

/// Executing slots per cluster size, learned (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct AdmissionModel {
    /// Slots per size; a size not here is unlimited.
    pub slots: BTreeMap<Rpu, u32>,
}

impl AdmissionModel {
    /// Learns the slot count of every size in `samples`.
    pub fn learn<'a>(samples: impl IntoIterator<Item = &'a AdmissionSample>) -> Self {
        // size → neighbours → (placements, queued).
        let mut counts: BTreeMap<Rpu, BTreeMap<u32, (usize, usize)>> = BTreeMap::new();
        for sample in samples {
            let entry = counts.entry(sample.size).or_default().entry(sample.neighbours).or_default();
            entry.0 += 1;
            entry.1 += usize::from(sample.queued >= QUEUED_AT_LEAST);
        }
        let slots = counts.into_iter().filter_map(|(size, by_neighbours)| Some((size, best_slots(&by_neighbours)?))).collect();
        AdmissionModel { slots }
    }

    /// The slots of a cluster of `size`, if limited.
    pub fn slots(&self, size: Rpu) -> Option<u32> {
        self.slots.get(&size).copied()
    }
}

/// The slot count whose rule misclassifies fewest placements, if it beats
/// no limit; `by_neighbours` maps a neighbour count to (placements,
/// queued).
fn best_slots(by_neighbours: &BTreeMap<u32, (usize, usize)>) -> Option<u32> {
    let queued_total: usize = by_neighbours.values().map(|(_, q)| q).sum();
    if queued_total < MIN_QUEUED {
        return None;
    }
    // With limit k: placements below k that queued, plus those at or above
    // it that did not. Without one: every queued placement.
    let mut best: (usize, Option<u32>) = (queued_total, None);
    let candidates = by_neighbours.keys().map(|&n| n.max(1));
    for k in candidates {
        let errors: usize = by_neighbours.iter().map(|(&n, &(placed, queued))| if n < k { queued } else { placed - queued }).sum();
        if errors < best.0 {
            best = (errors, Some(k));
        }
    }
    best.1
}

/// Quantiles kept of the residual distribution.
pub const RESIDUAL_QUANTILES: usize = 101;

/// The spread of actual latencies around the predictions (see the module
/// docs).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResidualModel {
    /// `actual / predicted` at evenly spaced quantiles, ascending; empty
    /// when nothing was learned.
    pub quantiles: Vec<f64>,
}

impl ResidualModel {
    /// Learns from `(predicted, actual)` pairs of isolated, uncensored
    /// executions. Pairs with a zero on either side are skipped.
    pub fn learn(pairs: impl IntoIterator<Item = (Duration, Duration)>) -> Self {
        let mut ratios: Vec<f64> = pairs
            .into_iter()
            .filter(|(predicted, actual)| predicted.as_micros() > 0 && actual.as_micros() > 0)
            .map(|(predicted, actual)| actual.as_secs_f64() / predicted.as_secs_f64())
            .collect();
        if ratios.is_empty() {
            return ResidualModel::default();
        }
        ratios.sort_by(f64::total_cmp);
        let last = ratios.len() - 1;
        let quantiles = (0..RESIDUAL_QUANTILES).map(|i| ratios[(i * last + (RESIDUAL_QUANTILES - 1) / 2) / (RESIDUAL_QUANTILES - 1)]).collect();
        ResidualModel { quantiles }
    }

    /// The factor query `query` runs long (or short) by: a quantile chosen
    /// by a hash of its id.
    pub fn factor(&self, query: QueryId) -> f64 {
        if self.quantiles.is_empty() {
            return 1.0;
        }
        // splitmix64: consecutive ids spread evenly over the quantiles.
        let mut z = query.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        self.quantiles[(z % self.quantiles.len() as u64) as usize]
    }
}

/// Everything the planner's warehouse calibrates by.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Calibration {
    /// Executing slots per size.
    pub admission: AdmissionModel,
    /// Latency spread around the predictions.
    pub residuals: ResidualModel,
}

impl std::fmt::Display for Calibration {
    /// `slots 16rpu=2 32rpu=4; latency ×0.81–×1.24 of predicted (p10–p90)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.admission.slots.is_empty() {
            write!(f, "no admission slots learned")?;
        } else {
            let slots: Vec<String> = self.admission.slots.iter().map(|(size, slots)| format!("{size}={slots}")).collect();
            write!(f, "slots {}", slots.join(" "))?;
        }
        match self.residuals.quantiles.as_slice() {
            [] => write!(f, "; no latency spread learned"),
            q => write!(f, "; latency ×{:.2}–×{:.2} of predicted (p10–p90)", q[q.len() / 10], q[q.len() * 9 / 10]),
        }
    }
}

impl Calibration {
    /// Learns both from an execution log: every record's queueing for the
    /// admission slots, and for the residuals the uncensored records that
    /// ran alone against `predictor`'s isolated predictions.
    pub fn learn(predictor: &dyn LatencyPredictor, log: &[ExecutionRecord]) -> Self {
        let samples: Vec<AdmissionSample> = log.iter().map(ExecutionRecord::admission_sample).collect();
        let pairs = log.iter().filter(|r| r.ran_alone && !r.censored).map(|r| (predictor.isolated(r.template, r.size), r.latency));
        Calibration { admission: AdmissionModel::learn(&samples), residuals: ResidualModel::learn(pairs) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(size: u32, neighbours: u32, queued_s: f64) -> AdmissionSample {
        AdmissionSample { size: Rpu(size), neighbours, queued: Duration::from_secs_f64(queued_s) }
    }

    #[test]
    fn the_slot_count_is_the_first_neighbour_count_at_which_most_placements_queue() {
        // 16 RPU: two slots (from two neighbours on, 9 of 10 queue, one
        // short query skipping the queue); 32 RPU never queues.
        let mut samples = Vec::new();
        for n in 0..6u32 {
            for i in 0..10 {
                samples.push(sample(16, n, if n >= 2 && i > 0 { 30.0 } else { 0.0 }));
                samples.push(sample(32, n, 0.0));
            }
        }
        let model = AdmissionModel::learn(&samples);
        assert_eq!(model.slots(Rpu(16)), Some(2));
        assert_eq!(model.slots(Rpu(32)), None);
        assert_eq!(model.slots(Rpu(8)), None);
    }

    #[test]
    fn too_few_queued_placements_decide_nothing() {
        let samples: Vec<AdmissionSample> = (0..MIN_QUEUED - 1).map(|_| sample(16, 3, 60.0)).collect();
        assert_eq!(AdmissionModel::learn(&samples).slots(Rpu(16)), None);
    }

    #[test]
    fn sparse_neighbour_counts_still_reveal_the_limit() {
        // A slow 4-RPU cluster: two slots, a few placements at each count.
        let mut samples = Vec::new();
        for n in 0..12u32 {
            for i in 0..3 {
                samples.push(sample(4, n, if n >= 2 && i < 2 { 40.0 } else { 0.0 }));
            }
        }
        assert_eq!(AdmissionModel::learn(&samples).slots(Rpu(4)), Some(2));
    }

    #[test]
    fn residual_quantiles_span_the_observed_ratios_and_draws_are_stable() {
        // Ratios 0.5, 1.0, 1.5, 2.0 over predictions of 10 s.
        let pairs: Vec<(Duration, Duration)> = (0..4).map(|i| (Duration::from_secs(10), Duration::from_secs(5 * (i + 1)))).collect();
        let model = ResidualModel::learn(pairs);
        assert_eq!(model.quantiles.len(), RESIDUAL_QUANTILES);
        assert_eq!((model.quantiles[0], model.quantiles[RESIDUAL_QUANTILES - 1]), (0.5, 2.0));
        let draws: Vec<f64> = (0..1_000).map(|id| model.factor(QueryId(id))).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 1.25).abs() < 0.1, "mean factor {mean}");
        assert_eq!(model.factor(QueryId(7)), model.factor(QueryId(7)));
        assert_eq!(ResidualModel::default().factor(QueryId(7)), 1.0);
    }

    proptest! {
        #[test]
        fn residual_factors_lie_within_the_observed_ratios(
            ratios in proptest::collection::vec(0.1f64..10.0, 1..200),
            ids in proptest::collection::vec(any::<u64>(), 1..50),
        ) {
            let pairs: Vec<(Duration, Duration)> = ratios.iter().map(|r| (Duration::from_secs(100), Duration::from_secs_f64(100.0 * r))).collect();
            let model = ResidualModel::learn(pairs);
            let (low, high) = (model.quantiles[0], model.quantiles[RESIDUAL_QUANTILES - 1]);
            for id in ids {
                let factor = model.factor(QueryId(id));
                prop_assert!((low..=high).contains(&factor));
            }
        }

        #[test]
        fn no_other_slot_count_misclassifies_fewer_placements(
            raw in proptest::collection::vec((0u32..8, 0.0f64..5.0), 0..300),
            seed in any::<u64>(),
        ) {
            let samples: Vec<AdmissionSample> = raw.iter().map(|&(n, q)| sample(16, n, q)).collect();
            let model = AdmissionModel::learn(&samples);
            let queued = |s: &AdmissionSample| s.queued >= QUEUED_AT_LEAST;
            let errors = |limit: Option<u32>| samples.iter().filter(|s| queued(s) != limit.is_some_and(|k| s.neighbours >= k)).count();
            let learned = model.slots(Rpu(16));
            if samples.iter().filter(|s| queued(s)).count() < MIN_QUEUED {
                prop_assert_eq!(learned, None);
                return Ok(());
            }
            prop_assert!(learned.is_none_or(|k| k >= 1));
            for k in 1..10 {
                prop_assert!(errors(learned) <= errors(Some(k)), "{:?} vs {}", learned, k);
            }
            prop_assert!(errors(learned) <= errors(None));
            // (C) order-independence.
            let mut shuffled = samples.clone();
            let len = shuffled.len();
            if len > 1 {
                let mut state = seed;
                for i in (1..len).rev() {
                    state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                    shuffled.swap(i, (state >> 33) as usize % (i + 1));
                }
            }
            prop_assert_eq!(AdmissionModel::learn(&shuffled), model);
        }
    }
}
