//! The tonic Gateway service: validates each request, forwards it to the
//! RouterShard, and turns the outcome into a `SubmitResponse`. It decides
//! nothing itself.

use std::pin::Pin;
use std::sync::Arc;

use actix::Addr;
use slogate_actors::metrics::Histogram;
use slogate_actors::backend::ResultRows;
use slogate_actors::idempotency::{RequestDigest, fnv1a};

use super::tenants::{InFlightSlot, Tenant, Tenants, bearer, retry_after};
use super::transport::connection_info;
use slogate_actors::router::{ClientGone, Recall, Remember, RouterShard, Submit, SubmitOutcome, SubmitStatus};
use slogate_actors::shards::RouterShards;
use slogate_proto::GatewayError;
use slogate_proto::v1::gateway_server::Gateway;
use slogate_proto::error::kind_of_code;
use slogate_proto::v1::{ForwardReply, ForwardRequest, QueryStatus, ResultSet, Row, SubmitRequest, SubmitResponse, submit_request};

use super::fleet::{Fleet, Placement, retryable};
use slogate_proto::validate::{Limits, validate_submit};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

/// Translates the actors' errors into gateway errors (whose codes are
/// mapped in `slogate_proto::error::status_codes`).
pub fn gateway_error(error: slogate_actors::Error) -> GatewayError {
    use slogate_actors::Error as A;
    match error {
        A::UnknownPool(pool) => GatewayError::UnknownPool(pool),
        A::AdmissionLimit { in_flight, limit } => GatewayError::AdmissionLimit { in_flight, limit },
        A::ShuttingDown => GatewayError::ShuttingDown,
        A::UnknownCluster(cluster) => GatewayError::UnknownCluster(cluster),
        A::Backend(reason) => GatewayError::Unavailable(reason),
        A::Unsupported(reason) => GatewayError::Conflict(reason),
        A::TuningInProgress(pool) => GatewayError::Conflict(format!("pool `{pool}` is already being tuned")),
        A::RetrainingInProgress(pool) => GatewayError::Conflict(format!("pool `{pool}`'s model is already being retrained")),
        limit @ (A::ClusterLimit { .. } | A::LastReadyCluster { .. } | A::CapReached { .. }) => GatewayError::Conflict(limit.to_string()),
        mismatch @ A::IdempotencyMismatch { .. } => GatewayError::AlreadyExists(mismatch.to_string()),
        other @ (A::Storage(_) | A::CorruptStore(_) | A::DamagedStore { .. }) => GatewayError::Internal(other.to_string()),
    }
}

/// How long a query waits at the intake for the reservoir to catch up
/// before it is refused (UNAVAILABLE, retryable).
pub const INTAKE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

/// The intake's backpressure: new queries wait while more than
/// `backlog_max` updates wait for the reservoir's thread, so a reservoir
/// that cannot keep up slows the clients (as one thread for both did)
/// rather than growing its mailbox or dropping history.
#[derive(Clone, Debug)]
pub struct Intake {
    /// Updates sent to the reservoir and not yet handled.
    pub reservoir_backlog: slogate_actors::reservoir::Backlog,
    /// The high-water mark.
    pub backlog_max: usize,
    /// How long a query waits at most ([`INTAKE_WAIT_MAX`] in a node).
    pub wait_max: std::time::Duration,
    /// Queries that had to wait, since start.
    pub held: Arc<std::sync::atomic::AtomicU64>,
}

