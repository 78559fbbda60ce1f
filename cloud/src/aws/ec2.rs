//! EC2 instances (`aws-sdk-ec2`) for request-level pools and self-hosted
//! Postgres-compatible engines: an instance per cluster, run from the
//! pool's launch template with the instance type configured for its size,
//! tagged at launch. A launch first looks for a running instance of the
//! cluster's name, and the name is also the launch's client token, so a
//! retried launch never runs two instances. It serves at its private
//! address (or its public one, when configured) on the engine's port, and
//! the backend's health check decides when it is ready.

use aws_config::SdkConfig;
use aws_sdk_ec2::Client;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{Filter, Instance, InstanceStateName, InstanceType, LaunchTemplateSpecification, ResourceType, Tag, TagSpecification};
use slogate_actors::provider::ProvidedEndpoint;
use slogate_core::scale::inventory::{Listed, Owner, ResourceState, tag};

use crate::api::{CallFuture, CloudApi, CloudError, CreateSpec, Described};
use crate::aws::cloud_error;
pub use crate::platform::Ec2Settings;

/// EC2 as a [`CloudApi`].
#[derive(Clone, Debug)]
pub struct Ec2 {
    client: Client,
    settings: Ec2Settings,
}

impl Ec2 {
    /// Instances through `config`.
    pub fn new(config: &SdkConfig, settings: Ec2Settings) -> Self {
        Ec2 { client: Client::new(config), settings }
    }

    /// Checks that the launch template exists, which also checks the
    /// endpoint, region and credentials.
    pub async fn check(&self) -> Result<(), CloudError> {
        let found = self
            .client
            .describe_launch_templates()
            .launch_template_names(&self.settings.launch_template)
            .send()
            .await
            .map_err(|e| cloud_error(e).about(&format!("launch template `{}`", self.settings.launch_template)))?;
        if found.launch_templates().is_empty() {
            return Err(CloudError::new("InvalidLaunchTemplateName.NotFoundException", format!("launch template `{}` does not exist", self.settings.launch_template)));
        }
        Ok(())
    }

    fn described(&self, instance: &Instance) -> Described {
        let name = instance.state().and_then(|s| s.name());
        let status = name.map_or_else(|| "unknown".to_owned(), |n| n.as_str().to_owned());
        let state = match name {
            Some(InstanceStateName::Running) => ResourceState::Available,
            Some(InstanceStateName::Pending) => ResourceState::Creating,
            Some(InstanceStateName::Stopped | InstanceStateName::Stopping) => ResourceState::Paused,
            Some(InstanceStateName::ShuttingDown | InstanceStateName::Terminated) => ResourceState::Deleting,
            _ => ResourceState::Failed,
        };
        let address = if self.settings.public_address { instance.public_ip_address() } else { instance.private_ip_address() };
        let endpoint = (state == ResourceState::Available)
            .then_some(address)
            .flatten()
            .map(|host| ProvidedEndpoint { host: host.to_owned(), port: self.settings.service_port });
        Described { state, endpoint, status }
    }
}

