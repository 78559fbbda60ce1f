//! SimulateBatch (AutoSLO §7.3): execution configurations × workloads →
//! a result matrix, simulated in parallel on the planner's warehouse.
//!
//! Each simulation is the ordinary engine ([`crate::sim::Simulation`]) on a
//! [`PredictedWarehouse`] that starts with the pool's initial clusters,
//! routed by an empty fork of the live router (what it learned, nothing
//! placed) that releases completed queries without learning from them, and
//! scaled by an [`Autoscaler`] with the configuration's knobs and planned
//! spinups. Nothing here reads the emulated world.
//!
//! Simulations run on a rayon pool of `threads` threads; the matrix is the
//! same for any thread count.
//!
//! # Properties
//!
//! - (A) `R[i][j]` is configuration `i` on workload `j`, and has one trace
//!   per query of the workload.
//! - (B) Deterministic: the same inputs give the same matrix, for any
//!   thread count.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::billing::BillingConfig;
use crate::model::{ExecutionReport, Pool, Query, QueryId, Rpu};
use crate::objective::Outcome;
use crate::route::{PlanningRouter, Routing, RoutingPolicy};
use crate::scale::{Autoscaler, AutoscalerConfig, AutoscalerPolicy, ScheduledSpinup};
use crate::sim::{Simulation, Warehouse};
use crate::time::{Duration, Instant};
use crate::tune::{PlannerTerms, PredictedWarehouse};

/// One execution configuration: planned spinups and the autoscaler's
/// knobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionConfig {
    /// Planned spinups, by instant from the day's start.
    pub spinups: Vec<ScheduledSpinup>,
    /// T_idle, T_min_lifetime, τ_trigger, θ, μ, w and the rest.
    pub knobs: AutoscalerConfig,
}

impl ExecutionConfig {
    /// The configuration on one line for reports: `spinups [32@25200s];
    /// ` then [`AutoscalerConfig::tuned_knobs`].
    pub fn describe(&self) -> String {
        let spinups: Vec<String> = self.spinups.iter().map(|s| format!("{}@{:.0}s", s.size, s.at.as_secs_f64())).collect();
        format!("spinups [{}]; {}", spinups.join(", "), self.knobs.tuned_knobs())
    }

    /// These knobs and one more planned spinup.
    pub fn with_spinup(&self, spinup: ScheduledSpinup) -> Self {
        let mut config = self.clone();
        config.spinups.push(spinup);
        config.spinups.sort();
        config
    }
}

/// What every simulation of a batch shares.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BatchSetup {
    /// The pool's clusters at the day's start, ready.
    pub initial_clusters: Vec<Rpu>,
    /// The autoscaling strategy.
    pub policy: AutoscalerPolicy,
    /// Billing terms of the autoscaler's estimates.
    pub billing: BillingConfig,
    /// The planner's warehouse.
    pub terms: PlannerTerms,
    /// Simulations at once.
    pub threads: usize,
}

/// One query's fate in a simulation, for the spinup scheduler's scan.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryTrace {
    /// When it arrived.
    pub arrival: Instant,
    /// When it finished (or was rejected).
    pub finished: Instant,
    /// Whether it missed its SLO.
    pub violated: bool,
}

/// One simulation's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunOutcome {
    /// Queries simulated.
    pub queries: usize,
    /// Of which missed their SLO.
    pub violations: usize,
    /// Clusters and elastic tier, dollars.
    pub cost_usd: f64,
    /// Spinups the autoscaler requested (planned ones included).
    pub spinups: u64,
    /// Every query, in finishing order.
    pub traces: Vec<QueryTrace>,
}

impl RunOutcome {
    /// `violations / queries` (0 for none).
    pub fn violation_rate(&self) -> f64 {
        if self.queries == 0 { 0.0 } else { self.violations as f64 / self.queries as f64 }
    }
}

/// A configuration's outcomes over workloads, pooled: the violation rate
/// over all their queries and the mean cost.
pub fn aggregate(outcomes: &[RunOutcome]) -> Outcome {
    let queries: usize = outcomes.iter().map(|o| o.queries).sum();
    let violations: usize = outcomes.iter().map(|o| o.violations).sum();
    let cost: f64 = outcomes.iter().map(|o| o.cost_usd).sum();
    Outcome {
        violations: if queries == 0 { 0.0 } else { violations as f64 / queries as f64 },
        cost_usd: if outcomes.is_empty() { 0.0 } else { cost / outcomes.len() as f64 },
    }
}

