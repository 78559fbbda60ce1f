//! The gateway benchmark: a node against the limit of its own stack.
//!
//! [`BareGateway`] implements `slogate.v1.Gateway` and answers every
//! Submit at once, with no routing, no actors and no storage: what tonic
//! 0.14 and this machine can do. The `slogate-bare-gateway` binary serves
//! it. [`bench_gateway`] (`slogate-loadgen bench-gateway`) starts the bare
//! server and then a `slogate serve` per policy, alternately, and drives
//! each with the same client ([`crate::replay`] at `--time-scale 0`), so
//! that a slow spell of this noisy machine falls on every side alike. It
//! reports medians of the runs and each policy's ratio to the bare server,
//! and, on Linux, each server's CPU time per query and the client's
//! (`/proc/PID/stat`): on a machine the client shares, a rate ratio is
//! roughly `(client + bare) / (client + node)` in CPU per query, and the
//! CPU figures move far less from run to run than the rates do.
//!
//! A node's runs also report its routing threads' event-loop lag over the
//! run (issue 16's stall goal): from the node's `/metrics`, read before
//! and after, the share of the lag probes that waited at most 1 ms and
//! the smallest bucket bound that holds the longest wait. Every probe
//! within 1 ms is the goal, which the histogram answers exactly; the
//! node's `_max` gauges would also count its start-up.
//!
//! Both servers are child processes on loopback ports the OS picks; each
//! logs `grpc_addr=HOST:PORT` on standard error when it listens (a node
//! also `admin_addr=HOST:PORT`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde::Serialize;
use slogate_proto::v1::gateway_server::{Gateway, GatewayServer};
use slogate_proto::v1::{QueryStatus, SubmitRequest, SubmitResponse};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::replay::{ReplayConfig, ReplayReport, replay};
use crate::workload::TraceEntry;
use crate::{Error, Result};

/// A Gateway that answers every query at once: completed, on time.
#[derive(Clone, Copy, Debug, Default)]
pub struct BareGateway;

fn answer(request: &SubmitRequest) -> SubmitResponse {
    SubmitResponse { query_id: request.query_id.clone(), status: QueryStatus::Completed as i32, slo_met: true, ..SubmitResponse::default() }
}

#[tonic::async_trait]
impl Gateway for BareGateway {
    async fn submit(&self, request: Request<SubmitRequest>) -> std::result::Result<Response<SubmitResponse>, Status> {
        Ok(Response::new(answer(request.get_ref())))
    }

    type SubmitStreamStream = Pin<Box<dyn Stream<Item = std::result::Result<SubmitResponse, Status>> + Send>>;

    async fn submit_stream(&self, request: Request<Streaming<SubmitRequest>>) -> std::result::Result<Response<Self::SubmitStreamStream>, Status> {
        let replies = request.into_inner().map(|request| request.map(|request| answer(&request)));
        Ok(Response::new(Box::pin(replies)))
    }
}

/// Serves [`BareGateway`] on `listener` until the process ends, with
/// TCP_NODELAY on every connection, as a node's listener has.
pub async fn serve_bare(listener: tokio::net::TcpListener) -> Result<()> {
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(GatewayServer::new(BareGateway))
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| Error::Replay(format!("the bare gateway stopped: {e}")))
}

/// A server under test: a child process, killed when dropped.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) grpc_addr: SocketAddr,
    /// The admin API's address, when the line that named the gRPC
    /// address named it too (a node's does).
    pub(crate) admin_addr: Option<SocketAddr>,
}

