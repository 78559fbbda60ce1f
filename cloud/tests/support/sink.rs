//! What the tests hand a provider in place of the backend, and the
//! settings they share.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use slogate_actors::backend::LocalFuture;
use slogate_actors::clock::VirtualClock;
use slogate_actors::provider::{EndpointSink, ProvidedEndpoint};
use slogate_cloud::api::CloudApi;
use slogate_cloud::aws::AwsSettings;
use slogate_cloud::provider::{CloudProvider, CloudSettings};
use slogate_core::model::{ClusterId, PoolId, Rpu};

/// What the provider handed the backend.
#[derive(Clone, Debug, PartialEq)]
pub enum Handed {
    Attached(ClusterId, Rpu, ProvidedEndpoint),
    Abandoned(ClusterId, String),
    Drained(ClusterId),
    Detached(ClusterId),
}

/// Records what it is handed, as the backend would receive it.
#[derive(Default)]
pub struct RecordingSink {
    handed: Mutex<Vec<Handed>>,
}

impl RecordingSink {
    pub fn handed(&self) -> Vec<Handed> {
        self.handed.lock().unwrap().clone()
    }

    /// Waits (polling, at most `timeout`) until `check` holds of what was
    /// handed.
    pub async fn wait_for(&self, timeout: Duration, check: impl Fn(&[Handed]) -> bool) -> Vec<Handed> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let handed = self.handed();
            if check(&handed) || tokio::time::Instant::now() > deadline {
                return handed;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

impl EndpointSink for RecordingSink {
    fn attach(&self, _pool: PoolId, cluster: ClusterId, size: Rpu, endpoint: ProvidedEndpoint) -> LocalFuture<Result<(), String>> {
        self.handed.lock().unwrap().push(Handed::Attached(cluster, size, endpoint));
        Box::pin(std::future::ready(Ok(())))
    }

    fn abandon(&self, _pool: PoolId, cluster: ClusterId, reason: String) {
        self.handed.lock().unwrap().push(Handed::Abandoned(cluster, reason));
    }

    fn drain(&self, _pool: PoolId, cluster: ClusterId) -> LocalFuture<()> {
        self.handed.lock().unwrap().push(Handed::Drained(cluster));
        Box::pin(std::future::ready(()))
    }

    fn detach(&self, _pool: PoolId, cluster: ClusterId) {
        self.handed.lock().unwrap().push(Handed::Detached(cluster));
    }
}

pub fn aws_settings(url: String) -> AwsSettings {
    AwsSettings {
        region: "us-east-1".into(),
        endpoint_url: Some(url),
        attempts_max: 3,
        backoff_initial: Duration::from_millis(20),
        attempt_timeout: Duration::from_secs(5),
    }
}


/// A provider for deployment `test` on node `n1` over `api`.
pub fn provider(api: impl CloudApi, sink: Arc<RecordingSink>, ready_timeout: Duration) -> CloudProvider {
    provider_on("n1", api, sink, ready_timeout)
}

/// A provider for deployment `test` on node `node` over `api`.
pub fn provider_on(node: &str, api: impl CloudApi, sink: Arc<RecordingSink>, ready_timeout: Duration) -> CloudProvider {
    let settings = CloudSettings {
        deployment: "test".into(),
        node: node.into(),
        name_prefix: "slogate".into(),
        poll_interval: Duration::from_millis(50),
        ready_timeout,
    };
    CloudProvider::new(Arc::new(api), sink, settings, VirtualClock::start(1.0))
}
