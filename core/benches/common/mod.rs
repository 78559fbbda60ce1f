//! The synthetic learned router the planner benchmarks share: 99
//! templates, 2–36 s isolated at 16 RPU, inverse in size, stretched by
//! 1 + neighbours/4, learned on sizes {4, 8, 16, 32} and up to 64
//! neighbours.

use slogate_core::billing::BillingConfig;
use slogate_core::model::{Rpu, TemplateId};
use slogate_core::predict::concurrency::{ConcurrencyAware, ConcurrencyConfig};
use slogate_core::predict::{LatencyPredictor, Observation};
use slogate_core::route::slo::SloRouter;
use slogate_core::time::Duration;

/// Template `template`'s isolated latency on `size` RPU, seconds.
pub fn isolated_s(template: u32, size: u32) -> f64 {
    f64::from(template % 17 + 1) * 2.0 * 16.0 / f64::from(size)
}

/// The SLO-aware router over a predictor trained on the law above.
pub fn router() -> SloRouter<ConcurrencyAware> {
    let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
    for t in 1..=99u32 {
        for size in [4u32, 8, 16, 32] {
            for n in [0u32, 1, 2, 4, 8, 16, 32, 64] {
                let latency = isolated_s(t, size) * (1.0 + f64::from(n) / 4.0);
                p.observe(&Observation { template: TemplateId(t), size: Rpu(size), neighbours: n, latency: Duration::from_secs_f64(latency), censored: false });
            }
        }
    }
    p.fit();
    SloRouter::new("slogate", p, BillingConfig::default())
}
