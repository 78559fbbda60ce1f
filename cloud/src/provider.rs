//! [`CloudProvider`]: the actors' `Provider` over any [`CloudApi`].
//!
//! - **Spin up:** take the pool's next cluster id, name and tag the
//!   resource, and create it. The request resolves once the platform
//!   accepted the create (an error names the platform's code). A task then
//!   describes the resource every `poll_interval` until it serves and hands
//!   its endpoint to the backend, which health-checks it and reports it
//!   ready. A resource that does not serve within `ready_timeout`, that
//!   the platform reports failed, or whose endpoint never passes the
//!   backend's health check, is deleted, and the cluster is reported gone
//!   with the reason.
//! - **Spin down:** the backend drains the cluster; then the resource is
//!   deleted. A cluster still starting is abandoned and deleted at once.
//! - **Parking** (a platform whose delete pauses, [`CloudApi::parks`]):
//!   every resource the provider pauses, and every paused one it finds at
//!   reconciliation and does not adopt, is parked. A spin-up reuses a
//!   parked resource before it creates one (core's `pick_parked`: the
//!   wanted size, else the nearest): it is retagged as the new cluster's,
//!   resumed, and resized in place once available if its size differs.
//!   So the pool never holds more resources, serving and paused, than the
//!   most clusters it ran at once, and none is left unaccounted for.
//! - **Reconciliation** ([`CloudProvider::reconcile`]), at start or when a
//!   fleet node takes the pool over: list the deployment's resources,
//!   adopt what the pool's layout needs (core's `inventory::reconcile`; a
//!   paused one is resumed), terminate the rest, and number new clusters
//!   above every listed one.
//! - **Hand-over** ([`CloudProvider::hand_over`]): a fleet node that lets
//!   the pool go forgets its resources without touching them; the next
//!   owner adopts them by their tags.
//! - **For operators:** every step is a lifecycle record, and the state
//!   lists the resources with their platform ids and status.
//!
//! The provider runs on the node's actor runtime: its futures and tasks
//! are local (`spawn_local`); the platform calls themselves are `Send`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use slogate_actors::backend::{ExecuteError, LocalFuture};
use slogate_actors::clock::VirtualClock;
use slogate_actors::provider::{EndpointSink, LifecycleRecord, Provider, ProviderState};
use slogate_core::model::{ClusterId, PoolId, Rpu};
use slogate_core::scale::inventory::{self, Adoption, Owner, ResourceState};
use slogate_core::scale::layout::Layout;

use crate::api::{CloudApi, CloudError, CreateSpec};

/// How a [`CloudProvider`] names, tags and waits.
#[derive(Clone, Debug, PartialEq)]
pub struct CloudSettings {
    /// The deployment tag (`fleet.deployment`).
    pub deployment: String,
    /// The node tag (`fleet.node_id`).
    pub node: String,
    /// Resource names start with it.
    pub name_prefix: String,
    /// How often a starting resource is described.
    pub poll_interval: Duration,
    /// How long a resource may take to serve before it is deleted.
    pub ready_timeout: Duration,
}

/// Most lifecycle records kept.
const RECENT_MAX: usize = 256;

/// One resource the provider holds for a cluster.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Resource {
    /// The pool.
    pub pool: PoolId,
    /// slogate's cluster id.
    pub cluster: ClusterId,
    /// The platform's id.
    pub resource_id: String,
    /// Its size.
    pub size: Rpu,
    /// `starting`, `serving`, `releasing`.
    pub phase: Phase,
    /// The platform's last status word.
    pub status: String,
}

/// Where a held resource is, from slogate's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Created; waiting until it serves.
    Starting,
    /// Handed to the backend.
    Serving,
    /// Draining or being deleted.
    Releasing,
}

/// A paused resource kept for reuse.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Parked {
    /// The platform's id.
    pub resource_id: String,
    /// Its size.
    pub size: Rpu,
}

#[derive(Default)]
struct Book {
    next_cluster: HashMap<PoolId, u32>,
    resources: BTreeMap<(PoolId, ClusterId), Resource>,
    parked: BTreeMap<PoolId, Vec<Parked>>,
    recent: VecDeque<LifecycleRecord>,
}

/// The `Provider` over a [`CloudApi`]. See the module docs.
pub struct CloudProvider {
    api: Arc<dyn CloudApi>,
    sink: Arc<dyn EndpointSink>,
    settings: CloudSettings,
    clock: VirtualClock,
    book: Arc<Mutex<Book>>,
}

