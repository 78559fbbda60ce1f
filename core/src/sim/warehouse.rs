//! The completion model a [`super::Simulation`] drives.
//!
//! Two implement it, and they are never mixed:
//!
//! - [`crate::world::World`], the emulated warehouse: ground truth, for
//!   evaluations;
//! - `crate::tune::PredictedWarehouse`, the planner's model: queries
//!   complete when a learned predictor says so, for the policy tuner's batch
//!   simulations.
//!
//! The engine, routers and controllers see only what this trait reports, as
//! a live RouterShard sees a real warehouse.

use crate::model::{ClusterId, ClusterState, Query, Rpu, WarehouseEvent};
use crate::time::{Duration, Instant};
use crate::world::World;

/// A warehouse the simulator drives in virtual time.
pub trait Warehouse {
    /// Requests a cluster of `size` at `now` (`warm`: ready at once, cache
    /// warm); it reports [`WarehouseEvent::ClusterReady`] when ready.
    fn add_cluster(&mut self, now: Instant, size: Rpu, warm: bool) -> ClusterId;
    /// Starts `query` on `cluster` at `now`.
    fn dispatch(&mut self, now: Instant, query: &Query, cluster: ClusterId);
    /// Whether an elastic tier takes offloads.
    fn has_elastic(&self) -> bool;
    /// Starts `query` on the elastic tier at `now` (only if
    /// [`Warehouse::has_elastic`]).
    fn dispatch_elastic(&mut self, now: Instant, query: &Query);
    /// Drains `cluster` and releases it.
    fn tear_down(&mut self, now: Instant, cluster: ClusterId);
    /// The next instant something happens without further input.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Advances to `now`.
    fn handle_timeout(&mut self, now: Instant);
    /// The next event, in the order things happened.
    fn poll_event(&mut self) -> Option<WarehouseEvent>;
    /// Every cluster ever requested, in id order.
    fn cluster_ids(&self) -> Vec<ClusterId>;
    /// A cluster's state.
    fn cluster_state(&self, cluster: ClusterId) -> ClusterState;
    /// A cluster's size.
    fn cluster_size(&self, cluster: ClusterId) -> Rpu;
    /// From a cluster's request to ready.
    fn spinup_delay(&self) -> Duration;
    /// A cluster's billed active time up to `now`.
    fn billed_time(&self, cluster: ClusterId, now: Instant) -> Duration;
    /// A cluster's bill up to `now`, dollars.
    fn billed_cost_usd(&self, cluster: ClusterId, now: Instant) -> f64;
    /// The elastic tier's bill, dollars.
    fn elastic_cost_usd(&self) -> f64;
}

impl Warehouse for World {
    fn add_cluster(&mut self, now: Instant, size: Rpu, warm: bool) -> ClusterId {
        World::add_cluster(self, now, size, warm)
    }
    fn dispatch(&mut self, now: Instant, query: &Query, cluster: ClusterId) {
        World::dispatch(self, now, query, cluster);
    }
    fn has_elastic(&self) -> bool {
        self.config().elastic.is_some()
    }
    fn dispatch_elastic(&mut self, now: Instant, query: &Query) {
        World::dispatch_elastic(self, now, query);
    }
    fn tear_down(&mut self, now: Instant, cluster: ClusterId) {
        World::tear_down(self, now, cluster);
    }
    fn poll_timeout(&self) -> Option<Instant> {
        World::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        World::handle_timeout(self, now);
    }
    fn poll_event(&mut self) -> Option<WarehouseEvent> {
        World::poll_event(self)
    }
    fn cluster_ids(&self) -> Vec<ClusterId> {
        World::cluster_ids(self).collect()
    }
    fn cluster_state(&self, cluster: ClusterId) -> ClusterState {
        World::cluster_state(self, cluster)
    }
    fn cluster_size(&self, cluster: ClusterId) -> Rpu {
        World::cluster_size(self, cluster)
    }
    fn spinup_delay(&self) -> Duration {
        self.config().spinup_delay
    }
    fn billed_time(&self, cluster: ClusterId, now: Instant) -> Duration {
        World::billed_time(self, cluster, now)
    }
    fn billed_cost_usd(&self, cluster: ClusterId, now: Instant) -> f64 {
        World::billed_cost_usd(self, cluster, now)
    }
    fn elastic_cost_usd(&self) -> f64 {
        World::elastic_cost_usd(self)
    }
}
