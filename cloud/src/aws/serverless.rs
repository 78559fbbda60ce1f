//! Redshift Serverless (`aws-sdk-redshiftserverless`). The service holds
//! one workgroup per namespace, so a cluster of size s is a namespace and a
//! workgroup of the same name (the cluster's resource name, which is its
//! id): the namespace with the pool's admin user and database, the
//! workgroup with base capacity s RPU. Both are tagged. Creating a name
//! that exists answers that resource, so a retried create never makes two.
//! Deleting deletes the workgroup, waits until it is gone, then deletes
//! the namespace. A namespace left without its workgroup (a node that died
//! between the two creates) is listed as failed, so reconciliation
//! terminates it.

use std::collections::BTreeMap;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_redshiftserverless::Client;
use aws_sdk_redshiftserverless::types::{Tag, Workgroup, WorkgroupStatus};
use slogate_actors::provider::ProvidedEndpoint;
use slogate_core::scale::inventory::{Listed, Owner, ResourceState};

use crate::api::{CallFuture, CloudApi, CloudError, CreateSpec, Described};
use crate::aws::cloud_error;
pub use crate::platform::ServerlessSettings;

/// Between checks that a deleted workgroup is gone, before its namespace
/// is deleted.
const DELETE_POLL: Duration = Duration::from_millis(500);
/// Checks at most (about half an hour).
const DELETE_POLLS_MAX: u32 = 3_600;

/// Redshift Serverless as a [`CloudApi`].
#[derive(Clone, Debug)]
pub struct Serverless {
    client: Client,
    settings: ServerlessSettings,
}

impl Serverless {
    /// Namespaces and workgroups through `config`.
    pub fn new(config: &SdkConfig, settings: ServerlessSettings) -> Self {
        Serverless { client: Client::new(config), settings }
    }

    /// Checks the endpoint, region and credentials, and that the producer
    /// namespace exists when there is one; the error names what failed.
    pub async fn check(&self) -> Result<(), CloudError> {
        match &self.settings.producer_namespace {
            Some(namespace) => self
                .client
                .get_namespace()
                .namespace_name(namespace)
                .send()
                .await
                .map(|_| ())
                .map_err(|e| cloud_error(e).about(&format!("namespace `{namespace}`"))),
            None => self.client.list_namespaces().max_results(1).send().await.map(|_| ()).map_err(cloud_error),
        }
    }

    fn tags(owner: &Owner) -> Result<Vec<Tag>, CloudError> {
        owner.tags().into_iter().map(|(key, value)| Tag::builder().key(key).value(value).build().map_err(|e| CloudError::new("InvalidTag", e.to_string()))).collect()
    }

    async fn tags_of(&self, arn: &str) -> Result<Option<Owner>, CloudError> {
        let tags = self.client.list_tags_for_resource().resource_arn(arn).send().await.map_err(cloud_error)?;
        Ok(Owner::from_tags(tags.tags().iter().map(|t| (t.key(), t.value()))))
    }
}

fn state(workgroup: &Workgroup) -> (ResourceState, String) {
    let status = workgroup.status().map_or_else(|| "unknown".to_owned(), |s| s.as_str().to_owned());
    let state = match workgroup.status() {
        Some(WorkgroupStatus::Available) => ResourceState::Available,
        Some(WorkgroupStatus::Creating | WorkgroupStatus::Modifying) => ResourceState::Creating,
        Some(WorkgroupStatus::Deleting) => ResourceState::Deleting,
        _ => ResourceState::Failed,
    };
    (state, status)
}

