//! `slogate demo`: one command that starts a node, replays a workload
//! against it over gRPC, prints the report and stops everything.
//!
//! - [`emulated`]: a node on the embedded emulated warehouse, BaseWorkload
//!   at a time compression (nothing installed).
//! - [`postgres`]: two throwaway PostgreSQL servers with TPC-DS loaded,
//!   each template's isolated latency measured on them, and BaseWorkload
//!   over the templates that finish within a cap, sent as SQL text with
//!   `SLO = κ × isolated latency`, once per routing policy, each from a
//!   fresh node and freshly restarted servers.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;
use slogate_core::model::{Template, TemplateId};
use slogate_core::time::Duration;
use slogate_loadgen::replay::{ReplayConfig, ReplayReport, billed_usd, replay};

use crate::backend::local_postgres::LocalPostgres;
use crate::backend::tpcds::{self, IsolatedRun, TpcdsData};
use crate::config::{Environment, NodeConfig, Overrides};
use crate::eval::Scenario;
use crate::{Error, Result};

/// The emulated demo's settings.
#[derive(Clone, Debug)]
pub struct EmulatedDemo {
    /// Virtual seconds per real second, node and replay alike.
    pub time_compression: f64,
    /// λ, queries per workload second.
    pub rate: f64,
    /// SLO tightness κ.
    pub kappa: f64,
    /// Seed of the workload and the warehouse.
    pub seed: u64,
}

/// Runs the emulated demo and returns its report's text.
///
/// # Errors
///
/// What starting the node or replaying returned.
pub fn emulated(demo: &EmulatedDemo) -> Result<String> {
    let data_dir = std::env::temp_dir().join(format!("slogate-demo-{}", std::process::id()));
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ntime_compression = {}\nseed = {}\n",
        demo.time_compression, demo.seed
    );
    let overrides = Overrides { data_dir: Some(data_dir.clone()), ..Default::default() };
    let config = NodeConfig::load(&text, &Environment, &overrides)?;
    let templates = Scenario::templates();
    let mut entries = slogate_loadgen::workload::base_workload(&templates, demo.rate, demo.seed)?;
    slogate_loadgen::workload::assign_slos(&mut entries, &templates, demo.kappa)?;
    let result = actix_rt::System::new().block_on(async move {
        let node = crate::node::start(config).await?;
        eprintln!("slogate demo: node up, grpc_addr={} admin_addr={}", node.grpc_addr, node.admin_addr);
        eprintln!(
            "slogate demo: replaying BaseWorkload λ={} κ={} ({} queries) at {}× over gRPC",
            demo.rate,
            demo.kappa,
            entries.len(),
            demo.time_compression
        );
        let report = replay(&entries, &replay_config(node.grpc_addr, "default", demo.time_compression, None)).await;
        let billed = billed_usd(node.admin_addr, "default").await;
        node.shutdown().await;
        let report = report?;
        Ok::<_, Error>(format!(
            "queries {}  completed {}  timed out {}\nviolation rate {:.1}%\nlatency s p50 {:.2} p95 {:.2} p99 {:.2}\ncost ${:.3}\n",
            report.submitted,
            report.completed,
            report.timed_out,
            report.violation_rate * 100.0,
            report.latency_ms.p50 / 1e3,
            report.latency_ms.p95 / 1e3,
            report.latency_ms.p99 / 1e3,
            billed.unwrap_or(f64::NAN)
        ))
    });
    std::fs::remove_dir_all(&data_dir).ok();
    result
}

fn replay_config(grpc: std::net::SocketAddr, pool: &str, time_scale: f64, sql: Option<Arc<BTreeMap<u32, String>>>) -> ReplayConfig {
    ReplayConfig {
        target: format!("http://{grpc}"),
        pool: pool.into(),
        time_scale,
        concurrency: 1_024,
        repeat: 1,
        deadline: std::time::Duration::from_secs(3_600),
        progress: true,
        run_id: ReplayConfig::fresh_run_id(),
        sql,
        ca_pem: None,
    }
}

/// The postgres demo's settings.
#[derive(Clone, Debug)]
pub struct PostgresDemo {
    /// Routing policies, each run from a fresh start.
    pub policies: Vec<String>,
    /// λ, queries per second.
    pub rate: f64,
    /// SLO tightness κ.
    pub kappa: f64,
    /// Seed of the workload.
    pub seed: u64,
    /// TPC-DS scale factor.
    pub scale_factor: f64,
    /// Where the generated data is cached.
    pub data_dir: PathBuf,
    /// The Python with `duckdb` and `duckdb-ext-tpcds`.
    pub python: String,
    /// Templates slower than this alone are left out of the workload.
    pub isolated_cap: std::time::Duration,
    /// Connections per server: each cluster's concurrency limit.
    pub connections: usize,
    /// The pool's query timeout.
    pub query_timeout_s: f64,
    /// Where to write every run's execution log, as JSON lines.
    pub keep_log: Option<PathBuf>,
}

