//! `[tune]` in a scenario file: the policy tuner evaluated on any
//! scenario or trace.
//!
//! With `[autoscale]` and `[tune]` (the keys of a node's `[pool.autoscale]`
//! and `[pool.tune]`), every case runs its workload's **last day** only,
//! the target, shifted to start at second 0; every policy runs that same
//! day. The days before it are the history the tuner reads, as a node's
//! reservoir would hold them: at most `history_days`, clamped to the days
//! the workload covers. The tuner forecasts the target day from them,
//! plans on the planner's warehouse (the slogate router's predictor and a
//! calibration learned from the training log, never the world), and the
//! policies that can plan then autoscale the target day with the tuned
//! configuration, or with `[autoscale]` itself when the tuner's validation
//! forecasts do not favour it. `every_hours` is a node's schedule and
//! means nothing here.

use serde::{Deserialize, Serialize};
use slogate_core::objective::Outcome;
use slogate_core::scale::{AutoscalerConfig, AutoscalerPolicy, ScheduledSpinup};
use slogate_core::time::{Duration, Instant};
use slogate_core::tune::{BatchSetup, Calibration, ExecutionConfig, PlannerTerms, SloBook, tune_pool};
use slogate_loadgen::workload::TraceEntry;

use super::{PoolTerms, build_policy_with, training_executions};
use crate::config::{AutoscaleSection, TuneSection};
use crate::tune::TraceHistory;
use crate::{Error, Result};

/// What the autoscaler runs a case with.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoscalePlan {
    /// The knobs.
    pub knobs: AutoscalerConfig,
    /// Which actions it may take.
    pub scaling: AutoscalerPolicy,
    /// Planned spinups, every day from second 0.
    pub spinups: Vec<ScheduledSpinup>,
}

impl AutoscalePlan {
    /// `[autoscale]` as written.
    pub fn from_section(section: &AutoscaleSection) -> Result<AutoscalePlan> {
        let (knobs, scaling) = section.to_core("autoscale").map_err(|e| Error::Scenario(e.to_string()))?;
        let spinups = section.schedule("autoscale").map_err(|e| Error::Scenario(e.to_string()))?;
        Ok(AutoscalePlan { knobs, scaling, spinups })
    }
}

/// One case's tuning run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseTuning {
    /// The case, as reports head it.
    pub case: String,
    /// The target: the workload's last day (index from day 0).
    pub target_day: u32,
    /// Days of history the tuner read (the ones before the target).
    pub history_days: u32,
    /// The configuration the policies that can plan ran with.
    pub config: ExecutionConfig,
    /// Its expected VR and cost per day on the validation forecasts.
    pub expected: Outcome,
    /// `[autoscale]`'s, on the same forecasts.
    pub base_expected: Option<Outcome>,
    /// Whether the tuned configuration beat `[autoscale]` there.
    pub accepted: bool,
    /// Forecast queries per day, on average.
    pub forecast_queries_per_day: f64,
    /// Simulations the tuner ran.
    pub simulations: usize,
}

/// The workload's last day with an arrival (index from day 0); an error if
/// it has no day before it to learn from.
pub fn target_day(entries: &[TraceEntry], workload: &str) -> Result<u32> {
    let last_s = entries.iter().map(|e| e.arrival.as_secs_f64()).fold(0.0, f64::max);
    let day = (last_s / 86_400.0).floor() as u32;
    if day == 0 {
        return Err(Error::Scenario(format!(
            "[tune] tunes a workload's last day from the days before it, but workload {workload} spans one day; give it more days (a longer trace, or a generator with more hours)"
        )));
    }
    Ok(day)
}

/// The target day's entries, shifted to start at second 0.
pub fn day_entries(entries: &[TraceEntry], day: u32) -> Vec<TraceEntry> {
    let start_s = f64::from(day) * 86_400.0;
    entries
        .iter()
        .filter(|e| (start_s..start_s + 86_400.0).contains(&e.arrival.as_secs_f64()))
        .map(|e| TraceEntry { arrival: Instant::from_secs_f64(e.arrival.as_secs_f64() - start_s), ..e.clone() })
        .collect()
}

