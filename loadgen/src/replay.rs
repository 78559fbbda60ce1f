//! The gRPC replayer: sends a workload to a node in real (scaled) time and
//! reports what came back.
//!
//! Each entry is submitted at `arrival / time_scale` after the start (or
//! as fast as possible with `time_scale = 0`), with at most `concurrency`
//! submissions in flight. Every request loop is bounded by the workload's
//! size and by `deadline`.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration as WallDuration;

use serde::Serialize;
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};

use crate::workload::TraceEntry;
use crate::{Error, Result};

/// How to replay.
#[derive(Clone, Debug)]
pub struct ReplayConfig {
    /// The node's gRPC endpoint, e.g. `http://127.0.0.1:50051`.
    pub target: String,
    /// The pool, unless entries name their own.
    pub pool: String,
    /// Workload seconds per real second; 0 sends as fast as possible.
    pub time_scale: f64,
    /// The most submissions in flight.
    pub concurrency: usize,
    /// How many times to send the workload (ids stay unique).
    pub repeat: u32,
    /// Give up waiting after this long.
    pub deadline: WallDuration,
    /// Show progress on standard error.
    pub progress: bool,
    /// Prefixes every query id, so that two runs against one node never
    /// share an id (the node answers a repeated id from its idempotency
    /// table). [`ReplayConfig::fresh_run_id`] makes one.
    pub run_id: String,
    /// SQL text per template: entries whose template has text are sent as
    /// that text (for SQL backends), the rest by template number.
    pub sql: Option<Arc<BTreeMap<u32, String>>>,
    /// The PEM certificate of the CA that signed the node's, for an
    /// `https://` target served over TLS.
    pub ca_pem: Option<Vec<u8>>,
}

impl ReplayConfig {
    /// A run id unlikely to repeat: the wall-clock time in microseconds
    /// and the process id, in base 36, with a trailing `-`.
    pub fn fresh_run_id() -> String {
        let micros = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
        format!("{}{}-", base36(micros), base36(u64::from(std::process::id())))
    }
}

fn base36(mut value: u64) -> String {
    let digits = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = Vec::new();
    loop {
        out.push(digits[(value % 36) as usize]);
        value /= 36;
        if value == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ascii digits")
}

/// Latency percentiles, milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
}

/// What a replay measured.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ReplayReport {
    /// Requests sent.
    pub submitted: u64,
    /// Replies with QUERY_STATUS_COMPLETED.
    pub completed: u64,
    /// Replies with QUERY_STATUS_TIMED_OUT.
    pub timed_out: u64,
    /// Replies with QUERY_STATUS_FAILED.
    pub failed: u64,
    /// gRPC errors by status code name.
    pub errors_by_status: BTreeMap<String, u64>,
    /// Replies that missed their SLO, over requests sent.
    pub violation_rate: f64,
    /// Latency the node reported (the backend's time), ms.
    pub latency_ms: Percentiles,
    /// Wall-clock round trip seen by this client, ms.
    pub round_trip_ms: Percentiles,
    /// Replies per target (`c0`, `c1`, `elastic`).
    pub targets: BTreeMap<String, u64>,
    /// The router's Q-error on completed queries it predicted,
    /// `max(predicted / measured, measured / predicted)`; empty when the
    /// policy made no predictions.
    pub q_error: Option<Percentiles>,
    /// Completed queries the Q-error is over.
    pub q_error_queries: u64,
    /// Wall time of the whole replay, seconds. (The gateway's own added
    /// latency is in the node's `/metrics`.)
    pub elapsed_s: f64,
    /// `submitted / elapsed_s`.
    pub submissions_per_s: f64,
}

fn percentiles(mut values: Vec<f64>) -> Percentiles {
    if values.is_empty() {
        return Percentiles::default();
    }
    values.sort_by(f64::total_cmp);
    let at = |q| slogate_core::stats::percentile(&values, q);
    Percentiles { p50: at(0.5), p95: at(0.95), p99: at(0.99) }
}

/// What one reply said.
struct Reply {
    status: QueryStatus,
    slo_met: bool,
    latency_ms: f64,
    predicted_ms: f64,
    target: String,
}

struct Sample {
    status: std::result::Result<Reply, tonic::Code>,
    round_trip_ms: f64,
}

/// The node's endpoint, with Nagle's algorithm off: a request waiting for
/// the delayed ACK of the one before it stalls for 40 ms.
pub fn endpoint(target: &str) -> Result<tonic::transport::Endpoint> {
    tonic::transport::Endpoint::from_shared(target.to_owned())
        .map(|endpoint| endpoint.tcp_nodelay(true))
        .map_err(|e| Error::InvalidParameter(format!("target `{target}` is not a URI: {e}")))
}

