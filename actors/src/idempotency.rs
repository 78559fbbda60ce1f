//! Idempotency records: what a retried client query id is answered from.
//!
//! A record is keyed by `(tenant, client query id)` within its pool, and
//! holds the request's [`RequestDigest`] and its outcome (without result
//! rows). The RouterShard keeps each pool's [`IdempotencyTable`] in memory
//! and sends every new record to the Reservoir, which writes it to sled; a
//! node loads the records at start, so a retry after a restart is answered,
//! not run again.
//!
//! # Guarantees
//!
//! - (A) A retry whose content matches its first submission is answered
//!   with the first one's outcome while the record is kept: for
//!   `retention` after the query finished, among the newest `kept` records
//!   of its pool, and, across a restart or a crash, once the record was
//!   flushed (the Reservoir flushes every `flush_every` updates and at least
//!   once a second). While the first is still running, the retry waits for
//!   the same outcome.
//! - (B) A retry whose content differs is refused, naming the first field
//!   that differs; it never gets another request's reply.
//! - (C) Tenants never share records: the same id from two tenants is two
//!   queries.
//! - (D) Memory holds at most `kept` records per pool, in a table of fixed
//!   capacity made at start (16 bytes a slot, two slots a record, plus the
//!   records): it never grows or rehashes.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use slogate_core::model::{PoolId, TemplateId};

use crate::router::SubmitOutcome;

/// What a retry must repeat: its template, SLO, SQL text and the rest of
/// the request (labels, payload), the last two as 64-bit FNV-1a digests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestDigest {
    /// The template or the SQL text's fingerprint.
    pub template: TemplateId,
    /// The SLO, milliseconds.
    pub slo_ms: u64,
    /// The SQL text's digest (0 without text).
    pub sql: u64,
    /// The labels' and payload's digest.
    pub rest: u64,
}

impl RequestDigest {
    /// The first field in which `retry` differs from `self`, if any.
    pub fn mismatch(&self, retry: &RequestDigest) -> Option<&'static str> {
        if self.template != retry.template {
            Some("template")
        } else if self.sql != retry.sql {
            Some("sql")
        } else if self.slo_ms != retry.slo_ms {
            Some("slo_ms")
        } else if self.rest != retry.rest {
            Some("labels or payload")
        } else {
            None
        }
    }
}

/// 64-bit FNV-1a over `parts`, each length-prefixed so that no two
/// sequences of parts collide by concatenation.
pub fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for part in parts {
        eat(&(part.len() as u64).to_le_bytes());
        eat(part);
    }
    hash
}

/// One finished query as its retries see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IdempotencyRecord {
    /// The pool.
    pub pool: PoolId,
    /// The tenant (empty without tenants).
    pub tenant: String,
    /// The client's query id.
    pub client_query_id: String,
    /// The first submission's content.
    pub digest: RequestDigest,
    /// When it finished, seconds since the Unix epoch.
    pub finished_unix_s: f64,
    /// Its outcome, without result rows.
    pub outcome: SubmitOutcome,
}

impl IdempotencyRecord {
    /// The store's key: pool, tenant and id, NUL-separated (none of them
    /// holds a NUL: pool names and query ids are validated, tenant names
    /// come from the config).
    pub fn key(&self) -> Vec<u8> {
        [self.pool.0.as_bytes(), self.tenant.as_bytes(), self.client_query_id.as_bytes()].join(&0u8)
    }
}

/// A record's key in memory: a keyed (SipHash, per table) 64-bit hash of
/// its tenant and id. Lookups check the record's own tenant and id, so a
/// collision (about 10⁻¹⁰ at 100,000 records, and not one a client can
/// aim for) can only make a record miss, never answer another query.
type Key = u64;

/// A hash table of fixed capacity: linear probing over a power-of-two
/// array kept at most half full, with backward-shift deletion, so it holds
/// no tombstones and never rehashes or grows. Keys are uniform hashes
/// already; their low bits pick the home slot.
struct FixedTable {
    slots: Vec<Option<(Key, Arc<IdempotencyRecord>)>>,
    mask: usize,
    len: usize,
}

impl FixedTable {
    /// Room for `capacity` records.
    fn new(capacity: usize) -> Self {
        let size = (capacity.max(1) * 2).next_power_of_two();
        FixedTable { slots: (0..size).map(|_| None).collect(), mask: size - 1, len: 0 }
    }

