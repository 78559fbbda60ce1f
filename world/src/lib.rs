//! # slogate-world
//!
//! The emulated warehouse: slogate's ground truth for evaluations and its
//! embedded default backend, fitted to real Amazon Redshift Serverless
//! measurements of TPC-DS.
//!
//! It is a crate of its own so that "decisions never read the world" is a
//! dependency rule rather than a convention: it depends on `slogate-core`,
//! so nothing in core (the router, predictors, autoscaler, tuner) can name
//! it. Decision components learn only from the executions a warehouse
//! reports. The live node drives it through the actors' `Backend` seam,
//! and the simulator through core's [`Warehouse`] trait.
//!
//! # Layout
//!
//! - [`World`] and [`WorldConfig`]: the model (processor sharing with a
//!   per-query parallelism limit, admission slots and a short-query lane,
//!   oversubscription interference, cold caches, noise, spinup and
//!   teardown delays, timeouts, billing, an elastic tier).
//! - [`catalog`]: the embedded measurements and their parsers.
//!
//! # Example
//!
//! Route 297 queries round-robin over two 16-RPU clusters in virtual time
//! and read the violation rate and cost:
//!
//! ```
//! use slogate_core::model::{PoolId, Query, QueryId, Rpu, Slo, TemplateId};
//! use slogate_core::route::RoundRobin;
//! use slogate_core::sim::Simulation;
//! use slogate_core::time::{Duration, Instant};
//! use slogate_world::{World, WorldConfig};
//!
//! let mut world = World::new(WorldConfig::default());
//! for _ in 0..2 {
//!     world.add_cluster(Instant::ZERO, Rpu(16), true);
//! }
//! let queries = (0..297)
//!     .map(|i| Query {
//!         id: QueryId(i),
//!         pool: PoolId::default(),
//!         template: TemplateId(1 + (i % 99) as u32),
//!         slo: Slo { latency: Duration::from_secs(120) },
//!         arrival: Instant::from_secs_f64(i as f64 * 10.0),
//!     })
//!     .collect();
//! let mut sim = Simulation::new(world, RoundRobin::default(), queries);
//! sim.drive_until_idle();
//! let summary = sim.summary();
//! assert_eq!(summary.queries, 297);
//! assert!(summary.cost_usd > 0.0);
//! ```
//!
//! [`Warehouse`]: slogate_core::sim::warehouse::Warehouse
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]
#![deny(clippy::disallowed_methods, clippy::disallowed_types)]

pub mod catalog;
mod emulated;
mod warehouse;

pub use emulated::*;
