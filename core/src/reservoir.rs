//! The workload reservoir's tables (AutoSLO §7.1), sans IO.
//!
//! Every arrival is recorded in two tables indexed by calendar date and
//! hour of day:
//!
//! - the **count table**: `(date, hour, template) → how many arrived`
//!   (exact; it is small: hours × templates);
//! - the **arrivals table**: `(date, hour) → within-hour second offsets`,
//!   kept as a uniform sample of at most `arrival_samples_per_hour_max`
//!   offsets per hour (reservoir sampling, Algorithm R, with a seeded RNG)
//!   plus the exact total.
//!
//! [`Reservoir::handle_arrival`] returns the [`ReservoirUpdate`] the shell
//! must persist, so storage writes exactly what changed; the shell also
//! replays stored rows into [`Reservoir::restore`] after a restart.
//!
//! # Properties
//!
//! - (A) Counts are exact: the sum over templates of an hour's counts is
//!   the hour's arrival total.
//! - (B) An hour never keeps more than the sampling bound of offsets, and
//!   keeps every offset while under it.
//! - (C) Offsets lie in `0..3600`.
//! - (D) Same seed and inputs, same tables.
//! - (E) An hour keeps at most `templates_per_hour_max` template rows, plus
//!   one [`OTHER_TEMPLATES`] row for the arrivals of any templates beyond
//!   them, so (A) still holds whatever templates clients send.
//! - (F) [`overlaps`] finds exactly the pairs of executions on one lane
//!   whose runs intersect, each listed from both sides in arrival order.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};

use crate::model::TemplateId;

const SECS_PER_HOUR: i64 = 3_600;
const SECS_PER_DAY: i64 = 86_400;

/// A calendar hour in UTC: days since 1970-01-01 and the hour of day.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CalendarHour {
    /// Days since 1970-01-01 (UTC).
    pub day: i32,
    /// Hour of day, 0–23.
    pub hour: u8,
}

impl CalendarHour {
    /// The hour containing `unix_secs`, and the second offset within it.
    pub fn from_unix_secs(unix_secs: i64) -> (CalendarHour, u16) {
        let day = unix_secs.div_euclid(SECS_PER_DAY);
        let within_day = unix_secs.rem_euclid(SECS_PER_DAY);
        let hour = CalendarHour {
            day: i32::try_from(day).expect("dates within ±5.8 million years"),
            hour: (within_day / SECS_PER_HOUR) as u8,
        };
        (hour, (within_day % SECS_PER_HOUR) as u16)
    }

    /// The hour's first second, since the Unix epoch.
    pub fn start_unix_secs(self) -> i64 {
        i64::from(self.day) * SECS_PER_DAY + i64::from(self.hour) * SECS_PER_HOUR
    }

    /// Day of week, 0 = Monday … 6 = Sunday (1970-01-01 was a Thursday).
    pub fn weekday(self) -> u8 {
        (i64::from(self.day) + 3).rem_euclid(7) as u8
    }

    /// Days since 1970-01-01 of the civil date `year-month-day`, if it is
    /// one.
    pub fn day_of(year: i32, month: u8, day: u8) -> Option<i32> {
        if !(1..=12).contains(&month) || day == 0 || day > 31 {
            return None;
        }
        // Howard Hinnant's days-from-civil algorithm.
        let y = i64::from(year) - i64::from(month <= 2);
        let era = y.div_euclid(400);
        let yoe = y.rem_euclid(400);
        let mp = (i64::from(month) + 9) % 12;
        let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
        let days = i32::try_from(era * 146_097 + doe - 719_468).ok()?;
        // Round-trips only for real dates (rejects 2024-02-31).
        (CalendarHour { day: days, hour: 0 }.date() == (year, month, day)).then_some(days)
    }

    /// The civil date `(year, month, day)` of this hour.
    pub fn date(self) -> (i32, u8, u8) {
        // Howard Hinnant's days-to-civil algorithm.
        let z = i64::from(self.day) + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
        let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
        let y = (yoe + era * 400 + i64::from(m <= 2)) as i32;
        (y, m, d)
    }
}

/// Reservoir configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReservoirConfig {
    /// The most arrival offsets kept per hour; beyond it, a uniform sample.
    pub arrival_samples_per_hour_max: u32,
    /// Seeds the sampling.
    pub seed: u64,
    /// The most templates counted apart per hour; arrivals of further new
    /// templates in that hour are counted under [`OTHER_TEMPLATES`]
    /// (clients choose templates, so this bounds the table).
    pub templates_per_hour_max: u32,
}

