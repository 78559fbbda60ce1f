//! `slogate eval calibrate`: the emulated warehouse against the real
//! Redshift measurements, measured the way the data was measured.
//!
//! Three comparisons, each on the fit split (`…_concurrent.csv` plus the
//! 16-RPU table) and on the held-out validation split:
//!
//! 1. **Isolated latency** per template and size: the median of 101
//!    simulated executions alone on a warm cluster, against the data's
//!    median isolated latency (zero overlapping queries, uncensored; on 16
//!    RPU the fit split uses the 16-RPU table's `isolated_p50_s`).
//! 2. **Size ratios**: the median over templates measured at both sizes of
//!    `ℓ(from) / ℓ(to)`, in the data and in the model, on the same templates.
//! 3. **Slowdown under concurrency**: the calibration experiment of AutoSLO
//!    §8.3.2 re-run in the simulator (BaseWorkload at λ ∈ {0.05, 0.1, 0.2,
//!    0.5, 1.0} and the four phased mixes, on one warm cluster of 4, 8, 16
//!    and 32 RPU, 1-hour timeout). Each query's overlapping neighbours are
//!    counted as the data counts them (client-side intervals that
//!    intersect), and the median slowdown of uncensored queries is compared
//!    per size and bucket (0, 1, 2, 3–4, 5–8, 9–16, 17–32, 33+). The data
//!    does not say which arrival rate each run used, and not every size ran
//!    every rate, so each data run is matched with the simulated runs of
//!    the closest median neighbour count (`matched_slowdowns`). Slowdown
//!    here is `latency / ℓ_iso16(template)`, the 16-RPU isolated median from
//!    the table, for data and model alike, so the data side does not depend
//!    on anything fitted.
//!
//! `--fit` runs the grid search that chose the per-size parameters in
//! `WorldConfig::tpcds_sf1000` against the fit split only.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use slogate_world::catalog::{self, ExecutionMeasurement, TemplateMeasurement};
use slogate_core::model::{PoolId, Query, QueryId, Rpu, Slo, TemplateId};
use slogate_core::route::RoundRobin;
use slogate_core::sim::{QueryOutcome, Simulation};
use slogate_core::time::{Duration, Instant};
use slogate_core::stats::{count_overlapping_neighbours, median};
use slogate_world::{SizeProfile, World, WorldConfig};
use slogate_loadgen::workload::{
    CALIBRATION_RATES_PER_S, PHASED_MIXES, TraceEntry, base_workload, phased_workload,
};

use crate::Result;

/// The sizes the data covers.
pub const SIZES: [u32; 4] = [4, 8, 16, 32];
/// The neighbour-count buckets of the report.
pub const BUCKETS: [(u32, u32, &str); 8] = [
    (0, 0, "0"),
    (1, 1, "1"),
    (2, 2, "2"),
    (3, 4, "3-4"),
    (5, 8, "5-8"),
    (9, 16, "9-16"),
    (17, 32, "17-32"),
    (33, u32::MAX, "33+"),
];
/// Simulated executions per template and size for the isolated medians.
const ISOLATED_DRAWS: u64 = 101;
/// The calibration runs' per-query timeout.
const CALIBRATION_TIMEOUT: Duration = Duration::from_secs(3_600);
/// Targets the issue sets for the world model.
pub const ISOLATED_TARGET_PCT: f64 = 10.0;
/// Size-ratio target, percent.
pub const SIZE_RATIO_TARGET_PCT: f64 = 15.0;
/// Slowdown target per bucket, percent.
pub const SLOWDOWN_TARGET_PCT: f64 = 20.0;

fn bucket_of(neighbours: u32) -> &'static str {
    BUCKETS.iter().find(|(lo, hi, _)| (*lo..=*hi).contains(&neighbours)).map(|(_, _, name)| *name).expect("buckets cover u32")
}

/// Isolated latency, one template at one size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IsolatedRow {
    /// `fit` or `validation`.
    pub split: String,
    /// Template.
    pub template: u32,
    /// Size.
    pub rpu: u32,
    /// Data median, seconds.
    pub data_s: f64,
    /// Model median, seconds.
    pub model_s: f64,
}

