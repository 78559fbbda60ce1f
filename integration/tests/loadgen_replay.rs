//! `slogate-loadgen run` against a `slogate serve` process.

use slogate_integration::{NodeProcess, json, workspace_binary};

#[test]
fn loadgen_replays_a_workload_and_reports_it() {
    let scratch_dir = tempfile::Builder::new().prefix("slogate-it-loadgen-").tempdir().unwrap();
    let dir = scratch_dir.path();
    let config = dir.join("node.toml");
    std::fs::write(
        &config,
        format!(
            "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 100000.0\n[[pool]]\nname = \"default\"\nclusters = [16, 16]\n",
            dir.join("data").display()
        ),
    )
    .unwrap();
    let node = NodeProcess::start(&config);
    let report = dir.join("report.json");
    let out = std::process::Command::new(workspace_binary("slogate-loadgen", "slogate-loadgen"))
        .args(["run", "--target", &format!("http://{}", node.grpc_addr), "--admin", &node.admin_addr.to_string()])
        .args(["--time-scale", "0", "--concurrency", "16", "--repeat", "2", "--deadline-s", "120", "--json"])
        .arg(&report)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report = json(&std::fs::read_to_string(&report).unwrap());
    assert_eq!(report["submitted"], 594);
    assert_eq!(report["completed"].as_u64().unwrap() + report["timed_out"].as_u64().unwrap(), 594);
    assert!(report["cost_usd"].as_f64().unwrap() > 0.0);
    assert!(report["submissions_per_s"].as_f64().unwrap() > 0.0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("violation rate"));
    drop(node);
}
