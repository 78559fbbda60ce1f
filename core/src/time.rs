//! Virtual time: microsecond [`Instant`] and [`Duration`] newtypes.
//!
//! Nothing in `slogate-core` reads a clock. Every time-dependent call takes
//! `now: Instant`; the simulator advances it event by event and the live
//! shells convert from their runtime's (pausable) clock.
//!
//! Arithmetic saturates at zero instead of wrapping: an `Instant` minus a
//! later `Instant` is [`Duration::ZERO`], which is what every caller here
//! wants ("how long ago", "how long until").

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

use serde::{Deserialize, Serialize};

const MICROS_PER_SEC: f64 = 1_000_000.0;

/// A point in virtual time, in microseconds since the start of the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Instant(u64);

/// A span of virtual time, in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Duration(u64);

impl Instant {
    /// The start of a run.
    pub const ZERO: Instant = Instant(0);
    /// The far future; used as "never".
    pub const MAX: Instant = Instant(u64::MAX);

    /// An instant `micros` microseconds after the start.
    pub const fn from_micros(micros: u64) -> Self {
        Instant(micros)
    }

    /// An instant `secs` seconds after the start, rounded to the microsecond.
    /// Negative and non-finite inputs clamp to the representable range.
    pub fn from_secs_f64(secs: f64) -> Self {
        Instant(secs_to_micros(secs))
    }

    /// Microseconds since the start.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// Seconds since the start.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / MICROS_PER_SEC
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }
}

impl Duration {
    /// No time at all.
    pub const ZERO: Duration = Duration(0);
    /// The longest representable span; used as "forever".
    pub const MAX: Duration = Duration(u64::MAX);

    /// A span of `micros` microseconds.
    pub const fn from_micros(micros: u64) -> Self {
        Duration(micros)
    }

    /// A span of `millis` milliseconds.
    pub const fn from_millis(millis: u64) -> Self {
        Duration(millis.saturating_mul(1_000))
    }

    /// A span of `secs` whole seconds.
    pub const fn from_secs(secs: u64) -> Self {
        Duration(secs.saturating_mul(1_000_000))
    }

    /// A span of `secs` seconds, rounded to the microsecond. Negative and
    /// non-finite inputs clamp to the representable range.
    pub fn from_secs_f64(secs: f64) -> Self {
        Duration(secs_to_micros(secs))
    }

    /// The span in microseconds.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// The span in seconds.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / MICROS_PER_SEC
    }

    /// The span in milliseconds, as a float.
    pub fn as_millis_f64(self) -> f64 {
        self.0 as f64 / 1_000.0
    }

    /// `self * factor`, rounded, saturating; negative factors give zero.
    pub fn mul_f64(self, factor: f64) -> Duration {
        // In microseconds: no round trip through seconds (two divisions'
        // latency on the router's path).
        Duration(round_micros(self.0 as f64 * factor))
    }

    /// `self / other` as a float (`inf` or NaN for a zero `other`), in
    /// one division.
    pub fn ratio(self, other: Duration) -> f64 {
        self.0 as f64 / other.0 as f64
    }

    /// `self - other`, or zero.
    pub fn saturating_sub(self, other: Duration) -> Duration {
        Duration(self.0.saturating_sub(other.0))
    }
}

fn secs_to_micros(secs: f64) -> u64 {
    round_micros(secs * MICROS_PER_SEC)
}

/// `micros` rounded half up to a whole count, saturating; NaN and
/// negatives give zero.
fn round_micros(micros: f64) -> u64 {
    if micros.is_nan() || micros <= 0.0 {
        0
    } else {
        // Round half up by truncating `x + 0.5` (a saturating cast): the
        // same as `round()` for positive values, without a libm call on
        // the prediction hot path.
        (micros + 0.5) as u64
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign<Duration> for Instant {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, rhs: Instant) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl Sub<Duration> for Instant {
    type Output = Instant;
    fn sub(self, rhs: Duration) -> Instant {
        Instant(self.0.saturating_sub(rhs.0))
    }
}

impl Add for Duration {
    type Output = Duration;
    fn add(self, rhs: Duration) -> Duration {
        Duration(self.0.saturating_add(rhs.0))
    }
}

impl AddAssign for Duration {
    fn add_assign(&mut self, rhs: Duration) {
        *self = *self + rhs;
    }
}

impl Sub for Duration {
    type Output = Duration;
    fn sub(self, rhs: Duration) -> Duration {
        self.saturating_sub(rhs)
    }
}

impl fmt::Display for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t+{}s", crate::decimal::Fixed::<3>(self.as_secs_f64()))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}s", crate::decimal::Fixed::<3>(self.as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instant_minus_later_instant_saturates_to_zero() {
        assert_eq!(Instant::from_micros(5) - Instant::from_micros(9), Duration::ZERO);
    }

    #[test]
    fn seconds_round_trip_at_microsecond_precision() {
        let d = Duration::from_secs_f64(1.234_567);
        assert_eq!(d.as_micros(), 1_234_567);
        assert_eq!(Instant::from_secs_f64(2.5) + Duration::from_millis(500), Instant::from_secs_f64(3.0));
    }

    #[test]
    fn negative_and_nan_seconds_clamp_to_zero() {
        assert_eq!(Duration::from_secs_f64(-3.0), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(f64::NAN), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(f64::INFINITY), Duration::MAX);
    }

    #[test]
    fn scaling_rounds_to_the_nearest_microsecond_and_saturates() {
        assert_eq!(Duration::from_micros(3).mul_f64(0.5), Duration::from_micros(2), "1.5 µs rounds half up");
        assert_eq!(Duration::from_micros(1_000_001).mul_f64(1.5), Duration::from_micros(1_500_002));
        assert_eq!(Duration::from_secs_f64(2.0).mul_f64(-1.0), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(2.0).mul_f64(f64::NAN), Duration::ZERO);
        assert_eq!(Duration::MAX.mul_f64(2.0), Duration::MAX);
        assert_eq!(Duration::from_micros(3).ratio(Duration::from_micros(4)), 0.75);
    }
}
