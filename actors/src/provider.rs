//! The [`Provider`] seam: cluster lifecycle requests to the platform that
//! hosts the clusters. The RouterShard and the ClusterTrackers hold an
//! `Arc<dyn Provider>` and never name an implementation.
//!
//! - The emulated provider (the [`EmulatedProvider`] actor's address) asks
//!   the emulated warehouse, which applies the spinup delay δ and the
//!   teardown delay ζ. It keeps a bounded log of what it was asked and
//!   when, for operators.
//! - [`FixedEndpoints`] is a pool of servers slogate did not create (a
//!   Postgres-wire pool's declared endpoints): it refuses to create or
//!   release any, saying so.
//! - [`DryRun`] wraps any provider (`[pool.provider] dry_run = true`): it
//!   logs and shows what it would create or release, does nothing, and
//!   answers each request with a refusal that says so.
//!
//! The cloud providers (`slogate-cloud`: Redshift Serverless, provisioned
//! Redshift, EC2) answer the same trait. They create a resource, wait until
//! it serves, and hand its address to the pool's backend through an
//! [`EndpointSink`]; the backend health-checks it and reports it ready to
//! its watchers, as for any cluster.

use std::collections::VecDeque;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::{ClusterId, PoolId, Rpu};

use crate::clock::VirtualClock;
use crate::backend::{ExecuteError, LocalFuture};
use crate::warehouse::{AddCluster, EmulatedWarehouse, TearDown};

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
    /// `spin_up`, `spin_down`, or a cloud provider's later steps
    /// (`ready`, `abandon`, `delete`, `adopt`, `terminate`).
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
    /// `emulated`, `fixed`, `dry-run` or a cloud provider's kind
    /// (`redshift-serverless`, `redshift`, `ec2`).
    pub kind: &'static str,
    /// Recent requests, newest first.
    pub recent: Vec<LifecycleRecord>,
    /// The implementation's own detail (a cloud provider's resources);
    /// null when it has none.
    pub detail: serde_json::Value,
}

/// Where a cluster a cloud provider created serves queries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ProvidedEndpoint {
    /// Its host name or address.
    pub host: String,
    /// Its port.
    pub port: u16,
}

/// The backend side of a cloud provider: where it hands the clusters it
/// creates and releases. The Postgres-wire executor implements it.
pub trait EndpointSink: Send + Sync {
    /// `cluster` of `pool` serves at `endpoint`: connect to it, check its
    /// health, and report it ready to the watchers. Resolves once it is
    /// ready, or with why it never passed its health check (the provider
    /// then deletes it and abandons the cluster).
    fn attach(&self, pool: PoolId, cluster: ClusterId, size: Rpu, endpoint: ProvidedEndpoint) -> LocalFuture<Result<(), String>>;

    /// `cluster` will never serve: report it gone, saying why.
    fn abandon(&self, pool: PoolId, cluster: ClusterId, reason: String);

    /// Stops routing to `cluster` and resolves once its queries have ended
    /// and it is reported gone; the provider then deletes its resource.
    fn drain(&self, pool: PoolId, cluster: ClusterId) -> LocalFuture<()>;

    /// Lets go of `cluster` without reporting anything: another node of
    /// the fleet adopts it. Its connections close as its queries end.
    fn detach(&self, pool: PoolId, cluster: ClusterId);
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
        MessageResult(ProviderState { kind: "emulated", recent: self.recent.iter().cloned().collect(), detail: serde_json::Value::Null })
    }
}

/// Creates and releases a pool's clusters. See the module docs.
pub trait Provider: Send + Sync {
    /// Requests a new cluster of `size` for `pool`; it is ready after the
    /// platform's spinup delay (reported through the backend's watchers).
    fn spin_up(&self, pool: PoolId, size: Rpu) -> LocalFuture<Result<ClusterId, ExecuteError>>;

    /// Asks the platform to drain and release `cluster`.
    fn spin_down(&self, pool: PoolId, cluster: ClusterId) -> LocalFuture<Result<(), ExecuteError>>;

    /// The observable state.
    fn state(&self) -> LocalFuture<Result<ProviderState, ExecuteError>>;

    /// Whether its requests change anything: false for a dry run, whose
    /// requests are only recorded (the router then leaves a cluster it was
    /// asked to release as it is, instead of draining it meanwhile).
    fn acts(&self) -> bool {
        true
    }
}

fn provider_not_answering(_: MailboxError) -> ExecuteError {
    ExecuteError::Unavailable("the provider is not answering".into())
}

/// The emulated provider as a [`Provider`].
impl Provider for Addr<EmulatedProvider> {
    fn spin_up(&self, pool: PoolId, size: Rpu) -> LocalFuture<Result<ClusterId, ExecuteError>> {
        let provider = self.clone();
        Box::pin(async move { provider.send(SpinUp { pool, size }).await.map_err(provider_not_answering)? })
    }

