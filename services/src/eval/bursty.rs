//! `slogate eval bursty-service`: Spandana's evaluation (§7–8) on the
//! request-level fleet simulator.
//!
//! For each of Spandana's four services (8, 14, 40, 130 ms idle latency),
//! one hour of load with second-scale fluctuations (each second within
//! ±50% of a steady minute-scale mean, Poisson within the second), scaled
//! so the fleet runs about ten instances; SLO 10× the idle latency; a 1%
//! violation budget. The spike variant surges to 2× at 20 minutes and
//! settles at 1.5×.
//!
//! Policies: `hpa-oracle`, the cheapest HPA target (30–95%, step 5) that
//! meets the budget over the whole trace, found here by running them all;
//! and the named policies of `slogate_core::fleet::FleetPolicy::named`
//! (`hpa-60`, `libra`, `spandana`, `spandana-central`, `slogate`).
//!
//! The printed table is deterministic for a seed; the simulation's wall
//! time is printed separately.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use slogate_core::fleet::{FleetConfig, FleetPolicy, FleetSummary, simulate};
use slogate_core::time::Instant;
use slogate_loadgen::service::{FluctuationConfig, RateTrace, ServiceSpec, arrivals, fluctuating_rates, spandana_services, with_spike};

use crate::{Error, Result};

/// The policies, in column order.
pub const POLICIES: [&str; 6] = ["hpa-60", "hpa-oracle", "libra", "spandana", "spandana-central", "slogate"];
// Every policy but the searched oracle is defined in core::fleet.
const _: () = assert!(FleetPolicy::NAMES.len() + 1 == POLICIES.len());

/// The violation budget.
pub const BUDGET: f64 = 0.01;

/// One policy on one service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BurstyResult {
    /// The service.
    pub service: String,
    /// `steady` or `spike`.
    pub variant: String,
    /// The policy (for `hpa-oracle`, with its target).
    pub policy: String,
    /// The run's figures.
    pub summary: FleetSummary,
}

/// The report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BurstyReport {
    /// The seed.
    pub seed: u64,
    /// Seconds of load per run.
    pub duration_s: u32,
    /// Every run.
    pub results: Vec<BurstyResult>,
    /// Requests simulated in all runs.
    pub requests_simulated: u64,
    /// The slowest single run (one policy, one hour): its requests and its
    /// wall-clock seconds (the only figure that is not a pure function of
    /// the seed).
    pub slowest_run: (u64, f64),
}

fn trace(service: &ServiceSpec, config: &FleetConfig, spike: bool, duration_s: u32, seed: u64) -> Result<RateTrace> {
    // About ten instances at 70% utilisation.
    let mean = 10.0 * 0.7 * config.capacity_rps();
    let fluctuation = FluctuationConfig { mean_rate_per_s: mean, duration_s, seed: seed ^ service.service_time.as_micros(), ..FluctuationConfig::default() };
    let steady = fluctuating_rates(&fluctuation).map_err(|e| Error::Scenario(e.to_string()))?;
    // An hour's spike starts at 20 minutes and holds 5; shorter runs scale.
    Ok(if spike { with_spike(&steady, duration_s / 3, 10, duration_s / 12, 2.0, 1.5) } else { steady })
}

