//! Workload generators: BaseWorkload, the phased mixes, and a multi-day
//! diurnal workload. Each is a pure function of its parameters and seed.
//!
//! A workload is a list of [`TraceEntry`]s. Generators leave the SLO empty;
//! [`assign_slos`] sets `SLO(q) = κ × ℓ_baseline(template)` (AutoSLO
//! §8.1.3), and [`to_queries`] turns entries into the simulator's queries.
//!
//! # Properties
//!
//! - (A) BaseWorkload(λ) has exactly 3 queries of each of the 99 templates,
//!   arrivals non-decreasing from the first interarrival gap, mean rate λ.
//! - (B) A phased workload has the same 297 queries as BaseWorkload.
//! - (C) The diurnal workload's arrivals lie within its days, sorted, and
//!   weekday daytime is busier than night and weekend.
//! - (D) Same parameters and seed, same workload.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use slogate_core::model::{PoolId, Query, QueryId, Slo, Template, TemplateId};
use slogate_core::time::{Duration, Instant};

use crate::{Error, Result};

/// One query of a workload or trace file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceEntry {
    /// Arrival, relative to the start of the workload.
    pub arrival: Instant,
    /// Template or fingerprint.
    pub template: TemplateId,
    /// Latency SLO; `None` until assigned.
    pub slo: Option<Duration>,
    /// The pool it is submitted to, if the trace names one.
    pub pool: Option<PoolId>,
    /// The client's query id, if the trace names one (the gRPC
    /// `query_id`; the simulator numbers queries by position instead).
    pub query_id: Option<String>,
}

impl TraceEntry {
    fn generated(arrival: Instant, template: TemplateId) -> Self {
        TraceEntry { arrival, template, slo: None, pool: None, query_id: None }
    }
}

/// Copies of each template in BaseWorkload.
pub const BASE_COPIES: usize = 3;

/// An exponential interarrival gap at `rate_per_s`.
fn exponential_gap_s(rng: &mut SmallRng, rate_per_s: f64) -> f64 {
    -(1.0 - rng.random::<f64>()).ln() / rate_per_s
}

/// The 297 queries of BaseWorkload, shuffled.
fn shuffled_base_templates(templates: &[Template], rng: &mut SmallRng) -> Vec<TemplateId> {
    let mut ids: Vec<TemplateId> =
        templates.iter().flat_map(|t| std::iter::repeat_n(t.id, BASE_COPIES)).collect();
    ids.shuffle(rng);
    ids
}

fn check_rate(rate_per_s: f64) -> Result<()> {
    if rate_per_s.is_finite() && rate_per_s > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidParameter(format!("arrival rate must be a positive number, got {rate_per_s}")))
    }
}

/// BaseWorkload(λ) (AutoSLO §8.1.2): 3 copies of each template, shuffled,
/// issued by a Poisson process of rate `rate_per_s`.
pub fn base_workload(templates: &[Template], rate_per_s: f64, seed: u64) -> Result<Vec<TraceEntry>> {
    check_rate(rate_per_s)?;
    let mut rng = SmallRng::seed_from_u64(seed);
    let ids = shuffled_base_templates(templates, &mut rng);
    let mut at_s = 0.0;
    Ok(ids
        .into_iter()
        .map(|template| {
            at_s += exponential_gap_s(&mut rng, rate_per_s);
            TraceEntry::generated(Instant::from_secs_f64(at_s), template)
        })
        .collect())
}

/// The slow phase's rate in the phased mixes.
pub const PHASED_LOW_RATE_PER_S: f64 = 0.05;
/// Queries per fast phase in the phased mixes.
pub const PHASED_HIGH_QUERIES: usize = 10;

