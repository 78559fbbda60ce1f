//! The command line: `slogate eval <SCENARIO> [--policies p1,p2] [--seed N]
//! [--json PATH]`. Bad input exits with code 2 and a message naming the
//! problem; failures while running exit with 1.

use std::ffi::OsString;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};
use slogate_world::WorldConfig;

use crate::eval::{self, Scenario, calibrate, scenario::BUILT_IN, seeds};
use crate::{Error, Result};

/// slogate: an SLO gateway for elastic analytical compute.
#[derive(Debug, Parser)]
#[command(name = "slogate", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run routing policies side by side on the emulated warehouse, in
    /// virtual time.
    Eval(EvalArgs),
    /// Run a gateway node: gRPC for clients, HTTP admin API for operators,
    /// on the embedded emulated warehouse unless configured otherwise.
    Serve(ServeArgs),
    /// One-command demo: start a node on the embedded emulated warehouse
    /// (or, with `--backend postgres`, on two throwaway PostgreSQL servers
    /// with TPC-DS loaded), replay BaseWorkload against it over gRPC, print
    /// the report, stop.
    Demo(DemoArgs),
    /// Write a scenario's workload as a trace file (CSV:
    /// `arrival_s,template,slo_s,pool,query_id`), to edit or replay.
    Trace(TraceArgs),
    /// Tune a pool offline (AutoSLO's policy tuner) from a stopped node's
    /// reservoir or a trace, and write the configuration as TOML.
    Tune(TuneArgs),
    /// Train the learned latency model (Iconq+) from an execution log and
    /// write it with its metadata (a build with the `learn` feature).
    TrainPredictor(TrainPredictorArgs),
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("executions").required(true).args(["log", "simulate"])))]
struct TrainPredictorArgs {
    /// A stopped node's data directory (its execution log), or a JSON-lines
    /// file of execution records.
    #[arg(long)]
    log: Option<PathBuf>,
    /// Train on the emulator's training run with this seed instead.
    #[arg(long)]
    simulate: Option<u64>,
    /// The directory to write `model.json` and `metadata.json` to.
    #[arg(long)]
    out: PathBuf,
    /// Seeds the model, the held-out split and the censored samples.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Optimiser steps (default: the trainer's).
    #[arg(long)]
    steps: Option<usize>,
}

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("history").required(true).args(["reservoir", "trace"])))]
struct TuneArgs {
    /// A stopped node's data directory (or its `reservoir` folder).
    #[arg(long)]
    reservoir: Option<PathBuf>,
    /// A trace file (`arrival_s,template,slo_s`); day 0 starts at its
    /// first second.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// The node configuration with the pool (default: the embedded one).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The pool (default: the configuration's first).
    #[arg(long)]
    pool: Option<String>,
    /// The target day, YYYY-MM-DD (default: tomorrow, or the day after the
    /// trace).
    #[arg(long)]
    day: Option<String>,
    /// Days of history before the target (default: the pool's
    /// `[pool.tune] history_days`).
    #[arg(long)]
    history_days: Option<u32>,
    /// SLO tightness for catalogue templates of a reservoir (κ × baseline).
    #[arg(long, default_value_t = 4.0)]
    kappa: f64,
    /// SLO of other templates, seconds.
    #[arg(long, default_value_t = 60.0)]
    default_slo_s: f64,
    /// Seeds the forecasts.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output file (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// A node configuration file (TOML, `version = "1"`); default: the
    /// embedded one (pool `default`, two 16-RPU emulated clusters).
    #[arg(long)]
    config: Option<PathBuf>,
    /// gRPC listen address; `127.0.0.1:0` picks a free port.
    #[arg(long)]
    grpc_addr: Option<String>,
    /// Admin HTTP listen address.
    #[arg(long)]
    admin_addr: Option<String>,
    /// Data directory (the sled reservoir lives here).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Also warm the learned policies up on this: a stopped node's data
    /// directory (its execution log), or a trace file, which is run on the
    /// embedded emulated warehouse to make one.
    #[arg(long)]
    warm_from: Option<PathBuf>,
    /// Open a damaged reservoir anyway: keep what is left, delete rows that
    /// do not decode, and log what was dropped. Without it, damage found at
    /// start is an error.
    #[arg(long)]
    repair: bool,
    /// Print the embedded default configuration and exit.
    #[arg(long)]
    print_default_config: bool,
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// What runs the queries: `emulated` (the embedded warehouse) or
    /// `postgres` (two local PostgreSQL servers with TPC-DS; needs Debian's
    /// postgresql, and PyPI duckdb==1.4.4 and duckdb-ext-tpcds once, to
    /// generate the data).
    #[arg(long, default_value = "emulated")]
    backend: String,
    /// Virtual (workload) seconds per real second, for the node and the
    /// replay alike (emulated only; postgres runs in real time).
    #[arg(long)]
    time_compression: Option<f64>,
    /// λ of BaseWorkload, queries per workload second (default 0.1
    /// emulated, 2 postgres).
    #[arg(long)]
    rate: Option<f64>,
    /// SLO tightness κ.
    #[arg(long, default_value_t = 4.0)]
    kappa: f64,
    /// Seed of the workload (and the emulated warehouse).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Routing policies to compare, each from a fresh start (postgres
    /// only; default slogate).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// Write the report as JSON here (postgres only).
    #[arg(long)]
    json: Option<PathBuf>,
    /// TPC-DS scale factor (postgres only).
    #[arg(long, default_value_t = 0.1)]
    scale_factor: f64,
    /// Where the generated TPC-DS data is cached (default
    /// ~/.cache/slogate/tpcds-sf<SF>).
    #[arg(long)]
    data: Option<PathBuf>,
    /// The Python with duckdb and duckdb-ext-tpcds (postgres only).
    #[arg(long, default_value = "python3")]
    python: String,
    /// Templates slower than this alone are left out, seconds (postgres
    /// only).
    #[arg(long, default_value_t = 10.0)]
    isolated_cap_s: f64,
    /// Write every policy's execution log (the executions each node
    /// logged, with their timelines) to this JSON-lines file, for
    /// `slogate train-predictor --log` (postgres only).
    #[arg(long)]
    keep_log: Option<PathBuf>,
    /// Connections per server, its concurrency limit (postgres only).
    #[arg(long, default_value_t = 4)]
    connections: usize,
}

