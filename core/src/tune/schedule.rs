//! The spinup scheduler (AutoSLO §7.4): planned spinups for predictable
//! congestion, found greedily on forecasted training days and chosen on
//! validation days.
//!
//! [`find_good_spinup_times`] (Algorithm 5) scans one timeline of every
//! training simulation's arrivals and completions with running sums: a
//! workload is **delinquent** while more than `target` of its running
//! queries violate their SLOs; a **congestion epoch** starts when at least
//! `k` workloads are delinquent and ends when fewer are. Each epoch yields
//! a candidate time `lead` before its start (clamped at the day's start),
//! kept only if at least `spacing` after the previous candidate.
//!
//! [`schedule_spinups`] (Algorithm 4) evolves each initial configuration
//! over at most `rounds` greedy rounds: it simulates the configurations
//! still alive on the training days, finds their candidate times, and in
//! waves of trials (every alive configuration × every size at its current
//! candidate) accepts a spinup only if it strictly beats the configuration
//! under BestWithTarget(τ); a configuration that finds nothing in
//! `attempts` candidates stops. The best configuration of each initial one
//! is then simulated on the validation days, and the best of those under
//! BestWithTarget(τ) is returned.
//!
//! # Properties
//!
//! - (A) Candidate times are ascending, at least `spacing` apart, and never
//!   before the day's start.
//! - (B) A round never accepts a spinup that does not strictly improve its
//!   configuration's training outcome under BestWithTarget.
//! - (C) Each configuration's training outcome never gets worse over the
//!   rounds.

use serde::{Deserialize, Serialize};

use crate::model::{Query, Rpu};
use crate::objective::{Outcome, best_with_target};
use crate::route::PlanningRouter;
use crate::scale::ScheduledSpinup;
use crate::time::{Duration, Instant};
use crate::tune::batch::{BatchSetup, ExecutionConfig, QueryTrace, RunOutcome, aggregate, simulate_batch};

/// The scheduler's knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// η: greedy rounds at most.
    pub rounds: usize,
    /// φ: candidate times tried per configuration and round at most.
    pub attempts: usize,
    /// Sizes a planned spinup may have.
    pub sizes: Vec<Rpu>,
    /// τ: the violation-rate target of BestWithTarget, and the share of
    /// running queries violating that makes a workload delinquent.
    pub target: f64,
    /// k: delinquent workloads that make a congestion epoch, as a share of
    /// the training workloads (at least one).
    pub delinquent_share: f64,
    /// δ: how long before an epoch a spinup is planned (the spinup delay).
    pub lead: Duration,
    /// σ_min: candidate times at least this far apart.
    pub spacing: Duration,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            rounds: 4,
            attempts: 3,
            sizes: vec![Rpu(8), Rpu(16), Rpu(32)],
            target: 0.1,
            delinquent_share: 0.5,
            lead: Duration::from_secs(300),
            spacing: Duration::from_secs(900),
        }
    }
}

impl SchedulerConfig {
    /// k for `workloads` training workloads.
    pub fn delinquent_workloads(&self, workloads: usize) -> usize {
        ((self.delinquent_share * workloads as f64).ceil() as usize).clamp(1, workloads.max(1))
    }
}

/// Algorithm 5: candidate spinup times from the training simulations'
/// traces (one slice per workload). See the module docs.
pub fn find_good_spinup_times(logs: &[&[QueryTrace]], target: f64, k: usize, lead: Duration, spacing: Duration) -> Vec<Instant> {
    // (time, workload, +1 arrival / -1 completion, violated); completions
    // first at equal instants.
    let mut events: Vec<(Instant, i8, usize, bool)> = Vec::with_capacity(2 * logs.iter().map(|l| l.len()).sum::<usize>());
    for (workload, log) in logs.iter().enumerate() {
        for trace in log.iter() {
            events.push((trace.arrival, 1, workload, trace.violated));
            events.push((trace.finished, -1, workload, trace.violated));
        }
    }
    events.sort_by_key(|&(at, delta, workload, _)| (at, delta, workload));
    let mut running = vec![0i64; logs.len()];
    let mut violating = vec![0i64; logs.len()];
    let mut delinquent = vec![false; logs.len()];
    let mut delinquent_count = 0usize;
    let mut candidates: Vec<Instant> = Vec::new();
    let mut epoch: Option<Instant> = None;
    let close = |candidates: &mut Vec<Instant>, candidate: Instant| {
        if candidates.last().is_none_or(|last| candidate >= *last + spacing) {
            candidates.push(candidate);
        }
    };
    let mut i = 0;
    while i < events.len() {
        let at = events[i].0;
        // Every event at this instant before judging: zero-length
        // intervals are skipped.
        while i < events.len() && events[i].0 == at {
            let (_, delta, workload, violated) = events[i];
            running[workload] += i64::from(delta);
            violating[workload] += i64::from(delta) * i64::from(violated);
            let now = running[workload] > 0 && violating[workload] as f64 > target * running[workload] as f64;
            if now != delinquent[workload] {
                delinquent[workload] = now;
                if now { delinquent_count += 1 } else { delinquent_count -= 1 }
            }
            i += 1;
        }
        match epoch {
            None if delinquent_count >= k => epoch = Some(Instant::ZERO + (at - Instant::ZERO).saturating_sub(lead)),
            Some(candidate) if delinquent_count < k => {
                close(&mut candidates, candidate);
                epoch = None;
            }
            _ => {}
        }
    }
    if let Some(candidate) = epoch {
        close(&mut candidates, candidate);
    }
    candidates
}

