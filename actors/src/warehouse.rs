//! The emulated warehouse as a live backend: [`slogate_world::World`]
//! driven by real (tokio) time, optionally compressed.
//!
//! Virtual time is `(tokio now − start) × compression`, so with a
//! compression of 1000 a 38-second query finishes in 38 ms of real time;
//! under `tokio::time::pause()` tests run in no real time at all. After
//! every input the actor asks the world for its next event and makes sure
//! a timer fires by then: it keeps the armed timer when that fires no
//! later (the world then just advances and the timer is armed again), and
//! otherwise arms a new one, which makes the older one stale (a timer
//! acts only if it is for the instant armed last; two for the same
//! instant are alike). Under load every dispatch moves the next event, mostly later
//! (the running queries slow down); a timer per dispatch cost a tokio
//! timer registration and, for four in ten dispatches at 25k queries/s,
//! a write to the runtime's wake-up descriptor.
//!
//! The actor decides nothing: it carries out dispatches and lifecycle
//! commands and hands each [`ExecutionReport`] back to whoever dispatched
//! the query. Its address is a [`Backend`].

use std::collections::HashMap;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::{ClusterId, ClusterState, PoolId, Query, QueryId, Rpu, Target};
use slogate_core::time::Instant;
use slogate_core::model::ExecutionReport;
use slogate_core::model::WarehouseEvent;
use slogate_world::{World, WorldConfig};
use tokio::sync::oneshot;

use crate::backend::{Backend, BackendState, CancelReason, ClusterUpdate, Completion, Execution, ExecuteError, Failure, LocalFuture};
use crate::clock::VirtualClock;

/// Requests a cluster; it is ready at once when `warm`, else after δ.
#[derive(Message)]
#[rtype(result = "ClusterId")]
pub struct AddCluster {
    /// Its size.
    pub size: Rpu,
    /// Start ready with a warm cache (a node's initial fleet).
    pub warm: bool,
}

/// Runs a query on a cluster; the report arrives on `reply` when it
/// finishes or times out.
#[derive(Message)]
#[rtype(result = "Result<(), ExecuteError>")]
pub struct Execute {
    /// The query (its id keys the reply).
    pub query: Query,
    /// Where.
    pub cluster: ClusterId,
    /// Receives the report, or the failure of a cancel.
    pub reply: oneshot::Sender<Result<ExecutionReport, Failure>>,
}

/// Runs a query on the elastic tier; the report arrives on `reply`.
#[derive(Message)]
#[rtype(result = "Result<(), ExecuteError>")]
pub struct ExecuteElastic {
    /// The query (its id keys the reply).
    pub query: Query,
    /// Receives the report, or the failure of a cancel.
    pub reply: oneshot::Sender<Result<ExecutionReport, Failure>>,
}

/// Drains and releases a cluster.
#[derive(Message)]
#[rtype(result = "Result<(), ExecuteError>")]
pub struct TearDown(pub ClusterId);

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "WarehouseState")]
pub struct GetState;

/// Registers a watcher of cluster state changes.
#[derive(Message)]
#[rtype(result = "()")]
pub struct WatchClusters {
    /// Echoed in every update.
    pub pool: PoolId,
    /// Receives the updates.
    pub recipient: Recipient<ClusterUpdate>,
}

/// One cluster as the warehouse reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WarehouseCluster {
    /// Identity.
    pub id: ClusterId,
    /// Size.
    pub size: Rpu,
    /// Lifecycle state.
    pub state: ClusterState,
    /// Queries executing (not queued).
    pub executing: usize,
    /// What the vendor has billed so far, dollars.
    pub billed_usd: f64,
}

/// The warehouse actor's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WarehouseState {
    /// Virtual time now, seconds since start.
    pub virtual_now_s: f64,
    /// Virtual seconds per real second.
    pub compression: f64,
    /// Every cluster ever requested.
    pub clusters: Vec<WarehouseCluster>,
    /// Queries dispatched and not yet finished.
    pub in_flight: usize,
    /// Queries finished since start.
    pub finished: u64,
    /// The elastic tier's bill so far, dollars (zero without one).
    pub elastic_billed_usd: f64,
    /// Elastic invocations so far.
    pub elastic_invocations: u64,
    /// Of which cold starts.
    pub elastic_cold_starts: u64,
}