impl CloudProvider {
    /// A provider that creates through `api` and hands endpoints to `sink`.
    pub fn new(api: Arc<dyn CloudApi>, sink: Arc<dyn EndpointSink>, settings: CloudSettings, clock: VirtualClock) -> Self {
        CloudProvider { api, sink, settings, clock, book: Arc::default() }
    }

    /// Lists the deployment's resources, adopts those of `pool` that
    /// `want` needs (each is handed to the backend once it serves),
    /// terminates the rest, and numbers new clusters above every listed
    /// one. Resolves with what it decided; the caller creates
    /// `adoption.request`. A dry run (`dry_run`) logs what it would
    /// terminate and terminates nothing.
    pub async fn reconcile(&self, pool: &PoolId, want: &Layout, dry_run: bool) -> Result<Adoption, CloudError> {
        let listed = self.api.list(self.settings.deployment.clone()).await?;
        let adoption = inventory::reconcile(&self.settings.deployment, &pool.0, &listed, want);
        self.book().next_cluster.insert(pool.clone(), adoption.next_cluster.0);
        // Terminations run on their own (a deletion may wait for the
        // platform), each logged when it is done.
        for (resource_id, reason) in &adoption.terminate {
            let found = listed.iter().find(|r| &r.resource_id == resource_id);
            let (cluster, size) = (found.map(|r| r.owner.cluster), found.map_or(Rpu(0), |r| r.owner.size));
            if self.api.parks() && found.is_some_and(|r| r.state == ResourceState::Paused) {
                tracing::info!(message = "Reconciliation: parked a paused resource the pool does not need now.", pool = %pool, %resource_id, %reason);
                self.log(pool, "park", cluster, Some(size), format!("kept {resource_id} paused for reuse: {reason}"));
                self.park(pool, resource_id.clone(), size);
                continue;
            }
            tracing::warn!(message = "Reconciliation: terminating a resource the pool does not need.", pool = %pool, %resource_id, %reason, dry_run);
            if dry_run {
                self.log(pool, "terminate", cluster, None, format!("dry run: would terminate {resource_id}: {reason}"));
                continue;
            }
            let (this, pool, resource_id, reason) = (self.clone_handle(), pool.clone(), resource_id.clone(), reason.clone());
            tokio::task::spawn_local(async move {
                let result = match delete_or_park(&this.api, &this.book, &pool, &resource_id, size).await {
                    Ok(true) => format!("paused and parked {resource_id}: {reason}"),
                    Ok(false) => format!("terminated {resource_id}: {reason}"),
                    Err(error) => format!("could not terminate {resource_id} ({reason}): {error}"),
                };
                tracing::warn!(message = "Reconciliation: a termination ended.", pool = %pool, %result);
                this.log(&pool, "terminate", cluster, None, result);
            });
        }
        for (cluster, resource_id) in &adoption.adopt {
            let found = listed.iter().find(|r| &r.resource_id == resource_id).expect("adopted resources are listed");
            self.book().resources.insert(
                (pool.clone(), *cluster),
                Resource {
                    pool: pool.clone(),
                    cluster: *cluster,
                    resource_id: resource_id.clone(),
                    size: found.owner.size,
                    phase: Phase::Starting,
                    status: format!("{:?}", found.state).to_lowercase(),
                },
            );
            let mut adopted = format!("adopted {resource_id}");
            if found.state == ResourceState::Paused {
                match self.api.resume(resource_id.clone()).await {
                    Ok(()) => adopted.push_str(", resuming it"),
                    Err(error) => adopted.push_str(&format!("; resuming it failed: {error}")),
                }
            }
            tracing::info!(message = "Reconciliation: adopted a resource.", pool = %pool, cluster = %cluster, result = %adopted);
            self.log(pool, "adopt", Some(*cluster), Some(found.owner.size), adopted);
            self.watch_until_serving(pool.clone(), *cluster, resource_id.clone(), found.owner.size, None);
        }
        Ok(adoption)
    }

    /// Lets go of `pool`'s resources without touching them, for another
    /// node of the fleet to adopt by their tags: the backend detaches each
    /// cluster, watches of starting ones stop, parked ones are left paused
    /// (the next owner's reconciliation parks them again). Returns the
    /// clusters let go.
    pub fn hand_over(&self, pool: &PoolId) -> Vec<ClusterId> {
        let released: Vec<Resource> = {
            let mut book = self.book();
            book.next_cluster.remove(pool);
            book.parked.remove(pool);
            let ours: Vec<(PoolId, ClusterId)> = book.resources.keys().filter(|(p, _)| p == pool).cloned().collect();
            ours.iter().filter_map(|key| book.resources.remove(key)).collect()
        };
        for resource in &released {
            self.sink.detach(pool.clone(), resource.cluster);
            self.log(pool, "hand_over", Some(resource.cluster), Some(resource.size), format!("left {} to the pool's next owner", resource.resource_id));
        }
        tracing::info!(message = "Handed the pool's resources over to its next owner.", pool = %pool, resources = released.len());
        released.iter().map(|r| r.cluster).collect()
    }