/// Algorithm 4's acceptance rule: the best of `trials` if it strictly beats
/// `baseline` under BestWithTarget(`target`), else `None`.
pub fn accept(baseline: Outcome, trials: &[Outcome], target: f64) -> Option<usize> {
    let mut all = vec![baseline];
    all.extend_from_slice(trials);
    // The baseline is listed first, so it wins ties.
    best_with_target(&all, target).filter(|&best| best > 0).map(|best| best - 1)
}

/// What the scheduler did for one initial configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduledCandidate {
    /// Its best configuration.
    pub config: ExecutionConfig,
    /// Its pooled training outcome, first and last.
    pub training_before: Outcome,
    /// After the rounds.
    pub training_after: Outcome,
    /// Its validation outcome.
    pub validation: Outcome,
}

/// The scheduler's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// The chosen configuration, E*.
    pub best: ExecutionConfig,
    /// Its validation outcome.
    pub expected: Outcome,
    /// Every initial configuration's path.
    pub candidates: Vec<ScheduledCandidate>,
    /// Simulations run.
    pub simulations: usize,
}

/// Algorithm 4: see the module docs. `initial` must not be empty.
pub fn schedule_spinups(
    setup: &BatchSetup,
    router: &dyn PlanningRouter,
    initial: &[ExecutionConfig],
    training: &[Vec<Query>],
    validation: &[Vec<Query>],
    config: &SchedulerConfig,
) -> Schedule {
    assert!(!initial.is_empty(), "the scheduler needs an initial configuration");
    let k = config.delinquent_workloads(training.len());
    let mut best: Vec<ExecutionConfig> = initial.to_vec();
    let mut before: Vec<Option<Outcome>> = vec![None; initial.len()];
    let mut current: Vec<Option<Outcome>> = vec![None; initial.len()];
    let mut alive: Vec<bool> = vec![!training.is_empty(); initial.len()];
    let mut simulations = 0;
    for _round in 0..config.rounds {
        let indices: Vec<usize> = (0..best.len()).filter(|&i| alive[i] || before[i].is_none()).collect();
        if indices.is_empty() {
            break;
        }
        let configs: Vec<ExecutionConfig> = indices.iter().map(|&i| best[i].clone()).collect();
        let results = simulate_batch(setup, router, &configs, training);
        simulations += configs.len() * training.len();
        let mut times: Vec<Vec<Instant>> = vec![Vec::new(); best.len()];
        for (&i, outcomes) in indices.iter().zip(&results) {
            let outcome = aggregate(outcomes);
            before[i].get_or_insert(outcome);
            current[i] = Some(outcome);
            let logs: Vec<&[QueryTrace]> = outcomes.iter().map(|o| &o.traces[..]).collect();
            times[i] = find_good_spinup_times(&logs, config.target, k, config.lead, config.spacing);
            if times[i].is_empty() {
                alive[i] = false;
            }
        }
        let mut attempt = vec![0usize; best.len()];
        let mut this_round: Vec<usize> = (0..best.len()).filter(|&i| alive[i]).collect();
        while !this_round.is_empty() {
            let trials: Vec<(usize, ExecutionConfig)> = this_round
                .iter()
                .flat_map(|&i| {
                    let at = times[i][attempt[i]];
                    config.sizes.iter().map(move |&size| (i, ScheduledSpinup { at, size }))
                })
                .map(|(i, spinup)| (i, best[i].with_spinup(spinup)))
                .collect();
            let trial_configs: Vec<ExecutionConfig> = trials.iter().map(|(_, c)| c.clone()).collect();
            let results: Vec<Vec<RunOutcome>> = simulate_batch(setup, router, &trial_configs, training);
            simulations += trial_configs.len() * training.len();
            let mut next_round = Vec::new();
            for &i in &this_round {
                let mine: Vec<(usize, Outcome)> = trials.iter().enumerate().filter(|(_, (owner, _))| *owner == i).map(|(t, _)| (t, aggregate(&results[t]))).collect();
                let outcomes: Vec<Outcome> = mine.iter().map(|(_, o)| *o).collect();
                let baseline = current[i].expect("simulated this round");
                match accept(baseline, &outcomes, config.target) {
                    Some(winner) => {
                        let (t, outcome) = mine[winner];
                        best[i] = trials[t].1.clone();
                        current[i] = Some(outcome);
                    }
                    None => {
                        attempt[i] += 1;
                        if attempt[i] >= config.attempts || attempt[i] >= times[i].len() {
                            alive[i] = false;
                        } else {
                            next_round.push(i);
                        }
                    }
                }
            }
            this_round = next_round;
        }
        if !alive.iter().any(|a| *a) {
            break;
        }
    }
    // Configurations never simulated (no rounds, or no training days).
    let unsimulated: Vec<usize> = (0..best.len()).filter(|&i| current[i].is_none()).collect();
    if !unsimulated.is_empty() && !training.is_empty() {
        let configs: Vec<ExecutionConfig> = unsimulated.iter().map(|&i| best[i].clone()).collect();
        let results = simulate_batch(setup, router, &configs, training);
        simulations += configs.len() * training.len();
        for (&i, outcomes) in unsimulated.iter().zip(&results) {
            let outcome = aggregate(outcomes);
            before[i] = Some(outcome);
            current[i] = Some(outcome);
        }
    }
    let validated = simulate_batch(setup, router, &best, validation);
    simulations += best.len() * validation.len();
    let validation_outcomes: Vec<Outcome> = validated.iter().map(|o| aggregate(o)).collect();
    let chosen = best_with_target(&validation_outcomes, config.target).expect("at least one configuration");
    let zero = Outcome { violations: 0.0, cost_usd: 0.0 };
    let candidates = (0..best.len())
        .map(|i| ScheduledCandidate {
            config: best[i].clone(),
            training_before: before[i].unwrap_or(zero),
            training_after: current[i].unwrap_or(zero),
            validation: validation_outcomes[i],
        })
        .collect();
    Schedule { best: best[chosen].clone(), expected: validation_outcomes[chosen], candidates, simulations }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::scale::AutoscalerConfig;
    use crate::tune::batch::tests::{burst, router, setup};

    fn trace(arrival_s: f64, finished_s: f64, violated: bool) -> QueryTrace {
        QueryTrace { arrival: Instant::from_secs_f64(arrival_s), finished: Instant::from_secs_f64(finished_s), violated }
    }

    fn at(s: f64) -> Instant {
        Instant::from_secs_f64(s)
    }

    /// A workload congested over `[from, to)`: a violating query spanning
    /// it, next to a long well-behaved one.
    fn congested(from: f64, to: f64) -> Vec<QueryTrace> {
        vec![trace(0.0, 10_000.0, false), trace(from, to, true)]
    }

    #[test]
    fn a_candidate_is_the_epoch_start_minus_the_lead() {
        // Workloads delinquent over [1000, 1500), [1100, 1600) and [1200,
        // 1400): with k = 3 the epoch is [1200, 1400).
        let logs = [congested(1_000.0, 1_500.0), congested(1_100.0, 1_600.0), congested(1_200.0, 1_400.0)];
        let slices: Vec<&[QueryTrace]> = logs.iter().map(|l| &l[..]).collect();
        let lead = Duration::from_secs(300);
        assert_eq!(find_good_spinup_times(&slices, 0.1, 3, lead, Duration::from_secs(600)), vec![at(900.0)]);
        // With k = 1 the epoch is [1000, 1600).
        assert_eq!(find_good_spinup_times(&slices, 0.1, 1, lead, Duration::from_secs(600)), vec![at(700.0)]);
        // Never four delinquent workloads: no epoch.
        assert!(find_good_spinup_times(&slices, 0.1, 4, lead, Duration::from_secs(600)).is_empty());
    }

    #[test]
    fn candidates_clamp_at_the_days_start_and_honour_the_spacing() {
        let early = [congested(100.0, 200.0)];
        let slices: Vec<&[QueryTrace]> = early.iter().map(|l| &l[..]).collect();
        assert_eq!(find_good_spinup_times(&slices, 0.1, 1, Duration::from_secs(300), Duration::from_secs(600)), vec![Instant::ZERO]);
        // Epochs starting at 1000, 1400 and 2000: with 600 s spacing the
        // candidates 700 and 1700 stay, 1100 is too close to 700.
        let mut log = vec![trace(0.0, 10_000.0, false)];
        log.extend([trace(1_000.0, 1_100.0, true), trace(1_400.0, 1_500.0, true), trace(2_000.0, 2_100.0, true)]);
        let slices: Vec<&[QueryTrace]> = vec![&log[..]];
        assert_eq!(find_good_spinup_times(&slices, 0.1, 1, Duration::from_secs(300), Duration::from_secs(600)), vec![at(700.0), at(1_700.0)]);
    }

    #[test]
    fn a_workload_is_delinquent_only_above_the_target_share() {
        // One violating query among four running: 25%, delinquent at τ =
        // 0.2, not at τ = 0.3.
        let mut log: Vec<QueryTrace> = (0..3).map(|_| trace(0.0, 5_000.0, false)).collect();
        log.push(trace(1_000.0, 2_000.0, true));
        let slices: Vec<&[QueryTrace]> = vec![&log[..]];
        assert_eq!(find_good_spinup_times(&slices, 0.2, 1, Duration::ZERO, Duration::ZERO), vec![at(1_000.0)]);
        assert!(find_good_spinup_times(&slices, 0.3, 1, Duration::ZERO, Duration::ZERO).is_empty());
    }

    #[test]
    fn the_scheduler_plans_a_spinup_ahead_of_a_recurring_burst() {
        // Every forecast day has a burst at 2 h that one 16-RPU cluster
        // cannot serve within 30 s SLOs, and the autoscaler never reacts:
        // the scheduler plans a cluster about δ before it.
        let day = |seed: u64| burst(seed * 1_000, 7_200.0 + seed as f64 * 20.0, 60, 2.0 + 0.1 * seed as f64, 30);
        let training: Vec<Vec<Query>> = (0..3).map(day).collect();
        let validation: Vec<Vec<Query>> = (3..5).map(day).collect();
        let initial = [ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() }];
        let config = SchedulerConfig { rounds: 2, ..SchedulerConfig::default() };
        let schedule = schedule_spinups(&setup(2), &router(), &initial, &training, &validation, &config);
        assert!(!schedule.best.spinups.is_empty(), "{schedule:?}");
        let first = schedule.best.spinups[0].at.as_secs_f64();
        assert!((6_600.0..7_300.0).contains(&first), "planned at {first}");
        let path = &schedule.candidates[0];
        assert_eq!(path.training_after.cmp_with_target(&path.training_before, config.target), std::cmp::Ordering::Less);
        assert!(schedule.expected.violations < 0.5, "{:?}", schedule.expected);
    }

    proptest! {
        #[test]
        fn a_round_accepts_only_a_strict_improvement(
            baseline in (0.0f64..1.0, 0.0f64..100.0),
            trials in prop::collection::vec((0.0f64..1.0, 0.0f64..100.0), 0..8),
            target in 0.0f64..0.5,
        ) {
            let baseline = Outcome { violations: baseline.0, cost_usd: baseline.1 };
            let trials: Vec<Outcome> = trials.into_iter().map(|(v, c)| Outcome { violations: v, cost_usd: c }).collect();
            match accept(baseline, &trials, target) {
                Some(i) => prop_assert_eq!(trials[i].cmp_with_target(&baseline, target), std::cmp::Ordering::Less),
                None => prop_assert!(trials.iter().all(|t| t.cmp_with_target(&baseline, target) != std::cmp::Ordering::Less)),
            }
        }

        #[test]
        fn candidate_times_are_ascending_spaced_and_not_before_the_start(
            spans in prop::collection::vec(prop::collection::vec((0.0f64..20_000.0, 1.0f64..3_000.0, any::<bool>()), 1..30), 1..5),
            k in 1usize..4,
            lead_s in 0u64..1_000,
            spacing_s in 0u64..2_000,
        ) {
            let logs: Vec<Vec<QueryTrace>> = spans.iter().map(|w| w.iter().map(|&(a, d, v)| trace(a, a + d, v)).collect()).collect();
            let slices: Vec<&[QueryTrace]> = logs.iter().map(|l| &l[..]).collect();
            let spacing = Duration::from_secs(spacing_s);
            let times = find_good_spinup_times(&slices, 0.1, k, Duration::from_secs(lead_s), spacing);
            for pair in times.windows(2) {
                prop_assert!(pair[1] >= pair[0] + spacing);
            }
            prop_assert!(times.iter().all(|t| *t >= Instant::ZERO));
        }
    }
}