#[derive(Debug, clap::Args)]
struct TraceArgs {
    /// A built-in scenario, a scenario TOML file, or `tuner-table5` (the same
    /// as `e2e-diurnal`): their 60-day diurnal workload.
    scenario: String,
    /// Which of the scenario's workloads (0-based).
    #[arg(long, default_value_t = 0)]
    workload: usize,
    /// κ for the SLOs (default: the scenario's first; 4 for the diurnal
    /// workload).
    #[arg(long)]
    kappa: Option<f64>,
    /// Seed (default: the scenario's; 1 for the diurnal workload).
    #[arg(long)]
    seed: Option<u64>,
    /// Output file (default: standard output).
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct EvalArgs {
    /// A built-in scenario (`base`, `router-table2`, `shapes-dev`,
    /// `shapes-held-out`, `calibrate`,
    /// `predictor-real`, `predictor-sim`, `size-table3`, `trigger-table4`,
    /// `bursty-service`, `tuner-table5`, `e2e-diurnal`, `planner-fidelity`) or a scenario TOML
    /// file.
    scenario: String,
    /// Comma-separated policies (default: the scenario's).
    #[arg(long, value_delimiter = ',')]
    policies: Option<Vec<String>>,
    /// One seed for workloads and the world's noise: prints that seed's
    /// report in full.
    #[arg(long, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Seeds to run, `A..B` (both included) or `A,B,C`: prints each figure's
    /// mean, worst seed and spread. Default: five seeds from the
    /// scenario's (1..5 for the built-in ones), or one with `--explain`.
    #[arg(long)]
    seeds: Option<String>,
    /// Also write the report as JSON to this path.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Print each policy's first N routing decisions with their
    /// explanations.
    #[arg(long, default_value_t = 0)]
    explain: usize,
    /// `on` gives the world an elastic (serverless) tier and the learned
    /// policies the option to offload to it.
    #[arg(long, value_parser = ["on", "off"], default_value = "off")]
    elastic: String,
    /// The SLO Directors' (`spandana`, `spandana-central`) queue bound:
    /// outstanding queries per 16 RPU of a cluster before they offload.
    #[arg(long)]
    director_queue: Option<f64>,
    /// `slogate-iconq`'s trained model: the directory `slogate
    /// train-predictor` wrote. Unset: a build with the trainer (feature
    /// `learn`) trains one per seed on the training run.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The learned policies start from priors, with no training run to
    /// learn from: the simulated counterpart of a freshly started node
    /// without `--warm-from`.
    #[arg(long)]
    cold: bool,
    /// `bursty-service` only: seconds of load per run.
    #[arg(long, default_value_t = 3_600)]
    duration_s: u32,
    /// `bursty-service` only: write each service's spike-variant p99
    /// latency over time as an SVG into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// `calibrate` only: repetitions of the experiment design.
    #[arg(long, default_value_t = 3)]
    repetitions: u64,
    /// `calibrate` only: run the grid search behind the world's per-size
    /// parameters and print the best candidates.
    #[arg(long)]
    fit: bool,
}

/// Runs the command line; returns the process exit code.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    let result = match cli.command {
        Command::Eval(args) => run_eval(&args),
        Command::Trace(args) => run_trace(&args),
        Command::Serve(args) => run_serve(&args),
        Command::Demo(args) => run_demo(&args),
        Command::Tune(args) => run_tune(&args),
        Command::TrainPredictor(args) => run_train_predictor(&args),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            e.exit_code()
        }
    }
}

