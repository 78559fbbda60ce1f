//! The `slogate-loadgen` binary's argument handling.

use std::process::Command;

fn loadgen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_slogate-loadgen")).args(args).output().expect("binary runs")
}

#[test]
fn bad_arguments_exit_2_with_a_message() {
    let out = loadgen(&["run", "--target", "http://127.0.0.1:9", "--workload", "trace"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--file"));
    let out = loadgen(&["run", "--target", "http://127.0.0.1:9", "--rate=-1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("rate"));
    let out = loadgen(&["run"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_unreachable_node_is_a_runtime_failure_not_a_usage_error() {
    let out = loadgen(&["run", "--target", "http://127.0.0.1:9", "--deadline-s", "5"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));
}