    fn spin_down(&self, pool: PoolId, cluster: ClusterId) -> LocalFuture<Result<(), ExecuteError>> {
        let provider = self.clone();
        Box::pin(async move { provider.send(SpinDown { pool, cluster }).await.map_err(provider_not_answering)? })
    }

    fn state(&self) -> LocalFuture<Result<ProviderState, ExecuteError>> {
        let provider = self.clone();
        Box::pin(async move { provider.send(GetState).await.map_err(provider_not_answering) })
    }
}

/// Servers slogate did not create: a pool's declared endpoints. It never
/// creates or releases one.
pub struct FixedEndpoints;

impl Provider for FixedEndpoints {
    fn spin_up(&self, pool: PoolId, size: Rpu) -> LocalFuture<Result<ClusterId, ExecuteError>> {
        let reason = format!("pool `{pool}` runs on fixed endpoints: no provider can create a {size} cluster for it");
        Box::pin(std::future::ready(Err(ExecuteError::Unsupported(reason))))
    }

    fn spin_down(&self, pool: PoolId, cluster: ClusterId) -> LocalFuture<Result<(), ExecuteError>> {
        let reason = format!("pool `{pool}` runs on fixed endpoints: no provider can release {cluster}");
        Box::pin(std::future::ready(Err(ExecuteError::Unsupported(reason))))
    }

    fn state(&self) -> LocalFuture<Result<ProviderState, ExecuteError>> {
        Box::pin(std::future::ready(Ok(ProviderState { kind: "fixed", recent: Vec::new(), detail: serde_json::Value::Null })))
    }
}

/// A provider in dry-run mode: every request is logged as what it would
/// have done and refused, so nothing is created or released; the wrapped
/// provider's state is shown beside the log.
pub struct DryRun {
    inner: std::sync::Arc<dyn Provider>,
    clock: VirtualClock,
    recent: std::sync::Mutex<VecDeque<LifecycleRecord>>,
}

impl DryRun {
    /// `inner` in dry-run mode.
    pub fn new(inner: std::sync::Arc<dyn Provider>, clock: VirtualClock) -> Self {
        DryRun { inner, clock, recent: std::sync::Mutex::default() }
    }

    fn refuse(&self, record: LifecycleRecord) -> ExecuteError {
        let reason = format!("dry run: {}; nothing was done", record.result);
        let mut recent = self.recent.lock().expect("the dry run's log lock is never poisoned");
        if recent.len() == RECENT_MAX {
            recent.pop_back();
        }
        recent.push_front(record);
        ExecuteError::Unsupported(reason)
    }
}

impl Provider for DryRun {
    fn spin_up(&self, pool: PoolId, size: Rpu) -> LocalFuture<Result<ClusterId, ExecuteError>> {
        let result = format!("would create a {} RPU cluster for pool `{pool}`", size.0);
        let error = self.refuse(LifecycleRecord { at_s: self.clock.now().as_secs_f64(), pool, action: "spin_up", cluster: None, size: Some(size), result });
        Box::pin(std::future::ready(Err(error)))
    }

    fn spin_down(&self, pool: PoolId, cluster: ClusterId) -> LocalFuture<Result<(), ExecuteError>> {
        let result = format!("would release {cluster} of pool `{pool}`");
        let error = self.refuse(LifecycleRecord { at_s: self.clock.now().as_secs_f64(), pool, action: "spin_down", cluster: Some(cluster), size: None, result });
        Box::pin(std::future::ready(Err(error)))
    }

    fn acts(&self) -> bool {
        false
    }

    fn state(&self) -> LocalFuture<Result<ProviderState, ExecuteError>> {
        let recent: Vec<LifecycleRecord> = self.recent.lock().expect("the dry run's log lock is never poisoned").iter().cloned().collect();
        let inner = self.inner.state();
        Box::pin(async move {
            let mut state = inner.await?;
            state.kind = "dry-run";
            // What it would have done first, then what the platform did before.
            state.recent = recent.into_iter().chain(state.recent).collect();
            Ok(state)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[actix_rt::test]
    async fn a_dry_run_logs_what_it_would_do_does_nothing_and_says_so() {
        let clock = VirtualClock::start(1_000.0);
        let dry = DryRun::new(std::sync::Arc::new(FixedEndpoints), clock);
        let created = dry.spin_up(PoolId::new("p"), Rpu(32)).await.unwrap_err();
        assert!(created.to_string().contains("dry run: would create a 32 RPU cluster for pool `p`"), "{created}");
        let released = dry.spin_down(PoolId::new("p"), ClusterId(3)).await.unwrap_err();
        assert!(released.to_string().contains("would release c3"), "{released}");
        let state = dry.state().await.unwrap();
        assert_eq!(state.kind, "dry-run");
        let actions: Vec<&str> = state.recent.iter().map(|r| r.action).collect();
        assert_eq!(actions, ["spin_down", "spin_up"], "newest first");
        assert_eq!(state.recent[1].size, Some(Rpu(32)));
    }
}