#[cfg(feature = "learn")]
fn run_train_predictor(args: &TrainPredictorArgs) -> Result<()> {
    use crate::train::{LogSource, TrainRequest};
    let source = match (&args.log, args.simulate) {
        (Some(path), _) => LogSource::Path(path.clone()),
        (None, Some(seed)) => LogSource::Simulated(seed),
        (None, None) => unreachable!("clap requires --log or --simulate"),
    };
    eprintln!("training Iconq+ (seed {})…", args.seed);
    let metadata = crate::train::run(&TrainRequest { source, out: args.out.clone(), seed: args.seed, steps: args.steps })?;
    let (held, aware) = (&metadata.training.held_out, &metadata.concurrency_aware_held_out);
    print(&format!(
        "wrote {}/model.json, model.onnx and metadata.json\n\
         executions {} ({} with a timeline); training rows {} (censored {}), held-out rows {}\n\
         held-out Q-error p50/p90/p95, same executions: iconq+ {:.2}/{:.2}/{:.2} reading every neighbour, {:.2}/{:.2}/{:.2} reading those running at arrival; concurrency-aware {:.2}/{:.2}/{:.2} (queries running at arrival)\n",
        args.out.display(),
        metadata.executions,
        metadata.executions_with_timeline,
        metadata.training.train_rows,
        metadata.training.train_censored,
        metadata.training.held_out_rows,
        held.p50,
        held.p90,
        held.p95,
        metadata.training.held_out_at_arrival.p50,
        metadata.training.held_out_at_arrival.p90,
        metadata.training.held_out_at_arrival.p95,
        aware.p50,
        aware.p90,
        aware.p95,
    ));
    Ok(())
}

#[cfg(not(feature = "learn"))]
fn run_train_predictor(_args: &TrainPredictorArgs) -> Result<()> {
    Err(Error::Config("this slogate was built without the trainer: build it with `--features learn` (cargo build --release --features learn)".into()))
}

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("reports serialise");
    std::fs::write(path, text + "\n").map_err(|source| Error::Output { path: path.display().to_string(), source })
}

fn print(text: &str) {
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (e.g. `| head`) is not an error worth reporting.
    let _ = stdout.write_all(text.as_bytes());
}

