//! The completion model a [`super::Simulation`] drives.
//!
//! Two implement it, and they are never mixed:
//!
//! - `slogate_world::World`, the emulated warehouse: ground truth, for
//!   evaluations (its own crate, which decision components cannot import);
//! - `crate::tune::PredictedWarehouse`, the planner's model: queries
//!   complete when a learned predictor says so, for the policy tuner's batch
//!   simulations.
//!
//! The engine, routers and controllers see only what this trait reports, as
//! a live RouterShard sees a real warehouse.

use crate::model::{ClusterId, ClusterState, Query, Rpu, WarehouseEvent};
use crate::time::{Duration, Instant};

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
