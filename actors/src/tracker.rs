//! The ClusterTracker actor: one per cluster. It holds the cluster's
//! running queries, slogate's own billing timer for it (core's
//! [`BillingTimer`], so the node knows its cost without asking the
//! vendor), and its lifecycle; it makes the backend calls for the cluster
//! (the RouterShard dispatches through it) through the pool's
//! [`Backend`], and asks the pool's [`Provider`] to release it.

use actix::prelude::*;
use serde::Serialize;
use slogate_core::billing::{BillingConfig, BillingTimer};
use slogate_core::elastic::ProvisionedBilling;
use slogate_core::model::{ClusterId, ClusterState, PoolId, Query, QueryId, Rpu, Target};
use slogate_core::time::Instant;
use tokio::sync::oneshot;

use crate::backend::{Backend, CancelReason, ClusterUpdate, Completion, Execution, ExecuteError};
use crate::clock::VirtualClock;
use crate::provider::Provider;

/// Runs a query on this tracker's cluster; its completion arrives on
/// `reply` (a failure too: only a lost tracker drops it).
#[derive(Message)]
#[rtype(result = "Result<(), ExecuteError>")]
pub struct Dispatch {
    /// The query.
    pub query: Query,
    /// Its SQL text, for backends that run SQL.
    pub sql: Option<std::sync::Arc<str>>,
    /// Receives the completion.
    pub reply: oneshot::Sender<Completion>,
}

/// Stops a query running on this cluster, on the server.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Cancel {
    /// The query.
    pub query: QueryId,
    /// Why.
    pub reason: CancelReason,
}

/// Drains and releases the cluster.
#[derive(Message)]
#[rtype(result = "Result<(), ExecuteError>")]
pub struct Release;

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "TrackerState")]
pub struct GetState;

#[derive(Message)]
#[rtype(result = "()")]
struct Finished {
    query: QueryId,
    completion: Completion,
    reply: oneshot::Sender<Completion>,
}

/// A ClusterTracker's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrackerState {
    /// The cluster.
    pub cluster: ClusterId,
    /// Its size.
    pub size: Rpu,
    /// Its lifecycle state.
    pub state: ClusterState,
    /// Why it is unhealthy, when it is.
    pub unhealthy_reason: Option<String>,
    /// Queries sent to it and not finished.
    pub running: Vec<QueryId>,
    /// Queries finished on it.
    pub finished: u64,
    /// slogate's estimate of what the cluster has billed, dollars.
    pub billed_usd_estimate: f64,
    /// Billing windows opened (each pays the minimum).
    pub billing_windows: u32,
}

struct Running {
    query: QueryId,
    billed: bool,
}

/// The actor. See the module docs.
pub struct ClusterTracker {
    pool: PoolId,
    cluster: ClusterId,
    size: Rpu,
    state: ClusterState,
    unhealthy_reason: Option<String>,
    /// Whether provisioning finished: the warehouse runs (and bills) the
    /// queries it holds from then on, even on a cluster released while it
    /// was starting.
    provisioned: bool,
    billing: BillingTimer,
    /// Provisioned billing: the terms, since when, and until when (gone).
    provisioned_billing: Option<(ProvisionedBilling, Instant, Option<Instant>)>,
    /// The last instant given to `billing`, which takes inputs in time
    /// order: reports arrive a little after their virtual finish time.
    billing_clock: Instant,
    running: Vec<Running>,
    finished: u64,
    backend: std::sync::Arc<dyn Backend>,
    provider: std::sync::Arc<dyn Provider>,
    clock: VirtualClock,
    mailbox_capacity: usize,
}

/// What a tracker starts from.
pub struct TrackerSetup {
    /// The pool the cluster belongs to.
    pub pool: PoolId,
    /// The cluster (already requested from `backend`).
    pub cluster: ClusterId,
    /// Its size.
    pub size: Rpu,
    /// Its state now.
    pub state: ClusterState,
    /// Prices and minimum window for the billing estimate.
    pub billing: BillingConfig,
    /// Set when the pool's clusters are provisioned: the estimate is then
    /// from the tracker's start until the cluster is gone.
    pub provisioned: Option<ProvisionedBilling>,
    /// The backend that runs the cluster's queries.
    pub backend: std::sync::Arc<dyn Backend>,
    /// The platform that releases it.
    pub provider: std::sync::Arc<dyn Provider>,
    /// The node's clock.
    pub clock: VirtualClock,
    /// Mailbox capacity.
    pub mailbox_capacity: usize,
}

impl ClusterTracker {
    /// A tracker as `setup` describes.
    pub fn new(setup: TrackerSetup) -> Self {
        let TrackerSetup { pool, cluster, size, state, billing, provisioned, backend, provider, clock, mailbox_capacity } = setup;
        ClusterTracker {
            pool,
            cluster,
            size,
            state,
            unhealthy_reason: None,
            provisioned: state != ClusterState::Starting,
            billing: BillingTimer::new(billing, size),
            billing_clock: Instant::ZERO,
            provisioned_billing: provisioned.map(|b| (b, clock.now(), None)),
            running: Vec::new(),
            finished: 0,
            backend,
            provider,
            clock,
            mailbox_capacity,
        }
    }
}

