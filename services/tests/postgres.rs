//! A node with a postgres pool over real PostgreSQL servers that each test
//! starts itself (`LocalPostgres`: initdb in a temporary directory, a
//! loopback port), driven over gRPC as clients use it, with the servers'
//! own `pg_stat_activity` as the witness that cancels reach the server.

use std::time::Duration;

use slogate::backend::local_postgres::LocalPostgres;
use slogate::config::{NodeConfig, Overrides};
use slogate::node;
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};

/// A scratch directory for one test, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-pg-{name}-")).tempdir().unwrap()
}

/// A node config with one postgres pool over `servers`, routed by the SLO
/// aware router; `extra` goes into its `[pool.postgres]`.
fn config(dir: &std::path::Path, servers: &[&LocalPostgres], extra: &str, grace_s: u64) -> String {
    config_with_policy(dir, servers, extra, grace_s, "slogate")
}

fn config_with_policy(dir: &std::path::Path, servers: &[&LocalPostgres], extra: &str, grace_s: u64, policy: &str) -> String {
    let mut text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 1.0\n\
         [limits]\nshutdown_grace_s = {grace_s}\n[[pool]]\nname = \"pg\"\nbackend = \"postgres\"\npolicy = \"{policy}\"\n\
         [pool.postgres]\nhealth_check_interval_ms = 200\n{extra}\n",
        dir.join("data").display(),
    );
    for server in servers {
        text.push_str(&format!(
            "[[pool.endpoint]]\nhost = \"127.0.0.1\"\nport = {}\ndatabase = \"postgres\"\nuser = \"postgres\"\nsize_rpu = 16\nconnections = 4\npassword_file = \"{}\"\n",
            server.port,
            server.password_file.display()
        ));
    }
    text
}

fn load(text: &str) -> NodeConfig {
    NodeConfig::load(text, &std::collections::HashMap::new(), &Overrides::default()).unwrap()
}

/// Starts a node with `text` and connects a client to it.
async fn serve(text: &str) -> (node::Node, GatewayClient<tonic::transport::Channel>) {
    let node = node::start(load(text)).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    (node, client)
}

fn sql(id: &str, text: &str, slo_ms: u64) -> SubmitRequest {
    SubmitRequest { pool: "pg".into(), query_id: id.into(), query: Some(Query::Sql(text.into())), slo_ms, ..Default::default() }
}

/// Queries running `pg_sleep` on `server`, other than this check's own.
async fn sleeping(server: &LocalPostgres) -> i64 {
    let client = server.connect("postgres").await.unwrap();
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%pg_sleep%' AND pid <> pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    row.get(0)
}