/// Replays `entries` against the node. SLOs must be set.
pub async fn replay(entries: &[TraceEntry], config: &ReplayConfig) -> Result<ReplayReport> {
    if config.concurrency == 0 {
        return Err(Error::InvalidParameter("concurrency must be at least 1".into()));
    }
    if !(config.time_scale.is_finite() && config.time_scale >= 0.0) {
        return Err(Error::InvalidParameter(format!("time scale must be ≥ 0, got {}", config.time_scale)));
    }
    let mut endpoint = endpoint(&config.target)?;
    if let Some(pem) = &config.ca_pem {
        // rustls needs a process-wide provider; one installed already stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
        // The name to check the certificate against is the target's host,
        // an IP address included.
        let host = endpoint.uri().host().unwrap_or_default().trim_matches(['[', ']']).to_owned();
        let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(pem)).domain_name(host);
        endpoint = endpoint.tls_config(tls).map_err(|e| Error::InvalidParameter(format!("cannot use the CA certificate for {}: {e}", config.target)))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| Error::Replay(format!("cannot connect to {}: {e}", config.target)))?;
    let client = GatewayClient::new(channel);
    let total = entries.len() as u64 * u64::from(config.repeat);
    let permits = Arc::new(tokio::sync::Semaphore::new(config.concurrency));
    let done = Arc::new(AtomicU64::new(0));
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<Sample>();
    let started = tokio::time::Instant::now();
    let deadline = started + config.deadline;

    let progress = config.progress.then(|| {
        let done = done.clone();
        tokio::spawn(async move {
            let terminal = std::io::stderr().is_terminal();
            let mut last_decile = 0;
            loop {
                tokio::time::sleep(WallDuration::from_millis(200)).await;
                let finished = done.load(Ordering::Relaxed);
                if terminal {
                    let width = 30;
                    let filled = (finished * width / total.max(1)) as usize;
                    eprint!("\r[{}{}] {finished}/{total}", "=".repeat(filled), " ".repeat(width as usize - filled));
                } else if finished * 10 / total.max(1) > last_decile {
                    last_decile = finished * 10 / total.max(1);
                    eprintln!("replayed {finished}/{total}");
                }
                if finished >= total {
                    if terminal {
                        eprintln!();
                    }
                    break;
                }
            }
        })
    });

    for round in 0..config.repeat {
        for (index, entry) in entries.iter().enumerate() {
            if config.time_scale > 0.0 {
                let offset = entry.arrival.as_secs_f64() / config.time_scale;
                tokio::time::sleep_until(started + WallDuration::from_secs_f64(offset)).await;
            }
            let permit = tokio::select! {
                permit = permits.clone().acquire_owned() => permit.expect("semaphore open"),
                _ = tokio::time::sleep_until(deadline) => return Err(Error::Replay("deadline passed while sending".into())),
            };
            let slo = entry.slo.ok_or_else(|| Error::InvalidParameter(format!("entry {index} has no SLO")))?;
            let request = SubmitRequest {
                pool: entry.pool.as_ref().map_or_else(|| config.pool.clone(), |p| p.to_string()),
                query_id: match &entry.query_id {
                    Some(id) => format!("{}r{round}-{id}", config.run_id),
                    None => format!("{}r{round}-{index}", config.run_id),
                },
                query: Some(match config.sql.as_ref().and_then(|texts| texts.get(&entry.template.0)) {
                    Some(text) => Query::Sql(text.clone()),
                    None => Query::Template(entry.template.0),
                }),
                slo_ms: (slo.as_millis_f64().ceil() as u64).max(1),
                ..SubmitRequest::default()
            };
            let mut client = client.clone();
            let sender = sender.clone();
            let done = done.clone();
            tokio::spawn(async move {
                let sent = std::time::Instant::now();
                let status = match client.submit(request).await {
                    Ok(reply) => {
                        let reply = reply.into_inner();
                        Ok(Reply {
                            status: reply.status(),
                            slo_met: reply.slo_met,
                            latency_ms: reply.latency_ms,
                            predicted_ms: reply.predicted_ms,
                            target: reply.target,
                        })
                    }
                    Err(status) => Err(status.code()),
                };
                let _ = sender.send(Sample { status, round_trip_ms: sent.elapsed().as_secs_f64() * 1e3 });
                done.fetch_add(1, Ordering::Relaxed);
                drop(permit);
            });
        }
    }
    drop(sender);

    let mut report = ReplayReport { submitted: total, ..ReplayReport::default() };
    let mut latencies = Vec::new();
    let mut round_trips = Vec::new();
    let mut violations = 0;
    let mut q_errors = Vec::new();
    loop {
        let sample = tokio::select! {
            sample = receiver.recv() => sample,
            _ = tokio::time::sleep_until(deadline) => return Err(Error::Replay("deadline passed waiting for replies".into())),
        };
        let Some(sample) = sample else { break };
        round_trips.push(sample.round_trip_ms);
        match sample.status {
            Ok(reply) => {
                match reply.status {
                    QueryStatus::Completed => report.completed += 1,
                    QueryStatus::TimedOut => report.timed_out += 1,
                    _ => report.failed += 1,
                }
                if !reply.slo_met {
                    violations += 1;
                }
                if reply.status == QueryStatus::Completed && reply.predicted_ms > 0.0 && reply.latency_ms > 0.0 {
                    q_errors.push((reply.predicted_ms / reply.latency_ms).max(reply.latency_ms / reply.predicted_ms));
                }
                if !reply.target.is_empty() {
                    *report.targets.entry(reply.target).or_default() += 1;
                }
                latencies.push(reply.latency_ms);
            }
            Err(code) => {
                violations += 1;
                *report.errors_by_status.entry(format!("{code:?}")).or_default() += 1;
            }
        }
    }
    // The clock stops at the last reply, not at the progress bar's next
    // 200 ms tick.
    report.elapsed_s = started.elapsed().as_secs_f64();
    if let Some(progress) = progress {
        let _ = progress.await;
    }
    report.submissions_per_s = if report.elapsed_s > 0.0 { total as f64 / report.elapsed_s } else { 0.0 };
    report.violation_rate = if total == 0 { 0.0 } else { violations as f64 / total as f64 };
    report.latency_ms = percentiles(latencies);
    report.round_trip_ms = percentiles(round_trips);
    report.q_error_queries = q_errors.len() as u64;
    report.q_error = (!q_errors.is_empty()).then(|| percentiles(q_errors));
    Ok(report)
}

