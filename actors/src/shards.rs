//! The node's RouterShards: which shard owns each pool, and the calls
//! that span them.
//!
//! A node runs one or more [`RouterShard`]s, each on a thread of its own
//! with its pools' trackers and emulated warehouses. Every pool is owned
//! by exactly one shard: a query is routed by its pool's shard alone, so
//! shards share nothing on the query path and pools on different shards
//! run on different threads. [`RouterShards`] is the map the gRPC service,
//! the admin API and the shutdown use:
//!
//! - a pool's calls go to its owner ([`RouterShards::for_pool`]);
//! - state reads fan out to every shard and merge: pools by name, counters
//!   summed, each shard listed with its thread ([`RouterShards::state`]);
//! - the decision log merges the shards' logs, newest first
//!   ([`merge_newest`]: the result is the `limit` newest of all, in order);
//! - drain, flush and fail-in-flight go to every shard
//!   ([`RouterShards::broadcast`]).

use std::collections::HashMap;

use actix::dev::{MessageResponse, ToEnvelope};
use actix::{Addr, Handler, MailboxError, Message};
use slogate_core::model::PoolId;

use crate::router::{DecisionRecord, GetDecisions, GetState, RouterShard, RouterState};

/// The node's shards and the pools each owns. Cheap to clone.
#[derive(Clone)]
pub struct RouterShards {
    shards: Vec<Addr<RouterShard>>,
    owners: std::sync::Arc<HashMap<PoolId, usize>>,
}

impl RouterShards {
    /// The shards, each with the pools it owns. A pool listed twice is
    /// owned by its first shard.
    pub fn new(shards: Vec<(Addr<RouterShard>, Vec<PoolId>)>) -> Self {
        let mut owners = HashMap::new();
        let mut addresses = Vec::with_capacity(shards.len());
        for (index, (address, pools)) in shards.into_iter().enumerate() {
            for pool in pools {
                owners.entry(pool).or_insert(index);
            }
            addresses.push(address);
        }
        RouterShards { shards: addresses, owners: std::sync::Arc::new(owners) }
    }

    /// The shard that owns `pool`, if any does.
    pub fn for_pool(&self, pool: &PoolId) -> Option<&Addr<RouterShard>> {
        self.owners.get(pool).map(|&index| &self.shards[index])
    }

    /// Every shard, in index order.
    pub fn shards(&self) -> &[Addr<RouterShard>] {
        &self.shards
    }

    /// Sends `message` to every shard and collects the replies in shard
    /// order; the first undeliverable one is the error.
    pub async fn broadcast<M>(&self, message: M) -> Result<Vec<M::Result>, MailboxError>
    where
        M: Message + Clone + Send + 'static,
        M::Result: Send,
        RouterShard: Handler<M>,
        <RouterShard as actix::Actor>::Context: ToEnvelope<RouterShard, M>,
        <RouterShard as Handler<M>>::Result: MessageResponse<RouterShard, M>,
    {
        let sends: Vec<_> = self.shards.iter().map(|shard| shard.send(message.clone())).collect();
        let mut replies = Vec::with_capacity(sends.len());
        for send in sends {
            replies.push(send.await?);
        }
        Ok(replies)
    }

    /// Every shard's state merged: pools sorted by name, counters summed,
    /// draining if any shard is, and each shard's [`crate::router::ShardInfo`].
    pub async fn state(&self) -> Result<RouterState, MailboxError> {
        Ok(merge_states(self.broadcast(GetState).await?))
    }

    /// The `limit` newest decisions of all shards (only `tenant`'s and
    /// `pool`'s, if set; a pool's are asked of its shard alone), newest
    /// first.
    pub async fn decisions(&self, limit: usize, tenant: Option<String>, pool: Option<PoolId>) -> Result<Vec<DecisionRecord>, MailboxError> {
        if let Some(shard) = pool.as_ref().and_then(|p| self.for_pool(p)) {
            return shard.send(GetDecisions { limit, tenant, pool }).await;
        }
        Ok(merge_newest(self.broadcast(GetDecisions { limit, tenant, pool }).await?, limit))
    }
}

/// One state of several shards'.
fn merge_states(states: Vec<RouterState>) -> RouterState {
    let mut merged =
        RouterState { draining: false, pools: Vec::new(), reservoir_updates_dropped: 0, scale_notices_dropped: 0, shards: Vec::new() };
    for state in states {
        merged.draining |= state.draining;
        merged.pools.extend(state.pools);
        merged.reservoir_updates_dropped += state.reservoir_updates_dropped;
        merged.scale_notices_dropped += state.scale_notices_dropped;
        merged.shards.extend(state.shards);
    }
    merged.pools.sort_by(|a, b| a.id.cmp(&b.id));
    merged.shards.sort_by_key(|s| s.index);
    merged
}

/// The `limit` newest records of `logs`, each newest first, newest first.
/// Records of equal time keep their log's order.
pub fn merge_newest(logs: Vec<Vec<DecisionRecord>>, limit: usize) -> Vec<DecisionRecord> {
    let mut all: Vec<DecisionRecord> = logs.into_iter().flatten().collect();
    all.sort_by(|a, b| b.at_s.total_cmp(&a.at_s));
    all.truncate(limit);
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use slogate_core::model::{QueryId, TemplateId};

    fn record(shard: usize, at_s: f64) -> DecisionRecord {
        DecisionRecord {
            pool: PoolId::new(format!("p{shard}")),
            query: QueryId(0),
            client_query_id: String::new(),
            tenant: String::new(),
            template: TemplateId(0),
            at_s,
            target: None,
            explanation: "".into(),
        }
    }

    proptest! {
        #[test]
        fn merged_decisions_are_the_newest_of_all_shards_newest_first(
            times in proptest::collection::vec(proptest::collection::vec(0u32..1_000, 0..20), 1..5),
            limit in 0usize..50,
        ) {
            let logs: Vec<Vec<DecisionRecord>> = times
                .iter()
                .enumerate()
                .map(|(shard, ts)| {
                    let mut ts = ts.clone();
                    ts.sort_unstable_by(|a, b| b.cmp(a));
                    ts.into_iter().map(|t| record(shard, f64::from(t))).collect()
                })
                .collect();
            let merged = merge_newest(logs, limit);
            let mut expected: Vec<u32> = times.iter().flatten().copied().collect();
            expected.sort_unstable_by(|a, b| b.cmp(a));
            expected.truncate(limit);
            let got: Vec<u32> = merged.iter().map(|r| r.at_s as u32).collect();
            prop_assert_eq!(got, expected);
        }
    }

    #[test]
    fn a_pool_is_owned_by_the_shard_that_lists_it() {
        let system = actix::System::new();
        system.block_on(async {
            let shard = |index| {
                let clock = crate::clock::VirtualClock::start(1.0);
                actix::Actor::start(RouterShard::new(clock, Vec::new(), None, crate::router::small_limits()).as_shard(index, 2))
            };
            let (a, b) = (shard(0), shard(1));
            let shards = RouterShards::new(vec![(a.clone(), vec![PoolId::new("x")]), (b.clone(), vec![PoolId::new("y")])]);
            assert_eq!(shards.for_pool(&PoolId::new("x")), Some(&a));
            assert_eq!(shards.for_pool(&PoolId::new("y")), Some(&b));
            assert_eq!(shards.for_pool(&PoolId::new("z")), None);
            let state = shards.state().await.unwrap();
            assert_eq!(state.shards.iter().map(|s| s.index).collect::<Vec<_>>(), vec![0, 1]);
        });
    }
}
