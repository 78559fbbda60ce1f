//! Latency histograms the shells publish (core never exports metrics).
//!
//! A [`Histogram`] has fixed, roughly logarithmic buckets, lock-free
//! counters, and renders as a Prometheus histogram plus a `_max` gauge:
//! the largest observation since start (a stall's length, which the
//! buckets only bound). One made [`Histogram::with_recent_max`] also
//! renders a `_recent_max` gauge: the largest observation of about the
//! last minute ([`RecentMax`]), which a stall at start-up or an hour ago
//! no longer holds up. The default buckets ([`BUCKETS_S`], 1 µs to 10 s)
//! are for slogate's own time; [`QUERY_BUCKETS_S`] (10 ms to 2 h) for
//! queries' latencies.
//!
//! # Properties
//!
//! - (A) [`RecentMax::get_at`] at `now` is the largest observation made
//!   in the slots of `now`'s and the `SLOTS − 1` before it: every
//!   observation of the last `window − slot` counts, and none older than
//!   `window` does. Its resolution is a microsecond (rounded down).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Upper bounds of the buckets, seconds.
pub const BUCKETS_S: [f64; 22] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
    0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds of the buckets of a query-latency histogram, seconds.
pub const QUERY_BUCKETS_S: [f64; 18] = [0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1_200.0, 1_800.0, 3_600.0, 7_200.0];

/// Sub-windows (slots) of a [`RecentMax`].
pub const SLOTS: u64 = 4;

/// The largest observation over a sliding window, lock-free: the window is
/// [`SLOTS`] slots of a fixed length from a start, each holding the slot's
/// number (its epoch) and its largest observation in microseconds in one
/// word, so that an observation and a slot's reuse for a later epoch
/// never tear. See the module's property (A).
#[derive(Debug)]
pub struct RecentMax {
    start: Instant,
    slot: Duration,
    slots: [AtomicU64; SLOTS as usize],
}

impl RecentMax {
    /// A window of `window` (split into [`SLOTS`] slots) from `start`.
    pub fn new(window: Duration, start: Instant) -> Self {
        let slot = (window / SLOTS as u32).max(Duration::from_millis(1));
        RecentMax { start, slot, slots: Default::default() }
    }

    /// The window it covers at most.
    pub fn window(&self) -> Duration {
        self.slot * SLOTS as u32
    }