/// Isolated-latency error summary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IsolatedReport {
    /// Median absolute percentage error over the fit split's rows.
    pub median_abs_pct_error: f64,
    /// The measurement noise floor: two isolated executions of the same
    /// template, variant and size (any split) differ by this much, median
    /// `max/min − 1` in percent. No model can beat it on held-out data.
    pub repeat_abs_pct_difference: f64,
    /// The same over the validation split's rows.
    pub validation_median_abs_pct_error: f64,
    /// Per split and size: (split, rpu, rows, median abs % error).
    pub by_size: Vec<IsolatedBySize>,
    /// Every compared row.
    pub rows: Vec<IsolatedRow>,
}

/// Isolated-latency error at one size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IsolatedBySize {
    /// `fit` or `validation`.
    pub split: String,
    /// Size.
    pub rpu: u32,
    /// Templates compared.
    pub templates: usize,
    /// Median absolute percentage error.
    pub median_abs_pct_error: f64,
}

/// A size ratio, data vs model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SizeRatio {
    /// `fit` or `validation`.
    pub split: String,
    /// Smaller size.
    pub from_rpu: u32,
    /// Larger size.
    pub to_rpu: u32,
    /// Templates measured at both sizes.
    pub templates: usize,
    /// Median `ℓ(from) / ℓ(to)` in the data.
    pub data: f64,
    /// The same in the model.
    pub model: f64,
}

/// Median slowdown in one size and neighbour bucket, data vs model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlowdownRow {
    /// `fit` or `validation`.
    pub split: String,
    /// Size.
    pub rpu: u32,
    /// Neighbour bucket.
    pub bucket: String,
    /// Uncensored data rows in the bucket.
    pub rows: usize,
    /// Data median slowdown (`None` without rows).
    pub data_median: Option<f64>,
    /// Uncensored simulated queries in the bucket.
    pub model_rows: usize,
    /// Model median slowdown (`None` without rows).
    pub model_median: Option<f64>,
    /// Data median relative to the data's own zero-neighbour median at this
    /// size and split: slowdown against the measured isolated level.
    pub data_relative: Option<f64>,
    /// Model median relative to the model's zero-neighbour median.
    pub model_relative: Option<f64>,
}

impl SlowdownRow {
    /// `|model / data − 1|` in percent, when both exist.
    pub fn error_pct(&self) -> Option<f64> {
        Some((self.model_median? / self.data_median? - 1.0).abs() * 100.0)
    }

    /// The same for the slowdowns relative to each side's own isolated
    /// level.
    pub fn relative_error_pct(&self) -> Option<f64> {
        Some((self.model_relative? / self.data_relative? - 1.0).abs() * 100.0)
    }
}

/// The whole calibration report (`calibrate --json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationReport {
    /// The seed of the simulated runs.
    pub seed: u64,
    /// Simulated repetitions of the experiment design.
    pub repetitions: u64,
    /// Isolated latencies.
    pub isolated: IsolatedReport,
    /// Size ratios.
    pub size_ratio: Vec<SizeRatio>,
    /// Slowdowns.
    pub slowdown: Vec<SlowdownRow>,
}

struct Data {
    templates: Vec<TemplateMeasurement>,
    fit: Vec<ExecutionMeasurement>,
    validation: Vec<ExecutionMeasurement>,
    iso16: HashMap<TemplateId, f64>,
}

impl Data {
    fn load() -> Data {
        let templates = catalog::tpcds_templates();
        let iso16 = templates.iter().map(|t| (t.template, t.isolated_p50.as_secs_f64())).collect();
        Data {
            templates,
            fit: catalog::parse_concurrent(catalog::CONCURRENT_FIT_CSV).expect("embedded data parses"),
            validation: catalog::parse_concurrent(catalog::CONCURRENT_VALIDATION_CSV).expect("embedded data parses"),
            iso16,
        }
    }

    fn split(&self, split: &str) -> &[ExecutionMeasurement] {
        if split == "fit" { &self.fit } else { &self.validation }
    }
}

