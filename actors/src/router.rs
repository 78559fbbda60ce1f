//! The RouterShard actor: owns a set of pools and routes each submitted
//! query with the pool's [`RoutingPolicy`] from `slogate-core`.
//!
//! For each submission it:
//!
//! 1. checks the pool exists, the node is not draining, and the pool's
//!    in-flight count is under its admission limit;
//! 2. answers a retried client query id from its idempotency table (the
//!    same reply, and the query never runs twice);
//! 3. asks the policy for a decision, records it (recent decisions are kept
//!    for the admin API), and sends the query to the pool's [`Backend`]
//!    (through the cluster's tracker, or straight to the elastic tier);
//! 4. when the backend reports, updates the pool view, feeds the policy,
//!    logs the execution to the Reservoir, and replies. An offload the
//!    elastic tier throttled is routed again once instead (the policy
//!    learns of the throttle first, so it routes to a cluster), with its
//!    id, waiters and arrival kept, and a second decision saying why.
//!
//! Learning stays off the routing path: the policy hands each refit of its
//! predictor out as a job (`RoutingPolicy::defer_fits`), the shard runs it
//! on tokio's blocking pool, at most one per pool at a time, and installs
//! the result when it is done. Until then the previous fit predicts; a
//! refit never stalls a routing decision (`predictor_fits` counts them).
//! Learning's share of the machine is bounded: after a refit that took
//! `d`, the pool's next starts no sooner than `FIT_REST_FACTOR × d` later,
//! so refits take at most a tenth of a core however fast completions come
//! (at 10,000 queries/s, a refit due every 256 completions took a quarter
//! of this 2-core machine; at a quarter of a core, learning was still 15%
//! of a node's CPU under `bench-gateway`, and a tenth gave the slogate
//! policy 10–20% more queries a second).
//!
//! Every accepted query gets exactly one outcome: completed, timed out, or
//! failed with a reason (a SQL error, a refused dispatch, a lost backend
//! reply, a cancel). A query whose every waiting client has gone
//! ([`ClientGone`]) is cancelled on the server, and so is every query
//! still running when a shutdown's grace period ends.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::{
    ClusterId, ClusterState, ClusterView, ExecutionOutcome, Pool, PoolId, Query, QueryId, Rpu, RunningQuery, Slo, Target,
    TemplateId,
};
use slogate_core::fingerprint::SqlCatalog;
use slogate_core::reservoir::{ExecutionRecord, Timeline};
use slogate_core::route::{PlanningRouter, Routing, RoutingPolicy};
use slogate_core::time::{Duration, Instant};
use tokio::sync::oneshot;

use crate::autoscaler::{PoolSnapshot, ScaleEvent, ScaleNotice};
use crate::backend::{Backend, CancelReason, ClusterUpdate, Completion, Execution, ExecuteError, ResultRows};
use crate::clock::VirtualClock;
use crate::provider::Provider;
use crate::idempotency::{IdempotencyRecord, IdempotencyTable, RequestDigest};
use crate::reservoir::{ArrivalUpdate, LogUpdate, ReservoirLink};
use crate::tracker::{Cancel, ClusterTracker, Dispatch, Release, TrackerSetup};
use crate::{Error, Result};

/// How a submitted query ended.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubmitStatus {
    /// It ran to completion.
    Completed,
    /// The backend cancelled it at its timeout.
    TimedOut,
    /// It could not run; the explanation says why.
    Failed,
}

/// The reply to a submission.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct SubmitOutcome {
    /// The client's query id (or the node's, if the client gave none).
    pub client_query_id: String,
    /// The node's id for the query.
    pub query: QueryId,
    /// How it ended.
    pub status: SubmitStatus,
    /// Where it ran, if anywhere.
    pub target: Option<Target>,
    /// Client-side latency in the backend's time.
    pub latency: Duration,
    /// Whether it met its SLO.
    pub slo_met: bool,
    /// The routing decision's explanation, or why it failed (shared: the
    /// reply, the decision log, the idempotency table and the recent
    /// outcomes hold the same text).
    pub explanation: Arc<str>,
    /// The routing policy's predicted latency, if it predicts.
    pub predicted: Option<Duration>,
    /// Wall-clock time the backend held the query (zero if it never ran):
    /// the gateway's own overhead is the rest of the client's wait.
    pub backend_wall: std::time::Duration,
    /// The server's SQLSTATE, when a SQL error failed it.
    pub sqlstate: Option<String>,
    /// The rows it returned, for backends that return rows. A retry
    /// answered from the idempotency table gets the columns only, marked
    /// truncated: the table does not keep rows.
    pub result: Option<ResultRows>,
    /// The execution the log recorded for it, when it ran on a cluster of
    /// a node with an execution log (not kept in the idempotency table).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution: Option<ExecutionRecord>,
}

/// An accepted submission: the node's id for it and where its outcome
/// arrives.
#[derive(Debug)]
pub struct Submitted {
    /// The node's query id (for [`ClientGone`]).
    pub query: QueryId,
    /// Receives the outcome.
    pub reply: oneshot::Receiver<SubmitOutcome>,
}

/// A client waiting for `query` hung up or passed its deadline. When no
/// waiting client is left, the query is cancelled on the server.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ClientGone {
    /// The pool.
    pub pool: PoolId,
    /// The query.
    pub query: QueryId,
}

impl SubmitOutcome {
    /// The outcome as the idempotency table keeps it: the result's
    /// columns, without its rows (marked truncated when it had any).
    fn without_rows(&self) -> SubmitOutcome {
        let result = self.result.as_ref().map(|r| ResultRows {
            columns: r.columns.clone(),
            rows: Vec::new(),
            truncated: r.truncated || !r.rows.is_empty(),
            rows_total: r.rows_total,
        });
        // Field by field: a clone of the whole would copy the rows and the
        // execution record only to drop them.
        SubmitOutcome {
            client_query_id: self.client_query_id.clone(),
            query: self.query,
            status: self.status.clone(),
            target: self.target,
            latency: self.latency,
            slo_met: self.slo_met,
            explanation: self.explanation.clone(),
            predicted: self.predicted,
            backend_wall: self.backend_wall,
            sqlstate: self.sqlstate.clone(),
            result,
            execution: None,
        }
    }
}

/// A submission, already validated by the gRPC layer.
#[derive(Message)]
#[rtype(result = "Result<Submitted>")]
pub struct Submit {
    /// The pool.
    pub pool: PoolId,
    /// The client's idempotency key; empty for none.
    pub client_query_id: String,
    /// The tenant that sent it (empty without tenants): its idempotency
    /// records are its own.
    pub tenant: String,
    /// What a retry of `client_query_id` must repeat.
    pub digest: RequestDigest,
    /// Template or fingerprint.
    pub template: TemplateId,
    /// Its SQL text, when the client sent text.
    pub sql: Option<Arc<str>>,
    /// Its SLO.
    pub slo: Slo,
}

/// Requests a new cluster for a pool (ready after the spinup delay).
#[derive(Message)]
#[rtype(result = "Result<ClusterId>")]
pub struct RequestCluster {
    /// The pool.
    pub pool: PoolId,
    /// Its size.
    pub size: Rpu,
}

/// Takes clusters a provider already holds into a pool (a fleet's new
/// owner adopting the previous owner's resources): each starts as
/// `Starting`, with no spin-up, and turns ready when its backend says so.
/// Ids the pool already has are skipped. Resolves with the ids taken.
#[derive(Message)]
#[rtype(result = "Result<Vec<ClusterId>>")]
pub struct AdoptClusters {
    /// The pool.
    pub pool: PoolId,
    /// The clusters, with their sizes.
    pub clusters: Vec<(ClusterId, Rpu)>,
}

/// Lets go of every cluster of a pool without releasing any (a fleet node
/// handing the pool to another, which adopts them): the router stops
/// routing to them and forgets them; queries still running on them end
/// as they would. Resolves with the ids forgotten.
#[derive(Message)]
#[rtype(result = "Result<Vec<ClusterId>>")]
pub struct ForgetClusters {
    /// The pool.
    pub pool: PoolId,
}

/// Drains and releases one of a pool's clusters.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ReleaseCluster {
    /// The pool.
    pub pool: PoolId,
    /// The cluster.
    pub cluster: ClusterId,
    /// Release it even when it is the pool's last ready cluster (its
    /// queries then wait for a new one or go to the elastic tier).
    pub force: bool,
}

/// A fork of a pool's router and the pool as it is, for the size
/// selector's replay.
#[derive(Message)]
#[rtype(result = "Result<(Box<dyn PlanningRouter>, Pool)>")]
pub struct ForkPlanner {
    /// The pool.
    pub pool: PoolId,
}

/// Replaces a pool's learned latency model, between two routing
/// decisions.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct InstallModel {
    /// The pool.
    pub pool: PoolId,
    /// The new weights.
    pub weights: std::sync::Arc<slogate_core::predict::iconq::IconqWeights>,
}

/// The latest SLO per template a pool has seen.
#[derive(Message)]
#[rtype(result = "Result<std::collections::BTreeMap<slogate_core::model::TemplateId, slogate_core::time::Duration>>")]
pub struct GetSloBook {
    /// The pool.
    pub pool: PoolId,
}

