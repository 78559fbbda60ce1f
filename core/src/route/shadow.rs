//! Shadow mode: one policy places every query (the *acting* policy, today's
//! practice such as round-robin), while another (the *shadow*, slogate's
//! router) decides every query alongside it and records what it would have
//! done and what it predicts of both choices.
//!
//! [`Shadowed`] is itself a [`RoutingPolicy`], so the simulator and the
//! live RouterShard run shadow mode with no other change. For each query it
//! asks the acting policy first; that decision is the one returned. Then it
//! hands the shadow the query with [`RoutingPolicy::route_in_shadow`]: the
//! shadow decides as it would, but tracks the query where it actually runs,
//! so that its view of every cluster (and what it learns from completions)
//! stays that of the real pool. Both placements are judged by the shadow's
//! predictions on the pool as it was at the query's arrival (a one-step
//! counterfactual: what slogate's choice would have added, not a replay of
//! the whole day under slogate).
//!
//! The [`ShadowLedger`] keeps the comparison an operator reads before
//! letting slogate act: how often the two agree, the realised VR of the
//! actual placements, the VR the shadow predicted for them (how far its
//! predictions can be trusted) and for its own choices, and the marginal
//! cost each choice was predicted to add.
//!
//! # Properties
//!
//! - (A) Where a query runs is the acting policy's decision: for any
//!   sequence of arrivals, completions and failures, `Shadowed(a, s)`
//!   returns exactly the decisions `a` alone returns.
//! - (B) The shadow tracks the actual placements: a query still running is
//!   among the shadow's predicted latencies of the cluster it runs on, and
//!   of no other.
//! - (C) The ledger adds up: `agreed ≤ decisions`, `finished ≤ decisions`,
//!   `violations ≤ finished`, and the recent decisions it keeps are at most
//!   its bound, newest first.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::{PlanningRouter, Routing, RoutingPolicy};
use crate::model::{ClusterId, ExecutionOutcome, ExecutionReport, Pool, Query, QueryId, Target};
use crate::time::{Duration, Instant};

/// Recent shadow decisions kept for operators, unless told otherwise.
pub const RECENT_DECISIONS_DEFAULT: usize = 200;

/// What a predicting policy expects of one placement, judged on the pool as
/// it was when the query arrived.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PredictedPlacement {
    /// Where.
    pub target: Target,
    /// The query's predicted latency there (the point estimate).
    pub predicted_latency_s: f64,
    /// Whether the query is predicted to miss its SLO there (at the
    /// policy's decision quantile).
    pub predicted_miss: bool,
    /// Expected SLO violations the placement adds: the query's own miss
    /// probability plus the rise in the running queries'.
    pub expected_violations: f64,
    /// Cost the placement is predicted to add, dollars (a cluster's billing
    /// window it extends, or an offload's bill).
    pub marginal_cost_usd: f64,
}

/// A shadow's decision on one query whose placement another policy made.
#[derive(Clone, Debug, PartialEq)]
pub struct ShadowVerdict {
    /// What the shadow would have done.
    pub routing: Routing,
    /// Its prediction for its own choice (policies that predict).
    pub own: Option<PredictedPlacement>,
    /// Its prediction for the actual placement (policies that predict).
    pub actual: Option<PredictedPlacement>,
}

/// One query as shadow mode saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShadowDecision {
    /// The query.
    pub query: QueryId,
    /// Its arrival, seconds since the start of the run.
    pub at_s: f64,
    /// Its SLO, seconds.
    pub slo_s: f64,
    /// Where it ran (the acting policy's choice).
    pub actual: Target,
    /// Where the shadow would have sent it (`None`: it would have rejected
    /// it).
    pub would: Option<Target>,
    /// The shadow's explanation.
    pub explanation: String,
    /// The shadow's prediction for its own choice.
    pub own: Option<PredictedPlacement>,
    /// The shadow's prediction for the actual placement.
    pub predicted_actual: Option<PredictedPlacement>,
    /// Seconds the query took, once it finished.
    pub latency_s: Option<f64>,
    /// Whether it missed its SLO (a failure misses), once it finished.
    pub missed: Option<bool>,
}

