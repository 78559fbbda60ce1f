//! `slogate serve` as a process: submissions, admin reads, bad input,
//! SIGKILL and restart with the reservoir intact, and graceful SIGTERM.

use slogate_integration::{NodeProcess, browser, http, http_get, json};
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};

fn write_config(dir: &std::path::Path) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("node.toml");
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 20000.0\nadmin_token = \"t0ken\"\n[[pool]]\nname = \"default\"\nclusters = [16, 16]\n",
        dir.join("data").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn request(id: &str, template: u32, slo_ms: u64) -> SubmitRequest {
    SubmitRequest { query_id: id.into(), query: Some(Query::Template(template)), slo_ms, ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_survives_sigkill_with_its_reservoir_and_stops_cleanly_on_sigterm() {
    let scratch_dir = tempfile::Builder::new().prefix("slogate-it-").tempdir().unwrap();
    let dir = scratch_dir.path();
    let config = write_config(dir);

    // 1. 300 concurrent submissions all complete with a status and latency.
    let node = NodeProcess::start(&config);
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let tasks: Vec<_> = (0..300u32)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.submit(request(&format!("q{i}"), 1 + i % 99, 600_000)).await })
        })
        .collect();
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut));
        assert!(reply.latency_ms > 0.0);
    }

    // 2. The admin API shows them.
    let admin = node.admin_addr;
    let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/pools/default")).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(json(&body)["stats"]["accepted"], 300);

    // 3. Bad input gets a status naming the problem.
    let mut bad = client.clone();
    let err = bad.submit(request("zero", 4, 0)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("slo_ms"));
    let err = bad.submit(SubmitRequest { pool: "nope".into(), ..request("p", 4, 1_000) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    assert!(err.message().contains("nope"));
    let err = bad.submit(SubmitRequest { payload: vec![7; (1 << 20) + 1], ..request("big", 4, 1_000) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("payload"));
    // Past the message limit, tonic refuses it before it is decoded.
    let err = bad.submit(SubmitRequest { payload: vec![7; 3 << 20], ..request("huge", 4, 1_000) }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    assert!(err.message().contains("the limit is"), "{err:?}");
    let (status, body) = tokio::task::spawn_blocking(move || http(admin, "POST", "/v1/pools/default/clusters", Some("t0ken"), "{size:"))
        .await
        .unwrap();
    assert_eq!(status, 400);
    assert_eq!(json(&body)["code"], "INVALID_ARGUMENT");
    let (status, body) =
        tokio::task::spawn_blocking(move || http(admin, "POST", "/v1/pools/default/clusters", None, r#"{"size": 8}"#)).await.unwrap();
    assert_eq!(status, 401);
    assert_eq!(json(&body)["code"], "UNAUTHENTICATED");

    // 4. A retried query id does not execute twice.
    let first = bad.submit(request("q7", 8, 600_000)).await.unwrap().into_inner();
    assert_eq!(first.query_id, "q7");
    let (_, body) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/pools/default")).await.unwrap();
    let pool = json(&body);
    assert_eq!(pool["stats"]["accepted"], 300, "the retry of q7 was answered, not run");
    assert_eq!(pool["stats"]["deduplicated"], 1);

    // 5. SIGKILL after the reservoir's flush interval; restart; counts intact.
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let (_, before) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/actors")).await.unwrap();
    let arrivals_before = json(&before)["reservoir"]["arrivals"].as_u64().unwrap();
    assert_eq!(arrivals_before, 300);
    node.kill();
    let node = NodeProcess::start(&config);
    let admin = node.admin_addr;
    let (_, after) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/actors")).await.unwrap();
    assert_eq!(json(&after)["reservoir"]["arrivals"].as_u64(), Some(arrivals_before));

    // 6. SIGTERM drains and exits cleanly.
    let lines = tokio::task::spawn_blocking(move || node.terminate()).await.unwrap();
    assert!(lines.iter().any(|l| l.contains("Stopped.") && l.contains("in_flight_left=0")), "{lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_pools_live_charts_and_explained_decisions_in_a_real_browser() {
    let scratch_dir = tempfile::Builder::new().prefix("slogate-it-console-").tempdir().unwrap();
    let dir = scratch_dir.path();
    let config = dir.join("node.toml");
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 200.0\nadmin_token = \"t0ken\"\n\
         [[pool]]\nname = \"dashboards\"\npolicy = \"slogate\"\nclusters = [16, 32]\n\
         [[pool]]\nname = \"adhoc\"\npolicy = \"slogate\"\nmode = \"shadow\"\nbaseline = \"round-robin\"\nclusters = [4, 16]\n",
        dir.join("data").display()
    );
    std::fs::write(&config, text).unwrap();
    let node = NodeProcess::start(&config);
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    // Load while the browser reads: 8 clients, at most 150 queries each.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load: Vec<_> = (0..8u32)
        .map(|worker| {
            let (mut client, stop) = (client.clone(), stop.clone());
            tokio::spawn(async move {
                for i in 0..150u32 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let mut submitted = request(&format!("w{worker}-{i}"), 1 + (worker * 7 + i) % 30, 30_000);
                    submitted.pool = if worker % 2 == 0 { "dashboards" } else { "adhoc" }.into();
                    let _ = client.submit(submitted).await;
                }
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    let url = format!("http://{}/ui", node.admin_addr);
    let page = url.clone();
    let dom = tokio::task::spawn_blocking(move || browser::dom(&page, 10_000)).await.unwrap();
    // Pools listed, with their clusters.
    for pool in ["dashboards", "adhoc"] {
        assert!(dom.contains(&format!("data-pool=\"{pool}\"")), "pool {pool} listed: {dom}");
    }
    assert!(dom.contains("round-robin (shadow: slogate)"), "the shadow pool's policy shown");
    // A chart drawn with points.
    let chart = dom.split("id=\"chart-vr\"").nth(1).expect("the VR chart is there");
    let points: usize = chart.split("data-points=\"").nth(1).and_then(|rest| rest.split('"').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(points >= 1 && chart.contains("<canvas"), "the VR chart is drawn with points: {}", &chart[..chart.len().min(600)]);
    // A routing decision's explanation and runner-up, and the shadow
    // comparison.
    let decisions = dom.split("id=\"decisions\"").nth(1).expect("the decision log is there");
    assert!(decisions.contains("vs SLO") && decisions.contains("runner-up"), "a decision's explanation shown: {}", &decisions[..decisions.len().min(2000)]);
    assert!(dom.contains("slogate in its shadow") && dom.contains("as slogate predicted it"), "the shadow comparison shown");
    assert!(!dom.contains("Cannot read the admin API"), "the page read the API");
    // Without the token the page offers no change, and no token is in it.
    assert!(dom.contains("disabled=\"\" title=\"Sign in with the admin token to change the pool\""), "mutations need the token");
    assert!(!dom.contains("t0ken"), "the token is nowhere in the page");
    // One node: no fleet to show.
    assert!(dom.contains("<section id=\"fleet-section\" hidden=\"\">"), "no fleet view for one node");

    // The screenshot, a CI artifact at 1280×800.
    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui");
    std::fs::create_dir_all(&artifacts).unwrap();
    let shot = artifacts.join("dashboard-1280x800.png");
    let path = shot.clone();
    tokio::task::spawn_blocking(move || browser::screenshot(&url, 10_000, (1280, 800), &path)).await.unwrap();
    println!("screenshot: {}", shot.display());

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }
    node.terminate();
}
