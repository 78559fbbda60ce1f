//! Node configuration: a TOML file, then environment overrides, then
//! command-line flags, validated once into a typed [`NodeConfig`].
//!
//! The file is versioned (`version = 1`) and unknown keys are errors, so a
//! typo never silently falls back to a default. Every error names the key.
//! Environment overrides are read through [`Strings`], never by mutating
//! the process environment, so tests stay isolated:
//!
//! | variable | key |
//! | --- | --- |
//! | `SLOGATE_GRPC_ADDR` | `node.grpc_addr` |
//! | `SLOGATE_ADMIN_ADDR` | `node.admin_addr` |
//! | `SLOGATE_DATA_DIR` | `node.data_dir` |
//! | `SLOGATE_TIME_COMPRESSION` | `node.time_compression` |
//! | `SLOGATE_ADMIN_TOKEN` | `node.admin_token` |

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use slogate_core::route::BaselinePolicy;

use crate::{Error, Result};

/// A source of string settings (the process environment, or a map in
/// tests).
pub trait Strings {
    /// The value of `key`, if set.
    fn get(&self, key: &str) -> Option<String>;
}

/// The process environment.
pub struct Environment;

impl Strings for Environment {
    fn get(&self, key: &str) -> Option<String> {
        std::env::var(key).ok()
    }
}

impl Strings for std::collections::HashMap<String, String> {
    fn get(&self, key: &str) -> Option<String> {
        std::collections::HashMap::get(self, key).cloned()
    }
}

/// The file format, by version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "version", deny_unknown_fields)]
pub enum ConfigFile {
    /// Version 1.
    #[serde(rename = "1")]
    V1(ConfigV1),
}

/// Version 1 of the file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConfigV1 {
    /// Listening addresses, data and time.
    pub node: NodeSection,
    /// Bounds on what the node accepts and keeps.
    pub limits: LimitsSection,
    /// The workload reservoir.
    pub reservoir: ReservoirSection,
    /// The pools this node serves.
    pub pool: Vec<PoolSection>,
    /// Tenants: with one or more, every gRPC call needs a tenant's token.
    #[serde(default)]
    pub tenant: Vec<TenantSection>,
    /// Several router nodes: who the members are and who owns which pool.
    pub fleet: FleetSection,
}

/// `[fleet]`: a deployment of several router nodes. Unset (`node_id`
/// empty), the node is alone and owns every pool. With a static `member`
/// list, each pool's owner is fixed by rendezvous hashing over it; with
/// `etcd_endpoints`, members register under leases and claim pools there,
/// and a dead member's pools move to the next in rendezvous order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetSection {
    /// This node's id, unique in the deployment; empty: a single node.
    pub node_id: String,
    /// Where the other nodes reach this node's gRPC (`host:port`); empty:
    /// the address gRPC is bound to.
    pub advertise_addr: String,
    /// A static member list (this node among them); exclusive with
    /// `etcd_endpoints`.
    pub member: Vec<MemberSection>,
    /// etcd's client URLs (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// The deployment's name: its keys live under `/slogate/<deployment>/`.
    pub deployment: String,
    /// The membership lease's time to live, in seconds: a node that cannot
    /// renew it stops routing its pools within this time, and another takes
    /// them.
    pub lease_ttl_s: u64,
    /// How often membership and ownership are read from etcd.
    pub poll_interval_ms: u64,
    /// How long the accepting node keeps retrying a forwarded query whose
    /// owner fails or is changing, when the client set no deadline.
    pub failover_wait_s: u64,
    /// How long an owner giving a pool away waits for its in-flight
    /// queries of that pool before it lets go anyway.
    pub drain_max_s: u64,
    /// A shared secret the Node service requires from other nodes (the
    /// `x-slogate-fleet-secret` header); empty: none.
    pub secret: String,
    /// With TLS on gRPC (`node.tls_cert_path`), the PEM certificate(s) of
    /// the authority that signed the members' certificates: nodes call each
    /// other over TLS and trust only these. Required then; unused without.
    pub ca_path: Option<PathBuf>,
    /// With `https://` etcd endpoints, the PEM certificate(s) of the
    /// authority that signed etcd's: required then, refused otherwise.
    pub etcd_ca_path: Option<PathBuf>,
}

/// `[[fleet.member]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberSection {
    /// The member's node id.
    pub id: String,
    /// Its gRPC address, `host:port`.
    pub grpc_addr: String,
}

impl Default for FleetSection {
    fn default() -> Self {
        FleetSection {
            node_id: String::new(),
            advertise_addr: String::new(),
            member: Vec::new(),
            etcd_endpoints: Vec::new(),
            deployment: "default".into(),
            lease_ttl_s: 5,
            poll_interval_ms: 250,
            failover_wait_s: 30,
            drain_max_s: 30,
            secret: String::new(),
            ca_path: None,
            etcd_ca_path: None,
        }
    }
}

impl FleetSection {
    /// Whether this node is one of several.
    pub fn enabled(&self) -> bool {
        !self.node_id.is_empty()
    }

    fn validate(&self, tls: bool) -> Result<()> {
        match (&self.ca_path, tls && self.enabled()) {
            (None, true) => return Err(invalid("fleet.ca_path", "nodes serving gRPC over TLS call each other over TLS: name the authority that signed their certificates")),
            (Some(_), false) => return Err(invalid("fleet.ca_path", "only used by a fleet whose nodes serve gRPC over TLS (node.tls_cert_path)")),
            (Some(path), true) if !path.is_file() => return Err(invalid("fleet.ca_path", format!("`{}` is not a readable file", path.display()))),
            _ => {}
        }
        if !self.enabled() {
            if !self.member.is_empty() || !self.etcd_endpoints.is_empty() {
                return Err(invalid("fleet.node_id", "a member list or etcd_endpoints needs this node's id"));
            }
            return Ok(());
        }
        let name_ok = |id: &str| !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
        if !name_ok(&self.node_id) {
            return Err(invalid("fleet.node_id", format!("`{}` must be 1-64 of [A-Za-z0-9._-]", self.node_id)));
        }
        if !name_ok(&self.deployment) {
            return Err(invalid("fleet.deployment", format!("`{}` must be 1-64 of [A-Za-z0-9._-]", self.deployment)));
        }
        match (self.member.is_empty(), self.etcd_endpoints.is_empty()) {
            (true, true) => return Err(invalid("fleet", "set either a static [[fleet.member]] list or etcd_endpoints")),
            (false, false) => return Err(invalid("fleet", "a static [[fleet.member]] list and etcd_endpoints exclude each other")),
            _ => {}
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, member) in self.member.iter().enumerate() {
            if !name_ok(&member.id) {
                return Err(invalid(&format!("fleet.member[{i}].id"), format!("`{}` must be 1-64 of [A-Za-z0-9._-]", member.id)));
            }
            if !seen.insert(member.id.as_str()) {
                return Err(invalid(&format!("fleet.member[{i}].id"), format!("`{}` is listed twice", member.id)));
            }
            if member.grpc_addr.rsplit_once(':').is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err()) {
                return Err(invalid(&format!("fleet.member[{i}].grpc_addr"), format!("`{}` is not host:port", member.grpc_addr)));
            }
        }
        if !self.member.is_empty() && !seen.contains(self.node_id.as_str()) {
            return Err(invalid("fleet.member", format!("this node (`{}`) is not in the list", self.node_id)));
        }
        for (i, url) in self.etcd_endpoints.iter().enumerate() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err(invalid(&format!("fleet.etcd_endpoints[{i}]"), format!("`{url}` must be an http:// or https:// URL")));
            }
        }
        let https = self.etcd_endpoints.iter().filter(|url| url.starts_with("https://")).count();
        if https > 0 && https < self.etcd_endpoints.len() {
            return Err(invalid("fleet.etcd_endpoints", "mixes http:// and https:// endpoints"));
        }
        match (&self.etcd_ca_path, https > 0) {
            (None, true) => return Err(invalid("fleet.etcd_ca_path", "https:// etcd endpoints need the authority that signed etcd's certificate")),
            (Some(_), false) => return Err(invalid("fleet.etcd_ca_path", "only used with https:// etcd endpoints")),
            (Some(path), true) if !path.is_file() => return Err(invalid("fleet.etcd_ca_path", format!("`{}` is not a readable file", path.display()))),
            _ => {}
        }
        if !self.advertise_addr.is_empty() && self.advertise_addr.rsplit_once(':').is_none_or(|(_, port)| port.parse::<u16>().is_err()) {
            return Err(invalid("fleet.advertise_addr", format!("`{}` is not host:port", self.advertise_addr)));
        }
        for (key, value, min, max) in [
            ("fleet.lease_ttl_s", self.lease_ttl_s, 1, 3_600),
            ("fleet.poll_interval_ms", self.poll_interval_ms, 10, 60_000),
            ("fleet.failover_wait_s", self.failover_wait_s, 0, 3_600),
            ("fleet.drain_max_s", self.drain_max_s, 0, 3_600),
        ] {
            if !(min..=max).contains(&value) {
                return Err(invalid(key, format!("must be in [{min}, {max}], got {value}")));
            }
        }
        if self.poll_interval_ms >= self.lease_ttl_s * 1_000 / 2 {
            return Err(invalid("fleet.poll_interval_ms", format!("must be under half of lease_ttl_s ({} ms)", self.lease_ttl_s * 500)));
        }
        Ok(())
    }
}

/// `[[tenant]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSection {
    /// Its name (ASCII letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// SHA-256 of its bearer token, 64 hex digits
    /// (`printf %s TOKEN | sha256sum`); the token itself is never stored.
    pub token_sha256: String,
    /// The pools it may use; `["*"]` for all.
    pub pools: Vec<String>,
    /// Queries admitted per second at most, on average (0: no limit).
    #[serde(default)]
    pub queries_per_s_max: f64,
    /// Queries admitted at once above the rate.
    #[serde(default = "default_burst")]
    pub burst: f64,
    /// Queries in progress at most.
    #[serde(default = "default_tenant_in_flight")]
    pub in_flight_max: usize,
}

fn default_burst() -> f64 {
    100.0
}

fn default_tenant_in_flight() -> usize {
    1_000
}

/// `[node]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    /// gRPC listen address (`127.0.0.1:0` picks a free port).
    pub grpc_addr: String,
    /// Admin HTTP listen address.
    pub admin_addr: String,
    /// Where sled keeps the reservoir.
    pub data_dir: PathBuf,
    /// Virtual seconds of the emulated warehouse per real second.
    pub time_compression: f64,
    /// Bearer token required by state-changing admin calls; empty refuses
    /// them all.
    pub admin_token: String,
    /// Whether admin reads need the token too.
    pub reads_require_token: bool,
    /// Seed of the emulated warehouse's noise.
    pub seed: u64,
    /// Where the node's calendar starts: `wall` (the wall clock at start)
    /// or `midnight` (the last 00:00 UTC, so that a trace replayed from the
    /// node's start lines its times of day up with planned spinups). The
    /// calendar runs at the time compression: a compressed node's days
    /// (its reservoir's hours, its tuner's target day, its planned
    /// spinups' times of day) pass that much faster.
    pub calendar: String,
    /// PEM certificate chain for TLS on gRPC and the admin API; with
    /// `tls_key_path`. Unset: plaintext.
    pub tls_cert_path: Option<PathBuf>,
    /// PEM private key for `tls_cert_path`.
    pub tls_key_path: Option<PathBuf>,
    /// Threads of the gRPC server's own tokio runtime; 0 runs gRPC on the
    /// routing thread with the actors.
    pub grpc_threads: usize,
    /// RouterShards, each routing its pools on a thread of its own with
    /// their trackers (and emulated warehouses). Pool `i` goes to shard
    /// `i % router_shards` unless it names its `shard`. Shard 0 shares the
    /// node's main thread with the admin API (and gRPC, when
    /// `grpc_threads` is 0). At most the number of pools.
    pub router_shards: usize,
    /// ONNX Runtime's shared library (`libonnxruntime.so.*`, e.g. from the
    /// PyPI `onnxruntime` wheel), with which an `iconq` pool's
    /// `model.onnx` is checked against its weights at start (builds with
    /// the `onnx` feature). Unset: `ORT_DYLIB_PATH`; neither: the check is
    /// skipped (inference is native either way), and the log says so.
    pub onnxruntime_path: Option<PathBuf>,
}

