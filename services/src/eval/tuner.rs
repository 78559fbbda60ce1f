//! `slogate eval tuner-table5`: the policy tuner's evaluation (AutoSLO
//! §8.7, Table 5) on the emulated warehouse.
//!
//! A multi-day diurnal workload from loadgen (weekday/weekend profile,
//! dashboard refreshes every 15 minutes in office hours, a nightly batch,
//! random bursts, a drifting template mix) runs over 60 days starting on a
//! Monday. Two target days (Tuesdays, days 36 and 57) are held out: the
//! tuner never sees them. For each target day and κ ∈ {2, 4}, the tuner is
//! given no past data, or the 1, 7 or 30 days before the target through the
//! reservoir's tables, forecasts the target day, and produces an execution
//! configuration (planned spinups and autoscaler knobs) by simulating the
//! forecasts on the planner's warehouse. The target day then runs once in
//! the emulated world per configuration: one warm 16-RPU cluster, slogate's
//! router (warmed on a training run, as in the other evaluations) and the
//! autoscaler with the configuration. VR and cost are over the whole target
//! day.
//!
//! The printed table is deterministic for a seed; tuning wall-clock times
//! are printed separately.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{PoolId, Query, Rpu, Template};
use slogate_core::objective::Outcome;
use slogate_core::reservoir::{Reservoir, ReservoirConfig};
use slogate_core::scale::{Autoscaler, AutoscalerConfig, AutoscalerPolicy, ScaleDecision};
use slogate_core::sim::Simulation;
use slogate_core::time::{Duration, Instant};
use slogate_core::tune::{BatchSetup, Calibration, ExecutionConfig, PLANNING_TARGET, PlannerTerms, RunOutcome, SloBook, TuningConfig, TuningReport, aggregate, simulate_batch, tune_pool};
use slogate_world::World;
use slogate_loadgen::workload::{DiurnalConfig, TraceEntry, assign_slos, diurnal_workload, to_queries};

use slogate_core::route::PlanningRouter;
use slogate_core::route::elastic::ElasticOptions;

use super::{PoolTerms, Scenario, build_policy_with, training_executions};
use slogate_core::reservoir::ExecutionRecord;
use crate::{Error, Result};

/// Days since 1970-01-01 of the workload's day 0, a Monday (2024-04-01).
pub const FIRST_DAY: i32 = 19_814;

/// Days of workload generated.
pub const WORKLOAD_DAYS: u32 = 60;

/// The held-out target days (workload day indices, both Tuesdays, so that
/// one day of history is a weekday too).
pub const TARGET_DAYS: [u32; 2] = [36, 57];

/// Arrivals per hour at a weekday's peak.
pub const PEAK_QUERIES_PER_HOUR: f64 = 360.0;

/// Days of history the tuner is given, in column order.
pub const HISTORIES: [u32; 4] = [0, 1, 7, 30];

/// The SLO tightness values.
pub const KAPPAS: [f64; 2] = [4.0, 2.0];

/// The pool's starting cluster, RPU.
pub const START_RPU: u32 = 16;

/// One cell of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunerCell {
    /// The target day's workload index.
    pub target_day: u32,
    /// SLO tightness.
    pub kappa: f64,
    /// Days of history given.
    pub history_days: u32,
    /// The tuned configuration.
    pub config: ExecutionConfig,
    /// What the tuner expected on its validation forecasts.
    pub expected: Outcome,
    /// What it expected of the base configuration there (none without
    /// validation days).
    pub base_expected: Option<Outcome>,
    /// Whether the tuned configuration beat the base there and was used.
    pub accepted: bool,
    /// The configuration on the planner's warehouse over the target day's
    /// real queries: what the planner would have said with a perfect
    /// forecast.
    pub planner_actual: Outcome,
    /// The target day's VR in the world.
    pub violation_rate: f64,
    /// Its cost, dollars.
    pub cost_usd: f64,
    /// Its queries.
    pub queries: usize,
    /// Spinups during the day (planned and reactive).
    pub spinups: usize,
    /// Simulations the tuner ran.
    pub simulations: usize,
    /// The tuner's wall-clock seconds (not a pure function of the seed).
    pub tuning_s: f64,
}

/// The report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunerReport {
    /// The seed.
    pub seed: u64,
    /// Every cell.
    pub cells: Vec<TunerCell>,
}

