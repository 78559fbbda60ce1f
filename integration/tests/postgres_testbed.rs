//! The real-SQL path end to end, as a newcomer runs it: `slogate demo
//! --backend postgres` (TPC-DS generated, loaded into two throwaway
//! PostgreSQL servers, replayed as SQL text over gRPC), and the README's
//! Python grpcio client against a `slogate serve` process with a postgres
//! pool.
//!
//! They need PostgreSQL and a Python with `duckdb==1.4.4`,
//! `duckdb-ext-tpcds`, `grpcio` and `grpcio-tools`: `.ci/run` installs
//! them and names that Python in `SLOGATE_PYTHON`.

use std::process::Command;

use slogate::backend::local_postgres::LocalPostgres;
use slogate_integration::{NodeProcess, slogate_binary};

fn python() -> String {
    std::env::var("SLOGATE_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A scratch directory for one test, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-it-pg-{name}-")).tempdir().unwrap()
}

#[test]
fn postgres_demo_runs_at_least_ninety_tpcds_templates_as_sql_and_reports_each_policy() {
    let scratch_dir = scratch("demo");
    let dir = scratch_dir.path();
    let json = dir.join("report.json");
    let output = Command::new(slogate_binary())
        .args(["demo", "--backend", "postgres", "--scale-factor", "0.01", "--rate", "10", "--policies", "least-loaded,slogate"])
        .arg("--data")
        .arg(dir.join("tpcds"))
        .args(["--python", &python(), "--json"])
        .arg(&json)
        .arg("--keep-log")
        .arg(dir.join("executions.jsonl"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "demo failed: {stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("least-loaded") && stdout.contains("slogate"), "{stdout}");

    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let used = report["templates_used"].as_u64().unwrap();
    assert!(used >= 90, "only {used} of 99 TPC-DS templates ran within the cap: {}", report["isolated"]);
    assert_eq!(report["queries"].as_u64().unwrap(), used * 3);
    assert!(report["server_versions"][0].as_str().unwrap().starts_with(char::is_numeric), "{}", report["server_versions"]);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    for run in runs {
        let replay = &run["replay"];
        let answered = replay["completed"].as_u64().unwrap() + replay["timed_out"].as_u64().unwrap() + replay["failed"].as_u64().unwrap();
        assert_eq!(answered, used * 3, "every query got an outcome: {run}");
        assert!(replay["failed"].as_u64().unwrap() == 0, "{run}");
        assert!(run["cost_usd"].as_f64().unwrap() > 0.0, "{run}");
        let targets = replay["targets"].as_object().unwrap();
        assert!(targets.contains_key("c0") && targets.contains_key("c1"), "both servers ran queries: {run}");
    }
    // Only the learned router predicts, so only it has a Q-error.
    assert!(runs[0]["replay"]["q_error"].is_null());
    assert!(runs[1]["replay"]["q_error"]["p50"].as_f64().unwrap() >= 1.0, "{}", runs[1]);
    // Both runs' real executions were kept, with their timelines, and the
    // learned model trains on them.
    let log = std::fs::read_to_string(dir.join("executions.jsonl")).unwrap();
    let records: Vec<serde_json::Value> = log.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(records.len() as u64, used * 3 * 2, "every execution of both runs is kept");
    assert!(records.iter().all(|r| r["timeline"]["lane"].as_str().is_some_and(|lane| lane.starts_with("tpcds/c"))), "every execution has its lane");
    let trained = Command::new(slogate_binary())
        .args(["train-predictor", "--steps", "20", "--log"])
        .arg(dir.join("executions.jsonl"))
        .arg("--out")
        .arg(dir.join("model"))
        .output()
        .unwrap();
    assert!(trained.status.success(), "{}", String::from_utf8_lossy(&trained.stderr));
    assert!(String::from_utf8_lossy(&trained.stdout).contains("concurrency-aware"), "{}", String::from_utf8_lossy(&trained.stdout));
    assert!(dir.join("model/model.onnx").exists());
}

#[test]
fn the_readme_python_client_runs_sql_on_a_postgres_pool() {
    let scratch_dir = scratch("client");
    let dir = scratch_dir.path();
    let server = LocalPostgres::start(dir).unwrap();
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 1.0\n\
             [[pool]]\nname = \"pg\"\nbackend = \"postgres\"\n\
             [[pool.endpoint]]\nhost = \"127.0.0.1\"\nport = {}\ndatabase = \"postgres\"\nuser = \"postgres\"\nsize_rpu = 16\npassword_file = \"{}\"\n",
            dir.join("data").display(),
            server.port,
            server.password_file.display()
        ),
    )
    .unwrap();
    let node = NodeProcess::start(&config);
    let client = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/clients/submit.py");
    let run = |args: &[&str]| {
        let output = Command::new(python()).arg(&client).args(["--target", &node.grpc_addr.to_string(), "--pool", "pg"]).args(args).output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(output.status.success(), "client failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
        serde_json::from_str::<serde_json::Value>(&stdout).unwrap()
    };
    let reply = run(&["--sql", "SELECT 6 * 7 AS answer", "--slo-ms", "5000"]);
    assert_eq!(reply["status"], "QUERY_STATUS_COMPLETED", "{reply}");
    assert_eq!((reply["columns"][0].as_str(), reply["rows"][0][0].as_str()), (Some("answer"), Some("42")), "{reply}");
    let failed = run(&["--sql", "SELEC 1", "--slo-ms", "5000"]);
    assert_eq!((failed["status"].as_str(), failed["sqlstate"].as_str()), (Some("QUERY_STATUS_FAILED"), Some("42601")), "{failed}");
    drop(node);
}
