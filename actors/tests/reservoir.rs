//! The Reservoir actor against a real sled store in a scratch directory.

use actix::Actor;
use slogate_actors::reservoir::{ArrivalUpdate, ExecutionUpdate, Flush, GetCounts, GetRecentExecutions, GetState, ReservoirActor, ReservoirStore, Shutdown, SledStore};
use slogate_core::model::{ClusterId, QueryId, Rpu, TemplateId};
use slogate_core::reservoir::{CalendarHour, ExecutionRecord, ReservoirConfig};
use slogate_core::time::Duration;

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("slogate-reservoir-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
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
    }
}

/// 2024-05-27 13:00:00 UTC.
const MONDAY_1PM: i64 = 1_716_814_800;

#[actix_rt::test]
async fn counts_and_executions_survive_a_restart() {
    let dir = scratch("restart");
    let config = ReservoirConfig { arrival_samples_per_hour_max: 8, seed: 1 };
    {
        let actor = ReservoirActor::new(config.clone(), Box::new(SledStore::open(&dir).unwrap()), 1_000, 64).unwrap().start();
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
    let store = SledStore::open(&dir).unwrap();
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
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn execution_records_logged_before_queueing_was_recorded_read_zero_queueing() {
    let old = r#"{"query":1,"template":3,"cluster":0,"size":16,"neighbours_at_dispatch":2,"latency":8000000,"censored":false}"#;
    let decoded: ExecutionRecord = serde_json::from_str(old).unwrap();
    assert_eq!(decoded, ExecutionRecord { queued: Duration::ZERO, ran_alone: false, ..record(1) });
}

#[actix_rt::test]
async fn arrival_samples_stay_within_the_bound() {
    let dir = scratch("bound");
    let store = SledStore::open(&dir).unwrap();
    let actor = ReservoirActor::new(ReservoirConfig { arrival_samples_per_hour_max: 16, seed: 2 }, Box::new(store), 10, 64).unwrap().start();
    for i in 0..500 {
        actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM + i * 7, template: TemplateId(1) }).await.unwrap().unwrap();
    }
    actor.send(Shutdown).await.unwrap().unwrap();
    let stored = SledStore::open(&dir).unwrap().load().unwrap();
    assert_eq!(stored.totals.iter().map(|(_, t)| t).sum::<u64>(), 500);
    assert!(stored.samples.len() <= 16, "{} samples kept", stored.samples.len());
    std::fs::remove_dir_all(&dir).ok();
}

#[actix_rt::test]
async fn unflushed_updates_are_flushed_within_a_second() {
    tokio::time::pause();
    let dir = scratch("interval");
    let actor = ReservoirActor::new(ReservoirConfig::default(), Box::new(SledStore::open(&dir).unwrap()), 1_000_000, 64).unwrap().start();
    actor.send(ArrivalUpdate { unix_secs: MONDAY_1PM, template: TemplateId(1) }).await.unwrap().unwrap();
    assert_eq!(actor.send(GetState).await.unwrap().unflushed, 1);
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    assert_eq!(actor.send(GetState).await.unwrap().unflushed, 0);
    actor.send(Shutdown).await.unwrap().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