/// The workload's entries, SLOs at `kappa`.
pub fn workload(templates: &[Template], kappa: f64, seed: u64) -> Result<Vec<TraceEntry>> {
    let config = DiurnalConfig { days: WORKLOAD_DAYS, first_weekday: 0, peak_queries_per_hour: PEAK_QUERIES_PER_HOUR, seed, ..DiurnalConfig::default() };
    let mut entries = diurnal_workload(templates, &config).map_err(|e| Error::Scenario(e.to_string()))?;
    assign_slos(&mut entries, templates, kappa).map_err(|e| Error::Scenario(e.to_string()))?;
    Ok(entries)
}

/// The reservoir holding the arrivals of workload days `history`.
fn reservoir_of(entries: &[TraceEntry], history: std::ops::Range<u32>) -> Reservoir {
    let mut reservoir = Reservoir::new(ReservoirConfig::default());
    let from = f64::from(history.start) * 86_400.0;
    let to = f64::from(history.end) * 86_400.0;
    for entry in entries.iter().filter(|e| (from..to).contains(&e.arrival.as_secs_f64())) {
        let unix_secs = i64::from(FIRST_DAY) * 86_400 + entry.arrival.as_secs_f64().floor() as i64;
        reservoir.handle_arrival(unix_secs, entry.template);
    }
    reservoir
}

/// Workload day `day`'s queries, from the day's start.
pub fn day_queries(entries: &[TraceEntry], day: u32) -> Result<Vec<Query>> {
    let start = f64::from(day) * 86_400.0;
    let shifted: Vec<TraceEntry> = entries
        .iter()
        .filter(|e| (start..start + 86_400.0).contains(&e.arrival.as_secs_f64()))
        .map(|e| TraceEntry { arrival: Instant::from_secs_f64(e.arrival.as_secs_f64() - start), ..e.clone() })
        .collect();
    Ok(to_queries(&shifted, &PoolId::default())?)
}

/// The tuner's settings here: the defaults, with the knob space and
/// rounds sized for a 2-core machine.
pub fn tuning_config(seed: u64) -> TuningConfig {
    let mut config = TuningConfig::default();
    config.forecast.seed = seed;
    config.scheduler.sizes = vec![Rpu(8), Rpu(16), Rpu(32)];
    config.tuner.seed = seed;
    config
}

/// The batch setup of a pool starting from one warm 16-RPU cluster, with
/// the elastic tier if `elastic`, calibrated by `calibration`.
pub fn batch_setup(elastic: Option<&ElasticOptions>, calibration: &Calibration) -> BatchSetup {
    BatchSetup {
        initial_clusters: vec![Rpu(START_RPU)],
        policy: AutoscalerPolicy::SLOGATE,
        billing: BillingConfig::default(),
        terms: PlannerTerms { elastic: elastic.map(|e| e.config.clone()), calibration: calibration.clone(), ..PlannerTerms::default() },
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
    }
}

/// The slogate router warmed on `history`, on the pool's `terms` (the
/// elastic tier and the violation budget are the ones that apply).
fn router(history: &[slogate_core::predict::Observation], terms: &PoolTerms) -> Result<Box<dyn slogate_core::route::RoutingPolicy>> {
    build_policy_with("slogate", history, terms)
}

/// Runs `queries` in the world from one warm 16-RPU cluster with `config`
/// on the pool's `terms` (the elastic tier if it has one): VR, cost,
/// spinups and the elastic tier's part of the cost.
pub fn run_day(queries: &[Query], config: &ExecutionConfig, history: &[slogate_core::predict::Observation], terms: &PoolTerms, seed: u64) -> Result<(f64, f64, usize, f64)> {
    run_day_with(queries, config, AutoscalerPolicy::SLOGATE, history, terms, seed)
}

/// [`run_day`] under autoscaling `policy`.
pub fn run_day_with(
    queries: &[Query],
    config: &ExecutionConfig,
    policy: AutoscalerPolicy,
    history: &[slogate_core::predict::Observation],
    terms: &PoolTerms,
    seed: u64,
) -> Result<(f64, f64, usize, f64)> {
    let mut world = World::seeded_with_ready(seed, &[START_RPU]);
    if let Some(options) = &terms.elastic {
        world.set_elastic(options.config.clone());
    }
    let router = router(history, terms)?;
    let autoscaler = Rc::new(RefCell::new(
        Autoscaler::new(config.knobs.clone(), policy, BillingConfig::default()).with_schedule(config.spinups.clone()),
    ));
    let mut sim = Simulation::new(world, router, queries.to_vec()).with_controller(Box::new(Rc::clone(&autoscaler)));
    sim.drive_until_idle();
    let summary = sim.summary();
    let spinups = autoscaler.borrow().decisions().filter(|d| matches!(d, ScaleDecision::SpinUp { .. })).count();
    Ok((summary.violation_rate, summary.cost_usd, spinups, summary.elastic_cost_usd))
}

