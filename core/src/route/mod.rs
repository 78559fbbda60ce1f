//! Routing: the [`RoutingPolicy`] trait every router implements, and the
//! baseline policies.
//!
//! The simulator and the live RouterShard drive the same trait: for each
//! arriving query, [`RoutingPolicy::route`] sees the query and the pool as
//! an operator could observe it (no ground truth) and returns a
//! [`Routing`]. Completed executions are fed back through
//! [`RoutingPolicy::handle_completion`] so learning policies can learn.
//!
//! # Properties of the baselines
//!
//! - (A) They only ever choose a `Ready` cluster when one exists; with none
//!   ready they choose the starting cluster that is ready soonest, and with
//!   none at all they reject.
//! - (B) Round-robin visits the ready clusters in id order, cycling: over
//!   `n·k` consecutive queries on a fixed set of `n` clusters each gets `k`.
//! - (C) Least-loaded chooses a ready cluster with the fewest running
//!   queries, ties to the lowest id.
//! - (D) Both are deterministic functions of their inputs and history.

use serde::{Deserialize, Serialize};

pub mod budget;
pub mod director;
pub mod elastic;
pub mod future;
pub mod margin;
pub mod reserve;
pub mod shadow;
pub mod slo;

use crate::model::{ClusterId, ClusterState, ClusterView, Pool, Query, QueryId, Target};
use crate::time::{Duration, Instant};
use crate::model::ExecutionReport;

/// A routing decision with the reason an operator would want to read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RouteDecision {
    /// Where the query goes.
    pub target: Target,
    /// One line on why.
    pub explanation: String,
    /// The query's predicted latency there, for policies that predict.
    pub predicted_latency: Option<crate::time::Duration>,
}

/// The outcome of routing one query.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Routing {
    /// Send the query to a target.
    Dispatch(RouteDecision),
    /// The query cannot be placed; it fails with this reason.
    Reject {
        /// Why.
        reason: String,
    },
}

/// A routing policy, driven by the simulator or a live RouterShard.
pub trait RoutingPolicy {
    /// The policy's short name, as used on the command line.
    fn name(&self) -> &str;

    /// Chooses where `query`, arriving at `now`, runs.
    fn route(&mut self, now: Instant, query: &Query, pool: &Pool) -> Routing;

    /// Observes a finished execution (completed or timed out).
    fn handle_completion(&mut self, now: Instant, report: &ExecutionReport) {
        let _ = (now, report);
    }

    /// Observes an execution that failed (a server error, a lost
    /// connection, a refused dispatch, a failed offload): the query holds
    /// nothing any more, and its latency teaches nothing. `throttled` says
    /// the elastic tier refused it for its rate.
    fn handle_failure(&mut self, now: Instant, query: QueryId, throttled: bool) {
        let _ = (now, query, throttled);
    }

    /// The current (guarded) predicted latency of a query this policy
    /// placed and that is still running, for policies that predict.
    fn predicted_latency(&self, query: QueryId) -> Option<Duration> {
        let _ = query;
        None
    }

    /// The current (guarded) predicted latencies of every query this
    /// policy placed on `cluster` that is still running, in O(running).
    fn predicted_latencies(&self, cluster: ClusterId) -> Vec<(QueryId, Duration)> {
        let _ = cluster;
        Vec::new()
    }

    /// A copy of this router for the planner's replay, for policies that
    /// can predict completions. The copy shares nothing with the original.
    fn fork_planner(&self) -> Option<Box<dyn PlanningRouter>> {
        None
    }

    /// The calibrated margin its SLO decisions use, with the predicted and
    /// realised misses, for policies that have one ([`margin`]).
    fn margin(&self) -> Option<margin::MarginState> {
        None
    }

    /// The violation budget it spends on cost, for policies with one
    /// ([`budget`]).
    fn violation_budget(&self) -> Option<budget::BudgetState> {
        None
    }

    /// The name of the latency predictor it decides with, for policies
    /// that predict.
    fn predictor_name(&self) -> Option<&str> {
        None
    }

    /// Replaces its predictor's learned model
    /// ([`crate::predict::LatencyPredictor::install_model`]).
    ///
    /// # Errors
    ///
    /// If its predictor has no learned model, or the weights are unusable.
    fn install_model(&mut self, weights: std::sync::Arc<crate::predict::iconq::IconqWeights>) -> Result<(), String> {
        let _ = weights;
        Err(format!("policy {} has no learned model to replace", self.name()))
    }

