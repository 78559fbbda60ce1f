//! `slogate serve`: a gateway node.
//!
//! One actix System runs the RouterShard and its trackers, the actix-web
//! admin API and the tonic gRPC server (spawned on the same tokio runtime)
//! on one thread: the routing thread. With `node.router_shards` > 1,
//! every shard after the first runs on an arbiter of its own with its pools'
//! trackers and emulated warehouses, and the gRPC service sends each query
//! to its pool's shard ([`RouterShards`]); shard 0 stays on the main
//! thread. Work that would stall a shard runs
//! elsewhere: the Reservoir's sled writes on an arbiter of its own (the
//! gRPC intake holds new queries while more than `reservoir.backlog_max`
//! updates wait for it, see [`grpc::Intake`]), each Autoscaler's and
//! Tuner's replays on theirs, and predictor refits on tokio's blocking
//! pool. With `node.grpc_threads` > 0 the gRPC server runs on a tokio
//! runtime of its own with that many threads instead, and reaches the
//! actors through their `Addr`s. [`start`] binds both listeners (port 0 picks a free one), starts
//! the actors, and returns a [`Node`] with the bound addresses;
//! [`Node::shutdown`] stops gracefully:
//!
//! 1. readiness and gRPC health turn to not-serving, and the RouterShard
//!    refuses new submissions with UNAVAILABLE;
//! 2. in-flight queries finish, up to the grace period; any still running
//!    then are cancelled on the backend and fail with a reason, so every
//!    accepted query gets a reply;
//! 3. every `SubmitStream` stops reading and ends, and gRPC asks each
//!    connection to close; after `shutdown_close_s` the node closes the
//!    ones a client still holds open, so no client can keep it up;
//! 4. the admin API stops and the reservoir is flushed and closed.
//!
//! The gRPC listener's connection limits are in [`transport`].

pub mod admin;
pub mod fleet;
pub mod grpc;
pub mod takeover;
pub mod tenants;
pub mod transport;
pub mod ui;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use actix::{Actor, Addr};
use slogate_actors::autoscaler::{ApplyTuning, AutoscalerActor};
use slogate_actors::tuner::{TunerActor, TunerSettings};
use slogate_actors::clock::VirtualClock;
use slogate_actors::backend::Backend;
use slogate_actors::provider::{EmulatedProvider, FixedEndpoints, Provider};
use slogate_actors::reservoir::{self, ReservoirActor, SledStore};
use slogate_actors::router::{self, PoolSetup, RouterLimits, RouterShard};
use slogate_actors::shards::RouterShards;
use slogate_actors::warehouse::{AddCluster, EmulatedWarehouse};
use slogate_core::fingerprint::SqlCatalog;
use slogate_core::model::{ClusterId, ClusterState, PoolId, Rpu};
use slogate_core::predict::Observation;
use slogate_core::reservoir::ReservoirConfig;
use slogate_world::WorldConfig;
use slogate_proto::v1::gateway_server::GatewayServer;
use slogate_proto::validate::Limits;

use crate::backend::postgres::PostgresBackend;
use crate::config::NodeConfig;
use crate::{Error, Result};

/// A running node.
pub struct Node {
    /// Where gRPC listens.
    pub grpc_addr: SocketAddr,
    /// Where the admin API listens.
    pub admin_addr: SocketAddr,
    router: RouterShards,
    reservoir: Addr<ReservoirActor>,
    ready: Arc<AtomicBool>,
    health: tonic_health::server::HealthReporter,
    grpc_stop: tokio::sync::oneshot::Sender<()>,
    grpc_task: tokio::task::JoinHandle<()>,
    /// Tells every `SubmitStream` to stop reading.
    closing: tokio::sync::watch::Sender<bool>,
    connections: transport::Connections,
    admin_handle: actix_web::dev::ServerHandle,
    grace: std::time::Duration,
    close_deadline: std::time::Duration,
    arbiters: Vec<actix::Arbiter>,
    /// gRPC's own runtime, when `node.grpc_threads` > 0.
    grpc_runtime: Option<GrpcRuntime>,
    /// The deployment, when this node is one of several.
    fleet: Option<Arc<fleet::Fleet>>,
    /// Tells the membership task to leave the fleet.
    fleet_stop: tokio::sync::watch::Sender<bool>,
    fleet_task: Option<tokio::task::JoinHandle<()>>,
}

/// The gRPC server's multi-thread tokio runtime. The actors stay on the
/// actix System's thread; the service reaches them through their `Addr`s,
/// which are Send. Dropped, it shuts down in the background: a runtime may
/// not block its way down inside another's async context.
struct GrpcRuntime(Option<tokio::runtime::Runtime>);

impl GrpcRuntime {
    fn new(threads: usize) -> Result<GrpcRuntime> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("slogate-grpc")
            .enable_all()
            .build()
            .map(|runtime| GrpcRuntime(Some(runtime)))
            .map_err(|e| io("cannot start the gRPC runtime", e))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("present until dropped").handle()
    }
}

impl Drop for GrpcRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}

fn io(what: &str, error: std::io::Error) -> Error {
    Error::Node(format!("{what}: {error}"))
}