fn run_eval(args: &EvalArgs) -> Result<()> {
    if args.scenario == "calibrate" {
        return run_calibrate(args);
    }
    if args.scenario == "predictor-sim" {
        if args.policies.is_some() || args.fit {
            return Err(Error::Scenario("`predictor-sim` takes no --policies or --fit".into()));
        }
        return match seeds_of(args, 1)? {
            Seeds::One(seed) => {
                let results = crate::eval::predictor::run_simulated(seed)?;
                print(&crate::eval::predictor::render_simulated(&results));
                match &args.json {
                    Some(path) => write_json(path, &serde_json::json!({ "results": results })),
                    None => Ok(()),
                }
            }
            Seeds::Many(seeds) => {
                let report = seeds::run_seeds("predictor-sim", &seeds, crate::eval::predictor::run_simulated)?;
                emit(args, &seeds::render(&report), &report)
            }
        };
    }
    if args.scenario == "predictor-real" {
        if args.policies.is_some() || args.fit {
            return Err(Error::Scenario("`predictor-real` takes no --policies or --fit".into()));
        }
        if args.seed.is_some() || args.seeds.is_some() {
            return Err(Error::Scenario("`predictor-real` learns from and predicts the fixed Redshift measurements; it takes no --seed or --seeds".into()));
        }
        let report = crate::eval::predictor::run()?;
        return emit(args, &crate::eval::predictor::render(&report), &report);
    }
    if args.fit {
        return Err(Error::Scenario("--fit applies only to `calibrate`".into()));
    }
    if ["e2e-diurnal", "planner-fidelity", "tuner-table5"].contains(&args.scenario.as_str()) && args.policies.is_some() {
        return Err(Error::Scenario(format!("`{}` compares a fixed set of policies and takes no --policies", args.scenario)));
    }
    if args.scenario == "e2e-diurnal" {
        return evaluate(args, 1, crate::eval::e2e::run, crate::eval::e2e::render);
    }
    if args.scenario == "planner-fidelity" {
        return evaluate(args, 1, crate::eval::fidelity::run, crate::eval::fidelity::render);
    }
    if args.scenario == "tuner-table5" {
        let Seeds::One(seed) = seeds_of(args, 1)? else {
            return evaluate(args, 1, crate::eval::tuner::run, crate::eval::tuner::render);
        };
        let report = crate::eval::tuner::run(seed)?;
        emit(args, &crate::eval::tuner::render(&report), &report)?;
        let tuning_s: Vec<f64> = report.cells.iter().map(|c| c.tuning_s).collect();
        eprintln!(
            "tuning took {:.1} s in all; the slowest run (one pool, one day) {:.1} s",
            tuning_s.iter().sum::<f64>(),
            tuning_s.iter().copied().fold(0.0, f64::max)
        );
        return Ok(());
    }
    if args.scenario == "bursty-service" {
        let started = std::time::Instant::now();
        let report = match seeds_of(args, 1)? {
            Seeds::One(seed) => {
                let report = crate::eval::bursty::run(args.policies.as_deref(), seed, args.duration_s)?;
                print(&crate::eval::bursty::render(&report));
                report
            }
            Seeds::Many(seeds) => {
                let multi = seeds::run_seeds("bursty-service", &seeds, |seed| crate::eval::bursty::run(args.policies.as_deref(), seed, args.duration_s))?;
                print(&seeds::render(&multi));
                if let Some(path) = &args.json {
                    write_json(path, &multi)?;
                }
                eprintln!("simulated {} seeds in {:.1} s; --plot draws the first seed", seeds.len(), started.elapsed().as_secs_f64());
                let first = multi.per_seed.into_iter().next().expect("at least one seed");
                plot_bursty(args, &first)?;
                return Ok(());
            }
        };
        let (slowest_requests, slowest_s) = report.slowest_run;
        eprintln!(
            "simulated {} requests in {:.1} s; the slowest run, {} requests, took {:.2} s",
            report.requests_simulated,
            started.elapsed().as_secs_f64(),
            slowest_requests,
            slowest_s
        );
        plot_bursty(args, &report)?;
        if let Some(path) = &args.json {
            write_json(path, &report)?;
        }
        return Ok(());
    }
    if let Some(experiment) = crate::eval::autoscale::Experiment::from_name(&args.scenario) {
        let policies = args.policies.as_deref();
        return evaluate(args, 1, |seed| crate::eval::autoscale::run(experiment, policies, seed), crate::eval::autoscale::render);
    }
    let scenario = load_scenario(&args.scenario, &EVALUATIONS)?;
    let policies = args.policies.clone().unwrap_or_else(|| scenario.policies.clone());
    if policies.is_empty() {
        return Err(Error::Scenario("--policies needs at least one policy".into()));
    }
    if let Some(bound) = args.director_queue
        && !(bound.is_finite() && bound > 0.0)
    {
        return Err(Error::Scenario(format!("--director-queue must be positive, got {bound}")));
    }
    let options = eval::EvalOptions {
        explain: args.explain,
        elastic: (args.elastic == "on").then(slogate_core::route::elastic::ElasticOptions::default),
        director_queue_per_16_rpu: args.director_queue,
        iconq: args.model.as_deref().map(crate::model::load).transpose()?,
        cold: args.cold,
    };
    evaluate(args, scenario.seed, |seed| eval::run_with(&scenario, &policies, seed, &options), eval::render_table)
}

