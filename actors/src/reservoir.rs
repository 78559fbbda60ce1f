//! The Reservoir actor: [`slogate_core::reservoir::Reservoir`] persisted in
//! sled, plus the execution log the predictor trains on and the finished
//! queries' idempotency records, in segment logs beside it.
//!
//! Storage sits behind [`ReservoirStore`] so sled can be swapped (redb is
//! the maintained alternative). The sled layout:
//!
//! | tree | key | value |
//! | --- | --- | --- |
//! | `totals` | day (i32 BE, sign-flipped), hour (u8), chunk (u16 BE) | up to 6 KiB of the hour's [`HourRow`]: arrivals, each template's count, sampled offsets |
//!
//! The two logs are not in sled but in segment logs ([`crate::segments`])
//! in the store's directory, a frame per batch of up to 6 KiB of JSON (a
//! "row" in the counts below):
//!
//! | directory | frame payload |
//! | --- | --- |
//! | `executions-log` | logged time (f64 BE), JSON array of [`ExecutionRecord`] |
//! | `idempotency-log` | newest finish (f64 BE), JSON array of [`IdempotencyRecord`] |
//!
//! A log is a sequence appended at its end and dropped from its front,
//! which is what segment files do cheaply (a write per flush; a deleted
//! file per megabyte pruned) and a tree does not (in sled every insert and
//! every delete updated a page, and the idempotency log alone cost a fifth
//! of a least-loaded node's CPU per query). Every frame carries a CRC and
//! is checked as the store opens; a segment that ends in a partial frame
//! (a write a crash tore) is cut back to its last whole frame, and frames
//! lost before that count against the manifest like any other rows.
//!
//! **Group commit.** Nothing is written per query. The actor buffers the
//! executions and idempotency records, and notes the hours with new
//! arrivals; at every flush (every `flush_every` updates, at least once a
//! second, and before any read) it appends each buffer to its log in one
//! write and rewrites each noted hour's row from the in-memory tables.
//! (Three to six sled inserts per query had cost about 60 µs of the
//! reservoir's thread at 10,000 queries/s, more than routing it.) An older
//! store's rows move when it opens: its `executions` tree (batches, and
//! single-record rows from before them, with 8-byte keys and a value of
//! the logged time then the JSON record, or JSON alone) into the execution
//! log; its `idempotency_log` tree, and the `idempotency` and
//! `idempotency_by_time` trees from before it, into the idempotency log;
//! its `counts` and `samples` trees, a row per count and per sample, into
//! hour rows.
//!
//! The log keeps the newest [`Retention::executions_kept_max`] executions,
//! none logged longer than [`Retention::execution_age_max_s`] ago, pruned
//! a batch at a time, so up to a batch more stay; the idempotency records
//! likewise, in the order written (the order they finished, to within a
//! flush); and the hours of arrival history older than
//! [`Retention::history_s`] before the latest arrival.
//!
//! **Pruning keeps up at any write rate.** Every second each table is
//! pruned by up to [`prune_budget`] rows: twice the rows written to it
//! since the previous prune, and at least 20,000. So each prune deletes
//! at least as many rows as arrived since the last, plus part of any
//! backlog: the rows beyond a bound never grow from one prune to the next,
//! whatever the write rate (a fixed batch was outpaced at 5,000 queries/s
//! and let the log grow to 1.2 M rows over a bound of 5,000).
//!
//! **Damage detection.** Next to sled's files the store keeps a manifest
//! (`slogate-manifest.json`, checksummed, written atomically) with the rows
//! of each tree at the last flush. Rows only grow between flushes, and a
//! deletion lowers the manifest before it happens, so the manifest is a
//! lower bound of what an intact store holds. [`SledStore::open_with`]
//! compares: fewer rows, a missing or unreadable manifest for a store with
//! rows, or a store sled cannot open is [`Error::DamagedStore`] unless
//! [`StoreOptions::repair`] is set, and a repair reports what it dropped.
//!
//! Writes are applied as they come and flushed to disk every
//! `flush_every` updates, at least once a second while anything is
//! unflushed, and on [`Flush`]; what was flushed survives a crash, so a
//! `kill -9` loses at most the last second. The logs sync at most every
//! [`LOG_SYNC_INTERVAL`] of those flushes, and at least once a second while
//! they hold unsynced records (a process killed loses nothing it wrote,
//! which the kernel holds; a machine that loses power loses up to the
//! last second of them).

use std::path::Path;

use actix::prelude::*;
use serde::Serialize;
use slogate_core::model::TemplateId;
use slogate_core::reservoir::{CalendarHour, ExecutionRecord, Reservoir, ReservoirConfig};

use crate::idempotency::IdempotencyRecord;
use crate::segments::SegmentLog;
use crate::{Error, Result};

/// Rows loaded back from storage.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StoredTables {
    /// Count table rows.
    pub counts: Vec<((CalendarHour, TemplateId), u64)>,
    /// Arrival totals per hour.
    pub totals: Vec<(CalendarHour, u64)>,
    /// Arrival sample slots.
    pub samples: Vec<((CalendarHour, u32), u16)>,
    /// Executions logged.
    pub executions: u64,
}

/// One hour of arrival history as the store keeps it: a row per hour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HourRow {
    /// The hour.
    pub hour: CalendarHour,
    /// Arrivals in it.
    pub total: u64,
    /// Each template's count (at least one: the hour had an arrival).
    pub counts: Vec<(TemplateId, u64)>,
    /// The sampled offsets, by slot.
    pub samples: Vec<u16>,
}

impl HourRow {
    /// `hour` of `reservoir`, or `None` once it holds no arrivals there.
    pub fn of(reservoir: &Reservoir, hour: CalendarHour) -> Option<HourRow> {
        let (total, samples) = reservoir.arrivals_in(hour);
        (total > 0).then(|| HourRow { hour, total, counts: reservoir.counts_in(hour).collect(), samples: samples.to_vec() })
    }

    /// The value: the total (u64 BE), the counts (u32 BE, then template
    /// u32 BE and count u64 BE each), then the offsets (u16 BE each). Only
    /// an older store's rows are 8 bytes long: the total alone.
    fn encode(&self) -> Vec<u8> {
        let mut value = Vec::with_capacity(12 + self.counts.len() * 12 + self.samples.len() * 2);
        value.extend_from_slice(&self.total.to_be_bytes());
        value.extend_from_slice(&(self.counts.len() as u32).to_be_bytes());
        for &(template, count) in &self.counts {
            value.extend_from_slice(&template.0.to_be_bytes());
            value.extend_from_slice(&count.to_be_bytes());
        }
        for offset in &self.samples {
            value.extend_from_slice(&offset.to_be_bytes());
        }
        value
    }

    fn decode(hour: CalendarHour, value: &[u8]) -> Result<HourRow> {
        let bad = || Error::CorruptStore("hour row");
        let total = u64::from_be_bytes(value.get(..8).and_then(|b| b.try_into().ok()).ok_or_else(bad)?);
        let counts_len = u32::from_be_bytes(value.get(8..12).and_then(|b| b.try_into().ok()).ok_or_else(bad)?) as usize;
        let samples_at = counts_len.checked_mul(12).and_then(|n| n.checked_add(12)).filter(|&at| at <= value.len()).ok_or_else(bad)?;
        if (value.len() - samples_at) % 2 != 0 {
            return Err(bad());
        }
        let counts = value[12..samples_at]
            .chunks_exact(12)
            .map(|c| (TemplateId(u32::from_be_bytes(c[..4].try_into().expect("4 bytes"))), u64::from_be_bytes(c[4..].try_into().expect("8 bytes"))))
            .collect();
        let samples = value[samples_at..].chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
        Ok(HourRow { hour, total, counts, samples })
    }
}

/// Where the reservoir lives.
pub trait ReservoirStore: Send {
    /// Writes each hour's row, replacing what it held.
    fn put_hours(&mut self, hours: &[HourRow]) -> Result<()>;
    /// Appends `records`, logged at `logged_unix_s`, to the log as one
    /// row (a batch).
    fn append_executions(&mut self, records: &[ExecutionRecord], logged_unix_s: f64) -> Result<()>;
    /// Deletes the oldest logged executions beyond the newest `kept_max`
    /// and those logged before `logged_before_unix_s`, whole batches of
    /// them, stopping once it has deleted `batch_max`; returns how many it
    /// deleted. At least `kept_max` stay (while the log holds that many).
    fn prune_executions(&mut self, kept_max: u64, logged_before_unix_s: f64, batch_max: usize) -> Result<u64>;
    /// Deletes the count, total and sample rows of the hours before
    /// `cutoff`, at most `batch_max` rows; returns how many.
    fn delete_hours_before(&mut self, cutoff: CalendarHour, batch_max: usize) -> Result<u64>;
    /// Reads every stored row.
    fn load(&self) -> Result<StoredTables>;
    /// Reads the last `limit` logged executions, oldest first (by
    /// sequence number, which only grows but may skip).
    fn recent_executions(&self, limit: usize) -> Result<Vec<ExecutionRecord>>;
    /// Writes idempotency records as one row (a batch); a record read back
    /// replaces any earlier one with its key.
    fn put_idempotency(&mut self, records: &[std::sync::Arc<IdempotencyRecord>]) -> Result<()>;
    /// Reads every idempotency record finished at or after
    /// `since_unix_s`, oldest first (the older ones are
    /// [`ReservoirStore::prune_idempotency`]'s to delete).
    fn idempotency_records(&self, since_unix_s: f64) -> Result<Vec<IdempotencyRecord>>;
    /// Deletes the idempotency records written first beyond the newest
    /// `kept_max`, and those of batches that all finished before
    /// `finished_before_unix_s`, whole batches, stopping once it has
    /// deleted `batch_max`; returns how many.
    fn prune_idempotency(&mut self, kept_max: u64, finished_before_unix_s: f64, batch_max: usize) -> Result<u64>;
    /// Makes everything written so far durable, but for the logs'
    /// records of the last [`LOG_SYNC_INTERVAL`], which
    /// [`ReservoirStore::sync_logs`] makes durable.
    fn flush(&self) -> Result<()>;

