//! Latency prediction, learned only from observed executions.
//!
//! A predictor never sees the emulated warehouse's parameters: everything
//! it knows comes through [`LatencyPredictor::observe`], as it would in
//! production (the reservoir's execution log, or completions as they
//! happen). Observations may be **censored**: a timed-out or still-running
//! query's latency is only a lower bound.
//!
//! # Layout
//!
//! - [`isolated`]: robust per-template, per-size isolated latency
//!   estimates with a fitted size-scaling curve and a fallback for unseen
//!   templates.
//! - [`stage`]: the concurrency-unaware predictor ("Stage-like").
//! - [`concurrency`]: the concurrency-aware predictor: a joint model of
//!   isolated latency and a learned, monotone slowdown curve per cluster
//!   size, with each template's own sensitivity to interference.
//!
//! The router's counterfactual batch API is
//! [`LatencyPredictor::predict_placement`]: the predictions for a query and
//! for every running query if it were placed on a cluster, from cached
//! per-query [`QueryState`] in O(running), with the monotonicity guard. Its
//! default is built on [`LatencyPredictor::predict`], and moves a running
//! query's prediction by the share of its remaining time the new query
//! overlaps; a sequence model (Iconq+) overrides it and keeps its hidden
//! state in its own cache. A router scores every cluster and commits one,
//! so it scores with [`LatencyPredictor::score_placement`] (the same
//! predictions, without what only a committed placement carries on, such
//! as Iconq+'s stepped memories) and completes the one it commits with
//! [`LatencyPredictor::complete_placement`].
//!
//! (Moving a running query all the way to the prediction at its new count
//! on every arrival, as the default did through commit 2388f6c, made a short query
//! look as costly to its neighbours as a long one. On `eval router-table2`
//! that gave −60.9% VR against round-robin on the mean and −54.6% on the
//! worst seed, against −64.6% and −60.1% with the share; on seeds 11..15,
//! never tuned on, −60.8% and −54.0% against −65.5% and −63.5%. A
//! time-based variant, the running query stretched by the curve's ratio
//! over only the overlap, with no gap carried to later arrivals, did worse
//! than both: −58.6% and −55.0%.)

pub mod concurrency;
pub mod iconq;
pub mod isolated;
pub mod stage;

use serde::{Deserialize, Serialize};

use crate::model::{Query, QueryId, Rpu, TemplateId};
use crate::time::{Duration, Instant};

pub use concurrency::{ConcurrencyAware, Fit, FitJob};
pub use stage::StageLike;

/// One observed execution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Template or fingerprint.
    pub template: TemplateId,
    /// Cluster size it ran on.
    pub size: Rpu,
    /// Its concurrency feature: how many other queries overlapped it, or,
    /// for the router, how many were running when it was placed. A caller
    /// must use one meaning for both learning and prediction.
    pub neighbours: u32,
    /// Its client-side latency (a lower bound when `censored`).
    pub latency: Duration,
    /// Timed out or cut short.
    pub censored: bool,
}

/// A running query's cached prediction state, updated incrementally as
/// neighbours arrive.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryState {
    /// The query.
    pub query: QueryId,
    /// Its template.
    pub template: TemplateId,
    /// When it arrived.
    pub arrival: Instant,
    /// Queries running on its cluster when it was placed.
    pub neighbours_at_dispatch: u32,
    /// That plus the queries placed on its cluster since.
    pub neighbours: u32,
    /// Its guarded predicted latency.
    pub predicted: Duration,
    /// What a sequence model has read of its neighbours, for predictors
    /// that update incrementally ([`iconq::IconqPredictor`]); `None` for
    /// the others. Not serialised: a state read back starts over.
    #[serde(skip)]
    pub memory: Option<std::sync::Arc<iconq::Memory>>,
}

/// A counterfactual placement's predictions.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// The placed query's new state.
    pub query: QueryState,
    /// Every running query's updated state, in input order.
    pub running: Vec<QueryState>,
}

