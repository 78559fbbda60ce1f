//! Several router nodes: who the members are, which node owns which pool,
//! and forwarding a query to its pool's owner.
//!
//! Every node of a deployment runs the same configuration, so every node
//! has every pool's actors; a node *routes* a pool only while it owns it.
//! Any node accepts any Submit: when another node owns the pool, the
//! accepting node forwards the request over `slogate.v1.Node/Forward` with
//! the client's remaining deadline, waits, and answers its client.
//!
//! Ownership (the decisions are `slogate_core::ownership`'s):
//!
//! - **Static** (`[[fleet.member]]`): each pool's owner is the first member
//!   in rendezvous order, fixed for the process's life. No failure
//!   detection: a dead member's pools wait for it.
//! - **etcd** (`fleet.etcd_endpoints`): [`run_etcd`] registers the node
//!   under `/slogate/<deployment>/members/<id>`, bound to a lease it renews
//!   every third of the TTL, and every poll reads the live members and the
//!   claims under `/slogate/<deployment>/owners/<pool>`. A pool with no
//!   claim whose rendezvous owner is this node is claimed by a transaction
//!   (create only if absent) bound to the lease, so it vanishes with it. An
//!   owner that is no longer first in rendezvous order (a node joined)
//!   stops taking the pool's queries, waits up to `drain_max_s` for its
//!   in-flight ones, and deletes its claim; the new owner then claims it.
//!
//! A pool's small durable state (its tuned configuration) lives on etcd
//! under `/slogate/<deployment>/state/<pool>/`, written by its owner only
//! while its claim stands, and adopted by the next owner as it claims the
//! pool.
//!
//! # Guarantees
//!
//! - **One router per pool at any instant**, given clock rates that agree
//!   over a TTL: a node routes a pool only while its claim is the one it
//!   read *and* its lease holds by [`LeaseView::holds_at`], which ends
//!   `margin` before the earliest instant etcd can expire the lease and let
//!   another node claim the pool. A node cut off from etcd therefore stops
//!   routing within the TTL.
//! - **Nothing accepted is lost:** a forwarded query whose owner fails, or
//!   whose pool is changing hands, is sent again with the same id to
//!   whoever owns the pool next, until the client's deadline (or
//!   `failover_wait_s` without one); then the client gets UNAVAILABLE,
//!   which is retryable.
//! - **When a query can run twice:** only across an owner's death. If the
//!   owner had dispatched the query and died before its reply reached the
//!   accepting node, the new owner, whose idempotency table does not hold
//!   the id, runs it again. The first run's result is lost with the owner
//!   (an emulated cluster dies with its process; a SQL statement on a real
//!   backend may still finish there). A retry to a *live* owner is answered
//!   from its idempotency table and never runs twice.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use serde::Serialize;
use slogate_core::ownership::{self, LeaseView, PoolSeen, Route, Step};
use slogate_proto::etcd::kv_client::KvClient;
use slogate_proto::etcd::lease_client::LeaseClient;
use slogate_proto::etcd::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
    compare, request_op,
};
use slogate_proto::v1::node_client::NodeClient;
use slogate_proto::v1::{ForwardReply, ForwardRequest, NodeState};
use tonic::transport::{Channel, Endpoint};

use crate::config::FleetSection;
use crate::{Error, Result};

/// The metadata key carrying the fleet's shared secret on Node calls.
pub const SECRET_HEADER: &str = "x-slogate-fleet-secret";

/// Where a pool's queries go from this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// This node owns the pool and its lease holds: route here.
    Local,
    /// Another live member owns it.
    Remote {
        /// The owner's id.
        node: String,
        /// Its gRPC address.
        addr: String,
    },
    /// Nobody can route it now (a claim is pending, the owner's lease
    /// lapsed, or this node is handing it over): wait and look again.
    Unowned,
}

/// Where ownership comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// A static member list: fixed owners, no leases.
    Static,
    /// Leases and claims on etcd.
    Etcd,
}

