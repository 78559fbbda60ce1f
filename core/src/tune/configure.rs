//! The configuration tuner (AutoSLO §7.5): the autoscaler's knobs, chosen
//! by simulation.
//!
//! A [`KnobSpace`] lists the values each knob may take: T_idle,
//! T_min_lifetime, τ_trigger, θ, μ, w, and the trigger's SLO tightening
//! (how early a latency counts as a miss for the trigger, a knob that
//! trades violation-rate slack under τ for cost). A [`TuneStrategy`]
//! proposes points of it:
//!
//! - `grid`: every point;
//! - `random`: `budget` distinct points drawn uniformly (seeded);
//! - `coordinate-descent`: from the base configuration, each knob in turn
//!   takes its best value with the others fixed, for up to `sweeps`
//!   sweeps or until a sweep changes nothing;
//! - `adaptive-batch`: random batches that double in size, stopping at the
//!   first batch that does not beat the best so far (or at `budget`).
//!
//! Every proposed configuration keeps the base's planned spinups and is
//! simulated on the training days ([`simulate_batch`]); the `top_k` best
//! under BestWithTarget(τ) on training are simulated on the validation
//! days, and the best of them there is returned.
//!
//! # Properties
//!
//! - (A) The result is one of the evaluated configurations, and no other
//!   of the `top_k` beats it on validation under BestWithTarget.
//! - (B) No configuration is simulated twice.
//! - (C) Deterministic for a seed.

use std::collections::BTreeMap;

use rand::seq::SliceRandom;
use rand::{SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};

use crate::model::Query;
use crate::objective::{Outcome, best_with_target};
use crate::route::PlanningRouter;
use crate::scale::AutoscalerConfig;
use crate::time::Duration;
use crate::tune::batch::{BatchSetup, ExecutionConfig, aggregate, simulate_batch};

/// The values each knob may take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KnobSpace {
    /// T_idle, seconds.
    pub idle_teardown_s: Vec<u64>,
    /// T_min_lifetime, seconds.
    pub min_lifetime_s: Vec<u64>,
    /// τ_trigger.
    pub trigger_target: Vec<f64>,
    /// θ.
    pub min_observations: Vec<usize>,
    /// μ.
    pub completions: Vec<usize>,
    /// w, seconds.
    pub window_s: Vec<u64>,
    /// The factor of the SLO the spinup trigger judges latencies against.
    pub trigger_slo_tightening: Vec<f64>,
}

impl Default for KnobSpace {
    fn default() -> Self {
        KnobSpace {
            idle_teardown_s: vec![300, 600, 1_200, 2_400],
            min_lifetime_s: vec![600, 1_200, 2_400],
            trigger_target: vec![0.05, 0.1, 0.2],
            min_observations: vec![16, 32, 64],
            completions: vec![16, 32, 64],
            window_s: vec![150, 300, 600],
            trigger_slo_tightening: vec![0.5, 0.75, 1.0],
        }
    }
}

/// Knobs in the space.
const DIMENSIONS: usize = 7;

/// A point: one value index per knob.
type Point = [usize; DIMENSIONS];

impl KnobSpace {
    fn sizes(&self) -> Point {
        [
            self.idle_teardown_s.len(),
            self.min_lifetime_s.len(),
            self.trigger_target.len(),
            self.min_observations.len(),
            self.completions.len(),
            self.window_s.len(),
            self.trigger_slo_tightening.len(),
        ]
    }

    /// Points in the grid.
    pub fn len(&self) -> usize {
        self.sizes().iter().product()
    }

    /// Whether some knob has no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn point(&self, mut index: usize) -> Point {
        let sizes = self.sizes();
        std::array::from_fn(|d| {
            let value = index % sizes[d];
            index /= sizes[d];
            value
        })
    }

    /// `base` with the knobs at `point`.
    fn apply(&self, point: &Point, base: &AutoscalerConfig) -> AutoscalerConfig {
        AutoscalerConfig {
            idle_teardown: Duration::from_secs(self.idle_teardown_s[point[0]]),
            min_lifetime: Duration::from_secs(self.min_lifetime_s[point[1]]),
            trigger_target: self.trigger_target[point[2]],
            min_observations: self.min_observations[point[3]],
            completions: self.completions[point[4]],
            window: Duration::from_secs(self.window_s[point[5]]),
            trigger_slo_tightening: self.trigger_slo_tightening[point[6]],
            ..base.clone()
        }
    }

    /// The point nearest `base` (each knob's closest value).
    fn nearest(&self, base: &AutoscalerConfig) -> Point {
        fn closest(values: impl Iterator<Item = f64>, target: f64) -> usize {
            values.enumerate().min_by(|a, b| (a.1 - target).abs().total_cmp(&(b.1 - target).abs())).map_or(0, |(i, _)| i)
        }
        [
            closest(self.idle_teardown_s.iter().map(|&v| v as f64), base.idle_teardown.as_secs_f64()),
            closest(self.min_lifetime_s.iter().map(|&v| v as f64), base.min_lifetime.as_secs_f64()),
            closest(self.trigger_target.iter().copied(), base.trigger_target),
            closest(self.min_observations.iter().map(|&v| v as f64), base.min_observations as f64),
            closest(self.completions.iter().map(|&v| v as f64), base.completions as f64),
            closest(self.window_s.iter().map(|&v| v as f64), base.window.as_secs_f64()),
            closest(self.trigger_slo_tightening.iter().copied(), base.trigger_slo_tightening),
        ]
    }
}

