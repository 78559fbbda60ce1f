//! Provisioned Redshift clusters (`aws-sdk-redshift`): a cluster of size s
//! is s ÷ `rpu_per_node` nodes (at least one) of the pool's node type,
//! named by slogate and tagged at creation. The cluster identifier is its
//! id; creating an identifier that exists answers that cluster (resumed,
//! if it was paused). A pool configured to pause releases its
//! clusters by pausing them (they bill for storage only) instead of
//! deleting them, and a later cluster reuses a paused one: it is
//! retagged as the new cluster's, resumed, and resized (`ModifyCluster`
//! with the node count, the in-place resize) when its size differs.

use aws_config::SdkConfig;
use aws_sdk_redshift::Client;
use aws_sdk_redshift::types::{Cluster, Tag};
use slogate_actors::provider::ProvidedEndpoint;
use slogate_core::scale::inventory::{Listed, Owner, ResourceState};

use crate::api::{CallFuture, CloudApi, CloudError, CreateSpec, Described};
use crate::aws::cloud_error;
pub use crate::platform::RedshiftSettings;

/// Provisioned Redshift as a [`CloudApi`].
#[derive(Clone, Debug)]
pub struct Redshift {
    client: Client,
    settings: RedshiftSettings,
}

impl Redshift {
    /// Clusters through `config`.
    pub fn new(config: &SdkConfig, settings: RedshiftSettings) -> Self {
        Redshift { client: Client::new(config), settings }
    }

    /// Checks the endpoint, region and credentials with one listing call.
    pub async fn check(&self) -> Result<(), CloudError> {
        self.client.describe_clusters().max_records(20).send().await.map(|_| ()).map_err(cloud_error)
    }

    /// Nodes for `size_rpu`.
    pub fn nodes_for(&self, size_rpu: u32) -> i32 {
        i32::try_from((size_rpu / self.settings.rpu_per_node.max(1)).max(1)).unwrap_or(i32::MAX)
    }

    /// The cluster's ARN, which tagging calls name it by, as the tag
    /// listing of clusters gives it (it holds the account id, which no
    /// cluster call answers).
    async fn arn(&self, identifier: &str) -> Result<String, CloudError> {
        let suffix = format!(":cluster:{identifier}");
        let mut marker: Option<String> = None;
        loop {
            let page = self.client.describe_tags().resource_type("cluster").set_marker(marker.take()).send().await.map_err(cloud_error)?;
            if let Some(arn) = page.tagged_resources().iter().filter_map(|r| r.resource_name()).find(|name| name.ends_with(&suffix)) {
                return Ok(arn.to_owned());
            }
            match page.marker() {
                Some(next) if !next.is_empty() => marker = Some(next.to_owned()),
                _ => return Err(CloudError::new("NotFound", format!("no tagged cluster `{identifier}`"))),
            }
        }
    }

    async fn find(&self, identifier: &str) -> Result<Option<Cluster>, CloudError> {
        match self.client.describe_clusters().cluster_identifier(identifier).send().await {
            Ok(reply) => Ok(reply.clusters().first().cloned()),
            Err(error) if error.as_service_error().is_some_and(|e| e.is_cluster_not_found_fault()) => Ok(None),
            Err(error) => Err(cloud_error(error)),
        }
    }
}

fn described(cluster: &Cluster) -> Described {
    let status = cluster.cluster_status().unwrap_or("unknown").to_owned();
    let state = match status.as_str() {
        "available" => ResourceState::Available,
        "creating" | "resuming" | "modifying" | "rebooting" | "renaming" | "resizing" | "available, prep-for-resize" | "available, resize-cleanup" => {
            ResourceState::Creating
        }
        "paused" | "pausing" => ResourceState::Paused,
        "deleting" | "final-snapshot" => ResourceState::Deleting,
        _ => ResourceState::Failed,
    };
    let endpoint = (state == ResourceState::Available)
        .then(|| cluster.endpoint())
        .flatten()
        .and_then(|e| Some(ProvidedEndpoint { host: e.address()?.to_owned(), port: u16::try_from(e.port()?).ok()? }));
    Described { state, endpoint, status }
}