impl ServerProcess {
    /// Runs `command` and waits (at most 60 s) for it to log
    /// `grpc_addr=HOST:PORT` on standard error.
    pub(crate) fn start(mut command: Command, what: &str) -> Result<ServerProcess> {
        let mut child = command
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Replay(format!("cannot start {what}: {e}")))?;
        let stderr = child.stderr.take().expect("piped standard error");
        let (sender, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Keeps reading after the address, so the child never blocks
            // on a full pipe.
            for line in BufReader::new(stderr).lines().map_while(std::result::Result::ok) {
                let _ = sender.send(line);
            }
        });
        let mut logged = Vec::new();
        loop {
            let Ok(line) = lines.recv_timeout(Duration::from_secs(60)) else {
                let _ = child.kill();
                return Err(Error::Replay(format!("{what} did not log its address within 60 s; it logged {logged:?}")));
            };
            if let Some(start) = line.find("grpc_addr=") {
                let address = line[start + "grpc_addr=".len()..].split_whitespace().next().unwrap_or_default();
                let grpc_addr = address.parse().map_err(|_| Error::Replay(format!("{what} logged an address that does not parse: {line}")))?;
                let admin_addr = line.find("admin_addr=").and_then(|start| line[start + "admin_addr=".len()..].split_whitespace().next()?.parse().ok());
                return Ok(ServerProcess { child, grpc_addr, admin_addr });
            }
            logged.push(line);
        }
    }
}

/// The node's lag probes so far, every shard's together: the count, and
/// the cumulative count at each bucket bound (seconds, ascending).
#[derive(Clone, Debug, Default, PartialEq)]
struct LagProbes {
    count: u64,
    at_most: Vec<(f64, u64)>,
}

/// The lag series of a Prometheus text (`slogate_event_loop_lag_seconds`,
/// summed over the shards).
fn lag_probes_in(metrics: &str) -> LagProbes {
    const COUNT: &str = "slogate_event_loop_lag_seconds_count{";
    const BUCKET: &str = "slogate_event_loop_lag_seconds_bucket{";
    let mut probes = LagProbes::default();
    let mut by_bound: std::collections::BTreeMap<u64, (f64, u64)> = std::collections::BTreeMap::new();
    for line in metrics.lines() {
        let Some((series, value)) = line.rsplit_once(' ') else { continue };
        let Ok(value) = value.parse::<u64>() else { continue };
        if series.starts_with(COUNT) {
            probes.count += value;
        } else if let Some(labels) = series.strip_prefix(BUCKET) {
            let Some(bound) = labels.split("le=\"").nth(1).and_then(|rest| rest.split('"').next()) else { continue };
            let Ok(bound) = bound.parse::<f64>() else { continue };
            if bound.is_finite() {
                by_bound.entry(bound.to_bits()).or_insert((bound, 0)).1 += value;
            }
        }
    }
    probes.at_most = by_bound.into_values().collect();
    probes.at_most.sort_by(|a, b| a.0.total_cmp(&b.0));
    probes
}

/// A node's lag probes so far, read from its `/metrics`; `None` for a
/// server without an admin API, or when it cannot be read.
async fn node_lag(admin_addr: Option<SocketAddr>) -> Option<LagProbes> {
    let metrics = crate::replay::admin_get(admin_addr?, "/metrics").await.ok()?;
    Some(lag_probes_in(&metrics))
}

/// A run's lag: the probes between two readings, the share of them that
/// waited at most 1 ms, and the smallest bucket bound holding them all
/// (infinite past the last bound).
#[derive(Clone, Copy, Debug, PartialEq)]
struct RunLag {
    probes: u64,
    within_1ms_share: f64,
    longest_at_most_s: f64,
}

fn run_lag(before: &LagProbes, after: &LagProbes) -> Option<RunLag> {
    let probes = after.count.checked_sub(before.count).filter(|&n| n > 0)?;
    let at_most = |bound: f64| {
        let count = |p: &LagProbes| p.at_most.iter().find(|(b, _)| *b == bound).map_or(0, |&(_, c)| c);
        count(after).saturating_sub(count(before))
    };
    let longest_at_most_s = after.at_most.iter().map(|&(bound, _)| bound).find(|&bound| at_most(bound) >= probes).unwrap_or(f64::INFINITY);
    Some(RunLag { probes, within_1ms_share: at_most(1e-3) as f64 / probes as f64, longest_at_most_s })
}

/// A process's CPU time so far (user and system, all its threads), from
/// `/proc/PID/stat`; `None` off Linux or when it cannot be read.
fn cpu_seconds_of(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name, which may hold spaces, start at
    // the state (field 3); utime and stime are fields 14 and 15, in clock
    // ticks of 1/100 s (USER_HZ, fixed at 100 in Linux's user ABI).
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some((ticks(14)? + ticks(15)?) as f64 / 100.0)
}