/// Predictions added up over one side's placements.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PredictedTotals {
    /// Placements with a prediction.
    pub predicted: u64,
    /// Of which predicted to miss their SLO.
    pub predicted_misses: u64,
    /// Expected violations added, summed.
    pub expected_violations: f64,
    /// Expected violations per predicted placement: the VR the shadow
    /// predicts for this side.
    pub predicted_vr: f64,
    /// Marginal cost predicted, summed, dollars.
    pub marginal_cost_usd: f64,
    /// Placements on the elastic tier.
    pub offloads: u64,
}

impl PredictedTotals {
    fn add(&mut self, placement: &PredictedPlacement) {
        self.predicted += 1;
        self.predicted_misses += u64::from(placement.predicted_miss);
        self.expected_violations += placement.expected_violations;
        self.marginal_cost_usd += placement.marginal_cost_usd;
        self.offloads += u64::from(placement.target == Target::Elastic);
        self.predicted_vr = self.expected_violations / self.predicted as f64;
    }
}

/// The comparison an operator reads: the acting policy's placements, as
/// they ran and as the shadow predicted them, against the shadow's own
/// choices as it predicted them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShadowReport {
    /// The acting policy's name.
    pub acting: String,
    /// The shadow's name.
    pub shadow: String,
    /// Queries both decided.
    pub decisions: u64,
    /// Of which the shadow would have placed where the query ran.
    pub agreed: u64,
    /// `agreed / decisions` (0 before any decision).
    pub agreement: f64,
    /// Decided queries that finished (completed, timed out or failed).
    pub finished: u64,
    /// Of which missed their SLO.
    pub violations: u64,
    /// `violations / finished`: the acting policy's realised VR.
    pub realised_vr: f64,
    /// The shadow's predictions for the actual placements: next to
    /// `realised_vr`, how far its predictions can be trusted.
    pub actual_predicted: PredictedTotals,
    /// The shadow's predictions for its own choices.
    pub shadow_predicted: PredictedTotals,
    /// Recent decisions, newest first.
    pub recent: Vec<ShadowDecision>,
}

/// The record shadow mode keeps. See the module docs.
#[derive(Clone, Debug)]
pub struct ShadowLedger {
    decisions: u64,
    agreed: u64,
    finished: u64,
    violations: u64,
    actual_predicted: PredictedTotals,
    shadow_predicted: PredictedTotals,
    /// Decided queries still running, with their SLOs.
    running: HashMap<QueryId, Duration>,
    recent: VecDeque<ShadowDecision>,
    recent_max: usize,
}

impl ShadowLedger {
    /// An empty ledger keeping `recent_max` recent decisions.
    pub fn new(recent_max: usize) -> Self {
        ShadowLedger {
            decisions: 0,
            agreed: 0,
            finished: 0,
            violations: 0,
            actual_predicted: PredictedTotals::default(),
            shadow_predicted: PredictedTotals::default(),
            running: HashMap::new(),
            recent: VecDeque::new(),
            recent_max,
        }
    }

    /// Records one query: where it ran and the shadow's verdict.
    pub fn handle_decision(&mut self, now: Instant, query: &Query, actual: Target, verdict: ShadowVerdict) {
        let would = match &verdict.routing {
            Routing::Dispatch(decision) => Some(decision.target),
            Routing::Reject { .. } => None,
        };
        let explanation = match verdict.routing {
            Routing::Dispatch(decision) => decision.explanation,
            Routing::Reject { reason } => format!("rejected: {reason}"),
        };
        self.decisions += 1;
        self.agreed += u64::from(would == Some(actual));
        if let Some(own) = &verdict.own {
            self.shadow_predicted.add(own);
        }
        if let Some(predicted) = &verdict.actual {
            self.actual_predicted.add(predicted);
        }
        self.running.insert(query.id, query.slo.latency);
        if self.recent_max == 0 {
            return;
        }
        if self.recent.len() == self.recent_max {
            self.recent.pop_back();
        }
        self.recent.push_front(ShadowDecision {
            query: query.id,
            at_s: now.as_secs_f64(),
            slo_s: query.slo.latency.as_secs_f64(),
            actual,
            would,
            explanation,
            own: verdict.own,
            predicted_actual: verdict.actual,
            latency_s: None,
            missed: None,
        });
    }

