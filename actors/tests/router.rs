//! The RouterShard with the emulated warehouse on paused tokio time.

use actix::{Actor, Addr};
use slogate_actors::Error;
use slogate_actors::clock::VirtualClock;
use slogate_actors::idempotency::RequestDigest;
use slogate_actors::provider::EmulatedProvider;
use slogate_actors::reservoir::{Flush, GetRecentExecutions, ReservoirActor, ReservoirLink, SledStore};
use slogate_actors::router::{Drain, FailInFlight, GetDecisions, GetRecentOutcomes, GetSloBook, GetState, PoolSetup, RouterLimits, RouterShard, Submit, SubmitStatus};
use slogate_actors::warehouse::{AddCluster, EmulatedWarehouse};
use slogate_core::model::{ClusterState, PoolId, Rpu, Slo, TemplateId};
use slogate_core::route::BaselinePolicy;
use slogate_core::time::Duration;
use slogate_world::WorldConfig;

async fn node(in_flight_max: usize) -> Addr<RouterShard> {
    node_logging_to(in_flight_max, 2, None).await
}

async fn node_logging_to(in_flight_max: usize, cluster_count: usize, reservoir: Option<ReservoirLink>) -> Addr<RouterShard> {
    node_with(BaselinePolicy::LeastLoaded.build(), in_flight_max, cluster_count, reservoir, Default::default()).await
}

async fn node_with(
    policy: Box<dyn slogate_core::route::RoutingPolicy>,
    in_flight_max: usize,
    cluster_count: usize,
    reservoir: Option<ReservoirLink>,
    caps: slogate_actors::router::PoolCaps,
) -> Addr<RouterShard> {
    let clock = VirtualClock::start(1_000.0);
    let warehouse = EmulatedWarehouse::new(WorldConfig::default(), clock, 4_096).start();
    let mut clusters = Vec::new();
    for _ in 0..cluster_count {
        let id = warehouse.send(AddCluster { size: Rpu(16), warm: true }).await.unwrap();
        clusters.push((id, Rpu(16), ClusterState::Ready));
    }
    let provider = EmulatedProvider::new(warehouse.clone(), clock, 64).start();
    let pool = PoolSetup {
        id: PoolId::default(),
        policy,
        provider: std::sync::Arc::new(provider),
        backend: std::sync::Arc::new(warehouse),
        catalog: std::sync::Arc::default(),
        clusters,
        in_flight_max,
        elastic: false,
        provisioned: None,
        caps,
        query_latency: std::sync::Arc::default(),
    };
    RouterShard::new(clock, vec![pool], reservoir, limits(3)).start()
}

/// The test shards' limits, remembering SLOs of at most `templates_max`
/// templates.
fn limits(templates_max: usize) -> RouterLimits {
    RouterLimits {
        billing: slogate_core::billing::BillingConfig::default(),
        decisions_max: 100,
        idempotency_max: 1_000,
        idempotency_retention_s: 86_400.0,
        mailbox_capacity: 4_096,
        templates_max,
        clusters_per_pool_max: 3,
    }
}

fn submit(id: &str, template: u32) -> Submit {
    Submit {
        pool: PoolId::default(),
        client_query_id: id.into(),
        tenant: String::new(),
        digest: RequestDigest { template: TemplateId(template), slo_ms: 120_000, sql: 0, rest: 0 },
        template: TemplateId(template),
        sql: None,
        slo: Slo { latency: Duration::from_secs(120) },
    }
}

#[actix_rt::test]
async fn every_accepted_query_gets_exactly_one_outcome() {
    tokio::time::pause();
    let router = node(1_000).await;
    let mut replies = Vec::new();
    for i in 0..100u32 {
        replies.push(router.send(submit(&format!("q{i}"), 1 + i % 99)).await.unwrap().unwrap());
    }
    let mut outcomes = Vec::new();
    for reply in replies {
        outcomes.push(reply.reply.await.unwrap());
    }
    assert!(outcomes.iter().all(|o| matches!(o.status, SubmitStatus::Completed | SubmitStatus::TimedOut)));
    assert!(outcomes.iter().all(|o| o.target.is_some() && o.latency > Duration::ZERO));
    let state = router.send(GetState).await.unwrap();
    let pool = &state.pools[0];
    assert_eq!(pool.stats.accepted, 100);
    assert_eq!(pool.stats.completed + pool.stats.timed_out, 100);
    assert_eq!(pool.in_flight, 0);
    assert!(pool.clusters.iter().all(|c| c.running.is_empty()));
    assert_eq!(router.send(GetDecisions { limit: 10, tenant: None, pool: None }).await.unwrap().len(), 10);
}