/// The seeds an evaluation runs.
enum Seeds {
    /// `--seed N`, or `--explain` without `--seeds`: one report in full.
    One(u64),
    /// `--seeds`, or the default five: the aggregate.
    Many(Vec<u64>),
}

/// What `--seed` and `--seeds` ask for; `default_first` is the scenario's
/// own seed.
fn seeds_of(args: &EvalArgs, default_first: u64) -> Result<Seeds> {
    match (&args.seeds, args.seed) {
        (Some(_), Some(_)) => unreachable!("clap refuses --seed with --seeds"),
        (None, Some(seed)) => Ok(Seeds::One(seed)),
        (Some(text), None) => {
            let seeds = seeds::parse_seeds(text)?;
            if args.explain > 0 && seeds.len() > 1 {
                return Err(Error::Scenario("--explain prints one seed's decisions: give it --seed N, not several --seeds".into()));
            }
            Ok(if seeds.len() == 1 { Seeds::One(seeds[0]) } else { Seeds::Many(seeds) })
        }
        (None, None) if args.explain > 0 => Ok(Seeds::One(default_first)),
        (None, None) => Ok(Seeds::Many(seeds::default_seeds(default_first))),
    }
}

/// Runs an evaluation on its seeds: one seed's report in full, or the
/// aggregate over several; prints it and writes the JSON.
fn evaluate<R: seeds::SeedFigures + serde::Serialize>(
    args: &EvalArgs,
    default_first: u64,
    mut run: impl FnMut(u64) -> Result<R>,
    render: impl Fn(&R) -> String,
) -> Result<()> {
    match seeds_of(args, default_first)? {
        Seeds::One(seed) => {
            let report = run(seed)?;
            emit(args, &render(&report), &report)
        }
        Seeds::Many(seeds) => {
            let name = args.scenario.rsplit('/').next().unwrap_or(&args.scenario);
            let report = seeds::run_seeds(name, &seeds, &mut run)?;
            emit(args, &seeds::render(&report), &report)
        }
    }
}