/// The actor. See the module docs.
pub struct EmulatedWarehouse {
    world: World,
    clock: VirtualClock,
    pending: HashMap<QueryId, oneshot::Sender<Result<ExecutionReport, Failure>>>,
    watchers: Vec<(PoolId, Recipient<ClusterUpdate>)>,
    /// When the live timer fires, in virtual time; a timer for any other
    /// instant is stale.
    timer_armed_at: Option<Instant>,
    finished: u64,
    mailbox_capacity: usize,
}

impl EmulatedWarehouse {
    /// A warehouse with `config` on `clock`.
    pub fn new(config: WorldConfig, clock: VirtualClock, mailbox_capacity: usize) -> Self {
        EmulatedWarehouse {
            world: World::new(config),
            clock,
            pending: HashMap::new(),
            watchers: Vec::new(),
            timer_armed_at: None,
            finished: 0,
            mailbox_capacity,
        }
    }

    /// Virtual time now.
    fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Hands out finished executions and re-arms the timer.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        while let Some(event) = self.world.poll_event() {
            let (cluster, state) = match event {
                WarehouseEvent::QueryFinished(report) => {
                    self.finished += 1;
                    if let Some(reply) = self.pending.remove(&report.query) {
                        // The dispatcher may have gone away; the report is
                        // then nobody's to read.
                        let _ = reply.send(Ok(report));
                    }
                    continue;
                }
                WarehouseEvent::ClusterReady { cluster, .. } => (cluster, ClusterState::Ready),
                WarehouseEvent::ClusterGone { cluster, .. } => (cluster, ClusterState::Gone),
            };
            for (pool, watcher) in &self.watchers {
                watcher.do_send(ClusterUpdate { pool: pool.clone(), cluster, state, reason: None });
            }
        }
        let Some(at) = self.world.poll_timeout() else {
            self.timer_armed_at = None;
            return;
        };
        if self.timer_armed_at.is_some_and(|armed| armed <= at) {
            // The armed timer fires first; it advances the world, which
            // reports nothing yet, and arms the next.
            return;
        }
        self.timer_armed_at = Some(at);
        let real_delay = self.clock.real_duration(at - self.now());
        ctx.run_later(real_delay, move |actor, ctx| {
            if actor.timer_armed_at == Some(at) {
                actor.timer_armed_at = None;
                let now = actor.now().max(at);
                actor.advance(now, ctx);
            }
        });
    }

    fn advance(&mut self, now: Instant, ctx: &mut Context<Self>) {
        self.world.handle_timeout(now);
        self.pump(ctx);
    }
}

impl Actor for EmulatedWarehouse {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

impl Handler<AddCluster> for EmulatedWarehouse {
    type Result = MessageResult<AddCluster>;

    fn handle(&mut self, message: AddCluster, ctx: &mut Self::Context) -> Self::Result {
        let now = self.now();
        let id = self.world.add_cluster(now, message.size, message.warm);
        self.pump(ctx);
        MessageResult(id)
    }
}

impl Handler<Execute> for EmulatedWarehouse {
    type Result = Result<(), ExecuteError>;

    fn handle(&mut self, message: Execute, ctx: &mut Self::Context) -> Self::Result {
        if !self.world.cluster_ids().any(|id| id == message.cluster) {
            return Err(ExecuteError::UnknownCluster(message.cluster));
        }
        let state = self.world.cluster_state(message.cluster);
        if !matches!(state, ClusterState::Starting | ClusterState::Ready) {
            return Err(ExecuteError::NotAccepting(message.cluster, state));
        }
        if self.pending.contains_key(&message.query.id) {
            return Err(ExecuteError::Duplicate(message.query.id));
        }
        let now = self.now();
        self.pending.insert(message.query.id, message.reply);
        self.world.dispatch(now, &message.query, message.cluster);
        self.pump(ctx);
        Ok(())
    }
}

impl Handler<ExecuteElastic> for EmulatedWarehouse {
    type Result = Result<(), ExecuteError>;

    fn handle(&mut self, message: ExecuteElastic, ctx: &mut Self::Context) -> Self::Result {
        if self.world.config().elastic.is_none() {
            return Err(ExecuteError::NoElasticTier);
        }
        if self.pending.contains_key(&message.query.id) {
            return Err(ExecuteError::Duplicate(message.query.id));
        }
        let now = self.now();
        self.pending.insert(message.query.id, message.reply);
        self.world.dispatch_elastic(now, &message.query);
        self.pump(ctx);
        Ok(())
    }
}

/// Stops a running or queued query, as a cancel on the server does; its
/// execution ends as a [`Failure`] with the reason.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CancelQuery {
    /// The query.
    pub query: QueryId,
    /// Why.
    pub reason: CancelReason,
}

