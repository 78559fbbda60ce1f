//! `slogate-loadgen run`: replay a workload against a node over gRPC in
//! real (scaled) time and report violation rate, latency percentiles,
//! errors by status, throughput and cost. `slogate-loadgen bench-gateway`:
//! a node's throughput against a bare gRPC server's, side by side.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};
use slogate_world::catalog::tpcds_template_set;
use slogate_loadgen::replay::{ReplayConfig, billed_usd, replay};
use slogate_loadgen::trace::read_trace;
use slogate_loadgen::workload::{assign_slos, base_workload, phased_workload};

/// Load generator for slogate nodes.
#[derive(Debug, Parser)]
#[command(name = "slogate-loadgen", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a workload against a node.
    Run(RunArgs),
    /// Compare nodes (one per policy) with the bare gRPC server
    /// (`slogate-bare-gateway`), alternately, driven by the same client;
    /// each node run also reports its event-loop lag over the run.
    BenchGateway(BenchArgs),
    /// Aggregate throughput of deployments of 1, 2, … nodes, and the
    /// latency the forwarding hop adds.
    BenchFleet(FleetArgs),
}

#[derive(Debug, clap::Args)]
struct FleetArgs {
    /// Deployment sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 3])]
    nodes: Vec<usize>,
    /// The nodes' policy.
    #[arg(long, default_value = "least-loaded")]
    policy: String,
    /// Total client concurrency, split over every (node, pool) pair.
    #[arg(long, default_value_t = 72)]
    concurrency: usize,
    /// Alternating runs per size; the figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Times each (node, pool) client sends BaseWorkload(0.1) (297 queries).
    #[arg(long, default_value_t = 10)]
    repeat: u32,
    /// The nodes' time compression.
    #[arg(long, default_value_t = 1e6)]
    time_compression: f64,
    /// Each pool's cluster sizes, comma-separated RPU.
    #[arg(long, value_delimiter = ',', default_values_t = [16, 16])]
    clusters: Vec<u32>,
    /// The `slogate` binary (default: next to this one).
    #[arg(long)]
    node_binary: Option<PathBuf>,
    /// Also write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
struct BenchArgs {
    /// Client concurrencies, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [32, 128])]
    concurrency: Vec<usize>,
    /// The node's policies, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = ["least-loaded".to_owned(), "slogate".to_owned()])]
    policies: Vec<String>,
    /// Alternating runs per side; the figures are medians.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Times BaseWorkload(0.1) (297 queries) is sent per run.
    #[arg(long, default_value_t = 100)]
    repeat: u32,
    /// The node's time compression.
    #[arg(long, default_value_t = 1e6)]
    time_compression: f64,
    /// The node's cluster sizes, comma-separated RPU.
    #[arg(long, value_delimiter = ',', default_values_t = [16, 16])]
    clusters: Vec<u32>,
    /// The node's `grpc_threads` (0: gRPC on the routing thread).
    #[arg(long, default_value_t = 0)]
    grpc_threads: usize,
    /// Pools on the node, each with --clusters; the client splits its
    /// concurrency among them, a connection each.
    #[arg(long, default_value_t = 1)]
    pools: usize,
    /// The node's `router_shards` (at most --pools).
    #[arg(long, default_value_t = 1)]
    router_shards: usize,
    /// The `slogate` binary (default: next to this one).
    #[arg(long)]
    node_binary: Option<PathBuf>,
    /// The `slogate-bare-gateway` binary (default: next to this one).
    #[arg(long)]
    bare_binary: Option<PathBuf>,
    /// Also write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum WorkloadKind {
    /// BaseWorkload(λ): 99 TPC-DS templates × 3, Poisson arrivals.
    Base,
    /// A phased mix: 15 queries at λ = 0.05, then 10 at --rate.
    Phased,
    /// A trace file (--file).
    Trace,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The node's gRPC endpoint (`https://` for a node serving TLS, with
    /// `--ca-cert`).
    #[arg(long)]
    target: String,
    /// The PEM certificate of the CA that signed the node's certificate.
    #[arg(long)]
    ca_cert: Option<std::path::PathBuf>,
    /// The workload.
    #[arg(long, value_enum, default_value = "base")]
    workload: WorkloadKind,
    /// Trace file for `--workload trace`.
    #[arg(long)]
    file: Option<PathBuf>,
    /// λ for generated workloads, queries per workload second.
    #[arg(long, default_value_t = 0.1)]
    rate: f64,
    /// SLO tightness for generated workloads.
    #[arg(long, default_value_t = 4.0)]
    kappa: f64,
    /// Seed for generated workloads.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Workload seconds per real second; 0 sends as fast as possible.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// The most submissions in flight.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Send the workload this many times.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// The pool to submit to.
    #[arg(long, default_value = "default")]
    pool: String,
    /// The node's admin address (host:port), to read the cost.
    #[arg(long)]
    admin: Option<std::net::SocketAddr>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 3_600)]
    deadline_s: u64,
    /// Prefix of every query id (default: a fresh one per run, so a second
    /// run is never answered from the node's idempotency table).
    #[arg(long)]
    run_id: Option<String>,
    /// Also write the report as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// mimalloc: the same allocator as the servers it drives.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("tokio runtime");
    let code = match cli.command {
        Command::Run(args) => runtime.block_on(run(args)),
        Command::BenchGateway(args) => runtime.block_on(bench(args)),
        Command::BenchFleet(args) => runtime.block_on(bench_fleet(args)),
    };
    std::process::exit(code);
}