    /// Hands its predictor's refits out instead of running them inside
    /// [`RoutingPolicy::handle_completion`] (see
    /// [`crate::predict::ConcurrencyAware::defer_fits`]); a no-op for
    /// policies that do not learn.
    fn defer_fits(&mut self) {}

    /// The refit that fell due, once deferred: the caller runs it (on
    /// another thread, say) and hands the result to
    /// [`RoutingPolicy::install_fit`].
    fn take_fit_job(&mut self) -> Option<crate::predict::FitJob> {
        None
    }

    /// Installs a fit run from a job this policy handed out.
    fn install_fit(&mut self, fit: crate::predict::Fit) {
        let _ = fit;
    }

    /// Decides where `query` would go, as [`RoutingPolicy::route`] does,
    /// while another policy sends it to `actual`: the policy keeps track of
    /// the query at `actual`, as if it had placed it there, and says what
    /// it predicts of both placements ([`shadow`]). The default routes and
    /// predicts nothing: right for policies whose state does not depend on
    /// where their queries went.
    fn route_in_shadow(&mut self, now: Instant, query: &Query, pool: &Pool, actual: Target) -> shadow::ShadowVerdict {
        let _ = actual;
        shadow::ShadowVerdict { routing: self.route(now, query, pool), own: None, actual: None }
    }

    /// Shadow mode's comparison, for a policy running another in its shadow
    /// ([`shadow::Shadowed`]).
    fn shadow_report(&self) -> Option<shadow::ShadowReport> {
        None
    }
}

/// A router the planner drives in its predictor-driven replay (the spinup
/// size selector, the tuner): it routes replayed arrivals and predicts when
/// each placed query completes, and the replay releases a query when its
/// predicted completion comes, without the router learning from it.
pub trait PlanningRouter: RoutingPolicy + Send {
    /// Forgets a placed query that the replay completed at `now`: its
    /// cluster's prediction state and billing let go of it; the predictor
    /// learns nothing. A violation budget counts the replay's outcome (see
    /// [`budget`]), as it would a real one.
    fn release(&mut self, now: Instant, query: QueryId);

    /// Another independent copy, for evaluating one more candidate.
    fn fork(&self) -> Box<dyn PlanningRouter>;

    /// A copy that keeps what the router learned but holds nothing placed
    /// and has spent nothing: for simulating a day from an empty pool.
    fn fork_empty(&self) -> Box<dyn PlanningRouter>;

    /// A copy of the predictor behind this router's predictions, for the
    /// planner's warehouse ([`crate::tune::PredictedWarehouse`]).
    fn fork_predictor(&self) -> Box<dyn crate::predict::LatencyPredictor + Send>;

    /// The estimated bill of an elastic offload running `duration`; zero
    /// for a router without an elastic tier.
    fn elastic_cost_estimate_usd(&self, duration: Duration) -> f64;

    /// The query on `cluster` predicted to complete first, and when
    /// (arrival plus its guarded prediction; ties to the lower id).
    fn earliest_completion(&self, cluster: ClusterId) -> Option<(Instant, QueryId)>;
}

impl<P: RoutingPolicy + ?Sized> RoutingPolicy for Box<P> {
    fn name(&self) -> &str {
        (**self).name()
    }
    fn route(&mut self, now: Instant, query: &Query, pool: &Pool) -> Routing {
        (**self).route(now, query, pool)
    }
    fn handle_completion(&mut self, now: Instant, report: &ExecutionReport) {
        (**self).handle_completion(now, report)
    }
    fn handle_failure(&mut self, now: Instant, query: QueryId, throttled: bool) {
        (**self).handle_failure(now, query, throttled)
    }
    fn predicted_latency(&self, query: QueryId) -> Option<Duration> {
        (**self).predicted_latency(query)
    }
    fn predicted_latencies(&self, cluster: ClusterId) -> Vec<(QueryId, Duration)> {
        (**self).predicted_latencies(cluster)
    }
    fn fork_planner(&self) -> Option<Box<dyn PlanningRouter>> {
        (**self).fork_planner()
    }
    fn predictor_name(&self) -> Option<&str> {
        (**self).predictor_name()
    }
    fn install_model(&mut self, weights: std::sync::Arc<crate::predict::iconq::IconqWeights>) -> Result<(), String> {
        (**self).install_model(weights)
    }
    fn margin(&self) -> Option<margin::MarginState> {
        (**self).margin()
    }
    fn violation_budget(&self) -> Option<budget::BudgetState> {
        (**self).violation_budget()
    }
    fn defer_fits(&mut self) {
        (**self).defer_fits()
    }
    fn take_fit_job(&mut self) -> Option<crate::predict::FitJob> {
        (**self).take_fit_job()
    }
    fn install_fit(&mut self, fit: crate::predict::Fit) {
        (**self).install_fit(fit)
    }
    fn route_in_shadow(&mut self, now: Instant, query: &Query, pool: &Pool, actual: Target) -> shadow::ShadowVerdict {
        (**self).route_in_shadow(now, query, pool, actual)
    }
    fn shadow_report(&self) -> Option<shadow::ShadowReport> {
        (**self).shadow_report()
    }
}

