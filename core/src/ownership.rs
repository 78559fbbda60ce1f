//! Which router node owns which pool: rendezvous hashing over the live
//! members, and the lease arithmetic that fences an owner that lost touch.
//!
//! Pools are sharded across the nodes of a deployment (DESIGN.md,
//! "Scale-out"). A pool's owner is the first live member in rendezvous
//! (highest-random-weight) order for the pool's name; the coordination
//! service (etcd) then binds the claim to the owner's lease. This module
//! holds the decisions and no IO: the node's membership task feeds it the
//! members it read and the instants at which it asked for lease renewals.
//!
//! # Properties (tested by property tests)
//!
//! - **Deterministic and stable:** the order depends only on the pool's
//!   name and the set of member ids, not on their listing order, process,
//!   platform or release (the hash is defined here, FNV-1a then a
//!   SplitMix64 finish, never std's randomised `DefaultHasher`).
//! - **Minimal movement:** when a member leaves, only the pools it owned
//!   move; when one joins, pools move only to it.
//! - **Balance:** over many pools, each of n members owns about 1/n.
//! - **Fencing:** a lease is held until `ttl` after the *send* time of the
//!   last renewal the server acknowledged. The server keeps the lease at
//!   least `ttl` after it *received* that renewal, which is later; so a
//!   holder stops deciding before the server can hand its pools to anyone
//!   else, whatever the network delay (clock rates assumed equal over a
//!   TTL).

/// A member's weight for a pool: a stable 64-bit hash of both names.
pub fn weight(pool: &str, member: &str) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = FNV_OFFSET;
    // A separator that cannot occur in UTF-8 keeps ("ab", "c") and
    // ("a", "bc") apart.
    for byte in pool.as_bytes().iter().chain([0xff].iter()).chain(member.as_bytes()) {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    splitmix64(hash)
}

/// SplitMix64's finaliser: spreads FNV's weak low bits over the word.
fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `members` in rendezvous order for `pool`: highest weight first, ties
/// (equal weights) broken by the member id, so the order is total.
pub fn rendezvous_order<'a>(pool: &str, members: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    let mut ranked: Vec<(u64, &str)> = members.into_iter().map(|member| (weight(pool, member), member)).collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked.into_iter().map(|(_, member)| member).collect()
}

/// The owner of `pool` among `members`: the first in rendezvous order, or
/// `None` when there is no member.
pub fn owner<'a>(pool: &str, members: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    members.into_iter().map(|member| (weight(pool, member), member)).max_by(|a, b| a.0.cmp(&b.0).then_with(|| b.1.cmp(a.1))).map(|(_, m)| m)
}

/// A lease as its holder sees it, in seconds on the holder's monotonic
/// clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LeaseView {
    /// The lease's time to live as the server granted it.
    pub ttl_s: f64,
    /// When the holder sent the last request the server acknowledged with
    /// a live lease (the grant or a renewal).
    pub acknowledged_sent_at_s: f64,
}

impl LeaseView {
    /// A lease granted for `ttl_s` by a request sent at `sent_at_s`.
    pub fn granted(ttl_s: f64, sent_at_s: f64) -> LeaseView {
        LeaseView { ttl_s, acknowledged_sent_at_s: sent_at_s }
    }

    /// Records a renewal sent at `sent_at_s` that the server acknowledged
    /// with `ttl_s` left. An acknowledgement of an older request never
    /// moves the expiry back.
    pub fn renewed(&mut self, sent_at_s: f64, ttl_s: f64) {
        if sent_at_s >= self.acknowledged_sent_at_s {
            self.acknowledged_sent_at_s = sent_at_s;
            self.ttl_s = ttl_s;
        }
    }

    /// The last instant at which the holder may still act as the lease's
    /// owner, `margin_s` before the earliest moment the server could
    /// expire it.
    pub fn valid_until_s(&self, margin_s: f64) -> f64 {
        self.acknowledged_sent_at_s + self.ttl_s - margin_s
    }

