//! The Reservoir actor against a real sled store in a scratch directory.

use actix::Actor;
use slogate_actors::reservoir::{ArrivalUpdate, HourRow, ExecutionUpdate, Flush, GetCounts, GetRecentExecutions, GetState, Prune, ReservoirActor, ReservoirStore, Shutdown, SledStore};
use slogate_core::model::{ClusterId, QueryId, Rpu, TemplateId};
use slogate_core::reservoir::{CalendarHour, ExecutionRecord, ReservoirConfig};
use slogate_core::time::Duration;

/// A scratch directory for one test, removed when it drops.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("slogate-reservoir-{name}-")).tempdir().unwrap()
}

/// Opens `dir` with sled directly, once a store just dropped there has
/// released its lock (as `SledStore::open` waits for it).
fn open_sled(dir: &std::path::Path) -> sled::Db {
    slogate_actors::reservoir::when_unlocked(|| sled::open(dir)).unwrap()
}

/// Makes `dir` a store as an older node left it: an intact manifest of
/// zero rows, then what `write` puts into sled's trees directly.
fn older_store(dir: &std::path::Path, write: impl FnOnce(&sled::Db)) {
    drop(SledStore::open(dir).unwrap());
    let db = open_sled(dir);
    write(&db);
    db.flush().unwrap();
}

/// An older store's batch key: a sequence number, then the records.
fn older_batch_key(sequence: u64, records: u32) -> Vec<u8> {
    [sequence.to_be_bytes().as_slice(), records.to_be_bytes().as_slice()].concat()
}

/// Whether the closed store in `dir` has a sled tree `name`.
fn has_sled_tree(dir: &std::path::Path, name: &str) -> bool {
    open_sled(dir).tree_names().iter().any(|n| n.as_ref() == name.as_bytes())
}

/// The newest segment file of the store's `log` directory.
fn newest_segment(dir: &std::path::Path, log: &str) -> std::path::PathBuf {
    let mut segments: Vec<_> = std::fs::read_dir(dir.join(log)).unwrap().map(|e| e.unwrap().path()).collect();
    segments.sort();
    segments.pop().expect("a segment")
}

fn record(id: u64) -> ExecutionRecord {
    ExecutionRecord {
        query: QueryId(id),
        template: TemplateId(3),
        cluster: ClusterId(0),
        size: Rpu(16),
        neighbours_at_dispatch: 2,
        latency: Duration::from_millis(8_000),
        censored: false,
        queued: Duration::from_millis(id * 100),
        ran_alone: id % 2 == 0,
        timeline: None,
    }
}

/// 2024-05-27 13:00:00 UTC.
const MONDAY_1PM: i64 = 1_716_814_800;

#[actix_rt::test]
async fn counts_and_executions_survive_a_restart() {
    let scratch_dir = scratch("restart");
    let dir = scratch_dir.path();
    let config = ReservoirConfig { arrival_samples_per_hour_max: 8, seed: 1, ..ReservoirConfig::default() };
    {
        let actor = ReservoirActor::new(config.clone(), Box::new(SledStore::open(dir).unwrap()), 1_000, 64).unwrap().start();
        for i in 0..30 {
            actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM + i * 60, template: TemplateId((i % 3) as u32 + 1) }).await.unwrap().unwrap();
        }
        for i in 0..5 {
            actor.send(ExecutionUpdate(record(i))).await.unwrap().unwrap();
        }
        actor.send(Flush).await.unwrap().unwrap();
        let state = actor.send(GetState).await.unwrap();
        assert_eq!((state.arrivals, state.executions, state.unflushed), (30, 5, 0));
        actor.send(Shutdown).await.unwrap().unwrap();
    }
    let store = SledStore::open(dir).unwrap();
    assert_eq!(store.recent_executions(100).unwrap(), (0..5).map(record).collect::<Vec<_>>());
    let actor = ReservoirActor::new(config, Box::new(store), 1_000, 64).unwrap().start();
    let (hour, _) = CalendarHour::from_unix_secs(MONDAY_1PM);
    let mut counts = actor.send(GetCounts(hour)).await.unwrap();
    counts.sort();
    assert_eq!(counts, vec![(TemplateId(1), 10), (TemplateId(2), 10), (TemplateId(3), 10)]);
    let state = actor.send(GetState).await.unwrap();
    assert_eq!((state.arrivals, state.executions), (30, 5));
    let recent = actor.send(GetRecentExecutions { limit: 3 }).await.unwrap().unwrap();
    assert_eq!(recent, (2..5).map(record).collect::<Vec<_>>());
    actor.send(Shutdown).await.unwrap().unwrap();
}