/// A "phased" BaseWorkload (AutoSLO §8.3.2): the same 297 shuffled queries,
/// alternating `low_queries` at λ = 0.05 and 10 at `high_rate_per_s`.
pub fn phased_workload(
    templates: &[Template],
    low_queries: usize,
    high_rate_per_s: f64,
    seed: u64,
) -> Result<Vec<TraceEntry>> {
    check_rate(high_rate_per_s)?;
    if low_queries == 0 {
        return Err(Error::InvalidParameter("a phased workload needs at least one low-rate query per phase".into()));
    }
    let mut rng = SmallRng::seed_from_u64(seed);
    let ids = shuffled_base_templates(templates, &mut rng);
    let cycle = low_queries + PHASED_HIGH_QUERIES;
    let mut at_s = 0.0;
    Ok(ids
        .into_iter()
        .enumerate()
        .map(|(index, template)| {
            let rate = if index % cycle < low_queries { PHASED_LOW_RATE_PER_S } else { high_rate_per_s };
            at_s += exponential_gap_s(&mut rng, rate);
            TraceEntry::generated(Instant::from_secs_f64(at_s), template)
        })
        .collect())
}

/// The four phased mixes of AutoSLO §8.3.2: `x ∈ {40, 15}`,
/// `λ_high ∈ {0.2, 0.5}`, as `(x, λ_high)`.
pub const PHASED_MIXES: [(usize, f64); 4] = [(40, 0.2), (40, 0.5), (15, 0.2), (15, 0.5)];

/// The BaseWorkload rates of the calibration runs (AutoSLO §8.3.2).
pub const CALIBRATION_RATES_PER_S: [f64; 5] = [0.05, 0.1, 0.2, 0.5, 1.0];

/// Parameters of the multi-day diurnal workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DiurnalConfig {
    /// Days to generate.
    pub days: u32,
    /// Weekday of day 0: 0 = Monday … 6 = Sunday.
    pub first_weekday: u32,
    /// Mean arrivals per hour at a weekday's peak hour.
    pub peak_queries_per_hour: f64,
    /// Weekend level relative to weekdays.
    pub weekend_factor: f64,
    /// Day-to-day variation of the level (σ of a lognormal factor).
    pub daily_level_sigma: f64,
    /// Mean unscheduled bursts per day (ad hoc analysis spikes).
    pub bursts_per_day: f64,
    /// A burst multiplies the rate by this, for 5–20 minutes.
    pub burst_rate_factor: f64,
    /// Queries in each dashboard refresh (every 15 minutes, 08:00–18:00 on
    /// weekdays): the reliably recurring load.
    pub dashboard_queries_per_refresh: u32,
    /// Day-to-day drift of the template mix (σ of a random walk on each
    /// template's log-weight).
    pub mix_drift_sigma: f64,
    /// Seeds everything.
    pub seed: u64,
}

impl Default for DiurnalConfig {
    fn default() -> Self {
        DiurnalConfig {
            days: 7,
            first_weekday: 0,
            peak_queries_per_hour: 240.0,
            weekend_factor: 0.3,
            daily_level_sigma: 0.1,
            bursts_per_day: 2.0,
            burst_rate_factor: 4.0,
            dashboard_queries_per_refresh: 6,
            mix_drift_sigma: 0.15,
            seed: 0,
        }
    }
}

/// Relative arrival rate per hour of a weekday (peak = 1): a quiet night
/// with a nightly batch at 02:00, a morning ramp, a late-morning peak, a
/// lunch dip, an afternoon peak and an evening tail.
const WEEKDAY_HOURLY_SHAPE: [f64; 24] = [
    0.06, 0.05, 0.30, 0.20, 0.05, 0.05, 0.08, 0.20, 0.55, 0.85, 1.00, 0.95, //
    0.65, 0.80, 0.95, 0.90, 0.75, 0.55, 0.35, 0.25, 0.18, 0.12, 0.09, 0.07,
];

/// Relative arrival rate per hour of a weekend day (before the weekend
/// factor): flatter, later, with the same nightly batch.
const WEEKEND_HOURLY_SHAPE: [f64; 24] = [
    0.10, 0.08, 0.60, 0.40, 0.08, 0.06, 0.06, 0.08, 0.15, 0.30, 0.50, 0.60, //
    0.60, 0.55, 0.55, 0.50, 0.45, 0.40, 0.35, 0.30, 0.25, 0.20, 0.15, 0.12,
];

const SECS_PER_HOUR: f64 = 3_600.0;
const SECS_PER_DAY: f64 = 86_400.0;

