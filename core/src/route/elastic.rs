//! The elastic tier as one more routing candidate (Spandana's per-request
//! offload, inside AutoSLO's Algorithm 1).
//!
//! The router keeps its own view of the tier: a warm pool and a count of
//! running invocations driven only by the offloads it made and the
//! completions it saw, its elastic spend over the last hour, and the
//! tier's speed: the configured speed is only a prior, replaced once
//! enough offloads completed by the median ratio of their execution time
//! to their predicted reference latency (as the cluster predictors, it
//! learns from observations, never from the tier's true parameters). A query
//! is eligible for the tier only when no ready cluster can take it without
//! adding a predicted violation (Spandana's P1: anything a provisioned
//! target can serve within its SLO stays there), its template is allowed,
//! the tier is under its concurrency limit and the spend cap has room.
//! Then it competes under BestWithTarget like any cluster: it wins with
//! fewer marginal violations, or as many at lower cost.
//!
//! # Properties
//!
//! - (A) Never eligible while some ready cluster adds no violation.
//! - (B) Never eligible once the spend in the last hour (completed
//!   invocations' bills plus the estimates of running ones) reaches the
//!   cap.
//! - (C) Never more offloads running than the concurrency limit.
//! - (D) After the tier throttles an offload (a real tier's 429), no
//!   offload for a cool-down: 1 s after the first throttle in a row,
//!   doubling with each further one up to 60 s; a completed offload ends
//!   the run. A failed offload frees its slot like a completed one.

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::elastic::{ElasticConfig, ElasticPool};
use crate::model::{ExecutionOutcome, ExecutionReport, QueryId, Rpu, TemplateId};
use crate::stats::{median, push_bounded};
use crate::time::{Duration, Instant};

/// A pool's elastic options.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ElasticOptions {
    /// The tier's behaviour and prices.
    pub config: ElasticConfig,
    /// At most this much elastic spend per rolling hour, dollars; `None`
    /// for no cap.
    pub spend_cap_usd_per_hour: Option<f64>,
    /// Templates that may run elastically; `None` for all.
    pub templates: Option<BTreeSet<TemplateId>>,
}

/// An eligible offload's prediction.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ElasticScore {
    /// Predicted latency on the tier, cold start included.
    pub predicted_latency: Duration,
    /// Its estimated bill.
    pub cost_usd: f64,
    /// The query's predicted isolated latency at the reference size.
    pub reference: Duration,
    /// Whether it is predicted to start cold.
    pub cold: bool,
}

/// A running offload: its estimated bill and what it was predicted from.
#[derive(Clone, Copy, Debug)]
struct Offloaded {
    cost_usd: f64,
    reference: Duration,
    cold: bool,
}

/// Completed offloads the speed estimate keeps.
const SPEED_WINDOW: usize = 256;
/// Completed offloads before the estimate replaces the configured speed.
const SPEED_MIN_SAMPLES: usize = 8;

/// The router's view of the tier. See the module docs.
#[derive(Clone, Debug)]
pub struct ElasticRouting {
    options: ElasticOptions,
    pool: ElasticPool,
    /// Running offloads.
    running: HashMap<QueryId, Offloaded>,
    /// Logs of completed offloads' execution time over their reference
    /// latency, and their median's exponent once there are enough.
    speed_log_ratios: VecDeque<f64>,
    learned_factor: Option<f64>,
    /// Completed offloads' bills, `(finished, dollars)`, within the last
    /// hour.
    spent: VecDeque<(Instant, f64)>,
    offloads: u64,
    /// Throttles since the last completed offload.
    throttles_in_a_row: u32,
    /// No offload before this, after a throttle.
    cooling_until: Option<Instant>,
}

/// The cool-down after the first throttle in a row.
pub const THROTTLE_COOLDOWN_MIN: Duration = Duration::from_secs(1);
/// The longest cool-down.
pub const THROTTLE_COOLDOWN_MAX: Duration = Duration::from_secs(60);

const HOUR: Duration = Duration::from_secs(3_600);

