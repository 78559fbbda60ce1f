//! The planner's warehouse: a [`Warehouse`] whose queries complete when a
//! learned predictor says so (AutoSLO's Workload Simulator), for the policy
//! tuner's batch simulations.
//!
//! It knows only what an operator knows: the predictor and its
//! calibration (both learned from observed executions), the pricing, and
//! the platform's published delays and timeout ([`PlannerTerms`]). It
//! never reads the emulated world.
//!
//! Execution is a fluid model built on the predictor's slowdown curve: a
//! query of template `t` on a cluster of size `s` progresses, while `n`
//! other queries run there, at `1 / predict(t, s, n)` of its work per
//! second, so that it takes exactly `predict(t, s, n)` if `n` stays put,
//! speeds up when neighbours leave and slows down when they arrive. (The
//! router's own predictions are guarded and never come down; completing by
//! them would make every query as slow as its busiest moment.) Each
//! query's work is its residual factor
//! ([`ResidualModel`](crate::tune::ResidualModel)) times its predicted
//! work. A cluster whose size has learned admission slots
//! ([`AdmissionModel`](crate::tune::AdmissionModel)) executes at most that
//! many at once and queues the rest in placement order, as the workload
//! manager does. A query placed on a starting cluster waits there and is
//! admitted when the cluster is ready. A query still running at
//! `query_timeout` after its arrival times out. Offloads take the
//! template's isolated latency at the tier's reference size, scaled by the
//! tier's speed, plus a cold start when no warm instance is left.
//!
//! # Properties
//!
//! - (A) Every dispatched query is reported finished exactly once.
//! - (B) Without residuals, a query running alone takes its predicted
//!   isolated latency; with a fixed set of neighbours, its predicted
//!   latency at that concurrency.
//! - (C) Deterministic: the same dispatches give the same events.
//! - (D) No cluster executes more queries than its learned slots.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::billing::{BillingConfig, BillingTimer};
use crate::elastic::{ElasticConfig, ElasticPool, ProvisionedBilling};
use crate::model::{ClusterId, ClusterState, ExecutionOutcome, ExecutionReport, Query, QueryId, Rpu, Target, TemplateId, WarehouseEvent};
use crate::predict::LatencyPredictor;
use crate::sim::Warehouse;
use crate::tune::calibration::Calibration;
use crate::time::{Duration, Instant};

/// What the planner knows of the platform besides its predictor.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlannerTerms {
    /// From a cluster's request to ready.
    pub spinup_delay: Duration,
    /// From a drained cluster's last query to gone.
    pub teardown_delay: Duration,
    /// A query running this long after its arrival is cancelled.
    pub query_timeout: Duration,
    /// Usage billing (the warehouse timer).
    pub billing: BillingConfig,
    /// Provisioned billing per RPU instead, if the pool bills so.
    pub provisioned: Option<ProvisionedBilling>,
    /// The elastic tier, if the pool has one.
    pub elastic: Option<ElasticConfig>,
    /// Executing slots per size and the latency spread, learned from
    /// observed executions.
    #[serde(default)]
    pub calibration: Calibration,
}

impl Default for PlannerTerms {
    fn default() -> Self {
        PlannerTerms {
            spinup_delay: Duration::from_secs(300),
            teardown_delay: Duration::from_secs(60),
            query_timeout: Duration::from_secs(3_600),
            billing: BillingConfig::default(),
            provisioned: None,
            elastic: None,
            calibration: Calibration::default(),
        }
    }
}

#[derive(Clone, Debug)]
struct Running {
    query: QueryId,
    template: TemplateId,
    arrival: Instant,
    dispatched: Instant,
    started: Instant,
    /// Its work left, in shares of its predicted work (it starts at its
    /// residual factor).
    remaining: f64,
    /// Share of its work done per second at the cluster's concurrency.
    rate: f64,
}

impl Running {
    /// When it completes at its current rate, from `since`, or times out.
    fn finish(&self, since: Instant, timeout: Duration) -> (Instant, ExecutionOutcome) {
        let done = if self.rate > 0.0 { since + Duration::from_secs_f64(self.remaining / self.rate) } else { Instant::MAX };
        let deadline = (self.arrival + timeout).max(self.started);
        if done > deadline { (deadline, ExecutionOutcome::TimedOut) } else { (done, ExecutionOutcome::Completed) }
    }
}

