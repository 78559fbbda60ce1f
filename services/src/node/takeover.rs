//! What a node of a fleet does when it takes a pool over, and what an
//! owner publishes so that the next owner can.
//!
//! - [`prepare_claims`]: for each pool this node claims, before it routes
//!   it, rebuild the pool's routing policy on the execution log this node
//!   holds (which has copies of what the previous owners logged for the
//!   queries this node forwarded to them), adopt the tuned configuration
//!   the previous owner published on etcd, and bring the pool's clusters to
//!   the layout (sizes) it published: clusters it had added are requested
//!   (they start after the spinup delay), clusters it had released are
//!   drained.
//! - [`publish_state`]: while this node owns a pool, store on etcd its
//!   cluster layout whenever it changes and its Tuner's configuration in
//!   force whenever a newer one is chosen.
//! - [`hand_over_released`]: for each cloud pool this node lets go, forget
//!   its clusters without releasing them, for the next owner to adopt.
//!
//! The decisions are core's ([`slogate_core::scale::layout`]); the
//! layout, not the clusters themselves: an emulated cluster lives in
//! its node's process, so the next owner runs clusters of the same sizes
//! on its own warehouse. A cloud pool's clusters are the cloud's
//! resources, tagged with the deployment and the pool: the next owner
//! reconciles them with the published layout (or the configured one), so
//! it adopts the clusters the previous owner ran, terminates what the
//! layout does not need (a spinup the previous owner had not noted, say),
//! and creates only what is missing.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use slogate_actors::reservoir::{GetRecentExecutions, ReservoirActor};
use slogate_actors::router::{AdoptClusters, ForgetClusters, PolicyBuilder, ReleaseCluster, ReplacePolicy, RequestCluster};
use slogate_actors::shards::RouterShards;
use slogate_actors::tuner::{Adopt, GetState, TunedConfig, TunerActor};
use slogate_core::model::{ClusterView, PoolId};
use slogate_core::scale::layout::{Layout, Reconciliation, reconcile};
use slogate_core::predict::Observation;

use super::WARM_UP_EXECUTIONS_MAX;
use super::fleet::{Claim, Fleet, Placement};

/// The etcd state kind of a pool's tuned configuration.
const TUNED: &str = "tuned";

/// The etcd state kind of a pool's cluster layout.
const CLUSTERS: &str = "clusters";

/// How often an owner looks for state to publish.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// What taking a pool over needs.
#[derive(Clone)]
pub struct Wiring {
    /// The deployment.
    pub fleet: Arc<Fleet>,
    /// The node's shards.
    pub router: RouterShards,
    /// The node's execution log.
    pub reservoir: Addr<ReservoirActor>,
    /// Each pool's policy name and terms, to rebuild it.
    pub policies: HashMap<String, (String, crate::eval::PoolTerms)>,
    /// Each tuned pool's Tuner.
    pub tuners: Vec<(PoolId, Addr<TunerActor>)>,
    /// For each pool, how many executions the node had written since it
    /// started when the pool's policy last learned from the log (absent:
    /// zero, the log the policies were built on at start).
    pub learned_at: Arc<std::sync::Mutex<HashMap<String, u64>>>,
    /// Each cloud pool's provider.
    pub cloud: Arc<HashMap<String, CloudPool>>,
}

/// A cloud pool's provider, for a fleet's hand-overs.
#[derive(Clone)]
pub struct CloudPool {
    /// The provider.
    pub provider: Arc<slogate_cloud::provider::CloudProvider>,
    /// The configured layout, for a claim with none published.
    pub initial: Layout,
    /// `[pool.provider] dry_run`.
    pub dry_run: bool,
}

/// `pool`'s clusters on this node.
async fn clusters_of(wiring: &Wiring, pool: &str) -> Option<Vec<ClusterView>> {
    let shard = wiring.router.for_pool(&PoolId::new(pool))?;
    let state = shard.send(slogate_actors::router::GetState).await.ok()?;
    state.pools.into_iter().find(|p| p.id.as_str() == pool).map(|p| p.clusters)
}

/// Prepares each claimed pool; the claim's `ready` is answered when done
/// (or dropped, when a step fails: the pool then routes as it was).
pub async fn prepare_claims(mut claims: tokio::sync::mpsc::UnboundedReceiver<Claim>, wiring: Wiring) {
    while let Some(Claim { pool, ready }) = claims.recv().await {
        adopt_tuned(&wiring, &pool).await;
        match wiring.cloud.get(&pool) {
            Some(cloud) => adopt_resources(&wiring, &pool, cloud).await,
            None => restore_layout(&wiring, &pool).await,
        }
        relearn(&wiring, &pool).await;
        let _ = ready.send(());
    }
}