/// How candidates are proposed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum TuneStrategy {
    /// Every point.
    Grid,
    /// `budget` distinct random points.
    Random {
        /// Points at most.
        budget: usize,
    },
    /// One knob at a time from the base.
    CoordinateDescent {
        /// Sweeps over the knobs at most.
        sweeps: usize,
    },
    /// Doubling random batches with early stopping.
    AdaptiveBatch {
        /// The first batch's size.
        initial: usize,
        /// Points at most.
        budget: usize,
    },
}

/// The tuner's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TunerConfig {
    /// The proposal strategy.
    pub strategy: TuneStrategy,
    /// The knobs' values.
    pub space: KnobSpace,
    /// Configurations re-evaluated on validation.
    pub top_k: usize,
    /// τ of BestWithTarget.
    pub target: f64,
    /// Seeds the random strategies.
    pub seed: u64,
}

impl Default for TunerConfig {
    fn default() -> Self {
        TunerConfig { strategy: TuneStrategy::CoordinateDescent { sweeps: 2 }, space: KnobSpace::default(), top_k: 3, target: 0.1, seed: 1 }
    }
}

/// One evaluated configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluated {
    /// Its knobs.
    pub knobs: AutoscalerConfig,
    /// Pooled over the training days.
    pub training: Outcome,
    /// Pooled over the validation days, if it was among the top k.
    pub validation: Option<Outcome>,
}

/// The tuner's result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tuning {
    /// The chosen configuration.
    pub best: ExecutionConfig,
    /// Its validation outcome.
    pub expected: Outcome,
    /// Every evaluated configuration, in evaluation order.
    pub evaluated: Vec<Evaluated>,
    /// Simulations run.
    pub simulations: usize,
}

/// Evaluates points on the training days, remembering each.
struct Evaluator<'a> {
    setup: &'a BatchSetup,
    router: &'a dyn PlanningRouter,
    base: &'a ExecutionConfig,
    space: &'a KnobSpace,
    training: &'a [Vec<Query>],
    target: f64,
    seen: BTreeMap<Point, Outcome>,
    order: Vec<Point>,
    simulations: usize,
}

impl Evaluator<'_> {
    fn config(&self, point: &Point) -> ExecutionConfig {
        ExecutionConfig { spinups: self.base.spinups.clone(), knobs: self.space.apply(point, &self.base.knobs) }
    }

    /// Simulates the points not yet seen, in one batch.
    fn evaluate(&mut self, points: &[Point]) {
        let mut fresh: Vec<Point> = Vec::new();
        for point in points {
            if !self.seen.contains_key(point) && !fresh.contains(point) {
                fresh.push(*point);
            }
        }
        if fresh.is_empty() {
            return;
        }
        let configs: Vec<ExecutionConfig> = fresh.iter().map(|p| self.config(p)).collect();
        let results = simulate_batch(self.setup, self.router, &configs, self.training);
        self.simulations += configs.len() * self.training.len();
        for (point, outcomes) in fresh.into_iter().zip(results) {
            self.seen.insert(point, aggregate(&outcomes));
            self.order.push(point);
        }
    }

    /// The best of `points` (all seen), the first on ties.
    fn best_of(&self, points: &[Point]) -> Point {
        let outcomes: Vec<Outcome> = points.iter().map(|p| self.seen[p]).collect();
        points[best_with_target(&outcomes, self.target).expect("points to choose from")]
    }

    fn incumbent(&self) -> Option<Point> {
        (!self.order.is_empty()).then(|| self.best_of(&self.order))
    }
}