/// Connects a pool's Autoscaler: it is notified of every arrival,
/// completion and cluster change.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct AttachAutoscaler {
    /// The pool.
    pub pool: PoolId,
    /// Where notices go.
    pub autoscaler: Recipient<ScaleNotice>,
}

/// Looks a client's query id up in a pool's idempotency table, as a
/// Submit would: the recorded outcome, `None` when the id is unknown, or
/// [`Error::IdempotencyMismatch`] when it named other content. A node that
/// forwards a query to its pool's owner asks first, so a retry it accepted
/// before is answered without running again, whoever owns the pool now.
#[derive(Message)]
#[rtype(result = "Result<Option<SubmitOutcome>>")]
pub struct Recall {
    /// The pool.
    pub pool: PoolId,
    /// The tenant.
    pub tenant: String,
    /// The client's id.
    pub client_query_id: String,
    /// The retry's content.
    pub digest: RequestDigest,
}

/// Keeps `record` in its pool's idempotency table and the execution log:
/// the outcome of a query this node accepted and another node ran.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Remember {
    /// The record.
    pub record: IdempotencyRecord,
}

/// Builds a policy on the shard's thread (policies need not be `Send`).
pub type PolicyBuilder = Box<dyn FnOnce() -> std::result::Result<Box<dyn RoutingPolicy>, String> + Send>;

/// Replaces a pool's routing policy with one `build` makes on the shard's
/// thread: a node taking a pool over from another starts it on the
/// execution log it holds now, not the one it started with. Refused while
/// the pool has queries in flight, whose predictions the new policy would
/// not know; a refit of the old policy still running is not installed.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ReplacePolicy {
    /// The pool.
    pub pool: PoolId,
    /// Makes the new policy.
    pub build: PolicyBuilder,
}

/// Stop accepting submissions (graceful shutdown); in-flight queries
/// finish.
#[derive(Clone, Message)]
#[rtype(result = "()")]
pub struct Drain;

/// Fails every query still in flight with a reason (end of a shutdown's
/// grace period), so no accepted query goes unanswered. Returns how many.
#[derive(Clone, Message)]
#[rtype(result = "usize")]
pub struct FailInFlight {
    /// Why, for the replies.
    pub reason: String,
}

/// Reads the recent routing decisions, newest first.
#[derive(Clone, Message)]
#[rtype(result = "Vec<DecisionRecord>")]
pub struct GetDecisions {
    /// At most this many.
    pub limit: usize,
    /// Only this tenant's, if set.
    pub tenant: Option<String>,
    /// Only this pool's, if set.
    pub pool: Option<PoolId>,
}

/// Reads the observable state.
#[derive(Clone, Message)]
#[rtype(result = "RouterState")]
pub struct GetState;

/// Lists a pool's cluster trackers, for the admin API.
#[derive(Message)]
#[rtype(result = "Vec<(ClusterId, Addr<ClusterTracker>)>")]
pub struct GetTrackers(pub PoolId);

/// Reads a pool's shadow-mode comparison (`None`: the pool is unknown or
/// not in shadow mode).
#[derive(Message)]
#[rtype(result = "Option<slogate_core::route::shadow::ShadowReport>")]
pub struct GetShadow(pub PoolId);

/// Reads a pool's most recent outcomes, newest first.
#[derive(Message)]
#[rtype(result = "Vec<SubmitOutcome>")]
pub struct GetRecentOutcomes {
    /// The pool.
    pub pool: PoolId,
    /// At most this many.
    pub limit: usize,
    /// Only this tenant's, if set.
    pub tenant: Option<String>,
}

/// The node ids of a tenant's queries in flight in a pool.
#[derive(Message)]
#[rtype(result = "Vec<QueryId>")]
pub struct GetTenantInFlight {
    /// The pool.
    pub pool: PoolId,
    /// The tenant.
    pub tenant: String,
}

#[derive(Message)]
#[rtype(result = "()")]
struct CompletionUpdate {
    pool: PoolId,
    query: QueryId,
    /// `None` when the backend lost the query.
    completion: Option<Completion>,
    backend_wall: std::time::Duration,
}

/// One routing decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecisionRecord {
    /// The pool.
    pub pool: PoolId,
    /// The node's query id.
    pub query: QueryId,
    /// The client's query id.
    pub client_query_id: String,
    /// The tenant that sent it (empty without tenants).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub tenant: String,
    /// The template.
    pub template: TemplateId,
    /// When, in the node's virtual time (seconds since start).
    pub at_s: f64,
    /// Where the query went, if anywhere.
    pub target: Option<Target>,
    /// Why.
    pub explanation: Arc<str>,
}

/// A pool's static setup.
pub struct PoolSetup {
    /// Its name.
    pub id: PoolId,
    /// Its routing policy.
    pub policy: Box<dyn RoutingPolicy>,
    /// The backend that runs its queries.
    pub backend: Arc<dyn Backend>,
    /// The platform that spins its clusters up and down.
    pub provider: Arc<dyn Provider>,
    /// The SQL text of its named templates (empty for backends that need
    /// none).
    pub catalog: Arc<SqlCatalog>,
    /// Its clusters (already requested from the backend).
    pub clusters: Vec<(ClusterId, Rpu, ClusterState)>,
    /// The most queries in flight before submissions are refused.
    pub in_flight_max: usize,
    /// Whether the backend's elastic tier takes offloaded queries.
    pub elastic: bool,
    /// Set when the pool's clusters are provisioned (trackers estimate
    /// their bill from spinup until gone).
    pub provisioned: Option<slogate_core::elastic::ProvisionedBilling>,
    /// What the pool may hold, whatever a policy or an operator asks.
    pub caps: PoolCaps,
    /// Observes each run's latency, arrival to end, in the node's (virtual)
    /// time: a histogram over [`crate::metrics::QUERY_BUCKETS_S`].
    pub query_latency: Arc<crate::metrics::Histogram>,
}

/// A pool's caps and the price its spend cap counts at.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PoolCaps {
    /// The caps.
    pub caps: slogate_core::scale::caps::Caps,
    /// Dollars per RPU-hour a live cluster can bill at most.
    pub price_per_rpu_hour_usd: f64,
}

impl Default for PoolCaps {
    fn default() -> Self {
        PoolCaps { caps: slogate_core::scale::caps::Caps::default(), price_per_rpu_hour_usd: slogate_core::billing::BillingConfig::default().price_per_rpu_hour_usd }
    }
}

/// A pool's queries in flight by client query id, per tenant: looked up
/// and removed by borrowed strings, so a submission copies neither to ask.
/// Tenants come from the node's configuration, so their maps are few.
#[derive(Default)]
struct ClientIds(HashMap<String, HashMap<String, QueryId>>);

impl ClientIds {
    /// The query in flight under `tenant`'s `client_query_id`.
    fn get(&self, tenant: &str, client_query_id: &str) -> Option<QueryId> {
        self.0.get(tenant)?.get(client_query_id).copied()
    }

    /// Indexes `query` under `tenant`'s `client_query_id`.
    fn insert(&mut self, tenant: &str, client_query_id: String, query: QueryId) {
        match self.0.get_mut(tenant) {
            Some(ids) => {
                ids.insert(client_query_id, query);
            }
            None => {
                self.0.insert(tenant.to_owned(), HashMap::from([(client_query_id, query)]));
            }
        }
    }

