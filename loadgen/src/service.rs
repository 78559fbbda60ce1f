//! Request-level workloads for services with millisecond service times
//! (Spandana §2.1 and §7): the service set, per-second rate traces with
//! second- and sub-second-scale fluctuations, a load-spike variant, import
//! of a per-second rate trace, and the arrivals themselves.
//!
//! A [`RateTrace`] holds one rate per second; [`arrivals`] turns it into
//! request arrival times, a Poisson process within each second at that
//! second's rate (Spandana extrapolates its one-second trace the same way).
//! The arrivals are an iterator: an hour at thousands of requests per
//! second is millions of requests, and nothing needs them all at once.
//!
//! # Properties
//!
//! - (A) [`fluctuating_rates`]: every second's rate is within
//!   `max_deviation` of its minute's mean, and every minute's mean within
//!   `minute_drift` of the trace's mean.
//! - (B) [`arrivals`] are ascending, fall in their second, and number
//!   about the trace's total (a Poisson count per second).
//! - (C) Everything is a pure function of its parameters and seed.

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use slogate_core::time::{Duration, Instant};

use crate::{Error, Result};

/// A request-level service: its latency for one request on an idle
/// instance.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceSpec {
    /// Its name.
    pub name: String,
    /// Idle single-request latency.
    pub service_time: Duration,
}

/// Spandana's four applications (§7): Details 8 ms, Ratings 14 ms, Image
/// Processing 40 ms, Compression 130 ms.
pub fn spandana_services() -> Vec<ServiceSpec> {
    [("details", 8), ("ratings", 14), ("image-processing", 40), ("compression", 130)]
        .into_iter()
        .map(|(name, ms)| ServiceSpec { name: name.to_owned(), service_time: Duration::from_millis(ms) })
        .collect()
}

/// Requests per second, one entry per second from 0.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RateTrace {
    /// The rate of each second.
    pub rates_per_s: Vec<f64>,
}

impl RateTrace {
    /// Its length.
    pub fn duration(&self) -> Duration {
        Duration::from_secs(self.rates_per_s.len() as u64)
    }

    /// Expected requests over the whole trace.
    pub fn expected_requests(&self) -> f64 {
        self.rates_per_s.iter().sum()
    }

    /// The mean rate.
    pub fn mean_rate(&self) -> f64 {
        if self.rates_per_s.is_empty() { 0.0 } else { self.expected_requests() / self.rates_per_s.len() as f64 }
    }
}

/// Parameters of [`fluctuating_rates`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FluctuationConfig {
    /// The trace's mean rate, requests per second.
    pub mean_rate_per_s: f64,
    /// Its length, seconds.
    pub duration_s: u32,
    /// Each second deviates from its minute's mean by at most this fraction
    /// (Spandana's Twitter trace: 0.5).
    pub max_deviation: f64,
    /// Each minute's mean deviates from the trace's mean by at most this
    /// fraction (the Twitter trace: 0.072).
    pub minute_drift: f64,
    /// Seed.
    pub seed: u64,
}

impl Default for FluctuationConfig {
    fn default() -> Self {
        FluctuationConfig { mean_rate_per_s: 1_000.0, duration_s: 3_600, max_deviation: 0.5, minute_drift: 0.072, seed: 1 }
    }
}