impl Intake {
    /// Returns once the reservoir's backlog is at most `backlog_max`, or
    /// UNAVAILABLE after `wait_max`.
    pub async fn admit(&self) -> Result<(), GatewayError> {
        if self.reservoir_backlog.len() <= self.backlog_max {
            return Ok(());
        }
        self.held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + self.wait_max;
        while self.reservoir_backlog.len() > self.backlog_max {
            if tokio::time::Instant::now() >= deadline {
                return Err(GatewayError::Unavailable(format!(
                    "the node's execution log is {} updates behind; retry",
                    self.reservoir_backlog.len()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// The Gateway service.
#[derive(Clone)]
pub struct GatewayService {
    router: RouterShards,
    limits: Limits,
    added_latency: Arc<Histogram>,
    stream_in_flight_max: usize,
    /// Turns true when the node starts to shut down: streams stop reading.
    closing: tokio::sync::watch::Receiver<bool>,
    tenants: Arc<Tenants>,
    intake: Intake,
    /// The deployment this node is one of; `None` when it is alone.
    fleet: Option<Arc<Fleet>>,
    /// This node's execution log, which keeps a copy of what the owners
    /// of the pools it forwards to logged.
    log: Option<slogate_actors::reservoir::ReservoirLink>,
}

/// A request once validated: only what the query needs from here on.
struct Validated {
    spec: slogate_proto::validate::SubmitSpec,
    sql: Option<Arc<str>>,
    digest: RequestDigest,
    tenant: String,
    /// The tenant's in-flight slot, held until the query is answered.
    _slot: Option<InFlightSlot>,
}

impl GatewayService {
    /// A service forwarding each query to its pool's shard of `router`, recording each query's time in
    /// slogate outside the backend in `added_latency`; each `SubmitStream`
    /// has at most `stream_in_flight_max` queries in progress, and stops
    /// reading once `closing` turns true; new queries wait at `intake`.
    pub fn new(
        router: RouterShards,
        limits: Limits,
        added_latency: Arc<Histogram>,
        stream_in_flight_max: usize,
        closing: tokio::sync::watch::Receiver<bool>,
        tenants: Arc<Tenants>,
        intake: Intake,
    ) -> Self {
        GatewayService { router, limits, added_latency, stream_in_flight_max: stream_in_flight_max.max(1), closing, tenants, intake, fleet: None, log: None }
    }

    /// The service as one node of `fleet`: queries of pools another node
    /// owns are forwarded to it, and the executions the owners logged for
    /// them are copied into `log`.
    pub fn with_fleet(mut self, fleet: Arc<Fleet>, log: slogate_actors::reservoir::ReservoirLink) -> Self {
        self.fleet = Some(fleet);
        self.log = Some(log);
        self
    }

    /// Copies an owner's logged `execution` into this node's log. A full
    /// log drops it (the owner's own log has it).
    fn keep_copy(&self, execution: Option<slogate_proto::v1::Execution>) {
        if let (Some(log), Some(execution)) = (&self.log, execution) {
            let _ = log.offer_batch(vec![slogate_actors::reservoir::LogUpdate::Execution(execution_record(&execution))]);
        }
    }

    /// The calling tenant, from the call's `authorization` metadata.
    fn caller<T>(&self, request: &Request<T>) -> Result<Option<Arc<Tenant>>, Status> {
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let peer = connection_info(request.extensions()).map(|c| c.remote);
        self.tenants.authenticate(bearer(header), peer).map_err(|e| status_of(&e))
    }

    /// Checks `request` and keeps only what the query needs: the payload,
    /// labels and anything else are dropped here.
    /// Checks `request` from `tenant` (and admits it under the tenant's
    /// limits), keeping only what the query needs.
    fn validate(&self, request: SubmitRequest, tenant: Option<&Arc<Tenant>>) -> Result<Validated, GatewayError> {
        let spec = validate_submit(&request, &self.limits)?;
        let slot = tenant.map(|t| t.admit(&spec.pool.0, std::time::Instant::now())).transpose()?;
        let name = tenant.map(|t| t.name.clone()).unwrap_or_default();
        Ok(self.checked(request, spec, name, slot))
    }

    /// Keeps what a checked `request` needs, for `tenant`.
    fn checked(&self, request: SubmitRequest, spec: slogate_proto::validate::SubmitSpec, tenant: String, slot: Option<InFlightSlot>) -> Validated {
        let mut rest: Vec<&[u8]> = vec![&request.payload];
        for (key, value) in &spec.labels {
            rest.extend([key.as_bytes(), value.as_bytes()]);
        }
        let rest = fnv1a(&rest);
        let sql = match request.query {
            Some(submit_request::Query::Sql(text)) => Some(Arc::from(text)),
            _ => None,
        };
        let digest = RequestDigest {
            template: spec.template,
            slo_ms: request.slo_ms,
            sql: sql.as_deref().map_or(0, |text: &str| fnv1a(&[text.as_bytes()])),
            rest,
        };
        Validated { spec, sql, digest, tenant, _slot: slot }
    }

    /// Answers `request` from `tenant`: routes it here when this node owns
    /// its pool, or forwards it to the owner, trying again (same id) while
    /// the owner fails or the pool changes hands, until `deadline` (the
    /// client's, or the fleet's failover wait).
    async fn answer(&self, request: SubmitRequest, tenant: Option<&Arc<Tenant>>, deadline: Option<std::time::Duration>) -> Result<SubmitResponse, GatewayError> {
        let Some(fleet) = &self.fleet else {
            let query = self.validate(request, tenant)?;
            return self.run(query).await.map(response);
        };
        let pool = if request.pool.is_empty() { slogate_core::model::PoolId::default().to_string() } else { request.pool.clone() };
        // Counted first, then placed: see `Fleet::running`.
        let running = fleet.running(&pool);
        if fleet.placement(&pool) == Placement::Local {
            let query = self.validate(request, tenant)?;
            return self.run(query).await.map(response);
        }
        drop(running);
        let copy = request.clone();
        let query = self.validate(request, tenant)?;
        let shard = self.router.for_pool(&query.spec.pool).ok_or_else(|| GatewayError::UnknownPool(pool.clone()))?.clone();
        // A retry this node accepted before is answered from its record,
        // whoever owns the pool now.
        if !query.spec.client_query_id.is_empty() {
            let recall = Recall {
                pool: query.spec.pool.clone(),
                tenant: query.tenant.clone(),
                client_query_id: query.spec.client_query_id.clone(),
                digest: query.digest,
            };
            match shard.send(recall).await {
                Ok(Ok(Some(outcome))) => return Ok(response(outcome)),
                Ok(Err(error)) => return Err(gateway_error(error)),
                Ok(Ok(None)) | Err(_) => {}
            }
        }
        let started = std::time::Instant::now();
        let wait = deadline.unwrap_or(fleet.settings().failover_wait);
        let mut last_failure = String::from("no node owns it yet");
        let mut attempts = 0u32;
        loop {
            let running = fleet.running(&pool);
            match fleet.placement(&pool) {
                Placement::Local => return self.run(query).await.map(response),
                Placement::Remote { node, addr } => {
                    drop(running);
                    let left = wait.saturating_sub(started.elapsed());
                    let forward = ForwardRequest {
                        request: Some(copy.clone()),
                        tenant: query.tenant.clone(),
                        deadline_ms: deadline.map_or(0, |_| left.as_millis() as u64),
                        from_node: fleet.node_id.clone(),
                    };
                    attempts += 1;
                    if attempts == 1 {
                        fleet.forwarded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        fleet.reforwarded.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    match fleet.forward(&addr, forward, deadline.map(|_| left)).await {
                        Ok(ForwardReply { reply: Some(reply), execution }) => {
                            self.keep_copy(execution);
                            if !query.spec.client_query_id.is_empty() {
                                shard.do_send(Remember { record: remembered(&query, &reply) });
                            }
                            return Ok(reply);
                        }
                        Ok(ForwardReply { reply: None, .. }) => {
                            return Err(GatewayError::Internal(format!("node {node} answered a forwarded query with no reply")));
                        }
                        Err(status) if retryable(&status) => last_failure = format!("its owner {node} answered {:?}: {}", status.code(), status.message()),
                        Err(status) => return Err(GatewayError::Remote { kind: kind_of_code(status.code()), message: status.message().to_owned() }),
                    }
                }
                Placement::Unowned => drop(running),
            }
            let left = wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(GatewayError::Unavailable(format!(
                    "pool `{pool}` could not be reached within {:.1} s ({last_failure}); retry with the same query_id",
                    wait.as_secs_f64()
                )));
            }
            tokio::time::sleep(fleet.settings().poll_interval.min(left)).await;
        }
    }

    /// Runs a query another node forwarded: this node must own its pool.
    pub async fn forwarded(&self, forward: ForwardRequest) -> Result<ForwardReply, GatewayError> {
        let Some(fleet) = &self.fleet else { return Err(GatewayError::Internal("a single node takes no forwarded queries".into())) };
        let request = forward.request.ok_or_else(|| GatewayError::InvalidArgument("a forwarded query needs its request".into()))?;
        let spec = validate_submit(&request, &self.limits)?;
        let _running = fleet.running(&spec.pool.0);
        if fleet.placement(&spec.pool.0) != Placement::Local {
            return Err(GatewayError::NotOwner { pool: spec.pool.to_string(), node: fleet.node_id.clone() });
        }
        fleet.received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let query = self.checked(request, spec, forward.tenant, None);
        let mut outcome = self.run(query).await?;
        let execution = outcome.execution.take().map(|record| execution_message(&record));
        Ok(ForwardReply { reply: Some(response(outcome)), execution })
    }

    async fn run(&self, query: Validated) -> Result<SubmitOutcome, GatewayError> {
        let started = std::time::Instant::now();
        self.intake.admit().await?;
        let outcome = self.route_and_wait(query).await?;
        self.added_latency.observe(started.elapsed().saturating_sub(outcome.backend_wall));
        Ok(outcome)
    }

    async fn route_and_wait(&self, query: Validated) -> Result<SubmitOutcome, GatewayError> {
        let Validated { spec, sql, digest, tenant, _slot } = query;
        let pool = spec.pool.clone();
        let shard = self.router.for_pool(&pool).ok_or_else(|| GatewayError::UnknownPool(pool.to_string()))?;
        let submitted = shard
            .send(Submit {
                pool: spec.pool,
                client_query_id: spec.client_query_id,
                tenant,
                digest,
                template: spec.template,
                sql,
                slo: spec.slo,
            })
            .await
            .map_err(|e| match e {
                actix::MailboxError::Closed => GatewayError::ShuttingDown,
                actix::MailboxError::Timeout => GatewayError::Internal("router timed out".into()),
            })?
            .map_err(gateway_error)?;
        // Dropped unanswered (the client hung up, or its deadline passed
        // and tonic dropped this future), it tells the router, which
        // cancels the query on the server once no client waits for it.
        let mut waiting = ClientWaiting { router: shard.clone(), pool, query: submitted.query, answered: false };
        let outcome = submitted.reply.await.map_err(|_| GatewayError::Internal("the router dropped the query's reply".into()));
        waiting.answered = true;
        outcome
    }
}

/// A client waiting for a query's outcome; see `route_and_wait`.
struct ClientWaiting {
    router: Addr<RouterShard>,
    pool: slogate_core::model::PoolId,
    query: slogate_core::model::QueryId,
    answered: bool,
}

impl Drop for ClientWaiting {
    fn drop(&mut self) {
        if !self.answered {
            self.router.do_send(ClientGone { pool: self.pool.clone(), query: self.query });
        }
    }
}

/// The idempotency record of `query`, which another node ran and answered
/// with `reply` (the rows are not kept, as for a query run here).
fn remembered(query: &Validated, reply: &SubmitResponse) -> slogate_actors::idempotency::IdempotencyRecord {
    let target = match reply.target.as_str() {
        "" => None,
        "elastic" => Some(slogate_core::model::Target::Elastic),
        cluster => cluster.strip_prefix('c').and_then(|id| id.parse().ok()).map(|id| slogate_core::model::Target::Cluster(slogate_core::model::ClusterId(id))),
    };
    let status = match reply.status() {
        QueryStatus::Completed => SubmitStatus::Completed,
        QueryStatus::TimedOut => SubmitStatus::TimedOut,
        _ => SubmitStatus::Failed,
    };
    let outcome = SubmitOutcome {
        client_query_id: query.spec.client_query_id.clone(),
        query: slogate_core::model::QueryId(0),
        status,
        target,
        latency: slogate_core::time::Duration::from_secs_f64(reply.latency_ms / 1_000.0),
        slo_met: reply.slo_met,
        explanation: reply.explanation.as_str().into(),
        predicted: (reply.predicted_ms > 0.0).then(|| slogate_core::time::Duration::from_secs_f64(reply.predicted_ms / 1_000.0)),
        backend_wall: std::time::Duration::ZERO,
        sqlstate: (!reply.sqlstate.is_empty()).then(|| reply.sqlstate.clone()),
        result: reply.result.as_ref().map(|rows| ResultRows {
            columns: rows.columns.clone(),
            rows: Vec::new(),
            truncated: rows.truncated || !rows.rows.is_empty(),
            rows_total: rows.rows_total,
        }),
        execution: None,
    };
    slogate_actors::idempotency::IdempotencyRecord {
        pool: query.spec.pool.clone(),
        tenant: query.tenant.clone(),
        client_query_id: query.spec.client_query_id.clone(),
        digest: query.digest,
        finished_unix_s: slogate_actors::clock::unix_now_s(),
        outcome,
    }
}

/// An execution log record as the Node service carries it.
fn execution_message(record: &slogate_core::reservoir::ExecutionRecord) -> slogate_proto::v1::Execution {
    slogate_proto::v1::Execution {
        template: record.template.0,
        cluster: record.cluster.0,
        size_rpu: record.size.0,
        neighbours_at_dispatch: record.neighbours_at_dispatch,
        latency_us: record.latency.as_micros(),
        censored: record.censored,
        queued_us: record.queued.as_micros(),
        ran_alone: record.ran_alone,
    }
}

/// The record an owner's [`execution_message`] came from. The owner's
/// query id is its own, so the copy gets none.
fn execution_record(message: &slogate_proto::v1::Execution) -> slogate_core::reservoir::ExecutionRecord {
    use slogate_core::time::Duration;
    slogate_core::reservoir::ExecutionRecord {
        query: slogate_core::model::QueryId(0),
        template: slogate_core::model::TemplateId(message.template),
        cluster: slogate_core::model::ClusterId(message.cluster),
        size: slogate_core::model::Rpu(message.size_rpu),
        neighbours_at_dispatch: message.neighbours_at_dispatch,
        latency: Duration::from_micros(message.latency_us),
        censored: message.censored,
        queued: Duration::from_micros(message.queued_us),
        ran_alone: message.ran_alone,
        // The owner logged it with its timeline; the copy counts it.
        timeline: None,
    }
}

/// The client's deadline from its `grpc-timeout` header (`<digits><unit>`,
/// the unit one of H, M, S, m, u, n), if it set one.
pub fn client_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<std::time::Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => std::time::Duration::from_secs(amount.saturating_mul(3_600)),
        "M" => std::time::Duration::from_secs(amount.saturating_mul(60)),
        "S" => std::time::Duration::from_secs(amount),
        "m" => std::time::Duration::from_millis(amount),
        "u" => std::time::Duration::from_micros(amount),
        "n" => std::time::Duration::from_nanos(amount),
        _ => return None,
    })
}

/// The rows as the wire carries them.
fn result_set(rows: ResultRows) -> ResultSet {
    ResultSet {
        columns: rows.columns,
        rows: rows
            .rows
            .into_iter()
            .map(|row| {
                let nulls = row.iter().enumerate().filter(|(_, v)| v.is_none()).map(|(i, _)| i as u32).collect();
                Row { values: row.into_iter().map(Option::unwrap_or_default).collect(), nulls }
            })
            .collect(),
        truncated: rows.truncated,
        rows_total: rows.rows_total,
    }
}

fn response(outcome: SubmitOutcome) -> SubmitResponse {
    let status = match outcome.status {
        SubmitStatus::Completed => QueryStatus::Completed,
        SubmitStatus::TimedOut => QueryStatus::TimedOut,
        SubmitStatus::Failed => QueryStatus::Failed,
    };
    SubmitResponse {
        query_id: outcome.client_query_id,
        status: status as i32,
        target: outcome.target.map(|t| t.to_string()).unwrap_or_default(),
        predicted_ms: outcome.predicted.map_or(0.0, |p| p.as_millis_f64()),
        latency_ms: outcome.latency.as_millis_f64(),
        slo_met: outcome.slo_met,
        explanation: outcome.explanation.to_string(),
        result: outcome.result.map(result_set),
        error_code: 0,
        sqlstate: outcome.sqlstate.unwrap_or_default(),
    }
}

/// The gRPC status for `error`, with `grpc-retry-pushback-ms` when a
/// tenant's limit says when to retry.
fn status_of(error: &GatewayError) -> Status {
    let mut status = error.to_status();
    if let Some(wait) = retry_after(error)
        && let Ok(value) = wait.as_millis().to_string().parse()
    {
        status.metadata_mut().insert("grpc-retry-pushback-ms", value);
    }
    status
}

fn rejected(query_id: String, error: &GatewayError) -> SubmitResponse {
    SubmitResponse {
        query_id,
        status: QueryStatus::Rejected as i32,
        explanation: error.to_string(),
        error_code: error.to_status().code() as i32,
        ..SubmitResponse::default()
    }
}

#[tonic::async_trait]
impl Gateway for GatewayService {
    async fn submit(&self, request: Request<SubmitRequest>) -> Result<Response<SubmitResponse>, Status> {
        let tenant = self.caller(&request)?;
        let deadline = client_deadline(request.metadata());
        let reply = self.answer(request.into_inner(), tenant.as_ref(), deadline).await.map_err(|e| status_of(&e))?;
        Ok(Response::new(reply))
    }

    type SubmitStreamStream = Pin<Box<dyn Stream<Item = Result<SubmitResponse, Status>> + Send>>;

    /// Reads requests while fewer than `stream_in_flight_max` of the
    /// stream's queries are in progress (the client then waits on HTTP/2
    /// flow control), answers each as it finishes, and ends once the client
    /// half-closes and every accepted query is answered. A request that
    /// does not decode, or the node's shutdown, stops the reading; the
    /// queries already accepted are still answered, and the error (or
    /// UNAVAILABLE) comes last.
    async fn submit_stream(&self, request: Request<Streaming<SubmitRequest>>) -> Result<Response<Self::SubmitStreamStream>, Status> {
        let tenant = self.caller(&request)?;
        let service = self.clone();
        let replies = serve_stream(request.into_inner(), self.stream_in_flight_max, self.closing.clone(), move |request: SubmitRequest| {
            let (service, tenant) = (service.clone(), tenant.clone());
            async move {
                let query_id = request.query_id.clone();
                match service.answer(request, tenant.as_ref(), None).await {
                    Ok(reply) => reply,
                    Err(error) => rejected(query_id, &error),
                }
            }
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// Serves a stream of requests with `answer`: reads while fewer than
/// `in_flight_max` are in progress (the client then waits on HTTP/2 flow
/// control), sends each reply as it is ready, and ends once the client
/// half-closes and every accepted request is answered. A request that does
/// not decode, or `closing` turning true, stops the reading; the requests
/// already accepted are still answered, and the error (or UNAVAILABLE)
/// comes last.
fn serve_stream<Req, Rep, Fut>(
    mut requests: Streaming<Req>,
    in_flight_max: usize,
    mut closing: tokio::sync::watch::Receiver<bool>,
    answer: impl Fn(Req) -> Fut + Send + 'static,
) -> tokio_stream::wrappers::ReceiverStream<Result<Rep, Status>>
where
    Req: Send + 'static,
    Rep: Send + 'static,
    Fut: std::future::Future<Output = Rep> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(in_flight_max);
    tokio::spawn(async move {
        let mut tasks = tokio::task::JoinSet::new();
        let mut last: Option<Status> = None;
        loop {
            let room = tasks.len() < in_flight_max;
            tokio::select! {
                next = requests.next(), if room => match next {
                    Some(Ok(request)) => {
                        let (reply, sender) = (answer(request), sender.clone());
                        tasks.spawn(async move {
                            // A client that hung up no longer reads replies.
                            let _ = sender.send(Ok(reply.await)).await;
                        });
                    }
                    Some(Err(status)) => {
                        last = Some(status);
                        break;
                    }
                    None => break,
                },
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                _ = closing.wait_for(|closing| *closing) => {
                    last = Some(GatewayError::ShuttingDown.to_status());
                    break;
                }
            }
        }
        while tasks.join_next().await.is_some() {}
        if let Some(status) = last {
            let _ = sender.send(Err(status)).await;
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// The node-to-node service: runs the queries other nodes forward here,
/// and reports this node's state. Its calls carry the fleet's secret.
#[derive(Clone)]
pub struct NodeService {
    gateway: GatewayService,
    fleet: Arc<Fleet>,
    /// Where `PoolActors` asks the admin API's task, which runs on the
    /// actors' thread (a pool's backend and provider answer there).
    actors: PoolActorsAsker,
}

/// Asks the admin API's task for one pool's actors.
pub type PoolActorsAsker = tokio::sync::mpsc::Sender<(slogate_core::model::PoolId, tokio::sync::oneshot::Sender<Result<serde_json::Value, GatewayError>>)>;

impl NodeService {
    /// The Node service of `gateway`'s node in `fleet` (a gateway already
    /// given the fleet with [`GatewayService::with_fleet`]); `PoolActors`
    /// asks `actors`.
    pub fn new(gateway: GatewayService, fleet: Arc<Fleet>, actors: PoolActorsAsker) -> Self {
        NodeService { gateway, fleet, actors }
    }
}

#[tonic::async_trait]
impl slogate_proto::v1::node_server::Node for NodeService {
    async fn forward(&self, request: Request<ForwardRequest>) -> Result<Response<ForwardReply>, Status> {
        self.fleet.check_secret(request.metadata())?;
        let reply = self.gateway.forwarded(request.into_inner()).await.map_err(|e| status_of(&e))?;
        Ok(Response::new(reply))
    }

    type ForwardStreamStream = Pin<Box<dyn Stream<Item = Result<ForwardReply, Status>> + Send>>;

    /// Like `SubmitStream`: at most `stream_in_flight_max` in progress,
    /// replies in completion order, a refusal as a `REJECTED` reply.
    async fn forward_stream(&self, request: Request<Streaming<ForwardRequest>>) -> Result<Response<Self::ForwardStreamStream>, Status> {
        self.fleet.check_secret(request.metadata())?;
        let service = self.gateway.clone();
        let (in_flight_max, closing) = (service.stream_in_flight_max, service.closing.clone());
        let replies = serve_stream(request.into_inner(), in_flight_max, closing, move |forward: ForwardRequest| {
            let service = service.clone();
            async move {
                let query_id = forward.request.as_ref().map(|r| r.query_id.clone()).unwrap_or_default();
                match service.forwarded(forward).await {
                    Ok(reply) => reply,
                    Err(error) => ForwardReply { reply: Some(rejected(query_id, &error)), execution: None },
                }
            }
        });
        Ok(Response::new(Box::pin(replies)))
    }

    async fn state(&self, request: Request<slogate_proto::v1::StateRequest>) -> Result<Response<slogate_proto::v1::NodeState>, Status> {
        self.fleet.check_secret(request.metadata())?;
        Ok(Response::new(self.fleet.state()))
    }

    async fn pool_actors(&self, request: Request<slogate_proto::v1::PoolActorsRequest>) -> Result<Response<slogate_proto::v1::PoolActorsReply>, Status> {
        self.fleet.check_secret(request.metadata())?;
        let pool = slogate_core::model::PoolId::new(request.into_inner().pool);
        let (reply, answer) = tokio::sync::oneshot::channel();
        let gone = || GatewayError::Unavailable("the node's admin task is not answering".into()).to_status();
        self.actors.send((pool, reply)).await.map_err(|_| gone())?;
        let actors = answer.await.map_err(|_| gone())?.map_err(|e| status_of(&e))?;
        Ok(Response::new(slogate_proto::v1::PoolActorsReply { json: actors.to_string() }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slogate_actors::reservoir::{ArrivalUpdate, Flush, LogUpdate, ReservoirActor, SledStore};
    use slogate_core::model::TemplateId;

    /// A reservoir on an arbiter that is busy for `busy`, with `updates`
    /// arrivals offered behind the busy spell.
    async fn busy_reservoir(name: &str, busy: std::time::Duration, updates: usize) -> (tempfile::TempDir, actix::Arbiter, slogate_actors::reservoir::ReservoirLink) {
        let dir = tempfile::Builder::new().prefix(&format!("slogate-intake-{name}-")).tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let arbiter = actix::Arbiter::new();
        let link = ReservoirActor::new(Default::default(), Box::new(store), 1_000, 1_024).unwrap().start_linked_in(&arbiter.handle());
        link.addr().send(Flush).await.unwrap().unwrap();
        let (asleep, sleeping) = tokio::sync::oneshot::channel();
        assert!(arbiter.spawn_fn(move || {
            let _ = asleep.send(());
            std::thread::sleep(busy);
        }));
        sleeping.await.unwrap();
        let arrivals = (0..updates).map(|i| LogUpdate::Arrival(ArrivalUpdate { unix_secs: 1_716_817_510 + i as i64, template: TemplateId(1) })).collect();
        assert!(link.offer_batch(arrivals).is_ok());
        (dir, arbiter, link)
    }

    /// Stops the reservoir's arbiter and waits for its thread to end, so
    /// that nothing it writes on stopping (its manifest) lands after the
    /// test's directory is removed.
    async fn stop(arbiter: actix::Arbiter) {
        arbiter.stop();
        tokio::task::spawn_blocking(move || arbiter.join()).await.unwrap().unwrap();
    }

    #[actix_rt::test]
    async fn the_intake_holds_queries_while_the_reservoir_is_behind_and_lets_them_in_once_it_catches_up() {
        let (_dir, arbiter, link) = busy_reservoir("holds", std::time::Duration::from_millis(300), 10).await;
        assert_eq!(link.backlog().len(), 10);
        let intake = Intake { reservoir_backlog: link.backlog(), backlog_max: 4, wait_max: std::time::Duration::from_secs(10), held: Arc::default() };
        let started = std::time::Instant::now();
        intake.admit().await.unwrap();
        assert!(started.elapsed() >= std::time::Duration::from_millis(100), "admitted after {:?}, before the reservoir caught up", started.elapsed());
        assert!(link.backlog().len() <= 4);
        assert_eq!(intake.held.load(std::sync::atomic::Ordering::Relaxed), 1);
        // Under the mark, nobody waits.
        intake.admit().await.unwrap();
        assert_eq!(intake.held.load(std::sync::atomic::Ordering::Relaxed), 1);
        stop(arbiter).await;
    }

    #[actix_rt::test]
    async fn a_query_held_past_the_wait_limit_is_refused_as_unavailable_naming_the_backlog() {
        let (_dir, arbiter, link) = busy_reservoir("refuses", std::time::Duration::from_millis(500), 10).await;
        let intake = Intake { reservoir_backlog: link.backlog(), backlog_max: 4, wait_max: std::time::Duration::from_millis(50), held: Arc::default() };
        let error = intake.admit().await.unwrap_err();
        assert_eq!(error.to_status().code(), tonic::Code::Unavailable, "{error}");
        assert!(error.to_string().contains("10 updates behind"), "{error}");
        stop(arbiter).await;
    }
}