/// Whether day `day` of a workload starting on `first_weekday` is a weekend.
pub fn is_weekend(first_weekday: u32, day: u32) -> bool {
    (first_weekday + day) % 7 >= 5
}

/// A multi-day diurnal workload: hourly weekday/weekend profile, daily level
/// variation, random bursts, dashboard refreshes and a drifting template mix.
pub fn diurnal_workload(templates: &[Template], config: &DiurnalConfig) -> Result<Vec<TraceEntry>> {
    check_rate(config.peak_queries_per_hour)?;
    if config.days == 0 || templates.is_empty() {
        return Err(Error::InvalidParameter("a diurnal workload needs at least one day and one template".into()));
    }
    if config.first_weekday > 6 {
        return Err(Error::InvalidParameter(format!("first_weekday must be 0–6, got {}", config.first_weekday)));
    }
    let mut rng = SmallRng::seed_from_u64(config.seed);
    // Template popularity: a Zipf-like base over a random order, drifting.
    let mut order: Vec<usize> = (0..templates.len()).collect();
    order.shuffle(&mut rng);
    let mut log_weights = vec![0.0f64; templates.len()];
    for (rank, &index) in order.iter().enumerate() {
        log_weights[index] = -(1.0 + rank as f64).ln() * 0.8;
    }
    // Dashboards re-run a small fixed set of cheap templates.
    let mut by_cost: Vec<usize> = (0..templates.len()).collect();
    by_cost.sort_by_key(|&i| (templates[i].baseline_latency, templates[i].id));
    let dashboard: Vec<TemplateId> = by_cost.iter().take(12).map(|&i| templates[i].id).collect();
    // Batch jobs at night favour heavy templates.
    let heavy: Vec<TemplateId> = by_cost.iter().rev().take(20).map(|&i| templates[i].id).collect();

    let mut entries = Vec::new();
    for day in 0..config.days {
        for w in &mut log_weights {
            *w += config.mix_drift_sigma * standard_normal(&mut rng);
        }
        let cumulative = cumulative_weights(&log_weights);
        let weekend = is_weekend(config.first_weekday, day);
        let shape = if weekend { &WEEKEND_HOURLY_SHAPE } else { &WEEKDAY_HOURLY_SHAPE };
        let level = config.peak_queries_per_hour
            * if weekend { config.weekend_factor } else { 1.0 }
            * (config.daily_level_sigma * standard_normal(&mut rng)).exp();
        let day_start_s = f64::from(day) * SECS_PER_DAY;

        // Bursts: (start, end) within the day.
        let bursts: Vec<(f64, f64)> = (0..poisson(&mut rng, config.bursts_per_day))
            .map(|_| {
                let start = rng.random_range(7.0..20.0) * SECS_PER_HOUR;
                (start, start + rng.random_range(300.0..1_200.0))
            })
            .collect();
        let rate_at = |t_s: f64| -> f64 {
            let hour_f = t_s / SECS_PER_HOUR;
            let hour = (hour_f.floor() as usize).min(23);
            let next = (hour + 1) % 24;
            let frac = hour_f - hour as f64;
            let base = shape[hour] + (shape[next] - shape[hour]) * frac;
            let burst = if bursts.iter().any(|&(s, e)| t_s >= s && t_s < e) { config.burst_rate_factor } else { 1.0 };
            level * base * burst / SECS_PER_HOUR
        };
        let rate_max = level * config.burst_rate_factor / SECS_PER_HOUR;
        // Thinning of a homogeneous process at the maximum rate.
        let mut t_s = 0.0;
        loop {
            t_s += exponential_gap_s(&mut rng, rate_max);
            if t_s >= SECS_PER_DAY {
                break;
            }
            if rng.random::<f64>() * rate_max <= rate_at(t_s) {
                let hour = (t_s / SECS_PER_HOUR) as u32;
                let template = if (2..4).contains(&hour) && rng.random::<f64>() < 0.7 {
                    heavy[rng.random_range(0..heavy.len())]
                } else {
                    templates[sample_index(&cumulative, rng.random())].id
                };
                entries.push(TraceEntry::generated(Instant::from_secs_f64(day_start_s + t_s), template));
            }
        }
        if !weekend {
            for quarter in (8 * 4)..(18 * 4) {
                let refresh_s = f64::from(quarter) * 900.0;
                for k in 0..config.dashboard_queries_per_refresh {
                    let jitter_s = rng.random_range(0.0..20.0);
                    let template = dashboard[(k as usize) % dashboard.len()];
                    entries.push(TraceEntry::generated(Instant::from_secs_f64(day_start_s + refresh_s + jitter_s), template));
                }
            }
        }
    }
    entries.sort_by_key(|e| (e.arrival, e.template));
    Ok(entries)
}