/// Runs every service, variant and policy in `policies` (default: all),
/// each over `duration_s` seconds of load (the evaluation: 3,600).
pub fn run(policies: Option<&[String]>, seed: u64, duration_s: u32) -> Result<BurstyReport> {
    if duration_s < 60 {
        return Err(Error::Scenario(format!("--duration-s must be at least 60, got {duration_s}")));
    }
    let policies: Vec<String> = policies.map_or_else(|| POLICIES.iter().map(|p| (*p).to_owned()).collect(), <[String]>::to_vec);
    for p in &policies {
        if !POLICIES.contains(&p.as_str()) {
            return Err(Error::UnknownPolicy { name: p.clone(), known: POLICIES.join(", ") });
        }
    }
    let mut results = Vec::new();
    let mut requests_simulated = 0;
    let mut slowest_run = (0, 0.0);
    let mut timed = |config: &FleetConfig, policy: &FleetPolicy, times: &[Instant]| {
        let started = std::time::Instant::now();
        let summary = simulate(config, policy, times.iter().copied());
        let seconds = started.elapsed().as_secs_f64();
        if seconds > slowest_run.1 {
            slowest_run = (summary.requests, seconds);
        }
        summary
    };
    for service in spandana_services() {
        for spike in [false, true] {
            let mut config = FleetConfig::spandana(service.service_time, 10, seed);
            let rates = trace(&service, &config, spike, duration_s, seed)?;
            let times: Vec<Instant> = arrivals(&rates, seed).collect();
            config.initial_instances = ((rates.mean_rate() / (0.6 * config.capacity_rps())).ceil() as u32).max(1);
            for name in &policies {
                let (label, summary) = if name == "hpa-oracle" {
                    let mut best: Option<(f64, FleetSummary)> = None;
                    for step in 0..14 {
                        let target = 0.30 + 0.05 * f64::from(step);
                        let p = FleetPolicy::hpa(target);
                        let summary = timed(&config, &p, &times);
                        requests_simulated += summary.requests;
                        let better = summary.violation_rate <= BUDGET && best.as_ref().is_none_or(|(_, b)| summary.cost_usd() < b.cost_usd());
                        if better {
                            best = Some((target, summary));
                        }
                    }
                    match best {
                        Some((target, summary)) => (format!("hpa-oracle@{:.0}", target * 100.0), summary),
                        None => {
                            let p = FleetPolicy::hpa(0.3);
                            ("hpa-oracle@30(none met)".to_owned(), timed(&config, &p, &times))
                        }
                    }
                } else {
                    let policy = FleetPolicy::named(name, &config, BUDGET).expect("names checked above");
                    let summary = timed(&config, &policy, &times);
                    requests_simulated += summary.requests;
                    (name.clone(), summary)
                };
                results.push(BurstyResult { service: service.name.clone(), variant: if spike { "spike" } else { "steady" }.into(), policy: label, summary });
            }
        }
    }
    Ok(BurstyReport { seed, duration_s, results, requests_simulated, slowest_run })
}

/// The table: per service and variant, each policy's VR, cost split,
impl super::seeds::SeedFigures for BurstyReport {
    /// Per service, variant and policy: VR, cost, utilisation and p99.
    fn figures(&self) -> Vec<super::seeds::Figure> {
        use super::seeds::{Figure, Unit};
        let mut figures = Vec::new();
        for r in &self.results {
            let row = format!("{} {}  {}", r.service, r.variant, r.policy);
            figures.push(Figure::lower(row.clone(), "VR", r.summary.violation_rate, Unit::Percent));
            figures.push(Figure::lower(row.clone(), "cost", r.summary.cost_usd(), Unit::Usd));
            figures.push(Figure::higher(row.clone(), "utilisation", r.summary.utilisation, Unit::Percent));
            figures.push(Figure::lower(row, "p99 ms", r.summary.latency_ms_p99, Unit::Number));
        }
        figures
    }
}

/// utilisation, offloaded share and instance-hours.
pub fn render(report: &BurstyReport) -> String {
    let mut out = String::new();
    writeln!(out, "scenario bursty-service  seed {}  ({} s per run, SLO 10x idle latency, budget {:.0}%)", report.seed, report.duration_s, BUDGET * 100.0)
        .expect("write to String");
    let mut last = (String::new(), String::new());
    for r in &report.results {
        if (r.service.clone(), r.variant.clone()) != last {
            writeln!(out, "\nservice {} ({})", r.service, r.variant).expect("write to String");
            writeln!(
                out,
                "{:<24} {:>8} {:>9} {:>11} {:>10} {:>6} {:>9} {:>7} {:>9}",
                "policy", "VR", "cost $", "instance $", "elastic $", "util", "offload", "inst-h", "p99 ms"
            )
            .expect("write to String");
            last = (r.service.clone(), r.variant.clone());
        }
        let s = &r.summary;
        let budget = if s.violation_rate <= BUDGET { " " } else { "!" };
        writeln!(
            out,
            "{:<24} {:>7.3}%{budget}{:>9.3} {:>11.3} {:>10.3} {:>5.0}% {:>8.2}% {:>7.2} {:>9.1}",
            r.policy,
            s.violation_rate * 100.0,
            s.cost_usd(),
            s.instance_cost_usd,
            s.elastic_cost_usd,
            s.utilisation * 100.0,
            s.offloaded as f64 / s.requests.max(1) as f64 * 100.0,
            s.instance_hours,
            s.latency_ms_p99
        )
        .expect("write to String");
    }
    writeln!(out, "\n! marks a run over the {:.0}% budget.", BUDGET * 100.0).expect("write to String");
    out
}