/// The monotonicity guard: a prediction never goes down, and never below
/// the time the query has already run.
pub fn guard(previous: Duration, fresh: Duration, elapsed: Duration) -> Duration {
    fresh.max(previous).max(elapsed)
}

/// A running query's prediction once a new query joins it: from its
/// guarded prediction before (`previous`, at least `elapsed`) towards the
/// guarded `fresh` one that counts the newcomer, by the share of its
/// predicted remaining time the newcomer (predicted to take `newcomer`)
/// overlaps, at most all of it, and all of it for a query past its
/// prediction. Never below [`guard`]'s first half, never above the guard.
pub fn overlap_update(previous: Duration, fresh: Duration, elapsed: Duration, newcomer: Duration) -> Duration {
    let before = previous.max(elapsed);
    let full = fresh.max(before);
    let remaining = before - elapsed;
    let share = if remaining == Duration::ZERO { 1.0 } else { newcomer.ratio(remaining).min(1.0) };
    before + (full - before).mul_f64(share)
}

/// A latency predictor.
pub trait LatencyPredictor {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// Learns from an execution.
    fn observe(&mut self, observation: &Observation);

    /// Predicted isolated latency of `template` on a cluster of `size`.
    fn isolated(&self, template: TemplateId, size: Rpu) -> Duration;

    /// Executions of `template` it has learned from, for a router to tell
    /// a firm estimate from a guess. The default, for predictors that do
    /// not count, is `u64::MAX` (always firm).
    fn template_observations(&self, template: TemplateId) -> u64 {
        let _ = template;
        u64::MAX
    }

    /// Predicted latency of `template` on `size` when `neighbours` other
    /// queries overlap it.
    fn predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> Duration;

    /// A version of [`LatencyPredictor::predict`]'s answers: while it
    /// stays the same, so does every answer, and a caller may keep them
    /// (see [`LatencyPredictor::predict_placement`]'s `next`). `None` (the
    /// default): not tracked, keep nothing.
    fn predictions_version(&self) -> Option<u64> {
        None
    }

    /// Hands refits out ([`LatencyPredictor::take_fit_job`]) instead of
    /// running them while observing, for predictors that refit; a no-op
    /// for the others.
    fn defer_fits(&mut self) {}

    /// The refit that fell due, once deferred; `None` for predictors that
    /// do not refit.
    fn take_fit_job(&mut self) -> Option<FitJob> {
        None
    }

    /// Installs a fit run from a job this predictor handed out.
    fn install_fit(&mut self, fit: Fit) {
        let _ = fit;
    }

    /// Replaces its learned sequence model ([`iconq`]) with `weights`,
    /// for predictors that have one; queries already running are
    /// predicted by the new model from their next update on.
    ///
    /// # Errors
    ///
    /// If it has no such model, or the weights fail their check.
    fn install_model(&mut self, weights: std::sync::Arc<iconq::IconqWeights>) -> Result<(), String> {
        let _ = weights;
        Err(format!("the {} predictor has no learned model to replace", self.name()))
    }