/// `--plot`: the spike variant's p99 over time per service, as SVG.
fn plot_bursty(args: &EvalArgs, report: &crate::eval::bursty::BurstyReport) -> Result<()> {
    let Some(dir) = &args.plot else { return Ok(()) };
    std::fs::create_dir_all(dir).map_err(|source| Error::Output { path: dir.display().to_string(), source })?;
    for service in slogate_loadgen::service::spandana_services() {
        if let Some(svg) = crate::eval::bursty::render_p99_svg(report, &service.name, "spike") {
            let path = dir.join(format!("bursty-{}-spike-p99.svg", service.name));
            std::fs::write(&path, svg).map_err(|source| Error::Output { path: path.display().to_string(), source })?;
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(())
}

/// Prints a report's table, and writes the report as JSON if `--json`.
fn emit(args: &EvalArgs, table: &str, report: &impl serde::Serialize) -> Result<()> {
    print(table);
    match &args.json {
        Some(path) => write_json(path, report),
        None => Ok(()),
    }
}

fn run_tune(args: &TuneArgs) -> Result<()> {
    let text = match &args.config {
        Some(path) => std::fs::read_to_string(path).map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?,
        None => String::new(),
    };
    let config = crate::config::NodeConfig::load(&text, &crate::config::Environment, &crate::config::Overrides::default())?;
    let day = match &args.day {
        None => None,
        Some(text) => {
            let parts: Vec<&str> = text.split('-').collect();
            let parsed = match parts.as_slice() {
                [y, m, d] => match (y.parse(), m.parse(), d.parse()) {
                    (Ok(y), Ok(m), Ok(d)) => slogate_core::reservoir::CalendarHour::day_of(y, m, d),
                    _ => None,
                },
                _ => None,
            };
            Some(parsed.ok_or_else(|| Error::Config(format!("--day must be a date like 2026-12-02, got `{text}`")))?)
        }
    };
    let positive = |v: f64| v.is_finite() && v > 0.0;
    if !positive(args.kappa) || !positive(args.default_slo_s) {
        return Err(Error::Config("--kappa and --default-slo-s must be positive".into()));
    }
    let source = match (&args.reservoir, &args.trace) {
        (Some(dir), _) => crate::tune::Source::Reservoir(dir.clone()),
        (None, Some(path)) => crate::tune::Source::Trace(path.clone()),
        (None, None) => unreachable!("clap requires one of --reservoir and --trace"),
    };
    let request = crate::tune::TuneRequest {
        source,
        config,
        pool: args.pool.clone(),
        day,
        history_days: args.history_days,
        kappa: args.kappa,
        default_slo_s: args.default_slo_s,
        seed: args.seed,
    };
    let started = std::time::Instant::now();
    let crate::tune::Tuned { fragment, report, notes } = crate::tune::run(&request, &mut |phase| {
        let step = match phase {
            slogate_core::tune::TuningPhase::Forecasting => "[1/3] forecasting the target day",
            slogate_core::tune::TuningPhase::Scheduling => "[2/3] scheduling spinups (Algorithm 4)",
            slogate_core::tune::TuningPhase::Configuring => "[3/3] tuning the autoscaler's knobs",
            slogate_core::tune::TuningPhase::Done => "done",
        };
        eprintln!("{step} ({:.1} s)", started.elapsed().as_secs_f64());
    })?;
    for note in &notes {
        eprintln!("note: {note}");
    }
    eprintln!("{} simulations in {:.1} s", report.simulations, started.elapsed().as_secs_f64());
    match &args.out {
        Some(path) => std::fs::write(path, &fragment).map_err(|source| Error::Output { path: path.display().to_string(), source })?,
        None => print(&fragment),
    }
    Ok(())
}

fn run_serve(args: &ServeArgs) -> Result<()> {
    if args.print_default_config {
        print(crate::config::NodeConfig::EXAMPLE_TOML);
        return Ok(());
    }
    let text = match &args.config {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?,
        None => String::new(),
    };
    let overrides = crate::config::Overrides {
        grpc_addr: args.grpc_addr.clone(),
        admin_addr: args.admin_addr.clone(),
        data_dir: args.data_dir.clone(),
        warm_from: args.warm_from.clone(),
        repair: args.repair,
    };
    let config = crate::config::NodeConfig::load(&text, &crate::config::Environment, &overrides)?;
    init_logging();
    actix_rt::System::new().block_on(async move {
        let signals = ShutdownSignals::install()?;
        let node = crate::node::start(config).await?;
        tracing::info!(message = "Listening.", grpc_addr = %node.grpc_addr, admin_addr = %node.admin_addr);
        signals.wait().await;
        tracing::info!(message = "Shutting down; draining in-flight queries.");
        let in_flight_left = node.shutdown().await;
        tracing::info!(message = "Stopped.", in_flight_left);
        Ok(())
    })
}

/// Key/value logs on standard error; `RUST_LOG` sets the filter (default
/// `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

fn run_demo(args: &DemoArgs) -> Result<()> {
    let usage = |message: String| Err(Error::Config(format!("demo: {message}")));
    if !(args.kappa.is_finite() && args.kappa > 0.0) {
        return usage(format!("--kappa must be positive, got {}", args.kappa));
    }
    match args.backend.as_str() {
        "emulated" => {
            if !args.policies.is_empty() || args.json.is_some() || args.data.is_some() {
                return usage("--policies, --json and --data go with --backend postgres".into());
            }
            let demo = crate::demo::EmulatedDemo {
                time_compression: args.time_compression.unwrap_or(600.0),
                rate: args.rate.unwrap_or(0.1),
                kappa: args.kappa,
                seed: args.seed,
            };
            print(&crate::demo::emulated(&demo)?);
            Ok(())
        }
        "postgres" => {
            if args.time_compression.is_some() {
                return usage("--time-compression is for the emulated warehouse: real servers run in real time".into());
            }
            let positive = |x: f64| x.is_finite() && x > 0.0;
            if !positive(args.isolated_cap_s) || args.connections == 0 || !positive(args.scale_factor) {
                return usage("--isolated-cap-s, --connections and --scale-factor must be positive".into());
            }
            let policies = if args.policies.is_empty() { vec!["slogate".to_owned()] } else { args.policies.clone() };
            for policy in &policies {
                crate::eval::policy_by_name(policy).map_err(|e| Error::Config(format!("demo: --policies: {e}")))?;
            }
            let demo = crate::demo::PostgresDemo {
                policies,
                rate: args.rate.unwrap_or(2.0),
                kappa: args.kappa,
                seed: args.seed,
                scale_factor: args.scale_factor,
                data_dir: args.data.clone().unwrap_or_else(|| crate::backend::tpcds::default_cache_dir(args.scale_factor)),
                python: args.python.clone(),
                isolated_cap: std::time::Duration::from_secs_f64(args.isolated_cap_s),
                connections: args.connections,
                query_timeout_s: 60.0,
                keep_log: args.keep_log.clone(),
            };
            let report = crate::demo::postgres(&demo)?;
            print(&crate::demo::render_postgres(&report));
            if let Some(path) = &args.json {
                let json = serde_json::to_string_pretty(&report).expect("the report serialises");
                std::fs::write(path, json).map_err(|source| Error::Output { path: path.display().to_string(), source })?;
            }
            Ok(())
        }
        other => usage(format!("--backend `{other}` is not one of emulated, postgres")),
    }
}

/// Waits for SIGINT or SIGTERM.
/// SIGTERM and SIGINT, listened for from before the node announces its
/// addresses: a signal sent the moment it is up stops it cleanly rather
/// than killing it.
struct ShutdownSignals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl ShutdownSignals {
    fn install() -> Result<ShutdownSignals> {
        use tokio::signal::unix::{SignalKind, signal};
        let listen = |kind: SignalKind, name: &str| signal(kind).map_err(|e| Error::Node(format!("cannot listen for {name}: {e}")));
        Ok(ShutdownSignals { terminate: listen(SignalKind::terminate(), "SIGTERM")?, interrupt: listen(SignalKind::interrupt(), "SIGINT")? })
    }

    async fn wait(mut self) {
        tokio::select! {
            _ = self.interrupt.recv() => {}
            _ = self.terminate.recv() => {}
        }
    }
}

/// The evaluations `eval` runs besides the scenarios (named in its
/// unknown-scenario error).
const EVALUATIONS: [&str; 9] =
    ["calibrate", "predictor-real", "predictor-sim", "size-table3", "trigger-table4", "bursty-service", "tuner-table5", "e2e-diurnal", "planner-fidelity"];

/// The evaluations whose workload is the 60-day diurnal one, which `trace`
/// writes too.
const DIURNAL_EVALUATIONS: [&str; 2] = ["tuner-table5", "e2e-diurnal"];

/// A built-in scenario or a scenario file; `also_known` are the other names
/// the calling command takes, for the error.
fn load_scenario(name: &str, also_known: &[&str]) -> Result<Scenario> {
    if let Some(scenario) = Scenario::built_in(name) {
        return Ok(scenario);
    }
    let path = Path::new(name);
    if !path.is_file() {
        let known: Vec<&str> = BUILT_IN.iter().chain(also_known).copied().collect();
        return Err(Error::UnknownScenario { name: name.to_owned(), known: known.join(", ") });
    }
    Scenario::from_path(path)
}

fn run_trace(args: &TraceArgs) -> Result<()> {
    if DIURNAL_EVALUATIONS.contains(&args.scenario.as_str()) {
        return write_diurnal_trace(args);
    }
    let scenario = load_scenario(&args.scenario, &DIURNAL_EVALUATIONS)?;
    let spec = scenario.workloads.get(args.workload).ok_or_else(|| {
        Error::Scenario(format!("--workload {} is out of range: the scenario has {}", args.workload, scenario.workloads.len()))
    })?;
    let kappa = args.kappa.or_else(|| scenario.kappas.first().copied());
    let seed = args.seed.unwrap_or(scenario.seed);
    let entries = spec.generate(&Scenario::templates(), kappa, seed, &scenario.base_dir)?;
    write_trace_out(args, entries)
}

/// `trace tuner-table5` (or `e2e-diurnal`): their 60-day diurnal workload
/// at κ (default the first of theirs) and the seed (default 1), arrivals
/// from the first day's midnight.
fn write_diurnal_trace(args: &TraceArgs) -> Result<()> {
    if args.workload != 0 {
        return Err(Error::Scenario(format!("--workload {} is out of range: `{}` has one workload", args.workload, args.scenario)));
    }
    let kappa = args.kappa.unwrap_or(crate::eval::tuner::KAPPAS[0]);
    let entries = crate::eval::tuner::workload(&Scenario::templates(), kappa, args.seed.unwrap_or(1))?;
    write_trace_out(args, entries)
}

/// Writes `entries` as a trace to `--out` (or standard output), each in
/// the default pool and numbered unless it says otherwise.
fn write_trace_out(args: &TraceArgs, mut entries: Vec<slogate_loadgen::workload::TraceEntry>) -> Result<()> {
    let pool = slogate_core::model::PoolId::default();
    for (index, entry) in entries.iter_mut().enumerate() {
        entry.pool.get_or_insert_with(|| pool.clone());
        entry.query_id.get_or_insert_with(|| index.to_string());
    }
    let text = slogate_loadgen::trace::write_trace(&entries)?;
    match &args.out {
        Some(path) => std::fs::write(path, text).map_err(|source| Error::Output { path: path.display().to_string(), source }),
        None => {
            print(&text);
            Ok(())
        }
    }
}

fn run_calibrate(args: &EvalArgs) -> Result<()> {
    if args.policies.is_some() {
        return Err(Error::Scenario("`calibrate` takes no --policies".into()));
    }
    if args.repetitions == 0 {
        return Err(Error::Scenario("--repetitions must be at least 1".into()));
    }
    let seed = args.seed.unwrap_or(1);
    let config = WorldConfig::default();
    if args.fit {
        // Coordinate search: the short-query lane first (scored by each
        // size's best loss), then every size's profile with the best lane.
        print("short-query lane: (max isolated latency s, slots, total best loss)\n");
        let lanes = calibrate::fit_short_query_lane(&config, seed, args.repetitions);
        for (max_latency_s, slots, loss) in lanes.iter().take(5) {
            print(&format!("  {max_latency_s:>5.1}  {slots:>2}  {loss:>8.3}\n"));
        }
        let mut config = config.clone();
        let (max_latency_s, slots, _) = lanes[0];
        config.short_query_max_latency = slogate_core::time::Duration::from_secs_f64(max_latency_s);
        config.short_query_slots = slots;
        for size in calibrate::SIZES {
            let points = calibrate::fit_size(&config, size, seed, args.repetitions);
            print(&format!("{size} RPU: best candidates (loss, latency_factor, demand_fraction, sharing_exponent, admission_slots, oversubscription_penalty)\n"));
            for p in points.iter().take(5) {
                print(&format!(
                    "  {:>8.3}  {:.2}  {:.2}  {:.2}  {:>3}  {:.2}\n",
                    p.loss, p.profile.latency_factor, p.profile.demand_fraction, p.profile.sharing_exponent, p.profile.admission_slots, p.profile.oversubscription_penalty
                ));
            }
        }
        return Ok(());
    }
    let report = calibrate::run(&config, seed, args.repetitions)?;
    print(&calibrate::render(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(())
}
