//! The Postgres-wire executor: a [`Backend`] whose clusters are servers
//! that speak the PostgreSQL protocol — Amazon Redshift clusters, Redshift
//! Serverless workgroup endpoints, or PostgreSQL itself.
//!
//! Each cluster is a declared endpoint with a bounded connection pool
//! (`deadpool-postgres`). The pool's size is the cluster's concurrency
//! limit: a query that finds every connection busy waits for one, as a
//! warehouse's WLM queue holds it, and its report counts that wait as
//! queueing (`started` is when it got its connection).
//!
//! What it guarantees:
//!
//! - (A) **Timeouts end on the server.** Every connection runs with
//!   `statement_timeout` set to the pool's query timeout, so the server
//!   ends a long query itself (SQLSTATE 57014, reported as timed out). A
//!   guard a little past the timeout sends the cancel request in case the
//!   server did not.
//! - (B) **A cancel stops the server.** [`Backend::cancel`] sends the
//!   protocol's cancel request for the query's connection (dropping a
//!   future would leave it running there); a query still waiting for a
//!   connection never starts.
//! - (C) **Nothing runs twice.** A query whose connection could not be had
//!   (refused, closed before the query was written) is retried once on a
//!   fresh connection; once the query was sent, a lost connection fails it
//!   with a reason and it is never re-run: it may have been DML.
//! - (D) **Dead servers are routed around.** A lost connection or a failed
//!   connect marks the cluster unhealthy (watchers hear
//!   [`ClusterState::Unhealthy`] with the error); a health check on its
//!   own connection, every `health_check_interval`, marks it ready again
//!   when it answers.
//! - (E) **Secrets stay secret.** Passwords come from the environment or a
//!   file, are handed to the driver only, and no state or error shows them.
//! - (F) **TLS as libpq means it.** `require` encrypts without checking the
//!   server's certificate; `verify-full` checks its chain (against a CA file,
//!   or the bundled Mozilla roots, which include Amazon's) and that it names
//!   the host. Every connection of the cluster — pooled, health check and
//!   cancel request — uses the same mode.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration as StdDuration;

use actix::Recipient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, PoolError, RecyclingMethod, Timeouts};
use serde::Serialize;
use slogate_actors::backend::{
    Backend, BackendState, CancelReason, ClusterUpdate, Completion, ExecuteError, Execution, Failure, LocalFuture, ResultRows,
};
use slogate_actors::clock::VirtualClock;
use slogate_core::model::{ClusterId, ClusterState, ExecutionOutcome, ExecutionReport, PoolId, QueryId, Rpu, Target};
use slogate_core::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::{CancelToken, NoTls, SimpleQueryMessage};
use tokio_stream::StreamExt;

use crate::{Error, Result};

/// One server of a pool, as configured.
#[derive(Clone)]
pub struct Endpoint {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// Database.
    pub database: String,
    /// User.
    pub user: String,
    /// Password, if the server asks for one (never shown).
    pub password: Option<String>,
    /// Declared size, RPU (what billing and the predictor's size features
    /// use).
    pub size: Rpu,
    /// Connections at most: the cluster's concurrency limit.
    pub connections: usize,
    /// How its connections are secured.
    pub tls: TlsMode,
}

/// How a cluster's connections are secured (libpq's `sslmode` names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP.
    Disable,
    /// TLS, without checking the server's certificate.
    Require,
    /// TLS; the certificate must chain to a trusted root (the CA file's, or
    /// the bundled Mozilla roots) and name the host.
    VerifyFull {
        /// PEM certificates to trust instead of the bundled roots.
        ca_file: Option<std::path::PathBuf>,
    },
}

/// A cluster's connector: the driver's TLS for its mode.
#[derive(Clone)]
enum Connector {
    Plain,
    Rustls(tokio_postgres_rustls::MakeRustlsConnect),
}

