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
//! - (E) A touch is O(1) (expected: one hash lookup), whatever the
//!   capacity.

use std::collections::HashMap;
use std::hash::Hash;

/// No neighbour in the recency list.
const NIL: u32 = u32::MAX;

/// A held key and its neighbours in the recency list (slab indices).
#[derive(Clone, Debug)]
struct Entry<K> {
    key: K,
    older: u32,
    newer: u32,
}

/// See the module docs. A touch is O(1): a hash lookup and a move to the
/// newest end of a doubly linked list kept in a slab, whose slots are
/// reused by eviction (it never shrinks or frees).
#[derive(Clone, Debug)]
pub struct RecentKeys<K> {
    capacity: usize,
    index: HashMap<K, u32>,
    entries: Vec<Entry<K>>,
    oldest: u32,
    newest: u32,
    evicted: u64,
}

impl<K: Clone + Eq + Hash> RecentKeys<K> {
    /// An empty set holding at most `capacity` keys (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, NIL as usize);
        RecentKeys { capacity, index: HashMap::new(), entries: Vec::new(), oldest: NIL, newest: NIL, evicted: 0 }
    }

    /// Marks `key` as seen now; returns the key evicted to make room for
    /// it, if any.
    pub fn touch(&mut self, key: &K) -> Option<K> {
        if let Some(&at) = self.index.get(key) {
            if at != self.newest {
                self.unlink(at);
                self.push_newest(at);
            }
            return None;
        }
        if self.entries.len() < self.capacity {
            let at = self.entries.len() as u32;
            self.entries.push(Entry { key: key.clone(), older: NIL, newer: NIL });
            self.index.insert(key.clone(), at);
            self.push_newest(at);
            return None;
        }
        // Full: the oldest entry's slot takes the new key.
        let at = self.oldest;
        self.unlink(at);
        let evicted = std::mem::replace(&mut self.entries[at as usize].key, key.clone());
        self.index.remove(&evicted);
        self.index.insert(key.clone(), at);
        self.push_newest(at);
        self.evicted += 1;
        Some(evicted)
    }

    /// Takes entry `at` out of the recency list.
    fn unlink(&mut self, at: u32) {
        let Entry { older, newer, .. } = self.entries[at as usize];
        match older {
            NIL => self.oldest = newer,
            older => self.entries[older as usize].newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            newer => self.entries[newer as usize].older = older,
        }
    }

    /// Puts entry `at` (unlinked) at the newest end.
    fn push_newest(&mut self, at: u32) {
        let entry = &mut self.entries[at as usize];
        entry.older = self.newest;
        entry.newer = NIL;
        match self.newest {
            NIL => self.oldest = at,
            newest => self.entries[newest as usize].newer = at,
        }
        self.newest = at;
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: &K) -> bool {
        self.index.contains_key(key)
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
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
