//! The EC2 and provisioned Redshift providers against moto's server,
//! started by each test on loopback.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use slogate_actors::provider::Provider;
use slogate_cloud::api::{CloudApi, CreateSpec};
use slogate_cloud::aws::ec2::{Ec2, Ec2Settings};
use slogate_cloud::aws::redshift::{Redshift, RedshiftSettings};
use slogate_cloud::aws::{Credentials, sdk_config};
use slogate_core::model::{ClusterId, PoolId, Rpu};
use slogate_core::scale::inventory::{Owner, ResourceState};
use slogate_core::scale::layout::Layout;
use slogate_integration::moto::Moto;
use support::sink::{Handed, RecordingSink, aws_settings, provider};

async fn config(moto: &Moto) -> aws_config::SdkConfig {
    sdk_config(&aws_settings(moto.url()), Some(Credentials::new("testing", "testing", None, None, "tests"))).await.unwrap()
}

fn pool() -> PoolId {
    PoolId::new("batch")
}

async fn launch_template(config: &aws_config::SdkConfig, name: &str) {
    let ec2 = aws_sdk_ec2::Client::new(config);
    let images = ec2.describe_images().send().await.unwrap();
    let image = images.images().first().and_then(|i| i.image_id()).expect("moto lists images").to_owned();
    ec2.create_launch_template()
        .launch_template_name(name)
        .launch_template_data(aws_sdk_ec2::types::RequestLaunchTemplateData::builder().image_id(image).build())
        .send()
        .await
        .unwrap();
}

fn ec2_settings(template: &str) -> Ec2Settings {
    Ec2Settings {
        launch_template: template.into(),
        instance_types: BTreeMap::from([(16, "m5.xlarge".to_owned()), (32, "m5.2xlarge".to_owned())]),
        service_port: 5432,
        public_address: false,
    }
}

