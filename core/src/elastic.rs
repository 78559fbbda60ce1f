//! The elastic (serverless) tier: a FaaS platform such as AWS Lambda
//! running a query on a fan-out of workers.
//!
//! - [`ElasticConfig`]: cold start, keep-alive, speed relative to a
//!   reference cluster size, a concurrency limit, and FaaS prices (AWS
//!   Lambda's public x86 prices as defaults).
//! - [`ElasticPool`]: which invocations find a warm instance, and how many
//!   run. The world keeps one as ground truth; the router keeps its own,
//!   driven only by the invocations it made and the completions it saw.
//! - [`ElasticConfig::invocation_cost_usd`]: what one invocation bills.
//!
//! # Properties
//!
//! - (A) An invocation is warm exactly when an instance finished within
//!   the keep-alive period before it and no other invocation took it.
//! - (B) Never more than `concurrency_limit` invocations run at once.
//! - (C) Cost is non-negative and non-decreasing in duration.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::model::Rpu;
use crate::time::{Duration, Instant};

/// The elastic tier's behaviour and prices.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ElasticConfig {
    /// Extra latency of an invocation that finds no warm instance.
    pub cold_start: Duration,
    /// How long a finished instance stays warm.
    pub keep_alive: Duration,
    /// The cluster size whose isolated latency the elastic tier is
    /// compared with.
    pub reference_size: Rpu,
    /// Speed relative to that size: 0.5 takes twice as long.
    pub speed_factor: f64,
    /// Invocations that may run at once; more wait for a slot.
    pub concurrency_limit: u32,
    /// Workers (functions) one query fans out to.
    pub workers_per_query: u32,
    /// Memory per worker, MB (the price is per GB-second).
    pub memory_mb: u32,
    /// Price per request, dollars (Lambda: $0.20 per million).
    pub price_per_request_usd: f64,
    /// Price per GB-second, dollars (Lambda x86: $0.0000166667).
    pub price_per_gb_second_usd: f64,
}

impl Default for ElasticConfig {
    fn default() -> Self {
        ElasticConfig {
            cold_start: Duration::from_secs(2),
            keep_alive: Duration::from_secs(600),
            reference_size: Rpu(16),
            speed_factor: 0.5,
            concurrency_limit: 64,
            workers_per_query: 16,
            memory_mb: 10_240,
            price_per_request_usd: 0.20e-6,
            price_per_gb_second_usd: 0.000_016_666_7,
        }
    }
}

impl ElasticConfig {
    /// The bill of one query's invocation running for `duration`.
    pub fn invocation_cost_usd(&self, duration: Duration) -> f64 {
        let workers = f64::from(self.workers_per_query);
        let gb_seconds = f64::from(self.memory_mb) / 1_024.0 * duration.as_secs_f64();
        workers * (self.price_per_request_usd + gb_seconds * self.price_per_gb_second_usd)
    }

    /// Execution time on the elastic tier of a query whose isolated latency
    /// at `reference_size` is `reference_latency` (cold start excluded).
    pub fn execution_time(&self, reference_latency: Duration) -> Duration {
        reference_latency.mul_f64(1.0 / self.speed_factor.max(1e-6))
    }
}

/// Warm instances and running invocations. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ElasticPool {
    /// When each idle instance went idle, oldest first.
    idle_since: VecDeque<Instant>,
    running: u32,
}

impl ElasticPool {
    /// An empty pool: every first invocation is cold.
    pub fn new() -> Self {
        ElasticPool::default()
    }

    /// Invocations running now.
    pub fn running(&self) -> u32 {
        self.running
    }

    /// Drops instances that went cold by `now`.
    fn expire(&mut self, now: Instant, keep_alive: Duration) {
        while self.idle_since.front().is_some_and(|&idle| idle + keep_alive <= now) {
            self.idle_since.pop_front();
        }
    }

    /// Whether an invocation at `now` would find a warm instance.
    pub fn would_be_warm(&self, now: Instant, config: &ElasticConfig) -> bool {
        self.idle_since.iter().any(|&idle| idle + config.keep_alive > now)
    }

    /// Whether an invocation may start now (under the concurrency limit).
    pub fn has_capacity(&self, config: &ElasticConfig) -> bool {
        self.running < config.concurrency_limit
    }

    /// Starts an invocation at `now`; returns whether it is warm. The
    /// caller checks [`ElasticPool::has_capacity`] first.
    ///
    /// # Panics
    ///
    /// At the concurrency limit.
    pub fn start(&mut self, now: Instant, config: &ElasticConfig) -> bool {
        assert!(self.has_capacity(config), "elastic invocation beyond the concurrency limit");
        self.expire(now, config.keep_alive);
        self.running += 1;
        // The most recently idle instance is the warmest.
        self.idle_since.pop_back().is_some()
    }