#[derive(Clone, Debug)]
struct Cluster {
    size: Rpu,
    state: ClusterState,
    requested_at: Instant,
    ready_at: Instant,
    gone_at: Option<Instant>,
    billing: BillingTimer,
    running: Vec<Running>,
    /// When the running queries' `remaining` was last brought up to date.
    progressed_to: Instant,
    /// Placed while starting, or while every slot was taken: `(query,
    /// dispatched)`, in order.
    waiting: VecDeque<(Query, Instant)>,
    /// Executing slots, if limited.
    slots: Option<u32>,
}

impl Cluster {
}

/// The planner's warehouse. See the module docs.
pub struct PredictedWarehouse {
    predictor: Box<dyn LatencyPredictor + Send>,
    terms: PlannerTerms,
    clusters: Vec<Cluster>,
    elastic_pool: ElasticPool,
    /// Running offloads: `(finish, report)`.
    elastic_running: Vec<(Instant, ExecutionReport)>,
    elastic_cost_usd: f64,
    events: VecDeque<WarehouseEvent>,
    now: Instant,
}

impl PredictedWarehouse {
    /// An empty warehouse completing queries by `predictor`.
    pub fn new(predictor: Box<dyn LatencyPredictor + Send>, terms: PlannerTerms) -> Self {
        PredictedWarehouse {
            predictor,
            terms,
            clusters: Vec::new(),
            elastic_pool: ElasticPool::new(),
            elastic_running: Vec::new(),
            elastic_cost_usd: 0.0,
            events: VecDeque::new(),
            now: Instant::ZERO,
        }
    }

    /// The terms it plans with.
    pub fn terms(&self) -> &PlannerTerms {
        &self.terms
    }

    /// Brings cluster `index`'s running queries' progress up to `now`.
    fn progress(&mut self, index: usize, now: Instant) {
        let cluster = &mut self.clusters[index];
        let elapsed = now.saturating_duration_since(cluster.progressed_to).as_secs_f64();
        for running in &mut cluster.running {
            running.remaining = (running.remaining - running.rate * elapsed).max(0.0);
        }
        cluster.progressed_to = cluster.progressed_to.max(now);
    }

    /// Every running query's rate at the cluster's current concurrency.
    fn rerate(&mut self, index: usize) {
        let cluster = &mut self.clusters[index];
        let others = cluster.running.len().saturating_sub(1) as u32;
        for running in &mut cluster.running {
            let latency = self.predictor.predict(running.template, cluster.size, others).as_secs_f64();
            running.rate = if latency > 0.0 { 1.0 / latency } else { f64::INFINITY };
        }
    }

    fn start(&mut self, index: usize, now: Instant, query: &Query, dispatched: Instant) {
        self.progress(index, now);
        let residual = self.terms.calibration.residuals.factor(query.id);
        let cluster = &mut self.clusters[index];
        cluster.running.push(Running {
            query: query.id,
            template: query.template,
            arrival: query.arrival,
            dispatched,
            started: now,
            remaining: residual,
            rate: 0.0,
        });
        cluster.billing.handle_query_start(now);
        self.rerate(index);
    }

    /// Starts waiting queries on cluster `index`, in order, while it has
    /// free slots.
    /// Starts waiting queries on cluster `index`, in order, while it has
    /// free slots.
    fn admit(&mut self, index: usize, now: Instant) {
        loop {
            let cluster = &self.clusters[index];
            if cluster.waiting.is_empty() || cluster.slots.is_some_and(|slots| cluster.running.len() >= slots as usize) {
                return;
            }
            let (query, dispatched) = self.clusters[index].waiting.pop_front().expect("not empty");
            self.start(index, now, &query, dispatched);
        }
    }