/// `[limits]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Queries in flight per pool before submissions get RESOURCE_EXHAUSTED.
    pub in_flight_per_pool_max: usize,
    /// Largest accepted payload, bytes.
    pub payload_bytes_max: usize,
    /// Largest accepted SLO, milliseconds.
    pub slo_ms_max: u64,
    /// Actor mailbox capacity.
    pub mailbox_capacity: usize,
    /// Routing decisions kept for `GET /v1/decisions`.
    pub decisions_kept: usize,
    /// Finished client query ids remembered per pool for retries.
    pub idempotency_kept: usize,
    /// How long a finished query answers retries of its id, wall-clock
    /// hours (its record is kept on disk that long).
    pub idempotency_retention_h: f64,
    /// Templates (or SQL fingerprints) whose state a pool keeps; clients
    /// choose them, so beyond it the least recently seen is forgotten: by
    /// the router's SLO book (counted in `templates_evicted` in the pool's
    /// stats) and by the learned predictors.
    pub templates_per_pool_max: usize,
    /// Clusters a pool may have at once, whoever asks (the admin API or
    /// the autoscaler); a request beyond it is refused.
    pub clusters_per_pool_max: usize,
    /// How long shutdown waits for in-flight queries, seconds.
    pub shutdown_grace_s: u64,
    /// After the grace period, how long connections get to close before
    /// the node closes them and exits, seconds.
    pub shutdown_close_s: u64,
    /// gRPC connections open at once; the accept loop waits beyond it.
    pub grpc_connections_max: usize,
    /// HTTP/2 streams a gRPC connection may have open at once.
    pub grpc_streams_per_connection_max: u32,
    /// Requests a gRPC connection may have in progress; more wait.
    pub grpc_in_flight_per_connection_max: usize,
    /// Queries one `SubmitStream` may have in progress; the stream is not
    /// read further until one is answered.
    pub stream_in_flight_max: usize,
    /// The largest gRPC message accepted, bytes.
    pub grpc_message_bytes_max: usize,
    /// A new gRPC connection must send its first byte within this, seconds.
    pub grpc_handshake_timeout_s: u64,
    /// A gRPC connection with no open stream for this long is closed,
    /// seconds.
    pub grpc_idle_timeout_s: u64,
    /// HTTP/2 keepalive: the node pings an open connection this often,
    /// seconds (0: never).
    pub grpc_keepalive_interval_s: u64,
    /// HTTP/2 keepalive: a ping unanswered this long closes the
    /// connection, seconds.
    pub grpc_keepalive_timeout_s: u64,
    /// The longest accepted pool name, bytes.
    pub pool_name_bytes_max: usize,
    /// Labels one query may carry at most.
    pub labels_max: usize,
    /// Bytes of one query's label keys and values together, at most.
    pub labels_bytes_max: usize,
    /// The longest accepted SQL text, bytes.
    pub sql_bytes_max: usize,
}

/// `[reservoir]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservoirSection {
    /// Arrival offsets kept per hour (a uniform sample beyond it).
    pub arrival_samples_per_hour_max: u32,
    /// Updates between flushes to disk.
    pub flush_every: u64,
    /// The execution log keeps at most this many executions (about 300 B
    /// each), the newest.
    pub executions_kept_max: u64,
    /// Executions logged longer ago than this are deleted, hours.
    pub execution_retention_h: f64,
    /// sled's page cache, MiB.
    pub cache_mb: u64,
    /// Days of arrival history (the count table the tuner forecasts from)
    /// kept before the latest arrival.
    pub history_days: f64,
    /// Updates waiting for the reservoir's thread before the gRPC intake
    /// holds new queries until it catches up.
    pub backlog_max: usize,
}

/// `[[pool]]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// The pool's name.
    pub name: String,
    /// Routing policy.
    #[serde(default = "default_policy")]
    pub policy: String,
    /// `active` (the policy places the queries, and its autoscaler and
    /// tuner act) or `shadow`: the `baseline` policy places every query,
    /// while the policy, its autoscaler and its tuner decide alongside it
    /// and record what they would have done (the provider is a dry run, so
    /// nothing is created or released). `GET /v1/pools/{pool}/shadow`
    /// compares the two.
    #[serde(default = "default_mode")]
    pub mode: String,
    /// Shadow mode's acting policy, today's practice: `round-robin` or
    /// `least-loaded`.
    #[serde(default = "default_baseline")]
    pub baseline: String,
    /// The `slogate` policies' latency predictor: `concurrency-aware` (a
    /// learned slowdown curve per size over the queries running; the
    /// default) or `iconq` (Iconq+, the learned sequence model in `model`,
    /// over the concurrency-aware one). Policy `slogate-iconq` is `slogate`
    /// with `predictor = "iconq"`.
    #[serde(default = "default_predictor")]
    pub predictor: String,
    /// `predictor = "iconq"`: the directory `slogate train-predictor`
    /// wrote (its `model.json`, and `model.onnx`, checked in ONNX Runtime
    /// at start when the node has the library).
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// `predictor = "iconq"`: retraining the model from the pool's
    /// execution log.
    #[serde(default)]
    pub retrain: RetrainSection,
    /// What runs its queries: `emulated` (the embedded warehouse) or
    /// `postgres` (servers that speak the PostgreSQL protocol: Amazon
    /// Redshift, Redshift Serverless endpoints, PostgreSQL), one per
    /// `[[pool.endpoint]]`.
    #[serde(default = "default_backend")]
    pub backend: String,
    /// Initial clusters on the emulated warehouse, sizes in RPU (emulated
    /// pools only).
    #[serde(default)]
    pub clusters: Vec<u32>,
    /// A postgres pool's servers, one cluster each (`c0`, `c1`, … in
    /// order).
    #[serde(default)]
    pub endpoint: Vec<EndpointSection>,
    /// A postgres pool's executor settings.
    #[serde(default)]
    pub postgres: PostgresSection,
    /// How clusters bill: `usage` (the warehouse timer: running while
    /// queries run, 60 s minimum windows) or `provisioned` (from spinup
    /// until teardown, per second, 60 s minimum).
    #[serde(default = "default_billing")]
    pub billing: String,
    /// Price of a provisioned cluster per RPU-hour, dollars.
    #[serde(default = "default_provisioned_price")]
    pub provisioned_price_per_rpu_hour_usd: f64,
    /// The pool's autoscaler.
    #[serde(default)]
    pub autoscale: AutoscaleSection,
    /// The pool's elastic tier.
    #[serde(default)]
    pub elastic: ElasticSection,
    /// The pool's policy tuner.
    #[serde(default)]
    pub tune: TuneSection,
    /// The RouterShard that owns the pool (below `node.router_shards`);
    /// unset: its index in the file modulo the shard count.
    #[serde(default)]
    pub shard: Option<usize>,
    /// What the pool may hold, whatever its policy or an operator asks.
    #[serde(default)]
    pub caps: CapsSection,
    /// The pool's provider.
    #[serde(default)]
    pub provider: ProviderSection,
    /// `[pool.violation_budget]`: the SLO-aware router spends the slack
    /// under `target` (the recent violation rate of its own queries) on
    /// cheaper placements; unset, it buys all the safety it can see
    /// (`slogate_core::route::budget`).
    #[serde(default)]
    pub violation_budget: Option<slogate_core::route::budget::BudgetConfig>,
}

/// `[pool.provider]`: who creates and releases the pool's clusters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProviderSection {
    /// Log and show what the provider would create or release, and do
    /// nothing: each request is refused, saying what it would have done.
    pub dry_run: bool,
    /// `""` (the backend's own: the emulated warehouse, or a postgres
    /// pool's fixed endpoints), or a cloud provider for a postgres pool:
    /// `redshift-serverless`, `redshift` or `ec2` (a build with the `aws`
    /// feature).
    pub kind: String,
    /// The AWS region.
    pub region: String,
    /// Another endpoint for the AWS APIs (a local AWS-compatible server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_url: Option<String>,
    /// Most attempts per AWS call on throttling and 5xx, the first
    /// included.
    pub attempts_max: u32,
    /// Between descriptions of a starting resource, milliseconds.
    pub poll_interval_ms: u64,
    /// How long a resource may take to serve before it is deleted and its
    /// cluster abandoned, seconds.
    pub ready_timeout_s: u64,
    /// Resource names start with it.
    pub name_prefix: String,
    /// Redshift Serverless: the producer namespace whose datashare the
    /// clusters read (checked at start; each cluster is a namespace and a
    /// workgroup of its own, as the service holds one workgroup per
    /// namespace); empty for none.
    pub namespace: String,
    /// Redshift Serverless: public endpoints.
    pub publicly_accessible: bool,
    /// Provisioned Redshift: the node type.
    pub node_type: String,
    /// Provisioned Redshift: RPU one node counts as.
    pub rpu_per_node: u32,
    /// Redshift (provisioned or Serverless): the admin user clusters (or
    /// their namespaces) are created with.
    pub master_username: String,
    /// Redshift (provisioned or Serverless): the environment variable
    /// holding its password.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_password_env: Option<String>,
    /// Provisioned Redshift: pause released clusters instead of deleting
    /// them.
    pub pause_instead_of_delete: bool,
    /// EC2: the launch template instances run from.
    pub launch_template: String,
    /// EC2: the instance type per cluster size (`"16" = "m5.xlarge"`).
    pub instance_types: std::collections::BTreeMap<String, String>,
    /// EC2: the engine's port.
    pub service_port: u16,
    /// EC2: connect to instances' public addresses.
    pub public_address: bool,
    /// How the executor connects to each cluster the provider creates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connect: Option<ConnectSection>,
}

impl Default for ProviderSection {
    fn default() -> Self {
        ProviderSection {
            dry_run: false,
            kind: String::new(),
            region: "us-east-1".into(),
            endpoint_url: None,
            attempts_max: 4,
            poll_interval_ms: 5_000,
            ready_timeout_s: 900,
            name_prefix: "slogate".into(),
            namespace: String::new(),
            publicly_accessible: false,
            node_type: "ra3.xlplus".into(),
            rpu_per_node: 8,
            master_username: "slogate".into(),
            master_password_env: None,
            pause_instead_of_delete: false,
            launch_template: String::new(),
            instance_types: std::collections::BTreeMap::new(),
            service_port: 5432,
            public_address: false,
            connect: None,
        }
    }
}

impl ProviderSection {
    /// The platform this section names, with secrets from `env`; `key`
    /// names the section in errors. `None` for the backend's own provider.
    pub fn platform(&self, env: &dyn Strings, key: &str) -> Result<Option<slogate_cloud::platform::Platform>> {
        use slogate_cloud::platform::{Ec2Settings, Platform, RedshiftSettings, ServerlessSettings};
        Ok(Some(match self.kind.as_str() {
            "" => return Ok(None),
            "redshift-serverless" => Platform::Serverless(ServerlessSettings {
                producer_namespace: (!self.namespace.is_empty()).then(|| self.namespace.clone()),
                admin_username: self.master_username.clone(),
                admin_password: self.master_password(env, key)?,
                database: self.connect.as_ref().map_or_else(|| "dev".to_owned(), |c| c.database.clone()),
                publicly_accessible: self.publicly_accessible,
                port: None,
            }),
            "redshift" => {
                let master_password = self.master_password(env, key)?;
                Platform::Redshift(RedshiftSettings {
                    node_type: self.node_type.clone(),
                    rpu_per_node: self.rpu_per_node,
                    master_username: self.master_username.clone(),
                    master_password,
                    database: self.connect.as_ref().map_or_else(|| "dev".to_owned(), |c| c.database.clone()),
                    pause_instead_of_delete: self.pause_instead_of_delete,
                })
            }
            "ec2" => Platform::Ec2(Ec2Settings {
                launch_template: self.launch_template.clone(),
                instance_types: self.instance_types.iter().filter_map(|(size, t)| Some((size.parse().ok()?, t.clone()))).collect(),
                service_port: self.service_port,
                public_address: self.public_address,
            }),
            other => return Err(invalid(&format!("{key}.kind"), format!("`{other}` is not one of {}", CLOUD_PROVIDERS.join(", ")))),
        }))
    }

    /// The admin password, from `master_password_env`.
    fn master_password(&self, env: &dyn Strings, key: &str) -> Result<String> {
        let variable = self.master_password_env.as_deref().unwrap_or_default();
        env.get(variable).ok_or_else(|| invalid(&format!("{key}.master_password_env"), format!("the environment variable `{variable}` is not set")))
    }

    /// Where and how the AWS SDK calls.
    pub fn aws(&self) -> slogate_cloud::platform::AwsSettings {
        slogate_cloud::platform::AwsSettings {
            region: self.region.clone(),
            endpoint_url: self.endpoint_url.clone(),
            attempts_max: self.attempts_max,
            ..slogate_cloud::platform::AwsSettings::default()
        }
    }
}