/// The planner's replay of `config` on `queries` (a real day: the plan
/// without the forecast's error), on `setup`'s pool.
pub fn replay_day(setup: &BatchSetup, planner: &dyn PlanningRouter, config: &ExecutionConfig, queries: &[Query]) -> RunOutcome {
    simulate_batch(setup, planner, std::slice::from_ref(config), std::slice::from_ref(&queries.to_vec())).swap_remove(0).swap_remove(0)
}

/// The planner the tuner plans with: a fork of the slogate router warmed
/// on `history`, on the pool's `terms`.
pub fn planner_for(history: &[slogate_core::predict::Observation], terms: &PoolTerms) -> Result<Box<dyn PlanningRouter>> {
    router(history, terms)?.fork_planner().ok_or_else(|| Error::Scenario("slogate cannot plan".into()))
}

/// The training log's observations, and the planner's calibration learned
/// from the log against the predictor they warm.
pub fn learn_from(log: &[ExecutionRecord]) -> Result<(Vec<slogate_core::predict::Observation>, Calibration)> {
    let history: Vec<_> = log.iter().map(ExecutionRecord::observation).collect();
    let calibration = Calibration::learn(planner_for(&history, &PoolTerms::default())?.fork_predictor().as_ref(), log);
    Ok((history, calibration))
}

/// Tunes for `target` from `history_days` days of `entries` (with the
/// pool's `terms`: the elastic tier if it has one, and the violation
/// budget the router spends).
#[allow(clippy::too_many_arguments)]
pub fn tune_for(
    entries: &[TraceEntry],
    templates: &[Template],
    kappa: f64,
    target: u32,
    history_days: u32,
    history: &[slogate_core::predict::Observation],
    calibration: &Calibration,
    terms: &PoolTerms,
    seed: u64,
) -> Result<TuningReport> {
    let reservoir = reservoir_of(entries, target.saturating_sub(history_days)..target);
    let slos = SloBook {
        by_template: templates.iter().map(|t| (t.id, t.baseline_latency.mul_f64(kappa))).collect::<BTreeMap<_, _>>(),
        default: Duration::from_secs(60),
    };
    let planner = planner_for(history, terms)?;
    let day = FIRST_DAY + target as i32;
    let base = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
    Ok(tune_pool(&reservoir, day, day - history_days as i32..day, &slos, &batch_setup(terms.elastic.as_ref(), calibration), planner.as_ref(), &base, &tuning_config(seed), &mut |_| {}))
}

/// The whole table.
pub fn run(seed: u64) -> Result<TunerReport> {
    let templates = Scenario::templates();
    let (history, calibration) = learn_from(&training_executions(&[4, 8, 16, 32], seed))?;
    let planner = planner_for(&history, &PoolTerms::default())?;
    let setup = batch_setup(None, &calibration);
    let mut cells = Vec::new();
    for &kappa in &KAPPAS {
        let entries = workload(&templates, kappa, seed)?;
        for &target in &TARGET_DAYS {
            let queries = day_queries(&entries, target)?;
            for &history_days in &HISTORIES {
                let started = std::time::Instant::now();
                let report = tune_for(&entries, &templates, kappa, target, history_days, &history, &calibration, &PoolTerms::default(), seed)?;
                let tuning_s = started.elapsed().as_secs_f64();
                let (violation_rate, cost_usd, spinups, _) = run_day(&queries, &report.config, &history, &PoolTerms::default(), seed)?;
                let planner_actual = aggregate(&[replay_day(&setup, planner.as_ref(), &report.config, &queries)]);
                cells.push(TunerCell {
                    target_day: target,
                    kappa,
                    history_days,
                    config: report.config,
                    expected: report.expected,
                    base_expected: report.base_expected,
                    accepted: report.accepted,
                    planner_actual,
                    violation_rate,
                    cost_usd,
                    queries: queries.len(),
                    spinups,
                    simulations: report.simulations,
                    tuning_s,
                });
            }
        }
    }
    Ok(TunerReport { seed, cells })
}

