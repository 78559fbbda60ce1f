//! The discrete-event engine.
//!
//! A [`Simulation`] replays a list of arrivals against a completion model
//! (a [`Warehouse`]) in virtual time, routing each query with a
//! [`RoutingPolicy`] and, optionally, changing the cluster set with a
//! [`Controller`]. For evaluations the completion model is the **world**
//! (`slogate_world::World`, ground truth); planning components run the
//! same engine on a predictor-driven model instead, and the two are never
//! mixed.
//!
//! Events, in the order they are handled at one instant: world events
//! (completions, timeouts, clusters ready or gone), then controller timers,
//! then arrivals. Ties within a kind go by id, so a run is a pure function of
//! its inputs and seeds.
//!
//! The `slogate-world` crate's docs run a simulation on the world.

mod scripted;
pub mod warehouse;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::invariants;
use crate::model::{ClusterId, ClusterState, ClusterView, Pool, Query, QueryId, Rpu, RunningQuery, Slo, Target, TemplateId};
use crate::route::{Routing, RoutingPolicy};
use crate::time::{Duration, Instant};
use crate::model::{ExecutionOutcome, ExecutionReport};
use crate::stats::percentile;
use crate::model::WarehouseEvent;

pub use scripted::ScriptedController;
pub use warehouse::Warehouse;

/// A change to the cluster set, asked for by a [`Controller`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterCommand {
    /// Request a new cluster; it is ready after the spinup delay.
    SpinUp {
        /// Its size.
        size: Rpu,
    },
    /// Drain a cluster and release it.
    TearDown {
        /// Which.
        cluster: ClusterId,
    },
}

/// Something a controller may react to.
#[derive(Clone, Copy, Debug)]
pub enum Observation<'a> {
    /// A query arrived and was routed.
    Arrival {
        /// The query.
        query: &'a Query,
        /// Where it went, if anywhere.
        target: Option<Target>,
    },
    /// An execution finished.
    Finished(&'a ExecutionReport),
    /// A cluster became ready.
    ClusterReady(ClusterId),
    /// A cluster was released.
    ClusterGone(ClusterId),
}

/// Changes the cluster set: autoscalers, scheduled spinups, scripts.
///
/// Call order per instant: `handle_observation` for each event, then
/// `handle_timeout` if `poll_timeout` is due, then `poll_command` until
/// `None`. Besides the pool, a controller may read the routing policy's
/// predictions and fork it for the planner's replay; it never sees the
/// world.
pub trait Controller {
    /// Reacts to an event.
    fn handle_observation(&mut self, now: Instant, observation: Observation<'_>, pool: &Pool, router: &dyn RoutingPolicy);
    /// The next instant the controller wants to act on its own.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Acts at a due timer.
    fn handle_timeout(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy);
    /// The next command to carry out.
    fn poll_command(&mut self) -> Option<ClusterCommand>;
}

/// A shared controller: the caller keeps a handle to read it after the run.
impl<C: Controller> Controller for std::rc::Rc<std::cell::RefCell<C>> {
    fn handle_observation(&mut self, now: Instant, observation: Observation<'_>, pool: &Pool, router: &dyn RoutingPolicy) {
        self.borrow_mut().handle_observation(now, observation, pool, router);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.borrow().poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy) {
        self.borrow_mut().handle_timeout(now, pool, router);
    }
    fn poll_command(&mut self) -> Option<ClusterCommand> {
        self.borrow_mut().poll_command()
    }
}

/// How a query ended, from the client's side.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QueryOutcome {
    /// It completed.
    Completed,
    /// It was cancelled at the warehouse's timeout.
    TimedOut,
    /// It could not be placed.
    Rejected {
        /// Why.
        reason: String,
    },
}

/// One query's fate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryRecord {
    /// The query.
    pub query: QueryId,
    /// Its template.
    pub template: TemplateId,
    /// Its SLO.
    pub slo: Slo,
    /// When it arrived.
    pub arrival: Instant,
    /// Where it ran.
    pub target: Option<Target>,
    /// When it started executing, if it did.
    pub started: Option<Instant>,
    /// When it finished (or was rejected).
    pub finished: Instant,
    /// How it ended.
    pub outcome: QueryOutcome,
}

impl QueryRecord {
    /// Client-side latency.
    pub fn latency(&self) -> Duration {
        self.finished - self.arrival
    }