/// The cloud providers a postgres pool can name.
pub const CLOUD_PROVIDERS: [&str; 3] = ["redshift-serverless", "redshift", "ec2"];

/// `[pool.provider.connect]`: the database, user, password, TLS and
/// connection limit of every cluster a cloud provider creates (its host
/// and port come from the provider).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectSection {
    /// Database.
    pub database: String,
    /// User.
    pub user: String,
    /// TLS: `disable`, `require` or `verify-full`.
    #[serde(default = "default_tls")]
    pub tls: String,
    /// PEM certificates `verify-full` trusts instead of the bundled roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Connections at most per cluster.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// The environment variable holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// The file holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// Statements each new cluster runs once before it takes queries (a
    /// Serverless cluster attaching the producer's datashare: `CREATE
    /// DATABASE shared FROM DATASHARE s OF NAMESPACE '…'`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub setup_sql: Vec<String>,
}

impl ConnectSection {
    /// As an endpoint section with no host or size yet.
    pub fn as_endpoint(&self) -> EndpointSection {
        EndpointSection {
            host: String::new(),
            port: 0,
            database: self.database.clone(),
            user: self.user.clone(),
            tls: self.tls.clone(),
            ca_file: self.ca_file.clone(),
            size_rpu: 0,
            connections: self.connections,
            password_env: self.password_env.clone(),
            password_file: self.password_file.clone(),
        }
    }
}

/// `[pool.caps]`: most clusters, RPU and spend per hour the pool may hold,
/// whatever its autoscaler or an operator asks; 0 is no cap. A spinup past
/// one is refused, and the refusal is a scaling decision with its reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CapsSection {
    /// Most live clusters.
    pub clusters_max: usize,
    /// Most RPU over the live clusters.
    pub rpu_total_max: u32,
    /// Most dollars an hour, every live cluster billed for the whole hour
    /// at the pool's price.
    pub spend_per_hour_max_usd: f64,
}

impl CapsSection {
    /// The caps as the router checks them, with the price the spend cap
    /// counts at; `key` names the section in errors.
    pub fn to_core(&self, key: &str, price_per_rpu_hour_usd: f64) -> Result<slogate_actors::router::PoolCaps> {
        let spend = self.spend_per_hour_max_usd;
        if !(spend.is_finite() && spend >= 0.0) {
            return Err(invalid(&format!("{key}.spend_per_hour_max_usd"), format!("must be a finite number ≥ 0, got {spend}")));
        }
        Ok(slogate_actors::router::PoolCaps {
            caps: slogate_core::scale::caps::Caps {
                clusters_max: (self.clusters_max > 0).then_some(self.clusters_max),
                rpu_total_max: (self.rpu_total_max > 0).then_some(self.rpu_total_max),
                spend_per_hour_max_usd: (spend > 0.0).then_some(spend),
            },
            price_per_rpu_hour_usd,
        })
    }
}

impl PoolSection {
    /// The shard that owns the pool at `index` in the file, of `shards`.
    pub fn shard_index(&self, index: usize, shards: usize) -> usize {
        self.shard.unwrap_or(index % shards.max(1))
    }

    /// The pool's caps, counted at its price per RPU-hour.
    pub fn caps(&self, index: usize) -> Result<slogate_actors::router::PoolCaps> {
        let price = match self.provisioned_billing() {
            Some(provisioned) => provisioned.price_per_hour_usd,
            None => slogate_core::billing::BillingConfig::default().price_per_rpu_hour_usd,
        };
        self.caps.to_core(&format!("pool[{index}].caps"), price)
    }

    /// The provisioned clusters' billing, if the pool bills so.
    pub fn provisioned_billing(&self) -> Option<slogate_core::elastic::ProvisionedBilling> {
        (self.billing == "provisioned").then(|| slogate_core::elastic::ProvisionedBilling {
            price_per_hour_usd: self.provisioned_price_per_rpu_hour_usd,
            minimum: slogate_core::time::Duration::from_secs(60),
        })
    }

    /// Shadow mode's acting policy, or `None` in active mode.
    pub fn shadow_of(&self) -> Option<slogate_core::route::BaselinePolicy> {
        if self.mode == "shadow" { slogate_core::route::BaselinePolicy::from_name(&self.baseline) } else { None }
    }

    /// What the policy tuner plans pool `index` with (its starting clusters,
    /// autoscaler, billing and elastic tier, and the platform's published
    /// delays), and the autoscaler knobs it starts from. The live Tuner and
    /// `slogate tune` share it.
    pub fn planner_setup(&self, index: usize) -> Result<(slogate_core::tune::BatchSetup, slogate_core::scale::AutoscalerConfig)> {
        let (knobs, policy) = self.autoscale.to_core(&format!("pool[{index}].autoscale"))?;
        let elastic = if self.elastic.enabled { Some(self.elastic.to_core(&format!("pool[{index}].elastic"))?.config) } else { None };
        let terms = slogate_core::tune::PlannerTerms {
            spinup_delay: knobs.spinup_delay,
            provisioned: self.provisioned_billing(),
            elastic,
            ..slogate_core::tune::PlannerTerms::default()
        };
        let setup = slogate_core::tune::BatchSetup {
            initial_clusters: self.clusters.iter().copied().map(slogate_core::model::Rpu).collect(),
            policy,
            billing: slogate_core::billing::BillingConfig::default(),
            terms,
            threads: self.tune.threads,
        };
        Ok((setup, knobs))
    }
}

/// `[[pool.endpoint]]`: one server of a postgres pool. Its password is
/// never in the file: `password_env` names an environment variable, or
/// `password_file` a file, that holds it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointSection {
    /// Host name or address.
    pub host: String,
    /// TCP port (Redshift listens on 5439).
    #[serde(default = "default_pg_port")]
    pub port: u16,
    /// Database.
    pub database: String,
    /// User.
    pub user: String,
    /// TLS, as libpq's `sslmode`: `disable`, `require` (encrypted, the
    /// certificate unchecked) or `verify-full` (the certificate must chain
    /// to `ca_file`, or to the bundled Mozilla roots, and name the host).
    #[serde(default = "default_tls")]
    pub tls: String,
    /// PEM certificates `verify-full` trusts instead of the bundled roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// Its size, RPU (billing and the predictor's size features).
    pub size_rpu: u32,
    /// Connections at most: the cluster's concurrency limit; slogate
    /// queues beyond it.
    #[serde(default = "default_connections")]
    pub connections: usize,
    /// The environment variable holding the password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
    /// The file holding the password (trailing newline ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
}

fn default_pg_port() -> u16 {
    5432
}

fn default_tls() -> String {
    "disable".into()
}

fn default_connections() -> usize {
    4
}

fn default_backend() -> String {
    "emulated".into()
}

impl EndpointSection {
    /// The password, read from where the file says; `None` when it names
    /// no source (trust or peer authentication).
    ///
    /// # Errors
    ///
    /// [`Error::Config`] naming the key when the variable is unset or the
    /// file unreadable. The password itself is never in an error.
    pub fn password(&self, env: &dyn Strings, key: &str) -> Result<Option<String>> {
        if let Some(variable) = &self.password_env {
            return env
                .get(variable)
                .map(Some)
                .ok_or_else(|| invalid(&format!("{key}.password_env"), format!("the environment variable `{variable}` is not set")));
        }
        if let Some(path) = &self.password_file {
            let text = std::fs::read_to_string(path).map_err(|e| invalid(&format!("{key}.password_file"), format!("cannot read {}: {e}", path.display())))?;
            return Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()));
        }
        Ok(None)
    }

    /// The executor's endpoint, with its password resolved.
    pub fn to_endpoint(&self, env: &dyn Strings, key: &str) -> Result<crate::backend::postgres::Endpoint> {
        Ok(crate::backend::postgres::Endpoint {
            host: self.host.clone(),
            port: self.port,
            database: self.database.clone(),
            user: self.user.clone(),
            password: self.password(env, key)?,
            size: slogate_core::model::Rpu(self.size_rpu),
            connections: self.connections,
            tls: match self.tls.as_str() {
                "require" => crate::backend::postgres::TlsMode::Require,
                "verify-full" => crate::backend::postgres::TlsMode::VerifyFull { ca_file: self.ca_file.clone() },
                _ => crate::backend::postgres::TlsMode::Disable,
            },
        })
    }
}

/// `[pool.postgres]`: a postgres pool's executor settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PostgresSection {
    /// The query timeout, seconds: the server's `statement_timeout`, and
    /// the longest a query waits for a connection.
    pub query_timeout_s: f64,
    /// Rows returned per query at most (the response says when it was
    /// truncated).
    pub result_rows_max: usize,
    /// Bytes of values returned per query at most.
    pub result_bytes_max: usize,
    /// Between health checks of each server, milliseconds.
    pub health_check_interval_ms: u64,
    /// Connecting gives up after this, milliseconds.
    pub connect_timeout_ms: u64,
    /// A directory of SQL files (`17.sql` or `query17.sql`), the text of
    /// the pool's named templates: a submission by template number runs
    /// its text, and submitted text that matches one is that template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub catalog_dir: Option<PathBuf>,
}

impl Default for PostgresSection {
    fn default() -> Self {
        PostgresSection {
            query_timeout_s: 3_600.0,
            result_rows_max: 1_000,
            result_bytes_max: 1 << 20,
            health_check_interval_ms: 1_000,
            connect_timeout_ms: 5_000,
            catalog_dir: None,
        }
    }
}

impl PostgresSection {
    /// The executor's settings; an error names the key.
    pub fn to_settings(&self, prefix: &str) -> Result<crate::backend::postgres::PostgresSettings> {
        let key = |name: &str| format!("{prefix}.{name}");
        if !(self.query_timeout_s.is_finite() && self.query_timeout_s >= 0.001 && self.query_timeout_s <= 7.0 * 86_400.0) {
            return Err(invalid(&key("query_timeout_s"), format!("must be between 0.001 and 604800 seconds, got {}", self.query_timeout_s)));
        }
        for (name, value) in [
            ("result_rows_max", self.result_rows_max as u64),
            ("result_bytes_max", self.result_bytes_max as u64),
            ("health_check_interval_ms", self.health_check_interval_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(&key(name), "must be at least 1"));
            }
        }
        Ok(crate::backend::postgres::PostgresSettings {
            query_timeout: std::time::Duration::from_secs_f64(self.query_timeout_s),
            result_rows_max: self.result_rows_max,
            result_bytes_max: self.result_bytes_max,
            health_check_interval: std::time::Duration::from_millis(self.health_check_interval_ms),
            connect_timeout: std::time::Duration::from_millis(self.connect_timeout_ms),
        })
    }
}

/// `[pool.retrain]`: an `iconq` pool's Retrainer (builds with the trainer,
/// feature `learn`): it retrains the model from the pool's execution log
/// on demand (`POST /v1/pools/{pool}/predictor/retrain`) and every
/// `every_hours`, and swaps the new model in only when it scores no worse
/// on held-out executions than the model in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrainSection {
    /// Real hours between scheduled runs; 0 for on demand only.
    pub every_hours: f64,
    /// The fewest of the pool's executions (logged with their timeline) a
    /// run trains on.
    pub min_executions: usize,
    /// Optimiser steps per run.
    pub steps: usize,
}

impl Default for RetrainSection {
    fn default() -> Self {
        RetrainSection { every_hours: 0.0, min_executions: 500, steps: 2_000 }
    }
}

/// `[pool.tune]`: the policy tuner (AutoSLO §7). Needs `[pool.autoscale]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TuneSection {
    /// Whether the pool has a Tuner (runs on demand through `POST
    /// /v1/pools/{pool}/tune`, and every `every_hours`).
    pub enabled: bool,
    /// Real hours between scheduled runs; 0 for on demand only.
    pub every_hours: f64,
    /// Days of history each run reads from the reservoir.
    pub history_days: u32,
    /// Forecast days per run (60% train, 40% validate).
    pub scenarios: usize,
    /// The configuration tuner's strategy: `grid`, `random`,
    /// `coordinate-descent` or `adaptive-batch`.
    pub strategy: String,
    /// Configurations at most, for `random` and `adaptive-batch`.
    pub budget: usize,
    /// The spinup scheduler's greedy rounds at most.
    pub rounds: usize,
    /// The violation rate the tuner plans for (below the pool's τ, for
    /// headroom).
    pub target: f64,
    /// Simulations at once.
    pub threads: usize,
}