/// The baseline policies by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BaselinePolicy {
    /// [`RoundRobin`].
    RoundRobin,
    /// [`LeastLoaded`].
    LeastLoaded,
}

impl BaselinePolicy {
    /// Every baseline, in display order.
    pub const ALL: [BaselinePolicy; 2] = [BaselinePolicy::RoundRobin, BaselinePolicy::LeastLoaded];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            BaselinePolicy::RoundRobin => "round-robin",
            BaselinePolicy::LeastLoaded => "least-loaded",
        }
    }

    /// Looks a baseline up by its command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// A fresh instance.
    pub fn build(self) -> Box<dyn RoutingPolicy> {
        match self {
            BaselinePolicy::RoundRobin => Box::new(RoundRobin::default()),
            BaselinePolicy::LeastLoaded => Box::new(LeastLoaded),
        }
    }
}

/// With no ready cluster: the starting cluster that is ready soonest, or a
/// rejection.
fn fallback(pool: &Pool) -> Routing {
    let starting = pool
        .clusters
        .iter()
        .filter(|c| c.state == ClusterState::Starting)
        .min_by_key(|c| (c.ready_at, c.id));
    match starting {
        Some(c) => Routing::Dispatch(RouteDecision {
            target: Target::Cluster(c.id),
            explanation: format!("no ready cluster; {} is ready soonest ({})", c.id, c.ready_at),
            predicted_latency: None,
        }),
        None => Routing::Reject { reason: format!("pool {} has no ready or starting cluster", pool.id) },
    }
}

/// Cycles over the ready clusters in id order.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    /// The cluster chosen last; the next choice is the first ready cluster
    /// with a larger id (wrapping).
    last: Option<ClusterId>,
}

impl RoutingPolicy for RoundRobin {
    fn name(&self) -> &str {
        BaselinePolicy::RoundRobin.name()
    }

    fn route(&mut self, _now: Instant, _query: &Query, pool: &Pool) -> Routing {
        let mut ready: Vec<&ClusterView> = pool.ready_clusters().collect();
        if ready.is_empty() {
            return fallback(pool);
        }
        ready.sort_by_key(|c| c.id);
        let chosen = match self.last {
            Some(last) => ready.iter().find(|c| c.id > last).unwrap_or(&ready[0]),
            None => &ready[0],
        };
        self.last = Some(chosen.id);
        Routing::Dispatch(RouteDecision {
            target: Target::Cluster(chosen.id),
            explanation: format!("round-robin over {} ready clusters", ready.len()),
            predicted_latency: None,
        })
    }
}

/// Chooses the ready cluster with the fewest running queries.
#[derive(Clone, Copy, Debug, Default)]
pub struct LeastLoaded;

impl RoutingPolicy for LeastLoaded {
    fn name(&self) -> &str {
        BaselinePolicy::LeastLoaded.name()
    }