    /// Whether it met its SLO (only a completed query can).
    pub fn slo_met(&self) -> bool {
        self.outcome == QueryOutcome::Completed && self.slo.is_met_by(self.latency())
    }
}

/// Aggregate results of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimSummary {
    /// Queries that arrived.
    pub queries: usize,
    /// Queries that completed.
    pub completed: usize,
    /// Queries cancelled at the timeout.
    pub timed_out: usize,
    /// Queries that could not be placed.
    pub rejected: usize,
    /// Queries that missed their SLO (timed out and rejected included).
    pub violations: usize,
    /// `violations / queries` (0 for an empty run).
    pub violation_rate: f64,
    /// Total billed cost, clusters and elastic tier, in dollars.
    pub cost_usd: f64,
    /// Of which the elastic tier's.
    pub elastic_cost_usd: f64,
    /// Queries that ran on the elastic tier.
    pub offloaded: usize,
    /// Billed active time summed over clusters, in hours.
    pub cluster_hours: f64,
    /// Billed RPU-hours.
    pub rpu_hours: f64,
    /// Client-side latency percentiles over completed and timed-out
    /// queries, in seconds.
    pub latency_s_p50: f64,
    /// 95th percentile.
    pub latency_s_p95: f64,
    /// 99th percentile.
    pub latency_s_p99: f64,
    /// When the last event happened.
    pub makespan: Duration,
    /// Events the engine handled.
    pub events: u64,
}

/// Where the simulator gets its next input from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    World(Instant),
    Controller(Instant),
    Arrival(Instant),
}

/// The engine. See the module docs.
pub struct Simulation<P: RoutingPolicy, W: Warehouse> {
    world: W,
    policy: P,
    controller: Option<Box<dyn Controller>>,
    pool: Pool,
    arrivals: Vec<Query>,
    next_arrival: usize,
    pending: HashMap<QueryId, (TemplateId, Slo, Target)>,
    records: Vec<QueryRecord>,
    now: Instant,
    events: u64,
    decision_hash: u64,
}

impl<P: RoutingPolicy, W: Warehouse> Simulation<P, W> {
    /// A simulation of `arrivals` (any order) on `world`'s clusters.
    pub fn new(world: W, policy: P, mut arrivals: Vec<Query>) -> Self {
        arrivals.sort_by_key(|q| (q.arrival, q.id));
        let pool_id = arrivals.first().map(|q| q.pool.clone()).unwrap_or_default();
        let mut sim = Simulation {
            world,
            policy,
            controller: None,
            pool: Pool { id: pool_id, clusters: Vec::new() },
            arrivals,
            next_arrival: 0,
            pending: HashMap::new(),
            records: Vec::new(),
            now: Instant::ZERO,
            events: 0,
            decision_hash: FNV_OFFSET,
        };
        sim.sync_clusters();
        sim.drain_world();
        sim
    }

    /// Adds a controller that may change the cluster set.
    pub fn with_controller(mut self, controller: Box<dyn Controller>) -> Self {
        self.controller = Some(controller);
        self
    }

    /// The current virtual time.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// The pool as policies see it.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The routing policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// Every finished query, in finishing order.
    pub fn records(&self) -> &[QueryRecord] {
        &self.records
    }

    /// The warehouse (for the world, ground truth: for reports, never for
    /// decisions).
    pub fn world(&self) -> &W {
        &self.world
    }

    /// A hash of every decision and outcome so far, in order: equal across
    /// runs exactly when the runs are identical.
    pub fn decision_log_hash(&self) -> u64 {
        self.decision_hash
    }

    /// Handles the next input. Returns `false` when nothing is left.
    pub fn step(&mut self) -> bool {
        let Some(next) = self.next_input() else { return false };
        self.events += 1;
        match next {
            Next::World(at) => {
                self.now = at;
                self.world.handle_timeout(at);
            }
            Next::Controller(at) => {
                self.now = at;
                if let Some(controller) = self.controller.as_mut() {
                    controller.handle_timeout(at, &self.pool, &self.policy);
                }
            }
            Next::Arrival(at) => {
                self.now = at;
                let query = self.arrivals[self.next_arrival].clone();
                self.next_arrival += 1;
                self.arrive(&query);
            }
        }
        self.drain_world();
        self.run_commands();
        if cfg!(debug_assertions) {
            invariants::assert_pool_consistent(&self.pool);
        }
        true
    }