#[actix_rt::test]
async fn a_learning_policy_refits_off_the_routing_thread_and_its_fits_are_installed() {
    use slogate_core::predict::ConcurrencyAware;
    use slogate_core::predict::concurrency::ConcurrencyConfig;
    use slogate_core::route::slo::SloRouter;
    tokio::time::pause();
    let predictor = ConcurrencyAware::new(ConcurrencyConfig { refit_every: 16, ..ConcurrencyConfig::default() });
    let policy = Box::new(SloRouter::new("slogate", predictor, slogate_core::billing::BillingConfig::default()));
    let router = node_with(policy, 1_000, 2, None, Default::default()).await;
    let mut replies = Vec::new();
    for i in 0..100u32 {
        replies.push(router.send(submit(&format!("q{i}"), 1 + i % 7)).await.unwrap().unwrap());
    }
    for reply in replies {
        assert!(matches!(reply.reply.await.unwrap().status, SubmitStatus::Completed | SubmitStatus::TimedOut));
    }
    // Fits fall due after 1, 2, 4 and 8 completions, then every 16: ten in
    // all. One runs at a time per pool, so some are merged into the next.
    let mut fits = 0;
    for _ in 0..200 {
        fits = router.send(GetState).await.unwrap().pools[0].stats.predictor_fits;
        if fits > 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!((1..=10).contains(&fits), "{fits} fits installed");
}

#[actix_rt::test]
async fn the_slo_book_keeps_the_most_recently_seen_templates_and_counts_what_it_forgets() {
    tokio::time::pause();
    let router = node(1_000).await;
    let mut replies = Vec::new();
    // The node keeps 3 templates; 1 is seen again before 5 and 6 arrive.
    for (i, template) in [1, 2, 3, 1, 5, 6].into_iter().enumerate() {
        replies.push(router.send(submit(&format!("t{i}"), template)).await.unwrap().unwrap());
    }
    let book = router.send(GetSloBook { pool: PoolId::default() }).await.unwrap().unwrap();
    assert_eq!(book.keys().map(|t| t.0).collect::<Vec<_>>(), vec![1, 5, 6]);
    assert_eq!(router.send(GetState).await.unwrap().pools[0].stats.templates_evicted, 2);
    for reply in replies {
        reply.reply.await.unwrap();
    }
}

#[actix_rt::test]
async fn a_retried_query_id_runs_once_and_gets_the_same_reply() {
    tokio::time::pause();
    let router = node(1_000).await;
    let first = router.send(submit("same", 4)).await.unwrap().unwrap();
    let retry_in_flight = router.send(submit("same", 4)).await.unwrap().unwrap();
    let (first, retry_in_flight) = (first.reply.await.unwrap(), retry_in_flight.reply.await.unwrap());
    let retry_after = router.send(submit("same", 4)).await.unwrap().unwrap().reply.await.unwrap();
    assert_eq!(first, retry_in_flight);
    assert_eq!(first, retry_after);
    let stats = router.send(GetState).await.unwrap().pools[0].stats.clone();
    assert_eq!((stats.accepted, stats.deduplicated), (1, 2));
}

#[actix_rt::test]
async fn a_decision_s_explanation_is_shared_by_the_reply_the_decision_log_the_recent_outcomes_and_the_idempotency_table() {
    tokio::time::pause();
    let router = node(1_000).await;
    let outcome = router.send(submit("shared", 4)).await.unwrap().unwrap().reply.await.unwrap();
    let retry = router.send(submit("shared", 4)).await.unwrap().unwrap().reply.await.unwrap();
    let decisions = router.send(GetDecisions { limit: 1, tenant: None, pool: None }).await.unwrap();
    let recent = router.send(GetRecentOutcomes { pool: PoolId::default(), limit: 1, tenant: None }).await.unwrap();
    assert!(!outcome.explanation.is_empty());
    // One text, referenced from each: the routing thread copies none of it.
    for (holder, explanation) in [("decision log", &decisions[0].explanation), ("recent outcomes", &recent[0].explanation), ("idempotency table", &retry.explanation)] {
        assert!(std::sync::Arc::ptr_eq(&outcome.explanation, explanation), "the {holder} holds a copy: {explanation}");
    }
}

#[actix_rt::test]
async fn a_query_every_client_abandoned_is_cancelled_and_a_retry_of_its_id_runs_anew() {
    use slogate_actors::router::ClientGone;
    tokio::time::pause();
    let router = node(1_000).await;
    let abandoned = router.send(submit("left", 4)).await.unwrap().unwrap();
    let query = abandoned.query;
    drop(abandoned.reply);
    router.send(ClientGone { pool: PoolId::default(), query }).await.unwrap();
    // Retried at once (a forwarding node re-sending it after its first
    // owner failed), the id starts a new run instead of joining the
    // cancelled one or getting its cancellation.
    let retry = router.send(submit("left", 4)).await.unwrap().unwrap();
    assert_ne!(retry.query, query);
    let outcome = retry.reply.await.unwrap();
    assert_eq!(outcome.status, SubmitStatus::Completed, "{outcome:?}");
    // And that run's outcome is the one remembered.
    let again = router.send(submit("left", 4)).await.unwrap().unwrap().reply.await.unwrap();
    assert_eq!(again, outcome);
    let stats = router.send(GetState).await.unwrap().pools[0].stats.clone();
    assert_eq!((stats.accepted, stats.failed, stats.completed, stats.deduplicated), (2, 1, 1, 1));
}

#[actix_rt::test]
async fn a_retry_with_other_content_is_refused_and_tenants_do_not_share_ids() {
    tokio::time::pause();
    let router = node(1_000).await;
    let first = router.send(submit("same", 4)).await.unwrap().unwrap();
    // In flight and after: another template under the same id is refused.
    let changed = router.send(submit("same", 5)).await.unwrap().unwrap_err();
    assert!(matches!(changed, Error::IdempotencyMismatch { field: "template", .. }), "{changed:?}");
    first.reply.await.unwrap();
    let slower = Submit { digest: RequestDigest { slo_ms: 1, ..submit("same", 4).digest }, ..submit("same", 4) };
    let refused = router.send(slower).await.unwrap().unwrap_err();
    assert!(refused.to_string().contains("different slo_ms"), "{refused}");
    // Another tenant's "same" is another query.
    let other = Submit { tenant: "b".into(), ..submit("same", 5) };
    router.send(other).await.unwrap().unwrap().reply.await.unwrap();
    let stats = router.send(GetState).await.unwrap().pools[0].stats.clone();
    assert_eq!((stats.accepted, stats.deduplicated), (2, 0));
}

#[actix_rt::test]
async fn unknown_pool_admission_limit_and_draining_are_refused() {
    tokio::time::pause();
    let router = node(2).await;
    let unknown = Submit { pool: PoolId::new("nope"), ..submit("a", 4) };
    assert!(matches!(router.send(unknown).await.unwrap(), Err(Error::UnknownPool(p)) if p == "nope"));
    let _a = router.send(submit("a", 4)).await.unwrap().unwrap();
    let _b = router.send(submit("b", 4)).await.unwrap().unwrap();
    assert!(matches!(router.send(submit("c", 4)).await.unwrap(), Err(Error::AdmissionLimit { in_flight: 2, limit: 2 })));
    router.send(Drain).await.unwrap();
    assert!(matches!(router.send(submit("d", 4)).await.unwrap(), Err(Error::ShuttingDown)));
    // In-flight queries still finish after the drain starts.
    assert_eq!(_a.reply.await.unwrap().status, SubmitStatus::Completed);
}

#[actix_rt::test]
async fn queries_still_running_at_the_end_of_shutdown_fail_with_a_reason() {
    tokio::time::pause();
    let router = node(1_000).await;
    let reply = router.send(submit("slow", 4)).await.unwrap().unwrap();
    router.send(Drain).await.unwrap();
    assert_eq!(router.send(FailInFlight { reason: "shutting down".into() }).await.unwrap(), 1);
    let outcome = reply.reply.await.unwrap();
    assert_eq!(outcome.status, SubmitStatus::Failed);
    assert_eq!(&*outcome.explanation, "shutting down");
    let state = router.send(GetState).await.unwrap();
    assert_eq!((state.pools[0].in_flight, state.pools[0].stats.failed), (0, 1));
}

#[actix_rt::test]
async fn a_requested_cluster_starts_then_takes_queries_once_ready() {
    use slogate_actors::router::{ReleaseCluster, RequestCluster};
    tokio::time::pause();
    let router = node(1_000).await;
    let cluster = router.send(RequestCluster { pool: PoolId::default(), size: Rpu(32) }).await.unwrap().unwrap();
    let view = |state: &slogate_actors::router::RouterState| state.pools[0].clusters.iter().find(|c| c.id == cluster).unwrap().state;
    assert_eq!(view(&router.send(GetState).await.unwrap()), ClusterState::Starting);
    // δ = 300 virtual seconds = 300 ms here.
    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(view(&router.send(GetState).await.unwrap()), ClusterState::Ready);
    router.send(ReleaseCluster { pool: PoolId::default(), cluster, force: false }).await.unwrap().unwrap();
    assert_eq!(view(&router.send(GetState).await.unwrap()), ClusterState::Draining);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(view(&router.send(GetState).await.unwrap()), ClusterState::Gone);
}

#[actix_rt::test]
async fn the_execution_log_records_queueing_and_whether_a_query_ran_alone() {
    tokio::time::pause();
    let scratch_dir = tempfile::Builder::new().prefix("slogate-router-log-").tempdir().unwrap();
    let dir = scratch_dir.path();
    let store = SledStore::open(dir).unwrap();
    let reservoir = ReservoirActor::new(slogate_core::reservoir::ReservoirConfig::default(), Box::new(store), 1, 64).unwrap().start_linked();
    // One 16-RPU cluster: a lone query, then eight at once, more than its
    // admission slots.
    let router = node_logging_to(1_000, 1, Some(reservoir.clone())).await;
    router.send(submit("alone", 40)).await.unwrap().unwrap().reply.await.unwrap();
    let mut replies = Vec::new();
    for i in 0..8 {
        replies.push(router.send(submit(&format!("crowd{i}"), 40)).await.unwrap().unwrap());
    }
    for reply in replies {
        reply.reply.await.unwrap();
    }
    router.send(slogate_actors::router::FlushLog).await.unwrap();
    reservoir.addr().send(Flush).await.unwrap().unwrap();
    let log = reservoir.addr().send(GetRecentExecutions { limit: 100 }).await.unwrap().unwrap();
    assert_eq!(log.len(), 9);
    assert!(log[0].ran_alone && log[0].queued == Duration::ZERO, "{:?}", log[0]);
    assert!(log[1..].iter().all(|r| !r.ran_alone));
    assert!(log[1..].iter().any(|r| r.queued > Duration::from_secs(1)), "{log:?}");
}

#[actix_rt::test]
async fn a_pool_refuses_clusters_beyond_its_cap_and_keeps_its_last_ready_cluster_unless_forced() {
    use slogate_actors::router::{ReleaseCluster, RequestCluster};
    tokio::time::pause();
    // Two ready clusters; the cap is 3.
    let router = node(1_000).await;
    router.send(RequestCluster { pool: PoolId::default(), size: Rpu(16) }).await.unwrap().unwrap();
    let refused = router.send(RequestCluster { pool: PoolId::default(), size: Rpu(16) }).await.unwrap().unwrap_err();
    assert!(matches!(refused, Error::ClusterLimit { limit: 3, .. }), "{refused}");
    let state = router.send(GetState).await.unwrap();
    let ready: Vec<_> = state.pools[0].clusters.iter().filter(|c| c.state == ClusterState::Ready).map(|c| c.id).collect();
    assert_eq!(ready.len(), 2);
    router.send(ReleaseCluster { pool: PoolId::default(), cluster: ready[0], force: false }).await.unwrap().unwrap();
    let last = router.send(ReleaseCluster { pool: PoolId::default(), cluster: ready[1], force: false }).await.unwrap().unwrap_err();
    assert!(matches!(last, Error::LastReadyCluster { .. }), "{last}");
    assert!(last.to_string().contains("force"));
    router.send(ReleaseCluster { pool: PoolId::default(), cluster: ready[1], force: true }).await.unwrap().unwrap();
}

#[actix_rt::test]
async fn a_spinup_past_a_pool_cap_is_refused_naming_the_cap_whoever_asks() {
    use slogate_actors::router::{PoolCaps, RequestCluster};
    use slogate_core::scale::caps::Caps;
    tokio::time::pause();
    // One ready cluster of 16 RPU; at most 40 RPU and $14 an hour.
    let caps = PoolCaps { caps: Caps { clusters_max: None, rpu_total_max: Some(40), spend_per_hour_max_usd: Some(14.0) }, price_per_rpu_hour_usd: 0.375 };
    let router = node_with(BaselinePolicy::LeastLoaded.build(), 1_000, 1, None, caps).await;
    let refused = router.send(RequestCluster { pool: PoolId::default(), size: Rpu(32) }).await.unwrap().unwrap_err();
    assert!(matches!(&refused, Error::CapReached { reason, .. } if reason.contains("cap of 40 RPU")), "{refused}");
    // 16 more fit both caps (32 RPU bill $12/h).
    router.send(RequestCluster { pool: PoolId::default(), size: Rpu(16) }).await.unwrap().unwrap();
    // 8 more fit 40 RPU but would bill $15/h.
    let refused = router.send(RequestCluster { pool: PoolId::default(), size: Rpu(8) }).await.unwrap().unwrap_err();
    assert!(matches!(&refused, Error::CapReached { reason, .. } if reason.contains("$15.00/h") && reason.contains("$14.00/h")), "{refused}");
    let state = router.send(GetState).await.unwrap();
    assert_eq!(state.pools[0].clusters.len(), 2);
}

/// An elastic tier that refuses every invocation for its rate, as Lambda's
/// 429 does, counting them.
struct ThrottlingTier {
    invocations: std::sync::atomic::AtomicUsize,
}

impl slogate_actors::elastic::ElasticTier for ThrottlingTier {
    fn invoke(&self, _execution: slogate_actors::backend::Execution) -> slogate_actors::backend::LocalFuture<Result<slogate_actors::backend::Completion, slogate_actors::backend::ExecuteError>> {
        self.invocations.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async { Err(slogate_actors::backend::ExecuteError::Throttled("Rate exceeded (429)".into())) })
    }

    fn state(&self) -> slogate_actors::elastic::ElasticTierState {
        slogate_actors::elastic::ElasticTierState { kind: "throttling", billed_usd: 0.0, detail: serde_json::Value::Null }
    }
}