/// Isolated medians per (template, size) of a split's zero-neighbour rows.
fn isolated_medians(rows: &[ExecutionMeasurement]) -> HashMap<(TemplateId, Rpu), f64> {
    let mut samples: HashMap<(TemplateId, Rpu), Vec<f64>> = HashMap::new();
    for r in rows.iter().filter(|r| r.neighbours == 0 && !r.censored) {
        samples.entry((r.template, r.size)).or_default().push(r.latency.as_secs_f64());
    }
    samples.into_iter().map(|(k, v)| (k, median(&v))).collect()
}

/// The model's isolated median of every template at `size`: 101 noisy
/// executions each, alone on a warm cluster.
fn model_isolated(config: &WorldConfig, templates: &[TemplateMeasurement], size: Rpu) -> HashMap<TemplateId, f64> {
    let mut config = config.clone();
    config.query_timeout = Duration::from_secs(10_000_000);
    let mut world = World::new(config);
    world.add_cluster(Instant::ZERO, Rpu(size.0), true);
    let spacing = Duration::from_secs(100_000);
    let mut queries = Vec::new();
    let mut at = Instant::ZERO;
    for t in templates {
        for _ in 0..ISOLATED_DRAWS {
            queries.push(Query {
                id: QueryId(queries.len() as u64),
                pool: PoolId::default(),
                template: t.template,
                slo: Slo { latency: Duration::MAX },
                arrival: at,
            });
            at += spacing;
        }
    }
    let mut sim = Simulation::new(world, RoundRobin::default(), queries.clone());
    sim.drive_until_idle();
    let mut samples: HashMap<TemplateId, Vec<f64>> = HashMap::new();
    for r in sim.records() {
        samples.entry(r.template).or_default().push(r.latency().as_secs_f64());
    }
    samples.into_iter().map(|(k, v)| (k, median(&v))).collect()
}

/// The calibration workloads of one repetition.
fn design_workloads(seed: u64) -> Vec<Vec<TraceEntry>> {
    let templates = slogate_world::catalog::tpcds_template_set();
    let mut workloads = Vec::new();
    for (i, rate) in CALIBRATION_RATES_PER_S.iter().enumerate() {
        workloads.push(base_workload(&templates, *rate, seed.wrapping_mul(31).wrapping_add(i as u64)).expect("valid rate"));
    }
    for (i, (low, high)) in PHASED_MIXES.iter().enumerate() {
        workloads.push(phased_workload(&templates, *low, *high, seed.wrapping_mul(37).wrapping_add(i as u64)).expect("valid"));
    }
    workloads
}

