//! Request validation: from a wire `SubmitRequest` to a checked
//! [`SubmitSpec`], or a [`GatewayError`] naming the problem.

use std::collections::BTreeMap;

use slogate_core::fingerprint::fingerprint_sql;
use slogate_core::model::{PoolId, Slo, TemplateId};
use slogate_core::time::Duration;

use crate::error::GatewayError;
use crate::v1::SubmitRequest;
use crate::v1::submit_request::Query;

/// A node's limits on what it accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest accepted SLO, milliseconds.
    pub slo_ms_max: u64,
    /// The largest accepted payload, bytes.
    pub payload_bytes_max: usize,
    /// The longest accepted client query id, bytes.
    pub query_id_bytes_max: usize,
    /// The longest accepted pool name, bytes.
    pub pool_name_bytes_max: usize,
    /// Labels one query may carry at most.
    pub labels_max: usize,
    /// Bytes of one query's label keys and values together, at most.
    pub labels_bytes_max: usize,
    /// The longest accepted SQL text, bytes.
    pub sql_bytes_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            slo_ms_max: 24 * 3_600 * 1_000,
            payload_bytes_max: 1 << 20,
            query_id_bytes_max: 256,
            pool_name_bytes_max: 64,
            labels_max: 32,
            labels_bytes_max: 4_096,
            sql_bytes_max: 1 << 20,
        }
    }
}

/// Checks a pool name: 1 to `max_bytes` bytes of ASCII letters, digits,
/// `-`, `_` and `.`, starting with a letter or digit. Names are echoed in
/// errors, metrics labels and file names, so nothing else is accepted.
pub fn check_pool_name(name: &str, max_bytes: usize) -> Result<(), GatewayError> {
    if name.len() > max_bytes {
        return Err(GatewayError::FieldTooLarge { field: "pool", size: name.len(), max: max_bytes });
    }
    let mut chars = name.chars();
    let starts_well = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !starts_well || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(GatewayError::InvalidArgument(
            "pool must start with a letter or digit and hold only ASCII letters, digits, `-`, `_` and `.`".into(),
        ));
    }
    Ok(())
}

/// A validated submission.
#[derive(Clone, Debug, PartialEq)]
pub struct SubmitSpec {
    /// The pool ("default" when the request left it empty).
    pub pool: PoolId,
    /// The client's idempotency key; empty when the client gave none.
    pub client_query_id: String,
    /// The template, or the SQL text's fingerprint.
    pub template: TemplateId,
    /// The SLO.
    pub slo: Slo,
    /// Labels, sorted by key.
    pub labels: BTreeMap<String, String>,
    /// The payload's size, bytes.
    pub payload_bytes: usize,
}

