//! The violation budget: a pool with a violation-rate target lets the
//! SLO-aware router spend the slack under it on cost.
//!
//! The objective is to meet the target first and then to spend as little
//! as possible. The router's rule takes the cheapest placement among those
//! whose expected violations are within a tolerance of the fewest
//! ([`super::slo::EXPECTED_VIOLATION_TOLERANCE`]). That tolerance is fixed
//! and small, so the router buys safety it does not need while the pool is
//! far under its target: it opens a billing window on an idle cluster to
//! spare a running query a few hundredths of a miss.
//!
//! The budget watches the router's own finished queries on clusters, the
//! last `window` of them (offloads to the elastic tier are not counted:
//! the tier does not keep their SLOs, and leaving them out, which mostly
//! meet theirs, only makes the budget more cautious), and widens the
//! tolerance by up to `extra_tolerance_max` in proportion to the unspent
//! share of the target:
//!
//! `extra = extra_tolerance_max × clamp(1 − realised / target, 0, 1)`
//!
//! where `realised` is the share of those queries that missed their SLO.
//! With no recent miss it is at its widest; as misses approach the target
//! it closes, and at or above the target the router's rule is the usual
//! one. It feeds back from what happened, not from predictions, so a
//! planner's misjudgement of the day does not carry into it.
//!
//! # Properties
//!
//! - (A) The extra tolerance lies in `[0, extra_tolerance_max]`.
//! - (B) It is 0 until `min_finished` queries have finished, and whenever
//!   the recent violation rate is at or above the target.
//! - (C) One more miss in place of a met SLO never widens it.
//! - (D) Deterministic: the same outcomes in the same order give the same
//!   tolerance.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// The budget's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BudgetConfig {
    /// The violation rate the router may spend up to.
    pub target: f64,
    /// Finished queries the recent violation rate is taken over.
    pub window: usize,
    /// Finished queries before the budget widens anything.
    pub min_finished: usize,
    /// The widest the tolerance grows beyond the router's own, in expected
    /// violations.
    pub extra_tolerance_max: f64,
}

impl Default for BudgetConfig {
    fn default() -> Self {
        BudgetConfig { target: 0.05, window: 128, min_finished: 32, extra_tolerance_max: 0.3 }
    }
}

impl BudgetConfig {
    /// Checks the settings, naming the first that is out of range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.target > 0.0 && self.target < 1.0) {
            return Err(format!("violation budget target must be in (0, 1), got {}", self.target));
        }
        if self.window == 0 {
            return Err("violation budget window must be at least 1".into());
        }
        if self.min_finished > self.window {
            return Err(format!("violation budget min_finished ({}) must not exceed its window ({})", self.min_finished, self.window));
        }
        if !(self.extra_tolerance_max >= 0.0 && self.extra_tolerance_max.is_finite()) {
            return Err(format!("violation budget extra_tolerance_max must be a finite number ≥ 0, got {}", self.extra_tolerance_max));
        }
        Ok(())
    }
}

/// What the budget shows an operator.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct BudgetState {
    /// The target.
    pub target: f64,
    /// The recent violation rate.
    pub realised: f64,
    /// Finished queries it is taken over.
    pub finished: usize,
    /// The tolerance it adds now.
    pub extra_tolerance: f64,
}

/// The violation budget. See the module docs.
#[derive(Clone, Debug)]
pub struct ViolationBudget {
    config: BudgetConfig,
    recent: VecDeque<bool>,
    misses: usize,
}

impl ViolationBudget {
    /// An empty budget with `config`.
    pub fn new(config: BudgetConfig) -> Self {
        ViolationBudget { recent: VecDeque::with_capacity(config.window), misses: 0, config }
    }

    /// The settings.
    pub fn config(&self) -> &BudgetConfig {
        &self.config
    }

    /// A query the router placed finished; `missed` if past its SLO (or
    /// never finished).
    pub fn handle_finished(&mut self, missed: bool) {
        if self.recent.len() == self.config.window
            && let Some(oldest) = self.recent.pop_front()
        {
            self.misses -= usize::from(oldest);
        }
        self.recent.push_back(missed);
        self.misses += usize::from(missed);
    }

    /// The recent violation rate (0 before any query finished).
    pub fn realised(&self) -> f64 {
        if self.recent.is_empty() { 0.0 } else { self.misses as f64 / self.recent.len() as f64 }
    }

