//! Scale-in by replay: the size selector's mirror image.
//!
//! The teardown trigger (AutoSLO §6) removes a cluster only once nothing
//! has been routed to it for T_idle. A router that spreads load rarely
//! leaves one idle that long, and it never makes the pool's one cluster
//! smaller, so clusters added at a peak stay through the quiet hours.
//! Scale-in asks the replay instead. From the pool as it is at `now`, it
//! replays the recent arrival window on a fork of the router once per
//! candidate:
//!
//! - keeping the pool as it is;
//! - draining one ready cluster now (nothing more is routed to it, and it
//!   goes once its running queries finish), for each ready cluster, when
//!   two or more are ready;
//! - replacing the pool's only cluster with a strictly smaller size, ready
//!   after δ (the old one drains once it is).
//!
//! The candidates' replays run on the selector's threads, in candidate
//! order. Every replay runs for the same span, δ + `horizon`, so their
//! costs compare; the violation rate counts the queries that arrive from `now`
//! on, with those still running at the end counted by their predictions.
//! A candidate is chosen only when its violation rate is at most `target`,
//! set below the spinup side's so that a scale-in does not at once fire the
//! spinup trigger, and when it saves at least [`MIN_SAVING`] of keeping's
//! cost. The cheapest such candidate wins.
//!
//! # Properties
//!
//! - (A) Keeping wins unless a candidate meets the target and saves at
//!   least [`MIN_SAVING`]; the chosen candidate is the cheapest of those.
//! - (B) It never drains the last ready cluster, and it shrinks only to a
//!   strictly smaller size, only a pool of one ready cluster.
//! - (C) Deterministic: the same inputs give the same choice.

use serde::{Deserialize, Serialize};

use crate::model::{ClusterId, ClusterState, Pool, Rpu};
use crate::route::PlanningRouter;
use crate::scale::replay::{Replay, SelectorConfig, evaluate_all};
use crate::scale::windows::ArrivalRecord;
use crate::time::Instant;

/// The share of keeping's simulated cost a scale-in must save.
pub const MIN_SAVING: f64 = 0.1;

/// A way to make the pool smaller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ScaleIn {
    /// Route nothing more to this cluster, and tear it down once drained.
    Drain {
        /// The cluster.
        cluster: ClusterId,
    },
    /// Replace the pool's one cluster with a smaller one once that is
    /// ready.
    Shrink {
        /// The cluster replaced.
        cluster: ClusterId,
        /// The new, smaller size.
        size: Rpu,
    },
}

/// One candidate's simulated outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleInOutcome {
    /// The candidate; `None` for keeping the pool as it is.
    pub action: Option<ScaleIn>,
    /// Simulated violation rate among the queries arriving from `now` on.
    pub violation_rate: f64,
    /// Simulated cost over the replay's span, dollars.
    pub cost_usd: f64,
}

/// Scale-in's answer, with every candidate for the decision record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleInSelection {
    /// Every candidate, keeping first.
    pub candidates: Vec<ScaleInOutcome>,
    /// What to do, or `None` to keep the pool.
    pub choice: Option<ScaleIn>,
    /// The violation-rate target the candidates had to meet.
    pub target: f64,
    /// Replayed arrivals over all candidates (a measure of effort).
    pub replayed_arrivals: usize,
}

/// The candidates for `pool`: each ready cluster drained when two or more
/// are ready; the one ready cluster replaced by each smaller size of
/// `sizes` otherwise.
pub fn candidates(pool: &Pool, sizes: &[Rpu]) -> Vec<ScaleIn> {
    let ready: Vec<_> = pool.clusters.iter().filter(|c| c.state == ClusterState::Ready).collect();
    match ready.as_slice() {
        [] => Vec::new(),
        [only] => sizes.iter().filter(|s| **s < only.size).map(|size| ScaleIn::Shrink { cluster: only.id, size: *size }).collect(),
        several => several.iter().map(|c| ScaleIn::Drain { cluster: c.id }).collect(),
    }
}

