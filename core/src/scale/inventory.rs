//! A pool's cloud resources: the tags that name them as slogate's, and the
//! reconciliation a node runs when it starts or takes a pool over: which
//! listed resources it adopts as the pool's clusters, which it terminates,
//! and which sizes it still has to create.
//!
//! Nothing about a pool's clusters is kept anywhere but in the platform:
//! every resource carries the deployment, node, pool and cluster id in its
//! tags, so a node that died between a create call and noting its answer
//! finds the resource again by listing the deployment's tags.
//!
//! # Properties (tested by property tests)
//!
//! - **Complete:** every listed resource of the pool is adopted,
//!   terminated, or left alone because it is already being deleted; none is
//!   forgotten, so nothing leaks.
//! - **Exact:** the adopted clusters and the requested sizes together make
//!   the wanted layout.
//! - **No duplicates:** no cluster id is adopted twice; of two resources
//!   tagged with one cluster id, one at most is kept.
//! - **Fresh ids:** the next cluster id is above every listed one, so a
//!   new resource never takes the tags of one still alive or deleting.
//! - **Available first:** of resources of one size, available ones are
//!   adopted before creating or paused ones.
//! - **Nearest parked:** [`pick_parked`] takes a parked resource of the
//!   wanted size when there is one, and otherwise the one whose size is
//!   nearest (the smallest resize), the smaller on a tie.
//! - **Valid names:** [`resource_name`] gives a name every platform here
//!   takes (a letter first, then lowercase letters, digits and single
//!   hyphens, at most 63 characters), distinct for distinct clusters.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::model::{ClusterId, ClusterState, ClusterView, Rpu};
use crate::scale::layout::{self, Layout};
use crate::time::Instant;

/// The tag keys every slogate resource carries.
pub mod tag {
    /// The deployment (`fleet.deployment`).
    pub const DEPLOYMENT: &str = "slogate:deployment";
    /// The node that created it.
    pub const NODE: &str = "slogate:node";
    /// The pool it belongs to.
    pub const POOL: &str = "slogate:pool";
    /// slogate's cluster id (`c3`).
    pub const CLUSTER: &str = "slogate:cluster";
    /// Its size, RPU.
    pub const SIZE_RPU: &str = "slogate:size-rpu";
}

/// Who a resource belongs to, as its tags say.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// The deployment.
    pub deployment: String,
    /// The node that created it.
    pub node: String,
    /// The pool.
    pub pool: String,
    /// slogate's cluster id.
    pub cluster: ClusterId,
    /// Its size.
    pub size: Rpu,
}

impl Owner {
    /// The tags that say so, in a fixed order.
    pub fn tags(&self) -> Vec<(String, String)> {
        vec![
            (tag::DEPLOYMENT.into(), self.deployment.clone()),
            (tag::NODE.into(), self.node.clone()),
            (tag::POOL.into(), self.pool.clone()),
            (tag::CLUSTER.into(), self.cluster.to_string()),
            (tag::SIZE_RPU.into(), self.size.0.to_string()),
        ]
    }

    /// The owner `tags` name, if they carry every slogate key with a
    /// well-formed value; `None` marks a resource slogate did not tag.
    pub fn from_tags<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Option<Owner> {
        let tags: BTreeMap<&str, &str> = tags.into_iter().collect();
        let cluster = tags.get(tag::CLUSTER)?.strip_prefix('c')?.parse().ok()?;
        Some(Owner {
            deployment: (*tags.get(tag::DEPLOYMENT)?).to_owned(),
            node: (*tags.get(tag::NODE)?).to_owned(),
            pool: (*tags.get(tag::POOL)?).to_owned(),
            cluster: ClusterId(cluster),
            size: Rpu(tags.get(tag::SIZE_RPU)?.parse().ok()?),
        })
    }
}

/// Longest resource name: a provisioned Redshift cluster identifier's
/// limit, the tightest of the platforms here.
pub const NAME_LEN_MAX: usize = 63;

/// The name of `cluster`'s resource in `pool` of `deployment`, under
/// `prefix`: `prefix-deployment-pool-c3`, lowercased, with every run of
/// other characters as one hyphen. A name past [`NAME_LEN_MAX`] keeps its
/// start and ends with a hash of the whole, then the cluster id, so names
/// stay distinct and readable.
pub fn resource_name(prefix: &str, deployment: &str, pool: &str, cluster: ClusterId) -> String {
    let mut name = String::new();
    for c in format!("{prefix}-{deployment}-{pool}").chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c.to_ascii_lowercase());
        } else if !name.is_empty() && !name.ends_with('-') {
            name.push('-');
        }
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name.insert_str(0, "s-");
    }
    if !name.ends_with('-') {
        name.push('-');
    }
    let suffix = cluster.to_string();
    if name.len() + suffix.len() > NAME_LEN_MAX {
        let hash = crate::ownership::weight(&name, "resource-name");
        let tail = format!("{:08x}-{suffix}", hash as u32);
        name.truncate(NAME_LEN_MAX - tail.len() - 1);
        while name.ends_with('-') {
            name.pop();
        }
        name.push('-');
        name.push_str(&tail);
        return name;
    }
    name.push_str(&suffix);
    name
}

