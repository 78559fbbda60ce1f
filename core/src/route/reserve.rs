//! The overload reserve: when a pool is overloaded, keep its short queries
//! apart from its long ones.
//!
//! A router that places each query where it adds the fewest violations
//! *now* is myopic under overload. When nearly every query misses its SLO
//! wherever it goes, a long query placed beside short ones stretches every
//! short query that arrives there for as long as it runs. Splitting the
//! work by size (size-interval assignment) protects the many short queries
//! at the expense of the few long ones. Since every query's SLO is judged
//! on its own latency, that cuts the violation *rate*.
//!
//! The reserve watches the router's own decisions. Once at least
//! [`ReserveConfig::overload_share`] of the last
//! [`ReserveConfig::decisions`] were damage control (the query missed its
//! SLO on every ready cluster), the pool counts as overloaded, and it
//! stays so until the share falls to [`ReserveConfig::recovered_share`]
//! (the reserve cuts the very damage control it reacts to, so leaving at
//! the entry mark would undo it at once). While it is overloaded, with two
//! or more ready clusters:
//!
//! - one ready cluster is the **overflow** cluster: the one named before
//!   if it is still ready, else the one with the most predicted work
//!   placed;
//! - a **long** query goes to the overflow cluster. A query is long when
//!   the recent arrivals with smaller isolated estimates carry at least the
//!   current **short share** of the recent work (each arrival's isolated
//!   estimate counts as its work);
//! - every other query is placed by the router's own rule among the other
//!   clusters, so the overflow cluster's backlog never reaches them;
//! - the short share starts at [`ReserveConfig::protected_work_share`]
//!   and adapts: each short query predicted to miss on the protected
//!   clusters lowers it, each predicted to meet raises it, so that about
//!   [`ReserveConfig::protected_miss_target`] of them miss.
//!
//! It is the policy `slogate-reserve`, not `slogate`'s default: it pays
//! off when the overload lasts, and costs when it is brief (a flash crowd,
//! a shift towards heavier queries), where protecting short queries sends
//! the long ones to a cluster that is then overloaded on its own. `eval
//! router-table2 --policies round-robin,slogate,slogate-reserve` and `eval
//! shapes-dev` show both sides.
//!
//! # Properties
//!
//! - (A) It never reports overload before it has seen
//!   [`ReserveConfig::decisions`] decisions; it enters with at least
//!   `overload_share` of the last ones in damage control and leaves with
//!   at most `recovered_share`.
//! - (B) The arrivals below a long query's estimate carry at least the
//!   short share of the recent work; those below a short query's, less.
//! - (C) Its memory is bounded: `decisions` flags and `arrivals` estimates.
//! - (D) It is a deterministic function of what it was shown.
//! - (E) The short share stays within `[share_min, share_max]`; a predicted
//!   miss never raises it and a predicted meet never lowers it.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::model::ClusterId;
use crate::stats::push_bounded;

/// The reserve's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReserveConfig {
    /// Recent decisions the overload test looks at.
    pub decisions: usize,
    /// The share of them in damage control at which the pool counts as
    /// overloaded.
    pub overload_share: f64,
    /// Once overloaded, the pool counts as overloaded until the share falls
    /// to this or below (the reserve itself cuts the damage control it
    /// responds to, so leaving at the entry mark would undo it).
    pub recovered_share: f64,
    /// Recent arrivals whose isolated estimates make the work distribution.
    pub arrivals: usize,
    /// The share of the recent work the shortest queries may carry and
    /// still count as short.
    pub protected_work_share: f64,
    /// The share of short queries the reserve lets miss their SLO on the
    /// protected clusters: above it, the short share shrinks; below it,
    /// it grows.
    pub protected_miss_target: f64,
    /// How far one short query moves the share.
    pub share_step: f64,
    /// The bounds of the short share.
    pub share_min: f64,
    /// See `share_min`.
    pub share_max: f64,
}

impl Default for ReserveConfig {
    fn default() -> Self {
        ReserveConfig {
            decisions: 32,
            overload_share: 0.5,
            recovered_share: 0.1,
            arrivals: 512,
            protected_work_share: 0.25,
            protected_miss_target: 0.2,
            share_step: 0.01,
            share_min: 0.05,
            share_max: 0.5,
        }
    }
}