impl ElasticRouting {
    /// A view of a tier with `options`, nothing running.
    pub fn new(options: ElasticOptions) -> Self {
        ElasticRouting {
            options,
            pool: ElasticPool::new(),
            running: HashMap::new(),
            speed_log_ratios: VecDeque::new(),
            learned_factor: None,
            spent: VecDeque::new(),
            offloads: 0,
            throttles_in_a_row: 0,
            cooling_until: None,
        }
    }

    /// The tier refused an offload for its rate at `now`: no offload for a
    /// cool-down that doubles with each throttle in a row (property D).
    pub fn throttled(&mut self, now: Instant) {
        self.throttles_in_a_row = self.throttles_in_a_row.saturating_add(1);
        let doublings = self.throttles_in_a_row.saturating_sub(1).min(16);
        let cooldown = THROTTLE_COOLDOWN_MIN.mul_f64(f64::from(1u32 << doublings)).min(THROTTLE_COOLDOWN_MAX);
        self.cooling_until = Some(now + cooldown);
    }

    /// The options.
    pub fn options(&self) -> &ElasticOptions {
        &self.options
    }

    /// Offloads made so far.
    pub fn offloads(&self) -> u64 {
        self.offloads
    }

    /// Spend in the hour before `now`: completed bills plus running
    /// estimates.
    pub fn spend_last_hour_usd(&self, now: Instant) -> f64 {
        let horizon = now.as_micros().saturating_sub(HOUR.as_micros());
        let completed: f64 = self.spent.iter().filter(|(at, _)| at.as_micros() > horizon).map(|(_, usd)| usd).sum();
        completed + self.running.values().map(|o| o.cost_usd).sum::<f64>()
    }

    /// Why `template` cannot go to the tier at `now`, if it cannot (apart
    /// from the clusters' state, which the router judges).
    pub fn unavailable(&self, now: Instant, template: TemplateId) -> Option<String> {
        if self.options.templates.as_ref().is_some_and(|allowed| !allowed.contains(&template)) {
            return Some(format!("template {template} may not run elastically"));
        }
        if let Some(until) = self.cooling_until
            && now < until
        {
            let left = until.saturating_duration_since(now).as_secs_f64();
            return Some(format!("the elastic tier throttled {} offload(s) in a row; offloads resume in {} s", self.throttles_in_a_row, crate::decimal::Fixed::<1>(left)));
        }
        if !self.pool.has_capacity(&self.options.config) {
            return Some(format!("the elastic tier is at its concurrency limit ({})", self.options.config.concurrency_limit));
        }
        if let Some(cap) = self.options.spend_cap_usd_per_hour {
            let spent = self.spend_last_hour_usd(now);
            if spent >= cap {
                return Some(format!("the elastic spend cap is reached (${} of ${} in the last hour)", crate::decimal::Fixed::<4>(spent), crate::decimal::Fixed::<4>(cap)));
            }
        }
        None
    }

    /// The offload's predicted latency and bill, given the query's
    /// predicted isolated latency at `reference_latency` (its latency on a
    /// cluster of the tier's reference size).
    pub fn score(&self, now: Instant, reference_latency: Duration) -> ElasticScore {
        let config = &self.options.config;
        let run = match self.learned_factor {
            Some(factor) => reference_latency.mul_f64(factor),
            None => config.execution_time(reference_latency),
        };
        let cold = !self.pool.would_be_warm(now, config);
        let start = if cold { config.cold_start } else { Duration::ZERO };
        ElasticScore { predicted_latency: start + run, cost_usd: config.invocation_cost_usd(start + run), reference: reference_latency, cold }
    }

    /// The tier's execution time over the reference latency, learned from
    /// completed offloads once there are enough.
    pub fn learned_factor(&self) -> Option<f64> {
        self.learned_factor
    }