    /// Records how a decided query ended: its latency (`None`: it failed)
    /// and whether it timed out.
    fn handle_end(&mut self, query: QueryId, latency: Option<Duration>, timed_out: bool) {
        let Some(slo) = self.running.remove(&query) else { return };
        let missed = timed_out || latency.is_none_or(|l| l > slo);
        self.finished += 1;
        self.violations += u64::from(missed);
        if let Some(recent) = self.recent.iter_mut().find(|d| d.query == query) {
            recent.latency_s = latency.map(Duration::as_secs_f64);
            recent.missed = Some(missed);
        }
    }

    /// The comparison, with the policies' names.
    pub fn report(&self, acting: &str, shadow: &str) -> ShadowReport {
        let ratio = |part: u64, whole: u64| if whole == 0 { 0.0 } else { part as f64 / whole as f64 };
        ShadowReport {
            acting: acting.to_owned(),
            shadow: shadow.to_owned(),
            decisions: self.decisions,
            agreed: self.agreed,
            agreement: ratio(self.agreed, self.decisions),
            finished: self.finished,
            violations: self.violations,
            realised_vr: ratio(self.violations, self.finished),
            actual_predicted: self.actual_predicted.clone(),
            shadow_predicted: self.shadow_predicted.clone(),
            recent: self.recent.iter().cloned().collect(),
        }
    }
}

/// The acting policy places every query; the shadow decides alongside it.
/// See the module docs.
pub struct Shadowed {
    name: String,
    acting: Box<dyn RoutingPolicy>,
    shadow: Box<dyn RoutingPolicy>,
    ledger: ShadowLedger,
}

impl Shadowed {
    /// `acting` places the queries; `shadow` decides alongside it, and the
    /// ledger keeps `recent_max` recent decisions. Its name says both:
    /// `round-robin (shadow: slogate)`.
    pub fn new(acting: Box<dyn RoutingPolicy>, shadow: Box<dyn RoutingPolicy>, recent_max: usize) -> Self {
        let name = format!("{} (shadow: {})", acting.name(), shadow.name());
        Shadowed { name, acting, shadow, ledger: ShadowLedger::new(recent_max) }
    }

    /// The ledger.
    pub fn ledger(&self) -> &ShadowLedger {
        &self.ledger
    }
}

impl RoutingPolicy for Shadowed {
    fn name(&self) -> &str {
        &self.name
    }

    fn route(&mut self, now: Instant, query: &Query, pool: &Pool) -> Routing {
        let routing = self.acting.route(now, query, pool);
        let Routing::Dispatch(mut decision) = routing else { return routing };
        let verdict = self.shadow.route_in_shadow(now, query, pool, decision.target);
        let note = match &verdict.routing {
            Routing::Dispatch(would) if would.target == decision.target => {
                format!("; shadow {} agrees: {}", self.shadow.name(), would.explanation)
            }
            Routing::Dispatch(would) => format!("; shadow {} would send it to {}: {}", self.shadow.name(), would.target, would.explanation),
            Routing::Reject { reason } => format!("; shadow {} would reject it: {reason}", self.shadow.name()),
        };
        decision.explanation.push_str(&note);
        self.ledger.handle_decision(now, query, decision.target, verdict);
        Routing::Dispatch(decision)
    }

    fn handle_completion(&mut self, now: Instant, report: &ExecutionReport) {
        self.acting.handle_completion(now, report);
        self.shadow.handle_completion(now, report);
        self.ledger.handle_end(report.query, Some(report.latency()), report.outcome == ExecutionOutcome::TimedOut);
    }

    fn handle_failure(&mut self, now: Instant, query: QueryId, throttled: bool) {
        self.acting.handle_failure(now, query, throttled);
        self.shadow.handle_failure(now, query, throttled);
        self.ledger.handle_end(query, None, false);
    }

    // The autoscaler, the tuner and the calibration are the shadow's: they
    // decide on its predictions of the actual placements.
    fn predicted_latency(&self, query: QueryId) -> Option<Duration> {
        self.shadow.predicted_latency(query)
    }

    fn predicted_latencies(&self, cluster: ClusterId) -> Vec<(QueryId, Duration)> {
        self.shadow.predicted_latencies(cluster)
    }

    fn fork_planner(&self) -> Option<Box<dyn PlanningRouter>> {
        self.shadow.fork_planner()
    }

    fn margin(&self) -> Option<super::margin::MarginState> {
        self.shadow.margin()
    }

