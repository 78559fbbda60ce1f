//! The ClusterTracker on paused time: it runs queries through the backend
//! and its own billing estimate matches the warehouse's bill.

use actix::{Actor, Addr};
use slogate_actors::clock::VirtualClock;
use slogate_actors::provider::EmulatedProvider;
use slogate_actors::tracker::{ClusterTracker, Dispatch, GetState, Release, TrackerSetup};
use slogate_actors::warehouse::{self, AddCluster, EmulatedWarehouse};
use slogate_core::billing::BillingConfig;
use slogate_core::model::{ClusterId, ClusterState, PoolId, Query, QueryId, Rpu, Slo, TemplateId};
use slogate_core::time::{Duration, Instant};
use slogate_world::WorldConfig;
use tokio::sync::oneshot;

/// A tracker for a 16-RPU `cluster` of `backend`.
fn tracker(backend: &Addr<EmulatedWarehouse>, cluster: ClusterId, state: ClusterState, clock: VirtualClock) -> Addr<ClusterTracker> {
    ClusterTracker::new(TrackerSetup {
        pool: PoolId::default(),
        cluster,
        size: Rpu(16),
        state,
        billing: BillingConfig::default(),
        provisioned: None,
        backend: std::sync::Arc::new(backend.clone()),
        provider: std::sync::Arc::new(EmulatedProvider::new(backend.clone(), clock, 64).start()),
        clock,
        mailbox_capacity: 256,
    })
    .start()
}

#[actix_rt::test]
async fn tracker_runs_queries_and_estimates_the_bill_the_warehouse_charges() {
    tokio::time::pause();
    let clock = VirtualClock::start(1_000.0);
    let backend = EmulatedWarehouse::new(WorldConfig::default(), clock, 256).start();
    let cluster = backend.send(AddCluster { size: Rpu(16), warm: true }).await.unwrap();
    let tracker = tracker(&backend, cluster, ClusterState::Ready, clock);
    let mut reports = Vec::new();
    for id in 0..5 {
        let (reply, report) = oneshot::channel();
        let query = Query {
            id: QueryId(id),
            pool: PoolId::default(),
            template: TemplateId(3 + id as u32),
            slo: Slo { latency: Duration::from_secs(100) },
            arrival: Instant::ZERO,
        };
        tracker.send(Dispatch { query, sql: None, reply }).await.unwrap().unwrap();
        reports.push(report);
    }
    for report in reports {
        report.await.unwrap();
    }
    // Let both timers close their minimum windows.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let state = tracker.send(GetState).await.unwrap();
    assert_eq!((state.finished, state.running.len()), (5, 0));
    let billed = backend.send(warehouse::GetState).await.unwrap().clusters[0].billed_usd;
    assert!(state.billed_usd_estimate > 0.0);
    assert!((state.billed_usd_estimate / billed - 1.0).abs() < 0.01, "estimate {} vs bill {billed}", state.billed_usd_estimate);

    tracker.send(Release).await.unwrap().unwrap();
    let (reply, _) = oneshot::channel();
    let late = Query { id: QueryId(9), pool: PoolId::default(), template: TemplateId(3), slo: Slo { latency: Duration::from_secs(1) }, arrival: Instant::ZERO };
    assert!(tracker.send(Dispatch { query: late, sql: None, reply }).await.unwrap().is_err());
}

#[actix_rt::test]
async fn a_cluster_released_while_starting_still_bills_the_queries_it_holds() {
    tokio::time::pause();
    let clock = VirtualClock::start(1_000.0);
    let backend = EmulatedWarehouse::new(WorldConfig::default(), clock, 256).start();
    let cluster = backend.send(AddCluster { size: Rpu(16), warm: false }).await.unwrap();
    let tracker = tracker(&backend, cluster, ClusterState::Starting, clock);
    let (reply, report) = oneshot::channel();
    let query = Query { id: QueryId(1), pool: PoolId::default(), template: TemplateId(3), slo: Slo { latency: Duration::from_secs(900) }, arrival: Instant::ZERO };
    tracker.send(Dispatch { query, sql: None, reply }).await.unwrap().unwrap();
    // Released before δ = 300 virtual seconds (0.3 s here) pass: it runs
    // what it holds once provisioned, then goes.
    tracker.send(Release).await.unwrap().unwrap();
    report.await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let state = tracker.send(GetState).await.unwrap();
    assert_eq!(state.state, ClusterState::Gone, "{state:?}");
    let billed = backend.send(warehouse::GetState).await.unwrap().clusters[0].billed_usd;
    assert!(billed > 0.0);
    assert!((state.billed_usd_estimate / billed - 1.0).abs() < 0.01, "estimate {} vs bill {billed}", state.billed_usd_estimate);
}