/// The layout `pool`'s previous owner published, if any (a bad or
/// unreadable one is logged and taken as none).
async fn published_layout(wiring: &Wiring, pool: &str) -> Option<Layout> {
    match wiring.fleet.pool_state(pool, CLUSTERS).await {
        Ok(Some(bytes)) => match serde_json::from_slice::<Layout>(&bytes) {
            Ok(layout) => Some(layout),
            Err(error) => {
                tracing::warn!(message = "The pool's cluster layout on etcd does not decode.", pool = %pool, %error);
                None
            }
        },
        Ok(None) => None,
        Err(error) => {
            tracing::warn!(message = "Could not read the pool's cluster layout from etcd.", pool = %pool, %error);
            None
        }
    }
}

/// Takes a cloud pool's resources over: reconciles the deployment's
/// resources with the layout its previous owner published (else the
/// configured one), adopts the clusters kept, and requests the missing
/// sizes.
async fn adopt_resources(wiring: &Wiring, pool: &str, cloud: &CloudPool) {
    let pool_id = PoolId::new(pool);
    let want = published_layout(wiring, pool).await.filter(|l| !l.sizes_rpu.is_empty()).unwrap_or_else(|| cloud.initial.clone());
    let adoption = match cloud.provider.reconcile(&pool_id, &want, cloud.dry_run).await {
        Ok(adoption) => adoption,
        Err(error) => return tracing::error!(message = "Took a cloud pool over but could not list its resources; it has no clusters until an operator or the autoscaler adds some.", pool = %pool, %error),
    };
    let Some(shard) = wiring.router.for_pool(&pool_id) else { return };
    let adopted = cloud.provider.adopted_clusters(&pool_id, &adoption);
    match shard.send(AdoptClusters { pool: pool_id.clone(), clusters: adopted }).await {
        Ok(Ok(taken)) => tracing::info!(message = "Took a cloud pool over with its resources.", pool = %pool, layout = ?want.sizes_rpu, adopted = taken.len(), terminated = adoption.terminate.len(), to_create = ?adoption.request.iter().map(|s| s.0).collect::<Vec<_>>()),
        Ok(Err(error)) => tracing::warn!(message = "Could not adopt the pool's clusters.", pool = %pool, %error),
        Err(_) => return,
    }
    for size in &adoption.request {
        if let Ok(Err(error)) = shard.send(RequestCluster { pool: pool_id.clone(), size: *size }).await {
            tracing::warn!(message = "Could not request a cluster of the pool's layout.", pool = %pool, size = size.0, %error);
        }
    }
}

/// For each cloud pool this node lets go: the router forgets its clusters
/// and the provider its resources, untouched, for the next owner to adopt.
/// Other pools keep their clusters (an emulated cluster lives here).
pub async fn hand_over_released(mut released: tokio::sync::mpsc::UnboundedReceiver<String>, wiring: Wiring) {
    while let Some(pool) = released.recv().await {
        let Some(cloud) = wiring.cloud.get(&pool) else { continue };
        let pool_id = PoolId::new(pool.as_str());
        if let Some(shard) = wiring.router.for_pool(&pool_id)
            && let Ok(Err(error)) = shard.send(ForgetClusters { pool: pool_id.clone() }).await
        {
            tracing::warn!(message = "Could not forget the pool's clusters.", pool = %pool, %error);
        }
        let let_go = cloud.provider.hand_over(&pool_id);
        tracing::info!(message = "Left a cloud pool's resources to its next owner.", pool = %pool, clusters = let_go.len());
    }
}

/// Brings `pool`'s clusters to the layout its previous owner published.
async fn restore_layout(wiring: &Wiring, pool: &str) {
    let Some(want) = published_layout(wiring, pool).await else { return };
    let pool_id = PoolId::new(pool);
    let (Some(clusters), Some(shard)) = (clusters_of(wiring, pool).await, wiring.router.for_pool(&pool_id)) else { return };
    if want.sizes_rpu.is_empty() || Layout::of(&clusters) == want {
        return;
    }
    let Reconciliation { request, release } = reconcile(&clusters, &want);
    for size in &request {
        if let Ok(Err(error)) = shard.send(RequestCluster { pool: pool_id.clone(), size: *size }).await {
            tracing::warn!(message = "Could not request a cluster of the pool's layout.", pool = %pool, size = size.0, %error);
        }
    }
    for cluster in &release {
        if let Ok(Err(error)) = shard.send(ReleaseCluster { pool: pool_id.clone(), cluster: *cluster, force: false }).await {
            tracing::warn!(message = "Could not release a cluster beyond the pool's layout.", pool = %pool, %cluster, %error);
        }
    }
    tracing::info!(message = "Took a pool over with its previous owner's cluster layout.", pool = %pool, layout = ?want.sizes_rpu, requested = ?request, released = release.len());
}

