//! `slogate tune`: the policy tuner offline, on a stopped node's reservoir
//! or on a trace file, writing the chosen configuration as TOML to paste
//! into the pool's section (or to keep next to the node's config).
//!
//! - `--reservoir DIR` reads the node's sled reservoir (DIR is the node's
//!   data directory or its `reservoir` folder; the node must be stopped,
//!   since sled locks it). The router's predictor and the planner's
//!   calibration learn from the reservoir's execution log, as the live
//!   Tuner's do; with an empty log, from the embedded training run. Forecast queries take each template's SLO
//!   as κ × its baseline latency when the template is one of the embedded
//!   TPC-DS ones, else `--default-slo-s`.
//! - `--trace FILE` reads a trace (`arrival_s,template,slo_s`): day 0 starts
//!   at its first second, the target is the day after its last arrival, and
//!   each template's SLO is the median of its rows'. The predictor and
//!   the calibration learn from the embedded training run.
//!
//! The pool comes from `--config` (its `--pool`, default the first): its
//! starting clusters, autoscaler knobs and elastic tier. Progress goes to
//! standard error, one line per phase.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use slogate_core::model::TemplateId;
use slogate_core::predict::Observation;
use slogate_core::reservoir::{CalendarHour, ExecutionRecord, Reservoir, ReservoirConfig};
use slogate_core::time::Duration;
use slogate_core::tune::{Calibration, ExecutionConfig, SloBook, TuningPhase, TuningReport, tune_pool};

use crate::config::{NodeConfig, PoolSection};
use crate::eval::{Scenario, build_policy, training_executions};
use crate::{Error, Result};

/// Where the history comes from.
#[derive(Clone, Debug)]
pub enum Source {
    /// A node's data directory or its reservoir folder.
    Reservoir(PathBuf),
    /// A trace file.
    Trace(PathBuf),
}

/// What `slogate tune` was asked.
#[derive(Clone, Debug)]
pub struct TuneRequest {
    /// The history.
    pub source: Source,
    /// The node configuration, for the pool.
    pub config: NodeConfig,
    /// Which pool.
    pub pool: Option<String>,
    /// The target day, days since 1970-01-01 (default: tomorrow for a
    /// reservoir, the day after the trace).
    pub day: Option<i32>,
    /// Days of history before it (default: the pool's `[pool.tune]`).
    pub history_days: Option<u32>,
    /// κ for templates of the embedded catalogue (reservoir only).
    pub kappa: f64,
    /// SLO of other templates, seconds.
    pub default_slo_s: f64,
    /// Seeds the forecasts and the random strategies.
    pub seed: u64,
}

/// The history as the tuner reads it.
struct History {
    reservoir: Reservoir,
    slos: BTreeMap<TemplateId, Duration>,
    /// The node's execution log (empty for a trace).
    log: Vec<ExecutionRecord>,
    default_day: i32,
}

impl History {
    /// The first day the reservoir saw an arrival, if any.
    fn first_day(&self) -> Option<i32> {
        self.reservoir.hours().map(|h| h.day).min()
    }
}

/// What `slogate tune` produced.
#[derive(Clone, Debug)]
pub struct Tuned {
    /// The `[pool.autoscale]` fragment.
    pub fragment: String,
    /// The tuner's report.
    pub report: TuningReport,
    /// What the user should know about how it was made (for standard
    /// error).
    pub notes: Vec<String>,
}

/// Days of history a weekly forecast needs; with fewer the forecaster
/// stands the most recent day in for the same weekday.
const WEEK_DAYS: i32 = 7;

/// The most recent logged executions read.
const EXECUTIONS_MAX: usize = 200_000;

/// The trace's epoch: its second 0 is 00:00 UTC of this day (2024-04-01),
/// so its days keep their weekdays stable.
pub const TRACE_FIRST_DAY: i32 = 19_814;

fn read_trace(path: &Path) -> Result<History> {
    let entries = slogate_loadgen::trace::read_trace(path)?;
    if entries.is_empty() {
        return Err(Error::Config(format!("{}: the trace has no rows", path.display())));
    }
    let trace = TraceHistory::of(&entries);
    Ok(History { reservoir: trace.reservoir, slos: trace.slos, log: Vec::new(), default_day: trace.first_day + trace.days as i32 })
}

/// What the tuner reads from a trace's rows: their arrivals in a
/// reservoir, the trace's second 0 at 00:00 UTC of [`TRACE_FIRST_DAY`],
/// and each template's SLO as the median of its rows'.
pub struct TraceHistory {
    /// The arrivals.
    pub reservoir: Reservoir,
    /// Per template.
    pub slos: BTreeMap<TemplateId, Duration>,
    /// Days since 1970-01-01 of the trace's day 0.
    pub first_day: i32,
    /// Days the trace spans (through its last arrival's day).
    pub days: u32,
}

