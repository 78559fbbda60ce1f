//! A node with a Redshift Serverless pool, end to end: `slogate serve`
//! creates workgroups through the AWS SDK against the Serverless stand-in
//! (`slogate_integration::serverless_stand_in`), whose workgroups all
//! serve at a local PostgreSQL server the test starts. The autoscaler's
//! spinups become workgroups, the router uses each once its endpoint passes
//! the health check, idleness deletes it, and a node killed between a
//! create call and noting its answer leaks nothing when it restarts.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use slogate::backend::local_postgres::LocalPostgres;
use slogate_integration::serverless_stand_in::{ACCESS_KEY, Behaviour, ServerlessStandIn};
use slogate_integration::{NodeProcess, http, json};
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};

const TOKEN: &str = "cloud-t0ken";

/// A scratch directory for one test, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-it-cloud-{name}-")).tempdir().unwrap()
}

/// A node config with one Serverless pool `sls` of one 8-RPU cluster, and
/// `fleet` (a `[fleet]` section, or nothing).
fn write_config(dir: &Path, stand_in: &ServerlessStandIn, server: &LocalPostgres, autoscale: &str, ready_timeout_s: u64, fleet: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("node.toml");
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{data}\"\ntime_compression = 1.0\nadmin_token = \"{TOKEN}\"\n\
         {fleet}[[pool]]\nname = \"sls\"\nbackend = \"postgres\"\npolicy = \"slogate\"\nclusters = [8]\n\
         {autoscale}\
         [pool.provider]\nkind = \"redshift-serverless\"\nendpoint_url = \"{url}\"\nnamespace = \"analytics\"\nmaster_password_env = \"SLOGATE_TEST_ADMIN_PASSWORD\"\npoll_interval_ms = 100\nready_timeout_s = {ready_timeout_s}\nattempts_max = 3\n\
         [pool.provider.connect]\ndatabase = \"postgres\"\nuser = \"postgres\"\nconnections = 1\npassword_file = \"{password}\"\n\
         setup_sql = [\"CREATE TABLE IF NOT EXISTS attached (at timestamptz DEFAULT now())\", \"INSERT INTO attached DEFAULT VALUES\"]\n",
        data = dir.join("data").display(),
        url = stand_in.url(),
        password = server.password_file.display(),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The standard AWS chain's environment variables, set to the stand-in's
/// test key; no profile or instance metadata is read.
const AWS_ENV: [(&str, &str); 6] = [
    ("SLOGATE_TEST_ADMIN_PASSWORD", "Passw0rd-test"),
    ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
    ("AWS_SECRET_ACCESS_KEY", "stand-in-secret"),
    ("AWS_EC2_METADATA_DISABLED", "true"),
    ("AWS_CONFIG_FILE", "/nonexistent/slogate-test-aws-config"),
    ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/slogate-test-aws-credentials"),
];

/// The pool's clusters in the admin API: (id, state).
fn clusters(admin: SocketAddr) -> Vec<(String, String)> {
    let (status, body) = http(admin, "GET", "/v1/pools/sls", Some(TOKEN), "");
    assert_eq!(status, 200, "{body}");
    json(&body)["clusters"]
        .as_array()
        .unwrap_or_else(|| panic!("clusters in {body}"))
        .iter()
        .map(|c| {
            let id = c["id"].as_u64().map_or_else(|| c["id"].to_string(), |n| format!("c{n}"));
            (id, c["state"].as_str().unwrap_or_default().to_owned())
        })
        .collect()
}

/// Polls `check` every 100 ms for at most `limit`.
fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "{what} did not happen within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A test's scratch directory, its PostgreSQL server, a Serverless
/// stand-in whose workgroups all serve at that server, and a node config
/// for them.
struct Bench {
    /// Alive as long as the bench.
    _server: LocalPostgres,
    stand_in: ServerlessStandIn,
    config: PathBuf,
    /// Removed last, after the server has stopped.
    dir: tempfile::TempDir,
}

impl Bench {
    fn new(name: &str, autoscale: &str, ready_timeout_s: u64) -> Bench {
        let dir = scratch(name);
        let server = LocalPostgres::start(dir.path()).unwrap();
        let stand_in = ServerlessStandIn::start(Behaviour { endpoint: ("127.0.0.1".into(), server.port), ..Behaviour::default() });
        let config = write_config(dir.path(), &stand_in, &server, autoscale, ready_timeout_s, "");
        Bench { _server: server, stand_in, config, dir }
    }

    /// `slogate serve` on the config, with the stand-in's credentials.
    fn start_node(&self) -> NodeProcess {
        NodeProcess::start_with_env(&self.config, &[], &AWS_ENV)
    }
}

/// Spin up on a queue of three; tear down after 3 s idle.
const AUTOSCALE: &str = "[pool.autoscale]\nenabled = true\ntrigger = \"queue\"\nqueue_threshold = 3\nteardown = true\nidle_teardown_s = 3\nmin_lifetime_s = 1\nsizes = [8]\nmax_clusters = 2\nspinup_delay_s = 1\n";

fn sql(id: &str, text: &str, slo_ms: u64) -> SubmitRequest {
    SubmitRequest { pool: "sls".into(), query_id: id.into(), query: Some(Query::Sql(text.into())), slo_ms, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_creates_a_workgroup_that_serves_once_healthy_and_idleness_deletes_it() {
    let bench = Bench::new("burst", AUTOSCALE, 30);
    let (_dir, stand_in) = (bench.dir.path(), &bench.stand_in);
    let node = bench.start_node();
    let admin = node.admin_addr;

    // The initial cluster is a workgroup, ready once its endpoint answers.
    wait_until(Duration::from_secs(30), "c0 ready", || clusters(admin).contains(&("c0".into(), "ready".into())));
    assert_eq!(stand_in.workgroups().len(), 1);

    // A burst of queries queues on c0's one connection: the autoscaler
    // asks for another cluster, which the router uses once it is healthy.
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(150 * i)).await;
                client.submit(sql(&format!("b{i}"), "SELECT pg_sleep(0.5), 1 AS one", 1_000)).await
            })
        })
        .collect();
    let mut targets = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap().expect("accepted").into_inner();
        assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
        targets.push(reply.target);
    }
    assert!(stand_in.calls("CreateWorkgroup") >= 2, "the burst created a workgroup");
    assert!(targets.iter().any(|t| t != "c0"), "a query ran on the new cluster: {targets:?}");
    // Each cluster ran the pool's setup SQL once before its first query
    // (both are the one test server here).
    let mut setup = client.clone();
    let reply = setup.submit(sql("setup", "SELECT count(*) FROM attached", 5_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
    let attached: u32 = reply.result.as_ref().and_then(|r| r.rows.first()).and_then(|row| row.values.first()).and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!(attached >= 2 && attached <= stand_in.calls("CreateWorkgroup"), "one setup per cluster that served, {attached} rows");

    // Idle, the new cluster is torn down: drained, then its workgroup is
    // deleted.
    wait_until(Duration::from_secs(30), "the new workgroup's deletion", || stand_in.calls("DeleteWorkgroup") >= 1);
    wait_until(Duration::from_secs(10), "one workgroup left", || stand_in.workgroups().iter().filter(|w| w.1 != "DELETING").count() == 1);
    // The stand-in counts a call when it receives it; the provider logs
    // the deletion once the answer is back.
    wait_until(Duration::from_secs(10), "the provider's log of the deletion", || {
        http(admin, "GET", "/v1/actors?pool=sls", Some(TOKEN), "").1.contains("\"action\":\"delete\"")
    });

    // The operator sees it all: the provider's log and resources, the
    // decisions, the bill.
    let (status, body) = http(admin, "GET", "/v1/actors?pool=sls", Some(TOKEN), "");
    assert_eq!(status, 200, "{body}");
    let actors = json(&body);
    let text = actors.to_string();
    assert!(text.contains("redshift-serverless"), "the provider's kind: {text}");
    for action in ["spin_up", "ready", "spin_down", "delete"] {
        assert!(text.contains(&format!("\"action\":\"{action}\"")), "the provider logged {action}: {text}");
    }
    let (status, decisions) = http(admin, "GET", "/v1/decisions?kind=scaling", Some(TOKEN), "");
    assert_eq!(status, 200, "{decisions}");
    for kind in ["trigger_fired", "selection", "spin_up", "tear_down"] {
        assert!(decisions.contains(&format!("\"kind\":\"{kind}\"")), "the autoscaler's {kind} decision shows: {decisions}");
    }
    let (_, pool) = http(admin, "GET", "/v1/pools/sls", Some(TOKEN), "");
    let bill = json(&pool)["billed_usd"].as_f64();
    assert!(bill.is_some_and(|b| b > 0.0), "the bill shows: {pool}");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_between_a_create_and_its_record_leaks_nothing_and_duplicates_nothing_after_a_restart() {
    let bench = Bench::new("kill", "", 30);
    let (_dir, stand_in) = (bench.dir.path(), &bench.stand_in);
    let node = bench.start_node();
    let admin = node.admin_addr;
    wait_until(Duration::from_secs(30), "c0 ready", || clusters(admin).contains(&("c0".into(), "ready".into())));

    // An operator adds a cluster; the platform makes the workgroup, and the
    // node dies before it hears back.
    stand_in.hold_creates(1);
    std::thread::spawn(move || {
        if let Ok(mut stream) = std::net::TcpStream::connect(admin) {
            let body = r#"{"size": 16}"#;
            let request = format!(
                "POST /v1/pools/sls/clusters HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(request.as_bytes());
        }
    });
    assert!(stand_in.wait_for_held(Duration::from_secs(20)), "the create reached the platform");
    node.kill();
    stand_in.release_held();
    let creates = stand_in.calls("CreateWorkgroup");
    assert_eq!(stand_in.workgroups().len(), 2, "the platform made the second workgroup");

    // Restarted, the node adopts c0 (its layout wants one 8-RPU cluster),
    // terminates the 16-RPU workgroup nobody noted, and creates nothing.
    let node = bench.start_node();
    let admin = node.admin_addr;
    wait_until(Duration::from_secs(30), "c0 ready again", || clusters(admin).contains(&("c0".into(), "ready".into())));
    wait_until(Duration::from_secs(10), "the unnoted workgroup and its namespace terminated", || {
        stand_in.workgroups().iter().all(|w| w.0 == "slogate-default-sls-c0") && stand_in.namespaces().iter().all(|n| n.0 != "slogate-default-sls-c1")
    });
    let live: Vec<String> = stand_in.workgroups().into_iter().map(|w| w.0).collect();
    assert_eq!(live, ["slogate-default-sls-c0"], "no leak");
    assert_eq!(stand_in.calls("CreateWorkgroup"), creates, "no duplicate: nothing was created after the restart");
    let logged = node.logged_at_start().join("\n");
    assert!(logged.contains("slogate-default-sls-c1"), "the termination is logged: {logged}");

    // And it serves.
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let reply = client.submit(sql("after", "SELECT 6 * 7 AS answer", 5_000)).await.unwrap().into_inner();
    assert_eq!((reply.status(), reply.target.as_str()), (QueryStatus::Completed, "c0"), "{reply:?}");
    drop(node);
}

#[test]
fn a_workgroup_that_never_becomes_available_is_deleted_and_its_abandonment_is_a_decision_with_the_reason() {
    let bench = Bench::new("never", AUTOSCALE, 2);
    let (_dir, stand_in) = (bench.dir.path(), &bench.stand_in);
    stand_in.never_available(1);
    let node = bench.start_node();
    let admin = node.admin_addr;
    wait_until(Duration::from_secs(20), "c0 gone", || clusters(admin).contains(&("c0".into(), "gone".into())));
    assert_eq!(stand_in.calls("DeleteWorkgroup"), 1, "the workgroup was deleted");
    let (status, decisions) = http(admin, "GET", "/v1/decisions?kind=scaling", Some(TOKEN), "");
    assert_eq!(status, 200, "{decisions}");
    let decisions = json(&decisions);
    let abandoned = decisions.as_array().unwrap().iter().find(|d| d["kind"] == "abandoned").unwrap_or_else(|| panic!("no abandoned decision in {decisions}"));
    let reason = abandoned["reason"].as_str().unwrap();
    assert!(reason.contains("slogate-default-sls-c0 did not become available within 2 s") && reason.contains("deleted it"), "{reason}");
    drop(node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_queries_go_through_the_sdk_to_lambda_and_bill_their_duration() {
    let scratch_dir = scratch("lambda");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let moto = slogate_integration::moto::Moto::start();
    moto.lambda_function("offload");
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{data}\"\ntime_compression = 1.0\nadmin_token = \"{TOKEN}\"\n\
             [[pool]]\nname = \"pg\"\nbackend = \"postgres\"\npolicy = \"spandana\"\n\
             [pool.elastic]\nenabled = true\ntier = \"lambda\"\nlambda_function = \"offload\"\ndirector_queue_per_16_rpu = 0.5\nconcurrency_limit = 4\n\
             [pool.provider]\nendpoint_url = \"{url}\"\n\
             [[pool.endpoint]]\nhost = \"127.0.0.1\"\nport = {port}\ndatabase = \"postgres\"\nuser = \"postgres\"\nsize_rpu = 16\nconnections = 1\npassword_file = \"{password}\"\n",
            data = dir.join("data").display(),
            url = moto.url(),
            port = server.port,
            password = server.password_file.display(),
        ),
    )
    .unwrap();
    let env = [("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"), AWS_ENV[3], AWS_ENV[4], AWS_ENV[5]];
    let node = NodeProcess::start_with_env(&config, &[], &env);
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move {
                let request = SubmitRequest { pool: "pg".into(), ..sql(&format!("l{i}"), "SELECT pg_sleep(0.3), 1 AS one", 5_000) };
                client.submit(request).await
            })
        })
        .collect();
    let mut targets = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap().expect("accepted").into_inner();
        assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
        targets.push(reply.target);
    }
    let offloaded = targets.iter().filter(|t| *t == "elastic").count();
    assert!(offloaded >= 1 && targets.contains(&"c0".to_owned()), "both the cluster and the tier ran queries: {targets:?}");
    let (status, pool) = http(node.admin_addr, "GET", "/v1/pools/pg", Some(TOKEN), "");
    assert_eq!(status, 200, "{pool}");
    let pool = json(&pool);
    assert!(pool["elastic_billed_usd"].as_f64().is_some_and(|b| b > 0.0), "{pool}");
    let elastic = &pool["backend"]["detail"]["elastic"];
    assert_eq!(elastic["kind"], "lambda", "{pool}");
    assert_eq!(elastic["detail"]["tally"]["invocations"].as_u64(), Some(offloaded as u64), "{pool}");
    drop(node);
}

