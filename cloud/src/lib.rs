//! # slogate-cloud
//!
//! Cloud providers behind the actors' `Provider` seam. The autoscaler
//! decides which clusters should exist; a provider here makes them exist on
//! a cloud platform, waits until each serves, and hands its address to the
//! pool's backend (the Postgres-wire executor) through an `EndpointSink`.
//!
//! Every resource carries tags naming the deployment, the node, the pool
//! and slogate's cluster id (`slogate_core::scale::inventory`). A node that
//! starts lists what its deployment's tags name, adopts what the pool's
//! layout needs and terminates the rest, so nothing leaks even when a node
//! dies between a create call and noting its answer.
//!
//! # Layout
//!
//! - [`api`]: the [`api::CloudApi`] trait, the four calls a platform
//!   answers (create, describe, delete, list by tag), and its error.
//! - [`provider`]: [`provider::CloudProvider`], the `Provider` over any
//!   [`api::CloudApi`]: cluster ids, names and tags, waiting until a
//!   resource serves (deleting it when it does not in time), draining
//!   before deleting, reconciliation at start, and its log for operators.
//! - [`platform`]: which platform a pool's clusters live on, its settings,
//!   and [`platform::open`], which checks it at start.
//! - `aws` (cargo feature `aws`, on by default here; the node binary
//!   forwards its own `aws` feature): the AWS SDK implementations: Redshift
//!   Serverless workgroups, provisioned Redshift clusters and EC2
//!   instances, with the SDK's bounded retries on throttling and 5xx.
//!
//! Decisions stay in `slogate-core`: which resources to adopt or terminate
//! is `inventory::reconcile`, and a resource's name is
//! `inventory::resource_name`. This crate only carries them out.
#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

pub mod api;
#[cfg(feature = "aws")]
pub mod aws;
pub mod platform;
pub mod provider;

/// Why a cloud provider could not be set up or asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The provider's settings are wrong; the message names the setting.
    #[error("{0}")]
    Config(String),
    /// The platform refused or failed a call.
    #[error(transparent)]
    Api(#[from] api::CloudError),
    /// This build has no such provider.
    #[error("{0}")]
    NotBuilt(String),
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, Error>;

/// Whether this build has the AWS providers (cargo feature `aws`).
pub const AWS_BUILT: bool = cfg!(feature = "aws");
