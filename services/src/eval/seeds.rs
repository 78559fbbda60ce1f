//! Multi-seed evaluation: every built-in evaluation over several seeds,
//! each figure reported as the mean, the worst seed and the spread.
//!
//! A decision-quality figure from one seed is an anecdote. Each report
//! type lists its headline figures ([`SeedFigures`]); [`run_seeds`] runs
//! the evaluation once per seed and [`aggregate`] folds the figures of the
//! same row and metric across seeds:
//!
//! - `mean` over the seeds that have the figure (a comparison that does not
//!   apply on some seed, such as a saving against a baseline that missed
//!   τ, is left out there, and the count shows it);
//! - `worst`: the highest value where lower is better (VR, cost), the
//!   lowest where higher is better, with the seed that gave it;
//! - `spread`: the highest value minus the lowest.
//!
//! # Properties
//!
//! - (A) `min ≤ mean ≤ max`, `spread = max − min ≥ 0`, and `worst` is
//!   `max` or `min` as the figure's direction says.
//! - (B) Rows and metrics keep the order in which the first seed listed
//!   them; a figure first seen on a later seed follows.
//! - (C) With one seed, `mean = worst` and `spread = 0`.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// Seeds the evaluations run when none are given: five, from the
/// scenario's own.
pub const DEFAULT_SEED_COUNT: u64 = 5;

/// The most seeds one command runs.
pub const SEEDS_MAX: usize = 1_000;

/// Which way a figure is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// Lower is better (violation rate, cost, latency).
    Lower,
    /// Higher is better (savings as a positive number, scenarios meeting τ).
    Higher,
}

/// How a figure is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unit {
    /// A fraction printed as a percentage (`0.123` → `12.3%`).
    Percent,
    /// A relative change printed with its sign (`-0.5` → `-50.0%`).
    Change,
    /// A difference of two fractions, in percentage points with its sign
    /// (`-0.02` → `-2.0pt`).
    Points,
    /// Dollars.
    Usd,
    /// Seconds.
    Seconds,
    /// A count or ratio.
    Number,
}

impl Unit {
    fn format(self, value: f64) -> String {
        match self {
            Unit::Percent => format!("{:.1}%", value * 100.0),
            Unit::Change => format!("{:+.1}%", value * 100.0),
            Unit::Points => format!("{:+.1}pt", value * 100.0),
            Unit::Usd => format!("${value:.3}"),
            Unit::Seconds => format!("{value:.2}s"),
            Unit::Number => format!("{value:.2}"),
        }
    }

    /// A spread in this unit (points for percentages).
    fn format_spread(self, spread: f64) -> String {
        match self {
            Unit::Percent | Unit::Change | Unit::Points => format!("{:.1}pt", spread * 100.0),
            other => other.format(spread),
        }
    }
}

/// One figure of one seed's report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    /// What it is about: a case and policy, a scenario, a summary row.
    pub row: String,
    /// What it measures, e.g. `VR` or `cost`.
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Which way is better.
    pub better: Better,
    /// How to print it.
    pub unit: Unit,
}

impl Figure {
    /// A figure where lower is better.
    pub fn lower(row: impl Into<String>, metric: &str, value: f64, unit: Unit) -> Self {
        Figure { row: row.into(), metric: metric.to_owned(), value, better: Better::Lower, unit }
    }

    /// A figure where higher is better.
    pub fn higher(row: impl Into<String>, metric: &str, value: f64, unit: Unit) -> Self {
        Figure { row: row.into(), metric: metric.to_owned(), value, better: Better::Higher, unit }
    }
}

/// A report whose headline figures can be compared across seeds.
pub trait SeedFigures {
    /// The figures, in the order a reader expects them.
    fn figures(&self) -> Vec<Figure>;
}

/// The figures of a "mean Δ vs `baseline` over cases" table: per policy,
/// its VR change (where the baseline had violations) and cost change.
pub fn mean_delta_figures(baseline: &str, deltas: Vec<(String, Option<f64>, f64)>) -> Vec<Figure> {
    let mut figures = Vec::new();
    for (policy, vr, cost) in deltas {
        let row = format!("mean Δ vs {baseline} over cases  {policy}");
        if let Some(vr) = vr {
            figures.push(Figure::lower(row.clone(), "VR Δ", vr, Unit::Change));
        }
        figures.push(Figure::lower(row, "cost Δ", cost, Unit::Change));
    }
    figures
}

/// One figure over the seeds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    /// The row.
    pub row: String,
    /// The metric.
    pub metric: String,
    /// Which way is better.
    pub better: Better,
    /// How it prints.
    pub unit: Unit,
    /// Seeds that had this figure.
    pub seeds: usize,
    /// Mean over them.
    pub mean: f64,
    /// The worst value.
    pub worst: f64,
    /// The seed that gave it (the first such seed on ties).
    pub worst_seed: u64,
    /// The lowest value.
    pub min: f64,
    /// The highest value.
    pub max: f64,
    /// `max − min`.
    pub spread: f64,
}