impl Default for TuneSection {
    fn default() -> Self {
        let core = slogate_core::tune::TuningConfig::default();
        TuneSection {
            enabled: false,
            every_hours: 24.0,
            history_days: 30,
            scenarios: core.forecast.scenarios,
            strategy: "coordinate-descent".into(),
            budget: 32,
            rounds: core.scheduler.rounds,
            target: slogate_core::tune::PLANNING_TARGET,
            threads: 2,
        }
    }
}

impl TuneSection {
    /// Core's pipeline settings; an error names the key.
    pub fn to_core(&self, prefix: &str, seed: u64) -> Result<slogate_core::tune::TuningConfig> {
        use slogate_core::tune::{TuneStrategy, TuningConfig};
        let key = |name: &str| format!("{prefix}.{name}");
        let strategy = match self.strategy.as_str() {
            "grid" => TuneStrategy::Grid,
            "random" => TuneStrategy::Random { budget: self.budget.max(1) },
            "coordinate-descent" => TuneStrategy::CoordinateDescent { sweeps: 2 },
            "adaptive-batch" => TuneStrategy::AdaptiveBatch { initial: 4, budget: self.budget.max(1) },
            other => return Err(invalid(&key("strategy"), format!("`{other}` is not one of grid, random, coordinate-descent, adaptive-batch"))),
        };
        if !(self.every_hours.is_finite() && self.every_hours >= 0.0) {
            return Err(invalid(&key("every_hours"), format!("must be 0 or more hours, got {}", self.every_hours)));
        }
        if !(0.0..=1.0).contains(&self.target) {
            return Err(invalid(&key("target"), format!("must be a rate in [0, 1], got {}", self.target)));
        }
        for (name, value) in [("scenarios", self.scenarios), ("threads", self.threads), ("rounds", self.rounds)] {
            if value == 0 {
                return Err(invalid(&key(name), "must be at least 1"));
            }
        }
        let mut config = TuningConfig::default();
        config.forecast.scenarios = self.scenarios.max(2);
        config.forecast.seed = seed;
        config.scheduler.rounds = self.rounds;
        config.scheduler.target = self.target;
        config.tuner.strategy = strategy;
        config.tuner.target = self.target;
        config.tuner.seed = seed;
        Ok(config)
    }
}

/// `[[pool.autoscale.scheduled]]`: a planned spinup every day.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduledSection {
    /// Seconds after 00:00 UTC.
    pub at_s: u32,
    /// Size, RPU.
    pub size: u32,
}

/// `[pool.elastic]`: the elastic (serverless) tier and offload options.
/// Defaults: `core::elastic::ElasticConfig` (AWS Lambda's x86 prices).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ElasticSection {
    /// Whether queries may be offloaded (needs slogate, slogate-reserve,
    /// stage-cost, spandana or spandana-central).
    pub enabled: bool,
    /// The SLO Director's queue bound (policies `spandana` and
    /// `spandana-central`): outstanding queries per 16 RPU of a cluster
    /// before it offloads.
    pub director_queue_per_16_rpu: f64,
    /// Elastic spend per rolling hour at most, dollars; 0 for no cap.
    pub spend_cap_usd_per_hour: f64,
    /// Templates that may run elastically; empty for all.
    pub templates: Vec<u32>,
    /// Extra latency without a warm instance, milliseconds.
    pub cold_start_ms: u64,
    /// How long an idle instance stays warm, seconds.
    pub keep_alive_s: u64,
    /// The cluster size the tier's speed is relative to, RPU.
    pub reference_rpu: u32,
    /// Speed relative to that size (0.5: twice as long).
    pub speed_factor: f64,
    /// Invocations running at once at most.
    pub concurrency_limit: u32,
    /// Workers one query fans out to.
    pub workers_per_query: u32,
    /// Memory per worker, MB.
    pub memory_mb: u32,
    /// Price per request, dollars.
    pub price_per_request_usd: f64,
    /// Price per GB-second, dollars.
    pub price_per_gb_second_usd: f64,
    /// The tier: `""` (the emulated warehouse's own) or `lambda` (AWS
    /// Lambda, for a postgres pool; a build with the `aws` feature; region
    /// and endpoint from `[pool.provider]`).
    pub tier: String,
    /// The Lambda function each offload invokes.
    pub lambda_function: String,
}

impl ElasticSection {
    /// The Lambda tier's settings.
    pub fn lambda(&self) -> slogate_cloud::platform::LambdaSettings {
        slogate_cloud::platform::LambdaSettings {
            function: self.lambda_function.clone(),
            concurrency_limit: self.concurrency_limit,
            memory_mb: self.memory_mb,
            price_per_gb_second_usd: self.price_per_gb_second_usd,
            price_per_request_usd: self.price_per_request_usd,
        }
    }

    /// Checks a postgres pool's tier: only Lambda, with its function.
    fn validate_real(&self, key: &dyn Fn(&str) -> String) -> Result<()> {
        if !self.enabled {
            return Ok(());
        }
        match self.tier.as_str() {
            "lambda" if self.lambda_function.is_empty() => Err(invalid(&key("elastic.lambda_function"), "the Lambda tier names the function each offload invokes")),
            "lambda" => Ok(()),
            "" => Err(invalid(&key("elastic.tier"), "a postgres pool's elastic tier is AWS Lambda: set tier = \"lambda\" and lambda_function")),
            other => Err(invalid(&key("elastic.tier"), format!("`{other}` is not a tier (lambda)"))),
        }
    }
}

impl Default for ElasticSection {
    fn default() -> Self {
        let core = slogate_core::elastic::ElasticConfig::default();
        ElasticSection {
            enabled: false,
            director_queue_per_16_rpu: slogate_core::route::director::DEFAULT_QUEUE_PER_16_RPU,
            spend_cap_usd_per_hour: 0.0,
            templates: Vec::new(),
            cold_start_ms: core.cold_start.as_micros() / 1_000,
            keep_alive_s: core.keep_alive.as_micros() / 1_000_000,
            reference_rpu: core.reference_size.0,
            speed_factor: core.speed_factor,
            concurrency_limit: core.concurrency_limit,
            workers_per_query: core.workers_per_query,
            memory_mb: core.memory_mb,
            price_per_request_usd: core.price_per_request_usd,
            price_per_gb_second_usd: core.price_per_gb_second_usd,
            tier: String::new(),
            lambda_function: String::new(),
        }
    }
}

impl ElasticSection {
    /// Core's options; an error names the key (`prefix` is the section's
    /// path).
    pub fn to_core(&self, prefix: &str) -> Result<slogate_core::route::elastic::ElasticOptions> {
        use slogate_core::elastic::ElasticConfig;
        use slogate_core::model::{Rpu, TemplateId};
        use slogate_core::time::Duration;
        let key = |name: &str| format!("{prefix}.{name}");
        if !(self.speed_factor.is_finite() && self.speed_factor > 0.0) {
            return Err(invalid(&key("speed_factor"), format!("must be positive, got {}", self.speed_factor)));
        }
        for (name, value) in [("concurrency_limit", self.concurrency_limit), ("workers_per_query", self.workers_per_query), ("memory_mb", self.memory_mb)] {
            if value == 0 {
                return Err(invalid(&key(name), "must be at least 1"));
            }
        }
        let bound = self.director_queue_per_16_rpu;
        if !(bound.is_finite() && bound > 0.0) {
            return Err(invalid(&key("director_queue_per_16_rpu"), format!("must be positive, got {bound}")));
        }
        if self.reference_rpu == 0 || self.reference_rpu > 1_024 {
            return Err(invalid(&key("reference_rpu"), "must be in 1–1024 RPU"));
        }
        for (name, value) in [
            ("spend_cap_usd_per_hour", self.spend_cap_usd_per_hour),
            ("price_per_request_usd", self.price_per_request_usd),
            ("price_per_gb_second_usd", self.price_per_gb_second_usd),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(&key(name), format!("must be a non-negative amount, got {value}")));
            }
        }
        Ok(slogate_core::route::elastic::ElasticOptions {
            config: ElasticConfig {
                cold_start: Duration::from_millis(self.cold_start_ms),
                keep_alive: Duration::from_secs(self.keep_alive_s),
                reference_size: Rpu(self.reference_rpu),
                speed_factor: self.speed_factor,
                concurrency_limit: self.concurrency_limit,
                workers_per_query: self.workers_per_query,
                memory_mb: self.memory_mb,
                price_per_request_usd: self.price_per_request_usd,
                price_per_gb_second_usd: self.price_per_gb_second_usd,
            },
            spend_cap_usd_per_hour: (self.spend_cap_usd_per_hour > 0.0).then_some(self.spend_cap_usd_per_hour),
            templates: (!self.templates.is_empty()).then(|| self.templates.iter().copied().map(TemplateId).collect()),
        })
    }
}

/// `[pool.autoscale]`: the knobs of AutoSLO §6, defaults from its reference
/// configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleSection {
    /// Whether the pool autoscales (needs a predicting policy: slogate,
    /// slogate-reserve or stage-cost).
    pub enabled: bool,
    /// Spinup trigger: `projected` (Algorithm 2), `observed` (completions
    /// only) or `queue` (outstanding queries ≥ `queue_threshold`).
    pub trigger: String,
    /// Outstanding queries that fire the `queue` trigger.
    pub queue_threshold: usize,
    /// Whether idle clusters are torn down.
    pub teardown: bool,
    /// Never tear down the last ready cluster (off lets an idle pool scale
    /// to zero: queries then fail with a reason until a spinup is ready).
    pub keep_last_cluster: bool,
    /// T_idle, seconds.
    pub idle_teardown_s: u64,
    /// T_min_lifetime, seconds.
    pub min_lifetime_s: u64,
    /// τ_trigger.
    pub trigger_target: f64,
    /// θ.
    pub min_observations: usize,
    /// The trigger judges latencies against the SLO times this.
    pub trigger_slo_tightening: f64,
    /// μ.
    pub completions: usize,
    /// w, seconds.
    pub window_s: u64,
    /// Sizes the selector may choose, RPU.
    pub sizes: Vec<u32>,
    /// Starting or Ready clusters at most.
    pub max_clusters: usize,
    /// δ the selector plans with, seconds.
    pub spinup_delay_s: u64,
    /// τ_target.
    pub target: f64,
    /// Copies of the arrival window the selector replays at most.
    pub max_replay_copies: usize,
    /// The selector's replay stops this long after the new cluster is
    /// ready, seconds.
    pub replay_horizon_s: u64,
    /// Clusters one selection may add at once when no single one gets the
    /// selector's replay under the target.
    pub max_spinups_at_once: usize,
    /// Scale-in by replay: drain a cluster, or make the pool's one cluster
    /// smaller, when the replay says the pool still meets
    /// `scale_in_target` for less.
    pub scale_in: bool,
    /// How often scale-in replays the pool at most, seconds.
    pub scale_in_interval_s: u64,
    /// The violation rate a scale-in must keep in the replay.
    pub scale_in_target: f64,
    /// Threads the selector evaluates candidates on.
    pub selector_threads: usize,
    /// Planned spinups every day (what `slogate tune` writes).
    pub scheduled: Vec<ScheduledSection>,
}

impl Default for AutoscaleSection {
    fn default() -> Self {
        let core = slogate_core::scale::AutoscalerConfig::default();
        AutoscaleSection {
            enabled: false,
            trigger: "projected".into(),
            queue_threshold: 32,
            teardown: true,
            keep_last_cluster: core.keep_last_cluster,
            idle_teardown_s: core.idle_teardown.as_micros() / 1_000_000,
            min_lifetime_s: core.min_lifetime.as_micros() / 1_000_000,
            trigger_target: core.trigger_target,
            min_observations: core.min_observations,
            trigger_slo_tightening: core.trigger_slo_tightening,
            completions: core.completions,
            window_s: core.window.as_micros() / 1_000_000,
            sizes: core.sizes.iter().map(|s| s.0).collect(),
            max_clusters: core.max_clusters,
            spinup_delay_s: core.spinup_delay.as_micros() / 1_000_000,
            target: core.target,
            max_replay_copies: core.max_replay_copies,
            replay_horizon_s: core.replay_horizon.as_micros() / 1_000_000,
            max_spinups_at_once: core.max_spinups_at_once,
            scale_in: core.scale_in,
            scale_in_interval_s: core.scale_in_interval.as_micros() / 1_000_000,
            scale_in_target: core.scale_in_target,
            selector_threads: core.selector_threads,
            scheduled: Vec::new(),
        }
    }
}