impl Default for ReservoirConfig {
    fn default() -> Self {
        ReservoirConfig { arrival_samples_per_hour_max: 4_096, seed: 0, templates_per_hour_max: 10_000 }
    }
}

/// The count-table row of the templates beyond an hour's
/// `templates_per_hour_max`.
pub const OTHER_TEMPLATES: TemplateId = TemplateId(u32::MAX);

/// One finished execution, as the predictor will train on it: what ran,
/// where, next to how many queries, and how long it took.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecutionRecord {
    /// The query's id within the node.
    pub query: crate::model::QueryId,
    /// Its template or fingerprint.
    pub template: TemplateId,
    /// The cluster it ran on.
    pub cluster: crate::model::ClusterId,
    /// That cluster's size.
    pub size: crate::model::Rpu,
    /// Queries running on the cluster when it was placed there.
    pub neighbours_at_dispatch: u32,
    /// Client-side latency (a lower bound when `censored`).
    pub latency: crate::time::Duration,
    /// Timed out or cut short: `latency` is only a lower bound.
    pub censored: bool,
    /// From placement to start: how long the cluster's admission queue
    /// held it. Logs written before it was recorded read zero.
    #[serde(default)]
    pub queued: crate::time::Duration,
    /// No other query was on its cluster at any time from its placement to
    /// its finish. Logs written before it was recorded read `false`.
    #[serde(default)]
    pub ran_alone: bool,
    /// Where and when it ran on the log's timeline, to rebuild which
    /// executions overlapped (what a sequence model learns from). `None` in
    /// logs written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeline: Option<Timeline>,
}

/// An execution's place on its log's timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// The cluster it ran on, named uniquely within the log (`pool/c3`):
    /// executions overlap only within one lane.
    pub lane: String,
    /// When it arrived, seconds on the log's clock (a node's calendar; a
    /// training run's own clock, runs apart).
    pub arrival_s: f64,
}

impl Timeline {
    /// An execution on `cluster` of `pool` that arrived at `arrival_s`:
    /// a node's lanes are `pool/cluster`.
    pub fn on_cluster(pool: &crate::model::PoolId, cluster: crate::model::ClusterId, arrival_s: f64) -> Timeline {
        Timeline { lane: format!("{pool}/{cluster}"), arrival_s }
    }

    /// Whether the execution ran on one of `pool`'s clusters (a lane
    /// [`Timeline::on_cluster`] made).
    pub fn in_pool(&self, pool: &crate::model::PoolId) -> bool {
        self.lane.strip_prefix(pool.as_str()).is_some_and(|rest| rest.starts_with('/'))
    }
}

/// For each execution of `log`, the executions that overlapped it on its
/// lane (ran at some time between its arrival and its end), in arrival
/// order; empty for executions without a timeline
/// ([`crate::stats::overlapping`] per lane).
pub fn overlaps(log: &[ExecutionRecord]) -> Vec<Vec<usize>> {
    let mut by_lane: std::collections::BTreeMap<&str, Vec<usize>> = std::collections::BTreeMap::new();
    for (index, record) in log.iter().enumerate() {
        if let Some(timeline) = &record.timeline {
            by_lane.entry(timeline.lane.as_str()).or_default().push(index);
        }
    }
    let mut found = vec![Vec::new(); log.len()];
    for lane in by_lane.values() {
        let spans: Vec<(f64, f64)> = lane
            .iter()
            .map(|&i| {
                let arrival = log[i].timeline.as_ref().map_or(0.0, |t| t.arrival_s);
                (arrival, arrival + log[i].latency.as_secs_f64())
            })
            .collect();
        for (local, others) in crate::stats::overlapping(&spans).into_iter().enumerate() {
            found[lane[local]] = others.into_iter().map(|other| lane[other]).collect();
        }
    }
    found
}

impl ExecutionRecord {
    /// The record as the predictors learn from it. The log keeps the
    /// queries running at dispatch as the concurrency feature.
    pub fn observation(&self) -> crate::predict::Observation {
        crate::predict::Observation {
            template: self.template,
            size: self.size,
            neighbours: self.neighbours_at_dispatch,
            latency: self.latency,
            censored: self.censored,
        }
    }

    /// The record as the planner's admission model learns from it.
    pub fn admission_sample(&self) -> crate::tune::AdmissionSample {
        crate::tune::AdmissionSample { size: self.size, neighbours: self.neighbours_at_dispatch, queued: self.queued }
    }
}

