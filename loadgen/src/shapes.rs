//! Workload shapes the papers' scenarios lack, to test decisions on loads
//! nobody tuned them for: a flash crowd of heavy templates, a shift in the
//! template mix, two tenants with different SLOs on one pool, a slow drift
//! in the arrival rate, and heavy-tailed query sizes.
//!
//! Each shape is a [`Shape`] value (its parameters, all with defaults) and
//! [`generate`] turns it, the template catalogue, κ and a seed into a
//! workload with SLOs set. Templates are told apart only by their baseline
//! latency (what a deployment knows of them from its own log), lightest
//! first: "heavy" means the heaviest part of that order.
//!
//! Which shapes and seeds an evaluation may be tuned on, and which are held
//! out, is the evaluation's business (`slogate eval shapes-dev` and
//! `shapes-held-out`).
//!
//! # Properties
//!
//! - (A) Arrivals are sorted, within `[0, duration_s)`, and every entry has
//!   an SLO: κ × the template's baseline, except the multi-tenant shape,
//!   whose tenants scale κ by their own factors.
//! - (B) Same shape, κ and seed, same workload.
//! - (C) A flash crowd's window has more arrivals per second than the rest;
//!   after a mix shift the mean baseline is higher than before; a rising
//!   drift has more arrivals in its second half than in its first.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use slogate_core::model::{Template, TemplateId};
use slogate_core::time::{Duration, Instant};

use crate::workload::TraceEntry;
use crate::{Error, Result};

/// A workload shape and its parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "shape", rename_all = "snake_case", deny_unknown_fields)]
pub enum Shape {
    /// Poisson arrivals over the whole catalogue, plus a window in which the
    /// heaviest templates arrive at a much higher rate.
    FlashCrowd {
        /// Background rate over all templates, queries per second.
        #[serde(default = "defaults::rate")]
        rate_per_s: f64,
        /// Length of the workload, seconds.
        #[serde(default = "defaults::duration")]
        duration_s: f64,
        /// When the crowd starts, seconds.
        #[serde(default = "defaults::crowd_at")]
        crowd_at_s: f64,
        /// How long it lasts, seconds.
        #[serde(default = "defaults::crowd_duration")]
        crowd_duration_s: f64,
        /// Extra rate of heavy templates during the crowd.
        #[serde(default = "defaults::crowd_rate")]
        crowd_rate_per_s: f64,
        /// The crowd draws from this heaviest fraction of the catalogue.
        #[serde(default = "defaults::heavy_fraction")]
        heavy_fraction: f64,
    },
    /// The first part draws from the lightest templates, the rest from the
    /// heaviest: what the predictor learned early stops applying.
    MixShift {
        /// Rate, queries per second.
        #[serde(default = "defaults::rate")]
        rate_per_s: f64,
        /// Length, seconds.
        #[serde(default = "defaults::duration")]
        duration_s: f64,
        /// The shift happens at this fraction of the duration.
        #[serde(default = "defaults::half")]
        shift_at_fraction: f64,
        /// Each side draws from this fraction of the catalogue (lightest
        /// before, heaviest after).
        #[serde(default = "defaults::mix_fraction")]
        side_fraction: f64,
    },
    /// Two tenants on one pool: dashboards (frequent, light templates,
    /// tight SLOs) and batch (rare, heavy templates, loose SLOs).
    MultiTenant {
        /// Dashboard queries per second.
        #[serde(default = "defaults::dashboard_rate")]
        dashboard_rate_per_s: f64,
        /// Batch queries per second.
        #[serde(default = "defaults::batch_rate")]
        batch_rate_per_s: f64,
        /// Length, seconds.
        #[serde(default = "defaults::duration")]
        duration_s: f64,
        /// Dashboards use this lightest fraction of the catalogue, batch
        /// the same heaviest fraction.
        #[serde(default = "defaults::tenant_fraction")]
        tenant_fraction: f64,
        /// A dashboard's SLO is κ × this × its baseline.
        #[serde(default = "defaults::dashboard_kappa_factor")]
        dashboard_kappa_factor: f64,
        /// A batch query's SLO is κ × this × its baseline.
        #[serde(default = "defaults::batch_kappa_factor")]
        batch_kappa_factor: f64,
    },
    /// The arrival rate moves linearly from one value to another.
    RateDrift {
        /// Rate at the start.
        #[serde(default = "defaults::drift_start")]
        start_rate_per_s: f64,
        /// Rate at the end.
        #[serde(default = "defaults::drift_end")]
        end_rate_per_s: f64,
        /// Length, seconds.
        #[serde(default = "defaults::duration")]
        duration_s: f64,
    },
    /// Query sizes follow a Pareto law: most queries are light, a few are
    /// far heavier than the median.
    HeavyTailed {
        /// Rate, queries per second.
        #[serde(default = "defaults::rate")]
        rate_per_s: f64,
        /// Length, seconds.
        #[serde(default = "defaults::duration")]
        duration_s: f64,
        /// The Pareto exponent of the baseline latency drawn (smaller:
        /// heavier tail).
        #[serde(default = "defaults::pareto_alpha")]
        pareto_alpha: f64,
    },
}