/// One policy's run on the testbed.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyRun {
    /// The routing policy.
    pub policy: String,
    /// What the client measured.
    pub replay: ReplayReport,
    /// slogate's billing estimate for the two clusters, dollars.
    pub cost_usd: f64,
}

/// The postgres demo's report (also its JSON).
#[derive(Clone, Debug, Serialize)]
pub struct PostgresReport {
    /// Each server's `server_version`.
    pub server_versions: Vec<String>,
    /// The scale factor.
    pub scale_factor: f64,
    /// Each template's isolated latency on this machine.
    pub isolated: BTreeMap<u32, IsolatedRun>,
    /// Templates in the workload.
    pub templates_used: usize,
    /// Queries in the workload.
    pub queries: usize,
    /// λ, κ and the seed.
    pub rate: f64,
    /// SLO tightness.
    pub kappa: f64,
    /// Workload seed.
    pub seed: u64,
    /// One run per policy.
    pub runs: Vec<PolicyRun>,
}

/// Runs the postgres demo.
///
/// # Errors
///
/// [`Error::Node`] when PostgreSQL or the data generator is missing (the
/// message says what to install), or a server or the node fails.
pub fn postgres(demo: &PostgresDemo) -> Result<PostgresReport> {
    let data = TpcdsData::prepare(&demo.data_dir, demo.scale_factor, &demo.python)?;
    let queries = data.queries()?;
    let scratch = std::env::temp_dir().join(format!("slogate-demo-pg-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| Error::Node(format!("cannot create {}: {e}", scratch.display())))?;
    let result = actix_rt::System::new().block_on(run_postgres(demo, &data, queries, &scratch));
    std::fs::remove_dir_all(&scratch).ok();
    result
}

async fn run_postgres(demo: &PostgresDemo, data: &TpcdsData, queries: BTreeMap<u32, String>, scratch: &std::path::Path) -> Result<PostgresReport> {
    let servers = [LocalPostgres::start(scratch)?, LocalPostgres::start(scratch)?];
    let mut server_versions = Vec::new();
    for server in &servers {
        let client = server.connect("postgres").await?;
        let row = client.query_one("SHOW server_version", &[]).await.map_err(|e| Error::Node(e.to_string()))?;
        server_versions.push(row.get::<_, String>(0));
    }
    eprintln!("slogate demo: PostgreSQL {} on ports {} and {}; loading TPC-DS SF {}", server_versions[0], servers[0].port, servers[1].port, demo.scale_factor);
    let (first, second) = tokio::join!(data.load_into(&servers[0]), data.load_into(&servers[1]));
    first?;
    second?;

    eprintln!("slogate demo: measuring each template alone (capped at {:.0} s)", demo.isolated_cap.as_secs_f64());
    let isolated = tpcds::measure_isolated(&servers[0], &queries, demo.isolated_cap).await?;
    let templates: Vec<Template> = isolated
        .iter()
        .filter_map(|(&id, run)| Some(Template { id: TemplateId(id), baseline_latency: Duration::from_secs_f64(run.latency_s?) }))
        .collect();
    for (id, run) in isolated.iter().filter(|(_, r)| r.latency_s.is_none()) {
        eprintln!("slogate demo: template {id} left out: {}", run.note.as_deref().unwrap_or("no latency"));
    }
    let mut entries = slogate_loadgen::workload::base_workload(&templates, demo.rate, demo.seed)?;
    slogate_loadgen::workload::assign_slos(&mut entries, &templates, demo.kappa)?;
    let sql = Arc::new(queries);

    if let Some(path) = &demo.keep_log {
        std::fs::write(path, "").map_err(|e| Error::Output { path: path.display().to_string(), source: e })?;
    }
    let mut runs = Vec::new();
    for policy in &demo.policies {
        // A fresh start: restarted servers (cold buffers) and a new node
        // with an empty execution log.
        for server in &servers {
            server.kill()?;
            server.start_server()?;
        }
        let node_dir = scratch.join(format!("node-{policy}"));
        let config = NodeConfig::load(&node_config(demo, &servers, policy, &node_dir, &data.dir), &Environment, &Overrides::default())?;
        let node = crate::node::start(config).await?;
        eprintln!("slogate demo: policy {policy}: replaying {} queries (λ={}/s, κ={}) as SQL over gRPC", entries.len(), demo.rate, demo.kappa);
        let report = replay(&entries, &replay_config(node.grpc_addr, "tpcds", 1.0, Some(sql.clone()))).await;
        let cost = billed_usd(node.admin_addr, "tpcds").await;
        node.shutdown().await;
        if let Some(path) = &demo.keep_log {
            append_execution_log(&node_dir, path)?;
        }
        runs.push(PolicyRun { policy: policy.clone(), replay: report?, cost_usd: cost.map_err(Error::from)? });
    }
    Ok(PostgresReport {
        server_versions,
        scale_factor: demo.scale_factor,
        templates_used: templates.len(),
        queries: entries.len(),
        isolated,
        rate: demo.rate,
        kappa: demo.kappa,
        seed: demo.seed,
        runs,
    })
}

/// Appends the execution log of the stopped node in `node_dir` to `path`,
/// one JSON record a line.
fn append_execution_log(node_dir: &std::path::Path, path: &std::path::Path) -> Result<()> {
    use slogate_actors::reservoir::{ReservoirStore, SledStore};
    use std::io::Write as _;
    let store = SledStore::open(&crate::tune::reservoir_folder(node_dir)).map_err(|e| Error::Node(format!("cannot read the node's execution log: {e}")))?;
    let executions = store.recent_executions(usize::MAX).map_err(|e| Error::Node(e.to_string()))?;
    let output = |source| Error::Output { path: path.display().to_string(), source };
    let mut file = std::fs::OpenOptions::new().append(true).open(path).map_err(output)?;
    for record in &executions {
        writeln!(file, "{}", serde_json::to_string(record).expect("records serialise")).map_err(output)?;
    }
    eprintln!("slogate demo: {} executions appended to {}", executions.len(), path.display());
    Ok(())
}

fn node_config(demo: &PostgresDemo, servers: &[LocalPostgres], policy: &str, dir: &std::path::Path, data: &std::path::Path) -> String {
    let mut text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 1.0\nseed = {}\n\
         [[pool]]\nname = \"tpcds\"\nbackend = \"postgres\"\npolicy = \"{policy}\"\n\
         [pool.postgres]\nquery_timeout_s = {}\ncatalog_dir = \"{}\"\n",
        dir.display(),
        demo.seed,
        demo.query_timeout_s,
        data.join("queries").display()
    );
    for server in servers {
        text.push_str(&format!(
            "[[pool.endpoint]]\nhost = \"127.0.0.1\"\nport = {}\ndatabase = \"{}\"\nuser = \"{}\"\nsize_rpu = 16\nconnections = {}\npassword_file = \"{}\"\n",
            server.port,
            tpcds::DATABASE,
            server.user,
            demo.connections,
            server.password_file.display()
        ));
    }
    text
}

/// The report as a table.
pub fn render_postgres(report: &PostgresReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "testbed: 2 PostgreSQL {} servers on loopback, TPC-DS SF {}, {} of 99 templates ({} queries, λ={}/s, κ={}, seed {})",
        report.server_versions.first().map_or("?", String::as_str),
        report.scale_factor,
        report.templates_used,
        report.queries,
        report.rate,
        report.kappa,
        report.seed
    );
    let _ = writeln!(out, "{:<14} {:>6} {:>9} {:>8} {:>8} {:>8} {:>11} {:>16} {:>18}", "policy", "VR", "cost $", "p50 s", "p95 s", "p99 s", "completed", "c0/c1", "Q-error p50/p95");
    for run in &report.runs {
        let r = &run.replay;
        let split = format!("{}/{}", r.targets.get("c0").copied().unwrap_or(0), r.targets.get("c1").copied().unwrap_or(0));
        let q_error = r.q_error.as_ref().map_or_else(|| "-".to_owned(), |q| format!("{:.2}/{:.2}", q.p50, q.p95));
        let _ = writeln!(
            out,
            "{:<14} {:>5.1}% {:>9.4} {:>8.3} {:>8.3} {:>8.3} {:>7}/{:<3} {:>16} {:>18}",
            run.policy,
            r.violation_rate * 100.0,
            run.cost_usd,
            r.latency_ms.p50 / 1e3,
            r.latency_ms.p95 / 1e3,
            r.latency_ms.p99 / 1e3,
            r.completed,
            r.submitted,
            split,
            q_error
        );
    }
    out
}
