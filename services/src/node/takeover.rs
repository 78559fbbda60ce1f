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
//!
//! The layout, not the clusters themselves: an emulated cluster lives in
//! its node's process, so the next owner runs clusters of the same sizes
//! on its own warehouse. Providers of real clusters adopt them by their
//! tags instead.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use slogate_actors::reservoir::{GetRecentExecutions, ReservoirActor};
use slogate_actors::router::{PolicyBuilder, ReleaseCluster, ReplacePolicy, RequestCluster};
use slogate_actors::shards::RouterShards;
use slogate_actors::tuner::{Adopt, GetState, TunedConfig, TunerActor};
use slogate_core::model::{ClusterId, ClusterState, PoolId, Rpu};
use slogate_core::predict::Observation;

use super::WARM_UP_EXECUTIONS_MAX;
use super::fleet::{Claim, Fleet, Placement};

/// The etcd state kind of a pool's tuned configuration.
const TUNED: &str = "tuned";

/// The etcd state kind of a pool's cluster layout.
const CLUSTERS: &str = "clusters";

/// How often an owner looks for state to publish.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// A pool's clusters as the next owner should have them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Layout {
    /// The sizes of its starting, ready and unhealthy clusters, ascending.
    pub sizes_rpu: Vec<u32>,
}

/// `pool`'s layout on this node, and its clusters by id and size.
async fn layout_of(wiring: &Wiring, pool: &str) -> Option<(Layout, Vec<(ClusterId, ClusterState, u32)>)> {
    let shard = wiring.router.for_pool(&PoolId(pool.to_owned()))?;
    let state = shard.send(slogate_actors::router::GetState).await.ok()?;
    let pool = state.pools.into_iter().find(|p| p.id.0 == pool)?;
    let clusters: Vec<(ClusterId, ClusterState, u32)> = pool
        .clusters
        .iter()
        .filter(|c| matches!(c.state, ClusterState::Starting | ClusterState::Ready | ClusterState::Unhealthy))
        .map(|c| (c.id, c.state, c.size.0))
        .collect();
    let mut sizes_rpu: Vec<u32> = clusters.iter().map(|c| c.2).collect();
    sizes_rpu.sort_unstable();
    Some((Layout { sizes_rpu }, clusters))
}

/// What to do to turn `have` (id, state, size) into `want` (sizes): the
/// sizes to request and the clusters to release, starting ones first.
pub fn reconcile(have: &[(ClusterId, ClusterState, u32)], want: &Layout) -> (Vec<u32>, Vec<ClusterId>) {
    let mut spare: Vec<(ClusterId, ClusterState, u32)> = have.to_vec();
    // Keep ready clusters before starting ones.
    spare.sort_by_key(|c| (c.1 != ClusterState::Ready, c.0));
    let mut request = Vec::new();
    for &size in &want.sizes_rpu {
        match spare.iter().position(|c| c.2 == size) {
            Some(kept) => {
                spare.remove(kept);
            }
            None => request.push(size),
        }
    }
    // What is left over is released, starting and unhealthy ones first.
    spare.sort_by_key(|c| (c.1 == ClusterState::Ready, c.0));
    (request, spare.into_iter().map(|c| c.0).collect())
}

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
}

/// Prepares each claimed pool; the claim's `ready` is answered when done
/// (or dropped, when a step fails: the pool then routes as it was).
pub async fn prepare_claims(mut claims: tokio::sync::mpsc::UnboundedReceiver<Claim>, wiring: Wiring) {
    while let Some(Claim { pool, ready }) = claims.recv().await {
        adopt_tuned(&wiring, &pool).await;
        restore_layout(&wiring, &pool).await;
        relearn(&wiring, &pool).await;
        let _ = ready.send(());
    }
}

