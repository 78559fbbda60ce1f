//! The policy tuner (AutoSLO §7): plans ahead from the workload's history
//! by simulating forecasted days on the planner's model, never the world.
//!
//! [`tune_pool`] runs the whole pipeline for one pool and one target day:
//! forecast training and validation days from the reservoir, give each
//! forecast query its template's SLO, schedule spinups from the base
//! configuration (Algorithm 4), then tune the autoscaler's knobs with those
//! spinups fixed (§7.5). With no history the forecasts are empty and the
//! base configuration comes back unchanged. The planner's warehouse is
//! only as good as its calibration (`setup.terms.calibration`), which the
//! caller learns from the execution log with [`Calibration::learn`].
//!
//! # Properties
//!
//! - (A) The returned configuration is never expected to be worse than the
//!   base on the validation forecasts under BestWithTarget(τ).
//! - (B) It differs from the base only when the tuned configuration is
//!   strictly better there (`accepted`); otherwise the base comes back,
//!   with its own expected outcome.
//!
//! # Layout
//!
//! - [`forecast`](mod@forecast): forecasted days from the reservoir's tables (weekly
//!   decay, previous day, or a window), split into training and validation.
//! - [`predicted`]: the planner's warehouse, where queries complete when
//!   the learned predictor says so.
//! - [`calibration`]: what it learns beyond the predictor's curve from
//!   observed executions: executing slots per size and the spread of
//!   latencies around the predictions.
//! - [`batch`]: SimulateBatch, execution configurations × workloads on the
//!   planner's warehouse, in parallel.
//! - [`schedule`]: the spinup scheduler: candidate times from congestion
//!   epochs (Algorithm 5) and the greedy rounds (Algorithm 4).
//! - [`configure`]: the configuration tuner: grid, random, coordinate
//!   descent and adaptive batches over the autoscaler's knobs.

pub mod batch;
pub mod calibration;
pub mod configure;
pub mod forecast;
pub mod predicted;
pub mod schedule;

use std::collections::BTreeMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::model::{PoolId, Query, QueryId, Slo, TemplateId};
use crate::objective::Outcome;
use crate::reservoir::Reservoir;
use crate::route::PlanningRouter;
use crate::time::{Duration, Instant};

pub use calibration::{AdmissionModel, AdmissionSample, Calibration, ResidualModel};
pub use batch::{BatchSetup, ExecutionConfig, RunOutcome, aggregate, simulate_batch};
pub use configure::{TuneStrategy, TunerConfig, Tuning, tune_configuration};
pub use forecast::{ForecastConfig, ForecastDay, ForecastMethod, Forecasts, forecast};
pub use predicted::{PlannerTerms, PredictedWarehouse};
pub use schedule::{Schedule, SchedulerConfig, schedule_spinups};

/// Every setting of one tuning run.
///
/// The defaults plan for τ = 0.1 with half of it as headroom: the
/// scheduler and the configuration tuner aim at a violation rate of 0.05
/// on the forecasts, because the forecasts only approximate the day and the
/// planner's warehouse only approximates the cluster, and a configuration
/// chosen right at τ in the plan lands above it as often as below.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TuningConfig {
    /// The forecaster.
    pub forecast: ForecastConfig,
    /// The spinup scheduler.
    pub scheduler: SchedulerConfig,
    /// The configuration tuner.
    pub tuner: TunerConfig,
}

/// The violation rate the defaults plan for: half of τ = 0.1.
pub const PLANNING_TARGET: f64 = 0.05;

impl Default for TuningConfig {
    fn default() -> Self {
        TuningConfig {
            forecast: ForecastConfig::default(),
            scheduler: SchedulerConfig { target: PLANNING_TARGET, ..SchedulerConfig::default() },
            tuner: TunerConfig { target: PLANNING_TARGET, ..TunerConfig::default() },
        }
    }
}

/// Each template's SLO, for forecast queries (the reservoir keeps counts,
/// not SLOs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SloBook {
    /// Per template.
    pub by_template: BTreeMap<TemplateId, Duration>,
    /// For templates it has not seen.
    pub default: Duration,
}

impl SloBook {
    /// The SLO of `template`.
    pub fn slo(&self, template: TemplateId) -> Slo {
        Slo { latency: self.by_template.get(&template).copied().unwrap_or(self.default) }
    }
}

/// Where a tuning run is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TuningPhase {
    /// Drawing forecasts.
    Forecasting,
    /// Algorithm 4.
    Scheduling,
    /// §7.5.
    Configuring,
    /// Finished.
    Done,
}

