//! The domain model: queries, templates, SLOs, clusters, pools and targets.
//!
//! These are plain data. Who may read what is part of the design: a
//! [`Query`] carries only what a client submits (template, SLO, arrival), and
//! a [`ClusterView`] carries only what an operator can observe (size, state,
//! which queries it runs). Neither carries the emulated warehouse's hidden
//! parameters, so a routing policy cannot peek at ground truth.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::time::{Duration, Instant};

/// A query's identity, unique within a run (and the client's idempotency key
/// in live mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct QueryId(pub u64);

/// A query template (for TPC-DS, 1–99) or a fingerprint of the query text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TemplateId(pub u32);

/// A cluster's identity, unique within a run and never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClusterId(pub u32);

/// A pool's name: a set of clusters that can all read the same data.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PoolId(pub std::sync::Arc<str>);

/// Cluster size in Redshift Processing Units. Billing is linear in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Rpu(pub u32);

impl fmt::Display for QueryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "q{}", self.0)
    }
}

impl fmt::Display for TemplateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c{}", self.0)
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Rpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}rpu", self.0)
    }
}

/// The default pool's name, allocated once: requests that name no pool
/// share it.
static DEFAULT_POOL: std::sync::LazyLock<std::sync::Arc<str>> = std::sync::LazyLock::new(|| "default".into());

impl Default for PoolId {
    fn default() -> Self {
        PoolId(DEFAULT_POOL.clone())
    }
}

impl PoolId {
    /// The pool named `name`. The name is shared: a clone, made for every
    /// query and decision on the routing path, copies no bytes.
    pub fn new(name: impl Into<std::sync::Arc<str>>) -> Self {
        PoolId(name.into())
    }

    /// Its name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A latency service-level objective: the query met it when its client-side
/// latency is at most `latency`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Slo {
    /// The latency bound, client side (queueing included).
    pub latency: Duration,
}

impl Slo {
    /// Whether a query that took `latency` met this SLO (`L(q) <= SLO(q)`).
    pub fn is_met_by(&self, latency: Duration) -> bool {
        latency <= self.latency
    }
}

/// What is known about a template before any query runs: its name and the
/// reference latencies a workload author uses to set SLOs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Template {
    /// The template's identity.
    pub id: TemplateId,
    /// The baseline latency `ℓ_baseline` (AutoSLO §8.1.3: the maximum
    /// closed-loop latency on 16 RPU). SLOs are `κ × ℓ_baseline`.
    pub baseline_latency: Duration,
}

/// A query as the gateway sees it on arrival.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Query {
    /// Unique within the run.
    pub id: QueryId,
    /// The pool it was submitted to.
    pub pool: PoolId,
    /// Its template or fingerprint; the only hint of its cost.
    pub template: TemplateId,
    /// Its latency objective.
    pub slo: Slo,
    /// When it arrived at the gateway.
    pub arrival: Instant,
}

/// The lifecycle of a cluster. Transitions go forward,
/// `Starting → Ready → Draining → Gone`, and `Starting → Gone` on a failed
/// spinup; the one way back is a ready cluster that failed its health
/// check (`Ready → Unhealthy`) and passed it again (`Unhealthy → Ready`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusterState {
    /// Requested; becomes ready after the spinup delay δ.
    Starting,
    /// Accepting queries.
    Ready,
    /// Failing its health check (a real server that refuses connections or
    /// died mid-query): routed around until it passes again.
    Unhealthy,
    /// Finishing its running queries; accepts no new ones.
    Draining,
    /// Released; billed no more.
    Gone,
}

impl ClusterState {
    /// Whether a cluster in this state accepts newly routed queries.
    pub fn accepts_queries(self) -> bool {
        matches!(self, ClusterState::Ready)
    }

