//! # slogate-core
//!
//! The sans-IO heart of slogate: every decision and the simulator that
//! evaluates decisions. Nothing here reads a clock, touches the network or
//! disk, or draws from an OS random source: `now` is always a parameter and
//! randomness comes from seeded generators. The live actors and the
//! simulator run this same code.
//!
//! # Layout
//!
//! - [`time`]: microsecond `Instant`/`Duration` newtypes (virtual time).
//! - [`decimal`]: fixed-point decimals for explanations, as `{:.N}` writes
//!   them at a fraction of the cost.
//! - [`model`]: queries, templates, SLOs, clusters, pools and targets.
//! - [`fingerprint`]: template ids for queries submitted as SQL text.
//! - [`billing`]: the usage-based billing timer (AutoSLO §2).
//! - [`elastic`]: the elastic (serverless) tier: cold starts, keep-alive,
//!   concurrency limit, FaaS prices; provisioned-instance billing.
//! - [`objective`]: BestWithTarget(V, K, τ).
//! - [`ownership`]: which router node owns which pool: rendezvous
//!   hashing over the live members and lease fencing.
//! - [`predict`]: latency predictors learned from observed executions.
//! - [`reservoir`]: the workload reservoir's count and arrivals tables.
//! - [`route`]: the `RoutingPolicy` trait, baseline routers, the
//!   SLO-aware router, its calibrated margin, its price of the harm to
//!   queries still to come, its overload reserve, its elastic candidate,
//!   and Spandana's SLO Director.
//! - [`scale`]: the autoscaler: observation windows, triggers, the
//!   planner's replay and the spinup size selector.
//! - [`tune`]: the policy tuner: the planner's predicted warehouse,
//!   forecasts from the reservoir, batch simulation, the spinup scheduler
//!   and the configuration tuner.
//! - [`fleet`]: request-level services (Spandana's setting): instances
//!   with FIFO queues, the elastic tier, and the offload and scaling
//!   policies of its evaluation, at millions of requests per second.
//! - [`sim`]: the discrete-event engine that drives a routing policy (and
//!   optionally a cluster controller) against a `Warehouse`: the world, or
//!   the planner's predicted warehouse.
//!
//! The emulated warehouse (the world, ground truth) and the Redshift
//! measurements it is fitted to live in the `slogate-world` crate, which
//! depends on this one: no decision component here can read its
//! parameters, by construction.
//! - [`stats`]: medians, percentiles, overlap counting.
//! - [`recency`]: bounded sets of client-chosen keys, least recently seen
//!   evicted first.
//! - [`invariants`]: checks shared by production asserts and simulations.
//!
//! # Example
//!
//! Route a query with the SLO-aware router's simplest baseline,
//! round-robin, over a pool of two ready clusters:
//!
//! ```
//! use slogate_core::model::{ClusterId, ClusterState, ClusterView, Pool, PoolId, Query, QueryId, Rpu, Slo, Target, TemplateId};
//! use slogate_core::route::{RoundRobin, Routing, RoutingPolicy};
//! use slogate_core::time::{Duration, Instant};
//!
//! let cluster = |id| ClusterView {
//!     id: ClusterId(id),
//!     size: Rpu(16),
//!     state: ClusterState::Ready,
//!     requested_at: Instant::ZERO,
//!     ready_at: Instant::ZERO,
//!     running: Vec::new(),
//! };
//! let pool = Pool { id: PoolId::default(), clusters: vec![cluster(0), cluster(1)] };
//! let query = Query {
//!     id: QueryId(1),
//!     pool: PoolId::default(),
//!     template: TemplateId(17),
//!     slo: Slo { latency: Duration::from_secs(20) },
//!     arrival: Instant::ZERO,
//! };
//! let mut router = RoundRobin::default();
//! let Routing::Dispatch(decision) = router.route(Instant::ZERO, &query, &pool) else { panic!("round-robin always dispatches") };
//! assert!(matches!(decision.target, Target::Cluster(_)));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod billing;
pub mod decimal;
pub mod elastic;
pub mod fleet;
pub mod fingerprint;
pub mod invariants;
pub mod model;
pub mod objective;
pub mod ownership;
pub mod predict;
pub mod recency;
pub mod reservoir;
pub mod route;
pub mod scale;
pub mod sim;
pub mod stats;
pub mod time;
pub mod tune;

/// Errors of `slogate-core`: bad inputs it was handed. Invariant
/// violations are bugs and panic instead.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// A data table could not be parsed.
    #[error("data line {line}: {reason}")]
    Data {
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
