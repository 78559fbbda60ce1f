//! The node's virtual clock: core's `Instant` from tokio's (pausable) clock,
//! optionally compressed.

use slogate_core::time::{Duration, Instant};

/// Maps tokio time to core virtual time: `(now − start) × compression`.
/// Copies share the same origin, so every actor of a node agrees on `now`.
#[derive(Clone, Copy, Debug)]
pub struct VirtualClock {
    start: tokio::time::Instant,
    compression: f64,
    /// The node's calendar at `start`, UNIX seconds.
    calendar_start_unix_s: f64,
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
        VirtualClock { start: tokio::time::Instant::now(), compression, calendar_start_unix_s: unix_now_s() }
    }

    /// The same clock with its calendar starting at `unix_s` instead of the
    /// wall clock's now (e.g. the last 00:00 UTC, so that a trace replayed
    /// from the node's start keeps its times of day).
    pub fn with_calendar_start(mut self, unix_s: f64) -> Self {
        self.calendar_start_unix_s = unix_s;
        self
    }

    /// The node's calendar now, UNIX seconds: its start plus the virtual
    /// time since. Calendar days (the reservoir's hours, the tuner's target
    /// day, planned times of day) are counted in it, so that a compressed
    /// node's days pass at its compression; at compression 1 with the
    /// default start it is the wall clock.
    pub fn calendar_now_s(&self) -> f64 {
        self.calendar_s(self.now())
    }

    /// The node's calendar at virtual instant `at`, UNIX seconds.
    pub fn calendar_s(&self, at: Instant) -> f64 {
        self.calendar_start_unix_s + at.as_secs_f64()
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

/// Wall-clock UNIX time, seconds (what a node's calendar starts from, and
/// what operators' timestamps are in).
pub fn unix_now_s() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}