/// See the module docs.
#[derive(Clone, Debug)]
pub struct OverloadReserve {
    config: ReserveConfig,
    damage_control: VecDeque<bool>,
    in_damage_control: usize,
    estimates_s: VecDeque<f64>,
    overflow: Option<ClusterId>,
    overloaded: bool,
    /// The work share short queries may carry now.
    short_share: f64,
}

impl Default for OverloadReserve {
    fn default() -> Self {
        OverloadReserve::new(ReserveConfig::default())
    }
}

impl OverloadReserve {
    /// A reserve that has seen nothing.
    pub fn new(config: ReserveConfig) -> Self {
        let short_share = config.protected_work_share;
        OverloadReserve { config, damage_control: VecDeque::new(), in_damage_control: 0, estimates_s: VecDeque::new(), overflow: None, overloaded: false, short_share }
    }

    /// Records an arrival's isolated estimate (its work).
    pub fn handle_arrival(&mut self, isolated_s: f64) {
        push_bounded(&mut self.estimates_s, isolated_s.max(0.0), self.config.arrivals);
    }

    /// Records whether a decision was damage control.
    pub fn handle_decision(&mut self, damage_control: bool) {
        if push_bounded(&mut self.damage_control, damage_control, self.config.decisions) == Some(true) {
            self.in_damage_control -= 1;
        }
        self.in_damage_control += usize::from(damage_control);
        let full = self.damage_control.len() >= self.config.decisions.max(1);
        let share = self.damage_control_share();
        self.overloaded = full
            && if self.overloaded { share > self.config.recovered_share } else { share >= self.config.overload_share };
        if !self.overloaded {
            self.overflow = None;
        }
    }

    /// Whether the pool counts as overloaded (property A), as of the last
    /// decision recorded.
    pub fn overloaded(&self) -> bool {
        self.overloaded
    }

    /// The share of the recent work carried by arrivals estimated shorter
    /// than `isolated_s` (plus half of those as long as it), in `[0, 1]`.
    pub fn work_share_below(&self, isolated_s: f64) -> f64 {
        let total: f64 = self.estimates_s.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        let below: f64 = self
            .estimates_s
            .iter()
            .map(|&e| if e < isolated_s { e } else if e == isolated_s { e / 2.0 } else { 0.0 })
            .sum();
        (below / total).clamp(0.0, 1.0)
    }

    /// Whether a query with this isolated estimate is long (property B).
    pub fn is_long(&self, isolated_s: f64) -> bool {
        self.work_share_below(isolated_s) >= self.short_share
    }

    /// Records whether a short query placed under the reserve is predicted
    /// to miss its SLO: the short share moves towards the one at which
    /// `protected_miss_target` of them miss.
    pub fn handle_short_placement(&mut self, missed: bool) {
        let step = self.config.share_step;
        let target = self.config.protected_miss_target;
        let moved = if missed { self.short_share - step * (1.0 - target) } else { self.short_share + step * target };
        self.short_share = moved.clamp(self.config.share_min, self.config.share_max);
    }

    /// The work share short queries may carry now.
    pub fn short_share(&self) -> f64 {
        self.short_share
    }