impl TraceHistory {
    /// Reads `entries`.
    pub fn of(entries: &[slogate_loadgen::workload::TraceEntry]) -> TraceHistory {
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        let mut by_template: BTreeMap<TemplateId, Vec<f64>> = BTreeMap::new();
        let mut last_s = 0.0f64;
        for entry in entries {
            let at_s = entry.arrival.as_secs_f64();
            last_s = last_s.max(at_s);
            reservoir.handle_arrival(i64::from(TRACE_FIRST_DAY) * 86_400 + at_s.floor() as i64, entry.template);
            if let Some(slo) = entry.slo {
                by_template.entry(entry.template).or_default().push(slo.as_secs_f64());
            }
        }
        let slos = by_template
            .into_iter()
            .map(|(t, mut v)| {
                v.sort_by(f64::total_cmp);
                (t, Duration::from_secs_f64(slogate_core::stats::median(&v)))
            })
            .collect();
        TraceHistory { reservoir, slos, first_day: TRACE_FIRST_DAY, days: (last_s / 86_400.0).floor() as u32 + 1 }
    }
}

/// The reservoir of a node's data directory, or `dir` itself when it is
/// the `reservoir` folder (what `slogate tune --reservoir` and `slogate
/// serve --warm-from` accept).
pub fn reservoir_folder(dir: &Path) -> std::path::PathBuf {
    if dir.join("reservoir").is_dir() { dir.join("reservoir") } else { dir.to_path_buf() }
}

fn read_reservoir(dir: &Path, kappa: f64) -> Result<History> {
    use slogate_actors::reservoir::{ReservoirStore, SledStore};
    let folder = reservoir_folder(dir);
    if !folder.is_dir() {
        return Err(Error::Config(format!("{}: no reservoir there (expected a node's data directory)", dir.display())));
    }
    let store = SledStore::open(&folder)
        .map_err(|e| Error::Node(format!("cannot open the reservoir in {} (is the node still running? use POST /v1/pools/{{pool}}/tune then): {e}", folder.display())))?;
    let tables = store.load().map_err(|e| Error::Node(e.to_string()))?;
    let mut reservoir = Reservoir::new(ReservoirConfig::default());
    reservoir.restore(tables.counts, tables.totals, tables.samples);
    let log = store.recent_executions(EXECUTIONS_MAX).map_err(|e| Error::Node(e.to_string()))?;
    let slos = Scenario::templates().iter().map(|t| (t.id, t.baseline_latency.mul_f64(kappa))).collect();
    let today = (slogate_actors::clock::unix_now_s() / 86_400.0).floor() as i32;
    Ok(History { reservoir, slos, log, default_day: today + 1 })
}

fn pool_of<'a>(config: &'a NodeConfig, name: Option<&str>) -> Result<(usize, &'a PoolSection)> {
    let pools = &config.file.pool;
    match name {
        None => Ok((0, &pools[0])),
        Some(name) => pools.iter().enumerate().find(|(_, p)| p.name == name).ok_or_else(|| {
            let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
            Error::Config(format!("no pool `{name}` in the configuration (pools: {})", known.join(", ")))
        }),
    }
}

/// Runs the tuner; `progress` hears each phase.
pub fn run(request: &TuneRequest, progress: &mut dyn FnMut(TuningPhase)) -> Result<Tuned> {
    let history = match &request.source {
        Source::Reservoir(dir) => read_reservoir(dir, request.kappa)?,
        Source::Trace(path) => read_trace(path)?,
    };
    let first_day = history.first_day();
    let (index, pool) = pool_of(&request.config, request.pool.as_deref())?;
    let (setup, knobs) = pool.planner_setup(index)?;
    let config = pool.tune.to_core(&format!("pool[{index}].tune"), request.seed)?;
    // The node's log, as the live Tuner plans from it; a trace (or an
    // empty log) has none, and the embedded training run stands in.
    let log = if history.log.is_empty() {
        let mut sizes: Vec<u32> = pool.clusters.clone();
        sizes.extend(knobs.sizes.iter().map(|s| s.0));
        training_executions(&sizes, request.seed)
    } else {
        history.log
    };
    let observations: Vec<Observation> = log.iter().map(ExecutionRecord::observation).collect();
    let router = build_policy("slogate", &observations)?;
    let planner = router.fork_planner().ok_or_else(|| Error::Config("the slogate router cannot plan".into()))?;
    let mut setup = setup;
    setup.terms.calibration = Calibration::learn(planner.fork_predictor().as_ref(), &log);
    let day = request.day.unwrap_or(history.default_day);
    let asked_days = request.history_days.unwrap_or(pool.tune.history_days);
    // Only the days the history covers inform the forecast: a same-weekday
    // bin before the first arrival would forecast an empty day.
    let first = first_day.ok_or_else(|| Error::Config("the history has no arrivals to forecast from".into()))?;
    if first >= day {
        return Err(Error::Config(format!("the history starts on or after the target day (day {first} ≥ {day}); nothing to forecast from")));
    }
    let start = (day - asked_days as i32).max(first);
    let history_days = (day - start) as u32;
    let mut notes = Vec::new();
    if history_days < asked_days {
        notes.push(format!("the history covers {history_days} of the {asked_days} days asked for; forecasting from those"));
    }
    if (history_days as i32) < WEEK_DAYS {
        notes.push(format!("less than a week of history ({}): the previous day stands in for the same weekday of past weeks", days(history_days)));
    }
    let slos = SloBook { by_template: history.slos, default: Duration::from_secs_f64(request.default_slo_s) };
    let base = ExecutionConfig { spinups: Vec::new(), knobs };
    let report = tune_pool(&history.reservoir, day, start..day, &slos, &setup, planner.as_ref(), &base, &config, progress);
    if report.forecast_queries_per_day <= 0.0 {
        return Err(Error::Config(format!("the forecast of day {day} from days {start}..{day} holds no queries; nothing to tune")));
    }
    Ok(Tuned { fragment: render(&pool.name, history_days, &report, &setup.terms.calibration), report, notes })
}

