//! The policy tuner's two expensive functions (AutoSLO Figure 8c/d):
//!
//! - `simulate_batch`: one configuration on workloads of {1,000, 5,000,
//!   15,000} queries × {1, 4, 16} workloads simulated in parallel (2
//!   threads), on the planner's warehouse from one 16-RPU cluster with the
//!   slogate autoscaler;
//! - `find_good_spinup_times` (Algorithm 5): {5, 10, 20} forecasts ×
//!   {1,000, 5,000, 15,000} queries each, on synthetic traces with
//!   congestion every 20 minutes.
//!
//! Workloads are a day of arrivals over 99 templates (2–36 s isolated at
//! 16 RPU) with SLOs 4× that; the router's predictor is trained on a
//! synthetic law (inverse in size, stretched by 1 + neighbours/4).
//!
//! `cargo bench -p slogate-core --bench tune`
// A benchmark measures wall time; core's ban on clocks is for its logic.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{PoolId, Query, QueryId, Rpu, Slo, TemplateId};
use slogate_core::scale::{AutoscalerConfig, AutoscalerPolicy};
use slogate_core::time::{Duration, Instant};
use slogate_core::tune::batch::QueryTrace;
use slogate_core::tune::schedule::find_good_spinup_times;
use slogate_core::tune::{BatchSetup, ExecutionConfig, PlannerTerms, simulate_batch};

mod common;

use common::{isolated_s, router};

/// `count` queries over a day, denser in office hours.
fn day(count: u64, seed: u64) -> Vec<Query> {
    (0..count)
        .map(|i| {
            let template = 1 + ((i * 37 + seed * 11) % 99) as u32;
            // Quadratic warp: more arrivals mid-day.
            let u = (i as f64 + 0.5) / count as f64;
            let at = 86_400.0 * (0.5 + 0.5 * (2.0 * u - 1.0) * (2.0 * u - 1.0).abs());
            Query {
                id: QueryId(i),
                pool: PoolId::default(),
                template: TemplateId(template),
                slo: Slo { latency: Duration::from_secs_f64(4.0 * isolated_s(template, 16)) },
                arrival: Instant::from_secs_f64(at),
            }
        })
        .collect()
}

fn traces(count: u64, seed: u64) -> Vec<QueryTrace> {
    (0..count)
        .map(|i| {
            let arrival = 86_400.0 * i as f64 / count as f64;
            let congested = (arrival as u64 + seed * 60) % 1_200 < 300;
            QueryTrace { arrival: Instant::from_secs_f64(arrival), finished: Instant::from_secs_f64(arrival + if congested { 400.0 } else { 20.0 }), violated: congested }
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let router = router();
    let setup = BatchSetup {
        initial_clusters: vec![Rpu(16)],
        policy: AutoscalerPolicy::SLOGATE,
        billing: BillingConfig::default(),
        terms: PlannerTerms::default(),
        threads: 2,
    };
    let config = [ExecutionConfig { spinups: Vec::new(), knobs: AutoscalerConfig::default() }];
    let mut group = c.benchmark_group("simulate_batch");
    group.sample_size(10);
    for queries in [1_000u64, 5_000, 15_000] {
        for parallel in [1u64, 4, 16] {
            let workloads: Vec<Vec<Query>> = (0..parallel).map(|s| day(queries, s)).collect();
            group.bench_with_input(BenchmarkId::new(format!("{queries}q"), format!("{parallel}w")), &workloads, |b, w| {
                b.iter(|| simulate_batch(&setup, &router, &config, w))
            });
        }
    }
    group.finish();
    let mut group = c.benchmark_group("find_good_spinup_times");
    group.sample_size(10);
    for forecasts in [5u64, 10, 20] {
        for queries in [1_000u64, 5_000, 15_000] {
            let logs: Vec<Vec<QueryTrace>> = (0..forecasts).map(|s| traces(queries, s)).collect();
            let slices: Vec<&[QueryTrace]> = logs.iter().map(|l| &l[..]).collect();
            group.bench_with_input(BenchmarkId::new(format!("{forecasts}f"), format!("{queries}q")), &slices, |b, s| {
                b.iter(|| find_good_spinup_times(s, 0.1, (forecasts as usize).div_ceil(2), Duration::from_secs(300), Duration::from_secs(900)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