    /// The tolerance to add to the router's own, in expected violations.
    pub fn extra_tolerance(&self) -> f64 {
        if self.recent.len() < self.config.min_finished.max(1) {
            return 0.0;
        }
        let unspent = (1.0 - self.realised() / self.config.target).clamp(0.0, 1.0);
        self.config.extra_tolerance_max * unspent
    }

    /// What an operator reads.
    pub fn state(&self) -> BudgetState {
        BudgetState { target: self.config.target, realised: self.realised(), finished: self.recent.len(), extra_tolerance: self.extra_tolerance() }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn budget_after(outcomes: &[bool], config: BudgetConfig) -> ViolationBudget {
        let mut budget = ViolationBudget::new(config);
        for &missed in outcomes {
            budget.handle_finished(missed);
        }
        budget
    }

    #[test]
    fn nothing_is_widened_until_enough_queries_finished() {
        let config = BudgetConfig::default();
        let budget = budget_after(&vec![false; config.min_finished - 1], config.clone());
        assert_eq!(budget.extra_tolerance(), 0.0);
        let budget = budget_after(&vec![false; config.min_finished], config.clone());
        assert_eq!(budget.extra_tolerance(), config.extra_tolerance_max);
    }

    #[test]
    fn the_tolerance_closes_as_recent_misses_reach_the_target() {
        let config = BudgetConfig { target: 0.1, window: 100, min_finished: 10, extra_tolerance_max: 0.2 };
        // 5 misses of 100: half the target spent.
        let outcomes: Vec<bool> = (0..100).map(|i| i % 20 == 0).collect();
        let budget = budget_after(&outcomes, config.clone());
        assert!((budget.extra_tolerance() - 0.1).abs() < 1e-12, "{}", budget.extra_tolerance());
        // 10 misses of 100: all of it.
        let outcomes: Vec<bool> = (0..100).map(|i| i % 10 == 0).collect();
        assert_eq!(budget_after(&outcomes, config).extra_tolerance(), 0.0);
    }

    #[test]
    fn old_misses_leave_the_window() {
        let config = BudgetConfig { target: 0.1, window: 50, min_finished: 10, extra_tolerance_max: 0.2 };
        let mut outcomes = vec![true; 50];
        outcomes.extend(vec![false; 50]);
        let budget = budget_after(&outcomes, config.clone());
        assert_eq!(budget.realised(), 0.0);
        assert_eq!(budget.extra_tolerance(), config.extra_tolerance_max);
    }

    #[test]
    fn settings_out_of_range_are_named() {
        let bad = BudgetConfig { target: 1.5, ..BudgetConfig::default() };
        assert!(bad.validate().unwrap_err().contains("target"));
        let bad = BudgetConfig { min_finished: 500, ..BudgetConfig::default() };
        assert!(bad.validate().unwrap_err().contains("min_finished"));
        assert!(BudgetConfig::default().validate().is_ok());
    }

    fn configs() -> impl Strategy<Value = BudgetConfig> {
        (0.01f64..0.5, 1usize..64, 0usize..64, 0.0f64..1.0).prop_map(|(target, window, min_finished, extra_tolerance_max)| BudgetConfig {
            target,
            window,
            min_finished: min_finished.min(window),
            extra_tolerance_max,
        })
    }

    proptest! {
        /// (A) and (B).
        #[test]
        fn the_extra_tolerance_stays_in_range_and_is_zero_at_or_over_the_target(config in configs(), outcomes in prop::collection::vec(any::<bool>(), 0..200)) {
            let budget = budget_after(&outcomes, config.clone());
            let extra = budget.extra_tolerance();
            prop_assert!((0.0..=config.extra_tolerance_max).contains(&extra));
            if budget.state().finished < config.min_finished.max(1) || budget.realised() >= config.target {
                prop_assert_eq!(extra, 0.0);
            }
        }

        /// (C) and (D).
        #[test]
        fn a_miss_in_place_of_a_met_slo_never_widens_it(config in configs(), outcomes in prop::collection::vec(any::<bool>(), 1..200), flip in any::<prop::sample::Index>()) {
            let i = flip.index(outcomes.len());
            let mut met = outcomes.clone();
            met[i] = false;
            let mut missed = outcomes.clone();
            missed[i] = true;
            let (met, missed) = (budget_after(&met, config.clone()), budget_after(&missed, config.clone()));
            prop_assert!(missed.extra_tolerance() <= met.extra_tolerance());
            prop_assert_eq!(budget_after(&outcomes, config.clone()).extra_tolerance(), budget_after(&outcomes, config).extra_tolerance());
        }
    }
}
