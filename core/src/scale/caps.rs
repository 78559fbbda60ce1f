//! Caps on what a pool may hold, whatever a policy or an operator asks:
//! most clusters, most RPU in total, and most spend per hour.
//!
//! The spend cap bounds the pool's *rate*: every live cluster billed for
//! the whole hour at the pool's price per RPU-hour, the most it can cost in
//! any hour. A spinup is admitted only if the pool stays within every cap
//! with the new cluster counted; otherwise [`Caps::admit`] names the cap
//! and the figures.
//!
//! # Properties (tested by property tests)
//!
//! - **Sound:** an admitted spinup leaves the pool within every cap.
//! - **Complete:** a spinup that leaves the pool within every cap is
//!   admitted.
//! - **No caps, no refusals:** [`Caps::default`] admits everything.

use serde::{Deserialize, Serialize};

use crate::model::Rpu;

/// The caps; `None` is no cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Caps {
    /// Most live clusters.
    pub clusters_max: Option<usize>,
    /// Most RPU over the live clusters.
    pub rpu_total_max: Option<u32>,
    /// Most dollars an hour, every live cluster billed for the whole hour.
    pub spend_per_hour_max_usd: Option<f64>,
}

/// Why a spinup was refused.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
pub enum CapRefusal {
    /// Too many clusters.
    #[error("the pool has {live} clusters; its cap is {max}")]
    Clusters {
        /// Live clusters now.
        live: usize,
        /// The cap.
        max: usize,
    },
    /// Too many RPU.
    #[error("{live_rpu} RPU live plus {adding_rpu} would pass the pool's cap of {max_rpu} RPU")]
    Rpu {
        /// Live RPU now.
        live_rpu: u32,
        /// The spinup's size.
        adding_rpu: u32,
        /// The cap.
        max_rpu: u32,
    },
    /// Too much spend per hour.
    #[error("${with_usd:.2}/h with it would pass the pool's cap of ${max_usd:.2}/h")]
    Spend {
        /// The hourly rate with the new cluster.
        with_usd: f64,
        /// The cap.
        max_usd: f64,
    },
}

impl Caps {
    /// Whether a cluster of `adding` may join live clusters of `live`
    /// sizes, at `price_per_rpu_hour_usd`.
    pub fn admit(&self, live: &[Rpu], adding: Rpu, price_per_rpu_hour_usd: f64) -> Result<(), CapRefusal> {
        if let Some(max) = self.clusters_max
            && live.len() + 1 > max
        {
            return Err(CapRefusal::Clusters { live: live.len(), max });
        }
        let live_rpu: u32 = live.iter().map(|size| size.0).sum();
        if let Some(max_rpu) = self.rpu_total_max
            && live_rpu.saturating_add(adding.0) > max_rpu
        {
            return Err(CapRefusal::Rpu { live_rpu, adding_rpu: adding.0, max_rpu });
        }
        if let Some(max_usd) = self.spend_per_hour_max_usd {
            let with_usd = f64::from(live_rpu.saturating_add(adding.0)) * price_per_rpu_hour_usd;
            if with_usd > max_usd {
                return Err(CapRefusal::Spend { with_usd, max_usd });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn within(caps: &Caps, sizes: &[Rpu], price: f64) -> bool {
        let rpu: u32 = sizes.iter().map(|s| s.0).sum();
        caps.clusters_max.is_none_or(|max| sizes.len() <= max)
            && caps.rpu_total_max.is_none_or(|max| rpu <= max)
            && caps.spend_per_hour_max_usd.is_none_or(|max| f64::from(rpu) * price <= max)
    }

    #[test]
    fn each_cap_names_itself_and_its_figures() {
        let caps = Caps { clusters_max: Some(2), rpu_total_max: Some(48), spend_per_hour_max_usd: Some(15.0) };
        assert_eq!(caps.admit(&[Rpu(16), Rpu(16)], Rpu(8), 0.375), Err(CapRefusal::Clusters { live: 2, max: 2 }));
        assert_eq!(caps.admit(&[Rpu(32)], Rpu(32), 0.375), Err(CapRefusal::Rpu { live_rpu: 32, adding_rpu: 32, max_rpu: 48 }));
        let spend = caps.admit(&[Rpu(32)], Rpu(16), 0.375).unwrap_err();
        assert_eq!(spend, CapRefusal::Spend { with_usd: 18.0, max_usd: 15.0 });
        assert!(spend.to_string().contains("$18.00/h"), "{spend}");
        assert!(caps.admit(&[Rpu(16)], Rpu(16), 0.375).is_ok());
    }

    proptest! {
        #[test]
        fn admitted_means_within_every_cap_and_within_means_admitted(
            live in proptest::collection::vec(1u32..128, 0..8),
            adding in 1u32..128,
            clusters_max in proptest::option::of(0usize..10),
            rpu_total_max in proptest::option::of(0u32..600),
            spend_max in proptest::option::of(0.0f64..300.0),
            price in 0.01f64..2.0,
        ) {
            let caps = Caps { clusters_max, rpu_total_max, spend_per_hour_max_usd: spend_max };
            let live: Vec<Rpu> = live.into_iter().map(Rpu).collect();
            let mut with = live.clone();
            with.push(Rpu(adding));
            prop_assert_eq!(caps.admit(&live, Rpu(adding), price).is_ok(), within(&caps, &with, price));
        }

        #[test]
        fn no_caps_refuse_nothing(live in proptest::collection::vec(1u32..1024, 0..64), adding in 1u32..1024) {
            let live: Vec<Rpu> = live.into_iter().map(Rpu).collect();
            prop_assert!(Caps::default().admit(&live, Rpu(adding), 0.375).is_ok());
        }
    }
}