/// `path`, or `name` next to this binary.
fn sibling(path: Option<PathBuf>, name: &str) -> PathBuf {
    path.unwrap_or_else(|| std::env::current_exe().ok().and_then(|exe| exe.parent().map(|dir| dir.join(name))).unwrap_or_else(|| PathBuf::from(name)))
}

async fn bench_fleet(args: FleetArgs) -> i32 {
    let templates = tpcds_template_set();
    let mut workload = base_workload(&templates, 0.1, 1).expect("BaseWorkload(0.1) is valid");
    assign_slos(&mut workload, &templates, 4.0).expect("κ = 4 is valid");
    let config = slogate_loadgen::bench_fleet::FleetBenchConfig {
        node_binary: sibling(args.node_binary, "slogate"),
        node_counts: args.nodes,
        policy: args.policy,
        concurrency: args.concurrency,
        runs: args.runs,
        workload,
        repeat: args.repeat,
        time_compression: args.time_compression,
        clusters: args.clusters,
        scratch: std::env::temp_dir().join("slogate-bench-fleet"),
    };
    let report = slogate_loadgen::bench_fleet::bench_fleet(&config, &mut |line| eprintln!("{line}")).await;
    finish(report.map(|report| (report.table(), serde_json::to_string_pretty(&report).expect("json"))), args.json.as_deref())
}

/// Prints a benchmark's table and writes its JSON to `json`, if asked;
/// the exit code (2 for bad parameters).
fn finish(report: slogate_loadgen::Result<(String, String)>, json: Option<&std::path::Path>) -> i32 {
    let (table, report_json) = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return if matches!(e, slogate_loadgen::Error::InvalidParameter(_)) { 2 } else { 1 };
        }
    };
    print!("{table}");
    if let Some(path) = json
        && let Err(e) = std::fs::write(path, report_json + "\n")
    {
        eprintln!("error: cannot write {}: {e}", path.display());
        return 1;
    }
    0
}