    /// Counterfactual batch prediction: if `query` were placed at `now` on a
    /// cluster of `size` running `running`, its state and every running
    /// query's updated, guarded state. O(running).
    ///
    /// `next`, when the caller kept them, is each running query's
    /// [`LatencyPredictor::predict`] at its neighbour count plus one
    /// (`next[i]` for `running[i]`, made at the current
    /// [`LatencyPredictor::predictions_version`]): a router scores every
    /// cluster on every arrival, and a cluster's running queries change
    /// only when one is placed there. A hint: the placement is the same
    /// with it or without it, and a predictor that does not move running
    /// queries by `predict` ignores it.
    ///
    /// The default predicts the new query at the running count, and moves
    /// each running query's prediction towards [`LatencyPredictor::predict`]
    /// at its neighbour count plus one (guarded) by the share of its
    /// predicted remaining time that the new query is predicted to overlap
    /// (the new query's predicted latency over that remaining time, at most
    /// 1; all of it for a query past its prediction). A query that will be
    /// gone long before a running one ends slows it only while it runs;
    /// what it leaves of the gap, later arrivals close. The count still
    /// rises by one.
    ///
    /// A router that scores many placements and commits one uses
    /// [`LatencyPredictor::score_placement`] and
    /// [`LatencyPredictor::complete_placement`] instead.
    fn predict_placement(&self, now: Instant, query: &Query, size: Rpu, running: &[QueryState], next: Option<&[Duration]>) -> Placement {
        let predicted = self.predict(query.template, size, running.len() as u32);
        match next {
            Some(next) => {
                debug_assert_eq!(running.len(), next.len());
                overlap_placement(predicted, now, query, running, |i, _| next[i])
            }
            None => overlap_placement(predicted, now, query, running, |_, r| self.predict(r.template, size, r.neighbours + 1)),
        }
    }

    /// [`LatencyPredictor::predict_placement`] for scoring: the same
    /// predictions, but the running queries' states may come without what
    /// only a committed placement carries on (a learned model's memory of
    /// what each has read: a router scores every cluster, and commits
    /// one). The default is [`LatencyPredictor::predict_placement`].
    fn score_placement(&self, now: Instant, query: &Query, size: Rpu, running: &[QueryState], next: Option<&[Duration]>) -> Placement {
        self.predict_placement(now, query, size, running, next)
    }

    /// Fills in what [`LatencyPredictor::score_placement`] left out of
    /// `placement` (scored with the same arguments) for the placement a
    /// router commits, so that it equals
    /// [`LatencyPredictor::predict_placement`]'s. The default has nothing
    /// to fill in.
    fn complete_placement(&self, now: Instant, query: &Query, size: Rpu, running: &[QueryState], placement: &mut Placement) {
        let _ = (now, query, size, running, placement);
    }
}

/// A placement of `query`, predicted to take `predicted` alongside
/// `running`, each of which moves by [`overlap_update`] towards
/// `fresh(i, running[i])`, its prediction at its next neighbour count.
fn overlap_placement(predicted: Duration, now: Instant, query: &Query, running: &[QueryState], fresh: impl Fn(usize, &QueryState) -> Duration) -> Placement {
    let count = running.len() as u32;
    let updated = running
        .iter()
        .enumerate()
        .map(|(i, r)| QueryState { neighbours: r.neighbours + 1, predicted: overlap_update(r.predicted, fresh(i, r), now - r.arrival, predicted), ..r.clone() })
        .collect();
    Placement {
        query: QueryState { query: query.id, template: query.template, arrival: query.arrival, neighbours_at_dispatch: count, neighbours: count, predicted, memory: None },
        running: updated,
    }
}

