//! # slogate-loadgen
//!
//! Workloads for slogate: the generators the papers' evaluations use, SLO
//! assignment, and the trace file format users bring. Everything here is a
//! pure, seeded function of its parameters, so an evaluation is
//! reproducible from its seed.
//!
//! # Layout
//!
//! - [`workload`]: BaseWorkload(λ), the phased mixes, the multi-day diurnal
//!   workload, `SLO = κ × ℓ_baseline`, and conversion to queries.
//! - [`replay`]: the gRPC replayer behind the `slogate-loadgen` binary.
//! - [`bench`](mod@bench): `slogate-loadgen bench-gateway`, a node against the bare
//!   gRPC server of the `slogate-bare-gateway` binary.
//! - [`bench_fleet`]: `slogate-loadgen bench-fleet`, the aggregate
//!   throughput of 1, 2, … nodes of one deployment and the forwarding hop.
//! - [`service`]: request-level workloads (Spandana): millisecond
//!   services, fluctuating per-second rate traces, a load spike, rate-trace
//!   import, and Poisson arrivals within each second.
//! - [`shapes`]: workload shapes the papers' scenarios lack (flash crowd,
//!   mix shift, multi-tenant SLO mix, rate drift, heavy-tailed sizes), for
//!   held-out evaluation.
//! - [`trace`]: CSV import and export (`arrival_s,template,slo_s`, optional
//!   `pool,query_id`) with line-numbered errors.
//!
//! # Example
//!
//! ```
//! use slogate_world::catalog::tpcds_template_set;
//! use slogate_core::model::PoolId;
//! use slogate_loadgen::workload::{assign_slos, base_workload, to_queries};
//!
//! let templates = tpcds_template_set();
//! let mut workload = base_workload(&templates, 0.1, 42).unwrap();
//! assign_slos(&mut workload, &templates, 4.0).unwrap();
//! let queries = to_queries(&workload, &PoolId::default()).unwrap();
//! assert_eq!(queries.len(), 297);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod bench;
pub mod bench_fleet;
pub mod replay;
pub mod service;
pub mod shapes;
pub mod trace;
pub mod workload;

/// Errors of `slogate-loadgen`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A trace line is malformed.
    #[error("trace line {line}: {reason}")]
    Trace {
        /// 1-based line number in the file.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A generator parameter is out of range.
    #[error("invalid workload parameter: {0}")]
    InvalidParameter(String),
    /// Replaying against a node failed.
    #[error("replay: {0}")]
    Replay(String),
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