fn standard_normal(rng: &mut SmallRng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn poisson(rng: &mut SmallRng, mean: f64) -> u32 {
    // Knuth's method; means here are small.
    let limit = (-mean).exp();
    let mut product: f64 = rng.random();
    let mut count = 0;
    while product > limit && count < 1_000 {
        product *= rng.random::<f64>();
        count += 1;
    }
    count
}

fn cumulative_weights(log_weights: &[f64]) -> Vec<f64> {
    let max = log_weights.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    log_weights
        .iter()
        .map(|w| {
            total += (w - max).exp();
            total
        })
        .collect()
}

fn sample_index(cumulative: &[f64], u: f64) -> usize {
    let target = u * cumulative.last().copied().unwrap_or(0.0);
    cumulative.partition_point(|&c| c < target).min(cumulative.len() - 1)
}

/// Sets every entry's SLO to `κ × ℓ_baseline(template)`. Entries whose
/// template is unknown keep their SLO if they have one.
///
/// # Errors
///
/// A non-positive κ, or an entry without an SLO whose template has no
/// baseline.
pub fn assign_slos(entries: &mut [TraceEntry], templates: &[Template], kappa: f64) -> Result<()> {
    if !(kappa.is_finite() && kappa > 0.0) {
        return Err(Error::InvalidParameter(format!("κ must be a positive number, got {kappa}")));
    }
    for entry in entries {
        match templates.iter().find(|t| t.id == entry.template) {
            Some(t) => entry.slo = Some(t.baseline_latency.mul_f64(kappa)),
            None if entry.slo.is_some() => {}
            None => {
                return Err(Error::InvalidParameter(format!(
                    "template {} has no baseline latency to derive an SLO from",
                    entry.template.0
                )));
            }
        }
    }
    Ok(())
}

/// Turns entries into queries of `pool` (unless an entry names its own),
/// numbered by position (a client's string id is the gateway's business,
/// not the simulator's).
///
/// # Errors
///
/// An entry without an SLO.
pub fn to_queries(entries: &[TraceEntry], pool: &PoolId) -> Result<Vec<Query>> {
    entries
        .iter()
        .enumerate()
        .map(|(index, e)| {
            let slo = e.slo.ok_or_else(|| {
                Error::InvalidParameter(format!("query {index} (template {}) has no SLO", e.template.0))
            })?;
            Ok(Query {
                id: QueryId(index as u64),
                pool: e.pool.clone().unwrap_or_else(|| pool.clone()),
                template: e.template,
                slo: Slo { latency: slo },
                arrival: e.arrival,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use slogate_world::catalog::tpcds_template_set;

    use super::*;

    #[test]
    fn base_workload_has_three_copies_of_each_template_at_rate_lambda() {
        let templates = tpcds_template_set();
        let w = base_workload(&templates, 0.1, 7).unwrap();
        assert_eq!(w.len(), 297);
        let mut counts: HashMap<TemplateId, usize> = HashMap::new();
        for e in &w {
            *counts.entry(e.template).or_default() += 1;
        }
        assert!(counts.values().all(|&c| c == 3) && counts.len() == 99);
        assert!(w.windows(2).all(|p| p[0].arrival <= p[1].arrival));
        let rate = w.len() as f64 / w.last().unwrap().arrival.as_secs_f64();
        assert!((rate - 0.1).abs() < 0.025, "observed rate {rate}");
    }

    #[test]
    fn phased_workload_alternates_slow_and_fast_phases() {
        let templates = tpcds_template_set();
        let w = phased_workload(&templates, 40, 0.5, 3).unwrap();
        assert_eq!(w.len(), 297);
        let mut phased: Vec<TemplateId> = w.iter().map(|e| e.template).collect();
        let mut base: Vec<TemplateId> = base_workload(&templates, 0.1, 3).unwrap().iter().map(|e| e.template).collect();
        phased.sort();
        base.sort();
        assert_eq!(phased, base, "same 297 queries as BaseWorkload");
        let gaps: Vec<f64> = w.windows(2).map(|p| (p[1].arrival - p[0].arrival).as_secs_f64()).collect();
        let slow: f64 = gaps[0..39].iter().sum::<f64>() / 39.0;
        let fast: f64 = gaps[40..49].iter().sum::<f64>() / 9.0;
        assert!(slow > 3.0 * fast, "slow gap {slow}, fast gap {fast}");
    }

    #[test]
    fn slo_is_kappa_times_baseline() {
        let templates = tpcds_template_set();
        let mut w = base_workload(&templates, 0.1, 1).unwrap();
        assign_slos(&mut w, &templates, 4.0).unwrap();
        for e in &w {
            let baseline = templates.iter().find(|t| t.id == e.template).unwrap().baseline_latency;
            assert_eq!(e.slo, Some(baseline.mul_f64(4.0)));
        }
        assert!(assign_slos(&mut w, &templates, 0.0).is_err());
    }

    #[test]
    fn diurnal_weekday_daytime_is_busier_than_night_and_weekend() {
        let templates = tpcds_template_set();
        let config = DiurnalConfig { days: 7, seed: 11, ..DiurnalConfig::default() };
        let w = diurnal_workload(&templates, &config).unwrap();
        let count = |day: u32, from_h: f64, to_h: f64| {
            let (from, to) = (f64::from(day) * SECS_PER_DAY + from_h * 3_600.0, f64::from(day) * SECS_PER_DAY + to_h * 3_600.0);
            w.iter().filter(|e| (from..to).contains(&e.arrival.as_secs_f64())).count()
        };
        for day in 0..5 {
            assert!(count(day, 10.0, 12.0) > 3 * count(day, 4.0, 6.0), "day {day}");
        }
        let weekday: usize = (0..5).map(|d| count(d, 0.0, 24.0)).sum::<usize>() / 5;
        let weekend: usize = (5..7).map(|d| count(d, 0.0, 24.0)).sum::<usize>() / 2;
        assert!(weekend * 2 < weekday, "weekend {weekend} vs weekday {weekday}");
        assert!(w.last().unwrap().arrival.as_secs_f64() < 7.0 * SECS_PER_DAY);
    }

    #[test]
    fn diurnal_template_mix_drifts_across_days() {
        let templates = tpcds_template_set();
        let config = DiurnalConfig { days: 30, seed: 5, ..DiurnalConfig::default() };
        let w = diurnal_workload(&templates, &config).unwrap();
        let share = |day: u32| {
            let mut counts = vec![0f64; 100];
            let day_entries: Vec<_> = w.iter().filter(|e| (e.arrival.as_secs_f64() / SECS_PER_DAY) as u32 == day).collect();
            for e in &day_entries {
                counts[e.template.0 as usize] += 1.0 / day_entries.len() as f64;
            }
            counts
        };
        let distance = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).sum::<f64>();
        let (d0, d1, d28) = (share(0), share(1), share(28));
        assert!(distance(&d0, &d28) > distance(&d0, &d1), "mix a month apart differs more than a day apart");
    }

    proptest! {
        #[test]
        fn generators_are_deterministic_per_seed(seed in 0u64..1_000, rate in 1u32..20) {
            let templates = tpcds_template_set();
            let rate = f64::from(rate) / 20.0;
            prop_assert_eq!(base_workload(&templates, rate, seed).unwrap(), base_workload(&templates, rate, seed).unwrap());
            prop_assert_eq!(phased_workload(&templates, 15, rate, seed).unwrap(), phased_workload(&templates, 15, rate, seed).unwrap());
        }

        #[test]
        fn base_workload_rejects_non_positive_rates(rate in -10.0f64..=0.0) {
            prop_assert!(base_workload(&tpcds_template_set(), rate, 1).is_err());
        }
    }
}
