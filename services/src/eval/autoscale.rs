//! `slogate eval size-table3` and `slogate eval trigger-table4`: the
//! autoscaler's evaluations (AutoSLO §8.5 and §8.6) on the emulated
//! warehouse.
//!
//! Each case starts from one warm cluster of 8 or 16 RPU under
//! BaseWorkload(λ ∈ {0.1, 0.2}) with SLOs κ ∈ {4, 2} times the baseline. The
//! router is slogate's SLO-aware router, warmed on a separate training run
//! on every candidate size; the autoscaler sees only the pool, its
//! observations and the router's predictions.
//!
//! - **size-table3**: the trigger is forced once, after 20% of the
//!   workload's arrivals; no other trigger and no teardown. VR and cost are
//!   measured over the last 20% of the queries (by arrival), cost from the
//!   first of them arriving until the end. Policies: No-Op, Horizontal
//!   (a copy of the existing size), Vertical (the selector's single
//!   replacement) and slogate (the selector adds a cluster).
//! - **trigger-table4**: VR and cost over the whole workload, teardown on,
//!   every trigger followed by slogate's size selector. Policies: No-Op,
//!   Queue@32, Observed (Algorithm 2 without projections) and slogate.
//!
//! The printed tables are deterministic for a seed. The selector's
//! wall-clock time per run (the slowest controller step) is only in the
//! JSON.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::time::Instant as WallInstant;

use serde::{Deserialize, Serialize};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{Pool, PoolId, Query};
use slogate_core::route::RoutingPolicy;
use slogate_core::scale::{Autoscaler, AutoscalerPolicy, ScaleAction, ScaleDecision, SpinupPolicy};
use slogate_core::scale::AutoscalerConfig;
use slogate_core::sim::{ClusterCommand, Controller, Observation as SimObservation, Simulation};
use slogate_core::time::Instant;
use slogate_world::World;
use slogate_loadgen::workload::{assign_slos, base_workload, to_queries};

use super::{Scenario, build_policy, training_observations};
use crate::{Error, Result};

/// Which experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Experiment {
    /// §8.5, Table 3.
    SizeTable3,
    /// §8.6, Table 4.
    TriggerTable4,
}

impl Experiment {
    /// By command-line name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "size-table3" => Some(Experiment::SizeTable3),
            "trigger-table4" => Some(Experiment::TriggerTable4),
            _ => None,
        }
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Experiment::SizeTable3 => "size-table3",
            Experiment::TriggerTable4 => "trigger-table4",
        }
    }

    /// The policies compared, in column order; the first is the baseline.
    pub fn policies(self) -> &'static [&'static str] {
        match self {
            Experiment::SizeTable3 => &["no-op", "horizontal", "vertical", "slogate"],
            Experiment::TriggerTable4 => &["no-op", "queue@32", "observed", "slogate"],
        }
    }

    fn policy(self, name: &str, arrivals: usize) -> Result<AutoscalerPolicy> {
        let forced = SpinupPolicy::Forced { after_arrivals: arrivals.div_ceil(5) };
        let policy = match (self, name) {
            (Experiment::SizeTable3, "no-op") => AutoscalerPolicy { spinup: SpinupPolicy::Never, action: ScaleAction::Select, teardown: false },
            (Experiment::SizeTable3, "horizontal") => AutoscalerPolicy { spinup: forced, action: ScaleAction::Horizontal, teardown: false },
            (Experiment::SizeTable3, "vertical") => AutoscalerPolicy { spinup: forced, action: ScaleAction::Vertical, teardown: false },
            (Experiment::SizeTable3, "slogate") => AutoscalerPolicy { spinup: forced, action: ScaleAction::Select, teardown: false },
            (Experiment::TriggerTable4, "no-op") => AutoscalerPolicy { spinup: SpinupPolicy::Never, action: ScaleAction::Select, teardown: true },
            (Experiment::TriggerTable4, "queue@32") => {
                AutoscalerPolicy { spinup: SpinupPolicy::QueueLength { threshold: 32 }, action: ScaleAction::Select, teardown: true }
            }
            (Experiment::TriggerTable4, "observed") => AutoscalerPolicy { spinup: SpinupPolicy::Observed, action: ScaleAction::Select, teardown: true },
            (Experiment::TriggerTable4, "slogate") => AutoscalerPolicy::SLOGATE,
            _ => {
                return Err(Error::UnknownPolicy { name: name.to_owned(), known: self.policies().join(", ") });
            }
        };
        Ok(policy)
    }
}

/// One case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleCase {
    /// BaseWorkload's arrival rate.
    pub lambda: f64,
    /// SLO tightness.
    pub kappa: f64,
    /// The starting cluster's size.
    pub start_rpu: u32,
}

