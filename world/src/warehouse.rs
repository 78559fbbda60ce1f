//! The world as the simulator's completion model.

use slogate_core::model::{ClusterId, ClusterState, Query, Rpu, WarehouseEvent};
use slogate_core::sim::warehouse::Warehouse;
use slogate_core::time::{Duration, Instant};

use crate::World;

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