impl ScaleInSelection {
    /// The chosen candidate's outcome, `None` for keeping the pool.
    pub fn chosen(&self) -> Option<&ScaleInOutcome> {
        self.choice.and_then(|choice| self.candidates.iter().find(|c| c.action == Some(choice)))
    }

    /// Keeping the pool's outcome (the first candidate).
    pub fn keep(&self) -> &ScaleInOutcome {
        &self.candidates[0]
    }
}

/// Replays each candidate (see the module docs) and chooses among them
/// against `target`; `None`, with nothing replayed, when there is nothing
/// to try: no candidate, or no arrival in the window to replay.
pub fn select_scale_in(now: Instant, pool: &Pool, router: &dyn PlanningRouter, window: &[ArrivalRecord], config: &SelectorConfig, target: f64) -> Option<ScaleInSelection> {
    let actions = candidates(pool, &config.sizes);
    if actions.is_empty() || window.is_empty() {
        return None;
    }
    let preparation = Replay::start(now, now, pool, router, window, config);
    let until = now + config.spinup_delay + config.horizon;
    let options: Vec<Option<ScaleIn>> = std::iter::once(None).chain(actions.into_iter().map(Some)).collect();
    let evaluate = |action: Option<ScaleIn>, mut replay: Replay<'_>| {
        match action {
            None => {}
            Some(ScaleIn::Drain { cluster }) => replay.drain(cluster),
            Some(ScaleIn::Shrink { size, .. }) => replay.add_cluster(size, now + config.spinup_delay, true),
        }
        replay.run(until, &|_| false);
        let outcome = replay.outcome(None, 0);
        (ScaleInOutcome { action, violation_rate: outcome.violation_rate, cost_usd: outcome.cost_usd }, replay.arrivals)
    };
    let results = evaluate_all(&options, &preparation, config.threads, &evaluate);
    let replayed_arrivals = results.iter().map(|(_, arrivals)| arrivals).sum();
    let candidates: Vec<ScaleInOutcome> = results.into_iter().map(|(outcome, _)| outcome).collect();
    let choice = choose(&candidates, target);
    Some(ScaleInSelection { candidates, choice, target, replayed_arrivals })
}

