//! A node in-process on 127.0.0.1 ephemeral ports, driven through its gRPC
//! and admin surfaces as clients and operators use them.

mod common;

use common::{admin, admin_get, config, config_at, load, request, scratch};
use slogate::config::NodeConfig;
use slogate::node;
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};




/// Submits `count` queries, the i-th to `pools[i % pools.len()]` with
/// template `1 + i % 20` and id `{pool}{i}`, each on a task of its own.
fn submit_to_pools(
    client: &GatewayClient<tonic::transport::Channel>,
    pools: &[&'static str],
    count: usize,
) -> Vec<tokio::task::JoinHandle<Result<slogate_proto::v1::SubmitResponse, tonic::Status>>> {
    (0..count)
        .map(|i| {
            let mut client = client.clone();
            let pool = pools[i % pools.len()];
            tokio::spawn(async move {
                let mut request = request(&format!("{pool}{i}"), 1 + (i as u32) % 20, 600_000);
                request.pool = pool.into();
                client.submit(request).await.map(|r| r.into_inner())
            })
        })
        .collect()
}





#[actix_rt::test]
async fn three_hundred_concurrent_submissions_all_complete_and_show_in_the_admin_api() {
    let scratch_dir = scratch("300");
    let dir = scratch_dir.path();
    // It compares slogate's billing estimate with the warehouse's bill: at
    // 20,000x a millisecond of actor scheduling is 20 billed seconds, and
    // parallel tests make that jitter, so this node runs at 2,000x.
    let node = node::start(config_at(dir, 2_000.0)).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..300u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("q{i}"), 1 + i % 99, 600_000)).await }));
    }
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        assert!(reply.latency_ms > 0.0 && !reply.target.is_empty());
    }
    let (status, body) = admin_get(node.admin_addr, "/v1/pools/default").await;
    assert_eq!(status, 200);
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pool["stats"]["accepted"], 300);
    assert_eq!(pool["in_flight"], 0);
    assert!(pool["billed_usd"].as_f64().unwrap() > 0.0);
    let (status, body) = admin_get(node.admin_addr, "/v1/decisions?limit=5").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap().as_array().unwrap().len(), 5);
    let (status, body) = admin_get(node.admin_addr, "/v1/actors").await;
    assert_eq!(status, 200);
    assert!(body.contains("router_shard") && body.contains("reservoir"));
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let trackers = actors["cluster_trackers"]["default"].as_array().unwrap();
    assert_eq!(trackers.len(), 2);
    let finished: u64 = trackers.iter().map(|t| t["finished"].as_u64().unwrap()).sum();
    assert_eq!(finished, 300);
    let estimate: f64 = trackers.iter().map(|t| t["billed_usd_estimate"].as_f64().unwrap()).sum();
    let billed = pool["billed_usd"].as_f64().unwrap();
    assert!((estimate / billed - 1.0).abs() < 0.25, "slogate's estimate {estimate} vs the warehouse's bill {billed}");
    let (status, body) = admin_get(node.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("slogate_submissions_total{pool=\"default\"} 300"));
    assert!(body.contains("slogate_decision_time_seconds_count{} 300"), "{body}");
    assert!(body.contains("slogate_cluster_queries{pool=\"default\",cluster=\"c0\",state=\"waiting\"} 0"));
    assert!(body.contains("slogate_gateway_added_latency_seconds_count{} 300"));
    let reservoir_disk_bytes: u64 = body
        .lines()
        .find_map(|line| line.strip_prefix("slogate_reservoir_disk_bytes "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no slogate_reservoir_disk_bytes in {body}"));
    assert!(reservoir_disk_bytes > 0);
    let lag_probes: u64 = body
        .lines()
        .find_map(|line| line.strip_prefix("slogate_event_loop_lag_seconds_count{shard=\"0\"} "))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no slogate_event_loop_lag_seconds_count in {body}"));
    assert!(lag_probes > 0, "the routing thread's lag probe fires while the node runs");
    assert!(body.contains("slogate_intake_held_total 0"), "300 queries never fill the reservoir's backlog: {body}");
    assert!(body.contains("# TYPE slogate_reservoir_backlog gauge"), "{body}");
    assert!(actors["reservoir"]["disk_bytes"].as_u64().is_some_and(|bytes| bytes > 0), "{actors}");
    assert_eq!(node.shutdown().await, 0);
}

#[actix_rt::test]
async fn bad_requests_get_the_documented_statuses_and_retries_run_once() {
    let scratch_dir = scratch("bad");
    let dir = scratch_dir.path();
    let node = node::start(config(dir)).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();

    let zero_slo = client.submit(request("a", 4, 0)).await.unwrap_err();
    assert_eq!(zero_slo.code(), tonic::Code::InvalidArgument);
    assert!(zero_slo.message().contains("slo_ms"));
    let unknown_pool = client.submit(SubmitRequest { pool: "nope".into(), ..request("b", 4, 1_000) }).await.unwrap_err();
    assert_eq!(unknown_pool.code(), tonic::Code::NotFound);
    let oversize = client.submit(SubmitRequest { payload: vec![0; 2_048], ..request("c", 4, 1_000) }).await.unwrap_err();
    assert_eq!(oversize.code(), tonic::Code::InvalidArgument);
    assert!(oversize.message().contains("payload"));
    let empty = client.submit(SubmitRequest { query: Some(Query::Sql(" ".into())), ..request("d", 4, 1_000) }).await.unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);

    let first = client.submit(request("retry-me", 4, 600_000)).await.unwrap().into_inner();
    let again = client.submit(request("retry-me", 4, 600_000)).await.unwrap().into_inner();
    assert_eq!(first, again);
    let (_, body) = admin_get(node.admin_addr, "/v1/pools/default").await;
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((pool["stats"]["accepted"].as_u64(), pool["stats"]["deduplicated"].as_u64()), (Some(1), Some(1)));

    let (status, body) = admin_get(node.admin_addr, "/v1/pools/nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("\"code\":\"NOT_FOUND\""));
    node.shutdown().await;
}