impl CloudApi for Ec2 {
    fn kind(&self) -> &'static str {
        "ec2"
    }

    fn create(&self, spec: CreateSpec) -> CallFuture<String> {
        let this = self.clone();
        Box::pin(async move {
            let size = spec.owner.size.0;
            let instance_type = this.settings.instance_types.get(&size).ok_or_else(|| {
                let sizes: Vec<String> = this.settings.instance_types.keys().map(u32::to_string).collect();
                CloudError::new("NoInstanceType", format!("no instance type is configured for {size} RPU (configured: {})", sizes.join(", ")))
            })?;
            // A launch of this name that already runs is this cluster's:
            // an earlier call made it and its answer was lost. (EC2 itself
            // also dedupes by the client token, within one call's retries.)
            let running = this
                .client
                .describe_instances()
                .filters(Filter::builder().name("tag:Name").values(&spec.name).build())
                .filters(Filter::builder().name("instance-state-name").set_values(Some(["pending", "running"].map(String::from).to_vec())).build())
                .send()
                .await
                .map_err(cloud_error)?;
            if let Some(id) = running.reservations().iter().flat_map(|r| r.instances()).find_map(|i| i.instance_id()) {
                return Ok(id.to_owned());
            }
            let tags = TagSpecification::builder()
                .resource_type(ResourceType::Instance)
                .set_tags(Some(spec.owner.tags().into_iter().map(|(key, value)| Tag::builder().key(key).value(value).build()).chain([Tag::builder().key("Name").value(&spec.name).build()]).collect()))
                .build();
            let launched = this
                .client
                .run_instances()
                .launch_template(LaunchTemplateSpecification::builder().launch_template_name(&this.settings.launch_template).build())
                .instance_type(InstanceType::from(instance_type.as_str()))
                .min_count(1)
                .max_count(1)
                .client_token(&spec.name)
                .tag_specifications(tags)
                .send()
                .await
                .map_err(cloud_error)?;
            launched
                .instances()
                .first()
                .and_then(|i| i.instance_id())
                .map(str::to_owned)
                .ok_or_else(|| CloudError::new("MalformedReply", "RunInstances answered no instance"))
        })
    }

    fn resume(&self, resource_id: String) -> CallFuture<()> {
        let client = self.client.clone();
        Box::pin(async move { client.start_instances().instance_ids(&resource_id).send().await.map(|_| ()).map_err(cloud_error) })
    }

    fn describe(&self, resource_id: String) -> CallFuture<Described> {
        let this = self.clone();
        Box::pin(async move {
            let reply = match this.client.describe_instances().instance_ids(&resource_id).send().await {
                Ok(reply) => reply,
                Err(error) if error.code() == Some("InvalidInstanceID.NotFound") => {
                    return Ok(Described { state: ResourceState::Deleting, endpoint: None, status: "not found".into() });
                }
                Err(error) => return Err(cloud_error(error)),
            };
            let instance = reply.reservations().iter().flat_map(|r| r.instances()).find(|i| i.instance_id() == Some(resource_id.as_str()));
            Ok(instance.map_or_else(|| Described { state: ResourceState::Deleting, endpoint: None, status: "not found".into() }, |i| this.described(i)))
        })
    }

    fn delete(&self, resource_id: String) -> CallFuture<()> {
        let client = self.client.clone();
        Box::pin(async move {
            match client.terminate_instances().instance_ids(&resource_id).send().await {
                Ok(_) => Ok(()),
                Err(error) if error.code() == Some("InvalidInstanceID.NotFound") => Ok(()),
                Err(error) => Err(cloud_error(error)),
            }
        })
    }

    fn list(&self, deployment: String) -> CallFuture<Vec<Listed>> {
        let this = self.clone();
        Box::pin(async move {
            let mut listed = Vec::new();
            let mut next_token: Option<String> = None;
            loop {
                let page = this
                    .client
                    .describe_instances()
                    .filters(Filter::builder().name(format!("tag:{}", tag::DEPLOYMENT)).values(&deployment).build())
                    .filters(Filter::builder().name("instance-state-name").set_values(Some(["pending", "running", "stopping", "stopped"].map(String::from).to_vec())).build())
                    .set_next_token(next_token.take())
                    .send()
                    .await
                    .map_err(cloud_error)?;
                for instance in page.reservations().iter().flat_map(|r| r.instances()) {
                    let Some(id) = instance.instance_id() else { continue };
                    let Some(owner) = Owner::from_tags(instance.tags().iter().filter_map(|t| Some((t.key()?, t.value()?)))) else { continue };
                    if owner.deployment == deployment {
                        listed.push(Listed { resource_id: id.to_owned(), owner, state: this.described(instance).state });
                    }
                }
                match page.next_token() {
                    Some(token) if !token.is_empty() => next_token = Some(token.to_owned()),
                    _ => return Ok(listed),
                }
            }
        })
    }
}
