//! The target-aware objective BestWithTarget(V, K, τ) of AutoSLO §2.
//!
//! Each candidate has a violation measure `v` (a rate or a count) and a cost
//! `k`. The best candidate minimises, lexicographically,
//! `(max(0, v − τ), k)`: first get under the target τ, then be cheap.
//! Ties on both keys go to the earliest candidate, so callers control
//! tie-breaking by the order in which they list candidates.
//!
//! # Properties
//!
//! For any non-empty candidate list (finite values):
//!
//! - (A) if some candidate has `v ≤ τ`, the chosen one does too;
//! - (B) among candidates with `v ≤ τ`, the chosen one has the least cost;
//! - (C) if no candidate has `v ≤ τ`, the chosen one has the least `v`;
//! - (D) the choice is deterministic: the earliest of the tied candidates.

use std::cmp::Ordering;

use serde::{Deserialize, Serialize};

/// One option's outcome: its violation measure and its cost.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    /// Violation rate (or count, if τ is a count).
    pub violations: f64,
    /// Cost in dollars.
    pub cost_usd: f64,
}

impl Outcome {
    /// The lexicographic key `(max(0, v − τ), k)`.
    pub fn key(&self, target: f64) -> (f64, f64) {
        ((self.violations - target).max(0.0), self.cost_usd)
    }

    /// Compares two outcomes under BestWithTarget with target τ.
    pub fn cmp_with_target(&self, other: &Outcome, target: f64) -> Ordering {
        let (a_excess, a_cost) = self.key(target);
        let (b_excess, b_cost) = other.key(target);
        a_excess.total_cmp(&b_excess).then(a_cost.total_cmp(&b_cost))
    }
}

/// BestWithTarget(V, K, τ): the index of the best outcome, or `None` when
/// there are no outcomes.
pub fn best_with_target(outcomes: &[Outcome], target: f64) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (index, outcome) in outcomes.iter().enumerate() {
        match best {
            Some(current) if outcome.cmp_with_target(&outcomes[current], target) != Ordering::Less => {}
            _ => best = Some(index),
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn o(violations: f64, cost_usd: f64) -> Outcome {
        Outcome { violations, cost_usd }
    }

    #[test]
    fn cheaper_option_wins_when_both_meet_the_target() {
        assert_eq!(best_with_target(&[o(0.05, 10.0), o(0.0, 20.0)], 0.1), Some(0));
    }

    #[test]
    fn fewer_violations_win_when_above_the_target_regardless_of_cost() {
        assert_eq!(best_with_target(&[o(0.3, 1.0), o(0.2, 100.0)], 0.1), Some(1));
    }

    #[test]
    fn earliest_candidate_wins_exact_ties() {
        assert_eq!(best_with_target(&[o(0.0, 5.0), o(0.05, 5.0)], 0.1), Some(0));
        assert_eq!(best_with_target(&[], 0.1), None);
    }

    fn outcomes() -> impl Strategy<Value = Vec<Outcome>> {
        prop::collection::vec((0u32..=100, 0u32..1_000), 1..16)
            .prop_map(|raw| raw.into_iter().map(|(v, k)| o(f64::from(v) / 100.0, f64::from(k))).collect())
    }

    proptest! {
        #[test]
        fn chosen_meets_target_whenever_any_candidate_does(outcomes in outcomes(), tau in 0u32..=100) {
            let tau = f64::from(tau) / 100.0;
            let chosen = &outcomes[best_with_target(&outcomes, tau).unwrap()];
            if outcomes.iter().any(|c| c.violations <= tau) {
                prop_assert!(chosen.violations <= tau);
                let cheapest = outcomes.iter().filter(|c| c.violations <= tau).map(|c| c.cost_usd).fold(f64::INFINITY, f64::min);
                prop_assert_eq!(chosen.cost_usd, cheapest);
            } else {
                let least = outcomes.iter().map(|c| c.violations).fold(f64::INFINITY, f64::min);
                prop_assert_eq!(chosen.violations, least);
            }
        }

        #[test]
        fn choice_is_the_earliest_of_the_tied_minimum(outcomes in outcomes(), tau in 0u32..=100) {
            let tau = f64::from(tau) / 100.0;
            let chosen = best_with_target(&outcomes, tau).unwrap();
            for (index, candidate) in outcomes.iter().enumerate() {
                let ordering = candidate.cmp_with_target(&outcomes[chosen], tau);
                prop_assert!(ordering != Ordering::Less);
                if index < chosen {
                    prop_assert!(ordering == Ordering::Greater);
                }
            }
        }
    }
}