    /// The clusters `adoption` (of `pool`, from [`CloudProvider::reconcile`])
    /// kept, with their sizes: what the router takes in.
    pub fn adopted_clusters(&self, pool: &PoolId, adoption: &Adoption) -> Vec<(ClusterId, Rpu)> {
        let book = self.book();
        adoption.adopt.iter().filter_map(|(cluster, _)| Some((*cluster, book.resources.get(&(pool.clone(), *cluster))?.size))).collect()
    }

    /// The resources held, in pool and cluster order.
    pub fn resources(&self) -> Vec<Resource> {
        self.book().resources.values().cloned().collect()
    }

    /// Each pool's parked resources.
    pub fn parked(&self) -> BTreeMap<PoolId, Vec<Parked>> {
        self.book().parked.clone()
    }

    fn park(&self, pool: &PoolId, resource_id: String, size: Rpu) {
        park(&self.book, pool, resource_id, size);
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().expect("the provider's book lock is never poisoned")
    }

    fn log(&self, pool: &PoolId, action: &'static str, cluster: Option<ClusterId>, size: Option<Rpu>, result: String) {
        record(&self.book, self.clock, pool, action, cluster, size, result);
    }

    /// Describes `resource_id` until it serves, then hands it to the sink;
    /// deletes it and abandons the cluster when it fails or times out. A
    /// reused resource of another size (`resize_from`) is resized once
    /// available, and serves once available again.
    fn watch_until_serving(&self, pool: PoolId, cluster: ClusterId, resource_id: String, size: Rpu, mut resize_from: Option<Rpu>) {
        let (api, sink, book, clock) = (self.api.clone(), self.sink.clone(), self.book.clone(), self.clock);
        let (poll, timeout) = (self.settings.poll_interval, self.settings.ready_timeout);
        tokio::task::spawn_local(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let mut last_error = None;
            let reason = loop {
                let still_ours = |book: &Arc<Mutex<Book>>| {
                    let book = book.lock().expect("the provider's book lock is never poisoned");
                    book.resources.get(&(pool.clone(), cluster)).is_some_and(|r| r.phase == Phase::Starting)
                };
                if !still_ours(&book) {
                    // Released while starting: spin_down deletes it.
                    return;
                }
                match api.describe(resource_id.clone()).await {
                    Ok(described) => {
                        if let Some(r) = book.lock().expect("the provider's book lock is never poisoned").resources.get_mut(&(pool.clone(), cluster)) {
                            r.status.clone_from(&described.status);
                        }
                        match (described.state, described.endpoint) {
                            (ResourceState::Available, Some(_)) if let Some(from) = resize_from => {
                                if let Err(error) = api.resize(resource_id.clone(), size).await {
                                    break format!("resizing {resource_id} from {} to {} RPU failed: {error}", from.0, size.0);
                                }
                                resize_from = None;
                                record(&book, clock, &pool, "resize", Some(cluster), Some(size), format!("resizing {resource_id} from {} RPU", from.0));
                            }
                            (ResourceState::Available, Some(endpoint)) => {
                                if !still_ours(&book) {
                                    return;
                                }
                                let at = format!("{}:{}", endpoint.host, endpoint.port);
                                match sink.attach(pool.clone(), cluster, size, endpoint).await {
                                    // Handed over to another node meanwhile.
                                    Ok(()) if !still_ours(&book) => {
                                        sink.detach(pool.clone(), cluster);
                                        return;
                                    }
                                    Ok(()) => {
                                        if let Some(r) = book.lock().expect("the provider's book lock is never poisoned").resources.get_mut(&(pool.clone(), cluster)) {
                                            r.phase = Phase::Serving;
                                        }
                                        record(&book, clock, &pool, "ready", Some(cluster), Some(size), format!("{resource_id} serves at {at}"));
                                        return;
                                    }
                                    Err(reason) => break format!("{resource_id} is available at {at} but {reason}"),
                                }
                            }
                            (ResourceState::Failed | ResourceState::Deleting, _) => {
                                break format!("the platform reports {resource_id} as {}", described.status);
                            }
                            _ => {}
                        }
                    }
                    Err(error) => last_error = Some(error),
                }
                if tokio::time::Instant::now() + poll > deadline {
                    let seen = last_error.map_or_else(String::new, |e| format!("; the last describe failed: {e}"));
                    break format!("{resource_id} did not become available within {:.0} s{seen}", timeout.as_secs_f64());
                }
                tokio::time::sleep(poll).await;
            };
            // It will not serve: delete it, and say why.
            if let Some(r) = book.lock().expect("the provider's book lock is never poisoned").resources.get_mut(&(pool.clone(), cluster)) {
                r.phase = Phase::Releasing;
            }
            let deleted = match delete_or_park(&api, &book, &pool, &resource_id, size).await {
                Ok(true) => format!("{reason}; paused and parked it"),
                Ok(false) => format!("{reason}; deleted it"),
                Err(error) => format!("{reason}; deleting it failed: {error}"),
            };
            tracing::warn!(message = "A cluster never served; abandoned.", pool = %pool, cluster = %cluster, reason = %deleted);
            book.lock().expect("the provider's book lock is never poisoned").resources.remove(&(pool.clone(), cluster));
            record(&book, clock, &pool, "abandon", Some(cluster), Some(size), deleted.clone());
            sink.abandon(pool, cluster, deleted);
        });
    }
}