impl Handler<CancelQuery> for EmulatedWarehouse {
    type Result = ();

    fn handle(&mut self, message: CancelQuery, ctx: &mut Self::Context) {
        let now = self.now();
        if let Some(started) = self.world.cancel(now, message.query)
            && let Some(reply) = self.pending.remove(&message.query)
        {
            self.finished += 1;
            let failure = Failure { reason: message.reason.explanation().into(), sqlstate: None, started, finished: now, throttled: false };
            let _ = reply.send(Err(failure));
        }
        self.pump(ctx);
    }
}

impl Handler<TearDown> for EmulatedWarehouse {
    type Result = Result<(), ExecuteError>;

    fn handle(&mut self, message: TearDown, ctx: &mut Self::Context) -> Self::Result {
        if !self.world.cluster_ids().any(|id| id == message.0) {
            return Err(ExecuteError::UnknownCluster(message.0));
        }
        let now = self.now();
        self.world.tear_down(now, message.0);
        self.pump(ctx);
        Ok(())
    }
}

impl Handler<WatchClusters> for EmulatedWarehouse {
    type Result = ();

    fn handle(&mut self, message: WatchClusters, _ctx: &mut Self::Context) {
        self.watchers.push((message.pool, message.recipient));
    }
}

impl Handler<GetState> for EmulatedWarehouse {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        let now = self.now();
        let clusters = self
            .world
            .cluster_ids()
            .map(|id| WarehouseCluster {
                id,
                size: self.world.cluster_size(id),
                state: self.world.cluster_state(id),
                executing: self.world.executing_count(id),
                billed_usd: self.world.billed_cost_usd(id, now),
            })
            .collect();
        MessageResult(WarehouseState {
            virtual_now_s: now.as_secs_f64(),
            compression: self.clock.compression(),
            clusters,
            in_flight: self.pending.len(),
            finished: self.finished,
            elastic_billed_usd: self.world.elastic_cost_usd(),
            elastic_invocations: self.world.elastic_invocations().0,
            elastic_cold_starts: self.world.elastic_invocations().1,
        })
    }
}

fn not_answering(_: MailboxError) -> ExecuteError {
    ExecuteError::Unavailable("the emulated warehouse is not answering".into())
}

/// The emulated warehouse as a [`Backend`]: the embedded default.
impl Backend for Addr<EmulatedWarehouse> {
    fn kind(&self) -> &'static str {
        "emulated"
    }

    fn execute(&self, execution: Execution) -> LocalFuture<Result<Completion, ExecuteError>> {
        let warehouse = self.clone();
        Box::pin(async move {
            let (reply, report) = oneshot::channel();
            let Execution { query, target, .. } = execution;
            match target {
                Target::Cluster(cluster) => warehouse.send(Execute { query, cluster, reply }).await.map_err(not_answering)??,
                Target::Elastic => warehouse.send(ExecuteElastic { query, reply }).await.map_err(not_answering)??,
            }
            match report.await.map_err(|_| ExecuteError::Unavailable("the emulated warehouse dropped the query".into()))? {
                Ok(report) => Ok(Completion::Ran { report, result: None }),
                Err(failure) => Ok(Completion::Failed(failure)),
            }
        })
    }

    /// Stops the query in the world: it frees its share of the cluster at
    /// once, and its execution ends as a failure with the reason.
    fn cancel(&self, query: QueryId, reason: CancelReason) {
        self.do_send(CancelQuery { query, reason });
    }

    fn watch_clusters(&self, pool: PoolId, recipient: Recipient<ClusterUpdate>) {
        self.do_send(WatchClusters { pool, recipient });
    }

    fn state(&self) -> LocalFuture<Result<BackendState, ExecuteError>> {
        let warehouse = self.clone();
        Box::pin(async move {
            let state = warehouse.send(GetState).await.map_err(not_answering)?;
            Ok(BackendState {
                kind: "emulated",
                vendor_billed_usd: Some(state.clusters.iter().map(|c| c.billed_usd).sum()),
                elastic_billed_usd: state.elastic_billed_usd,
                executing: state.clusters.iter().map(|c| (c.id, c.executing)).collect(),
                detail: serde_json::to_value(&state).expect("the warehouse state serialises"),
            })
        })
    }
}