/// Rebuilds `pool`'s policy on the node's execution log, unless nothing
/// was written to the log since the policy learned from it (at start-up,
/// the policies were just built on the same log).
async fn relearn(wiring: &Wiring, pool: &str) {
    let (Some((policy, terms)), Some(shard)) = (wiring.policies.get(pool).cloned(), wiring.router.for_pool(&PoolId::new(pool)).cloned()) else {
        return;
    };
    let Ok(state) = wiring.reservoir.send(slogate_actors::reservoir::GetState).await else { return };
    let written = state.executions_written_since_start;
    if written <= wiring.learned_at.lock().expect("learned_at lock").get(pool).copied().unwrap_or(0) {
        return;
    }
    let Ok(Ok(records)) = wiring.reservoir.send(GetRecentExecutions { limit: WARM_UP_EXECUTIONS_MAX }).await else { return };
    let history: Vec<Observation> = records.iter().map(|r| r.observation()).collect();
    let executions = history.len();
    let build: PolicyBuilder = Box::new(move || crate::eval::build_policy_with(&policy, &history, &terms).map_err(|e| e.to_string()));
    match shard.send(ReplacePolicy { pool: PoolId::new(pool), build }).await {
        Ok(Ok(())) => {
            wiring.learned_at.lock().expect("learned_at lock").insert(pool.to_owned(), written);
            wiring.fleet.relearned(pool, executions);
            tracing::info!(message = "Took a pool over with its policy learned from the execution log.", pool = %pool, executions);
        }
        Ok(Err(error)) => tracing::warn!(message = "Took a pool over with the policy it had.", pool = %pool, %error),
        Err(_) => {}
    }
}

/// Adopts the tuned configuration `pool`'s previous owner published.
async fn adopt_tuned(wiring: &Wiring, pool: &str) {
    let Some((_, tuner)) = wiring.tuners.iter().find(|(id, _)| id.as_str() == pool) else { return };
    let stored = match wiring.fleet.pool_state(pool, TUNED).await {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return,
        Err(error) => {
            tracing::warn!(message = "Could not read the pool's tuned configuration from etcd.", pool = %pool, %error);
            return;
        }
    };
    match serde_json::from_slice::<TunedConfig>(&stored) {
        Ok(tuned) => {
            let finished = tuned.finished_at_unix_s;
            if let Ok(true) = tuner.send(Adopt { tuned, source: "fleet (adopted)".to_owned() }).await {
                tracing::info!(message = "Took a pool over with its previous owner's tuned configuration.", pool = %pool, finished_at_unix_s = finished);
            }
        }
        Err(error) => tracing::warn!(message = "The pool's tuned configuration on etcd does not decode.", pool = %pool, %error),
    }
}

/// Publishes each owned pool's cluster layout when it changes and its
/// tuned configuration when a newer one is in force, every
/// [`PUBLISH_EVERY`], for as long as the node runs.
pub async fn publish_state(wiring: Wiring) {
    let mut tuned_published: BTreeMap<String, i64> = BTreeMap::new();
    let mut layout_published: BTreeMap<String, Layout> = BTreeMap::new();
    let pools: Vec<String> = wiring.policies.keys().cloned().collect();
    loop {
        tokio::time::sleep(PUBLISH_EVERY).await;
        let owned: Vec<&String> = pools.iter().filter(|pool| wiring.fleet.placement(pool) == Placement::Local).collect();
        layout_published.retain(|pool, _| owned.contains(&pool));
        if owned.is_empty() {
            continue;
        }
        // One read of every shard's pools per round.
        let Ok(state) = wiring.router.state().await else { continue };
        for pool in owned {
            if let Some(routed) = state.pools.iter().find(|p| p.id.as_str() == *pool) {
                let layout = Layout::of(&routed.clusters);
                if layout_published.get(pool) != Some(&layout) && publish(&wiring, pool, CLUSTERS, &layout).await {
                    layout_published.insert(pool.clone(), layout);
                }
            }
            let Some((_, tuner)) = wiring.tuners.iter().find(|(id, _)| id.as_str() == *pool) else { continue };
            let Ok(state) = tuner.send(GetState).await else { continue };
            let Some(active) = state.active else { continue };
            if tuned_published.get(pool).is_some_and(|&at| at >= active.finished_at_unix_s) {
                continue;
            }
            if publish(&wiring, pool, TUNED, &active).await {
                tuned_published.insert(pool.clone(), active.finished_at_unix_s);
            }
        }
    }
}

/// Stores `value` as `pool`'s `kind` of state; whether it was stored.
async fn publish(wiring: &Wiring, pool: &str, kind: &str, value: &impl serde::Serialize) -> bool {
    let bytes = serde_json::to_vec(value).expect("the pool's state serialises");
    match wiring.fleet.put_pool_state(pool, kind, bytes).await {
        Ok(stored) => stored,
        Err(error) => {
            tracing::warn!(message = "Could not publish the pool's state.", pool = %pool, kind, %error);
            false
        }
    }
}
