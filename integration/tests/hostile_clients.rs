//! `slogate serve` against clients that try to hold it or fill it: raw
//! sockets that never speak, oversized and undecodable requests, streams
//! whose replies are never read, and streams held open through a shutdown.
//! Each test starts its own node process on loopback ports, with every
//! wait bounded.

use std::io::Read;
use std::time::Duration;

use bytes::BufMut;
use prost::Message;
use slogate_integration::NodeProcess;
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest, SubmitResponse};
use tokio_stream::StreamExt;

/// A node whose `[limits]` section is `limits`, after its directory:
/// bound as `let (_dir, node)`, the node drops first (bindings drop in
/// reverse order), and then its directory is removed.
fn node(name: &str, limits: &str) -> (tempfile::TempDir, NodeProcess) {
    let dir = scratch(name);
    let node = NodeProcess::start(&node_config(dir.path(), limits, ""));
    (dir, node)
}

/// A scratch directory for one test, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-hostile-{name}-")).tempdir().unwrap()
}

/// A config for a node with its data in `dir`; returns the config's path.
fn node_config(dir: &std::path::Path, limits: &str, extra: &str) -> std::path::PathBuf {
    let path = dir.join("node.toml");
    let text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 20000.0\nadmin_token = \"t0ken\"\n[limits]\n{limits}\n[[pool]]\nname = \"default\"\nclusters = [16, 16]\n{extra}",
        dir.join("data").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn request(id: &str, template: u32, slo_ms: u64) -> SubmitRequest {
    SubmitRequest { query_id: id.into(), query: Some(Query::Template(template)), slo_ms, ..Default::default() }
}

/// A client codec that sends raw bytes as the message, to put what no
/// well-behaved client would on the wire.
#[derive(Clone, Default)]
struct RawCodec;

struct RawEncoder;

impl tonic::codec::Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;

    fn encode(&mut self, item: Vec<u8>, buf: &mut tonic::codec::EncodeBuf<'_>) -> Result<(), tonic::Status> {
        buf.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = SubmitResponse;
    type Encoder = RawEncoder;
    type Decoder = tonic_prost::ProstDecoder<SubmitResponse>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::default()
    }
}

async fn raw_channel(node: &NodeProcess) -> tonic::client::Grpc<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", node.grpc_addr)).unwrap().connect().await.unwrap();
    tonic::client::Grpc::new(channel)
}