#[actix_rt::test]
async fn a_stream_answers_each_request_by_id_and_rejects_bad_ones_without_ending() {
    let scratch_dir = scratch("stream");
    let dir = scratch_dir.path();
    let node = node::start(config(dir)).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let mut requests: Vec<SubmitRequest> = (0..50u32).map(|i| request(&format!("s{i}"), 1 + i, 600_000)).collect();
    requests.push(request("bad", 4, 0));
    let mut replies = client.submit_stream(tokio_stream::iter(requests)).await.unwrap().into_inner();
    let mut seen = Vec::new();
    while let Some(reply) = replies.message().await.unwrap() {
        if reply.query_id == "bad" {
            assert_eq!(reply.status(), QueryStatus::Rejected);
            assert_eq!(reply.error_code, tonic::Code::InvalidArgument as i32);
        } else {
            assert_eq!(reply.status(), QueryStatus::Completed);
        }
        seen.push(reply.query_id);
    }
    assert_eq!(seen.len(), 51);
    node.shutdown().await;
}

#[actix_rt::test]
async fn after_shutdown_starts_new_submissions_are_unavailable() {
    let scratch_dir = scratch("drain");
    let dir = scratch_dir.path();
    let config = config(dir);
    let node = node::start(config).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let in_flight = {
        let mut client = client.clone();
        tokio::spawn(async move { client.submit(request("long", 4, 600_000)).await })
    };
    // Shut down only once the query is in flight (bounded: 2 s).
    for _ in 0..400 {
        let (_, running) = admin_get(node.admin_addr, "/v1/pools/default/queries?state=running").await;
        let (_, done) = admin_get(node.admin_addr, "/v1/pools/default/queries?state=done").await;
        if running.contains("\"long\"") || done.contains("\"long\"") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let left = node.shutdown().await;
    assert_eq!(left, 0);
    let reply = in_flight.await.unwrap().unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    assert!(client.submit(request("late", 4, 1_000)).await.is_err());
}

/// Polls the pool (at most 200 times, 10 ms apart) until cluster `index`
/// reaches `wanted`; returns the last state seen.
async fn wait_for_cluster_state(addr: std::net::SocketAddr, index: usize, wanted: &str) -> String {
    let mut state = String::new();
    for _ in 0..200 {
        let (_, body) = admin_get(addr, "/v1/pools/default").await;
        state = serde_json::from_str::<serde_json::Value>(&body).unwrap()["clusters"][index]["state"].as_str().unwrap().to_owned();
        if state == wanted {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    state
}

#[actix_rt::test]
async fn operators_add_and_remove_clusters_with_the_token_only() {
    let scratch_dir = scratch("clusters");
    let dir = scratch_dir.path();
    let node = node::start(config(dir)).await.unwrap();
    let addr = node.admin_addr;

    let (status, body) = admin(addr, "POST", "/v1/pools/default/clusters", None, r#"{"size": 32}"#).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("UNAUTHENTICATED"));
    let (status, _) = admin(addr, "POST", "/v1/pools/default/clusters", Some("wrong"), r#"{"size": 32}"#).await;
    assert_eq!(status, 401);
    let (status, body) = admin(addr, "POST", "/v1/pools/default/clusters", Some("s3cret"), "{size: 32").await;
    assert_eq!(status, 400);
    assert!(body.contains("INVALID_ARGUMENT") && body.contains("JSON"), "{body}");
    let (status, _) = admin(addr, "POST", "/v1/pools/nope/clusters", Some("s3cret"), r#"{"size": 32}"#).await;
    assert_eq!(status, 404);

    let (status, body) = admin(addr, "POST", "/v1/pools/default/clusters", Some("s3cret"), r#"{"size": 32}"#).await;
    assert_eq!(status, 202, "{body}");
    let cluster = serde_json::from_str::<serde_json::Value>(&body).unwrap()["cluster"].as_u64().unwrap();
    assert_eq!(cluster, 2);
    // δ = 300 virtual seconds is 15 ms at this compression.
    assert_eq!(wait_for_cluster_state(addr, 2, "ready").await, "ready");

    let (status, _) = admin(addr, "DELETE", "/v1/pools/default/clusters/c2", None, "").await;
    assert_eq!(status, 401);
    let (status, _) = admin(addr, "DELETE", "/v1/pools/default/clusters/c9", Some("s3cret"), "").await;
    assert_eq!(status, 404);
    let (status, body) = admin(addr, "DELETE", "/v1/pools/default/clusters/c2", Some("s3cret"), "").await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(wait_for_cluster_state(addr, 2, "gone").await, "gone");
    let (_, body) = admin_get(addr, "/v1/actors").await;
    let actions: Vec<String> = serde_json::from_str::<serde_json::Value>(&body).unwrap()["providers"]["default"]["recent"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["action"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(actions, vec!["spin_down", "spin_up"]);
    node.shutdown().await;
}

#[actix_rt::test]
async fn the_slo_aware_router_serves_live_with_predictions_learns_from_completions_and_shows_its_violation_budget() {
    let scratch_dir = scratch("slogate-policy");
    let dir = scratch_dir.path();
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 20000.0\n[[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [32, 16]\n[pool.violation_budget]\ntarget = 0.05\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config.clone()).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..100u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("q{i}"), 1 + i % 99, 600_000)).await }));
    }
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(reply.predicted_ms > 0.0, "{reply:?}");
        assert!(reply.explanation.contains("predicted"), "{}", reply.explanation);
    }
    // The budget counts every query the router placed and saw finish.
    let (status, body) = admin_get(node.admin_addr, "/v1/pools/default").await;
    assert_eq!(status, 200, "{body}");
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    let budget = &pool["violation_budget"];
    assert_eq!(budget["target"], 0.05, "{body}");
    assert_eq!(budget["finished"], 100, "{body}");
    let (realised, extra) = (budget["realised"].as_f64().unwrap(), budget["extra_tolerance"].as_f64().unwrap());
    assert!((0.0..=1.0).contains(&realised) && (0.0..=0.3).contains(&extra), "{body}");
    assert_eq!(extra == 0.0, realised >= 0.05, "the tolerance widens exactly while the budget is unspent: {body}");
    node.shutdown().await;
    // A restart warms the router up from the execution log.
    let node = node::start(config).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let reply = client.submit(request("after-restart", 5, 600_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    node.shutdown().await;
}

/// Polls `/v1/decisions?kind=scaling` (at most 1,600 times, 25 ms apart:
/// generous, for a machine busy with other builds)
/// until a decision of `kind` shows; returns the decisions last seen.
async fn wait_for_scale_decision(addr: std::net::SocketAddr, kind: &str) -> Vec<serde_json::Value> {
    let mut decisions = Vec::new();
    for _ in 0..1_600 {
        let (status, body) = admin_get(addr, "/v1/decisions?kind=scaling&limit=100").await;
        assert_eq!(status, 200, "{body}");
        decisions = serde_json::from_str::<serde_json::Value>(&body).unwrap().as_array().unwrap().clone();
        if decisions.iter().any(|d| d["kind"] == kind) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    decisions
}

/// A node with one autoscaled pool of one 4-RPU cluster (and `extra`
/// TOML for it), and a burst of 60 queries with 20 s SLOs that makes its
/// autoscaler ask for a cluster. The directory comes first: bound as
/// `let (_dir, node, tasks)`, the node drops before it is removed.
async fn bursting_node(name: &str, extra: &str) -> (tempfile::TempDir, node::Node, Vec<tokio::task::JoinHandle<Result<tonic::Response<slogate_proto::v1::SubmitResponse>, tonic::Status>>>) {
    let scratch_dir = scratch(name);
    let dir = scratch_dir.path();
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 2000.0\nadmin_token = \"s3cret\"\n\
         [[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [4]\n\
         [pool.autoscale]\nenabled = true\nmin_observations = 8\n{extra}",
        dir.display()
    );
    let node = node::start(load(&text)).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    // One query first, until the autoscaler has evaluated with the pool's
    // cluster in view: it dates the Ready set from when it first sees it,
    // so a burst sent before that (its thread behind, on a loaded machine)
    // would not count, and nothing would fire.
    client.submit(request("warm-up", 1, 20_000)).await.unwrap();
    for _ in 0..200 {
        let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
        if !serde_json::from_str::<serde_json::Value>(&body).unwrap()["autoscalers"]["default"]["last_trigger_evaluation"].is_null() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let tasks = (0..60u32)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.submit(request(&format!("{i}"), 1 + i, 20_000)).await })
        })
        .collect();
    (scratch_dir, node, tasks)
}

/// Every burst query answered; then an operator's request for a cluster
/// is refused saying `why`, and the pool still has its one cluster.
async fn burst_answered_and_operator_refused(node: &node::Node, tasks: Vec<tokio::task::JoinHandle<Result<tonic::Response<slogate_proto::v1::SubmitResponse>, tonic::Status>>>, why: &str) {
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
    }
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/default/clusters", Some("s3cret"), r#"{"size": 8}"#).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains(why), "{body}");
    let (_, body) = admin_get(node.admin_addr, "/v1/pools/default").await;
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pool["clusters"].as_array().unwrap().len(), 1, "nothing was created: {pool}");
}

