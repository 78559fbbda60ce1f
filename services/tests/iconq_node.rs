//! Nodes whose pools predict with Iconq+, the learned model: loading and
//! checking it at start, routing with it, and retraining it. A test binary
//! of its own: training runs in-process and takes the CPU the timing-
//! sensitive node tests need.

mod common;

use common::{admin, config, load, scratch};
use slogate::config::{NodeConfig, Overrides};
use slogate::node;
#[cfg(feature = "learn")]
use {common::admin_get, common::request, slogate_proto::v1::QueryStatus, slogate_proto::v1::gateway_client::GatewayClient};

/// A pool with `predictor = "iconq"` and the model in `model`, its
/// section followed by `extra`.
fn iconq_config(dir: &std::path::Path, model: &std::path::Path, extra: &str) -> NodeConfig {
    load(&format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 20000.0\nadmin_token = \"s3cret\"\n[[pool]]\nname = \"default\"\npolicy = \"slogate\"\npredictor = \"iconq\"\nmodel = \"{}\"\nclusters = [32, 16]\n{extra}",
        dir.display(),
        model.display()
    ))
}

/// A small model trained on simulated run `seed`, in `dir/model`.
#[cfg(feature = "learn")]
fn trained_model(dir: &std::path::Path, seed: u64) -> std::path::PathBuf {
    let model = dir.join("model");
    slogate::train::run(&slogate::train::TrainRequest { source: slogate::train::LogSource::Simulated(seed), out: model.clone(), seed, steps: Some(20) }).unwrap();
    model
}

#[cfg(feature = "learn")]
#[actix_rt::test]
async fn a_pool_predicts_with_a_trained_iconq_model_and_serves_every_query() {
    let scratch_dir = scratch("iconq");
    let dir = scratch_dir.path();
    let model = trained_model(dir, 2);
    // With ONNX Runtime in the build and ORT_DYLIB_PATH set (as .ci/run
    // sets it), the node also checks model.onnx against model.json at start.
    let node = node::start(iconq_config(&dir.join("data"), &model, "")).await.unwrap();
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..60u32 {
        let mut client = client.clone();
        tasks.push(tokio::spawn(async move { client.submit(request(&format!("q{i}"), 1 + i % 99, 600_000)).await }));
    }
    let mut completed = 0;
    for task in tasks {
        // Sixty at once congest two clusters: some may reach the
        // warehouse's timeout, but every one is answered.
        let reply = task.await.unwrap().unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        completed += usize::from(reply.status() == QueryStatus::Completed);
        assert!(reply.predicted_ms.is_finite() && reply.predicted_ms > 0.0, "{reply:?}");
        assert!(reply.explanation.contains("predicted"), "{}", reply.explanation);
    }
    assert!(completed > 0, "none of 60 completed");
    let (status, body) = admin_get(node.admin_addr, "/v1/pools/default").await;
    assert_eq!(status, 200, "{body}");
    let pool: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pool["predictor"], "iconq", "{body}");
    assert_eq!(pool["policy"], "slogate", "{body}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn an_iconq_pool_whose_model_is_missing_or_broken_stops_the_node_at_start_naming_the_file() {
    let scratch_dir = scratch("iconq-missing");
    let dir = scratch_dir.path();
    let error = node::start(iconq_config(&dir.join("data"), &dir.join("no-model"), "")).await.err().expect("no model, no node");
    let text = error.to_string();
    assert!(text.contains("pool `default`") && text.contains("no-model/model.json"), "{text}");
    std::fs::create_dir_all(dir.join("broken")).unwrap();
    std::fs::write(dir.join("broken/model.json"), "{\"schema_version\": 1}").unwrap();
    let error = node::start(iconq_config(&dir.join("data"), &dir.join("broken"), "")).await.err().expect("a broken model, no node");
    assert!(error.to_string().contains("is not an Iconq+ model"), "{error}");
}

#[test]
fn the_config_says_what_an_iconq_pool_lacks() {
    let base = "version = \"1\"\n[[pool]]\nname = \"p\"\nclusters = [16]\n";
    let refused = |extra: &str| NodeConfig::load(&format!("{base}{extra}"), &std::collections::HashMap::new(), &Overrides::default()).unwrap_err().to_string();
    assert!(refused("policy = \"slogate\"\npredictor = \"iconq\"\n").contains("pool[0].model"));
    assert!(refused("policy = \"least-loaded\"\npredictor = \"iconq\"\nmodel = \"m\"\n").contains("iconq predicts for the slogate policies"));
    assert!(refused("policy = \"slogate\"\npredictor = \"lstm\"\n").contains("not one of concurrency-aware, iconq"));
    assert!(refused("policy = \"slogate-iconq\"\n").contains("set predictor = \"iconq\""));
}