impl Connector {
    fn for_mode(mode: &TlsMode) -> Result<Connector, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let config = match mode {
            TlsMode::Disable => return Ok(Connector::Plain),
            TlsMode::Require => {
                builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))).with_no_client_auth()
            }
            TlsMode::VerifyFull { ca_file } => {
                let mut roots = rustls::RootCertStore::empty();
                match ca_file {
                    Some(path) => {
                        use rustls::pki_types::pem::PemObject;
                        let certificates = rustls::pki_types::CertificateDer::pem_file_iter(path)
                            .map_err(|e| format!("TLS: cannot read ca_file {}: {e}", path.display()))?;
                        for certificate in certificates {
                            let certificate = certificate.map_err(|e| format!("TLS: ca_file {}: {e}", path.display()))?;
                            roots.add(certificate).map_err(|e| format!("TLS: ca_file {}: {e}", path.display()))?;
                        }
                        if roots.is_empty() {
                            return Err(format!("TLS: ca_file {} holds no certificate", path.display()));
                        }
                    }
                    None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        Ok(Connector::Rustls(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
    }

    fn manager(&self, config: tokio_postgres::Config) -> Manager {
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        match self {
            Connector::Plain => Manager::from_config(config, NoTls, recycling),
            Connector::Rustls(tls) => Manager::from_config(config, tls.clone(), recycling),
        }
    }

    async fn connect(&self, config: &tokio_postgres::Config) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
        match self {
            Connector::Plain => connect_with(config, NoTls).await,
            Connector::Rustls(tls) => connect_with(config, tls.clone()).await,
        }
    }

    async fn cancel(&self, token: &CancelToken) -> Result<(), tokio_postgres::Error> {
        match self {
            Connector::Plain => token.cancel_query(NoTls).await,
            Connector::Rustls(tls) => token.cancel_query(tls.clone()).await,
        }
    }
}

/// One connection outside the pool; its driver runs on the actor runtime.
async fn connect_with<T>(config: &tokio_postgres::Config, tls: T) -> Result<tokio_postgres::Client, tokio_postgres::Error>
where
    T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket>,
    T::Stream: 'static,
{
    let (client, connection) = config.connect(tls).await?;
    actix_rt::spawn(connection);
    Ok(client)
}

/// `require`'s verifier: any certificate, with its handshake signatures
/// still checked (libpq's `sslmode=require`).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Endpoint {
    /// `user@host:port/database`, for messages and state: no password.
    pub fn describe(&self) -> String {
        format!("{}@{}:{}/{}", self.user, self.host, self.port, self.database)
    }
}

/// A pool's executor settings.
#[derive(Clone, Debug)]
pub struct PostgresSettings {
    /// The pool's query timeout (the server's `statement_timeout`).
    pub query_timeout: StdDuration,
    /// Rows kept per result at most.
    pub result_rows_max: usize,
    /// Bytes of values kept per result at most.
    pub result_bytes_max: usize,
    /// Between health checks of each cluster.
    pub health_check_interval: StdDuration,
    /// Connecting gives up after this.
    pub connect_timeout: StdDuration,
}

/// How long past the query timeout the guard waits before it cancels on
/// the server itself.
const TIMEOUT_GUARD_MARGIN: StdDuration = StdDuration::from_secs(2);

struct Cluster {
    id: ClusterId,
    endpoint: Endpoint,
    connector: Connector,
    pool: Pool,
    /// `SHOW server_version` at start.
    server_version: String,
    health: Mutex<Health>,
    /// Released by its provider: it takes no new query.
    draining: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Health {
    /// Why it is unhealthy; `None` when healthy.
    failing: Option<String>,
    executing: usize,
    completed: u64,
    failed: u64,
    timed_out: u64,
}

/// A query the backend holds: where, its cancel handle once it has a
/// connection, and a cancel asked for.
struct Running {
    token: Option<CancelToken>,
    /// Where it got its connection.
    cluster: Option<ClusterId>,
    cancelled: Option<CancelReason>,
}

struct Inner {
    pool: PoolId,
    clusters: Mutex<std::collections::BTreeMap<ClusterId, Arc<Cluster>>>,
    /// A provider pool's connection settings: every cluster its provider
    /// hands over is this endpoint at the provided host and port.
    template: Option<Endpoint>,
    /// Statements each provided cluster runs once before it is ready (a
    /// datashare to attach, say).
    setup_sql: Vec<String>,
    settings: PostgresSettings,
    clock: VirtualClock,
    running: Mutex<HashMap<QueryId, Running>>,
    watchers: Mutex<Vec<(PoolId, Recipient<ClusterUpdate>)>>,
}

/// The executor. See the module docs.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
}