/// Checks `request` against `limits`.
pub fn validate_submit(request: &SubmitRequest, limits: &Limits) -> Result<SubmitSpec, GatewayError> {
    if request.slo_ms == 0 || request.slo_ms > limits.slo_ms_max {
        return Err(GatewayError::InvalidSlo { got_ms: request.slo_ms, max_ms: limits.slo_ms_max });
    }
    if request.query_id.len() > limits.query_id_bytes_max {
        return Err(GatewayError::QueryIdTooLong { len: request.query_id.len(), max: limits.query_id_bytes_max });
    }
    if request.query_id.chars().any(char::is_control) {
        return Err(GatewayError::InvalidArgument("query_id must not contain control characters".into()));
    }
    if request.payload.len() > limits.payload_bytes_max {
        return Err(GatewayError::PayloadTooLarge { size: request.payload.len(), max: limits.payload_bytes_max });
    }
    if request.labels.len() > limits.labels_max {
        return Err(GatewayError::InvalidArgument(format!("{} labels; at most {} are accepted", request.labels.len(), limits.labels_max)));
    }
    let labels_bytes: usize = request.labels.iter().map(|(k, v)| k.len() + v.len()).sum();
    if labels_bytes > limits.labels_bytes_max {
        return Err(GatewayError::FieldTooLarge { field: "labels", size: labels_bytes, max: limits.labels_bytes_max });
    }
    let template = match &request.query {
        Some(Query::Template(0)) => return Err(GatewayError::InvalidTemplate),
        Some(Query::Template(t)) => TemplateId(*t),
        Some(Query::Sql(sql)) if sql.len() > limits.sql_bytes_max => {
            return Err(GatewayError::FieldTooLarge { field: "sql", size: sql.len(), max: limits.sql_bytes_max });
        }
        Some(Query::Sql(sql)) if !sql.trim().is_empty() => fingerprint_sql(sql),
        Some(Query::Sql(_)) | None => return Err(GatewayError::EmptyQuery),
    };
    let pool = if request.pool.is_empty() {
        PoolId::default()
    } else {
        check_pool_name(&request.pool, limits.pool_name_bytes_max)?;
        PoolId::new(request.pool.as_str())
    };
    Ok(SubmitSpec {
        pool,
        client_query_id: request.query_id.clone(),
        template,
        slo: Slo { latency: Duration::from_millis(request.slo_ms) },
        labels: request.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        payload_bytes: request.payload.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> SubmitRequest {
        SubmitRequest { query_id: "a".into(), query: Some(Query::Template(4)), slo_ms: 1_000, ..Default::default() }
    }

    #[test]
    fn zero_slo_is_rejected_as_invalid_argument() {
        let err = validate_submit(&SubmitRequest { slo_ms: 0, ..request() }, &Limits::default()).unwrap_err();
        assert_eq!(err.to_status().code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("slo_ms must be between 1"));
    }

    #[test]
    fn empty_sql_and_missing_query_are_rejected() {
        let blank = SubmitRequest { query: Some(Query::Sql("  \n".into())), ..request() };
        assert_eq!(validate_submit(&blank, &Limits::default()), Err(GatewayError::EmptyQuery));
        let none = SubmitRequest { query: None, ..request() };
        assert_eq!(validate_submit(&none, &Limits::default()), Err(GatewayError::EmptyQuery));
    }

    #[test]
    fn oversize_payload_is_rejected_with_sizes() {
        let limits = Limits { payload_bytes_max: 4, ..Limits::default() };
        let big = SubmitRequest { payload: vec![0; 5], ..request() };
        assert_eq!(validate_submit(&big, &limits), Err(GatewayError::PayloadTooLarge { size: 5, max: 4 }));
    }

    #[test]
    fn oversize_and_malformed_fields_are_refused_without_echoing_them() {
        let limits = Limits::default();
        let long_pool = SubmitRequest { pool: "p".repeat(200_000), ..request() };
        let error = validate_submit(&long_pool, &limits).unwrap_err();
        assert_eq!(error, GatewayError::FieldTooLarge { field: "pool", size: 200_000, max: 64 });
        assert!(error.to_string().len() < 100, "{error}");
        for bad in ["a\nb", "-lead", "a b", "x/../y", "ü"] {
            let error = validate_submit(&SubmitRequest { pool: bad.into(), ..request() }, &limits).unwrap_err();
            assert_eq!(error.to_status().code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(!error.to_string().contains(bad), "{bad:?} echoed: {error}");
        }
        let labels = (0..33).map(|i| (format!("k{i}"), String::new())).collect();
        let many = SubmitRequest { labels, ..request() };
        assert!(validate_submit(&many, &limits).unwrap_err().to_string().contains("33 labels; at most 32"));
        let heavy = SubmitRequest { labels: [("k".to_owned(), "v".repeat(5_000))].into(), ..request() };
        assert_eq!(validate_submit(&heavy, &limits), Err(GatewayError::FieldTooLarge { field: "labels", size: 5_001, max: 4_096 }));
        let sql = SubmitRequest { query: Some(Query::Sql("x".repeat((1 << 20) + 1))), ..request() };
        assert_eq!(validate_submit(&sql, &limits), Err(GatewayError::FieldTooLarge { field: "sql", size: (1 << 20) + 1, max: 1 << 20 }));
        let id = SubmitRequest { query_id: "a\u{0}b".into(), ..request() };
        assert_eq!(validate_submit(&id, &limits).unwrap_err().to_status().code(), tonic::Code::InvalidArgument);
        for good in ["default", "analytics-eu.1", "Batch_2"] {
            assert!(validate_submit(&SubmitRequest { pool: good.into(), ..request() }, &limits).is_ok(), "{good}");
        }
    }

    #[test]
    fn sql_text_gets_its_fingerprint_and_empty_pool_is_default() {
        let sql = SubmitRequest { query: Some(Query::Sql("select 1".into())), ..request() };
        let spec = validate_submit(&sql, &Limits::default()).unwrap();
        assert_eq!(spec.template, fingerprint_sql("SELECT 2"));
        assert_eq!(spec.pool, PoolId::default());
        assert_eq!(spec.slo.latency, Duration::from_secs(1));
    }
}