/// One simulated run of the experiment design.
struct SimulatedRun {
    /// Median overlapping-neighbour count over all its queries.
    median_neighbours: f64,
    /// (bucket, slowdown) of each uncensored query.
    slowdowns: Vec<(&'static str, f64)>,
}

/// Runs the experiment design `repetitions` times on one warm cluster of
/// `size`.
fn simulate_design(config: &WorldConfig, iso16: &HashMap<TemplateId, f64>, size: Rpu, seed: u64, repetitions: u64) -> Vec<SimulatedRun> {
    let mut runs = Vec::new();
    for rep in 0..repetitions {
        for (run, workload) in design_workloads(seed.wrapping_add(rep)).into_iter().enumerate() {
            let mut config = config.clone();
            config.query_timeout = CALIBRATION_TIMEOUT;
            config.seed = seed.wrapping_add(rep).wrapping_mul(1_000).wrapping_add(run as u64 + u64::from(size.0) * 100);
            let mut world = World::new(config);
            world.add_cluster(Instant::ZERO, size, true);
            let queries: Vec<Query> = workload
                .iter()
                .enumerate()
                .map(|(i, e)| Query {
                    id: QueryId(i as u64),
                    pool: PoolId::default(),
                    template: e.template,
                    slo: Slo { latency: Duration::MAX },
                    arrival: e.arrival,
                })
                .collect();
            let mut sim = Simulation::new(world, RoundRobin::default(), queries);
            sim.drive_until_idle();
            let records = sim.records();
            let intervals: Vec<(Instant, Instant)> = records.iter().map(|r| (r.arrival, r.finished)).collect();
            let neighbours = count_overlapping_neighbours(&intervals);
            let median_neighbours = median(&neighbours.iter().map(|&n| f64::from(n)).collect::<Vec<_>>());
            let slowdowns = records
                .iter()
                .zip(neighbours)
                .filter(|(r, _)| r.outcome == QueryOutcome::Completed)
                .map(|(r, n)| (bucket_of(n), r.latency().as_secs_f64() / iso16[&r.template]))
                .collect();
            runs.push(SimulatedRun { median_neighbours, slowdowns });
        }
    }
    runs
}

/// The data's runs at one size: each run's median neighbour count.
fn data_run_medians(rows: &[ExecutionMeasurement], size: Rpu) -> Vec<f64> {
    let mut by_run: HashMap<u64, Vec<f64>> = HashMap::new();
    for r in rows.iter().filter(|r| r.size == size) {
        by_run.entry(r.run_id).or_default().push(f64::from(r.neighbours));
    }
    let mut runs: Vec<(u64, f64)> = by_run.into_iter().map(|(id, n)| (id, median(&n))).collect();
    runs.sort_by_key(|(id, _)| *id);
    runs.into_iter().map(|(_, m)| m).collect()
}

/// The data does not label each run's arrival rate, and its sizes did not
/// all run the whole design. To compare like with like, each data run is
/// matched with the `per_run` simulated runs whose median neighbour count
/// is closest (in log scale) to its own, and the model's bucket rows are the
/// union of the matched runs' rows.
fn matched_slowdowns(data_medians: &[f64], simulated: &[SimulatedRun], per_run: usize) -> HashMap<&'static str, Vec<f64>> {
    let mut by_bucket: HashMap<&'static str, Vec<f64>> = HashMap::new();
    for &data_median in data_medians {
        let mut order: Vec<usize> = (0..simulated.len()).collect();
        let distance = |i: usize| ((1.0 + simulated[i].median_neighbours).ln() - (1.0 + data_median).ln()).abs();
        order.sort_by(|&a, &b| distance(a).total_cmp(&distance(b)).then(a.cmp(&b)));
        for &i in order.iter().take(per_run) {
            for &(bucket, slowdown) in &simulated[i].slowdowns {
                by_bucket.entry(bucket).or_default().push(slowdown);
            }
        }
    }
    by_bucket
}