/// One policy on one case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleResult {
    /// The case.
    pub case: AutoscaleCase,
    /// The policy.
    pub policy: String,
    /// Violation rate over the measured queries.
    pub violation_rate: f64,
    /// Cost over the measured period, dollars.
    pub cost_usd: f64,
    /// Queries measured.
    pub queries: usize,
    /// Spinups requested: `(seconds since start, rpu)`.
    pub spinups: Vec<(f64, u32)>,
    /// Teardowns requested.
    pub teardowns: u64,
    /// Size selector runs.
    pub selections: u64,
    /// The slowest autoscaler step (a selection), wall-clock milliseconds.
    pub slowest_step_ms: f64,
}

/// The report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleReport {
    /// The experiment.
    pub experiment: Experiment,
    /// The seed.
    pub seed: u64,
    /// Cases outermost, policies in column order.
    pub results: Vec<AutoscaleResult>,
}

/// Times each controller step (the slowest is a selection) and forwards
/// it; the caller keeps its own handle on the shared controller.
struct TimedController<C> {
    inner: C,
    slowest_ms: Rc<Cell<f64>>,
}

impl<C: Controller> Controller for TimedController<C> {
    fn handle_observation(&mut self, now: Instant, observation: SimObservation<'_>, pool: &Pool, router: &dyn RoutingPolicy) {
        let started = WallInstant::now();
        self.inner.handle_observation(now, observation, pool, router);
        self.slowest_ms.set(self.slowest_ms.get().max(started.elapsed().as_secs_f64() * 1e3));
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.inner.poll_timeout()
    }
    fn handle_timeout(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy) {
        self.inner.handle_timeout(now, pool, router);
    }
    fn poll_command(&mut self) -> Option<ClusterCommand> {
        self.inner.poll_command()
    }
}

/// The eight cases of Tables 3 and 4.
pub fn cases() -> Vec<AutoscaleCase> {
    let mut cases = Vec::new();
    for lambda in [0.1, 0.2] {
        for kappa in [4.0, 2.0] {
            for start_rpu in [8, 16] {
                cases.push(AutoscaleCase { lambda, kappa, start_rpu });
            }
        }
    }
    cases
}

fn workload(case: &AutoscaleCase, seed: u64) -> Result<Vec<Query>> {
    let templates = Scenario::templates();
    let mut entries = base_workload(&templates, case.lambda, seed)?;
    assign_slos(&mut entries, &templates, case.kappa)?;
    let mut queries = to_queries(&entries, &PoolId::default())?;
    queries.sort_by_key(|q| (q.arrival, q.id));
    Ok(queries)
}

/// Runs `experiment` with `policies` (default: all of its columns).
pub fn run(experiment: Experiment, policies: Option<&[String]>, seed: u64) -> Result<AutoscaleReport> {
    let policies: Vec<String> = policies.map_or_else(|| experiment.policies().iter().map(|p| (*p).to_owned()).collect(), <[String]>::to_vec);
    for policy in &policies {
        experiment.policy(policy, 1)?;
    }
    let config = AutoscalerConfig::default();
    let sizes: Vec<u32> = config.sizes.iter().map(|s| s.0).collect();
    let history = training_observations(&sizes, seed);
    let mut results = Vec::new();
    for case in cases() {
        let queries = workload(&case, seed)?;
        for policy in &policies {
            results.push(run_case(experiment, &case, policy, &queries, &history, seed)?);
        }
    }
    Ok(AutoscaleReport { experiment, seed, results })
}

fn run_case(
    experiment: Experiment,
    case: &AutoscaleCase,
    policy: &str,
    queries: &[Query],
    history: &[slogate_core::predict::Observation],
    seed: u64,
) -> Result<AutoscaleResult> {
    let world = World::seeded_with_ready(seed, &[case.start_rpu]);
    let router = build_policy("slogate", history)?;
    let autoscaler =
        Rc::new(RefCell::new(Autoscaler::new(AutoscalerConfig::default(), experiment.policy(policy, queries.len())?, BillingConfig::default())));
    let slowest_ms = Rc::new(Cell::new(0.0));
    let controller = TimedController { inner: Rc::clone(&autoscaler), slowest_ms: Rc::clone(&slowest_ms) };
    let mut sim = Simulation::new(world, router, queries.to_vec()).with_controller(Box::new(controller));
    sim.drive_until_idle();
    let (measured_from, measured) = match experiment {
        Experiment::SizeTable3 => {
            let first = queries.len() - queries.len().div_ceil(5);
            (queries[first].arrival, &queries[first..])
        }
        Experiment::TriggerTable4 => (Instant::ZERO, queries),
    };
    let ids: std::collections::HashSet<_> = measured.iter().map(|q| q.id).collect();
    let violations = sim.records().iter().filter(|r| ids.contains(&r.query) && !r.slo_met()).count();
    let world = sim.world();
    let cost_usd: f64 = world.cluster_ids().map(|id| world.billed_cost_usd(id, Instant::MAX) - world.billed_cost_usd(id, measured_from)).sum();
    let autoscaler = autoscaler.borrow();
    let spinups = autoscaler
        .decisions()
        .filter_map(|d| match d {
            ScaleDecision::SpinUp { at, size, .. } => Some((at.as_secs_f64(), size.0)),
            _ => None,
        })
        .collect();
    let stats = autoscaler.stats();
    Ok(AutoscaleResult {
        case: case.clone(),
        policy: policy.to_owned(),
        violation_rate: violations as f64 / measured.len().max(1) as f64,
        cost_usd,
        queries: measured.len(),
        spinups,
        teardowns: stats.teardowns,
        selections: stats.selections,
        slowest_step_ms: slowest_ms.get(),
    })
}