    /// Whether the holder may act at `now_s`.
    pub fn holds_at(&self, now_s: f64, margin_s: f64) -> bool {
        now_s < self.valid_until_s(margin_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn names(count: usize) -> Vec<String> {
        (0..count).map(|i| format!("node-{i}")).collect()
    }

    #[test]
    fn weights_are_pinned_across_releases() {
        // A change of hash would move every pool in a rolling upgrade.
        // (Values from an independent Python rendering of the same hash.)
        assert_eq!(weight("default", "node-0"), 14_059_451_156_971_113_924);
        assert_eq!(weight("default", "node-1"), 9_114_548_524_412_245_280);
        assert_eq!(weight("default", "node-2"), 2_807_198_146_690_622_301);
        assert_ne!(weight("ab", "c"), weight("a", "bc"));
        assert_eq!(rendezvous_order("default", ["node-2", "node-0", "node-1"]), ["node-0", "node-1", "node-2"]);
        assert_eq!(owner("default", ["node-2", "node-0", "node-1"]), Some("node-0"));
    }

    #[test]
    fn no_member_means_no_owner() {
        assert_eq!(owner("p", std::iter::empty()), None);
        assert!(rendezvous_order("p", std::iter::empty()).is_empty());
    }

    #[test]
    fn pools_spread_about_evenly_over_members() {
        let members = names(3);
        let mut owned = [0usize; 3];
        for pool in 0..3_000 {
            let owner = owner(&format!("pool-{pool}"), members.iter().map(String::as_str)).unwrap();
            owned[members.iter().position(|m| m == owner).unwrap()] += 1;
        }
        for count in owned {
            assert!((850..=1_150).contains(&count), "{owned:?}");
        }
    }

    #[test]
    fn a_lease_is_held_until_ttl_after_the_last_acknowledged_send() {
        let mut lease = LeaseView::granted(3.0, 10.0);
        assert!(lease.holds_at(12.9, 0.0));
        assert!(!lease.holds_at(13.0, 0.0));
        assert!(!lease.holds_at(12.6, 0.5));
        lease.renewed(12.0, 3.0);
        assert!(lease.holds_at(14.9, 0.0));
        // A late acknowledgement of an older renewal changes nothing.
        lease.renewed(11.0, 3.0);
        assert_eq!(lease.valid_until_s(0.0), 15.0);
    }

    proptest! {
        #[test]
        fn order_ignores_listing_order(pool in "[a-z]{1,8}", count in 1usize..8, rotate in 0usize..8) {
            let members = names(count);
            let mut shuffled = members.clone();
            shuffled.rotate_left(rotate % count);
            shuffled.reverse();
            let a = rendezvous_order(&pool, members.iter().map(String::as_str));
            let b = rendezvous_order(&pool, shuffled.iter().map(String::as_str));
            prop_assert_eq!(&a, &b);
            prop_assert_eq!(owner(&pool, shuffled.iter().map(String::as_str)), Some(a[0]));
        }

        #[test]
        fn a_leaving_member_moves_only_its_own_pools(pool in "[a-z0-9-]{1,12}", count in 2usize..8, leaving in 0usize..8) {
            let members = names(count);
            let leaving = &members[leaving % count];
            let before = owner(&pool, members.iter().map(String::as_str)).unwrap();
            let after = owner(&pool, members.iter().filter(|m| *m != leaving).map(String::as_str)).unwrap();
            if before != leaving {
                prop_assert_eq!(before, after);
            } else {
                // The next in rendezvous order takes it.
                let order = rendezvous_order(&pool, members.iter().map(String::as_str));
                prop_assert_eq!(after, order[1]);
            }
        }

        #[test]
        fn a_joining_member_takes_pools_only_for_itself(pool in "[a-z0-9-]{1,12}", count in 1usize..8) {
            let members = names(count + 1);
            let (old, joining) = members.split_at(count);
            let before = owner(&pool, old.iter().map(String::as_str)).unwrap();
            let after = owner(&pool, members.iter().map(String::as_str)).unwrap();
            prop_assert!(after == before || after == joining[0].as_str());
        }

        #[test]
        fn a_lease_never_outlives_its_server_side_expiry(
            ttl_s in 1.0f64..30.0,
            sends in proptest::collection::vec((0.0f64..5.0, 0.0f64..2.0), 1..20),
        ) {
            // Each renewal is sent `gap` after the previous and reaches the
            // server `delay` later; the server's expiry is ttl after
            // receipt, so always at or after the holder's.
            let mut lease = LeaseView::granted(ttl_s, 0.0);
            let mut server_expiry = ttl_s;
            let mut sent = 0.0;
            for (gap, delay) in sends {
                sent += gap;
                if sent + delay < server_expiry {
                    lease.renewed(sent, ttl_s);
                    server_expiry = server_expiry.max(sent + delay + ttl_s);
                }
                prop_assert!(lease.valid_until_s(0.0) <= server_expiry);
            }
        }
    }
}