/// `n` days, as a note reads it: "1 day", "3 days".
fn days(n: u32) -> String {
    if n == 1 { "1 day".to_owned() } else { format!("{n} days") }
}

/// The configuration as a `[pool.autoscale]` fragment.
pub fn render(pool: &str, history_days: u32, report: &TuningReport, calibration: &Calibration) -> String {
    let (y, m, d) = CalendarHour { day: report.day, hour: 0 }.date();
    let k = &report.config.knobs;
    let mut out = String::new();
    let _ = writeln!(out, "# slogate tune: pool `{pool}`, target day {y:04}-{m:02}-{d:02}, {} of history,", days(history_days));
    let (fewest, most) = report.forecast_queries_per_day_range;
    let _ = writeln!(
        out,
        "# {:.0} forecast queries per day ({fewest}–{most} across the {} forecasts), {} simulations.",
        report.forecast_queries_per_day,
        report.days.0 + report.days.1,
        report.simulations
    );
    let _ = writeln!(out, "# Expected on the validation forecasts: VR {:.2}%, ${:.3} per day.", report.expected.violations * 100.0, report.expected.cost_usd);
    if let Some(base) = report.base_expected {
        let verdict = if report.accepted { "tuned configuration accepted: it beats" } else { "tuned configuration rejected: it does not beat" };
        let _ = writeln!(out, "# The {verdict} the base (VR {:.2}%, ${:.3} per day) there.", base.violations * 100.0, base.cost_usd);
    }
    let _ = writeln!(out, "# Planner calibrated from the execution log: {calibration}.");
    let _ = writeln!(out, "# Paste into the pool's [[pool]] section (or replace its [pool.autoscale] keys).");
    let _ = writeln!(out, "[pool.autoscale]");
    let _ = writeln!(out, "enabled = true");
    let _ = writeln!(out, "idle_teardown_s = {}", k.idle_teardown.as_micros() / 1_000_000);
    let _ = writeln!(out, "min_lifetime_s = {}", k.min_lifetime.as_micros() / 1_000_000);
    let _ = writeln!(out, "trigger_target = {}", k.trigger_target);
    let _ = writeln!(out, "min_observations = {}", k.min_observations);
    let _ = writeln!(out, "completions = {}", k.completions);
    let _ = writeln!(out, "window_s = {}", k.window.as_micros() / 1_000_000);
    let _ = writeln!(out, "trigger_slo_tightening = {}", k.trigger_slo_tightening);
    for spinup in &report.config.spinups {
        let at_s = spinup.at.as_micros() / 1_000_000;
        let _ = writeln!(out, "\n[[pool.autoscale.scheduled]]\n# {:02}:{:02}:{:02} UTC\nat_s = {at_s}\nsize = {}", at_s / 3_600, at_s / 60 % 60, at_s % 60, spinup.size.0);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    fn node_config(extra: &str) -> NodeConfig {
        let text = format!("version = \"1\"\n[[pool]]\nname = \"bi\"\npolicy = \"slogate\"\nclusters = [16]\n[pool.autoscale]\nenabled = true\n[pool.tune]\nscenarios = 4\nstrategy = \"random\"\nbudget = 2\nrounds = 1\n{extra}");
        NodeConfig::load(&text, &std::collections::HashMap::new(), &Overrides::default()).unwrap()
    }

    #[test]
    fn a_trace_tunes_into_a_fragment_the_node_accepts() {
        let scratch_dir = tempfile::Builder::new().prefix("slogate-tune-").tempdir().unwrap();
        let dir = scratch_dir.path();
        let trace = dir.join("trace.csv");
        // Two days: each at 10:00, 40 queries of template 5 within 80 s.
        let mut text = "arrival_s,template,slo_s\n".to_owned();
        for day in 0..2 {
            for i in 0..40 {
                let _ = writeln!(text, "{},5,30", day * 86_400 + 36_000 + i * 2);
            }
        }
        std::fs::write(&trace, text).unwrap();
        let request = TuneRequest { source: Source::Trace(trace), config: node_config(""), pool: None, day: None, history_days: Some(2), kappa: 4.0, default_slo_s: 60.0, seed: 1 };
        let mut phases = Vec::new();
        let Tuned { fragment, report, notes } = run(&request, &mut |p| phases.push(p)).unwrap();
        assert!(notes.iter().any(|n| n.contains("less than a week")), "{notes:?}");
        assert_eq!(phases.last(), Some(&TuningPhase::Done));
        assert_eq!(report.day, TRACE_FIRST_DAY + 2);
        assert!((report.forecast_queries_per_day - 40.0).abs() < 1e-9, "{}", report.forecast_queries_per_day);
        // One day stands in for the weekday: no day-to-day spread.
        assert!(fragment.contains("# 40 forecast queries per day (40–40 across the 4 forecasts)"), "{fragment}");
        // The fragment drops into a pool section and loads.
        let base = "version = \"1\"\n[[pool]]\nname = \"bi\"\npolicy = \"slogate\"\nclusters = [16]\n";
        assert!(fragment.contains("[pool.autoscale]\nenabled = true\n"), "{fragment}");
        let merged = format!("{base}{fragment}");
        let loaded = NodeConfig::load(&merged, &std::collections::HashMap::new(), &Overrides::default()).unwrap();
        assert_eq!(loaded.file.pool[0].autoscale.scheduled.len(), report.config.spinups.len());
    }

    #[test]
    fn a_short_trace_forecasts_from_the_days_it_has_not_an_empty_month() {
        let scratch_dir = tempfile::Builder::new().prefix("slogate-tune-short-").tempdir().unwrap();
        let dir = scratch_dir.path();
        let trace = dir.join("trace.csv");
        let mut text = "arrival_s,template,slo_s\n".to_owned();
        for day in 0..3 {
            for i in 0..30 {
                let _ = writeln!(text, "{},7,40", day * 86_400 + 50_000 + i * 3);
            }
        }
        std::fs::write(&trace, text).unwrap();
        // The pool asks for 30 days; the trace has 3.
        let request = TuneRequest { source: Source::Trace(trace), config: node_config("history_days = 30\n"), pool: None, day: None, history_days: None, kappa: 4.0, default_slo_s: 60.0, seed: 1 };
        let tuned = run(&request, &mut |_| {}).unwrap();
        assert!((tuned.report.forecast_queries_per_day - 30.0).abs() < 1e-9, "{}", tuned.report.forecast_queries_per_day);
        assert!(tuned.notes.iter().any(|n| n.contains("covers 3 of the 30 days")), "{:?}", tuned.notes);
        assert!(tuned.fragment.contains("3 days of history"), "{}", tuned.fragment);
        assert!(tuned.notes.iter().any(|n| n.contains("less than a week of history (3 days)")), "{:?}", tuned.notes);
    }

    #[test]
    fn a_single_day_is_written_in_the_singular() {
        assert_eq!((days(1).as_str(), days(0).as_str(), days(7).as_str()), ("1 day", "0 days", "7 days"));
    }

    #[test]
    fn bad_sources_and_pools_are_named() {
        let missing = TuneRequest {
            source: Source::Reservoir(PathBuf::from("/nonexistent/slogate")),
            config: node_config(""),
            pool: None,
            day: None,
            history_days: None,
            kappa: 4.0,
            default_slo_s: 60.0,
            seed: 1,
        };
        let error = run(&missing, &mut |_| {}).unwrap_err();
        assert_eq!(error.exit_code(), 2);
        assert!(error.to_string().contains("no reservoir there"), "{error}");
        let scratch_dir = tempfile::Builder::new().prefix("slogate-tune-pool-").tempdir().unwrap();
        let dir = scratch_dir.path();
        let trace = dir.join("t.csv");
        std::fs::write(&trace, "arrival_s,template,slo_s\n1,5,30\n").unwrap();
        let wrong_pool = TuneRequest { source: Source::Trace(trace), pool: Some("etl".into()), ..missing };
        assert!(run(&wrong_pool, &mut |_| {}).unwrap_err().to_string().contains("no pool `etl`"));
    }
}