/// Offloads every query until the tier throttles one, then routes to the
/// first cluster, if `clusters_allowed`, or rejects.
struct OffloadUntilThrottled {
    throttled: bool,
    clusters_allowed: bool,
}

impl slogate_core::route::RoutingPolicy for OffloadUntilThrottled {
    fn name(&self) -> &str {
        "offload-until-throttled"
    }

    fn route(&mut self, _now: slogate_core::time::Instant, _query: &slogate_core::model::Query, pool: &slogate_core::model::Pool) -> slogate_core::route::Routing {
        use slogate_core::route::{RouteDecision, Routing};
        if !self.throttled {
            return Routing::Dispatch(RouteDecision { target: slogate_core::model::Target::Elastic, explanation: "offloaded".into(), predicted_latency: None });
        }
        if !self.clusters_allowed {
            return Routing::Reject { reason: "no cluster may take it".into() };
        }
        let cluster = pool.clusters[0].id;
        Routing::Dispatch(RouteDecision { target: slogate_core::model::Target::Cluster(cluster), explanation: "the tier is cooling down".into(), predicted_latency: None })
    }

    fn handle_failure(&mut self, _now: slogate_core::time::Instant, _query: slogate_core::model::QueryId, throttled: bool) {
        self.throttled |= throttled;
    }
}

