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
//! default is built on [`LatencyPredictor::predict`]; a sequence model
//! (Iconq+) overrides it and keeps its hidden state in its own cache.

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
    fn predict_placement(&self, now: Instant, query: &Query, size: Rpu, running: &[QueryState]) -> Placement {
        let updated = running
            .iter()
            .map(|r| {
                let fresh = self.predict(r.template, size, r.neighbours + 1);
                QueryState { neighbours: r.neighbours + 1, predicted: guard(r.predicted, fresh, now - r.arrival), ..r.clone() }
            })
            .collect();
        let count = running.len() as u32;
        let predicted = self.predict(query.template, size, count);
        Placement {
            query: QueryState {
                query: query.id,
                template: query.template,
                arrival: query.arrival,
                neighbours_at_dispatch: count,
                neighbours: count,
                predicted,
                memory: None,
            },
            running: updated,
        }
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
        let placement = predictor.predict_placement(Instant::from_secs_f64(5.0), &query, Rpu(16), &running);
        assert_eq!(placement.query.neighbours_at_dispatch, 2);
        assert_eq!(placement.running.iter().map(|s| s.neighbours).collect::<Vec<_>>(), vec![1, 4]);
        // Query 1 has run 5 s already: the guard lifts its prediction to that.
        assert!(placement.running[0].predicted >= Duration::from_secs(5));
    }

    proptest! {
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
            let placement = predictor.predict_placement(Instant::from_secs_f64(now_s), &query, Rpu(16), &running);
            for (before, after) in running.iter().zip(&placement.running) {
                prop_assert!(after.predicted >= before.predicted);
                prop_assert!(after.predicted >= Instant::from_secs_f64(now_s) - before.arrival);
            }
        }
    }
}