/// Per history length: the mean relative change in VR and cost against no
/// past data, over the (day, κ) rows.
pub fn mean_delta(report: &TunerReport) -> Vec<(u32, f64, f64)> {
    HISTORIES[1..]
        .iter()
        .map(|&h| {
            let pairs: Vec<(&TunerCell, &TunerCell)> = report
                .cells
                .iter()
                .filter(|c| c.history_days == h)
                .filter_map(|c| report.cells.iter().find(|b| b.history_days == 0 && b.target_day == c.target_day && b.kappa == c.kappa).map(|b| (b, c)))
                .collect();
            let relative = |f: &dyn Fn(&TunerCell) -> f64| {
                let v: Vec<f64> = pairs.iter().filter(|(b, _)| f(b) > 0.0).map(|(b, c)| f(c) / f(b) - 1.0).collect();
                if v.is_empty() { 0.0 } else { v.iter().sum::<f64>() / v.len() as f64 }
            };
            (h, relative(&|c| c.violation_rate), relative(&|c| c.cost_usd))
        })
        .collect()
}

/// Why a tuned configuration did what it did in the world, against the
/// base configuration (the no-past-data cell of the same day and κ), under
/// the tuner's own objective, BestWithTarget at [`PLANNING_TARGET`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Attribution {
    /// The validation forecasts did not favour the tuned configuration, so
    /// the base was kept.
    BaseKept,
    /// Accepted, and not worse than the base in the world.
    NotWorse,
    /// Worse in the world, and the planner on the day's real queries says
    /// so too: the forecasts misled it (a perfect forecast would not
    /// have).
    Forecast,
    /// Worse in the world, though the planner on the day's real queries
    /// says it is better: the planner's model of the cluster misled it.
    Planner,
}

impl Attribution {
    /// The label in the table.
    pub fn label(self) -> &'static str {
        match self {
            Attribution::BaseKept => "base kept",
            Attribution::NotWorse => "not worse",
            Attribution::Forecast => "worse: forecast",
            Attribution::Planner => "worse: planner",
        }
    }
}

/// `cell`'s attribution against `base`, its no-past-data cell.
pub fn attribute(cell: &TunerCell, base: &TunerCell) -> Attribution {
    if !cell.accepted {
        return Attribution::BaseKept;
    }
    let world = |c: &TunerCell| Outcome { violations: c.violation_rate, cost_usd: c.cost_usd };
    if world(cell).cmp_with_target(&world(base), PLANNING_TARGET) != std::cmp::Ordering::Greater {
        return Attribution::NotWorse;
    }
    if cell.planner_actual.cmp_with_target(&base.planner_actual, PLANNING_TARGET) == std::cmp::Ordering::Greater {
        Attribution::Forecast
    } else {
        Attribution::Planner
    }
}

/// Every cell with history, with its no-past-data cell and attribution.
pub fn attributions(report: &TunerReport) -> Vec<(&TunerCell, &TunerCell, Attribution)> {
    report
        .cells
        .iter()
        .filter(|c| c.history_days > 0)
        .filter_map(|c| {
            let base = report.cells.iter().find(|b| b.history_days == 0 && b.target_day == c.target_day && b.kappa == c.kappa)?;
            Some((c, base, attribute(c, base)))
        })
        .collect()
}

