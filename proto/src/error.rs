//! Gateway errors and the one place they map to status codes.
//!
//! Every error a client or operator can see is a [`GatewayError`]; its
//! [`ErrorKind`] decides the gRPC code and the HTTP status together in
//! [`status_codes`], so the gRPC and admin surfaces never disagree.

/// The class of an error, independent of transport.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request is malformed or out of range.
    InvalidArgument,
    /// A named thing (pool, cluster) does not exist.
    NotFound,
    /// An admission limit is hit; retry later.
    ResourceExhausted,
    /// The node is shutting down or not ready.
    Unavailable,
    /// A state-changing admin call lacks a valid bearer token.
    Unauthenticated,
    /// The request conflicts with work in progress (a tuning run).
    Conflict,
    /// An admin path does not take this method.
    MethodNotAllowed,
    /// A retried id came with different content.
    AlreadyExists,
    /// The caller is known but may not do this.
    PermissionDenied,
    /// A request body is larger than the node reads.
    TooLarge,
    /// A bug or a backend failure.
    Internal,
    /// A forwarded query reached a node that does not own its pool.
    NotOwner,
}

/// gRPC code and HTTP status for each error kind: the only mapping.
pub fn status_codes(kind: ErrorKind) -> (tonic::Code, u16) {
    match kind {
        ErrorKind::InvalidArgument => (tonic::Code::InvalidArgument, 400),
        ErrorKind::NotFound => (tonic::Code::NotFound, 404),
        ErrorKind::ResourceExhausted => (tonic::Code::ResourceExhausted, 429),
        ErrorKind::Unavailable => (tonic::Code::Unavailable, 503),
        ErrorKind::Unauthenticated => (tonic::Code::Unauthenticated, 401),
        ErrorKind::Conflict => (tonic::Code::Aborted, 409),
        ErrorKind::MethodNotAllowed => (tonic::Code::Unimplemented, 405),
        ErrorKind::AlreadyExists => (tonic::Code::AlreadyExists, 409),
        ErrorKind::PermissionDenied => (tonic::Code::PermissionDenied, 403),
        ErrorKind::TooLarge => (tonic::Code::OutOfRange, 413),
        ErrorKind::Internal => (tonic::Code::Internal, 500),
        ErrorKind::NotOwner => (tonic::Code::FailedPrecondition, 421),
    }
}

/// An error a client or operator sees.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum GatewayError {
    /// `slo_ms` is zero or above the node's maximum.
    #[error("slo_ms must be between 1 and {max_ms}, got {got_ms}")]
    InvalidSlo {
        /// What was sent.
        got_ms: u64,
        /// The node's maximum.
        max_ms: u64,
    },
    /// Neither a template nor non-blank SQL text was given.
    #[error("a query needs a template or non-empty sql text")]
    EmptyQuery,
    /// The template id is zero.
    #[error("template must be a positive integer")]
    InvalidTemplate,
    /// `query_id` is longer than the node accepts.
    #[error("query_id is {len} bytes; at most {max} are accepted")]
    QueryIdTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The payload is larger than the node accepts.
    #[error("payload is {size} bytes; at most {max} are accepted")]
    PayloadTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A field is larger than the node accepts.
    #[error("{field} is {size} bytes; at most {max} are accepted")]
    FieldTooLarge {
        /// The field.
        field: &'static str,
        /// Its size.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// Another malformed field.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The pool does not exist on this deployment.
    #[error("unknown pool `{0}`")]
    UnknownPool(String),
    /// A cluster does not exist in the pool.
    #[error("unknown cluster `{0}`")]
    UnknownCluster(String),
    /// The pool exists but has no tuner.
    #[error("pool `{0}` has no tuner; set [pool.tune] enabled = true")]
    NoTuner(String),
    /// The pool is not in shadow mode.
    #[error("pool `{0}` is not in shadow mode; set mode = \"shadow\" in its [[pool]]")]
    NotShadowed(String),
    /// Too many queries in flight.
    #[error("admission limit reached: {in_flight} queries in flight (limit {limit}); retry later")]
    AdmissionLimit {
        /// In flight now.
        in_flight: usize,
        /// The limit.
        limit: usize,
    },
    /// The node is draining for shutdown.
    #[error("the node is shutting down")]
    ShuttingDown,
    /// A component is not answering.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// Missing or wrong bearer token.
    #[error("a valid bearer token is required")]
    Unauthenticated,
    /// Work in progress conflicts with the request.
    #[error("conflict: {0}")]
    Conflict(String),
    /// The tenant may not use this pool.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A tenant's rate or in-flight limit.
    #[error("tenant `{tenant}` is throttled: {reason}; retry in {retry_after_ms} ms")]
    TenantLimit {
        /// The tenant.
        tenant: String,
        /// Which limit.
        reason: String,
        /// When a retry may pass.
        retry_after_ms: u64,
    },
    /// A query id already names a request with other content.
    #[error("{0}")]
    AlreadyExists(String),
    /// No admin route has this path.
    #[error("no route for {method} {path}")]
    NoRoute {
        /// The method.
        method: String,
        /// The path (at most 200 bytes of it).
        path: String,
    },
    /// The admin path exists but not with this method.
    #[error("{method} is not allowed on {path}; allowed: {allowed}")]
    MethodNotAllowed {
        /// The method.
        method: String,
        /// The path.
        path: String,
        /// The methods it takes.
        allowed: String,
    },
    /// A request body over the admin API's limit.
    #[error("the request body is over the {max} bytes accepted")]
    BodyTooLarge {
        /// The limit.
        max: usize,
    },
    /// Something that should not happen.
    #[error("internal error: {0}")]
    Internal(String),
    /// A query was forwarded to a node that does not own its pool (any
    /// more, or yet): the sender re-reads ownership and tries again.
    #[error("node `{node}` is not the owner of pool `{pool}`")]
    NotOwner {
        /// The pool.
        pool: String,
        /// The node that refused.
        node: String,
    },
    /// Another node's refusal of a forwarded query, passed on unchanged:
    /// the accepting node answers with the owner's code and message.
    #[error("{message}")]
    Remote {
        /// The class of the owner's gRPC code.
        kind: ErrorKind,
        /// The owner's message.
        message: String,
    },
}