async fn node_offloading_to_a_throttling_tier(clusters_allowed: bool) -> (Addr<RouterShard>, std::sync::Arc<ThrottlingTier>) {
    let clock = VirtualClock::start(1_000.0);
    let warehouse = EmulatedWarehouse::new(WorldConfig::default(), clock, 4_096).start();
    let cluster = warehouse.send(AddCluster { size: Rpu(16), warm: true }).await.unwrap();
    let provider = EmulatedProvider::new(warehouse.clone(), clock, 64).start();
    let tier = std::sync::Arc::new(ThrottlingTier { invocations: Default::default() });
    let backend = slogate_actors::elastic::WithElastic::new(std::sync::Arc::new(warehouse), tier.clone());
    let pool = PoolSetup {
        id: PoolId::default(),
        policy: Box::new(OffloadUntilThrottled { throttled: false, clusters_allowed }),
        provider: std::sync::Arc::new(provider),
        backend: std::sync::Arc::new(backend),
        catalog: std::sync::Arc::default(),
        clusters: vec![(cluster, Rpu(16), ClusterState::Ready)],
        in_flight_max: 100,
        elastic: true,
        provisioned: None,
        caps: Default::default(),
        query_latency: std::sync::Arc::default(),
    };
    (RouterShard::new(clock, vec![pool], None, limits(16)).start(), tier)
}