#[test]
fn execution_records_logged_before_queueing_was_recorded_read_zero_queueing() {
    let old = r#"{"query":1,"template":3,"cluster":0,"size":16,"neighbours_at_dispatch":2,"latency":8000000,"censored":false}"#;
    let decoded: ExecutionRecord = serde_json::from_str(old).unwrap();
    assert_eq!(decoded, ExecutionRecord { queued: Duration::ZERO, ran_alone: false, ..record(1) });
}

#[actix_rt::test]
async fn arrival_samples_stay_within_the_bound() {
    let scratch_dir = scratch("bound");
    let dir = scratch_dir.path();
    let store = SledStore::open(dir).unwrap();
    let actor = ReservoirActor::new(ReservoirConfig { arrival_samples_per_hour_max: 16, seed: 2, ..ReservoirConfig::default() }, Box::new(store), 10, 64).unwrap().start();
    for i in 0..500 {
        actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM + i * 7, template: TemplateId(1) }).await.unwrap().unwrap();
    }
    actor.send(Shutdown).await.unwrap().unwrap();
    let stored = SledStore::open(dir).unwrap().load().unwrap();
    assert_eq!(stored.totals.iter().map(|(_, t)| t).sum::<u64>(), 500);
    assert!(stored.samples.len() <= 16, "{} samples kept", stored.samples.len());
}

#[actix_rt::test]
async fn unflushed_updates_are_flushed_within_a_second() {
    tokio::time::pause();
    let scratch_dir = scratch("interval");
    let dir = scratch_dir.path();
    let actor = ReservoirActor::new(ReservoirConfig::default(), Box::new(SledStore::open(dir).unwrap()), 1_000_000, 64).unwrap().start();
    actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM, template: TemplateId(1) }).await.unwrap().unwrap();
    assert_eq!(actor.send(GetState).await.unwrap().unflushed, 1);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(actor.send(GetState).await.unwrap().unflushed, 0);
    actor.send(Shutdown).await.unwrap().unwrap();
}

#[actix_rt::test]
async fn hour_rows_are_written_at_most_every_second_by_the_flushes_and_within_a_second_by_the_tick() {
    tokio::time::pause();
    let scratch_dir = scratch("hour-rows");
    let dir = scratch_dir.path();
    // A flush after every update: the first writes the hour's row, the
    // next ones within the second leave it for later.
    let actor = ReservoirActor::new(ReservoirConfig::default(), Box::new(SledStore::open(dir).unwrap()), 1, 64).unwrap().start();
    actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM, template: TemplateId(1) }).await.unwrap().unwrap();
    assert_eq!(actor.send(GetState).await.unwrap().hour_rows_unwritten, 0);
    actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM + 1, template: TemplateId(2) }).await.unwrap().unwrap();
    let state = actor.send(GetState).await.unwrap();
    assert_eq!((state.unflushed, state.hour_rows_unwritten), (0, 1), "flushed, the hour row deferred");
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(actor.send(GetState).await.unwrap().hour_rows_unwritten, 0, "the tick writes it");
    actor.send(Shutdown).await.unwrap().unwrap();
    let store = SledStore::open(dir).unwrap();
    assert_eq!(store.load().unwrap().totals, vec![(CalendarHour::from_unix_secs(MONDAY_1PM).0, 2)]);
}

/// Executions per batch row in [`fill`].
const FILL_BATCH: u64 = 10;

