//! The fleet benchmark (`slogate-loadgen bench-fleet`): aggregate
//! throughput of 1, 2, … nodes of one deployment, and the latency the
//! forwarding hop adds.
//!
//! Each run starts `n` `slogate serve` processes as one deployment with a
//! static member list (ownership by rendezvous hashing, as on etcd, minus
//! the leases), with as many pools as the largest deployment has nodes, so
//! that rendezvous spreads them. The client splits its concurrency over
//! every (node, pool) pair, so with `n` nodes about `(n − 1)/n` of the
//! queries reach a node that does not own their pool and are forwarded.
//! Node counts alternate run by run, so a slow spell of the machine falls
//! on each alike; the figures are medians.
//!
//! The hop: two nodes; one client at a time sends the same workload
//! straight to a pool's owner, then through the other node, and the round
//! trips' percentiles are compared.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::bench::{ServerProcess, median};
use crate::replay::{Percentiles, ReplayConfig, ReplayReport, replay};
use crate::workload::TraceEntry;
use crate::{Error, Result};

/// What to measure.
#[derive(Clone, Debug)]
pub struct FleetBenchConfig {
    /// The `slogate` binary.
    pub node_binary: PathBuf,
    /// Deployment sizes, each a row.
    pub node_counts: Vec<usize>,
    /// The nodes' routing policy.
    pub policy: String,
    /// Total client concurrency.
    pub concurrency: usize,
    /// Alternating runs per size.
    pub runs: usize,
    /// The workload each (node, pool) client sends `repeat` times.
    pub workload: Vec<TraceEntry>,
    /// Times each client sends it.
    pub repeat: u32,
    /// The nodes' time compression.
    pub time_compression: f64,
    /// Each pool's clusters, RPU.
    pub clusters: Vec<u32>,
    /// Where the nodes' data directories go.
    pub scratch: PathBuf,
}

/// One deployment size's runs.
#[derive(Clone, Debug, Serialize)]
pub struct SizeFigures {
    /// Nodes.
    pub nodes: usize,
    /// Each run's aggregate submissions per second.
    pub rates_per_s: Vec<f64>,
    /// Median of `rates_per_s`.
    pub rate_per_s_median: f64,
    /// Median over runs of the worst client's round-trip p99, ms.
    pub round_trip_ms_p99_median: f64,
    /// `rate_per_s_median` over the one-node figure (when measured).
    pub ratio_to_one_node: Option<f64>,
    /// Replies that were not COMPLETED, all runs.
    pub not_completed: u64,
}

/// The forwarding hop, measured one query at a time.
#[derive(Clone, Debug, Serialize)]
pub struct HopFigures {
    /// Queries per path.
    pub queries: u64,
    /// Round trips straight to the owner, ms.
    pub direct_ms: Percentiles,
    /// Round trips through the other node, ms.
    pub forwarded_ms: Percentiles,
}

/// What the benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct FleetBenchReport {
    /// Queries per run.
    pub queries_per_run: u64,
    /// One row per deployment size.
    pub sizes: Vec<SizeFigures>,
    /// The hop.
    pub hop: HopFigures,
}

/// A deployment of `count` nodes on loopback, killed when dropped.
struct Deployment {
    nodes: Vec<ServerProcess>,
    dir: PathBuf,
}

impl Drop for Deployment {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The pools: one per node of the largest deployment.
fn pool_names(config: &FleetBenchConfig) -> Vec<String> {
    let count = config.node_counts.iter().copied().max().unwrap_or(1).max(1);
    (0..count).map(|i| format!("p{i}")).collect()
}

/// Node `index`'s configuration in a deployment whose members listen on
/// `ports`.
fn node_config(data_dir: &Path, index: usize, ports: &[u16], config: &FleetBenchConfig) -> String {
    let clusters = config.clusters.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let mut text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:{}\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = {data_dir:?}\ntime_compression = {:?}\n",
        ports[index], config.time_compression
    );
    if ports.len() > 1 {
        text.push_str(&format!("[fleet]\nnode_id = \"n{index}\"\n"));
        for (member, port) in ports.iter().enumerate() {
            text.push_str(&format!("[[fleet.member]]\nid = \"n{member}\"\ngrpc_addr = \"127.0.0.1:{port}\"\n"));
        }
    }
    for pool in pool_names(config) {
        text.push_str(&format!("[[pool]]\nname = {pool:?}\npolicy = {:?}\nclusters = [{clusters}]\n", config.policy));
    }
    text
}

