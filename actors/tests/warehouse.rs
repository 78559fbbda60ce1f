//! The live emulated warehouse on paused tokio time: virtual latencies come
//! out exactly as the world model computes them, in no real time.

use actix::Actor;
use slogate_actors::clock::VirtualClock;
use slogate_actors::backend::ExecuteError;
use slogate_actors::warehouse::{AddCluster, EmulatedWarehouse, Execute, GetState, TearDown};
use slogate_core::model::{ClusterState, PoolId, Query, QueryId, Rpu, Slo, TemplateId};
use slogate_core::time::{Duration, Instant};
use slogate_core::model::ExecutionOutcome;
use slogate_world::WorldConfig;
use tokio::sync::oneshot;

fn quiet() -> WorldConfig {
    WorldConfig { noise_sigma: 0.0, ..WorldConfig::default() }
}

fn query(id: u64, template: u32) -> Query {
    Query {
        id: QueryId(id),
        pool: PoolId::default(),
        template: TemplateId(template),
        slo: Slo { latency: Duration::from_secs(100) },
        arrival: Instant::ZERO,
    }
}

#[actix_rt::test]
async fn a_lone_query_reports_its_isolated_latency_in_virtual_time() {
    tokio::time::pause();
    let expected = quiet().isolated_latency(TemplateId(4), Rpu(16));
    let warehouse = EmulatedWarehouse::new(quiet(), VirtualClock::start(1_000.0), 64).start();
    let cluster = warehouse.send(AddCluster { size: Rpu(16), warm: true }).await.unwrap();
    let (reply, report) = oneshot::channel();
    warehouse.send(Execute { query: query(1, 4), cluster, reply }).await.unwrap().unwrap();
    let report = report.await.unwrap().unwrap();
    assert_eq!(report.outcome, ExecutionOutcome::Completed);
    // Virtual time advances in whole real microseconds × 1000 here, so the
    // finish can land up to one compressed tick late.
    let error_ms = report.finished.as_secs_f64() * 1e3 - expected.as_secs_f64() * 1e3;
    assert!((0.0..=2.0).contains(&error_ms), "finished {} vs isolated {}", report.finished, expected);
    let state = warehouse.send(GetState).await.unwrap();
    assert_eq!((state.in_flight, state.finished), (0, 1));
    assert!(state.clusters[0].billed_usd > 0.0);
}

#[actix_rt::test]
async fn concurrent_queries_all_finish_and_share_the_cluster() {
    tokio::time::pause();
    let alone = quiet().isolated_latency(TemplateId(4), Rpu(16));
    let warehouse = EmulatedWarehouse::new(quiet(), VirtualClock::start(100.0), 256).start();
    let cluster = warehouse.send(AddCluster { size: Rpu(16), warm: true }).await.unwrap();
    let mut reports = Vec::new();
    for id in 0..20 {
        let (reply, report) = oneshot::channel();
        warehouse.send(Execute { query: query(id, 4), cluster, reply }).await.unwrap().unwrap();
        reports.push(report);
    }
    let mut finished = Vec::new();
    for report in reports {
        finished.push(report.await.unwrap().unwrap());
    }
    assert_eq!(finished.len(), 20);
    assert!(finished.iter().all(|r| r.latency() > alone), "sharing slows every query down");
}

#[actix_rt::test]
async fn bad_dispatches_are_refused_with_a_reason() {
    tokio::time::pause();
    let warehouse = EmulatedWarehouse::new(quiet(), VirtualClock::start(1_000.0), 64).start();
    let cluster = warehouse.send(AddCluster { size: Rpu(8), warm: true }).await.unwrap();
    let (reply, _report) = oneshot::channel();
    warehouse.send(Execute { query: query(1, 4), cluster, reply }).await.unwrap().unwrap();
    let (reply, _) = oneshot::channel();
    let duplicate = warehouse.send(Execute { query: query(1, 4), cluster, reply }).await.unwrap();
    assert_eq!(duplicate, Err(ExecuteError::Duplicate(QueryId(1))));
    let (reply, _) = oneshot::channel();
    let unknown = slogate_core::model::ClusterId(9);
    assert_eq!(warehouse.send(Execute { query: query(2, 4), cluster: unknown, reply }).await.unwrap(), Err(ExecuteError::UnknownCluster(unknown)));
    warehouse.send(TearDown(cluster)).await.unwrap().unwrap();
    let (reply, _) = oneshot::channel();
    let refused = warehouse.send(Execute { query: query(3, 4), cluster, reply }).await.unwrap();
    assert_eq!(refused, Err(ExecuteError::NotAccepting(cluster, ClusterState::Draining)));
}

#[actix_rt::test]
async fn a_requested_cluster_becomes_ready_after_the_spinup_delay() {
    tokio::time::pause();
    let delay = quiet().spinup_delay;
    let warehouse = EmulatedWarehouse::new(quiet(), VirtualClock::start(1_000.0), 64).start();
    let cluster = warehouse.send(AddCluster { size: Rpu(32), warm: false }).await.unwrap();
    assert_eq!(warehouse.send(GetState).await.unwrap().clusters[0].state, ClusterState::Starting);
    let (reply, report) = oneshot::channel();
    warehouse.send(Execute { query: query(1, 3), cluster, reply }).await.unwrap().unwrap();
    let report = report.await.unwrap().unwrap();
    assert!(report.started.unwrap() >= Instant::ZERO + delay);
    assert_eq!(warehouse.send(GetState).await.unwrap().clusters[0].state, ClusterState::Ready);
}
