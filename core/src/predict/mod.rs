//! Latency prediction, learned only from observed executions.
//!
//! A predictor never sees the emulated warehouse's parameters: everything
//! it knows comes through [`LatencyPredictor::observe`], as it would in
//! production (the reservoir's execution log, or completions as they
//! happen). Observations may be **censored**: a timed-out or still-running
//! query's latency is only a lower bound.
//!
//! # Layout
//!
//! - [`isolated`]: robust per-template, per-size isolated latency
//!   estimates with a fitted size-scaling curve and a fallback for unseen
//!   templates.
//! - [`stage`]: the concurrency-unaware predictor ("Stage-like").
//! - [`concurrency`]: the concurrency-aware predictor: isolated latency
//!   stretched by a learned, monotone slowdown curve per cluster size.
//!
//! The router's counterfactual batch API (predictions for a query and every
//! running query if it were placed on a cluster) builds on these and lands
//! with the SLO-aware router.

pub mod concurrency;
pub mod isolated;
pub mod stage;

use serde::{Deserialize, Serialize};

use crate::model::{Rpu, TemplateId};
use crate::time::Duration;

pub use concurrency::ConcurrencyAware;
pub use stage::StageLike;

/// One observed execution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Observation {
    /// Template or fingerprint.
    pub template: TemplateId,
    /// Cluster size it ran on.
    pub size: Rpu,
    /// Its concurrency feature: how many other queries overlapped it, or,
    /// for the router, how many were running when it was placed. A caller
    /// must use one meaning for both learning and prediction.
    pub neighbours: u32,
    /// Its client-side latency (a lower bound when `censored`).
    pub latency: Duration,
    /// Timed out or cut short.
    pub censored: bool,
}

/// A latency predictor.
pub trait LatencyPredictor {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// Learns from an execution.
    fn observe(&mut self, observation: &Observation);

    /// Predicted isolated latency of `template` on a cluster of `size`.
    fn isolated(&self, template: TemplateId, size: Rpu) -> Duration;

    /// Predicted latency of `template` on `size` when `neighbours` other
    /// queries overlap it.
    fn predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> Duration;
}

/// `max(predicted / actual, actual / predicted)`; both must be positive.
pub fn q_error(predicted: Duration, actual: Duration) -> f64 {
    let (p, a) = (predicted.as_secs_f64().max(1e-6), actual.as_secs_f64().max(1e-6));
    (p / a).max(a / p)
}
