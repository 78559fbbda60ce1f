//! # slogate-actors
//!
//! The live node's runtime components, as actix actors. Each actor holds
//! one `slogate-core` component plus its IO handles: a handler maps the
//! message to a core call, carries out what core returns, and decides
//! nothing itself. Every actor has a bounded mailbox and a serialisable
//! observable state (`GetState`) for the admin API.
//!
//! # Layout
//!
//! - [`backend`]: the [`backend::Backend`] seam: what runs queries (the
//!   emulated warehouse, a Postgres-wire executor), as a trait object.
//! - [`autoscaler`]: one Autoscaler per pool: core's triggers on every
//!   notice from the RouterShard, the size selector on a fork of the
//!   router, off the routing path.
//! - [`elastic`]: the [`elastic::ElasticTier`] seam (a real elastic tier,
//!   AWS Lambda, behind any backend's elastic target).
//! - [`clock`]: the node's virtual clock (tokio time, compressible).
//! - [`idempotency`]: the records a retried client query id is answered
//!   from, keyed by tenant and id and checked against the request's
//!   digest; persisted by the Reservoir.
//! - [`metrics`]: latency histograms the shells publish.
//! - [`provider`]: the [`provider::Provider`] seam: cluster lifecycle
//!   requests to the hosting platform (emulated: the emulated warehouse
//!   applies δ and ζ; fixed endpoints refuse).
//! - [`reservoir`]: the workload reservoir (count and arrivals tables of
//!   AutoSLO §7.1), persisted in sled behind
//!   [`reservoir::ReservoirStore`], and the execution log and the
//!   idempotency records, in segment logs beside it.
//! - [`retrainer`]: one Retrainer per pool that predicts with Iconq+:
//!   retrains the model off the routing path, keeps the model in force
//!   when the candidate scores worse, and swaps a better one in.
//! - [`segments`]: an append-only log of checksummed frames in segment
//!   files, dropped from the front a file at a time (the reservoir's two
//!   logs).
//! - [`router`]: the RouterShard: admission, idempotency, routing with
//!   core's policies, dispatch, and replies.
//! - [`shards`]: the node's RouterShards, which pool each owns, and the
//!   calls that fan out to all of them and merge.
//! - [`tracker`]: one ClusterTracker per cluster: running queries,
//!   slogate's own billing timer, lifecycle, backend calls.
//! - [`tuner`]: one Tuner per tuned pool: the policy tuner on a schedule
//!   and on demand, off the routing path; it persists its choice and hands
//!   it to the pool's Autoscaler.
//! - [`warehouse`]: the emulated warehouse as a live backend, in real
//!   (optionally compressed) time.
//!
//! # Example
//!
//! ```
//! use actix::Actor;
//! use slogate_actors::reservoir::{ArrivalUpdate, GetState, ReservoirActor, Shutdown, SledStore};
//! use slogate_core::model::TemplateId;
//! use slogate_core::reservoir::ReservoirConfig;
//!
//! # let dir = std::env::temp_dir().join(format!("slogate-doc-{}", std::process::id()));
//! actix::System::new().block_on(async {
//!     let store = SledStore::open(&dir).unwrap();
//!     let reservoir = ReservoirActor::new(ReservoirConfig::default(), Box::new(store), 64, 1_024).unwrap().start();
//!     reservoir.send(ArrivalUpdate { unix_secs: 1_716_817_510, template: TemplateId(7) }).await.unwrap().unwrap();
//!     assert_eq!(reservoir.send(GetState).await.unwrap().arrivals, 1);
//!     reservoir.send(Shutdown).await.unwrap().unwrap();
//! });
//! # std::fs::remove_dir_all(&dir).ok();
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod autoscaler;
pub mod backend;
pub mod clock;
pub mod elastic;
pub mod idempotency;
pub mod metrics;
pub mod provider;
pub mod reservoir;
pub mod retrainer;
pub mod segments;
pub mod router;
pub mod shards;
pub mod tracker;
pub mod tuner;
pub mod warehouse;

/// Replaces the file at `path` with `bytes` as a whole: written to a
/// temporary beside it (`<name>.tmp`), then renamed over it, so a reader
/// (or a restart after a crash) finds the old file or the new, never half
/// of one. What the Tuner and the Retrainer keep across restarts is
/// written so.
pub(crate) fn replace_file(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path)
}

/// [`replace_file`], durably: the temporary is synced before the rename
/// and the directory after it, so that once this returns the new file
/// survives a machine's crash too. The reservoir's manifest and its
/// rewritten log segments are written so.
pub(crate) fn replace_file_durably(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)?;
    std::fs::File::open(path.parent().unwrap_or(std::path::Path::new(".")))?.sync_all()
}

/// Errors of the actors: what a caller may be told in a reply.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The storage engine failed.
    #[error("storage: {0}")]
    Storage(#[from] sled::Error),
    /// Stored bytes do not decode: the data directory is damaged.
    #[error("corrupt store: bad {0}")]
    CorruptStore(&'static str),
    /// The store holds less than its manifest says it should (or cannot be
    /// opened at all): data was lost since the last flush that succeeded.
    #[error("the reservoir in {dir} is damaged: {reason}; start with `slogate serve --repair` to keep what is left (the repair logs what it drops)")]
    DamagedStore {
        /// The store's directory.
        dir: String,
        /// What is wrong.
        reason: String,
    },
    /// No pool of that name on this shard.
    #[error("unknown pool `{0}`")]
    UnknownPool(String),
    /// The pool's in-flight limit is reached.
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
    /// No live cluster of that id in the pool.
    #[error("unknown cluster `{0}`")]
    UnknownCluster(String),
    /// The backend refused or did not answer.
    #[error("backend: {0}")]
    Backend(String),
    /// The backend or provider cannot do this at all (e.g. spin up a
    /// cluster for a pool of fixed endpoints).
    #[error("{0}")]
    Unsupported(String),
    /// A tuning run for the pool is already going.
    #[error("pool `{0}` is already being tuned")]
    TuningInProgress(String),
    /// A retraining run for the pool's model is already going.
    #[error("pool `{0}`'s model is already being retrained")]
    RetrainingInProgress(String),
    /// The pool has as many clusters as it may have.
    #[error("pool `{pool}` already has {limit} clusters, its limit (limits.clusters_per_pool_max)")]
    ClusterLimit {
        /// The pool.
        pool: String,
        /// The limit.
        limit: usize,
    },
    /// A spinup would take the pool past one of its caps.
    #[error("pool `{pool}`: spinup refused: {reason}")]
    CapReached {
        /// The pool.
        pool: String,
        /// Which cap, with its figures.
        reason: String,
    },
    /// Releasing this cluster would leave the pool with no ready cluster.
    #[error("cluster `{cluster}` is pool `{pool}`'s last ready cluster; releasing it needs force")]
    LastReadyCluster {
        /// The pool.
        pool: String,
        /// The cluster.
        cluster: String,
    },
    /// A retried client query id came with different content.
    #[error("query_id `{client_query_id}` was first submitted with a different {field}; a retry must repeat the request")]
    IdempotencyMismatch {
        /// The id.
        client_query_id: String,
        /// The first field that differs.
        field: &'static str,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    #[test]
    fn a_replaced_file_holds_the_new_bytes_and_leaves_no_temporary() {
        let dir = tempfile::Builder::new().prefix("slogate-replace-").tempdir().unwrap();
        let path = dir.path().join("model.onnx");
        std::fs::write(&path, b"old").unwrap();
        super::replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["model.onnx"], "only the file itself is left");
    }
}
