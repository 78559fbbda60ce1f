//! The Autoscaler actor: one per pool, a thin shell around core's
//! [`Autoscaler`].
//!
//! The RouterShard sends it a [`ScaleNotice`] after every routing decision,
//! every completion and every cluster becoming ready or gone, each with a
//! snapshot of the pool and the router's current predictions for the
//! running queries. The actor feeds core's autoscaler, which runs the
//! teardown and spinup triggers on it. When a trigger fires, the actor asks
//! the RouterShard for a fork of its router and the pool as it is, and runs
//! the size selector on that fork here, on the actor's own thread, off the
//! routing path. Core's commands become `RequestCluster` and
//! `ReleaseCluster` messages to the RouterShard, which asks the Provider
//! and keeps the trackers. A timer wakes it for teardowns that fall due
//! while nothing happens.
//!
//! Every trigger that fires, every selection (each candidate's simulated
//! VR and cost, and the choice) and every command is kept in core's
//! bounded decision log, served with the latest trigger evaluation by
//! [`GetState`] and [`GetScaleDecisions`].
//!
//! A tuned configuration ([`ApplyTuning`], from the policy tuner or the
//! config file) replaces the knobs and sets a **daily schedule** of planned
//! spinups, each at a time of day in UTC. The actor maps today's 00:00 UTC
//! and the length of a day onto the virtual clock ([`daily_schedule`]);
//! core's autoscaler fires every occurrence once a day from then on.

use std::collections::HashMap;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::{ClusterId, ExecutionReport, Pool, PoolId, Query, QueryId, Target};
use slogate_core::route::{Routing, RoutingPolicy};
use slogate_core::scale::autoscaler::AutoscalerStats;
use slogate_core::scale::trigger::TriggerEvaluation;
use slogate_core::objective::Outcome;
use slogate_core::scale::{Autoscaler, AutoscalerConfig, AutoscalerPolicy, DailySchedule, ScaleDecision, ScheduledSpinup};
use slogate_core::sim::{ClusterCommand, Controller, Observation};
use slogate_core::time::Duration;

use crate::clock::{VirtualClock, unix_now_s};
use crate::router::{ForkPlanner, ReleaseCluster, RequestCluster, RouterShard};

/// What happened in the pool.
#[derive(Clone, Debug)]
pub enum ScaleEvent {
    /// A query arrived and was routed (or not).
    Arrival {
        /// The query.
        query: Query,
        /// Where it went.
        target: Option<Target>,
    },
    /// An execution finished.
    Finished(ExecutionReport),
    /// A cluster became ready.
    ClusterReady(ClusterId),
    /// A cluster was released.
    ClusterGone(ClusterId),
    /// A starting cluster never served: its provider gave up on it.
    ClusterAbandoned {
        /// Which.
        cluster: ClusterId,
        /// Why, from the provider.
        reason: String,
    },
}

/// The pool as the router sees it, with its predictions for the running
/// queries.
#[derive(Clone, Debug)]
pub struct PoolSnapshot {
    /// The pool view.
    pub pool: Pool,
    /// The router's current predictions, per running query it placed.
    pub predictions: Vec<(QueryId, Duration)>,
}

/// A notification from the RouterShard.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ScaleNotice {
    /// What happened.
    pub event: ScaleEvent,
    /// The pool right after it.
    pub snapshot: PoolSnapshot,
}

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "AutoscalerState")]
pub struct GetState;

/// Reads the recent scaling decisions, newest first.
#[derive(Message)]
#[rtype(result = "Vec<ScaleDecision>")]
pub struct GetScaleDecisions {
    /// At most this many.
    pub limit: usize,
}

/// A tuned configuration to apply.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct ApplyTuning {
    /// The knobs.
    pub knobs: AutoscalerConfig,
    /// Planned spinups, each `at` as time after 00:00 UTC, every day.
    pub daily: Vec<ScheduledSpinup>,
    /// What the tuner expected of it, if it came from the tuner.
    pub expected: Option<Outcome>,
    /// Where it came from (`tuner`, `config`).
    pub source: String,
}