/// The body of `GET path` from the node's admin API at `admin_addr`
/// (loopback), which must answer 200 within `ADMIN_TIMEOUT`.
pub async fn admin_get(admin_addr: std::net::SocketAddr, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(admin_addr)
            .await
            .map_err(|e| Error::Replay(format!("cannot reach the admin API at {admin_addr}: {e}")))?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {admin_addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.map_err(|e| Error::Replay(e.to_string()))?;
        let mut response = String::new();
        stream.take(ADMIN_REPLY_BYTES_MAX).read_to_string(&mut response).await.map_err(|e| Error::Replay(e.to_string()))?;
        Ok(response)
    };
    let response = tokio::time::timeout(ADMIN_TIMEOUT, exchange)
        .await
        .map_err(|_| Error::Replay(format!("the admin API at {admin_addr} did not answer GET {path} within {ADMIN_TIMEOUT:?}")))??;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(Error::Replay(format!("the admin API answered GET {path} with `{status}`: {body}")));
    }
    Ok(body.to_owned())
}

/// How long [`admin_get`] waits for a whole reply.
const ADMIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The longest admin reply [`admin_get`] reads.
const ADMIN_REPLY_BYTES_MAX: u64 = 64 << 20;

/// Reads `GET /v1/pools/{pool}` from the node's admin API and returns its
/// `total_billed_usd`: the clusters' bill and the elastic tier's.
pub async fn billed_usd(admin_addr: std::net::SocketAddr, pool: &str) -> Result<f64> {
    let body = admin_get(admin_addr, &format!("/v1/pools/{pool}")).await?;
    let json: serde_json::Value = serde_json::from_str(&body).map_err(|e| Error::Replay(format!("admin API reply: {e}")))?;
    json["total_billed_usd"].as_f64().ok_or_else(|| Error::Replay(format!("no total_billed_usd in {body}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_client_turns_nagle_off_and_names_a_bad_target() {
        assert!(endpoint("http://127.0.0.1:50051").unwrap().get_tcp_nodelay());
        let error = endpoint("not a uri").unwrap_err().to_string();
        assert!(error.contains("not a uri"), "{error}");
    }

    /// A one-shot HTTP server on loopback answering `reply`; its address.
    async fn answering(reply: &'static str) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = socket.read(&mut request).await;
            socket.write_all(reply.as_bytes()).await.unwrap();
        });
        address
    }

    #[tokio::test]
    async fn an_admin_reply_gives_its_body_on_200_and_names_any_other_status() {
        let ok = answering("HTTP/1.1 200 OK\r\n\r\n{\"total_billed_usd\": 2.5}").await;
        assert_eq!(admin_get(ok, "/metrics").await.unwrap(), "{\"total_billed_usd\": 2.5}");
        let billed = answering("HTTP/1.1 200 OK\r\n\r\n{\"total_billed_usd\": 2.5}").await;
        assert_eq!(billed_usd(billed, "default").await.unwrap(), 2.5);
        let missing = answering("HTTP/1.1 404 Not Found\r\n\r\n{\"error\": \"no pool `x`\"}").await;
        let error = admin_get(missing, "/v1/pools/x").await.unwrap_err().to_string();
        assert!(error.contains("404 Not Found") && error.contains("no pool `x`"), "{error}");
    }

    #[test]
    fn percentiles_use_nearest_rank() {
        let p = percentiles((1..=100).map(f64::from).collect());
        assert_eq!((p.p50, p.p95, p.p99), (50.0, 95.0, 99.0));
        assert_eq!(percentiles(Vec::new()), Percentiles::default());
    }
}