impl AutoscaleSection {
    /// Core's knobs and strategy; an error names the key (`prefix` is the
    /// section's path).
    pub fn to_core(&self, prefix: &str) -> Result<(slogate_core::scale::AutoscalerConfig, slogate_core::scale::AutoscalerPolicy)> {
        use slogate_core::model::Rpu;
        use slogate_core::scale::{AutoscalerConfig, AutoscalerPolicy, ScaleAction, SpinupPolicy};
        use slogate_core::time::Duration;
        let key = |name: &str| format!("{prefix}.{name}");
        let spinup = match self.trigger.as_str() {
            "projected" => SpinupPolicy::Projected,
            "observed" => SpinupPolicy::Observed,
            "queue" => SpinupPolicy::QueueLength { threshold: self.queue_threshold.max(1) },
            other => return Err(invalid(&key("trigger"), format!("`{other}` is not one of projected, observed, queue"))),
        };
        for (name, value) in [("trigger_target", self.trigger_target), ("target", self.target), ("scale_in_target", self.scale_in_target)] {
            if !(0.0..=1.0).contains(&value) {
                return Err(invalid(&key(name), format!("must be a rate in [0, 1], got {value}")));
            }
        }
        if !(self.trigger_slo_tightening > 0.0 && self.trigger_slo_tightening <= 1.0) {
            return Err(invalid(&key("trigger_slo_tightening"), format!("must be in (0, 1], got {}", self.trigger_slo_tightening)));
        }
        if self.sizes.is_empty() || self.sizes.iter().any(|&s| s == 0 || s > 1_024) {
            return Err(invalid(&key("sizes"), "needs one or more sizes in 1–1024 RPU"));
        }
        for (name, value) in [
            ("min_observations", self.min_observations),
            ("completions", self.completions),
            ("max_clusters", self.max_clusters),
            ("max_replay_copies", self.max_replay_copies),
            ("selector_threads", self.selector_threads),
            ("max_spinups_at_once", self.max_spinups_at_once),
            ("window_s", self.window_s as usize),
            ("scale_in_interval_s", self.scale_in_interval_s as usize),
        ] {
            if value == 0 {
                return Err(invalid(&key(name), "must be at least 1"));
            }
        }
        let config = AutoscalerConfig {
            idle_teardown: Duration::from_secs(self.idle_teardown_s),
            min_lifetime: Duration::from_secs(self.min_lifetime_s),
            keep_last_cluster: self.keep_last_cluster,
            trigger_target: self.trigger_target,
            min_observations: self.min_observations,
            trigger_slo_tightening: self.trigger_slo_tightening,
            completions: self.completions,
            window: Duration::from_secs(self.window_s),
            max_window_entries: 10_000,
            sizes: self.sizes.iter().copied().map(Rpu).collect(),
            max_clusters: self.max_clusters,
            spinup_delay: Duration::from_secs(self.spinup_delay_s),
            target: self.target,
            max_replay_copies: self.max_replay_copies,
            replay_horizon: Duration::from_secs(self.replay_horizon_s),
            max_spinups_at_once: self.max_spinups_at_once,
            scale_in: self.scale_in,
            scale_in_interval: Duration::from_secs(self.scale_in_interval_s),
            scale_in_target: self.scale_in_target,
            selector_threads: self.selector_threads,
        };
        Ok((config, AutoscalerPolicy { spinup, action: ScaleAction::Select, teardown: self.teardown }))
    }

    /// The planned daily spinups; an error names the key.
    pub fn schedule(&self, prefix: &str) -> Result<Vec<slogate_core::scale::ScheduledSpinup>> {
        self.scheduled
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if s.at_s >= 86_400 {
                    return Err(invalid(&format!("{prefix}.scheduled[{i}].at_s"), format!("must be under 86400 (a time of day), got {}", s.at_s)));
                }
                if s.size == 0 || s.size > 1_024 {
                    return Err(invalid(&format!("{prefix}.scheduled[{i}].size"), "must be 1–1024 RPU"));
                }
                Ok(slogate_core::scale::ScheduledSpinup {
                    at: slogate_core::time::Instant::from_secs_f64(f64::from(s.at_s)),
                    size: slogate_core::model::Rpu(s.size),
                })
            })
            .collect()
    }
}

fn default_billing() -> String {
    "usage".to_owned()
}

fn default_provisioned_price() -> f64 {
    0.375
}

fn default_mode() -> String {
    "active".into()
}

fn default_baseline() -> String {
    "round-robin".into()
}

fn default_predictor() -> String {
    "concurrency-aware".into()
}

fn default_policy() -> String {
    BaselinePolicy::LeastLoaded.name().to_owned()
}

impl Default for NodeSection {
    fn default() -> Self {
        NodeSection {
            grpc_addr: "127.0.0.1:50051".into(),
            admin_addr: "127.0.0.1:8080".into(),
            data_dir: PathBuf::from("./data"),
            time_compression: 6.0,
            admin_token: String::new(),
            reads_require_token: false,
            seed: 1,
            calendar: "wall".into(),
            tls_cert_path: None,
            tls_key_path: None,
            grpc_threads: 0,
            router_shards: 1,
            onnxruntime_path: None,
        }
    }
}

impl Default for LimitsSection {
    fn default() -> Self {
        LimitsSection {
            in_flight_per_pool_max: 10_000,
            payload_bytes_max: 1 << 20,
            slo_ms_max: 24 * 3_600 * 1_000,
            mailbox_capacity: 65_536,
            decisions_kept: 1_000,
            idempotency_kept: 100_000,
            idempotency_retention_h: 24.0,
            templates_per_pool_max: 10_000,
            clusters_per_pool_max: 64,
            shutdown_grace_s: 30,
            shutdown_close_s: 5,
            grpc_connections_max: 1_024,
            grpc_streams_per_connection_max: 1_024,
            grpc_in_flight_per_connection_max: 1_024,
            stream_in_flight_max: 256,
            // Room for the largest valid request: a full payload and SQL
            // text, with labels and the rest.
            grpc_message_bytes_max: (2 << 20) + (64 << 10),
            grpc_handshake_timeout_s: 10,
            grpc_idle_timeout_s: 600,
            grpc_keepalive_interval_s: 60,
            grpc_keepalive_timeout_s: 20,
            pool_name_bytes_max: 64,
            labels_max: 32,
            labels_bytes_max: 4_096,
            sql_bytes_max: 1 << 20,
        }
    }
}

impl Default for ReservoirSection {
    fn default() -> Self {
        ReservoirSection {
            arrival_samples_per_hour_max: 4_096,
            flush_every: 256,
            executions_kept_max: 1_000_000,
            execution_retention_h: 720.0,
            cache_mb: 64,
            history_days: 35.0,
            backlog_max: 16_384,
        }
    }
}

impl Default for ConfigV1 {
    fn default() -> Self {
        ConfigV1 {
            node: NodeSection::default(),
            limits: LimitsSection::default(),
            reservoir: ReservoirSection::default(),
            pool: vec![PoolSection {
                name: "default".into(),
                policy: default_policy(),
                mode: default_mode(),
                baseline: default_baseline(),
                predictor: default_predictor(),
                model: None,
                retrain: RetrainSection::default(),
                backend: default_backend(),
                clusters: vec![16, 16],
                endpoint: Vec::new(),
                postgres: PostgresSection::default(),
                billing: default_billing(),
                provisioned_price_per_rpu_hour_usd: default_provisioned_price(),
                autoscale: AutoscaleSection::default(),
                elastic: ElasticSection::default(),
                tune: TuneSection::default(),
                shard: None,
                caps: CapsSection::default(),
                provider: ProviderSection::default(),
                violation_budget: None,
            }],
            tenant: Vec::new(),
            fleet: FleetSection::default(),
        }
    }
}

/// Flags that override the file and environment.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    /// `--grpc-addr`.
    pub grpc_addr: Option<String>,
    /// `--admin-addr`.
    pub admin_addr: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<PathBuf>,
    /// `--warm-from`.
    pub warm_from: Option<PathBuf>,
    /// `--repair`.
    pub repair: bool,
}

/// The validated configuration a node runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// Admin listen address.
    pub admin_addr: SocketAddr,
    /// Data directory.
    pub data_dir: PathBuf,
    /// An execution log or a trace the learned policies warm up on besides
    /// the node's own log (`slogate serve --warm-from`).
    pub warm_from: Option<PathBuf>,
    /// Open a damaged reservoir anyway, keeping what is left
    /// (`slogate serve --repair`).
    pub repair: bool,
    /// Everything else, as validated.
    pub file: ConfigV1,
}

fn invalid(key: &str, reason: impl std::fmt::Display) -> Error {
    Error::Config(format!("`{key}`: {reason}"))
}

/// A parse error with the key and line it happened at: serde's message
/// alone ("invalid type: string, expected usize") does not say where.
fn located(toml_text: &str, error: &toml::de::Error) -> Error {
    let Some(span) = error.span() else { return Error::Config(error.message().to_owned()) };
    let before = &toml_text[..span.start.min(toml_text.len())];
    let line_number = before.matches('\n').count() + 1;
    let line = toml_text.lines().nth(line_number - 1).unwrap_or_default();
    let table = before
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('['))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    let key = line.split_once('=').map(|(k, _)| k.trim().to_owned()).filter(|k| !k.is_empty() && !k.starts_with('['));
    let name = match (table, key) {
        (Some(table), Some(key)) => format!("{table}.{key}"),
        (None, Some(key)) => key,
        (Some(table), None) => table,
        (None, None) => return Error::Config(format!("line {line_number}: {}", error.message())),
    };
    invalid(&name, format!("line {line_number}: {}", error.message()))
}

