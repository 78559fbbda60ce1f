//! What a node of a fleet does when it takes a pool over, and what an
//! owner publishes so that the next owner can.
//!
//! - [`prepare_claims`]: for each pool this node claims, before it routes
//!   it, rebuild the pool's routing policy on the execution log this node
//!   holds (which has copies of what the previous owners logged for the
//!   queries this node forwarded to them), and adopt the tuned
//!   configuration the previous owner published on etcd.
//! - [`publish_tuned`]: while this node owns a tuned pool, store its
//!   Tuner's configuration in force on etcd whenever a newer one is chosen.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use slogate_actors::reservoir::{GetRecentExecutions, ReservoirActor};
use slogate_actors::router::{PolicyBuilder, ReplacePolicy};
use slogate_actors::shards::RouterShards;
use slogate_actors::tuner::{Adopt, GetState, TunedConfig, TunerActor};
use slogate_core::model::PoolId;
use slogate_core::predict::Observation;

use super::WARM_UP_EXECUTIONS_MAX;
use super::fleet::{Claim, Fleet, Placement};

/// The etcd state kind of a pool's tuned configuration.
const TUNED: &str = "tuned";

/// How often an owner looks for a newer tuned configuration to publish.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

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
        relearn(&wiring, &pool).await;
        let _ = ready.send(());
    }
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

/// Publishes each owned tuned pool's configuration when a newer one is in
/// force, every [`PUBLISH_EVERY`], for as long as the node runs.
pub async fn publish_tuned(wiring: Wiring) {
    let mut published: BTreeMap<String, i64> = BTreeMap::new();
    loop {
        tokio::time::sleep(PUBLISH_EVERY).await;
        for (pool, tuner) in &wiring.tuners {
            if wiring.fleet.placement(&pool.0) != Placement::Local {
                continue;
            }
            let Ok(state) = tuner.send(GetState).await else { return };
            let Some(active) = state.active else { continue };
            if published.get(&pool.0).is_some_and(|&at| at >= active.finished_at_unix_s) {
                continue;
            }
            let bytes = serde_json::to_vec(&active).expect("a tuned configuration serialises");
            match wiring.fleet.put_pool_state(&pool.0, TUNED, bytes).await {
                Ok(true) => {
                    published.insert(pool.0.clone(), active.finished_at_unix_s);
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(message = "Could not publish the pool's tuned configuration.", pool = %pool, %error),
            }
        }
    }
}
