//! The policy tuner (AutoSLO §7): plans ahead from the workload's history
//! by simulating forecasted days on the planner's model, never the world.
//!
//! # Layout
//!
//! - [`forecast`]: forecasted days from the reservoir's tables (weekly
//!   decay, previous day, or a window), split into training and validation.
//! - [`predicted`]: the planner's warehouse, where queries complete when
//!   the learned predictor says so.

pub mod forecast;
pub mod predicted;

pub use predicted::{PlannerTerms, PredictedWarehouse};
