//! The node's virtual clock: core's `Instant` from tokio's (pausable) clock,
//! optionally compressed.

use slogate_core::time::{Duration, Instant};

/// Maps tokio time to core virtual time: `(now − start) × compression`.
/// Copies share the same origin, so every actor of a node agrees on `now`.
#[derive(Clone, Copy, Debug)]
pub struct VirtualClock {
    start: tokio::time::Instant,
    compression: f64,
}

impl VirtualClock {
    /// A clock starting now, running `compression` virtual seconds per real
    /// second.
    ///
    /// # Panics
    ///
    /// If `compression` is not a positive finite number (config validation
    /// rules that out).
    pub fn start(compression: f64) -> Self {
        assert!(compression.is_finite() && compression > 0.0, "compression must be positive, got {compression}");
        VirtualClock { start: tokio::time::Instant::now(), compression }
    }

    /// Virtual time now.
    pub fn now(&self) -> Instant {
        Instant::from_secs_f64(self.start.elapsed().as_secs_f64() * self.compression)
    }

    /// Virtual seconds per real second.
    pub fn compression(&self) -> f64 {
        self.compression
    }

    /// The real time a virtual span takes.
    pub fn real_duration(&self, virtual_span: Duration) -> std::time::Duration {
        std::time::Duration::from_secs_f64(virtual_span.as_secs_f64() / self.compression)
    }
}

/// Wall-clock UNIX time, seconds: what calendar days (the reservoir's
/// hours, the tuner's target day, planned times of day) are counted in.
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