#[actix_rt::test]
async fn an_offload_the_elastic_tier_throttles_is_routed_again_to_a_cluster_and_completes_there() {
    tokio::time::pause();
    let (router, tier) = node_offloading_to_a_throttling_tier(true).await;
    let submitted = router.send(submit("q1", 3)).await.unwrap().unwrap();
    let outcome = submitted.reply.await.unwrap();

    assert_eq!(outcome.status, SubmitStatus::Completed, "{outcome:?}");
    assert!(matches!(outcome.target, Some(slogate_core::model::Target::Cluster(_))), "{outcome:?}");
    assert!(outcome.explanation.contains("the elastic tier throttled it (") && outcome.explanation.contains("routed again: the tier is cooling down"), "{}", outcome.explanation);
    assert_eq!(tier.invocations.load(std::sync::atomic::Ordering::SeqCst), 1, "the tier is tried once");
    let decisions = router.send(GetDecisions { limit: 10, tenant: None, pool: None }).await.unwrap();
    assert_eq!(decisions.len(), 2, "the offload and the re-route are both decisions: {decisions:?}");
    assert!(decisions[0].explanation.contains("routed again") && decisions[1].target == Some(slogate_core::model::Target::Elastic), "{decisions:?}");
    let state = router.send(GetState).await.unwrap();
    let pool = &state.pools[0];
    assert_eq!((pool.stats.offloads_rerouted, pool.stats.completed, pool.stats.failed, pool.in_flight), (1, 1, 0, 0));
    assert!(pool.clusters.iter().all(|c| c.running.is_empty()));
}

#[actix_rt::test]
async fn a_throttled_offload_no_cluster_can_take_fails_naming_the_throttle() {
    tokio::time::pause();
    let (router, _tier) = node_offloading_to_a_throttling_tier(false).await;
    let submitted = router.send(submit("q1", 3)).await.unwrap().unwrap();
    let outcome = submitted.reply.await.unwrap();

    assert_eq!(outcome.status, SubmitStatus::Failed, "{outcome:?}");
    assert!(outcome.explanation.contains("Rate exceeded (429)"), "{}", outcome.explanation);
    let state = router.send(GetState).await.unwrap();
    assert_eq!((state.pools[0].stats.offloads_rerouted, state.pools[0].stats.failed, state.pools[0].in_flight), (0, 1, 0));
}
