//! A bounded set of keys ordered by when each was last seen: the guard for
//! every map keyed by something a client chooses (templates, fingerprints).
//!
//! A structure that keeps data per template also keeps a [`RecentKeys`] of
//! its templates, touches it on every use, and deletes the data of the key
//! [`RecentKeys::touch`] hands back. Its memory is then bounded by the
//! capacity, whatever a client sends.
//!
//! # Properties
//!
//! - (A) It never holds more than its capacity (at least 1).
//! - (B) The key evicted is the least recently touched one.
//! - (C) A key touched again moves to the most recent place and is not
//!   evicted until `capacity` other keys have been touched after it.
//! - (D) [`RecentKeys::evicted`] counts every key handed back.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;

/// See the module docs.
#[derive(Clone, Debug)]
pub struct RecentKeys<K> {
    capacity: usize,
    tick: u64,
    last_seen: HashMap<K, u64>,
    by_age: BTreeMap<u64, K>,
    evicted: u64,
}

impl<K: Clone + Eq + Hash> RecentKeys<K> {
    /// An empty set holding at most `capacity` keys (at least 1).
    pub fn new(capacity: usize) -> Self {
        RecentKeys { capacity: capacity.max(1), tick: 0, last_seen: HashMap::new(), by_age: BTreeMap::new(), evicted: 0 }
    }

    /// Marks `key` as seen now; returns the key evicted to make room for
    /// it, if any.
    pub fn touch(&mut self, key: &K) -> Option<K> {
        self.tick += 1;
        if let Some(seen) = self.last_seen.get_mut(key) {
            self.by_age.remove(seen);
            *seen = self.tick;
            self.by_age.insert(self.tick, key.clone());
            return None;
        }
        let evicted = if self.last_seen.len() >= self.capacity {
            let (_, oldest) = self.by_age.pop_first().expect("a full set has an oldest key");
            self.last_seen.remove(&oldest);
            self.evicted += 1;
            Some(oldest)
        } else {
            None
        };
        self.last_seen.insert(key.clone(), self.tick);
        self.by_age.insert(self.tick, key.clone());
        evicted
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &K) -> bool {
        self.last_seen.contains_key(key)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.last_seen.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.last_seen.is_empty()
    }

    /// The most it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Keys evicted so far.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn it_stays_bounded_and_evicts_the_least_recently_touched(capacity in 1usize..8, keys in proptest::collection::vec(0u8..16, 0..200)) {
            let mut set = RecentKeys::new(capacity);
            // A model: keys, most recent last.
            let mut model: Vec<u8> = Vec::new();
            let mut evictions = 0;
            for key in keys {
                let expected = if let Some(i) = model.iter().position(|&k| k == key) {
                    model.remove(i);
                    None
                } else if model.len() == capacity {
                    evictions += 1;
                    Some(model.remove(0))
                } else {
                    None
                };
                model.push(key);
                prop_assert_eq!(set.touch(&key), expected);
                prop_assert!(set.len() <= capacity);
                prop_assert_eq!(set.len(), model.len());
                prop_assert!(set.contains(&key));
            }
            prop_assert_eq!(set.evicted(), evictions);
        }
    }

    #[test]
    fn a_key_touched_again_outlives_keys_touched_once_before_it() {
        let mut set = RecentKeys::new(2);
        assert_eq!(set.touch(&1), None);
        assert_eq!(set.touch(&2), None);
        assert_eq!(set.touch(&1), None);
        assert_eq!(set.touch(&3), Some(2));
        assert!(set.contains(&1) && set.contains(&3));
        assert_eq!(set.evicted(), 1);
    }
}
