//! Latency histograms the shells publish (core never exports metrics).
//!
//! A [`Histogram`] has fixed, roughly logarithmic buckets from 1 µs to
//! 10 s, lock-free counters, and renders as a Prometheus histogram plus a
//! `_max` gauge: the largest observation since start (a stall's length,
//! which the buckets only bound).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets, seconds.
pub const BUCKETS_S: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A Prometheus-style histogram.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; 22],
    overflow: AtomicU64,
    sum_ns: AtomicU64,
    count: AtomicU64,
    max_ns: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, value: std::time::Duration) {
        let seconds = value.as_secs_f64();
        match BUCKETS_S.iter().position(|&bound| seconds <= bound) {
            Some(i) => self.buckets[i].fetch_add(1, Ordering::Relaxed),
            None => self.overflow.fetch_add(1, Ordering::Relaxed),
        };
        let nanos = value.as_nanos().min(u128::from(u64::MAX)) as u64;
        self.sum_ns.fetch_add(nanos, Ordering::Relaxed);
        self.max_ns.fetch_max(nanos, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The largest observation so far (zero if none).
    pub fn max(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.max_ns.load(Ordering::Relaxed))
    }

    /// The `q`-quantile's bucket upper bound, seconds (`None` if empty).
    pub fn quantile_upper_bound_s(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (q * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, bucket) in self.buckets.iter().enumerate() {
            seen += bucket.load(Ordering::Relaxed);
            if seen >= rank {
                return Some(BUCKETS_S[i]);
            }
        }
        Some(f64::INFINITY)
    }

    /// Appends the Prometheus text of this histogram as `name` with
    /// `labels` (e.g. `pool="default"`, or empty).
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram").expect("write to String");
        let mut cumulative = 0;
        for (i, bound) in BUCKETS_S.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}").expect("write to String");
        }
        cumulative += self.overflow.load(Ordering::Relaxed);
        writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}").expect("write to String");
        let sum_s = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        writeln!(out, "{name}_sum{{{labels}}} {sum_s}\n{name}_count{{{labels}}} {}", self.count()).expect("write to String");
        writeln!(
            out,
            "# HELP {name}_max The largest observation of {name} since start.\n# TYPE {name}_max gauge\n{name}_max{{{labels}}} {}",
            self.max().as_secs_f64()
        )
        .expect("write to String");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn observations_land_in_the_smallest_bucket_that_holds_them() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(3));
        h.observe(Duration::from_millis(2));
        h.observe(Duration::from_secs(60));
        assert_eq!(h.count(), 3);
        assert_eq!(h.quantile_upper_bound_s(0.3), Some(5e-6));
        assert_eq!(h.quantile_upper_bound_s(0.6), Some(2.5e-3));
        assert_eq!(h.quantile_upper_bound_s(1.0), Some(f64::INFINITY));
        let mut text = String::new();
        h.render(&mut text, "x_seconds", "test", "");
        assert!(text.contains("x_seconds_bucket{le=\"+Inf\"} 3"));
        assert!(text.contains("x_seconds_count{} 3"));
        assert_eq!(h.max(), Duration::from_secs(60));
        assert!(text.contains("# TYPE x_seconds_max gauge\nx_seconds_max{} 60"), "{text}");
    }
}