/// A figure's identity: its row and metric.
type FigureKey = (String, String);

/// A figure's direction, unit and `(seed, value)` samples.
type Samples = (Better, Unit, Vec<(u64, f64)>);

/// Folds each seed's figures (see the module docs).
pub fn aggregate(per_seed: &[(u64, Vec<Figure>)]) -> Vec<Aggregate> {
    let mut order: Vec<FigureKey> = Vec::new();
    let mut values: std::collections::HashMap<FigureKey, Samples> = std::collections::HashMap::new();
    for (seed, figures) in per_seed {
        for figure in figures {
            let key = (figure.row.clone(), figure.metric.clone());
            let entry = values.entry(key.clone()).or_insert_with(|| {
                order.push(key);
                (figure.better, figure.unit, Vec::new())
            });
            entry.2.push((*seed, figure.value));
        }
    }
    order
        .into_iter()
        .map(|key| {
            let (better, unit, samples) = values.remove(&key).expect("every key has values");
            let mean = samples.iter().map(|(_, v)| v).sum::<f64>() / samples.len() as f64;
            let min = samples.iter().map(|(_, v)| *v).fold(f64::INFINITY, f64::min);
            let max = samples.iter().map(|(_, v)| *v).fold(f64::NEG_INFINITY, f64::max);
            let worst = if better == Better::Lower { max } else { min };
            let worst_seed = samples.iter().find(|(_, v)| *v == worst).map_or(0, |(seed, _)| *seed);
            Aggregate { row: key.0, metric: key.1, better, unit, seeds: samples.len(), mean: mean.clamp(min, max), worst, worst_seed, min, max, spread: max - min }
        })
        .collect()
}

/// An evaluation over several seeds: the aggregate and every seed's own
/// report.
#[derive(Clone, Debug, Serialize)]
pub struct MultiSeedReport<R> {
    /// The evaluation's name.
    pub evaluation: String,
    /// The seeds, in the order they ran.
    pub seeds: Vec<u64>,
    /// Each figure over the seeds.
    pub aggregate: Vec<Aggregate>,
    /// Each seed's report.
    pub per_seed: Vec<R>,
}

/// Runs `evaluate` once per seed and aggregates the figures. Progress goes
/// to standard error.
///
/// # Errors
///
/// The first seed's error, named with its seed.
pub fn run_seeds<R: SeedFigures>(evaluation: &str, seeds: &[u64], mut evaluate: impl FnMut(u64) -> Result<R>) -> Result<MultiSeedReport<R>> {
    let mut per_seed = Vec::with_capacity(seeds.len());
    let mut figures = Vec::with_capacity(seeds.len());
    let started = std::time::Instant::now();
    for (index, &seed) in seeds.iter().enumerate() {
        let report = evaluate(seed).map_err(|e| match e {
            Error::Scenario(reason) => Error::Scenario(format!("seed {seed}: {reason}")),
            other => other,
        })?;
        figures.push((seed, report.figures()));
        per_seed.push(report);
        eprintln!("{evaluation}: seed {seed} done ({} of {}, {:.1} s)", index + 1, seeds.len(), started.elapsed().as_secs_f64());
    }
    Ok(MultiSeedReport { evaluation: evaluation.to_owned(), seeds: seeds.to_vec(), aggregate: aggregate(&figures), per_seed })
}

/// Parses `--seeds`: `A..B` (both included), or a comma-separated list.
///
/// # Errors
///
/// Text that is neither, an empty or reversed range, a repeated seed, or
/// more than [`SEEDS_MAX`] seeds.
pub fn parse_seeds(text: &str) -> Result<Vec<u64>> {
    let bad = |reason: String| Error::Scenario(format!("--seeds `{text}`: {reason}"));
    let number = |part: &str| part.trim().parse::<u64>().map_err(|_| bad(format!("`{}` is not a non-negative integer", part.trim())));
    let seeds: Vec<u64> = match text.split_once("..") {
        Some((first, last)) => {
            let (first, last) = (number(first)?, number(last.trim_start_matches('='))?);
            if last < first {
                return Err(bad("the range is reversed (write A..B with A ≤ B)".into()));
            }
            if last - first >= SEEDS_MAX as u64 {
                return Err(bad(format!("at most {SEEDS_MAX} seeds")));
            }
            (first..=last).collect()
        }
        None => text.split(',').map(number).collect::<Result<_>>()?,
    };
    if seeds.len() > SEEDS_MAX {
        return Err(bad(format!("at most {SEEDS_MAX} seeds")));
    }
    let mut sorted = seeds.clone();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|p| p[0] == p[1]) {
        return Err(bad(format!("seed {} appears twice", pair[0])));
    }
    Ok(seeds)
}