/// The configuration in force, as applied.
#[derive(Clone, Debug, Serialize)]
pub struct ActiveTuning {
    /// Where it came from.
    pub source: String,
    /// Planned spinups, daily, by time after 00:00 UTC.
    pub daily: Vec<ScheduledSpinup>,
    /// The tuner's expected VR and cost per day, if any.
    pub expected: Option<Outcome>,
    /// Wall-clock UNIX seconds when applied.
    pub applied_at_unix_s: i64,
}

/// The Autoscaler's observable state.
#[derive(Clone, Debug, Serialize)]
pub struct AutoscalerState {
    /// The pool.
    pub pool: PoolId,
    /// The strategy.
    pub policy: AutoscalerPolicy,
    /// The knobs.
    pub config: AutoscalerConfig,
    /// Counters.
    pub stats: AutoscalerStats,
    /// The latest spinup trigger evaluation, fired or not.
    pub last_trigger_evaluation: Option<TriggerEvaluation>,
    /// Whether a selection is running or waiting for the router's fork.
    pub selection_pending: bool,
    /// Commands (and router forks) that failed.
    pub commands_failed: u64,
    /// The last failure's reason.
    pub last_command_error: Option<String>,
    /// The tuned configuration in force, if any.
    pub tuning: Option<ActiveTuning>,
    /// Planned spinups still to fire, in virtual time.
    pub planned: Vec<ScheduledSpinup>,
    /// Whether this node decides for the pool now (false on a node of a
    /// fleet that does not own it).
    pub deciding: bool,
    /// Observations and timer checks skipped while it did not decide.
    pub skipped_as_standby: u64,
}

/// The router as a snapshot: predictions only (what the triggers read). It
/// cannot route or fork; the actor fetches a fork from the RouterShard when
/// a selection needs one.
struct SnapshotRouter {
    predictions: HashMap<QueryId, Duration>,
}

impl SnapshotRouter {
    fn new(snapshot: &PoolSnapshot) -> Self {
        SnapshotRouter { predictions: snapshot.predictions.iter().copied().collect() }
    }
}

impl RoutingPolicy for SnapshotRouter {
    fn name(&self) -> &str {
        "snapshot"
    }
    fn route(&mut self, _now: slogate_core::time::Instant, _query: &Query, _pool: &Pool) -> Routing {
        Routing::Reject { reason: "a snapshot does not route".to_owned() }
    }
    fn predicted_latency(&self, query: QueryId) -> Option<Duration> {
        self.predictions.get(&query).copied()
    }
}

/// The actor. See the module docs.
pub struct AutoscalerActor {
    pool: PoolId,
    core: Autoscaler,
    router: Addr<RouterShard>,
    clock: VirtualClock,
    last_snapshot: Option<PoolSnapshot>,
    selecting: bool,
    commands_failed: u64,
    last_command_error: Option<String>,
    mailbox_capacity: usize,
    tuning: Option<ActiveTuning>,
    /// Whether this node decides for the pool now (see [`OwnershipGate`]).
    gate: Option<OwnershipGate>,
    /// Observations and timer checks skipped while another node decided.
    skipped_as_standby: u64,
}

/// Whether this node decides for a pool now: in a fleet, only the pool's
/// owner routes, scales and tunes it, and a node stops deciding the moment
/// its ownership lapses. Without one, the node always decides.
pub type OwnershipGate = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

/// `daily` (times after 00:00 UTC of the node's calendar) on the virtual
/// clock: the calendar day that holds `calendar_now_s` (the node's calendar
/// at virtual instant `now`) started `calendar_now_s mod 86,400` virtual
/// seconds before `now`, and a day lasts 86,400 virtual seconds.
pub fn daily_schedule(daily: Vec<ScheduledSpinup>, calendar_now_s: f64, now: slogate_core::time::Instant) -> DailySchedule {
    let into_day = calendar_now_s.rem_euclid(86_400.0);
    // Any day's start will do; virtual instants are not negative, so a day
    // that began before the clock did is named by the next one.
    let mut day_start_s = now.as_secs_f64() - into_day;
    if day_start_s < 0.0 {
        day_start_s += 86_400.0;
    }
    DailySchedule { spinups: daily, day_start: slogate_core::time::Instant::from_secs_f64(day_start_s), day_length: Duration::from_secs(86_400) }
}