/// One cluster's observable state.
#[derive(Clone, Debug, Serialize)]
struct ClusterDetail {
    cluster: ClusterId,
    endpoint: String,
    tls: String,
    size: Rpu,
    server_version: String,
    healthy: bool,
    unhealthy_reason: Option<String>,
    connections_max: usize,
    connections_open: usize,
    connections_idle: usize,
    waiting_for_connection: usize,
    executing: usize,
    completed: u64,
    failed: u64,
    timed_out: u64,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic elsewhere cannot leave these maps half-updated: every
    // critical section is a single insert, remove or field write.
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl PostgresBackend {
    /// Connects to every endpoint of `pool` (ids `c0`, `c1`, … in order),
    /// checks each answers, and starts their health checks. Must run
    /// inside the node's actix System.
    ///
    /// # Errors
    ///
    /// [`Error::Node`] naming the cluster and endpoint when one is
    /// unreachable, refuses the credentials, or lacks the database.
    pub async fn connect(pool: PoolId, endpoints: Vec<Endpoint>, settings: PostgresSettings, clock: VirtualClock) -> Result<Self> {
        let mut clusters = std::collections::BTreeMap::new();
        for (index, endpoint) in endpoints.into_iter().enumerate() {
            let id = ClusterId(index as u32);
            let described = endpoint.describe();
            let cluster = open_cluster(id, endpoint, &settings).await.map_err(|reason| Error::Node(format!("pool `{pool}` cluster {id} ({described}): {reason}")))?;
            clusters.insert(id, Arc::new(cluster));
        }
        let backend = Self::with_clusters(pool, clusters, None, settings, clock);
        for id in backend.inner.cluster_ids() {
            actix_rt::spawn(health_checks(Arc::downgrade(&backend.inner), id));
        }
        Ok(backend)
    }

    /// A backend for a pool whose clusters a cloud provider creates: it
    /// starts with none, and connects to each the provider hands over
    /// ([`slogate_actors::provider::EndpointSink`]) with `template`'s database, user, password, TLS
    /// and connection limit, and runs `setup_sql` on each before it is
    /// ready. Must run inside the node's actix System.
    pub fn for_provider(pool: PoolId, template: Endpoint, setup_sql: Vec<String>, settings: PostgresSettings, clock: VirtualClock) -> Self {
        let mut backend = Self::with_clusters(pool, std::collections::BTreeMap::new(), Some(template), settings, clock);
        Arc::get_mut(&mut backend.inner).expect("a new backend has one owner").setup_sql = setup_sql;
        backend
    }

    fn with_clusters(
        pool: PoolId,
        clusters: std::collections::BTreeMap<ClusterId, Arc<Cluster>>,
        template: Option<Endpoint>,
        settings: PostgresSettings,
        clock: VirtualClock,
    ) -> Self {
        let inner = Inner { pool, clusters: Mutex::new(clusters), template, setup_sql: Vec::new(), settings, clock, running: Mutex::default(), watchers: Mutex::default() };
        PostgresBackend { inner: Arc::new(inner) }
    }

    /// The clusters, with their declared sizes, in id order.
    pub fn clusters(&self) -> Vec<(ClusterId, Rpu)> {
        lock(&self.inner.clusters).values().map(|c| (c.id, c.endpoint.size)).collect()
    }
}

/// Connects to `endpoint` as cluster `id`: its connection pool, and one
/// probe that it answers.
async fn open_cluster(id: ClusterId, endpoint: Endpoint, settings: &PostgresSettings) -> Result<Cluster, String> {
    let config = pg_config(&endpoint, settings);
    let connector = Connector::for_mode(&endpoint.tls)?;
    let built = Pool::builder(connector.manager(config.clone()))
        .max_size(endpoint.connections)
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .timeouts(Timeouts { wait: None, create: Some(settings.connect_timeout), recycle: Some(settings.connect_timeout) })
        .build()
        .map_err(|e| format!("cannot build its connection pool: {e}"))?;
    let server_version = probe(&connector, &config).await?;
    Ok(Cluster { id, endpoint, connector, pool: built, server_version, health: Mutex::default(), draining: Default::default() })
}

/// How long a provided endpoint may take to pass its first health check.
const ATTACH_TIMEOUT: StdDuration = StdDuration::from_secs(60);

/// Between an attaching endpoint's health checks.
const ATTACH_RETRY: StdDuration = StdDuration::from_millis(500);

impl slogate_actors::provider::EndpointSink for PostgresBackend {
    fn attach(&self, pool: PoolId, cluster: ClusterId, size: Rpu, endpoint: slogate_actors::provider::ProvidedEndpoint) -> LocalFuture<Result<(), String>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let Some(template) = inner.template.clone() else {
                return Err(format!("pool `{pool}` runs on fixed endpoints and takes no provided cluster"));
            };
            let endpoint = Endpoint { host: endpoint.host, port: endpoint.port, size, ..template };
            let deadline = tokio::time::Instant::now() + ATTACH_TIMEOUT;
            let opened = loop {
                match open_cluster(cluster, endpoint.clone(), &inner.settings).await {
                    Ok(opened) => break opened,
                    Err(reason) if tokio::time::Instant::now() + ATTACH_RETRY > deadline => {
                        return Err(format!("did not pass its health check within {} s: {reason}", ATTACH_TIMEOUT.as_secs()));
                    }
                    Err(_) => tokio::time::sleep(ATTACH_RETRY).await,
                }
            };
            if !inner.setup_sql.is_empty() {
                let client = opened.pool.get().await.map_err(|e| format!("cannot connect to run its setup SQL: {e}"))?;
                for statement in &inner.setup_sql {
                    client.simple_query(statement).await.map_err(|e| format!("its setup SQL failed on `{statement}`: {}", describe_error(&e)))?;
                }
            }
            tracing::info!(message = "A provided cluster passed its health check.", pool = %pool, cluster = %cluster, endpoint = %opened.endpoint.describe(), server_version = %opened.server_version);
            lock(&inner.clusters).insert(cluster, Arc::new(opened));
            actix_rt::spawn(health_checks(Arc::downgrade(&inner), cluster));
            inner.notify(cluster, ClusterState::Ready, None);
            Ok(())
        })
    }

    fn abandon(&self, _pool: PoolId, cluster: ClusterId, reason: String) {
        lock(&self.inner.clusters).remove(&cluster);
        self.inner.notify(cluster, ClusterState::Gone, Some(reason));
    }

    fn detach(&self, pool: PoolId, cluster: ClusterId) {
        if lock(&self.inner.clusters).remove(&cluster).is_some() {
            tracing::info!(message = "Let go of a provided cluster for another node to adopt.", pool = %pool, cluster = %cluster);
        }
    }

    fn drain(&self, _pool: PoolId, cluster: ClusterId) -> LocalFuture<()> {
        let inner = self.inner.clone();
        Box::pin(async move {
            if let Some(draining) = inner.cluster(cluster) {
                draining.draining.store(true, std::sync::atomic::Ordering::Relaxed);
                while lock(&draining.health).executing > 0 {
                    tokio::time::sleep(StdDuration::from_millis(100)).await;
                }
            }
            lock(&inner.clusters).remove(&cluster);
            inner.notify(cluster, ClusterState::Gone, Some("released by its provider".into()));
        })
    }
}