impl CloudApi for Redshift {
    fn kind(&self) -> &'static str {
        "redshift"
    }

    fn create(&self, spec: CreateSpec) -> CallFuture<String> {
        let this = self.clone();
        Box::pin(async move {
            if let Some(existing) = this.find(&spec.name).await? {
                // An earlier attempt made it: it is this cluster's.
                if described(&existing).state == ResourceState::Paused {
                    this.client.resume_cluster().cluster_identifier(&spec.name).send().await.map_err(cloud_error)?;
                }
                return Ok(spec.name);
            }
            let nodes = this.nodes_for(spec.owner.size.0);
            let mut request = this
                .client
                .create_cluster()
                .cluster_identifier(&spec.name)
                .node_type(&this.settings.node_type)
                .master_username(&this.settings.master_username)
                .master_user_password(&this.settings.master_password)
                .db_name(&this.settings.database)
                .cluster_type(if nodes == 1 { "single-node" } else { "multi-node" });
            if nodes > 1 {
                request = request.number_of_nodes(nodes);
            }
            for (key, value) in spec.owner.tags() {
                request = request.tags(Tag::builder().key(key).value(value).build());
            }
            match request.send().await {
                Ok(_) => Ok(spec.name),
                Err(error) if error.as_service_error().is_some_and(|e| e.is_cluster_already_exists_fault()) => Ok(spec.name),
                Err(error) => Err(cloud_error(error)),
            }
        })
    }

    fn resume(&self, resource_id: String) -> CallFuture<()> {
        let client = self.client.clone();
        Box::pin(async move { client.resume_cluster().cluster_identifier(&resource_id).send().await.map(|_| ()).map_err(cloud_error) })
    }

    fn describe(&self, resource_id: String) -> CallFuture<Described> {
        let this = self.clone();
        Box::pin(async move {
            Ok(this.find(&resource_id).await?.map_or_else(|| Described { state: ResourceState::Deleting, endpoint: None, status: "not found".into() }, |c| described(&c)))
        })
    }

    fn delete(&self, resource_id: String) -> CallFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let result = if this.settings.pause_instead_of_delete {
                this.client.pause_cluster().cluster_identifier(&resource_id).send().await.map(|_| ()).map_err(cloud_error)
            } else {
                this.client.delete_cluster().cluster_identifier(&resource_id).skip_final_cluster_snapshot(true).send().await.map(|_| ()).map_err(|error| {
                    if error.as_service_error().is_some_and(|e| e.is_cluster_not_found_fault()) { CloudError::new("NotFound", String::new()) } else { cloud_error(error) }
                })
            };
            match result {
                Err(error) if error.code == "NotFound" => Ok(()),
                other => other,
            }
        })
    }

    fn parks(&self) -> bool {
        self.settings.pause_instead_of_delete
    }

    fn retag(&self, resource_id: String, owner: Owner) -> CallFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let arn = this.arn(&resource_id).await?;
            let tags = owner.tags().into_iter().map(|(key, value)| Tag::builder().key(key).value(value).build()).collect();
            this.client.create_tags().resource_name(arn).set_tags(Some(tags)).send().await.map(|_| ()).map_err(cloud_error)
        })
    }

    fn resize(&self, resource_id: String, size: slogate_core::model::Rpu) -> CallFuture<()> {
        let this = self.clone();
        Box::pin(async move {
            let nodes = this.nodes_for(size.0);
            // ModifyCluster resizes with the node type and count both named.
            let mut request = this
                .client
                .modify_cluster()
                .cluster_identifier(&resource_id)
                .node_type(&this.settings.node_type)
                .cluster_type(if nodes == 1 { "single-node" } else { "multi-node" });
            if nodes > 1 {
                request = request.number_of_nodes(nodes);
            }
            request.send().await.map(|_| ()).map_err(cloud_error)
        })
    }

    fn list(&self, deployment: String) -> CallFuture<Vec<Listed>> {
        let client = self.client.clone();
        Box::pin(async move {
            let mut listed = Vec::new();
            let mut marker: Option<String> = None;
            loop {
                let page = client.describe_clusters().set_marker(marker.take()).send().await.map_err(cloud_error)?;
                for cluster in page.clusters() {
                    let Some(id) = cluster.cluster_identifier() else { continue };
                    let Some(owner) = Owner::from_tags(cluster.tags().iter().filter_map(|t| Some((t.key()?, t.value()?)))) else { continue };
                    let state = described(cluster).state;
                    if owner.deployment == deployment && state != ResourceState::Deleting {
                        listed.push(Listed { resource_id: id.to_owned(), owner, state });
                    }
                }
                match page.marker() {
                    Some(next) if !next.is_empty() => marker = Some(next.to_owned()),
                    _ => return Ok(listed),
                }
            }
        })
    }
}