/// Polls `/v1/actors` (at most 600 times, 100 ms apart) until the pool's
/// Retrainer has finished `runs` runs (or failed); returns its state.
#[cfg(feature = "learn")]
async fn wait_for_retraining(addr: std::net::SocketAddr, runs: u64) -> serde_json::Value {
    for _ in 0..600 {
        let (_, body) = admin_get(addr, "/v1/actors").await;
        let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
        let retrainer = actors["retrainers"]["default"].clone();
        if retrainer["runs"].as_u64().unwrap_or(0) + retrainer["failures"].as_u64().unwrap_or(0) >= runs {
            return retrainer;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("the retrainer did not finish {runs} run(s) within 60 s");
}

#[cfg(feature = "learn")]
#[actix_rt::test]
async fn an_operator_retrains_a_worse_model_away_and_the_new_one_survives_a_restart() {
    let scratch_dir = scratch("iconq-retrain");
    let dir = scratch_dir.path();
    let model = trained_model(dir, 3);
    // A model that over-predicts every latency e⁴-fold: a retrained one
    // must score better and replace it.
    let mut weights: slogate_core::predict::iconq::IconqWeights = serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    weights.out.b += 4.0;
    std::fs::write(model.join("model.json"), serde_json::to_vec(&weights).unwrap()).unwrap();
    std::fs::write(model.join("model.onnx"), slogate_onnx::graph::iconq_model_bytes(&weights).unwrap()).unwrap();
    std::fs::remove_file(model.join("metadata.json")).unwrap();
    let config = iconq_config(&dir.join("data"), &model, "[pool.retrain]\nmin_executions = 40\nsteps = 40\n");
    let node = node::start(config.clone()).await.unwrap();
    // Too little history yet: the run says so and changes nothing.
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/default/predictor/retrain", Some("s3cret"), "").await;
    assert_eq!(status, 202, "{body}");
    let early = wait_for_retraining(node.admin_addr, 1).await;
    assert_eq!(early["failures"], 1, "{early}");
    assert!(early["last_error"].as_str().unwrap().contains("a run needs at least 40"), "{early}");
    assert_eq!(early["model"]["version"], 1, "{early}");
    let (status, _) = admin(node.admin_addr, "POST", "/v1/pools/default/predictor/retrain", None, "").await;
    assert_eq!(status, 401, "retraining needs the token");
    let client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    for round in 0..5u32 {
        let mut tasks = Vec::new();
        for i in 0..20u32 {
            let mut client = client.clone();
            tasks.push(tokio::spawn(async move { client.submit(request(&format!("r{round}q{i}"), 1 + (round * 20 + i) % 60, 600_000)).await }));
        }
        for task in tasks {
            task.await.unwrap().unwrap();
        }
    }
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/default/predictor/retrain", Some("s3cret"), "").await;
    assert_eq!(status, 202, "{body}");
    let retrainer = wait_for_retraining(node.admin_addr, 2).await;
    assert_eq!(retrainer["runs"], 1, "{retrainer}");
    let run = &retrainer["last_run"];
    assert!(run["held_out_executions"].as_u64().unwrap() > 0 && run["training_executions"].as_u64().unwrap() >= 40, "{run}");
    assert!(run["candidate"]["p90"].as_f64().unwrap() <= run["current"]["p90"].as_f64().unwrap(), "{run}");
    assert_eq!(run["installed"], true, "{run}");
    assert_eq!(retrainer["model"]["version"], 2, "{retrainer}");
    assert_eq!(retrainer["model"]["source"], "retrained", "{retrainer}");
    // The pool routes on with the new model.
    let mut client = client.clone();
    let reply = client.submit(request("after-retraining", 5, 600_000)).await.unwrap().into_inner();
    assert!(reply.predicted_ms.is_finite() && reply.predicted_ms > 0.0, "{reply:?}");
    node.shutdown().await;
    // It is kept as a model directory; a restart starts the pool on it
    // (its model.onnx checked against it when ONNX Runtime is named), not
    // on the file's.
    let kept = dir.join("data/models/default");
    assert!(kept.join("model.json").exists() && kept.join("model.onnx").exists(), "the kept model: {}", kept.display());
    let node = node::start(config).await.unwrap();
    let (_, body) = admin_get(node.admin_addr, "/v1/actors").await;
    let actors: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(actors["retrainers"]["default"]["model"]["version"], 2, "{body}");
    node.shutdown().await;
}

#[actix_rt::test]
async fn retraining_a_pool_without_a_learned_model_is_a_conflict_that_says_why() {
    let scratch_dir = scratch("retrain-none");
    let dir = scratch_dir.path();
    let node = node::start(config(dir)).await.unwrap();
    let (status, body) = admin(node.admin_addr, "POST", "/v1/pools/default/predictor/retrain", Some("s3cret"), "").await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("predictor = \\\"iconq\\\""), "{body}");
    let (status, _) = admin(node.admin_addr, "POST", "/v1/pools/nope/predictor/retrain", Some("s3cret"), "").await;
    assert_eq!(status, 404);
    node.shutdown().await;
}
