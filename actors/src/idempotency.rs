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
//! - (D) Memory holds at most `kept` records per pool.

use std::collections::{HashMap, VecDeque};

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

type Key = (String, String);

/// One pool's records in memory (see the module docs).
#[derive(Debug)]
pub struct IdempotencyTable {
    records: HashMap<Key, IdempotencyRecord>,
    /// Keys in the order they were inserted (finish order).
    order: VecDeque<Key>,
    kept: usize,
    retention_s: f64,
}

impl IdempotencyTable {
    /// An empty table keeping at most `kept` records for `retention_s`.
    pub fn new(kept: usize, retention_s: f64) -> Self {
        IdempotencyTable { records: HashMap::new(), order: VecDeque::new(), kept: kept.max(1), retention_s }
    }

    /// The live record for `(tenant, id)` at `now_unix_s`.
    pub fn get(&self, tenant: &str, client_query_id: &str, now_unix_s: f64) -> Option<&IdempotencyRecord> {
        self.records
            .get(&(tenant.to_owned(), client_query_id.to_owned()))
            .filter(|r| now_unix_s - r.finished_unix_s <= self.retention_s)
    }

    /// Adds `record`, replacing one with its key, and drops the oldest past
    /// `kept` and any past retention at `now_unix_s`.
    pub fn insert(&mut self, record: IdempotencyRecord, now_unix_s: f64) {
        let key = (record.tenant.clone(), record.client_query_id.clone());
        if self.records.insert(key.clone(), record).is_some() {
            self.order.retain(|k| *k != key);
        }
        self.order.push_back(key);
        while let Some(oldest) = self.order.front() {
            let expired = self.records.get(oldest).is_none_or(|r| now_unix_s - r.finished_unix_s > self.retention_s);
            if self.order.len() <= self.kept && !expired {
                break;
            }
            let oldest = self.order.pop_front().expect("checked non-empty");
            self.records.remove(&oldest);
        }
    }

    /// Records held.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
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
                explanation: String::new(),
                predicted: None,
                backend_wall: std::time::Duration::ZERO,
                sqlstate: None,
                result: None,
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
        /// (D): never more than `kept` records, and the newest stays.
        #[test]
        fn the_table_holds_at_most_kept_records_and_keeps_the_newest(kept in 1usize..20, ids in proptest::collection::vec(0u32..40, 1..200)) {
            let mut table = IdempotencyTable::new(kept, 1e9);
            for (i, id) in ids.iter().enumerate() {
                table.insert(record("", &id.to_string(), i as f64), i as f64);
                prop_assert!(table.len() <= kept);
                prop_assert_eq!(table.order.len(), table.len());
            }
            let last = ids.last().unwrap().to_string();
            prop_assert!(table.get("", &last, ids.len() as f64).is_some());
        }
    }
}