/// Starts a node with `config`. Must run inside an actix System.
pub async fn start(config: NodeConfig) -> Result<Node> {
    // With the AWS providers built in, rustls has two crypto backends (the
    // SDK's aws-lc-rs and our ring) and picks no process default, which
    // tonic's TLS server needs: name ring, as the rest of the node uses.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let file = &config.file;
    let clock = match file.node.calendar.as_str() {
        // The last 00:00 UTC: a trace replayed from the node's start keeps
        // its times of day.
        "midnight" => {
            let now = slogate_actors::clock::unix_now_s();
            VirtualClock::start(file.node.time_compression).with_calendar_start(now - now.rem_euclid(86_400.0))
        }
        _ => VirtualClock::start(file.node.time_compression),
    };
    let mailbox = file.limits.mailbox_capacity;
    // Both listeners first: an address in use fails the start before any
    // actor or store is up.
    let std_listener = std::net::TcpListener::bind(config.grpc_addr).map_err(|e| io(&format!("cannot bind gRPC on {}", config.grpc_addr), e))?;
    std_listener.set_nonblocking(true).map_err(|e| io("gRPC listener", e))?;
    let admin_listener =
        std::net::TcpListener::bind(config.admin_addr).map_err(|e| io(&format!("cannot bind the admin API on {}", config.admin_addr), e))?;

    std::fs::create_dir_all(&config.data_dir).map_err(|e| io(&format!("cannot create data dir {}", config.data_dir.display()), e))?;
    let store_options = slogate_actors::reservoir::StoreOptions { cache_bytes: file.reservoir.cache_mb << 20, repair: config.repair };
    let store = SledStore::open_with(&config.data_dir.join("reservoir"), &store_options).map_err(|e| match e {
        damaged @ slogate_actors::Error::DamagedStore { .. } => Error::Node(damaged.to_string()),
        e => Error::Node(format!("cannot open the reservoir in {}: {e}", config.data_dir.display())),
    })?;
    match store.repair_report() {
        Some(report) => tracing::warn!(
            message = "Reservoir repaired: started with what was left.",
            damage = %report.damage,
            expected = ?report.expected,
            kept = ?report.kept,
            undecodable_deleted = ?report.undecodable_deleted,
            moved_to = report.moved_to.as_deref().unwrap_or("-"),
        ),
        None if config.repair => tracing::info!(message = "--repair: the reservoir is intact; nothing dropped."),
        None => {}
    }
    // Learned policies warm up on the execution log; they keep learning
    // from completions online.
    let mut history = warm_up_log(&store)?;
    if let Some(path) = &config.warm_from {
        let extra = warm_from(path, &config)?;
        tracing::info!(message = "Warmed up from another log.", path = %path.display(), executions = extra.len());
        history.extend(extra);
    }
    // Pools first: a backend that fails to start then drops the store,
    // which releases the data directory's lock. Shard 0 runs on this
    // thread; each other shard on an arbiter of its own, where its pools'
    // emulated warehouses and trackers run too.
    let shard_count = file.node.router_shards.max(1);
    let shard_arbiters: Vec<Option<actix::Arbiter>> = (0..shard_count).map(|k| (k > 0).then(actix::Arbiter::new)).collect();
    let mut pending: Vec<Vec<PendingPool>> = (0..shard_count).map(|_| Vec::new()).collect();
    let mut owners: std::collections::HashMap<PoolId, usize> = std::collections::HashMap::new();
    let mut backends = Vec::new();
    // Clusters to request once the pools route: a cloud pool's initial
    // sizes that reconciliation did not find.
    let mut startup_requests: Vec<(PoolId, Vec<Rpu>)> = Vec::new();
    // Each pool's policy and terms, to rebuild it when this node takes the
    // pool over from another.
    let mut policies: std::collections::HashMap<String, (String, crate::eval::PoolTerms)> = std::collections::HashMap::new();
    // Each cloud pool's provider, for a fleet's hand-overs.
    let mut cloud_pools: std::collections::HashMap<String, takeover::CloudPool> = std::collections::HashMap::new();
    for (i, pool) in file.pool.iter().enumerate() {
        let id = PoolId::new(pool.name.as_str());
        let shard = pool.shard_index(i, shard_count);
        owners.insert(id.clone(), shard);
        let elastic = if pool.elastic.enabled { Some(pool.elastic.to_core(&format!("pool[{i}].elastic"))?) } else { None };
        let provisioned_billing = pool.provisioned_billing();
        let provisioned = provisioned_billing.is_some();
        let arbiter = shard_arbiters[shard].as_ref().map(|a| a.handle());
        let mut wiring = match pool.backend.as_str() {
            "postgres" if !pool.provider.kind.is_empty() => cloud_pool(&id, pool, i, &file.fleet, clock).await?,
            "postgres" => postgres_pool(&id, pool, i, clock).await?,
            _ => emulated_pool(file.node.seed, pool, elastic.as_ref(), clock, mailbox, arbiter.as_ref()).await?,
        };
        if pool.elastic.enabled && pool.elastic.tier == "lambda" {
            let tier = slogate_cloud::platform::open_lambda(&pool.elastic.lambda(), &pool.provider.aws(), clock)
                .await
                .map_err(|e| Error::Config(format!("pool `{id}`: its Lambda elastic tier cannot start: {e}")))?;
            tracing::info!(message = "Lambda elastic tier ready.", pool = %id, function = %pool.elastic.lambda_function);
            wiring.backend = Arc::new(slogate_actors::elastic::WithElastic::new(wiring.backend, tier));
        }
        let shadow_of = pool.shadow_of();
        if let Some(baseline) = shadow_of {
            tracing::warn!(
                message = "Shadow mode: the baseline places every query; the policy, its autoscaler and its tuner only record what they would do.",
                pool = %id,
                baseline = baseline.name(),
                policy = %pool.policy,
            );
        }
        if pool.provider.dry_run || shadow_of.is_some() {
            tracing::warn!(message = "Dry run: the pool's provider creates and releases nothing.", pool = %id);
            wiring.provider = Arc::new(slogate_actors::provider::DryRun::new(wiring.provider, clock));
        }
        let iconq = match (pool.predictor.as_str(), &pool.model) {
            ("iconq", Some(configured)) => {
                // A model the pool's Retrainer installed before a restart
                // wins over the file's.
                let kept = kept_model_dir(&config.data_dir, &pool.name);
                let dir = if slogate_actors::retrainer::holds_kept_model(&kept) { kept } else { configured.clone() };
                Some(iconq_model(&id, &dir, file.node.onnxruntime_path.as_deref())?)
            }
            _ => None,
        };
        let terms = crate::eval::PoolTerms {
            iconq,
            elastic: elastic.clone(),
            provisioned,
            director_queue_per_16_rpu: Some(pool.elastic.director_queue_per_16_rpu),
            templates_max: Some(file.limits.templates_per_pool_max),
            shadow_of,
            violation_budget: pool.violation_budget.clone(),
        };
        crate::eval::policy_by_name(&pool.policy).map_err(|e| Error::Config(format!("pool[{i}].policy: {e}")))?;
        policies.insert(pool.name.clone(), (pool.policy.clone(), terms.clone()));
        let query_latency = Arc::new(slogate_actors::metrics::Histogram::with_bounds(&slogate_actors::metrics::QUERY_BUCKETS_S));
        backends.push(admin::PoolBackends { pool: id.clone(), backend: wiring.backend.clone(), provider: wiring.provider.clone(), query_latency: query_latency.clone() });
        if !wiring.requests.is_empty() {
            startup_requests.push((id.clone(), wiring.requests.clone()));
        }
        if let Some(cloud) = wiring.cloud.take() {
            cloud_pools.insert(pool.name.clone(), cloud);
        }
        pending[shard].push(PendingPool {
            id,
            policy: pool.policy.clone(),
            terms,
            wiring,
            in_flight_max: file.limits.in_flight_per_pool_max,
            elastic: elastic.is_some(),
            provisioned: provisioned_billing,
            caps: pool.caps(i)?,
            query_latency: query_latency.clone(),
        });
    }
    let history = Arc::new(history);
    // Retries after a restart are answered from the records kept on disk.
    let retention_s = file.limits.idempotency_retention_h * 3_600.0;
    let idempotency = {
        use slogate_actors::reservoir::ReservoirStore;
        store
            .idempotency_records(slogate_actors::clock::unix_now_s() - retention_s)
            .map_err(|e| Error::Node(format!("cannot read the idempotency records: {e}")))?
    };
    tracing::info!(message = "Idempotency records loaded.", records = idempotency.len());
    let reservoir_config = ReservoirConfig {
        arrival_samples_per_hour_max: file.reservoir.arrival_samples_per_hour_max,
        seed: file.node.seed,
        templates_per_hour_max: file.limits.templates_per_pool_max.min(u32::MAX as usize) as u32,
    };
    let retention = slogate_actors::reservoir::Retention {
        executions_kept_max: file.reservoir.executions_kept_max,
        execution_age_max_s: file.reservoir.execution_retention_h * 3_600.0,
        idempotency_kept_max: (file.limits.idempotency_kept * file.pool.len()) as u64,
        idempotency_age_max_s: retention_s,
        history_s: file.reservoir.history_days * 86_400.0,
        ..slogate_actors::reservoir::Retention::default()
    };
    // The reservoir's sled writes run on a thread of their own, off the
    // routing thread.
    let reservoir_arbiter = actix::Arbiter::new();
    let reservoir_link = ReservoirActor::new(reservoir_config, Box::new(store), file.reservoir.flush_every, mailbox)
        .map_err(|e| Error::Node(format!("cannot load the reservoir: {e}")))?
        .with_retention(retention)
        .start_linked_in(&reservoir_arbiter.handle());
    let reservoir = reservoir_link.addr().clone();

    let limits = RouterLimits {
        billing: slogate_core::billing::BillingConfig::default(),
        decisions_max: file.limits.decisions_kept,
        idempotency_max: file.limits.idempotency_kept,
        idempotency_retention_s: retention_s,
        mailbox_capacity: mailbox,
        templates_max: file.limits.templates_per_pool_max,
        clusters_per_pool_max: file.limits.clusters_per_pool_max,
    };
    let intake = grpc::Intake { reservoir_backlog: reservoir_link.backlog(), backlog_max: file.reservoir.backlog_max, wait_max: grpc::INTAKE_WAIT_MAX, held: Arc::default() };
    let histograms = admin::Histograms {
        decision_time: Arc::default(),
        added_latency: Arc::default(),
        event_loop_lag: (0..shard_count).map(|_| Arc::new(slogate_actors::metrics::Histogram::default().with_recent_max(LAG_RECENT_WINDOW))).collect(),
    };
    let mut shards = Vec::new();
    let mut idempotency_by_shard: Vec<Vec<_>> = (0..shard_count).map(|_| Vec::new()).collect();
    for record in idempotency {
        if let Some(&shard) = owners.get(&record.pool) {
            idempotency_by_shard[shard].push(record);
        }
    }
    for (index, (pools, records)) in pending.into_iter().zip(idempotency_by_shard).enumerate() {
        let owned: Vec<PoolId> = pools.iter().map(|p| p.id.clone()).collect();
        let plan = ShardPlan {
            index,
            count: shard_count,
            clock,
            pools,
            history: history.clone(),
            reservoir: reservoir_link.clone(),
            limits: limits.clone(),
            idempotency: records,
            histograms: (histograms.decision_time.clone(), histograms.event_loop_lag[index].clone()),
        };
        let address = match &shard_arbiters[index] {
            None => plan.build()?.start(),
            Some(arbiter) => {
                // The shard (its policies, its trackers) is built and
                // started on its own thread; its address comes back.
                let (sent, received) = tokio::sync::oneshot::channel();
                arbiter.spawn(async move {
                    let _ = sent.send(plan.build().map(Actor::start));
                });
                received.await.map_err(|_| Error::Node(format!("router shard {index} did not start")))??
            }
        };
        shards.push((address, owned));
    }
    let router = RouterShards::new(shards);
    for (pool, sizes) in startup_requests {
        let Some(shard) = router.for_pool(&pool).cloned() else { continue };
        actix::spawn(async move {
            for size in sizes {
                match shard.send(router::RequestCluster { pool: pool.clone(), size }).await {
                    Ok(Ok(cluster)) => tracing::info!(message = "Requested an initial cluster.", pool = %pool, %cluster, size = size.0),
                    Ok(Err(error)) => tracing::warn!(message = "Could not request an initial cluster.", pool = %pool, size = size.0, %error),
                    Err(error) => tracing::warn!(message = "Could not request an initial cluster.", pool = %pool, size = size.0, %error),
                }
            }
        });
    }

    // gRPC's listener was bound first: a fleet advertises its address.
    let grpc_addr = std_listener.local_addr().map_err(|e| io("gRPC address", e))?;
    // Several nodes: this one routes (and scales and tunes) the pools it
    // owns and forwards the rest; the Node service takes what the others
    // forward.
    let fleet = if file.fleet.enabled() {
        let pools: Vec<String> = file.pool.iter().map(|p| p.name.clone()).collect();
        Some(Arc::new(fleet::Fleet::new(&file.fleet, &pools, grpc_addr)?))
    } else {
        None
    };
    let gate = |pool: &str| -> Option<slogate_actors::autoscaler::OwnershipGate> {
        fleet.as_ref().map(|fleet| {
            let (fleet, pool) = (fleet.clone(), pool.to_owned());
            Arc::new(move || fleet.placement(&pool) == fleet::Placement::Local) as slogate_actors::autoscaler::OwnershipGate
        })
    };

    // Autoscalers, each on its own thread: the size selector's replays run
    // there, off the routing path.
    let mut autoscalers = Vec::new();
    let mut tuners = Vec::new();
    let mut arbiters = vec![reservoir_arbiter];
    arbiters.extend(shard_arbiters.into_iter().flatten());
    for (i, pool) in file.pool.iter().enumerate().filter(|(_, p)| p.autoscale.enabled) {
        let (knobs, policy) = pool.autoscale.to_core(&format!("pool[{i}].autoscale"))?;
        let core = slogate_core::scale::Autoscaler::new(knobs.clone(), policy, slogate_core::billing::BillingConfig::default());
        let id = PoolId::new(pool.name.as_str());
        let owner = router.for_pool(&id).expect("every pool has a shard").clone();
        let arbiter = actix::Arbiter::new();
        let actor = {
            let (id, router) = (id.clone(), owner.clone());
            let gate = gate(&id.0);
            AutoscalerActor::start_in_arbiter(&arbiter.handle(), move |_| {
                let actor = AutoscalerActor::new(id, core, router, clock, mailbox);
                match gate {
                    Some(gate) => actor.with_gate(gate),
                    None => actor,
                }
            })
        };
        owner
            .send(router::AttachAutoscaler { pool: id.clone(), autoscaler: actor.clone().recipient() })
            .await
            .map_err(|e| Error::Node(e.to_string()))?
            .map_err(|e| Error::Node(e.to_string()))?;
        let daily = pool.autoscale.schedule(&format!("pool[{i}].autoscale"))?;
        if !daily.is_empty() {
            actor.do_send(ApplyTuning { knobs: knobs.clone(), daily, expected: None, source: "config".to_owned() });
        }
        // The pool's Tuner, on a thread of its own; a configuration it
        // chose before a restart is applied as it starts, over the file's.
        if pool.tune.enabled {
            let settings = tuner_settings(&config, pool, i)?;
            let tuner_arbiter = actix::Arbiter::new();
            let tuner = {
                let (id, router, reservoir, autoscaler) = (id.clone(), owner.clone(), reservoir.clone(), actor.clone());
                let gate = gate(&id.0);
                TunerActor::start_in_arbiter(&tuner_arbiter.handle(), move |_| {
                    let tuner = TunerActor::new(id, settings, clock, router, reservoir, autoscaler);
                    match gate {
                        Some(gate) => tuner.with_gate(gate),
                        None => tuner,
                    }
                })
            };
            tuners.push((id.clone(), tuner));
            arbiters.push(tuner_arbiter);
        }
        autoscalers.push((id, actor));
        arbiters.push(arbiter);
    }

    let retrainers = start_retrainers(&config, &router, &reservoir, &policies, &mut arbiters);

    // gRPC, on the routing thread or on a runtime of its own.
    let grpc_runtime = match file.node.grpc_threads {
        0 => None,
        threads => Some(GrpcRuntime::new(threads)?),
    };
    let (health, health_service) = slogate_proto::health_service();
    let (closing, closing_seen) = tokio::sync::watch::channel(false);
    let tenants = Arc::new(tenants::Tenants::new(&file.tenant));
    if !tenants.enabled() && !config.grpc_addr.ip().is_loopback() {
        tracing::warn!(
            message = "gRPC listens beyond loopback with no [[tenant]]: anyone who reaches it can submit queries.",
            grpc_addr = %config.grpc_addr
        );
    }
    // A pool this node takes over starts on the execution log it holds
    // now, and on the tuned configuration and cluster layout its last
    // owner published.
    if let Some(fleet) = &fleet {
        let wiring = takeover::Wiring {
            fleet: fleet.clone(),
            router: router.clone(),
            reservoir: reservoir.clone(),
            policies: policies.clone(),
            tuners: tuners.clone(),
            learned_at: Arc::default(),
            cloud: Arc::new(cloud_pools),
        };
        actix_rt::spawn(takeover::prepare_claims(fleet.claims(), wiring.clone()));
        actix_rt::spawn(takeover::hand_over_released(fleet.releases(), wiring.clone()));
        if !file.fleet.etcd_endpoints.is_empty() {
            actix_rt::spawn(takeover::publish_state(wiring));
        }
    }
    let (fleet_stop, fleet_stopped) = tokio::sync::watch::channel(false);
    let fleet_task = match &fleet {
        Some(fleet) if !file.fleet.etcd_endpoints.is_empty() => {
            let (fleet, endpoints, ca) = (fleet.clone(), file.fleet.etcd_endpoints.clone(), file.fleet.etcd_ca_path.clone());
            Some(actix_rt::spawn(async move {
                if let Err(error) = fleet::run_etcd(fleet, endpoints, ca, fleet_stopped).await {
                    tracing::error!(message = "Fleet membership stopped.", %error);
                }
            }))
        }
        _ => None,
    };
    let service = grpc::GatewayService::new(
        router.clone(),
        Limits {
            slo_ms_max: file.limits.slo_ms_max,
            payload_bytes_max: file.limits.payload_bytes_max,
            pool_name_bytes_max: file.limits.pool_name_bytes_max,
            labels_max: file.limits.labels_max,
            labels_bytes_max: file.limits.labels_bytes_max,
            sql_bytes_max: file.limits.sql_bytes_max,
            ..Limits::default()
        },
        histograms.added_latency.clone(),
        file.limits.stream_in_flight_max,
        closing_seen,
        tenants.clone(),
        intake.clone(),
    );
    let service = match &fleet {
        Some(fleet) => service.with_fleet(fleet.clone(), reservoir_link.clone()),
        None => service,
    };
    // Other nodes' `PoolActors` calls are answered by a task on this
    // thread, where the admin API's state lives.
    let (pool_actors_asker, mut pool_actors_asked) = tokio::sync::mpsc::channel(16);
    let node_service = fleet.as_ref().map(|fleet| {
        slogate_proto::v1::node_server::NodeServer::new(grpc::NodeService::new(service.clone(), fleet.clone(), pool_actors_asker))
            .max_decoding_message_size(file.limits.grpc_message_bytes_max)
    });
    let gateway = GatewayServer::new(service).max_decoding_message_size(file.limits.grpc_message_bytes_max);
    health.set_serving::<GatewayServer<grpc::GatewayService>>().await;
    let (grpc_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let connections = transport::Connections::new(file.limits.grpc_connections_max);
    let transport_limits = transport::TransportLimits {
        connections_max: file.limits.grpc_connections_max,
        handshake_timeout: std::time::Duration::from_secs(file.limits.grpc_handshake_timeout_s),
        idle_timeout: std::time::Duration::from_secs(file.limits.grpc_idle_timeout_s),
    };
    let keepalive = (file.limits.grpc_keepalive_interval_s > 0).then(|| std::time::Duration::from_secs(file.limits.grpc_keepalive_interval_s));
    let tls = load_tls(file)?;
    let mut builder = tonic::transport::Server::builder();
    if let Some((cert, key)) = &tls {
        let identity = tonic::transport::Identity::from_pem(cert, key);
        builder = builder
            .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
            .map_err(|e| Error::Config(format!("node.tls_cert_path: {e}")))?;
    } else if !config.grpc_addr.ip().is_loopback() || !config.admin_addr.ip().is_loopback() {
        tracing::warn!(message = "Listening beyond loopback without TLS: tokens and queries travel in the clear.");
    }
    let server = builder
        .max_concurrent_streams(file.limits.grpc_streams_per_connection_max)
        .concurrency_limit_per_connection(file.limits.grpc_in_flight_per_connection_max)
        .http2_keepalive_interval(keepalive)
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(file.limits.grpc_keepalive_timeout_s)))
        .layer(transport::StreamTrackingLayer);
    // Everything the gRPC server spawns (the accept loop, each connection)
    // goes to its runtime. The guard is dropped before the next await.
    let entered = grpc_runtime.as_ref().map(|runtime| runtime.handle().enter());
    let listener = tokio::net::TcpListener::from_std(std_listener).map_err(|e| io("gRPC listener", e))?;
    let incoming = transport::incoming(listener, transport_limits, connections.clone());
    let grpc_task = tokio::spawn(async move {
        let result = { server }
            .add_service(health_service)
            .add_service(slogate_proto::reflection_service())
            .add_service(slogate_proto::reflection_service_v1alpha())
            .add_service(gateway)
            .add_optional_service(node_service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await;
        if let Err(error) = result {
            tracing::error!(message = "gRPC server stopped with an error.", %error);
        }
    });
    drop(entered);

    // Admin API.
    let ready = Arc::new(AtomicBool::new(true));
    let admin_state = admin::AdminState {
        router: router.clone(),
        reservoir: reservoir.clone(),
        backends,
        token: file.node.admin_token.clone(),
        reads_require_token: file.node.reads_require_token,
        ready: ready.clone(),
        histograms,
        autoscalers,
        tuners,
        retrainers,
        auth_failures: Arc::default(),
        tenants,
        intake,
        fleet: fleet.clone(),
        clock,
    };
    {
        let admin_state = admin_state.clone();
        actix_rt::spawn(async move {
            while let Some((pool, reply)) = pool_actors_asked.recv().await {
                let _ = reply.send(admin::pool_actors(&admin_state, &pool).await);
            }
        });
    }
    let server = actix_web::HttpServer::new(move || {
        actix_web::App::new().app_data(actix_web::web::Data::new(admin_state.clone())).configure(admin::routes)
    })
    .workers(1)
    .disable_signals();
    let server = match &tls {
        Some((cert, key)) => server.listen_rustls_0_23(admin_listener, admin_tls(cert, key)?),
        None => server.listen(admin_listener),
    }
    .map_err(|e| io(&format!("cannot bind the admin API on {}", config.admin_addr), e))?;
    let admin_addr = server.addrs()[0];
    let server = server.run();
    let admin_handle = server.handle();
    actix_rt::spawn(server);

    Ok(Node {
        grpc_addr,
        admin_addr,
        router,
        reservoir,
        ready,
        health,
        grpc_stop,
        grpc_task,
        closing,
        connections,
        admin_handle,
        grace: std::time::Duration::from_secs(file.limits.shutdown_grace_s),
        close_deadline: std::time::Duration::from_secs(file.limits.shutdown_close_s),
        arbiters,
        grpc_runtime,
        fleet,
        fleet_stop,
        fleet_task,
    })
}

