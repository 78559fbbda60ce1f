//! The Redshift Serverless provider against the stand-in server
//! (`slogate_integration::serverless_stand_in`): the AWS SDK's real requests,
//! signing, retries and error parsing, on loopback.

mod support;

use std::sync::Arc;
use std::time::Duration;

use slogate_actors::provider::{ProvidedEndpoint, Provider};
use slogate_cloud::api::CloudApi;
use slogate_cloud::aws::serverless::{Serverless, ServerlessSettings};
use slogate_cloud::aws::{AwsSettings, sdk_config};
use slogate_core::model::{ClusterId, PoolId, Rpu};
use slogate_core::scale::inventory::tag;
use slogate_core::scale::layout::Layout;
use slogate_integration::serverless_stand_in::{ACCESS_KEY, Behaviour, ServerlessStandIn};
use support::sink::{Handed, RecordingSink, aws_settings, provider};

fn credentials() -> slogate_cloud::aws::Credentials {
    slogate_cloud::aws::Credentials::new(ACCESS_KEY, "stand-in-secret", None, None, "tests")
}

async fn serverless(stand_in: &ServerlessStandIn, namespace: &str) -> Serverless {
    let credentials = credentials();
    let config = sdk_config(&aws_settings(stand_in.url()), Some(credentials)).await.unwrap();
    Serverless::new(&config, settings(namespace))
}

fn settings(producer_namespace: &str) -> ServerlessSettings {
    ServerlessSettings {
        producer_namespace: Some(producer_namespace.into()),
        admin_username: "admin".into(),
        admin_password: "Passw0rd-test".into(),
        database: "dev".into(),
        publicly_accessible: false,
        port: None,
    }
}

fn pool() -> PoolId {
    PoolId::new("dash")
}

#[actix_rt::test]
async fn a_spinup_creates_a_tagged_workgroup_hands_its_endpoint_over_once_available_and_a_spindown_drains_then_deletes_it() {
    let stand_in = ServerlessStandIn::start(Behaviour { endpoint: ("127.0.0.1".into(), 15439), ..Behaviour::default() });
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(serverless(&stand_in, "analytics").await, sink.clone(), Duration::from_secs(10));

    let cluster = provider.spin_up(pool(), Rpu(32)).await.expect("the create is accepted");
    assert_eq!(cluster, ClusterId(0));
    let workgroups = stand_in.workgroups();
    assert_eq!(workgroups.len(), 1);
    let (name, status, tags) = &workgroups[0];
    assert_eq!(name, "slogate-test-dash-c0");
    assert_eq!(status, "CREATING");
    for (key, value) in [(tag::DEPLOYMENT, "test"), (tag::NODE, "n1"), (tag::POOL, "dash"), (tag::CLUSTER, "c0"), (tag::SIZE_RPU, "32")] {
        assert!(tags.contains(&(key.to_owned(), value.to_owned())), "tag {key}={value} missing from {tags:?}");
    }
    // One workgroup per namespace, as the service holds them: the
    // cluster's own namespace, tagged alike, with the pool's admin user.
    let namespaces = stand_in.namespaces();
    assert!(namespaces.iter().any(|(n, t)| n == "slogate-test-dash-c0" && t == tags), "{namespaces:?}");
    assert_eq!(stand_in.namespace_admin("slogate-test-dash-c0"), Some((Some("admin".into()), Some("dev".into()))));
    assert!(sink.handed().is_empty(), "nothing is handed over while it is creating");

    let handed = sink.wait_for(Duration::from_secs(5), |h| !h.is_empty()).await;
    assert_eq!(handed, [Handed::Attached(ClusterId(0), Rpu(32), ProvidedEndpoint { host: "127.0.0.1".into(), port: 15439 })]);
    let state = provider.state().await.unwrap();
    assert_eq!(state.kind, "redshift-serverless");
    assert_eq!(state.detail["resources"][0]["phase"], "serving");
    assert_eq!(state.detail["resources"][0]["resource_id"], "slogate-test-dash-c0");

    provider.spin_down(pool(), cluster).await.expect("the release is accepted");
    let handed = sink.wait_for(Duration::from_secs(5), |h| h.len() == 2).await;
    assert_eq!(handed[1], Handed::Drained(ClusterId(0)));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stand_in.calls("DeleteWorkgroup") == 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(stand_in.calls("DeleteWorkgroup"), 1, "deleted once, after the drain");
    // Its namespace goes once the workgroup is gone.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while stand_in.namespaces().iter().any(|(n, _)| n == "slogate-test-dash-c0") {
        assert!(tokio::time::Instant::now() < deadline, "the namespace was not deleted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The release logs its outcome once the deletes return: after the
    // namespace is gone, not before.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let mut state = provider.state().await.unwrap();
    while state.recent.len() < 4 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        state = provider.state().await.unwrap();
    }
    let actions: Vec<&str> = state.recent.iter().map(|r| r.action).collect();
    assert_eq!(actions, ["delete", "spin_down", "ready", "spin_up"], "newest first");
}