/// A steady minute-scale load with second-scale fluctuations: each minute's
/// mean drifts within `minute_drift` of the trace's mean; each second's rate
/// is its minute's mean times `1 + u`, `u` uniform in
/// `[-max_deviation, max_deviation]`.
pub fn fluctuating_rates(config: &FluctuationConfig) -> Result<RateTrace> {
    if !(config.mean_rate_per_s.is_finite() && config.mean_rate_per_s > 0.0) {
        return Err(Error::InvalidParameter(format!("mean_rate_per_s must be positive, got {}", config.mean_rate_per_s)));
    }
    if !(0.0..1.0).contains(&config.max_deviation) || !(0.0..1.0).contains(&config.minute_drift) {
        return Err(Error::InvalidParameter("max_deviation and minute_drift must be in [0, 1)".into()));
    }
    let mut rng = SmallRng::seed_from_u64(config.seed);
    let mut rates = Vec::with_capacity(config.duration_s as usize);
    let mut minute_mean = config.mean_rate_per_s;
    for second in 0..config.duration_s {
        if second % 60 == 0 {
            minute_mean = config.mean_rate_per_s * (1.0 + rng.random_range(-1.0..=1.0) * config.minute_drift);
        }
        rates.push(minute_mean * (1.0 + rng.random_range(-1.0..=1.0) * config.max_deviation));
    }
    Ok(RateTrace { rates_per_s: rates })
}

/// The load-spike variant (Spandana §8.2): from `at_s` the load ramps to
/// `peak` times the trace over `ramp_s`, holds for `hold_s`, then eases over
/// `ramp_s` to `settle` times the trace for the rest.
pub fn with_spike(trace: &RateTrace, at_s: u32, ramp_s: u32, hold_s: u32, peak: f64, settle: f64) -> RateTrace {
    let factor = |second: u32| -> f64 {
        let ramp = f64::from(ramp_s.max(1));
        if second < at_s {
            1.0
        } else if second < at_s + ramp_s {
            1.0 + (peak - 1.0) * f64::from(second - at_s) / ramp
        } else if second < at_s + ramp_s + hold_s {
            peak
        } else if second < at_s + 2 * ramp_s + hold_s {
            peak + (settle - peak) * f64::from(second - at_s - ramp_s - hold_s) / ramp
        } else {
            settle
        }
    };
    RateTrace { rates_per_s: trace.rates_per_s.iter().enumerate().map(|(s, r)| r * factor(s as u32)).collect() }
}

/// Parses a per-second rate trace: CSV with the header `second,rate`,
/// seconds ascending from 0 (gaps are seconds without requests). Errors
/// name the line.
pub fn parse_rate_csv(text: &str) -> Result<RateTrace> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, header)) if header.trim() == "second,rate" => {}
        _ => return Err(Error::Trace { line: 1, reason: "expected the header `second,rate`".into() }),
    }
    let mut rates: Vec<f64> = Vec::new();
    for (index, line) in lines {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [second, rate] = fields.as_slice() else {
            return Err(Error::Trace { line: number, reason: format!("expected 2 fields, found {}", fields.len()) });
        };
        let second: usize = second.parse().map_err(|_| Error::Trace { line: number, reason: format!("second `{second}` is not a whole number") })?;
        let rate: f64 = rate.parse().map_err(|_| Error::Trace { line: number, reason: format!("rate `{rate}` is not a number") })?;
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(Error::Trace { line: number, reason: format!("rate {rate} must be finite and non-negative") });
        }
        if second < rates.len() {
            return Err(Error::Trace { line: number, reason: format!("second {second} is not after the previous line's") });
        }
        rates.resize(second, 0.0);
        rates.push(rate);
    }
    Ok(RateTrace { rates_per_s: rates })
}

/// Request arrivals of `trace`: within each second a Poisson process at
/// that second's rate. See the module docs.
pub fn arrivals(trace: &RateTrace, seed: u64) -> Arrivals<'_> {
    Arrivals { trace, rng: SmallRng::seed_from_u64(seed), second: 0, at_s: 0.0 }
}

/// The iterator of [`arrivals`].
#[derive(Clone, Debug)]
pub struct Arrivals<'a> {
    trace: &'a RateTrace,
    rng: SmallRng,
    second: usize,
    /// The last arrival (or the second's start), seconds.
    at_s: f64,
}