/// Runs the calibration with `config` as the world.
pub fn run(config: &WorldConfig, seed: u64, repetitions: u64) -> Result<CalibrationReport> {
    let data = Data::load();
    let model_iso: HashMap<u32, HashMap<TemplateId, f64>> =
        SIZES.iter().map(|&s| (s, model_isolated(config, &data.templates, Rpu(s)))).collect();

    // 1. Isolated latencies.
    let mut rows = Vec::new();
    for split in ["fit", "validation"] {
        let medians = isolated_medians(data.split(split));
        let mut keys: Vec<_> = medians.keys().copied().collect();
        if split == "fit" {
            keys.retain(|(_, size)| *size != Rpu(16));
            keys.extend(data.templates.iter().map(|t| (t.template, Rpu(16))));
        }
        keys.sort();
        for (template, size) in keys {
            let data_s = if split == "fit" && size == Rpu(16) { data.iso16[&template] } else { medians[&(template, size)] };
            let Some(model_s) = model_iso.get(&size.0).and_then(|m| m.get(&template)) else { continue };
            rows.push(IsolatedRow { split: split.into(), template: template.0, rpu: size.0, data_s, model_s: *model_s });
        }
    }
    let abs_pct = |r: &IsolatedRow| (r.model_s / r.data_s - 1.0).abs() * 100.0;
    let split_error = |split: &str| {
        let errors: Vec<f64> = rows.iter().filter(|r| r.split == split).map(abs_pct).collect();
        if errors.is_empty() { f64::NAN } else { median(&errors) }
    };
    let mut by_size = Vec::new();
    for split in ["fit", "validation"] {
        for &size in &SIZES {
            let errors: Vec<f64> = rows.iter().filter(|r| r.split == split && r.rpu == size).map(abs_pct).collect();
            if !errors.is_empty() {
                by_size.push(IsolatedBySize { split: split.into(), rpu: size, templates: errors.len(), median_abs_pct_error: median(&errors) });
            }
        }
    }
    let mut repeats: HashMap<(TemplateId, u32, Rpu), Vec<f64>> = HashMap::new();
    for r in data.fit.iter().chain(&data.validation).filter(|r| r.neighbours == 0 && !r.censored) {
        repeats.entry((r.template, r.variant, r.size)).or_default().push(r.latency.as_secs_f64());
    }
    let mut differences = Vec::new();
    for samples in repeats.values() {
        for (i, a) in samples.iter().enumerate() {
            for b in &samples[i + 1..] {
                differences.push((a.max(*b) / a.min(*b) - 1.0) * 100.0);
            }
        }
    }
    let isolated = IsolatedReport {
        median_abs_pct_error: split_error("fit"),
        repeat_abs_pct_difference: median(&differences),
        validation_median_abs_pct_error: split_error("validation"),
        by_size,
        rows,
    };

    // 2. Size ratios.
    let mut size_ratio = Vec::new();
    for split in ["fit", "validation"] {
        let medians = isolated_medians(data.split(split));
        for (i, &from) in SIZES.iter().enumerate() {
            for &to in &SIZES[i + 1..] {
                let templates: Vec<TemplateId> = data
                    .templates
                    .iter()
                    .map(|t| t.template)
                    .filter(|t| medians.contains_key(&(*t, Rpu(from))) && medians.contains_key(&(*t, Rpu(to))))
                    .collect();
                if templates.is_empty() {
                    continue;
                }
                let data_ratios: Vec<f64> = templates.iter().map(|t| medians[&(*t, Rpu(from))] / medians[&(*t, Rpu(to))]).collect();
                let model_ratios: Vec<f64> = templates.iter().map(|t| model_iso[&from][t] / model_iso[&to][t]).collect();
                size_ratio.push(SizeRatio {
                    split: split.into(),
                    from_rpu: from,
                    to_rpu: to,
                    templates: templates.len(),
                    data: median(&data_ratios),
                    model: median(&model_ratios),
                });
            }
        }
    }

    // 3. Slowdowns.
    let mut slowdown = Vec::new();
    let simulated: HashMap<u32, Vec<SimulatedRun>> =
        SIZES.iter().map(|&s| (s, simulate_design(config, &data.iso16, Rpu(s), seed, repetitions))).collect();
    for split in ["fit", "validation"] {
        for &size in &SIZES {
            let model = matched_slowdowns(&data_run_medians(data.split(split), Rpu(size)), &simulated[&size], repetitions as usize);
            let mut data_buckets: HashMap<&str, Vec<f64>> = HashMap::new();
            for r in data.split(split).iter().filter(|r| r.size == Rpu(size) && !r.censored) {
                data_buckets.entry(bucket_of(r.neighbours)).or_default().push(r.latency.as_secs_f64() / data.iso16[&r.template]);
            }
            let data_isolated = data_buckets.get("0").filter(|v| !v.is_empty()).map(|v| median(v));
            let model_isolated = model.get("0").filter(|v| !v.is_empty()).map(|v| median(v));
            for (_, _, bucket) in BUCKETS {
                let data_rows = data_buckets.get(bucket).map_or(&[][..], |v| &v[..]);
                let model_rows = model.get(bucket).map_or(&[][..], |v| &v[..]);
                let data_median = (!data_rows.is_empty()).then(|| median(data_rows));
                let model_median = (!model_rows.is_empty()).then(|| median(model_rows));
                slowdown.push(SlowdownRow {
                    data_relative: data_median.zip(data_isolated).map(|(m, i)| m / i),
                    model_relative: model_median.zip(model_isolated).map(|(m, i)| m / i),
                    split: split.into(),
                    rpu: size,
                    bucket: bucket.into(),
                    rows: data_rows.len(),
                    data_median,
                    model_rows: model_rows.len(),
                    model_median,
                });
            }
        }
    }
    Ok(CalibrationReport { seed, repetitions, isolated, size_ratio, slowdown })
}

