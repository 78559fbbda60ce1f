//! Tenants: who may submit to which pools, how fast, and how much at once.
//!
//! Each `[[tenant]]` has a bearer token, stored only as its SHA-256 hex
//! digest, the pools it may use, a rate (a token bucket of
//! `queries_per_s_max` with `burst`) and an in-flight cap. A client presents
//! `authorization: Bearer <token>`; the node hashes it and compares the
//! digest with every tenant's in constant time. With no tenants configured
//! the node is open, as a single-user node on loopback is.
//!
//! # Properties
//!
//! - (A) With tenants configured, a call without a token of one of them is
//!   refused (UNAUTHENTICATED), and a tenant's call to a pool it was not
//!   given is refused (PERMISSION_DENIED).
//! - (B) A tenant never has more than `in_flight_max` queries in progress,
//!   and over any interval of `t` seconds is admitted at most
//!   `burst + queries_per_s_max · t` queries; a refusal says when to retry.
//! - (C) The comparison's time does not depend on where a wrong token's
//!   digest differs.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use slogate_proto::GatewayError;

use crate::config::TenantSection;

/// One tenant's settings and counters.
#[derive(Debug)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    token_sha256: [u8; 32],
    /// The pools it may use; `None` for every pool.
    pools: Option<BTreeSet<String>>,
    queries_per_s_max: f64,
    burst: f64,
    in_flight_max: usize,
    bucket: Mutex<(f64, Instant)>,
    in_flight: AtomicUsize,
    /// Submissions refused by its rate or in-flight limit.
    pub throttled: AtomicU64,
}

/// Holds one of a tenant's in-flight slots until dropped.
#[derive(Debug)]
pub struct InFlightSlot {
    tenant: Arc<Tenant>,
}