/// Writes `executions` executions (in batches of [`FILL_BATCH`], each
/// logged at 1,000 s plus its last record's number) and some arrivals,
/// flushed, and closes the store.
fn fill(dir: &std::path::Path, executions: u64) {
    let mut store = SledStore::open(dir).unwrap();
    let mut reservoir = slogate_core::reservoir::Reservoir::new(ReservoirConfig::default());
    for i in 0..200 {
        reservoir.handle_arrival(MONDAY_1PM + i * 7, TemplateId((i % 5) as u32 + 1));
    }
    store.put_hours(&reservoir.hours().filter_map(|hour| HourRow::of(&reservoir, hour)).collect::<Vec<_>>()).unwrap();
    for first in (0..executions).step_by(FILL_BATCH as usize) {
        let batch: Vec<_> = (first..(first + FILL_BATCH).min(executions)).map(record).collect();
        store.append_executions(&batch, 1_000.0 + (first + batch.len() as u64 - 1) as f64).unwrap();
    }
    store.flush().unwrap();
}

/// Removes sled's snapshots and cuts its log file, and the execution
/// log's newest segment, to `fraction` of their length: what a full disk
/// or a bad copy leaves.
fn truncate_log(dir: &std::path::Path, fraction: f64) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("snap.")) {
            std::fs::remove_file(path).unwrap();
        }
    }
    for file in [dir.join("db"), newest_segment(dir, "executions-log")] {
        let length = std::fs::metadata(&file).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len((length as f64 * fraction) as u64).unwrap();
    }
}

#[test]
fn a_store_reopens_intact_and_its_manifest_matches_its_rows() {
    let scratch_dir = scratch("intact");
    let dir = scratch_dir.path();
    fill(dir, 3_000);
    let store = SledStore::open(dir).unwrap();
    assert!(store.repair_report().is_none());
    assert_eq!(store.rows().executions, 3_000 / FILL_BATCH, "a row per batch");
    assert_eq!(store.recent_executions(10_000).unwrap(), (0..3_000).map(record).collect::<Vec<_>>());
    assert_eq!(store.recent_executions(25).unwrap(), (2_975..3_000).map(record).collect::<Vec<_>>(), "the newest, across batches");
}

#[test]
fn a_truncated_store_is_a_clear_error_naming_what_was_lost() {
    let scratch_dir = scratch("truncated");
    let dir = scratch_dir.path();
    fill(dir, 20_000);
    truncate_log(dir, 0.5);
    let error = SledStore::open(dir).err().expect("a truncated store must not open silently");
    let message = error.to_string();
    assert!(matches!(error, slogate_actors::Error::DamagedStore { .. }), "{message}");
    assert!(message.contains("--repair"), "the error says how to go on: {message}");
    // Failing to open does not bless the damage for the next try.
    let again = SledStore::open(dir).err().expect("a damaged store stays damaged until repaired");
    assert!(matches!(again, slogate_actors::Error::DamagedStore { .. }), "{again}");
}

#[test]
fn a_repair_keeps_what_is_left_says_what_it_dropped_and_the_store_then_opens_cleanly() {
    let scratch_dir = scratch("repair");
    // The store one level down: a repair moves the damaged store aside,
    // beside it, and that copy must stay inside the scratch directory.
    let store_dir = scratch_dir.path().join("store");
    let dir = store_dir.as_path();
    fill(dir, 20_000);
    truncate_log(dir, 0.5);
    let options = slogate_actors::reservoir::StoreOptions { repair: true, ..Default::default() };
    let store = SledStore::open_with(dir, &options).unwrap();
    let report = store.repair_report().expect("damage is reported").clone();
    assert!(!report.damage.is_empty());
    let kept = report.kept;
    if report.moved_to.is_none() {
        assert_eq!(report.expected.executions, 20_000 / FILL_BATCH, "{report:?}");
        assert!(kept.executions < 20_000 / FILL_BATCH, "{report:?}");
    }
    assert_eq!(store.rows(), kept);
    drop(store);
    let store = SledStore::open(dir).expect("a repaired store opens without --repair");
    assert!(store.repair_report().is_none());
    assert_eq!(store.rows(), kept);
}