/// Minimum data rows for a bucket to count towards the summary: medians of
/// fewer rows are mostly noise.
pub const MIN_BUCKET_ROWS: usize = 10;

/// Buckets (of a split) with at least [`MIN_BUCKET_ROWS`] data rows and a
/// model median, and how many of them are within the slowdown target.
pub fn slowdown_within_target(report: &CalibrationReport, split: &str) -> (usize, usize) {
    let eligible: Vec<&SlowdownRow> = report
        .slowdown
        .iter()
        .filter(|r| r.split == split && r.rows >= MIN_BUCKET_ROWS && r.model_median.is_some())
        .collect();
    let within = eligible.iter().filter(|r| r.error_pct().is_some_and(|e| e <= SLOWDOWN_TARGET_PCT)).count();
    (within, eligible.len())
}

/// As [`slowdown_within_target`], for the slowdowns relative to each
/// side's own isolated level (buckets other than 0, where both exist).
pub fn relative_slowdown_within_target(report: &CalibrationReport, split: &str) -> (usize, usize) {
    let eligible: Vec<&SlowdownRow> = report
        .slowdown
        .iter()
        .filter(|r| r.split == split && r.bucket != "0" && r.rows >= MIN_BUCKET_ROWS && r.relative_error_pct().is_some())
        .collect();
    let within = eligible.iter().filter(|r| r.relative_error_pct().is_some_and(|e| e <= SLOWDOWN_TARGET_PCT)).count();
    (within, eligible.len())
}