#[actix_rt::test]
async fn a_pool_at_its_cap_refuses_the_autoscaler_s_spinup_and_the_operator_s_and_says_why() {
    let (_dir, node, tasks) = bursting_node("caps", "[pool.caps]\nrpu_total_max = 4\n").await;
    let addr = node.admin_addr;
    let mut decisions = wait_for_scale_decision(addr, "refused").await;
    let refused = decisions.iter().find(|d| d["kind"] == "refused").unwrap_or_else(|| panic!("no refusal: {decisions:?}"));
    assert!(refused["reason"].as_str().unwrap().contains("cap of 4 RPU"), "{refused}");
    // Each spinup asked for (a `spin_up` decision) is refused, once the
    // router has answered it.
    let count = |decisions: &[serde_json::Value], kind: &str| decisions.iter().filter(|d| d["kind"] == kind).count();
    for _ in 0..200 {
        if count(&decisions, "refused") == count(&decisions, "spin_up") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
        decisions = wait_for_scale_decision(addr, "refused").await;
    }
    assert_eq!(count(&decisions, "refused"), count(&decisions, "spin_up"), "{decisions:?}");
    // The operator is refused too, with the same reason.
    burst_answered_and_operator_refused(&node, tasks, "cap of 4 RPU").await;
    node.shutdown().await;
}

