//! Spandana's Resource Optimizer (SRO, Spandana Algorithm 1): the instance
//! count that minimises provisioned cost plus the elastic cost of the
//! residual load, over a recent high-resolution load profile.
//!
//! For each count `n` from 1 to the count that covers the profile's peak,
//! the provisioned cost is `n` instances for the profile's length, and the
//! residual at each step is the load above `n × rps_max`, offloaded at the
//! elastic price per request. The cheapest `n` wins; ties go to the smaller
//! count (the first found, as in the algorithm).
//!
//! # Properties
//!
//! - (A) The chosen count's total cost is the minimum over all counts in
//!   range.
//! - (B) A profile that never exceeds one instance's capacity chooses one
//!   instance.
//! - (C) With free elastic requests it chooses one instance; with elastic
//!   requests dearer than a whole instance-step, it covers the peak.

use serde::{Deserialize, Serialize};

use crate::time::Duration;

/// What the SRO prices and assumes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SroConfig {
    /// Requests per second one instance serves within the SLO.
    pub rps_max_per_instance: f64,
    /// One instance's price per second, dollars.
    pub instance_price_per_s_usd: f64,
    /// One offloaded request's price, dollars.
    pub elastic_price_per_request_usd: f64,
}

/// One count's projected cost.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SroCandidate {
    /// Instances.
    pub instances: u32,
    /// Their cost over the profile, dollars.
    pub provisioned_usd: f64,
    /// The residual load's elastic cost, dollars.
    pub elastic_usd: f64,
}

impl SroCandidate {
    /// Provisioned plus elastic.
    pub fn total_usd(&self) -> f64 {
        self.provisioned_usd + self.elastic_usd
    }
}

/// The SRO's answer, with every candidate for the decision record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SroDecision {
    /// The cheapest count.
    pub instances: u32,
    /// Every count considered, ascending.
    pub candidates: Vec<SroCandidate>,
}

/// Algorithm 1 over `profile_rps`, one rate per `step`. An empty or idle
/// profile keeps one instance.
pub fn optimise_instances(profile_rps: &[f64], step: Duration, config: &SroConfig) -> SroDecision {
    let step_s = step.as_secs_f64();
    let peak = profile_rps.iter().copied().fold(0.0, f64::max);
    let capacity = config.rps_max_per_instance.max(1e-9);
    let most = ((peak / capacity).ceil() as u32).max(1);
    let span_s = step_s * profile_rps.len() as f64;
    let candidates: Vec<SroCandidate> = (1..=most)
        .map(|instances| {
            let covered = f64::from(instances) * capacity;
            let residual_requests: f64 = profile_rps.iter().map(|rate| (rate - covered).max(0.0) * step_s).sum();
            SroCandidate {
                instances,
                provisioned_usd: f64::from(instances) * config.instance_price_per_s_usd * span_s,
                elastic_usd: residual_requests * config.elastic_price_per_request_usd,
            }
        })
        .collect();
    let best = candidates.iter().fold(None::<&SroCandidate>, |best, c| match best {
        Some(b) if b.total_usd() <= c.total_usd() => Some(b),
        _ => Some(c),
    });
    SroDecision { instances: best.map_or(1, |b| b.instances), candidates }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_cost_minimum_of_a_hand_computed_profile() {
        // Capacity 10 rps per instance, $1 per instance-second, $0.3 per
        // offloaded request, over 4 one-second steps of 10, 30, 20, 50 rps:
        //   1: 4 + 0.3 × (0 + 20 + 10 + 40) = 25
        //   2: 8 + 0.3 × (0 + 10 + 0 + 30) = 20
        //   3: 12 + 0.3 × 20 = 18   <- the minimum
        //   4: 16 + 0.3 × 10 = 19
        //   5: 20 + 0 = 20
        let config = SroConfig { rps_max_per_instance: 10.0, instance_price_per_s_usd: 1.0, elastic_price_per_request_usd: 0.3 };
        let decision = optimise_instances(&[10.0, 30.0, 20.0, 50.0], Duration::from_secs(1), &config);
        let totals: Vec<f64> = decision.candidates.iter().map(SroCandidate::total_usd).collect();
        for (total, expected) in totals.iter().zip([25.0, 20.0, 18.0, 19.0, 20.0]) {
            assert!((total - expected).abs() < 1e-9, "{totals:?}");
        }
        assert_eq!(decision.instances, 3);
    }

    proptest! {
        #[test]
        fn the_choice_is_the_cheapest_candidate(profile in prop::collection::vec(0.0f64..500.0, 1..60), rps_max in 1.0f64..100.0, vm in 0.0f64..1.0, elastic in 0.0f64..0.1) {
            let config = SroConfig { rps_max_per_instance: rps_max, instance_price_per_s_usd: vm, elastic_price_per_request_usd: elastic };
            let decision = optimise_instances(&profile, Duration::from_secs(1), &config);
            let chosen = decision.candidates.iter().find(|c| c.instances == decision.instances).expect("listed");
            prop_assert!(decision.candidates.iter().all(|c| chosen.total_usd() <= c.total_usd() + 1e-12));
            if profile.iter().all(|&r| r <= rps_max) {
                prop_assert_eq!(decision.instances, 1);
            }
        }
    }
}