#[actix_rt::test]
async fn throttling_and_server_errors_on_create_are_retried_with_backoff_and_bounded() {
    let stand_in = ServerlessStandIn::start(Behaviour::default());
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(serverless(&stand_in, "analytics").await, sink.clone(), Duration::from_secs(10));

    // Two failures fit in three attempts.
    stand_in.throttle_creates(1);
    stand_in.fail_creates(1);
    provider.spin_up(pool(), Rpu(16)).await.expect("the third attempt succeeds");
    assert_eq!(stand_in.calls("CreateWorkgroup"), 3);

    // Three throttles use every attempt: the spinup fails, naming the code.
    stand_in.throttle_creates(3);
    let refused = provider.spin_up(pool(), Rpu(16)).await.unwrap_err().to_string();
    assert_eq!(stand_in.calls("CreateWorkgroup"), 6, "bounded at three attempts");
    assert!(refused.contains("ThrottlingException"), "{refused}");
    assert!(refused.contains("slogate-test-dash-c1"), "{refused}");
    let state = provider.state().await.unwrap();
    assert!(state.recent[0].result.contains("ThrottlingException"), "the log says why: {:?}", state.recent[0]);
    assert_eq!(stand_in.workgroups().len(), 1, "the refused spinup made nothing");
}

#[actix_rt::test]
async fn a_workgroup_that_never_becomes_available_times_out_is_deleted_and_the_cluster_is_abandoned_with_the_reason() {
    let stand_in = ServerlessStandIn::start(Behaviour::default());
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(serverless(&stand_in, "analytics").await, sink.clone(), Duration::from_millis(600));
    stand_in.never_available(1);

    let cluster = provider.spin_up(pool(), Rpu(64)).await.unwrap();
    let handed = sink.wait_for(Duration::from_secs(5), |h| !h.is_empty()).await;
    let [Handed::Abandoned(abandoned, reason)] = handed.as_slice() else { panic!("expected one abandon, got {handed:?}") };
    assert_eq!(*abandoned, cluster);
    assert!(reason.contains("did not become available within 1 s"), "{reason}");
    assert!(reason.contains("deleted it"), "{reason}");
    assert_eq!(stand_in.calls("DeleteWorkgroup"), 1);
    assert!(stand_in.workgroups().is_empty(), "the workgroup is gone");
    assert!(!stand_in.namespaces().iter().any(|(n, _)| n == "slogate-test-dash-c0"), "and its namespace");
    let state = provider.state().await.unwrap();
    assert_eq!(state.recent[0].action, "abandon");
    assert!(state.detail["resources"].as_array().unwrap().is_empty(), "the provider holds nothing more");
}