impl AutoscalerActor {
    /// An autoscaler for `pool`, acting through `router`.
    pub fn new(pool: PoolId, core: Autoscaler, router: Addr<RouterShard>, clock: VirtualClock, mailbox_capacity: usize) -> Self {
        AutoscalerActor {
            pool,
            core: core.defer_selections(),
            router,
            clock,
            last_snapshot: None,
            selecting: false,
            commands_failed: 0,
            last_command_error: None,
            mailbox_capacity,
            tuning: None,
            gate: None,
            skipped_as_standby: 0,
        }
    }

    /// The autoscaler decides only while `gate` says so.
    pub fn with_gate(mut self, gate: OwnershipGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// Whether it decides now; counts a skip when it does not.
    fn deciding(&mut self) -> bool {
        let deciding = self.gate.as_ref().is_none_or(|gate| gate());
        if !deciding {
            self.skipped_as_standby += 1;
        }
        deciding
    }

    /// Carries out core's commands, then starts a pending selection.
    fn act(&mut self, ctx: &mut Context<Self>) {
        while let Some(command) = self.core.poll_command() {
            let router = self.router.clone();
            let pool = self.pool.clone();
            let spinup = match command {
                ClusterCommand::SpinUp { size } => Some(size),
                ClusterCommand::TearDown { .. } => None,
            };
            let sent = async move {
                match command {
                    ClusterCommand::SpinUp { size } => router.send(RequestCluster { pool, size }).await.map(|r| r.map(|_| ())),
                    ClusterCommand::TearDown { cluster } => router.send(ReleaseCluster { pool, cluster, force: true }).await,
                }
            };
            ctx.spawn(sent.into_actor(self).map(move |reply, actor, _ctx| {
                let error = match reply {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "the router shard is not answering".to_owned(),
                };
                // A refused spinup is a decision of its own, with its reason.
                if let Some(size) = spinup {
                    actor.core.record_refusal(actor.clock.now(), size, error.clone());
                }
                actor.commands_failed += 1;
                actor.last_command_error = Some(error);
            }));
        }
        if self.core.pending_selection() && !self.selecting {
            self.selecting = true;
            let request = self.router.send(ForkPlanner { pool: self.pool.clone() });
            ctx.spawn(request.into_actor(self).map(|reply, actor, ctx| {
                actor.selecting = false;
                match reply {
                    Ok(Ok((planner, pool))) => {
                        let now = actor.clock.now();
                        actor.core.run_pending_selection(now, &pool, planner.as_ref());
                        actor.act(ctx);
                    }
                    Ok(Err(e)) => {
                        actor.commands_failed += 1;
                        actor.last_command_error = Some(format!("cannot fork the router: {e}"));
                    }
                    Err(_) => {
                        actor.commands_failed += 1;
                        actor.last_command_error = Some("the router shard is not answering".to_owned());
                    }
                }
            }));
        }
    }
}

impl Actor for AutoscalerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        // Teardowns fall due while nothing happens: check the core's timer
        // every 50 ms of real time.
        ctx.run_interval(std::time::Duration::from_millis(50), |actor, ctx| {
            let now = actor.clock.now();
            if actor.core.poll_timeout().is_some_and(|at| at <= now) && actor.deciding() {
                // Before any notice the pool is not known yet; a planned
                // spinup still fires.
                let snapshot = actor.last_snapshot.clone().unwrap_or_else(|| PoolSnapshot {
                    pool: Pool { id: actor.pool.clone(), clusters: Vec::new() },
                    predictions: Vec::new(),
                });
                let router = SnapshotRouter::new(&snapshot);
                actor.core.handle_timeout(now, &snapshot.pool, &router);
                actor.act(ctx);
            }
        });
    }
}

impl Handler<ScaleNotice> for AutoscalerActor {
    type Result = ();