    /// Whether `self → next` is a legal lifecycle transition.
    pub fn can_become(self, next: ClusterState) -> bool {
        use ClusterState::*;
        matches!(
            (self, next),
            (Starting, Ready)
                | (Starting, Gone)
                | (Ready, Draining)
                | (Ready, Gone)
                | (Ready, Unhealthy)
                | (Unhealthy, Ready)
                | (Unhealthy, Draining)
                | (Unhealthy, Gone)
                | (Draining, Gone)
        )
    }
}

/// Where a query runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// A provisioned cluster of the pool.
    Cluster(ClusterId),
    /// The elastic serverless tier (AWS Lambda or a stand-in).
    Elastic,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Cluster(id) => id.fmt(f),
            Target::Elastic => f.write_str("elastic"),
        }
    }
}

/// A query running (or waiting in the cluster's admission queue) on a
/// cluster, as the gateway observes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunningQuery {
    /// The query.
    pub id: QueryId,
    /// Its template.
    pub template: TemplateId,
    /// Its SLO.
    pub slo: Slo,
    /// When it arrived at the gateway.
    pub arrival: Instant,
    /// When it was sent to this cluster.
    pub dispatched: Instant,
}

/// A cluster as a routing or scaling policy may observe it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Identity.
    pub id: ClusterId,
    /// Size.
    pub size: Rpu,
    /// Lifecycle state.
    pub state: ClusterState,
    /// When it was requested.
    pub requested_at: Instant,
    /// When it became (or will become) ready.
    pub ready_at: Instant,
    /// Queries sent to it that have not completed, in dispatch order.
    pub running: Vec<RunningQuery>,
}

/// A pool: its name and its clusters.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Pool {
    /// The pool's name.
    pub id: PoolId,
    /// Its clusters, in creation order.
    pub clusters: Vec<ClusterView>,
}

impl Pool {
    /// The clusters that accept queries now.
    pub fn ready_clusters(&self) -> impl Iterator<Item = &ClusterView> {
        self.clusters.iter().filter(|c| c.state.accepts_queries())
    }
}

/// How an execution ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionOutcome {
    /// It ran to completion.
    Completed,
    /// It was cancelled at the timeout; its latency is a lower bound.
    TimedOut,
}

/// What a real warehouse would report about one execution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionReport {
    /// The query.
    pub query: QueryId,
    /// Where it ran: a cluster or the elastic tier.
    pub target: Target,
    /// When it arrived at the gateway.
    pub arrival: Instant,
    /// When it was sent to the cluster.
    pub dispatched: Instant,
    /// When it started executing (left the admission queue), if it did.
    pub started: Option<Instant>,
    /// When it finished or was cancelled.
    pub finished: Instant,
    /// How it ended.
    pub outcome: ExecutionOutcome,
}

impl ExecutionReport {
    /// Client-side latency.
    pub fn latency(&self) -> Duration {
        self.finished - self.arrival
    }
}

/// Something the warehouse reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarehouseEvent {
    /// A query finished or timed out.
    QueryFinished(ExecutionReport),
    /// A cluster became ready.
    ClusterReady {
        /// Which.
        cluster: ClusterId,
        /// When.
        at: Instant,
    },
    /// A cluster was released.
    ClusterGone {
        /// Which.
        cluster: ClusterId,
        /// When.
        at: Instant,
    },
}


#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_lifecycle_only_moves_forward() {
        use ClusterState::*;
        assert!(Starting.can_become(Ready));
        assert!(Ready.can_become(Draining));
        assert!(Draining.can_become(Gone));
        assert!(!Ready.can_become(Starting));
        assert!(!Gone.can_become(Ready));
        assert!(!Draining.can_become(Ready));
        assert!(Ready.can_become(Unhealthy) && Unhealthy.can_become(Ready));
        assert!(!Starting.can_become(Unhealthy) && !Unhealthy.accepts_queries());
    }

    #[test]
    fn slo_is_met_at_exactly_the_bound() {
        let slo = Slo { latency: Duration::from_secs(10) };
        assert!(slo.is_met_by(Duration::from_secs(10)));
        assert!(!slo.is_met_by(Duration::from_micros(10_000_001)));
    }
}