    /// Drops `tenant`'s `client_query_id` if it still names `query` (a
    /// retry after an abandoned run may have taken it over); the id as
    /// it was kept.
    fn remove(&mut self, tenant: &str, client_query_id: &str, query: QueryId) -> Option<String> {
        let ids = self.0.get_mut(tenant)?;
        if ids.get(client_query_id) != Some(&query) {
            return None;
        }
        ids.remove_entry(client_query_id).map(|(id, _)| id)
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

struct InFlight {
    client_query_id: String,
    template: TemplateId,
    slo: Slo,
    arrival: Instant,
    target: Target,
    neighbours_at_dispatch: u32,
    /// Another query was running on its cluster when it was dispatched.
    overlapped_at_dispatch: bool,
    /// Its cluster's dispatch count (`PoolRuntime::dispatches`) just after
    /// its own dispatch: a higher count later means another query joined it.
    dispatches_at_dispatch: u64,
    explanation: Arc<str>,
    predicted: Option<Duration>,
    client_supplied: bool,
    tenant: String,
    digest: RequestDigest,
    waiters: Vec<oneshot::Sender<SubmitOutcome>>,
    /// Every client left and the query is being cancelled: its id is free
    /// for a retry, and its failure is not remembered for one.
    abandoned: bool,
    /// Its SQL text, kept for a second dispatch.
    sql: Option<Arc<str>>,
    /// The elastic tier throttled it and it was routed again: it is not
    /// routed a third time.
    rerouted: bool,
}

struct PoolRuntime {
    policy: Box<dyn RoutingPolicy>,
    /// Counts [`ReplacePolicy`]s: a refit started for an earlier policy is
    /// not installed in a later one.
    policy_generation: u64,
    /// A refit of the policy's predictor is running off the thread.
    fit_running: bool,
    /// No refit starts before this (see `FIT_REST_FACTOR`).
    fit_rested_at: std::time::Instant,
    backend: Arc<dyn Backend>,
    provider: Arc<dyn Provider>,
    catalog: Arc<SqlCatalog>,
    trackers: HashMap<ClusterId, Addr<ClusterTracker>>,
    view: Pool,
    in_flight: HashMap<QueryId, InFlight>,
    in_flight_max: usize,
    by_client_id: ClientIds,
    /// Queries dispatched to each cluster so far (see
    /// `InFlight::dispatches_at_dispatch`): one count a dispatch, where
    /// marking every running query on the cluster was a lookup each.
    dispatches: HashMap<ClusterId, u64>,
    done: IdempotencyTable,
    /// Recent outcomes, newest first, with their tenants.
    recent: VecDeque<(String, SubmitOutcome)>,
    stats: PoolStats,
    autoscaler: Option<Recipient<ScaleNotice>>,
    elastic: bool,
    provisioned: Option<slogate_core::elastic::ProvisionedBilling>,
    caps: PoolCaps,
    /// The latest SLO each template was submitted with (the tuner gives
    /// forecast queries these).
    slos: std::collections::BTreeMap<slogate_core::model::TemplateId, slogate_core::time::Duration>,
    /// The templates in `slos`, least recently seen first out.
    slo_templates: slogate_core::recency::RecentKeys<slogate_core::model::TemplateId>,
    query_latency: Arc<crate::metrics::Histogram>,
}

impl PoolRuntime {
    /// Counts a dispatch to `cluster`; its count after it.
    fn count_dispatch(&mut self, cluster: ClusterId) -> u64 {
        let count = self.dispatches.entry(cluster).or_default();
        *count += 1;
        *count
    }

    /// Whether a query dispatched to `target` shared its cluster at some
    /// point of its flight: another query was running there when it was
    /// dispatched (`overlapped_at_dispatch`), or one was dispatched there
    /// after it (the cluster's count passed `dispatches_at_dispatch`).
    fn overlapped(&self, target: Target, overlapped_at_dispatch: bool, dispatches_at_dispatch: u64) -> bool {
        overlapped_at_dispatch
            || match target {
                Target::Cluster(cluster) => self.dispatches.get(&cluster).is_some_and(|&count| count > dispatches_at_dispatch),
                Target::Elastic => false,
            }
    }

    /// Stops `query` on the server it runs on: a cluster's through its
    /// tracker, the elastic tier's on the backend.
    fn cancel(&self, query: QueryId, target: Target, reason: CancelReason) {
        match target {
            Target::Cluster(cluster) => {
                if let Some(tracker) = self.trackers.get(&cluster) {
                    tracker.do_send(Cancel { query, reason });
                }
            }
            Target::Elastic => self.backend.cancel(query, reason),
        }
    }

    /// Tells the pool's autoscaler, if any, what happened. A full mailbox
    /// drops the notice (counted): routing never waits for scaling.
    fn notify(&mut self, event: ScaleEvent) -> bool {
        let Some(autoscaler) = &self.autoscaler else { return true };
        let predictions = self.view.clusters.iter().flat_map(|c| self.policy.predicted_latencies(c.id)).collect();
        let snapshot = PoolSnapshot { pool: self.view.clone(), predictions };
        autoscaler.try_send(ScaleNotice { event, snapshot }).is_ok()
    }
}

/// Counters of one pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PoolStats {
    /// Submissions accepted.
    pub accepted: u64,
    /// Retries answered from the idempotency table.
    pub deduplicated: u64,
    /// Refused at the admission limit.
    pub refused: u64,
    /// Completed.
    pub completed: u64,
    /// Timed out.
    pub timed_out: u64,
    /// Failed.
    pub failed: u64,
    /// SLO violations (timeouts and failures included).
    pub violations: u64,
    /// Templates whose last SLO was forgotten to keep at most
    /// `templates_max` (least recently seen first).
    pub templates_evicted: u64,
    /// Refits of the policy's predictor run off the routing thread and
    /// installed.
    pub predictor_fits: u64,
    /// Queries sent to the elastic tier.
    pub offloaded: u64,
    /// Offloads the elastic tier throttled that were routed to a cluster
    /// instead of failing.
    pub offloads_rerouted: u64,
}

/// One pool's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PoolState {
    /// Its name.
    pub id: PoolId,
    /// The routing policy.
    pub policy: String,
    /// The latency predictor it decides with (`concurrency-aware`,
    /// `iconq`, …), for policies that predict.
    pub predictor: Option<String>,
    /// Its clusters with their running queries.
    pub clusters: Vec<ClusterView>,
    /// Queries in flight.
    pub in_flight: usize,
    /// The admission limit.
    pub in_flight_max: usize,
    /// Counters.
    pub stats: PoolStats,
    /// The violation budget the router spends on cost, when the pool has
    /// one: its target, the recent violation rate and the tolerance it
    /// adds now.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub violation_budget: Option<slogate_core::route::budget::BudgetState>,
}

/// The RouterShard's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouterState {
    /// Whether it refuses new submissions.
    pub draining: bool,
    /// Its pools.
    pub pools: Vec<PoolState>,
    /// Reservoir updates dropped because its mailbox was full.
    pub reservoir_updates_dropped: u64,
    /// Autoscaler notices dropped because its mailbox was full.
    pub scale_notices_dropped: u64,
    /// The shards this state covers (one for a shard's own; every shard's
    /// when [`crate::shards::RouterShards`] merges them).
    pub shards: Vec<ShardInfo>,
}

/// Which shard a [`RouterState`] came from, and where it runs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardInfo {
    /// Its index among the node's shards.
    pub index: usize,
    /// The thread its event loop runs on.
    pub thread: String,
    /// The pools it owns, by name.
    pub pools: Vec<PoolId>,
    /// Whether it refuses new submissions.
    pub draining: bool,
    /// How long the lag probe's messages have waited on its thread.
    pub event_loop_lag: LagSummary,
}

/// A shard's event-loop lag as the admin API shows it (the same
/// histogram as `slogate_event_loop_lag_seconds` in `/metrics`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LagSummary {
    /// Probes handled since start.
    pub probes: u64,
    /// The upper bound of the bucket that holds the 99th percentile,
    /// seconds; `None` before the first probe.
    pub p99_at_most_s: Option<f64>,
    /// The longest wait since start, seconds.
    pub max_s: f64,
    /// The longest wait of about the last minute, seconds; `None` when
    /// the histogram keeps no window.
    pub recent_max_s: Option<f64>,
}

impl LagSummary {
    fn of(histogram: &crate::metrics::Histogram) -> Self {
        LagSummary {
            probes: histogram.count(),
            p99_at_most_s: histogram.quantile_upper_bound_s(0.99),
            max_s: histogram.max().as_secs_f64(),
            recent_max_s: histogram.recent_max().map(|(max, _)| max.as_secs_f64()),
        }
    }
}

/// The actor. See the module docs.
pub struct RouterShard {
    clock: VirtualClock,
    decision_time: std::sync::Arc<crate::metrics::Histogram>,
    /// How long the lag probe's messages wait ([`RouterShard::with_lag_probe`]).
    event_loop_lag: std::sync::Arc<crate::metrics::Histogram>,
    lag_probe_every: Option<std::time::Duration>,
    pools: HashMap<PoolId, PoolRuntime>,
    log: Outbox,
    decisions: VecDeque<DecisionRecord>,
    decisions_max: usize,
    next_query: u64,
    /// Query ids step by the shard count, so the node's shards never hand
    /// out the same one.
    query_id_step: u64,
    index: usize,
    thread: String,
    draining: bool,
    scale_notices_dropped: u64,
    mailbox_capacity: usize,
    tracker_mailbox_capacity: usize,
    clusters_per_pool_max: usize,
    billing: slogate_core::billing::BillingConfig,
}

/// Sizes of the RouterShard's bounded tables, and the billing terms its
/// trackers estimate cost with.
#[derive(Clone, Debug)]
pub struct RouterLimits {
    /// Prices and minimum window of the clusters' billing.
    pub billing: slogate_core::billing::BillingConfig,
    /// Recent decisions (and recent outcomes per pool) kept for the admin
    /// API.
    pub decisions_max: usize,
    /// Finished client query ids remembered per pool for retries.
    pub idempotency_max: usize,
    /// How long a finished query's record answers retries, seconds.
    pub idempotency_retention_s: f64,
    /// The actor's mailbox capacity.
    pub mailbox_capacity: usize,
    /// Templates whose last SLO is kept per pool (clients choose
    /// templates, so this bounds the map).
    pub templates_max: usize,
    /// Clusters a pool may have at once (starting, ready, draining or
    /// unhealthy), whoever asks for one.
    pub clusters_per_pool_max: usize,
}