    /// Makes the executions and idempotency records written so far
    /// durable, if any are not yet.
    fn sync_logs(&self) -> Result<()> {
        Ok(())
    }

    /// Bytes the store takes on disk.
    fn size_on_disk(&self) -> Result<u64>;
}

/// How [`SledStore::open_with`] opens a store.
#[derive(Clone, Debug, PartialEq)]
pub struct StoreOptions {
    /// sled's page cache, bytes (sled's own default is 1 GiB).
    pub cache_bytes: u64,
    /// Open a damaged store anyway, keeping what is left and saying what
    /// was dropped ([`SledStore::repair_report`]), instead of failing.
    pub repair: bool,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions { cache_bytes: 64 << 20, repair: false }
    }
}

/// Rows per tree: what the manifest promises and what a store holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowCounts {
    /// `counts` rows.
    pub counts: u64,
    /// `totals` rows.
    pub totals: u64,
    /// `samples` rows.
    pub samples: u64,
    /// `executions` rows.
    pub executions: u64,
    /// `idempotency` rows.
    pub idempotency: u64,
}

impl RowCounts {
    /// The rows (frames) of `table`'s log.
    fn of_log(&mut self, table: LogTable) -> &mut u64 {
        match table {
            LogTable::Executions => &mut self.executions,
            LogTable::Idempotency => &mut self.idempotency,
        }
    }

    fn named(&self) -> [(&'static str, u64); 5] {
        [
            ("counts", self.counts),
            ("totals", self.totals),
            ("samples", self.samples),
            ("executions", self.executions),
            ("idempotency", self.idempotency),
        ]
    }

    fn checksum(&self) -> u64 {
        let text = self.named().iter().map(|(name, rows)| format!("{name}={rows};")).collect::<String>();
        crate::idempotency::fnv1a(&[MANIFEST_FORMAT.as_bytes(), text.as_bytes()])
    }
}

/// What a repair found and dropped.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RepairReport {
    /// What was wrong.
    pub damage: String,
    /// Rows the manifest promised, per tree (zero where it was unreadable).
    pub expected: RowCounts,
    /// Rows kept, per tree.
    pub kept: RowCounts,
    /// Rows that did not decode and were deleted, per tree.
    pub undecodable_deleted: RowCounts,
    /// Where an unopenable store was moved before starting empty.
    pub moved_to: Option<String>,
}

/// The manifest: the rows the store held at its last successful flush.
/// Rows only grow between flushes, and deletions lower the manifest before
/// they happen, so a store with fewer rows than its manifest lost data.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Manifest {
    format: String,
    rows: RowCounts,
    /// FNV-1a of the format and rows, hex: a torn or edited manifest is
    /// damage too.
    checksum: String,
}

const MANIFEST_FORMAT: &str = "slogate-reservoir-1";
const MANIFEST_FILE: &str = "slogate-manifest.json";

/// The sled-backed store. See the module docs.
pub struct SledStore {
    db: sled::Db,
    dir: std::path::PathBuf,
    counts: sled::Tree,
    totals: sled::Tree,
    samples: sled::Tree,
    /// The execution log: segment files in `EXECUTIONS_DIR`, a frame per
    /// batch.
    executions: SegmentLog,
    /// The idempotency records: segment files in `IDEMPOTENCY_DIR`, a
    /// frame per batch.
    idempotency: SegmentLog,
    /// Records in the two logs' frames (each holds a batch).
    records: Records,
    rows: RowCounts,
    /// When the manifest was last written: flushes rewrite it at most
    /// once per [`MANIFEST_INTERVAL`] (a stale manifest is still a valid
    /// lower bound, it only detects less).
    manifest_written: std::cell::Cell<Option<std::time::Instant>>,
    /// Whether the store passed its check (or was repaired): until then
    /// nothing may rewrite the manifest, or a damaged store dropped on its
    /// way to the error would bless itself for the next open.
    checked: bool,
    repair_report: Option<RepairReport>,
}

/// Records the logs hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Records {
    executions: u64,
    idempotency: u64,
}

impl Records {
    fn of(&self, table: LogTable) -> u64 {
        match table {
            LogTable::Executions => self.executions,
            LogTable::Idempotency => self.idempotency,
        }
    }
}

/// The longest a flush leaves the manifest behind.
const MANIFEST_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

fn hour_key(hour: CalendarHour) -> [u8; 5] {
    // Flip the sign bit so negative days sort before positive ones.
    let day = (hour.day as u32 ^ 0x8000_0000).to_be_bytes();
    [day[0], day[1], day[2], day[3], hour.hour]
}

/// An hour row's chunk key: the hour, then the chunk's index (u16 BE).
fn hour_chunk_key(hour: CalendarHour, index: usize) -> [u8; 7] {
    let key = hour_key(hour);
    let index = u16::try_from(index).expect("an hour row is under 400 MB").to_be_bytes();
    [key[0], key[1], key[2], key[3], key[4], index[0], index[1]]
}

fn parse_hour(key: &[u8]) -> Result<CalendarHour> {
    let bytes: [u8; 4] = key.get(0..4).and_then(|b| b.try_into().ok()).ok_or(Error::CorruptStore("short hour key"))?;
    let hour = *key.get(4).ok_or(Error::CorruptStore("short hour key"))?;
    Ok(CalendarHour { day: (u32::from_be_bytes(bytes) ^ 0x8000_0000) as i32, hour })
}

fn u64_value(bytes: &[u8]) -> Result<u64> {
    Ok(u64::from_be_bytes(bytes.try_into().map_err(|_| Error::CorruptStore("u64 value"))?))
}

fn template_suffix(key: &[u8], what: &'static str) -> Result<u32> {
    Ok(u32::from_be_bytes(key.get(5..9).and_then(|b| b.try_into().ok()).ok_or(Error::CorruptStore(what))?))
}

/// The records a row of an older store's batched tree holds, from its
/// key (a sequence number, u64 BE, then the records, u32 BE); single-record
/// execution rows from before batches have 8-byte keys.
fn batch_records(key: &[u8]) -> Result<u64> {
    match key.len() {
        8 => Ok(1),
        12 => Ok(u64::from(u32::from_be_bytes(key[8..].try_into().expect("four bytes")))),
        _ => Err(Error::CorruptStore("batch key")),
    }
}

/// The most JSON a batch row holds, bytes. sled 0.34 writes a page over
/// a quarter of its 512 KiB segment as a separate blob file, and a leaf
/// page holds up to 17 rows: rows of 100 KB made every page a blob, and
/// blob files outlived their pages (a release soak grew the store 26 MB a
/// minute). Rows of at most 6 KiB keep a full leaf under the threshold.
const ROW_JSON_BYTES_MAX: usize = 6 << 10;

/// `records` cut into batch rows: each row's range of records and its
/// value, `header` bytes (zeros, for the caller to fill in place) then the
/// records' JSON array, at most [`ROW_JSON_BYTES_MAX`] of JSON unless one
/// record alone is larger.
fn json_rows<T: Serialize>(records: &[T], header: usize) -> Vec<(std::ops::Range<usize>, Vec<u8>)> {
    let fresh = || {
        let mut row = vec![0; header];
        row.push(b'[');
        row
    };
    let mut rows = Vec::new();
    let (mut start, mut row) = (0, fresh());
    for (i, record) in records.iter().enumerate() {
        // Each record is written straight into the row; one that takes it
        // past the bound moves to the next row.
        let at = row.len();
        if i > start {
            row.push(b',');
        }
        serde_json::to_writer(&mut row, record).expect("records serialise");
        if i > start && row.len() - header + 1 > ROW_JSON_BYTES_MAX {
            let mut next = fresh();
            next.extend_from_slice(&row[at + 1..]);
            row.truncate(at);
            row.push(b']');
            rows.push((start..i, std::mem::replace(&mut row, next)));
            start = i;
        }
    }
    if start < records.len() {
        row.push(b']');
        rows.push((start..records.len(), row));
    }
    rows
}

/// `records` as one row: `header` zero bytes, then their JSON array.
fn json_row<T: Serialize>(records: &[T], header: usize) -> Vec<u8> {
    let mut row = vec![0; header];
    serde_json::to_writer(&mut row, records).expect("records serialise");
    row
}

