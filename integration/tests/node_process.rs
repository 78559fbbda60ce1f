//! `slogate serve` as a process: submissions, admin reads, bad input,
//! SIGKILL and restart with the reservoir intact, and graceful SIGTERM.

use slogate_integration::{NodeProcess, http, http_get, json};
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
    let dir = std::env::temp_dir().join(format!("slogate-it-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = write_config(&dir);

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
    std::fs::remove_dir_all(&dir).ok();
}