/// A process's live threads' CPU time so far, seconds, by thread id, with
/// each thread's name.
type ThreadTimes = std::collections::BTreeMap<String, (String, f64)>;

/// Process `pid`'s [`ThreadTimes`] (`/proc/PID/task/TID/stat` and
/// `comm`); empty off Linux.
fn thread_cpu_seconds_of(pid: &str) -> ThreadTimes {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Default::default() };
    tasks
        .filter_map(|task| {
            let tid = task.ok()?.file_name().into_string().ok()?;
            let seconds = cpu_seconds_of(&format!("{pid}/task/{tid}"))?;
            let name = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm")).ok()?.trim().to_owned();
            Some((tid, (name, seconds)))
        })
        .collect()
}

/// What the threads alive at both readings spent between them, µs per
/// query, summed by name with trailing digits dropped (`sled-io-3` is
/// `sled-io`), largest first.
fn per_thread_us_per_query(before: &ThreadTimes, after: &ThreadTimes, queries: u64) -> Vec<(String, f64)> {
    let mut by_name: std::collections::BTreeMap<String, f64> = Default::default();
    for (tid, (name, seconds)) in after {
        let start = before.get(tid).map_or(0.0, |(_, s)| *s);
        let group = name.trim_end_matches(|c: char| c.is_ascii_digit()).trim_end_matches(['-', '_']).to_owned();
        *by_name.entry(group).or_default() += (seconds - start) * 1e6 / queries.max(1) as f64;
    }
    let mut groups: Vec<(String, f64)> = by_name.into_iter().filter(|(_, us)| *us > 0.0).collect();
    groups.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    groups
}

/// CPU time so far: the server's, its threads', and this client's.
struct CpuReading {
    server: Option<f64>,
    server_threads: ThreadTimes,
    client: Option<f64>,
}

impl CpuReading {
    fn now(server: &ServerProcess) -> CpuReading {
        let pid = server.child.id().to_string();
        CpuReading { server: cpu_seconds_of(&pid), server_threads: thread_cpu_seconds_of(&pid), client: cpu_seconds_of("self") }
    }
}

/// `value` in µs to a tenth, or `?` where it could not be read.
fn us_text(value: Option<f64>) -> String {
    value.map_or_else(|| "?".to_owned(), |v| format!("{v:.1}"))
}

/// A lag bucket's bound, seconds, as "≤ 2.5 ms" (or "> 10 s" past the
/// last one).
fn ms_bound_text(bound_s: f64) -> String {
    if bound_s.is_finite() { format!("≤ {} ms", bound_s * 1e3) } else { "> 10 s".to_owned() }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What to compare.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// The `slogate-bare-gateway` binary.
    pub bare_binary: PathBuf,
    /// The `slogate` binary.
    pub node_binary: PathBuf,
    /// The node's routing policies, each a side of the comparison.
    pub policies: Vec<String>,
    /// Client concurrencies, each a table row.
    pub concurrencies: Vec<usize>,
    /// Alternating runs per side and concurrency (the figures are their
    /// medians).
    pub runs: usize,
    /// The workload each run sends `repeat` times, as fast as the server
    /// answers.
    pub workload: Vec<TraceEntry>,
    /// Times each run sends the workload.
    pub repeat: u32,
    /// The node's virtual seconds per real second: at 1e6 a query takes
    /// microseconds on the emulated warehouse, so the node's own path is
    /// what is measured.
    pub time_compression: f64,
    /// The node's clusters, RPU each.
    pub clusters: Vec<u32>,
    /// The node's `grpc_threads`: 0 serves gRPC on its routing thread.
    pub grpc_threads: usize,
    /// Pools on the node (`p0`, `p1`, …), each with `clusters`; the client
    /// splits its concurrency evenly among them, one connection each (the
    /// bare server gets the same client).
    pub pools: usize,
    /// The node's `router_shards` (at most `pools`).
    pub router_shards: usize,
    /// Where the nodes' data directories go.
    pub scratch: PathBuf,
}