    /// The earliest predicted event strictly after nothing: `(at, kind)`.
    fn next_event(&self) -> Option<(Instant, Next)> {
        let timeout = self.terms.query_timeout;
        let mut best: Option<(Instant, Next)> = None;
        let mut consider = |at: Instant, next: Next| {
            if best.as_ref().is_none_or(|(b, n)| (at, next.rank()) < (*b, n.rank())) {
                best = Some((at, next));
            }
        };
        for (index, cluster) in self.clusters.iter().enumerate() {
            match cluster.state {
                ClusterState::Starting => consider(cluster.ready_at, Next::Ready(index)),
                ClusterState::Draining if cluster.running.is_empty() => {
                    if let Some(gone) = cluster.gone_at {
                        consider(gone, Next::Gone(index));
                    }
                }
                _ => {}
            }
            if let Some((position, (at, _))) = cluster
                .running
                .iter()
                .enumerate()
                .map(|(i, r)| (i, r.finish(cluster.progressed_to, timeout)))
                .min_by_key(|(i, (at, _))| (*at, cluster.running[*i].query))
            {
                consider(at, Next::Finish(index, position));
            }
        }
        if let Some((position, (at, _))) = self.elastic_running.iter().enumerate().min_by_key(|(_, (at, r))| (*at, r.query)) {
            consider(*at, Next::ElasticFinish(position));
        }
        best
    }

    fn apply(&mut self, at: Instant, next: Next) {
        match next {
            Next::Ready(index) => {
                let cluster = &mut self.clusters[index];
                cluster.state = if cluster.gone_at.is_some() { ClusterState::Draining } else { ClusterState::Ready };
                self.events.push_back(WarehouseEvent::ClusterReady { cluster: ClusterId(index as u32), at });
                self.admit(index, at);
                self.drain_if_empty(index, at);
            }
            Next::Finish(index, position) => {
                let timeout = self.terms.query_timeout;
                let since = self.clusters[index].progressed_to;
                let (finished, outcome) = self.clusters[index].running[position].finish(since, timeout);
                self.progress(index, finished);
                let cluster = &mut self.clusters[index];
                let running = cluster.running.swap_remove(position);
                cluster.billing.handle_query_end(finished);
                self.rerate(index);
                self.admit(index, finished);
                self.events.push_back(WarehouseEvent::QueryFinished(ExecutionReport {
                    query: running.query,
                    target: Target::Cluster(ClusterId(index as u32)),
                    arrival: running.arrival,
                    dispatched: running.dispatched,
                    started: Some(running.started),
                    finished,
                    outcome,
                }));
                self.drain_if_empty(index, at);
            }
            Next::ElasticFinish(position) => {
                let (_, report) = self.elastic_running.swap_remove(position);
                if let Some(config) = &self.terms.elastic {
                    self.elastic_pool.finish(at, config);
                }
                self.events.push_back(WarehouseEvent::QueryFinished(report));
            }
            Next::Gone(index) => {
                self.clusters[index].state = ClusterState::Gone;
                self.events.push_back(WarehouseEvent::ClusterGone { cluster: ClusterId(index as u32), at });
            }
        }
    }

    /// A draining cluster with nothing left is gone after the teardown
    /// delay.
    fn drain_if_empty(&mut self, index: usize, at: Instant) {
        let teardown = self.terms.teardown_delay;
        let cluster = &mut self.clusters[index];
        if cluster.state == ClusterState::Draining && cluster.running.is_empty() && cluster.waiting.is_empty() {
            let gone = at + teardown;
            cluster.gone_at = Some(cluster.gone_at.map_or(gone, |g| g.max(gone)));
        }
    }

    fn advance(&mut self, now: Instant) {
        while let Some((at, next)) = self.next_event().filter(|(at, _)| *at <= now) {
            self.now = self.now.max(at);
            self.apply(at, next);
        }
        self.now = self.now.max(now);
    }
}

/// A pending event, in handling order at one instant: finishes, then
/// clusters ready, then clusters gone.
#[derive(Clone, Copy, Debug)]
enum Next {
    Finish(usize, usize),
    ElasticFinish(usize),
    Ready(usize),
    Gone(usize),
}

impl Next {
    fn rank(&self) -> u8 {
        match self {
            Next::Finish(..) | Next::ElasticFinish(_) => 0,
            Next::Ready(_) => 1,
            Next::Gone(_) => 2,
        }
    }
}

impl Warehouse for PredictedWarehouse {
    fn add_cluster(&mut self, now: Instant, size: Rpu, warm: bool) -> ClusterId {
        self.advance(now);
        let id = ClusterId(u32::try_from(self.clusters.len()).expect("fewer than 2^32 clusters"));
        let ready_at = if warm { now } else { now + self.terms.spinup_delay };
        self.clusters.push(Cluster {
            size,
            state: if warm { ClusterState::Ready } else { ClusterState::Starting },
            requested_at: now,
            ready_at,
            gone_at: None,
            billing: BillingTimer::new(self.terms.billing.clone(), size),
            running: Vec::new(),
            progressed_to: now,
            waiting: VecDeque::new(),
            slots: self.terms.calibration.admission.slots(size),
        });
        if warm {
            self.events.push_back(WarehouseEvent::ClusterReady { cluster: id, at: now });
        }
        id
    }

