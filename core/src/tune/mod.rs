//! The policy tuner (AutoSLO §7): plans ahead from the workload's history
//! by simulating forecasted days on the planner's model, never the world.
//!
//! # Layout
//!
//! - [`forecast`]: forecasted days from the reservoir's tables (weekly
//!   decay, previous day, or a window), split into training and validation.
//! - [`predicted`]: the planner's warehouse, where queries complete when
//!   the learned predictor says so.
//! - [`batch`]: SimulateBatch, execution configurations × workloads on the
//!   planner's warehouse, in parallel.
//! - [`configure`]: the configuration tuner: grid, random, coordinate
//!   descent and adaptive batches over the autoscaler's knobs.
//! - [`schedule`]: the spinup scheduler: candidate times from congestion
//!   epochs (Algorithm 5) and the greedy rounds (Algorithm 4).

pub mod batch;
pub mod configure;
pub mod forecast;
pub mod predicted;
pub mod schedule;

pub use batch::{BatchSetup, ExecutionConfig, RunOutcome, simulate_batch};
pub use predicted::{PlannerTerms, PredictedWarehouse};