/// One side's runs at one concurrency.
#[derive(Clone, Debug, Serialize)]
pub struct SideFigures {
    /// `bare`, or the node's policy.
    pub side: String,
    /// Each run's submissions per second, in run order.
    pub rates_per_s: Vec<f64>,
    /// Each run's client round-trip p99, ms.
    pub round_trip_ms_p99: Vec<f64>,
    /// Replies that were not COMPLETED, all runs.
    pub not_completed: u64,
    /// Median of `rates_per_s`.
    pub rate_per_s_median: f64,
    /// Median of `round_trip_ms_p99`.
    pub round_trip_ms_p99_median: f64,
    /// `rate_per_s_median` over the bare server's.
    pub ratio_to_bare: f64,
    /// `round_trip_ms_p99_median` over the bare server's.
    pub p99_ratio_to_bare: f64,
    /// The server's CPU time per submission (all its threads, user and
    /// system), µs, median over the runs; `None` where `/proc` is not
    /// there to read. Steadier than the rates on a shared machine: it is
    /// what the server spends, not how the scheduler shared the cores.
    pub server_cpu_us_per_query_median: Option<f64>,
    /// The same for this client process, µs per submission.
    pub client_cpu_us_per_query_median: Option<f64>,
    /// A node's lag probes that waited at most 1 ms, as a share of the
    /// run's, median over the runs; `None` for the bare server.
    pub lag_within_1ms_share_median: Option<f64>,
    /// The smallest lag bucket bound, ms, that held every probe of every
    /// run (the worst run's; infinite past the last bound).
    pub lag_longest_at_most_ms: Option<f64>,
}

/// What one run measured.
#[derive(Clone, Debug)]
struct RunFigures {
    report: ReplayReport,
    server_cpu_us_per_query: Option<f64>,
    client_cpu_us_per_query: Option<f64>,
    /// The server's threads, by name (see [`per_thread_us_per_query`]).
    server_threads_us_per_query: Vec<(String, f64)>,
    /// A node's event-loop lag over the run.
    lag: Option<RunLag>,
}

/// One concurrency's row.
#[derive(Clone, Debug, Serialize)]
pub struct ConcurrencyFigures {
    /// Submissions in flight.
    pub concurrency: usize,
    /// The bare server first, then each policy.
    pub sides: Vec<SideFigures>,
}

/// What the benchmark measured.
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    /// Queries per run.
    pub queries_per_run: usize,
    /// Runs per side.
    pub runs: usize,
    /// One row per concurrency.
    pub rows: Vec<ConcurrencyFigures>,
}

pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// The node's configuration for one run.
fn node_config(data_dir: &Path, policy: &str, config: &BenchConfig) -> String {
    let clusters = config.clusters.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let mut text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = {data_dir:?}\ntime_compression = {:?}\ngrpc_threads = {}\nrouter_shards = {}\n",
        config.time_compression, config.grpc_threads, config.router_shards
    );
    for pool in pool_names(config) {
        text.push_str(&format!("[[pool]]\nname = {pool:?}\npolicy = {policy:?}\nclusters = [{clusters}]\n"));
    }
    text
}

/// The node's pools: `default` alone, or `p0`, `p1`, ….
fn pool_names(config: &BenchConfig) -> Vec<String> {
    match config.pools {
        0 | 1 => vec!["default".to_owned()],
        n => (0..n).map(|i| format!("p{i}")).collect(),
    }
}

/// The reports of one run's concurrent replays (one per pool) as one:
/// counts summed, the rate over the longest replay's time, and the worst
/// replay's round-trip percentiles.
pub(crate) fn combined(reports: Vec<ReplayReport>) -> ReplayReport {
    let mut reports = reports.into_iter();
    let mut total = reports.next().expect("at least one pool");
    for report in reports {
        total.submitted += report.submitted;
        total.completed += report.completed;
        total.timed_out += report.timed_out;
        total.failed += report.failed;
        total.elapsed_s = total.elapsed_s.max(report.elapsed_s);
        if report.round_trip_ms.p99 > total.round_trip_ms.p99 {
            total.round_trip_ms = report.round_trip_ms;
        }
    }
    total.submissions_per_s = total.submitted as f64 / total.elapsed_s.max(f64::MIN_POSITIVE);
    total
}