/// Per policy other than the first: mean relative change in VR and cost
/// against the first (No-Op), over the cases where No-Op has violations
/// (VR) or cost.
pub fn mean_delta(report: &AutoscaleReport) -> Vec<(String, Option<f64>, f64)> {
    let baseline = report.experiment.policies()[0];
    let mut policies: Vec<&str> = Vec::new();
    for r in &report.results {
        if r.policy != baseline && !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    policies
        .into_iter()
        .filter_map(|policy| {
            let (mut vr, mut cost) = (Vec::new(), Vec::new());
            for r in report.results.iter().filter(|r| r.policy == policy) {
                let Some(base) = report.results.iter().find(|b| b.policy == baseline && b.case == r.case) else { continue };
                if base.violation_rate > 0.0 {
                    vr.push(r.violation_rate / base.violation_rate - 1.0);
                }
                if base.cost_usd > 0.0 {
                    cost.push(r.cost_usd / base.cost_usd - 1.0);
                }
            }
            (!cost.is_empty()).then(|| (policy.to_owned(), (!vr.is_empty()).then(|| mean(&vr)), mean(&cost)))
        })
        .collect()
}

impl super::seeds::SeedFigures for AutoscaleReport {
    /// Per case and policy: VR and cost; then each policy's mean Δ against
    /// No-Op.
    fn figures(&self) -> Vec<super::seeds::Figure> {
        use super::seeds::{Figure, Unit};
        let mut figures = Vec::new();
        for r in &self.results {
            let row = format!("λ={} κ={} [{}]  {}", r.case.lambda, r.case.kappa, r.case.start_rpu, r.policy);
            figures.push(Figure::lower(row.clone(), "VR", r.violation_rate, Unit::Percent));
            figures.push(Figure::lower(row, "cost", r.cost_usd, Unit::Usd));
        }
        figures.extend(super::seeds::mean_delta_figures(self.experiment.policies()[0], mean_delta(self)));
        figures
    }
}

/// The table, one row per case with VR and cost per policy, then the mean
/// Δ row and each run's spinups (deterministic: no wall-clock figures).
pub fn render(report: &AutoscaleReport) -> String {
    let mut out = String::new();
    let mut policies: Vec<&str> = Vec::new();
    for r in &report.results {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let measured = match report.experiment {
        Experiment::SizeTable3 => "VR and cost over the last 20% of the workload; trigger forced after 20%",
        Experiment::TriggerTable4 => "VR and cost over the whole workload",
    };
    writeln!(out, "scenario {}  seed {}  ({measured})", report.experiment.name(), report.seed).expect("write to String");
    write!(out, "{:>5} {:>3} {:>5}", "λ", "κ", "C").expect("write to String");
    for policy in &policies {
        write!(out, " | {:>17}", format!("{policy} VR  cost")).expect("write to String");
    }
    writeln!(out).expect("write to String");
    for case in cases() {
        let row: Vec<&AutoscaleResult> = policies.iter().filter_map(|p| report.results.iter().find(|r| r.case == case && r.policy == *p)).collect();
        if row.is_empty() {
            continue;
        }
        write!(out, "{:>5} {:>3} {:>5}", case.lambda, case.kappa, format!("[{}]", case.start_rpu)).expect("write to String");
        for r in row {
            write!(out, " | {:>7.4} {:>9}", r.violation_rate, format!("${:.2}", r.cost_usd)).expect("write to String");
        }
        writeln!(out).expect("write to String");
    }
    let deltas = mean_delta(report);
    if !deltas.is_empty() {
        writeln!(out, "\nmean Δ vs {} over cases:", report.experiment.policies()[0]).expect("write to String");
        for (policy, vr, cost) in deltas {
            let vr = vr.map_or("n/a".to_owned(), |v| format!("{:+.1}%", v * 100.0));
            writeln!(out, "{policy:<12} VR {vr:>8}   cost {:+.1}%", cost * 100.0).expect("write to String");
        }
    }
    writeln!(out, "\nspinups (s after start: RPU), teardowns:").expect("write to String");
    for r in &report.results {
        if r.spinups.is_empty() && r.teardowns == 0 {
            continue;
        }
        let spinups: Vec<String> = r.spinups.iter().map(|(at, rpu)| format!("{at:.0}:{rpu}")).collect();
        writeln!(
            out,
            "  λ={} κ={} [{}] {:<11} spinups [{}]  teardowns {}",
            r.case.lambda,
            r.case.kappa,
            r.case.start_rpu,
            r.policy,
            spinups.join(", "),
            r.teardowns
        )
        .expect("write to String");
    }
    out
}