    fn home(&self, key: Key) -> usize {
        key as usize & self.mask
    }

    fn find(&self, key: Key) -> Option<usize> {
        let mut at = self.home(key);
        loop {
            match &self.slots[at] {
                None => return None,
                Some((k, _)) if *k == key => return Some(at),
                Some(_) => at = (at + 1) & self.mask,
            }
        }
    }

    fn get(&self, key: Key) -> Option<&IdempotencyRecord> {
        self.find(key).and_then(|at| self.slots[at].as_ref()).map(|(_, record)| &**record)
    }

    /// Inserts `record`; `true` when it replaced one with its key. The
    /// caller keeps `len` within the capacity.
    fn insert(&mut self, key: Key, record: Arc<IdempotencyRecord>) -> bool {
        if let Some(at) = self.find(key) {
            self.slots[at] = Some((key, record));
            return true;
        }
        assert!(self.len < self.slots.len() / 2 + 1, "a FixedTable holds at most its capacity");
        let mut at = self.home(key);
        while self.slots[at].is_some() {
            at = (at + 1) & self.mask;
        }
        self.slots[at] = Some((key, record));
        self.len += 1;
        false
    }

    fn remove(&mut self, key: Key) {
        let Some(mut hole) = self.find(key) else { return };
        self.slots[hole] = None;
        self.len -= 1;
        // Shift back every entry of the run after the hole that may live
        // there: one whose home is not cyclically in (hole, at].
        let mut at = hole;
        loop {
            at = (at + 1) & self.mask;
            let Some((k, _)) = &self.slots[at] else { return };
            let home = self.home(*k);
            let stays = if hole <= at { hole < home && home <= at } else { hole < home || home <= at };
            if !stays {
                self.slots[hole] = self.slots[at].take();
                hole = at;
            }
        }
    }
}

/// One pool's records in memory (see the module docs). Its capacity is
/// fixed at `kept` when it is made (a `FixedTable`): an insert never
/// rehashes (a rehash at 100,000 records stalled the routing thread for
/// 15–30 ms), and a lookup allocates nothing.
pub struct IdempotencyTable {
    records: FixedTable,
    /// Keys in the order they were inserted (finish order), each with its
    /// record's finish time: expiry is read here, not from the record (a
    /// cold one, at the far end of the table).
    order: VecDeque<(Key, f64)>,
    hasher: std::hash::RandomState,
    kept: usize,
    retention_s: f64,
}

impl std::fmt::Debug for IdempotencyTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyTable").field("records", &self.records.len).field("kept", &self.kept).field("retention_s", &self.retention_s).finish()
    }
}

impl IdempotencyTable {
    /// An empty table keeping at most `kept` records for `retention_s`.
    pub fn new(kept: usize, retention_s: f64) -> Self {
        let kept = kept.max(1);
        IdempotencyTable {
            records: FixedTable::new(kept + 1),
            order: VecDeque::with_capacity(kept + 1),
            hasher: std::hash::RandomState::new(),
            kept,
            retention_s,
        }
    }

    fn key(&self, tenant: &str, client_query_id: &str) -> Key {
        use std::hash::BuildHasher;
        self.hasher.hash_one((tenant, client_query_id))
    }

    /// The live record for `(tenant, id)` at `now_unix_s`.
    pub fn get(&self, tenant: &str, client_query_id: &str, now_unix_s: f64) -> Option<&IdempotencyRecord> {
        self.records
            .get(self.key(tenant, client_query_id))
            .filter(|r| r.tenant == tenant && r.client_query_id == client_query_id && now_unix_s - r.finished_unix_s <= self.retention_s)
    }

