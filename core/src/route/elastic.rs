//! The elastic tier as one more routing candidate (Spandana's per-request
//! offload, inside AutoSLO's Algorithm 1).
//!
//! The router keeps its own view of the tier: a warm pool and a count of
//! running invocations driven only by the offloads it made and the
//! completions it saw, and its elastic spend over the last hour. A query
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

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::elastic::{ElasticConfig, ElasticPool};
use crate::model::{ExecutionReport, QueryId, Rpu, TemplateId};
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
}

/// The router's view of the tier. See the module docs.
#[derive(Clone, Debug)]
pub struct ElasticRouting {
    options: ElasticOptions,
    pool: ElasticPool,
    /// Running offloads and their estimated bills.
    running: HashMap<QueryId, f64>,
    /// Completed offloads' bills, `(finished, dollars)`, within the last
    /// hour.
    spent: VecDeque<(Instant, f64)>,
    offloads: u64,
}

const HOUR: Duration = Duration::from_secs(3_600);

impl ElasticRouting {
    /// A view of a tier with `options`, nothing running.
    pub fn new(options: ElasticOptions) -> Self {
        ElasticRouting { options, pool: ElasticPool::new(), running: HashMap::new(), spent: VecDeque::new(), offloads: 0 }
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
        completed + self.running.values().sum::<f64>()
    }

    /// Why `template` cannot go to the tier at `now`, if it cannot (apart
    /// from the clusters' state, which the router judges).
    pub fn unavailable(&self, now: Instant, template: TemplateId) -> Option<String> {
        if self.options.templates.as_ref().is_some_and(|allowed| !allowed.contains(&template)) {
            return Some(format!("template {template} may not run elastically"));
        }
        if !self.pool.has_capacity(&self.options.config) {
            return Some(format!("the elastic tier is at its concurrency limit ({})", self.options.config.concurrency_limit));
        }
        if let Some(cap) = self.options.spend_cap_usd_per_hour {
            let spent = self.spend_last_hour_usd(now);
            if spent >= cap {
                return Some(format!("the elastic spend cap is reached (${spent:.4} of ${cap:.4} in the last hour)"));
            }
        }
        None
    }

    /// The offload's predicted latency and bill, given the query's
    /// predicted isolated latency at `reference_latency` (its latency on a
    /// cluster of the tier's reference size).
    pub fn score(&self, now: Instant, reference_latency: Duration) -> ElasticScore {
        let config = &self.options.config;
        let run = config.execution_time(reference_latency);
        let cold = if self.pool.would_be_warm(now, config) { Duration::ZERO } else { config.cold_start };
        ElasticScore { predicted_latency: cold + run, cost_usd: config.invocation_cost_usd(cold + run) }
    }

    /// The reference size whose isolated latency [`ElasticRouting::score`]
    /// takes.
    pub fn reference_size(&self) -> Rpu {
        self.options.config.reference_size
    }

    /// Records an offload placed at `now` with its estimated bill.
    pub fn place(&mut self, now: Instant, query: QueryId, cost_usd: f64) {
        self.pool.start(now, &self.options.config);
        self.running.insert(query, cost_usd);
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
        if self.running.remove(&report.query).is_none() {
            return false;
        }
        self.pool.finish(now, &self.options.config);
        let started = report.started.unwrap_or(report.dispatched);
        self.spent.push_back((report.finished, self.options.config.invocation_cost_usd(report.finished - started)));
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

    proptest! {
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