impl RouterShard {
    /// A shard owning `pools`.
    pub fn new(clock: VirtualClock, pools: Vec<PoolSetup>, reservoir: Option<ReservoirLink>, limits: RouterLimits) -> Self {
        let pools = pools
            .into_iter()
            .map(|setup| {
                let now = clock.now();
                let clusters = setup
                    .clusters
                    .iter()
                    .map(|&(id, size, state)| ClusterView { id, size, state, requested_at: now, ready_at: now, running: Vec::new() })
                    .collect();
                let trackers = setup
                    .clusters
                    .iter()
                    .map(|&(cluster, size, state)| {
                        let tracker = ClusterTracker::new(TrackerSetup {
                            pool: setup.id.clone(),
                            cluster,
                            size,
                            state,
                            billing: limits.billing.clone(),
                            provisioned: setup.provisioned.clone(),
                            backend: setup.backend.clone(),
                            provider: setup.provider.clone(),
                            clock,
                            mailbox_capacity: limits.mailbox_capacity,
                        });
                        (cluster, tracker.start())
                    })
                    .collect();
                let mut policy = setup.policy;
                policy.defer_fits();
                let runtime = PoolRuntime {
                    policy,
                    policy_generation: 0,
                    fit_running: false,
                    fit_rested_at: std::time::Instant::now(),
                    backend: setup.backend,
                    provider: setup.provider,
                    catalog: setup.catalog,
                    trackers,
                    view: Pool { id: setup.id.clone(), clusters },
                    in_flight: HashMap::new(),
                    in_flight_max: setup.in_flight_max,
                    by_client_id: ClientIds::default(),
                    dispatches: HashMap::new(),
                    done: IdempotencyTable::new(limits.idempotency_max, limits.idempotency_retention_s),
                    recent: VecDeque::new(),
                    stats: PoolStats::default(),
                    autoscaler: None,
                    elastic: setup.elastic,
                    provisioned: setup.provisioned,
                    caps: setup.caps,
                    query_latency: setup.query_latency,
                    slos: std::collections::BTreeMap::new(),
                    slo_templates: slogate_core::recency::RecentKeys::new(limits.templates_max),
                };
                (setup.id, runtime)
            })
            .collect();
        RouterShard {
            clock,
            decision_time: std::sync::Arc::default(),
            event_loop_lag: std::sync::Arc::default(),
            lag_probe_every: None,
            pools,
            log: Outbox { link: reservoir, updates: Vec::new(), dropped: 0 },
            decisions: VecDeque::new(),
            decisions_max: limits.decisions_max,
            tracker_mailbox_capacity: limits.mailbox_capacity,
            clusters_per_pool_max: limits.clusters_per_pool_max.max(1),
            billing: limits.billing.clone(),
            next_query: 0,
            query_id_step: 1,
            index: 0,
            thread: String::new(),
            draining: false,
            scale_notices_dropped: 0,
            mailbox_capacity: limits.mailbox_capacity,
        }
    }

    /// Loads idempotency records kept from before a restart (oldest first
    /// within a pool); records of pools it does not own are skipped.
    pub fn restore_idempotency(&mut self, records: Vec<IdempotencyRecord>) {
        let now = crate::clock::unix_now_s();
        for record in records {
            if let Some(pool) = self.pools.get_mut(&record.pool) {
                pool.done.insert(record, now);
            }
        }
    }

    /// Makes this shard `index` of `count`: its query ids are those equal
    /// to `index` modulo `count`, so no two shards of a node share one.
    pub fn as_shard(mut self, index: usize, count: usize) -> Self {
        let count = count.max(1) as u64;
        self.index = index;
        self.next_query = index as u64 % count;
        self.query_id_step = count;
        self
    }

    /// Records into `decision_time` and `event_loop_lag` instead of the
    /// shard's own histograms: the node's shards share one decision-time
    /// histogram and each has a lag histogram the metrics endpoint labels.
    pub fn with_histograms(
        mut self,
        decision_time: std::sync::Arc<crate::metrics::Histogram>,
        event_loop_lag: std::sync::Arc<crate::metrics::Histogram>,
    ) -> Self {
        self.decision_time = decision_time;
        self.event_loop_lag = event_loop_lag;
        self
    }

    /// Wall-clock time of each `route()` call, for the metrics endpoint.
    pub fn decision_time(&self) -> std::sync::Arc<crate::metrics::Histogram> {
        self.decision_time.clone()
    }

    /// Measures the shard's event-loop lag: a thread of its own sends the
    /// shard a timestamped message every `every`, and the handler records
    /// how long it waited, behind the messages ahead of it and whatever
    /// else ran on the shard's thread. The stamp is taken as it is sent, so
    /// the measure has no timer granularity (a timer's lateness had about
    /// 2 ms of it on an idle thread).
    pub fn with_lag_probe(mut self, every: std::time::Duration) -> Self {
        self.lag_probe_every = Some(every);
        self
    }

    /// The lag probe's measurements, for the metrics endpoint.
    pub fn event_loop_lag(&self) -> std::sync::Arc<crate::metrics::Histogram> {
        self.event_loop_lag.clone()
    }

    /// Starts the probe's sender. It holds the shard weakly, so it never
    /// keeps it alive, and ends once the shard has stopped.
    fn probe_lag(every: std::time::Duration, shard: actix::WeakAddr<RouterShard>) {
        let spawned = std::thread::Builder::new().name("slogate-lag-probe".into()).spawn(move || {
            loop {
                std::thread::sleep(every);
                let Some(shard) = shard.upgrade().filter(Addr::connected) else { break };
                // A full mailbox skips a probe: the queue's length says
                // that already.
                let _ = shard.try_send(LagProbe { sent: std::time::Instant::now() });
            }
        });
        if let Err(error) = spawned {
            tracing::warn!(message = "The event-loop lag probe did not start.", %error);
        }
    }

    fn record_decision(&mut self, record: DecisionRecord) {
        if self.decisions.len() == self.decisions_max {
            self.decisions.pop_back();
        }
        self.decisions.push_front(record);
    }
}

/// Pool `id`'s runtime, or the error that names the unknown pool.
fn pool_in<'a>(pools: &'a HashMap<PoolId, PoolRuntime>, id: &PoolId) -> Result<&'a PoolRuntime> {
    pools.get(id).ok_or_else(|| Error::UnknownPool(id.to_string()))
}

/// The same, to change it.
fn pool_in_mut<'a>(pools: &'a mut HashMap<PoolId, PoolRuntime>, id: &PoolId) -> Result<&'a mut PoolRuntime> {
    pools.get_mut(id).ok_or_else(|| Error::UnknownPool(id.to_string()))
}

impl Actor for RouterShard {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        let current = std::thread::current();
        self.thread = current.name().map_or_else(|| format!("{:?}", current.id()), str::to_owned);
        for (id, pool) in &self.pools {
            pool.backend.watch_clusters(id.clone(), ctx.address().recipient());
        }
        if let Some(every) = self.lag_probe_every {
            RouterShard::probe_lag(every, ctx.address().downgrade());
        }
        ctx.run_interval(OUTBOX_EVERY, |actor, _ctx| actor.log.flush());
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.log.flush();
    }
}

/// The longest an update waits in the shard's outbox for the Reservoir.
const OUTBOX_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// Updates the outbox sends at once, at most.
const OUTBOX_MAX: usize = 256;

/// The shard's updates for the Reservoir, sent a batch per message (every
/// [`OUTBOX_EVERY`], or at [`OUTBOX_MAX`]): one message per update woke
/// the reservoir's thread for each, which cost it as much as the writes.
struct Outbox {
    link: Option<ReservoirLink>,
    updates: Vec<LogUpdate>,
    /// Updates dropped because the Reservoir's mailbox was full.
    dropped: u64,
}

impl Outbox {
    fn push(&mut self, update: LogUpdate) {
        if self.link.is_none() {
            return;
        }
        self.updates.push(update);
        if self.updates.len() >= OUTBOX_MAX {
            self.flush();
        }
    }

    /// Sends what waits.
    fn flush(&mut self) {
        let Some(link) = &self.link else { return };
        if self.updates.is_empty() {
            return;
        }
        let updates = std::mem::replace(&mut self.updates, Vec::with_capacity(OUTBOX_MAX));
        if let Err(refused) = link.offer_batch(updates) {
            self.dropped += refused.len() as u64;
        }
    }
}

/// The lag probe's message: when it was sent.
#[derive(Message)]
#[rtype(result = "()")]
struct LagProbe {
    sent: std::time::Instant,
}

impl Handler<LagProbe> for RouterShard {
    type Result = ();

    fn handle(&mut self, probe: LagProbe, _ctx: &mut Self::Context) {
        self.event_loop_lag.observe(probe.sent.elapsed());
    }
}

/// Sends the shard's waiting Reservoir updates now (a shutdown does before
/// it closes the Reservoir; the outbox otherwise waits up to 5 ms).
#[derive(Clone, Message)]
#[rtype(result = "()")]
pub struct FlushLog;

impl Handler<FlushLog> for RouterShard {
    type Result = ();

    fn handle(&mut self, _message: FlushLog, _ctx: &mut Self::Context) {
        self.log.flush();
    }
}

impl Handler<ClusterUpdate> for RouterShard {
    type Result = ();