    /// Learns the tier's speed from one completed offload that `ran` (cold
    /// start included, if it had one).
    fn learn_speed(&mut self, ran: Duration, offloaded: &Offloaded) {
        let cold = if offloaded.cold { self.options.config.cold_start } else { Duration::ZERO };
        let executed = ran.saturating_sub(cold).as_secs_f64();
        let reference = offloaded.reference.as_secs_f64();
        if executed <= 0.0 || reference <= 0.0 {
            return;
        }
        push_bounded(&mut self.speed_log_ratios, (executed / reference).ln(), SPEED_WINDOW);
        if self.speed_log_ratios.len() >= SPEED_MIN_SAMPLES {
            self.learned_factor = Some(median(&self.speed_log_ratios.iter().copied().collect::<Vec<_>>()).exp());
        }
    }

    /// The reference size whose isolated latency [`ElasticRouting::score`]
    /// takes.
    pub fn reference_size(&self) -> Rpu {
        self.options.config.reference_size
    }

    /// Forgets running offloads and spend, keeping the learned speed (a
    /// planner's copy for a day simulated from scratch).
    pub fn forget_placements(&mut self) {
        self.pool = ElasticPool::new();
        self.running.clear();
        self.spent.clear();
        self.offloads = 0;
    }

    /// Records an offload placed at `now` as `score` predicted it.
    pub fn place(&mut self, now: Instant, query: QueryId, score: &ElasticScore) {
        self.pool.start(now, &self.options.config);
        self.running.insert(query, Offloaded { cost_usd: score.cost_usd, reference: score.reference, cold: score.cold });
        self.offloads += 1;
    }

    /// Forgets an offload the planner's replay completed at `now`, with no
    /// bill; returns false if it was not one.
    pub fn release(&mut self, now: Instant, query: QueryId) -> bool {
        if self.running.remove(&query).is_none() {
            return false;
        }
        self.pool.finish(now, &self.options.config);
        true
    }