/// Serde defaults of the shapes' parameters.
mod defaults {
    pub(super) fn rate() -> f64 {
        0.07
    }
    pub(super) fn duration() -> f64 {
        3_600.0
    }
    pub(super) fn crowd_at() -> f64 {
        1_200.0
    }
    pub(super) fn crowd_duration() -> f64 {
        240.0
    }
    pub(super) fn crowd_rate() -> f64 {
        0.1
    }
    pub(super) fn heavy_fraction() -> f64 {
        0.25
    }
    pub(super) fn half() -> f64 {
        0.5
    }
    pub(super) fn mix_fraction() -> f64 {
        0.5
    }
    pub(super) fn dashboard_rate() -> f64 {
        0.12
    }
    pub(super) fn batch_rate() -> f64 {
        0.02
    }
    pub(super) fn tenant_fraction() -> f64 {
        0.3
    }
    pub(super) fn dashboard_kappa_factor() -> f64 {
        0.5
    }
    pub(super) fn batch_kappa_factor() -> f64 {
        2.0
    }
    pub(super) fn drift_start() -> f64 {
        0.04
    }
    pub(super) fn drift_end() -> f64 {
        0.16
    }
    pub(super) fn pareto_alpha() -> f64 {
        1.1
    }
}

impl Shape {
    /// Every shape with its default parameters.
    pub fn all_defaults() -> Vec<Shape> {
        ["flash_crowd", "mix_shift", "multi_tenant", "rate_drift", "heavy_tailed"]
            .into_iter()
            .map(|name| Shape::by_name(name).expect("known shape"))
            .collect()
    }

    /// A shape with its default parameters, by its `shape` name.
    pub fn by_name(name: &str) -> Option<Shape> {
        toml_like_default(name)
    }

    /// Its name, as written in a scenario file.
    pub fn name(&self) -> &'static str {
        match self {
            Shape::FlashCrowd { .. } => "flash_crowd",
            Shape::MixShift { .. } => "mix_shift",
            Shape::MultiTenant { .. } => "multi_tenant",
            Shape::RateDrift { .. } => "rate_drift",
            Shape::HeavyTailed { .. } => "heavy_tailed",
        }
    }

    /// A short label for reports.
    pub fn label(&self) -> String {
        match self {
            Shape::FlashCrowd { crowd_rate_per_s, crowd_duration_s, .. } => format!("flash-crowd(+{crowd_rate_per_s}/s heavy for {crowd_duration_s}s)"),
            Shape::MixShift { .. } => "mix-shift(light→heavy)".to_owned(),
            Shape::MultiTenant { dashboard_kappa_factor, batch_kappa_factor, .. } => {
                format!("multi-tenant(dashboards κ×{dashboard_kappa_factor}, batch κ×{batch_kappa_factor})")
            }
            Shape::RateDrift { start_rate_per_s, end_rate_per_s, .. } => format!("rate-drift({start_rate_per_s}→{end_rate_per_s}/s)"),
            Shape::HeavyTailed { pareto_alpha, .. } => format!("heavy-tailed(α={pareto_alpha})"),
        }
    }
}

fn toml_like_default(name: &str) -> Option<Shape> {
    use defaults as d;
    Some(match name {
        "flash_crowd" => Shape::FlashCrowd {
            rate_per_s: d::rate(),
            duration_s: d::duration(),
            crowd_at_s: d::crowd_at(),
            crowd_duration_s: d::crowd_duration(),
            crowd_rate_per_s: d::crowd_rate(),
            heavy_fraction: d::heavy_fraction(),
        },
        "mix_shift" => Shape::MixShift { rate_per_s: d::rate(), duration_s: d::duration(), shift_at_fraction: d::half(), side_fraction: d::mix_fraction() },
        "multi_tenant" => Shape::MultiTenant {
            dashboard_rate_per_s: d::dashboard_rate(),
            batch_rate_per_s: d::batch_rate(),
            duration_s: d::duration(),
            tenant_fraction: d::tenant_fraction(),
            dashboard_kappa_factor: d::dashboard_kappa_factor(),
            batch_kappa_factor: d::batch_kappa_factor(),
        },
        "rate_drift" => Shape::RateDrift { start_rate_per_s: d::drift_start(), end_rate_per_s: d::drift_end(), duration_s: d::duration() },
        "heavy_tailed" => Shape::HeavyTailed { rate_per_s: d::rate(), duration_s: d::duration(), pareto_alpha: d::pareto_alpha() },
        _ => return None,
    })
}

