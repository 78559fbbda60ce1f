//! Invariants shared by production `debug_assert!`s, the simulator's
//! per-step checks and the tests. A violation is a bug, so these panic.

use std::collections::HashSet;

use crate::model::{ClusterState, Pool};

/// Checks a pool view:
///
/// - a query runs on at most one cluster;
/// - a gone cluster runs nothing;
/// - cluster ids are unique.
///
/// # Panics
///
/// On the first violated invariant, naming it.
pub fn assert_pool_consistent(pool: &Pool) {
    let mut clusters = HashSet::new();
    let mut queries = HashSet::new();
    for cluster in &pool.clusters {
        assert!(clusters.insert(cluster.id), "invariant: cluster {} listed twice", cluster.id);
        assert!(
            cluster.state != ClusterState::Gone || cluster.running.is_empty(),
            "invariant: gone cluster {} still runs {} queries",
            cluster.id,
            cluster.running.len()
        );
        for query in &cluster.running {
            assert!(queries.insert(query.id), "invariant: query {} runs on two clusters", query.id);
        }
    }
}
