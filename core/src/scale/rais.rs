//! A RAIS-like baseline: one cluster resized on queue length, with a
//! price-performance setting, in the manner of Redshift Serverless'
//! AI-driven scaling (AutoSLO §8.2's red baselines). The real system is
//! proprietary; this is the documented behaviour it is modelled on: scale
//! up when work queues, down when it stays light, within a maximum size.
//!
//! Every `interval` it counts the pool's outstanding queries per 16 RPU of
//! its cluster. At `scale_up_per_16_rpu` or more it requests a cluster of
//! twice the size (at most `max_size`); at `scale_down_per_16_rpu` or fewer
//! for `scale_down_after` it requests one of half the size (at least
//! `min_size`). The old cluster is torn down once the new one is ready, and
//! nothing else changes while a replacement is starting. It is SLO-unaware.
//! It stops looking while the pool is idle at its smallest size, and looks
//! again one interval after the next arrival.
//!
//! # Properties
//!
//! - (A) At most one replacement is in flight, and every cluster it
//!   requests is within `[min_size, max_size]`.
//! - (B) It never tears down the only ready cluster before its replacement
//!   is ready.

use serde::{Deserialize, Serialize};

use crate::model::{ClusterId, ClusterState, Pool, Rpu};
use crate::route::RoutingPolicy;
use crate::sim::{ClusterCommand, Controller, Observation};
use crate::time::{Duration, Instant};

/// The price-performance setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RaisConfig {
    /// How often it looks.
    pub interval: Duration,
    /// Outstanding queries per 16 RPU that double the cluster.
    pub scale_up_per_16_rpu: f64,
    /// Outstanding queries per 16 RPU at or under which, for
    /// `scale_down_after`, the cluster halves.
    pub scale_down_per_16_rpu: f64,
    /// How long the load must stay light.
    pub scale_down_after: Duration,
    /// The smallest size.
    pub min_size: Rpu,
    /// The largest size.
    pub max_size: Rpu,
}

impl RaisConfig {
    /// "Balanced" (slider at 50): scales up at 4 queued per 16 RPU, down
    /// after 15 minutes at 1 or fewer.
    pub fn balanced() -> Self {
        RaisConfig {
            interval: Duration::from_secs(60),
            scale_up_per_16_rpu: 4.0,
            scale_down_per_16_rpu: 1.0,
            scale_down_after: Duration::from_secs(900),
            min_size: Rpu(8),
            max_size: Rpu(128),
        }
    }

    /// "High performance" (slider at 100): scales up at 2 queued per 16
    /// RPU, down after 30 minutes at 0.5 or fewer, never under 16 RPU.
    pub fn high_performance() -> Self {
        RaisConfig {
            scale_up_per_16_rpu: 2.0,
            scale_down_per_16_rpu: 0.5,
            scale_down_after: Duration::from_secs(1_800),
            min_size: Rpu(16),
            ..RaisConfig::balanced()
        }
    }
}

/// The controller. See the module docs.
#[derive(Clone, Debug)]
pub struct Rais {
    config: RaisConfig,
    next_tick: Option<Instant>,
    light_since: Option<Instant>,
    /// The cluster to tear down once a replacement is ready.
    replacing: Option<ClusterId>,
    commands: std::collections::VecDeque<ClusterCommand>,
    /// Replacements requested, `(at, size)`.
    pub resizes: Vec<(Instant, Rpu)>,
}

impl Rais {
    /// A controller with `config`, first looking after one interval.
    pub fn new(config: RaisConfig) -> Self {
        let next_tick = Some(Instant::ZERO + config.interval);
        Rais { config, next_tick, light_since: None, replacing: None, commands: std::collections::VecDeque::new(), resizes: Vec::new() }
    }

    fn resize(&mut self, now: Instant, from: ClusterId, size: Rpu) {
        self.replacing = Some(from);
        self.light_since = None;
        self.resizes.push((now, size));
        self.commands.push_back(ClusterCommand::SpinUp { size });
    }
}

impl Controller for Rais {
    fn handle_observation(&mut self, now: Instant, observation: Observation<'_>, pool: &Pool, _router: &dyn RoutingPolicy) {
        if matches!(observation, Observation::Arrival { .. }) && self.next_tick.is_none() {
            self.next_tick = Some(now + self.config.interval);
        }
        if let Observation::ClusterReady(new) = observation
            && let Some(old) = self.replacing
            && new != old
            && pool.clusters.iter().any(|c| c.id == old && c.state == ClusterState::Ready)
        {
            self.replacing = None;
            self.commands.push_back(ClusterCommand::TearDown { cluster: old });
        }
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.next_tick
    }