/// The driver's settings for `endpoint`: the pool's statement timeout on
/// every session, and a name operators can find in `pg_stat_activity`.
fn pg_config(endpoint: &Endpoint, settings: &PostgresSettings) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host(&endpoint.host)
        .port(endpoint.port)
        .dbname(&endpoint.database)
        .user(&endpoint.user)
        .application_name("slogate")
        .connect_timeout(settings.connect_timeout)
        .keepalives(true)
        .options(format!("-c statement_timeout={}", settings.query_timeout.as_millis().max(1)))
        .ssl_mode(if endpoint.tls == TlsMode::Disable { tokio_postgres::config::SslMode::Disable } else { tokio_postgres::config::SslMode::Require });
    if let Some(password) = &endpoint.password {
        config.password(password);
    }
    config
}

/// Connects once on a connection of its own and reads the server's
/// version: the start-up check and the health check.
async fn probe(connector: &Connector, config: &tokio_postgres::Config) -> Result<String, String> {
    let client = connector.connect(config).await.map_err(|e| describe_error(&e))?;
    let version = client.simple_query("SHOW server_version").await.map_err(|e| describe_error(&e))?;
    version
        .iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .ok_or_else(|| "the server did not report server_version".to_owned())
}

/// A driver error as one line: the server's message and SQLSTATE when it
/// sent one, else the driver's (and its cause's) description.
fn describe_error(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => match std::error::Error::source(error) {
            Some(cause) => format!("{error}: {cause}"),
            None => error.to_string(),
        },
    }
}