/// Releases `resource_id` on the platform: deletes it or, on a platform
/// whose delete pauses ([`CloudApi::parks`]), pauses it and parks it for
/// reuse. Resolves with whether it was parked.
async fn delete_or_park(api: &Arc<dyn CloudApi>, book: &Arc<Mutex<Book>>, pool: &PoolId, resource_id: &str, size: Rpu) -> Result<bool, CloudError> {
    api.delete(resource_id.to_owned()).await?;
    let parks = api.parks();
    if parks {
        park(book, pool, resource_id.to_owned(), size);
    }
    Ok(parks)
}

fn park(book: &Arc<Mutex<Book>>, pool: &PoolId, resource_id: String, size: Rpu) {
    let mut book = book.lock().expect("the provider's book lock is never poisoned");
    let parked = book.parked.entry(pool.clone()).or_default();
    if !parked.iter().any(|p| p.resource_id == resource_id) {
        parked.push(Parked { resource_id, size });
    }
}

fn record(book: &Arc<Mutex<Book>>, clock: VirtualClock, pool: &PoolId, action: &'static str, cluster: Option<ClusterId>, size: Option<Rpu>, result: String) {
    let mut book = book.lock().expect("the provider's book lock is never poisoned");
    if book.recent.len() == RECENT_MAX {
        book.recent.pop_back();
    }
    book.recent.push_front(LifecycleRecord { at_s: clock.now().as_secs_f64(), pool: pool.clone(), action, cluster, size, result });
}

/// A refused platform call as the actors' error, naming the platform's
/// code.
fn refused(kind: &str, what: &str, error: &CloudError) -> ExecuteError {
    ExecuteError::Unavailable(format!("{kind} refused to {what}: {error}"))
}

impl Provider for CloudProvider {
    fn spin_up(&self, pool: PoolId, size: Rpu) -> LocalFuture<Result<ClusterId, ExecuteError>> {
        let cluster = {
            let mut book = self.book();
            let next = book.next_cluster.entry(pool.clone()).or_insert(0);
            let cluster = ClusterId(*next);
            *next += 1;
            cluster
        };
        let name = inventory::resource_name(&self.settings.name_prefix, &self.settings.deployment, &pool.0, cluster);
        let owner = Owner { deployment: self.settings.deployment.clone(), node: self.settings.node.clone(), pool: pool.to_string(), cluster, size };
        let kind = self.api.kind();
        let this = self.clone_handle();
        let reuse = self.unpark(&pool, size);
        Box::pin(async move {
            if let Some(parked) = reuse {
                match this.reuse(&pool, cluster, &parked, owner.clone()).await {
                    Ok(()) => return Ok(cluster),
                    Err(error) => {
                        // It stays parked; a new resource is created instead.
                        this.park(&pool, parked.resource_id.clone(), parked.size);
                        this.log(&pool, "reuse", Some(cluster), Some(size), format!("could not reuse {}: {error}; creating {name}", parked.resource_id));
                    }
                }
            }
            match this.api.create(CreateSpec { name: name.clone(), owner }).await {
                Ok(resource_id) => {
                    this.book().resources.insert(
                        (pool.clone(), cluster),
                        Resource { pool: pool.clone(), cluster, resource_id: resource_id.clone(), size, phase: Phase::Starting, status: "creating".into() },
                    );
                    this.log(&pool, "spin_up", Some(cluster), Some(size), format!("created {resource_id}"));
                    this.watch_until_serving(pool, cluster, resource_id, size, None);
                    Ok(cluster)
                }
                Err(error) => {
                    let refusal = refused(kind, &format!("create {name} ({} RPU)", size.0), &error);
                    this.log(&pool, "spin_up", Some(cluster), Some(size), refusal.to_string());
                    Err(refusal)
                }
            }
        })
    }