/// A tuning run's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TuningReport {
    /// The target day, days since 1970-01-01.
    pub day: i32,
    /// The chosen configuration: the tuned one if accepted, else the base.
    pub config: ExecutionConfig,
    /// Its expected outcome on the validation forecasts (VR, mean cost per
    /// day).
    pub expected: Outcome,
    /// The base configuration's expected outcome on the same forecasts
    /// (none when they hold no queries).
    pub base_expected: Option<Outcome>,
    /// Whether the tuned configuration beat the base on the validation
    /// forecasts under BestWithTarget (strictly) and so replaced it.
    pub accepted: bool,
    /// Forecast queries per training and per validation day, on average.
    pub forecast_queries_per_day: f64,
    /// The fewest and the most queries of one forecast day: how far the
    /// forecasts stray from one another (see [`mod@forecast`]'s day-to-day
    /// ratios).
    #[serde(default)]
    pub forecast_queries_per_day_range: (usize, usize),
    /// Training and validation days.
    pub days: (usize, usize),
    /// The scheduler's path.
    pub schedule: Schedule,
    /// The configuration tuner's path.
    pub tuning: Tuning,
    /// Simulations run in all.
    pub simulations: usize,
}

/// A forecast day's queries, each with its template's SLO.
pub fn forecast_queries(day: &ForecastDay, slos: &SloBook, pool: &PoolId) -> Vec<Query> {
    day.arrivals
        .iter()
        .enumerate()
        .map(|(i, (offset, template))| Query { id: QueryId(i as u64), pool: pool.clone(), template: *template, slo: slos.slo(*template), arrival: Instant::ZERO + *offset })
        .collect()
}

