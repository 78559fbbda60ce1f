//! Which cloud platform a pool's clusters live on, with its settings, and
//! opening it. The settings are plain data and always built; opening a
//! platform needs the `aws` feature, and a build without it says so.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::api::CloudApi;

/// Where and how the SDK calls AWS.
#[derive(Clone, Debug, PartialEq)]
pub struct AwsSettings {
    /// The region (`us-east-1`).
    pub region: String,
    /// Another endpoint for every service (a local AWS-compatible server);
    /// `None` is AWS itself.
    pub endpoint_url: Option<String>,
    /// Most attempts per call, the first included, on throttling and 5xx.
    pub attempts_max: u32,
    /// The first retry's backoff; each later one doubles, with jitter.
    pub backoff_initial: Duration,
    /// Longest a single call attempt may take.
    pub attempt_timeout: Duration,
}

impl Default for AwsSettings {
    fn default() -> Self {
        AwsSettings {
            region: "us-east-1".into(),
            endpoint_url: None,
            attempts_max: 4,
            backoff_initial: Duration::from_millis(200),
            attempt_timeout: Duration::from_secs(20),
        }
    }
}

/// Whether `region` looks like an AWS region (`us-east-1`,
/// `ap-southeast-2`, `us-gov-west-1`).
pub fn region_is_valid(region: &str) -> bool {
    let parts: Vec<&str> = region.split('-').collect();
    parts.len() >= 3
        && parts[..parts.len() - 1].iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts.last().is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// A pool's Serverless settings. Redshift Serverless holds one workgroup
/// per namespace, so each cluster is a namespace and a workgroup of the
/// same name, both tagged; the data they read comes from a producer's
/// datashare, attached by the pool's setup SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerlessSettings {
    /// The producer namespace whose datashare the clusters read, checked at
    /// start; `None` when the clusters need no shared data.
    pub producer_namespace: Option<String>,
    /// The admin user each cluster's namespace is created with.
    pub admin_username: String,
    /// Its password (from the environment, never the config file).
    pub admin_password: String,
    /// The database each namespace is created with.
    pub database: String,
    /// Whether workgroups get a public endpoint.
    pub publicly_accessible: bool,
    /// The port workgroups serve on; `None` is Redshift's default (5439).
    pub port: Option<u16>,
}

/// A pool's EC2 settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ec2Settings {
    /// The launch template every instance runs from (image, network,
    /// security groups, user data that starts the engine).
    pub launch_template: String,
    /// The instance type for each cluster size, RPU.
    pub instance_types: BTreeMap<u32, String>,
    /// The port the engine serves on.
    pub service_port: u16,
    /// Connect to the instance's public address instead of its private one.
    pub public_address: bool,
}

/// A pool's provisioned Redshift settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedshiftSettings {
    /// The node type (`ra3.xlplus`).
    pub node_type: String,
    /// RPU one node counts as, to turn a size into a node count.
    pub rpu_per_node: u32,
    /// The admin user the clusters are created with.
    pub master_username: String,
    /// Its password (from the environment, never the config file).
    pub master_password: String,
    /// The database created in each cluster.
    pub database: String,
    /// Pause released clusters instead of deleting them.
    pub pause_instead_of_delete: bool,
}

/// The Lambda elastic tier's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct LambdaSettings {
    /// The function's name or ARN.
    pub function: String,
    /// Invocations at once at most.
    pub concurrency_limit: u32,
    /// The function's memory, MB (its bill is per GB-second).
    pub memory_mb: u32,
    /// Price per GB-second, dollars.
    pub price_per_gb_second_usd: f64,
    /// Price per request, dollars.
    pub price_per_request_usd: f64,
}

/// A pool's platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Platform {
    /// Redshift Serverless workgroups.
    Serverless(ServerlessSettings),
    /// Provisioned Redshift clusters.
    Redshift(RedshiftSettings),
    /// EC2 instances.
    Ec2(Ec2Settings),
}

/// Opens `platform` with the standard AWS credential chain, and checks it
/// (the namespace or launch template exists; the endpoint, region and
/// credentials answer).
///
/// # Errors
///
/// [`crate::Error::NotBuilt`] in a build without the `aws` feature;
/// [`crate::Error::Config`] for bad settings; [`crate::Error::Api`] when
/// the check fails, with the platform's code.
pub async fn open(platform: &Platform, aws: &AwsSettings) -> crate::Result<Arc<dyn CloudApi>> {
    #[cfg(feature = "aws")]
    {
        let config = crate::aws::sdk_config(aws, None).await?;
        Ok(crate::aws::open(platform, &config).await?)
    }
    #[cfg(not(feature = "aws"))]
    {
        let _ = (platform, aws);
        Err(crate::Error::NotBuilt("this slogate was built without the AWS providers: build it with `cargo build --release -p slogate --features aws`".into()))
    }
}

/// Opens the Lambda elastic tier with the standard AWS credential chain,
/// and checks that its function exists.
///
/// # Errors
///
/// As [`open`].
pub async fn open_lambda(
    settings: &LambdaSettings,
    aws: &AwsSettings,
    clock: slogate_actors::clock::VirtualClock,
) -> crate::Result<Arc<dyn slogate_actors::elastic::ElasticTier>> {
    #[cfg(feature = "aws")]
    {
        let config = crate::aws::sdk_config(aws, None).await?;
        let tier = crate::aws::lambda::Lambda::new(&config, settings.clone(), clock);
        tier.check().await?;
        Ok(Arc::new(tier))
    }
    #[cfg(not(feature = "aws"))]
    {
        let _ = (settings, aws, clock);
        Err(crate::Error::NotBuilt("this slogate was built without the AWS providers: build it with `cargo build --release -p slogate --features aws`".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_checked_by_shape() {
        for good in ["us-east-1", "ap-southeast-2", "us-gov-west-1", "eu-central-1"] {
            assert!(region_is_valid(good), "{good}");
        }
        for bad in ["", "us-east", "US-EAST-1", "useast1", "us-east-x", "-east-1"] {
            assert!(!region_is_valid(bad), "{bad}");
        }
    }
}