    /// Runs until no input is left.
    pub fn drive_until_idle(&mut self) {
        while self.step() {}
        assert!(self.pending.is_empty(), "every dispatched query finishes: {} still pending", self.pending.len());
        assert_eq!(self.records.len(), self.arrivals.len(), "every arrival has a record");
    }

    /// Aggregates the run so far.
    pub fn summary(&self) -> SimSummary {
        let queries = self.arrivals.len();
        let count = |f: &dyn Fn(&QueryRecord) -> bool| self.records.iter().filter(|r| f(r)).count();
        let completed = count(&|r| r.outcome == QueryOutcome::Completed);
        let timed_out = count(&|r| r.outcome == QueryOutcome::TimedOut);
        let rejected = count(&|r| matches!(r.outcome, QueryOutcome::Rejected { .. }));
        let violations = count(&|r| !r.slo_met());
        let end = self.now;
        let mut cost_usd = 0.0;
        let mut cluster_hours = 0.0;
        let mut rpu_hours = 0.0;
        for id in self.world.cluster_ids() {
            let hours = self.world.billed_time(id, Instant::MAX).as_secs_f64() / 3_600.0;
            cost_usd += self.world.billed_cost_usd(id, Instant::MAX);
            cluster_hours += hours;
            rpu_hours += hours * f64::from(self.world.cluster_size(id).0);
        }
        let elastic_cost_usd = self.world.elastic_cost_usd();
        cost_usd += elastic_cost_usd;
        let offloaded = count(&|r| r.target == Some(Target::Elastic));
        let mut latencies: Vec<f64> = self
            .records
            .iter()
            .filter(|r| !matches!(r.outcome, QueryOutcome::Rejected { .. }))
            .map(|r| r.latency().as_secs_f64())
            .collect();
        latencies.sort_by(f64::total_cmp);
        SimSummary {
            queries,
            completed,
            timed_out,
            rejected,
            violations,
            violation_rate: if queries == 0 { 0.0 } else { violations as f64 / queries as f64 },
            cost_usd,
            elastic_cost_usd,
            offloaded,
            cluster_hours,
            rpu_hours,
            latency_s_p50: percentile(&latencies, 0.50),
            latency_s_p95: percentile(&latencies, 0.95),
            latency_s_p99: percentile(&latencies, 0.99),
            makespan: end - Instant::ZERO,
            events: self.events,
        }
    }

    fn next_input(&self) -> Option<Next> {
        let world = self.world.poll_timeout().map(Next::World);
        let controller = self.controller.as_ref().and_then(|c| c.poll_timeout()).map(Next::Controller);
        let arrival = self.arrivals.get(self.next_arrival).map(|q| Next::Arrival(q.arrival));
        [world, controller, arrival].into_iter().flatten().min_by_key(|next| match *next {
            Next::World(at) => (at, 0),
            Next::Controller(at) => (at, 1),
            Next::Arrival(at) => (at, 2),
        })
    }

    fn arrive(&mut self, query: &Query) {
        let routing = self.policy.route(self.now, query, &self.pool);
        let target = match routing {
            Routing::Dispatch(decision) => match decision.target {
                Target::Cluster(id) => {
                    let view = self.pool.clusters.get(id.0 as usize);
                    match view.map(|c| c.state) {
                        Some(ClusterState::Ready | ClusterState::Starting) => Ok(decision.target),
                        Some(state) => Err(format!("{} chose {id}, which is {state:?}", self.policy.name())),
                        None => Err(format!("{} chose unknown cluster {id}", self.policy.name())),
                    }
                }
                Target::Elastic if self.world.has_elastic() => Ok(Target::Elastic),
                Target::Elastic => Err("no elastic tier is configured for this pool".to_owned()),
            },
            Routing::Reject { reason } => Err(reason),
        };
        match target {
            Ok(Target::Cluster(id)) => {
                self.hash(&[1, query.id.0, u64::from(id.0)]);
                self.world.dispatch(self.now, query, id);
                self.pool.clusters[id.0 as usize].running.push(RunningQuery {
                    id: query.id,
                    template: query.template,
                    slo: query.slo,
                    arrival: query.arrival,
                    dispatched: self.now,
                });
                self.pending.insert(query.id, (query.template, query.slo, Target::Cluster(id)));
                self.observe(Observation::Arrival { query, target: Some(Target::Cluster(id)) });
            }
            Ok(Target::Elastic) => {
                self.hash(&[8, query.id.0]);
                self.world.dispatch_elastic(self.now, query);
                self.pending.insert(query.id, (query.template, query.slo, Target::Elastic));
                self.observe(Observation::Arrival { query, target: Some(Target::Elastic) });
            }
            Err(reason) => {
                self.hash(&[2, query.id.0]);
                self.records.push(QueryRecord {
                    query: query.id,
                    template: query.template,
                    slo: query.slo,
                    arrival: query.arrival,
                    target: None,
                    started: None,
                    finished: self.now,
                    outcome: QueryOutcome::Rejected { reason },
                });
                self.observe(Observation::Arrival { query, target: None });
            }
        }
    }