    /// Records an offload's completion; returns false if it was not one.
    pub fn complete(&mut self, now: Instant, report: &ExecutionReport) -> bool {
        let Some(offloaded) = self.running.remove(&report.query) else { return false };
        self.pool.finish(now, &self.options.config);
        let started = report.started.unwrap_or(report.dispatched);
        let ran = report.finished - started;
        self.spent.push_back((report.finished, self.options.config.invocation_cost_usd(ran)));
        if report.outcome == ExecutionOutcome::Completed {
            self.learn_speed(ran, &offloaded);
            self.throttles_in_a_row = 0;
        }
        let horizon = now.as_micros().saturating_sub(HOUR.as_micros());
        while self.spent.front().is_some_and(|(at, _)| at.as_micros() <= horizon) {
            self.spent.pop_front();
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::billing::BillingConfig;
    use crate::model::{ClusterId, ClusterState, ClusterView, ExecutionOutcome, Pool, PoolId, Query, Slo, Target};
    use crate::predict::concurrency::{ConcurrencyAware, ConcurrencyConfig};
    use crate::predict::{LatencyPredictor, Observation};
    use crate::route::slo::SloRouter;
    use crate::route::{RouteDecision, Routing, RoutingPolicy};

    /// Template t takes t seconds alone on 16 RPU, stretched (1 + n) by n
    /// neighbours.
    fn router(options: ElasticOptions) -> SloRouter<ConcurrencyAware> {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for t in 1..=20u32 {
            for n in [0u32, 1, 2, 4, 8, 16] {
                let latency = Duration::from_secs_f64(f64::from(t) * (1.0 + f64::from(n)));
                p.observe(&Observation { template: TemplateId(t), size: Rpu(16), neighbours: n, latency, censored: false });
            }
        }
        p.fit();
        SloRouter::new("slogate", p, BillingConfig::default()).with_elastic(options)
    }

    fn pool(clusters: usize) -> Pool {
        Pool {
            id: PoolId::default(),
            clusters: (0..clusters)
                .map(|i| ClusterView {
                    id: ClusterId(i as u32),
                    size: Rpu(16),
                    state: ClusterState::Ready,
                    requested_at: Instant::ZERO,
                    ready_at: Instant::ZERO,
                    running: Vec::new(),
                })
                .collect(),
        }
    }

    fn query(id: u64, template: u32, slo_s: f64, at: Instant) -> Query {
        Query { id: QueryId(id), pool: PoolId::default(), template: TemplateId(template), slo: Slo { latency: Duration::from_secs_f64(slo_s) }, arrival: at }
    }

    /// A fast, warm tier: 4× the reference speed, no cold start.
    fn fast() -> ElasticOptions {
        ElasticOptions { config: ElasticConfig { speed_factor: 4.0, cold_start: Duration::ZERO, ..ElasticConfig::default() }, ..ElasticOptions::default() }
    }

    fn is_elastic(routing: &Routing) -> bool {
        matches!(routing, Routing::Dispatch(RouteDecision { target: Target::Elastic, .. }))
    }

    #[test]
    fn a_query_no_cluster_can_serve_in_time_is_offloaded() {
        let mut r = router(fast());
        // 10 s on the cluster, 2.5 s elastic: a 5 s SLO only fits elastic.
        let routing = r.route(Instant::ZERO, &query(1, 10, 5.0, Instant::ZERO), &pool(1));
        assert!(is_elastic(&routing), "{routing:?}");
        // A 20 s SLO fits the cluster: it stays there.
        assert!(!is_elastic(&r.route(Instant::ZERO, &query(2, 10, 20.0, Instant::ZERO), &pool(1))));
    }

    #[test]
    fn the_spend_cap_stops_offloads_and_says_so() {
        let options = ElasticOptions { spend_cap_usd_per_hour: Some(0.05), ..fast() };
        let mut r = router(options);
        let mut offloaded = 0;
        let mut last = None;
        for id in 0..20 {
            let routing = r.route(Instant::ZERO, &query(id, 10, 5.0, Instant::ZERO), &pool(1));
            offloaded += usize::from(is_elastic(&routing));
            last = Some(routing);
        }
        let spent = r.elastic().expect("configured").spend_last_hour_usd(Instant::ZERO);
        // Each offload of 2.5 s costs 16 × (0.2e-6 + 10 GB × 2.5 s × 0.0000166667) ≈ $0.0067.
        assert!(offloaded >= 1 && spent < 0.05 + 0.0067 + 1e-9, "{offloaded} offloads, ${spent}");
        let Some(Routing::Dispatch(decision)) = last else { panic!("routed") };
        assert!(decision.explanation.contains("spend cap"), "{}", decision.explanation);
    }

    #[test]
    fn completed_offloads_free_their_slot_and_count_their_bill() {
        let options = ElasticOptions { config: ElasticConfig { concurrency_limit: 1, ..fast().config }, ..fast() };
        let mut r = router(options);
        assert!(is_elastic(&r.route(Instant::ZERO, &query(1, 10, 5.0, Instant::ZERO), &pool(1))));
        let second = r.route(Instant::ZERO, &query(2, 10, 5.0, Instant::ZERO), &pool(1));
        assert!(!is_elastic(&second), "at the concurrency limit");
        let report = ExecutionReport {
            query: QueryId(1),
            target: Target::Elastic,
            arrival: Instant::ZERO,
            dispatched: Instant::ZERO,
            started: Some(Instant::ZERO),
            finished: Instant::from_secs_f64(3.0),
            outcome: ExecutionOutcome::Completed,
        };
        r.handle_completion(Instant::from_secs_f64(3.0), &report);
        let spent = r.elastic().expect("configured").spend_last_hour_usd(Instant::from_secs_f64(3.0));
        assert!((spent - ElasticConfig::default().invocation_cost_usd(Duration::from_secs(3))).abs() < 1e-9, "{spent}");
        let at = Instant::from_secs_f64(3.0);
        assert!(is_elastic(&r.route(at, &query(3, 10, 5.0, at), &pool(1))));
    }

    #[test]
    fn the_tiers_speed_is_learned_from_completed_offloads() {
        // The prior says 4× the reference speed (10 s of work in 2.5 s);
        // the tier really takes 10 s.
        let mut r = router(fast());
        let mut at = Instant::ZERO;
        for id in 0..8 {
            assert!(is_elastic(&r.route(at, &query(id, 10, 5.0, at), &pool(1))), "offload {id}");
            let finished = at + Duration::from_secs(10);
            let report = ExecutionReport {
                query: QueryId(id),
                target: Target::Elastic,
                arrival: at,
                dispatched: at,
                started: Some(at),
                finished,
                outcome: ExecutionOutcome::Completed,
            };
            r.handle_completion(finished, &report);
            at = finished;
        }
        let factor = r.elastic().expect("configured").learned_factor().expect("eight completions");
        assert!((factor - 1.0).abs() < 0.05, "{factor}");
        // Its prediction now says 10 s, not the prior's 2.5 s.
        let Routing::Dispatch(decision) = r.route(at, &query(99, 10, 5.0, at), &pool(1)) else { panic!("routed") };
        let predicted = decision.predicted_latency.expect("predicted").as_secs_f64();
        assert!((predicted - 10.0).abs() < 0.5, "{predicted}: {}", decision.explanation);
    }

    #[test]
    fn a_throttle_pauses_offloads_for_a_cooldown_that_doubles_and_a_failure_frees_its_slot() {
        let mut tier = ElasticRouting::new(ElasticOptions { config: ElasticConfig { concurrency_limit: 1, ..ElasticConfig::default() }, ..ElasticOptions::default() });
        let t0 = Instant::from_secs_f64(100.0);
        let score = tier.score(t0, Duration::from_secs(1));
        tier.place(t0, QueryId(1), &score);
        assert!(tier.unavailable(t0, TemplateId(1)).unwrap().contains("concurrency limit"));
        assert!(tier.release(t0, QueryId(1)), "a failed offload frees its slot");
        assert_eq!(tier.unavailable(t0, TemplateId(1)), None);
        tier.throttled(t0);
        let why = tier.unavailable(t0 + Duration::from_millis(500), TemplateId(1)).unwrap();
        assert!(why.contains("throttled 1 offload(s) in a row; offloads resume in 0.5 s"), "{why}");
        assert_eq!(tier.unavailable(t0 + THROTTLE_COOLDOWN_MIN, TemplateId(1)), None);
        tier.throttled(t0 + THROTTLE_COOLDOWN_MIN);
        assert!(tier.unavailable(t0 + THROTTLE_COOLDOWN_MIN.mul_f64(2.0), TemplateId(1)).is_some(), "the second throttle in a row waits 2 s");
        assert_eq!(tier.unavailable(t0 + THROTTLE_COOLDOWN_MIN.mul_f64(3.0), TemplateId(1)), None);
    }

    proptest! {
        #[test]
        fn throttle_cooldowns_grow_and_stay_bounded(throttles in 1u32..40, at_s in 0.0f64..1e6) {
            let mut tier = ElasticRouting::new(ElasticOptions::default());
            let now = Instant::from_secs_f64(at_s);
            let mut last = Duration::ZERO;
            for _ in 0..throttles {
                tier.throttled(now);
                let until = tier.cooling_until.unwrap();
                let cooldown = until.saturating_duration_since(now);
                prop_assert!(cooldown >= last && cooldown >= THROTTLE_COOLDOWN_MIN && cooldown <= THROTTLE_COOLDOWN_MAX);
                prop_assert!(tier.unavailable(until - Duration::from_micros(1), TemplateId(1)).is_some());
                prop_assert!(tier.unavailable(until, TemplateId(1)).is_none());
                last = cooldown;
            }
        }

        #[test]
        fn offload_happens_only_when_no_cluster_meets_the_slo(
            queries in prop::collection::vec((1u32..20, 1.0f64..60.0), 1..40),
            clusters in 1usize..3,
        ) {
            let mut r = router(fast());
            let p = pool(clusters);
            for (id, &(template, slo_s)) in queries.iter().enumerate() {
                let now = Instant::from_secs_f64(id as f64 * 0.1);
                let routing = r.route(now, &query(id as u64, template, slo_s, now), &p);
                let fits = r.last_scores().iter().any(|s| s.marginal_violations <= 0);
                prop_assert!(!(fits && is_elastic(&routing)), "offloaded though a cluster fits: {:?}", r.last_scores());
            }
        }
    }
}