/// Polls until `server` runs no `pg_sleep`, for at most 5 s; returns how
/// many still run then.
async fn settles_to_no_sleepers(server: &LocalPostgres) -> i64 {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let n = sleeping(server).await;
        if n == 0 || tokio::time::Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (at most 5 s) until `server` runs a `pg_sleep`.
async fn until_sleeping(server: &LocalPostgres) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while sleeping(server).await == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits (at most `limit`) until the pool's cluster `index` shows `state`.
async fn until_cluster_state(admin: std::net::SocketAddr, index: usize, state: &str, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let pool = admin_get(admin, "/v1/pools/pg").await;
        if pool["clusters"][index]["state"] == state {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "c{index} never showed {state}: {pool}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn admin_get(addr: std::net::SocketAddr, path: &str) -> serde_json::Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
}

#[actix_rt::test]
async fn a_query_runs_and_returns_its_rows_within_the_row_limit() {
    let scratch_dir = scratch("rows");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let (node, mut client) = serve(&config(dir, &[&server], "result_rows_max = 5", 5)).await;

    let reply = client.submit(sql("few", "SELECT 42 AS answer, NULL::text AS nothing", 10_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
    let result = reply.result.unwrap();
    assert_eq!(result.columns, ["answer", "nothing"]);
    assert_eq!((result.rows.len(), result.rows[0].values[0].as_str(), result.rows[0].nulls.as_slice()), (1, "42", &[1][..]));
    assert!(!result.truncated && reply.slo_met && reply.target.starts_with('c'));

    let many = client.submit(sql("many", "SELECT g FROM generate_series(1, 100) AS g", 10_000)).await.unwrap().into_inner();
    let result = many.result.unwrap();
    assert_eq!((result.rows.len(), result.rows_total, result.truncated), (5, 100, true));
    assert_eq!(result.rows[4].values, ["5"]);

    // The pool's state shows the server, never its password.
    let actors = admin_get(node.admin_addr, "/v1/actors").await;
    let backend = &actors["backends"]["pg"];
    assert_eq!(backend["kind"], "postgres");
    assert!(backend["detail"]["clusters"][0]["server_version"].as_str().unwrap().starts_with(char::is_numeric), "{backend}");
    assert!(!actors.to_string().contains(&server.password()), "the admin API shows the password");
    node.shutdown().await;
}

#[actix_rt::test]
async fn a_timeout_cancels_the_query_on_the_server() {
    let scratch_dir = scratch("timeout");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let (node, mut client) = serve(&config(dir, &[&server], "query_timeout_s = 0.5", 5)).await;
    let started = std::time::Instant::now();
    let reply = client.submit(sql("slow", "SELECT pg_sleep(30)", 60_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::TimedOut, "{reply:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "the timeout did not end the query: {:?}", started.elapsed());
    assert_eq!(settles_to_no_sleepers(&server).await, 0, "pg_sleep still runs on the server after the timeout");
    node.shutdown().await;
}

#[actix_rt::test]
async fn a_client_that_hangs_up_cancels_its_query_on_the_server() {
    let scratch_dir = scratch("disconnect");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let (node, mut client) = serve(&config(dir, &[&server], "", 5)).await;

    // A gRPC deadline that passes while the query runs.
    let mut request = tonic::Request::new(sql("deadline", "SELECT pg_sleep(30)", 60_000));
    request.set_timeout(Duration::from_millis(500));
    let status = client.submit(request).await.unwrap_err();
    assert!(matches!(status.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled), "{status:?}");
    assert_eq!(settles_to_no_sleepers(&server).await, 0, "pg_sleep still runs after the client's deadline passed");

    // A client that drops its call mid-query.
    let mut dropping = client.clone();
    let call = tokio::spawn(async move { dropping.submit(sql("dropped", "SELECT pg_sleep(30)", 60_000)).await });
    until_sleeping(&server).await;
    call.abort();
    assert_eq!(settles_to_no_sleepers(&server).await, 0, "pg_sleep still runs after the client hung up");
    node.shutdown().await;
}

#[actix_rt::test]
async fn sql_errors_fail_the_query_with_their_sqlstate() {
    let scratch_dir = scratch("sqlstate");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let (node, mut client) = serve(&config(dir, &[&server], "", 5)).await;
    for (id, text, sqlstate) in [("syntax", "SELEC 1", "42601"), ("zero", "SELECT 1 / 0", "22012"), ("missing", "SELECT * FROM no_such_table", "42P01")] {
        let reply = client.submit(sql(id, text, 10_000)).await.unwrap().into_inner();
        assert_eq!((reply.status(), reply.sqlstate.as_str()), (QueryStatus::Failed, sqlstate), "{reply:?}");
        assert!(reply.explanation.contains(sqlstate) && !reply.slo_met, "{reply:?}");
    }
    // The node still serves.
    let reply = client.submit(sql("after", "SELECT 1", 10_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    node.shutdown().await;
}

#[actix_rt::test]
async fn a_server_killed_mid_query_fails_its_queries_and_is_routed_around_until_it_is_back() {
    let scratch_dir = scratch("kill");
    let dir = scratch_dir.path();
    let (first, second) = (LocalPostgres::start(dir).unwrap(), LocalPostgres::start(dir).unwrap());
    // Least-loaded spreads the two long queries, one on each server.
    let (node, client) = serve(&config_with_policy(dir, &[&first, &second], "", 5, "least-loaded")).await;

    let mut calls = Vec::new();
    for i in 0..2 {
        let mut client = client.clone();
        calls.push(tokio::spawn(async move { client.submit(sql(&format!("long{i}"), "SELECT pg_sleep(20)", 60_000)).await }));
    }
    until_sleeping(&first).await;
    first.kill().unwrap();
    let mut failed = Vec::new();
    for call in calls {
        let reply = call.await.unwrap().unwrap().into_inner();
        if reply.status() == QueryStatus::Failed {
            failed.push(reply);
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0].target, "c0");
    assert!(failed[0].explanation.contains("lost"), "{:?}", failed[0]);

    // c0 is unhealthy: every query goes to c1 meanwhile.
    until_cluster_state(node.admin_addr, 0, "unhealthy", Duration::from_secs(5)).await;
    for i in 0..6 {
        let reply = client.clone().submit(sql(&format!("around{i}"), "SELECT 1", 10_000)).await.unwrap().into_inner();
        assert_eq!((reply.status(), reply.target.as_str()), (QueryStatus::Completed, "c1"), "{reply:?}");
    }

    // Back: its health check passes and it takes queries again.
    first.start_server().unwrap();
    until_cluster_state(node.admin_addr, 0, "ready", Duration::from_secs(10)).await;
    let mut targets = std::collections::BTreeSet::new();
    let mut calls = Vec::new();
    for i in 0..4 {
        let mut client = client.clone();
        calls.push(tokio::spawn(async move { client.submit(sql(&format!("back{i}"), "SELECT pg_sleep(0.3)", 10_000)).await }));
    }
    for call in calls {
        let reply = call.await.unwrap().unwrap().into_inner();
        assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
        targets.insert(reply.target);
    }
    assert!(targets.contains("c0"), "no query went back to c0: {targets:?}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn shutdown_past_its_grace_cancels_running_queries_on_the_server() {
    let scratch_dir = scratch("shutdown");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let (node, mut client) = serve(&config(dir, &[&server], "", 0)).await;
    let call = tokio::spawn(async move { client.submit(sql("held", "SELECT pg_sleep(30)", 60_000)).await });
    until_sleeping(&server).await;
    node.shutdown().await;
    let reply = call.await.unwrap().unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Failed, "{reply:?}");
    assert_eq!(settles_to_no_sleepers(&server).await, 0, "pg_sleep still runs after the node shut down");
}

#[actix_rt::test]
async fn a_restarted_node_learns_from_the_real_execution_log() {
    let scratch_dir = scratch("restart");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let text = config(dir, &[&server], "", 5);
    let (node, mut client) = serve(&text).await;
    for i in 0..12 {
        let reply = client.submit(sql(&format!("q{i}"), &format!("SELECT pg_sleep(0.0{})", i % 5), 10_000)).await.unwrap().into_inner();
        assert_eq!(reply.status(), QueryStatus::Completed);
    }
    node.shutdown().await;

    let node = node::start(load(&text)).await.unwrap();
    let actors = admin_get(node.admin_addr, "/v1/actors").await;
    let executions = actors["reservoir"]["executions"].as_u64().unwrap();
    assert_eq!(executions, 12, "{}", actors["reservoir"]);
    // The warmed-up router predicts this shape from the log's latencies.
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let reply = client.submit(sql("again", "SELECT pg_sleep(0.04)", 10_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    assert!(reply.predicted_ms > 0.0, "{reply:?}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn start_up_fails_naming_the_cluster_for_a_bad_endpoint() {
    let scratch_dir = scratch("startup");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let good = config(dir, &[&server], "connect_timeout_ms = 2000", 5);
    // Nothing listens on the port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let unreachable = good.replace(&format!("port = {}", server.port), &format!("port = {closed}"));
    let wrong_password = dir.join("wrong");
    std::fs::write(&wrong_password, "not-the-password").unwrap();
    let bad_credentials = good.replace(&server.password_file.display().to_string(), &wrong_password.display().to_string());
    let missing_database = good.replace("database = \"postgres\"", "database = \"no_such_db\"");
    for (text, expected) in [(unreachable, "connect"), (bad_credentials, "28P01"), (missing_database, "3D000")] {
        let error = match node::start(load(&text)).await {
            Ok(_) => panic!("the node started with a bad endpoint"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains("pool `pg` cluster c0"), "{error}");
        assert!(error.contains(expected), "{error}");
        assert!(!error.contains(&server.password()));
    }
}

#[actix_rt::test]
async fn tls_connections_are_encrypted_and_an_untrusted_certificate_fails_start_up() {
    let scratch_dir = scratch("tls");
    let dir = scratch_dir.path();
    let secured = LocalPostgres::start_with_tls(dir).unwrap();
    let plain = LocalPostgres::start(dir).unwrap();
    let ca_file = secured.ca_file.clone().unwrap();
    let with_tls = |server: &LocalPostgres, tls: &str| {
        config(dir, &[server], "", 5).replace("size_rpu = 16", &format!("{tls}\nsize_rpu = 16"))
    };

    for tls in [format!("tls = \"verify-full\"\nca_file = \"{}\"", ca_file.display()), "tls = \"require\"".to_owned()] {
        let (node, mut client) = serve(&with_tls(&secured, &tls)).await;
        let reply = client.submit(sql("secure", "SELECT 1", 10_000)).await.unwrap().into_inner();
        assert_eq!(reply.status(), QueryStatus::Completed, "{tls}: {reply:?}");
        // The server's own view: every slogate connection is encrypted.
        let check = secured.connect("postgres").await.unwrap();
        let row = check
            .query_one(
                "SELECT count(*), bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = 'slogate'",
                &[],
            )
            .await
            .unwrap();
        let (connections, all_encrypted): (i64, Option<bool>) = (row.get(0), row.get(1));
        assert!(connections > 0 && all_encrypted == Some(true), "{tls}: {connections} slogate connections, all encrypted: {all_encrypted:?}");
        node.shutdown().await;
    }

    // The bundled roots do not trust the throwaway CA; a plain server
    // cannot do TLS. Both stop start-up, naming the cluster.
    for (text, expected) in [(with_tls(&secured, "tls = \"verify-full\""), "certificate"), (with_tls(&plain, "tls = \"require\""), "TLS")] {
        let error = match node::start(load(&text)).await {
            Ok(_) => panic!("the node started: {text}"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains("pool `pg` cluster c0") && error.contains(expected), "{error}");
    }
}
