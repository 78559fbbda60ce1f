//! # slogate (services)
//!
//! The `slogate` binary and what it wires together. Today that is the
//! evaluation harness: `slogate eval <SCENARIO>` runs routing policies side
//! by side on the emulated warehouse in virtual time and reports each
//! policy's SLO violation rate and dollar cost; `slogate eval calibrate`
//! shows how closely the emulated warehouse reproduces the real Redshift
//! measurements it was fitted to.
//!
//! # Layout
//!
//! - [`eval`]: scenarios (built-in and TOML), the side-by-side runner and
//!   its table/JSON reports; [`eval::seeds`] runs any evaluation over
//!   several seeds and reports each figure's mean, worst seed and spread.
//! - [`eval::calibrate`]: the calibration report and the fit behind the
//!   world model's defaults.
//! - [`backend`]: backends beyond the emulated warehouse: the
//!   Postgres-wire executor, and SQL catalogs.
//! - [`config`]: the node's configuration (file, environment, flags).
//! - [`demo`]: `slogate demo`, on the emulated warehouse or on local
//!   PostgreSQL servers with TPC-DS.
//! - [`node`]: `slogate serve`, a gateway node: actors, gRPC, admin API.
//! - [`cli`]: the command line (argument parsing, exit codes).
//! - [`model`]: a trained Iconq+ model read from its directory (and, with
//!   the `onnx` feature, its ONNX graph checked in ONNX Runtime).
//! - `train` (feature `learn`): `slogate train-predictor`, Iconq+ from an
//!   execution log, with slogate-learn.
//!
//! # Example
//!
//! ```
//! use slogate::eval::{self, Scenario};
//!
//! let scenario = Scenario::built_in("base").unwrap();
//! let report = eval::run(&scenario, &scenario.policies, 1).unwrap();
//! println!("{}", eval::render_table(&report));
//! assert_eq!(report.results.len(), 2);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod backend;
pub mod cli;
pub mod config;
pub mod demo;
pub mod eval;
pub mod model;
pub mod node;
#[cfg(feature = "learn")]
pub mod train;
pub mod tune;

/// Errors of the `slogate` binary. [`Error::exit_code`] maps each to the
/// process exit code in one place.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The scenario name is neither built in nor a readable file.
    #[error("unknown scenario `{name}`: not a built-in ({known}) and no such file")]
    UnknownScenario {
        /// What was asked for.
        name: String,
        /// The built-in names.
        known: String,
    },
    /// A scenario file is malformed or out of range.
    #[error("invalid scenario: {0}")]
    Scenario(String),
    /// A policy name is unknown.
    #[error("unknown policy `{name}` (known: {known})")]
    UnknownPolicy {
        /// What was asked for.
        name: String,
        /// The known names.
        known: String,
    },
    /// A workload could not be generated or read.
    #[error(transparent)]
    Workload(#[from] slogate_loadgen::Error),
    /// The node configuration is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The node could not start or run.
    #[error("node: {0}")]
    Node(String),
    /// Writing an output file failed.
    #[error("cannot write {path}: {source}")]
    Output {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

impl Error {
    /// The process exit code: 2 for bad input (usage, scenario, policy,
    /// workload), 1 for failures while running.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::UnknownScenario { .. }
            | Error::Scenario(_)
            | Error::UnknownPolicy { .. }
            | Error::Workload(_)
            | Error::Config(_) => 2,
            Error::Output { .. } | Error::Node(_) => 1,
        }
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