/// Where a resource is in its life, as the platform reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceState {
    /// Being created or resumed.
    Creating,
    /// Serving.
    Available,
    /// Paused (a provisioned cluster): it bills for storage only, and
    /// serves once resumed.
    Paused,
    /// Being deleted or terminated.
    Deleting,
    /// Broken: it will not serve.
    Failed,
}

/// One resource a platform listed under the deployment's tags.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Listed {
    /// The platform's id (a workgroup name, an instance id).
    pub resource_id: String,
    /// Its tags' owner.
    pub owner: Owner,
    /// Its state.
    pub state: ResourceState,
}

/// What to do with a pool's listed resources.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Adoption {
    /// Resources kept as the pool's clusters: (cluster, resource id).
    pub adopt: Vec<(ClusterId, String)>,
    /// Resources to terminate, each with why.
    pub terminate: Vec<(String, String)>,
    /// Sizes still to create.
    pub request: Vec<Rpu>,
    /// The first cluster id free for new resources.
    pub next_cluster: ClusterId,
}

/// The live states: a resource that bills, or will once it serves.
fn live(state: ResourceState) -> bool {
    matches!(state, ResourceState::Creating | ResourceState::Available | ResourceState::Paused)
}

/// What brings `pool`'s resources among `listed` to `want`. Resources of
/// other pools or deployments are not looked at: their own owners
/// reconcile them.
pub fn reconcile(deployment: &str, pool: &str, listed: &[Listed], want: &Layout) -> Adoption {
    let ours: Vec<&Listed> = listed.iter().filter(|r| r.owner.deployment == deployment && r.owner.pool == pool).collect();
    let next_cluster = ClusterId(ours.iter().map(|r| r.owner.cluster.0 + 1).max().unwrap_or(0));
    let mut terminate = Vec::new();
    // One resource per cluster id: the one furthest along is kept.
    let mut by_cluster: BTreeMap<ClusterId, &Listed> = BTreeMap::new();
    let rank = |state: ResourceState| match state {
        ResourceState::Available => 0,
        ResourceState::Creating => 1,
        _ => 2,
    };
    for resource in ours.iter().copied() {
        match resource.state {
            ResourceState::Deleting => continue,
            ResourceState::Failed => {
                terminate.push((resource.resource_id.clone(), "the platform reports it failed".to_owned()));
                continue;
            }
            _ => {}
        }
        match by_cluster.get(&resource.owner.cluster) {
            Some(kept) if (rank(kept.state), &kept.resource_id) <= (rank(resource.state), &resource.resource_id) => {
                terminate.push((resource.resource_id.clone(), format!("a duplicate of {}, which is kept", kept.resource_id)));
            }
            Some(kept) => {
                terminate.push((kept.resource_id.clone(), format!("a duplicate of {}, which is kept", resource.resource_id)));
                by_cluster.insert(resource.owner.cluster, resource);
            }
            None => {
                by_cluster.insert(resource.owner.cluster, resource);
            }
        }
    }
    // The pool's layout decides which to keep, as for clusters.
    let views: Vec<ClusterView> = by_cluster
        .values()
        .filter(|r| live(r.state))
        .map(|r| ClusterView {
            id: r.owner.cluster,
            size: r.owner.size,
            state: match r.state {
                ResourceState::Available => ClusterState::Ready,
                ResourceState::Creating => ClusterState::Starting,
                _ => ClusterState::Unhealthy,
            },
            requested_at: Instant::ZERO,
            ready_at: Instant::ZERO,
            running: Vec::new(),
        })
        .collect();
    let plan = layout::reconcile(&views, want);
    for cluster in &plan.release {
        terminate.push((by_cluster[cluster].resource_id.clone(), "the pool's layout does not need it".to_owned()));
    }
    let adopt = by_cluster
        .iter()
        .filter(|(cluster, r)| live(r.state) && !plan.release.contains(cluster))
        .map(|(cluster, r)| (*cluster, r.resource_id.clone()))
        .collect();
    Adoption { adopt, terminate, request: plan.request, next_cluster }
}