    fn handle(&mut self, message: ClusterUpdate, _ctx: &mut Self::Context) {
        let now = self.clock.now();
        if let Some(view) = self
            .pools
            .get_mut(&message.pool)
            .and_then(|p| p.view.clusters.iter_mut().find(|c| c.id == message.cluster))
        {
            // A cluster released while starting (or while unhealthy) stays
            // draining when it becomes ready: it must not take new queries.
            if matches!(message.state, ClusterState::Ready | ClusterState::Unhealthy) && view.state == ClusterState::Draining {
                return;
            }
            if message.state == ClusterState::Ready && view.state == ClusterState::Unhealthy {
                // Back from a failed health check: it was ready before.
                view.state = ClusterState::Ready;
                return;
            }
            if message.state == ClusterState::Ready {
                view.ready_at = now;
            }
            let was = view.state;
            view.state = message.state;
            let event = match (message.state, message.reason) {
                (ClusterState::Ready, _) => Some(ScaleEvent::ClusterReady(message.cluster)),
                (ClusterState::Gone, Some(reason)) if was == ClusterState::Starting => {
                    tracing::warn!(message = "A starting cluster was abandoned by its provider.", pool = %message.pool, cluster = %message.cluster, %reason);
                    Some(ScaleEvent::ClusterAbandoned { cluster: message.cluster, reason })
                }
                (ClusterState::Gone, _) => Some(ScaleEvent::ClusterGone(message.cluster)),
                _ => None,
            };
            if let Some(event) = event
                && let Some(pool) = self.pools.get_mut(&message.pool)
                && !pool.notify(event)
            {
                self.scale_notices_dropped += 1;
            }
        }
    }
}

impl Handler<ForkPlanner> for RouterShard {
    type Result = Result<(Box<dyn PlanningRouter>, Pool)>;

    fn handle(&mut self, message: ForkPlanner, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in(&self.pools, &message.pool)?;
        let planner = pool
            .policy
            .fork_planner()
            .ok_or_else(|| Error::Backend(format!("routing policy {} cannot predict completions for the size selector", pool.policy.name())))?;
        Ok((planner, pool.view.clone()))
    }
}

impl Handler<InstallModel> for RouterShard {
    type Result = Result<()>;

    fn handle(&mut self, message: InstallModel, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in_mut(&mut self.pools, &message.pool)?;
        pool.policy.install_model(message.weights).map_err(Error::Unsupported)?;
        tracing::info!(message = "A new latency model is in force.", pool = %message.pool);
        Ok(())
    }
}

impl Handler<GetSloBook> for RouterShard {
    type Result = Result<std::collections::BTreeMap<slogate_core::model::TemplateId, slogate_core::time::Duration>>;

    fn handle(&mut self, message: GetSloBook, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in(&self.pools, &message.pool)?;
        Ok(pool.slos.clone())
    }
}

impl Handler<AttachAutoscaler> for RouterShard {
    type Result = Result<()>;

    fn handle(&mut self, message: AttachAutoscaler, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in_mut(&mut self.pools, &message.pool)?;
        pool.autoscaler = Some(message.autoscaler);
        Ok(())
    }
}

impl Handler<Recall> for RouterShard {
    type Result = Result<Option<SubmitOutcome>>;

    fn handle(&mut self, message: Recall, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in_mut(&mut self.pools, &message.pool)?;
        let Some(record) = pool.done.get(&message.tenant, &message.client_query_id, crate::clock::unix_now_s()) else { return Ok(None) };
        if let Some(field) = record.digest.mismatch(&message.digest) {
            return Err(Error::IdempotencyMismatch { client_query_id: message.client_query_id, field });
        }
        pool.stats.deduplicated += 1;
        Ok(Some(record.outcome.clone()))
    }
}

impl Handler<Remember> for RouterShard {
    type Result = ();

    fn handle(&mut self, message: Remember, _ctx: &mut Self::Context) {
        let Some(pool) = self.pools.get_mut(&message.record.pool) else { return };
        let finished_unix_s = message.record.finished_unix_s;
        let record = std::sync::Arc::new(message.record);
        if self.log.link.is_some() {
            self.log.push(LogUpdate::Idempotency(record.clone()));
        }
        pool.done.insert(record, finished_unix_s);
    }
}

impl Handler<ReplacePolicy> for RouterShard {
    type Result = Result<()>;

    fn handle(&mut self, message: ReplacePolicy, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in_mut(&mut self.pools, &message.pool)?;
        if !pool.in_flight.is_empty() {
            return Err(Error::Unsupported(format!("pool `{}` has {} queries in flight; its policy stays", message.pool, pool.in_flight.len())));
        }
        let mut policy = (message.build)().map_err(Error::Unsupported)?;
        policy.defer_fits();
        pool.policy = policy;
        pool.policy_generation += 1;
        Ok(())
    }
}

impl Handler<RequestCluster> for RouterShard {
    type Result = ResponseActFuture<Self, Result<ClusterId>>;

    fn handle(&mut self, message: RequestCluster, _ctx: &mut Self::Context) -> Self::Result {
        let clusters_max = self.clusters_per_pool_max;
        let provider = match self.pools.get(&message.pool) {
            Some(pool) if !self.draining && pool.view.clusters.iter().filter(|c| c.state != ClusterState::Gone).count() >= clusters_max => {
                return Box::pin(fut::ready(Err(Error::ClusterLimit { pool: message.pool.to_string(), limit: clusters_max })));
            }
            Some(pool) if !self.draining => {
                // The pool's caps count every cluster that can still bill.
                let live: Vec<Rpu> = pool.view.clusters.iter().filter(|c| c.state != ClusterState::Gone).map(|c| c.size).collect();
                if let Err(refusal) = pool.caps.caps.admit(&live, message.size, pool.caps.price_per_rpu_hour_usd) {
                    return Box::pin(fut::ready(Err(Error::CapReached { pool: message.pool.to_string(), reason: refusal.to_string() })));
                }
                pool.provider.clone()
            }
            Some(_) => return Box::pin(fut::ready(Err(Error::ShuttingDown))),
            None => return Box::pin(fut::ready(Err(Error::UnknownPool(message.pool.to_string())))),
        };
        let size = message.size;
        let pool_id = message.pool;
        let requested = provider.spin_up(pool_id.clone(), size);
        Box::pin(requested.into_actor(self).map(move |reply, actor, _ctx| {
            let cluster = reply.map_err(backend_error)?;
            actor.add_starting_cluster(&pool_id, cluster, size);
            Ok(cluster)
        }))
    }
}

impl RouterShard {
    /// Puts `cluster` into `pool_id`'s view as starting, with a tracker.
    fn add_starting_cluster(&mut self, pool_id: &PoolId, cluster: ClusterId, size: Rpu) {
        let now = self.clock.now();
        let Some(pool) = self.pools.get_mut(pool_id) else { return };
        let setup = TrackerSetup {
            pool: pool_id.clone(),
            cluster,
            size,
            state: ClusterState::Starting,
            billing: self.billing.clone(),
            provisioned: pool.provisioned.clone(),
            backend: pool.backend.clone(),
            provider: pool.provider.clone(),
            clock: self.clock,
            mailbox_capacity: self.tracker_mailbox_capacity,
        };
        pool.trackers.insert(cluster, ClusterTracker::new(setup).start());
        pool.view.clusters.push(ClusterView { id: cluster, size, state: ClusterState::Starting, requested_at: now, ready_at: now, running: Vec::new() });
    }
}

impl Handler<AdoptClusters> for RouterShard {
    type Result = Result<Vec<ClusterId>>;

    fn handle(&mut self, message: AdoptClusters, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in(&self.pools, &message.pool)?;
        let known: Vec<ClusterId> = pool.view.clusters.iter().map(|c| c.id).collect();
        let mut adopted = Vec::new();
        for (cluster, size) in message.clusters {
            if !known.contains(&cluster) && !adopted.contains(&cluster) {
                self.add_starting_cluster(&message.pool, cluster, size);
                adopted.push(cluster);
            }
        }
        Ok(adopted)
    }
}

impl Handler<ForgetClusters> for RouterShard {
    type Result = Result<Vec<ClusterId>>;

    fn handle(&mut self, message: ForgetClusters, _ctx: &mut Self::Context) -> Self::Result {
        let pool = pool_in_mut(&mut self.pools, &message.pool)?;
        let forgotten: Vec<ClusterId> = pool.view.clusters.drain(..).map(|c| c.id).collect();
        // A tracker with queries still running lives until they end.
        pool.trackers.clear();
        Ok(forgotten)
    }
}

impl Handler<ReleaseCluster> for RouterShard {
    type Result = ResponseActFuture<Self, Result<()>>;

    fn handle(&mut self, message: ReleaseCluster, _ctx: &mut Self::Context) -> Self::Result {
        let Some(pool) = self.pools.get_mut(&message.pool) else {
            return Box::pin(fut::ready(Err(Error::UnknownPool(message.pool.to_string()))));
        };
        let ready = pool.view.clusters.iter().filter(|c| c.state == ClusterState::Ready).count();
        let Some(view) = pool.view.clusters.iter_mut().find(|c| c.id == message.cluster && c.state != ClusterState::Gone) else {
            return Box::pin(fut::ready(Err(Error::UnknownCluster(message.cluster.to_string()))));
        };
        if view.state == ClusterState::Ready && ready == 1 && !message.force {
            return Box::pin(fut::ready(Err(Error::LastReadyCluster { pool: message.pool.to_string(), cluster: message.cluster.to_string() })));
        }
        // A dry run (every shadow-mode pool's provider) only records the
        // release: the cluster keeps serving, never draining meanwhile.
        if !pool.provider.acts() {
            let released = pool.provider.spin_down(message.pool, message.cluster);
            return Box::pin(async move { released.await.map_err(backend_error) }.into_actor(self));
        }
        // Stop routing to it at once; the backend drains it.
        let previous = view.state;
        if matches!(view.state, ClusterState::Ready | ClusterState::Starting | ClusterState::Unhealthy) {
            view.state = ClusterState::Draining;
        }
        let tracker = pool.trackers.get(&message.cluster).expect("every cluster in the view has a tracker").clone();
        let (pool_id, cluster) = (message.pool, message.cluster);
        Box::pin(async move { tracker.send(Release).await }.into_actor(self).map(move |reply, actor, _ctx| {
            let result = match reply {
                Ok(result) => result.map_err(backend_error),
                Err(_) => Err(Error::Backend("the cluster's tracker is not answering".into())),
            };
            // A platform that refused keeps the cluster as it was.
            if result.is_err()
                && let Some(view) = actor.pools.get_mut(&pool_id).and_then(|p| p.view.clusters.iter_mut().find(|c| c.id == cluster))
                && view.state == ClusterState::Draining
            {
                view.state = previous;
            }
            result
        }))
    }
}