/// What one arrival changed, for the shell to persist.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservoirUpdate {
    /// The hour.
    pub hour: CalendarHour,
    /// The template whose count is now `count`.
    pub template: TemplateId,
    /// The template's new count in this hour.
    pub count: u64,
    /// The hour's new arrival total.
    pub arrivals_total: u64,
    /// The sample slot written, if the offset was kept: `(slot, offset_s)`.
    pub sample: Option<(u32, u16)>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct HourArrivals {
    total: u64,
    samples: Vec<u16>,
    /// Templates with a row of their own in the count table.
    #[serde(default)]
    templates: u32,
}

/// The two tables. See the module docs.
#[derive(Clone, Debug)]
pub struct Reservoir {
    config: ReservoirConfig,
    counts: BTreeMap<(CalendarHour, TemplateId), u64>,
    arrivals: BTreeMap<CalendarHour, HourArrivals>,
    rng: SmallRng,
}

impl Reservoir {
    /// Empty tables.
    pub fn new(config: ReservoirConfig) -> Self {
        let rng = SmallRng::seed_from_u64(config.seed);
        Reservoir { config, counts: BTreeMap::new(), arrivals: BTreeMap::new(), rng }
    }

    /// Records an arrival of `template` at `unix_secs` (wall-clock UTC).
    pub fn handle_arrival(&mut self, unix_secs: i64, template: TemplateId) -> ReservoirUpdate {
        let (hour, offset_s) = CalendarHour::from_unix_secs(unix_secs);
        let arrivals = self.arrivals.entry(hour).or_default();
        let template = if self.counts.contains_key(&(hour, template)) || template == OTHER_TEMPLATES {
            template
        } else if arrivals.templates < self.config.templates_per_hour_max.max(1) {
            arrivals.templates += 1;
            template
        } else {
            OTHER_TEMPLATES
        };
        let count = self.counts.entry((hour, template)).or_insert(0);
        *count += 1;
        let count = *count;
        let bound = self.config.arrival_samples_per_hour_max as usize;
        arrivals.total += 1;
        let sample = if arrivals.samples.len() < bound {
            arrivals.samples.push(offset_s);
            Some(((arrivals.samples.len() - 1) as u32, offset_s))
        } else {
            // Algorithm R: keep the new item with probability bound / total.
            let slot = self.rng.random_range(0..arrivals.total);
            (slot < bound as u64).then(|| {
                arrivals.samples[slot as usize] = offset_s;
                (slot as u32, offset_s)
            })
        };
        ReservoirUpdate { hour, template, count, arrivals_total: arrivals.total, sample }
    }

    /// Loads persisted rows after a restart: counts, hour totals and
    /// sample slots.
    pub fn restore(
        &mut self,
        counts: impl IntoIterator<Item = ((CalendarHour, TemplateId), u64)>,
        totals: impl IntoIterator<Item = (CalendarHour, u64)>,
        samples: impl IntoIterator<Item = ((CalendarHour, u32), u16)>,
    ) {
        for ((hour, template), count) in counts {
            if self.counts.insert((hour, template), count).is_none() && template != OTHER_TEMPLATES {
                self.arrivals.entry(hour).or_default().templates += 1;
            }
        }
        for (hour, total) in totals {
            self.arrivals.entry(hour).or_default().total = total;
        }
        let mut by_hour: BTreeMap<CalendarHour, BTreeMap<u32, u16>> = BTreeMap::new();
        for ((hour, slot), offset) in samples {
            by_hour.entry(hour).or_default().insert(slot, offset);
        }
        for (hour, slots) in by_hour {
            self.arrivals.entry(hour).or_default().samples = slots.into_values().collect();
        }
    }

    /// How many `template` queries arrived in `hour`.
    pub fn count(&self, hour: CalendarHour, template: TemplateId) -> u64 {
        self.counts.get(&(hour, template)).copied().unwrap_or(0)
    }