/// The whole tuning pipeline for `day` from `reservoir`'s `history` (see
/// the module docs). `progress` hears each phase as it starts.
#[allow(clippy::too_many_arguments)]
pub fn tune_pool(
    reservoir: &Reservoir,
    day: i32,
    history: Range<i32>,
    slos: &SloBook,
    setup: &BatchSetup,
    router: &dyn PlanningRouter,
    base: &ExecutionConfig,
    config: &TuningConfig,
    progress: &mut dyn FnMut(TuningPhase),
) -> TuningReport {
    progress(TuningPhase::Forecasting);
    let forecasts = forecast(reservoir, day, &history, &config.forecast);
    let pool = PoolId::default();
    let training: Vec<Vec<Query>> = forecasts.training.iter().map(|d| forecast_queries(d, slos, &pool)).collect();
    let validation: Vec<Vec<Query>> = forecasts.validation.iter().map(|d| forecast_queries(d, slos, &pool)).collect();
    let days = training.len() + validation.len();
    let forecast_queries_per_day = if days == 0 { 0.0 } else { training.iter().chain(&validation).map(Vec::len).sum::<usize>() as f64 / days as f64 };
    let day_lengths = || training.iter().chain(&validation).map(Vec::len);
    let forecast_queries_per_day_range = (day_lengths().min().unwrap_or(0), day_lengths().max().unwrap_or(0));
    progress(TuningPhase::Scheduling);
    let schedule = schedule_spinups(setup, router, std::slice::from_ref(base), &training, &validation, &config.scheduler);
    progress(TuningPhase::Configuring);
    let tuning = tune_configuration(setup, router, &schedule.best, &training, &validation, &config.tuner);
    progress(TuningPhase::Done);
    // The tuner's finalists include the scheduled configuration's own
    // knobs only if the space holds them; keep whichever validates better.
    let (tuned, tuned_expected) = if tuning.expected.cmp_with_target(&schedule.expected, config.tuner.target) == std::cmp::Ordering::Greater {
        (schedule.best.clone(), schedule.expected)
    } else {
        (tuning.best.clone(), tuning.expected)
    };
    // The acceptance gate: the tuned configuration replaces the base only
    // if the validation forecasts say it is strictly better.
    let mut simulations = schedule.simulations + tuning.simulations;
    let base_expected = if validation.iter().all(Vec::is_empty) {
        None
    } else {
        simulations += validation.len();
        Some(aggregate(&simulate_batch(setup, router, std::slice::from_ref(base), &validation)[0]))
    };
    let accepted = base_expected.is_some_and(|b| tuned_expected.cmp_with_target(&b, config.tuner.target) == std::cmp::Ordering::Less);
    let (config, expected) = match base_expected {
        Some(b) if !accepted => (base.clone(), b),
        None => (base.clone(), tuned_expected),
        _ => (tuned, tuned_expected),
    };
    TuningReport {
        day,
        config,
        expected,
        base_expected,
        accepted,
        forecast_queries_per_day,
        forecast_queries_per_day_range,
        days: (training.len(), validation.len()),
        schedule,
        tuning,
        simulations,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Rpu;
    use crate::reservoir::ReservoirConfig;
    use crate::scale::AutoscalerConfig;
    use crate::tune::batch::tests::{router, setup};

    /// 2024-05-27, a Monday.
    const MONDAY: i32 = 19_870;

    fn reservoir_with_daily_bursts(days: std::ops::Range<i32>) -> Reservoir {
        // Every day at 10:00, 60 queries of template 10 within two minutes.
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        for day in days {
            for i in 0..60 {
                reservoir.handle_arrival(i64::from(day) * 86_400 + 36_000 + i * 2, TemplateId(10));
            }
        }
        reservoir
    }

    fn small_config() -> TuningConfig {
        TuningConfig {
            forecast: ForecastConfig { scenarios: 5, ..ForecastConfig::default() },
            scheduler: SchedulerConfig { rounds: 2, sizes: vec![Rpu(16), Rpu(32)], ..SchedulerConfig::default() },
            tuner: TunerConfig { strategy: TuneStrategy::Random { budget: 2 }, ..TunerConfig::default() },
        }
    }

    #[test]
    fn history_of_a_recurring_burst_yields_a_spinup_planned_ahead_of_it() {
        let reservoir = reservoir_with_daily_bursts(MONDAY - 7..MONDAY);
        let slos = SloBook { by_template: BTreeMap::new(), default: Duration::from_secs(30) };
        let base = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
        let mut phases = Vec::new();
        let report = tune_pool(&reservoir, MONDAY, MONDAY - 7..MONDAY, &slos, &setup(2), &router(), &base, &small_config(), &mut |p| phases.push(p));
        assert_eq!(phases, vec![TuningPhase::Forecasting, TuningPhase::Scheduling, TuningPhase::Configuring, TuningPhase::Done]);
        assert_eq!(report.days, (3, 2));
        assert!((report.forecast_queries_per_day - 60.0).abs() < 1e-9);
        // Every past day alike: every forecast day alike.
        assert_eq!(report.forecast_queries_per_day_range, (60, 60));
        let first = report.config.spinups.first().expect("a planned spinup").at.as_secs_f64();
        assert!((35_000.0..36_300.0).contains(&first), "planned at {first}");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 6, ..Default::default() })]

        #[test]
        fn the_chosen_configuration_never_validates_worse_than_the_base(idle_s in 60u64..3_000, trigger in 0.02f64..0.3, burst_days in 2i32..8) {
            let reservoir = reservoir_with_daily_bursts(MONDAY - burst_days..MONDAY);
            let slos = SloBook { by_template: BTreeMap::new(), default: Duration::from_secs(30) };
            let knobs = AutoscalerConfig { idle_teardown: Duration::from_secs(idle_s), trigger_target: trigger, ..AutoscalerConfig::default() };
            let base = ExecutionConfig { spinups: Vec::new(), knobs };
            let config = small_config();
            let report = tune_pool(&reservoir, MONDAY, MONDAY - burst_days..MONDAY, &slos, &setup(2), &router(), &base, &config, &mut |_| {});
            let base_expected = report.base_expected.expect("validation days");
            proptest::prop_assert_ne!(report.expected.cmp_with_target(&base_expected, config.tuner.target), std::cmp::Ordering::Greater);
            if report.accepted {
                proptest::prop_assert_eq!(report.expected.cmp_with_target(&base_expected, config.tuner.target), std::cmp::Ordering::Less);
            } else {
                proptest::prop_assert_eq!(&report.config, &base);
                proptest::prop_assert_eq!(report.expected, base_expected);
            }
        }
    }

    #[test]
    fn without_history_the_base_configuration_comes_back() {
        let reservoir = Reservoir::new(ReservoirConfig::default());
        let slos = SloBook { by_template: BTreeMap::new(), default: Duration::from_secs(30) };
        let base = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
        let report = tune_pool(&reservoir, MONDAY, MONDAY..MONDAY, &slos, &setup(1), &router(), &base, &small_config(), &mut |_| {});
        assert!(report.config.spinups.is_empty());
        assert_eq!(report.forecast_queries_per_day, 0.0);
        assert!(!report.accepted && report.base_expected.is_none(), "nothing to validate on");
    }
}