#[test]
fn a_missing_namespace_is_a_start_up_error_naming_the_pool() {
    let scratch_dir = scratch("namespace");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let stand_in = ServerlessStandIn::start(Behaviour { namespaces: vec!["other".into()], ..Behaviour::default() });
    let config = write_config(dir, &stand_in, &server, "", 30, "");
    let output = std::process::Command::new(slogate_integration::slogate_binary())
        .args(["serve", "--config"])
        .arg(&config)
        .envs(AWS_ENV)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("pool `sls`") && stderr.contains("namespace `analytics`") && stderr.contains("ResourceNotFoundException"), "{stderr}");
}

/// The pools `admin`'s node owns, from `/v1/fleet`.
fn owns_sls(admin: SocketAddr) -> bool {
    let (status, body) = http(admin, "GET", "/v1/fleet", Some(TOKEN), "");
    status == 200 && json(&body)["owned"].as_array().is_some_and(|owned| owned.iter().any(|p| p == "sls"))
}

/// The provider's lifecycle actions for `sls`, as its owner shows them
/// (newest first).
fn provider_actions(admin: SocketAddr) -> Vec<String> {
    let (status, body) = http(admin, "GET", "/v1/actors?pool=sls", Some(TOKEN), "");
    assert_eq!(status, 200, "{body}");
    let actors = json(&body);
    let recent = actors["provider"]["recent"].as_array().unwrap_or_else(|| panic!("the provider's log in {body}"));
    recent.iter().map(|r| r["action"].as_str().unwrap_or_default().to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_fleet_only_the_owner_manages_a_cloud_pool_and_each_next_owner_adopts_its_workgroup_without_creating_one() {
    let scratch_dir = scratch("fleet");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let stand_in = ServerlessStandIn::start(Behaviour { endpoint: ("127.0.0.1".into(), server.port), ..Behaviour::default() });
    let etcd = slogate_integration::EtcdProcess::start(&dir.join("etcd"));
    // `joiner` is first in rendezvous order for `sls`: when it joins, the
    // first node hands the pool over to it.
    let joiner = slogate_core::ownership::owner("sls", ["na", "nb"]).unwrap();
    let first = if joiner == "na" { "nb" } else { "na" };
    let fleet = |id: &str| {
        format!(
            "[fleet]\nnode_id = \"{id}\"\ndeployment = \"it\"\netcd_endpoints = [\"{}\"]\nlease_ttl_s = 2\npoll_interval_ms = 100\nfailover_wait_s = 20\ndrain_max_s = 3\n",
            etcd.client_url
        )
    };
    let config = |id: &str| write_config(&dir.join(id), &stand_in, &server, "", 30, &fleet(id));
    let ask = |grpc: SocketAddr, id: &'static str| async move {
        let mut client = GatewayClient::connect(format!("http://{grpc}")).await.unwrap();
        client.submit(sql(id, "SELECT 6 * 7 AS answer", 20_000)).await.expect("accepted").into_inner()
    };

    // Alone, the first node claims the pool and creates its one workgroup.
    let first_node = NodeProcess::start_with_env(&config(first), &[], &AWS_ENV);
    wait_until(Duration::from_secs(30), "the first node's c0 ready", || owns_sls(first_node.admin_addr) && clusters(first_node.admin_addr).contains(&("c0".into(), "ready".into())));
    assert_eq!(stand_in.calls("CreateWorkgroup"), 1);
    let reply = ask(first_node.grpc_addr, "q1").await;
    assert_eq!((reply.status(), reply.target.as_str()), (QueryStatus::Completed, "c0"), "{reply:?}");

    // A node joins and takes the pool over: the first lets its workgroup
    // go untouched, the joiner adopts it, and nobody creates another.
    let joiner_node = NodeProcess::start_with_env(&config(joiner), &[], &AWS_ENV);
    wait_until(Duration::from_secs(30), "the joiner's adopted c0 ready", || owns_sls(joiner_node.admin_addr) && clusters(joiner_node.admin_addr).contains(&("c0".into(), "ready".into())));
    assert!(clusters(first_node.admin_addr).is_empty(), "the first node forgot the pool's clusters: {:?}", clusters(first_node.admin_addr));
    let actions = provider_actions(joiner_node.admin_addr);
    assert!(actions.contains(&"adopt".to_owned()) && !actions.contains(&"spin_up".to_owned()), "{actions:?}");
    // Through either node, the query runs on the adopted workgroup.
    for (grpc, id) in [(first_node.grpc_addr, "q2"), (joiner_node.grpc_addr, "q3")] {
        let reply = ask(grpc, id).await;
        assert_eq!((reply.status(), reply.target.as_str()), (QueryStatus::Completed, "c0"), "{reply:?}");
    }
    // Only the owner changes the pool's clusters.
    let first_admin = first_node.admin_addr;
    let (status, body) = http(first_admin, "POST", "/v1/pools/sls/clusters", Some(TOKEN), r#"{"size": 8}"#);
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(&format!("ask its owner, node `{joiner}`")), "{body}");

    // The owner dies: the first node claims the pool again and adopts the
    // workgroup again.
    joiner_node.kill();
    wait_until(Duration::from_secs(30), "the first node's re-adopted c0 ready", || owns_sls(first_admin) && clusters(first_admin).contains(&("c0".into(), "ready".into())));
    let actions = provider_actions(first_admin);
    let position = |action: &str| actions.iter().position(|a| a == action);
    assert!(position("adopt") < position("hand_over") && position("hand_over").is_some(), "newest first: adopted after handing over: {actions:?}");
    let reply = ask(first_node.grpc_addr, "q4").await;
    assert_eq!((reply.status(), reply.target.as_str()), (QueryStatus::Completed, "c0"), "{reply:?}");
    assert_eq!(stand_in.calls("CreateWorkgroup"), 1, "one workgroup was ever created");
    assert_eq!(stand_in.calls("DeleteWorkgroup"), 0, "and none deleted");
    assert_eq!(stand_in.workgroups().len(), 1);
    drop(first_node);
    drop(etcd);
}