fn positive(name: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 { Ok(()) } else { Err(Error::InvalidParameter(format!("{name} must be a positive number, got {value}"))) }
}

fn fraction(name: &str, value: f64) -> Result<()> {
    if value.is_finite() && value > 0.0 && value <= 1.0 { Ok(()) } else { Err(Error::InvalidParameter(format!("{name} must be in (0, 1], got {value}"))) }
}

/// The catalogue lightest first (by baseline latency, then id).
fn by_weight(templates: &[Template]) -> Vec<&Template> {
    let mut sorted: Vec<&Template> = templates.iter().collect();
    sorted.sort_by_key(|t| (t.baseline_latency, t.id));
    sorted
}

/// The lightest (or heaviest) `fraction` of `sorted`, at least one.
fn part<'a>(sorted: &[&'a Template], fraction: f64, heaviest: bool) -> Vec<&'a Template> {
    let count = ((sorted.len() as f64 * fraction).round() as usize).clamp(1, sorted.len());
    if heaviest { sorted[sorted.len() - count..].to_vec() } else { sorted[..count].to_vec() }
}

/// Poisson arrivals of a rate that may vary in time, by thinning against
/// `rate_max_per_s`.
fn arrivals(rng: &mut SmallRng, duration_s: f64, rate_max_per_s: f64, rate_at: impl Fn(f64) -> f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut at_s = 0.0;
    loop {
        at_s += -(1.0 - rng.random::<f64>()).ln() / rate_max_per_s;
        if at_s >= duration_s {
            return out;
        }
        if rng.random::<f64>() * rate_max_per_s < rate_at(at_s) {
            out.push(at_s);
        }
    }
}

fn pick<'a>(rng: &mut SmallRng, from: &[&'a Template]) -> &'a Template {
    from[rng.random_range(0..from.len())]
}