/// Which of a pool's parked resources (paused, kept for reuse), of sizes
/// `parked_sizes`, a new cluster of size `want` reuses: one of that size if
/// any, else the nearest in size (it is resized), the smaller on a tie;
/// `None` when nothing is parked.
pub fn pick_parked(parked_sizes: &[Rpu], want: Rpu) -> Option<usize> {
    parked_sizes.iter().enumerate().min_by_key(|(_, size)| (size.0.abs_diff(want.0), size.0)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn listed(id: &str, pool: &str, cluster: u32, size: u32, state: ResourceState) -> Listed {
        Listed {
            resource_id: id.into(),
            owner: Owner { deployment: "d".into(), node: "n1".into(), pool: pool.into(), cluster: ClusterId(cluster), size: Rpu(size) },
            state,
        }
    }

    #[test]
    fn tags_name_the_owner_and_untagged_resources_have_none() {
        let owner = Owner { deployment: "prod".into(), node: "n2".into(), pool: "dash".into(), cluster: ClusterId(7), size: Rpu(32) };
        let tags = owner.tags();
        assert_eq!(Owner::from_tags(tags.iter().map(|(k, v)| (k.as_str(), v.as_str()))), Some(owner));
        assert_eq!(Owner::from_tags([(tag::DEPLOYMENT, "prod"), (tag::POOL, "dash")]), None, "missing keys");
        let mut bad = tags.clone();
        bad[3].1 = "seven".into();
        assert_eq!(Owner::from_tags(bad.iter().map(|(k, v)| (k.as_str(), v.as_str()))), None, "a malformed cluster id");
    }

    #[test]
    fn a_resource_created_but_never_noted_is_terminated_when_the_layout_does_not_need_it() {
        // The node died after creating c2 for a burst; it restarts wanting
        // its base layout of one 16-RPU cluster.
        let found = [listed("wg-c0", "p", 0, 16, ResourceState::Available), listed("wg-c2", "p", 2, 32, ResourceState::Creating)];
        let plan = reconcile("d", "p", &found, &Layout { sizes_rpu: vec![16] });
        assert_eq!(plan.adopt, [(ClusterId(0), "wg-c0".to_owned())]);
        assert_eq!(plan.terminate, [("wg-c2".to_owned(), "the pool's layout does not need it".to_owned())]);
        assert!(plan.request.is_empty());
        assert_eq!(plan.next_cluster, ClusterId(3));
    }

    #[test]
    fn duplicates_of_one_cluster_keep_the_available_one_and_other_pools_are_left_alone() {
        let found = [
            listed("i-b", "p", 1, 16, ResourceState::Creating),
            listed("i-a", "p", 1, 16, ResourceState::Available),
            listed("i-other", "q", 1, 16, ResourceState::Available),
            listed("i-old", "p", 0, 16, ResourceState::Deleting),
            listed("i-bad", "p", 4, 16, ResourceState::Failed),
        ];
        let plan = reconcile("d", "p", &found, &Layout { sizes_rpu: vec![16, 64] });
        assert_eq!(plan.adopt, [(ClusterId(1), "i-a".to_owned())]);
        let terminated: Vec<&str> = plan.terminate.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(terminated, ["i-b", "i-bad"]);
        assert_eq!(plan.request, [Rpu(64)]);
        assert_eq!(plan.next_cluster, ClusterId(5));
    }

    #[test]
    fn resource_names_are_readable_and_long_ones_are_shortened_with_a_hash() {
        assert_eq!(resource_name("slogate", "prod", "Dash_Boards", ClusterId(3)), "slogate-prod-dash-boards-c3");
        assert_eq!(resource_name("", "", "7pool", ClusterId(0)), "s-7pool-c0");
        let long = resource_name("slogate", "production-eu-west", &"analytics".repeat(8), ClusterId(12));
        assert_eq!(long.len(), NAME_LEN_MAX);
        assert!(long.starts_with("slogate-production-eu-west-analytics"), "{long}");
        assert!(long.ends_with("-c12"), "{long}");
    }

    #[test]
    fn a_parked_resource_of_the_wanted_size_is_reused_before_a_nearer_one_to_resize() {
        assert_eq!(pick_parked(&[Rpu(64), Rpu(16), Rpu(32)], Rpu(32)), Some(2));
        assert_eq!(pick_parked(&[Rpu(128), Rpu(16)], Rpu(32)), Some(1));
        assert_eq!(pick_parked(&[], Rpu(32)), None);
    }

    proptest! {
        #[test]
        fn the_parked_resource_picked_needs_the_smallest_resize(
            parked in proptest::collection::vec(prop_oneof![Just(8u32), Just(16), Just(32), Just(64), Just(128)], 0..6),
            want in prop_oneof![Just(8u32), Just(16), Just(32), Just(64), Just(128)],
        ) {
            let sizes: Vec<Rpu> = parked.iter().map(|&s| Rpu(s)).collect();
            match pick_parked(&sizes, Rpu(want)) {
                None => prop_assert!(sizes.is_empty()),
                Some(i) => {
                    let picked = sizes[i].0;
                    for other in &sizes {
                        prop_assert!(picked.abs_diff(want) <= other.0.abs_diff(want), "{picked} picked over {} for {want}", other.0);
                        if other.0.abs_diff(want) == picked.abs_diff(want) {
                            prop_assert!(picked <= other.0, "ties go to the smaller");
                        }
                    }
                }
            }
        }

        #[test]
        fn resource_names_are_valid_everywhere_and_distinct_per_cluster(
            prefix in "[a-zA-Z0-9_ -]{0,20}",
            deployment in "[a-zA-Z0-9_.:-]{0,40}",
            pool in "[a-zA-Z0-9_. -]{0,80}",
            a in 0u32..100_000,
            b in 0u32..100_000,
        ) {
            let name = resource_name(&prefix, &deployment, &pool, ClusterId(a));
            prop_assert!(name.len() <= NAME_LEN_MAX, "{name}");
            prop_assert!(name.starts_with(|c: char| c.is_ascii_lowercase()), "{name}");
            prop_assert!(name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{name}");
            prop_assert!(!name.contains("--") && !name.ends_with('-'), "{name}");
            if a != b {
                prop_assert_ne!(name, resource_name(&prefix, &deployment, &pool, ClusterId(b)));
            }
        }

        #[test]
        fn reconciliation_is_complete_exact_and_keeps_no_duplicate(
            found in proptest::collection::vec((0usize..2, 0u32..5, prop_oneof![Just(8u32), Just(16), Just(32)], 0usize..5), 0..10),
            want in proptest::collection::vec(prop_oneof![Just(8u32), Just(16), Just(32)], 0..5),
        ) {
            let states = [ResourceState::Creating, ResourceState::Available, ResourceState::Paused, ResourceState::Deleting, ResourceState::Failed];
            let pools = ["p", "q"];
            let listed: Vec<Listed> = found
                .iter()
                .enumerate()
                .map(|(i, &(pool, cluster, size, state))| listed(&format!("r{i}"), pools[pool], cluster, size, states[state]))
                .collect();
            let mut want_sorted = want.clone();
            want_sorted.sort_unstable();
            let want = Layout { sizes_rpu: want_sorted };
            let plan = reconcile("d", "p", &listed, &want);
            let adopted: Vec<&str> = plan.adopt.iter().map(|(_, id)| id.as_str()).collect();
            for resource in &listed {
                let id = resource.resource_id.as_str();
                let kept = adopted.contains(&id);
                let dropped = plan.terminate.iter().any(|(t, _)| t == id);
                if resource.owner.pool != "p" {
                    prop_assert!(!kept && !dropped, "another pool's resource was touched");
                } else if resource.state == ResourceState::Deleting {
                    prop_assert!(!kept && !dropped, "a deleting resource is left to finish");
                } else {
                    prop_assert!(kept != dropped, "{id} is neither or both adopted and terminated");
                }
                if resource.owner.pool == "p" {
                    prop_assert!(plan.next_cluster.0 > resource.owner.cluster.0);
                }
            }
            // No cluster id adopted twice.
            let mut ids: Vec<ClusterId> = plan.adopt.iter().map(|(c, _)| *c).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), plan.adopt.len());
            // Adopted plus requested is the wanted layout.
            let mut sizes: Vec<u32> = plan
                .adopt
                .iter()
                .map(|(_, id)| listed.iter().find(|r| &r.resource_id == id).unwrap().owner.size.0)
                .chain(plan.request.iter().map(|s| s.0))
                .collect();
            sizes.sort_unstable();
            prop_assert_eq!(sizes, want.sizes_rpu.clone());
            // Available first: no creating or paused resource is adopted
            // while an available one of its size is terminated as unneeded.
            for (id, why) in &plan.terminate {
                let gone = listed.iter().find(|r| &r.resource_id == id).unwrap();
                if gone.state == ResourceState::Available && why.contains("layout") {
                    let lesser_kept = plan.adopt.iter().any(|(_, a)| {
                        let kept = listed.iter().find(|r| &r.resource_id == a).unwrap();
                        kept.state != ResourceState::Available && kept.owner.size == gone.owner.size
                    });
                    prop_assert!(!lesser_kept, "an available resource went while a lesser one of its size stayed");
                }
            }
        }
    }
}