/// Marks an execution batch's value (no single-record value starts with
/// it: those start with `{` or a positive time's first byte).
const EXECUTION_BATCH: u8 = 0xB7;

/// The bytes before an execution frame's JSON: the time it was logged.
const LOGGED_HEADER: usize = 8;

/// An execution frame's payload: the time it was logged (f64 bits, BE),
/// then the records' JSON array; written into the header `row` leaves
/// for it.
fn logged_frame(mut row: Vec<u8>, logged_unix_s: f64) -> Vec<u8> {
    row[..LOGGED_HEADER].copy_from_slice(&logged_unix_s.to_bits().to_be_bytes());
    row
}

/// `records`, logged at `logged_unix_s`, as execution frames (record
/// count, payload) of up to 6 KiB of JSON each.
fn execution_frames(records: &[ExecutionRecord], logged_unix_s: f64) -> Vec<(u32, Vec<u8>)> {
    json_rows(records, LOGGED_HEADER).into_iter().map(|(range, row)| (range.len() as u32, logged_frame(row, logged_unix_s))).collect()
}

/// An execution frame's records.
fn parse_logged_executions(payload: &[u8]) -> Result<Vec<ExecutionRecord>> {
    serde_json::from_slice(payload.get(LOGGED_HEADER..).ok_or(Error::CorruptStore("execution frame"))?).map_err(|_| Error::CorruptStore("execution frame"))
}

fn f64_at(value: &[u8], at: usize) -> Option<f64> {
    let bytes: [u8; 8] = value.get(at..at + 8)?.try_into().ok()?;
    Some(f64::from_bits(u64::from_be_bytes(bytes)))
}

/// When an execution row was logged, without decoding its records;
/// `None` for rows written before the time was kept.
fn logged_time(value: &[u8]) -> Option<f64> {
    match value.first() {
        Some(b'{') => None,
        Some(&EXECUTION_BATCH) => f64_at(value, 1),
        _ => f64_at(value, 0),
    }
}

/// An execution row's records: a batch, or one record from before.
fn parse_executions(value: &[u8]) -> Result<Vec<ExecutionRecord>> {
    let bad = |_| Error::CorruptStore("execution record");
    match value.first() {
        Some(b'{') => Ok(vec![serde_json::from_slice(value).map_err(bad)?]),
        Some(&EXECUTION_BATCH) => serde_json::from_slice(value.get(9..).ok_or(Error::CorruptStore("execution batch"))?).map_err(bad),
        _ => Ok(vec![serde_json::from_slice(value.get(8..).ok_or(Error::CorruptStore("execution record"))?).map_err(bad)?]),
    }
}

/// The bytes before an idempotency batch's JSON: its newest finish.
const IDEMPOTENCY_HEADER: usize = 8;

/// An idempotency batch's value: the newest of its records' `finishes`
/// (f64 bits, BE), then their JSON array; written into the header `row`
/// leaves for it.
fn idempotency_batch_value(finishes: impl Iterator<Item = f64>, mut row: Vec<u8>) -> Vec<u8> {
    let newest = finishes.fold(f64::NEG_INFINITY, f64::max);
    row[..IDEMPOTENCY_HEADER].copy_from_slice(&newest.to_bits().to_be_bytes());
    row
}

/// `records` as idempotency frames (record count, payload) of up to 6 KiB
/// of JSON each.
fn idempotency_frames(records: &[std::sync::Arc<IdempotencyRecord>]) -> Vec<(u32, Vec<u8>)> {
    json_rows(records, IDEMPOTENCY_HEADER)
        .into_iter()
        .map(|(range, row)| (range.len() as u32, idempotency_batch_value(records[range].iter().map(|r| r.finished_unix_s), row)))
        .collect()
}

fn parse_idempotency(value: &[u8]) -> Result<Vec<IdempotencyRecord>> {
    serde_json::from_slice(value.get(8..).ok_or(Error::CorruptStore("idempotency batch"))?).map_err(|_| Error::CorruptStore("idempotency batch"))
}

/// The trees of an older store's idempotency records: one row per record,
/// and its index by finish time.
const LEGACY_IDEMPOTENCY: &str = "idempotency";
const LEGACY_IDEMPOTENCY_INDEX: &str = "idempotency_by_time";

/// The sled tree that held the idempotency batches before
/// `IDEMPOTENCY_DIR` (a row per batch, as a frame now holds one).
const SLED_IDEMPOTENCY: &str = "idempotency_log";

/// The idempotency log's directory, in the store's.
const IDEMPOTENCY_DIR: &str = "idempotency-log";

/// The execution log's directory, in the store's.
const EXECUTIONS_DIR: &str = "executions-log";

/// The sled tree that held the execution batches before `EXECUTIONS_DIR`.
const SLED_EXECUTIONS: &str = "executions";

/// The logs sync at most this often on a flush (and whenever the manifest
/// is written, and at least once a second while they hold unsynced
/// records: the actor's tick). A sync per flush (every 256 updates) was a
/// quarter of the Reservoir's thread at 35,000 queries/s: ext4 commits
/// the file's new length with every one.
pub const LOG_SYNC_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// The hour rows are rewritten at most this often by the flushes every
/// `flush_every` updates (and on the tick, a [`Flush`] and at the end):
/// the current hour's row is kilobytes, and rewriting it at every flush
/// kept sled's writer threads busy. Arrival history reaches the disk
/// within a second, as the module docs promise.
const HOUR_ROWS_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a write-out writes the hour rows now or when they are due
/// ([`HOUR_ROWS_INTERVAL`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hours {
    Now,
    WhenDue,
}

/// One of the store's segment logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LogTable {
    Executions,
    Idempotency,
}


/// How long [`SledStore::open`] waits for a previous owner (this process's
/// last node, or one that just died) to release the store's file lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How often sled's flusher thread wakes: it flushes, then spends up to
/// half the interval relocating live pages from segments to be reclaimed.
const SLED_FLUSHER_INTERVAL_MS: u64 = 200;

/// Runs `open` again while it fails on sled's file lock, for up to 5 s:
/// sled's IO threads let go of a closed store's lock shortly after it is
/// dropped, and a node restarting in the same process (or a tool opening
/// a store a node just closed) would otherwise fail at once.
pub fn when_unlocked<T>(mut open: impl FnMut() -> std::result::Result<T, sled::Error>) -> std::result::Result<T, sled::Error> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match open() {
            Err(sled::Error::Io(e)) if is_lock_error(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            result => return result,
        }
    }
}

fn open_when_unlocked(dir: &Path, cache_bytes: u64) -> std::result::Result<sled::Db, sled::Error> {
    when_unlocked(|| {
        // sled reclaims a mostly-dead segment by moving its live pages
        // elsewhere: one page per page replacement, and as many as its
        // background flusher can move in half of each interval. Without the
        // flusher, segments pinned by pages that are rarely replaced stay
        // allocated and the file grows under a constant row count. The
        // actor still flushes on its own schedule for durability; dropping
        // the store joins the flusher, so the lock is released promptly.
        let config = sled::Config::new()
            .path(dir)
            .cache_capacity(cache_bytes)
            .mode(sled::Mode::LowSpace)
            .flush_every_ms(Some(SLED_FLUSHER_INTERVAL_MS));
        // sled 0.34 can panic instead of failing on some damaged logs
        // ("tried to serialize Uninitialized" while it rewrites a snapshot).
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open())).unwrap_or_else(|panic| {
            let reason = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned());
            Err(sled::Error::Unsupported(format!("sled panicked opening it: {}", reason.unwrap_or_else(|| "no message".into()))))
        })
    })
}

fn is_lock_error(error: &std::io::Error) -> bool {
    error.to_string().contains("could not acquire lock")
}

impl SledStore {
    /// Opens (or creates) the store in `dir` with the default
    /// [`StoreOptions`]: damage is an error.
    pub fn open(dir: &Path) -> Result<SledStore> {
        SledStore::open_with(dir, &StoreOptions::default())
    }