impl super::seeds::SeedFigures for TunerReport {
    /// Per cell: VR, cost and the planner's expected VR; then per history
    /// length the mean Δ against no past data, and the worst cell's VR Δ
    /// (above zero: some cell got worse with history).
    fn figures(&self) -> Vec<super::seeds::Figure> {
        use super::seeds::{Figure, Unit};
        let mut figures = Vec::new();
        for c in &self.cells {
            let row = format!("day {} κ={} past {} days", c.target_day, c.kappa, c.history_days);
            figures.push(Figure::lower(row.clone(), "VR", c.violation_rate, Unit::Percent));
            figures.push(Figure::lower(row.clone(), "expected VR", c.expected.violations, Unit::Percent));
            figures.push(Figure::lower(row, "cost", c.cost_usd, Unit::Usd));
        }
        for (history_days, vr, cost) in mean_delta(self) {
            let row = format!("mean Δ vs no past data  past {history_days} days");
            figures.push(Figure::lower(row.clone(), "VR Δ", vr, Unit::Change));
            figures.push(Figure::lower(row.clone(), "cost Δ", cost, Unit::Change));
            let worst_cell = self
                .cells
                .iter()
                .filter(|c| c.history_days == history_days)
                .filter_map(|c| {
                    let none = self.cells.iter().find(|b| b.history_days == 0 && b.target_day == c.target_day && b.kappa == c.kappa)?;
                    (none.violation_rate > 0.0).then(|| c.violation_rate / none.violation_rate - 1.0)
                })
                .fold(f64::NEG_INFINITY, f64::max);
            if worst_cell.is_finite() {
                figures.push(Figure::lower(row.clone(), "worst cell VR Δ", worst_cell, Unit::Change));
            }
            let verdicts: Vec<Attribution> = attributions(self).into_iter().filter(|(c, _, _)| c.history_days == history_days).map(|(_, _, a)| a).collect();
            let count = |wanted: Attribution| verdicts.iter().filter(|a| **a == wanted).count() as f64;
            figures.push(Figure::lower(row.clone(), "cells worse than none: forecast", count(Attribution::Forecast), Unit::Number));
            figures.push(Figure::lower(row.clone(), "cells worse than none: planner", count(Attribution::Planner), Unit::Number));
            figures.push(Figure::lower(row, "cells where the base was kept", count(Attribution::BaseKept), Unit::Number));
        }
        figures
    }
}