/// Brings `pool`'s clusters to the layout its previous owner published.
async fn restore_layout(wiring: &Wiring, pool: &str) {
    let want = match wiring.fleet.pool_state(pool, CLUSTERS).await {
        Ok(Some(bytes)) => match serde_json::from_slice::<Layout>(&bytes) {
            Ok(layout) => layout,
            Err(error) => return tracing::warn!(message = "The pool's cluster layout on etcd does not decode.", pool = %pool, %error),
        },
        Ok(None) => return,
        Err(error) => return tracing::warn!(message = "Could not read the pool's cluster layout from etcd.", pool = %pool, %error),
    };
    let (Some((have, clusters)), Some(shard)) = (layout_of(wiring, pool).await, wiring.router.for_pool(&PoolId(pool.to_owned()))) else { return };
    if have == want || want.sizes_rpu.is_empty() {
        return;
    }
    let (request, release) = reconcile(&clusters, &want);
    for size in &request {
        if let Ok(Err(error)) = shard.send(RequestCluster { pool: PoolId(pool.to_owned()), size: Rpu(*size) }).await {
            tracing::warn!(message = "Could not request a cluster of the pool's layout.", pool = %pool, size, %error);
        }
    }
    for cluster in &release {
        if let Ok(Err(error)) = shard.send(ReleaseCluster { pool: PoolId(pool.to_owned()), cluster: *cluster, force: false }).await {
            tracing::warn!(message = "Could not release a cluster beyond the pool's layout.", pool = %pool, %cluster, %error);
        }
    }
    tracing::info!(message = "Took a pool over with its previous owner's cluster layout.", pool = %pool, layout = ?want.sizes_rpu, requested = ?request, released = release.len());
}

/// Rebuilds `pool`'s policy on the node's execution log.
async fn relearn(wiring: &Wiring, pool: &str) {
    let (Some((policy, terms)), Some(shard)) = (wiring.policies.get(pool).cloned(), wiring.router.for_pool(&PoolId(pool.to_owned())).cloned()) else {
        return;
    };
    let Ok(Ok(records)) = wiring.reservoir.send(GetRecentExecutions { limit: WARM_UP_EXECUTIONS_MAX }).await else { return };
    let history: Vec<Observation> = records.iter().map(|r| r.observation()).collect();
    let executions = history.len();
    let build: PolicyBuilder = Box::new(move || crate::eval::build_policy_with(&policy, &history, &terms).map_err(|e| e.to_string()));
    match shard.send(ReplacePolicy { pool: PoolId(pool.to_owned()), build }).await {
        Ok(Ok(())) => {
            wiring.fleet.relearned(pool, executions);
            tracing::info!(message = "Took a pool over with its policy learned from the execution log.", pool = %pool, executions);
        }
        Ok(Err(error)) => tracing::warn!(message = "Took a pool over with the policy it had.", pool = %pool, %error),
        Err(_) => {}
    }
}

/// Adopts the tuned configuration `pool`'s previous owner published.
async fn adopt_tuned(wiring: &Wiring, pool: &str) {
    let Some((_, tuner)) = wiring.tuners.iter().find(|(id, _)| id.0 == pool) else { return };
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
        for pool in &pools {
            if wiring.fleet.placement(pool) != Placement::Local {
                layout_published.remove(pool);
                continue;
            }
            if let Some((layout, _)) = layout_of(&wiring, pool).await
                && layout_published.get(pool) != Some(&layout)
                && publish(&wiring, pool, CLUSTERS, &layout).await
            {
                layout_published.insert(pool.clone(), layout);
            }
            let Some((_, tuner)) = wiring.tuners.iter().find(|(id, _)| id.0 == *pool) else { continue };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconciling_requests_the_missing_sizes_and_releases_the_extra_clusters_starting_ones_first() {
        let have = [(ClusterId(0), ClusterState::Ready, 16), (ClusterId(1), ClusterState::Ready, 16), (ClusterId(2), ClusterState::Starting, 16)];
        let (request, release) = reconcile(&have, &Layout { sizes_rpu: vec![16, 16, 32] });
        assert_eq!(request, [32]);
        assert_eq!(release, [ClusterId(2)], "the starting cluster goes, the ready ones stay");
        let (request, release) = reconcile(&have, &Layout { sizes_rpu: vec![16] });
        assert!(request.is_empty());
        assert_eq!(release, [ClusterId(2), ClusterId(1)]);
        let (request, release) = reconcile(&have[..2], &Layout { sizes_rpu: vec![16, 16] });
        assert!(request.is_empty() && release.is_empty(), "the same layout changes nothing");
    }
}