/// Free loopback ports, one per node (bound, then released).
fn free_ports(count: usize) -> Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::Replay(format!("no free port: {e}"))))
        .collect::<Result<Vec<_>>>()?;
    listeners.iter().map(|l| l.local_addr().map(|a| a.port()).map_err(|e| Error::Replay(e.to_string()))).collect()
}

fn start(count: usize, tag: &str, config: &FleetBenchConfig) -> Result<Deployment> {
    let dir = config.scratch.join(format!("{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| Error::Io { path: dir.display().to_string(), source: e })?;
    let ports = free_ports(count)?;
    let mut nodes = Vec::new();
    for index in 0..count {
        let path = dir.join(format!("n{index}.toml"));
        let text = node_config(&dir.join(format!("n{index}")), index, &ports, config);
        std::fs::write(&path, text).map_err(|e| Error::Io { path: path.display().to_string(), source: e })?;
        let mut command = Command::new(&config.node_binary);
        command.arg("serve").arg("--config").arg(&path);
        nodes.push(ServerProcess::start(command, &format!("node n{index}"))?);
    }
    Ok(Deployment { nodes, dir })
}

fn replay_config(target: std::net::SocketAddr, pool: &str, concurrency: usize, repeat: u32) -> ReplayConfig {
    ReplayConfig {
        target: format!("http://{target}"),
        pool: pool.to_owned(),
        time_scale: 0.0,
        concurrency,
        repeat,
        deadline: Duration::from_secs(600),
        progress: false,
        run_id: ReplayConfig::fresh_run_id(),
        sql: None,
        ca_pem: None,
    }
}

/// One run of `count` nodes: every (node, pool) pair's client at once.
async fn run_once(count: usize, run: usize, config: &FleetBenchConfig) -> Result<ReplayReport> {
    let deployment = start(count, &format!("n{count}-r{run}"), config)?;
    let pools = pool_names(config);
    let pairs: Vec<(std::net::SocketAddr, &String)> = deployment.nodes.iter().flat_map(|node| pools.iter().map(move |pool| (node.grpc_addr, pool))).collect();
    let each = (config.concurrency / pairs.len()).max(1);
    let replays = pairs.iter().map(|(addr, pool)| {
        let replay_config = replay_config(*addr, pool, each, config.repeat);
        async move { replay(&config.workload, &replay_config).await }
    });
    let report = futures_util::future::try_join_all(replays).await.map(crate::bench::combined);
    drop(deployment);
    report
}

/// The hop: two nodes; the same workload straight to `p0`'s owner, then
/// through the other node, one query at a time.
async fn hop(config: &FleetBenchConfig) -> Result<HopFigures> {
    let two = FleetBenchConfig { node_counts: vec![2], ..config.clone() };
    let deployment = start(2, "hop", &two)?;
    let owner = slogate_core::ownership::owner("p0", ["n0", "n1"]).expect("two members");
    let (owner, other) = if owner == "n0" { (0, 1) } else { (1, 0) };
    let direct = replay(&config.workload, &replay_config(deployment.nodes[owner].grpc_addr, "p0", 1, 1)).await?;
    let forwarded = replay(&config.workload, &replay_config(deployment.nodes[other].grpc_addr, "p0", 1, 1)).await?;
    Ok(HopFigures { queries: direct.submitted, direct_ms: direct.round_trip_ms, forwarded_ms: forwarded.round_trip_ms })
}

/// Runs the benchmark; `progress` hears each run as it ends.
pub async fn bench_fleet(config: &FleetBenchConfig, progress: &mut dyn FnMut(&str)) -> Result<FleetBenchReport> {
    if config.runs == 0 || config.node_counts.is_empty() || config.node_counts.contains(&0) || config.concurrency == 0 {
        return Err(Error::InvalidParameter("bench-fleet needs at least one run, node counts of at least 1 and a concurrency of at least 1".into()));
    }
    if config.repeat == 0 || config.workload.is_empty() {
        return Err(Error::InvalidParameter("bench-fleet needs a workload sent at least once".into()));
    }
    if !config.node_binary.is_file() {
        return Err(Error::InvalidParameter(format!("no binary at {} (build it with `cargo build --release`)", config.node_binary.display())));
    }
    let mut reports: Vec<Vec<ReplayReport>> = vec![Vec::new(); config.node_counts.len()];
    for run in 0..config.runs {
        for (i, &count) in config.node_counts.iter().enumerate() {
            let report = run_once(count, run, config).await?;
            progress(&format!("run {}: {count} node(s) {:.0}/s, worst round trip p99 {:.2} ms", run + 1, report.submissions_per_s, report.round_trip_ms.p99));
            reports[i].push(report);
        }
    }
    let one_node = config.node_counts.iter().position(|&n| n == 1).map(|i| median(&reports[i].iter().map(|r| r.submissions_per_s).collect::<Vec<_>>()));
    let sizes = config
        .node_counts
        .iter()
        .zip(&reports)
        .map(|(&nodes, runs)| {
            let rates: Vec<f64> = runs.iter().map(|r| r.submissions_per_s).collect();
            let rate = median(&rates);
            SizeFigures {
                nodes,
                rate_per_s_median: rate,
                round_trip_ms_p99_median: median(&runs.iter().map(|r| r.round_trip_ms.p99).collect::<Vec<_>>()),
                ratio_to_one_node: one_node.map(|one| rate / one),
                not_completed: runs.iter().map(|r| r.submitted - r.completed).sum(),
                rates_per_s: rates,
            }
        })
        .collect();
    let hop = hop(config).await?;
    progress(&format!("hop: direct p50 {:.3} ms, through another node p50 {:.3} ms", hop.direct_ms.p50, hop.forwarded_ms.p50));
    let queries_per_run = reports.first().and_then(|runs| runs.first()).map_or(0, |r| r.submitted);
    Ok(FleetBenchReport { queries_per_run, sizes, hop })
}

impl FleetBenchReport {
    /// The report as Markdown tables.
    pub fn table(&self) -> String {
        let mut out = String::from("| nodes | submissions/s | ratio to 1 node | worst round trip p99 ms | not completed |\n|---|---|---|---|---|\n");
        for size in &self.sizes {
            let ratio = size.ratio_to_one_node.map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
            out.push_str(&format!(
                "| {} | {:.0} | {ratio} | {:.2} | {} |\n",
                size.nodes, size.rate_per_s_median, size.round_trip_ms_p99_median, size.not_completed
            ));
        }
        out.push_str(&format!(
            "\nforwarding hop ({} queries, one at a time): direct p50 {:.3} ms, p99 {:.3} ms; through another node p50 {:.3} ms, p99 {:.3} ms; added p50 {:.3} ms, p99 {:.3} ms\n",
            self.hop.queries,
            self.hop.direct_ms.p50,
            self.hop.direct_ms.p99,
            self.hop.forwarded_ms.p50,
            self.hop.forwarded_ms.p99,
            self.hop.forwarded_ms.p50 - self.hop.direct_ms.p50,
            self.hop.forwarded_ms.p99 - self.hop.direct_ms.p99,
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> FleetBenchConfig {
        FleetBenchConfig {
            node_binary: PathBuf::from("/nonexistent/slogate"),
            node_counts: vec![1, 2, 3],
            policy: "least-loaded".into(),
            concurrency: 36,
            runs: 1,
            workload: vec![TraceEntry { arrival: slogate_core::time::Instant::ZERO, template: slogate_core::model::TemplateId(1), slo: None, pool: None, query_id: None }],
            repeat: 1,
            time_compression: 1e6,
            clusters: vec![16],
            scratch: std::env::temp_dir(),
        }
    }

    #[test]
    fn every_node_of_a_deployment_lists_every_member_and_one_pool_per_node_of_the_largest() {
        let config = config();
        let ports = [7001, 7002, 7003];
        let text = node_config(Path::new("/tmp/x"), 1, &ports, &config);
        assert!(text.contains("grpc_addr = \"127.0.0.1:7002\"") && text.contains("node_id = \"n1\""), "{text}");
        assert_eq!(text.matches("[[fleet.member]]").count(), 3);
        assert_eq!(text.matches("[[pool]]").count(), 3);
        // One node alone has no [fleet] at all.
        let alone = node_config(Path::new("/tmp/x"), 0, &ports[..1], &config);
        assert!(!alone.contains("[fleet]"), "{alone}");
    }

    #[tokio::test]
    async fn a_benchmark_without_its_binary_or_with_zero_nodes_says_so() {
        let error = bench_fleet(&config(), &mut |_| {}).await.unwrap_err();
        assert!(matches!(&error, Error::InvalidParameter(reason) if reason.contains("/nonexistent/slogate")), "{error}");
        let zero = FleetBenchConfig { node_counts: vec![0, 2], ..config() };
        let error = bench_fleet(&zero, &mut |_| {}).await.unwrap_err();
        assert!(matches!(&error, Error::InvalidParameter(reason) if reason.contains("node counts")), "{error}");
    }
}