    fn dispatch(&mut self, now: Instant, query: &Query, cluster: ClusterId) {
        self.advance(now);
        let index = cluster.0 as usize;
        match self.clusters[index].state {
            ClusterState::Ready => {
                self.clusters[index].waiting.push_back((query.clone(), now));
                self.admit(index, now);
            }
            ClusterState::Starting => self.clusters[index].waiting.push_back((query.clone(), now)),
            state => panic!("dispatch to {cluster}, which is {state:?}: a policy bug the simulator checks"),
        }
    }

    fn has_elastic(&self) -> bool {
        self.terms.elastic.is_some()
    }

    fn dispatch_elastic(&mut self, now: Instant, query: &Query) {
        self.advance(now);
        let config = self.terms.elastic.as_ref().expect("the simulator offloads only with a tier");
        let reference = self.predictor.isolated(query.template, config.reference_size);
        let warm = self.elastic_pool.start(now, config);
        let run = if warm { Duration::ZERO } else { config.cold_start } + config.execution_time(reference);
        self.elastic_cost_usd += config.invocation_cost_usd(run);
        let report = ExecutionReport {
            query: query.id,
            target: Target::Elastic,
            arrival: query.arrival,
            dispatched: now,
            started: Some(now),
            finished: now + run,
            outcome: ExecutionOutcome::Completed,
        };
        self.elastic_running.push((now + run, report));
    }