#[test]
fn a_missing_or_edited_manifest_is_damage() {
    let scratch_dir = scratch("manifest");
    let dir = scratch_dir.path();
    fill(dir, 100);
    let manifest = dir.join("slogate-manifest.json");
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"executions\": 10", "\"executions\": 9")).unwrap();
    let error = SledStore::open(dir).err().expect("an edited manifest is damage").to_string();
    assert!(error.contains("checksum"), "{error}");
    std::fs::remove_file(&manifest).unwrap();
    let error = SledStore::open(dir).err().expect("a missing manifest is damage").to_string();
    assert!(error.contains("missing"), "{error}");
}

#[test]
fn pruning_keeps_the_newest_executions_and_none_older_than_the_cutoff() {
    let scratch_dir = scratch("prune");
    let dir = scratch_dir.path();
    fill(dir, 1_000);
    let mut store = SledStore::open(dir).unwrap();
    // By count, at most a budget per prune.
    assert_eq!(store.prune_executions(800, 0.0, 150).unwrap(), 150);
    assert_eq!(store.prune_executions(800, 0.0, 150).unwrap(), 50);
    assert_eq!(store.prune_executions(800, 0.0, 150).unwrap(), 0);
    let kept = store.recent_executions(10_000).unwrap();
    assert_eq!(kept, (200..1_000).map(record).collect::<Vec<_>>());
    // A bound inside a batch trims that batch: exactly the newest stay.
    assert_eq!(store.prune_executions(795, 0.0, 150).unwrap(), 5);
    assert_eq!(store.recent_executions(10_000).unwrap(), (205..1_000).map(record).collect::<Vec<_>>());
    // By age, whole batches: the batch ending at i was logged at 1000 + i.
    assert_eq!(store.prune_executions(10_000, 1_900.0, 10_000).unwrap(), 695);
    assert_eq!(store.recent_executions(10_000).unwrap(), (900..1_000).map(record).collect::<Vec<_>>());
    drop(store);
    let store = SledStore::open(dir).expect("pruning keeps the manifest truthful");
    assert_eq!(store.rows().executions, 100 / FILL_BATCH);
    assert_eq!(store.recent_executions(10_000).unwrap().len(), 100);
}