/// Generates `shape` over `templates` with SLOs from `kappa`, seeded.
///
/// # Errors
///
/// An empty catalogue, a non-positive κ, or a parameter out of range (each
/// named).
pub fn generate(shape: &Shape, templates: &[Template], kappa: f64, seed: u64) -> Result<Vec<TraceEntry>> {
    positive("κ", kappa)?;
    if templates.is_empty() {
        return Err(Error::InvalidParameter("the template catalogue is empty".into()));
    }
    let sorted = by_weight(templates);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5ea9_e5ba_5e00_0000);
    // (arrival, template, SLO factor on κ)
    let mut drawn: Vec<(f64, TemplateId, f64, Duration)> = Vec::new();
    let mut push = |at_s: f64, t: &Template, factor: f64| drawn.push((at_s, t.id, factor, t.baseline_latency));
    match *shape {
        Shape::FlashCrowd { rate_per_s, duration_s, crowd_at_s, crowd_duration_s, crowd_rate_per_s, heavy_fraction } => {
            positive("rate_per_s", rate_per_s)?;
            positive("duration_s", duration_s)?;
            positive("crowd_duration_s", crowd_duration_s)?;
            positive("crowd_rate_per_s", crowd_rate_per_s)?;
            fraction("heavy_fraction", heavy_fraction)?;
            if !(crowd_at_s.is_finite() && crowd_at_s >= 0.0 && crowd_at_s < duration_s) {
                return Err(Error::InvalidParameter(format!("crowd_at_s must lie within the workload, got {crowd_at_s}")));
            }
            let heavy = part(&sorted, heavy_fraction, true);
            for at_s in arrivals(&mut rng, duration_s, rate_per_s, |_| rate_per_s) {
                let t = pick(&mut rng, &sorted);
                push(at_s, t, 1.0);
            }
            let crowd_end = (crowd_at_s + crowd_duration_s).min(duration_s);
            for at_s in arrivals(&mut rng, crowd_end - crowd_at_s, crowd_rate_per_s, |_| crowd_rate_per_s) {
                let t = pick(&mut rng, &heavy);
                push(crowd_at_s + at_s, t, 1.0);
            }
        }
        Shape::MixShift { rate_per_s, duration_s, shift_at_fraction, side_fraction } => {
            positive("rate_per_s", rate_per_s)?;
            positive("duration_s", duration_s)?;
            fraction("shift_at_fraction", shift_at_fraction)?;
            fraction("side_fraction", side_fraction)?;
            let (light, heavy) = (part(&sorted, side_fraction, false), part(&sorted, side_fraction, true));
            let shift_s = duration_s * shift_at_fraction;
            for at_s in arrivals(&mut rng, duration_s, rate_per_s, |_| rate_per_s) {
                let t = pick(&mut rng, if at_s < shift_s { &light } else { &heavy });
                push(at_s, t, 1.0);
            }
        }
        Shape::MultiTenant { dashboard_rate_per_s, batch_rate_per_s, duration_s, tenant_fraction, dashboard_kappa_factor, batch_kappa_factor } => {
            positive("dashboard_rate_per_s", dashboard_rate_per_s)?;
            positive("batch_rate_per_s", batch_rate_per_s)?;
            positive("duration_s", duration_s)?;
            fraction("tenant_fraction", tenant_fraction)?;
            positive("dashboard_kappa_factor", dashboard_kappa_factor)?;
            positive("batch_kappa_factor", batch_kappa_factor)?;
            let (light, heavy) = (part(&sorted, tenant_fraction, false), part(&sorted, tenant_fraction, true));
            for at_s in arrivals(&mut rng, duration_s, dashboard_rate_per_s, |_| dashboard_rate_per_s) {
                let t = pick(&mut rng, &light);
                push(at_s, t, dashboard_kappa_factor);
            }
            for at_s in arrivals(&mut rng, duration_s, batch_rate_per_s, |_| batch_rate_per_s) {
                let t = pick(&mut rng, &heavy);
                push(at_s, t, batch_kappa_factor);
            }
        }
        Shape::RateDrift { start_rate_per_s, end_rate_per_s, duration_s } => {
            positive("start_rate_per_s", start_rate_per_s)?;
            positive("end_rate_per_s", end_rate_per_s)?;
            positive("duration_s", duration_s)?;
            let rate_at = |at_s: f64| start_rate_per_s + (end_rate_per_s - start_rate_per_s) * at_s / duration_s;
            for at_s in arrivals(&mut rng, duration_s, start_rate_per_s.max(end_rate_per_s), rate_at) {
                let t = pick(&mut rng, &sorted);
                push(at_s, t, 1.0);
            }
        }
        Shape::HeavyTailed { rate_per_s, duration_s, pareto_alpha } => {
            positive("rate_per_s", rate_per_s)?;
            positive("duration_s", duration_s)?;
            positive("pareto_alpha", pareto_alpha)?;
            let lightest_s = sorted[0].baseline_latency.as_secs_f64().max(1e-3);
            for at_s in arrivals(&mut rng, duration_s, rate_per_s, |_| rate_per_s) {
                // A Pareto draw of the baseline, then the template nearest
                // to it in log latency.
                let target_s = lightest_s * (1.0 - rng.random::<f64>()).powf(-1.0 / pareto_alpha);
                let t = sorted
                    .iter()
                    .min_by(|a, b| {
                        let distance = |t: &Template| (t.baseline_latency.as_secs_f64().max(1e-3) / target_s).ln().abs();
                        distance(a).total_cmp(&distance(b))
                    })
                    .expect("a non-empty catalogue");
                push(at_s, t, 1.0);
            }
        }
    }
    drawn.sort_by(|a, b| a.0.total_cmp(&b.0));
    Ok(drawn
        .into_iter()
        .map(|(at_s, template, factor, baseline)| TraceEntry {
            arrival: Instant::from_secs_f64(at_s),
            template,
            slo: Some(baseline.mul_f64(kappa * factor)),
            pool: None,
            query_id: None,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn catalogue() -> Vec<Template> {
        (1..=40u32).map(|i| Template { id: TemplateId(i), baseline_latency: Duration::from_secs_f64(f64::from(i) * 1.5) }).collect()
    }

    fn mean_baseline(entries: &[TraceEntry], templates: &[Template]) -> f64 {
        let of = |id: TemplateId| templates.iter().find(|t| t.id == id).unwrap().baseline_latency.as_secs_f64();
        entries.iter().map(|e| of(e.template)).sum::<f64>() / entries.len().max(1) as f64
    }

    #[test]
    fn a_flash_crowd_is_denser_inside_its_window() {
        let shape = Shape::by_name("flash_crowd").unwrap();
        let entries = generate(&shape, &catalogue(), 4.0, 3).unwrap();
        let inside = entries.iter().filter(|e| (1_200.0..1_440.0).contains(&e.arrival.as_secs_f64())).count() as f64 / 240.0;
        let outside = entries.iter().filter(|e| !(1_200.0..1_440.0).contains(&e.arrival.as_secs_f64())).count() as f64 / 3_360.0;
        assert!(inside > 1.5 * outside, "inside {inside}/s, outside {outside}/s");
    }

    #[test]
    fn after_a_mix_shift_the_queries_are_heavier() {
        let templates = catalogue();
        let entries = generate(&Shape::by_name("mix_shift").unwrap(), &templates, 4.0, 3).unwrap();
        let (before, after): (Vec<TraceEntry>, Vec<TraceEntry>) = entries.into_iter().partition(|e| e.arrival.as_secs_f64() < 1_800.0);
        assert!(mean_baseline(&after, &templates) > 2.0 * mean_baseline(&before, &templates));
    }

    #[test]
    fn tenants_get_their_own_slo_factors() {
        let templates = catalogue();
        let entries = generate(&Shape::by_name("multi_tenant").unwrap(), &templates, 4.0, 3).unwrap();
        let factor = |e: &TraceEntry| {
            let baseline = templates.iter().find(|t| t.id == e.template).unwrap().baseline_latency.as_secs_f64();
            e.slo.unwrap().as_secs_f64() / baseline
        };
        assert!(entries.iter().any(|e| (factor(e) - 2.0).abs() < 1e-3), "dashboards at κ × 0.5");
        assert!(entries.iter().any(|e| (factor(e) - 8.0).abs() < 1e-3), "batch at κ × 2");
        assert!(entries.iter().all(|e| (factor(e) - 2.0).abs() < 1e-3 || (factor(e) - 8.0).abs() < 1e-3));
    }

    #[test]
    fn a_rising_drift_has_more_arrivals_late_than_early() {
        let entries = generate(&Shape::by_name("rate_drift").unwrap(), &catalogue(), 4.0, 3).unwrap();
        let early = entries.iter().filter(|e| e.arrival.as_secs_f64() < 1_800.0).count();
        assert!(entries.len() - early > early, "early {early} of {}", entries.len());
    }

    #[test]
    fn heavy_tailed_sizes_are_mostly_light_with_a_heavy_tail() {
        let templates = catalogue();
        let entries = generate(&Shape::by_name("heavy_tailed").unwrap(), &templates, 4.0, 3).unwrap();
        let light = entries.iter().filter(|e| e.template.0 <= 4).count();
        let heavy = entries.iter().filter(|e| e.template.0 >= 20).count();
        assert!(light > entries.len() / 2 && heavy > 0, "light {light}, heavy {heavy} of {}", entries.len());
    }

    #[test]
    fn bad_parameters_are_named() {
        let shape = Shape::FlashCrowd { rate_per_s: 0.1, duration_s: 100.0, crowd_at_s: 500.0, crowd_duration_s: 10.0, crowd_rate_per_s: 1.0, heavy_fraction: 0.5 };
        assert!(generate(&shape, &catalogue(), 4.0, 1).unwrap_err().to_string().contains("crowd_at_s"));
        let shape = Shape::MixShift { rate_per_s: 0.1, duration_s: 100.0, shift_at_fraction: 0.5, side_fraction: 1.5 };
        assert!(generate(&shape, &catalogue(), 4.0, 1).unwrap_err().to_string().contains("side_fraction"));
        assert!(generate(&Shape::by_name("rate_drift").unwrap(), &catalogue(), -1.0, 1).unwrap_err().to_string().contains("κ"));
    }

    proptest! {
        #[test]
        fn every_shape_is_sorted_bounded_seeded_and_has_slos(seed in 0u64..1_000, which in 0usize..5) {
            let shape = Shape::all_defaults().swap_remove(which);
            let templates = catalogue();
            let a = generate(&shape, &templates, 3.0, seed).unwrap();
            // (A)
            prop_assert!(a.windows(2).all(|p| p[0].arrival <= p[1].arrival));
            prop_assert!(a.iter().all(|e| e.arrival.as_secs_f64() < 3_600.0 && e.slo.is_some()));
            // (B)
            prop_assert_eq!(&a, &generate(&shape, &templates, 3.0, seed).unwrap());
        }
    }
}