#[actix_rt::test]
async fn a_dry_run_provider_shows_what_the_autoscaler_would_create_and_creates_nothing() {
    let (_dir, node, tasks) = bursting_node("dry-run", "[pool.provider]\ndry_run = true\n").await;
    let addr = node.admin_addr;
    let decisions = wait_for_scale_decision(addr, "refused").await;
    let refused = decisions.iter().find(|d| d["kind"] == "refused").unwrap_or_else(|| panic!("no refusal: {decisions:?}"));
    assert!(refused["reason"].as_str().unwrap().contains("dry run: would create a"), "{refused}");
    burst_answered_and_operator_refused(&node, tasks, "dry run").await;
    let (_, body) = admin_get(addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let provider = &actors["providers"]["default"];
    assert_eq!(provider["kind"], "dry-run", "{provider}");
    assert!(provider["recent"].as_array().unwrap().iter().any(|r| r["action"] == "spin_up" && r["result"].as_str().unwrap().starts_with("would create")), "{provider}");
    // A release is recorded too, and the cluster keeps serving.
    let (status, body) = admin(addr, "DELETE", "/v1/pools/default/clusters/c0?force=true", Some("s3cret"), "").await;
    assert_ne!(status, 200, "{body}");
    assert!(body.contains("dry run: would release c0"), "{body}");
    let (_, body) = admin_get(addr, "/v1/pools/default").await;
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pool["clusters"][0]["state"], "ready", "{pool}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn a_burst_spins_a_cluster_up_and_an_idle_period_tears_one_down() {
    let scratch_dir = scratch("autoscale");
    let dir = scratch_dir.path();
    // δ = 300 virtual seconds is 150 ms at this compression; T_idle and
    // T_min_lifetime are 120 virtual seconds.
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 2000.0\n\
         [[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [4]\n\
         [pool.autoscale]\nenabled = true\nmin_observations = 8\nidle_teardown_s = 120\nmin_lifetime_s = 120\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    let addr = node.admin_addr;
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();

    // A burst of 60 queries with 20 s SLOs on one 4-RPU cluster.
    let mut tasks = Vec::new();
    for i in 0..60u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("burst{i}"), 1 + i, 20_000)).await }));
    }
    let decisions = wait_for_scale_decision(addr, "spin_up").await;
    assert!(decisions.iter().any(|d| d["kind"] == "trigger_fired"), "{decisions:?}");
    let selection = decisions.iter().find(|d| d["kind"] == "selection").expect("the selector ran");
    let candidates = selection["selection"]["candidates"].as_array().unwrap();
    // Doing nothing and one of each size; when none of those meets the
    // target, two and three copies of the best size too.
    let singles: Vec<(serde_json::Value, u64)> = candidates.iter().take(5).map(|c| (c["size"].clone(), c["copies"].as_u64().unwrap())).collect();
    assert_eq!(singles, vec![(serde_json::Value::Null, 0), (4.into(), 1), (8.into(), 1), (16.into(), 1), (32.into(), 1)], "{selection}");
    assert!(candidates.len() <= 7 && candidates[5..].iter().all(|c| c["copies"].as_u64().unwrap() >= 2), "at most three at once: {selection}");
    assert!(candidates.iter().all(|c| c["violation_rate"].is_number() && c["cost_usd"].is_number()));
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
    }

    // Then nothing arrives: an idle cluster goes, the last one stays.
    let decisions = wait_for_scale_decision(addr, "tear_down").await;
    assert!(decisions.iter().any(|d| d["kind"] == "tear_down"), "{decisions:?}");
    let (_, body) = admin_get(addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let autoscaler = &actors["autoscalers"]["default"];
    assert!(autoscaler["stats"]["spinups"].as_u64().unwrap() >= 1 && autoscaler["stats"]["teardowns"].as_u64().unwrap() >= 1, "{autoscaler}");
    assert_eq!(autoscaler["commands_failed"], 0, "{autoscaler}");
    let (_, body) = admin_get(addr, "/v1/pools/default").await;
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    let states: Vec<&str> = pool["clusters"].as_array().unwrap().iter().map(|c| c["state"].as_str().unwrap()).collect();
    assert!(states.contains(&"ready") && states.iter().any(|s| *s == "draining" || *s == "gone"), "{states:?}");

    let (status, body) = admin_get(addr, "/v1/decisions?kind=everything").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("kind"));
    node.shutdown().await;
}

#[actix_rt::test]
async fn queries_no_cluster_can_serve_in_time_are_offloaded_to_the_elastic_tier() {
    let scratch_dir = scratch("elastic");
    let dir = scratch_dir.path();
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 2000.0\n\
         [[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [4]\n\
         [pool.elastic]\nenabled = true\nspeed_factor = 4.0\ncold_start_ms = 100\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    // A burst of 40 queries with 30 s SLOs on one 4-RPU cluster: the
    // cluster cannot serve them all in time.
    let mut tasks = Vec::new();
    for i in 0..40u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("e{i}"), 1 + i, 30_000)).await }));
    }
    let mut offloaded = 0;
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        if reply.target == "elastic" {
            offloaded += 1;
            assert!(reply.explanation.starts_with("offloaded"), "{}", reply.explanation);
        }
    }
    assert!(offloaded > 0, "nothing was offloaded");
    let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let warehouse = &actors["backends"]["default"]["detail"];
    assert_eq!(warehouse["elastic_invocations"].as_u64().unwrap(), offloaded, "{warehouse}");
    assert!(warehouse["elastic_billed_usd"].as_f64().unwrap() > 0.0);
    node.shutdown().await;
}

#[actix_rt::test]
async fn the_slo_director_offloads_what_overflows_a_clusters_queue() {
    let scratch_dir = scratch("director");
    let dir = scratch_dir.path();
    // One 4-RPU cluster whose queue holds 2 (8 per 16 RPU).
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 200.0\n\
         [[pool]]\nname = \"default\"\npolicy = \"spandana-central\"\nclusters = [4]\n\
         [pool.elastic]\nenabled = true\ndirector_queue_per_16_rpu = 8.0\ncold_start_ms = 100\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..12u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("d{i}"), 1 + i, 600_000)).await }));
    }
    let (mut offloaded, mut queued) = (0u64, 0u64);
    for task in tasks {
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        if reply.target == "elastic" {
            offloaded += 1;
            assert!(reply.explanation.contains("queue is full"), "{}", reply.explanation);
        } else {
            queued += 1;
        }
    }
    assert!(offloaded > 0 && queued >= 2, "offloaded {offloaded}, queued {queued}");
    let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(actors["backends"]["default"]["detail"]["elastic_invocations"].as_u64().unwrap(), offloaded, "{actors}");
    node.shutdown().await;
}

