//! The tonic Gateway service: validates each request, forwards it to the
//! RouterShard, and turns the outcome into a `SubmitResponse`. It decides
//! nothing itself.

use std::pin::Pin;
use std::sync::Arc;

use actix::Addr;
use slogate_actors::metrics::Histogram;
use slogate_actors::router::{RouterShard, Submit, SubmitOutcome, SubmitStatus};
use slogate_proto::GatewayError;
use slogate_proto::v1::gateway_server::Gateway;
use slogate_proto::v1::{QueryStatus, SubmitRequest, SubmitResponse};
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
        A::TuningInProgress(pool) => GatewayError::Conflict(format!("pool `{pool}` is already being tuned")),
        other @ (A::Storage(_) | A::CorruptStore(_)) => GatewayError::Internal(other.to_string()),
    }
}

/// The Gateway service.
#[derive(Clone)]
pub struct GatewayService {
    router: Addr<RouterShard>,
    limits: Limits,
    added_latency: Arc<Histogram>,
}

impl GatewayService {
    /// A service forwarding to `router`, recording each query's time in
    /// slogate outside the backend in `added_latency`.
    pub fn new(router: Addr<RouterShard>, limits: Limits, added_latency: Arc<Histogram>) -> Self {
        GatewayService { router, limits, added_latency }
    }

    async fn run(&self, request: &SubmitRequest) -> Result<SubmitOutcome, GatewayError> {
        let started = std::time::Instant::now();
        let outcome = self.route_and_wait(request).await?;
        self.added_latency.observe(started.elapsed().saturating_sub(outcome.backend_wall));
        Ok(outcome)
    }

    async fn route_and_wait(&self, request: &SubmitRequest) -> Result<SubmitOutcome, GatewayError> {
        let spec = validate_submit(request, &self.limits)?;
        let reply = self
            .router
            .send(Submit { pool: spec.pool, client_query_id: spec.client_query_id, template: spec.template, slo: spec.slo })
            .await
            .map_err(|e| match e {
                actix::MailboxError::Closed => GatewayError::ShuttingDown,
                actix::MailboxError::Timeout => GatewayError::Internal("router timed out".into()),
            })?
            .map_err(gateway_error)?;
        reply.await.map_err(|_| GatewayError::Internal("the router dropped the query's reply".into()))
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
        result: None,
        error_code: 0,
    }
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
        let outcome = self.run(request.get_ref()).await?;
        Ok(Response::new(response(outcome)))
    }

    type SubmitStreamStream = Pin<Box<dyn Stream<Item = Result<SubmitResponse, Status>> + Send>>;

    async fn submit_stream(&self, request: Request<Streaming<SubmitRequest>>) -> Result<Response<Self::SubmitStreamStream>, Status> {
        let mut requests = request.into_inner();
        let (sender, receiver) = tokio::sync::mpsc::channel(1_024);
        let service = self.clone();
        tokio::spawn(async move {
            let mut tasks = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    next = requests.next() => match next {
                        Some(Ok(request)) => {
                            let service = service.clone();
                            let sender = sender.clone();
                            tasks.spawn(async move {
                                let reply = match service.run(&request).await {
                                    Ok(outcome) => response(outcome),
                                    Err(error) => rejected(request.query_id.clone(), &error),
                                };
                                // A client that hung up no longer reads replies.
                                let _ = sender.send(Ok(reply)).await;
                            });
                        }
                        Some(Err(status)) => {
                            let _ = sender.send(Err(status)).await;
                            break;
                        }
                        None => break,
                    },
                    Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                }
            }
            while tasks.join_next().await.is_some() {}
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(receiver))))
    }
}