impl CloudApi for Serverless {
    fn kind(&self) -> &'static str {
        "redshift-serverless"
    }

    fn create(&self, spec: CreateSpec) -> CallFuture<String> {
        let this = self.clone();
        Box::pin(async move {
            let tags = Serverless::tags(&spec.owner)?;
            let namespace = this
                .client
                .create_namespace()
                .namespace_name(&spec.name)
                .admin_username(&this.settings.admin_username)
                .admin_user_password(&this.settings.admin_password)
                .db_name(&this.settings.database)
                .set_tags(Some(tags.clone()))
                .send()
                .await;
            match namespace {
                Ok(_) => {}
                // An earlier attempt made it: it is this cluster's.
                Err(error) if error.as_service_error().is_some_and(|e| e.is_conflict_exception()) => {}
                Err(error) => return Err(cloud_error(error)),
            }
            let mut request = this
                .client
                .create_workgroup()
                .workgroup_name(&spec.name)
                .namespace_name(&spec.name)
                .base_capacity(i32::try_from(spec.owner.size.0).unwrap_or(i32::MAX))
                .publicly_accessible(this.settings.publicly_accessible)
                .set_tags(Some(tags));
            if let Some(port) = this.settings.port {
                request = request.port(i32::from(port));
            }
            match request.send().await {
                Ok(_) => Ok(spec.name),
                Err(error) if error.as_service_error().is_some_and(|e| e.is_conflict_exception()) => Ok(spec.name),
                Err(error) => Err(cloud_error(error)),
            }
        })
    }

    fn resume(&self, resource_id: String) -> CallFuture<()> {
        // A workgroup is never paused: it bills only while it runs queries.
        Box::pin(std::future::ready(Err(CloudError::new("NotPausable", format!("workgroup {resource_id} cannot be paused or resumed")))))
    }

    fn describe(&self, resource_id: String) -> CallFuture<Described> {
        let client = self.client.clone();
        Box::pin(async move {
            let reply = match client.get_workgroup().workgroup_name(&resource_id).send().await {
                Ok(reply) => reply,
                Err(error) if error.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => {
                    return Ok(Described { state: ResourceState::Deleting, endpoint: None, status: "not found".into() });
                }
                Err(error) => return Err(cloud_error(error)),
            };
            let workgroup = reply.workgroup().ok_or_else(|| CloudError::new("MalformedReply", "GetWorkgroup answered no workgroup"))?;
            let (state, status) = state(workgroup);
            let endpoint = workgroup.endpoint().and_then(|e| {
                Some(ProvidedEndpoint { host: e.address()?.to_owned(), port: u16::try_from(e.port().or(workgroup.port())?).ok()? })
            });
            Ok(Described { state, endpoint, status })
        })
    }

    fn delete(&self, resource_id: String) -> CallFuture<()> {
        let client = self.client.clone();
        Box::pin(async move {
            match client.delete_workgroup().workgroup_name(&resource_id).send().await {
                Ok(_) => {}
                Err(error) if error.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => {}
                Err(error) => return Err(cloud_error(error)),
            }
            // The namespace goes once its workgroup is gone.
            for _ in 0..DELETE_POLLS_MAX {
                match client.get_workgroup().workgroup_name(&resource_id).send().await {
                    Err(error) if error.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => break,
                    Err(error) => return Err(cloud_error(error)),
                    Ok(_) => tokio::time::sleep(DELETE_POLL).await,
                }
            }
            match client.delete_namespace().namespace_name(&resource_id).send().await {
                Ok(_) => Ok(()),
                Err(error) if error.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => Ok(()),
                Err(error) => Err(cloud_error(error)),
            }
        })
    }

    fn list(&self, deployment: String) -> CallFuture<Vec<Listed>> {
        let this = self.clone();
        Box::pin(async move {
            let mut listed: BTreeMap<String, Listed> = BTreeMap::new();
            let mut next_token: Option<String> = None;
            loop {
                let page = this.client.list_workgroups().set_next_token(next_token.take()).send().await.map_err(cloud_error)?;
                for workgroup in page.workgroups() {
                    let (Some(name), Some(arn)) = (workgroup.workgroup_name(), workgroup.workgroup_arn()) else { continue };
                    let Some(owner) = this.tags_of(arn).await? else { continue };
                    if owner.deployment == deployment {
                        listed.insert(name.to_owned(), Listed { resource_id: name.to_owned(), owner, state: state(workgroup).0 });
                    }
                }
                match page.next_token() {
                    Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                    _ => break,
                }
            }
            // A tagged namespace without its workgroup is half a cluster.
            loop {
                let page = this.client.list_namespaces().set_next_token(next_token.take()).send().await.map_err(cloud_error)?;
                for namespace in page.namespaces() {
                    let (Some(name), Some(arn)) = (namespace.namespace_name(), namespace.namespace_arn()) else { continue };
                    if listed.contains_key(name) {
                        continue;
                    }
                    let Some(owner) = this.tags_of(arn).await? else { continue };
                    if owner.deployment == deployment {
                        listed.insert(name.to_owned(), Listed { resource_id: name.to_owned(), owner, state: ResourceState::Failed });
                    }
                }
                match page.next_token() {
                    Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                    _ => return Ok(listed.into_values().collect()),
                }
            }
        })
    }
}
