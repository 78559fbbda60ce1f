//! The elastic tier as a seam of its own: [`ElasticTier`] runs one query
//! as an invocation, and [`WithElastic`] puts a tier behind any backend's
//! `Target::Elastic`, so a pool on real servers (the Postgres-wire
//! executor) can offload to a real tier (AWS Lambda, `slogate-cloud`). The
//! emulated warehouse keeps its own emulated tier.

use std::sync::Arc;

use actix::Recipient;
use slogate_core::model::{PoolId, QueryId, Target};

use crate::backend::{Backend, BackendState, CancelReason, ClusterUpdate, Completion, ExecuteError, Execution, LocalFuture};

/// A tier's observable state.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ElasticTierState {
    /// `lambda`.
    pub kind: &'static str,
    /// What it billed so far, dollars.
    pub billed_usd: f64,
    /// The implementation's own detail.
    pub detail: serde_json::Value,
}

/// Runs queries as invocations of an elastic tier.
pub trait ElasticTier: Send + Sync {
    /// Invokes the tier with `execution`; resolves with how it ended. A
    /// throttled invocation is `Err(ExecuteError::Throttled)`, one that
    /// never started another `Err`; a function's own error is a
    /// `Completion::Failed` with its message.
    fn invoke(&self, execution: Execution) -> LocalFuture<Result<Completion, ExecuteError>>;

    /// The observable state.
    fn state(&self) -> ElasticTierState;
}

/// `inner` with `tier` behind its elastic target.
pub struct WithElastic {
    inner: Arc<dyn Backend>,
    tier: Arc<dyn ElasticTier>,
}

impl WithElastic {
    /// `inner`, offloading to `tier`.
    pub fn new(inner: Arc<dyn Backend>, tier: Arc<dyn ElasticTier>) -> Self {
        WithElastic { inner, tier }
    }
}

impl Backend for WithElastic {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn execute(&self, execution: Execution) -> LocalFuture<Result<Completion, ExecuteError>> {
        match execution.target {
            Target::Elastic => self.tier.invoke(execution),
            Target::Cluster(_) => self.inner.execute(execution),
        }
    }

    fn cancel(&self, query: QueryId, reason: CancelReason) {
        // An invocation cannot be stopped once sent; it ends by its own
        // timeout. Cluster queries stop on the server.
        self.inner.cancel(query, reason);
    }

    fn watch_clusters(&self, pool: PoolId, recipient: Recipient<ClusterUpdate>) {
        self.inner.watch_clusters(pool, recipient);
    }

    fn state(&self) -> LocalFuture<Result<BackendState, ExecuteError>> {
        let inner = self.inner.state();
        let tier = self.tier.state();
        Box::pin(async move {
            let mut state = inner.await?;
            state.elastic_billed_usd = tier.billed_usd;
            if let serde_json::Value::Object(detail) = &mut state.detail {
                detail.insert("elastic".into(), serde_json::to_value(&tier).unwrap_or_default());
            }
            Ok(state)
        })
    }
}