/// An SVG line chart of each policy's p99 latency over time for one
/// service and variant (log-scale latency, the SLO as a dashed line).
pub fn render_p99_svg(report: &BurstyReport, service: &str, variant: &str) -> Option<String> {
    const COLOURS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#17becf"];
    let runs: Vec<&BurstyResult> = report.results.iter().filter(|r| r.service == service && r.variant == variant).collect();
    let first = runs.first()?;
    let slo_ms = spandana_services().iter().find(|s| s.name == service)?.service_time.as_millis_f64() * 10.0;
    let (width, height, left, right, top, bottom) = (900.0, 420.0, 70.0, 170.0, 30.0, 50.0);
    let steps = runs.iter().map(|r| r.summary.p99_ms_series.len()).max().unwrap_or(1).max(2);
    let step_s = first.summary.series_step_s;
    let span_s = step_s * (steps - 1) as f64;
    let all: Vec<f64> = runs.iter().flat_map(|r| r.summary.p99_ms_series.iter().copied()).filter(|v| *v > 0.0).chain([slo_ms]).collect();
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).max(0.1).log10().floor();
    let hi = all.iter().copied().fold(0.0, f64::max).log10().ceil().max(lo + 1.0);
    let x = |t: f64| left + (width - left - right) * t / span_s.max(1.0);
    let y = |ms: f64| top + (height - top - bottom) * (1.0 - (ms.max(10f64.powf(lo)).log10() - lo) / (hi - lo));
    let mut svg = String::new();
    let _ = writeln!(svg, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#);
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(svg, r#"<text x="{left}" y="18">p99 latency per {step_s:.0} s, {service} ({variant}), seed {}</text>"#, report.seed);
    for decade in lo as i32..=hi as i32 {
        let ms = 10f64.powi(decade);
        let _ = writeln!(svg, r##"<line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{ms} ms</text>"##, width - right, y(ms), y(ms), left - 6.0, y(ms) + 4.0);
    }
    for minute in (0..=(span_s / 600.0) as u32).map(|k| f64::from(k) * 600.0) {
        let _ = writeln!(svg, r#"<text x="{:.1}" y="{}" text-anchor="middle">{:.0} min</text>"#, x(minute), height - bottom + 18.0, minute / 60.0);
    }
    let _ = writeln!(svg, r##"<line x1="{left}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#000" stroke-dasharray="6 4"/><text x="{}" y="{:.1}">SLO {slo_ms} ms</text>"##, width - right, y(slo_ms), y(slo_ms), width - right + 6.0, y(slo_ms) + 4.0);
    for (i, run) in runs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = run.summary.p99_ms_series.iter().enumerate().map(|(k, ms)| format!("{:.1},{:.1}", x(k as f64 * step_s), y(*ms))).collect();
        let _ = writeln!(svg, r#"<polyline fill="none" stroke="{colour}" stroke-width="1.2" points="{}"/>"#, points.join(" "));
        let legend_y = top + 16.0 * i as f64;
        let _ = writeln!(svg, r#"<rect x="{}" y="{:.1}" width="12" height="3" fill="{colour}"/><text x="{}" y="{:.1}">{}</text>"#, width - right + 6.0, legend_y + 20.0, width - right + 22.0, legend_y + 25.0, run.policy);
    }
    let _ = writeln!(svg, "</svg>");
    Some(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slogate_meets_the_budget_and_the_plot_draws_every_policy() {
        let policies: Vec<String> = ["spandana", "slogate"].iter().map(|p| (*p).to_owned()).collect();
        let report = run(Some(&policies), 3, 120).unwrap();
        assert_eq!(report.results.len(), 4 * 2 * 2);
        for r in report.results.iter().filter(|r| r.policy == "slogate") {
            assert!(r.summary.violation_rate <= BUDGET, "{} {}: {:?}", r.service, r.variant, r.summary);
            assert!(r.summary.requests > 0 && r.summary.utilisation > 0.0);
        }
        let svg = render_p99_svg(&report, "ratings", "spike").expect("the run exists");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("SLO 140 ms"));
        assert!(render(&report).contains("service compression (spike)"));
    }

    #[test]
    fn unknown_policies_and_short_runs_are_refused() {
        assert!(run(Some(&["hpa-99".to_owned()]), 1, 120).unwrap_err().to_string().contains("hpa-99"));
        assert!(run(None, 1, 10).unwrap_err().to_string().contains("--duration-s"));
    }
}