    fn epoch(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.start).as_nanos() / self.slot.as_nanos()) as u64
    }

    /// Records `value`, observed at `now`.
    pub fn observe_at(&self, value: Duration, now: Instant) {
        let epoch = self.epoch(now) & u64::from(u32::MAX);
        let micros = value.as_micros().min(u128::from(u32::MAX)) as u64;
        let slot = &self.slots[(epoch % SLOTS) as usize];
        let mut current = slot.load(Ordering::Relaxed);
        loop {
            let (slot_epoch, slot_micros) = (current >> 32, current & u64::from(u32::MAX));
            let wanted = if slot_epoch == epoch { (epoch << 32) | slot_micros.max(micros) } else { (epoch << 32) | micros };
            if wanted == current || slot_epoch > epoch {
                // Already held, or the slot moved on past this epoch (an
                // observation stamped late): nothing to change.
                return;
            }
            match slot.compare_exchange_weak(current, wanted, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// The largest observation of the window ending at `now` (zero if
    /// none).
    pub fn get_at(&self, now: Instant) -> Duration {
        let epoch = self.epoch(now) & u64::from(u32::MAX);
        let micros = self
            .slots
            .iter()
            .map(|slot| slot.load(Ordering::Relaxed))
            .filter(|v| {
                let slot_epoch = v >> 32;
                slot_epoch <= epoch && epoch - slot_epoch < SLOTS
            })
            .map(|v| v & u64::from(u32::MAX))
            .max()
            .unwrap_or(0);
        Duration::from_micros(micros)
    }
}

/// A Prometheus-style histogram.
#[derive(Debug)]
pub struct Histogram {
    bounds_s: &'static [f64],
    buckets: Vec<AtomicU64>,
    overflow: AtomicU64,
    sum_ns: AtomicU64,
    count: AtomicU64,
    max_ns: AtomicU64,
    recent_max: Option<RecentMax>,
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
            recent_max: None,
        }
    }

    /// The same, also keeping the largest observation of the last
    /// `window` (rendered as a `_recent_max` gauge).
    #[must_use]
    pub fn with_recent_max(mut self, window: Duration) -> Self {
        self.recent_max = Some(RecentMax::new(window, Instant::now()));
        self
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
        if let Some(recent) = &self.recent_max {
            recent.observe_at(value, Instant::now());
        }
    }

    /// The largest observation of the recent window, with the window, for
    /// a histogram made [`Histogram::with_recent_max`].
    pub fn recent_max(&self) -> Option<(Duration, Duration)> {
        self.recent_max.as_ref().map(|recent| (recent.get_at(Instant::now()), recent.window()))
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
    let recent: Vec<(&str, Duration, Duration)> = series.iter().filter_map(|(labels, h)| h.recent_max().map(|(max, window)| (*labels, max, window))).collect();
    if let Some((_, _, window)) = recent.first() {
        writeln!(out, "# HELP {name}_recent_max The largest observation of {name} over the last {} s.\n# TYPE {name}_recent_max gauge", window.as_secs())
            .expect("write to String");
        for (labels, max, _) in &recent {
            writeln!(out, "{name}_recent_max{{{labels}}} {}", max.as_secs_f64()).expect("write to String");
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_recent_max_forgets_what_left_the_window() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let recent = RecentMax::new(Duration::from_secs(60), start);
        assert_eq!(recent.get_at(at(0)), Duration::ZERO, "nothing observed");
        recent.observe_at(Duration::from_millis(9), at(1));
        recent.observe_at(Duration::from_millis(2), at(50));
        assert_eq!(recent.get_at(at(50)), Duration::from_millis(9));
        assert_eq!(recent.get_at(at(59)), Duration::from_millis(9), "within the window");
        assert_eq!(recent.get_at(at(61)), Duration::from_millis(2), "the 9 ms of second 1 left with its slot");
        assert_eq!(recent.get_at(at(200)), Duration::ZERO, "everything left");
        recent.observe_at(Duration::from_micros(700), at(201));
        assert_eq!(recent.get_at(at(201)), Duration::from_micros(700), "a reused slot starts afresh");
    }

    proptest! {
        /// (A) The recent max is the largest observation of the slots in
        /// the window, whatever the order of slots and reuses.
        #[test]
        fn the_recent_max_is_the_largest_observation_of_the_window(
            events in proptest::collection::vec((0u64..400_000, 0u64..5_000_000), 1..60),
            reads in proptest::collection::vec(0u64..400_000, 1..20),
        ) {
            let start = Instant::now();
            let mut events = events;
            events.sort_unstable();
            let recent = RecentMax::new(Duration::from_secs(60), start);
            let slot_ms = 15_000;
            let mut seen = Vec::new();
            let mut reads = reads;
            reads.sort_unstable();
            let mut reads = reads.into_iter().peekable();
            for (at_ms, value_us) in events {
                while let Some(read_ms) = reads.next_if(|&r| r < at_ms) {
                    let epoch = read_ms / slot_ms;
                    let expected = seen.iter().filter(|&&(e, _)| e <= epoch && epoch - e < SLOTS).map(|&(_, v)| v).max().unwrap_or(0);
                    prop_assert_eq!(recent.get_at(start + Duration::from_millis(read_ms)), Duration::from_micros(expected), "read at {} ms", read_ms);
                }
                recent.observe_at(Duration::from_micros(value_us), start + Duration::from_millis(at_ms));
                seen.push((at_ms / slot_ms, value_us));
            }
            for read_ms in reads {
                let epoch = read_ms / slot_ms;
                let expected = seen.iter().filter(|&&(e, _)| e <= epoch && epoch - e < SLOTS).map(|&(_, v)| v).max().unwrap_or(0);
                prop_assert_eq!(recent.get_at(start + Duration::from_millis(read_ms)), Duration::from_micros(expected), "read at {} ms", read_ms);
            }
        }
    }

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
        assert!(!text.contains("_recent_max"), "only a histogram made with a window has one: {text}");
        let (c, d) = (Histogram::default().with_recent_max(Duration::from_secs(60)), Histogram::default().with_recent_max(Duration::from_secs(60)));
        c.observe(Duration::from_millis(3));
        let mut text = String::new();
        render_family(&mut text, "lag_seconds", "test", &[("shard=\"0\"", &c), ("shard=\"1\"", &d)]);
        assert_eq!(text.matches("# TYPE lag_seconds_recent_max gauge").count(), 1, "{text}");
        assert!(text.contains("over the last 60 s") && text.contains("lag_seconds_recent_max{shard=\"0\"} 0.003\n") && text.contains("lag_seconds_recent_max{shard=\"1\"} 0\n"), "{text}");
    }
}