/// Checks `cluster` every interval while the backend lives; reports
/// unhealthy and healthy transitions.
async fn health_checks(inner: Weak<Inner>, cluster: ClusterId) {
    loop {
        let Some(backend) = inner.upgrade() else { return };
        let interval = backend.settings.health_check_interval;
        // A cluster its provider released is checked no more.
        let Some(checked) = backend.cluster(cluster) else { return };
        let (config, connector) = (pg_config(&checked.endpoint, &backend.settings), checked.connector.clone());
        drop(backend);
        tokio::time::sleep(interval).await;
        let result = probe(&connector, &config).await;
        let Some(backend) = inner.upgrade() else { return };
        match result {
            Ok(_) => backend.mark_healthy(cluster),
            Err(reason) => backend.mark_unhealthy(cluster, format!("health check failed: {reason}")),
        }
    }
}

impl Inner {
    fn cluster(&self, id: ClusterId) -> Option<Arc<Cluster>> {
        lock(&self.clusters).get(&id).cloned()
    }

    fn cluster_ids(&self) -> Vec<ClusterId> {
        lock(&self.clusters).keys().copied().collect()
    }

    fn notify(&self, cluster: ClusterId, state: ClusterState, reason: Option<String>) {
        for (pool, watcher) in lock(&self.watchers).iter() {
            watcher.do_send(ClusterUpdate { pool: pool.clone(), cluster, state, reason: reason.clone() });
        }
    }

    fn mark_unhealthy(&self, id: ClusterId, reason: String) {
        let Some(cluster) = self.cluster(id) else { return };
        let newly = {
            let mut health = lock(&cluster.health);
            let newly = health.failing.is_none();
            health.failing = Some(reason.clone());
            newly
        };
        if newly {
            tracing::warn!(message = "Cluster is unhealthy; routing around it.", pool = %self.pool, cluster = %id, endpoint = %cluster.endpoint.describe(), %reason);
            self.notify(id, ClusterState::Unhealthy, Some(reason));
        }
    }

    fn mark_healthy(&self, id: ClusterId) {
        let Some(cluster) = self.cluster(id) else { return };
        let recovered = lock(&cluster.health).failing.take().is_some();
        if recovered {
            tracing::info!(message = "Cluster passed its health check; routing to it again.", pool = %self.pool, cluster = %id);
            self.notify(id, ClusterState::Ready, None);
        }
    }

    fn failure(&self, reason: String, sqlstate: Option<String>, started: Option<Instant>) -> Completion {
        Completion::Failed(Failure { reason, sqlstate, started, finished: self.clock.now(), throttled: false })
    }