#[actix_rt::test]
async fn reconciliation_adopts_what_the_layout_needs_terminates_the_rest_and_leaves_others_alone() {
    let stand_in = ServerlessStandIn::start(Behaviour::default());
    let ours = |cluster: &'static str, size: &'static str| {
        [(tag::DEPLOYMENT, "test"), (tag::NODE, "n0"), (tag::POOL, "dash"), (tag::CLUSTER, cluster), (tag::SIZE_RPU, size)]
    };
    stand_in.seed_workgroup("slogate-test-dash-c0", 32, &ours("c0", "32"));
    // Created for a burst by a node that then died before noting it.
    stand_in.seed_workgroup("slogate-test-dash-c4", 128, &ours("c4", "128"));
    stand_in.seed_workgroup("slogate-test-other-c0", 32, &[(tag::DEPLOYMENT, "test"), (tag::NODE, "n0"), (tag::POOL, "other"), (tag::CLUSTER, "c0"), (tag::SIZE_RPU, "32")]);
    stand_in.seed_workgroup("someone-elses", 32, &[("team", "finance")]);
    // Half a cluster: a node died between creating the namespace and its
    // workgroup.
    stand_in.seed_namespace("slogate-test-dash-c6", &ours("c6", "32"));
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(serverless(&stand_in, "analytics").await, sink.clone(), Duration::from_secs(10));

    let adoption = provider.reconcile(&pool(), &Layout { sizes_rpu: vec![32, 32] }, false).await.unwrap();
    assert_eq!(adoption.adopt, [(ClusterId(0), "slogate-test-dash-c0".to_owned())]);
    let mut terminated: Vec<&str> = adoption.terminate.iter().map(|(id, _)| id.as_str()).collect();
    terminated.sort_unstable();
    assert_eq!(terminated, ["slogate-test-dash-c4", "slogate-test-dash-c6"]);
    assert_eq!(adoption.request, [Rpu(32)]);
    assert_eq!(adoption.next_cluster, ClusterId(7));
    // Terminations run on their own: the workgroup goes, then both
    // namespaces.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let namespaces: Vec<String> = stand_in.namespaces().into_iter().map(|(n, _)| n).collect();
        if !namespaces.iter().any(|n| n == "slogate-test-dash-c4" || n == "slogate-test-dash-c6") {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "not terminated: {namespaces:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let statuses: Vec<(String, String)> = stand_in.workgroups().into_iter().map(|(n, s, _)| (n, s)).collect();
    assert!(!statuses.iter().any(|(n, _)| n == "slogate-test-dash-c4"), "{statuses:?}");
    assert!(statuses.contains(&("slogate-test-other-c0".into(), "AVAILABLE".into())), "another pool's is left: {statuses:?}");
    assert!(statuses.contains(&("someone-elses".into(), "AVAILABLE".into())), "an untagged one is left: {statuses:?}");
    assert!(stand_in.calls("ListWorkgroups") >= 2, "the listing followed nextToken");

    // The adopted one is handed over; the next new cluster is c5.
    let handed = sink.wait_for(Duration::from_secs(5), |h| !h.is_empty()).await;
    assert!(matches!(handed[0], Handed::Attached(ClusterId(0), Rpu(32), _)), "{handed:?}");
    assert_eq!(provider.spin_up(pool(), Rpu(32)).await.unwrap(), ClusterId(7));
    let state = provider.state().await.unwrap();
    let terminations: Vec<&str> = state.recent.iter().filter(|r| r.action == "terminate").map(|r| r.result.as_str()).collect();
    assert_eq!(terminations.len(), 2, "{terminations:?}");
    assert!(terminations.iter().all(|r| r.starts_with("terminated slogate-test-dash-c")), "{terminations:?}");
    assert!(state.recent.iter().any(|r| r.action == "adopt"));
}

#[actix_rt::test]
async fn a_missing_namespace_or_a_wrong_key_is_an_error_that_names_it() {
    let stand_in = ServerlessStandIn::start(Behaviour::default());
    let missing = serverless(&stand_in, "nowhere").await.check().await.unwrap_err();
    assert_eq!(missing.code, "ResourceNotFoundException");
    assert!(missing.message.contains("namespace `nowhere`"), "{missing}");
    serverless(&stand_in, "analytics").await.check().await.expect("the namespace exists");

    let config = sdk_config(
        &aws_settings(stand_in.url()),
        Some(slogate_cloud::aws::Credentials::new("AKIDUNKNOWN", "x", None, None, "tests")),
    )
    .await
    .unwrap();
    let stranger = Serverless::new(&config, settings("analytics"));
    let refused = stranger.list("test".into()).await.unwrap_err();
    assert_eq!(refused.code, "UnrecognizedClientException", "{refused}");

    let wrong_region = sdk_config(&AwsSettings { region: "moon-1".into(), ..aws_settings(stand_in.url()) }, None).await.unwrap_err();
    assert!(wrong_region.to_string().contains("region `moon-1`"), "{wrong_region}");
}

#[actix_rt::test]
async fn a_node_handing_a_pool_over_leaves_its_workgroups_and_the_next_owner_adopts_them_creating_nothing() {
    let stand_in = ServerlessStandIn::start(Behaviour { endpoint: ("127.0.0.1".into(), 15439), ..Behaviour::default() });
    let old_sink = Arc::new(RecordingSink::default());
    let old_owner = support::sink::provider_on("n1", serverless(&stand_in, "analytics").await, old_sink.clone(), Duration::from_secs(10));
    assert_eq!(old_owner.reconcile(&pool(), &Layout { sizes_rpu: vec![32] }, false).await.unwrap().request, [Rpu(32)]);
    for size in [32, 64] {
        old_owner.spin_up(pool(), Rpu(size)).await.expect("the create is accepted");
    }
    old_sink.wait_for(Duration::from_secs(5), |h| h.len() == 2).await;
    let creates = stand_in.calls("CreateWorkgroup");

    let let_go = old_owner.hand_over(&pool());
    assert_eq!(let_go, [ClusterId(0), ClusterId(1)]);
    let handed = old_sink.handed();
    assert_eq!(handed[2..], [Handed::Detached(ClusterId(0)), Handed::Detached(ClusterId(1))], "the backend lets go of each");
    let state = old_owner.state().await.unwrap();
    assert_eq!(state.detail["resources"], serde_json::json!([]), "the old owner holds nothing");
    assert!(state.recent.iter().filter(|r| r.action == "hand_over").count() == 2);
    assert_eq!(stand_in.calls("DeleteWorkgroup"), 0, "nothing is deleted");

    // The next owner lists them by their tags and adopts both.
    let new_sink = Arc::new(RecordingSink::default());
    let new_owner = support::sink::provider_on("n2", serverless(&stand_in, "analytics").await, new_sink.clone(), Duration::from_secs(10));
    let adoption = new_owner.reconcile(&pool(), &Layout { sizes_rpu: vec![32, 64] }, false).await.unwrap();
    assert_eq!(adoption.adopt, [(ClusterId(0), "slogate-test-dash-c0".to_owned()), (ClusterId(1), "slogate-test-dash-c1".to_owned())]);
    assert!(adoption.terminate.is_empty() && adoption.request.is_empty(), "{adoption:?}");
    let handed = new_sink.wait_for(Duration::from_secs(5), |h| h.len() == 2).await;
    assert!(handed.iter().all(|h| matches!(h, Handed::Attached(..))), "{handed:?}");
    assert_eq!(stand_in.calls("CreateWorkgroup"), creates, "nothing created");
    assert_eq!(new_owner.spin_up(pool(), Rpu(32)).await.unwrap(), ClusterId(2), "new clusters are numbered above the adopted ones");
}
