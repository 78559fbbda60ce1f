//! The simulator end to end: a 15,000-query workload (BaseWorkloads back
//! to back at λ = 0.2, cut at 15,000) routed round-robin over [16, 16] on the
//! emulated warehouse. Reports time per run; events per second is
//! `events / time`, printed once before measuring.
//!
//! `cargo bench -p slogate-loadgen --bench simulate`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use slogate_world::catalog::tpcds_template_set;
use slogate_core::model::{PoolId, QueryId, Rpu};
use slogate_core::route::RoundRobin;
use slogate_core::sim::Simulation;
use slogate_core::time::{Duration, Instant};
use slogate_world::{World, WorldConfig};
use slogate_loadgen::workload::{assign_slos, base_workload, to_queries};

const QUERIES: usize = 15_000;

fn workload() -> Vec<slogate_core::model::Query> {
    let templates = tpcds_template_set();
    let mut queries = Vec::new();
    let mut offset = Duration::ZERO;
    for run in 0.. {
        if queries.len() >= QUERIES {
            break;
        }
        let mut part = base_workload(&templates, 0.2, run).expect("valid rate");
        assign_slos(&mut part, &templates, 4.0).expect("valid kappa");
        let mut part = to_queries(&part, &PoolId::default()).expect("slos assigned");
        let end = part.last().map_or(Duration::ZERO, |q| q.arrival - Instant::ZERO);
        for q in &mut part {
            q.id = QueryId(queries.len() as u64);
            q.arrival += offset;
            queries.push(q.clone());
        }
        offset += end;
    }
    queries.truncate(QUERIES);
    queries
}

fn simulate(queries: &[slogate_core::model::Query]) -> u64 {
    let mut world = World::new(WorldConfig::default());
    world.add_cluster(Instant::ZERO, Rpu(16), true);
    world.add_cluster(Instant::ZERO, Rpu(16), true);
    let mut sim = Simulation::new(world, RoundRobin::default(), queries.to_vec());
    sim.drive_until_idle();
    sim.summary().events
}

fn bench(c: &mut Criterion) {
    let queries = workload();
    let events = simulate(&queries);
    eprintln!("workload: {} queries, {} engine events per run", queries.len(), events);
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    group.throughput(Throughput::Elements(events));
    group.bench_function("round_robin_15k_queries", |b| b.iter(|| simulate(&queries)));
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
