//! Several `slogate serve` processes as one deployment: pools owned by
//! rendezvous over the live members on etcd, any node accepting any
//! query, failover when an owner is killed, a partition from etcd, a node
//! joining, and a static member list without etcd. Every server (etcd and
//! the nodes) is started here, on loopback.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use slogate_integration::{CuttableProxy, EtcdProcess, NodeProcess, free_port, http_get, json};
use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest};

const POOLS: [&str; 4] = ["p0", "p1", "p2", "p3"];
const LEASE_TTL_S: u64 = 2;

/// A test's directory, removed when it drops (after the nodes, which
/// the test declares later and so drops first).
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-fleet-{name}-")).tempdir().unwrap()
}

/// A node's configuration: four pools, time compressed 200× (a query of
/// ten virtual seconds takes 50 ms), and the given `[fleet]` body.
fn node_config(dir: &Path, id: &str, grpc_addr: &str, fleet: &str) -> PathBuf {
    let data = dir.join(id);
    std::fs::create_dir_all(&data).unwrap();
    let mut text = format!(
        "version = \"1\"\n[node]\ngrpc_addr = \"{grpc_addr}\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 200.0\nadmin_token = \"t0ken\"\n[fleet]\nnode_id = \"{id}\"\n{fleet}\n",
        data.join("data").display()
    );
    for pool in POOLS {
        text.push_str(&format!("[[pool]]\nname = \"{pool}\"\nclusters = [16, 16]\n"));
    }
    let path = data.join("node.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn etcd_fleet(endpoint: &str) -> String {
    format!("etcd_endpoints = [\"{endpoint}\"]\nlease_ttl_s = {LEASE_TTL_S}\npoll_interval_ms = 100\nfailover_wait_s = 20\ndrain_max_s = 5\n")
}

async fn fleet_view(admin: SocketAddr) -> serde_json::Value {
    let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/fleet")).await.unwrap();
    assert_eq!(status, 200, "{body}");
    json(&body)
}

fn owned(view: &serde_json::Value) -> BTreeSet<String> {
    view["owned"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()).collect()
}

/// Waits (at most `limit`) until the nodes at `admins` together own every
/// pool, each pool once, with `members` members each; returns the owners.
async fn settled(admins: &[SocketAddr], members: usize, limit: Duration) -> BTreeMap<String, String> {
    let started = Instant::now();
    loop {
        let mut owners = BTreeMap::new();
        let mut views_agree = true;
        // The views are read one after another, so a handover between two
        // reads can show a pool at both nodes. Two rounds of reads rule that
        // out: a node that owns a pool in both of its reads owned it all the
        // time between them, and so did any other node that owns it in both
        // of its own; whichever was read first owned it when the other was.
        let first: Vec<(String, BTreeSet<String>)> = read_owners(admins).await;
        let second: Vec<(String, BTreeSet<String>)> = read_owners(admins).await;
        let held: Vec<(&String, BTreeSet<&String>)> = first.iter().zip(&second).map(|((node, a), (_, b))| (node, a.intersection(b).collect())).collect();
        for (i, (node, pools)) in held.iter().enumerate() {
            for (other, theirs) in &held[i + 1..] {
                let both: Vec<_> = pools.intersection(theirs).collect();
                assert!(both.is_empty(), "{both:?} owned by {node} and {other} at once");
            }
        }
        for admin in admins {
            let view = fleet_view(*admin).await;
            views_agree &= view["members"].as_object().unwrap().len() == members;
            for pool in owned(&view) {
                owners.insert(pool, view["node_id"].as_str().unwrap().to_owned());
            }
        }
        if views_agree && owners.len() == POOLS.len() {
            return owners;
        }
        assert!(started.elapsed() < limit, "the fleet did not settle within {limit:?}: {owners:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Each node's id and the pools it owns, read one node after another.
async fn read_owners(admins: &[SocketAddr]) -> Vec<(String, BTreeSet<String>)> {
    let mut read = Vec::new();
    for admin in admins {
        let view = fleet_view(*admin).await;
        read.push((view["node_id"].as_str().unwrap().to_owned(), owned(&view)));
    }
    read
}

fn request(id: &str, pool: &str, template: u32) -> SubmitRequest {
    SubmitRequest { pool: pool.into(), query_id: id.into(), query: Some(Query::Template(template)), slo_ms: 600_000, ..Default::default() }
}

/// Submits `request` to the nodes in turn from `first`, the same id each
/// time, until one answers or 30 s pass, as a client with several gateway
/// addresses does on a retryable status. Returns the reply and the
/// attempts it took.
async fn submit_with_retries(nodes: &[SocketAddr], first: usize, request: SubmitRequest) -> (slogate_proto::v1::SubmitResponse, u32) {
    let started = Instant::now();
    let mut attempts = 0;
    let mut last = None;
    while started.elapsed() < Duration::from_secs(30) {
        let addr = nodes[(first + attempts as usize) % nodes.len()];
        attempts += 1;
        let call = async {
            let mut client = GatewayClient::connect(format!("http://{addr}")).await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(Duration::from_secs(20));
            client.submit(call).await
        };
        match call.await {
            Ok(reply) => return (reply.into_inner(), attempts),
            Err(status) if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled) => {
                last = Some(status);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("query {} refused for good: {status:?}", request.query_id),
        }
    }
    panic!("query {} unanswered after 30 s and {attempts} attempts: {last:?}", request.query_id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_on_etcd_answer_through_any_node_fail_over_within_two_ttls_and_take_in_a_joining_node() {
    let scratch_dir = scratch("failover");
    let dir = scratch_dir.path();
    let etcd = EtcdProcess::start(&dir.join("etcd"));
    let fleet = etcd_fleet(&etcd.client_url);
    let mut nodes: Vec<Option<NodeProcess>> =
        (0..3).map(|i| Some(NodeProcess::start(&node_config(dir, &format!("n{i}"), "127.0.0.1:0", &fleet)))).collect();
    let admins: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.admin_addr).collect();
    let owners = settled(&admins, 3, Duration::from_secs(20)).await;
    let distinct: BTreeSet<&String> = owners.values().collect();
    assert!(distinct.len() >= 2, "rendezvous spread 4 pools over 3 nodes: {owners:?}");

    // 1. Every node answers every pool's queries: 120 queries, each sent to
    //    one node, most of them owned elsewhere.
    let grpc: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.grpc_addr).collect();
    let tasks: Vec<_> = (0..120u32)
        .map(|i| {
            let grpc = grpc.clone();
            tokio::spawn(async move {
                let pool = POOLS[i as usize % POOLS.len()];
                submit_with_retries(&grpc, i as usize % 3, request(&format!("warm-{i}"), pool, 1 + i % 99)).await
            })
        })
        .collect();
    let mut warm_replies = Vec::new();
    for task in tasks {
        let (reply, attempts) = task.await.unwrap();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        assert_eq!(attempts, 1, "no failure yet, so no retry: {reply:?}");
        warm_replies.push(reply);
    }
    let mut forwarded = 0;
    for admin in &admins {
        let view = fleet_view(*admin).await;
        forwarded += view["reports"][view["node_id"].as_str().unwrap()]["forwarded"].as_u64().unwrap();
    }
    assert!(forwarded >= 60, "most queries went to a node that does not own their pool: {forwarded} forwarded");

    // 2. Under load through all three nodes (p0 the busiest), kill -9 the
    //    owner of p0.
    let victim_id = owners["p0"].clone();
    let mut victim = None;
    for (i, node) in nodes.iter().enumerate() {
        if fleet_view(node.as_ref().unwrap().admin_addr).await["node_id"] == victim_id.as_str() {
            victim = Some(i);
        }
    }
    let victim = victim.expect("p0's owner is one of the nodes");
    let load: Vec<_> = (0..600u32)
        .map(|i| {
            let grpc = grpc.clone();
            tokio::spawn(async move {
                // Spread over 6 s; half of them to p0.
                tokio::time::sleep(Duration::from_millis(u64::from(i) * 10)).await;
                let pool = if i % 2 == 0 { "p0" } else { POOLS[1 + (i as usize / 2) % 3] };
                submit_with_retries(&grpc, i as usize % 3, request(&format!("load-{i}"), pool, 1 + i % 99)).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(2)).await;
    nodes[victim].take().unwrap().kill();
    let killed_at = Instant::now();
    let survivors: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.admin_addr).collect();
    let takeover = loop {
        let mut routed = false;
        for admin in &survivors {
            routed |= owned(&fleet_view(*admin).await).contains("p0");
        }
        if routed {
            break killed_at.elapsed();
        }
        assert!(killed_at.elapsed() < Duration::from_secs(20), "nobody took p0 within 20 s of its owner's death");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("measured: p0 routed by a new owner {:.2} s after its owner was killed (TTL {LEASE_TTL_S} s)", takeover.as_secs_f64());
    // The new owner rebuilt p0's policy on its execution log.
    let mut relearned = 0;
    for admin in &survivors {
        let view = fleet_view(*admin).await;
        if owned(&view).contains("p0") {
            relearned = view["relearned"]["p0"].as_u64().unwrap_or(0);
        }
    }
    eprintln!("measured: the new owner of p0 learned from {relearned} executions at takeover");
    assert!(relearned > 0, "the new owner took p0 over with a policy learned from its log");
    assert!(takeover <= Duration::from_secs(2 * LEASE_TTL_S), "takeover took {takeover:?}, over 2 × TTL");

    // A retry of a p0 query that a survivor accepted and the dead owner ran
    // is answered from the survivor's record: the same reply, no second run.
    let mut recalled = 0;
    for (i, reply) in warm_replies.iter().enumerate().filter(|(i, _)| i % POOLS.len() == 0) {
        let accepted_by = i % 3;
        if accepted_by == victim {
            continue;
        }
        let mut client = GatewayClient::connect(format!("http://{}", grpc[accepted_by])).await.unwrap();
        let again = client.submit(request(&format!("warm-{i}"), "p0", 1 + i as u32 % 99)).await.unwrap().into_inner();
        assert_eq!((again.status, &again.target, &again.explanation), (reply.status, &reply.target, &reply.explanation), "warm-{i}");
        assert!((again.latency_ms - reply.latency_ms).abs() < 0.01, "warm-{i} ran again: {again:?} vs {reply:?}");
        recalled += 1;
    }
    assert!(recalled >= 10, "{recalled} retries checked");

    // 3. A node joins under the same load and takes its share.
    let joiner = NodeProcess::start(&node_config(dir, "n3", "127.0.0.1:0", &fleet));
    let mut admins: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.admin_addr).collect();
    admins.push(joiner.admin_addr);
    let owners = settled(&admins, 3, Duration::from_secs(20)).await;
    eprintln!("owners after the join: {owners:?}");

    // 4. Every accepted query was answered; the ones caught by the kill
    //    were answered on a retry.
    let mut retried = 0;
    for task in load {
        let (reply, attempts) = task.await.unwrap();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        retried += u32::from(attempts > 1);
    }
    let mut reforwarded = 0;
    for admin in &admins {
        reforwarded += fleet_view(*admin).await["reforwarded"].as_u64().unwrap();
    }
    eprintln!("measured: {retried} of 600 queries needed a client retry (sent to the killed node); survivors re-sent {reforwarded} forwards themselves");
    let joined = fleet_view(joiner.admin_addr).await;
    eprintln!("the joiner's moves: {}", joined["moves"]);
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_etcd_stops_routing_within_the_ttl_and_never_overlaps_the_next_owner() {
    let scratch_dir = scratch("partition");
    let dir = scratch_dir.path();
    let etcd = EtcdProcess::start(&dir.join("etcd"));
    let proxy = CuttableProxy::start(etcd.client_addr);
    let cut_node = NodeProcess::start(&node_config(dir, "a", "127.0.0.1:0", &etcd_fleet(&format!("http://{}", proxy.addr))));
    let other = NodeProcess::start(&node_config(dir, "b", "127.0.0.1:0", &etcd_fleet(&etcd.client_url)));
    let admins = [cut_node.admin_addr, other.admin_addr];
    let owners = settled(&admins, 2, Duration::from_secs(20)).await;
    let owned_by_a: BTreeSet<String> = owners.iter().filter(|(_, o)| *o == "a").map(|(p, _)| p.clone()).collect();
    assert!(!owned_by_a.is_empty(), "rendezvous gave node a some pools: {owners:?}");

    proxy.cut();
    let cut_at = Instant::now();
    let mut a_stopped = None;
    let mut b_took_all = None;
    // Sample both views until b owns every pool; never may both own one.
    while b_took_all.is_none() {
        let a = owned(&fleet_view(cut_node.admin_addr).await);
        let b = owned(&fleet_view(other.admin_addr).await);
        let both: Vec<_> = a.intersection(&b).collect();
        assert!(both.is_empty(), "{both:?} routed by both nodes {:?} after the cut", cut_at.elapsed());
        if a.is_empty() && a_stopped.is_none() {
            a_stopped = Some(cut_at.elapsed());
        }
        if b.len() == POOLS.len() {
            b_took_all = Some(cut_at.elapsed());
        }
        assert!(cut_at.elapsed() < Duration::from_secs(20), "b did not take a's pools within 20 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let a_stopped = a_stopped.expect("a stopped before b took everything");
    eprintln!(
        "measured: the cut-off node stopped routing {:.2} s after the cut, the other owned every pool {:.2} s after it (TTL {LEASE_TTL_S} s)",
        a_stopped.as_secs_f64(),
        b_took_all.unwrap().as_secs_f64()
    );
    assert!(a_stopped <= Duration::from_secs(LEASE_TTL_S), "a kept routing for {a_stopped:?}, past its TTL");

    // Queries through the cut-off node still complete: it forwards them.
    let mut client = GatewayClient::connect(format!("http://{}", cut_node.grpc_addr)).await.unwrap();
    for (i, pool) in POOLS.iter().enumerate() {
        let reply = client.submit(request(&format!("cut-{i}"), pool, 5)).await.unwrap().into_inner();
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
    }

    // Healed, a rejoins and takes its pools back from b after b drains them:
    // a settled fleet (two members, every pool owned) may still show one of
    // them at b, mid-handover, so it is read until the handovers are done.
    proxy.heal();
    let healed_at = Instant::now();
    loop {
        let owners = settled(&admins, 2, Duration::from_secs(20)).await;
        let back: BTreeSet<String> = owners.iter().filter(|(_, o)| *o == "a").map(|(p, _)| p.clone()).collect();
        if back == owned_by_a {
            break;
        }
        assert!(healed_at.elapsed() < Duration::from_secs(20), "rendezvous gives a the same pools again: a owns {back:?}, not {owned_by_a:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_list_splits_the_pools_and_forwards_between_two_nodes() {
    let scratch_dir = scratch("static");
    let dir = scratch_dir.path();
    let ports = [free_port(), free_port()];
    let members = format!(
        "[[fleet.member]]\nid = \"s0\"\ngrpc_addr = \"127.0.0.1:{}\"\n[[fleet.member]]\nid = \"s1\"\ngrpc_addr = \"127.0.0.1:{}\"\n",
        ports[0], ports[1]
    );
    let nodes: Vec<NodeProcess> =
        (0..2).map(|i| NodeProcess::start(&node_config(dir, &format!("s{i}"), &format!("127.0.0.1:{}", ports[i]), &members))).collect();
    let admins: Vec<SocketAddr> = nodes.iter().map(|n| n.admin_addr).collect();
    let owners = settled(&admins, 2, Duration::from_secs(10)).await;
    // The split is rendezvous hashing's, as `slogate_core::ownership` computes it.
    for (pool, owner) in &owners {
        assert_eq!(Some(owner.as_str()), slogate_core::ownership::owner(pool, ["s0", "s1"]), "{pool}");
    }
    let grpc: Vec<SocketAddr> = nodes.iter().map(|n| n.grpc_addr).collect();
    let mut elsewhere = 0;
    for i in 0..16u32 {
        let (pool, node) = (POOLS[i as usize % 4], format!("s{}", i % 2));
        elsewhere += u64::from(owners[pool] != node);
        let (reply, attempts) = submit_with_retries(&grpc, i as usize % 2, request(&format!("s-{i}"), POOLS[i as usize % 4], 1 + i)).await;
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
        assert_eq!(attempts, 1);
    }
    let forwarded: u64 = {
        let mut total = 0;
        for admin in &admins {
            let view = fleet_view(*admin).await;
            assert_eq!(view["mode"], "static");
            total += view["reports"][view["node_id"].as_str().unwrap()]["forwarded"].as_u64().unwrap();
        }
        total
    };
    assert_eq!(forwarded, elsewhere, "each query sent to the node that does not own its pool was forwarded once");
    assert!(elsewhere > 0);
    // The console shows the fleet: both members and every pool's owner.
    let url = format!("http://{}/ui", admins[0]);
    let dom = tokio::task::spawn_blocking(move || slogate_integration::browser::dom(&url, 3_000)).await.unwrap();
    let fleet = dom.split("id=\"fleet\"").nth(1).expect("the fleet view is there");
    assert!(!dom.contains("<section id=\"fleet-section\" hidden"), "the fleet view is shown");
    assert!(fleet.contains("s0 (this node)") && fleet.contains("<td>s1</td>"), "both members listed: {fleet}");
    for (pool, owner) in &owners {
        assert!(fleet.contains(&format!("<td>{pool}</td><td>{owner}</td>")), "{pool}'s owner {owner} shown: {fleet}");
    }
    // Any node shows a pool's actors from its owner.
    for admin in &admins {
        for (pool, owner) in &owners {
            let (admin, path) = (*admin, format!("/v1/actors?pool={pool}"));
            let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, &path)).await.unwrap();
            assert_eq!(status, 200, "{body}");
            let actors = json(&body);
            assert_eq!(actors["node"], owner.as_str(), "{pool}: {actors}");
            assert_eq!(actors["pool"]["id"], pool.as_str());
            assert!(actors["cluster_trackers"].as_array().is_some_and(|t| !t.is_empty()), "{actors}");
        }
        let admin = *admin;
        let (status, body) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/actors?pool=nope")).await.unwrap();
        assert_eq!((status, json(&body)["code"].as_str()), (404, Some("NOT_FOUND")), "{body}");
    }
    // Node/ForwardStream: p0's owner runs what is forwarded to it and
    // returns each execution; the other node refuses each query as not the
    // owner.
    let owner = if owners["p0"] == "s0" { 0 } else { 1 };
    for (node, runs) in [(owner, true), (1 - owner, false)] {
        let mut client = slogate_proto::v1::node_client::NodeClient::connect(format!("http://{}", grpc[node])).await.unwrap();
        let forwards: Vec<slogate_proto::v1::ForwardRequest> = (0..3)
            .map(|i| slogate_proto::v1::ForwardRequest {
                request: Some(request(&format!("stream-{node}-{i}"), "p0", 4 + i)),
                from_node: "test".into(),
                ..Default::default()
            })
            .collect();
        let mut replies = client.forward_stream(tokio_stream::iter(forwards)).await.unwrap().into_inner();
        let mut answered = 0;
        while let Some(reply) = replies.message().await.unwrap() {
            let response = reply.reply.unwrap();
            if runs {
                assert_eq!(response.status(), QueryStatus::Completed, "{response:?}");
                assert!(reply.execution.is_some_and(|e| e.latency_us > 0 && e.size_rpu == 16));
            } else {
                assert_eq!(response.status(), QueryStatus::Rejected, "{response:?}");
                assert_eq!(response.error_code, tonic::Code::FailedPrecondition as i32);
                assert!(response.explanation.contains("is not the owner of pool `p0`"), "{response:?}");
            }
            answered += 1;
        }
        assert_eq!(answered, 3);
    }
    // The owners logged all 16 executions and the 3 sent on the stream
    // above, and each accepting node kept a copy of those it forwarded.
    let started = Instant::now();
    loop {
        let mut logged = 0;
        for admin in &admins {
            let admin = *admin;
            let (_, body) = tokio::task::spawn_blocking(move || http_get(admin, "/v1/actors")).await.unwrap();
            logged += json(&body)["reservoir"]["executions"].as_u64().unwrap();
        }
        if logged == 16 + 3 + elsewhere {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{logged} executions logged, expected {}", 16 + 3 + elsewhere);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The README's Python client (stock grpcio), one call: its JSON output and
/// whether the call succeeded.
fn python_submit(target: SocketAddr, args: &[&str]) -> (serde_json::Value, bool) {
    let python = std::env::var("SLOGATE_PYTHON").unwrap_or_else(|_| "python3".into());
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/clients/submit.py");
    let output = std::process::Command::new(python).arg(&client).args(["--target", &target.to_string()]).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let reply = serde_json::from_str(&stdout).unwrap_or_else(|_| panic!("client printed no JSON: {stdout}{}", String::from_utf8_lossy(&output.stderr)));
    (reply, output.status.success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpcio_client_spread_over_three_nodes_sees_what_one_node_answers() {
    let scratch_dir = scratch("grpcio");
    let dir = scratch_dir.path();
    let ports = [free_port(), free_port(), free_port()];
    let members: String = (0..3).map(|i| format!("[[fleet.member]]\nid = \"g{i}\"\ngrpc_addr = \"127.0.0.1:{}\"\n", ports[i])).collect();
    let nodes: Vec<NodeProcess> =
        (0..3).map(|i| NodeProcess::start(&node_config(dir, &format!("g{i}"), &format!("127.0.0.1:{}", ports[i]), &members))).collect();
    // The same pools on one node alone (an empty [fleet]).
    let alone = NodeProcess::start(&node_config(dir, "", "127.0.0.1:0", ""));
    let grpc: Vec<SocketAddr> = nodes.iter().map(|n| n.grpc_addr).collect();
    let alone_addr = alone.grpc_addr;
    tokio::task::spawn_blocking(move || {
        // Every pool through every node completes, as on one node.
        for (i, pool) in POOLS.iter().enumerate() {
            for (k, node) in grpc.iter().chain([&alone_addr]).enumerate() {
                let (reply, ok) = python_submit(*node, &["--pool", pool, "--template", &(7 + i).to_string(), "--slo-ms", "600000", "--query-id", &format!("py-{i}-{k}")]);
                assert!(ok, "{reply}");
                assert_eq!(reply["status"], "QUERY_STATUS_COMPLETED", "{reply}");
                assert!(reply["target"].as_str().unwrap().starts_with('c'), "{reply}");
            }
        }
        // A retry through another node gets the same reply.
        let (first, _) = python_submit(grpc[0], &["--pool", "p1", "--template", "9", "--slo-ms", "600000", "--query-id", "py-retry"]);
        let (again, _) = python_submit(grpc[2], &["--pool", "p1", "--template", "9", "--slo-ms", "600000", "--query-id", "py-retry"]);
        assert_eq!(first, again);
        // Bad input gets the same status and message from any node as from one.
        for (args, code) in [
            (vec!["--pool", "p2", "--template", "3", "--slo-ms", "0"], "INVALID_ARGUMENT"),
            (vec!["--pool", "nope", "--template", "3", "--slo-ms", "1000"], "NOT_FOUND"),
        ] {
            let (expected, ok) = python_submit(alone_addr, &args);
            assert!(!ok);
            assert_eq!(expected["error"], code);
            for node in &grpc {
                let (reply, node_ok) = python_submit(*node, &args);
                assert!(!node_ok);
                assert_eq!(reply, expected, "{args:?}");
            }
        }
    })
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_s_tuned_configuration_and_cluster_layout_survive_its_owner() {
    let scratch_dir = scratch("tuned");
    let dir = scratch_dir.path();
    let etcd = EtcdProcess::start(&dir.join("etcd"));
    let config = |id: &str| {
        let data = dir.join(id);
        std::fs::create_dir_all(&data).unwrap();
        let text = format!(
            "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:0\"\nadmin_addr = \"127.0.0.1:0\"\ndata_dir = \"{}\"\ntime_compression = 2000.0\nadmin_token = \"t0ken\"\n\
             [fleet]\nnode_id = \"{id}\"\n{}\
             [[pool]]\nname = \"t\"\npolicy = \"slogate\"\nclusters = [4]\n\
             [pool.autoscale]\nenabled = true\n\
             [pool.tune]\nenabled = true\nevery_hours = 0.0\nhistory_days = 1\nscenarios = 4\nstrategy = \"random\"\nbudget = 2\nrounds = 1\nthreads = 1\n",
            data.join("data").display(),
            etcd_fleet(&etcd.client_url)
        );
        let path = data.join("node.toml");
        std::fs::write(&path, text).unwrap();
        path
    };
    let mut nodes = [Some(NodeProcess::start(&config("ta"))), Some(NodeProcess::start(&config("tb")))];
    let owner_of_t = || async {
        for (i, node) in nodes.iter().enumerate() {
            if let Some(node) = node
                && owned(&fleet_view(node.admin_addr).await).contains("t")
            {
                return Some(i);
            }
        }
        None
    };
    let started = Instant::now();
    let owner = loop {
        if let Some(owner) = owner_of_t().await {
            break owner;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "nobody owns t");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let other = 1 - owner;

    // Today's arrivals, through both nodes, are the history the owner's
    // tuner forecasts tomorrow from.
    let grpc: Vec<SocketAddr> = nodes.iter().flatten().map(|n| n.grpc_addr).collect();
    for i in 0..30u32 {
        let (reply, _) = submit_with_retries(&grpc, i as usize % 2, request(&format!("t{i}"), "t", 1 + i % 10)).await;
        assert!(matches!(reply.status(), QueryStatus::Completed | QueryStatus::TimedOut), "{reply:?}");
    }
    let owner_admin = nodes[owner].as_ref().unwrap().admin_addr;
    let other_admin = nodes[other].as_ref().unwrap().admin_addr;
    // Only the owner decides for the pool: the other node's Autoscaler and
    // Tuner stand by.
    let actors = |admin: SocketAddr| async move { json(&tokio::task::spawn_blocking(move || http_get(admin, "/v1/actors")).await.unwrap().1) };
    assert_eq!(actors(owner_admin).await["autoscalers"]["t"]["deciding"], true);
    assert_eq!(actors(other_admin).await["autoscalers"]["t"]["deciding"], false);
    let (status, body) =
        tokio::task::spawn_blocking(move || slogate_integration::http(other_admin, "POST", "/v1/pools/t/tune", Some("t0ken"), "")).await.unwrap();
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("does not own pool"), "{body}");
    let (status, body) =
        tokio::task::spawn_blocking(move || slogate_integration::http(owner_admin, "POST", "/v1/pools/t/tune", Some("t0ken"), "")).await.unwrap();
    assert_eq!(status, 202, "{body}");
    let tuned = loop {
        let state = actors(owner_admin).await;
        if state["tuners"]["t"]["runs"].as_u64() >= Some(1) {
            break state["tuners"]["t"]["active"].clone();
        }
        assert!(started.elapsed() < Duration::from_secs(120), "the tuner did not finish: {}", state["tuners"]["t"]);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(tuned.is_object(), "{tuned}");
    // The operator adds a cluster on the owner: the layout is now [4, 8].
    let (status, body) = tokio::task::spawn_blocking(move || slogate_integration::http(owner_admin, "POST", "/v1/pools/t/clusters", Some("t0ken"), r#"{"size": 8}"#))
        .await
        .unwrap();
    assert!(status == 201 || status == 202 || status == 200, "{status} {body}");
    // The owner publishes both within a second or so; then it dies.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    nodes[owner].take().unwrap().kill();

    let killed_at = Instant::now();
    loop {
        if owned(&fleet_view(other_admin).await).contains("t") {
            break;
        }
        assert!(killed_at.elapsed() < Duration::from_secs(20), "the survivor did not take t");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let state = actors(other_admin).await;
    assert_eq!(state["tuners"]["t"]["active"], tuned, "the new owner's configuration in force is the one the old owner chose");
    assert_eq!(state["autoscalers"]["t"]["tuning"]["source"], "fleet (adopted)", "{}", state["autoscalers"]["t"]);
    assert_eq!(state["autoscalers"]["t"]["deciding"], true, "the new owner decides now");
    let (_, body) = tokio::task::spawn_blocking(move || http_get(other_admin, "/v1/pools/t")).await.unwrap();
    let pool = json(&body);
    let mut sizes: Vec<u64> = pool["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] != "draining" && c["state"] != "gone")
        .map(|c| c["size"].as_u64().unwrap())
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [4, 8], "the new owner runs the old owner's layout: {pool}");
    drop(etcd);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_serving_tls_forward_to_each_other_over_tls() {
    let scratch_dir = scratch("tls");
    let dir = scratch_dir.path();
    let certificates = dir.join("certificates");
    std::fs::create_dir_all(&certificates).unwrap();
    let ca = slogate::backend::local_postgres::make_certificates(&certificates).expect("openssl makes a CA and a certificate (the CI installs it)");
    let (cert, key) = (certificates.join("server.crt"), certificates.join("server.key"));
    let ports = [free_port(), free_port()];
    let fleet = format!(
        "ca_path = \"{}\"\n[[fleet.member]]\nid = \"x0\"\ngrpc_addr = \"127.0.0.1:{}\"\n[[fleet.member]]\nid = \"x1\"\ngrpc_addr = \"127.0.0.1:{}\"\n",
        ca.display(),
        ports[0],
        ports[1]
    );
    let nodes: Vec<NodeProcess> = (0..2)
        .map(|i| {
            let path = node_config(dir, &format!("x{i}"), &format!("127.0.0.1:{}", ports[i]), &fleet);
            // The [node] keys go before [fleet]: splice TLS in.
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("[fleet]\n", &format!("tls_cert_path = \"{}\"\ntls_key_path = \"{}\"\n[fleet]\n", cert.display(), key.display()));
            std::fs::write(&path, text).unwrap();
            NodeProcess::start(&path)
        })
        .collect();
    let pem = std::fs::read(&ca).unwrap();
    for node in &nodes {
        let tls = tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(&pem)).domain_name("127.0.0.1");
        let channel = tonic::transport::Endpoint::from_shared(format!("https://{}", node.grpc_addr)).unwrap().tls_config(tls).unwrap().connect().await.unwrap();
        let mut client = GatewayClient::new(channel);
        // Every pool through each node: half of them forwarded, over TLS.
        for pool in POOLS {
            let reply = client.submit(request(&format!("tls-{pool}-{}", node.grpc_addr.port()), pool, 5)).await.unwrap().into_inner();
            assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
        }
    }
    // The admin API is on TLS too; each node's fleet view asks the other
    // over the Node service, over TLS.
    let mut forwarded = 0;
    for node in &nodes {
        let output = std::process::Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&ca)
            .arg(format!("https://{}/v1/fleet", node.admin_addr))
            .output()
            .expect("curl runs (the CI installs it)");
        let view = json(&String::from_utf8_lossy(&output.stdout));
        let other = if view["node_id"] == "x0" { "x1" } else { "x0" };
        assert!(view["reports"][other]["error"].is_null(), "{view}");
        forwarded += view["reports"][view["node_id"].as_str().unwrap()]["forwarded"].as_u64().unwrap();
    }
    assert_eq!(forwarded, POOLS.len() as u64, "each node forwarded the pools the other owns");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_reaches_etcd_over_tls() {
    let scratch_dir = scratch("etcd-tls");
    let dir = scratch_dir.path();
    let certificates = dir.join("certificates");
    std::fs::create_dir_all(&certificates).unwrap();
    let ca = slogate::backend::local_postgres::make_certificates(&certificates).expect("openssl makes a CA and a certificate (the CI installs it)");
    let tls = slogate_integration::EtcdTls { cert: certificates.join("server.crt"), key: certificates.join("server.key"), ca: ca.clone() };
    let etcd = EtcdProcess::start_tls(&dir.join("etcd"), &tls);
    assert!(etcd.client_url.starts_with("https://"));
    let fleet = format!("{}etcd_ca_path = \"{}\"\n", etcd_fleet(&etcd.client_url), ca.display());
    let nodes: Vec<NodeProcess> = ["e0", "e1"].iter().map(|id| NodeProcess::start(&node_config(dir, id, "127.0.0.1:0", &fleet))).collect();
    let admins: Vec<SocketAddr> = nodes.iter().map(|n| n.admin_addr).collect();
    // Both join and the pools are claimed, all through etcd over TLS.
    let owners = settled(&admins, 2, Duration::from_secs(20)).await;
    assert_eq!(owners.len(), POOLS.len());
    let grpc: Vec<SocketAddr> = nodes.iter().map(|n| n.grpc_addr).collect();
    for (i, pool) in POOLS.iter().enumerate() {
        let (reply, _) = submit_with_retries(&grpc, i % 2, request(&format!("etls-{i}"), pool, 5)).await;
        assert_eq!(reply.status(), QueryStatus::Completed, "{reply:?}");
    }
    drop(etcd);
}