async fn bench(args: BenchArgs) -> i32 {
    let templates = tpcds_template_set();
    let mut workload = base_workload(&templates, 0.1, 1).expect("BaseWorkload(0.1) is valid");
    assign_slos(&mut workload, &templates, 4.0).expect("κ = 4 is valid");
    let config = slogate_loadgen::bench::BenchConfig {
        bare_binary: sibling(args.bare_binary, "slogate-bare-gateway"),
        node_binary: sibling(args.node_binary, "slogate"),
        policies: args.policies,
        concurrencies: args.concurrency,
        runs: args.runs,
        workload,
        repeat: args.repeat,
        time_compression: args.time_compression,
        clusters: args.clusters,
        grpc_threads: args.grpc_threads,
        pools: args.pools,
        router_shards: args.router_shards,
        scratch: std::env::temp_dir().join("slogate-bench-gateway"),
    };
    let report = slogate_loadgen::bench::bench_gateway(&config, &mut |line| eprintln!("{line}")).await;
    finish(report.map(|report| (report.table(), serde_json::to_string_pretty(&report).expect("json"))), args.json.as_deref())
}

async fn run(args: RunArgs) -> i32 {
    let templates = tpcds_template_set();
    let entries = match args.workload {
        WorkloadKind::Base => base_workload(&templates, args.rate, args.seed),
        WorkloadKind::Phased => phased_workload(&templates, 15, args.rate, args.seed),
        WorkloadKind::Trace => match &args.file {
            Some(path) => read_trace(path),
            None => {
                eprintln!("error: --workload trace needs --file PATH");
                return 2;
            }
        },
    };
    let mut entries = match entries {
        Ok(entries) => entries,
        Err(e) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if !matches!(args.workload, WorkloadKind::Trace)
        && let Err(e) = assign_slos(&mut entries, &templates, args.kappa)
    {
        eprintln!("error: {e}");
        return 2;
    }
    let ca_pem = match &args.ca_cert {
        Some(path) => match std::fs::read(path) {
            Ok(pem) => Some(pem),
            Err(e) => {
                eprintln!("error: cannot read --ca-cert {}: {e}", path.display());
                return 2;
            }
        },
        None => None,
    };
    let config = ReplayConfig {
        target: args.target.clone(),
        pool: args.pool.clone(),
        time_scale: args.time_scale,
        concurrency: args.concurrency,
        repeat: args.repeat,
        deadline: std::time::Duration::from_secs(args.deadline_s),
        progress: true,
        run_id: args.run_id.clone().unwrap_or_else(ReplayConfig::fresh_run_id),
        sql: None,
        ca_pem,
    };
    let report = match replay(&entries, &config).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: {e}");
            return if matches!(e, slogate_loadgen::Error::InvalidParameter(_)) { 2 } else { 1 };
        }
    };
    let cost_usd = match args.admin {
        Some(admin) => match billed_usd(admin, &args.pool).await {
            Ok(cost) => Some(cost),
            Err(e) => {
                eprintln!("warning: {e}");
                None
            }
        },
        None => None,
    };
    println!("submitted {}  completed {}  timed out {}  failed {}", report.submitted, report.completed, report.timed_out, report.failed);
    println!("violation rate {:.1}%", report.violation_rate * 100.0);
    println!(
        "latency (node-reported) ms p50 {:.1} p95 {:.1} p99 {:.1}",
        report.latency_ms.p50, report.latency_ms.p95, report.latency_ms.p99
    );
    println!(
        "round trip (wall) ms p50 {:.3} p95 {:.3} p99 {:.3}",
        report.round_trip_ms.p50, report.round_trip_ms.p95, report.round_trip_ms.p99
    );
    println!("throughput {:.0} submissions/s over {:.2} s", report.submissions_per_s, report.elapsed_s);
    for (status, count) in &report.errors_by_status {
        println!("errors {status}: {count}");
    }
    if let Some(cost) = cost_usd {
        println!("cost ${cost:.3}");
    }
    if let Some(path) = &args.json {
        let mut value = serde_json::to_value(&report).expect("report serialises");
        value["cost_usd"] = serde_json::json!(cost_usd);
        if let Err(e) = std::fs::write(path, serde_json::to_string_pretty(&value).expect("json") + "\n") {
            eprintln!("error: cannot write {}: {e}", path.display());
            return 1;
        }
    }
    0
}