    /// Opens (or creates) the store in `dir`, waiting up to 5 s for a
    /// previous owner to release it, and checks it against its manifest.
    /// A store with fewer rows than its last flush promised, an unreadable
    /// manifest, a manifest missing from a store that holds rows, or a
    /// store sled cannot open is [`Error::DamagedStore`], unless
    /// `options.repair`, which keeps what is left, deletes rows that do not
    /// decode, and reports it.
    pub fn open_with(dir: &Path, options: &StoreOptions) -> Result<SledStore> {
        let damaged = |reason: String| Error::DamagedStore { dir: dir.display().to_string(), reason };
        let (db, moved_to) = match open_when_unlocked(dir, options.cache_bytes) {
            Ok(db) => (db, None),
            Err(sled::Error::Io(e)) if is_lock_error(&e) => return Err(sled::Error::Io(e).into()),
            Err(e) if !options.repair => return Err(damaged(format!("sled cannot open it ({e})"))),
            Err(e) => {
                let aside = dir.with_extension(format!("damaged-{}", crate::clock::unix_now_s() as u64));
                std::fs::rename(dir, &aside).map_err(|io| damaged(format!("sled cannot open it ({e}), nor can it be moved aside ({io})")))?;
                let db = open_when_unlocked(dir, options.cache_bytes)?;
                (db, Some((e.to_string(), aside.display().to_string())))
            }
        };
        let mut store = SledStore {
            counts: db.open_tree("counts")?,
            totals: db.open_tree("totals")?,
            samples: db.open_tree("samples")?,
            executions: SegmentLog::open(&dir.join(EXECUTIONS_DIR))?,
            idempotency: SegmentLog::open(&dir.join(IDEMPOTENCY_DIR))?,
            dir: dir.to_path_buf(),
            db,
            records: Records::default(),
            rows: RowCounts::default(),
            manifest_written: std::cell::Cell::new(None),
            checked: false,
            repair_report: None,
        };
        store.rows = store.count_rows();
        let expected = match moved_to {
            Some((error, aside)) => {
                store.repair_report = Some(RepairReport {
                    damage: format!("sled could not open the store: {error}"),
                    expected: RowCounts::default(),
                    kept: RowCounts::default(),
                    undecodable_deleted: RowCounts::default(),
                    moved_to: Some(aside),
                });
                store.checked = true;
                store.write_manifest(store.rows)?;
                return Ok(store);
            }
            None => store.read_manifest(),
        };
        let damage = match expected {
            Ok(Some(expected)) => {
                let short: Vec<String> = expected
                    .named()
                    .iter()
                    .zip(store.rows.named())
                    .filter(|((_, promised), (_, found))| found < promised)
                    .map(|((name, promised), (_, found))| format!("{name}: {found} rows where the last flush left {promised}"))
                    .collect();
                if short.is_empty() { None } else { Some((short.join(", "), expected)) }
            }
            Ok(None) if store.rows == RowCounts::default() => None,
            Ok(None) => Some((format!("its manifest ({MANIFEST_FILE}) is missing but it holds rows"), RowCounts::default())),
            Err(reason) => Some((reason, RowCounts::default())),
        };
        match damage {
            None => {}
            Some((reason, _)) if !options.repair => return Err(damaged(reason)),
            Some((reason, expected)) => {
                let undecodable_deleted = store.delete_undecodable()?;
                store.rows = store.count_rows();
                store.repair_report = Some(RepairReport { damage: reason, expected, kept: store.rows, undecodable_deleted, moved_to: None });
            }
        }
        store.checked = true;
        // A write torn by a crash after the last flush, or what a repair
        // gives up on: appends go after the last checked frame.
        for log in [&mut store.executions, &mut store.idempotency] {
            for tail in log.tails() {
                tracing::warn!(message = "A log segment ended in a partial frame; it is cut back to its last whole one.", path = %tail.path.display(), kept_bytes = tail.good_bytes, file_bytes = tail.file_bytes, newest = tail.newest);
            }
            log.cut_tails()?;
        }
        store.migrate_history()?;
        store.migrate_executions()?;
        store.migrate_idempotency()?;
        store.records = store.count_records()?;
        store.db.flush()?;
        store.write_manifest(store.rows)?;
        Ok(store)
    }

    /// What [`StoreOptions::repair`] found and dropped; `None` when the
    /// store was intact.
    pub fn repair_report(&self) -> Option<&RepairReport> {
        self.repair_report.as_ref()
    }

    /// Rows held now, per tree.
    pub fn rows(&self) -> RowCounts {
        self.rows
    }

    /// Rows per table: the logs' frames, and an older store's rows in the
    /// sled trees they move out of, which its manifest promised.
    fn count_rows(&self) -> RowCounts {
        let older = [LEGACY_IDEMPOTENCY, SLED_IDEMPOTENCY].iter().map(|name| self.existing_tree(name).map_or(0, |tree| tree.len() as u64)).sum::<u64>();
        RowCounts {
            counts: self.counts.len() as u64,
            totals: self.totals.len() as u64,
            samples: self.samples.len() as u64,
            executions: self.executions.frames() + self.existing_tree(SLED_EXECUTIONS).map_or(0, |tree| tree.len() as u64),
            idempotency: self.idempotency.frames() + older,
        }
    }

    /// The tree `name`, if the store has one (opening a tree creates it).
    fn existing_tree(&self, name: &str) -> Option<sled::Tree> {
        self.db.tree_names().iter().any(|n| n.as_ref() == name.as_bytes()).then(|| self.db.open_tree(name).ok()).flatten()
    }

    /// Records in the batched trees, from their keys.
    fn count_records(&self) -> Result<Records> {
        Ok(Records { executions: self.executions.records(), idempotency: self.idempotency.records() })
    }

    fn manifest_path(&self) -> std::path::PathBuf {
        self.dir.join(MANIFEST_FILE)
    }

