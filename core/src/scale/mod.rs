//! Autoscaling (AutoSLO §6): which clusters should exist.
//!
//! # Layout
//!
//! - [`windows`]: the arrival and completion windows over the last `w`
//!   seconds, bounded in memory.
//! - [`trigger`]: the teardown trigger, the spinup trigger (Algorithm 2,
//!   with or without projected violations) and Queue@N.
//! - [`replay`]: the planner's replay (completions from the router's
//!   predictor, never from the world) and the spinup size selector
//!   (Algorithm 3).
//! - [`scale_in`]: scale-in by the same replay: drain a cluster, or make
//!   the pool's one cluster smaller, when the SLOs still hold for less.
//! - [`rais`]: a RAIS-like baseline: one cluster resized on queue length
//!   with a price-performance setting.
//! - [`sro`]: Spandana's Resource Optimizer: the instance count that
//!   minimises provisioned plus elastic cost over a load profile.
//! - [`caps`]: most clusters, RPU and spend per hour a pool may hold,
//!   whatever a policy asks.
//! - [`layout`]: a pool's cluster sizes, and what brings a pool to them
//!   (a node taking a pool over).
//! - [`inventory`]: the tags on a pool's cloud resources, and which listed
//!   resources a starting node adopts or terminates.
//! - [`autoscaler`]: the [`Autoscaler`], which wires them together behind
//!   the simulator's `Controller` interface, with the §8.5–8.6 baselines as
//!   [`AutoscalerPolicy`] values.
//!
//! [`AutoscalerConfig`] holds the knobs, with the AutoSLO reference
//! configuration as defaults.

pub mod autoscaler;
pub mod caps;
pub mod inventory;
pub mod layout;
pub mod rais;
pub mod replay;
pub mod scale_in;
pub mod sro;
pub mod trigger;
pub mod windows;

use serde::{Deserialize, Serialize};

use crate::billing::BillingConfig;
use crate::model::Rpu;
use crate::time::Duration;
use replay::SelectorConfig;

pub use autoscaler::{Autoscaler, AutoscalerPolicy, DailySchedule, ScaleAction, ScaleDecision, ScheduledSpinup, SpinupPolicy};

/// The autoscaler's knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscalerConfig {
    /// T_idle: a cluster with nothing routed to it for this long may go.
    pub idle_teardown: Duration,
    /// T_min_lifetime: a cluster stays at least this long after ready.
    pub min_lifetime: Duration,
    /// Never tear down the last Ready cluster.
    pub keep_last_cluster: bool,
    /// τ_trigger: the violation rate above which the spinup trigger fires.
    pub trigger_target: f64,
    /// θ: observations needed before the spinup trigger may fire.
    pub min_observations: usize,
    /// The trigger judges latencies against the SLO times this factor.
    pub trigger_slo_tightening: f64,
    /// μ: completions the size selector simulates after the new cluster is
    /// ready.
    pub completions: usize,
    /// w: the observation windows' width.
    pub window: Duration,
    /// Records kept per window at most.
    pub max_window_entries: usize,
    /// Sizes the selector may choose.
    pub sizes: Vec<Rpu>,
    /// Starting or Ready clusters at most.
    pub max_clusters: usize,
    /// δ: the spinup delay the selector plans with.
    pub spinup_delay: Duration,
    /// τ_target: the violation-rate target of BestWithTarget.
    pub target: f64,
    /// Copies of the arrival window the selector replays at most.
    pub max_replay_copies: usize,
    /// The selector's replay stops this long after the new cluster is
    /// ready at the latest.
    pub replay_horizon: Duration,
    /// Clusters one selection may add at once when no single one gets the
    /// replay under the target (1: one spinup per trigger, as Algorithm 3).
    pub max_spinups_at_once: usize,
    /// Whether scale-in by replay runs (`scale_in`): a cluster drained, or
    /// the pool's one cluster made smaller, when the replay says the pool
    /// meets `scale_in_target` for less.
    pub scale_in: bool,
    /// How often scale-in replays the pool, at most.
    pub scale_in_interval: Duration,
    /// The violation rate a scale-in candidate must meet in the replay
    /// (below `target`, so that it does not fire the spinup trigger).
    pub scale_in_target: f64,
    /// Threads the size selector evaluates candidates on.
    pub selector_threads: usize,
}

impl AutoscalerConfig {
    /// The knobs the policy tuner chooses, on one line: `T_idle 1200s
    /// T_min 1200s τ_trigger 0.1 θ 32 μ 32 w 300s SLO×0.5`.
    pub fn tuned_knobs(&self) -> String {
        format!(
            "T_idle {:.0}s T_min {:.0}s τ_trigger {} θ {} μ {} w {:.0}s SLO×{}",
            self.idle_teardown.as_secs_f64(),
            self.min_lifetime.as_secs_f64(),
            self.trigger_target,
            self.min_observations,
            self.completions,
            self.window.as_secs_f64(),
            self.trigger_slo_tightening,
        )
    }

    /// The size selector's settings from these knobs, with the billing
    /// terms its cost estimates use.
    pub fn selector_config(&self, billing: BillingConfig) -> SelectorConfig {
        SelectorConfig {
            sizes: self.sizes.clone(),
            spinup_delay: self.spinup_delay,
            window: self.window,
            completions: self.completions,
            max_replay_copies: self.max_replay_copies,
            max_added: self.max_spinups_at_once.max(1),
            horizon: self.replay_horizon,
            target: self.target,
            threads: self.selector_threads,
            billing,
        }
    }
}

impl Default for AutoscalerConfig {
    fn default() -> Self {
        AutoscalerConfig {
            idle_teardown: Duration::from_secs(1_200),
            min_lifetime: Duration::from_secs(1_200),
            keep_last_cluster: true,
            trigger_target: 0.1,
            min_observations: 32,
            trigger_slo_tightening: 0.5,
            completions: 32,
            window: Duration::from_secs(300),
            max_window_entries: 10_000,
            sizes: vec![Rpu(4), Rpu(8), Rpu(16), Rpu(32)],
            max_clusters: 10,
            spinup_delay: Duration::from_secs(300),
            target: 0.1,
            max_replay_copies: 30,
            replay_horizon: Duration::from_secs(600),
            max_spinups_at_once: 3,
            scale_in: true,
            scale_in_interval: Duration::from_secs(900),
            scale_in_target: 0.05,
            selector_threads: 2,
        }
    }
}