#[actix_rt::test]
async fn the_actor_prunes_the_log_to_its_retention() {
    let scratch_dir = scratch("retention");
    let dir = scratch_dir.path();
    let retention = slogate_actors::reservoir::Retention { executions_kept_max: 50, ..Default::default() };
    let actor = ReservoirActor::new(ReservoirConfig::default(), Box::new(SledStore::open(dir).unwrap()), 1_000, 256)
        .unwrap()
        .with_retention(retention)
        .start();
    for i in 0..120 {
        actor.send(ExecutionUpdate(record(i))).await.unwrap().unwrap();
    }
    // The actor prunes every second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let state = actor.send(GetState).await.unwrap();
        if state.executions == 50 {
            assert_eq!(state.executions_pruned, 70);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not pruned: {state:?}");
        actix_rt::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let recent = actor.send(GetRecentExecutions { limit: 1_000 }).await.unwrap().unwrap();
    assert_eq!(recent, (70..120).map(record).collect::<Vec<_>>());
    actor.send(Shutdown).await.unwrap().unwrap();
}

#[actix_rt::test]
async fn one_prune_deletes_everything_written_beyond_the_bound_since_the_last_whatever_the_rate() {
    let scratch_dir = scratch("retention-pace");
    let dir = scratch_dir.path();
    // The interval never fires during the test: only the prune at start
    // and the one asked for run.
    let retention = slogate_actors::reservoir::Retention {
        executions_kept_max: 100,
        prune_interval: std::time::Duration::from_secs(3_600),
        ..Default::default()
    };
    let actor = ReservoirActor::new(ReservoirConfig::default(), Box::new(SledStore::open(dir).unwrap()), 10_000, 70_000)
        .unwrap()
        .with_retention(retention)
        .start();
    // Three times the smallest batch between two prunes: a fixed
    // 20,000-row batch would leave 39,900 rows beyond the bound.
    let written = 60_000u64;
    let replies: Vec<_> = (0..written).map(|i| actor.send(ExecutionUpdate(record(i)))).collect();
    for reply in replies {
        reply.await.unwrap().unwrap();
    }
    let state = actor.send(Prune).await.unwrap();
    assert_eq!((state.executions, state.executions_pruned), (100, written - 100), "{state:?}");
    let recent = actor.send(GetRecentExecutions { limit: 1_000 }).await.unwrap().unwrap();
    assert_eq!(recent, (written - 100..written).map(record).collect::<Vec<_>>());
    actor.send(Shutdown).await.unwrap().unwrap();
}

proptest::proptest! {
    /// The rows beyond a bound never grow from one prune to the next: each
    /// prune deletes what arrived since the last and at least 10,000 rows
    /// of any backlog, for any pattern of writes.
    #[test]
    fn rows_beyond_a_bound_never_grow_between_prunes(backlog in 0u64..200_000, writes in proptest::collection::vec(0u64..1_000_000, 1..50)) {
        let mut over = backlog;
        for written in writes {
            let after = (over + written).saturating_sub(slogate_actors::reservoir::prune_budget(written) as u64);
            proptest::prop_assert!(after <= over.saturating_sub(10_000), "{over} beyond the bound, {written} written, {after} left");
            over = after;
        }
    }
}

fn idempotency_record(id: u64, finished_unix_s: f64) -> slogate_actors::idempotency::IdempotencyRecord {
    use slogate_actors::idempotency::{IdempotencyRecord, RequestDigest};
    use slogate_actors::router::{SubmitOutcome, SubmitStatus};
    IdempotencyRecord {
        pool: slogate_core::model::PoolId::default(),
        tenant: String::new(),
        client_query_id: format!("q{id}"),
        digest: RequestDigest { template: TemplateId(4), slo_ms: 1_000, sql: 0, rest: 0 },
        finished_unix_s,
        outcome: SubmitOutcome {
            client_query_id: format!("q{id}"),
            query: QueryId(id),
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
fn idempotency_records_are_pruned_oldest_first_by_count_and_age() {
    let scratch_dir = scratch("idempotency-prune");
    let dir = scratch_dir.path();
    let mut store = SledStore::open(dir).unwrap();
    // Ten batches of a hundred, in finish order: id i finished at 10,000 + i.
    let finished = |i: u64| 10_000.0 + i as f64;
    for first in (0..1_000).step_by(100) {
        let batch: Vec<_> = (first..first + 100).map(|i| std::sync::Arc::new(idempotency_record(i, finished(i)))).collect();
        store.put_idempotency(&batch).unwrap();
    }
    let rows = store.rows().idempotency;
    assert!((10..100).contains(&rows), "rows of several records each, at most 6 KiB: {rows}");
    // By count: whole rows and a trimmed one, so exactly the newest stay.
    assert_eq!(store.prune_idempotency(650, 0.0, 10_000).unwrap(), 350);
    let kept = store.idempotency_records(0.0).unwrap();
    assert_eq!(kept.iter().map(|r| r.finished_unix_s).collect::<Vec<_>>(), (350..1_000).map(finished).collect::<Vec<_>>());
    // By age, whole rows: those that all finished before 10,900 go, so
    // everything from 10,900 on stays, and at most a row's worth before it.
    let deleted = store.prune_idempotency(10_000, 10_900.0, 10_000).unwrap();
    let kept = store.idempotency_records(0.0).unwrap();
    assert_eq!(deleted as usize + kept.len(), 650);
    assert!(kept.len() >= 100 && kept.len() < 100 + 1_000 / rows as usize * 2, "{} kept", kept.len());
    assert!(kept.iter().rev().take(100).all(|r| r.finished_unix_s >= 10_900.0));
    // Reading from a time skips what finished before it.
    assert_eq!(store.idempotency_records(10_950.0).unwrap().len(), 50);
    drop(store);
    let store = SledStore::open(dir).expect("pruning keeps the manifest truthful");
    assert_eq!(store.idempotency_records(0.0).unwrap().len(), kept.len());
}

#[test]
fn a_store_with_one_row_per_idempotency_record_moves_them_into_batches_when_it_opens() {
    let scratch_dir = scratch("idempotency-migrate");
    let dir = scratch_dir.path();
    // A store as an older node left it: an intact manifest of zero rows,
    // then the records in their own tree, one row each, with an index.
    older_store(dir, |db| {
        let (legacy, index) = (db.open_tree("idempotency").unwrap(), db.open_tree("idempotency_by_time").unwrap());
        for i in 0..2_500u64 {
            let record = idempotency_record(i, 20_000.0 - i as f64);
            legacy.insert(record.key(), serde_json::to_vec(&record).unwrap()).unwrap();
            index.insert(i.to_be_bytes(), &[]).unwrap();
        }
    });
    let store = SledStore::open(dir).unwrap();
    let records = store.idempotency_records(0.0).unwrap();
    assert_eq!(records.len(), 2_500);
    assert!(records.windows(2).all(|w| w[0].finished_unix_s <= w[1].finished_unix_s), "oldest finish first");
    let rows = store.rows().idempotency;
    assert!(rows < 2_500 / 10, "batched: {rows} rows");
    drop(store);
    let store = SledStore::open(dir).expect("the moved store opens as it is");
    assert_eq!((store.rows().idempotency, store.idempotency_records(0.0).unwrap().len()), (rows, 2_500));
    drop(store);
    assert!(!has_sled_tree(dir, "idempotency") && !has_sled_tree(dir, "idempotency_by_time"), "the old trees are gone");
}

#[test]
fn a_store_with_idempotency_batches_in_sled_moves_them_into_the_segment_log_when_it_opens() {
    let scratch_dir = scratch("idempotency-segments");
    let dir = scratch_dir.path();
    // A store as the previous version left it: an intact manifest of zero
    // rows, then batches of 20 records in sled's `idempotency_log` tree,
    // keyed by sequence number and record count, valued by the newest
    // finish (f64 BE) and the records' JSON array.
    older_store(dir, |db| {
        let tree = db.open_tree("idempotency_log").unwrap();
        for batch in 0..50u64 {
            let records: Vec<_> = (batch * 20..batch * 20 + 20).map(|i| idempotency_record(i, 30_000.0 + i as f64)).collect();
            let mut value = (30_000.0 + (batch * 20 + 19) as f64).to_bits().to_be_bytes().to_vec();
            value.extend_from_slice(&serde_json::to_vec(&records).unwrap());
            tree.insert(older_batch_key(batch, 20), value).unwrap();
        }
    });
    let store = SledStore::open(dir).unwrap();
    let records = store.idempotency_records(0.0).unwrap();
    assert_eq!(records.iter().map(|r| r.outcome.query.0).collect::<Vec<_>>(), (0..1_000).collect::<Vec<_>>(), "every record, in finish order");
    let frames = store.rows().idempotency;
    assert!(frames > 0 && frames < 1_000, "frames of a batch each: {frames}");
    drop(store);
    let segments = std::fs::read_dir(dir.join("idempotency-log")).unwrap().count();
    assert!(segments >= 1, "the records are in segment files");
    assert!(!has_sled_tree(dir, "idempotency_log"), "the sled tree is gone");
    let store = SledStore::open(dir).expect("the moved store opens as it is");
    assert_eq!((store.rows().idempotency, store.idempotency_records(0.0).unwrap().len()), (frames, 1_000));
}

#[test]
fn a_torn_idempotency_write_is_cut_back_and_a_lost_segment_is_damage() {
    let scratch_dir = scratch("idempotency-torn");
    let dir = scratch_dir.path();
    let mut store = SledStore::open(dir).unwrap();
    for first in (0..300).step_by(30) {
        let batch: Vec<_> = (first..first + 30).map(|i| std::sync::Arc::new(idempotency_record(i, 40_000.0 + i as f64))).collect();
        store.put_idempotency(&batch).unwrap();
    }
    store.flush().unwrap();
    drop(store);
    // A crash in the middle of a write: half a frame at the end.
    let path = newest_segment(dir, "idempotency-log");
    let mut bytes = std::fs::read(&path).unwrap();
    let whole = bytes.len();
    let half_a_frame = bytes[..40].to_vec();
    bytes.extend_from_slice(&half_a_frame);
    std::fs::write(&path, &bytes).unwrap();
    let mut store = SledStore::open(dir).expect("a torn write after the last flush is no damage");
    assert_eq!(store.idempotency_records(0.0).unwrap().len(), 300);
    assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, whole, "cut back to the last whole frame");
    store.put_idempotency(&[std::sync::Arc::new(idempotency_record(300, 40_300.0))]).unwrap();
    store.flush().unwrap();
    drop(store);
    let store = SledStore::open(dir).unwrap();
    assert_eq!(store.idempotency_records(0.0).unwrap().len(), 301, "appends follow the cut");
    drop(store);
    // Losing flushed frames is damage, named, until repaired.
    let path = newest_segment(dir, "idempotency-log");
    let length = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(length / 2).unwrap();
    let error = SledStore::open(dir).err().expect("lost frames are damage").to_string();
    assert!(error.contains("idempotency"), "{error}");
    let options = slogate_actors::reservoir::StoreOptions { repair: true, ..Default::default() };
    let store = SledStore::open_with(dir, &options).unwrap();
    let kept = store.idempotency_records(0.0).unwrap();
    assert!(!kept.is_empty() && kept.len() < 301, "{} kept", kept.len());
    assert!(kept.iter().enumerate().all(|(i, r)| r.outcome.query.0 == i as u64), "the frames before the cut, in order");
    drop(store);
    assert_eq!(SledStore::open(dir).unwrap().idempotency_records(0.0).unwrap().len(), kept.len(), "a repaired store opens without --repair");
}

#[test]
fn single_record_execution_rows_from_before_batches_read_and_prune_with_the_batches() {
    let scratch_dir = scratch("legacy-executions");
    let dir = scratch_dir.path();
    older_store(dir, |db| {
        let executions = db.open_tree("executions").unwrap();
        // One row of JSON alone, one of the logged time then JSON.
        executions.insert(1u64.to_be_bytes(), serde_json::to_vec(&record(0)).unwrap()).unwrap();
        let mut timed = 900.0f64.to_bits().to_be_bytes().to_vec();
        timed.extend(serde_json::to_vec(&record(1)).unwrap());
        executions.insert(2u64.to_be_bytes(), timed).unwrap();
    });
    let mut store = SledStore::open(dir).unwrap();
    store.append_executions(&(2..12).map(record).collect::<Vec<_>>(), 1_000.0).unwrap();
    assert_eq!(store.recent_executions(100).unwrap(), (0..12).map(record).collect::<Vec<_>>());
    assert_eq!(store.prune_executions(5, 0.0, 100).unwrap(), 7, "the single rows, then five of the batch");
    assert_eq!(store.recent_executions(100).unwrap(), (7..12).map(record).collect::<Vec<_>>());
}

#[test]
fn a_store_with_execution_batches_in_sled_moves_them_into_the_execution_log_when_it_opens() {
    let scratch_dir = scratch("executions-segments");
    let dir = scratch_dir.path();
    // As the previous version left it: batches of ten in sled's
    // `executions` tree, keyed by sequence number and record count,
    // valued by a marker (0xB7), the time logged (f64 BE) and the JSON.
    older_store(dir, |db| {
        let tree = db.open_tree("executions").unwrap();
        for batch in 0..30u64 {
            let records: Vec<_> = (batch * 10..batch * 10 + 10).map(record).collect();
            let mut value = vec![0xB7];
            value.extend_from_slice(&(2_000.0 + batch as f64).to_bits().to_be_bytes());
            value.extend_from_slice(&serde_json::to_vec(&records).unwrap());
            tree.insert(older_batch_key(batch, 10), value).unwrap();
        }
    });
    let mut store = SledStore::open(dir).unwrap();
    assert_eq!(store.recent_executions(1_000).unwrap(), (0..300).map(record).collect::<Vec<_>>());
    assert_eq!(store.rows().executions, 30, "a frame per batch");
    // The times logged came along: the batches logged before 2,010 go.
    assert_eq!(store.prune_executions(1_000, 2_010.0, 10_000).unwrap(), 100);
    assert_eq!(store.recent_executions(1_000).unwrap(), (100..300).map(record).collect::<Vec<_>>());
    drop(store);
    assert!(!has_sled_tree(dir, "executions"), "the sled tree is gone");
    let store = SledStore::open(dir).expect("the moved store opens as it is");
    assert_eq!(store.recent_executions(1_000).unwrap().len(), 200);
}

#[test]
fn a_store_with_a_row_per_count_and_sample_moves_its_history_into_hour_rows_when_it_opens() {
    let scratch_dir = scratch("history-migrate");
    let dir = scratch_dir.path();
    let mut reservoir = slogate_core::reservoir::Reservoir::new(ReservoirConfig { arrival_samples_per_hour_max: 8, ..ReservoirConfig::default() });
    let mut updates = Vec::new();
    for i in 0..500 {
        updates.push(reservoir.handle_arrival(MONDAY_1PM + i * 29, TemplateId((i % 7) as u32 + 1)));
    }
    // The layout an older node wrote: a row per count, per hour total and
    // per sample slot.
    older_store(dir, |db| {
        let (counts, totals, samples) = (db.open_tree("counts").unwrap(), db.open_tree("totals").unwrap(), db.open_tree("samples").unwrap());
        let hour_key = |hour: slogate_core::reservoir::CalendarHour| {
            let day = (hour.day as u32 ^ 0x8000_0000).to_be_bytes();
            vec![day[0], day[1], day[2], day[3], hour.hour]
        };
        for update in &updates {
            let key = hour_key(update.hour);
            counts.insert([key.clone(), update.template.0.to_be_bytes().to_vec()].concat(), &update.count.to_be_bytes()).unwrap();
            totals.insert(key.clone(), &update.arrivals_total.to_be_bytes()).unwrap();
            if let Some((slot, offset)) = update.sample {
                samples.insert([key, slot.to_be_bytes().to_vec()].concat(), &offset.to_be_bytes()).unwrap();
            }
        }
    });
    let expected: Vec<HourRow> = reservoir.hours().filter_map(|hour| HourRow::of(&reservoir, hour)).collect();
    for _ in 0..2 {
        let store = SledStore::open(dir).expect("the older layout opens, and so does the moved one");
        let rows = store.rows();
        assert_eq!((rows.counts, rows.samples, rows.totals), (0, 0, expected.len() as u64), "a row per hour, nothing else");
        let mut restored = slogate_core::reservoir::Reservoir::new(ReservoirConfig { arrival_samples_per_hour_max: 8, ..ReservoirConfig::default() });
        let tables = store.load().unwrap();
        restored.restore(tables.counts, tables.totals, tables.samples);
        assert_eq!(restored.hours().filter_map(|hour| HourRow::of(&restored, hour)).collect::<Vec<_>>(), expected);
    }
}

#[test]
fn a_large_hour_is_kept_in_chunks_that_load_back_whole_and_a_half_pruned_hour_is_skipped() {
    let scratch_dir = scratch("hour-chunks");
    let dir = scratch_dir.path();
    let mut store = SledStore::open(dir).unwrap();
    let hour = |h: u8| CalendarHour { day: 19_870, hour: h };
    // 2,000 templates and 4,096 samples: about 32 KB, six chunks.
    let large = |h: u8| HourRow {
        hour: hour(h),
        total: 10_000,
        counts: (1..=2_000).map(|t| (TemplateId(t), 5)).collect(),
        samples: (0..4_096).map(|i| (i % 3_600) as u16).collect(),
    };
    store.put_hours(&[large(1), large(2)]).unwrap();
    assert!(store.rows().totals >= 10, "{:?}", store.rows());
    store.flush().unwrap();
    drop(store);
    let mut store = SledStore::open(dir).unwrap();
    let tables = store.load().unwrap();
    assert_eq!(tables.totals, vec![(hour(1), 10_000), (hour(2), 10_000)]);
    assert_eq!(tables.counts.len(), 4_000);
    assert_eq!(tables.samples.len(), 8_192);
    // A prune cut short in hour 1 leaves its later chunks: it is skipped,
    // hour 2 loads whole.
    assert_eq!(store.delete_hours_before(hour(2), 2).unwrap(), 2);
    let tables = store.load().unwrap();
    assert_eq!(tables.totals, vec![(hour(2), 10_000)]);
    assert_eq!(tables.counts.len(), 2_000);
    drop(store);
    assert!(SledStore::open(dir).is_ok(), "the manifest follows the chunks");
}