/// The router inside a planned simulation: it routes as the live one would
/// and forgets each completion without learning from it.
struct Planned(Box<dyn PlanningRouter>);

impl RoutingPolicy for Planned {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn route(&mut self, now: Instant, query: &Query, pool: &Pool) -> Routing {
        self.0.route(now, query, pool)
    }
    fn handle_completion(&mut self, now: Instant, report: &ExecutionReport) {
        self.0.release(now, report.query);
    }
    fn predicted_latency(&self, query: QueryId) -> Option<Duration> {
        self.0.predicted_latency(query)
    }
    fn predicted_latencies(&self, cluster: crate::model::ClusterId) -> Vec<(QueryId, Duration)> {
        self.0.predicted_latencies(cluster)
    }
    fn fork_planner(&self) -> Option<Box<dyn PlanningRouter>> {
        Some(self.0.fork())
    }
}

/// A predictor a simulation owns.
type OwnedPredictor = Box<dyn crate::predict::LatencyPredictor + Send>;

/// One simulation: `config` on `workload`.
fn run_one(setup: &BatchSetup, router: Box<dyn PlanningRouter>, predictor: OwnedPredictor, config: &ExecutionConfig, workload: &[Query]) -> RunOutcome {
    let mut warehouse = PredictedWarehouse::new(predictor, setup.terms.clone());
    for &size in &setup.initial_clusters {
        warehouse.add_cluster(Instant::ZERO, size, true);
    }
    // Nested parallelism would oversubscribe the pool: the selector runs
    // its candidates in turn here.
    let knobs = AutoscalerConfig { selector_threads: 1, ..config.knobs.clone() };
    let autoscaler = std::rc::Rc::new(std::cell::RefCell::new(Autoscaler::new(knobs, setup.policy, setup.billing.clone()).with_schedule(config.spinups.clone())));
    let mut sim = Simulation::new(warehouse, Planned(router), workload.to_vec()).with_controller(Box::new(autoscaler.clone()));
    sim.drive_until_idle();
    let summary = sim.summary();
    let traces = sim.records().iter().map(|r| QueryTrace { arrival: r.arrival, finished: r.finished, violated: !r.slo_met() }).collect();
    let spinups = autoscaler.borrow().stats().spinups;
    RunOutcome { queries: summary.queries, violations: summary.violations, cost_usd: summary.cost_usd, spinups, traces }
}