impl NodeConfig {
    /// The environment variables a node reads, each overriding one key.
    pub const ENVIRONMENT_KEYS: &'static [&'static str] = &[
        "SLOGATE_GRPC_ADDR",
        "SLOGATE_ADMIN_ADDR",
        "SLOGATE_DATA_DIR",
        "SLOGATE_TIME_COMPRESSION",
        "SLOGATE_ADMIN_TOKEN",
        "SLOGATE_NODE_ID",
        "SLOGATE_ADVERTISE_ADDR",
    ];

    /// Parses `toml_text` (empty for the embedded defaults), applies `env`
    /// and `overrides`, and validates.
    pub fn load(toml_text: &str, env: &dyn Strings, overrides: &Overrides) -> Result<NodeConfig> {
        let mut file = if toml_text.trim().is_empty() {
            ConfigV1::default()
        } else {
            let value: toml::Table = toml::from_str(toml_text).map_err(|e| Error::Config(e.message().to_owned()))?;
            match value.get("version").and_then(|v| v.as_str()) {
                Some("1") => {}
                Some(other) => return Err(invalid("version", format!("unsupported version \"{other}\" (this build reads \"1\")"))),
                None => return Err(invalid("version", "missing; write version = \"1\" at the top")),
            }
            // Version 1: the rest is a `ConfigV1`. Read it from the text with
            // the version line blanked (same offsets), so that an error's
            // span still points into the operator's file.
            #[derive(Deserialize)]
            struct Version {
                version: toml::Spanned<String>,
            }
            let version: Version = toml::from_str(toml_text).map_err(|e| Error::Config(e.message().to_owned()))?;
            let span = version.version.span();
            let line_start = toml_text[..span.start].rfind('\n').map_or(0, |i| i + 1);
            let line_end = toml_text[span.end..].find('\n').map_or(toml_text.len(), |i| span.end + i);
            let mut rest = toml_text.to_owned();
            rest.replace_range(line_start..line_end, &" ".repeat(line_end - line_start));
            toml::from_str::<ConfigV1>(&rest).map_err(|e| located(toml_text, &e))?
        };
        let node = &mut file.node;
        if let Some(v) = env.get("SLOGATE_GRPC_ADDR") {
            node.grpc_addr = v;
        }
        if let Some(v) = env.get("SLOGATE_ADMIN_ADDR") {
            node.admin_addr = v;
        }
        if let Some(v) = env.get("SLOGATE_DATA_DIR") {
            node.data_dir = PathBuf::from(v);
        }
        if let Some(v) = env.get("SLOGATE_TIME_COMPRESSION") {
            node.time_compression = v.parse().map_err(|_| invalid("SLOGATE_TIME_COMPRESSION", format!("`{v}` is not a number")))?;
        }
        if let Some(v) = env.get("SLOGATE_ADMIN_TOKEN") {
            node.admin_token = v;
        }
        // A StatefulSet gives each pod its name and address this way.
        if let Some(v) = env.get("SLOGATE_NODE_ID") {
            file.fleet.node_id = v;
        }
        if let Some(v) = env.get("SLOGATE_ADVERTISE_ADDR") {
            file.fleet.advertise_addr = v;
        }
        let node = &mut file.node;
        if let Some(v) = &overrides.grpc_addr {
            node.grpc_addr = v.clone();
        }
        if let Some(v) = &overrides.admin_addr {
            node.admin_addr = v.clone();
        }
        if let Some(v) = &overrides.data_dir {
            node.data_dir = v.clone();
        }
        let mut config = Self::validate(file)?;
        config.warm_from = overrides.warm_from.clone();
        config.repair = overrides.repair;
        Ok(config)
    }

    fn validate(file: ConfigV1) -> Result<NodeConfig> {
        let grpc_addr = file.node.grpc_addr.parse().map_err(|_| invalid("node.grpc_addr", format!("`{}` is not an ip:port", file.node.grpc_addr)))?;
        let admin_addr =
            file.node.admin_addr.parse().map_err(|_| invalid("node.admin_addr", format!("`{}` is not an ip:port", file.node.admin_addr)))?;
        let compression = file.node.time_compression;
        if !(compression.is_finite() && compression > 0.0 && compression <= 1e6) {
            return Err(invalid("node.time_compression", format!("must be in (0, 1e6], got {compression}")));
        }
        if !["wall", "midnight"].contains(&file.node.calendar.as_str()) {
            return Err(invalid("node.calendar", format!("must be \"wall\" or \"midnight\", got \"{}\"", file.node.calendar)));
        }
        match (&file.node.tls_cert_path, &file.node.tls_key_path) {
            (None, None) => {}
            (Some(cert), Some(key)) => {
                for (name, path) in [("node.tls_cert_path", cert), ("node.tls_key_path", key)] {
                    if !path.is_file() {
                        return Err(invalid(name, format!("`{}` is not a readable file", path.display())));
                    }
                }
            }
            _ => return Err(invalid("node.tls_cert_path", "TLS needs both tls_cert_path and tls_key_path")),
        }
        file.fleet.validate(file.node.tls_cert_path.is_some())?;
        let limits = &file.limits;
        for (key, value) in [
            ("limits.in_flight_per_pool_max", limits.in_flight_per_pool_max),
            ("limits.mailbox_capacity", limits.mailbox_capacity),
            ("limits.decisions_kept", limits.decisions_kept),
            ("limits.idempotency_kept", limits.idempotency_kept),
            ("limits.grpc_connections_max", limits.grpc_connections_max),
            ("limits.grpc_streams_per_connection_max", limits.grpc_streams_per_connection_max as usize),
            ("limits.grpc_in_flight_per_connection_max", limits.grpc_in_flight_per_connection_max),
            ("limits.stream_in_flight_max", limits.stream_in_flight_max),
            ("limits.grpc_message_bytes_max", limits.grpc_message_bytes_max),
            ("limits.grpc_handshake_timeout_s", limits.grpc_handshake_timeout_s as usize),
            ("limits.grpc_idle_timeout_s", limits.grpc_idle_timeout_s as usize),
            ("limits.grpc_keepalive_timeout_s", limits.grpc_keepalive_timeout_s as usize),
            ("limits.pool_name_bytes_max", limits.pool_name_bytes_max),
            ("limits.sql_bytes_max", limits.sql_bytes_max),
        ] {
            if value == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if limits.clusters_per_pool_max == 0 {
            return Err(invalid("limits.clusters_per_pool_max", "must be ≥ 1"));
        }
        if limits.templates_per_pool_max == 0 {
            return Err(invalid("limits.templates_per_pool_max", "must be ≥ 1"));
        }
        let retention = limits.idempotency_retention_h;
        if !(retention.is_finite() && retention > 0.0) {
            return Err(invalid("limits.idempotency_retention_h", format!("must be a positive number of hours, got {retention}")));
        }
        if limits.slo_ms_max == 0 {
            return Err(invalid("limits.slo_ms_max", "must be at least 1"));
        }
        if file.reservoir.arrival_samples_per_hour_max == 0 || file.reservoir.flush_every == 0 {
            return Err(invalid("reservoir", "arrival_samples_per_hour_max and flush_every must be at least 1"));
        }
        if file.reservoir.executions_kept_max == 0 {
            return Err(invalid("reservoir.executions_kept_max", "must be ≥ 1"));
        }
        if !(file.reservoir.execution_retention_h.is_finite() && file.reservoir.execution_retention_h > 0.0) {
            return Err(invalid("reservoir.execution_retention_h", "must be a finite number of hours > 0"));
        }
        if !(file.reservoir.history_days.is_finite() && file.reservoir.history_days >= 1.0) {
            return Err(invalid("reservoir.history_days", "must be a finite number of days ≥ 1"));
        }
        if file.node.grpc_threads > 64 {
            return Err(invalid("node.grpc_threads", "must be at most 64"));
        }
        let shards = file.node.router_shards;
        if shards == 0 || shards > file.pool.len().max(1) {
            return Err(invalid("node.router_shards", format!("must be between 1 and the number of pools ({}): each shard owns at least one", file.pool.len())));
        }
        for (i, pool) in file.pool.iter().enumerate() {
            pool.caps(i)?;
            if let Some(shard) = pool.shard.filter(|&s| s >= shards) {
                return Err(invalid(&format!("pool[{i}].shard"), format!("is {shard}, but node.router_shards is {shards} (shards 0..{})", shards - 1)));
            }
        }
        if let Some(idle) = (0..shards).find(|&k| !file.pool.iter().enumerate().any(|(i, p)| p.shard_index(i, shards) == k)) {
            return Err(invalid("node.router_shards", format!("shard {idle} would own no pool; set fewer shards or give a pool `shard = {idle}`")));
        }
        if limits.idempotency_kept > 10_000_000 {
            return Err(invalid("limits.idempotency_kept", "must be at most 10,000,000 (its table is allocated at start, 32 bytes a record)"));
        }
        if file.reservoir.backlog_max == 0 || file.reservoir.backlog_max >= file.limits.mailbox_capacity {
            return Err(invalid("reservoir.backlog_max", "must be at least 1 and below limits.mailbox_capacity"));
        }
        if !(1..=65_536).contains(&file.reservoir.cache_mb) {
            return Err(invalid("reservoir.cache_mb", "must be between 1 and 65536 MiB"));
        }
        if file.pool.is_empty() {
            return Err(invalid("pool", "at least one [[pool]] is required"));
        }
        let mut tenant_names = std::collections::HashSet::new();
        let mut digests = std::collections::HashSet::new();
        for (i, tenant) in file.tenant.iter().enumerate() {
            let key = |field: &str| format!("tenant[{i}].{field}");
            if let Err(error) = slogate_proto::validate::check_pool_name(&tenant.name, 64) {
                return Err(invalid(&key("name"), error.to_string().replace("pool", "tenant name")));
            }
            if !tenant_names.insert(tenant.name.as_str()) {
                return Err(invalid(&key("name"), format!("`{}` is repeated", tenant.name)));
            }
            let digest = &tenant.token_sha256;
            if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(&key("token_sha256"), "must be 64 hex digits: the SHA-256 of the token (`printf %s TOKEN | sha256sum`)"));
            }
            if !digests.insert(digest.to_ascii_lowercase()) {
                return Err(invalid(&key("token_sha256"), "another tenant has the same token"));
            }
            if tenant.pools.is_empty() {
                return Err(invalid(&key("pools"), "needs one or more pool names, or [\"*\"] for all"));
            }
            for pool in tenant.pools.iter().filter(|p| *p != "*") {
                if !file.pool.iter().any(|p| &p.name == pool) {
                    return Err(invalid(&key("pools"), format!("`{pool}` is not a configured pool")));
                }
            }
            let rate = tenant.queries_per_s_max;
            if !(rate.is_finite() && rate >= 0.0) {
                return Err(invalid(&key("queries_per_s_max"), "must be a finite number ≥ 0"));
            }
            if !(tenant.burst.is_finite() && tenant.burst >= 1.0) {
                return Err(invalid(&key("burst"), "must be a finite number ≥ 1"));
            }
            if tenant.in_flight_max == 0 {
                return Err(invalid(&key("in_flight_max"), "must be ≥ 1"));
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, pool) in file.pool.iter().enumerate() {
            if let Err(error) = slogate_proto::validate::check_pool_name(&pool.name, limits.pool_name_bytes_max) {
                return Err(invalid(&format!("pool[{i}].name"), error.to_string()));
            }
            if !names.insert(pool.name.as_str()) {
                return Err(invalid(&format!("pool[{i}].name"), format!("`{}` is repeated", pool.name)));
            }
            if let Err(error) = crate::eval::policy_by_name(&pool.policy) {
                return Err(invalid(&format!("pool[{i}].policy"), error));
            }
            let predicting = crate::eval::ICONQ_POLICIES.contains(&pool.policy.as_str());
            match pool.predictor.as_str() {
                "concurrency-aware" if pool.policy == "slogate-iconq" => {
                    return Err(invalid(&format!("pool[{i}].predictor"), "policy slogate-iconq predicts with Iconq+: set predictor = \"iconq\" and model = \"DIR\""));
                }
                "concurrency-aware" => {}
                "iconq" if !predicting => {
                    return Err(invalid(&format!("pool[{i}].predictor"), format!("iconq predicts for the slogate policies (slogate, slogate-reserve), not `{}`", pool.policy)));
                }
                "iconq" if pool.model.is_none() => {
                    return Err(invalid(&format!("pool[{i}].model"), "predictor = \"iconq\" needs the model's directory (`slogate train-predictor --out DIR`)"));
                }
                "iconq" => {}
                other => return Err(invalid(&format!("pool[{i}].predictor"), format!("`{other}` is not one of concurrency-aware, iconq"))),
            }
            let retrain = &pool.retrain;
            if !(retrain.every_hours.is_finite() && retrain.every_hours >= 0.0) {
                return Err(invalid(&format!("pool[{i}].retrain.every_hours"), format!("must be 0 (on demand only) or positive, got {}", retrain.every_hours)));
            }
            if retrain.min_executions < 10 || !(1..=100_000).contains(&retrain.steps) {
                return Err(invalid(&format!("pool[{i}].retrain"), "min_executions must be at least 10 and steps within 1–100000"));
            }
            if let Some(budget) = &pool.violation_budget {
                budget.validate().map_err(|reason| invalid(&format!("pool[{i}].violation_budget"), reason))?;
            }
            match pool.mode.as_str() {
                "active" => {}
                "shadow" => {
                    if slogate_core::route::BaselinePolicy::from_name(&pool.baseline).is_none() {
                        let known: Vec<&str> = slogate_core::route::BaselinePolicy::ALL.iter().map(|p| p.name()).collect();
                        return Err(invalid(&format!("pool[{i}].baseline"), format!("`{}` is not one of {}", pool.baseline, known.join(", "))));
                    }
                    if !crate::eval::LEARNED_POLICIES.contains(&pool.policy.as_str()) {
                        return Err(invalid(
                            &format!("pool[{i}].policy"),
                            format!("shadow mode shadows a predicting policy ({}), not `{}`", crate::eval::LEARNED_POLICIES.join(", "), pool.policy),
                        ));
                    }
                }
                other => return Err(invalid(&format!("pool[{i}].mode"), format!("`{other}` is not one of active, shadow"))),
            }
            match pool.backend.as_str() {
                "emulated" => {
                    if pool.clusters.is_empty() || pool.clusters.iter().any(|&s| s == 0 || s > 1_024) {
                        return Err(invalid(&format!("pool[{i}].clusters"), "needs one or more sizes in 1–1024 RPU"));
                    }
                    if !pool.endpoint.is_empty() {
                        return Err(invalid(&format!("pool[{i}].endpoint"), "endpoints need backend = \"postgres\""));
                    }
                }
                "postgres" => Self::validate_postgres_pool(&file, pool, i)?,
                other => return Err(invalid(&format!("pool[{i}].backend"), format!("`{other}` is not one of emulated, postgres"))),
            }
            if pool.billing != "usage" && pool.billing != "provisioned" {
                return Err(invalid(&format!("pool[{i}].billing"), format!("`{}` is not one of usage, provisioned", pool.billing)));
            }
            let price = pool.provisioned_price_per_rpu_hour_usd;
            if !(price.is_finite() && price >= 0.0) {
                return Err(invalid(&format!("pool[{i}].provisioned_price_per_rpu_hour_usd"), format!("must be a non-negative amount, got {price}")));
            }
            pool.autoscale.to_core(&format!("pool[{i}].autoscale"))?;
            pool.autoscale.schedule(&format!("pool[{i}].autoscale"))?;
            pool.tune.to_core(&format!("pool[{i}].tune"), 0)?;
            if pool.tune.enabled && !pool.autoscale.enabled {
                return Err(invalid(&format!("pool[{i}].tune.enabled"), "the tuner configures the autoscaler: enable [pool.autoscale] too"));
            }
            pool.elastic.to_core(&format!("pool[{i}].elastic"))?;
            if pool.elastic.enabled && !crate::eval::can_offload(&pool.policy) {
                return Err(invalid(
                    &format!("pool[{i}].elastic.enabled"),
                    format!(
                        "offloading needs a policy that can offload ({}, {}), not `{}`",
                        crate::eval::LEARNED_POLICIES.join(", "),
                        crate::eval::DIRECTOR_POLICIES.join(", "),
                        pool.policy
                    ),
                ));
            }
            if pool.autoscale.enabled && !crate::eval::LEARNED_POLICIES.contains(&pool.policy.as_str()) {
                return Err(invalid(
                    &format!("pool[{i}].autoscale.enabled"),
                    format!("the size selector needs a predicting routing policy ({}), not `{}`", crate::eval::LEARNED_POLICIES.join(", "), pool.policy),
                ));
            }
            if pool.backend != "postgres" && !pool.elastic.tier.is_empty() {
                return Err(invalid(&format!("pool[{i}].elastic.tier"), "the emulated warehouse runs its own elastic tier; a real tier (lambda) is for postgres pools"));
            }
            if pool.backend != "postgres" && !pool.provider.kind.is_empty() {
                return Err(invalid(&format!("pool[{i}].provider.kind"), "a cloud provider's clusters run SQL: set backend = \"postgres\" and [pool.provider.connect]"));
            }
        }
        Ok(NodeConfig { grpc_addr, admin_addr, data_dir: file.node.data_dir.clone(), warm_from: None, repair: false, file })
    }

    /// A postgres pool runs on its declared endpoints in real time: no
    /// emulated clusters, no autoscaler or elastic tier (no provider can
    /// create servers for it yet), and no time compression.
    fn validate_postgres_pool(file: &ConfigV1, pool: &PoolSection, i: usize) -> Result<()> {
        let key = |name: &str| format!("pool[{i}].{name}");
        if !pool.provider.kind.is_empty() {
            return Self::validate_cloud_pool(file, pool, i);
        }
        if !pool.clusters.is_empty() {
            return Err(invalid(&key("clusters"), "a postgres pool's clusters are its [[pool.endpoint]]s; leave clusters out"));
        }
        if pool.endpoint.is_empty() {
            return Err(invalid(&key("endpoint"), "a postgres pool needs one or more [[pool.endpoint]]"));
        }
        for (j, endpoint) in pool.endpoint.iter().enumerate() {
            let key = |name: &str| format!("pool[{i}].endpoint[{j}].{name}");
            if endpoint.host.is_empty() {
                return Err(invalid(&key("host"), "host, database and user must be non-empty"));
            }
            if endpoint.size_rpu == 0 || endpoint.size_rpu > 1_024 {
                return Err(invalid(&key("size_rpu"), format!("must be in 1–1024 RPU, got {}", endpoint.size_rpu)));
            }
            Self::validate_connection(endpoint, &key)?;
        }
        pool.postgres.to_settings(&key("postgres"))?;
        if pool.autoscale.enabled {
            return Err(invalid(&key("autoscale.enabled"), "a postgres pool runs on fixed endpoints: no provider can create servers for it"));
        }
        pool.elastic.validate_real(&key)?;
        if file.node.time_compression != 1.0 {
            return Err(invalid(
                "node.time_compression",
                format!("must be 1 when a pool runs on real servers (pool `{}`), got {}", pool.name, file.node.time_compression),
            ));
        }
        Ok(())
    }

    /// How a postgres pool reaches a server, checked alike for a fixed
    /// endpoint and for a cloud provider's connection template.
    fn validate_connection(endpoint: &EndpointSection, key: &dyn Fn(&str) -> String) -> Result<()> {
        if endpoint.database.is_empty() || endpoint.user.is_empty() {
            return Err(invalid(&key("database"), "database and user must be non-empty"));
        }
        if endpoint.connections == 0 || endpoint.connections > 1_024 {
            return Err(invalid(&key("connections"), format!("must be in 1–1024, got {}", endpoint.connections)));
        }
        if !["disable", "require", "verify-full"].contains(&endpoint.tls.as_str()) {
            return Err(invalid(&key("tls"), format!("`{}` is not one of disable, require, verify-full", endpoint.tls)));
        }
        if endpoint.ca_file.is_some() && endpoint.tls != "verify-full" {
            return Err(invalid(&key("ca_file"), "a CA file is for tls = \"verify-full\""));
        }
        if endpoint.password_env.is_some() && endpoint.password_file.is_some() {
            return Err(invalid(&key("password_env"), "give password_env or password_file, not both"));
        }
        Ok(())
    }

    /// A postgres pool whose clusters a cloud provider creates: no fixed
    /// endpoints, a connection template, the provider's own keys, and
    /// real time.
    fn validate_cloud_pool(file: &ConfigV1, pool: &PoolSection, i: usize) -> Result<()> {
        let key = |name: &str| format!("pool[{i}].{name}");
        let provider = &pool.provider;
        if !CLOUD_PROVIDERS.contains(&provider.kind.as_str()) {
            return Err(invalid(&key("provider.kind"), format!("`{}` is not one of {}", provider.kind, CLOUD_PROVIDERS.join(", "))));
        }
        if !pool.endpoint.is_empty() {
            return Err(invalid(&key("endpoint"), format!("pool `{}`'s clusters come from its {} provider; leave out [[pool.endpoint]]", pool.name, provider.kind)));
        }
        let Some(connect) = &provider.connect else {
            return Err(invalid(&key("provider.connect"), format!("pool `{}` needs [pool.provider.connect] (database and user) to reach the clusters its provider creates", pool.name)));
        };
        Self::validate_connection(&connect.as_endpoint(), &|name| key(&format!("provider.connect.{name}")))?;
        if let Some(&size) = pool.clusters.iter().find(|&&s| s == 0 || s > 1_024) {
            return Err(invalid(&key("clusters"), format!("sizes must be in 1–1024 RPU, got {size}")));
        }
        if provider.attempts_max == 0 || provider.attempts_max > 20 {
            return Err(invalid(&key("provider.attempts_max"), format!("must be in 1–20, got {}", provider.attempts_max)));
        }
        if provider.poll_interval_ms == 0 || provider.ready_timeout_s == 0 {
            return Err(invalid(&key("provider.poll_interval_ms"), "poll_interval_ms and ready_timeout_s must be positive"));
        }
        if !slogate_cloud::platform::region_is_valid(&provider.region) {
            return Err(invalid(&key("provider.region"), format!("`{}` is not an AWS region (like us-east-1)", provider.region)));
        }
        match provider.kind.as_str() {
            "redshift-serverless" | "redshift" if provider.master_password_env.is_none() => {
                return Err(invalid(
                    &key("provider.master_password_env"),
                    format!("pool `{}`: a {} pool names the environment variable of its clusters' admin password", pool.name, provider.kind),
                ));
            }
            "redshift" if provider.rpu_per_node == 0 => return Err(invalid(&key("provider.rpu_per_node"), "must be positive")),
            "ec2" if provider.launch_template.is_empty() => {
                return Err(invalid(&key("provider.launch_template"), format!("pool `{}`: an EC2 pool names the launch template its instances run from", pool.name)));
            }
            "ec2" => {
                for (size, instance_type) in &provider.instance_types {
                    if size.parse::<u32>().map_or(true, |s| s == 0 || s > 1_024) || instance_type.is_empty() {
                        return Err(invalid(&key("provider.instance_types"), format!("`{size}` = `{instance_type}`: keys are sizes in 1–1024 RPU, values instance types")));
                    }
                }
                if provider.instance_types.is_empty() {
                    return Err(invalid(&key("provider.instance_types"), format!("pool `{}`: an EC2 pool maps each cluster size to an instance type", pool.name)));
                }
            }
            _ => {}
        }
        pool.postgres.to_settings(&key("postgres"))?;
        pool.elastic.validate_real(&key)?;
        if file.node.time_compression != 1.0 {
            return Err(invalid(
                "node.time_compression",
                format!("must be 1 when a pool runs on real servers (pool `{}`), got {}", pool.name, file.node.time_compression),
            ));
        }
        Ok(())
    }

    /// The documented example file, `deploy/slogate.example.toml`: every
    /// key with its default.
    pub const EXAMPLE_TOML: &'static str = include_str!("../../deploy/slogate.example.toml");
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_wrong_type_names_its_key_and_line() {
        let file = "version = \"1\"\n[limits]\nin_flight_per_pool_max = \"many\"\n";
        let error = NodeConfig::load(file, &env(&[]), &Overrides::default()).unwrap_err().to_string();
        assert!(error.contains("`limits.in_flight_per_pool_max`") && error.contains("line 3"), "{error}");
        let pool = "version = \"1\"\n[[pool]]\nname = \"a\"\nclusters = \"big\"\n";
        let error = NodeConfig::load(pool, &env(&[]), &Overrides::default()).unwrap_err().to_string();
        assert!(error.contains("`pool.clusters`") && error.contains("line 4"), "{error}");
    }

    #[test]
    fn a_fleet_section_is_checked_and_names_the_key_at_fault() {
        let load = |fleet: &str, env_pairs: &[(&str, &str)]| NodeConfig::load(&format!("version = \"1\"\n[fleet]\n{fleet}\n"), &env(env_pairs), &Overrides::default());
        let error = |fleet: &str| load(fleet, &[]).unwrap_err().to_string();
        let member = |id: &str, addr: &str| format!("[[fleet.member]]\nid = \"{id}\"\ngrpc_addr = \"{addr}\"\n");
        assert!(error("member = []\netcd_endpoints = [\"http://127.0.0.1:2379\"]").contains("`fleet.node_id`"));
        assert!(error("node_id = \"a\"").contains("either a static"));
        assert!(error(&format!("node_id = \"a\"\netcd_endpoints = [\"http://e:1\"]\n{}", member("a", "h:1"))).contains("exclude each other"));
        assert!(error(&format!("node_id = \"a\"\n{}", member("b", "h:1"))).contains("this node (`a`) is not in the list"));
        assert!(error(&format!("node_id = \"a\"\n{}{}", member("a", "h:1"), member("a", "h:2"))).contains("listed twice"));
        assert!(error(&format!("node_id = \"a\"\n{}", member("a", "nohost"))).contains("`fleet.member[0].grpc_addr`"));
        assert!(error("node_id = \"a b\"\netcd_endpoints = [\"http://e:1\"]").contains("`fleet.node_id`"));
        assert!(error("node_id = \"a\"\netcd_endpoints = [\"e:1\"]").contains("`fleet.etcd_endpoints[0]`"));
        let slow_poll = error("node_id = \"a\"\netcd_endpoints = [\"http://e:1\"]\nlease_ttl_s = 2\npoll_interval_ms = 1000");
        assert!(slow_poll.contains("`fleet.poll_interval_ms`") && slow_poll.contains("half of lease_ttl_s"), "{slow_poll}");
        // A StatefulSet names each pod through the environment.
        let config = load("etcd_endpoints = [\"http://e:2379\"]", &[("SLOGATE_NODE_ID", "slogate-1"), ("SLOGATE_ADVERTISE_ADDR", "slogate-1.slogate:50051")]).unwrap();
        assert_eq!((config.file.fleet.node_id.as_str(), config.file.fleet.advertise_addr.as_str()), ("slogate-1", "slogate-1.slogate:50051"));
        assert!(!NodeConfig::load("", &env(&[]), &Overrides::default()).unwrap().file.fleet.enabled(), "a single node by default");
        assert!(error("node_id = \"a\"\netcd_endpoints = [\"https://e:1\"]").contains("`fleet.etcd_ca_path`"));
        assert!(error("node_id = \"a\"\netcd_endpoints = [\"http://e:1\", \"https://f:1\"]").contains("mixes"));
        let needless_ca = error("node_id = \"a\"\netcd_endpoints = [\"http://e:1\"]\nca_path = \"/etc/hosts\"");
        assert!(needless_ca.contains("`fleet.ca_path`") && needless_ca.contains("over TLS"), "{needless_ca}");
    }

    #[test]
    fn pool_caps_are_checked_and_counted_at_the_pool_s_price() {
        let pool = |caps: &str, billing: &str| format!("version = \"1\"\n[[pool]]\nname = \"a\"\nclusters = [16]\n{billing}[pool.caps]\n{caps}\n");
        let error = NodeConfig::load(&pool("spend_per_hour_max_usd = -1.0", ""), &env(&[]), &Overrides::default()).unwrap_err().to_string();
        assert!(error.contains("`pool[0].caps.spend_per_hour_max_usd`"), "{error}");
        let serverless = NodeConfig::load(&pool("rpu_total_max = 64\nspend_per_hour_max_usd = 20.0", ""), &env(&[]), &Overrides::default()).unwrap();
        let caps = serverless.file.pool[0].caps(0).unwrap();
        assert_eq!((caps.caps.clusters_max, caps.caps.rpu_total_max, caps.caps.spend_per_hour_max_usd), (None, Some(64), Some(20.0)));
        assert_eq!(caps.price_per_rpu_hour_usd, 0.375);
        let provisioned = NodeConfig::load(&pool("clusters_max = 3", "billing = \"provisioned\"\nprovisioned_price_per_rpu_hour_usd = 0.5\n"), &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(provisioned.file.pool[0].caps(0).unwrap().price_per_rpu_hour_usd, 0.5);
    }

    #[test]
    fn pool_names_that_could_escape_a_label_or_a_path_are_refused() {
        for name in ["../etc", "a\\\"b", "x y", ""] {
            let file = format!("version = \"1\"\n[[pool]]\nname = \"{name}\"\nclusters = [16]\n");
            let error = NodeConfig::load(&file, &env(&[]), &Overrides::default()).unwrap_err().to_string();
            assert!(error.contains("pool[0].name"), "{name:?}: {error}");
        }
    }

    #[test]
    fn router_shards_that_would_own_no_pool_or_a_pool_on_no_shard_are_refused() {
        let two_pools = |node: &str, pool_b: &str| {
            format!("version = \"1\"\n[node]\n{node}\n[[pool]]\nname = \"a\"\nclusters = [16]\n[[pool]]\nname = \"b\"\nclusters = [16]\n{pool_b}\n")
        };
        let error = |text: String| NodeConfig::load(&text, &env(&[]), &Overrides::default()).unwrap_err().to_string();
        assert!(error(two_pools("router_shards = 0", "")).contains("`node.router_shards`"));
        let too_many = error(two_pools("router_shards = 3", ""));
        assert!(too_many.contains("`node.router_shards`") && too_many.contains("number of pools (2)"), "{too_many}");
        let out_of_range = error(two_pools("router_shards = 2", "shard = 2"));
        assert!(out_of_range.contains("`pool[1].shard`") && out_of_range.contains("0..1"), "{out_of_range}");
        let idle = error(two_pools("router_shards = 2", "shard = 0"));
        assert!(idle.contains("shard 1 would own no pool"), "{idle}");
        let config = NodeConfig::load(&two_pools("router_shards = 2", ""), &env(&[]), &Overrides::default()).unwrap();
        let owners: Vec<usize> = config.file.pool.iter().enumerate().map(|(i, p)| p.shard_index(i, 2)).collect();
        assert_eq!(owners, vec![0, 1]);
    }

    #[test]
    fn empty_file_gives_the_embedded_default_node() {
        let config = NodeConfig::load("", &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(config.file.pool[0].name, "default");
        assert_eq!(config.file.pool[0].clusters, vec![16, 16]);
        assert_eq!(config.data_dir, PathBuf::from("./data"));
    }

    #[test]
    fn flags_override_environment_which_overrides_the_file() {
        let file = "version = \"1\"\n[node]\ngrpc_addr = \"127.0.0.1:1\"\nadmin_addr = \"127.0.0.1:2\"\n";
        let config = NodeConfig::load(file, &env(&[("SLOGATE_GRPC_ADDR", "127.0.0.1:3")]), &Overrides::default()).unwrap();
        assert_eq!(config.grpc_addr.port(), 3);
        assert_eq!(config.admin_addr.port(), 2);
        let flags = Overrides { grpc_addr: Some("127.0.0.1:0".into()), ..Overrides::default() };
        let config = NodeConfig::load(file, &env(&[("SLOGATE_GRPC_ADDR", "127.0.0.1:3")]), &flags).unwrap();
        assert_eq!(config.grpc_addr.port(), 0);
    }

    #[test]
    fn a_violation_budget_is_read_with_defaults_and_a_bad_setting_is_named() {
        let load = |extra: &str| {
            NodeConfig::load(&format!("version = \"1\"\n[[pool]]\nname = \"a\"\nclusters = [16]\npolicy = \"slogate\"\n{extra}"), &env(&[]), &Overrides::default())
                .map_err(|e| e.to_string())
        };
        assert_eq!(load("").unwrap().file.pool[0].violation_budget, None);
        let budget = load("[pool.violation_budget]\ntarget = 0.08\n").unwrap().file.pool[0].violation_budget.clone().unwrap();
        assert_eq!(budget, slogate_core::route::budget::BudgetConfig { target: 0.08, ..Default::default() });
        let error = load("[pool.violation_budget]\ntarget = 2.0\n").unwrap_err();
        assert!(error.contains("pool[0].violation_budget") && error.contains("target must be in (0, 1), got 2"), "{error}");
        let error = load("[pool.violation_budget]\ntarget = 0.05\nwindow = 10\nmin_finished = 20\n").unwrap_err();
        assert!(error.contains("min_finished (20) must not exceed its window (10)"), "{error}");
    }

    #[test]
    fn shadow_mode_needs_a_baseline_that_acts_and_a_predicting_policy_to_shadow() {
        let load = |extra: &str| {
            NodeConfig::load(&format!("version = \"1\"\n[[pool]]\nname = \"a\"\nclusters = [16]\n{extra}"), &env(&[]), &Overrides::default())
                .map_err(|e| e.to_string())
        };
        let config = load("policy = \"slogate\"\nmode = \"shadow\"\nbaseline = \"least-loaded\"\n").unwrap();
        assert_eq!(config.file.pool[0].shadow_of(), Some(slogate_core::route::BaselinePolicy::LeastLoaded));
        assert_eq!(load("policy = \"slogate\"\n").unwrap().file.pool[0].shadow_of(), None);
        assert!(load("policy = \"slogate\"\nmode = \"sideways\"\n").unwrap_err().contains("pool[0].mode"));
        assert!(load("policy = \"slogate\"\nmode = \"shadow\"\nbaseline = \"slogate\"\n").unwrap_err().contains("pool[0].baseline"));
        let error = load("policy = \"round-robin\"\nmode = \"shadow\"\n").unwrap_err();
        assert!(error.contains("pool[0].policy") && error.contains("shadow mode shadows a predicting policy"), "{error}");
    }

    #[test]
    fn errors_name_the_key() {
        let err = |text: &str, e: &[(&str, &str)]| NodeConfig::load(text, &env(e), &Overrides::default()).unwrap_err().to_string();
        assert!(err("version = \"1\"\n[node]\ngrpc_adr = \"x\"\n", &[]).contains("grpc_adr"));
        assert!(err("version = \"1\"\n[node]\ngrpc_addr = \"nowhere\"\n", &[]).contains("node.grpc_addr"));
        assert!(err("version = \"1\"\n[[pool]]\nname = \"a\"\npolicy = \"magic\"\nclusters = [16]\n", &[]).contains("pool[0].policy"));
        assert!(err("", &[("SLOGATE_TIME_COMPRESSION", "fast")]).contains("SLOGATE_TIME_COMPRESSION"));
        assert!(err("version = \"2\"\n", &[]).contains("version"));
        let pool = "version = \"1\"\n[[pool]]\nname = \"a\"\npolicy = \"slogate\"\nclusters = [16]\n[pool.autoscale]\n";
        assert!(err(&format!("{pool}trigger = \"psychic\"\n"), &[]).contains("pool[0].autoscale.trigger"));
        assert!(err(&format!("{pool}sizes = []\n"), &[]).contains("pool[0].autoscale.sizes"));
        assert!(err(&format!("{pool}target = 2.0\n"), &[]).contains("pool[0].autoscale.target"));
        let round_robin = "version = \"1\"\n[[pool]]\nname = \"a\"\npolicy = \"round-robin\"\nclusters = [16]\n[pool.autoscale]\nenabled = true\n";
        assert!(err(round_robin, &[]).contains("pool[0].autoscale.enabled"));
        assert!(err("version = \"1\"\n[[pool]]\nname = \"a\"\nclusters = [16]\nbilling = \"hourly\"\n", &[]).contains("pool[0].billing"));
        let offload = |policy: &str, extra: &str| {
            format!("version = \"1\"\n[[pool]]\nname = \"a\"\npolicy = \"{policy}\"\nclusters = [16]\n[pool.elastic]\nenabled = true\n{extra}")
        };
        assert!(err(&offload("round-robin", ""), &[]).contains("pool[0].elastic.enabled"));
        assert!(err(&offload("spandana", "director_queue_per_16_rpu = 0.0\n"), &[]).contains("pool[0].elastic.director_queue_per_16_rpu"));
        for policy in ["spandana", "spandana-central", "slogate"] {
            assert!(NodeConfig::load(&offload(policy, ""), &env(&[]), &Overrides::default()).is_ok(), "{policy}");
        }
        let director = "version = \"1\"\n[[pool]]\nname = \"a\"\npolicy = \"spandana\"\nclusters = [16]\n[pool.autoscale]\nenabled = true\n";
        assert!(err(director, &[]).contains("pool[0].autoscale.enabled"));
    }

    #[test]
    fn a_cloud_pool_names_every_missing_or_wrong_provider_key() {
        let err = |text: &str| NodeConfig::load(text, &env(&[]), &Overrides::default()).unwrap_err().to_string();
        let cloud = |provider: &str, extra: &str| {
            format!(
                "version = \"1\"\n[node]\ntime_compression = 1.0\n{extra}[[pool]]\nname = \"sls\"\nbackend = \"postgres\"\npolicy = \"slogate\"\nclusters = [8]\n\
                 [pool.provider]\n{provider}\n[pool.provider.connect]\ndatabase = \"dev\"\nuser = \"slogate\"\n"
            )
        };
        let serverless = "kind = \"redshift-serverless\"\nnamespace = \"analytics\"\nmaster_password_env = \"PW\"";
        assert!(NodeConfig::load(&cloud(serverless, ""), &env(&[]), &Overrides::default()).is_ok());
        let e = err(&cloud("kind = \"gcp\"", ""));
        assert!(e.contains("pool[0].provider.kind") && e.contains("redshift-serverless, redshift, ec2"), "{e}");
        let e = err(&cloud("kind = \"redshift-serverless\"", ""));
        assert!(e.contains("pool[0].provider.master_password_env") && e.contains("pool `sls`"), "{e}");
        let e = err(&cloud(&format!("{serverless}\nregion = \"moon\""), ""));
        assert!(e.contains("pool[0].provider.region") && e.contains("`moon`"), "{e}");
        assert!(err(&cloud("kind = \"ec2\"\nlaunch_template = \"lt\"", "")).contains("pool[0].provider.instance_types"));
        assert!(err(&cloud("kind = \"ec2\"\nlaunch_template = \"lt\"\ninstance_types = { \"big\" = \"m5.xlarge\" }", "")).contains("`big`"));
        assert!(err(&cloud("kind = \"redshift\"", "")).contains("pool[0].provider.master_password_env"));
        // In a fleet, the pool's owner manages its resources.
        NodeConfig::load(&cloud(serverless, "[fleet]\nnode_id = \"a\"\n[[fleet.member]]\nid = \"a\"\ngrpc_addr = \"127.0.0.1:1\"\n"), &env(&[]), &Overrides::default())
            .unwrap();
        let no_connect = "version = \"1\"\n[node]\ntime_compression = 1.0\n[[pool]]\nname = \"sls\"\nbackend = \"postgres\"\n[pool.provider]\nkind = \"ec2\"\n";
        assert!(err(no_connect).contains("pool[0].provider.connect"));
        let emulated = "version = \"1\"\n[[pool]]\nname = \"a\"\nclusters = [16]\n[pool.provider]\nkind = \"ec2\"\n";
        assert!(err(emulated).contains("backend = \"postgres\""));
        let lambda = |extra: &str| cloud(serverless, "").replace("[pool.provider]", &format!("[pool.elastic]\nenabled = true\n{extra}[pool.provider]"));
        assert!(err(&lambda("")).contains("pool[0].elastic.tier"));
        assert!(err(&lambda("tier = \"lambda\"\n")).contains("pool[0].elastic.lambda_function"));
        NodeConfig::load(&lambda("tier = \"lambda\"\nlambda_function = \"offload\"\n"), &env(&[]), &Overrides::default()).unwrap();
    }

    #[test]
    fn example_file_parses_and_matches_the_defaults() {
        let config = NodeConfig::load(NodeConfig::EXAMPLE_TOML, &env(&[]), &Overrides::default()).unwrap();
        assert_eq!(config.file, ConfigV1::default());
    }
}