/// What this node knows of the deployment, as of its last read.
#[derive(Clone, Debug, Default, Serialize)]
pub struct View {
    /// Live members: id → gRPC address.
    pub members: BTreeMap<String, String>,
    /// Each pool's owner, as claimed (static: as hashed).
    pub owners: BTreeMap<String, String>,
    /// This node's lease, in seconds of [`Fleet::now_s`]; `None` with a
    /// static list, where ownership needs none.
    #[serde(skip)]
    pub lease: Option<LeaseView>,
    /// Pools this node is handing over: it takes none of their new queries.
    pub releasing: BTreeSet<String>,
    /// Whether the last read of etcd succeeded (always true when static).
    pub coordinator_reachable: bool,
    /// When membership was last read, in seconds of [`Fleet::now_s`].
    pub read_at_s: f64,
}

/// Settings from `[fleet]`.
#[derive(Clone, Debug)]
pub struct FleetSettings {
    /// The lease's TTL as asked of etcd.
    pub lease_ttl_s: u64,
    /// How often etcd is read.
    pub poll_interval: Duration,
    /// How long a forwarded query without a client deadline is retried.
    pub failover_wait: Duration,
    /// How long a pool being handed over waits for its in-flight queries.
    pub drain_max: Duration,
    /// How long before the earliest possible server-side expiry a node
    /// stops routing: covers a query's trip from the admission check to the
    /// router's mailbox.
    pub margin_s: f64,
}

impl FleetSettings {
    fn from_section(section: &FleetSection) -> FleetSettings {
        FleetSettings {
            lease_ttl_s: section.lease_ttl_s,
            poll_interval: Duration::from_millis(section.poll_interval_ms),
            failover_wait: Duration::from_secs(section.failover_wait_s),
            drain_max: Duration::from_secs(section.drain_max_s),
            margin_s: (section.lease_ttl_s as f64 / 4.0).min(0.5),
        }
    }
}

/// This node's membership: shared by the gateway, the Node service, the
/// membership task and the admin API.
pub struct Fleet {
    /// This node's id.
    pub node_id: String,
    /// Where other nodes reach this node's gRPC.
    pub advertise_addr: String,
    /// The deployment's name.
    pub deployment: String,
    settings: FleetSettings,
    mode: Mode,
    view: RwLock<View>,
    epoch: std::time::Instant,
    clients: Mutex<HashMap<String, NodeClient<Channel>>>,
    secret: Option<tonic::metadata::AsciiMetadataValue>,
    /// The authority other members' certificates are checked against, when
    /// nodes talk TLS.
    tls: Option<tonic::transport::ClientTlsConfig>,
    /// Queries of each pool running here now (a handover waits for them).
    in_flight: HashMap<String, AtomicUsize>,
    /// Queries this node accepted and forwarded.
    pub forwarded: AtomicU64,
    /// Queries forwarded to this node.
    pub received: AtomicU64,
    /// Forwards that failed and were sent again.
    pub reforwarded: AtomicU64,
    /// Queries this node accepted and is forwarding now.
    forwarding: AtomicUsize,
    /// Moves of pools in or out of this node, newest last (bounded).
    moves: Mutex<Vec<Move>>,
    /// Where each pool this node claims is announced (see
    /// [`Fleet::claims`]).
    claims: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Claim>>>,
    /// Where the pools this node lets go are announced.
    releases: Mutex<Option<tokio::sync::mpsc::UnboundedSender<String>>>,
    /// For each pool this node took over: the executions its policy was
    /// rebuilt on.
    relearned: Mutex<BTreeMap<String, usize>>,
    /// etcd's KV service, once the membership task has connected.
    kv: Mutex<Option<KvClient<Channel>>>,
}

/// A pool this node just claimed and does not route yet.
pub struct Claim {
    /// The pool.
    pub pool: String,
    /// Answered once the pool is ready to route here.
    pub ready: tokio::sync::oneshot::Sender<()>,
}

/// A pool changing hands, as this node saw it.
#[derive(Clone, Debug, Serialize)]
pub struct Move {
    /// The pool.
    pub pool: String,
    /// `claimed` (it came here) or `released` (it left).
    pub kind: &'static str,
    /// When, in seconds since the node started.
    pub at_s: f64,
    /// For `released`: how many of its queries were still running when the
    /// claim was let go (0 after a full drain).
    pub in_flight_left: usize,
}

const MOVES_KEPT: usize = 256;