/// The table, as AutoSLO's Table 5 lays it out.
pub fn render(report: &TunerReport) -> String {
    let mut out = String::new();
    writeln!(out, "scenario tuner-table5  seed {}  (diurnal workload, {} days from a Monday; target days held out)", report.seed, WORKLOAD_DAYS).expect("write to String");
    write!(out, "\n{:<5} {:>3}", "day", "κ").expect("write to String");
    for h in HISTORIES {
        let label = match h {
            0 => "no past data".to_owned(),
            1 => "past 1 day".to_owned(),
            n => format!("past {n} days"),
        };
        write!(out, " {label:>18}").expect("write to String");
    }
    writeln!(out).expect("write to String");
    write!(out, "{:<5} {:>3}", "", "").expect("write to String");
    for _ in HISTORIES {
        write!(out, " {:>7} {:>10}", "VR", "cost $").expect("write to String");
    }
    writeln!(out).expect("write to String");
    for &target in &TARGET_DAYS {
        for &kappa in &KAPPAS {
            write!(out, "{target:<5} {kappa:>3}").expect("write to String");
            for h in HISTORIES {
                match report.cells.iter().find(|c| c.target_day == target && c.kappa == kappa && c.history_days == h) {
                    Some(c) => write!(out, " {:>6.1}% {:>10.3}", c.violation_rate * 100.0, c.cost_usd).expect("write to String"),
                    None => write!(out, " {:>18}", "-").expect("write to String"),
                }
            }
            writeln!(out).expect("write to String");
        }
    }
    write!(out, "{:<9}", "mean Δ").expect("write to String");
    write!(out, " {:>18}", "—").expect("write to String");
    for (_, vr, cost) in mean_delta(report) {
        write!(out, " {:>+6.1}% {:>+9.1}%", vr * 100.0, cost * 100.0).expect("write to String");
    }
    writeln!(out).expect("write to String");
    writeln!(out, "\nplanned spinups and knobs per cell:").expect("write to String");
    for c in &report.cells {
        writeln!(
            out,
            "  day {} κ={} past {:>2}: {}; {}; {} spinups in the day",
            c.target_day,
            c.kappa,
            c.history_days,
            c.config.describe(),
            match (c.base_expected, c.accepted) {
                (None, _) => "nothing forecast: the base configuration".to_owned(),
                (Some(_), true) => format!("expected VR {:.1}% ${:.3}, accepted", c.expected.violations * 100.0, c.expected.cost_usd),
                (Some(_), false) => format!("expected VR {:.1}% ${:.3}, base kept", c.expected.violations * 100.0, c.expected.cost_usd),
            },
            c.spinups
        )
        .expect("write to String");
    }
    writeln!(
        out,
        "\nagainst no past data (BestWithTarget at {:.0}%): forecasts, planner on the day's real queries, world:",
        PLANNING_TARGET * 100.0
    )
    .expect("write to String");
    for (c, base, attribution) in attributions(report) {
        let forecasts = c.base_expected.map_or_else(|| "-".to_owned(), |b| format!("{:.1}% ${:.2} vs {:.1}% ${:.2}", c.expected.violations * 100.0, c.expected.cost_usd, b.violations * 100.0, b.cost_usd));
        writeln!(
            out,
            "  day {} κ={} past {:>2}: forecasts {forecasts}; planner {:.1}% ${:.2} vs {:.1}% ${:.2}; world {:.1}% ${:.2} vs {:.1}% ${:.2}: {}",
            c.target_day,
            c.kappa,
            c.history_days,
            c.planner_actual.violations * 100.0,
            c.planner_actual.cost_usd,
            base.planner_actual.violations * 100.0,
            base.planner_actual.cost_usd,
            c.violation_rate * 100.0,
            c.cost_usd,
            base.violation_rate * 100.0,
            base.cost_usd,
            attribution.label()
        )
        .expect("write to String");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tuner_sees_only_its_history_days_and_the_target_day_starts_at_zero() {
        let templates = Scenario::templates();
        let entries = workload(&templates, 4.0, 3).unwrap();
        let target = TARGET_DAYS[0];
        let reservoir = reservoir_of(&entries, target - 7..target);
        let seen: u64 = reservoir.hours().map(|h| reservoir.arrivals_in(h).0).sum();
        let expected = entries.iter().filter(|e| (f64::from(target - 7) * 86_400.0..f64::from(target) * 86_400.0).contains(&e.arrival.as_secs_f64())).count();
        assert_eq!(seen as usize, expected);
        assert!(reservoir.hours().all(|h| (FIRST_DAY + target as i32 - 7..FIRST_DAY + target as i32).contains(&h.day)));
        let day = day_queries(&entries, target).unwrap();
        assert!(!day.is_empty() && day.iter().all(|q| q.arrival.as_secs_f64() < 86_400.0));
    }

    #[test]
    fn mean_delta_is_relative_to_no_past_data_per_row() {
        let cell = |history_days, violation_rate, cost_usd| TunerCell {
            target_day: 36,
            kappa: 4.0,
            history_days,
            config: ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() },
            expected: Outcome { violations: 0.0, cost_usd: 0.0 },
            base_expected: None,
            accepted: history_days > 0,
            planner_actual: Outcome { violations: violation_rate, cost_usd },
            violation_rate,
            cost_usd,
            queries: 1,
            spinups: 0,
            simulations: 0,
            tuning_s: 0.0,
        };
        let report = TunerReport { seed: 1, cells: vec![cell(0, 0.2, 100.0), cell(1, 0.1, 110.0), cell(7, 0.05, 90.0), cell(30, 0.2, 100.0)] };
        let deltas = mean_delta(&report);
        assert_eq!(deltas.len(), 3);
        assert!((deltas[0].1 + 0.5).abs() < 1e-12 && (deltas[0].2 - 0.1).abs() < 1e-12, "{deltas:?}");
        assert!((deltas[1].1 + 0.75).abs() < 1e-12 && (deltas[1].2 + 0.1).abs() < 1e-12);
        assert!(render(&report).contains("past 30 days"));
    }

    #[test]
    fn a_cell_worse_than_no_past_data_is_blamed_on_the_forecast_only_when_the_planner_agrees_on_the_real_day() {
        let cell = |history_days, accepted, world: (f64, f64), planner: (f64, f64)| TunerCell {
            target_day: 36,
            kappa: 2.0,
            history_days,
            config: ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() },
            expected: Outcome { violations: 0.0, cost_usd: 0.0 },
            base_expected: None,
            accepted,
            planner_actual: Outcome { violations: planner.0, cost_usd: planner.1 },
            violation_rate: world.0,
            cost_usd: world.1,
            queries: 1,
            spinups: 0,
            simulations: 0,
            tuning_s: 0.0,
        };
        let base = cell(0, false, (0.03, 100.0), (0.03, 100.0));
        assert_eq!(attribute(&cell(1, false, (0.2, 90.0), (0.2, 90.0)), &base), Attribution::BaseKept);
        assert_eq!(attribute(&cell(1, true, (0.04, 95.0), (0.2, 90.0)), &base), Attribution::NotWorse, "cheaper under the target");
        assert_eq!(attribute(&cell(1, true, (0.07, 95.0), (0.08, 95.0)), &base), Attribution::Forecast);
        assert_eq!(attribute(&cell(1, true, (0.07, 95.0), (0.04, 95.0)), &base), Attribution::Planner);
    }
}