    /// `Ok(None)`: no manifest. `Err`: one that cannot be trusted.
    fn read_manifest(&self) -> std::result::Result<Option<RowCounts>, String> {
        let text = match std::fs::read(self.manifest_path()) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("its manifest cannot be read ({e})")),
        };
        let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| format!("its manifest does not parse ({e})"))?;
        if manifest.format != MANIFEST_FORMAT {
            return Err(format!("its manifest has format `{}`, expected `{MANIFEST_FORMAT}`", manifest.format));
        }
        if manifest.checksum != format!("{:016x}", manifest.rows.checksum()) {
            return Err("its manifest's checksum does not match its contents".into());
        }
        Ok(Some(manifest.rows))
    }

    /// Writes the manifest atomically: a temporary file, synced, renamed
    /// over the old one.
    fn write_manifest(&self, rows: RowCounts) -> Result<()> {
        if !self.checked {
            return Ok(());
        }
        let manifest = Manifest { format: MANIFEST_FORMAT.into(), rows, checksum: format!("{:016x}", rows.checksum()) };
        crate::replace_file_durably(&self.manifest_path(), &serde_json::to_vec_pretty(&manifest).expect("manifests serialise"))
            .map_err(|e| Error::Storage(sled::Error::Io(e)))?;
        self.manifest_written.set(Some(std::time::Instant::now()));
        Ok(())
    }

    /// Deletes rows as every retention does: the manifest is lowered to
    /// `remaining` first (so a crash in between is not mistaken for lost
    /// data, see the module docs; the logs are synced before, so that it
    /// promises only what is on disk), then `delete` runs, then the store
    /// flushes.
    fn delete_rows(&mut self, remaining: RowCounts, delete: impl FnOnce(&mut Self) -> Result<()>) -> Result<()> {
        self.sync_logs()?;
        self.write_manifest(remaining)?;
        delete(self)?;
        self.rows = remaining;
        self.flush()
    }

    /// `table`'s log.
    fn log(&self, table: LogTable) -> &SegmentLog {
        match table {
            LogTable::Executions => &self.executions,
            LogTable::Idempotency => &self.idempotency,
        }
    }

    /// `table`'s log and the count of records it holds.
    fn log_mut(&mut self, table: LogTable) -> (&mut SegmentLog, &mut u64) {
        match table {
            LogTable::Executions => (&mut self.executions, &mut self.records.executions),
            LogTable::Idempotency => (&mut self.idempotency, &mut self.records.idempotency),
        }
    }

    /// Appends `frames` (record count, payload) to `table`'s log, counted.
    fn append_to_log(&mut self, table: LogTable, frames: Vec<(u32, Vec<u8>)>) -> Result<()> {
        let (added_frames, added_records) = (frames.len() as u64, frames.iter().map(|(n, _)| u64::from(*n)).sum::<u64>());
        let (log, records) = self.log_mut(table);
        log.append(frames)?;
        *records += added_records;
        *self.rows.of_log(table) += added_frames;
        Ok(())
    }

    /// Prunes `table`'s log as the trees were pruned: whole frames from the
    /// oldest, those stamped before `older_than` or wholly beyond the
    /// newest `kept_max` records, and at most one frame trimmed of its
    /// oldest records (`trimmed(payload, drop_first)` gives its new record
    /// count and payload), so that exactly the newest `kept_max` stay;
    /// stopping once `budget` records are planned. The manifest is lowered
    /// first (see `delete_rows`); the trimmed frame is replaced, not
    /// deleted, so the frames never dip below it. Returns the records
    /// deleted.
    fn prune_log(&mut self, table: LogTable, kept_max: u64, older_than: f64, budget: usize, trimmed: impl Fn(&[u8], usize) -> Result<(u32, Vec<u8>)>) -> Result<u64> {
        let log = self.log(table);
        let mut over = self.records.of(table).saturating_sub(kept_max);
        let (mut doomed_frames, mut doomed_records) = (0usize, 0u64);
        let mut trim = None;
        for frame in log.iter_frames() {
            if doomed_records >= budget as u64 {
                break;
            }
            let in_frame = u64::from(frame.records);
            if in_frame <= over || frame.stamp < older_than {
                over = over.saturating_sub(in_frame);
                doomed_records += in_frame;
                doomed_frames += 1;
                continue;
            }
            if over > 0 {
                trim = Some(over as usize);
            }
            break;
        }
        if doomed_frames == 0 && trim.is_none() {
            return Ok(0);
        }
        let replacement = match trim {
            Some(drop_first) => Some(trimmed(&log.payload(doomed_frames)?, drop_first)?),
            None => None,
        };
        let deleted = doomed_records + trim.map_or(0, |n| n as u64);
        let mut remaining = self.rows;
        *remaining.of_log(table) -= doomed_frames as u64;
        self.delete_rows(remaining, |store| {
            let (log, records) = store.log_mut(table);
            log.drop_front(doomed_frames, replacement)?;
            *records -= deleted;
            Ok(())
        })?;
        Ok(deleted)
    }

    /// Moves an older store's arrival history (a row per count, per total
    /// and per sample) into a row per hour in `totals`. The hour rows are
    /// written and flushed, the manifest lowered to them, and then the old
    /// rows dropped, so a crash at any point leaves a store that opens
    /// (and moves what is left again).
    fn migrate_history(&mut self) -> Result<()> {
        let whole_rows: Vec<sled::IVec> = self.totals.iter().keys().filter(|key| key.as_ref().map_or(true, |k| k.len() == 5)).collect::<sled::Result<_>>()?;
        if self.counts.is_empty() && self.samples.is_empty() && whole_rows.is_empty() {
            return Ok(());
        }
        let tables = self.load()?;
        let mut reservoir = Reservoir::new(slogate_core::reservoir::ReservoirConfig::default());
        reservoir.restore(tables.counts, tables.totals, tables.samples);
        let hours: Vec<HourRow> = reservoir.hours().filter_map(|hour| HourRow::of(&reservoir, hour)).collect();
        self.put_hours(&hours)?;
        self.db.flush()?;
        let rows = RowCounts { counts: 0, samples: 0, totals: self.totals.len() as u64 - whole_rows.len() as u64, ..self.rows };
        self.write_manifest(rows)?;
        self.rows = rows;
        self.counts.clear()?;
        self.samples.clear()?;
        for key in whole_rows {
            self.totals.remove(key)?;
        }
        self.db.flush()?;
        tracing::info!(message = "Moved the arrival history into a row per hour.", hours = hours.len());
        Ok(())
    }

    /// Moves an older store's executions (its `executions` tree: a row per
    /// batch, or a row per record from before batches) into the execution
    /// log, in the order written, each row's records with the time they
    /// were logged (a row from before that was kept: now).
    fn migrate_executions(&mut self) -> Result<()> {
        let Some(tree) = self.existing_tree(SLED_EXECUTIONS) else { return Ok(()) };
        let now = crate::clock::unix_now_s();
        let mut frames = Vec::new();
        for row in tree.iter() {
            let (_, value) = row?;
            // A repair already deleted what does not decode.
            let Ok(records) = parse_executions(&value) else { continue };
            frames.extend(execution_frames(&records, logged_time(&value).unwrap_or(now)));
        }
        drop(tree);
        self.move_into_log(LogTable::Executions, frames, &[SLED_EXECUTIONS])
    }

    /// Moves `frames`, read out of an older store's `trees`, into `table`'s
    /// log: appended and synced, the manifest set to them, then the trees
    /// dropped, so a crash at any point leaves a store that opens (and
    /// moves what is left again).
    fn move_into_log(&mut self, table: LogTable, frames: Vec<(u32, Vec<u8>)>, trees: &[&str]) -> Result<()> {
        let moved: u64 = frames.iter().map(|(n, _)| u64::from(*n)).sum();
        self.append_to_log(table, frames)?;
        let log = self.log(table);
        log.sync()?;
        let mut rows = self.rows;
        *rows.of_log(table) = log.frames();
        self.write_manifest(rows)?;
        self.rows = rows;
        for name in trees {
            self.db.drop_tree(name)?;
        }
        self.db.flush()?;
        tracing::info!(message = "Moved an older store's records into a segment log.", log = ?table, records = moved, frames = *rows.of_log(table));
        Ok(())
    }

    /// Moves an older store's idempotency records into the segment log:
    /// those of its `idempotency_log` tree (a row per batch), and before
    /// them those of an even older `idempotency` tree (a row per record,
    /// with an `idempotency_by_time` index), oldest finish first (a record
    /// moved twice by a crash in between is read once, the later copy
    /// replacing the earlier).
    fn migrate_idempotency(&mut self) -> Result<()> {
        let (batches, legacy) = (self.existing_tree(SLED_IDEMPOTENCY), self.existing_tree(LEGACY_IDEMPOTENCY));
        if batches.is_none() && legacy.is_none() && self.existing_tree(LEGACY_IDEMPOTENCY_INDEX).is_none() {
            return Ok(());
        }
        let mut records = Vec::new();
        if let Some(legacy) = &legacy {
            for row in legacy.iter() {
                let (_, value) = row?;
                // A repair already deleted what does not decode.
                if let Ok(record) = serde_json::from_slice::<IdempotencyRecord>(&value) {
                    records.push(std::sync::Arc::new(record));
                }
            }
            records.sort_by(|a, b| a.finished_unix_s.total_cmp(&b.finished_unix_s));
        }
        if let Some(batches) = &batches {
            for row in batches.iter() {
                let (_, value) = row?;
                if let Ok(batch) = parse_idempotency(&value) {
                    records.extend(batch.into_iter().map(std::sync::Arc::new));
                }
            }
        }
        drop((batches, legacy));
        self.move_into_log(LogTable::Idempotency, idempotency_frames(&records), &[SLED_IDEMPOTENCY, LEGACY_IDEMPOTENCY, LEGACY_IDEMPOTENCY_INDEX])
    }

    /// Deletes the rows of every tree that do not decode; returns how many
    /// per tree.
    fn delete_undecodable(&mut self) -> Result<RowCounts> {
        fn sweep(tree: &sled::Tree, decodes: impl Fn(&[u8], &[u8]) -> bool) -> Result<u64> {
            let mut deleted = 0;
            for row in tree.iter() {
                let (key, value) = row?;
                if !decodes(&key, &value) {
                    tree.remove(key)?;
                    deleted += 1;
                }
            }
            Ok(deleted)
        }
        Ok(RowCounts {
            counts: sweep(&self.counts, |k, v| parse_hour(k).is_ok() && template_suffix(k, "count key").is_ok() && u64_value(v).is_ok())?,
            totals: sweep(&self.totals, |k, v| {
                parse_hour(k).is_ok_and(|hour| k.len() == 7 || (k.len() == 5 && (u64_value(v).is_ok() || HourRow::decode(hour, v).is_ok())))
            })?,
            samples: sweep(&self.samples, |k, v| parse_hour(k).is_ok() && template_suffix(k, "sample key").is_ok() && v.len() == 2)?,
            // The logs' frames are checked as they open (what fails its
            // check is cut off, see `open_with`); an older store's trees
            // are swept here, before they move into them.
            executions: self.existing_tree(SLED_EXECUTIONS).map_or(Ok(0), |tree| sweep(&tree, |k, v| batch_records(k).is_ok() && parse_executions(v).is_ok()))?,
            idempotency: self.existing_tree(SLED_IDEMPOTENCY).map_or(Ok(0), |tree| sweep(&tree, |k, v| batch_records(k).is_ok() && parse_idempotency(v).is_ok()))?
                + self.existing_tree(LEGACY_IDEMPOTENCY).map_or(Ok(0), |tree| sweep(&tree, |_, v| serde_json::from_slice::<IdempotencyRecord>(v).is_ok()))?,
        })
    }
}

impl Drop for SledStore {
    fn drop(&mut self) {
        // Best effort: what was written is made durable and promised.
        if self.checked && self.db.flush().is_ok() && self.executions.sync().is_ok() && self.idempotency.sync().is_ok() {
            let _ = self.write_manifest(self.rows);
        }
    }
}

impl ReservoirStore for SledStore {
    fn put_hours(&mut self, hours: &[HourRow]) -> Result<()> {
        // An hour's encoding only grows (templates and samples are only
        // added), so its chunks are rewritten in place and none is left
        // over past the last.
        for row in hours {
            for (index, chunk) in row.encode().chunks(ROW_JSON_BYTES_MAX).enumerate() {
                if self.totals.insert(hour_chunk_key(row.hour, index), chunk)?.is_none() {
                    self.rows.totals += 1;
                }
            }
        }
        Ok(())
    }