/// A tuned pool's node. Its calendar starts at midnight: at a time
/// compression of 2000 a test's second is 33 minutes of calendar, and on
/// the wall's calendar a run started in the half hour before midnight UTC
/// logged its arrivals on one day and tuned on the next, whose history
/// (the day before it) then held none of them.
fn tuned_config(dir: &std::path::Path) -> NodeConfig {
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 2000.0\nadmin_token = \"s3cret\"\ncalendar = \"midnight\"\n\
         [[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [4]\n\
         [pool.autoscale]\nenabled = true\n\
         [pool.tune]\nenabled = true\nevery_hours = 0.0\nhistory_days = 1\nscenarios = 4\nstrategy = \"random\"\nbudget = 2\nrounds = 1\nthreads = 1\n\
         [[pool]]\nname = \"plain\"\nclusters = [16]\n",
        dir.display()
    );
    load(&text)
}

async fn wait_for_tuning_runs(addr: std::net::SocketAddr, runs: u64) -> serde_json::Value {
    for _ in 0..600 {
        let (_, body) = admin_get(addr, "/v1/actors").await;
        let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
        if actors["tuners"]["default"]["runs"].as_u64() >= Some(runs) {
            return actors;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the tuner did not finish {runs} runs within 60 s");
}

#[actix_rt::test]
async fn an_operator_tunes_a_pool_and_the_choice_survives_a_restart() {
    let scratch_dir = scratch("tune");
    let dir = scratch_dir.path();
    let node = node::start(tuned_config(dir)).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    // Today's arrivals are the history the tuner forecasts tomorrow from.
    let mut tasks = Vec::new();
    for i in 0..30u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("t{i}"), 1 + i % 10, 120_000)).await }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/default/tune", None, "").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/plain/tune", Some("s3cret"), "").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("has no tuner"), "{body}");
    let (status, _) = admin(node.admin_addr, "POST", "/v1/pools/nowhere/tune", Some("s3cret"), "").await;
    assert_eq!(status, 404);
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/default/tune", Some("s3cret"), "").await;
    assert_eq!(status, 202, "{body}");
    let actors = wait_for_tuning_runs(node.admin_addr, 1).await;
    let tuner = &actors["tuners"]["default"];
    assert_eq!(tuner["running"], false, "{tuner}");
    assert_eq!(tuner["phase"], "done", "{tuner}");
    let active = &tuner["active"];
    assert!(active["forecast_queries_per_day"].as_f64().unwrap() > 0.0, "{active}");
    assert!(active["expected"]["violations"].is_number() && active["expected"]["cost_usd"].is_number(), "{active}");
    // What the planner calibrated on is shown: 30 queries at once on one
    // cluster queue, so its slots are learned from the execution log.
    assert!(active["calibration"]["admission"]["slots"].as_object().is_some_and(|slots| !slots.is_empty()), "{active}");
    let applied = &actors["autoscalers"]["default"]["tuning"];
    assert_eq!(applied["source"], "tuner", "{applied}");
    node.shutdown().await;

    // A restart restores the choice from the data directory.
    let node = node::start(tuned_config(dir)).await.unwrap();
    let mut restored = serde_json::Value::Null;
    for _ in 0..100 {
        let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
        restored = serde_json::from_str(&body).unwrap();
        if restored["autoscalers"]["default"]["tuning"]["source"] == "tuner (restored)" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(restored["autoscalers"]["default"]["tuning"]["source"], "tuner (restored)", "{restored}");
    assert_eq!(restored["tuners"]["default"]["active"], *active);
    node.shutdown().await;
}