    fn drain_world(&mut self) {
        while let Some(event) = self.world.poll_event() {
            match event {
                WarehouseEvent::QueryFinished(report) => {
                    let (template, slo, target) =
                        self.pending.remove(&report.query).expect("world reports only dispatched queries");
                    if let Target::Cluster(cluster) = report.target {
                        let running = &mut self.pool.clusters[cluster.0 as usize].running;
                        let index = running.iter().position(|r| r.id == report.query).expect("finished query was running");
                        running.remove(index);
                    }
                    let outcome = match report.outcome {
                        ExecutionOutcome::Completed => QueryOutcome::Completed,
                        ExecutionOutcome::TimedOut => QueryOutcome::TimedOut,
                    };
                    self.hash(&[3, report.query.0, report.finished.as_micros()]);
                    self.records.push(QueryRecord {
                        query: report.query,
                        template,
                        slo,
                        arrival: report.arrival,
                        target: Some(target),
                        started: report.started,
                        finished: report.finished,
                        outcome,
                    });
                    self.policy.handle_completion(self.now, &report);
                    self.observe(Observation::Finished(&report));
                }
                WarehouseEvent::ClusterReady { cluster, at } => {
                    self.hash(&[4, u64::from(cluster.0), at.as_micros()]);
                    self.sync_clusters();
                    self.observe(Observation::ClusterReady(cluster));
                }
                WarehouseEvent::ClusterGone { cluster, at } => {
                    self.hash(&[5, u64::from(cluster.0), at.as_micros()]);
                    self.sync_clusters();
                    self.observe(Observation::ClusterGone(cluster));
                }
            }
        }
    }

    fn run_commands(&mut self) {
        loop {
            let Some(command) = self.controller.as_mut().and_then(|c| c.poll_command()) else { return };
            match command {
                ClusterCommand::SpinUp { size } => {
                    let id = self.world.add_cluster(self.now, size, false);
                    self.hash(&[6, u64::from(id.0), u64::from(size.0)]);
                }
                ClusterCommand::TearDown { cluster } => {
                    if self.pool.clusters.get(cluster.0 as usize).is_some() {
                        self.world.tear_down(self.now, cluster);
                        self.hash(&[7, u64::from(cluster.0)]);
                    }
                }
            }
            self.sync_clusters();
            self.drain_world();
        }
    }

    /// Mirrors the world's cluster list and states into the pool view.
    fn sync_clusters(&mut self) {
        for id in self.world.cluster_ids() {
            let state = self.world.cluster_state(id);
            match self.pool.clusters.get_mut(id.0 as usize) {
                Some(view) => view.state = state,
                None => {
                    let delay = if state == ClusterState::Starting { self.world.spinup_delay() } else { Duration::ZERO };
                    self.pool.clusters.push(ClusterView {
                        id,
                        size: self.world.cluster_size(id),
                        state,
                        requested_at: self.now,
                        ready_at: self.now + delay,
                        running: Vec::new(),
                    });
                }
            }
        }
    }

    fn observe(&mut self, observation: Observation<'_>) {
        if let Some(controller) = self.controller.as_mut() {
            controller.handle_observation(self.now, observation, &self.pool, &self.policy);
        }
    }

    fn hash(&mut self, words: &[u64]) {
        for word in words {
            for byte in word.to_le_bytes() {
                self.decision_hash = (self.decision_hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
            }
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

