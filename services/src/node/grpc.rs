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
use slogate_actors::router::{ClientGone, RouterShard, Submit, SubmitOutcome, SubmitStatus};
use slogate_actors::shards::RouterShards;
use slogate_proto::GatewayError;
use slogate_proto::v1::gateway_server::Gateway;
use slogate_proto::v1::{QueryStatus, ResultSet, Row, SubmitRequest, SubmitResponse, submit_request};
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
        limit @ (A::ClusterLimit { .. } | A::LastReadyCluster { .. }) => GatewayError::Conflict(limit.to_string()),
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
        GatewayService { router, limits, added_latency, stream_in_flight_max: stream_in_flight_max.max(1), closing, tenants, intake }
    }

    /// The calling tenant, from the call's `authorization` metadata.
    fn caller<T>(&self, request: &Request<T>) -> Result<Option<Arc<Tenant>>, Status> {
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let peer = connection_info(request.extensions()).map(|c| c.remote.to_string()).unwrap_or_default();
        self.tenants.authenticate(bearer(header), &peer).map_err(|e| status_of(&e))
    }

    /// Checks `request` and keeps only what the query needs: the payload,
    /// labels and anything else are dropped here.
    /// Checks `request` from `tenant` (and admits it under the tenant's
    /// limits), keeping only what the query needs.
    fn validate(&self, request: SubmitRequest, tenant: Option<&Arc<Tenant>>) -> Result<Validated, GatewayError> {
        let spec = validate_submit(&request, &self.limits)?;
        let slot = tenant.map(|t| t.admit(&spec.pool.0, std::time::Instant::now())).transpose()?;
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
        Ok(Validated { spec, sql, digest, tenant: tenant.map(|t| t.name.clone()).unwrap_or_default(), _slot: slot })
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
        let shard = self.router.for_pool(&pool).ok_or_else(|| GatewayError::UnknownPool(pool.0.clone()))?;
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
        explanation: outcome.explanation,
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
        let query = self.validate(request.into_inner(), tenant.as_ref()).map_err(|e| status_of(&e))?;
        let outcome = self.run(query).await.map_err(|e| status_of(&e))?;
        Ok(Response::new(response(outcome)))
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
        let mut requests = request.into_inner();
        let (sender, receiver) = tokio::sync::mpsc::channel(self.stream_in_flight_max);
        let service = self.clone();
        let mut closing = self.closing.clone();
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            let mut last: Option<Status> = None;
            loop {
                let room = tasks.len() < service.stream_in_flight_max;
                tokio::select! {
                    next = requests.next(), if room => match next {
                        Some(Ok(request)) => {
                            let query_id = request.query_id.clone();
                            let service = service.clone();
                            let sender = sender.clone();
                            let query = service.validate(request, tenant.as_ref());
                            tasks.spawn(async move {
                                let reply = match query {
                                    Ok(query) => match service.run(query).await {
                                        Ok(outcome) => response(outcome),
                                        Err(error) => rejected(query_id, &error),
                                    },
                                    Err(error) => rejected(query_id, &error),
                                };
                                // A client that hung up no longer reads replies.
                                let _ = sender.send(Ok(reply)).await;
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
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slogate_actors::reservoir::{ArrivalUpdate, Flush, LogUpdate, ReservoirActor, SledStore};
    use slogate_core::model::TemplateId;

    /// A reservoir on an arbiter that is busy for `busy`, with `updates`
    /// arrivals offered behind the busy spell.
    async fn busy_reservoir(name: &str, busy: std::time::Duration, updates: usize) -> (actix::Arbiter, slogate_actors::reservoir::ReservoirLink, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("slogate-intake-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = SledStore::open(&dir).unwrap();
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
        (arbiter, link, dir)
    }

    #[actix_rt::test]
    async fn the_intake_holds_queries_while_the_reservoir_is_behind_and_lets_them_in_once_it_catches_up() {
        let (arbiter, link, dir) = busy_reservoir("holds", std::time::Duration::from_millis(300), 10).await;
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
        arbiter.stop();
        std::fs::remove_dir_all(&dir).ok();
    }

    #[actix_rt::test]
    async fn a_query_held_past_the_wait_limit_is_refused_as_unavailable_naming_the_backlog() {
        let (arbiter, link, dir) = busy_reservoir("refuses", std::time::Duration::from_millis(500), 10).await;
        let intake = Intake { reservoir_backlog: link.backlog(), backlog_max: 4, wait_max: std::time::Duration::from_millis(50), held: Arc::default() };
        let error = intake.admit().await.unwrap_err();
        assert_eq!(error.to_status().code(), tonic::Code::Unavailable, "{error}");
        assert!(error.to_string().contains("10 updates behind"), "{error}");
        arbiter.stop();
        std::fs::remove_dir_all(&dir).ok();
    }
}