    fn append_executions(&mut self, records: &[ExecutionRecord], logged_unix_s: f64) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.append_to_log(LogTable::Executions, execution_frames(records, logged_unix_s))
    }

    fn prune_executions(&mut self, kept_max: u64, logged_before_unix_s: f64, batch_max: usize) -> Result<u64> {
        self.prune_log(LogTable::Executions, kept_max, logged_before_unix_s, batch_max, |payload, drop_first| {
            let kept = parse_logged_executions(payload)?;
            let kept = &kept[drop_first.min(kept.len())..];
            let logged = f64_at(payload, 0).ok_or(Error::CorruptStore("execution frame"))?;
            Ok((kept.len() as u32, logged_frame(json_row(kept, LOGGED_HEADER), logged)))
        })
    }

    fn delete_hours_before(&mut self, cutoff: CalendarHour, batch_max: usize) -> Result<u64> {
        let end = hour_key(cutoff);
        let mut doomed: [Vec<sled::IVec>; 3] = Default::default();
        let mut total = 0;
        for (tree, keys) in [&self.counts, &self.totals, &self.samples].into_iter().zip(doomed.iter_mut()) {
            for row in tree.range(..end.as_slice()) {
                if total >= batch_max {
                    break;
                }
                keys.push(row?.0);
                total += 1;
            }
        }
        if total == 0 {
            return Ok(0);
        }
        let [counts, totals, samples] = doomed;
        let remaining = RowCounts {
            counts: self.rows.counts - counts.len() as u64,
            totals: self.rows.totals - totals.len() as u64,
            samples: self.rows.samples - samples.len() as u64,
            ..self.rows
        };
        self.delete_rows(remaining, |store| {
            [(&store.counts, counts), (&store.totals, totals), (&store.samples, samples)]
                .into_iter()
                .try_for_each(|(tree, keys)| keys.into_iter().try_for_each(|key| tree.remove(key).map(drop)))
                .map_err(Error::from)
        })?;
        Ok(total as u64)
    }

    fn load(&self) -> Result<StoredTables> {
        let mut tables = StoredTables::default();
        // Hour rows are chunks in key order; an hour whose first chunk is
        // gone was being pruned and is skipped.
        let mut whole: Vec<(CalendarHour, Vec<u8>)> = Vec::new();
        let mut open: Option<(CalendarHour, usize, Vec<u8>)> = None;
        for row in self.totals.iter() {
            let (key, value) = row?;
            let hour = parse_hour(&key)?;
            match key.len() {
                // An older store's total alone, or a whole hour row.
                5 if value.len() == 8 => tables.totals.push((hour, u64_value(&value)?)),
                5 => whole.push((hour, value.to_vec())),
                7 => {
                    let index = usize::from(u16::from_be_bytes([key[5], key[6]]));
                    match &mut open {
                        Some((open_hour, next, bytes)) if *open_hour == hour && *next == index => {
                            bytes.extend_from_slice(&value);
                            *next += 1;
                        }
                        _ => {
                            whole.extend(open.take().map(|(hour, _, bytes)| (hour, bytes)));
                            open = (index == 0).then(|| (hour, 1, value.to_vec()));
                        }
                    }
                }
                _ => return Err(Error::CorruptStore("hour key")),
            }
        }
        whole.extend(open.map(|(hour, _, bytes)| (hour, bytes)));
        for (hour, bytes) in whole {
            let row = HourRow::decode(hour, &bytes)?;
            tables.totals.push((hour, row.total));
            tables.counts.extend(row.counts.iter().map(|&(template, count)| ((hour, template), count)));
            tables.samples.extend(row.samples.iter().enumerate().map(|(slot, &offset)| ((hour, slot as u32), offset)));
        }
        // Rows of a store from before hour rows (moved when it opens).
        for row in self.counts.iter() {
            let (key, value) = row?;
            let template = template_suffix(&key, "count key")?;
            tables.counts.push(((parse_hour(&key)?, TemplateId(template)), u64_value(&value)?));
        }
        for row in self.samples.iter() {
            let (key, value) = row?;
            let slot = template_suffix(&key, "sample key")?;
            let offset = u16::from_be_bytes(value.as_ref().try_into().map_err(|_| Error::CorruptStore("sample value"))?);
            tables.samples.push(((parse_hour(&key)?, slot), offset));
        }
        tables.executions = self.records.executions;
        Ok(tables)
    }

    fn recent_executions(&self, limit: usize) -> Result<Vec<ExecutionRecord>> {
        // The frames from the newest back until they hold `limit`.
        let mut first = self.executions.frames() as usize;
        let mut found = 0;
        for frame in self.executions.iter_frames().rev() {
            if found >= limit {
                break;
            }
            first -= 1;
            found += frame.records as usize;
        }
        let mut records = Vec::with_capacity(found);
        for payload in self.executions.payloads_from(first)? {
            records.extend(parse_logged_executions(&payload)?);
        }
        records.drain(..records.len().saturating_sub(limit));
        Ok(records)
    }

    fn put_idempotency(&mut self, records: &[std::sync::Arc<IdempotencyRecord>]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        self.append_to_log(LogTable::Idempotency, idempotency_frames(records))
    }

    fn prune_idempotency(&mut self, kept_max: u64, finished_before_unix_s: f64, batch_max: usize) -> Result<u64> {
        self.prune_log(LogTable::Idempotency, kept_max, finished_before_unix_s, batch_max, |payload, drop_first| {
            let kept = parse_idempotency(payload)?;
            let kept = &kept[drop_first.min(kept.len())..];
            Ok((kept.len() as u32, idempotency_batch_value(kept.iter().map(|r| r.finished_unix_s), json_row(kept, IDEMPOTENCY_HEADER))))
        })
    }

    fn idempotency_records(&self, since_unix_s: f64) -> Result<Vec<IdempotencyRecord>> {
        let mut kept = Vec::new();
        for payload in self.idempotency.payloads_since(since_unix_s)? {
            kept.extend(parse_idempotency(&payload)?.into_iter().filter(|record| record.finished_unix_s >= since_unix_s));
        }
        // Stable: of two records with one key, the later written stays
        // later, and replaces the first as they are loaded.
        kept.sort_by(|a, b| a.finished_unix_s.total_cmp(&b.finished_unix_s));
        Ok(kept)
    }

    fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()? + self.executions.bytes() + self.idempotency.bytes())
    }

    fn flush(&self) -> Result<()> {
        self.db.flush()?;
        if self.manifest_written.get().is_none_or(|at| at.elapsed() >= MANIFEST_INTERVAL) {
            // The manifest promises only what is on disk.
            self.executions.sync()?;
            self.idempotency.sync()?;
            self.write_manifest(self.rows)?;
        } else {
            self.executions.sync_unless_within(LOG_SYNC_INTERVAL)?;
            self.idempotency.sync_unless_within(LOG_SYNC_INTERVAL)?;
        }
        Ok(())
    }

    fn sync_logs(&self) -> Result<()> {
        for log in [&self.executions, &self.idempotency] {
            if log.unsynced() {
                log.sync()?;
            }
        }
        Ok(())
    }
}

/// Records an arrival (a notification; the reply only reports storage
/// errors).
#[derive(Clone, Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct ArrivalUpdate {
    /// Wall-clock arrival, seconds since the Unix epoch (UTC).
    pub unix_secs: i64,
    /// The query's template or fingerprint.
    pub template: TemplateId,
}

/// Logs a finished execution (at the next flush; reads flush first).
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct ExecutionUpdate(pub ExecutionRecord);

/// Writes a finished query's idempotency record.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct IdempotencyUpdate(pub std::sync::Arc<IdempotencyRecord>);