    /// Adds `record` (shared with the log writer, or not), replacing one
    /// with its key, and drops the oldest past `kept` and any past
    /// retention at `now_unix_s`.
    pub fn insert(&mut self, record: impl Into<Arc<IdempotencyRecord>>, now_unix_s: f64) {
        let record = record.into();
        let key = self.key(&record.tenant, &record.client_query_id);
        let finished_unix_s = record.finished_unix_s;
        if self.records.insert(key, record) {
            self.order.retain(|(k, _)| *k != key);
        }
        self.order.push_back((key, finished_unix_s));
        while let Some(&(_, finished_unix_s)) = self.order.front() {
            let expired = now_unix_s - finished_unix_s > self.retention_s;
            if self.order.len() <= self.kept && !expired {
                break;
            }
            let (oldest, _) = self.order.pop_front().expect("checked non-empty");
            self.records.remove(oldest);
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.records.len == 0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::router::SubmitStatus;
    use slogate_core::model::QueryId;
    use slogate_core::time::Duration;

    fn record(tenant: &str, id: &str, finished_unix_s: f64) -> IdempotencyRecord {
        IdempotencyRecord {
            pool: PoolId::default(),
            tenant: tenant.into(),
            client_query_id: id.into(),
            digest: RequestDigest { template: TemplateId(4), slo_ms: 1_000, sql: 0, rest: 7 },
            finished_unix_s,
            outcome: SubmitOutcome {
                client_query_id: id.into(),
                query: QueryId(1),
                status: SubmitStatus::Completed,
                target: None,
                latency: Duration::from_secs(1),
                slo_met: true,
                explanation: "".into(),
                predicted: None,
                backend_wall: std::time::Duration::ZERO,
                sqlstate: None,
                result: None,
                execution: None,
            },
        }
    }

    #[test]
    fn a_mismatch_names_the_first_field_that_differs() {
        let first = RequestDigest { template: TemplateId(4), slo_ms: 1_000, sql: 0, rest: 7 };
        assert_eq!(first.mismatch(&first), None);
        assert_eq!(first.mismatch(&RequestDigest { template: TemplateId(5), ..first }), Some("template"));
        assert_eq!(first.mismatch(&RequestDigest { slo_ms: 9, ..first }), Some("slo_ms"));
        assert_eq!(first.mismatch(&RequestDigest { rest: 8, ..first }), Some("labels or payload"));
    }

    #[test]
    fn digests_of_split_parts_do_not_collide_by_concatenation() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"ab", b"c"]));
    }

    #[test]
    fn records_expire_after_retention_and_tenants_do_not_share_them() {
        let mut table = IdempotencyTable::new(10, 100.0);
        table.insert(record("a", "q", 1_000.0), 1_000.0);
        assert!(table.get("a", "q", 1_050.0).is_some());
        assert!(table.get("b", "q", 1_050.0).is_none());
        assert!(table.get("a", "q", 1_101.0).is_none());
        table.insert(record("a", "r", 1_200.0), 1_200.0);
        assert_eq!(table.len(), 1, "the expired record is dropped on the next insert");
    }

    proptest! {
        /// (D): never more than `kept` records, in the capacity it was
        /// made with, and the newest stays.
        #[test]
        fn the_table_holds_at_most_kept_records_and_keeps_the_newest(kept in 1usize..20, ids in proptest::collection::vec(0u32..40, 1..200)) {
            let mut table = IdempotencyTable::new(kept, 1e9);
            let slots = table.records.slots.len();
            for (i, id) in ids.iter().enumerate() {
                table.insert(record("", &id.to_string(), i as f64), i as f64);
                prop_assert!(table.len() <= kept);
                prop_assert_eq!(table.order.len(), table.len());
                prop_assert_eq!(table.records.slots.len(), slots, "the table never grows");
            }
            let last = ids.last().unwrap().to_string();
            prop_assert!(table.get("", &last, ids.len() as f64).is_some());
        }

        /// The fixed table answers as a map would under any inserts and
        /// removals, keys clustered into few home slots included.
        #[test]
        fn the_fixed_table_behaves_as_a_map(ops in proptest::collection::vec((any::<bool>(), 0u64..24, 0u64..4), 1..400)) {
            let mut table = FixedTable::new(12);
            let mut model = std::collections::HashMap::new();
            for (insert, low, high) in ops {
                // Keys share a few home slots at the end of the 32, so runs wrap
                // around and shift back across the end.
                let key = (high << 40) | ((28 + low % 8) & 31) | ((low / 8) << 20);
                if insert && (model.len() < 12 || model.contains_key(&key)) {
                    let id = format!("{key}-{}", model.len());
                    prop_assert_eq!(table.insert(key, Arc::new(record("", &id, 0.0))), model.insert(key, id).is_some());
                } else {
                    table.remove(key);
                    model.remove(&key);
                }
                prop_assert_eq!(table.len, model.len());
                for (key, id) in &model {
                    prop_assert_eq!(table.get(*key).map(|r| r.client_query_id.as_str()), Some(id.as_str()));
                }
            }
        }
    }
}
