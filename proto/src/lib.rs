//! # slogate-proto
//!
//! slogate's gRPC contracts, package `slogate.v1`, generated at build time
//! from `proto/slogate/v1/*.proto` with a vendored `protoc` (no network, no
//! system protoc needed), plus the pieces every gRPC surface shares:
//!
//! - [`error`]: [`GatewayError`] and [`error::status_codes`], the one place
//!   errors map to gRPC codes and HTTP statuses;
//! - [`codec`]: prost's codec, with undecodable requests as
//!   INVALID_ARGUMENT;
//! - [`validate`]: turning a `SubmitRequest` into a checked
//!   [`validate::SubmitSpec`] with the node's [`validate::Limits`];
//! - [`health_service`], [`reflection_service`] and
//!   [`reflection_service_v1alpha`]: the standard `grpc.health.v1` and
//!   server reflection in both generations, so stock tools (grpcurl,
//!   grpc_health_probe, grpcio-reflection) work.
//!
//! # Layout
//!
//! - [`v1`]: the generated messages, `gateway_client` and `gateway_server`,
//!   and the node-to-node `node_client` and `node_server`.
//! - [`etcd`]: a client of etcd's v3 KV and Lease services.
//! - [`codec`], [`error`], [`validate`].
//!
//! # Example
//!
//! ```
//! use slogate_proto::v1::{SubmitRequest, submit_request::Query};
//! use slogate_proto::validate::{Limits, validate_submit};
//!
//! let request = SubmitRequest {
//!     pool: "default".into(),
//!     query_id: "q-1".into(),
//!     query: Some(Query::Template(17)),
//!     slo_ms: 12_000,
//!     ..Default::default()
//! };
//! let spec = validate_submit(&request, &Limits::default()).unwrap();
//! assert_eq!(spec.template.0, 17);
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod codec;
pub mod error;
pub mod validate;

pub use error::GatewayError;

/// The generated `slogate.v1` code.
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod v1 {
    tonic::include_proto!("slogate.v1");
}

/// The generated client of etcd's v3 API (`etcdserverpb`): the KV and
/// Lease services, trimmed to what membership uses (`proto/etcd/etcd.proto`).
#[allow(missing_docs, unreachable_pub, clippy::all)]
pub mod etcd {
    tonic::include_proto!("etcdserverpb");
}

/// The encoded file descriptor set of `slogate.v1`, for server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("slogate_v1_descriptor");

/// The fully qualified name of the Gateway service.
pub const GATEWAY_SERVICE_NAME: &str = "slogate.v1.Gateway";

/// The fully qualified name of the node-to-node service.
pub const NODE_SERVICE_NAME: &str = "slogate.v1.Node";

/// A `grpc.health.v1` service and its reporter; the node marks the Gateway
/// serving once it is ready and not serving while it shuts down.
pub fn health_service() -> (
    tonic_health::server::HealthReporter,
    tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health>,
) {
    tonic_health::server::health_reporter()
}

/// The server reflection service (v1) for `slogate.v1`.
///
/// # Panics
///
/// If the embedded descriptor set is corrupt, which the build rules out.
pub fn reflection_service() -> tonic_reflection::server::v1::ServerReflectionServer<
    impl tonic_reflection::server::v1::ServerReflection,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor set is valid")
}

/// The same reflection as `grpc.reflection.v1alpha`, which grpcurl before
/// 1.9 and Python's grpcio-reflection ask for.
///
/// # Panics
///
/// If the embedded descriptor set is corrupt, which the build rules out.
pub fn reflection_service_v1alpha() -> tonic_reflection::server::v1alpha::ServerReflectionServer<
    impl tonic_reflection::server::v1alpha::ServerReflection,
> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .expect("the embedded descriptor set is valid")
}