    fn spin_down(&self, pool: PoolId, cluster: ClusterId) -> LocalFuture<Result<(), ExecuteError>> {
        let held = {
            let mut book = self.book();
            match book.resources.get_mut(&(pool.clone(), cluster)) {
                Some(r) if r.phase == Phase::Releasing => None,
                Some(r) => {
                    let was = r.phase;
                    r.phase = Phase::Releasing;
                    Some((r.resource_id.clone(), r.size, was))
                }
                None => None,
            }
        };
        let Some((resource_id, size, was)) = held else {
            return Box::pin(std::future::ready(Err(ExecuteError::UnknownCluster(cluster))));
        };
        self.log(&pool, "spin_down", Some(cluster), None, "draining, then deleting".into());
        let this = self.clone_handle();
        let kind = self.api.kind();
        tokio::task::spawn_local(async move {
            if was == Phase::Serving {
                this.sink.drain(pool.clone(), cluster).await;
            } else {
                this.sink.abandon(pool.clone(), cluster, "released before it served".into());
            }
            let result = match delete_or_park(&this.api, &this.book, &pool, &resource_id, size).await {
                Ok(true) => format!("paused and parked {resource_id}"),
                Ok(false) => format!("deleted {resource_id}"),
                Err(error) => refused(kind, &format!("delete {resource_id}"), &error).to_string(),
            };
            this.book().resources.remove(&(pool.clone(), cluster));
            this.log(&pool, "delete", Some(cluster), Some(size), result);
        });
        Box::pin(std::future::ready(Ok(())))
    }

    fn state(&self) -> LocalFuture<Result<ProviderState, ExecuteError>> {
        let book = self.book();
        let detail = serde_json::json!({ "resources": book.resources.values().collect::<Vec<_>>(), "parked": book.parked });
        let state = ProviderState { kind: self.api.kind(), recent: book.recent.iter().cloned().collect(), detail };
        Box::pin(std::future::ready(Ok(state)))
    }
}

impl CloudProvider {
    /// Takes the parked resource a new cluster of `size` reuses, if any.
    fn unpark(&self, pool: &PoolId, size: Rpu) -> Option<Parked> {
        if !self.api.parks() {
            return None;
        }
        let mut book = self.book();
        let parked = book.parked.get_mut(pool)?;
        let sizes: Vec<Rpu> = parked.iter().map(|p| p.size).collect();
        inventory::pick_parked(&sizes, size).map(|i| parked.remove(i))
    }

    /// Makes the parked resource `parked` the new `cluster`: retags it as
    /// `owner`'s and resumes it; the watch resizes it if needed.
    async fn reuse(&self, pool: &PoolId, cluster: ClusterId, parked: &Parked, owner: Owner) -> Result<(), CloudError> {
        let size = owner.size;
        self.api.retag(parked.resource_id.clone(), owner).await?;
        self.api.resume(parked.resource_id.clone()).await?;
        self.book().resources.insert(
            (pool.clone(), cluster),
            Resource { pool: pool.clone(), cluster, resource_id: parked.resource_id.clone(), size, phase: Phase::Starting, status: "resuming".into() },
        );
        let resize = (parked.size != size).then_some(parked.size);
        let how = resize.map_or_else(String::new, |from| format!(", to be resized from {} RPU", from.0));
        self.log(pool, "spin_up", Some(cluster), Some(size), format!("reusing parked {}{how}", parked.resource_id));
        self.watch_until_serving(pool.clone(), cluster, parked.resource_id.clone(), size, resize);
        Ok(())
    }

    /// Another handle on the same provider, for its tasks.
    fn clone_handle(&self) -> CloudProvider {
        CloudProvider { api: self.api.clone(), sink: self.sink.clone(), settings: self.settings.clone(), clock: self.clock, book: self.book.clone() }
    }
}
