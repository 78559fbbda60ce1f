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
//! [`route`] says where a member sends a pool's queries and [`step`] what
//! it does about its claims at each poll: the node's membership task only
//! carries them out.
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
//! - **Claims:** a member claims only an unclaimed pool it is first for,
//!   under a live lease; it releases only a pool it holds and is no longer
//!   first for, never in the poll that starts the drain, and only once
//!   drained or after the longest drain.
//! - **Routing:** a member routes a pool only if it claimed it and may
//!   route it; otherwise it sends the queries to another live member.
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

/// Where a member sends a pool's queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// This member routes them.
    Local,
    /// To this member: the pool's owner, or (when no live owner is known
    /// or this member may not route a pool it claimed) the next live member
    /// in rendezvous order, which refuses unless it owns the pool by then.
    Remote(&'a str),
    /// Nowhere yet: no other live member.
    Unowned,
}

/// Where `me` sends `pool`'s queries, given the member that claimed the
/// pool, the live members, and whether `me` may route a pool it claimed
/// now (its lease holds and it is not handing the pool over).
pub fn route<'a>(pool: &str, me: &str, claimed_by: Option<&'a str>, live: &[&'a str], may_route_here: bool) -> Route<'a> {
    match claimed_by {
        Some(owner) if owner == me && may_route_here => return Route::Local,
        Some(owner) if owner != me && live.contains(&owner) => return Route::Remote(owner),
        _ => {}
    }
    match owner(pool, live.iter().copied().filter(|member| *member != me)) {
        Some(next) => Route::Remote(next),
        None => Route::Unowned,
    }
}

/// What a member does about one pool at one poll of the membership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Claim it: nobody has, it is first in rendezvous order for the pool,
    /// and its lease holds.
    Claim,
    /// It holds the pool but another live member is first now: take no new
    /// queries of the pool and wait for the running ones.
    Drain,
    /// Let the claim go: drained (or waited long enough).
    Release,
    /// It was handing the pool over, but is first again: keep it.
    Keep,
    /// Nothing to do.
    Nothing,
}

/// One pool as a member sees it at a poll.
#[derive(Clone, Copy, Debug)]
pub struct PoolSeen<'a> {
    /// The pool.
    pub pool: &'a str,
    /// The member deciding.
    pub me: &'a str,
    /// Who claimed the pool, if anyone.
    pub claimed_by: Option<&'a str>,
    /// Whether its lease holds now.
    pub lease_holds: bool,
    /// Since when it has been draining the pool, if it is.
    pub draining_since_s: Option<f64>,
    /// Its queries of the pool still running, counted after the drain was
    /// announced.
    pub in_flight: usize,
    /// Now.
    pub now_s: f64,
    /// The longest a drain waits.
    pub drain_max_s: f64,
}

/// What `seen.me` does about `seen.pool`, with `live` the live members.
///
/// A drain starts one poll before any release, so that queries admitted
/// before the drain was announced are counted in `in_flight` when the
/// release is decided.
pub fn step(seen: &PoolSeen<'_>, live: &[&str]) -> Step {
    let first = owner(seen.pool, live.iter().copied());
    let mine = first == Some(seen.me);
    match seen.claimed_by {
        None if mine && seen.lease_holds => Step::Claim,
        Some(claimed) if claimed == seen.me && !mine && first.is_some() => match seen.draining_since_s {
            None => Step::Drain,
            Some(since) if seen.in_flight == 0 || seen.now_s - since >= seen.drain_max_s => Step::Release,
            Some(_) => Step::Drain,
        },
        Some(claimed) if claimed == seen.me && mine && seen.draining_since_s.is_some() => Step::Keep,
        _ => Step::Nothing,
    }
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

    #[test]
    fn a_member_routes_what_it_claimed_and_sends_the_rest_to_the_owner_or_the_next_in_order() {
        let live = ["node-0", "node-1", "node-2"];
        assert_eq!(route("default", "node-0", Some("node-0"), &live, true), Route::Local);
        assert_eq!(route("default", "node-1", Some("node-0"), &live, true), Route::Remote("node-0"));
        // Claimed here but the lease lapsed: the next in order other than me.
        assert_eq!(route("default", "node-0", Some("node-0"), &live, false), Route::Remote("node-1"));
        // Claimed by a member that is gone: the next in order.
        assert_eq!(route("default", "node-1", Some("node-9"), &live, true), Route::Remote("node-0"));
        assert_eq!(route("default", "node-0", None, &["node-0"], true), Route::Unowned);
    }

    #[test]
    fn a_drain_waits_for_running_queries_or_its_longest_wait() {
        let live = ["node-0", "node-1"];
        // node-1 holds "default", but node-0 is first for it.
        let seen = |since: Option<f64>, in_flight, now_s| PoolSeen {
            pool: "default",
            me: "node-1",
            claimed_by: Some("node-1"),
            lease_holds: true,
            draining_since_s: since,
            in_flight,
            now_s,
            drain_max_s: 30.0,
        };
        assert_eq!(step(&seen(None, 0, 10.0), &live), Step::Drain, "never released in the poll that starts the drain");
        assert_eq!(step(&seen(Some(10.0), 3, 11.0), &live), Step::Drain);
        assert_eq!(step(&seen(Some(10.0), 0, 11.0), &live), Step::Release);
        assert_eq!(step(&seen(Some(10.0), 3, 40.0), &live), Step::Release);
        // node-0 left: node-1 is first again and keeps the pool.
        assert_eq!(step(&seen(Some(10.0), 3, 11.0), &["node-1"]), Step::Keep);
    }

    proptest! {
        #[test]
        fn claims_and_releases_follow_rendezvous_order_and_the_lease(
            pool in "[a-z]{1,6}",
            count in 1usize..5,
            me in 0usize..5,
            claimed in proptest::option::of(0usize..6),
            lease_holds: bool,
            since in proptest::option::of(0.0f64..100.0),
            in_flight in 0usize..3,
            now_s in 0.0f64..200.0,
        ) {
            let members = names(count);
            let live: Vec<&str> = members.iter().map(String::as_str).collect();
            let me = live[me % count];
            let claimed_name = claimed.map(|i| format!("node-{i}"));
            let seen = PoolSeen {
                pool: &pool,
                me,
                claimed_by: claimed_name.as_deref(),
                lease_holds,
                draining_since_s: since,
                in_flight,
                now_s,
                drain_max_s: 30.0,
            };
            let first = owner(&pool, live.iter().copied());
            match step(&seen, &live) {
                Step::Claim => prop_assert!(seen.claimed_by.is_none() && first == Some(me) && lease_holds),
                Step::Drain | Step::Release => prop_assert!(seen.claimed_by == Some(me) && first != Some(me)),
                Step::Keep => prop_assert!(seen.claimed_by == Some(me) && first == Some(me)),
                Step::Nothing => {}
            }
            if step(&seen, &live) == Step::Release {
                let since = since.expect("a release follows a drain");
                prop_assert!(in_flight == 0 || now_s - since >= 30.0);
            }
            match route(&pool, me, seen.claimed_by, &live, lease_holds) {
                Route::Local => prop_assert!(seen.claimed_by == Some(me) && lease_holds),
                Route::Remote(other) => prop_assert!(other != me && live.contains(&other)),
                Route::Unowned => prop_assert_eq!(count, 1),
            }
        }

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