    /// Every template's count in `hour`.
    pub fn counts_in(&self, hour: CalendarHour) -> impl Iterator<Item = (TemplateId, u64)> + '_ {
        self.counts.range((hour, TemplateId(0))..=(hour, TemplateId(u32::MAX))).map(|((_, t), c)| (*t, *c))
    }

    /// The hour's arrival total and its sampled offsets.
    pub fn arrivals_in(&self, hour: CalendarHour) -> (u64, &[u16]) {
        self.arrivals.get(&hour).map_or((0, &[][..]), |a| (a.total, &a.samples[..]))
    }

    /// Hours with any arrival, in order.
    pub fn hours(&self) -> impl Iterator<Item = CalendarHour> + '_ {
        self.arrivals.keys().copied()
    }

    /// Keeps `history_s` of history: forgets the hours that began more
    /// than that before the latest hour with arrivals, and returns the
    /// first hour kept (the shell deletes the stored rows before it), or
    /// `None` with no arrivals. Relative to the latest arrival, not the
    /// clock, so a compressed or replayed calendar keeps its history too.
    pub fn forget_older_than(&mut self, history_s: f64) -> Option<CalendarHour> {
        let latest = *self.arrivals.keys().next_back()?;
        let (cutoff, _) = CalendarHour::from_unix_secs(latest.start_unix_secs() - history_s as i64);
        self.forget_before(cutoff);
        Some(cutoff)
    }

    /// Forgets every hour before `cutoff` (the history kept is bounded by
    /// age); returns how many hours it forgot.
    pub fn forget_before(&mut self, cutoff: CalendarHour) -> usize {
        let kept_arrivals = self.arrivals.split_off(&cutoff);
        let forgotten = std::mem::replace(&mut self.arrivals, kept_arrivals).len();
        let first_kept = (cutoff, TemplateId(0));
        let kept_counts = self.counts.split_off(&first_kept);
        self.counts = kept_counts;
        forgotten
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_pool_s_lanes_are_its_clusters_and_no_other_pool_s() {
        use crate::model::{ClusterId, PoolId};
        let lane = Timeline::on_cluster(&PoolId::new("ab"), ClusterId(3), 1.0);
        assert_eq!(lane.lane, "ab/c3");
        assert!(lane.in_pool(&PoolId::new("ab")));
        assert!(!lane.in_pool(&PoolId::new("a")), "a pool whose name is a prefix claims nothing");
    }

    #[test]
    fn calendar_hours_follow_the_utc_calendar() {
        // 2024-05-27 13:45:10 UTC, a Monday.
        let (hour, offset) = CalendarHour::from_unix_secs(1_716_817_510);
        assert_eq!(hour.date(), (2024, 5, 27));
        assert_eq!(hour.hour, 13);
        assert_eq!(offset, 45 * 60 + 10);
        assert_eq!(hour.weekday(), 0);
        assert_eq!(CalendarHour::from_unix_secs(0).0.weekday(), 3);
        assert_eq!(CalendarHour::from_unix_secs(-1).0.date(), (1969, 12, 31));
        assert_eq!(CalendarHour::day_of(2024, 5, 27), Some(hour.day));
        assert_eq!(CalendarHour::day_of(1970, 1, 1), Some(0));
        assert_eq!(CalendarHour::day_of(2024, 2, 31), None);
        assert_eq!(CalendarHour::day_of(2024, 13, 1), None);
    }

    #[test]
    fn forgetting_old_hours_keeps_the_later_ones_whole() {
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        for i in 0..48 {
            reservoir.handle_arrival(1_700_006_400 + i * 3_600, TemplateId((i % 3) as u32 + 1));
        }
        let hours: Vec<_> = reservoir.hours().collect();
        let cutoff = hours[30];
        let later: Vec<_> = hours[30..].iter().map(|&h| (reservoir.arrivals_in(h).0, reservoir.counts_in(h).collect::<Vec<_>>())).collect();
        assert_eq!(reservoir.forget_before(cutoff), 30);
        assert_eq!(reservoir.hours().collect::<Vec<_>>(), hours[30..].to_vec());
        let kept: Vec<_> = hours[30..].iter().map(|&h| (reservoir.arrivals_in(h).0, reservoir.counts_in(h).collect::<Vec<_>>())).collect();
        assert_eq!(kept, later);
        assert!(hours[..30].iter().all(|&h| reservoir.counts_in(h).next().is_none()));
    }

    #[test]
    fn history_is_kept_relative_to_the_latest_hour_with_arrivals() {
        let mut reservoir = Reservoir::new(ReservoirConfig::default());
        assert_eq!(reservoir.forget_older_than(86_400.0), None);
        let start = 1_700_006_400;
        for i in 0..72 {
            reservoir.handle_arrival(start + i * 3_600 + 1_800, TemplateId(1));
        }
        let hours: Vec<_> = reservoir.hours().collect();
        assert_eq!(hours[0].start_unix_secs(), start);
        let cutoff = reservoir.forget_older_than(86_400.0).unwrap();
        assert_eq!(cutoff, hours[47], "a day before the latest hour's start");
        assert_eq!(reservoir.hours().collect::<Vec<_>>(), hours[47..].to_vec());
    }

    #[test]
    fn restore_rebuilds_the_same_tables() {
        let mut original = Reservoir::new(ReservoirConfig { arrival_samples_per_hour_max: 3, seed: 1, ..ReservoirConfig::default() });
        let mut counts = BTreeMap::new();
        let mut totals = BTreeMap::new();
        let mut samples = BTreeMap::new();
        for i in 0..50 {
            let update = original.handle_arrival(1_700_000_000 + i * 97, TemplateId((i % 4) as u32 + 1));
            counts.insert((update.hour, update.template), update.count);
            totals.insert(update.hour, update.arrivals_total);
            if let Some((slot, offset)) = update.sample {
                samples.insert((update.hour, slot), offset);
            }
        }
        let mut restored = Reservoir::new(ReservoirConfig { arrival_samples_per_hour_max: 3, seed: 1, ..ReservoirConfig::default() });
        restored.restore(counts, totals, samples);
        for hour in original.hours() {
            assert_eq!(original.arrivals_in(hour), restored.arrivals_in(hour));
            assert_eq!(original.counts_in(hour).collect::<Vec<_>>(), restored.counts_in(hour).collect::<Vec<_>>());
        }
    }

    fn timed(lane: u8, arrival_s: f64, latency_s: f64) -> ExecutionRecord {
        ExecutionRecord {
            query: crate::model::QueryId(0),
            template: TemplateId(1),
            cluster: crate::model::ClusterId(0),
            size: crate::model::Rpu(16),
            neighbours_at_dispatch: 0,
            latency: crate::time::Duration::from_secs_f64(latency_s),
            censored: false,
            queued: crate::time::Duration::ZERO,
            ran_alone: false,
            timeline: Some(Timeline { lane: format!("p/c{lane}"), arrival_s }),
        }
    }

    proptest! {
        #[test]
        fn overlaps_are_exactly_the_intersecting_runs_on_one_lane(runs in prop::collection::vec((0u8..3, 0u32..200, 1u32..60), 0..80)) {
            let log: Vec<ExecutionRecord> = runs.iter().map(|&(lane, at, took)| timed(lane, f64::from(at), f64::from(took))).collect();
            let found = overlaps(&log);
            for (i, a) in log.iter().enumerate() {
                let (a_start, a_end) = (a.timeline.as_ref().unwrap().arrival_s, a.timeline.as_ref().unwrap().arrival_s + a.latency.as_secs_f64());
                let mut expected: Vec<usize> = (0..log.len())
                    .filter(|&j| {
                        let b = &log[j];
                        let (b_start, b_end) = (b.timeline.as_ref().unwrap().arrival_s, b.timeline.as_ref().unwrap().arrival_s + b.latency.as_secs_f64());
                        j != i && a.timeline.as_ref().unwrap().lane == b.timeline.as_ref().unwrap().lane && a_start < b_end && b_start < a_end
                    })
                    .collect();
                let mut got = found[i].clone();
                prop_assert!(got.windows(2).all(|w| log[w[0]].timeline.as_ref().unwrap().arrival_s <= log[w[1]].timeline.as_ref().unwrap().arrival_s));
                got.sort_unstable();
                expected.sort_unstable();
                prop_assert_eq!(got, expected, "execution {}", i);
            }
        }

        #[test]
        fn counts_are_exact_and_samples_and_templates_bounded(arrivals in prop::collection::vec((0i64..20_000, 1u32..6), 0..400), bound in 1u32..64, templates_max in 1u32..8) {
            let mut reservoir = Reservoir::new(ReservoirConfig { arrival_samples_per_hour_max: bound, seed: 3, templates_per_hour_max: templates_max });
            for &(at, template) in &arrivals {
                reservoir.handle_arrival(1_700_000_000 + at, TemplateId(template));
            }
            let hours: Vec<_> = reservoir.hours().collect();
            let mut grand_total = 0;
            for hour in hours {
                let (total, samples) = reservoir.arrivals_in(hour);
                let counted: u64 = reservoir.counts_in(hour).map(|(_, c)| c).sum();
                prop_assert_eq!(counted, total);
                prop_assert_eq!(samples.len() as u64, total.min(u64::from(bound)));
                prop_assert!(samples.iter().all(|&s| s < 3_600));
                let rows = reservoir.counts_in(hour).filter(|&(t, _)| t != OTHER_TEMPLATES).count();
                prop_assert!(rows <= templates_max as usize);
                grand_total += total;
            }
            prop_assert_eq!(grand_total, arrivals.len() as u64);
        }
    }
}
