//! The AWS SDK implementations of [`crate::api::CloudApi`] (cargo feature
//! `aws`).
//!
//! - [`serverless`]: Redshift Serverless workgroups, a cluster of size s
//!   being a workgroup with base capacity s RPU in the configured namespace
//!   (AutoSLO's own setting).
//! - [`redshift`]: provisioned Redshift clusters, s RPU being s ÷
//!   `rpu_per_node` nodes of the configured node type.
//! - [`ec2`]: EC2 instances from a launch template, with an instance type
//!   per size (Spandana's request-level pools, self-hosted engines).
//! - [`lambda`]: the elastic tier on AWS Lambda: a query per invocation,
//!   with a concurrency limit, function errors and throttles handled, and
//!   its bill from the billed duration.
//!
//! Credentials come from the standard AWS chain. `endpoint_url` points the
//! SDK at another endpoint (the tests' loopback servers). The SDK retries
//! throttling and 5xx answers itself, with exponential backoff, at most
//! `attempts_max` times a call; an error that outlasts them reaches the
//! caller with the service's error code.

pub mod ec2;
pub mod lambda;
pub mod redshift;
pub mod serverless;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::api::CloudError;
pub use crate::platform::AwsSettings;
use crate::platform::region_is_valid;

/// Static credentials, for local endpoints (tests); a node takes its
/// credentials from the standard chain.
pub use aws_sdk_ec2::config::Credentials;

/// The SDK's configuration for `settings`, with credentials from the
/// standard chain, or `credentials` when given (tests against loopback
/// servers).
pub async fn sdk_config(settings: &AwsSettings, credentials: Option<Credentials>) -> crate::Result<SdkConfig> {
    if !region_is_valid(&settings.region) {
        return Err(crate::Error::Config(format!("region `{}` is not an AWS region (like us-east-1)", settings.region)));
    }
    if settings.attempts_max == 0 {
        return Err(crate::Error::Config("attempts_max must be at least 1".into()));
    }
    let retry = RetryConfig::standard().with_max_attempts(settings.attempts_max).with_initial_backoff(settings.backoff_initial);
    let timeout = TimeoutConfig::builder().operation_attempt_timeout(settings.attempt_timeout).build();
    let mut loader = aws_config::defaults(BehaviorVersion::latest()).region(Region::new(settings.region.clone())).retry_config(retry).timeout_config(timeout);
    if let Some(url) = &settings.endpoint_url {
        loader = loader.endpoint_url(url);
    }
    if let Some(credentials) = credentials {
        loader = loader.credentials_provider(credentials);
    }
    Ok(loader.load().await)
}

/// An SDK error as a [`CloudError`] with the service's code.
pub(crate) fn cloud_error<E, R>(error: SdkError<E, R>) -> CloudError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match &error {
        SdkError::ServiceError(_) => {
            CloudError::new(error.code().unwrap_or("Unknown"), error.message().map_or_else(|| DisplayErrorContext(&error).to_string(), str::to_owned))
        }
        SdkError::TimeoutError(_) => CloudError::new("Timeout", DisplayErrorContext(&error).to_string()),
        SdkError::DispatchFailure(_) => CloudError::new("Unreachable", DisplayErrorContext(&error).to_string()),
        _ => CloudError::new("Unknown", DisplayErrorContext(&error).to_string()),
    }
}


/// The platform `platform` names through `config`, checked: its namespace
/// or launch template exists, and the endpoint, region and credentials
/// answer.
pub(crate) async fn open(platform: &crate::platform::Platform, config: &SdkConfig) -> Result<std::sync::Arc<dyn crate::api::CloudApi>, CloudError> {
    use crate::platform::Platform;
    Ok(match platform {
        Platform::Serverless(settings) => {
            let api = serverless::Serverless::new(config, settings.clone());
            api.check().await?;
            std::sync::Arc::new(api)
        }
        Platform::Redshift(settings) => {
            let api = redshift::Redshift::new(config, settings.clone());
            api.check().await?;
            std::sync::Arc::new(api)
        }
        Platform::Ec2(settings) => {
            let api = ec2::Ec2::new(config, settings.clone());
            api.check().await?;
            std::sync::Arc::new(api)
        }
    })
}