/// The default seeds: [`DEFAULT_SEED_COUNT`] from `first`.
pub fn default_seeds(first: u64) -> Vec<u64> {
    (0..DEFAULT_SEED_COUNT).map(|i| first.saturating_add(i)).collect()
}

fn seeds_label(seeds: &[u64]) -> String {
    let contiguous = seeds.windows(2).all(|p| p[1] == p[0] + 1);
    match (seeds.first(), seeds.last()) {
        (Some(first), Some(last)) if contiguous && seeds.len() > 1 => format!("seeds {first}..{last}"),
        _ => format!("seeds {}", seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(",")),
    }
}

/// The aggregate as a table: one line per row and metric, with the mean,
/// the worst seed's value and the spread.
pub fn render<R>(report: &MultiSeedReport<R>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "evaluation {}  {} ({} seeds): mean, worst seed, spread (max − min); `--seed N` prints one seed in full",
        report.evaluation,
        seeds_label(&report.seeds),
        report.seeds.len()
    );
    let metric_width = report.aggregate.iter().map(|a| a.metric.chars().count()).max().unwrap_or(0).max(6);
    let mut last_row: Option<&str> = None;
    for a in &report.aggregate {
        if last_row != Some(a.row.as_str()) {
            let _ = writeln!(out, "\n{}", a.row);
            let _ = writeln!(out, "  {:<metric_width$} {:>10} {:>16} {:>10} {:>6}", "", "mean", "worst (seed)", "spread", "seeds");
            last_row = Some(&a.row);
        }
        let worst = format!("{} (s{})", a.unit.format(a.worst), a.worst_seed);
        let seeds = if a.seeds == report.seeds.len() { format!("{}", a.seeds) } else { format!("{}/{}", a.seeds, report.seeds.len()) };
        let _ = writeln!(
            out,
            "  {:<metric_width$} {:>10} {:>16} {:>10} {:>6}",
            a.metric,
            a.unit.format(a.mean),
            worst,
            a.unit.format_spread(a.spread),
            seeds
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn seeds_parse_as_a_range_or_a_list() {
        assert_eq!(parse_seeds("1..5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(parse_seeds("11..=12").unwrap(), vec![11, 12]);
        assert_eq!(parse_seeds("3").unwrap(), vec![3]);
        assert_eq!(parse_seeds("7, 2,9").unwrap(), vec![7, 2, 9]);
        assert!(parse_seeds("5..1").unwrap_err().to_string().contains("reversed"));
        assert!(parse_seeds("1..x").unwrap_err().to_string().contains("`x` is not"));
        assert!(parse_seeds("1,1").unwrap_err().to_string().contains("appears twice"));
        assert!(parse_seeds("0..5000").unwrap_err().to_string().contains("at most"));
        assert_eq!(default_seeds(1), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn worst_follows_the_direction_and_missing_figures_are_counted() {
        let seed = |s, vr, saving: Option<f64>| {
            let mut figures = vec![Figure::lower("case", "VR", vr, Unit::Percent)];
            if let Some(saving) = saving {
                figures.push(Figure::higher("case", "saving", saving, Unit::Change));
            }
            (s, figures)
        };
        let aggregate = aggregate(&[seed(1, 0.1, Some(0.3)), seed(2, 0.3, None), seed(3, 0.2, Some(0.1))]);
        assert_eq!(aggregate.len(), 2);
        let vr = &aggregate[0];
        assert!((vr.mean - 0.2).abs() < 1e-12 && vr.worst == 0.3 && vr.worst_seed == 2 && (vr.spread - 0.2).abs() < 1e-12);
        let saving = &aggregate[1];
        assert_eq!((saving.seeds, saving.worst, saving.worst_seed), (2, 0.1, 3));
        let report = MultiSeedReport { evaluation: "t".into(), seeds: vec![1, 2, 3], aggregate, per_seed: Vec::<()>::new() };
        let text = render(&report);
        assert!(text.contains("seeds 1..3") && text.contains("30.0% (s2)") && text.contains("2/3"), "{text}");
    }

    proptest! {
        #[test]
        fn mean_lies_between_the_extremes_and_worst_is_an_extreme(
            values in prop::collection::vec(-1e6f64..1e6, 1..20),
            higher in any::<bool>(),
        ) {
            let per_seed: Vec<(u64, Vec<Figure>)> = values
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let figure = if higher { Figure::higher("r", "m", v, Unit::Number) } else { Figure::lower("r", "m", v, Unit::Number) };
                    (i as u64, vec![figure])
                })
                .collect();
            let a = &aggregate(&per_seed)[0];
            // (A)
            prop_assert!(a.min <= a.mean && a.mean <= a.max && a.spread >= 0.0);
            prop_assert_eq!(a.worst, if higher { a.min } else { a.max });
            prop_assert_eq!(values[a.worst_seed as usize], a.worst);
            // (C)
            if values.len() == 1 {
                prop_assert_eq!(a.mean, a.worst);
                prop_assert_eq!(a.spread, 0.0);
            }
        }
    }
}
