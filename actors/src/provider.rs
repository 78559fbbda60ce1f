//! The Provider actor: cluster lifecycle requests to the platform that
//! hosts the clusters. The emulated provider asks the emulated warehouse,
//! which applies the spinup delay δ and the teardown delay ζ; EC2 and
//! Redshift Serverless providers will answer the same messages.
//!
//! It keeps a bounded log of what it was asked and when, for operators.

use std::collections::VecDeque;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::{ClusterId, PoolId, Rpu};

use crate::clock::VirtualClock;
use crate::warehouse::{AddCluster, EmulatedWarehouse, ExecuteError, TearDown};

/// Requests a new cluster; it is ready after the platform's spinup delay.
#[derive(Message)]
#[rtype(result = "Result<ClusterId, ExecuteError>")]
pub struct SpinUp {
    /// For the log.
    pub pool: PoolId,
    /// Its size.
    pub size: Rpu,
}

/// Asks the platform to drain and release a cluster.
#[derive(Message)]
#[rtype(result = "Result<(), ExecuteError>")]
pub struct SpinDown {
    /// For the log.
    pub pool: PoolId,
    /// Which.
    pub cluster: ClusterId,
}

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "ProviderState")]
pub struct GetState;

/// One lifecycle request.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LifecycleRecord {
    /// When, virtual seconds since the node started.
    pub at_s: f64,
    /// The pool.
    pub pool: PoolId,
    /// `spin_up` or `spin_down`.
    pub action: &'static str,
    /// The cluster, once known.
    pub cluster: Option<ClusterId>,
    /// Its size, for spinups.
    pub size: Option<Rpu>,
    /// The platform's answer.
    pub result: String,
}

/// The Provider's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProviderState {
    /// `emulated`.
    pub kind: &'static str,
    /// Recent requests, newest first.
    pub recent: Vec<LifecycleRecord>,
}

/// Most lifecycle records kept.
const RECENT_MAX: usize = 256;

/// The emulated provider.
pub struct EmulatedProvider {
    warehouse: Addr<EmulatedWarehouse>,
    clock: VirtualClock,
    recent: VecDeque<LifecycleRecord>,
    mailbox_capacity: usize,
}

impl EmulatedProvider {
    /// A provider for clusters of `warehouse`.
    pub fn new(warehouse: Addr<EmulatedWarehouse>, clock: VirtualClock, mailbox_capacity: usize) -> Self {
        EmulatedProvider { warehouse, clock, recent: VecDeque::new(), mailbox_capacity }
    }

    fn log(&mut self, record: LifecycleRecord) {
        if self.recent.len() == RECENT_MAX {
            self.recent.pop_back();
        }
        self.recent.push_front(record);
    }
}

impl Actor for EmulatedProvider {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
    }
}

impl Handler<SpinUp> for EmulatedProvider {
    type Result = ResponseActFuture<Self, Result<ClusterId, ExecuteError>>;

    fn handle(&mut self, message: SpinUp, _ctx: &mut Self::Context) -> Self::Result {
        let warehouse = self.warehouse.clone();
        let at_s = self.clock.now().as_secs_f64();
        let size = message.size;
        Box::pin(async move { warehouse.send(AddCluster { size, warm: false }).await }.into_actor(self).map(
            move |reply, actor, _ctx| {
                let result = reply.map_err(|_| ExecuteError::Unavailable("the warehouse is not answering".into()));
                actor.log(LifecycleRecord {
                    at_s,
                    pool: message.pool,
                    action: "spin_up",
                    cluster: result.as_ref().ok().copied(),
                    size: Some(size),
                    result: result.as_ref().map_or_else(ToString::to_string, |_| "requested".into()),
                });
                result
            },
        ))
    }
}

impl Handler<SpinDown> for EmulatedProvider {
    type Result = ResponseActFuture<Self, Result<(), ExecuteError>>;

    fn handle(&mut self, message: SpinDown, _ctx: &mut Self::Context) -> Self::Result {
        let warehouse = self.warehouse.clone();
        let at_s = self.clock.now().as_secs_f64();
        let cluster = message.cluster;
        Box::pin(async move { warehouse.send(TearDown(cluster)).await }.into_actor(self).map(move |reply, actor, _ctx| {
            let result = reply.unwrap_or_else(|_| Err(ExecuteError::Unavailable("the warehouse is not answering".into())));
            actor.log(LifecycleRecord {
                at_s,
                pool: message.pool,
                action: "spin_down",
                cluster: Some(cluster),
                size: None,
                result: result.as_ref().map_or_else(ToString::to_string, |()| "draining".into()),
            });
            result
        }))
    }
}

impl Handler<GetState> for EmulatedProvider {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(ProviderState { kind: "emulated", recent: self.recent.iter().cloned().collect() })
    }
}