impl ClusterTracker {
    /// `at`, or the last billing input if that is later.
    fn billing_instant(&mut self, at: Instant) -> Instant {
        self.billing_clock = self.billing_clock.max(at);
        self.billing_clock
    }
}

impl Actor for ClusterTracker {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        self.backend.watch_clusters(self.pool.clone(), ctx.address().recipient());
    }
}

impl Handler<Dispatch> for ClusterTracker {
    type Result = Result<(), ExecuteError>;

    fn handle(&mut self, message: Dispatch, ctx: &mut Self::Context) -> Self::Result {
        if !matches!(self.state, ClusterState::Starting | ClusterState::Ready) {
            return Err(ExecuteError::NotAccepting(self.cluster, self.state));
        }
        if self.running.iter().any(|r| r.query == message.query.id) {
            return Err(ExecuteError::Duplicate(message.query.id));
        }
        let billed = self.state == ClusterState::Ready;
        if billed {
            let at = self.billing_instant(self.clock.now());
            self.billing.handle_query_start(at);
        }
        let id = message.query.id;
        self.running.push(Running { query: id, billed });
        let execution = Execution { query: message.query, target: Target::Cluster(self.cluster), sql: message.sql };
        let running = self.backend.execute(execution);
        let clock = self.clock;
        let reply = message.reply;
        // Handled as the run ends, with no second trip through the mailbox.
        ctx.spawn(
            async move { running.await.unwrap_or_else(|refused| Completion::refused(&refused, clock.now())) }
                .into_actor(self)
                .map(move |completion, actor, ctx| actor.handle(Finished { query: id, completion, reply }, ctx)),
        );
        Ok(())
    }
}

impl Handler<Finished> for ClusterTracker {
    type Result = ();

    fn handle(&mut self, message: Finished, _ctx: &mut Self::Context) {
        if let Some(index) = self.running.iter().position(|r| r.query == message.query) {
            let running = self.running.remove(index);
            if running.billed {
                let finished = match &message.completion {
                    Completion::Ran { report, .. } => report.finished,
                    Completion::Failed(failure) => failure.finished,
                };
                let at = self.billing_instant(finished);
                self.billing.handle_query_end(at);
            }
        }
        self.finished += 1;
        // The dispatcher may have gone away; then nobody reads it.
        let _ = message.reply.send(message.completion);
    }
}

impl Handler<Cancel> for ClusterTracker {
    type Result = ();

    fn handle(&mut self, message: Cancel, _ctx: &mut Self::Context) {
        if self.running.iter().any(|r| r.query == message.query) {
            self.backend.cancel(message.query, message.reason);
        }
    }
}

impl Handler<ClusterUpdate> for ClusterTracker {
    type Result = ();

    fn handle(&mut self, message: ClusterUpdate, _ctx: &mut Self::Context) {
        if message.cluster != self.cluster {
            return;
        }
        // "Ready" reports that provisioning finished. A cluster released
        // while starting still runs (and is billed for) what it holds, but
        // stays draining: it takes nothing new.
        if message.state == ClusterState::Ready && !self.provisioned {
            self.provisioned = true;
            let at = self.billing_instant(self.clock.now());
            for running in self.running.iter_mut().filter(|r| !r.billed) {
                self.billing.handle_query_start(at);
                running.billed = true;
            }
        }
        if message.state == ClusterState::Gone
            && let Some((_, _, gone)) = &mut self.provisioned_billing
        {
            *gone = Some(self.clock.now());
        }
        if self.state == ClusterState::Draining && matches!(message.state, ClusterState::Ready | ClusterState::Unhealthy) {
            return;
        }
        self.unhealthy_reason = if message.state == ClusterState::Unhealthy { message.reason } else { None };
        self.state = message.state;
    }
}

impl Handler<Release> for ClusterTracker {
    type Result = ResponseActFuture<Self, Result<(), ExecuteError>>;

    fn handle(&mut self, _message: Release, _ctx: &mut Self::Context) -> Self::Result {
        if self.state == ClusterState::Gone {
            return Box::pin(fut::ready(Err(ExecuteError::NotAccepting(self.cluster, self.state))));
        }
        let released = self.provider.spin_down(self.pool.clone(), self.cluster);
        let previous = self.state;
        self.state = ClusterState::Draining;
        Box::pin(released.into_actor(self).map(move |result, actor, _ctx| {
            // A platform that refused keeps the cluster as it was.
            if result.is_err() && actor.state == ClusterState::Draining {
                actor.state = previous;
            }
            result
        }))
    }
}

impl Handler<GetState> for ClusterTracker {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        let now = self.clock.now();
        MessageResult(TrackerState {
            cluster: self.cluster,
            size: self.size,
            state: self.state,
            unhealthy_reason: self.unhealthy_reason.clone(),
            running: self.running.iter().map(|r| r.query).collect(),
            finished: self.finished,
            billed_usd_estimate: match &self.provisioned_billing {
                Some((terms, since, gone)) => terms.cost_usd(*since, gone.unwrap_or(now)) * f64::from(self.size.0),
                None => self.billing.cost_usd(now),
            },
            billing_windows: self.billing.windows_opened(),
        })
    }
}
