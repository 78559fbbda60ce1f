//! A pool's cluster layout (the sizes of its live clusters), and what to
//! do to bring a pool to a layout: the decision a node makes when it takes
//! a pool over from another whose clusters it cannot adopt.
//!
//! # Properties (tested by property tests)
//!
//! - **Exact:** after the requested clusters are added and the released
//!   ones removed, the pool's layout is the wanted one.
//! - **Minimal:** a cluster of a wanted size is never released while one
//!   of that size is requested, and the same layout changes nothing.
//! - **Ready first:** of clusters of one size, ready ones are kept before
//!   starting or unhealthy ones.

use serde::{Deserialize, Serialize};

use crate::model::{ClusterId, ClusterState, ClusterView, Rpu};

/// The sizes of a pool's starting, ready and unhealthy clusters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Ascending.
    pub sizes_rpu: Vec<u32>,
}

/// Whether a cluster counts in a layout: it bills, or soon will.
fn live(cluster: &ClusterView) -> bool {
    matches!(cluster.state, ClusterState::Starting | ClusterState::Ready | ClusterState::Unhealthy)
}

impl Layout {
    /// The layout of `clusters`.
    pub fn of(clusters: &[ClusterView]) -> Layout {
        let mut sizes_rpu: Vec<u32> = clusters.iter().filter(|c| live(c)).map(|c| c.size.0).collect();
        sizes_rpu.sort_unstable();
        Layout { sizes_rpu }
    }
}

/// What brings a pool to a layout.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciliation {
    /// Sizes to request.
    pub request: Vec<Rpu>,
    /// Clusters to release, starting and unhealthy ones first.
    pub release: Vec<ClusterId>,
}

/// What turns `clusters` into `want`.
pub fn reconcile(clusters: &[ClusterView], want: &Layout) -> Reconciliation {
    let mut spare: Vec<&ClusterView> = clusters.iter().filter(|c| live(c)).collect();
    // Keep ready clusters before the others.
    spare.sort_by_key(|c| (c.state != ClusterState::Ready, c.id));
    let mut request = Vec::new();
    for &size in &want.sizes_rpu {
        match spare.iter().position(|c| c.size.0 == size) {
            Some(kept) => {
                spare.remove(kept);
            }
            None => request.push(Rpu(size)),
        }
    }
    spare.sort_by_key(|c| (c.state == ClusterState::Ready, c.id));
    Reconciliation { request, release: spare.into_iter().map(|c| c.id).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Instant;
    use proptest::prelude::*;

    fn cluster(id: u32, state: ClusterState, size: u32) -> ClusterView {
        ClusterView { id: ClusterId(id), size: Rpu(size), state, requested_at: Instant::ZERO, ready_at: Instant::ZERO, running: Vec::new() }
    }

    #[test]
    fn reconciling_requests_the_missing_sizes_and_releases_the_extra_clusters_starting_ones_first() {
        let have = [cluster(0, ClusterState::Ready, 16), cluster(1, ClusterState::Ready, 16), cluster(2, ClusterState::Starting, 16)];
        let plan = reconcile(&have, &Layout { sizes_rpu: vec![16, 16, 32] });
        assert_eq!(plan.request, [Rpu(32)]);
        assert_eq!(plan.release, [ClusterId(2)], "the starting cluster goes, the ready ones stay");
        let plan = reconcile(&have, &Layout { sizes_rpu: vec![16] });
        assert!(plan.request.is_empty());
        assert_eq!(plan.release, [ClusterId(2), ClusterId(1)]);
        let plan = reconcile(&have[..2], &Layout { sizes_rpu: vec![16, 16] });
        assert_eq!(plan, Reconciliation::default(), "the same layout changes nothing");
    }

    proptest! {
        #[test]
        fn applying_a_reconciliation_gives_the_wanted_layout(
            have in proptest::collection::vec((0usize..5, prop_oneof![Just(4u32), Just(8), Just(16), Just(32)]), 0..8),
            want in proptest::collection::vec(prop_oneof![Just(4u32), Just(8), Just(16), Just(32)], 0..8),
        ) {
            let states = [ClusterState::Starting, ClusterState::Ready, ClusterState::Unhealthy, ClusterState::Draining, ClusterState::Gone];
            let clusters: Vec<ClusterView> = have.iter().enumerate().map(|(i, &(s, size))| cluster(i as u32, states[s], size)).collect();
            let mut want_sorted = want.clone();
            want_sorted.sort_unstable();
            let want = Layout { sizes_rpu: want_sorted };
            let plan = reconcile(&clusters, &want);
            let mut after: Vec<ClusterView> = clusters.iter().filter(|c| !plan.release.contains(&c.id)).cloned().collect();
            for (i, size) in plan.request.iter().enumerate() {
                after.push(cluster(100 + i as u32, ClusterState::Starting, size.0));
            }
            prop_assert_eq!(Layout::of(&after), want.clone());
            // Nothing released of a size that is requested.
            for id in &plan.release {
                let size = clusters.iter().find(|c| c.id == *id).unwrap().size;
                prop_assert!(!plan.request.contains(&size));
            }
            // Ready clusters are kept before others of their size.
            for id in &plan.release {
                let released = clusters.iter().find(|c| c.id == *id).unwrap();
                if released.state == ClusterState::Ready {
                    prop_assert!(!clusters.iter().any(|c| live(c) && c.state != ClusterState::Ready && c.size == released.size && !plan.release.contains(&c.id)));
                }
            }
        }
    }
}