/// The human-readable report.
pub fn render(report: &CalibrationReport) -> String {
    let mut out = String::new();
    let w = &mut out;
    let iso = &report.isolated;
    writeln!(w, "calibration: emulated warehouse vs Redshift Serverless TPC-DS SF1000 (seed {}, {} repetitions)", report.seed, report.repetitions).unwrap();
    writeln!(w, "\n1. isolated latency, median |model/data - 1| (target ≤ {ISOLATED_TARGET_PCT}% on fit)").unwrap();
    writeln!(w, "   fit: {:.1}%   validation (held out): {:.1}%", iso.median_abs_pct_error, iso.validation_median_abs_pct_error).unwrap();
    writeln!(w, "   noise floor: two isolated runs of the same template, variant and size differ by {:.1}% (median)", iso.repeat_abs_pct_difference).unwrap();
    for s in &iso.by_size {
        writeln!(w, "   {:<10} {:>3} RPU  {:>3} templates  {:>6.1}%", s.split, s.rpu, s.templates, s.median_abs_pct_error).unwrap();
    }
    writeln!(w, "\n   per template at 16 RPU (fit: the 16-RPU table), seconds:").unwrap();
    let sixteen: Vec<&IsolatedRow> = iso.rows.iter().filter(|r| r.split == "fit" && r.rpu == 16).collect();
    for chunk in sixteen.chunks(4) {
        let cells: Vec<String> = chunk.iter().map(|r| format!("t{:<3} {:>7.2} {:>7.2}", r.template, r.data_s, r.model_s)).collect();
        writeln!(w, "   {}", cells.join("  |  ")).unwrap();
    }
    writeln!(w, "   (columns: template, data, model)").unwrap();
    for size in [8, 32] {
        writeln!(w, "\n   per template at {size} RPU (fit split's isolated executions), seconds:").unwrap();
        let at: Vec<&IsolatedRow> = iso.rows.iter().filter(|r| r.split == "fit" && r.rpu == size).collect();
        for chunk in at.chunks(4) {
            let cells: Vec<String> = chunk.iter().map(|r| format!("t{:<3} {:>7.2} {:>7.2}", r.template, r.data_s, r.model_s)).collect();
            writeln!(w, "   {}", cells.join("  |  ")).unwrap();
        }
    }
    writeln!(w, "\n2. size ratios, median over templates of ℓ(from)/ℓ(to) (target within {SIZE_RATIO_TARGET_PCT}%)").unwrap();
    writeln!(w, "   {:<10} {:>5} {:>5} {:>9} {:>7} {:>7} {:>7}", "split", "from", "to", "templates", "data", "model", "error").unwrap();
    for r in &report.size_ratio {
        writeln!(w, "   {:<10} {:>5} {:>5} {:>9} {:>7.2} {:>7.2} {:>6.1}%", r.split, r.from_rpu, r.to_rpu, r.templates, r.data, r.model, (r.model / r.data - 1.0).abs() * 100.0).unwrap();
    }
    writeln!(w, "\n3. median slowdown (latency / 16-RPU isolated latency) by overlapping queries (target within {SLOWDOWN_TARGET_PCT}%)").unwrap();
    writeln!(w, "   (rel: the same ÷ that side's own zero-neighbour median at the size)").unwrap();
    writeln!(w, "   {:<10} {:>4} {:>6} {:>6} {:>10} {:>7} {:>10} {:>7}  {:>8} {:>9} {:>7}", "split", "rpu", "bucket", "rows", "data", "model n", "model", "error", "data rel", "model rel", "error").unwrap();
    let fmt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.2}"));
    for r in &report.slowdown {
        let error = r.error_pct().map_or("-".to_owned(), |e| format!("{e:.0}%"));
        let mark = match r.error_pct() {
            Some(e) if r.rows >= MIN_BUCKET_ROWS && e <= SLOWDOWN_TARGET_PCT => " ok",
            Some(_) if r.rows >= MIN_BUCKET_ROWS => " MISS",
            _ => "",
        };
        let relative_error = r.relative_error_pct().map_or("-".to_owned(), |e| format!("{e:.0}%"));
        writeln!(
            w,
            "   {:<10} {:>4} {:>6} {:>6} {:>10} {:>7} {:>10} {:>7}  {:>8} {:>9} {:>7}{}",
            r.split, r.rpu, r.bucket, r.rows, fmt(r.data_median), r.model_rows, fmt(r.model_median), error,
            fmt(r.data_relative), fmt(r.model_relative), relative_error, mark
        )
        .unwrap();
    }
    for split in ["fit", "validation"] {
        let (within, eligible) = slowdown_within_target(report, split);
        let (within_relative, eligible_relative) = relative_slowdown_within_target(report, split);
        writeln!(
            w,
            "   {split}: {within} of {eligible} buckets with ≥ {MIN_BUCKET_ROWS} data rows within {SLOWDOWN_TARGET_PCT}%; relative to isolated: {within_relative} of {eligible_relative}"
        )
        .unwrap();
    }
    out
}

/// One point of the `--fit` grid for one size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FitPoint {
    /// The candidate profile.
    pub profile: SizeProfile,
    /// Weighted squared log error over the fit split's buckets.
    pub loss: f64,
}

/// Grid search over the short-query lane (shared by all sizes), each
/// candidate scored by the sum over sizes of the best per-size loss found
/// by [`fit_size`] with the other parameters fixed at `base`.
pub fn fit_short_query_lane(base: &WorldConfig, seed: u64, repetitions: u64) -> Vec<(f64, u32, f64)> {
    let mut results = Vec::new();
    for max_latency_s in [0.0, 1.0, 2.0, 5.0, 10.0] {
        for slots in [1u32, 2, 4, 8] {
            if max_latency_s == 0.0 && slots > 1 {
                continue;
            }
            let mut config = base.clone();
            config.short_query_max_latency = Duration::from_secs_f64(max_latency_s);
            config.short_query_slots = if max_latency_s == 0.0 { 0 } else { slots };
            let loss: f64 = SIZES.iter().map(|&size| fit_size(&config, size, seed, repetitions)[0].loss).sum();
            results.push((max_latency_s, config.short_query_slots, loss));
        }
    }
    results.sort_by(|a, b| a.2.total_cmp(&b.2));
    results
}