#[actix_rt::test]
async fn provisioned_clusters_bill_while_they_exist_and_trackers_agree() {
    let scratch_dir = scratch("provisioned");
    let dir = scratch_dir.path();
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 1000.0\n\
         [[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [16]\nbilling = \"provisioned\"\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let reply = client.submit(request("p1", 5, 600_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    // Idle, a provisioned cluster keeps billing: 16 RPU × $0.375 per
    // RPU-hour for every virtual second.
    let snapshot = || async {
        let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
        let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
        let warehouse = &actors["backends"]["default"]["detail"];
        let estimate = actors["cluster_trackers"]["default"][0]["billed_usd_estimate"].as_f64().unwrap();
        (warehouse["virtual_now_s"].as_f64().unwrap(), warehouse["clusters"][0]["billed_usd"].as_f64().unwrap(), estimate)
    };
    // Past the 60 s minimum first (100 ms is 100 virtual seconds).
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (t1, billed1, estimate1) = snapshot().await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let (t2, billed2, estimate2) = snapshot().await;
    let expected = 16.0 * 0.375 * (t2 - t1) / 3_600.0;
    assert!(((billed2 - billed1) / expected - 1.0).abs() < 0.05, "billed {} vs {expected} over {} s", billed2 - billed1, t2 - t1);
    // The tracker's estimate grows at the same rate (its start differs from
    // the warehouse's by the node's start-up time).
    let estimated = estimate2 - estimate1;
    assert!((estimated / expected - 1.0).abs() < 0.05, "tracker {estimated} vs {expected}");
    node.shutdown().await;
}

/// A tuned fragment's planned spinups fire in a live replay of the trace it
/// was tuned on: the node's calendar starts at midnight, so the trace's
/// second 0 is 00:00 and its times of day are the fragment's.
#[actix_rt::test]
async fn planned_spinups_fire_at_their_time_of_day_in_a_live_replay_of_the_trace() {
    let scratch_dir = scratch("planned");
    let dir = scratch_dir.path();
    // The fragment `slogate tune` writes, with one planned spinup at
    // 01:00 (3,600 s into the trace's day; 1.8 s after the node starts at
    // 2,000x, well after its actors are up).
    let fragment = "[pool.autoscale]\nenabled = true\nidle_teardown_s = 7200\nmin_lifetime_s = 7200\n\n[[pool.autoscale.scheduled]]\n# 01:00:00 UTC\nat_s = 3600\nsize = 8\n";
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 2000.0\ncalendar = \"midnight\"\n\
         [[pool]]\nname = \"default\"\npolicy = \"slogate\"\nclusters = [16]\n{fragment}",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    // The trace: a query every 80 s for the first 80 minutes of the day.
    let mut trace = "arrival_s,template,slo_s\n".to_owned();
    for i in 0..60u32 {
        trace.push_str(&format!("{},{},120\n", i * 80, 1 + i % 30));
    }
    let entries = slogate_loadgen::trace::parse_trace(&trace).unwrap();
    let replay = slogate_loadgen::replay::ReplayConfig {
        target: format!("http://{}", node.grpc_addr),
        pool: "default".into(),
        time_scale: 2_000.0,
        concurrency: 64,
        repeat: 1,
        deadline: std::time::Duration::from_secs(60),
        progress: false,
        run_id: slogate_loadgen::replay::ReplayConfig::fresh_run_id(),
        sql: None,
        ca_pem: None,
    };
    let report = slogate_loadgen::replay::replay(&entries, &replay).await.unwrap();
    assert_eq!(report.completed + report.timed_out, 60, "{report:?}");
    let decisions = wait_for_scale_decision(node.admin_addr, "spin_up").await;
    let (_, actors) = admin_get(node.admin_addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&actors).unwrap();
    let autoscaler = &actors["autoscalers"]["default"];
    let spinup = decisions.iter().find(|d| d["kind"] == "spin_up").unwrap_or_else(|| panic!("no planned spinup fired: {decisions:?}; the autoscaler: {autoscaler}"));
    assert_eq!(spinup["size"], 8, "{spinup}");
    // It fired at 01:00 of the node's calendar, where the trace's second
    // 3,600 was replayed (the actors' scheduling adds a few virtual seconds
    // at 2,000x).
    let at_s = spinup["at"].as_f64().unwrap() / 1e6;
    assert!((3_600.0..3_700.0).contains(&at_s), "fired at {at_s} s: {spinup}");
    assert!(spinup["reason"].as_str().unwrap().contains("scheduled") || spinup["reason"].as_str().unwrap().contains("planned"), "{spinup}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn grpc_on_a_runtime_of_its_own_answers_every_query_and_shuts_down_cleanly() {
    let scratch_dir = scratch("grpc-threads");
    let dir = scratch_dir.path();
    let mut config = config(dir);
    config.file.node.grpc_threads = 2;
    let node = node::start(config).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let replies: Vec<_> = (0..64)
        .map(|i| {
            let mut client = client.clone();
            tokio::spawn(async move { client.submit(request(&format!("q{i}"), 1 + i % 20, 600_000)).await.map(|r| r.into_inner()) })
        })
        .collect();
    for reply in replies {
        let reply = reply.await.unwrap().unwrap();
        assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
    }
    // The gRPC server's threads are the runtime's, not the routing thread.
    let threads: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .map(|name| name.trim().to_owned())
        .collect();
    assert!(threads.iter().filter(|name| name.as_str() == "slogate-grpc").count() >= 2, "{threads:?}");
    assert_eq!(node.shutdown().await, 0);
}

#[actix_rt::test]
async fn pools_on_two_router_shards_route_on_their_own_threads_and_the_admin_api_merges_them() {
    let scratch_dir = scratch("shards");
    let dir = scratch_dir.path();
    // Three pools on two shards: `a` and `c` on shard 0 (by index), `b`
    // pinned to shard 1; `c` autoscales, so its Autoscaler talks to its
    // own shard.
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 20000.0\n\
         admin_token = \"s3cret\"\nrouter_shards = 2\n\
         [[pool]]\nname = \"a\"\nclusters = [16]\n\
         [[pool]]\nname = \"b\"\npolicy = \"slogate\"\nclusters = [16, 8]\nshard = 1\n\
         [[pool]]\nname = \"c\"\npolicy = \"stage-cost\"\nclusters = [8]\nshard = 0\n[pool.autoscale]\nenabled = true\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let replies = submit_to_pools(&client, &["a", "b", "c"], 90);
    for reply in replies {
        let reply = reply.await.unwrap().unwrap();
        assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
    }
    // A retry reaches the shard that answered the first time.
    let mut retry = request("b1", 2, 600_000);
    retry.pool = "b".into();
    let again = client.clone().submit(retry).await.unwrap().into_inner();
    assert_eq!(again.status(), QueryStatus::Completed);

    let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    let shards = actors["router_shard"]["shards"].as_array().unwrap();
    assert_eq!(shards.len(), 2, "{shards:?}");
    assert_eq!(shards[0]["pools"], serde_json::json!(["a", "c"]));
    assert_eq!(shards[1]["pools"], serde_json::json!(["b"]));
    assert_ne!(shards[0]["thread"], shards[1]["thread"], "{shards:?}");
    // Each shows its event loop's lag, the longest of the last minute no
    // longer than the longest since start.
    for shard in shards {
        let lag = &shard["event_loop_lag"];
        let (max_s, recent_max_s) = (lag["max_s"].as_f64().unwrap(), lag["recent_max_s"].as_f64().unwrap());
        assert!(lag["probes"].as_u64().is_some() && recent_max_s <= max_s, "{shard}");
    }
    let (_, body) = admin_get(node.admin_addr, "/v1/pools").await;
    let pools: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let accepted: Vec<(String, u64)> =
        pools.iter().map(|p| (p["id"].as_str().unwrap().to_owned(), p["stats"]["accepted"].as_u64().unwrap())).collect();
    assert_eq!(accepted, vec![("a".to_owned(), 30), ("b".to_owned(), 30), ("c".to_owned(), 30)]);
    // The decision log holds every shard's decisions, newest first, and
    // no two queries share a node id.
    let (_, body) = admin_get(node.admin_addr, "/v1/decisions?limit=100").await;
    let decisions: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(decisions.len(), 90);
    let times: Vec<f64> = decisions.iter().map(|d| d["at_s"].as_f64().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{times:?}");
    let ids: std::collections::HashSet<u64> = decisions.iter().map(|d| d["query"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), 90);
    // Each shard's event loop has its own lag series.
    let (_, metrics) = admin_get(node.admin_addr, "/metrics").await;
    for shard in ["0", "1"] {
        let series = format!("slogate_event_loop_lag_seconds_max{{shard=\"{shard}\"}} ");
        assert!(metrics.contains(&series), "no {series} in {metrics}");
        // And the longest of about the last minute, no longer than the
        // longest since start.
        let gauge = |name: &str| -> f64 {
            let prefix = format!("{name}{{shard=\"{shard}\"}} ");
            metrics.lines().find_map(|line| line.strip_prefix(prefix.as_str())).and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {prefix} in {metrics}"))
        };
        assert!(gauge("slogate_event_loop_lag_seconds_recent_max") <= gauge("slogate_event_loop_lag_seconds_max"), "{metrics}");
    }
    // Pool operations reach the owner; an unknown pool is named.
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/b/clusters", Some("s3cret"), r#"{"size": 4}"#).await;
    assert_eq!(status, 202, "{body}");
    let (status, body) = admin_get(node.admin_addr, "/v1/pools/zzz/queries").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("zzz"), "{body}");
    assert_eq!(node.shutdown().await, 0);
}

#[actix_rt::test]
async fn a_shutdown_answers_every_query_in_flight_on_every_shard() {
    let scratch_dir = scratch("shards-drain");
    let dir = scratch_dir.path();
    // Real time: BaseWorkload's templates take seconds, so the queries are
    // still running when the (zero) grace period ends.
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 1.0\nrouter_shards = 2\n\
         [limits]\nshutdown_grace_s = 0\n[[pool]]\nname = \"a\"\nclusters = [4]\n[[pool]]\nname = \"b\"\nclusters = [4]\n",
        dir.display()
    );
    let config = load(&text);
    let node = node::start(config).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let replies = submit_to_pools(&client, &["a", "b"], 20);
    // Shut down once all 20 are accepted (bounded: 2 s).
    for _ in 0..400 {
        let (_, body) = admin_get(node.admin_addr, "/v1/pools").await;
        let pools: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
        if pools.iter().map(|p| p["stats"]["accepted"].as_u64().unwrap()).sum::<u64>() == 20 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let failed = node.shutdown().await;
    let mut failed_replies = 0;
    for reply in replies {
        let reply = reply.await.unwrap().unwrap();
        match reply.status() {
            QueryStatus::Completed => {}
            QueryStatus::Failed => {
                assert!(reply.explanation.contains("shut down"), "{reply:?}");
                failed_replies += 1;
            }
            other => panic!("{other:?}: {reply:?}"),
        }
    }
    assert!(failed > 0, "the queries were still running");
    assert_eq!(failed_replies, failed);
}

#[actix_rt::test]
async fn every_route_the_openapi_description_lists_answers_and_refuses_other_methods_naming_its_own() {
    let scratch_dir = scratch("openapi");
    let dir = scratch_dir.path();
    let node = node::start(config(dir)).await.unwrap();
    let addr = node.admin_addr;
    let (status, body) = admin_get(addr, "/v1/openapi.json").await;
    assert_eq!(status, 200);
    assert_eq!(body, slogate::node::admin::OPENAPI_JSON);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path.replace("{pool}", "default").replace("{cluster}", "c0");
        for method in item.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            // The route is there: never 404 for the path or 405 for the
            // method (mutations without the token get 401).
            let (status, body) = admin(addr, &method, &concrete, None, "").await;
            assert!(status != 404 && status != 405, "{method} {concrete}: {status} {body}");
            let other = if method == "GET" { "PUT" } else { "GET" };
            let (status, body) = admin(addr, other, &concrete, None, "").await;
            assert_eq!(status, 405, "{other} {concrete}: {body}");
            assert!(body.contains(&format!("allowed: {method}")), "{other} {concrete} names {method}: {body}");
        }
    }
    let (status, body) = admin_get(addr, "/v1/undocumented").await;
    assert_eq!(status, 404, "{body}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn every_metric_the_grafana_dashboard_charts_is_exported_by_the_node() {
    let scratch_dir = scratch("grafana");
    let dir = scratch_dir.path();
    let node = node::start(config(dir)).await.unwrap();
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let reply = client.submit(request("g1", 3, 600_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    let (status, metrics) = admin_get(node.admin_addr, "/metrics").await;
    assert_eq!(status, 200);
    let exported: std::collections::BTreeSet<&str> =
        metrics.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana-dashboard.json");
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut charted = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            let mut rest = expr;
            while let Some(at) = rest.find("slogate_") {
                let name: String = rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                rest = &rest[at + name.len()..];
                charted.insert(name);
            }
        }
    }
    assert!(charted.len() >= 15, "the dashboard charts the node's metrics: {charted:?}");
    let missing: Vec<&String> = charted.iter().filter(|name| !exported.contains(name.as_str())).collect();
    assert!(missing.is_empty(), "charted but not exported: {missing:?}\n{metrics}");
    // The query's latency was observed under its pool.
    assert!(metrics.contains("slogate_query_latency_seconds_count{pool=\"default\"} 1"), "{metrics}");
    node.shutdown().await;
}

/// The targets of `pool`'s routing decisions, by client query id.
async fn targets_by_query(addr: std::net::SocketAddr, pool: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    let (status, body) = admin_get(addr, &format!("/v1/decisions?pool={pool}&limit=1000")).await;
    assert_eq!(status, 200, "{body}");
    let decisions: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert!(decisions.iter().all(|d| d["pool"] == pool), "filtered by pool: {decisions:?}");
    decisions.into_iter().map(|d| (d["client_query_id"].as_str().unwrap().trim_start_matches(pool).to_owned(), d["target"].clone())).collect()
}

#[actix_rt::test]
async fn shadow_mode_never_changes_where_a_query_runs_and_records_what_slogate_would_do() {
    // Two pools alike but for the mode: `plain` routes round-robin;
    // `shadowed` routes round-robin with slogate (and its autoscaler) in
    // its shadow. The same queries, one at a time, must land alike.
    let scratch_dir = scratch("shadow");
    let dir = scratch_dir.path();
    let pool = |name: &str, extra: &str| {
        format!("[[pool]]\nname = \"{name}\"\npolicy = \"{}\"\nclusters = [4, 32]\n{extra}", if extra.is_empty() { "round-robin" } else { "slogate" })
    };
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 20000.0\nadmin_token = \"s3cret\"\n{}{}",
        dir.display(),
        pool("plain", ""),
        pool("shadowed", "mode = \"shadow\"\nbaseline = \"round-robin\"\n[pool.autoscale]\nenabled = true\nmin_observations = 8\n"),
    );
    let node = node::start(load(&text)).await.unwrap();
    let addr = node.admin_addr;
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    for i in 0..40u32 {
        // Five heavy templates with tight SLOs, each seen on both
        // clusters: once slogate has learned them it would keep them off
        // the 4-RPU cluster that round-robin sends every other one to.
        for pool in ["plain", "shadowed"] {
            let mut submitted = request(&format!("{pool}{i}"), 40 + i % 5, 15_000);
            submitted.pool = pool.into();
            let reply = client.submit(submitted).await.unwrap().into_inner();
            assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        }
    }
    let (plain, shadowed) = (targets_by_query(addr, "plain").await, targets_by_query(addr, "shadowed").await);
    assert_eq!(plain.len(), 40);
    assert_eq!(plain, shadowed, "shadow mode changed where a query ran");

    let (status, body) = admin_get(addr, "/v1/pools/shadowed/shadow").await;
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!((report["acting"].as_str(), report["shadow"].as_str()), (Some("round-robin"), Some("slogate")), "{report}");
    assert_eq!(report["decisions"], 40, "{report}");
    assert_eq!(report["actual"]["finished"], 40, "{report}");
    let agreed = report["agreed"].as_u64().unwrap();
    assert!(agreed < 40, "slogate would have placed some queries elsewhere: {report}");
    // Each choice of slogate's, scored on the same state as round-robin's
    // placement, adds no more expected violations than it, within the
    // router's tolerance (properties B and E), unless the template was
    // still a guess and was spread (property F). (The two sides' totals
    // are not ordered: a guess is spread whatever it adds.)
    let tolerance = slogate_core::route::slo::EXPECTED_VIOLATION_TOLERANCE;
    let mut learned = 0;
    for decision in report["recent"].as_array().unwrap() {
        if decision["explanation"].as_str().unwrap().starts_with("template") {
            continue;
        }
        learned += 1;
        let expected = |side: &str| decision[side]["expected_violations"].as_f64().unwrap();
        assert!(expected("own") <= expected("predicted_actual") + tolerance + 1e-9, "{decision}");
    }
    assert!(learned > 0, "some decisions were on learned templates: {report}");
    let disagreement = report["recent"].as_array().unwrap().iter().find(|d| d["would"] != d["actual"]).expect("a disagreement is listed");
    assert!(disagreement["explanation"].as_str().unwrap().contains("predicted"), "{disagreement}");
    assert!(disagreement["own"]["predicted_latency_s"].as_f64().is_some() && disagreement["missed"].is_boolean(), "{disagreement}");
    // The routing decision says what slogate would have done too.
    let (_, body) = admin_get(addr, "/v1/decisions?pool=shadowed&limit=40").await;
    assert!(body.contains("shadow slogate would send it to"), "{body}");

    // Slogate's autoscaler decides in the shadow too: the spinups it asks
    // for are recorded and nothing is created. On a loaded machine the
    // compressed clock can carry a burst past the point where a new
    // cluster would help (the selector then rightly does nothing), so up
    // to three bursts are sent, each waited on in full.
    let mut decisions = Vec::new();
    for round in 0..3u32 {
        let burst: Vec<_> = (0..60u32)
            .map(|i| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let mut submitted = request(&format!("burst{round}-{i}"), 40 + i % 40, 15_000);
                    submitted.pool = "shadowed".into();
                    client.submit(submitted).await
                })
            })
            .collect();
        decisions = wait_for_scale_decision(addr, "refused").await;
        for task in burst {
            task.await.unwrap().unwrap();
        }
        if decisions.iter().any(|d| d["pool"] == "shadowed" && d["kind"] == "refused") {
            break;
        }
    }
    assert!(decisions.iter().any(|d| d["pool"] == "shadowed" && d["kind"] == "refused"), "{decisions:?}");
    let (_, body) = admin_get(addr, "/v1/pools/shadowed/shadow").await;
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let would = report["would_provision"].as_array().unwrap();
    assert!(would.iter().any(|r| r["action"] == "spin_up" && r["result"].as_str().unwrap().starts_with("would create")), "{report}");
    let (_, body) = admin_get(addr, "/v1/pools/shadowed").await;
    let pool_state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pool_state["clusters"].as_array().unwrap().len(), 2, "nothing was created: {pool_state}");

    // An active pool has no shadow to read.
    let (status, body) = admin_get(addr, "/v1/pools/plain/shadow").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("not in shadow mode"), "{body}");
    node.shutdown().await;
}
