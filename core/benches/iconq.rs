//! Iconq+'s inference per arrival as congestion grows (AutoSLO Figure 7b),
//! and the SLO-aware router's decision time with it.
//!
//! - `iconq/incremental/N`: one arrival on a 16-RPU cluster running `N`
//!   queries, through `IconqPredictor::predict_placement`: the newcomer
//!   reads the `N` running queries, and each running query's memory
//!   advances one step.
//! - `iconq/full/N`: the same arrival re-ingesting every running query's
//!   whole neighbour sequence (what Iconq's backward pass needs).
//! - Before criterion's means, sampled p50/p99 of `SloRouter::route` with
//!   Iconq+ at 16 clusters × 64 running (2,000 decisions, each timed
//!   alone), reading up to 64 neighbours a side and, as the trainer's
//!   default model does, 32: each decision on a copy of the same router
//!   (`fresh`), and in a live router's loop (`steady`: each decision
//!   places its query, and the oldest query on the cluster it chose
//!   completes, so that the fleet stays at 64 a cluster, the next decision
//!   finds that cluster's memories new, and the base predictor learns and
//!   refits as on a node).
//!
//! The weights are drawn at the trainer's default widths (LSTMs of 32,
//! head of 32) and read up to 64 neighbours a side: inference time depends
//! on the shapes, not the values.
//!
//! `cargo bench -p slogate-core --bench iconq`
// A benchmark measures wall time; core's ban on clocks is for its logic.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::sync::Arc;

mod common;

/// The node binary's allocator: a route allocates each placement's
/// states, and the node runs it under mimalloc.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{ClusterId, ClusterState, ClusterView, ExecutionOutcome, ExecutionReport, Pool, PoolId, Query, QueryId, Rpu, Slo, Target, TemplateId};
use slogate_core::predict::concurrency::ConcurrencyAware;
use slogate_core::predict::iconq::{
    CONTEXT_FEATURES, Dense, FEATURE_SCHEMA_VERSION, FEATURES, Hidden, IconqPredictor, IconqWeights, Lstm, Member, TARGET_FEATURES, interaction,
};
use slogate_core::predict::{LatencyPredictor, QueryState};
use slogate_core::route::{RouteDecision, Routing, RoutingPolicy};
use slogate_core::route::slo::SloRouter;
use slogate_core::time::{Duration, Instant};

const HIDDEN: usize = 32;

fn weights() -> Arc<IconqWeights> {
    let mut rng = SmallRng::seed_from_u64(7);
    let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-0.2f32..0.2)).collect::<Vec<f32>>();
    let mut lstm = || Lstm { input: FEATURES, hidden: HIDDEN, w_ih: draw(4 * HIDDEN * FEATURES), w_hh: draw(4 * HIDDEN * HIDDEN), b_ih: draw(4 * HIDDEN), b_hh: draw(4 * HIDDEN) };
    let (before, after) = (lstm(), lstm());
    let inputs = 2 * HIDDEN + TARGET_FEATURES + CONTEXT_FEATURES;
    let mut rng = SmallRng::seed_from_u64(8);
    let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-0.2f32..0.2)).collect::<Vec<f32>>();
    Arc::new(IconqWeights {
        schema_version: FEATURE_SCHEMA_VERSION,
        before,
        after,
        hidden: Hidden { width: HIDDEN, w: draw(HIDDEN * inputs), b: draw(HIDDEN) },
        out: Dense { w: draw(HIDDEN), b: 0.0 },
        neighbours_max: 64,
    })
}

/// The base predictor: the planner benchmarks' learned one.
fn base() -> ConcurrencyAware {
    common::router().predictor_mut().clone()
}

fn query(id: u64) -> Query {
    Query {
        id: QueryId(id),
        pool: PoolId::default(),
        template: TemplateId(1 + (id % 99) as u32),
        slo: Slo { latency: Duration::from_secs(600) },
        arrival: Instant::from_secs_f64(id as f64 * 0.01),
    }
}

/// `running` queries placed one after another on one cluster.
fn congested(predictor: &IconqPredictor, running: u64) -> (Vec<QueryState>, Vec<Query>) {
    let mut states = Vec::new();
    let mut queries = Vec::new();
    for id in 0..running {
        let q = query(id);
        let placement = predictor.predict_placement(q.arrival, &q, Rpu(16), &states, None);
        states = placement.running;
        states.push(placement.query);
        queries.push(q);
    }
    (states, queries)
}