/// Tunes `case`'s autoscaler for day `target` of `entries` from the days
/// before it, starting from `base` on `clusters`, planning with the
/// slogate router on the pool's `terms` (its elastic tier and violation
/// budget).
#[allow(clippy::too_many_arguments)]
pub fn tune_case(
    case: &str,
    entries: &[TraceEntry],
    target: u32,
    clusters: &[u32],
    base: &AutoscalePlan,
    section: &TuneSection,
    terms: &PoolTerms,
    seed: u64,
) -> Result<CaseTuning> {
    let elastic = terms.elastic.as_ref();
    let before: Vec<TraceEntry> = entries.iter().filter(|e| e.arrival.as_secs_f64() < f64::from(target) * 86_400.0).cloned().collect();
    let history = TraceHistory::of(&before);
    let config = section.to_core("tune", seed).map_err(|e| Error::Scenario(e.to_string()))?;
    let mut sizes = clusters.to_vec();
    sizes.extend(base.knobs.sizes.iter().map(|s| s.0));
    let log = training_executions(&sizes, seed);
    let observations: Vec<_> = log.iter().map(slogate_core::reservoir::ExecutionRecord::observation).collect();
    let planner = build_policy_with("slogate", &observations, terms)?
        .fork_planner()
        .ok_or_else(|| Error::Scenario("the slogate router cannot plan".into()))?;
    let setup = BatchSetup {
        initial_clusters: clusters.iter().copied().map(slogate_core::model::Rpu).collect(),
        policy: base.scaling,
        billing: slogate_core::billing::BillingConfig::default(),
        terms: PlannerTerms {
            spinup_delay: base.knobs.spinup_delay,
            elastic: elastic.map(|e| e.config.clone()),
            calibration: Calibration::learn(planner.fork_predictor().as_ref(), &log),
            ..PlannerTerms::default()
        },
        threads: section.threads,
    };
    let day = history.first_day + target as i32;
    let history_days = section.history_days.min(target);
    let slos = SloBook { by_template: history.slos, default: Duration::from_secs(60) };
    let base_config = ExecutionConfig { spinups: base.spinups.clone(), knobs: base.knobs.clone() };
    let report = tune_pool(&history.reservoir, day, day - history_days as i32..day, &slos, &setup, planner.as_ref(), &base_config, &config, &mut |_| {});
    Ok(CaseTuning {
        case: case.to_owned(),
        target_day: target,
        history_days,
        config: report.config,
        expected: report.expected,
        base_expected: report.base_expected,
        accepted: report.accepted,
        forecast_queries_per_day: report.forecast_queries_per_day,
        simulations: report.simulations,
    })
}

impl CaseTuning {
    /// The plan the policies that can plan run with.
    pub fn plan(&self, base: &AutoscalePlan) -> AutoscalePlan {
        AutoscalePlan { knobs: self.config.knobs.clone(), scaling: base.scaling, spinups: self.config.spinups.clone() }
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        let verdict = match (self.accepted, self.base_expected) {
            (true, Some(b)) => format!("accepted over [autoscale] (expected {:.1}% ${:.2})", b.violations * 100.0, b.cost_usd),
            (false, Some(b)) => format!("[autoscale] kept: nothing tuned beat its {:.1}% ${:.2}", b.violations * 100.0, b.cost_usd),
            (_, None) => "[autoscale] kept: no validation forecasts".to_owned(),
        };
        format!(
            "tuned day {} from {} days ({:.0} forecast queries/day, {} simulations): {}; expected VR {:.1}% ${:.2}; {verdict}",
            self.target_day,
            self.history_days,
            self.forecast_queries_per_day,
            self.simulations,
            self.config.describe(),
            self.expected.violations * 100.0,
            self.expected.cost_usd,
        )
    }
}