/// The configuration tuner: see the module docs. `base` gives the planned
/// spinups and every knob outside the space.
pub fn tune_configuration(
    setup: &BatchSetup,
    router: &dyn PlanningRouter,
    base: &ExecutionConfig,
    training: &[Vec<Query>],
    validation: &[Vec<Query>],
    config: &TunerConfig,
) -> Tuning {
    let space = &config.space;
    let mut evaluator = Evaluator { setup, router, base, space, training, target: config.target, seen: BTreeMap::new(), order: Vec::new(), simulations: 0 };
    let mut rng = SmallRng::seed_from_u64(config.seed);
    let start = space.nearest(&base.knobs);
    if !space.is_empty() && !training.is_empty() {
        match config.strategy {
            TuneStrategy::Grid => {
                let all: Vec<Point> = (0..space.len()).map(|i| space.point(i)).collect();
                evaluator.evaluate(&all);
            }
            TuneStrategy::Random { budget } => {
                let mut all: Vec<usize> = (0..space.len()).collect();
                all.shuffle(&mut rng);
                let chosen: Vec<Point> = all.into_iter().take(budget.max(1)).map(|i| space.point(i)).collect();
                evaluator.evaluate(&chosen);
            }
            TuneStrategy::CoordinateDescent { sweeps } => {
                let mut current = start;
                evaluator.evaluate(&[current]);
                for _ in 0..sweeps {
                    let before = current;
                    for dimension in 0..DIMENSIONS {
                        // The current point first, so it keeps ties.
                        let mut line = vec![current];
                        line.extend((0..space.sizes()[dimension]).filter(|&v| v != current[dimension]).map(|v| {
                            let mut p = current;
                            p[dimension] = v;
                            p
                        }));
                        evaluator.evaluate(&line);
                        current = evaluator.best_of(&line);
                    }
                    if current == before {
                        break;
                    }
                }
            }
            TuneStrategy::AdaptiveBatch { initial, budget } => {
                let mut all: Vec<usize> = (0..space.len()).collect();
                all.shuffle(&mut rng);
                let mut remaining = all.into_iter().map(|i| space.point(i));
                evaluator.evaluate(&[start]);
                let mut batch = initial.max(1);
                while evaluator.order.len() < budget.max(1) {
                    let before = evaluator.incumbent().expect("the start is evaluated");
                    let next: Vec<Point> = remaining.by_ref().filter(|p| !evaluator.seen.contains_key(p)).take(batch.min(budget - evaluator.order.len())).collect();
                    if next.is_empty() {
                        break;
                    }
                    evaluator.evaluate(&next);
                    let after = evaluator.incumbent().expect("evaluated");
                    if after == before {
                        break;
                    }
                    batch *= 2;
                }
            }
        }
    }
    if evaluator.order.is_empty() {
        evaluator.evaluate(&[start]);
    }
    // Top k on training, ranked under BestWithTarget (evaluation order on
    // ties), then the best of them on validation.
    let mut ranked = evaluator.order.clone();
    ranked.sort_by(|a, b| evaluator.seen[a].cmp_with_target(&evaluator.seen[b], config.target));
    ranked.truncate(config.top_k.max(1));
    let finalists: Vec<ExecutionConfig> = ranked.iter().map(|p| evaluator.config(p)).collect();
    let validated: Vec<Outcome> = if validation.is_empty() {
        ranked.iter().map(|p| evaluator.seen[p]).collect()
    } else {
        let results = simulate_batch(setup, router, &finalists, validation);
        evaluator.simulations += finalists.len() * validation.len();
        results.iter().map(|o| aggregate(o)).collect()
    };
    let chosen = best_with_target(&validated, config.target).expect("at least one finalist");
    let evaluated = evaluator
        .order
        .iter()
        .map(|p| Evaluated {
            knobs: space.apply(p, &base.knobs),
            training: evaluator.seen[p],
            validation: ranked.iter().position(|r| r == p).map(|i| validated[i]),
        })
        .collect();
    Tuning { best: finalists[chosen].clone(), expected: validated[chosen], evaluated, simulations: evaluator.simulations }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale::SpinupPolicy;
    use crate::tune::batch::tests::{burst, router, setup};

    fn small_space() -> KnobSpace {
        KnobSpace {
            idle_teardown_s: vec![60, 1_200],
            min_lifetime_s: vec![60, 1_200],
            trigger_target: vec![0.1],
            min_observations: vec![8, 32],
            completions: vec![32],
            window_s: vec![300],
            trigger_slo_tightening: vec![0.5],
        }
    }

    /// Two bursts an hour apart: reactive spinups help; keeping the new
    /// cluster between the bursts costs, tearing it down early risks the
    /// second.
    fn days(seeds: std::ops::Range<u64>) -> Vec<Vec<Query>> {
        seeds
            .map(|s| {
                let mut day = burst(s * 10_000, 600.0 + s as f64 * 10.0, 80, 1.5, 30);
                day.extend(burst(s * 10_000 + 5_000, 4_200.0 + s as f64 * 10.0, 80, 1.5, 30));
                day
            })
            .collect()
    }

    fn reactive_setup() -> BatchSetup {
        BatchSetup { policy: crate::scale::AutoscalerPolicy { spinup: SpinupPolicy::Projected, ..crate::scale::AutoscalerPolicy::SLOGATE }, ..setup(2) }
    }

    #[test]
    fn the_grid_evaluates_every_point_once_and_returns_the_validation_best() {
        let base = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
        let config = TunerConfig { strategy: TuneStrategy::Grid, space: small_space(), top_k: 3, ..TunerConfig::default() };
        let tuning = tune_configuration(&reactive_setup(), &router(), &base, &days(0..2), &days(2..4), &config);
        assert_eq!(tuning.evaluated.len(), 8);
        assert_eq!(tuning.simulations, 8 * 2 + 3 * 2);
        let finalists: Vec<&Evaluated> = tuning.evaluated.iter().filter(|e| e.validation.is_some()).collect();
        assert_eq!(finalists.len(), 3);
        for f in &finalists {
            assert_ne!(f.validation.unwrap().cmp_with_target(&tuning.expected, config.target), std::cmp::Ordering::Less);
        }
        assert!(tuning.evaluated.iter().any(|e| e.knobs == tuning.best.knobs));
        // Random with the whole grid as budget proposes the same points.
        let random = TunerConfig { strategy: TuneStrategy::Random { budget: 8 }, ..config.clone() };
        let shuffled = tune_configuration(&reactive_setup(), &router(), &base, &days(0..2), &days(2..4), &random);
        assert_eq!(shuffled.expected, tuning.expected);
    }

    #[test]
    fn the_trigger_tightening_knob_reaches_the_simulated_autoscaler() {
        // Scale-in off: shrinking the pool between the bursts would blur
        // the one knob this test isolates.
        let base = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig { scale_in: false, ..AutoscalerConfig::default() } };
        let space = KnobSpace { idle_teardown_s: vec![1_200], min_observations: vec![8], trigger_slo_tightening: vec![0.25, 1.0], ..small_space() };
        let config = TunerConfig { strategy: TuneStrategy::Grid, space, top_k: 2, ..TunerConfig::default() };
        let tuning = tune_configuration(&reactive_setup(), &router(), &base, &days(0..2), &days(2..3), &config);
        let by_tightening = |t: f64| tuning.evaluated.iter().find(|e| e.knobs.trigger_slo_tightening == t).map(|e| e.training);
        let (eager, late) = (by_tightening(0.25).expect("0.25 evaluated"), by_tightening(1.0).expect("1.0 evaluated"));
        // Judging latencies against a quarter of the SLO fires on the
        // bursts sooner, so it spins up earlier and pays for it.
        assert!(eager.cost_usd > late.cost_usd, "eager {eager:?} late {late:?}");
    }

    #[test]
    fn coordinate_descent_and_adaptive_batches_stay_within_their_budgets() {
        let base = ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() };
        let descent = TunerConfig { strategy: TuneStrategy::CoordinateDescent { sweeps: 2 }, space: small_space(), ..TunerConfig::default() };
        let tuning = tune_configuration(&reactive_setup(), &router(), &base, &days(0..2), &days(2..3), &descent);
        // From the base's nearest point, one new value per two-valued knob
        // in the first sweep: at most 1 + 3 points, plus at most 3 more.
        assert!(tuning.evaluated.len() <= 7, "{}", tuning.evaluated.len());
        let start = &tuning.evaluated[0].knobs;
        assert_eq!((start.idle_teardown, start.min_observations), (Duration::from_secs(1_200), 32));
        let adaptive = TunerConfig { strategy: TuneStrategy::AdaptiveBatch { initial: 2, budget: 5 }, ..descent };
        let tuning = tune_configuration(&reactive_setup(), &router(), &base, &days(0..2), &days(2..3), &adaptive);
        assert!(tuning.evaluated.len() <= 5);
        let best_training = tuning.evaluated.iter().map(|e| e.training).min_by(|a, b| a.cmp_with_target(b, 0.1)).unwrap();
        assert!(tuning.evaluated.iter().filter(|e| e.validation.is_some()).any(|e| e.training == best_training));
    }
}