    fn route(&mut self, _now: Instant, _query: &Query, pool: &Pool) -> Routing {
        match pool.ready_clusters().min_by_key(|c| (c.running.len(), c.id)) {
            Some(c) => Routing::Dispatch(RouteDecision {
                target: Target::Cluster(c.id),
                explanation: format!("{} runs the fewest queries ({})", c.id, c.running.len()),
                predicted_latency: None,
            }),
            None => fallback(pool),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::{PoolId, QueryId, Rpu, RunningQuery, Slo, TemplateId};
    use crate::time::Duration;

    fn cluster(id: u32, state: ClusterState, running: usize) -> ClusterView {
        ClusterView {
            id: ClusterId(id),
            size: Rpu(16),
            state,
            requested_at: Instant::ZERO,
            ready_at: Instant::from_secs_f64(f64::from(id)),
            running: (0..running)
                .map(|i| RunningQuery {
                    id: QueryId(i as u64),
                    template: TemplateId(1),
                    slo: Slo { latency: Duration::from_secs(1) },
                    arrival: Instant::ZERO,
                    dispatched: Instant::ZERO,
                })
                .collect(),
        }
    }

    fn pool(clusters: Vec<ClusterView>) -> Pool {
        Pool { id: PoolId::default(), clusters }
    }

    fn query() -> Query {
        Query {
            id: QueryId(99),
            pool: PoolId::default(),
            template: TemplateId(1),
            slo: Slo { latency: Duration::from_secs(1) },
            arrival: Instant::ZERO,
        }
    }

    fn target(routing: Routing) -> Option<ClusterId> {
        match routing {
            Routing::Dispatch(RouteDecision { target: Target::Cluster(id), .. }) => Some(id),
            _ => None,
        }
    }

    #[test]
    fn round_robin_skips_clusters_that_are_not_ready() {
        let pool = pool(vec![
            cluster(0, ClusterState::Ready, 0),
            cluster(1, ClusterState::Draining, 0),
            cluster(2, ClusterState::Ready, 0),
        ]);
        let mut rr = RoundRobin::default();
        let picks: Vec<_> = (0..4).map(|_| target(rr.route(Instant::ZERO, &query(), &pool)).unwrap().0).collect();
        assert_eq!(picks, vec![0, 2, 0, 2]);
    }

    #[test]
    fn least_loaded_picks_fewest_running_with_lowest_id_on_ties() {
        let pool = pool(vec![
            cluster(0, ClusterState::Ready, 3),
            cluster(1, ClusterState::Ready, 1),
            cluster(2, ClusterState::Ready, 1),
        ]);
        assert_eq!(target(LeastLoaded.route(Instant::ZERO, &query(), &pool)), Some(ClusterId(1)));
    }

    #[test]
    fn with_no_ready_cluster_baselines_wait_for_the_soonest_starting_one() {
        let pool = pool(vec![cluster(3, ClusterState::Starting, 0), cluster(1, ClusterState::Starting, 0)]);
        assert_eq!(target(LeastLoaded.route(Instant::ZERO, &query(), &pool)), Some(ClusterId(1)));
        let empty = self::pool(vec![cluster(0, ClusterState::Gone, 0)]);
        assert!(matches!(RoundRobin::default().route(Instant::ZERO, &query(), &empty), Routing::Reject { .. }));
    }

    proptest! {
        #[test]
        fn round_robin_spreads_queries_evenly(n in 1u32..8, rounds in 1usize..20) {
            let pool = pool((0..n).map(|i| cluster(i, ClusterState::Ready, 0)).collect());
            let mut rr = RoundRobin::default();
            let mut counts = vec![0usize; n as usize];
            for _ in 0..(n as usize * rounds) {
                counts[target(rr.route(Instant::ZERO, &query(), &pool)).unwrap().0 as usize] += 1;
            }
            prop_assert!(counts.iter().all(|&c| c == rounds));
        }

        #[test]
        fn baselines_only_choose_ready_clusters_when_one_exists(states in prop::collection::vec(0u8..4, 1..8), loads in prop::collection::vec(0usize..5, 8)) {
            let clusters: Vec<_> = states.iter().enumerate().map(|(i, s)| {
                let state = [ClusterState::Starting, ClusterState::Ready, ClusterState::Draining, ClusterState::Gone][*s as usize];
                cluster(i as u32, state, loads[i])
            }).collect();
            let any_ready = clusters.iter().any(|c| c.state == ClusterState::Ready);
            let pool = pool(clusters);
            for mut policy in [BaselinePolicy::RoundRobin.build(), BaselinePolicy::LeastLoaded.build()] {
                if let Some(id) = target(policy.route(Instant::ZERO, &query(), &pool)) {
                    let state = pool.clusters[id.0 as usize].state;
                    let expected = if any_ready { ClusterState::Ready } else { ClusterState::Starting };
                    prop_assert_eq!(state, expected);
                }
            }
        }
    }
}