/// Bytes that are no `SubmitRequest`: field 1 (`pool`) claims 127 bytes
/// and carries one.
const UNDECODABLE: [u8; 3] = [0x0a, 0x7f, 0x41];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_argument_and_a_stream_still_answers_what_it_accepted() {
    let (_dir, node) = node("decode", "");
    let mut grpc = raw_channel(&node).await;

    grpc.ready().await.unwrap();
    let unary = grpc
        .unary::<Vec<u8>, SubmitResponse, _>(tonic::Request::new(UNDECODABLE.to_vec()), "/slogate.v1.Gateway/Submit".parse().unwrap(), RawCodec)
        .await
        .unwrap_err();
    assert_eq!(unary.code(), tonic::Code::InvalidArgument, "{unary:?}");
    assert!(unary.message().contains("does not decode"), "{unary:?}");

    // Three good queries, then garbage: three replies, then the error.
    let mut messages: Vec<Vec<u8>> = (0..3).map(|i| request(&format!("s{i}"), 4 + i, 600_000).encode_to_vec()).collect();
    messages.push(UNDECODABLE.to_vec());
    grpc.ready().await.unwrap();
    let response = grpc
        .streaming::<_, Vec<u8>, SubmitResponse, _>(
            tonic::Request::new(tokio_stream::iter(messages)),
            "/slogate.v1.Gateway/SubmitStream".parse().unwrap(),
            RawCodec,
        )
        .await
        .unwrap();
    let mut replies = response.into_inner();
    let mut answered = Vec::new();
    let error = loop {
        match tokio::time::timeout(Duration::from_secs(30), replies.next()).await.expect("a reply within 30 s") {
            Some(Ok(reply)) => answered.push(reply),
            Some(Err(status)) => break status,
            None => panic!("the stream ended without the decode error; answered {answered:?}"),
        }
    };
    assert_eq!(error.code(), tonic::Code::InvalidArgument, "{error:?}");
    answered.sort_by(|a, b| a.query_id.cmp(&b.query_id));
    assert_eq!(answered.iter().map(|r| r.query_id.as_str()).collect::<Vec<_>>(), ["s0", "s1", "s2"]);
    assert!(answered.iter().all(|r| r.status() == QueryStatus::Completed), "{answered:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_fields_are_refused_briefly_and_unread_streams_keep_memory_bounded() {
    let (_dir, node) = node("sizes", "stream_in_flight_max = 16");
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();

    // A 1 MB pool name: refused, and not echoed into grpc-message.
    let error = client.submit(SubmitRequest { pool: "p".repeat(1 << 20), ..request("long", 4, 1_000) }).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(error.message().len() < 200, "grpc-message is {} bytes", error.message().len());
    // 4 MB of labels: refused, by the message limit or the labels limit.
    let labels = [("blob".to_owned(), "x".repeat(4 << 20))].into();
    let error = client.submit(SubmitRequest { labels, ..request("labels", 4, 1_000) }).await.unwrap_err();
    assert_ne!(error.code(), tonic::Code::Internal, "{error:?}");
    assert_ne!(error.code(), tonic::Code::Ok);
    // A pool name that would inject a metrics line.
    let error = client.submit(SubmitRequest { pool: "x\"} 1\nevil".into(), ..request("inject", 4, 1_000) }).await.unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);

    // 3,000 requests with 200 KB pool names on streams whose replies are
    // never read: the node reads no faster than it answers, so its memory
    // stays bounded (it grew by 1.1 GB when every request got a task).
    let before = node.rss_bytes();
    let mut senders = Vec::new();
    for s in 0..10 {
        let mut client = client.clone();
        senders.push(tokio::spawn(async move {
            let requests = tokio_stream::iter((0..300).map(move |i| SubmitRequest { pool: "p".repeat(200_000), ..request(&format!("m{s}-{i}"), 4, 1_000) }));
            // Held, never read.
            let replies = client.submit_stream(requests).await;
            tokio::time::sleep(Duration::from_secs(8)).await;
            drop(replies);
        }));
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let during = node.rss_bytes();
    for sender in senders {
        let _ = tokio::time::timeout(Duration::from_secs(30), sender).await;
    }
    let growth_mb = during.saturating_sub(before) as f64 / 1e6;
    eprintln!("RSS with 3,000 unread 200 KB requests on 10 streams: {:.1} MB → {:.1} MB", before as f64 / 1e6, during as f64 / 1e6);
    assert!(growth_mb < 150.0, "RSS grew by {growth_mb:.0} MB with unread streams ({} → {} bytes)", before, during);

    // And the node still answers.
    let reply = client.submit(request("after", 4, 600_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_are_closed_and_the_connection_limit_holds_without_starving_the_node() {
    let (_dir, node) = node("sockets", "grpc_handshake_timeout_s = 1\ngrpc_connections_max = 8");
    // A socket that never sends the HTTP/2 preface is closed by the node.
    let addr = node.grpc_addr;
    let closed_after = tokio::task::spawn_blocking(move || {
        let mut socket = std::net::TcpStream::connect(addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let started = std::time::Instant::now();
        let mut buffer = [0u8; 64];
        // The node may send its SETTINGS first; read to the end.
        loop {
            match socket.read(&mut buffer) {
                Ok(0) => break Some(started.elapsed()),
                Ok(_) => continue,
                Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => break Some(started.elapsed()),
                Err(_) => break None,
            }
        }
    })
    .await
    .unwrap();
    let closed_after = closed_after.expect("the node closes a silent socket within 20 s");
    eprintln!("a silent socket was closed after {closed_after:?}");
    assert!(closed_after >= Duration::from_millis(900), "closed after {closed_after:?}, before the handshake timeout");

    // 40 silent sockets, five times the limit: the ones past the limit wait
    // in the backlog, each is closed a second after the node accepts it,
    // and a real client still gets through.
    let silent: Vec<std::net::TcpStream> = (0..40).map(|_| std::net::TcpStream::connect(addr).unwrap()).collect();
    let mut client = tokio::time::timeout(Duration::from_secs(30), GatewayClient::connect(format!("http://{addr}")))
        .await
        .expect("a client connects within 30 s")
        .unwrap();
    let reply = tokio::time::timeout(Duration::from_secs(30), client.submit(request("through", 4, 600_000)))
        .await
        .expect("an answer within 30 s")
        .unwrap()
        .into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);
    drop(silent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_holding_streams_open_cannot_keep_the_node_up_past_its_shutdown_deadline() {
    let (_dir, node) = node("shutdown", "shutdown_grace_s = 1\nshutdown_close_s = 1");
    let endpoint = format!("http://{}", node.grpc_addr);
    // A health watch never ends on its own.
    let channel = tonic::transport::Endpoint::from_shared(endpoint.clone()).unwrap().connect().await.unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let watch = health.watch(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap().into_inner();
    // A SubmitStream the client never half-closes, with one query answered.
    let mut client = GatewayClient::connect(endpoint).await.unwrap();
    let (sender, requests) = tokio::sync::mpsc::channel(4);
    sender.send(request("held", 4, 600_000)).await.unwrap();
    let mut replies = client.submit_stream(tokio_stream::wrappers::ReceiverStream::new(requests)).await.unwrap().into_inner();
    let first = tokio::time::timeout(Duration::from_secs(30), replies.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.query_id, "held");

    let exit = tokio::task::spawn_blocking(move || node.terminate_within(Duration::from_secs(20))).await.unwrap();
    let exit = exit.expect("the node exits within 20 s of SIGTERM");
    eprintln!("exit {exit:?} after SIGTERM with two streams held open");
    // Grace 1 s, close deadline 1 s, then the forced close: well under 10 s.
    assert!(exit < Duration::from_secs(10), "exited after {exit:?}");
    // The held stream ended with UNAVAILABLE (or the connection closed).
    let end = tokio::time::timeout(Duration::from_secs(5), replies.next()).await.expect("the stream ends");
    if let Some(Err(status)) = &end {
        assert!(matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled), "{status:?}");
    }
    drop((watch, sender));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_answers_both_the_v1_and_the_v1alpha_protocol() {
    let (_dir, node) = node("reflection", "");
    let endpoint = format!("http://{}", node.grpc_addr);
    let channel = tonic::transport::Endpoint::from_shared(endpoint).unwrap().connect().await.unwrap();
    let mut alpha = tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient::new(channel.clone());
    let ask = tonic_reflection::pb::v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let mut answers = alpha.server_reflection_info(tokio_stream::iter([ask])).await.unwrap().into_inner();
    let answer = answers.next().await.unwrap().unwrap();
    let Some(tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) = answer.message_response
    else {
        panic!("not a service list: {answer:?}");
    };
    assert!(list.service.iter().any(|s| s.name == "slogate.v1.Gateway"), "{list:?}");

    let mut v1 = tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient::new(channel);
    let ask = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(tonic_reflection::pb::v1::server_reflection_request::MessageRequest::ListServices(String::new())),
    };
    let answer = v1.server_reflection_info(tokio_stream::iter([ask])).await.unwrap().into_inner().next().await.unwrap().unwrap();
    assert!(matches!(answer.message_response, Some(tonic_reflection::pb::v1::server_reflection_response::MessageResponse::ListServicesResponse(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_answers_every_error_as_json() {
    use slogate_integration::{http, json};
    let (_dir, node) = node("admin", "clusters_per_pool_max = 2");
    let admin = node.admin_addr;
    let cases = tokio::task::spawn_blocking(move || {
        let big = "x".repeat(100 << 10);
        let token = Some("t0ken");
        vec![
            ("POST clusters beyond the cap", http(admin, "POST", "/v1/pools/default/clusters", token, r#"{"size": 16}"#)),
            ("DELETE c0", http(admin, "DELETE", "/v1/pools/default/clusters/c0", token, "")),
            ("DELETE c1, the last ready", http(admin, "DELETE", "/v1/pools/default/clusters/c1", token, "")),
            ("DELETE c1?force=maybe", http(admin, "DELETE", "/v1/pools/default/clusters/c1?force=maybe", token, "")),
            ("DELETE c1?force=true", http(admin, "DELETE", "/v1/pools/default/clusters/c1?force=true", token, "")),
            ("GET /nowhere", http(admin, "GET", "/nowhere", None, "")),
            ("DELETE /v1/pools", http(admin, "DELETE", "/v1/pools", None, "")),
            ("POST clusters [16]", http(admin, "POST", "/v1/pools/default/clusters", token, "[16]")),
            ("POST clusters 100 KB", http(admin, "POST", "/v1/pools/default/clusters", token, &big)),
            ("DELETE cluster cccc4", http(admin, "DELETE", "/v1/pools/default/clusters/cccc4", token, "")),
            ("POST clusters wrong token", http(admin, "POST", "/v1/pools/default/clusters", Some("t0kem"), r#"{"size": 8}"#)),
        ]
    })
    .await
    .unwrap();
    let expected = [409, 202, 409, 400, 202, 404, 405, 400, 413, 400, 401];
    for ((name, (status, body)), want) in cases.iter().zip(expected) {
        assert_eq!(*status, want, "{name}: {body}");
        if want == 202 {
            continue;
        }
        let body = json(body);
        assert!(body["error"].as_str().is_some_and(|e| !e.is_empty()), "{name}: {body}");
        assert!(body["code"].as_str().is_some(), "{name}: {body}");
    }
    assert!(json(&cases[0].1.1)["error"].as_str().unwrap().contains("clusters_per_pool_max"));
    assert!(json(&cases[2].1.1)["error"].as_str().unwrap().contains("needs force"));
    assert!(json(&cases[6].1.1)["error"].as_str().unwrap().contains("allowed: GET"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_crash_is_answered_from_the_durable_record_and_a_changed_retry_is_refused() {
    use slogate_integration::{http_get, json};
    let scratch_dir = scratch("idempotency");
    let config = node_config(scratch_dir.path(), "", "");
    let node = NodeProcess::start(&config);
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let first = client.submit(request("durable-1", 4, 600_000)).await.unwrap().into_inner();
    assert_eq!(first.status(), QueryStatus::Completed);
    // The Reservoir flushes at least once a second; then a crash.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    node.kill();

    let node = NodeProcess::start(&config);
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let retry = client.submit(request("durable-1", 4, 600_000)).await.unwrap().into_inner();
    assert_eq!((retry.status(), retry.latency_ms, retry.target.as_str()), (first.status(), first.latency_ms, first.target.as_str()));
    let changed = client.submit(request("durable-1", 5, 600_000)).await.unwrap_err();
    assert_eq!(changed.code(), tonic::Code::AlreadyExists, "{changed:?}");
    assert!(changed.message().contains("different template"), "{changed:?}");
    let admin = node.admin_addr;
    let (_, body) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/pools/default")).await.unwrap();
    let stats = &json(&body)["stats"];
    assert_eq!((stats["accepted"].as_u64(), stats["deduplicated"].as_u64()), (Some(0), Some(1)), "{stats}");
}

fn as_tenant<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_need_their_token_keep_their_own_ids_and_replies_and_are_throttled_with_a_hint() {
    use slogate::node::tenants::token_digest_hex;
    use slogate_integration::{http, json};
    let tenants = format!(
        "[[pool]]\nname = \"batch\"\nclusters = [8]\n[[tenant]]\nname = \"dash\"\ntoken_sha256 = \"{}\"\npools = [\"default\"]\nqueries_per_s_max = 1.0\nburst = 3.0\n[[tenant]]\nname = \"etl\"\ntoken_sha256 = \"{}\"\npools = [\"*\"]\n",
        token_digest_hex("token-dash"),
        token_digest_hex("token-etl")
    );
    let scratch_dir = scratch("tenants");
    let node = NodeProcess::start(&node_config(scratch_dir.path(), "", &tenants));
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();

    let anonymous = client.submit(request("anon", 4, 600_000)).await.unwrap_err();
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);
    let wrong = client.submit(as_tenant(request("anon", 4, 600_000), "token-dask")).await.unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);
    let other_pool = client.submit(as_tenant(SubmitRequest { pool: "batch".into(), ..request("p", 4, 600_000) }, "token-dash")).await.unwrap_err();
    assert_eq!(other_pool.code(), tonic::Code::PermissionDenied, "{other_pool:?}");

    // The same id from two tenants is two queries, each with its own reply.
    let dash = client.submit(as_tenant(request("shared", 4, 600_000), "token-dash")).await.unwrap().into_inner();
    let etl = client.submit(as_tenant(request("shared", 40, 600_000), "token-etl")).await.unwrap().into_inner();
    assert_eq!((dash.status(), etl.status()), (QueryStatus::Completed, QueryStatus::Completed));
    let etl_again = client.submit(as_tenant(request("shared", 40, 600_000), "token-etl")).await.unwrap().into_inner();
    assert_eq!((etl_again.latency_ms, &etl_again.target), (etl.latency_ms, &etl.target));
    // etl cannot read dash's reply by replaying its id and content.
    let replay = client.submit(as_tenant(request("shared", 4, 600_000), "token-etl")).await.unwrap_err();
    assert_eq!(replay.code(), tonic::Code::AlreadyExists, "{replay:?}");

    // dash: burst 3, then 1 per second; the refusal says when to retry.
    let mut throttled = None;
    for i in 0..6 {
        if let Err(status) = client.submit(as_tenant(request(&format!("burst{i}"), 4, 600_000), "token-dash")).await {
            throttled = Some(status);
            break;
        }
    }
    let throttled = throttled.expect("a burst past the tenant's rate is refused");
    assert_eq!(throttled.code(), tonic::Code::ResourceExhausted, "{throttled:?}");
    let hint: u64 = throttled.metadata().get("grpc-retry-pushback-ms").expect("a retry hint").to_str().unwrap().parse().unwrap();
    assert!((1..=1_000).contains(&hint), "hint {hint} ms");

    // The admin API shows a tenant only its own decisions, and nothing
    // without a token.
    let admin = node.admin_addr;
    let (mine, none, all) = tokio::task::spawn_blocking(move || {
        (
            http(admin, "GET", "/v1/decisions", Some("token-dash"), ""),
            http(admin, "GET", "/v1/decisions", None, ""),
            http(admin, "GET", "/v1/decisions", Some("t0ken"), ""),
        )
    })
    .await
    .unwrap();
    assert_eq!((mine.0, none.0, all.0), (200, 401, 200), "{mine:?} {none:?}");
    let mine = json(&mine.1);
    let mine = mine.as_array().unwrap();
    assert!(!mine.is_empty() && mine.iter().all(|d| d["tenant"] == "dash"), "{mine:?}");
    let all = json(&all.1);
    assert!(all.as_array().unwrap().iter().any(|d| d["tenant"] == "etl"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_grpc_a_loadgen_replay_given_the_ca_and_the_admin_api_and_plaintext_gets_nothing() {
    let certs = scratch("tls-certs");
    let dir = certs.path();
    let ca = slogate::backend::local_postgres::make_certificates(dir).expect("openssl makes a CA and a certificate (the CI installs it)");
    let (cert, key) = (dir.join("server.crt"), dir.join("server.key"));
    let node_section = format!("tls_cert_path = \"{}\"\ntls_key_path = \"{}\"\n", cert.display(), key.display());
    // The [node] keys go before [limits]: splice them in.
    let scratch_dir = scratch("tls");
    let config = node_config(scratch_dir.path(), "", "");
    let text = std::fs::read_to_string(&config).unwrap().replace("[limits]\n", &format!("{node_section}[limits]\n"));
    std::fs::write(&config, text).unwrap();
    let node = NodeProcess::start(&config);

    let pem = std::fs::read(&ca).unwrap();
    let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(&pem)).domain_name("127.0.0.1");
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", node.grpc_addr)).unwrap().tls_config(tls).unwrap().connect().await.unwrap();
    let reply = GatewayClient::new(channel).submit(request("over-tls", 4, 600_000)).await.unwrap().into_inner();
    assert_eq!(reply.status(), QueryStatus::Completed);

    // `slogate-loadgen run --ca-cert` replays over TLS, checking the
    // node's certificate against the CA it is given; without it, nothing
    // gets through.
    use slogate_loadgen::replay::{ReplayConfig, replay};
    let templates = slogate_world::catalog::tpcds_template_set();
    let mut entries = slogate_loadgen::workload::base_workload(&templates, 0.1, 1).unwrap();
    slogate_loadgen::workload::assign_slos(&mut entries, &templates, 4.0).unwrap();
    entries.truncate(30);
    let replay_config = |ca_pem: Option<Vec<u8>>| ReplayConfig {
        target: format!("https://{}", node.grpc_addr),
        pool: "default".into(),
        time_scale: 0.0,
        concurrency: 8,
        repeat: 1,
        deadline: Duration::from_secs(60),
        progress: false,
        run_id: ReplayConfig::fresh_run_id(),
        sql: None,
        ca_pem,
    };
    let report = replay(&entries, &replay_config(Some(pem.clone()))).await.unwrap();
    assert_eq!((report.submitted, report.completed), (30, 30), "{report:?}");
    let untrusted = replay(&entries, &replay_config(None)).await;
    assert!(untrusted.is_err(), "a replay got through TLS with no CA to check the node's certificate: {untrusted:?}");

    let plain = tokio::time::timeout(Duration::from_secs(10), async {
        let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await?;
        client.submit(request("plain", 4, 600_000)).await.map_err(Into::<Box<dyn std::error::Error + Send + Sync>>::into)?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
    })
    .await;
    assert!(!matches!(plain, Ok(Ok(()))), "a plaintext call went through a TLS port");

    let admin = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", "--cacert"])
        .arg(&ca)
        .arg(format!("https://{}/healthz", node.admin_addr))
        .output()
        .expect("curl runs (the CI installs it)");
    assert!(admin.status.success(), "{}", String::from_utf8_lossy(&admin.stderr));
    assert!(String::from_utf8_lossy(&admin.stdout).contains("ok"), "{}", String::from_utf8_lossy(&admin.stdout));
}

/// `slogate serve` on `config` with `flags`, run until it exits (at most
/// 60 s); returns its exit code and what it wrote to stderr.
fn serve_until_exit(config: &std::path::Path, flags: &[&str]) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(slogate_integration::slogate_binary())
        .args(["serve", "--config"])
        .arg(config)
        .args(flags)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(60), "slogate serve on a damaged store did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (child.wait().unwrap().code(), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_keeps_the_reservoir_to_its_last_flush_and_a_damaged_store_is_a_clear_error_until_repaired() {
    use slogate_integration::{http_get, json};
    let scratch_dir = scratch("crash");
    let config = node_config(scratch_dir.path(), "", "");
    let data = config.parent().unwrap().join("data").join("reservoir");
    let node = NodeProcess::start(&config);
    let admin = node.admin_addr;
    let executions = move || json(&http_get(admin, "/v1/actors").1)["reservoir"]["executions"].as_u64().unwrap();
    let submit_many = |prefix: &'static str, count: usize| {
        let addr = node.grpc_addr;
        tokio::spawn(async move {
            let client = GatewayClient::connect(format!("http://{addr}")).await.unwrap();
            let calls: Vec<_> = (0..count)
                .map(|i| {
                    let mut client = client.clone();
                    tokio::spawn(async move { client.submit(request(&format!("{prefix}-{i}"), 1 + (i % 5) as u32, 600_000)).await })
                })
                .collect();
            let mut answers = Vec::with_capacity(count);
            for call in calls {
                answers.push(call.await.unwrap());
            }
            answers
        })
    };
    // Phase 1: a burst, answered, then one flush interval.
    let answers = submit_many("before", 400).await.unwrap();
    let completed = answers.iter().filter(|a| a.as_ref().is_ok_and(|r| r.get_ref().status() == QueryStatus::Completed)).count();
    assert_eq!(completed, 400);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let flushed = tokio::task::spawn_blocking(executions).await.unwrap();
    assert!(flushed >= 400, "{flushed}");
    // Phase 2: kill -9 with queries in flight.
    let in_flight = submit_many("during", 2_000);
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.kill();
    let _ = in_flight.await;

    let node = NodeProcess::start(&config);
    let admin = node.admin_addr;
    let after = tokio::task::spawn_blocking(move || json(&http_get(admin, "/v1/actors").1)["reservoir"]["executions"].as_u64().unwrap())
        .await
        .unwrap();
    assert!(after >= flushed, "the log lost flushed executions: {after} < {flushed}");
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();
    let first = answers[7].as_ref().unwrap().get_ref().clone();
    let retry = client.submit(request("before-7", 1 + 7 % 5, 600_000)).await.unwrap().into_inner();
    assert_eq!((retry.status(), retry.latency_ms, retry.target.clone()), (first.status(), first.latency_ms, first.target.clone()));
    assert!(node.terminate().iter().all(|l| !l.contains("ERROR")));

    // Damage: sled's snapshots gone, and its log and the execution log's
    // newest segment cut in half.
    for entry in std::fs::read_dir(&data).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("snap.")) {
            std::fs::remove_file(path).unwrap();
        }
    }
    let mut segments: Vec<_> = std::fs::read_dir(data.join("executions-log")).unwrap().map(|e| e.unwrap().path()).collect();
    segments.sort();
    for file in [data.join("db"), segments.pop().expect("the node logged executions")] {
        let length = std::fs::metadata(&file).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(length / 2).unwrap();
    }
    let (code, stderr) = tokio::task::spawn_blocking({
        let config = config.clone();
        move || serve_until_exit(&config, &[])
    })
    .await
    .unwrap();
    eprintln!("a damaged store, exit {code:?}: {}", stderr.trim());
    assert_ne!(code, Some(0), "a damaged store must not start: {stderr}");
    assert!(stderr.contains("damaged") && stderr.contains("--repair"), "{stderr}");

    let node = NodeProcess::start_with(&config, &["--repair"]);
    assert!(node.logged_at_start().iter().any(|l| l.contains("Reservoir repaired")), "{:?}", node.logged_at_start());
    node.terminate();
    let node = NodeProcess::start(&config);
    assert!(node.logged_at_start().iter().all(|l| !l.contains("repaired")));
    node.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_or_whose_deadline_passes_has_its_query_cancelled_on_the_emulated_warehouse() {
    use slogate_integration::{http_get, json};
    // Real time: a TPC-DS template runs for seconds on the emulated warehouse.
    let scratch_dir = scratch("disconnect");
    let config = node_config(scratch_dir.path(), "", "");
    let text = std::fs::read_to_string(&config).unwrap().replace("time_compression = 20000.0", "time_compression = 1.0");
    std::fs::write(&config, text).unwrap();
    let node = NodeProcess::start(&config);
    let admin = node.admin_addr;
    let pool = move || json(&http_get(admin, "/v1/pools/default").1);
    let mut client = GatewayClient::connect(format!("http://{}", node.grpc_addr)).await.unwrap();

    let mut with_deadline = tonic::Request::new(request("deadline", 4, 600_000));
    with_deadline.set_timeout(Duration::from_millis(300));
    let status = client.submit(with_deadline).await.unwrap_err();
    assert!(matches!(status.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled), "{status:?}");
    let mut dropping = client.clone();
    let call = tokio::spawn(async move { dropping.submit(request("dropped", 4, 600_000)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    call.abort();

    // Both are cancelled on the warehouse long before they would finish.
    let started = std::time::Instant::now();
    let settled = loop {
        let state = tokio::task::spawn_blocking(pool).await.unwrap();
        if state["in_flight"].as_u64() == Some(0) {
            break state;
        }
        assert!(started.elapsed() < Duration::from_secs(5), "still in flight 5 s after the clients left: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(settled["stats"]["failed"].as_u64(), Some(2), "{settled}");
    assert_eq!(settled["stats"]["completed"].as_u64(), Some(0), "{settled}");
    assert!(settled["clusters"].as_array().unwrap().iter().all(|c| c["running"].as_array().unwrap().is_empty()), "{settled}");
}
