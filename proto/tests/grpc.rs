//! The generated service, health and reflection over a real loopback
//! connection, with a Gateway that validates and echoes.

use std::pin::Pin;

use slogate_proto::v1::gateway_client::GatewayClient;
use slogate_proto::v1::gateway_server::{Gateway, GatewayServer};
use slogate_proto::v1::submit_request::Query;
use slogate_proto::v1::{QueryStatus, SubmitRequest, SubmitResponse};
use slogate_proto::validate::{Limits, validate_submit};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

struct Echo;

fn reply(request: &SubmitRequest) -> Result<SubmitResponse, Status> {
    let spec = validate_submit(request, &Limits::default())?;
    Ok(SubmitResponse {
        query_id: spec.client_query_id,
        status: QueryStatus::Completed as i32,
        target: "c0".into(),
        explanation: format!("template {}", spec.template.0),
        ..Default::default()
    })
}

#[tonic::async_trait]
impl Gateway for Echo {
    async fn submit(&self, request: Request<SubmitRequest>) -> Result<Response<SubmitResponse>, Status> {
        reply(request.get_ref()).map(Response::new)
    }

    type SubmitStreamStream = Pin<Box<dyn Stream<Item = Result<SubmitResponse, Status>> + Send>>;

    async fn submit_stream(&self, request: Request<Streaming<SubmitRequest>>) -> Result<Response<Self::SubmitStreamStream>, Status> {
        let stream = request.into_inner().map(|item| item.and_then(|r| reply(&r)));
        Ok(Response::new(Box::pin(stream)))
    }
}

async fn serve() -> (std::net::SocketAddr, tonic_health::server::HealthReporter) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, health) = slogate_proto::health_service();
    reporter.set_serving::<GatewayServer<Echo>>().await;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(slogate_proto::reflection_service())
            .add_service(GatewayServer::new(Echo))
            .serve_with_incoming(incoming),
    );
    (addr, reporter)
}

fn request(id: &str, slo_ms: u64) -> SubmitRequest {
    SubmitRequest { query_id: id.into(), query: Some(Query::Template(3)), slo_ms, ..Default::default() }
}

#[tokio::test]
async fn submit_round_trips_and_bad_input_maps_to_invalid_argument() {
    let (addr, _reporter) = serve().await;
    let mut client = GatewayClient::connect(format!("http://{addr}")).await.unwrap();
    let ok = client.submit(request("q1", 500)).await.unwrap().into_inner();
    assert_eq!(ok.query_id, "q1");
    assert_eq!(ok.status(), QueryStatus::Completed);
    let err = client.submit(request("q2", 0)).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("slo_ms"));
}

#[tokio::test]
async fn stream_replies_carry_their_query_ids() {
    let (addr, _reporter) = serve().await;
    let mut client = GatewayClient::connect(format!("http://{addr}")).await.unwrap();
    let requests = tokio_stream::iter((0..20).map(|i| request(&format!("s{i}"), 100)));
    let mut replies = client.submit_stream(requests).await.unwrap().into_inner();
    let mut ids = Vec::new();
    while let Some(reply) = replies.next().await {
        ids.push(reply.unwrap().query_id);
    }
    ids.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("s{i}")).collect();
    expected.sort();
    assert_eq!(ids, expected);
}

#[tokio::test]
async fn health_reports_the_gateway_serving_and_reflection_lists_it() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let (addr, _reporter) = serve().await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest { service: slogate_proto::GATEWAY_SERVICE_NAME.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status(), ServingStatus::Serving);

    let list = ServerReflectionRequest { host: String::new(), message_request: Some(MessageRequest::ListServices(String::new())) };
    let mut responses =
        ServerReflectionClient::new(channel).server_reflection_info(tokio_stream::iter([list])).await.unwrap().into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(services)) = response.message_response else { panic!("no service list") };
    assert!(services.service.iter().any(|s| s.name == slogate_proto::GATEWAY_SERVICE_NAME));
}