    /// An invocation finished at `now`: its instance idles, warm.
    ///
    /// # Panics
    ///
    /// With nothing running.
    pub fn finish(&mut self, now: Instant, config: &ElasticConfig) {
        assert!(self.running > 0, "elastic finish without a running invocation");
        self.running -= 1;
        self.expire(now, config.keep_alive);
        self.idle_since.push_back(now);
    }
}

/// Billing of **provisioned** instances (EC2-like): from spinup until
/// teardown, per second, at least `minimum` per instance lifetime.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProvisionedBilling {
    /// Price per instance-hour, dollars.
    pub price_per_hour_usd: f64,
    /// The minimum billed per lifetime (EC2: 60 s).
    pub minimum: Duration,
}

impl Default for ProvisionedBilling {
    fn default() -> Self {
        ProvisionedBilling { price_per_hour_usd: 0.0416, minimum: Duration::from_secs(60) }
    }
}

impl ProvisionedBilling {
    /// The bill of an instance that ran from `started` to `stopped`: whole
    /// seconds, rounded up, at least `minimum`.
    pub fn cost_usd(&self, started: Instant, stopped: Instant) -> f64 {
        let seconds = (stopped - started).as_micros().div_ceil(1_000_000);
        let billed = seconds.max(self.minimum.as_micros().div_ceil(1_000_000));
        billed as f64 * self.price_per_hour_usd / 3_600.0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(s: f64) -> Instant {
        Instant::from_secs_f64(s)
    }

    #[test]
    fn lambda_prices_give_the_hand_computed_bill() {
        // 16 workers × (0.2e-6 + 10 GB × 30 s × 0.0000166667) = 0.0800032.
        let cost = ElasticConfig::default().invocation_cost_usd(Duration::from_secs(30));
        assert!((cost - 16.0 * (0.2e-6 + 10.0 * 30.0 * 0.000_016_666_7)).abs() < 1e-12, "{cost}");
        assert!((cost - 0.080_003_2).abs() < 1e-6);
    }

    #[test]
    fn an_instance_stays_warm_for_the_keep_alive_period_only() {
        let config = ElasticConfig { keep_alive: Duration::from_secs(100), ..ElasticConfig::default() };
        let mut pool = ElasticPool::new();
        assert!(!pool.start(at(0.0), &config), "the first invocation is cold");
        pool.finish(at(10.0), &config);
        assert!(pool.would_be_warm(at(109.0), &config));
        assert!(pool.start(at(109.0), &config), "reuses the idle instance");
        assert!(!pool.start(at(109.5), &config), "no second idle instance");
        pool.finish(at(120.0), &config);
        assert!(!pool.would_be_warm(at(220.0), &config));
        assert!(!pool.start(at(220.0), &config), "went cold at 220 s");
    }

    #[test]
    fn provisioned_instances_bill_whole_seconds_with_a_minute_minimum() {
        let billing = ProvisionedBilling { price_per_hour_usd: 3.6, minimum: Duration::from_secs(60) };
        // $0.001 per second.
        assert!((billing.cost_usd(at(0.0), at(10.0)) - 0.060).abs() < 1e-12, "10 s bills the 60 s minimum");
        assert!((billing.cost_usd(at(0.0), at(90.2)) - 0.091).abs() < 1e-12, "90.2 s bills 91 s");
        assert!((billing.cost_usd(at(100.0), at(3_700.0)) - 3.6).abs() < 1e-9, "an hour bills the hourly price");
    }

    proptest! {
        #[test]
        fn the_concurrency_limit_holds(ops in prop::collection::vec(any::<bool>(), 1..200), limit in 1u32..8) {
            let config = ElasticConfig { concurrency_limit: limit, ..ElasticConfig::default() };
            let mut pool = ElasticPool::new();
            for (i, start) in ops.into_iter().enumerate() {
                let now = at(i as f64);
                if start && pool.has_capacity(&config) {
                    pool.start(now, &config);
                } else if !start && pool.running() > 0 {
                    pool.finish(now, &config);
                }
                prop_assert!(pool.running() <= limit);
            }
        }

        #[test]
        fn cost_grows_with_duration(a in 0.0f64..1e4, b in 0.0f64..1e4) {
            let config = ElasticConfig::default();
            let (lo, hi) = if a <= b { (a, b) } else { (b, a) };
            let (c_lo, c_hi) = (config.invocation_cost_usd(Duration::from_secs_f64(lo)), config.invocation_cost_usd(Duration::from_secs_f64(hi)));
            prop_assert!(c_lo >= 0.0 && c_lo <= c_hi);
        }
    }
}
