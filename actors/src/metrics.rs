//! Latency histograms the shells publish (core never exports metrics).
//!
//! A [`Histogram`] has fixed, roughly logarithmic buckets, lock-free
//! counters, and renders as a Prometheus histogram plus a `_max` gauge:
//! the largest observation since start (a stall's length, which the
//! buckets only bound). The default buckets ([`BUCKETS_S`], 1 µs to 10 s)
//! are for slogate's own time; [`QUERY_BUCKETS_S`] (10 ms to 2 h) for
//! queries' latencies.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the buckets, seconds.
pub const BUCKETS_S: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the buckets of a query-latency histogram, seconds.
pub const QUERY_BUCKETS_S: [f64; 18] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1_200.0, 1_800.0, 3_600.0, 7_200.0];

/// A Prometheus-style histogram.
#[derive(Debug)]
pub struct Histogram {
    bounds_s: &'static [f64],
    buckets: Vec<AtomicU64>,
    overflow: AtomicU64,
    sum_ns: AtomicU64,
    count: AtomicU64,
    max_ns: AtomicU64,
}

impl Default for Histogram {
    /// A histogram over [`BUCKETS_S`].
    fn default() -> Self {
        Histogram::with_bounds(&BUCKETS_S)
    }
}

impl Histogram {
    /// An empty histogram whose buckets end at `bounds_s` (ascending).
    pub fn with_bounds(bounds_s: &'static [f64]) -> Self {
        Histogram {
            bounds_s,
            buckets: bounds_s.iter().map(|_| AtomicU64::new(0)).collect(),
            overflow: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
            count: AtomicU64::new(0),
            max_ns: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, value: std::time::Duration) {
        let seconds = value.as_secs_f64();
        match self.bounds_s.iter().position(|&bound| seconds <= bound) {
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
                return Some(self.bounds_s[i]);
            }
        }
        Some(f64::INFINITY)
    }

    /// Appends the Prometheus text of this histogram as `name` with
    /// `labels` (e.g. `pool="default"`, or empty).
    pub fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        render_family(out, name, help, &[(labels, self)]);
    }

    fn render_series(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, bound) in self.bounds_s.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}").expect("write to String");
        }
        cumulative += self.overflow.load(Ordering::Relaxed);
        writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {cumulative}").expect("write to String");
        let sum_s = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        writeln!(out, "{name}_sum{{{labels}}} {sum_s}\n{name}_count{{{labels}}} {}", self.count()).expect("write to String");
    }
}

/// Appends one histogram family `name`, a series per `(labels, histogram)`,
/// with its help and type written once, then its `_max` gauge family.
pub fn render_family(out: &mut String, name: &str, help: &str, series: &[(&str, &Histogram)]) {
    writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram").expect("write to String");
    for (labels, histogram) in series {
        histogram.render_series(out, name, labels);
    }
    writeln!(out, "# HELP {name}_max The largest observation of {name} since start.\n# TYPE {name}_max gauge").expect("write to String");
    for (labels, histogram) in series {
        writeln!(out, "{name}_max{{{labels}}} {}", histogram.max().as_secs_f64()).expect("write to String");
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

    #[test]
    fn a_query_latency_histogram_buckets_minutes_not_microseconds() {
        let h = Histogram::with_bounds(&QUERY_BUCKETS_S);
        h.observe(Duration::from_secs(42));
        h.observe(Duration::from_secs(9_000));
        assert_eq!(h.quantile_upper_bound_s(0.5), Some(60.0));
        assert_eq!(h.quantile_upper_bound_s(1.0), Some(f64::INFINITY));
        let mut text = String::new();
        h.render(&mut text, "q_seconds", "test", "pool=\"a\"");
        assert!(text.contains("q_seconds_bucket{pool=\"a\",le=\"7200\"} 1") && text.contains("q_seconds_bucket{pool=\"a\",le=\"+Inf\"} 2"), "{text}");
    }

    #[test]
    fn a_family_of_several_series_writes_its_help_and_type_once() {
        let (a, b) = (Histogram::default(), Histogram::default());
        a.observe(Duration::from_millis(1));
        b.observe(Duration::from_millis(7));
        let mut text = String::new();
        render_family(&mut text, "lag_seconds", "test", &[("shard=\"0\"", &a), ("shard=\"1\"", &b)]);
        assert_eq!(text.matches("# TYPE lag_seconds histogram").count(), 1);
        assert_eq!(text.matches("# TYPE lag_seconds_max gauge").count(), 1);
        assert!(text.contains("lag_seconds_count{shard=\"1\"} 1") && text.contains("lag_seconds_max{shard=\"1\"} 0.007"), "{text}");
    }
}