    fn handle(&mut self, notice: ScaleNotice, ctx: &mut Self::Context) {
        if !self.deciding() {
            return;
        }
        let now = self.clock.now();
        let router = SnapshotRouter::new(&notice.snapshot);
        let pool = &notice.snapshot.pool;
        match &notice.event {
            ScaleEvent::Arrival { query, target } => {
                self.core.handle_observation(now, Observation::Arrival { query, target: *target }, pool, &router);
            }
            ScaleEvent::Finished(report) => self.core.handle_observation(now, Observation::Finished(report), pool, &router),
            ScaleEvent::ClusterReady(cluster) => self.core.handle_observation(now, Observation::ClusterReady(*cluster), pool, &router),
            ScaleEvent::ClusterGone(cluster) => self.core.handle_observation(now, Observation::ClusterGone(*cluster), pool, &router),
            ScaleEvent::ClusterAbandoned { cluster, reason } => {
                self.core.record_abandoned(now, *cluster, reason.clone());
                self.core.handle_observation(now, Observation::ClusterGone(*cluster), pool, &router)
            }
        }
        self.last_snapshot = Some(notice.snapshot);
        self.act(ctx);
    }
}

impl Handler<GetState> for AutoscalerActor {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(AutoscalerState {
            pool: self.pool.clone(),
            policy: self.core.policy(),
            config: self.core.config().clone(),
            stats: self.core.stats().clone(),
            last_trigger_evaluation: self.core.last_evaluation().cloned(),
            selection_pending: self.core.pending_selection() || self.selecting,
            commands_failed: self.commands_failed,
            last_command_error: self.last_command_error.clone(),
            tuning: self.tuning.clone(),
            planned: self.core.schedule().copied().collect(),
            deciding: self.gate.as_ref().is_none_or(|gate| gate()),
            skipped_as_standby: self.skipped_as_standby,
        })
    }
}

impl Handler<ApplyTuning> for AutoscalerActor {
    type Result = ();

    fn handle(&mut self, message: ApplyTuning, _ctx: &mut Self::Context) {
        self.core.set_config(message.knobs);
        let now = self.clock.now();
        self.core.set_daily_schedule(now, daily_schedule(message.daily.clone(), self.clock.calendar_now_s(), now));
        self.tuning = Some(ActiveTuning { source: message.source, daily: message.daily, expected: message.expected, applied_at_unix_s: unix_now_s() as i64 });
    }
}

impl Handler<GetScaleDecisions> for AutoscalerActor {
    type Result = MessageResult<GetScaleDecisions>;

    fn handle(&mut self, message: GetScaleDecisions, _ctx: &mut Self::Context) -> Self::Result {
        let decisions: Vec<ScaleDecision> = self.core.decisions().cloned().collect();
        MessageResult(decisions.into_iter().rev().take(message.limit).collect())
    }
}

#[cfg(test)]
mod tests {
    use slogate_core::model::Rpu;
    use slogate_core::time::Instant;

    use super::*;

    #[test]
    fn a_calendar_day_maps_onto_the_virtual_clock() {
        // The node's calendar says 01:30 UTC at virtual 100,000 s: today
        // started 5,400 virtual seconds ago and a day lasts 86,400.
        let daily = vec![ScheduledSpinup { at: Instant::from_secs_f64(7_200.0), size: Rpu(16) }];
        let schedule = daily_schedule(daily.clone(), 20_000.0 * 86_400.0 + 5_400.0, Instant::from_secs_f64(100_000.0));
        assert_eq!(schedule.day_start, Instant::from_secs_f64(100_000.0 - 5_400.0));
        assert_eq!(schedule.day_length, Duration::from_secs(86_400));
        assert_eq!(schedule.spinups, daily);
    }

    #[test]
    fn a_day_that_began_before_the_clock_is_named_by_the_next_one() {
        // 05:00 on the calendar at virtual 100 s: today began before the
        // clock did, so the schedule counts from tomorrow's 00:00.
        let schedule = daily_schedule(Vec::new(), 20_000.0 * 86_400.0 + 18_000.0, Instant::from_secs_f64(100.0));
        assert_eq!(schedule.day_start, Instant::from_secs_f64(100.0 - 18_000.0 + 86_400.0));
    }
}