/// Property (A): keeping (the first candidate) unless another meets the
/// target and saves at least [`MIN_SAVING`]; the cheapest of those, the
/// first among equals.
fn choose(candidates: &[ScaleInOutcome], target: f64) -> Option<ScaleIn> {
    let keep = candidates.first()?;
    let ceiling = keep.cost_usd * (1.0 - MIN_SAVING);
    candidates
        .iter()
        .skip(1)
        .filter(|c| c.violation_rate <= target && c.cost_usd <= ceiling)
        .min_by(|a, b| a.cost_usd.total_cmp(&b.cost_usd))
        .and_then(|c| c.action)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::billing::BillingConfig;
    use crate::predict::ConcurrencyAware;
    use crate::route::slo::SloRouter;
    use crate::scale::replay::pool_of;
    use crate::scale::replay::tests::{router_with_slowdown, window};

    /// 20 s isolated at 16 RPU, scaling inversely with the square root of
    /// size, so a small cluster is cheaper per query.
    fn router() -> SloRouter<ConcurrencyAware> {
        router_with_slowdown(|size| (16.0 / size).sqrt())
    }

    fn config() -> SelectorConfig {
        crate::scale::AutoscalerConfig::default().selector_config(BillingConfig::default())
    }

    const AT: f64 = 1_000.0;

    #[test]
    fn a_drain_that_saves_nothing_is_not_chosen() {
        // Usage billing: the router already sends a quiet pool's queries to
        // one cluster, so the other costs nothing and draining it saves
        // nothing; keeping wins rather than churning the pool.
        let selection = select_scale_in(Instant::from_secs_f64(AT), &pool_of(&[Rpu(16), Rpu(16)]), &router(), &window(0.01, 300.0), &config(), 0.05).expect("candidates to replay");
        assert_eq!(selection.candidates.len(), 3, "{selection:?}");
        assert!(selection.candidates.iter().all(|c| c.violation_rate == 0.0), "{selection:?}");
        assert_eq!(selection.choice, None, "{selection:?}");
    }

    #[test]
    fn a_drain_that_breaks_the_slos_is_not_chosen_however_much_it_saves() {
        let selection = select_scale_in(Instant::from_secs_f64(AT), &pool_of(&[Rpu(16), Rpu(16)]), &router(), &window(0.1, 60.0), &config(), 0.05).expect("candidates to replay");
        let keep = selection.candidates[0].cost_usd;
        assert!(selection.candidates[1..].iter().all(|c| c.cost_usd < keep * (1.0 - MIN_SAVING) && c.violation_rate > 0.05), "{selection:?}");
        assert_eq!(selection.choice, None, "{selection:?}");
    }

    #[test]
    fn a_quiet_pool_of_one_large_cluster_shrinks_it() {
        let selection = select_scale_in(Instant::from_secs_f64(AT), &pool_of(&[Rpu(32)]), &router(), &window(0.02, 300.0), &config(), 0.05).expect("candidates to replay");
        let Some(ScaleIn::Shrink { size, .. }) = selection.choice else { panic!("a smaller cluster is cheaper: {selection:?}") };
        assert!(size < Rpu(32));
    }

    #[test]
    fn a_busy_pool_with_tight_slos_keeps_its_clusters() {
        let selection = select_scale_in(Instant::from_secs_f64(AT), &pool_of(&[Rpu(16), Rpu(16)]), &router(), &window(0.3, 30.0), &config(), 0.05).expect("candidates to replay");
        assert_eq!(selection.choice, None, "{selection:?}");
        assert!(selection.candidates.len() == 3, "keeping and one drain per cluster: {selection:?}");
    }

    #[test]
    fn the_last_ready_cluster_is_never_drained_and_only_shrinks() {
        let one = pool_of(&[Rpu(8)]);
        let sizes = [Rpu(4), Rpu(8), Rpu(16)];
        assert_eq!(candidates(&one, &sizes), vec![ScaleIn::Shrink { cluster: ClusterId(0), size: Rpu(4) }]);
        assert!(candidates(&pool_of(&[Rpu(4)]), &sizes).is_empty());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// (A), (B) and (C) on random pools and loads.
        #[test]
        fn scale_in_keeps_unless_a_candidate_meets_the_target_and_saves(
            sizes in prop::collection::vec(prop::sample::select(vec![4u32, 8, 16, 32]), 1..4),
            rate in 0.005f64..0.4,
            slo_s in 10.0f64..400.0,
            target in 0.0f64..0.2,
        ) {
            let pool = pool_of(&sizes.iter().copied().map(Rpu).collect::<Vec<_>>());
            let r = router();
            let at = Instant::from_secs_f64(AT);
            let selection = select_scale_in(at, &pool, &r, &window(rate, slo_s), &config(), target);
            let again = select_scale_in(at, &pool, &r, &window(rate, slo_s), &config(), target);
            prop_assert_eq!(&selection, &again, "deterministic");
            let Some(selection) = selection else {
                prop_assert!(candidates(&pool, &config().sizes).is_empty(), "replayed whenever there is a candidate");
                return Ok(());
            };
            let keep = selection.keep();
            prop_assert_eq!(keep.action, None);
            if let Some(choice) = selection.choice {
                let chosen = selection.chosen().expect("listed");
                prop_assert!(chosen.violation_rate <= target, "{:?}", selection);
                prop_assert!(chosen.cost_usd <= keep.cost_usd * (1.0 - MIN_SAVING), "{:?}", selection);
                let cheaper = selection.candidates.iter().skip(1).filter(|c| c.violation_rate <= target).any(|c| c.cost_usd < chosen.cost_usd);
                prop_assert!(!cheaper, "the cheapest: {:?}", selection);
                match choice {
                    ScaleIn::Drain { .. } => prop_assert!(sizes.len() >= 2, "{:?}", selection),
                    ScaleIn::Shrink { size, .. } => prop_assert!(sizes.len() == 1 && size.0 < sizes[0], "{:?}", selection),
                }
            }
        }
    }
}