/// SimulateBatch: `R[i][j]` is `configs[i]` on `workloads[j]` (see the
/// module docs).
pub fn simulate_batch(setup: &BatchSetup, router: &dyn PlanningRouter, configs: &[ExecutionConfig], workloads: &[Vec<Query>]) -> Vec<Vec<RunOutcome>> {
    // Forks are made here, in order: the live router is not shared across
    // threads.
    let jobs: Vec<(usize, usize, Box<dyn PlanningRouter>, OwnedPredictor)> = (0..configs.len())
        .flat_map(|i| (0..workloads.len()).map(move |j| (i, j)))
        .map(|(i, j)| (i, j, router.fork_empty(), router.fork_predictor()))
        .collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(setup.threads.max(1)).build().expect("a thread pool");
    let mut results: Vec<(usize, usize, RunOutcome)> = pool.install(|| {
        jobs.into_par_iter().map(|(i, j, router, predictor)| (i, j, run_one(setup, router, predictor, &configs[i], &workloads[j]))).collect()
    });
    results.sort_by_key(|(i, j, _)| (*i, *j));
    let mut matrix: Vec<Vec<RunOutcome>> = (0..configs.len()).map(|_| Vec::with_capacity(workloads.len())).collect();
    for (i, _, outcome) in results {
        matrix[i].push(outcome);
    }
    matrix
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::model::{PoolId, Slo, TemplateId};
    use crate::predict::concurrency::{ConcurrencyAware, ConcurrencyConfig};
    use crate::predict::{LatencyPredictor, Observation};
    use crate::route::slo::SloRouter;

    /// A router whose predictor learned: template t takes t seconds alone
    /// on 16 RPU, stretched (1 + n/4) by n neighbours, half on 32 RPU.
    pub(crate) fn router() -> SloRouter<ConcurrencyAware> {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for t in 1..=20u32 {
            for n in [0u32, 1, 2, 4, 8, 16] {
                for (size, factor) in [(16, 1.0), (32, 0.5)] {
                    let latency = Duration::from_secs_f64(f64::from(t) * factor * (1.0 + f64::from(n) / 4.0));
                    p.observe(&Observation { template: TemplateId(t), size: Rpu(size), neighbours: n, latency, censored: false });
                }
            }
        }
        p.fit();
        SloRouter::new("slogate", p, BillingConfig::default())
    }

    /// `count` queries of template 10 (10 s alone), `gap_s` apart from
    /// `start_s`, each with a `slo_s` SLO.
    pub(crate) fn burst(first_id: u64, start_s: f64, count: u64, gap_s: f64, slo_s: u64) -> Vec<Query> {
        (0..count)
            .map(|i| Query {
                id: QueryId(first_id + i),
                pool: PoolId::default(),
                template: TemplateId(10),
                slo: Slo { latency: Duration::from_secs(slo_s) },
                arrival: Instant::from_secs_f64(start_s + i as f64 * gap_s),
            })
            .collect()
    }

    pub(crate) fn setup(threads: usize) -> BatchSetup {
        BatchSetup {
            initial_clusters: vec![Rpu(16)],
            policy: AutoscalerPolicy { spinup: crate::scale::SpinupPolicy::Never, ..AutoscalerPolicy::SLOGATE },
            billing: BillingConfig::default(),
            terms: PlannerTerms::default(),
            threads,
        }
    }

    #[test]
    fn a_configuration_describes_its_spinups_then_every_tuned_knob() {
        let config = ExecutionConfig { spinups: vec![ScheduledSpinup { at: Instant::from_secs_f64(25_200.0), size: Rpu(32) }], knobs: AutoscalerConfig::default() };
        assert_eq!(config.describe(), "spinups [32rpu@25200s]; T_idle 1200s T_min 1200s τ_trigger 0.1 θ 32 μ 32 w 300s SLO×0.5");
    }

    #[test]
    fn a_planned_spinup_before_a_burst_lowers_its_violations_in_the_planners_model() {
        // 60 queries 2 s apart at 2 h: one 16-RPU cluster falls behind; a
        // 32-RPU cluster planned 10 minutes ahead takes most of them.
        let workloads = vec![burst(0, 7_200.0, 60, 2.0, 30), burst(1_000, 7_200.0, 60, 2.5, 30)];
        let none = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
        let planned = none.with_spinup(ScheduledSpinup { at: Instant::from_secs_f64(6_600.0), size: Rpu(32) });
        let matrix = simulate_batch(&setup(2), &router(), &[none, planned], &workloads);
        assert_eq!((matrix.len(), matrix[0].len()), (2, 2));
        assert!(matrix.iter().flatten().zip(workloads.iter().cycle()).all(|(o, w)| o.traces.len() == w.len() && o.queries == w.len()));
        let (without, with) = (aggregate(&matrix[0]), aggregate(&matrix[1]));
        assert!(with.violations < without.violations, "{with:?} vs {without:?}");
        assert!(with.cost_usd > without.cost_usd);
        assert_eq!(matrix[1][0].spinups, 1);
    }

    #[test]
    fn the_matrix_is_the_same_for_any_thread_count() {
        let workloads = vec![burst(0, 100.0, 30, 1.0, 40), burst(100, 50.0, 40, 1.5, 40), burst(200, 0.0, 20, 3.0, 40)];
        let configs: Vec<ExecutionConfig> = [600.0, 1_200.0]
            .iter()
            .map(|idle| ExecutionConfig { spinups: vec![ScheduledSpinup { at: Instant::ZERO, size: Rpu(16) }], knobs: AutoscalerConfig { idle_teardown: Duration::from_secs_f64(*idle), ..AutoscalerConfig::default() } })
            .collect();
        let one = simulate_batch(&setup(1), &router(), &configs, &workloads);
        let two = simulate_batch(&setup(2), &router(), &configs, &workloads);
        assert_eq!(one, two);
    }

    #[test]
    fn the_live_router_is_untouched_by_a_batch() {
        let live = router();
        let before = live.fork_predictor().predict(TemplateId(10), Rpu(16), 3);
        let _ = simulate_batch(&setup(2), &live, &[ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() }], &[burst(0, 0.0, 20, 1.0, 30)]);
        assert_eq!(live.fork_predictor().predict(TemplateId(10), Rpu(16), 3), before);
        assert!(live.last_scores().is_empty());
    }
}