    fn tear_down(&mut self, now: Instant, cluster: ClusterId) {
        self.advance(now);
        let index = cluster.0 as usize;
        let c = &mut self.clusters[index];
        match c.state {
            ClusterState::Starting if c.waiting.is_empty() => {
                c.state = ClusterState::Draining;
                c.gone_at = Some(now + self.terms.teardown_delay);
            }
            // It serves what it holds once ready, then drains.
            ClusterState::Starting => c.gone_at = Some(c.ready_at),
            ClusterState::Ready | ClusterState::Unhealthy => {
                c.state = ClusterState::Draining;
                self.drain_if_empty(index, now);
            }
            ClusterState::Draining | ClusterState::Gone => {}
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next_event().map(|(at, _)| at.max(self.now))
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.advance(now);
    }

    fn poll_event(&mut self) -> Option<WarehouseEvent> {
        self.events.pop_front()
    }

    fn cluster_ids(&self) -> Vec<ClusterId> {
        (0..self.clusters.len()).map(|i| ClusterId(i as u32)).collect()
    }

    fn cluster_state(&self, cluster: ClusterId) -> ClusterState {
        self.clusters[cluster.0 as usize].state
    }

    fn cluster_size(&self, cluster: ClusterId) -> Rpu {
        self.clusters[cluster.0 as usize].size
    }

    fn spinup_delay(&self) -> Duration {
        self.terms.spinup_delay
    }

    fn billed_time(&self, cluster: ClusterId, now: Instant) -> Duration {
        let c = &self.clusters[cluster.0 as usize];
        match &self.terms.provisioned {
            None => c.billing.active_time(now),
            Some(_) => {
                // From request until gone, or until the last event for
                // `Instant::MAX`.
                let open_end = if now == Instant::MAX { self.now } else { now };
                let end = c.gone_at.map_or(open_end, |gone| gone.min(now));
                end.saturating_duration_since(c.requested_at)
            }
        }
    }

    fn billed_cost_usd(&self, cluster: ClusterId, now: Instant) -> f64 {
        let c = &self.clusters[cluster.0 as usize];
        match &self.terms.provisioned {
            None => c.billing.cost_usd(now),
            Some(billing) => {
                let end = c.requested_at + self.billed_time(cluster, now);
                billing.cost_usd(c.requested_at, end) * f64::from(c.size.0)
            }
        }
    }

    fn elastic_cost_usd(&self) -> f64 {
        self.elastic_cost_usd
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PoolId, QueryId, Slo, TemplateId};
    use crate::predict::Observation;
    use crate::route::RoundRobin;
    use crate::sim::Simulation;

    /// Template t takes t seconds alone on 16 RPU and (1 + n)·t with n
    /// neighbours.
    #[derive(Clone)]
    struct Linear;

    impl LatencyPredictor for Linear {
        fn name(&self) -> &str {
            "linear"
        }
        fn observe(&mut self, _observation: &Observation) {}
        fn isolated(&self, template: TemplateId, _size: Rpu) -> Duration {
            Duration::from_secs(u64::from(template.0))
        }
        fn predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> Duration {
            self.isolated(template, size).mul_f64(1.0 + f64::from(neighbours))
        }
    }

    fn query(id: u64, template: u32, arrival_s: f64) -> Query {
        Query { id: QueryId(id), pool: PoolId::default(), template: TemplateId(template), slo: Slo { latency: Duration::from_secs(100) }, arrival: Instant::from_secs_f64(arrival_s) }
    }

    fn warehouse(ready: &[u32]) -> PredictedWarehouse {
        let mut w = PredictedWarehouse::new(Box::new(Linear), PlannerTerms::default());
        for &size in ready {
            w.add_cluster(Instant::ZERO, Rpu(size), true);
        }
        w
    }

    #[test]
    fn queries_progress_at_the_predicted_rate_of_the_current_concurrency() {
        // Query 1 (10 s alone) runs alone for 1 s (a tenth of its work);
        // query 2 (5 s alone) joins and both run at the rate of one
        // neighbour (20 s and 10 s): query 2 ends at 11 s, when query 1 has
        // 0.4 left, which alone takes 4 s more: it ends at 15 s.
        let mut sim = Simulation::new(warehouse(&[16]), RoundRobin::default(), vec![query(1, 10, 0.0), query(2, 5, 1.0)]);
        sim.drive_until_idle();
        let finished: Vec<(u64, f64)> = sim.records().iter().map(|r| (r.query.0, (r.finished.as_secs_f64() * 1e3).round() / 1e3)).collect();
        assert_eq!(finished, vec![(2, 11.0), (1, 15.0)]);
        assert!(sim.summary().cost_usd > 0.0);
    }

    #[test]
    fn a_starting_cluster_holds_its_queries_until_ready_and_timeouts_cancel() {
        let terms = PlannerTerms { spinup_delay: Duration::from_secs(30), query_timeout: Duration::from_secs(50), ..PlannerTerms::default() };
        let mut w = PredictedWarehouse::new(Box::new(Linear), terms);
        let id = w.add_cluster(Instant::ZERO, Rpu(16), false);
        w.dispatch(Instant::ZERO, &query(1, 10, 0.0), id);
        w.dispatch(Instant::ZERO, &query(2, 40, 0.0), id);
        w.handle_timeout(Instant::from_secs_f64(1_000.0));
        let events: Vec<WarehouseEvent> = std::iter::from_fn(|| w.poll_event()).collect();
        assert!(matches!(events[0], WarehouseEvent::ClusterReady { at, .. } if at == Instant::from_secs_f64(30.0)));
        // Both start at 30 s, one neighbour each: query 1 takes 20 s, done
        // at 50 s; query 2 has done a quarter of its 80 s by then, and its
        // 50 s timeout comes first.
        let reports: Vec<&ExecutionReport> = events.iter().filter_map(|e| if let WarehouseEvent::QueryFinished(r) = e { Some(r) } else { None }).collect();
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().all(|r| r.started == Some(Instant::from_secs_f64(30.0))));
        let timed_out = reports.iter().find(|r| r.query == QueryId(2)).unwrap();
        assert_eq!((timed_out.outcome, timed_out.finished), (ExecutionOutcome::TimedOut, Instant::from_secs_f64(50.0)));
    }

    fn queued_terms() -> PlannerTerms {
        let mut calibration = Calibration::default();
        calibration.admission.slots.insert(Rpu(16), 1);
        PlannerTerms { calibration, ..PlannerTerms::default() }
    }