    /// Runs `execution` on `cluster`; see the module docs for what each
    /// ending means.
    async fn run(self: Arc<Self>, execution: Execution, id: ClusterId, sql: Arc<str>) -> Completion {
        let cluster = self.cluster(id).expect("checked by execute");
        let query = execution.query.id;
        let dispatched = self.clock.now();
        let report = |started: Option<Instant>, outcome: ExecutionOutcome| ExecutionReport {
            query,
            target: Target::Cluster(id),
            arrival: execution.query.arrival,
            dispatched,
            started,
            finished: self.clock.now(),
            outcome,
        };

        // The WLM queue: wait for a connection, at most the query timeout.
        // A connection that cannot be had is retried once (nothing was
        // sent on it).
        let mut attempt = 0;
        let client = loop {
            let wait = Timeouts { wait: Some(self.settings.query_timeout), ..cluster.pool.timeouts() };
            match cluster.pool.timeout_get(&wait).await {
                Ok(client) if !client.is_closed() => break client,
                Ok(closed) => {
                    drop(deadpool_postgres::Object::take(closed));
                    attempt += 1;
                    if attempt == 2 {
                        self.mark_unhealthy(id, "its connections keep closing".into());
                        return self.failure(format!("cluster {id}: its connections closed before the query was sent"), None, None);
                    }
                }
                Err(PoolError::Timeout(_)) => return Completion::Ran { report: report(None, ExecutionOutcome::TimedOut), result: None },
                Err(error) => {
                    attempt += 1;
                    if attempt == 2 {
                        let reason = match &error {
                            PoolError::Backend(e) => describe_error(e),
                            other => other.to_string(),
                        };
                        self.mark_unhealthy(id, format!("cannot connect: {reason}"));
                        return self.failure(format!("cluster {id}: cannot connect (tried twice): {reason}"), None, None);
                    }
                }
            }
        };
        let started = self.clock.now();
        {
            let mut running = lock(&self.running);
            let Some(entry) = running.get_mut(&query) else {
                return self.failure("the query was forgotten before it started".into(), None, None);
            };
            if let Some(reason) = entry.cancelled {
                return self.failure(reason.explanation().into(), None, None);
            }
            entry.token = Some(client.cancel_token());
            entry.cluster = Some(id);
        }
        lock(&cluster.health).executing += 1;

        let guard = self.settings.query_timeout + TIMEOUT_GUARD_MARGIN;
        let limits = (self.settings.result_rows_max, self.settings.result_bytes_max);
        let outcome = tokio::time::timeout(guard, collect_rows(&client, &sql, limits)).await;
        lock(&cluster.health).executing -= 1;
        let cancelled = lock(&self.running).get(&query).and_then(|r| r.cancelled);
        let completion = match outcome {
            Ok(Ok(rows)) => Completion::Ran { report: report(Some(started), ExecutionOutcome::Completed), result: Some(rows) },
            Ok(Err(error)) => {
                let sqlstate = error.code().map(|c| c.code().to_owned());
                if error.code() == Some(&SqlState::QUERY_CANCELED) && cancelled.is_none() {
                    // The server's statement_timeout ended it.
                    Completion::Ran { report: report(Some(started), ExecutionOutcome::TimedOut), result: None }
                } else if let Some(reason) = cancelled {
                    self.failure(reason.explanation().into(), sqlstate, Some(started))
                } else if error.as_db_error().is_some() {
                    self.failure(describe_error(&error), sqlstate, Some(started))
                } else {
                    // The connection broke after the query was sent: never
                    // re-run it (it may have had effects).
                    let reason = describe_error(&error);
                    self.mark_unhealthy(id, format!("connection lost mid-query: {reason}"));
                    drop(deadpool_postgres::Object::take(client));
                    self.record(id, false, false);
                    return self.failure(
                        format!("cluster {id}: the connection was lost after the query was sent ({reason}); not retried, as it may have had effects"),
                        sqlstate,
                        Some(started),
                    );
                }
            }
            Err(_) => {
                // The server did not end it at its statement_timeout: end
                // it here, and do not reuse the connection.
                let token = client.cancel_token();
                drop(deadpool_postgres::Object::take(client));
                let _ = cluster.connector.cancel(&token).await;
                Completion::Ran { report: report(Some(started), ExecutionOutcome::TimedOut), result: None }
            }
        };
        match &completion {
            Completion::Ran { report, .. } => self.record(id, report.outcome == ExecutionOutcome::Completed, report.outcome == ExecutionOutcome::TimedOut),
            Completion::Failed(_) => self.record(id, false, false),
        }
        completion
    }

    fn record(&self, id: ClusterId, completed: bool, timed_out: bool) {
        let Some(cluster) = self.cluster(id) else { return };
        let mut health = lock(&cluster.health);
        if completed {
            health.completed += 1;
        } else if timed_out {
            health.timed_out += 1;
        } else {
            health.failed += 1;
        }
    }
}

/// Runs `sql` by the simple-query protocol and keeps the first result
/// set's rows within `(rows_max, bytes_max)`; later rows are read and
/// counted, so the latency is the whole query's.
async fn collect_rows(client: &tokio_postgres::Client, sql: &str, (rows_max, bytes_max): (usize, usize)) -> Result<ResultRows, tokio_postgres::Error> {
    let stream = client.simple_query_raw(sql).await?;
    tokio::pin!(stream);
    let mut result = ResultRows::default();
    let mut bytes = 0usize;
    let mut result_sets = 0;
    while let Some(message) = stream.next().await {
        match message? {
            SimpleQueryMessage::RowDescription(columns) => {
                result_sets += 1;
                if result_sets == 1 {
                    result.columns = columns.iter().map(|c| c.name().to_owned()).collect();
                }
            }
            SimpleQueryMessage::Row(row) => {
                result.rows_total += 1;
                if result_sets > 1 || result.rows.len() >= rows_max {
                    result.truncated = true;
                    continue;
                }
                let values: Vec<Option<String>> = (0..row.len()).map(|i| row.get(i).map(str::to_owned)).collect();
                let size: usize = values.iter().map(|v| v.as_ref().map_or(0, String::len)).sum();
                if bytes + size > bytes_max {
                    result.truncated = true;
                    continue;
                }
                bytes += size;
                result.rows.push(values);
            }
            SimpleQueryMessage::CommandComplete(_) => {}
            _ => {}
        }
    }
    Ok(result)
}

