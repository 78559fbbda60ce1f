//! `SloRouter::route` on fleets of realistic size (AutoSLO Figure 8a):
//! clusters {1, 2, 4, 8, 16} × running queries per cluster {1, 4, 16, 64},
//! with a trained concurrency-aware predictor. Each sample routes one query
//! on a fresh copy of the fleet's router state. Before criterion's means,
//! it prints sampled p50/p99 per decision at 16 clusters × 64 running
//! (2,000 decisions, each timed alone).
//!
//! `cargo bench -p slogate-core --bench route`
// A benchmark measures wall time; core's ban on clocks is for its logic.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{ClusterId, ClusterState, ClusterView, Pool, PoolId, Query, QueryId, Rpu, Slo, TemplateId};
use slogate_core::predict::concurrency::{ConcurrencyAware, ConcurrencyConfig};
use slogate_core::predict::{LatencyPredictor, Observation};
use slogate_core::route::RoutingPolicy;
use slogate_core::route::slo::SloRouter;
use slogate_core::time::{Duration, Instant};

fn predictor() -> ConcurrencyAware {
    let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
    for t in 1..=99u32 {
        for n in [0u32, 1, 2, 4, 8, 16, 32, 64] {
            p.observe(&Observation {
                template: TemplateId(t),
                size: Rpu(16),
                neighbours: n,
                latency: Duration::from_secs_f64(f64::from(t % 17 + 1) * (1.0 + f64::from(n))),
                censored: false,
            });
        }
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

fn fleet(clusters: u32, running: u64) -> (SloRouter<ConcurrencyAware>, Pool) {
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
    let mut router = SloRouter::new("slogate", predictor(), BillingConfig::default());
    // Fill the fleet: the router spreads these over the clusters.
    for id in 0..u64::from(clusters) * running {
        router.route(Instant::from_secs_f64(1.0), &query(id), &pool);
    }
    (router, pool)
}

fn sampled_percentiles() {
    let (router, pool) = fleet(16, 64);
    let next = query(1_000_000);
    let mut samples_us: Vec<f64> = (0..2_000)
        .map(|_| {
            let mut copy = router.clone();
            let started = std::time::Instant::now();
            criterion::black_box(copy.route(Instant::from_secs_f64(1.0), &next, &pool));
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples_us.sort_by(f64::total_cmp);
    let at = |q: f64| samples_us[((q * samples_us.len() as f64) as usize).min(samples_us.len() - 1)];
    eprintln!("route 16 clusters x 64 running: p50 {:.1} us, p99 {:.1} us over {} decisions", at(0.5), at(0.99), samples_us.len());
}

fn bench(c: &mut Criterion) {
    sampled_percentiles();
    let mut group = c.benchmark_group("route");
    for clusters in [1u32, 2, 4, 8, 16] {
        for running in [1u64, 4, 16, 64] {
            let (router, pool) = fleet(clusters, running);
            let next = query(1_000_000);
            group.bench_function(BenchmarkId::new(format!("{clusters}_clusters"), running), |b| {
                b.iter_batched(|| router.clone(), |mut r| r.route(Instant::from_secs_f64(1.0), &next, &pool), BatchSize::SmallInput)
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
