//! What the node tests share: a test node's configuration, scratch
//! directories, requests and admin calls.
#![allow(dead_code)]

use slogate::config::{NodeConfig, Overrides};
use slogate_proto::v1::SubmitRequest;
use slogate_proto::v1::submit_request::Query;

pub fn config(dir: &std::path::Path) -> NodeConfig {
    config_at(dir, 20_000.0)
}

/// The test node at `compression` virtual seconds per real second.
pub fn config_at(dir: &std::path::Path, compression: f64) -> NodeConfig {
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = {compression:.1}\nadmin_token = \"s3cret\"\n[limits]\npayload_bytes_max = 1024\nshutdown_grace_s = 10\n[[pool]]\nname = \"default\"\nclusters = [16, 16]\n",
        dir.display()
    );
    load(&text)
}

/// A node configuration from `text`, with no environment or flags.
pub fn load(text: &str) -> NodeConfig {
    NodeConfig::load(text, &std::collections::HashMap::new(), &Overrides::default()).unwrap()
}

/// A scratch directory for one test, removed when it drops.
pub fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-node-{name}-")).tempdir().unwrap()
}

pub fn request(id: &str, template: u32, slo_ms: u64) -> SubmitRequest {
    SubmitRequest { query_id: id.into(), query: Some(Query::Template(template)), slo_ms, ..Default::default() }
}

pub async fn admin_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    admin(addr, "GET", path, None, "").await
}

pub async fn admin(addr: std::net::SocketAddr, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response[9..12].parse().unwrap();
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}
