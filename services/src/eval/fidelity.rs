//! `slogate eval planner-fidelity`: how closely the planner's warehouse
//! tracks the emulated world, on the same day and configuration.
//!
//! The tuner can only be as good as its model of the cluster. For each κ
//! and `tuner-table5` target day, this runs the day's real queries (no
//! forecast error) once in the world and once on the planner's warehouse
//! ([`slogate_core::tune::PredictedWarehouse`], through SimulateBatch),
//! under two configurations: one 16-RPU cluster that never scales (the
//! cluster model alone) and the default autoscaler (the model under cluster
//! churn). The planner knows only the router's predictor and its
//! calibration ([`slogate_core::tune::Calibration`]: admission slots and
//! the latency spread), both learned from the training log, as in the
//! tuner's evaluation.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use slogate_core::scale::{AutoscalerConfig, AutoscalerPolicy, SpinupPolicy};
use slogate_core::tune::{Calibration, ExecutionConfig};

use super::tuner::{KAPPAS, TARGET_DAYS, batch_setup, day_queries, planner_for, replay_day, run_day_with, workload};
use super::{Scenario, training_executions};
use crate::Result;

/// One (κ, day, configuration) comparison.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FidelityRow {
    /// SLO tightness.
    pub kappa: f64,
    /// The target day.
    pub target_day: u32,
    /// `fixed-16` or `autoscaled`.
    pub configuration: String,
    /// Queries in the day.
    pub queries: usize,
    /// VR in the world.
    pub world_violation_rate: f64,
    /// VR on the planner's warehouse.
    pub planner_violation_rate: f64,
    /// Cost in the world, dollars.
    pub world_cost_usd: f64,
    /// Cost on the planner's warehouse, dollars.
    pub planner_cost_usd: f64,
    /// Spinups in the world.
    pub world_spinups: usize,
    /// Spinups on the planner's warehouse.
    pub planner_spinups: u64,
}

/// The report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FidelityReport {
    /// The seed.
    pub seed: u64,
    /// What the planner learned from the training log.
    pub calibration: Calibration,
    /// Every comparison.
    pub rows: Vec<FidelityRow>,
}

/// Runs every comparison.
pub fn run(seed: u64) -> Result<FidelityReport> {
    let templates = Scenario::templates();
    let (history, calibration) = super::tuner::learn_from(&training_executions(&[4, 8, 16, 32], seed))?;
    let configurations = [
        ("fixed-16", AutoscalerPolicy { spinup: SpinupPolicy::Never, teardown: false, ..AutoscalerPolicy::SLOGATE }),
        ("autoscaled", AutoscalerPolicy::SLOGATE),
    ];
    let config = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
    let planner = planner_for(&history, &super::PoolTerms::default())?;
    let mut rows = Vec::new();
    for &kappa in &KAPPAS {
        let entries = workload(&templates, kappa, seed)?;
        for &target in &TARGET_DAYS {
            let queries = day_queries(&entries, target)?;
            for (name, policy) in configurations {
                let (world_violation_rate, world_cost_usd, world_spinups, _) = run_day_with(&queries, &config, policy, &history, &super::PoolTerms::default(), seed)?;
                let setup = slogate_core::tune::BatchSetup { policy, ..batch_setup(None, &calibration) };
                let outcome = replay_day(&setup, planner.as_ref(), &config, &queries);
                rows.push(FidelityRow {
                    kappa,
                    target_day: target,
                    configuration: name.to_owned(),
                    queries: queries.len(),
                    world_violation_rate,
                    planner_violation_rate: outcome.violation_rate(),
                    world_cost_usd,
                    planner_cost_usd: outcome.cost_usd,
                    world_spinups,
                    planner_spinups: outcome.spinups,
                });
            }
        }
    }
    Ok(FidelityReport { seed, calibration, rows })
}

impl super::seeds::SeedFigures for FidelityReport {
    /// Per row: VR in the world and on the planner, and the planner's error
    /// (planner − world, in points; the absolute value is the miss).
    fn figures(&self) -> Vec<super::seeds::Figure> {
        use super::seeds::{Figure, Unit};
        let mut figures = Vec::new();
        for r in &self.rows {
            let row = format!("day {} κ={}  {}", r.target_day, r.kappa, r.configuration);
            figures.push(Figure::lower(row.clone(), "world VR", r.world_violation_rate, Unit::Percent));
            figures.push(Figure::lower(row.clone(), "planner VR", r.planner_violation_rate, Unit::Percent));
            figures.push(Figure::lower(row.clone(), "|planner − world| VR", (r.planner_violation_rate - r.world_violation_rate).abs(), Unit::Percent));
            figures.push(Figure::lower(row, "planner cost / world", r.planner_cost_usd / r.world_cost_usd.max(1e-9), Unit::Number));
        }
        figures
    }
}

/// The table.
pub fn render(report: &FidelityReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "scenario planner-fidelity  seed {}  (tuner-table5 target days, real queries, world vs planner)", report.seed);
    let _ = writeln!(out, "planner calibration: {}\n", report.calibration);
    let _ = writeln!(out, "{:<4} {:<4} {:<11} {:>7} {:>9} {:>9} {:>10} {:>10} {:>8} {:>8}", "κ", "day", "config", "queries", "VR world", "VR plan", "$ world", "$ plan", "up world", "up plan");
    for r in &report.rows {
        let _ = writeln!(
            out,
            "{:<4} {:<4} {:<11} {:>7} {:>8.1}% {:>8.1}% {:>10.3} {:>10.3} {:>8} {:>8}",
            r.kappa,
            r.target_day,
            r.configuration,
            r.queries,
            r.world_violation_rate * 100.0,
            r.planner_violation_rate * 100.0,
            r.world_cost_usd,
            r.planner_cost_usd,
            r.world_spinups,
            r.planner_spinups
        );
    }
    out
}

