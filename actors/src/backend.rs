//! The seam between routing and execution: the [`Backend`] trait.
//!
//! The RouterShard and every ClusterTracker hold a `Arc<dyn Backend>` and
//! never name an implementation. A backend is the only place that knows
//! how a query runs:
//!
//! - [`Backend::execute`] runs one query on a target and resolves with its
//!   [`Completion`]: the measured report (times on the node's clock), the
//!   rows it returned, or why it failed;
//! - [`Backend::cancel`] stops a running query on the server (a client
//!   that hung up, a shutdown past its grace period);
//! - [`Backend::watch_clusters`] reports clusters that became ready, gone,
//!   unhealthy or healthy again;
//! - [`Backend::state`] is its observable state for the admin API.
//!
//! Implementations: the emulated warehouse
//! (the [`crate::warehouse::EmulatedWarehouse`] actor's address, the
//! embedded default) and the
//! Postgres-wire executor (`slogate::backend::postgres`, which serves
//! Amazon Redshift and any PostgreSQL-compatible engine).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::{ClusterId, ClusterState, ExecutionReport, PoolId, Query, QueryId, Target};
use slogate_core::time::Instant;

/// A future on the node's (single-threaded) actor runtime.
pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// One query to run.
#[derive(Clone, Debug)]
pub struct Execution {
    /// The query (its id keys cancellation).
    pub query: Query,
    /// Where to run it.
    pub target: Target,
    /// Its SQL text, for backends that run SQL; `None` when the client
    /// named a template the backend knows no text for.
    pub sql: Option<Arc<str>>,
}

/// The rows a query returned, bounded by the pool's row and byte limits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct ResultRows {
    /// Column names.
    pub columns: Vec<String>,
    /// Rows kept, each value as text (`None` is SQL NULL).
    pub rows: Vec<Vec<Option<String>>>,
    /// Whether rows were dropped at a limit.
    pub truncated: bool,
    /// Rows the query returned in all.
    pub rows_total: u64,
}

/// Why an execution failed.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Failure {
    /// A sentence naming the cause.
    pub reason: String,
    /// The server's SQLSTATE, for SQL errors.
    pub sqlstate: Option<String>,
    /// When it was sent to the server, if it was.
    pub started: Option<Instant>,
    /// When the failure was observed.
    pub finished: Instant,
    /// The elastic tier refused it for its rate (a 429): the router pauses
    /// offloads for a while.
    pub throttled: bool,
}

/// How one execution ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Completion {
    /// It ran to completion or to its timeout (`report.outcome` says
    /// which), with the rows it returned, if the backend returns rows.
    Ran {
        /// The measured execution.
        report: ExecutionReport,
        /// Its rows.
        result: Option<ResultRows>,
    },
    /// It failed: a SQL error, a lost connection, or a cancel.
    Failed(Failure),
}

impl Completion {
    /// A dispatch the backend refused at `at`, as the query's failure.
    pub fn refused(error: &ExecuteError, at: Instant) -> Completion {
        let throttled = matches!(error, ExecuteError::Throttled(_));
        Completion::Failed(Failure { reason: format!("the backend refused the query: {error}"), sqlstate: None, started: None, finished: at, throttled })
    }
}

/// Why a cancel was asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelReason {
    /// Every client waiting for the query hung up or passed its deadline.
    ClientGone,
    /// The node shut down past its grace period.
    Shutdown,
}

impl CancelReason {
    /// The reason as a failure explanation.
    pub fn explanation(self) -> &'static str {
        match self {
            CancelReason::ClientGone => "cancelled on the server: the client disconnected or its deadline passed",
            CancelReason::Shutdown => "cancelled on the server: the node shut down before the query finished",
        }
    }
}

/// Why a dispatch or lifecycle request was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecuteError {
    /// No such cluster.
    #[error("unknown cluster {0}")]
    UnknownCluster(ClusterId),
    /// The cluster is draining, gone or unhealthy.
    #[error("cluster {0} is {1:?} and accepts no queries")]
    NotAccepting(ClusterId, ClusterState),
    /// The query id is already running.
    #[error("query {0} is already running")]
    Duplicate(QueryId),
    /// The backend has no elastic tier.
    #[error("this backend has no elastic tier")]
    NoElasticTier,
    /// The backend runs SQL and the query has none it knows.
    #[error("{0}")]
    NoSql(String),
    /// The backend or platform cannot do this at all.
    #[error("{0}")]
    Unsupported(String),
    /// The backend or platform is not answering.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The elastic tier refused the invocation for its rate.
    #[error("throttled: {0}")]
    Throttled(String),
}

/// A cluster changed state (ready, gone, unhealthy, healthy again), as
/// reported to watchers.
#[derive(Clone, Debug, Message)]
#[rtype(result = "()")]
pub struct ClusterUpdate {
    /// The pool the watcher registered under.
    pub pool: PoolId,
    /// Which cluster.
    pub cluster: ClusterId,
    /// Its new state.
    pub state: ClusterState,
    /// Why, for operators (a failed health check's error).
    pub reason: Option<String>,
}

/// A backend's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackendState {
    /// `emulated` or `postgres`.
    pub kind: &'static str,
    /// What the vendor has billed so far for the clusters (the elastic
    /// tier aside), dollars, when the backend knows: the emulated warehouse
    /// does; a real server does not say, and the trackers' estimates stand
    /// in.
    pub vendor_billed_usd: Option<f64>,
    /// What the elastic tier has billed so far, dollars (zero without
    /// one).
    pub elastic_billed_usd: f64,
    /// Queries executing (not queued) per cluster.
    pub executing: Vec<(ClusterId, usize)>,
    /// The implementation's own detail.
    pub detail: serde_json::Value,
}

/// Runs queries. See the module docs.
pub trait Backend: Send + Sync {
    /// `emulated` or `postgres`, for the admin API.
    fn kind(&self) -> &'static str;

    /// Runs `execution`; resolves when it has finished, timed out or
    /// failed. An `Err` means it never started.
    fn execute(&self, execution: Execution) -> LocalFuture<Result<Completion, ExecuteError>>;

    /// Stops `query` on the server, if it is running there; its
    /// [`Backend::execute`] then resolves with a failure naming `reason`.
    fn cancel(&self, query: QueryId, reason: CancelReason);

    /// Sends `recipient` every cluster state change, tagged with `pool`.
    fn watch_clusters(&self, pool: PoolId, recipient: Recipient<ClusterUpdate>);

    /// The observable state.
    fn state(&self) -> LocalFuture<Result<BackendState, ExecuteError>>;
}
