//! The concurrency-unaware predictor ("Stage-like"): every query is
//! predicted at its isolated latency, whatever runs next to it. It is the
//! baseline of AutoSLO's "Stage + cost" router.

use crate::model::{Rpu, TemplateId};
use crate::predict::isolated::{IsolatedConfig, IsolatedEstimator};
use crate::predict::{LatencyPredictor, Observation};
use crate::time::Duration;

/// See the module docs.
#[derive(Clone, Debug)]
pub struct StageLike {
    isolated: IsolatedEstimator,
}

impl StageLike {
    /// An untrained predictor.
    pub fn new(config: IsolatedConfig) -> Self {
        StageLike { isolated: IsolatedEstimator::new(config) }
    }
}

impl LatencyPredictor for StageLike {
    fn name(&self) -> &str {
        "stage"
    }

    fn observe(&mut self, observation: &Observation) {
        self.isolated.observe(observation);
    }

    fn isolated(&self, template: TemplateId, size: Rpu) -> Duration {
        self.isolated.estimate(template, size)
    }

    fn predict(&self, template: TemplateId, size: Rpu, _neighbours: u32) -> Duration {
        self.isolated.estimate(template, size)
    }
}