/// The arrival of `next` with every running query's sequence re-read.
fn full_reingestion(predictor: &IconqPredictor, weights: &IconqWeights, queries: &[Query], next: &Query) -> f64 {
    let size = Rpu(16);
    let member = |q: &Query| Member { isolated_s: predictor.isolated(q.template, size).as_secs_f64(), arrival_s: q.arrival.as_secs_f64() };
    let mut all: Vec<&Query> = queries.iter().collect();
    all.push(next);
    let mut total = 0.0;
    for (i, q) in all.iter().enumerate() {
        let target = member(q);
        let before: Vec<[f32; FEATURES]> = all[..i].iter().map(|n| interaction(target, member(n), size)).collect();
        let after: Vec<[f32; FEATURES]> = all[i + 1..].iter().map(|n| interaction(target, member(n), size)).collect();
        let memory = weights.memory(&before, &after);
        total += f64::from(weights.head(&memory, &[0.0; TARGET_FEATURES], false));
    }
    total
}

fn router_percentiles(weights: &Arc<IconqWeights>) {
    let predictor = IconqPredictor::new(base(), weights.clone()).expect("the bench's weights check");
    let pool = Pool {
        id: PoolId::default(),
        clusters: (0..16)
            .map(|i| ClusterView { id: ClusterId(i), size: Rpu(16), state: ClusterState::Ready, requested_at: Instant::ZERO, ready_at: Instant::ZERO, running: Vec::new() })
            .collect(),
    };
    let mut router = SloRouter::new("slogate", predictor, BillingConfig::default());
    // 64 queries on each cluster, placed where the bench says.
    for id in 0..16 * 64u64 {
        let q = query(id);
        router.route_in_shadow(q.arrival, &q, &pool, Target::Cluster(ClusterId((id % 16) as u32)));
    }
    let next = query(1_000_000);
    let fresh: Vec<f64> = (0..2_000)
        .map(|_| {
            let mut copy = router.clone();
            let started = std::time::Instant::now();
            criterion::black_box(copy.route(next.arrival, &next, &pool));
            started.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    report(weights, "fresh", fresh);
    // The live loop: each cluster's queries, oldest first.
    let mut placed: Vec<std::collections::VecDeque<Query>> = (0..16u64).map(|c| (0..64u64).map(|i| query(i * 16 + c)).collect()).collect();
    let steady: Vec<f64> = (0..2_000u64)
        .map(|i| {
            let next = query(1_000_000 + i);
            let started = std::time::Instant::now();
            let routing = criterion::black_box(router.route(next.arrival, &next, &pool));
            let took_us = started.elapsed().as_secs_f64() * 1e6;
            let Routing::Dispatch(RouteDecision { target: Target::Cluster(cluster), .. }) = routing else { panic!("the fleet takes every query: {routing:?}") };
            let on = &mut placed[cluster.0 as usize];
            on.push_back(next.clone());
            let done = on.pop_front().expect("the cluster runs queries");
            let report = ExecutionReport {
                query: done.id,
                target: Target::Cluster(cluster),
                arrival: done.arrival,
                dispatched: done.arrival,
                started: Some(done.arrival),
                finished: next.arrival,
                outcome: ExecutionOutcome::Completed,
            };
            router.handle_completion(next.arrival, &report);
            took_us
        })
        .collect();
    report(weights, "steady", steady);
}

fn report(weights: &IconqWeights, loop_name: &str, mut samples_us: Vec<f64>) {
    samples_us.sort_by(f64::total_cmp);
    let at = |q: f64| samples_us[((q * samples_us.len() as f64) as usize).min(samples_us.len() - 1)];
    eprintln!(
        "route with iconq (up to {} neighbours a side), 16 clusters x 64 running, {loop_name}: p50 {:.1} us, p99 {:.1} us over {} decisions",
        weights.neighbours_max,
        at(0.5),
        at(0.99),
        samples_us.len()
    );
}

fn bench(c: &mut Criterion) {
    let weights = weights();
    router_percentiles(&weights);
    // The trainer's default: the 32 nearest neighbours a side.
    router_percentiles(&Arc::new(IconqWeights { neighbours_max: 32, ..(*weights).clone() }));
    let predictor = IconqPredictor::new(base(), weights.clone()).expect("the bench's weights check");
    let mut group = c.benchmark_group("iconq");
    for running in [1u64, 8, 16, 32, 64] {
        let (states, queries) = congested(&predictor, running);
        let next = query(10_000);
        group.bench_function(BenchmarkId::new("incremental", running), |b| {
            b.iter_batched(|| states.clone(), |s| predictor.predict_placement(next.arrival, &next, Rpu(16), &s, None), BatchSize::SmallInput)
        });
        group.bench_function(BenchmarkId::new("full", running), |b| b.iter(|| full_reingestion(&predictor, &weights, &queries, &next)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