    fn violation_budget(&self) -> Option<super::budget::BudgetState> {
        self.shadow.violation_budget()
    }

    fn predictor_name(&self) -> Option<&str> {
        self.shadow.predictor_name()
    }

    fn install_model(&mut self, weights: std::sync::Arc<crate::predict::iconq::IconqWeights>) -> Result<(), String> {
        self.shadow.install_model(weights)
    }

    fn defer_fits(&mut self) {
        self.shadow.defer_fits();
    }

    fn take_fit_job(&mut self) -> Option<crate::predict::FitJob> {
        self.shadow.take_fit_job()
    }

    fn install_fit(&mut self, fit: crate::predict::Fit) {
        self.shadow.install_fit(fit);
    }

    fn shadow_report(&self) -> Option<ShadowReport> {
        Some(self.ledger.report(self.acting.name(), self.shadow.name()))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::billing::BillingConfig;
    use crate::model::{RunningQuery, TemplateId};
    use crate::route::slo::SloRouter;
    use crate::route::slo::tests::{pool, query, trained};
    use crate::route::{BaselinePolicy, RouteDecision};

    fn slogate() -> Box<dyn RoutingPolicy> {
        Box::new(SloRouter::new("slogate", trained(), BillingConfig::default()))
    }

    fn target(routing: &Routing) -> Option<Target> {
        match routing {
            Routing::Dispatch(RouteDecision { target, .. }) => Some(*target),
            Routing::Reject { .. } => None,
        }
    }

    fn report(query: QueryId, target: Target, arrival: Instant, finished: Instant, outcome: ExecutionOutcome) -> ExecutionReport {
        ExecutionReport { query, target, arrival, dispatched: arrival, started: Some(arrival), finished, outcome }
    }

    #[test]
    fn a_shadow_that_disagrees_records_its_choice_and_both_predictions_and_the_query_runs_where_the_baseline_sent_it() {
        // Template 10 takes 10 s alone on 16 RPU and 5 s on 32: a 7 s SLO
        // is met only on c1, where round-robin does not send the first
        // query.
        let mut shadowed = Shadowed::new(BaselinePolicy::RoundRobin.build(), slogate(), 8);
        let view = pool(&[16, 32]);
        let q = query(1, 10, 7.0, 0.0);
        let routing = shadowed.route(Instant::ZERO, &q, &view);
        let Routing::Dispatch(decision) = &routing else { panic!("{routing:?}") };
        assert_eq!(decision.target, Target::Cluster(ClusterId(0)));
        assert!(decision.explanation.contains("shadow slogate would send it to c1"), "{}", decision.explanation);

        let before = shadowed.shadow_report().expect("a shadowed policy reports");
        assert_eq!((before.decisions, before.agreed, before.finished), (1, 0, 0));
        assert_eq!((before.actual_predicted.predicted_misses, before.shadow_predicted.predicted_misses), (1, 0));
        let recent = &before.recent[0];
        assert_eq!((recent.actual, recent.would), (Target::Cluster(ClusterId(0)), Some(Target::Cluster(ClusterId(1)))));
        // The shadow tracks the query where it runs.
        assert_eq!(shadowed.predicted_latencies(ClusterId(0)).len(), 1);
        assert!(shadowed.predicted_latencies(ClusterId(1)).is_empty());

        let finished = Instant::from_secs_f64(10.5);
        shadowed.handle_completion(finished, &report(q.id, decision.target, Instant::ZERO, finished, ExecutionOutcome::Completed));
        let after = shadowed.shadow_report().expect("a shadowed policy reports");
        assert_eq!((after.finished, after.violations, after.realised_vr), (1, 1, 1.0));
        assert_eq!(after.recent[0].missed, Some(true));
        assert!(shadowed.predicted_latencies(ClusterId(0)).is_empty());
    }

    #[test]
    fn a_timed_out_query_counts_as_a_violation_and_a_failed_one_too() {
        let mut shadowed = Shadowed::new(BaselinePolicy::LeastLoaded.build(), slogate(), 8);
        let view = pool(&[16]);
        let (a, b) = (query(1, 1, 60.0, 0.0), query(2, 1, 60.0, 0.0));
        shadowed.route(Instant::ZERO, &a, &view);
        shadowed.route(Instant::ZERO, &b, &view);
        let at = Instant::from_secs_f64(3.0);
        shadowed.handle_completion(at, &report(a.id, Target::Cluster(ClusterId(0)), Instant::ZERO, at, ExecutionOutcome::TimedOut));
        shadowed.handle_failure(at, b.id, false);
        let report = shadowed.shadow_report().expect("a shadowed policy reports");
        assert_eq!((report.finished, report.violations), (2, 2));
        assert_eq!(report.recent.iter().find(|d| d.query == b.id).and_then(|d| d.latency_s), None);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Arrive { template: u32, slo_s: f64 },
        /// A running query ends: completed, timed out or failed.
        End { pick: usize, outcome: Option<ExecutionOutcome> },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1u32..=20, 1.0f64..80.0).prop_map(|(template, slo_s)| Op::Arrive { template, slo_s }),
            3 => (any::<usize>(), prop_oneof![Just(Some(ExecutionOutcome::Completed)), Just(Some(ExecutionOutcome::TimedOut)), Just(None)])
                .prop_map(|(pick, outcome)| Op::End { pick, outcome }),
        ]
    }

    proptest! {
        #[test]
        fn the_shadow_never_changes_where_a_query_runs_and_tracks_every_query_where_it_runs(
            ops in proptest::collection::vec(op(), 1..120),
            least_loaded in any::<bool>(),
        ) {
            let baseline = if least_loaded { BaselinePolicy::LeastLoaded } else { BaselinePolicy::RoundRobin };
            let mut alone = baseline.build();
            let mut shadowed = Shadowed::new(baseline.build(), slogate(), 16);
            let mut view = pool(&[16, 32, 16]);
            let mut running: Vec<(QueryId, Target, Instant)> = Vec::new();
            for (step, op) in ops.into_iter().enumerate() {
                let now = Instant::from_secs_f64(step as f64);
                match op {
                    Op::Arrive { template, slo_s } => {
                        let q = query(step as u64, template, slo_s, now.as_secs_f64());
                        let expected = alone.route(now, &q, &view);
                        let got = shadowed.route(now, &q, &view);
                        // (A): the same decision, the explanation aside.
                        prop_assert_eq!(target(&got), target(&expected));
                        if let (Routing::Dispatch(got), Routing::Dispatch(expected)) = (&got, &expected) {
                            prop_assert_eq!(got.predicted_latency, expected.predicted_latency);
                            prop_assert!(got.explanation.starts_with(&expected.explanation));
                        }
                        if let Some(Target::Cluster(c)) = target(&got) {
                            let cluster = view.clusters.iter_mut().find(|v| v.id == c).expect("a pool cluster");
                            cluster.running.push(RunningQuery { id: q.id, template: TemplateId(template), slo: q.slo, arrival: now, dispatched: now });
                            running.push((q.id, Target::Cluster(c), now));
                        }
                    }
                    Op::End { pick, outcome } if !running.is_empty() => {
                        let (id, target, arrival) = running.swap_remove(pick % running.len());
                        for cluster in &mut view.clusters {
                            cluster.running.retain(|r| r.id != id);
                        }
                        match outcome {
                            None => {
                                alone.handle_failure(now, id, false);
                                shadowed.handle_failure(now, id, false);
                            }
                            Some(outcome) => {
                                let report = report(id, target, arrival, now, outcome);
                                alone.handle_completion(now, &report);
                                shadowed.handle_completion(now, &report);
                            }
                        }
                    }
                    Op::End { .. } => {}
                }
                // (B): the shadow's view is the real one.
                for cluster in &view.clusters {
                    let mut tracked: Vec<QueryId> = shadowed.predicted_latencies(cluster.id).into_iter().map(|(q, _)| q).collect();
                    let mut actual: Vec<QueryId> = cluster.running.iter().map(|r| r.id).collect();
                    tracked.sort();
                    actual.sort();
                    prop_assert_eq!(tracked, actual, "cluster {}", cluster.id);
                }
                // (C): the ledger adds up.
                let report = shadowed.shadow_report().expect("a shadowed policy reports");
                prop_assert!(report.agreed <= report.decisions);
                prop_assert!(report.finished <= report.decisions);
                prop_assert!(report.violations <= report.finished);
                prop_assert!(report.recent.len() <= 16);
                prop_assert!(report.recent.windows(2).all(|w| w[0].at_s >= w[1].at_s));
            }
        }
    }
}