fn resolved(query: QueryId, outcome: SubmitOutcome) -> Submitted {
    let (sender, receiver) = oneshot::channel();
    let _ = sender.send(outcome);
    Submitted { query, reply: receiver }
}

/// The actors' error for a refused backend or provider request.
fn backend_error(error: ExecuteError) -> Error {
    match error {
        ExecuteError::Unsupported(reason) => Error::Unsupported(reason),
        other => Error::Backend(other.to_string()),
    }
}

impl Handler<Submit> for RouterShard {
    type Result = Result<Submitted>;

    fn handle(&mut self, message: Submit, ctx: &mut Self::Context) -> Self::Result {
        if self.draining {
            return Err(Error::ShuttingDown);
        }
        let now = self.clock.now();
        let pool = pool_in_mut(&mut self.pools, &message.pool)?;

        // Retries of a known client id: the same reply, never a second
        // run, and never another request's reply.
        if !message.client_query_id.is_empty() {
            let mismatch = |field: &'static str| Error::IdempotencyMismatch { client_query_id: message.client_query_id.clone(), field };
            if let Some(record) = pool.done.get(&message.tenant, &message.client_query_id, crate::clock::unix_now_s()) {
                if let Some(field) = record.digest.mismatch(&message.digest) {
                    return Err(mismatch(field));
                }
                pool.stats.deduplicated += 1;
                return Ok(resolved(record.outcome.query, record.outcome.clone()));
            }
            if let Some(query) = pool.by_client_id.get(&message.tenant, &message.client_query_id) {
                let flight = pool.in_flight.get_mut(&query).expect("client ids map to in-flight queries");
                if let Some(field) = flight.digest.mismatch(&message.digest) {
                    return Err(mismatch(field));
                }
                let (sender, receiver) = oneshot::channel();
                flight.waiters.push(sender);
                pool.stats.deduplicated += 1;
                return Ok(Submitted { query, reply: receiver });
            }
        }
        if pool.in_flight.len() >= pool.in_flight_max {
            pool.stats.refused += 1;
            return Err(Error::AdmissionLimit { in_flight: pool.in_flight.len(), limit: pool.in_flight_max });
        }

        let id = QueryId(self.next_query);
        self.next_query += self.query_id_step;
        // Without a client id the node's id stands in; it cannot be retried,
        // so it is not indexed for deduplication.
        let client_supplied = !message.client_query_id.is_empty();
        let client_query_id = if message.client_query_id.is_empty() { id.to_string() } else { message.client_query_id };
        let (template, sql) = pool.catalog.resolve(message.template, message.sql);
        let query = Query { id, pool: message.pool.clone(), template, slo: message.slo, arrival: now };
        pool.stats.accepted += 1;
        if let Some(forgotten) = pool.slo_templates.touch(&query.template) {
            pool.slos.remove(&forgotten);
            pool.stats.templates_evicted += 1;
        }
        pool.slos.insert(query.template, query.slo.latency);
        if self.log.link.is_some() {
            let unix_secs = self.clock.calendar_now_s().floor() as i64;
            self.log.push(LogUpdate::Arrival(ArrivalUpdate { unix_secs, template: query.template }));
        }

        let (sender, receiver) = oneshot::channel();
        let started = std::time::Instant::now();
        let routing = pool.policy.route(now, &query, &pool.view);
        self.decision_time.observe(started.elapsed());
        let (target, explanation, predicted) = match routing {
            Routing::Dispatch(decision) => (Some(decision.target), Arc::<str>::from(decision.explanation), decision.predicted_latency),
            Routing::Reject { reason } => (None, Arc::<str>::from(reason), None),
        };
        let decision = DecisionRecord {
            pool: message.pool.clone(),
            query: id,
            client_query_id: client_query_id.clone(),
            tenant: message.tenant.clone(),
            template: query.template,
            at_s: now.as_secs_f64(),
            target,
            explanation: explanation.clone(),
        };
        let chosen = match target {
            Some(Target::Cluster(cluster)) if pool.view.clusters.iter().any(|c| c.id == cluster) => Target::Cluster(cluster),
            Some(Target::Elastic) if pool.elastic => Target::Elastic,
            other => {
                let reason = match other {
                    Some(Target::Elastic) => "no elastic tier is configured for this pool".into(),
                    Some(Target::Cluster(c)) => format!("the policy chose unknown cluster {c}").into(),
                    None => explanation,
                };
                pool.stats.failed += 1;
                pool.stats.violations += 1;
                let outcome = SubmitOutcome {
                    client_query_id,
                    query: id,
                    status: SubmitStatus::Failed,
                    target: None,
                    latency: Duration::ZERO,
                    slo_met: false,
                    explanation: reason,
                    predicted: None,
                    backend_wall: std::time::Duration::ZERO,
                    sqlstate: None,
                    result: None,
                    execution: None,
                };
                if !pool.notify(ScaleEvent::Arrival { query: query.clone(), target: None }) {
                    self.scale_notices_dropped += 1;
                }
                self.record_decision(decision);
                return Ok(resolved(id, outcome));
            }
        };
        let mut neighbours_at_dispatch = 0;
        let mut dispatches_at_dispatch = 0;
        if chosen == Target::Elastic {
            pool.stats.offloaded += 1;
        }
        if let Target::Cluster(cluster) = chosen {
            let view = pool.view.clusters.iter_mut().find(|c| c.id == cluster).expect("checked above");
            neighbours_at_dispatch = view.running.len() as u32;
            view.running.push(RunningQuery { id, template: query.template, slo: query.slo, arrival: now, dispatched: now });
            dispatches_at_dispatch = pool.count_dispatch(cluster);
        }
        if client_supplied {
            pool.by_client_id.insert(&message.tenant, client_query_id.clone(), id);
        }
        pool.in_flight.insert(
            id,
            InFlight {
                client_query_id,
                template: query.template,
                slo: query.slo,
                arrival: now,
                target: chosen,
                neighbours_at_dispatch,
                overlapped_at_dispatch: neighbours_at_dispatch > 0,
                dispatches_at_dispatch,
                explanation,
                predicted,
                client_supplied,
                tenant: message.tenant,
                digest: message.digest,
                waiters: vec![sender],
                abandoned: false,
                sql: sql.clone(),
                rerouted: false,
            },
        );
        if !pool.notify(ScaleEvent::Arrival { query: query.clone(), target: Some(chosen) }) {
            self.scale_notices_dropped += 1;
        }
        self.record_decision(decision);
        self.dispatch(message.pool, query, sql, chosen, ctx);
        Ok(Submitted { query: id, reply: receiver })
    }
}

impl RouterShard {
    /// Sends `query`, already placed in `pool_id`'s view and in flight, to
    /// `chosen`, and handles its completion as the run ends.
    fn dispatch(&mut self, pool_id: PoolId, query: Query, sql: Option<Arc<str>>, chosen: Target, ctx: &mut Context<Self>) {
        let Some(pool) = self.pools.get(&pool_id) else { return };
        let id = query.id;
        let clock = self.clock;
        // Clusters run through their tracker; the elastic tier straight on
        // the backend.
        let completion: crate::backend::LocalFuture<Option<Completion>> = match chosen {
            Target::Cluster(cluster) => {
                let tracker = pool.trackers.get(&cluster).expect("every cluster in the view has a tracker").clone();
                let (reply, completion) = oneshot::channel();
                Box::pin(async move {
                    match tracker.send(Dispatch { query, sql, reply }).await {
                        Ok(Ok(())) => completion.await.ok(),
                        Ok(Err(refused)) => Some(Completion::refused(&refused, clock.now())),
                        Err(_) => None,
                    }
                })
            }
            Target::Elastic => {
                let running = pool.backend.execute(Execution { query, target: Target::Elastic, sql });
                Box::pin(async move { Some(running.await.unwrap_or_else(|refused| Completion::refused(&refused, clock.now()))) })
            }
        };
        // The completion is handled as the future ends, on the shard, with
        // no second trip through its mailbox.
        ctx.spawn(
            async move {
                let sent = std::time::Instant::now();
                let completion = completion.await;
                (completion, sent.elapsed())
            }
            .into_actor(self)
            .map(move |(completion, backend_wall), actor, ctx| {
                actor.handle(CompletionUpdate { pool: pool_id, query: id, completion, backend_wall }, ctx);
            }),
        );
    }
}

impl Handler<ClientGone> for RouterShard {
    type Result = ();