    #[test]
    fn a_full_cluster_queues_in_placement_order() {
        // One slot: query 1 (10 s) runs alone; queries 2 (10 s) and 3 (2 s)
        // queue behind it in order, each then running alone.
        let mut w = PredictedWarehouse::new(Box::new(Linear), queued_terms());
        w.add_cluster(Instant::ZERO, Rpu(16), true);
        w.dispatch(Instant::ZERO, &query(1, 10, 0.0), ClusterId(0));
        w.dispatch(Instant::from_secs_f64(1.0), &query(2, 10, 1.0), ClusterId(0));
        w.dispatch(Instant::from_secs_f64(2.0), &query(3, 2, 2.0), ClusterId(0));
        w.handle_timeout(Instant::from_secs_f64(1_000.0));
        let reports: Vec<ExecutionReport> = std::iter::from_fn(|| w.poll_event()).filter_map(|e| if let WarehouseEvent::QueryFinished(r) = e { Some(r) } else { None }).collect();
        let spans: Vec<(u64, f64, f64)> = reports.iter().map(|r| (r.query.0, r.started.unwrap().as_secs_f64(), r.finished.as_secs_f64())).collect();
        assert_eq!(spans, vec![(1, 0.0, 10.0), (2, 10.0, 20.0), (3, 20.0, 22.0)]);
    }

    proptest::proptest! {
        #[test]
        fn every_query_finishes_once_and_no_cluster_exceeds_its_slots(
            arrivals in proptest::collection::vec((0.0f64..300.0, 1u32..30), 1..60),
            slots in 1u32..4,
        ) {
            let mut terms = queued_terms();
            terms.calibration.admission.slots.insert(Rpu(16), slots);
            let mut w = PredictedWarehouse::new(Box::new(Linear), terms);
            w.add_cluster(Instant::ZERO, Rpu(16), true);
            let mut sorted = arrivals.clone();
            sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
            for (i, (at, template)) in sorted.iter().enumerate() {
                w.dispatch(Instant::from_secs_f64(*at), &query(i as u64, *template, *at), ClusterId(0));
            }
            w.handle_timeout(Instant::from_secs_f64(1e6));
            let reports: Vec<ExecutionReport> = std::iter::from_fn(|| w.poll_event()).filter_map(|e| if let WarehouseEvent::QueryFinished(r) = e { Some(r) } else { None }).collect();
            let mut ids: Vec<u64> = reports.iter().map(|r| r.query.0).collect();
            ids.sort_unstable();
            proptest::prop_assert_eq!(ids, (0..sorted.len() as u64).collect::<Vec<_>>());
            for r in &reports {
                let started = r.started.unwrap();
                let executing = reports.iter().filter(|o| o.started.unwrap() <= started && o.finished > started).count();
                proptest::prop_assert!(executing <= slots as usize, "{} executing at {:?} with {} slots", executing, started, slots);
            }
        }
    }

    #[test]
    fn a_torn_down_cluster_drains_then_goes() {
        let mut w = warehouse(&[16]);
        w.dispatch(Instant::ZERO, &query(1, 10, 0.0), ClusterId(0));
        w.tear_down(Instant::from_secs_f64(1.0), ClusterId(0));
        assert_eq!(w.cluster_state(ClusterId(0)), ClusterState::Draining);
        w.handle_timeout(Instant::from_secs_f64(100.0));
        assert_eq!(w.cluster_state(ClusterId(0)), ClusterState::Gone);
        assert!(std::iter::from_fn(|| w.poll_event()).any(|e| matches!(e, WarehouseEvent::ClusterGone { at, .. } if at == Instant::from_secs_f64(70.0))));
    }

    #[test]
    fn offloads_take_the_scaled_isolated_latency_and_a_cold_start_once() {
        let elastic = ElasticConfig { cold_start: Duration::from_secs(2), speed_factor: 0.5, ..ElasticConfig::default() };
        let mut w = PredictedWarehouse::new(Box::new(Linear), PlannerTerms { elastic: Some(elastic), ..PlannerTerms::default() });
        w.dispatch_elastic(Instant::ZERO, &query(1, 10, 0.0));
        w.handle_timeout(Instant::from_secs_f64(100.0));
        w.dispatch_elastic(Instant::from_secs_f64(100.0), &query(2, 10, 100.0));
        w.handle_timeout(Instant::from_secs_f64(1_000.0));
        let finished: Vec<f64> =
            std::iter::from_fn(|| w.poll_event()).filter_map(|e| if let WarehouseEvent::QueryFinished(r) = e { Some(r.latency().as_secs_f64()) } else { None }).collect();
        assert_eq!(finished, vec![22.0, 20.0]);
        assert!(w.elastic_cost_usd() > 0.0);
    }
}