/// Updates sent through a [`ReservoirLink`] and not yet handled: how far
/// the Reservoir is behind its writers. The gRPC intake holds new queries
/// while it is above a high-water mark, so a Reservoir on its own thread
/// that cannot keep up slows the clients instead of growing its mailbox.
#[derive(Clone, Debug, Default)]
pub struct Backlog(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Backlog {
    /// Updates waiting now.
    pub fn len(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether none is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How the RouterShard sends the Reservoir its updates: the actor's
/// address and the [`Backlog`] both count.
#[derive(Clone)]
pub struct ReservoirLink {
    addr: Addr<ReservoirActor>,
    backlog: Backlog,
}

impl ReservoirLink {
    /// The actor.
    pub fn addr(&self) -> &Addr<ReservoirActor> {
        &self.addr
    }

    /// The updates sent and not yet handled.
    pub fn backlog(&self) -> Backlog {
        self.backlog.clone()
    }

    /// Sends `updates` as one message (one wake-up of the reservoir's
    /// thread, one envelope), without waiting; `Err` gives them back when
    /// the mailbox is full.
    pub fn offer_batch(&self, updates: Vec<LogUpdate>) -> std::result::Result<(), Vec<LogUpdate>> {
        let count = updates.len();
        self.backlog.0.fetch_add(count, std::sync::atomic::Ordering::Relaxed);
        match self.addr.try_send(OfferedBatch(updates)) {
            Ok(()) => Ok(()),
            Err(error) => {
                self.backlog.0.fetch_sub(count, std::sync::atomic::Ordering::Relaxed);
                Err(error.into_inner().0)
            }
        }
    }
}

/// One update of a [`ReservoirLink::offer_batch`].
#[derive(Clone, Debug)]
pub enum LogUpdate {
    /// An arrival, as [`ArrivalUpdate`].
    Arrival(ArrivalUpdate),
    /// A finished execution, as [`ExecutionUpdate`].
    Execution(ExecutionRecord),
    /// A finished query's idempotency record, as [`IdempotencyUpdate`]:
    /// the one the RouterShard's table holds (many times the others'
    /// size, so shared rather than copied).
    Idempotency(std::sync::Arc<IdempotencyRecord>),
}

/// Updates sent together through [`ReservoirLink::offer_batch`].
struct OfferedBatch(Vec<LogUpdate>);

impl Message for OfferedBatch {
    type Result = ();
}

impl Handler<OfferedBatch> for ReservoirActor {
    type Result = ();

    fn handle(&mut self, message: OfferedBatch, ctx: &mut Self::Context) {
        self.backlog.0.fetch_sub(message.0.len(), std::sync::atomic::Ordering::Relaxed);
        // A failed write is counted in `storage_errors`; nobody waits.
        for update in message.0 {
            let _ = match update {
                LogUpdate::Arrival(arrival) => <Self as Handler<ArrivalUpdate>>::handle(self, arrival, ctx),
                LogUpdate::Execution(record) => <Self as Handler<ExecutionUpdate>>::handle(self, ExecutionUpdate(record), ctx),
                LogUpdate::Idempotency(record) => <Self as Handler<IdempotencyUpdate>>::handle(self, IdempotencyUpdate(record), ctx),
            };
        }
    }
}

/// Makes everything recorded so far durable.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct Flush;

/// Prunes every table to its [`Retention`] now, as the actor does every
/// [`Retention::prune_interval`]. The reply is the state after it.
#[derive(Message)]
#[rtype(result = "ReservoirState")]
pub struct Prune;

/// Flushes, closes the store, and stops the actor. (Its flush timer would
/// otherwise keep it alive after the last address is dropped.) Once it
/// replies, the data directory can be reopened.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct Shutdown;

/// Reads the count table of one hour.
#[derive(Message)]
#[rtype(result = "Vec<(TemplateId, u64)>")]
pub struct GetCounts(pub CalendarHour);

/// A copy of the tables, for the policy tuner.
#[derive(Message)]
#[rtype(result = "Reservoir")]
pub struct GetSnapshot;

/// Reads the most recent `limit` executions of the log, oldest first.
#[derive(Message)]
#[rtype(result = "Result<Vec<ExecutionRecord>>")]
pub struct GetRecentExecutions {
    /// At most this many.
    pub limit: usize,
}

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "ReservoirState")]
pub struct GetState;

/// The Reservoir actor's observable state.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReservoirState {
    /// Hours with arrivals.
    pub hours: usize,
    /// Arrivals recorded, all hours.
    pub arrivals: u64,
    /// Executions logged.
    pub executions: u64,
    /// Executions written since the actor started (never decreases; the
    /// retention prunes `executions`).
    pub executions_written_since_start: u64,
    /// Updates not yet flushed.
    pub unflushed: u64,
    /// Hours with arrivals whose rows are not yet written (they are
    /// within a second).
    pub hour_rows_unwritten: usize,
    /// Storage errors since start.
    pub storage_errors: u64,
    /// Executions deleted by the retention since start.
    pub executions_pruned: u64,
    /// Idempotency records deleted by the retention since start.
    pub idempotency_pruned: u64,
    /// Count, total and sample rows of hours past the history deleted
    /// since start.
    pub history_rows_pruned: u64,
    /// Bytes the store takes on disk (`None` when it cannot say, or is
    /// closed).
    pub disk_bytes: Option<u64>,
}

/// The longest unflushed writes wait.
const FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The fewest rows a prune may delete from a table: a backlog (after a
/// restart with a lower bound, say) drains in steps of this size, so one
/// prune never stalls the actor for long.
pub const PRUNE_BATCH_MIN: usize = 20_000;

/// The most rows one prune deletes from a table that had `written_since`
/// rows written since the previous prune: twice that, and at least
/// [`PRUNE_BATCH_MIN`]. Deleting at least what was written keeps the rows
/// beyond a bound from growing at any write rate; the factor of two
/// drains a backlog as well.
pub fn prune_budget(written_since: u64) -> usize {
    usize::try_from(written_since.saturating_mul(2)).unwrap_or(usize::MAX).max(PRUNE_BATCH_MIN)
}

/// Rows written to each pruned table since the last prune.
#[derive(Clone, Copy, Debug, Default)]
struct WrittenSincePrune {
    executions: u64,
    idempotency: u64,
    /// Count, total and sample rows upserted.
    history_rows: u64,
}

/// How much of each growing table is kept.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Retention {
    /// The newest this many executions.
    pub executions_kept_max: u64,
    /// Executions logged longer ago than this are deleted, seconds.
    pub execution_age_max_s: f64,
    /// The newest this many idempotency records.
    pub idempotency_kept_max: u64,
    /// Idempotency records of queries finished longer ago than this are
    /// deleted, seconds.
    pub idempotency_age_max_s: f64,
    /// Hours of arrival history (counts, totals, samples) kept before the
    /// latest arrival, seconds; the tuner forecasts from them.
    pub history_s: f64,
    /// How often the tables are pruned.
    pub prune_interval: std::time::Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            executions_kept_max: 1_000_000,
            execution_age_max_s: 30.0 * 86_400.0,
            idempotency_kept_max: 100_000,
            idempotency_age_max_s: 86_400.0,
            history_s: 35.0 * 86_400.0,
            prune_interval: std::time::Duration::from_secs(1),
        }
    }
}

/// The actor. See the module docs.
pub struct ReservoirActor {
    reservoir: Reservoir,
    /// `None` once [`Shutdown`] has closed it.
    store: Option<Box<dyn ReservoirStore>>,
    flush_every: u64,
    mailbox_capacity: usize,
    unflushed: u64,
    executions: u64,
    executions_written_since_start: u64,
    storage_errors: u64,
    retention: Retention,
    executions_pruned: u64,
    idempotency_pruned: u64,
    history_rows_pruned: u64,
    written_since_prune: WrittenSincePrune,
    backlog: Backlog,
    /// Hours with arrivals since the last write-out, and executions and
    /// idempotency records, waiting for the next.
    dirty_hours: std::collections::BTreeSet<CalendarHour>,
    /// When the hour rows were last written.
    hours_written_at: Option<std::time::Instant>,
    pending_executions: Vec<ExecutionRecord>,
    pending_idempotency: Vec<std::sync::Arc<IdempotencyRecord>>,
}

impl ReservoirActor {
    /// Loads the tables from `store` and wraps them.
    pub fn new(config: ReservoirConfig, store: Box<dyn ReservoirStore>, flush_every: u64, mailbox_capacity: usize) -> Result<Self> {
        let stored = store.load()?;
        let mut reservoir = Reservoir::new(config);
        reservoir.restore(stored.counts, stored.totals, stored.samples);
        Ok(ReservoirActor {
            reservoir,
            store: Some(store),
            flush_every: flush_every.max(1),
            mailbox_capacity,
            unflushed: 0,
            executions: stored.executions,
            executions_written_since_start: 0,
            storage_errors: 0,
            retention: Retention::default(),
            executions_pruned: 0,
            idempotency_pruned: 0,
            history_rows_pruned: 0,
            written_since_prune: WrittenSincePrune::default(),
            backlog: Backlog::default(),
            dirty_hours: std::collections::BTreeSet::new(),
            hours_written_at: None,
            pending_executions: Vec::new(),
            pending_idempotency: Vec::new(),
        })
    }

    /// Keeps the execution log to `retention` (default:
    /// [`Retention::default`]).
    pub fn with_retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Starts the actor on this thread, returning the link its writers send
    /// through.
    pub fn start_linked(self) -> ReservoirLink {
        let backlog = self.backlog.clone();
        ReservoirLink { addr: self.start(), backlog }
    }

    /// Starts the actor on `arbiter`'s thread (its sled writes then leave
    /// the caller's), returning the link its writers send through.
    pub fn start_linked_in(self, arbiter: &actix::ArbiterHandle) -> ReservoirLink {
        let backlog = self.backlog.clone();
        let addr = ReservoirActor::start_in_arbiter(arbiter, move |_| self);
        ReservoirLink { addr, backlog }
    }

    /// Deletes one batch of each table's rows beyond the retention.
    fn prune(&mut self) {
        // The buffered rows count against the bounds too; a failed write
        // is counted.
        let _ = self.write_out(Hours::WhenDue);
        let retention = self.retention;
        let written = std::mem::take(&mut self.written_since_prune);
        let cutoff_unix_s = crate::clock::unix_now_s() - retention.execution_age_max_s;
        match self.store().and_then(|store| store.prune_executions(retention.executions_kept_max, cutoff_unix_s, prune_budget(written.executions))) {
            Ok(deleted) => {
                self.executions = self.executions.saturating_sub(deleted);
                self.executions_pruned += deleted;
            }
            Err(_) => self.storage_errors += 1,
        }
        if let Some(cutoff) = self.reservoir.forget_older_than(retention.history_s) {
            match self.store().and_then(|store| store.delete_hours_before(cutoff, prune_budget(written.history_rows))) {
                Ok(deleted) => self.history_rows_pruned += deleted,
                Err(_) => self.storage_errors += 1,
            }
        }
        let finished_before_unix_s = crate::clock::unix_now_s() - retention.idempotency_age_max_s;
        match self.store().and_then(|store| store.prune_idempotency(retention.idempotency_kept_max, finished_before_unix_s, prune_budget(written.idempotency))) {
            Ok(deleted) => self.idempotency_pruned += deleted,
            Err(_) => self.storage_errors += 1,
        }
    }

    fn store(&mut self) -> Result<&mut Box<dyn ReservoirStore>> {
        self.store.as_mut().ok_or(Error::ShuttingDown)
    }