/// The PEM certificate chain and key, when TLS is configured.
fn load_tls(file: &crate::config::ConfigV1) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
    let (Some(cert), Some(key)) = (&file.node.tls_cert_path, &file.node.tls_key_path) else { return Ok(None) };
    let read = |key: &str, path: &std::path::Path| std::fs::read(path).map_err(|e| Error::Config(format!("{key}: cannot read {}: {e}", path.display())));
    Ok(Some((read("node.tls_cert_path", cert)?, read("node.tls_key_path", key)?)))
}

/// The admin API's rustls configuration from the PEM `cert` chain and `key`.
fn admin_tls(cert: &[u8], key: &[u8]) -> Result<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::Config(format!("node.tls_cert_path: not a PEM certificate chain: {e}")))?;
    if chain.is_empty() {
        return Err(Error::Config("node.tls_cert_path: no certificate in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::Config(format!("node.tls_key_path: not a PEM private key: {e}")))?;
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|builder| builder.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| Error::Config(format!("node.tls_cert_path: the certificate and key do not make a TLS configuration: {e}")))
}

/// A pool waiting for its shard: everything but its policy, which is
/// not `Send` and is built on the shard's own thread.
struct PendingPool {
    id: PoolId,
    policy: String,
    terms: crate::eval::PoolTerms,
    wiring: PoolWiring,
    in_flight_max: usize,
    elastic: bool,
    provisioned: Option<slogate_core::elastic::ProvisionedBilling>,
    caps: router::PoolCaps,
    query_latency: Arc<slogate_actors::metrics::Histogram>,
}

/// What a RouterShard is built from, on the thread it will run on.
struct ShardPlan {
    index: usize,
    count: usize,
    clock: VirtualClock,
    pools: Vec<PendingPool>,
    /// The executions the learned policies warm up on.
    history: Arc<Vec<Observation>>,
    reservoir: reservoir::ReservoirLink,
    limits: RouterLimits,
    idempotency: Vec<slogate_actors::idempotency::IdempotencyRecord>,
    /// The node's decision-time histogram (its shards share it) and this
    /// shard's event-loop lag.
    histograms: (Arc<slogate_actors::metrics::Histogram>, Arc<slogate_actors::metrics::Histogram>),
}

impl ShardPlan {
    /// Builds the policies and the shard (its trackers start on the
    /// calling thread's arbiter when it starts).
    fn build(self) -> Result<RouterShard> {
        let mut pools = Vec::with_capacity(self.pools.len());
        for pool in self.pools {
            let policy = crate::eval::build_policy_with(&pool.policy, &self.history, &pool.terms).map_err(|e| Error::Config(e.to_string()))?;
            pools.push(PoolSetup {
                id: pool.id,
                policy,
                backend: pool.wiring.backend,
                provider: pool.wiring.provider,
                catalog: pool.wiring.catalog,
                clusters: pool.wiring.clusters,
                in_flight_max: pool.in_flight_max,
                elastic: pool.elastic,
                provisioned: pool.provisioned,
                caps: pool.caps,
                query_latency: pool.query_latency,
            });
        }
        let (decision_time, event_loop_lag) = self.histograms;
        let mut shard = RouterShard::new(self.clock, pools, Some(self.reservoir), self.limits)
            .as_shard(self.index, self.count)
            .with_histograms(decision_time, event_loop_lag)
            .with_lag_probe(LAG_PROBE_EVERY);
        shard.restore_idempotency(self.idempotency);
        Ok(shard)
    }
}

/// What runs a pool's queries and holds its clusters.
struct PoolWiring {
    backend: Arc<dyn Backend>,
    provider: Arc<dyn Provider>,
    catalog: Arc<SqlCatalog>,
    clusters: Vec<(ClusterId, Rpu, ClusterState)>,
    /// Sizes to request once the pool routes (a cloud pool's initial
    /// clusters that reconciliation did not find).
    requests: Vec<Rpu>,
    /// A cloud pool's provider, for a fleet's hand-overs.
    cloud: Option<takeover::CloudPool>,
}

/// An emulated pool: its own emulated warehouse, warm clusters of the
/// configured sizes, and the emulated provider.
async fn emulated_pool(
    seed: u64,
    pool: &crate::config::PoolSection,
    elastic: Option<&slogate_core::route::elastic::ElasticOptions>,
    clock: VirtualClock,
    mailbox: usize,
    arbiter: Option<&actix::ArbiterHandle>,
) -> Result<PoolWiring> {
    let mut world = WorldConfig::default();
    world.seed(seed);
    world.elastic = elastic.map(|e| e.config.clone());
    world.provisioned = pool.provisioned_billing();
    let warehouse = match arbiter {
        Some(arbiter) => EmulatedWarehouse::start_in_arbiter(arbiter, move |_| EmulatedWarehouse::new(world, clock, mailbox)),
        None => EmulatedWarehouse::new(world, clock, mailbox).start(),
    };
    let mut clusters = Vec::new();
    for &size in &pool.clusters {
        let id = warehouse.send(AddCluster { size: Rpu(size), warm: true }).await.map_err(|e| Error::Node(e.to_string()))?;
        clusters.push((id, Rpu(size), ClusterState::Ready));
    }
    let provider = match arbiter {
        Some(arbiter) => {
            let warehouse = warehouse.clone();
            EmulatedProvider::start_in_arbiter(arbiter, move |_| EmulatedProvider::new(warehouse, clock, mailbox))
        }
        None => EmulatedProvider::new(warehouse.clone(), clock, mailbox).start(),
    };
    Ok(PoolWiring { backend: Arc::new(warehouse), provider: Arc::new(provider), catalog: Arc::default(), clusters, requests: Vec::new(), cloud: None })
}

/// A postgres pool: the Postgres-wire executor over its endpoints (each
/// checked at start), which slogate did not create and cannot release.
async fn postgres_pool(id: &PoolId, pool: &crate::config::PoolSection, index: usize, clock: VirtualClock) -> Result<PoolWiring> {
    let endpoints = pool
        .endpoint
        .iter()
        .enumerate()
        .map(|(j, endpoint)| endpoint.to_endpoint(&crate::config::Environment, &format!("pool[{index}].endpoint[{j}]")))
        .collect::<Result<Vec<_>>>()?;
    let settings = pool.postgres.to_settings(&format!("pool[{index}].postgres"))?;
    let catalog = match &pool.postgres.catalog_dir {
        Some(dir) => crate::backend::load_catalog(dir)?,
        None => SqlCatalog::default(),
    };
    let backend = PostgresBackend::connect(id.clone(), endpoints, settings, clock).await?;
    let clusters = backend.clusters().into_iter().map(|(cluster, size)| (cluster, size, ClusterState::Ready)).collect();
    tracing::info!(message = "Postgres pool connected.", pool = %id, clusters = pool.endpoint.len(), catalog_templates = catalog.len());
    Ok(PoolWiring { backend: Arc::new(backend), provider: Arc::new(FixedEndpoints), catalog: Arc::new(catalog), clusters, requests: Vec::new(), cloud: None })
}

/// Whether this node manages `pool`'s cloud resources from the start: a
/// single node does; in a static fleet, the pool's owner; on etcd, nobody
/// until it claims the pool (the claim reconciles, see `takeover`).
fn manages_cloud_pool_at_start(fleet: &crate::config::FleetSection, pool: &str) -> bool {
    if !fleet.enabled() {
        return true;
    }
    if !fleet.etcd_endpoints.is_empty() {
        return false;
    }
    let members = fleet.member.iter().map(|m| m.id.as_str()).chain(std::iter::once(fleet.node_id.as_str()));
    slogate_core::ownership::owner(pool, members) == Some(fleet.node_id.as_str())
}

/// A postgres pool whose clusters a cloud provider creates: the platform
/// is opened and checked; then, if this node manages the pool now
/// ([`manages_cloud_pool_at_start`]), the deployment's resources are
/// reconciled with the pool's initial layout (`clusters`), the adopted
/// ones are handed to the executor as they serve, and the missing sizes
/// are requested once the pool routes. Otherwise the pool starts with no
/// clusters, and its owner's claim brings them.
async fn cloud_pool(id: &PoolId, pool: &crate::config::PoolSection, index: usize, fleet: &crate::config::FleetSection, clock: VirtualClock) -> Result<PoolWiring> {
    let key = format!("pool[{index}].provider");
    let env = crate::config::Environment;
    let template = pool.provider.connect.as_ref().map(crate::config::ConnectSection::as_endpoint).ok_or_else(|| Error::Config(format!("{key}.connect is required")))?;
    let template = template.to_endpoint(&env, &format!("{key}.connect"))?;
    let settings = pool.postgres.to_settings(&format!("pool[{index}].postgres"))?;
    let catalog = match &pool.postgres.catalog_dir {
        Some(dir) => crate::backend::load_catalog(dir)?,
        None => SqlCatalog::default(),
    };
    let platform = pool.provider.platform(&env, &key)?.ok_or_else(|| Error::Config(format!("{key}.kind names no cloud provider")))?;
    let kind = pool.provider.kind.as_str();
    let api = slogate_cloud::platform::open(&platform, &pool.provider.aws())
        .await
        .map_err(|e| Error::Config(format!("pool `{id}`: its {kind} provider cannot start: {e}")))?;
    let setup_sql = pool.provider.connect.as_ref().map(|c| c.setup_sql.clone()).unwrap_or_default();
    let backend = PostgresBackend::for_provider(id.clone(), template, setup_sql, settings, clock);
    let cloud = slogate_cloud::provider::CloudSettings {
        deployment: if fleet.deployment.is_empty() { "default".into() } else { fleet.deployment.clone() },
        node: if fleet.node_id.is_empty() { "single".into() } else { fleet.node_id.clone() },
        name_prefix: pool.provider.name_prefix.clone(),
        poll_interval: std::time::Duration::from_millis(pool.provider.poll_interval_ms),
        ready_timeout: std::time::Duration::from_secs(pool.provider.ready_timeout_s),
    };
    let provider = Arc::new(slogate_cloud::provider::CloudProvider::new(api, Arc::new(backend.clone()), cloud, clock));
    let mut want = pool.clusters.clone();
    want.sort_unstable();
    let initial = slogate_core::scale::layout::Layout { sizes_rpu: want };
    let handle = takeover::CloudPool { provider: provider.clone(), initial: initial.clone(), dry_run: pool.provider.dry_run };
    if !manages_cloud_pool_at_start(fleet, &pool.name) {
        tracing::info!(message = "Cloud pool: another node of the fleet manages its resources until this one owns it.", pool = %id, provider = kind);
        return Ok(PoolWiring { backend: Arc::new(backend), provider, catalog: Arc::new(catalog), clusters: Vec::new(), requests: Vec::new(), cloud: Some(handle) });
    }
    let adoption = provider
        .reconcile(id, &initial, pool.provider.dry_run)
        .await
        .map_err(|e| Error::Config(format!("pool `{id}`: its {kind} provider could not list the deployment's resources: {e}")))?;
    let clusters = provider.adopted_clusters(id, &adoption).into_iter().map(|(cluster, size)| (cluster, size, ClusterState::Starting)).collect();
    tracing::info!(
        message = "Cloud pool reconciled.",
        pool = %id,
        provider = kind,
        adopted = adoption.adopt.len(),
        terminated = adoption.terminate.len(),
        to_create = ?adoption.request.iter().map(|s| s.0).collect::<Vec<_>>(),
    );
    Ok(PoolWiring { backend: Arc::new(backend), provider, catalog: Arc::new(catalog), clusters, requests: adoption.request, cloud: Some(handle) })
}

/// How often the routing thread's lag probe fires.
const LAG_PROBE_EVERY: std::time::Duration = std::time::Duration::from_millis(10);

/// The window of the lag's `_recent_max` gauge: the longest wait of about
/// the last minute, which a stall at start-up no longer holds up.
const LAG_RECENT_WINDOW: std::time::Duration = std::time::Duration::from_secs(60);

/// The most recent executions a learned policy warms up on.
pub(crate) const WARM_UP_EXECUTIONS_MAX: usize = 200_000;

fn warm_up_log(store: &SledStore) -> Result<Vec<Observation>> {
    use slogate_actors::reservoir::ReservoirStore;
    let records = store.recent_executions(WARM_UP_EXECUTIONS_MAX).map_err(|e| Error::Node(format!("cannot read the execution log: {e}")))?;
    // The log records the queries running at dispatch; the predictors'
    // neighbour count is all overlapping queries, so this slightly
    // understates concurrency until online completions take over.
    Ok(records.iter().map(|r| r.observation()).collect())
}

/// The executions `--warm-from PATH` gives: a stopped node's data
/// directory (or its `reservoir` folder) gives its execution log; a trace
/// file (`arrival_s,template,slo_s`) is run on the embedded emulated
/// warehouse, on the first pool's cluster sizes and routed round-robin, as
/// `slogate eval` makes its training run, and gives the executions that
/// run logged.
fn warm_from(path: &std::path::Path, config: &NodeConfig) -> Result<Vec<Observation>> {
    use slogate_actors::reservoir::ReservoirStore;
    let named = |reason: String| Error::Config(format!("--warm-from {}: {reason}", path.display()));
    if path.is_dir() {
        let folder = crate::tune::reservoir_folder(path);
        if folder == config.data_dir.join("reservoir") {
            return Err(named("is this node's own data directory, whose log it reads anyway".into()));
        }
        let store = SledStore::open(&folder).map_err(|e| named(format!("cannot open its reservoir (is that node still running?): {e}")))?;
        let records = store.recent_executions(WARM_UP_EXECUTIONS_MAX).map_err(|e| named(format!("cannot read its execution log: {e}")))?;
        if records.is_empty() {
            return Err(named("its execution log is empty".into()));
        }
        return Ok(records.iter().map(|r| r.observation()).collect());
    }
    if !path.is_file() {
        return Err(named("no such file or directory".into()));
    }
    let entries = slogate_loadgen::trace::read_trace(path).map_err(|e| named(e.to_string()))?;
    if entries.is_empty() {
        return Err(named("the trace has no queries".into()));
    }
    let queries = slogate_loadgen::workload::to_queries(&entries, &PoolId::default()).map_err(|e| named(e.to_string()))?;
    let sizes = config.file.pool.first().map(|p| p.clusters.clone()).filter(|c| !c.is_empty()).unwrap_or_else(|| vec![16]);
    let log = crate::eval::execution_log(queries, &sizes, config.file.node.seed);
    Ok(log.iter().map(|r| r.observation()).collect())
}

impl Node {
    /// Stops gracefully (see the module docs). Returns how many queries
    /// were still in flight when the grace period ended (they were failed
    /// with a reason).
    pub async fn shutdown(self) -> usize {
        self.ready.store(false, Ordering::Relaxed);
        self.health.set_not_serving::<GatewayServer<grpc::GatewayService>>().await;
        let _ = self.router.broadcast(router::Drain).await;
        let deadline = tokio::time::Instant::now() + self.grace;
        let mut in_flight = 0;
        loop {
            if let Ok(state) = self.router.state().await {
                in_flight = state.pools.iter().map(|p| p.in_flight).sum();
            }
            // Queries this node accepted and forwarded are its to answer too.
            in_flight += self.fleet.as_ref().map_or(0, |fleet| fleet.forwarding());
            if in_flight == 0 || tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        if in_flight > 0 {
            let reason = "the node shut down before the query finished".to_owned();
            let _ = self.router.broadcast(router::FailInFlight { reason }).await;
        }
        // Leave the fleet: the lease is revoked, so the next owners take
        // this node's pools at once rather than after the TTL.
        self.fleet_stop.send_replace(true);
        if let Some(task) = self.fleet_task {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(2), task).await;
        }
        // Streams answer what they accepted and end; then HTTP/2 asks every
        // connection to close (GOAWAY). One the client holds open past the
        // deadline (a stream it never ends, a request it never finishes
        // sending) is closed from this side.
        self.closing.send_replace(true);
        let _ = self.grpc_stop.send(());
        let mut grpc_task = self.grpc_task;
        if tokio::time::timeout(self.close_deadline, &mut grpc_task).await.is_err() {
            tracing::warn!(message = "Closing the gRPC connections still open at the shutdown deadline.", open = self.connections.open());
            self.connections.close_all();
            if tokio::time::timeout(std::time::Duration::from_secs(1), &mut grpc_task).await.is_err() {
                grpc_task.abort();
            }
        }
        self.admin_handle.stop(true).await;
        // The shards' last updates reach the Reservoir before it closes.
        let _ = self.router.broadcast(router::FlushLog).await;
        let _ = self.reservoir.send(reservoir::Shutdown).await;
        for arbiter in self.arbiters {
            arbiter.stop();
        }
        // Its server has stopped; its threads wind down in the background.
        drop(self.grpc_runtime);
        in_flight
    }
}

/// What pool `index`'s Tuner is given.
fn tuner_settings(config: &NodeConfig, pool: &crate::config::PoolSection, index: usize) -> Result<TunerSettings> {
    let (setup, knobs) = pool.planner_setup(index)?;
    Ok(TunerSettings {
        every: (pool.tune.every_hours > 0.0).then(|| std::time::Duration::from_secs_f64(pool.tune.every_hours * 3_600.0)),
        history_days: pool.tune.history_days,
        config: pool.tune.to_core(&format!("pool[{index}].tune"), config.file.node.seed)?,
        setup,
        base_knobs: knobs,
        default_slo: slogate_core::time::Duration::from_secs(60),
        state_path: config.data_dir.join("tuner").join(format!("{}.json", pool.name)),
    })
}

/// Where a pool's Retrainer keeps the model it installed (a model
/// directory: `model.json`, `model.onnx`, `model-info.json`).
fn kept_model_dir(data_dir: &std::path::Path, pool: &str) -> std::path::PathBuf {
    data_dir.join("models").join(pool)
}

/// Pool `id`'s Iconq+ model from `dir`, checked; its ONNX graph checked
/// in ONNX Runtime too when the build has it and a library is named.
fn iconq_model(id: &PoolId, dir: &std::path::Path, onnxruntime: Option<&std::path::Path>) -> Result<Arc<slogate_core::predict::iconq::IconqWeights>> {
    let in_pool = |e: Error| Error::Config(format!("pool `{id}`: {e}"));
    let weights = crate::model::load(dir).map_err(in_pool)?;
    #[cfg(feature = "onnx")]
    {
        let named = onnxruntime.is_some() || std::env::var_os(slogate_onnx::runtime::DYLIB_ENV).is_some_and(|p| !p.is_empty());
        if named {
            let version = crate::model::check_onnx(dir, &weights, onnxruntime).map_err(in_pool)?;
            tracing::info!(message = "Iconq+ loaded; model.onnx agrees with model.json in ONNX Runtime.", pool = %id, model = %dir.display(), onnxruntime = %version);
            return Ok(weights);
        }
    }
    if onnxruntime.is_some() {
        return Err(Error::Config(format!("pool `{id}`: node.onnxruntime_path is set, but this slogate was built without ONNX Runtime (build with `--features onnx`)")));
    }
    tracing::info!(message = "Iconq+ loaded (native inference); model.onnx not checked: no ONNX Runtime library named (node.onnxruntime_path or ORT_DYLIB_PATH).", pool = %id, model = %dir.display());
    Ok(weights)
}

/// A Retrainer for each pool that predicts with Iconq+, on a thread of its
/// own (builds with the trainer; without it, none, and the admin API says
/// so).
#[cfg(feature = "learn")]
fn start_retrainers(
    config: &NodeConfig,
    router: &slogate_actors::shards::RouterShards,
    reservoir: &Addr<ReservoirActor>,
    policies: &std::collections::HashMap<String, (String, crate::eval::PoolTerms)>,
    arbiters: &mut Vec<actix::Arbiter>,
) -> Vec<(PoolId, Addr<slogate_actors::retrainer::RetrainerActor>)> {
    use slogate_actors::retrainer::{ModelInfo, RetrainerActor, RetrainerSettings};
    let mut retrainers = Vec::new();
    for pool in &config.file.pool {
        let (Some(weights), Some(dir)) = (policies.get(&pool.name).and_then(|(_, terms)| terms.iconq.clone()), &pool.model) else { continue };
        let id = PoolId::new(pool.name.as_str());
        let owner = router.for_pool(&id).expect("every pool has a shard").clone();
        let settings = RetrainerSettings {
            every: (pool.retrain.every_hours > 0.0).then(|| std::time::Duration::from_secs_f64(pool.retrain.every_hours * 3_600.0)),
            min_executions: pool.retrain.min_executions,
            executions_max: 200_000,
            state_dir: kept_model_dir(&config.data_dir, &pool.name),
            train: crate::train::retrainer(pool.retrain.steps, config.file.node.seed),
        };
        let model = ModelInfo { version: 1, source: format!("config ({})", dir.display()), installed_at_unix_s: None, training_executions: None, held_out: configured_score(dir) };
        let arbiter = actix::Arbiter::new();
        let (pool_id, reservoir) = (id.clone(), reservoir.clone());
        let actor = RetrainerActor::start_in_arbiter(&arbiter.handle(), move |_| RetrainerActor::new(pool_id, settings, owner, reservoir, weights, model));
        retrainers.push((id, actor));
        arbiters.push(arbiter);
    }
    retrainers
}

/// The held-out score `slogate train-predictor` recorded for the model in
/// `dir` (reading the neighbours running at arrival), if its metadata says.
#[cfg(feature = "learn")]
fn configured_score(dir: &std::path::Path) -> Option<slogate_core::predict::iconq::HeldOutScore> {
    let metadata: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("metadata.json")).ok()?).ok()?;
    serde_json::from_value(metadata["training"]["held_out_at_arrival"].clone()).ok()
}

#[cfg(not(feature = "learn"))]
fn start_retrainers(
    _config: &NodeConfig,
    _router: &slogate_actors::shards::RouterShards,
    _reservoir: &Addr<ReservoirActor>,
    _policies: &std::collections::HashMap<String, (String, crate::eval::PoolTerms)>,
    _arbiters: &mut Vec<actix::Arbiter>,
) -> Vec<(PoolId, Addr<slogate_actors::retrainer::RetrainerActor>)> {
    Vec::new()
}