#[actix_rt::test]
async fn ec2_instances_run_from_the_launch_template_tagged_serve_at_their_address_and_terminate_on_release() {
    let moto = Moto::start();
    let config = config(&moto).await;
    launch_template(&config, "engine").await;
    let missing = Ec2::new(&config, ec2_settings("nowhere")).check().await.unwrap_err();
    assert!(missing.message.contains("launch template `nowhere`"), "{missing}");
    let api = Ec2::new(&config, ec2_settings("engine"));
    api.check().await.expect("the template exists");

    let sink = Arc::new(RecordingSink::default());
    let provider = provider(api.clone(), sink.clone(), Duration::from_secs(20));
    let cluster = provider.spin_up(pool(), Rpu(32)).await.expect("launched");
    let handed = sink.wait_for(Duration::from_secs(20), |h| !h.is_empty()).await;
    let [Handed::Attached(attached, size, endpoint)] = handed.as_slice() else { panic!("expected one attach, got {handed:?}") };
    assert_eq!((*attached, *size), (cluster, Rpu(32)));
    assert_eq!(endpoint.port, 5432);
    assert!(endpoint.host.parse::<std::net::Ipv4Addr>().is_ok(), "the private address: {endpoint:?}");

    // The instance carries every tag and the size's instance type.
    let ec2 = aws_sdk_ec2::Client::new(&config);
    let described = ec2.describe_instances().send().await.unwrap();
    let instance = described.reservations().iter().flat_map(|r| r.instances()).next().expect("one instance");
    assert_eq!(instance.instance_type().map(|t| t.as_str()), Some("m5.2xlarge"));
    let tags: Vec<(&str, &str)> = instance.tags().iter().filter_map(|t| Some((t.key()?, t.value()?))).collect();
    let owner = Owner::from_tags(tags.iter().copied()).expect("slogate's tags");
    assert_eq!(owner, Owner { deployment: "test".into(), node: "n1".into(), pool: "batch".into(), cluster, size: Rpu(32) });

    // A size with no instance type is refused, naming the sizes there are.
    let refused = provider.spin_up(pool(), Rpu(64)).await.unwrap_err().to_string();
    assert!(refused.contains("no instance type is configured for 64 RPU (configured: 16, 32)"), "{refused}");

    // The deployment's listing finds it.
    let listed = api.list("test".into()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, ResourceState::Available);
    assert!(api.list("elsewhere".into()).await.unwrap().is_empty());

    provider.spin_down(pool(), cluster).await.unwrap();
    let handed = sink.wait_for(Duration::from_secs(10), |h| h.len() == 2).await;
    assert_eq!(handed[1], Handed::Drained(cluster));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let state = api.describe(listed[0].resource_id.clone()).await.unwrap();
        if state.state == ResourceState::Deleting {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the instance was not terminated: {state:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(api.list("test".into()).await.unwrap().is_empty(), "a terminated instance is not listed");
}

#[actix_rt::test]
async fn a_relaunch_with_the_same_name_never_runs_a_second_instance() {
    let moto = Moto::start();
    let config = config(&moto).await;
    launch_template(&config, "engine").await;
    let api = Ec2::new(&config, ec2_settings("engine"));
    let owner = Owner { deployment: "test".into(), node: "n1".into(), pool: "batch".into(), cluster: ClusterId(3), size: Rpu(16) };
    let spec = CreateSpec { name: "slogate-test-batch-c3".into(), owner };
    let first = api.create(spec.clone()).await.unwrap();
    let again = api.create(spec).await.unwrap();
    assert_eq!(first, again, "the second launch finds the first by its name (moto ignores client tokens)");
    assert_eq!(api.list("test".into()).await.unwrap().len(), 1);
}

fn redshift_settings(pause: bool) -> RedshiftSettings {
    RedshiftSettings {
        node_type: "ra3.xlplus".into(),
        rpu_per_node: 8,
        master_username: "admin".into(),
        master_password: "Passw0rd-test".into(),
        database: "dev".into(),
        pause_instead_of_delete: pause,
    }
}

#[actix_rt::test]
async fn provisioned_clusters_are_created_with_nodes_for_their_size_tagged_and_deleted_on_release() {
    let moto = Moto::start();
    let config = config(&moto).await;
    let api = Redshift::new(&config, redshift_settings(false));
    api.check().await.unwrap();
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(api.clone(), sink.clone(), Duration::from_secs(20));

    let cluster = provider.spin_up(pool(), Rpu(32)).await.unwrap();
    let handed = sink.wait_for(Duration::from_secs(20), |h| !h.is_empty()).await;
    assert!(matches!(&handed[0], Handed::Attached(c, Rpu(32), e) if *c == cluster && e.port > 0), "{handed:?}");
    let redshift = aws_sdk_redshift::Client::new(&config);
    let described = redshift.describe_clusters().cluster_identifier("slogate-test-batch-c0").send().await.unwrap();
    let created = &described.clusters()[0];
    assert_eq!(created.number_of_nodes(), Some(4), "32 RPU at 8 RPU a node");
    assert_eq!(created.node_type(), Some("ra3.xlplus"));
    let listed = api.list("test".into()).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].owner.cluster, cluster);

    provider.spin_down(pool(), cluster).await.unwrap();
    sink.wait_for(Duration::from_secs(10), |h| h.len() == 2).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !api.list("test".into()).await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the cluster was not deleted");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Spins a cluster of `size` up, waits until it serves, and releases it.
async fn serve_then_release(provider: &slogate_cloud::provider::CloudProvider, sink: &RecordingSink, size: Rpu) -> slogate_core::model::ClusterId {
    let cluster = provider.spin_up(pool(), size).await.unwrap();
    sink.wait_for(Duration::from_secs(20), |h| !h.is_empty()).await;
    provider.spin_down(pool(), cluster).await.unwrap();
    cluster
}

#[actix_rt::test]
async fn a_pool_that_pauses_pauses_on_release_and_a_restarted_node_resumes_the_paused_cluster_instead_of_creating_one() {
    let moto = Moto::start();
    let config = config(&moto).await;
    let api = Redshift::new(&config, redshift_settings(true));
    let sink = Arc::new(RecordingSink::default());
    let first_life = provider(api.clone(), sink.clone(), Duration::from_secs(20));
    let cluster = serve_then_release(&first_life, &sink, Rpu(8)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let paused = loop {
        let listed = api.list("test".into()).await.unwrap();
        if listed.first().is_some_and(|r| r.state == ResourceState::Paused) {
            break listed;
        }
        assert!(tokio::time::Instant::now() < deadline, "not paused: {listed:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(paused.len(), 1);

    // A new life of the node wants one 8-RPU cluster: it adopts the paused
    // one and resumes it, and creates nothing.
    let sink = Arc::new(RecordingSink::default());
    let second_life = provider(api.clone(), sink.clone(), Duration::from_secs(20));
    let adoption = second_life.reconcile(&pool(), &Layout { sizes_rpu: vec![8] }, false).await.unwrap();
    assert_eq!(adoption.adopt, [(cluster, paused[0].resource_id.clone())]);
    assert!(adoption.request.is_empty() && adoption.terminate.is_empty(), "{adoption:?}");
    let handed = sink.wait_for(Duration::from_secs(20), |h| !h.is_empty()).await;
    assert!(matches!(&handed[0], Handed::Attached(c, Rpu(8), _) if *c == cluster), "{handed:?}");
    let listed = api.list("test".into()).await.unwrap();
    assert_eq!(listed.len(), 1, "no second cluster");
    assert_eq!(listed[0].state, ResourceState::Available, "resumed");
}

#[actix_rt::test]
async fn a_pool_that_pauses_reuses_its_paused_cluster_for_the_next_spinup_resized_in_place_and_retagged() {
    let moto = Moto::start();
    let config = config(&moto).await;
    let api = Redshift::new(&config, redshift_settings(true));
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(api.clone(), sink.clone(), Duration::from_secs(20));
    let first = serve_then_release(&provider, &sink, Rpu(16)).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while provider.parked().get(&pool()).is_none_or(Vec::is_empty) {
        assert!(tokio::time::Instant::now() < deadline, "never parked: {:?}", provider.parked());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // The next spinup wants 32 RPU: the paused 16-RPU cluster is resumed,
    // resized to 4 nodes and tagged as the new cluster; nothing is created.
    let second = provider.spin_up(pool(), Rpu(32)).await.unwrap();
    assert_ne!(second, first, "a new cluster id");
    let handed = sink.wait_for(Duration::from_secs(20), |h| h.iter().any(|x| matches!(x, Handed::Attached(c, ..) if *c == second))).await;
    assert!(handed.iter().any(|x| matches!(x, Handed::Attached(c, Rpu(32), _) if *c == second)), "{handed:?}");
    let redshift = aws_sdk_redshift::Client::new(&config);
    let clusters = redshift.describe_clusters().send().await.unwrap();
    assert_eq!(clusters.clusters().len(), 1, "the paused cluster was reused, not a second one created");
    let reused = &clusters.clusters()[0];
    assert_eq!(reused.cluster_status(), Some("available"));
    assert_eq!(reused.number_of_nodes(), Some(4), "resized from 2 nodes to 4");
    let listed = api.list("test".into()).await.unwrap();
    assert_eq!((listed[0].owner.cluster, listed[0].owner.size), (second, Rpu(32)), "retagged as the new cluster");
    assert!(provider.parked().get(&pool()).is_none_or(Vec::is_empty));
    let state = provider.state().await.unwrap();
    assert!(state.recent.iter().any(|r| r.action == "resize" && r.result.contains("from 16 RPU")), "{:?}", state.recent);
}

#[actix_rt::test]
async fn reconciliation_parks_paused_clusters_the_layout_does_not_need_instead_of_deleting_them() {
    let moto = Moto::start();
    let config = config(&moto).await;
    let api = Redshift::new(&config, redshift_settings(true));
    for (cluster, size) in [(0, 8), (1, 16)] {
        let owner = Owner { deployment: "test".into(), node: "n0".into(), pool: "batch".into(), cluster: ClusterId(cluster), size: Rpu(size) };
        let name = api.create(CreateSpec { name: format!("slogate-test-batch-c{cluster}"), owner }).await.unwrap();
        api.delete(name).await.unwrap();
    }
    let sink = Arc::new(RecordingSink::default());
    let provider = provider(api.clone(), sink.clone(), Duration::from_secs(20));
    let adoption = provider.reconcile(&pool(), &Layout { sizes_rpu: vec![8] }, false).await.unwrap();
    assert_eq!(adoption.adopt.len(), 1);
    let parked = provider.parked();
    assert_eq!(parked[&pool()].iter().map(|p| p.size).collect::<Vec<_>>(), [Rpu(16)], "the unneeded paused cluster is kept for reuse");
    let listed = api.list("test".into()).await.unwrap();
    assert_eq!(listed.len(), 2, "nothing deleted: {listed:?}");
}