    fn written(&mut self, result: Result<()>) -> Result<()> {
        if result.is_err() {
            self.storage_errors += 1;
            return result;
        }
        self.unflushed += 1;
        if self.unflushed >= self.flush_every {
            self.flush_now(Hours::WhenDue)?;
        }
        Ok(())
    }

    /// Writes the hours with new arrivals (a row each, rewritten whole),
    /// and the buffered executions and idempotency records (a row per
    /// table). What fails to write is counted and dropped: a failing disk
    /// must not grow the buffers without bound.
    fn write_out(&mut self, hours: Hours) -> Result<()> {
        let store = self.store.as_mut().ok_or(Error::ShuttingDown)?;
        let mut failed = None;
        let hours_due = hours == Hours::Now || self.hours_written_at.is_none_or(|at| at.elapsed() >= HOUR_ROWS_INTERVAL);
        if !self.dirty_hours.is_empty() && hours_due {
            self.hours_written_at = Some(std::time::Instant::now());
            // An hour the retention forgot meanwhile has no row to write.
            let hours: Vec<HourRow> = std::mem::take(&mut self.dirty_hours).into_iter().filter_map(|hour| HourRow::of(&self.reservoir, hour)).collect();
            if let Err(e) = store.put_hours(&hours) {
                failed = Some(e);
            }
        }
        if !self.pending_executions.is_empty() {
            match store.append_executions(&self.pending_executions, crate::clock::unix_now_s()) {
                Ok(()) => {
                    self.executions += self.pending_executions.len() as u64;
                    self.executions_written_since_start += self.pending_executions.len() as u64;
                }
                Err(e) => failed = Some(e),
            }
            self.pending_executions.clear();
        }
        if !self.pending_idempotency.is_empty() {
            if let Err(e) = store.put_idempotency(&self.pending_idempotency) {
                failed = Some(e);
            }
            self.pending_idempotency.clear();
        }
        match failed {
            Some(e) => {
                self.storage_errors += 1;
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Writes out what is buffered (the hour rows as `hours` says) and
    /// makes it durable.
    fn flush_now(&mut self, hours: Hours) -> Result<()> {
        let written = self.write_out(hours);
        let flushed = self.store()?.flush();
        if flushed.is_err() {
            self.storage_errors += 1;
        }
        written.and(flushed)?;
        self.unflushed = 0;
        Ok(())
    }
}

impl Actor for ReservoirActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.mailbox_capacity);
        ctx.run_interval(FLUSH_INTERVAL, |actor, _ctx| {
            if actor.unflushed > 0 || !actor.dirty_hours.is_empty() {
                // Counted in `storage_errors`.
                let _ = actor.flush_now(Hours::Now);
            }
            if actor.store().and_then(|store| store.sync_logs()).is_err() {
                actor.storage_errors += 1;
            }
        });
        self.prune();
        ctx.run_interval(self.retention.prune_interval, |actor, _ctx| actor.prune());
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        // Best effort: a failed flush here has no caller to tell.
        if self.store.is_some() {
            let _ = self.flush_now(Hours::Now);
        }
    }
}

impl Handler<ArrivalUpdate> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, message: ArrivalUpdate, _ctx: &mut Self::Context) -> Result<()> {
        self.store()?;
        let update = self.reservoir.handle_arrival(message.unix_secs, message.template);
        if self.dirty_hours.insert(update.hour) {
            self.written_since_prune.history_rows += 1;
        }
        self.written(Ok(()))
    }
}

impl Handler<ExecutionUpdate> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, message: ExecutionUpdate, _ctx: &mut Self::Context) -> Result<()> {
        self.store()?;
        self.pending_executions.push(message.0);
        self.written_since_prune.executions += 1;
        self.written(Ok(()))
    }
}

impl Handler<IdempotencyUpdate> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, message: IdempotencyUpdate, _ctx: &mut Self::Context) -> Result<()> {
        self.store()?;
        self.written_since_prune.idempotency += 1;
        self.pending_idempotency.push(message.0);
        self.written(Ok(()))
    }
}

impl Handler<Flush> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, _message: Flush, _ctx: &mut Self::Context) -> Result<()> {
        self.flush_now(Hours::Now)?;
        self.store()?.sync_logs()
    }
}

impl Handler<Shutdown> for ReservoirActor {
    type Result = Result<()>;

    fn handle(&mut self, _message: Shutdown, ctx: &mut Self::Context) -> Result<()> {
        ctx.stop();
        // Flush and close the store before replying, so the caller can
        // reopen the same directory at once (sled holds a file lock).
        let flushed = if self.store.is_some() { self.flush_now(Hours::Now) } else { Ok(()) };
        self.store = None;
        self.unflushed = 0;
        flushed
    }
}

impl Handler<GetCounts> for ReservoirActor {
    type Result = MessageResult<GetCounts>;

    fn handle(&mut self, message: GetCounts, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.reservoir.counts_in(message.0).collect())
    }
}

impl Handler<GetSnapshot> for ReservoirActor {
    type Result = MessageResult<GetSnapshot>;

    fn handle(&mut self, _message: GetSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.reservoir.clone())
    }
}

impl Handler<GetRecentExecutions> for ReservoirActor {
    type Result = Result<Vec<ExecutionRecord>>;

    fn handle(&mut self, message: GetRecentExecutions, _ctx: &mut Self::Context) -> Self::Result {
        // What is buffered is part of the log; a failed write is counted.
        let _ = self.write_out(Hours::WhenDue);
        self.store.as_ref().ok_or(Error::ShuttingDown)?.recent_executions(message.limit)
    }
}

impl Handler<Prune> for ReservoirActor {
    type Result = MessageResult<Prune>;

    fn handle(&mut self, _message: Prune, _ctx: &mut Self::Context) -> Self::Result {
        self.prune();
        MessageResult(self.state())
    }
}

impl Handler<GetState> for ReservoirActor {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.state())
    }
}

impl ReservoirActor {
    fn state(&self) -> ReservoirState {
        let hours: Vec<CalendarHour> = self.reservoir.hours().collect();
        ReservoirState {
            hours: hours.len(),
            arrivals: hours.iter().map(|&h| self.reservoir.arrivals_in(h).0).sum(),
            executions: self.executions,
            executions_written_since_start: self.executions_written_since_start,
            unflushed: self.unflushed,
            hour_rows_unwritten: self.dirty_hours.len(),
            storage_errors: self.storage_errors,
            executions_pruned: self.executions_pruned,
            idempotency_pruned: self.idempotency_pruned,
            history_rows_pruned: self.history_rows_pruned,
            disk_bytes: self.store.as_ref().and_then(|store| store.size_on_disk().ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// An hour row decodes to what was encoded, and no truncation of
        /// it decodes at all but the 8-byte total of an older store.
        #[test]
        fn hour_rows_decode_to_what_was_encoded(
            total in 1u64..u64::MAX,
            counts in proptest::collection::vec((0u32..u32::MAX, 0u64..u64::MAX), 1..40),
            samples in proptest::collection::vec(0u16..3_600, 0..40),
            cut in 9usize..1_000,
        ) {
            let hour = CalendarHour { day: 19_870, hour: 13 };
            let row = HourRow { hour, total, counts: counts.into_iter().map(|(t, c)| (TemplateId(t), c)).collect(), samples };
            let value = row.encode();
            proptest::prop_assert_eq!(HourRow::decode(hour, &value).unwrap(), row.clone());
            let cut = cut.min(value.len());
            if cut < value.len() && cut < 12 + row.counts.len() * 12 {
                proptest::prop_assert!(HourRow::decode(hour, &value[..cut]).is_err());
            }
        }

        /// Rows cover the records in order, each row's JSON is its records,
        /// and none is over the bound but a row of one record.
        #[test]
        fn json_rows_cover_the_records_in_order_within_the_bound(lengths in proptest::collection::vec(0usize..9_000, 0..60), header in 0usize..10) {
            let records: Vec<String> = lengths.iter().map(|&n| "x".repeat(n)).collect();
            let rows = json_rows(&records, header);
            let mut next = 0;
            for (range, row) in &rows {
                proptest::prop_assert_eq!(range.start, next);
                next = range.end;
                proptest::prop_assert!(row[..header].iter().all(|&b| b == 0));
                let json = &row[header..];
                let decoded: Vec<String> = serde_json::from_slice(json).unwrap();
                proptest::prop_assert_eq!(&decoded[..], &records[range.clone()]);
                proptest::prop_assert!(json.len() <= ROW_JSON_BYTES_MAX || range.len() == 1, "{} bytes in {} records", json.len(), range.len());
            }
            proptest::prop_assert_eq!(next, records.len());
        }

        /// An older store's batch key says how many records its row holds.
        #[test]
        fn an_older_store_s_batch_keys_carry_their_record_counts(sequence in 0u64..u64::MAX, records in 1u32..1_000_000) {
            let key = [sequence.to_be_bytes().as_slice(), records.to_be_bytes().as_slice()].concat();
            proptest::prop_assert_eq!(batch_records(&key).unwrap(), u64::from(records));
        }
    }
}
