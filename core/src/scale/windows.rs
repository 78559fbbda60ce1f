//! Observation windows (AutoSLO §6.1): the arrivals and the completions of
//! the last `w` seconds.
//!
//! # Properties
//!
//! - (A) After any record at `now`, every arrival kept arrived within
//!   `(now − w, now]` and every completion kept finished within it.
//! - (B) Each window holds at most `max_entries` records (the oldest go
//!   first), whatever the arrival rate.
//! - (C) Records stay in time order.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::model::{QueryId, Slo, TemplateId};
use crate::time::{Duration, Instant};

/// A query as the arrival window keeps it: enough to replay a copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ArrivalRecord {
    /// The query.
    pub query: QueryId,
    /// Its template.
    pub template: TemplateId,
    /// Its SLO.
    pub slo: Slo,
    /// When it arrived.
    pub arrival: Instant,
}

/// A finished query as the completion window keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CompletionRecord {
    /// The query.
    pub query: QueryId,
    /// When it arrived.
    pub arrival: Instant,
    /// When it finished.
    pub finished: Instant,
    /// Its SLO.
    pub slo: Slo,
    /// Whether it completed (a timed-out query did not).
    pub completed: bool,
}

impl CompletionRecord {
    /// Its client-side latency.
    pub fn latency(&self) -> Duration {
        self.finished - self.arrival
    }

    /// Whether it met `slo` scaled by `tightening` (1 = the SLO itself).
    pub fn met(&self, tightening: f64) -> bool {
        self.completed && self.latency() <= self.slo.latency.mul_f64(tightening)
    }
}

/// The two trailing windows. See the module docs.
#[derive(Clone, Debug)]
pub struct ObservationWindows {
    width: Duration,
    max_entries: usize,
    arrivals: VecDeque<ArrivalRecord>,
    completions: VecDeque<CompletionRecord>,
}

impl ObservationWindows {
    /// Windows over the last `width`, each holding at most `max_entries`.
    pub fn new(width: Duration, max_entries: usize) -> Self {
        ObservationWindows { width, max_entries: max_entries.max(1), arrivals: VecDeque::new(), completions: VecDeque::new() }
    }

    /// The window width `w`.
    pub fn width(&self) -> Duration {
        self.width
    }

    /// Appends an arrival at `now` and truncates.
    pub fn record_arrival(&mut self, now: Instant, record: ArrivalRecord) {
        if self.arrivals.len() == self.max_entries {
            self.arrivals.pop_front();
        }
        self.arrivals.push_back(record);
        self.truncate(now);
    }

    /// Appends a completion at `now` and truncates.
    pub fn record_completion(&mut self, now: Instant, record: CompletionRecord) {
        if self.completions.len() == self.max_entries {
            self.completions.pop_front();
        }
        self.completions.push_back(record);
        self.truncate(now);
    }

    /// Drops what fell out of the window at `now`.
    pub fn truncate(&mut self, now: Instant) {
        let Some(horizon) = now.as_micros().checked_sub(self.width.as_micros()).map(Instant::from_micros) else { return };
        while self.arrivals.front().is_some_and(|a| a.arrival <= horizon) {
            self.arrivals.pop_front();
        }
        while self.completions.front().is_some_and(|c| c.finished <= horizon) {
            self.completions.pop_front();
        }
    }

    /// The arrival window, oldest first.
    pub fn arrivals(&self) -> impl ExactSizeIterator<Item = &ArrivalRecord> + Clone {
        self.arrivals.iter()
    }

    /// The completion window, oldest first.
    pub fn completions(&self) -> impl ExactSizeIterator<Item = &CompletionRecord> {
        self.completions.iter()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn arrival(id: u64, at_s: f64) -> ArrivalRecord {
        ArrivalRecord { query: QueryId(id), template: TemplateId(1), slo: Slo { latency: Duration::from_secs(10) }, arrival: Instant::from_secs_f64(at_s) }
    }

    #[test]
    fn old_arrivals_fall_out_of_the_window() {
        let mut w = ObservationWindows::new(Duration::from_secs(300), 1_000);
        w.record_arrival(Instant::from_secs_f64(400.0), arrival(1, 400.0));
        w.record_arrival(Instant::from_secs_f64(650.0), arrival(2, 650.0));
        w.record_arrival(Instant::from_secs_f64(701.0), arrival(3, 701.0));
        assert_eq!(w.arrivals().map(|a| a.query.0).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn a_tightened_slo_counts_near_misses() {
        let record = CompletionRecord {
            query: QueryId(1),
            arrival: Instant::ZERO,
            finished: Instant::from_secs_f64(7.0),
            slo: Slo { latency: Duration::from_secs(10) },
            completed: true,
        };
        assert!(record.met(1.0));
        assert!(!record.met(0.5));
        assert!(!CompletionRecord { completed: false, ..record }.met(1.0));
    }

    proptest! {
        #[test]
        fn windows_hold_only_recent_records_and_stay_bounded(gaps in prop::collection::vec(0.0f64..50.0, 1..400), max in 1usize..64) {
            let mut w = ObservationWindows::new(Duration::from_secs(300), max);
            let mut now = 0.0;
            for (i, gap) in gaps.iter().enumerate() {
                now += gap;
                let at = Instant::from_secs_f64(now);
                w.record_arrival(at, arrival(i as u64, now));
                w.record_completion(at, CompletionRecord { query: QueryId(i as u64), arrival: Instant::ZERO, finished: at, slo: Slo { latency: Duration::from_secs(1) }, completed: true });
                prop_assert!(w.arrivals().len() <= max && w.completions().len() <= max);
                prop_assert!(w.arrivals().all(|a| now < 300.0 || a.arrival > at - Duration::from_secs(300)));
                prop_assert!(w.arrivals().zip(w.arrivals().skip(1)).all(|(a, b)| a.arrival <= b.arrival));
            }
        }
    }
}
