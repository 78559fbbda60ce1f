//! A clairvoyant reference for `slogate eval e2e-diurnal`'s cost goal.
//!
//! For each target day and κ of the evaluation, it runs every hour's
//! arrivals alone on each of a few static pools (slogate's router, the
//! emulated warehouse) and keeps the cheapest pool whose VR that hour is at
//! most `--hour-vr` (default 0.1). The sum over the day is what a policy
//! that knew each hour's load in advance, and paid nothing to switch
//! pools, would spend by choosing one of these pools per hour. It is a
//! reference for how much a cost goal asks, not a lower bound: a policy may
//! trade violations between hours, or use pools not listed here.
//!
//! `cargo run --release -p slogate --example e2e_hourly_oracle -- --seeds 1..5`

use slogate::eval::tuner::{KAPPAS, TARGET_DAYS, day_queries, learn_from, workload};
use slogate::eval::{PoolTerms, Scenario, build_policy_with, training_executions};
use slogate_core::sim::Simulation;
use slogate_world::World;

const POOLS: [&[u32]; 7] = [&[4], &[8], &[16], &[16, 16], &[32], &[16, 32], &[64]];

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let seeds: Vec<u64> = match value("--seeds") {
        Some(range) => {
            let (a, b) = range.split_once("..").expect("--seeds A..B");
            (a.parse().expect("a seed")..=b.parse().expect("a seed")).collect()
        }
        None => vec![1],
    };
    let hour_vr: f64 = value("--hour-vr").map_or(0.1, |v| v.parse().expect("--hour-vr is a fraction"));
    let templates = Scenario::templates();
    for seed in seeds {
        let (history, _) = learn_from(&training_executions(&[4, 8, 16, 32, 64], seed)).expect("the training log learns");
        for &kappa in &KAPPAS {
            let entries = workload(&templates, kappa, seed).expect("the workload generates");
            for &day in &TARGET_DAYS {
                let queries = day_queries(&entries, day).expect("the day's queries");
                let (mut cost_usd, mut violations) = (0.0, 0.0);
                for hour in 0..24 {
                    let slice: Vec<_> = queries.iter().filter(|q| (q.arrival.as_secs_f64() / 3_600.0).floor() as u32 == hour).cloned().collect();
                    let mut best: Option<(f64, f64)> = None;
                    let mut fallback = (f64::INFINITY, 0.0);
                    for sizes in POOLS {
                        let router = build_policy_with("slogate", &history, &PoolTerms::default()).expect("slogate builds");
                        let mut sim = Simulation::new(World::seeded_with_ready(seed, sizes), router, slice.clone());
                        sim.drive_until_idle();
                        let summary = sim.summary();
                        let here = (summary.cost_usd, summary.violation_rate * slice.len() as f64);
                        if summary.violation_rate <= hour_vr && best.is_none_or(|b| here.0 < b.0) {
                            best = Some(here);
                        }
                        if here.1 < fallback.1 || fallback.0.is_infinite() {
                            fallback = here;
                        }
                    }
                    let (cost, missed) = best.unwrap_or(fallback);
                    cost_usd += cost;
                    violations += missed;
                }
                println!("seed {seed} day {day} κ={kappa}: hourly oracle ${cost_usd:.1}, VR {:.1}%", 100.0 * violations / queries.len().max(1) as f64);
            }
        }
    }
}
