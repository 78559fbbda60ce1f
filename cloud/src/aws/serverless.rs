//! Redshift Serverless workgroups (`aws-sdk-redshiftserverless`): a
//! cluster of size s is a workgroup with base capacity s RPU in the pool's
//! namespace. The workgroup's name is its id; creating a name that exists
//! answers that workgroup, so a retried create never makes two.

use aws_config::SdkConfig;
use aws_sdk_redshiftserverless::Client;
use aws_sdk_redshiftserverless::types::{Tag, Workgroup, WorkgroupStatus};
use slogate_actors::provider::ProvidedEndpoint;
use slogate_core::scale::inventory::{Listed, Owner, ResourceState};

use crate::api::{CallFuture, CloudApi, CloudError, CreateSpec, Described};
use crate::aws::cloud_error;
pub use crate::platform::ServerlessSettings;

/// Redshift Serverless as a [`CloudApi`].
#[derive(Clone, Debug)]
pub struct Serverless {
    client: Client,
    settings: ServerlessSettings,
}

impl Serverless {
    /// Workgroups through `config`.
    pub fn new(config: &SdkConfig, settings: ServerlessSettings) -> Self {
        Serverless { client: Client::new(config), settings }
    }

    /// Checks that the namespace exists, which also checks the endpoint,
    /// region and credentials; the error says which call failed.
    pub async fn check(&self) -> Result<(), CloudError> {
        self.client.get_namespace().namespace_name(&self.settings.namespace).send().await.map_err(cloud_error).map(|_| ()).map_err(|e| {
            CloudError::new(e.code, format!("namespace `{}`: {}", self.settings.namespace, e.message))
        })
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
            let mut request = this
                .client
                .create_workgroup()
                .workgroup_name(&spec.name)
                .namespace_name(&this.settings.namespace)
                .base_capacity(i32::try_from(spec.owner.size.0).unwrap_or(i32::MAX))
                .publicly_accessible(this.settings.publicly_accessible);
            if let Some(port) = this.settings.port {
                request = request.port(i32::from(port));
            }
            for (key, value) in spec.owner.tags() {
                request = request.tags(Tag::builder().key(key).value(value).build().map_err(|e| CloudError::new("InvalidTag", e.to_string()))?);
            }
            match request.send().await {
                Ok(_) => Ok(spec.name),
                // An earlier attempt made it: it is this cluster's.
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
                Ok(_) => Ok(()),
                Err(error) if error.as_service_error().is_some_and(|e| e.is_resource_not_found_exception()) => Ok(()),
                Err(error) => Err(cloud_error(error)),
            }
        })
    }

    fn list(&self, deployment: String) -> CallFuture<Vec<Listed>> {
        let client = self.client.clone();
        Box::pin(async move {
            let mut listed = Vec::new();
            let mut next_token: Option<String> = None;
            loop {
                let page = client.list_workgroups().set_next_token(next_token.take()).send().await.map_err(cloud_error)?;
                for workgroup in page.workgroups() {
                    let (Some(name), Some(arn)) = (workgroup.workgroup_name(), workgroup.workgroup_arn()) else { continue };
                    let tags = client.list_tags_for_resource().resource_arn(arn).send().await.map_err(cloud_error)?;
                    let Some(owner) = Owner::from_tags(tags.tags().iter().map(|t| (t.key(), t.value()))) else { continue };
                    if owner.deployment != deployment {
                        continue;
                    }
                    let (state, _) = state(workgroup);
                    listed.push(Listed { resource_id: name.to_owned(), owner, state });
                }
                match page.next_token() {
                    Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                    _ => return Ok(listed),
                }
            }
        })
    }
}