    fn handle_timeout(&mut self, now: Instant, pool: &Pool, _router: &dyn RoutingPolicy) {
        self.next_tick = Some(now + self.config.interval);
        if self.replacing.is_some() {
            return;
        }
        let Some(cluster) = pool.ready_clusters().max_by_key(|c| (c.size, c.id)) else { return };
        let outstanding: usize = pool.clusters.iter().map(|c| c.running.len()).sum();
        if outstanding == 0 && cluster.size <= self.config.min_size {
            // Idle at the floor: nothing to watch until the next arrival.
            self.next_tick = None;
            return;
        }
        let per_16 = outstanding as f64 * 16.0 / f64::from(cluster.size.0);
        if per_16 >= self.config.scale_up_per_16_rpu && cluster.size < self.config.max_size {
            let size = Rpu((cluster.size.0 * 2).min(self.config.max_size.0));
            self.resize(now, cluster.id, size);
        } else if per_16 <= self.config.scale_down_per_16_rpu && cluster.size > self.config.min_size {
            let since = *self.light_since.get_or_insert(now);
            if now - since >= self.config.scale_down_after {
                let size = Rpu((cluster.size.0 / 2).max(self.config.min_size.0));
                self.resize(now, cluster.id, size);
            }
        } else {
            self.light_since = None;
        }
    }

    fn poll_command(&mut self) -> Option<ClusterCommand> {
        self.commands.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ClusterView, PoolId, QueryId, RunningQuery, Slo, TemplateId};
    use crate::route::RoundRobin;

    fn pool(size: u32, running: usize) -> Pool {
        let running = (0..running)
            .map(|i| RunningQuery { id: QueryId(i as u64), template: TemplateId(1), slo: Slo { latency: Duration::from_secs(10) }, arrival: Instant::ZERO, dispatched: Instant::ZERO })
            .collect();
        Pool { id: PoolId::default(), clusters: vec![ClusterView { id: ClusterId(0), size: Rpu(size), state: ClusterState::Ready, requested_at: Instant::ZERO, ready_at: Instant::ZERO, running }] }
    }

    #[test]
    fn a_queue_doubles_the_cluster_and_the_old_one_goes_once_the_new_is_ready() {
        let mut rais = Rais::new(RaisConfig::balanced());
        let router = RoundRobin::default();
        // 8 queued on 32 RPU = 4 per 16 RPU: double to 64.
        rais.handle_timeout(Instant::from_secs_f64(60.0), &pool(32, 8), &router);
        assert_eq!(rais.poll_command(), Some(ClusterCommand::SpinUp { size: Rpu(64) }));
        // While it starts, nothing more.
        rais.handle_timeout(Instant::from_secs_f64(120.0), &pool(32, 30), &router);
        assert_eq!(rais.poll_command(), None);
        let mut grown = pool(32, 8);
        grown.clusters.push(ClusterView { id: ClusterId(1), size: Rpu(64), state: ClusterState::Ready, ..grown.clusters[0].clone() });
        rais.handle_observation(Instant::from_secs_f64(400.0), Observation::ClusterReady(ClusterId(1)), &grown, &router);
        assert_eq!(rais.poll_command(), Some(ClusterCommand::TearDown { cluster: ClusterId(0) }));
    }

    #[test]
    fn an_idle_pool_at_its_floor_stops_the_clock_until_the_next_arrival() {
        let mut rais = Rais::new(RaisConfig::balanced());
        let router = RoundRobin::default();
        rais.handle_timeout(Instant::from_secs_f64(60.0), &pool(8, 0), &router);
        assert_eq!(rais.poll_timeout(), None);
        let query = crate::model::Query { id: QueryId(1), pool: PoolId::default(), template: TemplateId(1), slo: Slo { latency: Duration::from_secs(10) }, arrival: Instant::from_secs_f64(500.0) };
        rais.handle_observation(Instant::from_secs_f64(500.0), Observation::Arrival { query: &query, target: None }, &pool(8, 1), &router);
        assert_eq!(rais.poll_timeout(), Some(Instant::from_secs_f64(560.0)));
    }

    #[test]
    fn light_load_halves_the_cluster_only_after_the_delay_and_never_below_the_minimum() {
        let mut rais = Rais::new(RaisConfig::high_performance());
        let router = RoundRobin::default();
        for minute in 1..=30 {
            rais.handle_timeout(Instant::from_secs_f64(60.0 * f64::from(minute)), &pool(32, 0), &router);
            assert_eq!(rais.poll_command(), None, "minute {minute}");
        }
        rais.handle_timeout(Instant::from_secs_f64(60.0 * 31.0), &pool(32, 0), &router);
        assert_eq!(rais.poll_command(), Some(ClusterCommand::SpinUp { size: Rpu(16) }));
        let mut floor = Rais::new(RaisConfig::high_performance());
        for minute in 1..=100 {
            floor.handle_timeout(Instant::from_secs_f64(60.0 * f64::from(minute)), &pool(16, 0), &router);
        }
        assert_eq!(floor.poll_command(), None);
    }
}
