//! The concurrency-aware predictor's refit (`FitJob::run`), the learning a
//! node runs off its routing thread every `refit_every` completions once
//! its window is full: a warm-started fit over a full window of 16,384
//! executions (99 templates on 8, 16 and 32 RPU at 0 to 64 neighbours,
//! 5% censored, seeded), and the cold first fit of the same window.
//!
//! `cargo bench -p slogate-core --bench fit`
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use slogate_core::model::{Rpu, TemplateId};
use slogate_core::predict::concurrency::{ConcurrencyAware, ConcurrencyConfig, FitJob};
use slogate_core::predict::{LatencyPredictor, Observation};
use slogate_core::time::Duration;

/// The node binary's allocator: a fit allocates its rows and tables.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn observation(rng: &mut SmallRng) -> Observation {
    let template = rng.random_range(1..=99u32);
    let size = [8u32, 16, 32][rng.random_range(0..3)];
    let neighbours = rng.random_range(0..=64u32);
    let isolated_s = f64::from(template % 17 + 1) * 16.0 / f64::from(size);
    let slowdown = 1.0 + f64::from(neighbours) * f64::from(template % 5 + 1) / 10.0;
    Observation {
        template: TemplateId(template),
        size: Rpu(size),
        neighbours,
        latency: Duration::from_secs_f64(isolated_s * slowdown * rng.random_range(0.6..1.4)),
        censored: rng.random_bool(0.05),
    }
}

/// A predictor that defers its refits, with a full window, and the RNG
/// that drew it.
fn full_window() -> (ConcurrencyAware, SmallRng) {
    let config = ConcurrencyConfig::default();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut predictor = ConcurrencyAware::new(config.clone());
    predictor.defer_fits();
    for _ in 0..config.window {
        predictor.observe(&observation(&mut rng));
    }
    (predictor, rng)
}

/// The refit after a fit of the full window and `refit_every` more
/// executions.
fn warm_job() -> FitJob {
    let (mut predictor, mut rng) = full_window();
    if let Some(job) = predictor.take_fit_job() {
        predictor.install_fit(job.run());
    }
    for _ in 0..ConcurrencyConfig::default().refit_every {
        predictor.observe(&observation(&mut rng));
    }
    predictor.take_fit_job().expect("a refit falls due every refit_every observations")
}

/// The first fit of the full window.
fn cold_job() -> FitJob {
    full_window().0.take_fit_job().expect("the young window's last refit fell due")
}

fn bench_fit(c: &mut Criterion) {
    let warm = warm_job();
    let cold = cold_job();
    assert_eq!(warm.len(), ConcurrencyConfig::default().window);
    let mut group = c.benchmark_group("fit");
    group.sample_size(20);
    group.bench_function("warm/16384", |b| b.iter_batched(|| warm.clone(), FitJob::run, BatchSize::LargeInput));
    group.bench_function("cold/16384", |b| b.iter_batched(|| cold.clone(), FitJob::run, BatchSize::LargeInput));
    group.finish();
}

criterion_group!(benches, bench_fit);
criterion_main!(benches);