    fn handle(&mut self, message: ClientGone, _ctx: &mut Self::Context) {
        let Some(pool) = self.pools.get_mut(&message.pool) else { return };
        let Some(flight) = pool.in_flight.get_mut(&message.query) else { return };
        if !flight.waiters.iter().all(oneshot::Sender::is_closed) {
            return;
        }
        // A retry of the id (the client's, or the node that forwarded it
        // re-sending it after a failure) starts a new run rather than
        // joining this doomed one or getting its cancellation.
        flight.abandoned = true;
        if flight.client_supplied {
            pool.by_client_id.remove(&flight.tenant, &flight.client_query_id, message.query);
        }
        let target = flight.target;
        pool.cancel(message.query, target, CancelReason::ClientGone);
    }
}

impl Handler<CompletionUpdate> for RouterShard {
    type Result = ();

    fn handle(&mut self, message: CompletionUpdate, ctx: &mut Self::Context) {
        let pool = message.pool.clone();
        if let Some(Completion::Failed(failure)) = &message.completion
            && failure.throttled
            && self.reroute_throttled(&message.pool, message.query, &failure.reason, ctx)
        {
            return;
        }
        self.complete(message);
        self.start_fit(&pool, ctx);
    }
}

/// After a refit that took `d`, a pool's next waits `FIT_REST_FACTOR × d`:
/// refits then use at most `1 / (1 + FIT_REST_FACTOR)` of a core.
const FIT_REST_FACTOR: u32 = 9;

impl RouterShard {
    /// Runs the refit `pool`'s policy has due, if none is running and the
    /// last has rested, on tokio's blocking pool, and installs it when
    /// done. A refit that waits for its rest starts at a later completion.
    fn start_fit(&mut self, pool_id: &PoolId, ctx: &mut Context<Self>) {
        let Some(pool) = self.pools.get_mut(pool_id) else { return };
        if pool.fit_running || std::time::Instant::now() < pool.fit_rested_at {
            return;
        }
        let Some(job) = pool.policy.take_fit_job() else { return };
        pool.fit_running = true;
        let generation = pool.policy_generation;
        let pool_id = pool_id.clone();
        let fit = tokio::task::spawn_blocking(move || {
            let started = std::time::Instant::now();
            (job.run(), started.elapsed())
        });
        ctx.spawn(fit.into_actor(self).map(move |fit, actor, ctx| {
            let Some(pool) = actor.pools.get_mut(&pool_id) else { return };
            pool.fit_running = false;
            let fit = fit.map(|(fit, took)| {
                pool.fit_rested_at = std::time::Instant::now() + took * FIT_REST_FACTOR;
                fit
            });
            match fit {
                Ok(_) if pool.policy_generation != generation => {}
                Ok(fit) => {
                    pool.policy.install_fit(fit);
                    pool.stats.predictor_fits += 1;
                }
                Err(error) => tracing::error!(message = "A predictor refit failed; the previous fit stays.", pool = %pool_id, %error),
            }
            // Completions that came in meanwhile may have made another due.
            actor.start_fit(&pool_id, ctx);
        }));
    }

    /// The elastic tier throttled `query`, an offload: the policy learns it
    /// (the tier cools down), and the query is routed again, once, with its
    /// id, waiters and arrival kept. False when it is not such an offload,
    /// or the policy finds no cluster for it: then it fails.
    fn reroute_throttled(&mut self, pool_id: &PoolId, query_id: QueryId, reason: &str, ctx: &mut Context<Self>) -> bool {
        let now = self.clock.now();
        let Some(pool) = self.pools.get_mut(pool_id) else { return false };
        let Some(flight) = pool.in_flight.get_mut(&query_id) else { return false };
        if flight.target != Target::Elastic || flight.rerouted || flight.abandoned {
            return false;
        }
        pool.policy.handle_failure(now, query_id, true);
        let query = Query { id: query_id, pool: pool_id.clone(), template: flight.template, slo: flight.slo, arrival: flight.arrival };
        let Routing::Dispatch(decision) = pool.policy.route(now, &query, &pool.view) else { return false };
        let Target::Cluster(cluster) = decision.target else { return false };
        let Some(view) = pool.view.clusters.iter_mut().find(|c| c.id == cluster) else { return false };
        let neighbours = view.running.len() as u32;
        view.running.push(RunningQuery { id: query_id, template: query.template, slo: query.slo, arrival: query.arrival, dispatched: now });
        let dispatches = pool.count_dispatch(cluster);
        let flight = pool.in_flight.get_mut(&query_id).expect("looked up above");
        flight.target = Target::Cluster(cluster);
        flight.rerouted = true;
        flight.neighbours_at_dispatch = neighbours;
        flight.overlapped_at_dispatch = neighbours > 0;
        flight.dispatches_at_dispatch = dispatches;
        flight.explanation = format!("the elastic tier throttled it ({reason}), so it was routed again: {}", decision.explanation).into();
        flight.predicted = decision.predicted_latency;
        pool.stats.offloads_rerouted += 1;
        let record = DecisionRecord {
            pool: pool_id.clone(),
            query: query_id,
            client_query_id: flight.client_query_id.clone(),
            tenant: flight.tenant.clone(),
            template: query.template,
            at_s: now.as_secs_f64(),
            target: Some(flight.target),
            explanation: flight.explanation.clone(),
        };
        let sql = flight.sql.clone();
        // The autoscaler saw its arrival once, with the offload, and sees
        // its completion as usual.
        self.record_decision(record);
        self.dispatch(pool_id.clone(), query, sql, Target::Cluster(cluster), ctx);
        true
    }

    fn complete(&mut self, message: CompletionUpdate) {
        let now = self.clock.now();
        let recent_max = self.decisions_max;
        let Some(pool) = self.pools.get_mut(&message.pool) else { return };
        let Some(flight) = pool.in_flight.remove(&message.query) else { return };
        if let Target::Cluster(cluster) = flight.target
            && let Some(view) = pool.view.clusters.iter_mut().find(|c| c.id == cluster)
        {
            view.running.retain(|r| r.id != message.query);
        }
        let mut execution = None;
        let outcome = match message.completion {
            Some(Completion::Ran { report, result }) => {
                pool.policy.handle_completion(now, &report);
                if !pool.notify(ScaleEvent::Finished(report.clone())) {
                    self.scale_notices_dropped += 1;
                }
                let latency = report.latency();
                pool.query_latency.observe(std::time::Duration::from_micros(latency.as_micros()));
                let completed = report.outcome == ExecutionOutcome::Completed;
                let slo_met = completed && flight.slo.is_met_by(latency);
                if completed {
                    pool.stats.completed += 1;
                } else {
                    pool.stats.timed_out += 1;
                }
                if !slo_met {
                    pool.stats.violations += 1;
                }
                // The execution log teaches the cluster predictors: elastic
                // executions are not cluster executions.
                if self.log.link.is_some()
                    && let Target::Cluster(cluster) = report.target
                {
                    let size = pool.view.clusters.iter().find(|c| c.id == cluster).map_or(Rpu(0), |c| c.size);
                    let record = ExecutionRecord {
                        query: message.query,
                        template: flight.template,
                        cluster,
                        size,
                        neighbours_at_dispatch: flight.neighbours_at_dispatch,
                        latency,
                        censored: !completed,
                        ran_alone: !pool.overlapped(flight.target, flight.overlapped_at_dispatch, flight.dispatches_at_dispatch),
                        timeline: Some(Timeline::on_cluster(&message.pool, cluster, self.clock.calendar_s(flight.arrival))),
                        queued: report.started.map_or(slogate_core::time::Duration::ZERO, |started| started.saturating_duration_since(report.dispatched)),
                    };
                    execution = Some(record.clone());
                    self.log.push(LogUpdate::Execution(record));
                }
                SubmitOutcome {
                    client_query_id: flight.client_query_id.clone(),
                    query: message.query,
                    status: if completed { SubmitStatus::Completed } else { SubmitStatus::TimedOut },
                    target: Some(flight.target),
                    latency,
                    slo_met,
                    explanation: flight.explanation,
                    predicted: flight.predicted,
                    backend_wall: message.backend_wall,
                    sqlstate: None,
                    result,
                    execution: execution.take(),
                }
            }
            failed => {
                pool.stats.failed += 1;
                pool.stats.violations += 1;
                let (explanation, sqlstate, finished, throttled) = match failed {
                    Some(Completion::Failed(failure)) => (failure.reason.into(), failure.sqlstate, failure.finished, failure.throttled),
                    _ => ("the backend lost the query".into(), None, now, false),
                };
                pool.policy.handle_failure(now, message.query, throttled);
                SubmitOutcome {
                    client_query_id: flight.client_query_id.clone(),
                    query: message.query,
                    status: SubmitStatus::Failed,
                    target: Some(flight.target),
                    latency: finished.saturating_duration_since(flight.arrival),
                    slo_met: false,
                    explanation,
                    predicted: flight.predicted,
                    backend_wall: message.backend_wall,
                    sqlstate,
                    result: None,
                    execution: None,
                }
            }
        };
        if flight.client_supplied && !(flight.abandoned && outcome.status == SubmitStatus::Failed) {
            let client_query_id = pool
                .by_client_id
                .remove(&flight.tenant, &flight.client_query_id, message.query)
                .unwrap_or_else(|| flight.client_query_id.clone());
            let tenant = flight.tenant.clone();
            let finished_unix_s = crate::clock::unix_now_s();
            let record = std::sync::Arc::new(IdempotencyRecord {
                pool: message.pool.clone(),
                tenant,
                client_query_id,
                digest: flight.digest,
                finished_unix_s,
                outcome: outcome.without_rows(),
            });
            if self.log.link.is_some() {
                self.log.push(LogUpdate::Idempotency(record.clone()));
            }
            pool.done.insert(record, finished_unix_s);
        }
        if pool.recent.len() == recent_max {
            pool.recent.pop_back();
        }
        pool.recent.push_front((flight.tenant, outcome.clone()));
        // The last waiter (most often the only one) takes the outcome
        // itself. A caller that went away no longer needs the reply.
        let mut waiters = flight.waiters;
        if let Some(last) = waiters.pop() {
            for waiter in waiters {
                let _ = waiter.send(outcome.clone());
            }
            let _ = last.send(outcome);
        }
    }
}