/// `max(predicted / actual, actual / predicted)`; both must be positive.
pub fn q_error(predicted: Duration, actual: Duration) -> f64 {
    let (p, a) = (predicted.as_secs_f64().max(1e-6), actual.as_secs_f64().max(1e-6));
    (p / a).max(a / p)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::{PoolId, Slo};
    use crate::predict::concurrency::ConcurrencyConfig;

    fn state(id: u64, neighbours: u32, predicted_s: f64, arrival_s: f64) -> QueryState {
        QueryState {
            query: QueryId(id),
            template: TemplateId(1),
            arrival: Instant::from_secs_f64(arrival_s),
            neighbours_at_dispatch: neighbours,
            neighbours,
            predicted: Duration::from_secs_f64(predicted_s),
            memory: None,
        }
    }

    #[test]
    fn placement_counts_the_new_neighbour_for_everyone() {
        let predictor = ConcurrencyAware::new(ConcurrencyConfig::default());
        let query = Query {
            id: QueryId(9),
            pool: PoolId::default(),
            template: TemplateId(2),
            slo: Slo { latency: Duration::from_secs(10) },
            arrival: Instant::from_secs_f64(5.0),
        };
        let running = [state(1, 0, 1.0, 0.0), state(2, 3, 1.0, 4.0)];
        let placement = predictor.predict_placement(Instant::from_secs_f64(5.0), &query, Rpu(16), &running, None);
        assert_eq!(placement.query.neighbours_at_dispatch, 2);
        assert_eq!(placement.running.iter().map(|s| s.neighbours).collect::<Vec<_>>(), vec![1, 4]);
        // Query 1 has run 5 s already: the guard lifts its prediction to that.
        assert!(placement.running[0].predicted >= Duration::from_secs(5));
    }

    #[test]
    fn a_short_arrival_moves_a_long_running_query_by_its_share_and_a_long_one_all_the_way() {
        let mut predictor = ConcurrencyAware::new(ConcurrencyConfig::default());
        // Template 1 takes 100 s alone, template 2 takes 1 s; both stretch.
        for n in 0..8u32 {
            for (template, alone_s) in [(1, 100.0), (2, 1.0)] {
                let latency = Duration::from_secs_f64(alone_s * (1.0 + f64::from(n) / 2.0));
                predictor.observe(&Observation { template: TemplateId(template), size: Rpu(16), neighbours: n, latency, censored: false });
            }
        }
        predictor.fit();
        let before = predictor.predict(TemplateId(1), Rpu(16), 0);
        let running = [QueryState { template: TemplateId(1), predicted: before, ..state(1, 0, 0.0, 0.0) }];
        let full = predictor.predict(TemplateId(1), Rpu(16), 1);
        let arrival = |template: u32| Query {
            id: QueryId(9),
            pool: PoolId::default(),
            template: TemplateId(template),
            slo: Slo { latency: Duration::from_secs(10) },
            arrival: Instant::ZERO,
        };
        let short = predictor.predict_placement(Instant::ZERO, &arrival(2), Rpu(16), &running, None);
        let share = short.query.predicted.as_secs_f64() / before.as_secs_f64();
        let moved = (short.running[0].predicted - before).as_secs_f64();
        assert!(share < 0.05, "the short query is short: {share}");
        assert!((moved - share * (full - before).as_secs_f64()).abs() < 1e-3, "moved {moved} s of {:?}", full - before);
        assert_eq!(short.running[0].neighbours, 1, "the count rises by one all the same");
        let long = predictor.predict_placement(Instant::ZERO, &arrival(1), Rpu(16), &running, None);
        assert_eq!(long.running[0].predicted, full);
    }

    proptest! {
        /// A running query moves towards its guarded prediction at the new
        /// count, never past it, and all the way when the new query
        /// overlaps the rest of it.
        #[test]
        fn a_running_prediction_moves_by_the_overlapped_share_of_the_gap(
            predicted in prop::collection::vec((0.1f64..1_000.0, 0.0f64..500.0, 0u32..40), 1..20),
            new_template in 1u32..4,
            now_s in 0.0f64..2_000.0,
        ) {
            let predictor = ConcurrencyAware::new(ConcurrencyConfig::default());
            let now = Instant::from_secs_f64(now_s);
            let running: Vec<QueryState> =
                predicted.iter().enumerate().map(|(i, &(p, ago, n))| state(i as u64, n, p, (now_s - ago).max(0.0))).collect();
            let query = Query { id: QueryId(999), pool: PoolId::default(), template: TemplateId(new_template), slo: Slo { latency: Duration::from_secs(1) }, arrival: now };
            let placement = predictor.predict_placement(now, &query, Rpu(16), &running, None);
            for (r, after) in running.iter().zip(&placement.running) {
                let elapsed = now - r.arrival;
                let before = guard(r.predicted, r.predicted, elapsed);
                let full = guard(r.predicted, predictor.predict(r.template, Rpu(16), r.neighbours + 1), elapsed);
                prop_assert!(before <= after.predicted && after.predicted <= full, "{:?} ≤ {:?} ≤ {:?}", before, after.predicted, full);
                if placement.query.predicted >= before - elapsed {
                    prop_assert_eq!(after.predicted, full);
                }
            }
        }

        /// The update both predictors' placements share: between the
        /// guarded prediction before and the guard of the fresh one, and
        /// the latter when the newcomer outlasts what is left.
        #[test]
        fn an_overlap_update_lies_between_the_old_and_the_guarded_fresh_prediction(
            previous_s in 0.0f64..1_000.0, fresh_s in 0.0f64..1_000.0, elapsed_s in 0.0f64..1_000.0, newcomer_s in 0.0f64..1_000.0,
        ) {
            let [previous, fresh, elapsed, newcomer] = [previous_s, fresh_s, elapsed_s, newcomer_s].map(Duration::from_secs_f64);
            let updated = overlap_update(previous, fresh, elapsed, newcomer);
            prop_assert!(previous.max(elapsed) <= updated && updated <= guard(previous, fresh, elapsed));
            if newcomer >= previous.max(elapsed) - elapsed {
                prop_assert_eq!(updated, guard(previous, fresh, elapsed));
            }
        }

        /// Placing from kept next-count predictions is placing.
        #[test]
        fn a_placement_from_kept_predictions_is_the_placement(
            predicted in prop::collection::vec((0.1f64..1_000.0, 0.0f64..500.0, 0u32..40, 1u32..6), 0..20),
            now_s in 0.0f64..2_000.0,
        ) {
            let mut predictor = ConcurrencyAware::new(ConcurrencyConfig::default());
            for (i, &(p, _, n, template)) in predicted.iter().enumerate() {
                predictor.observe(&Observation { template: TemplateId(template), size: Rpu(16), neighbours: n, latency: Duration::from_secs_f64(p), censored: i % 5 == 4 });
            }
            predictor.fit();
            let running: Vec<QueryState> = predicted
                .iter()
                .enumerate()
                .map(|(i, &(p, ago, n, template))| QueryState { template: TemplateId(template), ..state(i as u64, n, p, (now_s - ago).max(0.0)) })
                .collect();
            let next: Vec<Duration> = running.iter().map(|r| predictor.predict(r.template, Rpu(16), r.neighbours + 1)).collect();
            let query = Query { id: QueryId(999), pool: PoolId::default(), template: TemplateId(2), slo: Slo { latency: Duration::from_secs(1) }, arrival: Instant::from_secs_f64(now_s) };
            let now = Instant::from_secs_f64(now_s);
            prop_assert_eq!(
                predictor.predict_placement(now, &query, Rpu(16), &running, Some(&next)),
                predictor.predict_placement(now, &query, Rpu(16), &running, None)
            );
        }

        #[test]
        fn placement_never_lowers_a_running_prediction(predicted in prop::collection::vec(0.1f64..1_000.0, 1..20), now_s in 0.0f64..2_000.0) {
            let predictor = ConcurrencyAware::new(ConcurrencyConfig::default());
            let running: Vec<QueryState> = predicted.iter().enumerate().map(|(i, &p)| state(i as u64, i as u32, p, 0.0)).collect();
            let query = Query {
                id: QueryId(999),
                pool: PoolId::default(),
                template: TemplateId(3),
                slo: Slo { latency: Duration::from_secs(1) },
                arrival: Instant::from_secs_f64(now_s),
            };
            let placement = predictor.predict_placement(Instant::from_secs_f64(now_s), &query, Rpu(16), &running, None);
            for (before, after) in running.iter().zip(&placement.running) {
                prop_assert!(after.predicted >= before.predicted);
                prop_assert!(after.predicted >= Instant::from_secs_f64(now_s) - before.arrival);
            }
        }
    }
}
