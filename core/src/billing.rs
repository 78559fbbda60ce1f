//! Usage-based billing: the warehouse timer of AutoSLO §2.
//!
//! A cluster's cost is `price × size × active time`, where the active time
//! is measured by a timer that
//!
//! - is initially paused;
//! - if paused, starts running when a query arrives at the cluster;
//! - if running, pauses when there are no running queries **and** at least
//!   the minimum window `m` has elapsed since it started.
//!
//! So a window that starts at `s` and whose last query finishes at `t`
//! closes at `max(t, s + m)`. An arrival strictly before that instant joins
//! the window; an arrival at or after it opens a new one (and pays a new
//! minimum).
//!
//! # Properties
//!
//! For any sequence of query executions `[sᵢ, eᵢ]` on one cluster:
//!
//! - (A) active time never decreases as `now` advances;
//! - (B) every instant at which a query runs is billed: active time is at
//!   least the length of `⋃ [sᵢ, eᵢ]`;
//! - (C) nothing else is billed beyond the minimum windows: active time is
//!   at most the length of `⋃ [sᵢ, max(eᵢ, sᵢ + m)]`;
//! - (D) a single query of duration `d` on an idle cluster is billed
//!   `max(d, m)`.
//!
//! These are checked by property tests below.

use serde::{Deserialize, Serialize};

use crate::model::Rpu;
use crate::time::{Duration, Instant};

const SECS_PER_HOUR: f64 = 3_600.0;

/// Prices and the minimum billing window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BillingConfig {
    /// The minimum billed window `m` once the timer starts (Redshift
    /// Serverless and Snowflake both bill at least 60 s).
    pub min_window: Duration,
    /// Price per RPU-hour of active time (Redshift Serverless, us-east-1).
    pub price_per_rpu_hour_usd: f64,
}

impl Default for BillingConfig {
    fn default() -> Self {
        BillingConfig { min_window: Duration::from_secs(60), price_per_rpu_hour_usd: 0.375 }
    }
}

impl BillingConfig {
    /// The price of `active` time on a cluster of `size`.
    pub fn cost_usd(&self, size: Rpu, active: Duration) -> f64 {
        self.price_per_rpu_hour_usd * f64::from(size.0) * active.as_secs_f64() / SECS_PER_HOUR
    }
}

/// An open billing window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
struct Window {
    started: Instant,
    /// When the last running query finished, if none is running now.
    idle_since: Option<Instant>,
}

impl Window {
    /// When this window pauses if no query arrives before then.
    fn pause_at(&self, min_window: Duration) -> Option<Instant> {
        self.idle_since.map(|idle| idle.max(self.started + min_window))
    }
}

/// The billing timer of one cluster.
///
/// Drive it with [`handle_query_start`](Self::handle_query_start) and
/// [`handle_query_end`](Self::handle_query_end) in time order; read it with
/// [`active_time`](Self::active_time) and [`cost_usd`](Self::cost_usd) at
/// any `now` not earlier than the last input.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BillingTimer {
    config: BillingConfig,
    size: Rpu,
    window: Option<Window>,
    closed_active: Duration,
    running_queries: u32,
    windows_opened: u32,
    last_input: Instant,
}

impl BillingTimer {
    /// A paused timer for a cluster of `size`.
    pub fn new(config: BillingConfig, size: Rpu) -> Self {
        BillingTimer {
            config,
            size,
            window: None,
            closed_active: Duration::ZERO,
            running_queries: 0,
            windows_opened: 0,
            last_input: Instant::ZERO,
        }
    }

    /// A query starts running on the cluster at `now`.
    ///
    /// # Panics
    ///
    /// If `now` is earlier than a previous input.
    pub fn handle_query_start(&mut self, now: Instant) {
        self.advance_to(now);
        match &mut self.window {
            Some(window) => window.idle_since = None,
            None => {
                self.window = Some(Window { started: now, idle_since: None });
                self.windows_opened += 1;
            }
        }
        self.running_queries += 1;
    }

    /// A query stops running on the cluster at `now` (completed, failed or
    /// cancelled).
    ///
    /// # Panics
    ///
    /// If no query is running, or `now` is earlier than a previous input.
    pub fn handle_query_end(&mut self, now: Instant) {
        self.advance_to(now);
        assert!(self.running_queries > 0, "billing: query end without a running query");
        self.running_queries -= 1;
        if self.running_queries == 0 {
            let window = self.window.as_mut().expect("billing: running queries imply an open window");
            window.idle_since = Some(now);
        }
    }