/// Grid search over one size's profile against the fit split.
pub fn fit_size(base: &WorldConfig, size: u32, seed: u64, repetitions: u64) -> Vec<FitPoint> {
    let data = Data::load();
    let mut data_buckets: HashMap<&str, Vec<f64>> = HashMap::new();
    for r in data.fit.iter().filter(|r| r.size == Rpu(size) && !r.censored) {
        data_buckets.entry(bucket_of(r.neighbours)).or_default().push(r.latency.as_secs_f64() / data.iso16[&r.template]);
    }
    let current = base.size_profile(Rpu(size));
    let data_medians = data_run_medians(&data.fit, Rpu(size));
    let latency_factors: Vec<f64> = if size == 4 { vec![3.5, 4.0, 4.4, 5.0, 6.0] } else { vec![current.latency_factor] };
    let mut points = Vec::new();
    for &latency_factor in &latency_factors {
        for admission_slots in [2u32, 3, 4, 5, 6, 8, 12, 16, 24] {
            for demand_fraction in [0.3, 0.5, 0.75, 1.0] {
                for sharing_exponent in [0.5, 0.6, 0.7, 0.8, 0.9, 1.0] {
                for oversubscription_penalty in [0.0, 0.1, 0.3] {
                    let profile = SizeProfile { size: Rpu(size), latency_factor, demand_fraction, sharing_exponent, admission_slots, oversubscription_penalty };
                    let mut config = base.clone();
                    config.sizes.retain(|p| p.size != Rpu(size));
                    config.sizes.push(profile.clone());
                    let simulated = simulate_design(&config, &data.iso16, Rpu(size), seed, repetitions);
                    let model = matched_slowdowns(&data_medians, &simulated, repetitions as usize);
                    let mut loss = 0.0;
                    for (bucket, rows) in &data_buckets {
                        let weight = (rows.len().min(50) as f64).sqrt();
                        let error = match model.get(bucket) {
                            Some(m) if !m.is_empty() => (median(m) / median(rows)).ln(),
                            _ => 3.0,
                        };
                        loss += weight * error * error;
                    }
                    points.push(FitPoint { profile, loss });
                }
                }
            }
        }
    }
    points.sort_by(|a, b| a.loss.total_cmp(&b.loss));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guards the calibration from regressing. The isolated and size-ratio
    /// targets hold on the fit split; the slowdown target (20% per bucket)
    /// holds in most but not all buckets (see the report), so this pins the
    /// quality reached: at least 60% of buckets within the target, a median
    /// bucket error of at most 20%, and no bucket off by 2× or more (seed 1,
    /// 3 repetitions: the report `slogate eval calibrate` prints).
    #[test]
    fn world_model_reproduces_the_fit_split_within_tolerance() {
        let report = run(&WorldConfig::default(), 1, 3).unwrap();
        assert!(report.isolated.median_abs_pct_error <= ISOLATED_TARGET_PCT, "isolated {}", report.isolated.median_abs_pct_error);
        for ratio in report.size_ratio.iter().filter(|r| r.split == "fit") {
            let error_pct = (ratio.model / ratio.data - 1.0).abs() * 100.0;
            assert!(error_pct <= SIZE_RATIO_TARGET_PCT, "{ratio:?}");
        }
        let errors: Vec<f64> = report
            .slowdown
            .iter()
            .filter(|r| r.split == "fit" && r.rows >= MIN_BUCKET_ROWS)
            .map(|r| r.error_pct().expect("model has rows in every bucket the data has"))
            .collect();
        assert!(errors.len() >= 20);
        let (within, eligible) = slowdown_within_target(&report, "fit");
        assert!(within as f64 >= 0.6 * eligible as f64, "{within} of {eligible} buckets within target");
        assert!(median(&errors) <= 20.0, "median bucket error {}", median(&errors));
        assert!(errors.iter().all(|&e| e < 100.0), "{errors:?}");
    }

    #[test]
    fn neighbour_buckets_cover_every_count() {
        assert_eq!(bucket_of(0), "0");
        assert_eq!(bucket_of(4), "3-4");
        assert_eq!(bucket_of(32), "17-32");
        assert_eq!(bucket_of(33), "33+");
        assert_eq!(bucket_of(u32::MAX), "33+");
    }
}