impl Handler<Drain> for RouterShard {
    type Result = ();

    fn handle(&mut self, _message: Drain, _ctx: &mut Self::Context) {
        self.draining = true;
    }
}

impl Handler<FailInFlight> for RouterShard {
    type Result = usize;

    fn handle(&mut self, message: FailInFlight, _ctx: &mut Self::Context) -> usize {
        let now = self.clock.now();
        let mut failed = 0;
        for pool in self.pools.values_mut() {
            let in_flight = std::mem::take(&mut pool.in_flight);
            for (query, flight) in in_flight {
                pool.cancel(query, flight.target, CancelReason::Shutdown);
                failed += 1;
                pool.stats.failed += 1;
                pool.stats.violations += 1;
                let outcome = SubmitOutcome {
                    client_query_id: flight.client_query_id,
                    query,
                    status: SubmitStatus::Failed,
                    target: Some(flight.target),
                    latency: now - flight.arrival,
                    slo_met: false,
                    explanation: message.reason.as_str().into(),
                    predicted: flight.predicted,
                    backend_wall: std::time::Duration::ZERO,
                    sqlstate: None,
                    result: None,
                    execution: None,
                };
                for waiter in flight.waiters {
                    let _ = waiter.send(outcome.clone());
                }
            }
            pool.by_client_id.clear();
            for cluster in &mut pool.view.clusters {
                cluster.running.clear();
            }
        }
        failed
    }
}

impl Handler<GetDecisions> for RouterShard {
    type Result = MessageResult<GetDecisions>;

    fn handle(&mut self, message: GetDecisions, _ctx: &mut Self::Context) -> Self::Result {
        let decisions = self
            .decisions
            .iter()
            .filter(|d| message.tenant.as_ref().is_none_or(|t| *t == d.tenant) && message.pool.as_ref().is_none_or(|p| *p == d.pool));
        MessageResult(decisions.take(message.limit).cloned().collect())
    }
}

impl Handler<GetShadow> for RouterShard {
    type Result = MessageResult<GetShadow>;

    fn handle(&mut self, message: GetShadow, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.pools.get(&message.0).and_then(|p| p.policy.shadow_report()))
    }
}

impl Handler<GetTrackers> for RouterShard {
    type Result = MessageResult<GetTrackers>;

    fn handle(&mut self, message: GetTrackers, _ctx: &mut Self::Context) -> Self::Result {
        let mut trackers: Vec<_> =
            self.pools.get(&message.0).map(|p| p.trackers.iter().map(|(id, addr)| (*id, addr.clone())).collect()).unwrap_or_default();
        trackers.sort_by_key(|(id, _)| *id);
        MessageResult(trackers)
    }
}

impl Handler<GetRecentOutcomes> for RouterShard {
    type Result = MessageResult<GetRecentOutcomes>;

    fn handle(&mut self, message: GetRecentOutcomes, _ctx: &mut Self::Context) -> Self::Result {
        let recent = self.pools.get(&message.pool).map(|p| {
            p.recent
                .iter()
                .filter(|(tenant, _)| message.tenant.as_ref().is_none_or(|t| t == tenant))
                .take(message.limit)
                .map(|(_, outcome)| outcome.clone())
                .collect()
        });
        MessageResult(recent.unwrap_or_default())
    }
}

impl Handler<GetTenantInFlight> for RouterShard {
    type Result = MessageResult<GetTenantInFlight>;

    fn handle(&mut self, message: GetTenantInFlight, _ctx: &mut Self::Context) -> Self::Result {
        let ids = self.pools.get(&message.pool).map(|p| p.in_flight.iter().filter(|(_, f)| f.tenant == message.tenant).map(|(id, _)| *id).collect());
        MessageResult(ids.unwrap_or_default())
    }
}

impl Handler<GetState> for RouterShard {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        let mut pools: Vec<PoolState> = self
            .pools
            .values()
            .map(|p| PoolState {
                id: p.view.id.clone(),
                policy: p.policy.name().to_owned(),
                predictor: p.policy.predictor_name().map(str::to_owned),
                clusters: p.view.clusters.clone(),
                in_flight: p.in_flight.len(),
                in_flight_max: p.in_flight_max,
                stats: p.stats.clone(),
                violation_budget: p.policy.violation_budget(),
            })
            .collect();
        pools.sort_by(|a, b| a.id.cmp(&b.id));
        let shard = ShardInfo {
            index: self.index,
            thread: self.thread.clone(),
            pools: pools.iter().map(|p| p.id.clone()).collect(),
            draining: self.draining,
            event_loop_lag: LagSummary::of(&self.event_loop_lag),
        };
        MessageResult(RouterState {
            draining: self.draining,
            shards: vec![shard],
            pools,
            reservoir_updates_dropped: self.log.dropped,
            scale_notices_dropped: self.scale_notices_dropped,
        })
    }
}

/// Small tables for tests of a shard with no pools.
#[cfg(test)]
pub(crate) fn small_limits() -> RouterLimits {
    RouterLimits {
        billing: slogate_core::billing::BillingConfig::default(),
        decisions_max: 8,
        idempotency_max: 8,
        idempotency_retention_s: 60.0,
        mailbox_capacity: 64,
        templates_max: 8,
        clusters_per_pool_max: 4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_id_is_found_by_its_tenant_and_id_and_only_by_them() {
        let mut ids = ClientIds::default();
        ids.insert("tenant", "q-1".to_owned(), QueryId(7));
        ids.insert("ab", "c".to_owned(), QueryId(8));
        assert_eq!(ids.get("tenant", "q-1"), Some(QueryId(7)));
        assert_eq!(ids.get("ab", "c"), Some(QueryId(8)));
        // The parts are kept apart: no concatenation finds another key.
        assert_eq!(ids.get("a", "bc"), None);
        assert_eq!(ids.get("", "tenantq-1"), None);
        // Removed only while it still names the query, handing the id back.
        assert_eq!(ids.remove("tenant", "q-1", QueryId(9)), None);
        assert_eq!(ids.remove("tenant", "q-1", QueryId(7)).as_deref(), Some("q-1"));
        assert_eq!(ids.get("tenant", "q-1"), None);
        assert_eq!(ids.get("ab", "c"), Some(QueryId(8)));
    }

    #[test]
    fn the_lag_probe_measures_how_long_the_shards_thread_was_held() {
        actix::System::new().block_on(async {
            let shard = RouterShard::new(VirtualClock::start(1.0), Vec::new(), None, small_limits()).with_lag_probe(std::time::Duration::from_millis(2));
            let lag = shard.event_loop_lag();
            let _address = shard.start();
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            assert!(lag.count() > 0, "probes arrive while the shard runs");
            // Holding the shard's thread (this test runs on it) delays the
            // probes sent meanwhile by about as long.
            std::thread::sleep(std::time::Duration::from_millis(40));
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            assert!(lag.max() >= std::time::Duration::from_millis(30), "{:?}", lag.max());
        });
    }

    #[test]
    fn the_idempotency_copy_of_an_outcome_keeps_the_columns_and_drops_the_rows_and_the_execution() {
        let outcome = SubmitOutcome {
            client_query_id: "q-1".into(),
            query: QueryId(7),
            status: SubmitStatus::Completed,
            target: Some(Target::Cluster(slogate_core::model::ClusterId(1))),
            latency: slogate_core::time::Duration::from_secs(2),
            slo_met: true,
            explanation: "predicted 2.0s vs SLO 5.0s".into(),
            predicted: Some(slogate_core::time::Duration::from_secs(2)),
            backend_wall: std::time::Duration::from_millis(3),
            sqlstate: Some("00000".into()),
            result: Some(ResultRows { columns: vec!["n".into()], rows: vec![vec![Some("1".into())]], truncated: false, rows_total: 1 }),
            execution: Some(ExecutionRecord {
                query: QueryId(7),
                template: slogate_core::model::TemplateId(3),
                cluster: slogate_core::model::ClusterId(1),
                size: Rpu(16),
                neighbours_at_dispatch: 0,
                latency: slogate_core::time::Duration::from_secs(2),
                censored: false,
                queued: slogate_core::time::Duration::ZERO,
                ran_alone: true,
                timeline: None,
            }),
        };
        let kept = outcome.without_rows();
        let expected_result = ResultRows { columns: vec!["n".into()], rows: Vec::new(), truncated: true, rows_total: 1 };
        assert_eq!(kept, SubmitOutcome { result: Some(expected_result), execution: None, ..outcome });
    }
}