    /// Whether the timer is running at `now`.
    pub fn is_running(&self, now: Instant) -> bool {
        match &self.window {
            None => false,
            Some(window) => window.pause_at(self.config.min_window).is_none_or(|pause| now < pause),
        }
    }

    /// The billing terms.
    pub fn config(&self) -> &BillingConfig {
        &self.config
    }

    /// Queries running now.
    pub fn running_queries(&self) -> u32 {
        self.running_queries
    }

    /// How many billing windows have opened (each pays at least `m`).
    pub fn windows_opened(&self) -> u32 {
        self.windows_opened
    }

    /// Total billed active time up to `now`.
    pub fn active_time(&self, now: Instant) -> Duration {
        let open = match &self.window {
            None => Duration::ZERO,
            Some(window) => {
                let end = match window.pause_at(self.config.min_window) {
                    Some(pause) => pause.min(now),
                    None => now,
                };
                end - window.started
            }
        };
        self.closed_active + open
    }

    /// Total billed cost up to `now`, in dollars.
    pub fn cost_usd(&self, now: Instant) -> f64 {
        self.config.cost_usd(self.size, self.active_time(now))
    }

    /// When the timer would pause if the running queries finish by
    /// `last_completion` and no other query arrives; `None` if it is paused
    /// already at `now`.
    pub fn pause_time(&self, now: Instant, last_completion: Instant) -> Option<Instant> {
        let window = self.window.as_ref()?;
        let pause = if self.running_queries == 0 {
            window.pause_at(self.config.min_window).expect("no running queries implies idle")
        } else {
            last_completion.max(window.started + self.config.min_window)
        };
        (pause > now).then_some(pause)
    }

    /// "Cost until drained": what the cluster will still bill from `now` if
    /// its running queries finish by `last_completion` and nothing else
    /// arrives, in dollars.
    pub fn cost_until_drained_usd(&self, now: Instant, last_completion: Instant) -> f64 {
        match self.pause_time(now, last_completion) {
            Some(pause) => self.config.cost_usd(self.size, pause - now),
            None => 0.0,
        }
    }