impl Backend for PostgresBackend {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn execute(&self, execution: Execution) -> LocalFuture<Result<Completion, ExecuteError>> {
        let inner = self.inner.clone();
        Box::pin(async move {
            let id = match execution.target {
                Target::Cluster(id) => id,
                Target::Elastic => return Err(ExecuteError::NoElasticTier),
            };
            let Some(cluster) = inner.cluster(id) else { return Err(ExecuteError::UnknownCluster(id)) };
            if lock(&cluster.health).failing.is_some() {
                return Err(ExecuteError::NotAccepting(id, ClusterState::Unhealthy));
            }
            if cluster.draining.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(ExecuteError::NotAccepting(id, ClusterState::Draining));
            }
            let Some(sql) = execution.sql.clone() else {
                return Err(ExecuteError::NoSql(format!(
                    "pool `{}` runs SQL, and template {} has no text in its catalog: send the query as sql",
                    inner.pool, execution.query.template
                )));
            };
            let query = execution.query.id;
            {
                let mut running = lock(&inner.running);
                if running.contains_key(&query) {
                    return Err(ExecuteError::Duplicate(query));
                }
                running.insert(query, Running { token: None, cluster: None, cancelled: None });
            }
            let completion = inner.clone().run(execution, id, sql).await;
            lock(&inner.running).remove(&query);
            Ok(completion)
        })
    }

    fn cancel(&self, query: QueryId, reason: CancelReason) {
        let token = {
            let mut running = lock(&self.inner.running);
            let Some(entry) = running.get_mut(&query) else { return };
            entry.cancelled = Some(reason);
            entry.token.clone().zip(entry.cluster)
        };
        if let Some((token, cluster)) = token {
            let pool = self.inner.pool.clone();
            let Some(connector) = self.inner.cluster(cluster).map(|c| c.connector.clone()) else { return };
            actix_rt::spawn(async move {
                if let Err(error) = connector.cancel(&token).await {
                    tracing::warn!(message = "Cancel request failed.", %pool, %query, error = %describe_error(&error));
                }
            });
        }
    }

    fn watch_clusters(&self, pool: PoolId, recipient: Recipient<ClusterUpdate>) {
        lock(&self.inner.watchers).push((pool, recipient));
    }

    fn state(&self) -> LocalFuture<Result<BackendState, ExecuteError>> {
        let clusters: Vec<ClusterDetail> = lock(&self.inner.clusters)
            .values()
            .map(|c| {
                let health = lock(&c.health);
                let status = c.pool.status();
                ClusterDetail {
                    cluster: c.id,
                    endpoint: c.endpoint.describe(),
                    tls: match &c.endpoint.tls {
                        TlsMode::Disable => "disable".into(),
                        TlsMode::Require => "require".into(),
                        TlsMode::VerifyFull { .. } => "verify-full".into(),
                    },
                    size: c.endpoint.size,
                    server_version: c.server_version.clone(),
                    healthy: health.failing.is_none(),
                    unhealthy_reason: health.failing.clone(),
                    connections_max: status.max_size,
                    connections_open: status.size,
                    connections_idle: status.available,
                    waiting_for_connection: status.waiting,
                    executing: health.executing,
                    completed: health.completed,
                    failed: health.failed,
                    timed_out: health.timed_out,
                }
            })
            .collect();
        let state = BackendState {
            kind: "postgres",
            vendor_billed_usd: None,
            elastic_billed_usd: 0.0,
            executing: clusters.iter().map(|c| (c.cluster, c.executing)).collect(),
            detail: serde_json::json!({
                "query_timeout_s": self.inner.settings.query_timeout.as_secs_f64(),
                "clusters": clusters,
            }),
        };
        Box::pin(std::future::ready(Ok(state)))
    }
}