impl Drop for InFlightSlot {
    fn drop(&mut self) {
        self.tenant.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Tenant {
    /// Whether it may use `pool`.
    pub fn may_use(&self, pool: &str) -> bool {
        self.pools.as_ref().is_none_or(|pools| pools.contains(pool))
    }

    /// Admits one query to `pool` at `now`: checks the pool, the rate and
    /// the in-flight cap, and returns the slot the query holds.
    pub fn admit(self: &Arc<Self>, pool: &str, now: Instant) -> Result<InFlightSlot, GatewayError> {
        if !self.may_use(pool) {
            return Err(GatewayError::PermissionDenied(format!("tenant `{}` may not use pool `{pool}`", self.name)));
        }
        if self.in_flight.fetch_add(1, Ordering::Relaxed) >= self.in_flight_max {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            self.throttled.fetch_add(1, Ordering::Relaxed);
            return Err(GatewayError::TenantLimit {
                tenant: self.name.clone(),
                reason: format!("{} queries in progress, its limit", self.in_flight_max),
                retry_after_ms: 100,
            });
        }
        let slot = InFlightSlot { tenant: Arc::clone(self) };
        if self.queries_per_s_max > 0.0 {
            let mut bucket = self.bucket.lock().expect("the bucket's lock is never poisoned");
            let (tokens, last) = *bucket;
            let tokens = (tokens + now.saturating_duration_since(last).as_secs_f64() * self.queries_per_s_max).min(self.burst);
            if tokens < 1.0 {
                *bucket = (tokens, now);
                self.throttled.fetch_add(1, Ordering::Relaxed);
                let wait_s = (1.0 - tokens) / self.queries_per_s_max;
                return Err(GatewayError::TenantLimit {
                    tenant: self.name.clone(),
                    reason: format!("over its rate of {} queries/s", self.queries_per_s_max),
                    retry_after_ms: (wait_s * 1_000.0).ceil() as u64,
                });
            }
            *bucket = (tokens - 1.0, now);
        }
        Ok(slot)
    }

    /// Queries it has in progress.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// The configured tenants.
#[derive(Debug, Default)]
pub struct Tenants {
    tenants: Vec<Arc<Tenant>>,
    /// Calls refused for a missing or unknown token.
    pub failures: AtomicU64,
}

/// The SHA-256 hex digest of `token`, as `token_sha256` stores it.
pub fn token_digest_hex(token: &str) -> String {
    Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

fn parse_hex_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Constant-time equality of two digests.
fn digests_match(a: &[u8; 32], b: &[u8; 32]) -> bool {
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

impl Tenants {
    /// The tenants of `sections`, checked by the config loader already
    /// (a malformed digest is refused there).
    pub fn new(sections: &[TenantSection]) -> Self {
        let now = Instant::now();
        let tenants = sections
            .iter()
            .map(|section| {
                Arc::new(Tenant {
                    name: section.name.clone(),
                    token_sha256: parse_hex_digest(&section.token_sha256).unwrap_or([0; 32]),
                    pools: (!section.pools.iter().any(|p| p == "*")).then(|| section.pools.iter().cloned().collect()),
                    queries_per_s_max: section.queries_per_s_max,
                    burst: section.burst.max(1.0),
                    in_flight_max: section.in_flight_max,
                    bucket: Mutex::new((section.burst.max(1.0), now)),
                    in_flight: AtomicUsize::new(0),
                    throttled: AtomicU64::new(0),
                })
            })
            .collect();
        Tenants { tenants, failures: AtomicU64::new(0) }
    }

    /// Whether any tenant is configured.
    pub fn enabled(&self) -> bool {
        !self.tenants.is_empty()
    }

    /// Every tenant.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<Tenant>> {
        self.tenants.iter()
    }

    /// The tenant whose token is `presented`, comparing against every
    /// tenant's digest (no early exit), or `None`.
    pub fn find(&self, presented: &str) -> Option<Arc<Tenant>> {
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found = None;
        for tenant in &self.tenants {
            if digests_match(&digest, &tenant.token_sha256) {
                found = Some(Arc::clone(tenant));
            }
        }
        found
    }

    /// Who is calling, from a bearer token if one was presented: `Ok(None)`
    /// when no tenants are configured; an error (counted and logged) when
    /// they are and the token is missing or unknown. `peer`, the caller's
    /// address if known, is formatted only into a refusal's log line.
    pub fn authenticate(&self, bearer: Option<&str>, peer: Option<std::net::SocketAddr>) -> Result<Option<Arc<Tenant>>, GatewayError> {
        if !self.enabled() {
            return Ok(None);
        }
        if let Some(tenant) = bearer.and_then(|token| self.find(token)) {
            return Ok(Some(tenant));
        }
        let failures = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        let peer = peer.map_or_else(String::new, |address| address.to_string());
        tracing::warn!(message = "gRPC call refused: missing or unknown tenant token.", %peer, failures);
        Err(GatewayError::Unauthenticated)
    }
}

/// The bearer token of an `authorization` header value, if it is one.
pub fn bearer(value: Option<&str>) -> Option<&str> {
    value.and_then(|v| v.strip_prefix("Bearer ")).map(str::trim)
}

/// How long a throttled client should wait, for `grpc-retry-pushback-ms`.
pub fn retry_after(error: &GatewayError) -> Option<Duration> {
    match error {
        GatewayError::TenantLimit { retry_after_ms, .. } => Some(Duration::from_millis(*retry_after_ms)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn section(rate: f64, burst: f64, in_flight_max: usize) -> TenantSection {
        TenantSection {
            name: "dash".into(),
            token_sha256: token_digest_hex("s3cret"),
            pools: vec!["default".into()],
            queries_per_s_max: rate,
            burst,
            in_flight_max,
        }
    }

    #[test]
    fn only_a_configured_token_authenticates_and_pools_are_checked() {
        let tenants = Tenants::new(&[section(0.0, 1.0, 10)]);
        let tenant = tenants.authenticate(Some("s3cret"), None).unwrap().unwrap();
        assert_eq!(tenant.name, "dash");
        assert_eq!(tenants.authenticate(Some("s3cres"), None).unwrap_err(), GatewayError::Unauthenticated);
        assert_eq!(tenants.authenticate(None, None).unwrap_err(), GatewayError::Unauthenticated);
        assert_eq!(tenants.failures.load(Ordering::Relaxed), 2);
        let denied = tenant.admit("batch", Instant::now()).unwrap_err();
        assert_eq!(denied.to_status().code(), tonic::Code::PermissionDenied);
        assert!(Tenants::new(&[]).authenticate(None, None).unwrap().is_none());
    }

    #[test]
    fn the_in_flight_cap_holds_and_frees_with_the_slot() {
        let tenants = Tenants::new(&[section(0.0, 1.0, 2)]);
        let tenant = tenants.find("s3cret").unwrap();
        let now = Instant::now();
        let (a, _b) = (tenant.admit("default", now).unwrap(), tenant.admit("default", now).unwrap());
        let refused = tenant.admit("default", now).unwrap_err();
        assert_eq!(refused.to_status().code(), tonic::Code::ResourceExhausted);
        assert!(retry_after(&refused).is_some());
        drop(a);
        assert!(tenant.admit("default", now).is_ok());
    }

    proptest! {
        /// (B): over `t` seconds at most `burst + rate·t` are admitted.
        #[test]
        fn the_rate_limit_admits_at_most_burst_plus_rate_times_time(rate in 1.0f64..50.0, burst in 1.0f64..20.0, gaps_ms in proptest::collection::vec(0u64..200, 1..300)) {
            let tenants = Tenants::new(&[section(rate, burst, usize::MAX)]);
            let tenant = tenants.find("s3cret").unwrap();
            let start = Instant::now();
            let mut now = start;
            let mut admitted = 0usize;
            for gap in gaps_ms {
                now += Duration::from_millis(gap);
                if let Ok(slot) = tenant.admit("default", now) {
                    admitted += 1;
                    drop(slot);
                }
            }
            let bound = burst.max(1.0) + rate * (now - start).as_secs_f64();
            prop_assert!(admitted as f64 <= bound + 1e-9, "{admitted} admitted, bound {bound}");
        }
    }
}
