//! The calls a cloud platform answers for slogate, as one trait: each
//! platform (Redshift Serverless, provisioned Redshift, EC2) implements it
//! over its SDK, and [`crate::provider::CloudProvider`] drives it.

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use slogate_actors::provider::ProvidedEndpoint;
use slogate_core::scale::inventory::{Listed, Owner, ResourceState};

/// A platform call in flight.
pub type CallFuture<T> = Pin<Box<dyn Future<Output = Result<T, CloudError>> + Send>>;

/// A platform's refusal or failure, with its own error code.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct CloudError {
    /// The platform's error code (`ThrottlingException`,
    /// `InvalidParameterValue`), or slogate's for a call that never got an
    /// answer (`Unreachable`, `Timeout`).
    pub code: String,
    /// Its message.
    pub message: String,
}

impl CloudError {
    /// An error with `code` and `message`.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        CloudError { code: code.into(), message: message.into() }
    }

    /// The same error, its message prefixed with what it was about
    /// (``namespace `analytics`: …``).
    pub fn about(self, what: &str) -> Self {
        CloudError { code: self.code, message: format!("{what}: {}", self.message) }
    }
}

/// What to create.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateSpec {
    /// The resource's name, unique per cluster
    /// (`inventory::resource_name`); creating the same name twice never
    /// makes two resources.
    pub name: String,
    /// Whose it is, which becomes its tags; `owner.size` is its size.
    pub owner: Owner,
}

/// A resource as the platform describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Described {
    /// Where it is in its life.
    pub state: ResourceState,
    /// Where it serves, once it does.
    pub endpoint: Option<ProvidedEndpoint>,
    /// The platform's own status word, for operators.
    pub status: String,
}

/// The calls slogate makes of a platform. See the module docs.
pub trait CloudApi: Send + Sync + 'static {
    /// `redshift-serverless`, `redshift` or `ec2`.
    fn kind(&self) -> &'static str;

    /// Creates the resource `spec` names, tagged with its owner; resolves
    /// with the platform's id for it once the platform accepted the
    /// request.
    fn create(&self, spec: CreateSpec) -> CallFuture<String>;

    /// Resumes the paused resource `resource_id` (a paused provisioned
    /// cluster, a stopped instance).
    fn resume(&self, resource_id: String) -> CallFuture<()>;

    /// Describes the resource `resource_id`.
    fn describe(&self, resource_id: String) -> CallFuture<Described>;

    /// Deletes (or terminates) the resource `resource_id`.
    fn delete(&self, resource_id: String) -> CallFuture<()>;

    /// Every resource tagged as `deployment`'s that is not yet deleted,
    /// with its owner and state.
    fn list(&self, deployment: String) -> CallFuture<Vec<Listed>>;

    /// Whether [`CloudApi::delete`] parks the resource (pauses it, billing
    /// storage only) rather than deleting it, so that a later cluster can
    /// reuse it with [`CloudApi::retag`], [`CloudApi::resume`] and
    /// [`CloudApi::resize`].
    fn parks(&self) -> bool {
        false
    }

    /// Tags the resource `resource_id` as `owner`'s, replacing its slogate
    /// tags: a parked resource taken by a new cluster.
    fn retag(&self, resource_id: String, owner: Owner) -> CallFuture<()> {
        let _ = owner;
        let kind = self.kind();
        Box::pin(async move { Err(CloudError::new("Unsupported", format!("{kind} does not retag {resource_id}"))) })
    }

    /// Resizes the available resource `resource_id` to `size` in place;
    /// it serves again once described as available.
    fn resize(&self, resource_id: String, size: slogate_core::model::Rpu) -> CallFuture<()> {
        let kind = self.kind();
        Box::pin(async move { Err(CloudError::new("Unsupported", format!("{kind} does not resize {resource_id} (to {} RPU)", size.0))) })
    }
}
