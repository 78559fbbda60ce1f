//! The spinup size selector (Algorithm 3) on the planner's replay (AutoSLO
//! Figure 8b): candidate sizes {1, 2, 4} × arrival rate in the window
//! {0.1, 0.5, 1, 2} queries/s, w = 300 s, δ = 300 s, μ = 32, at most 30
//! copies and a 600 s horizon, candidates on 2 threads. The pool is one 16-RPU cluster, empty at the
//! decision (the preparation period fills it); the router's predictor is
//! trained on a synthetic law (99 templates, 2–36 s isolated at 16 RPU,
//! inverse in size, stretched by 1 + neighbours/4). Before criterion's
//! means it prints each case's replayed arrivals.
//!
//! `cargo bench -p slogate-core --bench select`
// A benchmark measures wall time; core's ban on clocks is for its logic.
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{QueryId, Rpu, Slo, TemplateId};
use slogate_core::scale::AutoscalerConfig;
use slogate_core::scale::replay::{SelectorConfig, SelectorMode, pool_of, select_spinup_size};
use slogate_core::scale::windows::ArrivalRecord;
use slogate_core::time::{Duration, Instant};

mod common;

use common::{isolated_s, router};

fn window(rate_per_s: f64, decision: Instant) -> Vec<ArrivalRecord> {
    let count = (300.0 * rate_per_s).round() as u64;
    (0..count)
        .map(|i| {
            let template = 1 + (i * 37 % 99) as u32;
            ArrivalRecord {
                query: QueryId(i),
                template: TemplateId(template),
                slo: Slo { latency: Duration::from_secs_f64(4.0 * isolated_s(template, 16)) },
                arrival: decision - Duration::from_secs(300) + Duration::from_secs_f64(i as f64 / rate_per_s),
            }
        })
        .collect()
}

fn config(sizes: &[u32]) -> SelectorConfig {
    let knobs = AutoscalerConfig { sizes: sizes.iter().copied().map(Rpu).collect(), selector_threads: 2, ..AutoscalerConfig::default() };
    knobs.selector_config(BillingConfig::default())
}

fn bench(c: &mut Criterion) {
    let router = router();
    let pool = pool_of(&[Rpu(16)]);
    let decision = Instant::from_secs_f64(10_000.0);
    let mut group = c.benchmark_group("select");
    group.sample_size(20);
    for sizes in [&[32u32][..], &[16, 32], &[4, 8, 16, 32]] {
        for rate in [0.1, 0.5, 1.0, 2.0] {
            let arrivals = window(rate, decision);
            let cfg = config(sizes);
            let selection = select_spinup_size(decision, &pool, &router, &arrivals, &cfg, SelectorMode::AddCluster);
            eprintln!(
                "select {} sizes, {rate} q/s: {} replayed arrivals, choice {:?}",
                sizes.len(),
                selection.replayed_arrivals,
                selection.choice
            );
            group.bench_function(BenchmarkId::new(format!("{}_sizes", sizes.len()), rate), |b| {
                b.iter(|| select_spinup_size(decision, &pool, &router, &arrivals, &cfg, SelectorMode::AddCluster))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
