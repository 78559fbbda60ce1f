//! `SloRouter::route` on fleets of realistic size (AutoSLO Figure 8a):
//! clusters {1, 2, 4, 8, 16} × running queries per cluster {1, 4, 16, 64},
//! with a trained concurrency-aware predictor and a margin warmed from
//! noisy executions (so that, as on a live node, every placement's miss
//! probabilities are read from the learned spread). Each sample routes one
//! query on a fresh copy of the fleet's router state. Before criterion's means,
//! it prints sampled p50/p99 per decision at 16 clusters × 64 running
//! (2,000 decisions, each timed alone).
//!
//! The `steady` group is a live router's loop instead: on one router, warm
//! in the cache, each iteration routes a query and completes the oldest
//! running one (the margin and predictor learn from it; refits are
//! deferred, as on a node), so that the fleet stays at 64 running queries
//! a cluster (or 2: a node under `slogate-loadgen bench-gateway`, whose
//! time compression finishes queries almost as they start, runs few). It
//! is what a node's routing thread pays a query.
//!
//! `cargo bench -p slogate-core --bench route`
// A benchmark measures wall time; core's ban on clocks is for its logic.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use slogate_core::billing::BillingConfig;
use std::collections::VecDeque;

use slogate_core::model::{ClusterId, ClusterState, ClusterView, ExecutionOutcome, ExecutionReport, Pool, PoolId, Query, QueryId, Rpu, Slo, Target, TemplateId};
use slogate_core::predict::concurrency::{ConcurrencyAware, ConcurrencyConfig};
use slogate_core::predict::{LatencyPredictor, Observation};
use slogate_core::route::{Routing, RoutingPolicy};
use slogate_core::route::slo::SloRouter;
use slogate_core::time::{Duration, Instant};
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Executions of templates 1..=99 on 16 RPU at 0 to 64 neighbours, each
/// off its template's curve by up to ±40% (seeded).
fn history() -> Vec<Observation> {
    let mut rng = SmallRng::seed_from_u64(1);
    let mut history = Vec::new();
    for t in 1..=99u32 {
        for n in [0u32, 1, 2, 4, 8, 16, 32, 64] {
            let noise = rng.random_range(0.6..1.4);
            history.push(Observation {
                template: TemplateId(t),
                size: Rpu(16),
                neighbours: n,
                latency: Duration::from_secs_f64(f64::from(t % 17 + 1) * (1.0 + f64::from(n)) * noise),
                censored: false,
            });
        }
    }
    history
}

fn predictor(history: &[Observation]) -> ConcurrencyAware {
    let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
    for o in history {
        p.observe(o);
    }
    p.fit();
    p
}

fn query(id: u64) -> Query {
    Query {
        id: QueryId(id),
        pool: PoolId::default(),
        template: TemplateId(1 + (id % 99) as u32),
        slo: Slo { latency: Duration::from_secs(600) },
        arrival: Instant::from_secs_f64(1.0),
    }
}

/// Seconds between the arrivals that fill a fleet: spread in time, as a
/// live router sees them, so that the router prices the queries to come
/// (`slogate_core::route::future`) from their rate.
const FILL_GAP_S: f64 = 0.01;

/// A router whose fleet of `clusters` 16-RPU clusters runs `running`
/// queries each, filled from one second on, every [`FILL_GAP_S`]; and
/// when the next query arrives.
fn fleet(clusters: u32, running: u64) -> (SloRouter<ConcurrencyAware>, Pool, Instant) {
    let pool = Pool {
        id: PoolId::default(),
        clusters: (0..clusters)
            .map(|i| ClusterView {
                id: ClusterId(i),
                size: Rpu(16),
                state: ClusterState::Ready,
                requested_at: Instant::ZERO,
                ready_at: Instant::ZERO,
                running: Vec::new(),
            })
            .collect(),
    };
    let history = history();
    let mut router = SloRouter::new("slogate", predictor(&history), BillingConfig::default());
    router.warm_margin(&history);
    assert!(router.margin_state().samples > 0, "the margin applies");
    // Fill the fleet, `running` queries a cluster, placed in turn.
    let filled = u64::from(clusters) * running;
    let at = |id: u64| Instant::from_secs_f64(1.0 + id as f64 * FILL_GAP_S);
    for id in 0..filled {
        let mut q = query(id);
        q.arrival = at(id);
        router.route_in_shadow(q.arrival, &q, &pool, Target::Cluster(ClusterId((id % u64::from(clusters)) as u32)));
    }
    (router, pool, at(filled))
}

fn sampled_percentiles() {
    let (router, pool, now) = fleet(16, 64);
    let next = Query { arrival: now, ..query(1_000_000) };
    let mut samples_us: Vec<f64> = (0..2_000)
        .map(|_| {
            let mut copy = router.clone();
            let started = std::time::Instant::now();
            criterion::black_box(copy.route(now, &next, &pool));
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples_us.sort_by(f64::total_cmp);
    let at = |q: f64| samples_us[((q * samples_us.len() as f64) as usize).min(samples_us.len() - 1)];
    eprintln!("route 16 clusters x 64 running: p50 {:.1} us, p99 {:.1} us over {} decisions", at(0.5), at(0.99), samples_us.len());
}

/// A router in a live loop: queries in flight, oldest first.
struct Steady {
    router: SloRouter<ConcurrencyAware>,
    pool: Pool,
    running: VecDeque<(Query, Target)>,
    next_id: u64,
    now_s: f64,
}

impl Steady {
    fn new(clusters: u32, running_per_cluster: usize) -> Self {
        let (mut router, pool, _) = fleet(clusters, 0);
        router.defer_fits();
        let mut steady = Steady { router, pool, running: VecDeque::new(), next_id: 0, now_s: 1.0 };
        while steady.running.len() < running_per_cluster * clusters as usize {
            steady.route_one();
        }
        steady
    }

    fn route_one(&mut self) {
        self.now_s += 0.05;
        let mut query = query(self.next_id);
        query.arrival = Instant::from_secs_f64(self.now_s);
        self.next_id += 1;
        match self.router.route(query.arrival, &query, &self.pool) {
            Routing::Dispatch(decision) => self.running.push_back((query, decision.target)),
            Routing::Reject { reason } => panic!("rejected: {reason}"),
        }
    }

    /// Routes one query and completes the oldest.
    fn iterate(&mut self) {
        self.route_one();
        let (query, target) = self.running.pop_front().expect("the fleet runs queries");
        let finished = Instant::from_secs_f64(self.now_s);
        let report = ExecutionReport { query: query.id, target, arrival: query.arrival, dispatched: query.arrival, started: Some(query.arrival), finished, outcome: ExecutionOutcome::Completed };
        self.router.handle_completion(finished, &report);
    }
}

fn bench(c: &mut Criterion) {
    sampled_percentiles();
    let mut steady = c.benchmark_group("steady");
    for (clusters, running) in [(2u32, 2usize), (2, 64), (16, 64)] {
        let mut state = Steady::new(clusters, running);
        steady.bench_function(BenchmarkId::new(format!("{clusters}_clusters"), running), |b| b.iter(|| state.iterate()));
    }
    steady.finish();
    let mut group = c.benchmark_group("route");
    for clusters in [1u32, 2, 4, 8, 16] {
        for running in [1u64, 4, 16, 64] {
            let (router, pool, now) = fleet(clusters, running);
            let next = Query { arrival: now, ..query(1_000_000) };
            group.bench_function(BenchmarkId::new(format!("{clusters}_clusters"), running), |b| {
                b.iter_batched(|| router.clone(), |mut r| r.route(now, &next, &pool), BatchSize::SmallInput)
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