impl Fleet {
    /// A fleet for `pools` from `[fleet]`, advertising `bound_grpc_addr`
    /// unless `advertise_addr` says otherwise. With a static member list the
    /// owners are known at once.
    pub fn new(section: &FleetSection, pools: &[String], bound_grpc_addr: std::net::SocketAddr) -> Result<Fleet> {
        let tls = match &section.ca_path {
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| Error::Config(format!("`fleet.ca_path`: cannot read {}: {e}", path.display())))?;
                Some(tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(pem)))
            }
            None => None,
        };
        let advertise_addr = if section.advertise_addr.is_empty() { bound_grpc_addr.to_string() } else { section.advertise_addr.clone() };
        let secret = if section.secret.is_empty() {
            None
        } else {
            Some(section.secret.parse().map_err(|_| Error::Config("`fleet.secret`: must be printable ASCII".into()))?)
        };
        let mut view = View { coordinator_reachable: true, ..View::default() };
        if !section.member.is_empty() {
            view.members = section.member.iter().map(|m| (m.id.clone(), m.grpc_addr.clone())).collect();
            // This node's own entry may name port 0 in a test; what it
            // bound is what others should reach.
            view.members.insert(section.node_id.clone(), advertise_addr.clone());
            for pool in pools {
                if let Some(owner) = ownership::owner(pool, view.members.keys().map(String::as_str)) {
                    view.owners.insert(pool.clone(), owner.to_owned());
                }
            }
        }
        Ok(Fleet {
            node_id: section.node_id.clone(),
            advertise_addr,
            deployment: section.deployment.clone(),
            settings: FleetSettings::from_section(section),
            mode: if section.member.is_empty() { Mode::Etcd } else { Mode::Static },
            view: RwLock::new(view),
            epoch: std::time::Instant::now(),
            clients: Mutex::default(),
            secret,
            tls,
            in_flight: pools.iter().map(|p| (p.clone(), AtomicUsize::new(0))).collect(),
            forwarded: AtomicU64::new(0),
            received: AtomicU64::new(0),
            reforwarded: AtomicU64::new(0),
            forwarding: AtomicUsize::new(0),
            moves: Mutex::default(),
            claims: Mutex::default(),
            releases: Mutex::default(),
            relearned: Mutex::default(),
            kv: Mutex::default(),
        })
    }

    /// Seconds since this node's fleet started, on the monotonic clock.
    pub fn now_s(&self) -> f64 {
        self.epoch.elapsed().as_secs_f64()
    }

    /// `static` or `etcd`: where ownership comes from.
    pub fn mode_name(&self) -> &'static str {
        match self.mode {
            Mode::Static => "static",
            Mode::Etcd => "etcd",
        }
    }

    /// The settings.
    pub fn settings(&self) -> &FleetSettings {
        &self.settings
    }

    /// A copy of the current view.
    pub fn view(&self) -> View {
        self.view.read().expect("fleet view lock").clone()
    }

    /// The moves this node made, oldest first.
    pub fn moves(&self) -> Vec<Move> {
        self.moves.lock().expect("moves lock").clone()
    }

    /// The pools this node claims from now on, each as it claims it and
    /// before it routes it: the pool waits (up to the membership task's
    /// call timeout) for the receiver to answer the claim's `ready`.
    pub fn claims(&self) -> tokio::sync::mpsc::UnboundedReceiver<Claim> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        *self.claims.lock().expect("claims lock") = Some(sender);
        receiver
    }

    /// The pools this node lets go from now on, each once its claim is
    /// deleted or its lease is found expired (another node may own it
    /// then).
    pub fn releases(&self) -> tokio::sync::mpsc::UnboundedReceiver<String> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        *self.releases.lock().expect("releases lock") = Some(sender);
        receiver
    }

    fn announce_release(&self, pool: &str) {
        if let Some(releases) = self.releases.lock().expect("releases lock").as_ref() {
            let _ = releases.send(pool.to_owned());
        }
    }

    /// Announces the claim of `pool` and waits at most `limit` for it to be
    /// made ready.
    async fn prepare(&self, pool: &str, limit: Duration) {
        let (ready, prepared) = tokio::sync::oneshot::channel();
        let sent = self.claims.lock().expect("claims lock").as_ref().is_some_and(|claims| claims.send(Claim { pool: pool.to_owned(), ready }).is_ok());
        if sent && tokio::time::timeout(limit, prepared).await.is_err() {
            tracing::warn!(message = "A claimed pool was not prepared in time; it routes with the policy it had.", pool = %pool);
        }
    }

    /// Records that `pool`'s policy was rebuilt on `executions`.
    pub fn relearned(&self, pool: &str, executions: usize) {
        self.relearned.lock().expect("relearned lock").insert(pool.to_owned(), executions);
    }

    /// Each taken-over pool's executions its policy was rebuilt on.
    pub fn relearned_counts(&self) -> BTreeMap<String, usize> {
        self.relearned.lock().expect("relearned lock").clone()
    }

    fn record_move(&self, pool: &str, kind: &'static str, in_flight_left: usize) {
        let mut moves = self.moves.lock().expect("moves lock");
        if moves.len() == MOVES_KEPT {
            moves.remove(0);
        }
        moves.push(Move { pool: pool.to_owned(), kind, at_s: self.now_s(), in_flight_left });
    }

    /// Where `pool`'s queries go from here, now. When this node cannot
    /// route the pool and knows no other owner (the claim is pending, this
    /// node is handing the pool over, or its own lease lapsed), it sends
    /// the query to the next member in rendezvous order, the likeliest next
    /// owner, which refuses it unless it owns the pool by then.
    pub fn placement(&self, pool: &str) -> Placement {
        let view = self.view.read().expect("fleet view lock");
        let may_route_here = !view.releasing.contains(pool)
            && match self.mode {
                Mode::Static => true,
                Mode::Etcd => view.lease.is_some_and(|lease| lease.holds_at(self.now_s(), self.settings.margin_s)),
            };
        let live: Vec<&str> = view.members.keys().map(String::as_str).collect();
        match ownership::route(pool, &self.node_id, view.owners.get(pool).map(String::as_str), &live, may_route_here) {
            Route::Local => Placement::Local,
            Route::Remote(node) => Placement::Remote { node: node.to_owned(), addr: view.members[node].clone() },
            Route::Unowned => Placement::Unowned,
        }
    }

    /// The pools this node routes now.
    pub fn owned(&self) -> Vec<String> {
        let pools: Vec<String> = self.in_flight.keys().cloned().collect();
        let mut owned: Vec<String> = pools.into_iter().filter(|p| self.placement(p) == Placement::Local).collect();
        owned.sort();
        owned
    }

    /// Seconds left on this node's lease (0 when static or lapsed).
    pub fn lease_left_s(&self) -> f64 {
        let view = self.view.read().expect("fleet view lock");
        view.lease.map_or(0.0, |lease| (lease.valid_until_s(0.0) - self.now_s()).max(0.0))
    }

    /// Counts a query of `pool` running on this node until the guard drops.
    /// Take it *before* asking [`Fleet::placement`], so that a handover
    /// either sees the query or the query sees the handover.
    pub fn running(self: &Arc<Self>, pool: &str) -> Option<Running> {
        self.in_flight.get(pool).map(|count| {
            // SeqCst with the handover's read (see `poll`): a query counted
            // before the pool was marked releasing is waited for, and one
            // counted after sees the mark.
            count.fetch_add(1, Ordering::SeqCst);
            Running { fleet: self.clone(), pool: pool.to_owned() }
        })
    }

    fn in_flight_of(&self, pool: &str) -> usize {
        self.in_flight.get(pool).map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Checks the shared secret on a Node call.
    pub fn check_secret(&self, metadata: &tonic::metadata::MetadataMap) -> std::result::Result<(), tonic::Status> {
        match &self.secret {
            None => Ok(()),
            Some(secret) if metadata.get(SECRET_HEADER) == Some(secret) => Ok(()),
            Some(_) => Err(tonic::Status::unauthenticated(format!("Node calls need the fleet's secret in `{SECRET_HEADER}`"))),
        }
    }

    fn client(&self, addr: &str) -> std::result::Result<NodeClient<Channel>, tonic::Status> {
        let mut clients = self.clients.lock().expect("clients lock");
        if let Some(client) = clients.get(addr) {
            return Ok(client.clone());
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{addr}"))
            .map_err(|e| tonic::Status::internal(format!("member address `{addr}`: {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(1));
        if let Some(tls) = &self.tls {
            endpoint = endpoint.tls_config(tls.clone()).map_err(|e| tonic::Status::internal(format!("TLS to member `{addr}`: {e}")))?;
        }
        let client = NodeClient::new(endpoint.connect_lazy());
        clients.insert(addr.to_owned(), client.clone());
        Ok(client)
    }

    /// Stores `value` as the pool's durable `kind` of state on etcd
    /// (`/slogate/<deployment>/state/<pool>/<kind>`), only while this node's
    /// claim on the pool stands: a node that lost the pool cannot
    /// overwrite its new owner's. Returns whether it was stored (`false`
    /// also without etcd).
    pub async fn put_pool_state(&self, pool: &str, kind: &str, value: Vec<u8>) -> std::result::Result<bool, tonic::Status> {
        let Some(mut kv) = self.kv.lock().expect("kv lock").clone() else { return Ok(false) };
        let owner_key = format!("{}{pool}", owners_prefix(&self.deployment));
        let store = TxnRequest {
            compare: vec![value_is(&owner_key, self.node_id.as_bytes())],
            success: vec![put(&state_key(&self.deployment, pool, kind), value, 0)],
            failure: Vec::new(),
        };
        Ok(kv.txn(store).await?.into_inner().succeeded)
    }

    /// The pool's durable `kind` of state on etcd, if any was stored.
    pub async fn pool_state(&self, pool: &str, kind: &str) -> std::result::Result<Option<Vec<u8>>, tonic::Status> {
        let Some(mut kv) = self.kv.lock().expect("kv lock").clone() else { return Ok(None) };
        let range = RangeRequest { key: state_key(&self.deployment, pool, kind).into_bytes(), ..RangeRequest::default() };
        Ok(kv.range(range).await?.into_inner().kvs.into_iter().next().map(|kv| kv.value))
    }

    /// A Node call carrying `message`, with `timeout` as its deadline and
    /// the fleet's secret.
    fn call<T>(&self, message: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut call = tonic::Request::new(message);
        if let Some(timeout) = timeout {
            call.set_timeout(timeout);
        }
        if let Some(secret) = &self.secret {
            call.metadata_mut().insert(SECRET_HEADER, secret.clone());
        }
        call
    }

    /// Queries this node accepted and is forwarding now.
    pub fn forwarding(&self) -> usize {
        self.forwarding.load(Ordering::Relaxed)
    }

    /// Sends `request` to the node at `addr`, with `timeout` as the call's
    /// deadline.
    pub async fn forward(&self, addr: &str, request: ForwardRequest, timeout: Option<Duration>) -> std::result::Result<ForwardReply, tonic::Status> {
        let mut client = self.client(addr)?;
        self.forwarding.fetch_add(1, Ordering::Relaxed);
        let _done = Decrement(&self.forwarding);
        client.forward(self.call(request, timeout)).await.map(tonic::Response::into_inner)
    }

    /// Asks the node at `addr` for its state, within `timeout`.
    pub async fn state_of(&self, addr: &str, timeout: Duration) -> std::result::Result<NodeState, tonic::Status> {
        let mut client = self.client(addr)?;
        client.state(self.call(slogate_proto::v1::StateRequest {}, Some(timeout))).await.map(tonic::Response::into_inner)
    }

    /// Asks the node at `addr` for `pool`'s actors (JSON), within a
    /// second.
    pub async fn pool_actors_of(&self, addr: &str, pool: &str) -> std::result::Result<String, tonic::Status> {
        let mut client = self.client(addr)?;
        let call = self.call(slogate_proto::v1::PoolActorsRequest { pool: pool.to_owned() }, Some(Duration::from_secs(1)));
        client.pool_actors(call).await.map(|reply| reply.into_inner().json)
    }

    /// This node's state, as the Node service reports it.
    pub fn state(&self) -> NodeState {
        NodeState {
            node_id: self.node_id.clone(),
            grpc_addr: self.advertise_addr.clone(),
            pools_owned: self.owned(),
            lease_left_s: self.lease_left_s(),
            forwarded: self.forwarded.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
        }
    }
}

/// Decrements a counter when dropped (a call's future may be dropped
/// before it finishes).
struct Decrement<'a>(&'a AtomicUsize);

impl Drop for Decrement<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A query of a pool running on this node; see [`Fleet::running`].
pub struct Running {
    fleet: Arc<Fleet>,
    pool: String,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(count) = self.fleet.in_flight.get(&self.pool) {
            count.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Whether a failed forward may be sent again: the owner was unreachable,
/// is not the owner (any more or yet), or is shutting down.
pub fn retryable(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unavailable | tonic::Code::FailedPrecondition | tonic::Code::Unknown | tonic::Code::Cancelled)
}

/// The etcd key prefix of the deployment's members.
fn members_prefix(deployment: &str) -> String {
    format!("/slogate/{deployment}/members/")
}

/// The etcd key prefix of the deployment's pool claims.
fn owners_prefix(deployment: &str) -> String {
    format!("/slogate/{deployment}/owners/")
}

/// The etcd key of a pool's durable `kind` of state.
fn state_key(deployment: &str, pool: &str, kind: &str) -> String {
    format!("/slogate/{deployment}/state/{pool}/{kind}")
}

/// A transaction's test: `key` does not exist.
fn key_absent(key: &str) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Create as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(compare::TargetUnion::CreateRevision(0)),
        range_end: Vec::new(),
    }
}

/// A transaction's test: `key` holds `value`.
fn value_is(key: &str, value: &[u8]) -> Compare {
    Compare {
        result: compare::CompareResult::Equal as i32,
        target: compare::CompareTarget::Value as i32,
        key: key.as_bytes().to_vec(),
        target_union: Some(compare::TargetUnion::Value(value.to_vec())),
        range_end: Vec::new(),
    }
}

/// A transaction's put of `value` at `key`, bound to `lease` (0: none).
fn put(key: &str, value: Vec<u8>, lease: i64) -> RequestOp {
    RequestOp { request: Some(request_op::Request::RequestPut(PutRequest { key: key.as_bytes().to_vec(), value, lease, ..PutRequest::default() })) }
}

/// The end of the key range that starts with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    // Every prefix here ends in '/', which has a successor.
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// etcd's view of one prefix: the part of each key after it → its value.
async fn read_prefix(kv: &mut KvClient<Channel>, prefix: &str) -> std::result::Result<BTreeMap<String, String>, tonic::Status> {
    let response = kv.range(RangeRequest { key: prefix.as_bytes().to_vec(), range_end: prefix_end(prefix), ..RangeRequest::default() }).await?.into_inner();
    Ok(response
        .kvs
        .into_iter()
        .filter_map(|kv| {
            let key = String::from_utf8(kv.key).ok()?;
            let value = String::from_utf8(kv.value).ok()?;
            Some((key.strip_prefix(prefix)?.to_owned(), value))
        })
        .collect())
}

/// The membership task's own state between polls.
struct Session {
    kv: KvClient<Channel>,
    lease_client: LeaseClient<Channel>,
    lease_id: Option<i64>,
    last_renewal_sent_s: f64,
    /// Pools being handed over, and since when.
    releasing_since: BTreeMap<String, f64>,
    call_timeout: Duration,
}

/// Keeps this node's membership and its pools' claims on etcd until `stop`
/// turns true, then revokes its lease, which deletes its member key and
/// claims at once so that the next owners need not wait for the TTL.
pub async fn run_etcd(
    fleet: Arc<Fleet>,
    endpoints: Vec<String>,
    ca_path: Option<std::path::PathBuf>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<()> {
    let tls = match ca_path {
        Some(path) => {
            let pem = std::fs::read(&path).map_err(|e| Error::Config(format!("`fleet.etcd_ca_path`: cannot read {}: {e}", path.display())))?;
            Some(tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(pem)))
        }
        None => None,
    };
    let endpoints = endpoints
        .iter()
        .map(|url| {
            let endpoint = Endpoint::from_shared(url.clone())
                .map(|e| e.tcp_nodelay(true).connect_timeout(Duration::from_secs(1)))
                .map_err(|e| Error::Config(format!("`fleet.etcd_endpoints`: `{url}`: {e}")))?;
            match &tls {
                Some(tls) => endpoint.tls_config(tls.clone()).map_err(|e| Error::Config(format!("`fleet.etcd_endpoints`: `{url}`: {e}"))),
                None => Ok(endpoint),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    let channel = Channel::balance_list(endpoints.into_iter());
    *fleet.kv.lock().expect("kv lock") = Some(KvClient::new(channel.clone()));
    let settings = fleet.settings().clone();
    let mut session = Session {
        kv: KvClient::new(channel.clone()),
        lease_client: LeaseClient::new(channel),
        lease_id: None,
        last_renewal_sent_s: f64::NEG_INFINITY,
        releasing_since: BTreeMap::new(),
        call_timeout: settings.poll_interval.max(Duration::from_millis(500)).min(Duration::from_secs(settings.lease_ttl_s) / 3),
    };
    loop {
        if let Err(error) = poll(&fleet, &mut session).await {
            let mut view = fleet.view.write().expect("fleet view lock");
            if view.coordinator_reachable {
                tracing::warn!(message = "etcd is unreachable; this node's pools stop routing when its lease runs out.", %error);
            }
            view.coordinator_reachable = false;
        }
        tokio::select! {
            _ = tokio::time::sleep(settings.poll_interval) => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    if let Some(id) = session.lease_id {
        {
            let mut view = fleet.view.write().expect("fleet view lock");
            view.lease = None;
        }
        let revoked = tokio::time::timeout(session.call_timeout, session.lease_client.lease_revoke(LeaseRevokeRequest { id })).await;
        match revoked {
            Ok(Ok(_)) => tracing::info!(message = "Left the fleet: lease revoked.", node = %fleet.node_id),
            _ => tracing::warn!(message = "Could not revoke the lease; others take this node's pools when it expires.", node = %fleet.node_id),
        }
    }
    Ok(())
}

/// A failed etcd call, for the log.
#[derive(Debug, thiserror::Error)]
enum PollError {
    #[error("{0}")]
    Status(#[from] tonic::Status),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

async fn within<T>(limit: Duration, call: impl std::future::Future<Output = std::result::Result<T, tonic::Status>>) -> std::result::Result<T, PollError> {
    tokio::time::timeout(limit, call).await.map_err(|_| PollError::Timeout(limit))?.map_err(PollError::from)
}

/// One round: keep the lease, read members and claims, claim or hand over
/// pools, and publish the view.
async fn poll(fleet: &Arc<Fleet>, session: &mut Session) -> std::result::Result<(), PollError> {
    let settings = fleet.settings().clone();
    let limit = session.call_timeout;
    let member_key = format!("{}{}", members_prefix(&fleet.deployment), fleet.node_id);
    // 1. The lease: granted once, renewed every third of its TTL.
    match session.lease_id {
        None => {
            let sent = fleet.now_s();
            let granted = within(limit, session.lease_client.lease_grant(LeaseGrantRequest { ttl: settings.lease_ttl_s as i64, id: 0 })).await?.into_inner();
            if !granted.error.is_empty() || granted.ttl <= 0 {
                return Err(PollError::Status(tonic::Status::unavailable(format!("lease refused: {}", granted.error))));
            }
            session.lease_id = Some(granted.id);
            session.last_renewal_sent_s = sent;
            fleet.view.write().expect("fleet view lock").lease = Some(LeaseView::granted(granted.ttl as f64, sent));
            tracing::info!(message = "Joined the fleet.", node = %fleet.node_id, lease = granted.id, ttl_s = granted.ttl);
        }
        Some(id) if fleet.now_s() - session.last_renewal_sent_s >= settings.lease_ttl_s as f64 / 3.0 => {
            let sent = fleet.now_s();
            let mut replies = within(limit, session.lease_client.lease_keep_alive(tokio_stream::once(LeaseKeepAliveRequest { id }))).await?.into_inner();
            let reply = within(limit, async { replies.message().await }).await?;
            session.last_renewal_sent_s = sent;
            match reply {
                Some(reply) if reply.ttl > 0 => {
                    if let Some(lease) = fleet.view.write().expect("fleet view lock").lease.as_mut() {
                        lease.renewed(sent, reply.ttl as f64);
                    }
                }
                _ => {
                    // The lease expired on the server (a long partition):
                    // its keys are gone. Start over with a new one.
                    tracing::warn!(message = "The lease expired; rejoining the fleet.", node = %fleet.node_id);
                    session.lease_id = None;
                    session.releasing_since.clear();
                    let lost: Vec<String> = {
                        let mut view = fleet.view.write().expect("fleet view lock");
                        view.lease = None;
                        view.releasing.clear();
                        let lost = view.owners.iter().filter(|(_, owner)| **owner == fleet.node_id).map(|(pool, _)| pool.clone()).collect();
                        view.owners.retain(|_, owner| *owner != fleet.node_id);
                        lost
                    };
                    // Its claims went with the lease: other nodes may own
                    // those pools now.
                    for pool in lost {
                        fleet.record_move(&pool, "released", fleet.in_flight_of(&pool));
                        fleet.announce_release(&pool);
                    }
                    return Ok(());
                }
            }
        }
        Some(_) => {}
    }
    let Some(lease_id) = session.lease_id else { return Ok(()) };

    // 2. Who is alive, and who owns what.
    let mut members = within(limit, read_prefix(&mut session.kv, &members_prefix(&fleet.deployment))).await?;
    if members.get(&fleet.node_id) != Some(&fleet.advertise_addr) {
        let put = PutRequest { key: member_key.into_bytes(), value: fleet.advertise_addr.clone().into_bytes(), lease: lease_id, ..PutRequest::default() };
        within(limit, session.kv.put(put)).await?;
        members.insert(fleet.node_id.clone(), fleet.advertise_addr.clone());
    }
    let mut owners = within(limit, read_prefix(&mut session.kv, &owners_prefix(&fleet.deployment))).await?;

    // 3. Claim what is ours and free; hand over what is no longer ours.
    let lease_holds = fleet.view.read().expect("fleet view lock").lease.is_some_and(|lease| lease.holds_at(fleet.now_s(), settings.margin_s));
    let mut pools: Vec<&String> = fleet.in_flight.keys().collect();
    pools.sort();
    for pool in pools {
        let key = format!("{}{}", owners_prefix(&fleet.deployment), pool);
        let live: Vec<&str> = members.keys().map(String::as_str).collect();
        let seen = PoolSeen {
            pool,
            me: &fleet.node_id,
            claimed_by: owners.get(pool).map(String::as_str),
            lease_holds,
            draining_since_s: session.releasing_since.get(pool).copied(),
            in_flight: fleet.in_flight_of(pool),
            now_s: fleet.now_s(),
            drain_max_s: settings.drain_max.as_secs_f64(),
        };
        let in_flight = seen.in_flight;
        match ownership::step(&seen, &live) {
            Step::Claim => {
                let claim = TxnRequest {
                    compare: vec![key_absent(&key)],
                    success: vec![put(&key, fleet.node_id.clone().into_bytes(), lease_id)],
                    failure: Vec::new(),
                };
                if within(limit, session.kv.txn(claim)).await?.into_inner().succeeded {
                    // Nobody routes the pool until the next publish below.
                    fleet.prepare(pool, limit).await;
                    owners.insert(pool.clone(), fleet.node_id.clone());
                    fleet.record_move(pool, "claimed", 0);
                    tracing::info!(message = "Claimed a pool.", node = %fleet.node_id, pool = %pool);
                }
            }
            Step::Drain => {
                // Announced before the next poll counts the pool's running
                // queries (see `Fleet::running`).
                session.releasing_since.entry(pool.clone()).or_insert_with(|| fleet.now_s());
                fleet.view.write().expect("fleet view lock").releasing.insert(pool.clone());
            }
            Step::Release => {
                let release = TxnRequest {
                    compare: vec![value_is(&key, fleet.node_id.as_bytes())],
                    success: vec![RequestOp { request: Some(request_op::Request::RequestDeleteRange(DeleteRangeRequest { key: key.into_bytes(), ..DeleteRangeRequest::default() })) }],
                    failure: Vec::new(),
                };
                within(limit, session.kv.txn(release)).await?;
                owners.remove(pool);
                session.releasing_since.remove(pool);
                fleet.view.write().expect("fleet view lock").releasing.remove(pool);
                fleet.record_move(pool, "released", in_flight);
                fleet.announce_release(pool);
                tracing::info!(message = "Handed a pool over.", node = %fleet.node_id, pool = %pool, in_flight_left = in_flight);
            }
            Step::Keep => {
                session.releasing_since.remove(pool);
                fleet.view.write().expect("fleet view lock").releasing.remove(pool);
            }
            Step::Nothing => {}
        }
    }

    // 4. Publish.
    let mut view = fleet.view.write().expect("fleet view lock");
    view.members = members;
    view.owners = owners;
    view.coordinator_reachable = true;
    view.read_at_s = fleet.now_s();
    Ok(())
}