impl Iterator for Arrivals<'_> {
    type Item = Instant;

    fn next(&mut self) -> Option<Instant> {
        loop {
            let rate = *self.trace.rates_per_s.get(self.second)?;
            let end = (self.second + 1) as f64;
            if rate > 0.0 {
                let gap = -(1.0 - self.rng.random::<f64>()).ln() / rate;
                // Compared as the microsecond instants returned: an arrival a
                // hair before the second's end must not round up onto it.
                let at = Instant::from_secs_f64(self.at_s + gap);
                if at < Instant::from_secs_f64(end) {
                    self.at_s += gap;
                    return Some(at);
                }
            }
            // Memorylessness: the next second starts afresh.
            self.second += 1;
            self.at_s = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn spandanas_services_have_the_published_idle_latencies() {
        let ms: Vec<f64> = spandana_services().iter().map(|s| s.service_time.as_millis_f64()).collect();
        assert_eq!(ms, vec![8.0, 14.0, 40.0, 130.0]);
    }

    #[test]
    fn a_spike_surges_to_twice_the_load_and_settles_higher() {
        let flat = RateTrace { rates_per_s: vec![100.0; 600] };
        let spiked = with_spike(&flat, 100, 10, 60, 2.0, 1.5);
        assert_eq!(spiked.rates_per_s[99], 100.0);
        assert_eq!(spiked.rates_per_s[105], 150.0);
        assert_eq!(spiked.rates_per_s[140], 200.0);
        assert_eq!(spiked.rates_per_s[599], 150.0);
    }

    #[test]
    fn rate_csv_errors_name_the_line() {
        let trace = parse_rate_csv("second,rate\n0,10\n2,30\n").unwrap();
        assert_eq!(trace.rates_per_s, vec![10.0, 0.0, 30.0]);
        let err = |text: &str| parse_rate_csv(text).unwrap_err().to_string();
        assert!(err("sec,r\n").contains("line 1"));
        assert!(err("second,rate\n0,10\n0,5\n").contains("line 3"));
        assert!(err("second,rate\n0,fast\n").contains("line 2: rate `fast`"));
        assert!(err("second,rate\n0,-1\n").contains("non-negative"));
        assert!(err("second,rate\n0\n").contains("expected 2 fields"));
    }

    #[test]
    fn an_hour_at_a_thousand_per_second_is_millions_of_requests_near_the_expected_count() {
        let trace = fluctuating_rates(&FluctuationConfig::default()).unwrap();
        let count = arrivals(&trace, 3).count() as f64;
        let expected = trace.expected_requests();
        // A Poisson total: the standard deviation is sqrt(expected) ≈ 1,900.
        assert!((count - expected).abs() < 5.0 * expected.sqrt(), "{count} vs {expected}");
        assert!(count > 3.0e6);
    }

    proptest! {
        #[test]
        fn rates_stay_within_their_bounds(mean in 1.0f64..5_000.0, deviation in 0.0f64..0.9, drift in 0.0f64..0.3, seed in 0u64..1_000) {
            let config = FluctuationConfig { mean_rate_per_s: mean, duration_s: 300, max_deviation: deviation, minute_drift: drift, seed };
            let trace = fluctuating_rates(&config).unwrap();
            for minute in trace.rates_per_s.chunks(60) {
                let lo = mean * (1.0 - drift) * (1.0 - deviation) - 1e-9;
                let hi = mean * (1.0 + drift) * (1.0 + deviation) + 1e-9;
                prop_assert!(minute.iter().all(|r| (lo..=hi).contains(r)));
            }
            prop_assert_eq!(&trace, &fluctuating_rates(&config).unwrap());
        }

        #[test]
        fn arrivals_ascend_within_their_second(rates in prop::collection::vec(0.0f64..200.0, 1..30), seed in 0u64..100) {
            let trace = RateTrace { rates_per_s: rates };
            let mut last = Instant::ZERO;
            for at in arrivals(&trace, seed) {
                prop_assert!(at >= last);
                prop_assert!(at.as_secs_f64() < trace.rates_per_s.len() as f64);
                last = at;
            }
        }
    }
}
