//! Black-box tests of the `slogate` binary: output, determinism and exit
//! codes, as a user runs it.

use std::path::PathBuf;
use std::process::{Command, Output};

fn slogate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slogate")).args(args).output().expect("binary runs")
}

/// A scratch directory for one test, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-cli-{name}-")).tempdir().unwrap()
}

#[test]
fn eval_base_with_one_seed_prints_one_row_per_policy() {
    let out = slogate(&["eval", "base", "--seed", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("scenario base  seed 1"));
    assert!(stdout.lines().any(|l| l.starts_with("round-robin")));
    assert!(stdout.lines().any(|l| l.starts_with("least-loaded")));
}

#[test]
fn eval_defaults_to_five_seeds_and_reports_mean_worst_and_spread() {
    let scratch_dir = scratch("seeds");
    let dir = scratch_dir.path();
    let path = dir.join("seeds.json");
    let out = slogate(&["eval", "base", "--json", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.starts_with("evaluation base  seeds 1..5 (5 seeds)"), "{stdout}");
    assert!(stdout.contains("worst (seed)") && stdout.contains("spread"));
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["seeds"], serde_json::json!([1, 2, 3, 4, 5]));
    let per_seed = json["per_seed"].as_array().unwrap();
    assert_eq!(per_seed.len(), 5);
    // The aggregate agrees with the seeds' own reports.
    let vr: Vec<f64> = per_seed.iter().map(|r| r["results"][0]["violation_rate"].as_f64().unwrap()).collect();
    let first = json["aggregate"].as_array().unwrap().iter().find(|a| a["metric"] == "VR").unwrap();
    let mean = vr.iter().sum::<f64>() / 5.0;
    assert!((first["mean"].as_f64().unwrap() - mean).abs() < 1e-12);
    assert_eq!(first["worst"].as_f64().unwrap(), vr.iter().copied().fold(0.0, f64::max));
    // A seed range runs exactly those seeds.
    let out = slogate(&["eval", "base", "--seeds", "3..4", "--policies", "round-robin"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("evaluation base  seeds 3..4 (2 seeds)"));
}

#[test]
fn same_seed_gives_byte_identical_output_and_another_seed_differs() {
    let a = slogate(&["eval", "base", "--seed", "9"]);
    let b = slogate(&["eval", "base", "--seed", "9"]);
    let c = slogate(&["eval", "base", "--seed", "10"]);
    assert_eq!(a.stdout, b.stdout);
    assert_ne!(a.stdout, c.stdout);
}

#[test]
fn json_report_has_the_documented_fields() {
    let scratch_dir = scratch("json");
    let dir = scratch_dir.path();
    let path = dir.join("report.json");
    let out = slogate(&["eval", "base", "--seed", "1", "--policies", "round-robin", "--json", path.to_str().unwrap()]);
    assert!(out.status.success());
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(json["scenario"], "base");
    assert_eq!(json["seed"], 1);
    let result = &json["results"][0];
    assert_eq!(result["policy"], "round-robin");
    assert_eq!(result["queries"], 297);
    for field in ["violation_rate", "cost_usd", "cluster_hours"] {
        assert!(result[field].is_number(), "{field}");
    }
    for p in ["p50", "p95", "p99"] {
        assert!(result["latency_s"][p].is_number());
    }
    assert!(result["decision_time_us"]["p99"].is_number());
    assert_eq!(result["case"]["clusters"], serde_json::json!([16, 16]));
}

#[test]
fn toml_scenario_with_a_trace_runs() {
    let scratch_dir = scratch("toml");
    let dir = scratch_dir.path();
    std::fs::write(dir.join("trace.csv"), "arrival_s,template,slo_s\n0,3,30\n1.5,17,20\n2.0,4,200\n").unwrap();
    std::fs::write(
        dir.join("s.toml"),
        "name = 'mine'\nkappa = 4\nclusters = [[16], [16, 32]]\npolicies = ['least-loaded']\n[[workload]]\nkind = 'trace'\npath = 'trace.csv'\n",
    )
    .unwrap();
    let out = slogate(&["eval", dir.join("s.toml").to_str().unwrap(), "--seed", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(stdout.contains("clusters [16,32]"));
    assert_eq!(stdout.lines().filter(|l| l.contains("3/3")).count(), 2);
}

#[test]
fn bad_input_exits_2_with_a_message_naming_the_problem() {
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["eval", "nosuch"], "unknown scenario `nosuch`"),
        (vec!["eval", "base", "--policies", "fastest"], "unknown policy `fastest`"),
        (vec!["eval", "base", "--seed", "minus-one"], "invalid value"),
        (vec!["eval"], "SCENARIO"),
        (vec!["eval", "base", "--elastic", "maybe"], "--elastic"),
        (vec!["eval", "tuner-table5", "--policies", "slogate"], "takes no --policies"),
        (vec!["eval", "base", "--seeds", "5..1"], "reversed"),
        (vec!["eval", "base", "--seeds", "1..3", "--seed", "2"], "cannot be used with"),
        (vec!["eval", "base", "--seeds", "1..3", "--explain", "2"], "--explain prints one seed"),
        (vec!["eval", "predictor-real", "--seeds", "1..3"], "takes no --seed"),
    ];
    for (args, message) in cases {
        let out = slogate(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    let scratch_dir = scratch("bad");
    let dir = scratch_dir.path();
    let bad_toml = dir.join("bad.toml");
    std::fs::write(&bad_toml, "name = 'x'\nkappa = [\n").unwrap();
    let out = slogate(&["eval", bad_toml.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid scenario"));
    let bad_trace = dir.join("t.toml");
    std::fs::write(dir.join("t.csv"), "arrival_s,template,slo_s\n1,2\n").unwrap();
    std::fs::write(&bad_trace, "name='t'\nkappa=4\nclusters=[16]\npolicies=['round-robin']\n[[workload]]\nkind='trace'\npath='t.csv'\n").unwrap();
    let out = slogate(&["eval", bad_trace.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("trace line 2: expected 3 fields, found 2"));
}

#[test]
fn shipped_example_scenarios_run() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let out = slogate(&["eval", path.to_str().unwrap(), "--seeds", "1..2"]);
            assert!(out.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
            count += 1;
        }
    }
    assert!(count >= 3);
}

#[test]
fn exported_trace_replays_to_the_same_results_as_the_generated_workload() {
    let scratch_dir = scratch("export");
    let dir = scratch_dir.path();
    let trace = dir.join("base.csv");
    let out = slogate(&["trace", "base", "--seed", "5", "--out", trace.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.starts_with("arrival_s,template,slo_s,pool,query_id\n"));
    assert_eq!(text.lines().count(), 1 + 297);
    std::fs::write(
        dir.join("replay.toml"),
        "name = 'base'\nkappa = 4\nclusters = [16, 16]\npolicies = ['round-robin', 'least-loaded']\n[[workload]]\nkind = 'trace'\npath = 'base.csv'\n",
    )
    .unwrap();
    let replayed = slogate(&["eval", dir.join("replay.toml").to_str().unwrap(), "--seed", "5"]);
    let generated = slogate(&["eval", "base", "--seed", "5"]);
    let rows = |o: &Output| String::from_utf8_lossy(&o.stdout).lines().filter(|l| l.contains("297/297")).map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(rows(&replayed), rows(&generated));
    assert_eq!(rows(&generated).len(), 2);
}

#[test]
fn the_diurnal_evaluations_workload_exports_as_a_trace_and_trace_names_only_what_it_writes() {
    let scratch_dir = scratch("diurnal");
    let trace = scratch_dir.path().join("diurnal.csv");
    let out = slogate(&["trace", "tuner-table5", "--seed", "15", "--kappa", "2", "--out", trace.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&trace).unwrap();
    let arrivals: Vec<f64> = text.lines().skip(1).map(|l| l.split(',').next().unwrap().parse().unwrap()).collect();
    // 60 days of a diurnal workload, a few thousand queries a day.
    assert!(arrivals.len() > 60 * 2_000, "{} queries", arrivals.len());
    assert!(arrivals.last().unwrap() / 86_400.0 > 59.0);
    let again = slogate(&["trace", "e2e-diurnal", "--seed", "15", "--kappa", "2"]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), text);
    let out = slogate(&["trace", "size-table3"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown scenario `size-table3`") && stderr.contains("tuner-table5") && !stderr.contains("calibrate"), "{stderr}");
}

/// Golden outputs: every figure of these runs is a pure function of the
/// scenario and seed, so any change to a decision, the world model or the
/// report shows up here. After an intended change, refresh them with
/// `UPDATE_GOLDEN=1 cargo test -p slogate --test cli` and review the diff.
#[test]
fn eval_output_matches_the_golden_files() {
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let scenarios = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let sizes = scenarios.join("sizes.toml");
    let cases: [(&str, Vec<&str>); 7] = [
        ("eval-base-seeds1-5.txt", vec!["eval", "base"]),
        ("eval-base-seed1.txt", vec!["eval", "base", "--seed", "1"]),
        ("eval-sizes-seed1.txt", vec!["eval", sizes.to_str().unwrap(), "--seed", "1"]),
        ("eval-router-table2-seed1.txt", vec!["eval", "router-table2", "--seed", "1"]),
        ("eval-router-table2-elastic-seed1.txt", vec!["eval", "router-table2", "--elastic", "on", "--seed", "1"]),
        ("eval-size-table3-seed1.txt", vec!["eval", "size-table3", "--seed", "1"]),
        ("eval-trigger-table4-seed1.txt", vec!["eval", "trigger-table4", "--seed", "1"]),
    ];
    for (file, args) in cases {
        let out = slogate(&args);
        assert!(out.status.success());
        let path = golden.join(file);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &out.stdout).unwrap();
        }
        let expected = std::fs::read_to_string(&path).unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), expected, "{file} differs; see the test's doc to refresh it");
    }
}

#[test]
fn explain_prints_each_policys_first_decisions() {
    let out = slogate(&["eval", "base", "--policies", "slogate,round-robin", "--explain", "2"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().filter(|l| l.starts_with("    q") && l.contains("predicted")).count(), 2, "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.starts_with("    q") && l.contains("round-robin over")).count(), 2, "{stdout}");
    // Each decision says what became of its query.
    assert!(stdout.lines().filter(|l| l.starts_with("    q")).all(|l| l.contains(" ⇒ met: ") || l.contains(" ⇒ MISSED: ")), "{stdout}");
}

#[cfg(feature = "learn")]
#[test]
fn train_predictor_writes_the_model_and_its_metadata_and_the_same_seed_gives_the_same_model() {
    let scratch_dir = scratch("train-predictor");
    let dir = scratch_dir.path();
    let run = |out: &str| {
        let out = slogate(&["train-predictor", "--simulate", "3", "--seed", "7", "--steps", "15", "--out", dir.join(out).to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let stdout = run("a");
    assert!(stdout.contains("held-out Q-error p50/p90/p95") && stdout.contains("concurrency-aware"), "{stdout}");
    run("b");
    let model = |name: &str| std::fs::read_to_string(dir.join(name).join("model.json")).unwrap();
    assert_eq!(model("a"), model("b"), "the same log and seed give the same model");
    let weights: slogate_core::predict::iconq::IconqWeights = serde_json::from_str(&model("a")).unwrap();
    weights.check().unwrap();
    let metadata: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("a").join("metadata.json")).unwrap()).unwrap();
    assert_eq!(metadata["feature_schema_version"], slogate_core::predict::iconq::FEATURE_SCHEMA_VERSION);
    assert_eq!(metadata["features"].as_array().unwrap().len(), slogate_core::predict::iconq::FEATURES);
    assert_eq!(metadata["seed"], 7);
    assert!(metadata["training"]["held_out"]["rows"].as_u64().unwrap() > 0, "{metadata}");
    assert!(metadata["concurrency_aware_held_out"]["p50"].as_f64().unwrap() >= 1.0, "{metadata}");
    assert_eq!(metadata["onnx"]["file"], "model.onnx");
    let onnx = |name: &str| std::fs::read(dir.join(name).join("model.onnx")).unwrap();
    assert_eq!(onnx("a"), onnx("b"), "the same seed writes the same ONNX graph");
    // ONNX Runtime runs the trained graph and it gives what model.json
    // gives natively (to 1e-5), as a node checks it at start.
    #[cfg(feature = "onnx")]
    {
        let library = slogate_onnx::runtime::library_from_env_or_venv(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/ci-venv"));
        let library = library.expect("no ONNX Runtime library: set ORT_DYLIB_PATH or run .ci/run (it installs the onnxruntime wheel)");
        let version = slogate::model::check_onnx(&dir.join("a"), &weights, Some(&library)).unwrap();
        assert!(version.starts_with("1."), "{version}");
    }
}

#[test]
fn train_predictor_refuses_a_log_it_cannot_read_naming_the_line() {
    let scratch_dir = scratch("train-bad-log");
    let dir = scratch_dir.path();
    let log = dir.join("log.jsonl");
    std::fs::write(&log, "{\"not\": \"a record\"}\n").unwrap();
    let out = slogate(&["train-predictor", "--log", log.to_str().unwrap(), "--out", dir.join("m").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8(out.stderr).unwrap();
    // Without the trainer the build says how to get it; with it, the
    // bad line is named.
    assert!(stderr.contains("log.jsonl:1: not an execution record") || stderr.contains("--features learn"), "{stderr}");
}

#[cfg(target_os = "linux")]
#[test]
fn a_serving_node_has_transparent_huge_pages_turned_off() {
    use std::io::{BufRead, BufReader};
    let scratch_dir = scratch("thp");
    let dir = scratch_dir.path();
    let config = dir.join("node.toml");
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = {:?}\n",
        dir.join("data")
    );
    std::fs::write(&config, text).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("binary runs");
    // The node logs its gRPC address once it serves (bounded: 200 lines).
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let serving = stderr.lines().map_while(Result::ok).take(200).any(|line| line.contains("grpc_addr="));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(serving, "the node never logged its address");
    let thp = status.lines().find(|l| l.starts_with("THP_enabled:")).expect("the kernel reports THP_enabled (Linux 5.0 and later)");
    assert_eq!(thp.split_whitespace().nth(1), Some("0"), "{thp}");
}