/// The error kind of a gRPC `code` another node answered with: the
/// inverse of [`status_codes`] (codes no kind maps to are internal).
pub fn kind_of_code(code: tonic::Code) -> ErrorKind {
    use tonic::Code;
    match code {
        Code::InvalidArgument => ErrorKind::InvalidArgument,
        Code::NotFound => ErrorKind::NotFound,
        Code::ResourceExhausted => ErrorKind::ResourceExhausted,
        Code::Unavailable => ErrorKind::Unavailable,
        Code::Unauthenticated => ErrorKind::Unauthenticated,
        Code::Aborted => ErrorKind::Conflict,
        Code::Unimplemented => ErrorKind::MethodNotAllowed,
        Code::AlreadyExists => ErrorKind::AlreadyExists,
        Code::PermissionDenied => ErrorKind::PermissionDenied,
        Code::OutOfRange => ErrorKind::TooLarge,
        Code::FailedPrecondition => ErrorKind::NotOwner,
        _ => ErrorKind::Internal,
    }
}

impl GatewayError {
    /// The error's class.
    pub fn kind(&self) -> ErrorKind {
        use GatewayError::*;
        match self {
            InvalidSlo { .. } | EmptyQuery | InvalidTemplate | QueryIdTooLong { .. } | PayloadTooLarge { .. } | FieldTooLarge { .. } | InvalidArgument(_) => {
                ErrorKind::InvalidArgument
            }
            UnknownPool(_) | UnknownCluster(_) | NoTuner(_) | NoRoute { .. } => ErrorKind::NotFound,
            MethodNotAllowed { .. } => ErrorKind::MethodNotAllowed,
            BodyTooLarge { .. } => ErrorKind::TooLarge,
            AdmissionLimit { .. } | TenantLimit { .. } => ErrorKind::ResourceExhausted,
            PermissionDenied(_) => ErrorKind::PermissionDenied,
            ShuttingDown | Unavailable(_) => ErrorKind::Unavailable,
            Unauthenticated => ErrorKind::Unauthenticated,
            Conflict(_) | NotShadowed(_) => ErrorKind::Conflict,
            AlreadyExists(_) => ErrorKind::AlreadyExists,
            Internal(_) => ErrorKind::Internal,
            Remote { kind, .. } => *kind,
            NotOwner { .. } => ErrorKind::NotOwner,
        }
    }

    /// The gRPC status carrying this error's message.
    pub fn to_status(&self) -> tonic::Status {
        tonic::Status::new(status_codes(self.kind()).0, self.to_string())
    }

    /// The HTTP status code for the admin API.
    pub fn http_status(&self) -> u16 {
        status_codes(self.kind()).1
    }
}

impl From<GatewayError> for tonic::Status {
    fn from(error: GatewayError) -> Self {
        error.to_status()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_issue_s_error_classes_get_the_documented_grpc_codes() {
        let code = |e: GatewayError| e.to_status().code();
        assert_eq!(code(GatewayError::InvalidSlo { got_ms: 0, max_ms: 10 }), tonic::Code::InvalidArgument);
        assert_eq!(code(GatewayError::EmptyQuery), tonic::Code::InvalidArgument);
        assert_eq!(code(GatewayError::PayloadTooLarge { size: 9, max: 1 }), tonic::Code::InvalidArgument);
        assert_eq!(code(GatewayError::UnknownPool("x".into())), tonic::Code::NotFound);
        assert_eq!(code(GatewayError::AdmissionLimit { in_flight: 5, limit: 5 }), tonic::Code::ResourceExhausted);
        assert_eq!(code(GatewayError::ShuttingDown), tonic::Code::Unavailable);
    }

    #[test]
    fn grpc_and_http_agree_on_every_kind() {
        use ErrorKind::*;
        for kind in [InvalidArgument, NotFound, ResourceExhausted, Unavailable, Unauthenticated, Conflict, MethodNotAllowed, AlreadyExists, PermissionDenied, TooLarge, Internal, NotOwner] {
            let (grpc, http) = status_codes(kind);
            let expected_http = match grpc {
                tonic::Code::InvalidArgument => 400,
                tonic::Code::Unauthenticated => 401,
                tonic::Code::PermissionDenied => 403,
                tonic::Code::NotFound => 404,
                tonic::Code::ResourceExhausted => 429,
                tonic::Code::Unavailable => 503,
                tonic::Code::Aborted | tonic::Code::AlreadyExists => 409,
                tonic::Code::Unimplemented => 405,
                tonic::Code::OutOfRange => 413,
                tonic::Code::FailedPrecondition => 421,
                _ => 500,
            };
            assert_eq!(http, expected_http, "{kind:?}");
            // A refusal forwarded from another node keeps its class.
            assert_eq!(kind_of_code(grpc), kind);
            assert_eq!(GatewayError::Remote { kind, message: "m".into() }.to_status().code(), grpc);
        }
    }

    #[test]
    fn status_message_names_the_problem() {
        let status = GatewayError::UnknownPool("analytics".into()).to_status();
        assert_eq!(status.message(), "unknown pool `analytics`");
        assert_eq!(GatewayError::PayloadTooLarge { size: 2_000_000, max: 1_048_576 }.http_status(), 400);
    }
}