    fn advance_to(&mut self, now: Instant) {
        assert!(now >= self.last_input, "billing: inputs must arrive in time order");
        self.last_input = now;
        if let Some(window) = self.window
            && let Some(pause) = window.pause_at(self.config.min_window)
            && pause <= now
        {
            self.closed_active += pause - window.started;
            self.window = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn secs(s: f64) -> Instant {
        Instant::from_secs_f64(s)
    }

    fn timer() -> BillingTimer {
        BillingTimer::new(BillingConfig::default(), Rpu(16))
    }

    /// Runs queries `[start, end]` (seconds) through a fresh timer in event
    /// order and returns it.
    fn run(executions: &[(f64, f64)]) -> BillingTimer {
        let mut events: Vec<(Instant, bool)> = Vec::new();
        for &(start, end) in executions {
            events.push((secs(start), true));
            events.push((secs(end), false));
        }
        // Ends before starts at the same instant: a query that ends exactly
        // when another arrives frees the cluster first.
        events.sort_by_key(|&(at, is_start)| (at, is_start));
        let mut timer = timer();
        for (at, is_start) in events {
            if is_start {
                timer.handle_query_start(at);
            } else {
                timer.handle_query_end(at);
            }
        }
        timer
    }

    #[test]
    fn five_second_query_on_idle_cluster_is_billed_sixty_seconds() {
        let timer = run(&[(100.0, 105.0)]);
        assert_eq!(timer.active_time(secs(1_000.0)), Duration::from_secs(60));
        let expected_usd = 0.375 * 16.0 * 60.0 / 3_600.0;
        assert!((timer.cost_usd(secs(1_000.0)) - expected_usd).abs() < 1e-12);
    }

    #[test]
    fn two_queries_thirty_seconds_apart_share_one_window() {
        let timer = run(&[(0.0, 5.0), (30.0, 35.0)]);
        assert_eq!(timer.active_time(secs(500.0)), Duration::from_secs(60));
        assert_eq!(timer.windows_opened(), 1);
    }

    #[test]
    fn query_after_the_window_closes_opens_a_new_window() {
        let timer = run(&[(0.0, 5.0), (90.0, 95.0)]);
        assert_eq!(timer.active_time(secs(500.0)), Duration::from_secs(120));
        assert_eq!(timer.windows_opened(), 2);
    }

    #[test]
    fn arrival_exactly_at_the_pause_opens_a_new_window() {
        let timer = run(&[(0.0, 5.0), (60.0, 65.0)]);
        assert_eq!(timer.windows_opened(), 2);
        assert_eq!(timer.active_time(secs(500.0)), Duration::from_secs(120));
    }

    #[test]
    fn timer_keeps_running_past_the_minimum_while_queries_run() {
        let timer = run(&[(0.0, 200.0)]);
        assert!(timer.is_running(secs(150.0)));
        assert!(!timer.is_running(secs(200.0)));
        assert_eq!(timer.active_time(secs(150.0)), Duration::from_secs(150));
        assert_eq!(timer.active_time(secs(300.0)), Duration::from_secs(200));
    }

    #[test]
    fn timer_does_not_pause_before_the_minimum_even_when_idle() {
        let timer = run(&[(0.0, 5.0)]);
        assert!(timer.is_running(secs(30.0)));
        assert_eq!(timer.active_time(secs(30.0)), Duration::from_secs(30));
        assert!(!timer.is_running(secs(60.0)));
    }

    #[test]
    fn cost_until_drained_counts_the_rest_of_the_minimum_window() {
        let mut timer = timer();
        timer.handle_query_start(secs(0.0));
        // At t=10 with the running query predicted to end at t=20, the
        // window still pauses at t=60: 50 s left to bill.
        let usd = timer.cost_until_drained_usd(secs(10.0), secs(20.0));
        assert!((usd - 0.375 * 16.0 * 50.0 / 3_600.0).abs() < 1e-12);
        // Predicted to end at t=100: bill until then.
        let usd = timer.cost_until_drained_usd(secs(10.0), secs(100.0));
        assert!((usd - 0.375 * 16.0 * 90.0 / 3_600.0).abs() < 1e-12);
    }

    #[test]
    fn cost_until_drained_is_zero_on_a_paused_cluster() {
        let timer = run(&[(0.0, 5.0)]);
        assert_eq!(timer.cost_until_drained_usd(secs(61.0), secs(61.0)), 0.0);
        assert_eq!(timer.pause_time(secs(61.0), secs(61.0)), None);
    }

    /// Length of the union of intervals, in microseconds.
    fn union_micros(mut intervals: Vec<(u64, u64)>) -> u64 {
        intervals.sort();
        let mut total = 0;
        let mut current: Option<(u64, u64)> = None;
        for (start, end) in intervals {
            match current {
                Some((s, e)) if start <= e => current = Some((s, e.max(end))),
                Some((s, e)) => {
                    total += e - s;
                    current = Some((start, end));
                }
                None => current = Some((start, end)),
            }
        }
        total + current.map_or(0, |(s, e)| e - s)
    }

    fn executions() -> impl Strategy<Value = Vec<(f64, f64)>> {
        prop::collection::vec((0u32..2_000, 1u32..300), 1..12).prop_map(|raw| {
            raw.into_iter().map(|(start, dur)| (f64::from(start), f64::from(start + dur))).collect()
        })
    }

    proptest! {
        #[test]
        fn active_time_never_decreases(execs in executions(), probes in prop::collection::vec(0u32..3_000, 1..20)) {
            let timer = run(&execs);
            let mut probes = probes;
            probes.sort();
            let mut last = Duration::ZERO;
            for probe in probes {
                let now = secs(f64::from(probe)).max(timer.last_input);
                let active = timer.active_time(now);
                prop_assert!(active >= last);
                last = active;
            }
        }

        #[test]
        fn every_running_instant_is_billed_and_nothing_beyond_minimum_windows(execs in executions()) {
            let timer = run(&execs);
            let billed = timer.active_time(Instant::MAX).as_micros();
            let m = Duration::from_secs(60).as_micros();
            let busy = union_micros(execs.iter().map(|&(s, e)| (secs(s).as_micros(), secs(e).as_micros())).collect());
            let padded = union_micros(execs.iter().map(|&(s, e)| {
                let (s, e) = (secs(s).as_micros(), secs(e).as_micros());
                (s, e.max(s + m))
            }).collect());
            prop_assert!(billed >= busy, "billed {billed} < busy {busy}");
            prop_assert!(billed <= padded, "billed {billed} > padded {padded}");
            prop_assert!(billed >= u64::from(timer.windows_opened()) * m);
        }

        #[test]
        fn single_query_costs_max_of_duration_and_minimum(start in 0u32..10_000, dur in 1u32..500) {
            let timer = run(&[(f64::from(start), f64::from(start + dur))]);
            prop_assert_eq!(timer.active_time(Instant::MAX), Duration::from_secs(u64::from(dur.max(60))));
        }
    }
}
