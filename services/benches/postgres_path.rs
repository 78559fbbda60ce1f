//! The real SQL path's cost: `SELECT 1` at 32 concurrent clients, sent
//! straight to two local PostgreSQL servers (16 connections each) and sent
//! through a slogate node with a postgres pool over the same two servers
//! (16 connections each), one after the other on the same machine.
//!
//! It prints each side's throughput and client round-trip percentiles, and
//! slogate's added time: its round trip minus the direct one, at p50 and
//! p99. Run: `cargo bench -p slogate --bench postgres_path` (needs
//! PostgreSQL installed; `SLOGATE_BENCH_QUERIES` sets queries per side,
//! default 20,000).

use std::time::{Duration, Instant};

use slogate::backend::local_postgres::LocalPostgres;
use slogate::config::{NodeConfig, Overrides};
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};

const CLIENTS: usize = 32;

struct Side {
    elapsed: Duration,
    round_trips_ms: Vec<f64>,
}

impl Side {
    fn percentile(&self, q: f64) -> f64 {
        let index = ((self.round_trips_ms.len() - 1) as f64 * q).round() as usize;
        self.round_trips_ms[index]
    }

    fn print(&self, name: &str) {
        println!(
            "{name:<16} {:>9.0} queries/s   round trip ms p50 {:.3}  p99 {:.3}  ({} queries in {:.2} s)",
            self.round_trips_ms.len() as f64 / self.elapsed.as_secs_f64(),
            self.percentile(0.5),
            self.percentile(0.99),
            self.round_trips_ms.len(),
            self.elapsed.as_secs_f64()
        );
    }
}

async fn direct(servers: &[LocalPostgres], queries: usize) -> Side {
    let mut tasks = Vec::new();
    let started = Instant::now();
    for i in 0..CLIENTS {
        let client = servers[i % servers.len()].connect("postgres").await.unwrap();
        tasks.push(tokio::task::spawn_local(async move {
            let mut round_trips = Vec::with_capacity(queries / CLIENTS);
            for _ in 0..queries / CLIENTS {
                let sent = Instant::now();
                client.simple_query("SELECT 1").await.unwrap();
                round_trips.push(sent.elapsed().as_secs_f64() * 1e3);
            }
            round_trips
        }));
    }
    collect(tasks, started).await
}

async fn through_slogate(grpc: std::net::SocketAddr, queries: usize) -> Side {
    let channel = GatewayClient::connect(format!("http://{grpc}")).await.unwrap();
    let mut tasks = Vec::new();
    let started = Instant::now();
    for c in 0..CLIENTS {
        let mut client = channel.clone();
        tasks.push(tokio::task::spawn_local(async move {
            let mut round_trips = Vec::with_capacity(queries / CLIENTS);
            for i in 0..queries / CLIENTS {
                let request = SubmitRequest {
                    pool: "pg".into(),
                    query_id: format!("{c}-{i}"),
                    query: Some(Query::Sql("SELECT 1".into())),
                    slo_ms: 1_000,
                    ..Default::default()
                };
                let sent = Instant::now();
                let reply = client.submit(request).await.unwrap().into_inner();
                assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
                round_trips.push(sent.elapsed().as_secs_f64() * 1e3);
            }
            round_trips
        }));
    }
    collect(tasks, started).await
}

async fn collect(tasks: Vec<tokio::task::JoinHandle<Vec<f64>>>, started: Instant) -> Side {
    let mut round_trips_ms = Vec::new();
    for task in tasks {
        round_trips_ms.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed();
    round_trips_ms.sort_by(f64::total_cmp);
    Side { elapsed, round_trips_ms }
}

fn main() {
    let queries: usize = std::env::var("SLOGATE_BENCH_QUERIES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("slogate-bench-pg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let servers = [LocalPostgres::start(&dir).unwrap(), LocalPostgres::start(&dir).unwrap()];
    let mut text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 1.0\n\
         [limits]\nidempotency_kept = 1000\n[[pool]]\nname = \"pg\"\nbackend = \"postgres\"\npolicy = \"least-loaded\"\n",
        dir.join("data").display()
    );
    for server in servers.iter() {
        text.push_str(&format!(
            "[[pool.endpoint]]\nhost = \"127.0.0.1\"\nport = {}\ndatabase = \"postgres\"\nuser = \"postgres\"\nsize_rpu = 16\nconnections = 16\npassword_file = \"{}\"\n",
            server.port,
            server.password_file.display()
        ));
    }
    let config = NodeConfig::load(&text, &std::collections::HashMap::new(), &Overrides::default()).unwrap();
    actix_rt::System::new().block_on(async {
        let node = slogate::node::start(config).await.unwrap();
        // Warm both paths (connections, caches) before measuring.
        direct(&servers[..], CLIENTS * 20).await;
        through_slogate(node.grpc_addr, CLIENTS * 20).await;
        let straight = direct(&servers[..], queries).await;
        let gateway = through_slogate(node.grpc_addr, queries).await;
        println!("SELECT 1 at {CLIENTS} concurrent clients, two local PostgreSQL servers, 16 connections each");
        straight.print("direct");
        gateway.print("through slogate");
        println!(
            "slogate adds      p50 {:.3} ms  p99 {:.3} ms per query; throughput ratio {:.2}",
            gateway.percentile(0.5) - straight.percentile(0.5),
            gateway.percentile(0.99) - straight.percentile(0.99),
            (gateway.round_trips_ms.len() as f64 / gateway.elapsed.as_secs_f64())
                / (straight.round_trips_ms.len() as f64 / straight.elapsed.as_secs_f64())
        );
        node.shutdown().await;
    });
    drop(servers);
    let _ = std::fs::remove_dir_all(&dir);
}