    /// The overflow cluster among `ready` (`(id, predicted work placed in
    /// seconds)`), kept while it stays ready; `None` with fewer than two.
    pub fn overflow_cluster(&mut self, ready: &[(ClusterId, f64)]) -> Option<ClusterId> {
        if ready.len() < 2 {
            return None;
        }
        if let Some(kept) = self.overflow
            && ready.iter().any(|(id, _)| *id == kept)
        {
            return Some(kept);
        }
        let chosen = ready.iter().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0))).map(|(id, _)| *id);
        self.overflow = chosen;
        chosen
    }

    /// The share of the recent decisions in damage control.
    pub fn damage_control_share(&self) -> f64 {
        if self.damage_control.is_empty() { 0.0 } else { self.in_damage_control as f64 / self.damage_control.len() as f64 }
    }

    /// The settings.
    pub fn config(&self) -> &ReserveConfig {
        &self.config
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_pool_is_overloaded_once_enough_decisions_were_damage_control_and_until_few_are() {
        let config = ReserveConfig { decisions: 4, overload_share: 0.5, recovered_share: 0.25, ..ReserveConfig::default() };
        let mut reserve = OverloadReserve::new(config);
        for _ in 0..3 {
            reserve.handle_decision(true);
        }
        assert!(!reserve.overloaded(), "three decisions are fewer than the window");
        reserve.handle_decision(false);
        assert!(reserve.overloaded(), "three of four in damage control");
        reserve.handle_decision(false);
        assert!(reserve.overloaded(), "two of four: below the entry mark, above the exit mark");
        reserve.handle_decision(false);
        assert!(!reserve.overloaded(), "one of four: recovered");
        reserve.handle_decision(true);
        assert!(!reserve.overloaded(), "two of four: below the entry mark again");
    }

    #[test]
    fn the_overflow_cluster_stays_while_it_is_ready() {
        let mut reserve = OverloadReserve::default();
        let (a, b, c) = (ClusterId(1), ClusterId(2), ClusterId(3));
        assert_eq!(reserve.overflow_cluster(&[(a, 10.0)]), None);
        assert_eq!(reserve.overflow_cluster(&[(a, 10.0), (b, 50.0)]), Some(b));
        assert_eq!(reserve.overflow_cluster(&[(a, 90.0), (b, 5.0)]), Some(b), "kept while ready");
        assert_eq!(reserve.overflow_cluster(&[(a, 90.0), (c, 5.0)]), Some(a), "chosen again once gone");
    }

    proptest! {
        #[test]
        fn long_queries_are_those_above_the_protected_work_share(
            estimates in prop::collection::vec(0.01f64..1_000.0, 1..200),
            probe in 0.01f64..1_000.0,
            share in 0.05f64..0.95,
        ) {
            let mut reserve = OverloadReserve::new(ReserveConfig { protected_work_share: share, arrivals: 128, ..ReserveConfig::default() });
            for e in &estimates {
                reserve.handle_arrival(*e);
            }
            // (C) bounded memory.
            prop_assert!(reserve.estimates_s.len() <= 128);
            // (B) the split is by the work below the estimate.
            let kept: Vec<f64> = estimates.iter().rev().take(128).copied().collect();
            let total: f64 = kept.iter().sum();
            let below: f64 = kept.iter().map(|&e| if e < probe { e } else if e == probe { e / 2.0 } else { 0.0 }).sum();
            prop_assert_eq!(reserve.is_long(probe), below / total >= share);
            // A longer query is never short when a shorter one is long.
            if reserve.is_long(probe) {
                prop_assert!(reserve.is_long(probe * 2.0));
            }
        }

        #[test]
        fn the_short_share_moves_with_the_protected_misses_within_its_bounds(
            misses in prop::collection::vec(any::<bool>(), 0..400),
        ) {
            let mut reserve = OverloadReserve::default();
            let config = reserve.config().clone();
            for missed in misses {
                let before = reserve.short_share();
                reserve.handle_short_placement(missed);
                let after = reserve.short_share();
                // (E)
                prop_assert!(after >= config.share_min && after <= config.share_max);
                if missed { prop_assert!(after <= before) } else { prop_assert!(after >= before) }
            }
        }

        #[test]
        fn overload_follows_the_damage_control_share_of_the_window(
            flags in prop::collection::vec(any::<bool>(), 0..100),
            window in 1usize..40,
            entry in 0.3f64..0.9,
            exit in 0.0f64..0.3,
        ) {
            let config = ReserveConfig { decisions: window, overload_share: entry, recovered_share: exit, ..ReserveConfig::default() };
            let mut reserve = OverloadReserve::new(config);
            let mut expected = false;
            for (i, f) in flags.iter().enumerate() {
                reserve.handle_decision(*f);
                let recent: Vec<bool> = flags[..=i].iter().rev().take(window).copied().collect();
                let share = recent.iter().filter(|f| **f).count() as f64 / recent.len() as f64;
                expected = i + 1 >= window && if expected { share > exit } else { share >= entry };
                // (A), and (D): the same flags give the same answer.
                prop_assert_eq!(reserve.overloaded(), expected);
            }
        }
    }
}