/// One run of `side` at `concurrency`.
async fn run_once(side: &str, concurrency: usize, run: usize, config: &BenchConfig) -> Result<RunFigures> {
    let (server, data_dir) = if side == "bare" {
        let mut command = Command::new(&config.bare_binary);
        command.args(["--listen", "127.0.0.1:0"]);
        (ServerProcess::start(command, "the bare gateway")?, None)
    } else {
        let dir = config.scratch.join(format!("{side}-c{concurrency}-r{run}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Io { path: dir.display().to_string(), source: e })?;
        let path = dir.join("node.toml");
        std::fs::write(&path, node_config(&dir.join("data"), side, config)).map_err(|e| Error::Io { path: path.display().to_string(), source: e })?;
        let mut command = Command::new(&config.node_binary);
        command.arg("serve").arg("--config").arg(&path);
        (ServerProcess::start(command, &format!("slogate serve ({side})"))?, Some(dir))
    };
    let pools = pool_names(config);
    let replays = pools.iter().map(|pool| {
        let replay_config = ReplayConfig {
            target: format!("http://{}", server.grpc_addr),
            pool: pool.clone(),
            time_scale: 0.0,
            concurrency: (concurrency / pools.len()).max(1),
            repeat: config.repeat,
            deadline: Duration::from_secs(600),
            progress: false,
            run_id: ReplayConfig::fresh_run_id(),
            sql: None,
            ca_pem: None,
        };
        async move { replay(&config.workload, &replay_config).await }
    });
    let lag_before = node_lag(server.admin_addr).await;
    let before = CpuReading::now(&server);
    let report = futures_util::future::try_join_all(replays).await.map(combined);
    let after = CpuReading::now(&server);
    let lag_after = node_lag(server.admin_addr).await;
    drop(server);
    if let Some(dir) = data_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    let report = report?;
    let per_query = |before: Option<f64>, after: Option<f64>| Some((after? - before?) * 1e6 / report.submitted.max(1) as f64);
    Ok(RunFigures {
        server_cpu_us_per_query: per_query(before.server, after.server),
        client_cpu_us_per_query: per_query(before.client, after.client),
        server_threads_us_per_query: per_thread_us_per_query(&before.server_threads, &after.server_threads, report.submitted),
        lag: run_lag(&lag_before.unwrap_or_default(), &lag_after.unwrap_or_default()),
        report,
    })
}

/// Runs the comparison; `progress` hears each run as it ends.
pub async fn bench_gateway(config: &BenchConfig, progress: &mut dyn FnMut(&str)) -> Result<BenchReport> {
    if config.runs == 0 || config.concurrencies.is_empty() || config.concurrencies.contains(&0) {
        return Err(Error::InvalidParameter("bench-gateway needs at least one run and concurrencies of at least 1".into()));
    }
    if config.repeat == 0 || config.workload.is_empty() {
        return Err(Error::InvalidParameter("bench-gateway needs a workload sent at least once".into()));
    }
    if config.policies.is_empty() {
        return Err(Error::InvalidParameter("bench-gateway needs at least one policy".into()));
    }
    if config.router_shards == 0 || config.router_shards > config.pools.max(1) {
        return Err(Error::InvalidParameter(format!("--router-shards must be between 1 and --pools ({})", config.pools.max(1))));
    }
    for binary in [&config.bare_binary, &config.node_binary] {
        if !binary.is_file() {
            return Err(Error::InvalidParameter(format!("no binary at {} (build it with `cargo build --release`)", binary.display())));
        }
    }
    let sides: Vec<String> = std::iter::once("bare".to_owned()).chain(config.policies.iter().cloned()).collect();
    let mut rows = Vec::new();
    for &concurrency in &config.concurrencies {
        let mut reports: Vec<Vec<ReplayReport>> = vec![Vec::new(); sides.len()];
        let mut cpu: Vec<(Vec<f64>, Vec<f64>)> = vec![(Vec::new(), Vec::new()); sides.len()];
        let mut lags: Vec<Vec<RunLag>> = vec![Vec::new(); sides.len()];
        for run in 0..config.runs {
            for (i, side) in sides.iter().enumerate() {
                let figures = run_once(side, concurrency, run, config).await?;
                let report = figures.report;
                let threads = figures.server_threads_us_per_query.iter().map(|(name, us)| format!("{name} {us:.1}")).collect::<Vec<_>>().join(", ");
                let lag = figures.lag.map_or_else(String::new, |lag| {
                    format!(", lag: {:.1}% of {} probes within 1 ms, the longest {}", lag.within_1ms_share * 100.0, lag.probes, ms_bound_text(lag.longest_at_most_s))
                });
                progress(&format!(
                    "concurrency {concurrency}, run {}: {side} {:.0}/s, round trip p99 {:.2} ms, CPU per query: server {} µs ({threads}), client {} µs{lag}",
                    run + 1,
                    report.submissions_per_s,
                    report.round_trip_ms.p99,
                    us_text(figures.server_cpu_us_per_query),
                    us_text(figures.client_cpu_us_per_query),
                ));
                lags[i].extend(figures.lag);
                cpu[i].0.extend(figures.server_cpu_us_per_query);
                cpu[i].1.extend(figures.client_cpu_us_per_query);
                reports[i].push(report);
            }
        }
        let figures: Vec<(f64, f64)> = reports
            .iter()
            .map(|runs| {
                let rates: Vec<f64> = runs.iter().map(|r| r.submissions_per_s).collect();
                let p99s: Vec<f64> = runs.iter().map(|r| r.round_trip_ms.p99).collect();
                (median(&rates), median(&p99s))
            })
            .collect();
        let (bare_rate, bare_p99) = figures[0];
        let sides = sides
            .iter()
            .zip(&reports)
            .zip(&figures)
            .zip(&cpu)
            .zip(&lags)
            .map(|((((side, runs), &(rate, p99)), (server_cpu, client_cpu)), lags)| SideFigures {
                side: side.clone(),
                rates_per_s: runs.iter().map(|r| r.submissions_per_s).collect(),
                round_trip_ms_p99: runs.iter().map(|r| r.round_trip_ms.p99).collect(),
                not_completed: runs.iter().map(|r| r.submitted - r.completed).sum(),
                rate_per_s_median: rate,
                round_trip_ms_p99_median: p99,
                ratio_to_bare: rate / bare_rate,
                p99_ratio_to_bare: p99 / bare_p99,
                server_cpu_us_per_query_median: (server_cpu.len() == runs.len()).then(|| median(server_cpu)),
                client_cpu_us_per_query_median: (client_cpu.len() == runs.len()).then(|| median(client_cpu)),
                lag_within_1ms_share_median: (!lags.is_empty()).then(|| median(&lags.iter().map(|l| l.within_1ms_share).collect::<Vec<_>>())),
                lag_longest_at_most_ms: (!lags.is_empty()).then(|| lags.iter().map(|l| l.longest_at_most_s * 1e3).fold(0.0, f64::max)),
            })
            .collect();
        rows.push(ConcurrencyFigures { concurrency, sides });
    }
    Ok(BenchReport { queries_per_run: config.workload.len() * config.repeat as usize, runs: config.runs, rows })
}

impl BenchReport {
    /// The report as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{} queries per run, medians of {} alternating runs\n\n| concurrency | side | submissions/s | ratio | round trip p99 ms | p99 ratio | not completed | server CPU µs/query | client CPU µs/query | lag probes ≤ 1 ms | longest lag |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
            self.queries_per_run, self.runs
        );
        for row in &self.rows {
            for side in &row.sides {
                out.push_str(&format!(
                    "| {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {} | {} | {} | {} | {} |\n",
                    row.concurrency,
                    side.side,
                    side.rate_per_s_median,
                    side.ratio_to_bare,
                    side.round_trip_ms_p99_median,
                    side.p99_ratio_to_bare,
                    side.not_completed,
                    us_text(side.server_cpu_us_per_query_median),
                    us_text(side.client_cpu_us_per_query_median),
                    side.lag_within_1ms_share_median.map_or_else(|| "—".to_owned(), |share| format!("{:.1}%", share * 100.0)),
                    side.lag_longest_at_most_ms.map_or_else(|| "—".to_owned(), |ms| ms_bound_text(ms / 1e3)),
                ));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_s_lag_is_read_from_the_difference_of_two_metrics_readings() {
        let reading = |shard0: [u64; 3], shard1: [u64; 3]| {
            let series = |shard: u32, counts: [u64; 3]| {
                format!(
                    "slogate_event_loop_lag_seconds_bucket{{shard=\"{shard}\",le=\"0.001\"}} {}\nslogate_event_loop_lag_seconds_bucket{{shard=\"{shard}\",le=\"0.0025\"}} {}\nslogate_event_loop_lag_seconds_bucket{{shard=\"{shard}\",le=\"+Inf\"}} {}\nslogate_event_loop_lag_seconds_sum{{shard=\"{shard}\"}} 0.5\nslogate_event_loop_lag_seconds_count{{shard=\"{shard}\"}} {}\n",
                    counts[0], counts[1], counts[2], counts[2]
                )
            };
            lag_probes_in(&format!("# TYPE slogate_event_loop_lag_seconds histogram\n{}{}slogate_event_loop_lag_seconds_max{{shard=\"0\"}} 0.004\nslogate_decision_time_seconds_count{{}} 9\n", series(0, shard0), series(1, shard1)))
        };
        let before = reading([10, 12, 12], [5, 5, 5]);
        assert_eq!(before, LagProbes { count: 17, at_most: vec![(1e-3, 15), (2.5e-3, 17)] });
        // 20 more probes, 18 within 1 ms and the rest within 2.5 ms: the
        // start-up's two slow ones are not the run's.
        let after = reading([25, 29, 29], [8, 8, 8]);
        assert_eq!(run_lag(&before, &after), Some(RunLag { probes: 20, within_1ms_share: 0.9, longest_at_most_s: 2.5e-3 }));
        // One past the last bound.
        let past = reading([25, 29, 30], [8, 8, 8]);
        assert_eq!(run_lag(&before, &past).map(|l| l.longest_at_most_s), Some(f64::INFINITY));
        assert_eq!(run_lag(&before, &before), None, "no probe, no figure");
        assert_eq!(ms_bound_text(2.5e-3), "≤ 2.5 ms");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_bare_gateway_answers_every_submission_completed_and_on_time() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_bare(listener));
        let templates = slogate_world::catalog::tpcds_template_set();
        let mut workload = crate::workload::base_workload(&templates, 0.1, 1).unwrap();
        crate::workload::assign_slos(&mut workload, &templates, 4.0).unwrap();
        let config = ReplayConfig {
            target: format!("http://{address}"),
            pool: "default".into(),
            time_scale: 0.0,
            concurrency: 8,
            repeat: 2,
            deadline: Duration::from_secs(30),
            progress: false,
            run_id: ReplayConfig::fresh_run_id(),
            sql: None,
            ca_pem: None,
        };
        let report = replay(&workload, &config).await.unwrap();
        assert_eq!((report.submitted, report.completed), (594, 594), "{report:?}");
        assert_eq!(report.violation_rate, 0.0);
        server.abort();
    }

    #[test]
    fn a_process_s_cpu_time_is_read_from_proc_and_grows_with_work() {
        if !Path::new("/proc/self/stat").exists() {
            assert_eq!(cpu_seconds_of("self"), None, "no /proc: no figure, rather than a wrong one");
            return;
        }
        let before = cpu_seconds_of("self").expect("this process's own stat parses");
        // Arithmetic until the stat shows a few of its 10 ms ticks more
        // (bounded: ten seconds of wall time).
        let started = std::time::Instant::now();
        let mut x = 1u64;
        let mut after = before;
        while after - before < 0.05 && started.elapsed() < Duration::from_secs(10) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1));
            }
            after = cpu_seconds_of("self").unwrap();
        }
        assert!(after - before >= 0.05, "{before} s then {after} s after ten seconds of busy work");
        assert_eq!(cpu_seconds_of("4294967295"), None, "no such process");
    }

    #[test]
    fn thread_cpu_is_summed_by_name_without_the_number_and_largest_first() {
        let reading = |entries: &[(&str, &str, f64)]| entries.iter().map(|(tid, name, s)| (tid.to_string(), (name.to_string(), *s))).collect();
        let before = reading(&[("1", "slogate", 1.0), ("2", "sled-io-0", 0.5), ("3", "sled-io-1", 0.25)]);
        // Thread 4 started during the run; thread 5 did not run.
        let after = reading(&[("1", "slogate", 2.0), ("2", "sled-io-0", 0.75), ("3", "sled-io-1", 0.5), ("4", "worker", 0.25), ("5", "idle", 0.0)]);
        let groups = per_thread_us_per_query(&before, &after, 1_000_000);
        assert_eq!(groups, vec![("slogate".to_owned(), 1.0), ("sled-io".to_owned(), 0.5), ("worker".to_owned(), 0.25)]);
        if Path::new("/proc/self/task").exists() {
            let threads = thread_cpu_seconds_of("self");
            assert!(!threads.is_empty(), "this process's own threads are listed");
        }
    }

    #[tokio::test]
    async fn a_benchmark_without_its_binaries_says_which_is_missing() {
        let config = BenchConfig {
            bare_binary: PathBuf::from("/nonexistent/slogate-bare-gateway"),
            node_binary: PathBuf::from("/nonexistent/slogate"),
            policies: vec!["slogate".into()],
            concurrencies: vec![32],
            runs: 1,
            workload: vec![TraceEntry { arrival: slogate_core::time::Instant::ZERO, template: slogate_core::model::TemplateId(1), slo: None, pool: None, query_id: None }],
            repeat: 1,
            time_compression: 1e6,
            clusters: vec![16],
            grpc_threads: 0,
            pools: 1,
            router_shards: 1,
            scratch: std::env::temp_dir(),
        };
        let error = bench_gateway(&config, &mut |_| {}).await.unwrap_err();
        assert!(matches!(&error, Error::InvalidParameter(reason) if reason.contains("/nonexistent/slogate-bare-gateway")), "{error}");
    }

    #[test]
    fn replays_of_several_pools_combine_into_one_run_over_the_longest_time() {
        let report = |submitted: u64, elapsed_s: f64, p99: f64| ReplayReport {
            submitted,
            completed: submitted,
            elapsed_s,
            round_trip_ms: crate::replay::Percentiles { p50: 1.0, p95: 2.0, p99 },
            ..ReplayReport::default()
        };
        let total = combined(vec![report(1_000, 2.0, 3.0), report(3_000, 4.0, 5.0)]);
        assert_eq!((total.submitted, total.completed), (4_000, 4_000));
        assert_eq!(total.submissions_per_s, 1_000.0);
        assert_eq!(total.round_trip_ms.p99, 5.0);
    }

    #[test]
    fn a_node_of_several_pools_names_each_and_its_shard_count() {
        let config = BenchConfig {
            bare_binary: PathBuf::new(),
            node_binary: PathBuf::new(),
            policies: vec!["slogate".into()],
            concurrencies: vec![32],
            runs: 1,
            workload: Vec::new(),
            repeat: 1,
            time_compression: 1e6,
            clusters: vec![16, 8],
            grpc_threads: 0,
            pools: 2,
            router_shards: 2,
            scratch: std::env::temp_dir(),
        };
        let text = node_config(Path::new("/tmp/x"), "slogate", &config);
        assert!(text.contains("router_shards = 2\n"), "{text}");
        assert_eq!(text.matches("[[pool]]").count(), 2);
        assert!(text.contains("name = \"p0\"") && text.contains("name = \"p1\"") && text.contains("clusters = [16, 8]"), "{text}");
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    }
}
