//! The autoscaler: observation windows, the teardown and spinup triggers
//! and the size selector, behind the simulator's [`Controller`] interface
//! (the live Autoscaler actor drives the same type).
//!
//! On every arrival and completion it records the observation, runs the
//! teardown trigger, then the spinup trigger of its [`SpinupPolicy`]; when
//! that fires it acts by its [`ScaleAction`]: the size selector on a fork of
//! the router (adding a cluster, or several at once when no single one gets
//! the replay under the target, within `max_spinups_at_once` and
//! `max_clusters`; or for vertical scaling replacing the others once the new
//! one is ready), or a copy of the existing size (horizontal). It never sees the world: only the pool, the observations
//! and the router's predictions.
//!
//! Every `scale_in_interval`, while the pool is steady, **scale-in by
//! replay** ([`crate::scale::scale_in`]) may drain a cluster or replace the
//! pool's one cluster with a smaller one, when the replay says the pool
//! still meets `scale_in_target` for at least a tenth less; the teardown
//! trigger alone only removes clusters idle for T_idle.
//!
//! A schedule of **planned spinups** (the policy tuner's, AutoSLO §7.4) may
//! be set: each fires at its instant as a spinup of its size, within
//! `max_clusters`, and the teardown trigger treats the cluster like any
//! other (it lives at least `T_min_lifetime` once ready).
//!
//! # Properties
//!
//! - (A) It never asks for more than `max_clusters` Starting or Ready
//!   clusters.
//! - (B) It never tears down a cluster that runs queries, nor the last
//!   Ready one unless configured.
//! - (C) Every fired trigger, selection and command is recorded, in order,
//!   in a bounded log; the latest trigger evaluation is always kept.

use std::collections::{BTreeSet, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::billing::BillingConfig;
use crate::model::{ClusterId, ClusterState, ExecutionOutcome, Pool, QueryId, Rpu, Slo, Target};
use crate::route::{PlanningRouter, RoutingPolicy};
use crate::scale::AutoscalerConfig;
use crate::scale::replay::{Selection, SelectorConfig, SelectorMode, select_spinup_size};
use crate::scale::scale_in::{ScaleIn, ScaleInOutcome, ScaleInSelection, select_scale_in};
use crate::scale::trigger::{SpinupTrigger, TriggerEvaluation, TriggerSignal, teardown_candidates, teardown_eligible_at};
use crate::scale::windows::{ArrivalRecord, CompletionRecord, ObservationWindows};
use crate::sim::{ClusterCommand, Controller, Observation};
use crate::time::Instant;

/// Decisions kept in the log.
const DECISION_LOG: usize = 1_024;

/// When the spinup trigger fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum SpinupPolicy {
    /// Never ("No-Op").
    Never,
    /// Once, at the given arrival (the §8.5 experiment).
    Forced {
        /// Fires at this many arrivals.
        after_arrivals: usize,
    },
    /// With this many queries outstanding ("Queue@N").
    QueueLength {
        /// N.
        threshold: usize,
    },
    /// Algorithm 2 on completions only ("Observed").
    Observed,
    /// Algorithm 2 on completions and projected violations of running
    /// queries (slogate).
    Projected,
}

/// What a fired trigger does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScaleAction {
    /// The size selector chooses a cluster to add, or nothing.
    Select,
    /// Add a copy of the existing cluster's size ("Horizontal").
    Horizontal,
    /// The size selector chooses one cluster to replace the others
    /// ("Vertical"); they drain once it is ready.
    Vertical,
}

/// A complete autoscaling strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoscalerPolicy {
    /// When to spin up.
    pub spinup: SpinupPolicy,
    /// How.
    pub action: ScaleAction,
    /// Whether the teardown trigger runs.
    pub teardown: bool,
}

impl AutoscalerPolicy {
    /// slogate: Algorithm 2 with projections, the size selector, teardown.
    pub const SLOGATE: AutoscalerPolicy = AutoscalerPolicy { spinup: SpinupPolicy::Projected, action: ScaleAction::Select, teardown: true };
}

/// One recorded decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum ScaleDecision {
    /// The spinup trigger fired.
    TriggerFired(TriggerEvaluation),
    /// The size selector ran.
    Selection {
        /// When.
        at: Instant,
        /// Add or replace.
        mode: SelectorMode,
        /// Every candidate and the choice.
        selection: Selection,
    },
    /// A spinup was requested.
    SpinUp {
        /// When.
        at: Instant,
        /// Its size.
        size: Rpu,
        /// Why.
        reason: String,
    },
    /// A teardown was requested.
    TearDown {
        /// When.
        at: Instant,
        /// Which cluster.
        cluster: ClusterId,
        /// Why.
        reason: String,
    },
    /// Scale-in replayed the pool.
    ScaleIn {
        /// When.
        at: Instant,
        /// Every candidate and the choice.
        selection: ScaleInSelection,
    },
    /// A spinup was refused before it reached the platform: a cap, or the
    /// platform's own refusal.
    Refused {
        /// When.
        at: Instant,
        /// Its size.
        size: Rpu,
        /// Why, naming the cap and its figures.
        reason: String,
    },
    /// A cluster it asked for never served: its platform gave up on it
    /// (it never became available, or failed its health check) and
    /// deleted it.
    Abandoned {
        /// When.
        at: Instant,
        /// Which cluster.
        cluster: ClusterId,
        /// Why, from the provider.
        reason: String,
    },
    /// A fired trigger led to nothing.
    Skipped {
        /// When.
        at: Instant,
        /// Why.
        reason: String,
    },
}

/// A spinup planned ahead of the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ScheduledSpinup {
    /// When to request the cluster.
    pub at: Instant,
    /// Its size.
    pub size: Rpu,
}

/// Planned spinups that repeat every day (the live node's tuned schedule).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DailySchedule {
    /// Each `at` is a time of day: how long after the day's start, in the
    /// calendar's seconds (under 86,400 s).
    pub spinups: Vec<ScheduledSpinup>,
    /// The virtual instant a day starts at (any day's 00:00 UTC).
    pub day_start: Instant,
    /// A day's length in virtual time (86,400 s for the live node, whose
    /// calendar runs on the virtual clock).
    pub day_length: crate::time::Duration,
}

impl DailySchedule {
    /// Day `day`'s occurrences (day 0 starts at `day_start`).
    fn occurrences(&self, day: i64) -> impl Iterator<Item = ScheduledSpinup> + '_ {
        self.spinups.iter().map(move |s| {
            let days = day as f64 + s.at.as_secs_f64() / 86_400.0;
            ScheduledSpinup { at: Instant::from_secs_f64(self.day_start.as_secs_f64() + days * self.day_length.as_secs_f64()), size: s.size }
        })
    }

    /// The index of the day holding `now`.
    fn day_of(&self, now: Instant) -> i64 {
        ((now.as_secs_f64() - self.day_start.as_secs_f64()) / self.day_length.as_secs_f64().max(1e-9)).floor() as i64
    }
}

/// A decision left for [`Autoscaler::run_pending_selection`].
#[derive(Clone, Debug)]
enum Pending {
    /// A fired trigger's size selection.
    Select(SelectorMode, BTreeSet<ClusterId>),
    /// A scale-in replay.
    ScaleIn,
}

/// Counters over the autoscaler's life.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AutoscalerStats {
    /// Spinup trigger evaluations.
    pub trigger_evaluations: u64,
    /// Of which fired.
    pub triggers_fired: u64,
    /// Size selector runs.
    pub selections: u64,
    /// Spinups requested.
    pub spinups: u64,
    /// Teardowns requested.
    pub teardowns: u64,
}

/// The autoscaler. See the module docs.
#[derive(Clone, Debug)]
pub struct Autoscaler {
    config: AutoscalerConfig,
    policy: AutoscalerPolicy,
    billing: BillingConfig,
    windows: ObservationWindows,
    spinup: SpinupTrigger,
    last_routed: HashMap<ClusterId, Instant>,
    outstanding: HashMap<QueryId, Slo>,
    arrivals_seen: usize,
    forced_done: bool,
    replacing: Option<BTreeSet<ClusterId>>,
    teardown_requested: BTreeSet<ClusterId>,
    commands: VecDeque<ClusterCommand>,
    decisions: VecDeque<ScaleDecision>,
    last_evaluation: Option<TriggerEvaluation>,
    stats: AutoscalerStats,
    next_wakeup: Option<Instant>,
    defer_selections: bool,
    pending: Option<Pending>,
    /// Scale-in replays the pool again no earlier than this.
    next_scale_in: Instant,
    /// Planned spinups not yet fired, latest first (the next is last).
    schedule: Vec<ScheduledSpinup>,
    /// The repeating schedule, and the last day whose occurrences are in
    /// `schedule`.
    daily: Option<(DailySchedule, i64)>,
}

impl Autoscaler {
    /// An autoscaler with knobs `config`, strategy `policy`, and the billing
    /// terms its cost estimates use.
    pub fn new(config: AutoscalerConfig, policy: AutoscalerPolicy, billing: BillingConfig) -> Self {
        let windows = ObservationWindows::new(config.window, config.max_window_entries);
        Autoscaler {
            config,
            policy,
            billing,
            windows,
            spinup: SpinupTrigger::default(),
            last_routed: HashMap::new(),
            outstanding: HashMap::new(),
            arrivals_seen: 0,
            forced_done: false,
            replacing: None,
            teardown_requested: BTreeSet::new(),
            commands: VecDeque::new(),
            decisions: VecDeque::new(),
            last_evaluation: None,
            stats: AutoscalerStats::default(),
            next_wakeup: None,
            defer_selections: false,
            pending: None,
            next_scale_in: Instant::ZERO,
            schedule: Vec::new(),
            daily: None,
        }
    }

    /// Replaces the planned spinups with `daily`, repeating every day from
    /// `now` on: each occurrence fires once, today's past ones not at all.
    pub fn set_daily_schedule(&mut self, now: Instant, daily: DailySchedule) {
        let today = daily.day_of(now);
        let mut schedule: Vec<ScheduledSpinup> = daily.occurrences(today).filter(|s| s.at >= now).collect();
        schedule.extend(daily.occurrences(today + 1));
        self.store_schedule(schedule);
        self.daily = Some((daily, today + 1));
    }

    /// Keeps tomorrow's occurrences of the daily schedule armed.
    fn arm_daily(&mut self, now: Instant) {
        let Some((daily, armed)) = &mut self.daily else { return };
        let tomorrow = daily.day_of(now) + 1;
        if *armed >= tomorrow {
            return;
        }
        let mut added: Vec<ScheduledSpinup> = (*armed + 1..=tomorrow).flat_map(|day| daily.occurrences(day).collect::<Vec<_>>()).collect();
        *armed = tomorrow;
        added.append(&mut self.schedule);
        self.store_schedule(added);
    }

    /// Applies new knobs (the policy tuner's): the windows keep their
    /// records if their width is unchanged and start afresh otherwise.
    pub fn set_config(&mut self, config: AutoscalerConfig) {
        if config.window != self.config.window || config.max_window_entries != self.config.max_window_entries {
            self.windows = ObservationWindows::new(config.window, config.max_window_entries);
        }
        self.config = config;
    }

    /// Replaces the planned spinups (a daily schedule too) with `schedule`
    /// (any order); those at or before the next instant handled fire then.
    pub fn set_schedule(&mut self, schedule: Vec<ScheduledSpinup>) {
        self.daily = None;
        self.store_schedule(schedule);
    }

    fn store_schedule(&mut self, mut schedule: Vec<ScheduledSpinup>) {
        schedule.sort_by(|a, b| b.cmp(a));
        self.schedule = schedule;
    }

    /// [`Autoscaler::set_schedule`], by value.
    pub fn with_schedule(mut self, schedule: Vec<ScheduledSpinup>) -> Self {
        self.set_schedule(schedule);
        self
    }

    /// The planned spinups still to fire, earliest first.
    pub fn schedule(&self) -> impl Iterator<Item = &ScheduledSpinup> {
        self.schedule.iter().rev()
    }

    /// Fires the planned spinups due at `now`.
    fn run_schedule(&mut self, now: Instant, pool: &Pool) {
        self.arm_daily(now);
        while let Some(next) = self.schedule.last().copied().filter(|s| s.at <= now) {
            self.schedule.pop();
            let live = self.clusters_counted(pool);
            if live >= self.config.max_clusters {
                self.record(ScaleDecision::Skipped { at: now, reason: format!("scheduled {} spinup: already {live} clusters, the maximum", next.size) });
                continue;
            }
            self.spin_up(now, next.size, format!("scheduled for {}", next.at));
        }
    }

    /// The clusters `max_clusters` counts: starting or ready and not being
    /// torn down, plus spinups queued but not yet carried out.
    fn clusters_counted(&self, pool: &Pool) -> usize {
        pool.clusters.iter().filter(|c| matches!(c.state, ClusterState::Starting | ClusterState::Ready) && !self.teardown_requested.contains(&c.id)).count()
            + self.commands.iter().filter(|c| matches!(c, ClusterCommand::SpinUp { .. })).count()
    }

    /// The knobs.
    pub fn config(&self) -> &AutoscalerConfig {
        &self.config
    }

    /// The strategy.
    pub fn policy(&self) -> AutoscalerPolicy {
        self.policy
    }

    /// Recent decisions, oldest first.
    pub fn decisions(&self) -> impl Iterator<Item = &ScaleDecision> {
        self.decisions.iter()
    }

    /// The latest spinup trigger evaluation, fired or not.
    pub fn last_evaluation(&self) -> Option<&TriggerEvaluation> {
        self.last_evaluation.as_ref()
    }

    /// Counters.
    pub fn stats(&self) -> &AutoscalerStats {
        &self.stats
    }

    /// The observation windows.
    pub fn windows(&self) -> &ObservationWindows {
        &self.windows
    }

    /// The selector's settings, derived from the knobs.
    pub fn selector_config(&self) -> SelectorConfig {
        self.config.selector_config(self.billing.clone())
    }

    /// Records that a spinup of `size` it asked for at `now` was refused
    /// (a cap, or the platform), with the reason.
    pub fn record_refusal(&mut self, now: Instant, size: Rpu, reason: String) {
        self.record(ScaleDecision::Refused { at: now, size, reason });
    }

    /// Records that `cluster`, requested and still starting, was abandoned
    /// by its platform at `now`, with the reason.
    pub fn record_abandoned(&mut self, now: Instant, cluster: ClusterId, reason: String) {
        self.record(ScaleDecision::Abandoned { at: now, cluster, reason });
    }

    fn record(&mut self, decision: ScaleDecision) {
        if self.decisions.len() == DECISION_LOG {
            self.decisions.pop_front();
        }
        self.decisions.push_back(decision);
    }

    fn tear_down(&mut self, now: Instant, cluster: ClusterId, reason: String) {
        if self.teardown_requested.insert(cluster) {
            self.stats.teardowns += 1;
            self.commands.push_back(ClusterCommand::TearDown { cluster });
            self.record(ScaleDecision::TearDown { at: now, cluster, reason });
        }
    }

    fn run_teardown(&mut self, now: Instant, pool: &Pool) {
        if !self.policy.teardown {
            return;
        }
        for cluster in teardown_candidates(now, pool, &self.teardown_requested, &self.last_routed, &self.config) {
            let reason = format!(
                "idle for {:.0}s with nothing running, ready for at least {:.0}s",
                self.config.idle_teardown.as_secs_f64(),
                self.config.min_lifetime.as_secs_f64()
            );
            self.tear_down(now, cluster, reason);
        }
    }

    /// The next instant a teardown could become due, strictly after `now`.
    fn plan_wakeup(&mut self, now: Instant, pool: &Pool) {
        self.next_wakeup = None;
        if !self.policy.teardown {
            return;
        }
        let ready = pool.clusters.iter().filter(|c| c.state == ClusterState::Ready && !self.teardown_requested.contains(&c.id)).count();
        if self.config.keep_last_cluster && ready <= 1 {
            return;
        }
        self.next_wakeup = pool
            .clusters
            .iter()
            .filter(|c| !self.teardown_requested.contains(&c.id))
            .filter_map(|c| teardown_eligible_at(c, &self.last_routed, &self.config))
            .filter(|at| *at > now)
            .min();
    }

    fn run_spinup(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy) {
        let evaluation = match self.policy.spinup {
            SpinupPolicy::Never => return,
            SpinupPolicy::Forced { after_arrivals } => {
                if self.forced_done || self.arrivals_seen < after_arrivals {
                    return;
                }
                self.forced_done = true;
                self.spinup.force(now, pool)
            }
            SpinupPolicy::QueueLength { threshold } => self.spinup.evaluate_queue(now, pool, threshold),
            SpinupPolicy::Observed => {
                self.spinup.evaluate(now, pool, &self.windows, &|q| router.predicted_latency(q), TriggerSignal::Observed, &self.config)
            }
            SpinupPolicy::Projected => self.spinup.evaluate(
                now,
                pool,
                &self.windows,
                &|q| router.predicted_latency(q),
                TriggerSignal::ObservedAndProjected,
                &self.config,
            ),
        };
        self.stats.trigger_evaluations += 1;
        let fired = evaluation.fired;
        self.last_evaluation = Some(evaluation.clone());
        if !fired {
            return;
        }
        self.stats.triggers_fired += 1;
        self.record(ScaleDecision::TriggerFired(evaluation));
        self.act(now, pool, router);
    }

    fn skip(&mut self, now: Instant, reason: String) {
        self.spinup.set_in_flight(false);
        self.spinup.suppress_until(now + self.config.spinup_delay);
        self.record(ScaleDecision::Skipped { at: now, reason });
    }

    fn act(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy) {
        let live: Vec<&crate::model::ClusterView> = pool
            .clusters
            .iter()
            .filter(|c| matches!(c.state, ClusterState::Starting | ClusterState::Ready) && !self.teardown_requested.contains(&c.id))
            .collect();
        if live.len() >= self.config.max_clusters && self.policy.action != ScaleAction::Vertical {
            let reason = format!("already {} clusters, the maximum", live.len());
            self.skip(now, reason);
            return;
        }
        let mode = match self.policy.action {
            ScaleAction::Horizontal => {
                let Some(size) = live.iter().filter(|c| c.state == ClusterState::Ready).map(|c| c.size).max() else {
                    self.skip(now, "no ready cluster to copy".to_owned());
                    return;
                };
                self.spin_up(now, size, "horizontal: a copy of the existing size".to_owned());
                return;
            }
            ScaleAction::Select => SelectorMode::AddCluster,
            ScaleAction::Vertical => SelectorMode::Replace,
        };
        let replaced: BTreeSet<ClusterId> = live.iter().map(|c| c.id).collect();
        let Some(planner) = router.fork_planner() else {
            if self.defer_selections {
                self.pending = Some(Pending::Select(mode, replaced));
            } else {
                self.skip(now, format!("router {} cannot predict completions for the size selector", router.name()));
            }
            return;
        };
        self.select(now, pool, planner.as_ref(), mode, replaced);
    }

    /// Whether a fired trigger waits for [`Autoscaler::run_pending_selection`].
    pub fn pending_selection(&self) -> bool {
        self.pending.is_some()
    }

    /// Runs the size selector a fired trigger left pending (see
    /// [`Autoscaler::defer_selections`]) on `planner`, a fork of the live
    /// router, from the pool as it is at `now`.
    pub fn run_pending_selection(&mut self, now: Instant, pool: &Pool, planner: &dyn PlanningRouter) {
        match self.pending.take() {
            Some(Pending::Select(mode, replaced)) => self.select(now, pool, planner, mode, replaced),
            Some(Pending::ScaleIn) => self.scale_in(now, pool, planner),
            None => {}
        }
    }

    /// Leaves selections pending instead of running them inline when the
    /// router passed to the controller calls cannot fork: the live
    /// autoscaler's view of the router is a snapshot, and it fetches a fork
    /// from the router's actor off the routing path.
    pub fn defer_selections(mut self) -> Self {
        self.defer_selections = true;
        self
    }

    fn select(&mut self, now: Instant, pool: &Pool, planner: &dyn PlanningRouter, mode: SelectorMode, replaced: BTreeSet<ClusterId>) {
        let window: Vec<ArrivalRecord> = self.windows.arrivals().cloned().collect();
        let mut config = self.selector_config();
        config.max_added = config.max_added.min(self.config.max_clusters.saturating_sub(self.clusters_counted(pool))).max(1);
        let selection = select_spinup_size(now, pool, planner, &window, &config, mode);
        self.stats.selections += 1;
        let (choice, copies) = (selection.choice, selection.copies);
        self.record(ScaleDecision::Selection { at: now, mode, selection });
        match choice {
            None => {
                self.spinup.set_in_flight(false);
                self.spinup.suppress_until(now + self.config.spinup_delay);
            }
            Some(size) => {
                if mode == SelectorMode::Replace {
                    self.replacing = Some(replaced);
                }
                for copy in 1..=copies.max(1) {
                    let reason = if copies > 1 { format!("the size selector's choice ({mode:?}, {copy} of {copies})") } else { format!("the size selector's choice ({mode:?})") };
                    self.spin_up(now, size, reason);
                }
            }
        }
    }

    /// Whether scale-in may replay the pool now: it is due, the policy adds
    /// clusters by the selector and tears them down, and the pool is
    /// steady (nothing starting, draining, being replaced or pending, and
    /// every ready cluster past T_min_lifetime).
    fn scale_in_due(&self, now: Instant, pool: &Pool) -> bool {
        let steady = pool.clusters.iter().all(|c| match c.state {
            ClusterState::Ready => c.ready_at + self.config.min_lifetime <= now && !self.teardown_requested.contains(&c.id),
            ClusterState::Gone => true,
            _ => false,
        });
        self.config.scale_in
            && self.policy.teardown
            && self.policy.action == ScaleAction::Select
            && now >= self.next_scale_in
            && steady
            && self.pending.is_none()
            && self.replacing.is_none()
            && !self.spinup.in_flight()
            && self.commands.is_empty()
    }

    fn run_scale_in(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy) {
        if !self.scale_in_due(now, pool) {
            return;
        }
        self.next_scale_in = now + self.config.scale_in_interval;
        match router.fork_planner() {
            Some(planner) => self.scale_in(now, pool, planner.as_ref()),
            None if self.defer_selections => self.pending = Some(Pending::ScaleIn),
            None => {}
        }
    }

    fn scale_in(&mut self, now: Instant, pool: &Pool, planner: &dyn PlanningRouter) {
        let window: Vec<ArrivalRecord> = self.windows.arrivals().cloned().collect();
        let Some(selection) = select_scale_in(now, pool, planner, &window, &self.selector_config(), self.config.scale_in_target) else { return };
        let keep_usd = selection.keep().cost_usd;
        let chosen = selection.chosen().cloned();
        self.record(ScaleDecision::ScaleIn { at: now, selection });
        let Some(ScaleInOutcome { action: Some(action), violation_rate, cost_usd }) = chosen else { return };
        let why = format!(
            "scale-in: the replay gives {:.1}% VR (target {:.1}%) at ${cost_usd:.2} against ${keep_usd:.2} for keeping the pool",
            violation_rate * 100.0,
            self.config.scale_in_target * 100.0
        );
        match action {
            ScaleIn::Drain { cluster } => self.tear_down(now, cluster, why),
            ScaleIn::Shrink { cluster, size } => {
                self.replacing = Some(BTreeSet::from([cluster]));
                self.spin_up(now, size, format!("{why}; it replaces {cluster}"));
            }
        }
    }

    fn spin_up(&mut self, now: Instant, size: Rpu, reason: String) {
        self.stats.spinups += 1;
        self.commands.push_back(ClusterCommand::SpinUp { size });
        self.record(ScaleDecision::SpinUp { at: now, size, reason });
    }

    fn evaluate(&mut self, now: Instant, pool: &Pool, router: &dyn RoutingPolicy) {
        self.windows.truncate(now);
        self.run_schedule(now, pool);
        self.run_teardown(now, pool);
        self.run_spinup(now, pool, router);
        self.run_scale_in(now, pool, router);
        self.plan_wakeup(now, pool);
    }
}

impl Controller for Autoscaler {
    fn handle_observation(&mut self, now: Instant, observation: Observation<'_>, pool: &Pool, router: &dyn RoutingPolicy) {
        match observation {
            Observation::Arrival { query, target } => {
                self.arrivals_seen += 1;
                self.windows.record_arrival(now, ArrivalRecord { query: query.id, template: query.template, slo: query.slo, arrival: query.arrival });
                match target {
                    Some(Target::Cluster(cluster)) => {
                        self.last_routed.insert(cluster, now);
                        self.outstanding.insert(query.id, query.slo);
                    }
                    Some(Target::Elastic) => {
                        self.outstanding.insert(query.id, query.slo);
                    }
                    None => self.windows.record_completion(now, CompletionRecord {
                        query: query.id,
                        arrival: query.arrival,
                        finished: now,
                        slo: query.slo,
                        completed: false,
                    }),
                }
            }
            Observation::Finished(report) => {
                if let Some(slo) = self.outstanding.remove(&report.query) {
                    self.windows.record_completion(now, CompletionRecord {
                        query: report.query,
                        arrival: report.arrival,
                        finished: report.finished,
                        slo,
                        completed: report.outcome == ExecutionOutcome::Completed,
                    });
                }
            }
            Observation::ClusterReady(cluster) => {
                if let Some(old) = self.replacing.take_if(|old| !old.contains(&cluster)) {
                    for id in old {
                        if pool.clusters.iter().any(|c| c.id == id && c.state == ClusterState::Ready) {
                            self.tear_down(now, id, format!("replaced by {cluster} (vertical scaling)"));
                        }
                    }
                }
            }
            Observation::ClusterGone(cluster) => {
                self.teardown_requested.remove(&cluster);
                self.last_routed.remove(&cluster);
            }
        }
        self.evaluate(now, pool, router);
    }

    fn poll_timeout(&self) -> Option<Instant> {
        [self.next_wakeup, self.schedule.last().map(|s| s.at)].into_iter().flatten().min()
    }

    fn handle_timeout(&mut self, now: Instant, pool: &Pool, _router: &dyn RoutingPolicy) {
        self.windows.truncate(now);
        self.run_schedule(now, pool);
        self.run_teardown(now, pool);
        self.plan_wakeup(now, pool);
    }

    fn poll_command(&mut self) -> Option<ClusterCommand> {
        self.commands.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TemplateId;
    use crate::predict::concurrency::ConcurrencyConfig;
    use crate::predict::{ConcurrencyAware, LatencyPredictor, Observation as Execution};
    use crate::route::slo::SloRouter;
    use crate::time::Duration;

    fn planner() -> SloRouter<ConcurrencyAware> {
        let mut predictor = ConcurrencyAware::new(ConcurrencyConfig::default());
        for n in [0u32, 2, 8] {
            let latency = Duration::from_secs_f64(10.0 * (1.0 + f64::from(n) / 4.0));
            predictor.observe(&Execution { template: TemplateId(1), size: Rpu(16), neighbours: n, latency, censored: false });
        }
        predictor.fit();
        SloRouter::new("slogate", predictor, BillingConfig::default())
    }

    #[test]
    fn a_router_that_cannot_predict_leaves_the_selection_skipped_or_pending() {
        let pool = crate::scale::replay::pool_of(&[Rpu(16)]);
        let router = crate::route::RoundRobin::default();
        let mut skipping = Autoscaler::new(AutoscalerConfig::default(), AutoscalerPolicy::SLOGATE, BillingConfig::default());
        skipping.act(Instant::ZERO, &pool, &router);
        assert!(matches!(skipping.decisions().last(), Some(ScaleDecision::Skipped { .. })));
        let mut deferring = Autoscaler::new(AutoscalerConfig::default(), AutoscalerPolicy::SLOGATE, BillingConfig::default()).defer_selections();
        deferring.act(Instant::ZERO, &pool, &router);
        assert!(deferring.pending_selection());
        deferring.run_pending_selection(Instant::ZERO, &pool, &planner());
        assert!(!deferring.pending_selection());
        assert!(deferring.decisions().any(|d| matches!(d, ScaleDecision::Selection { .. })));
    }

    /// An autoscaler that saw `count` light queries (template 1, 300 s
    /// SLO) over the 300 s before `now`.
    fn after_light_load(now: Instant, count: u64) -> Autoscaler {
        let mut autoscaler = Autoscaler::new(AutoscalerConfig::default(), AutoscalerPolicy::SLOGATE, BillingConfig::default());
        for i in 0..count {
            let arrival = now - Duration::from_secs_f64(300.0 * (count - i) as f64 / count as f64);
            autoscaler.windows.record_arrival(arrival, ArrivalRecord { query: QueryId(i), template: TemplateId(1), slo: Slo { latency: Duration::from_secs(300) }, arrival });
        }
        autoscaler
    }

    #[test]
    fn a_steady_lightly_loaded_cluster_is_replaced_by_a_smaller_one_once_per_interval() {
        let pool = crate::scale::replay::pool_of(&[Rpu(32)]);
        let now = Instant::from_secs_f64(3_600.0);
        let mut autoscaler = after_light_load(now, 10);
        autoscaler.evaluate(now, &pool, &planner());
        let Some(ScaleDecision::ScaleIn { selection, .. }) = autoscaler.decisions().find(|d| matches!(d, ScaleDecision::ScaleIn { .. })).cloned() else {
            panic!("a steady pool is replayed for scale-in: {:?}", autoscaler.decisions().collect::<Vec<_>>())
        };
        let Some(ScaleIn::Shrink { cluster, size }) = selection.choice else { panic!("light load on 32 RPU shrinks: {selection:?}") };
        assert_eq!(cluster, ClusterId(0));
        let commands: Vec<ClusterCommand> = std::iter::from_fn(|| autoscaler.poll_command()).collect();
        assert_eq!(commands, vec![ClusterCommand::SpinUp { size }]);
        assert_eq!(autoscaler.replacing, Some(BTreeSet::from([ClusterId(0)])), "the old cluster goes once the new one is ready");
        autoscaler.evaluate(now + Duration::from_secs(1), &pool, &planner());
        assert_eq!(autoscaler.decisions().filter(|d| matches!(d, ScaleDecision::ScaleIn { .. })).count(), 1, "not again before the interval");
    }

    #[test]
    fn scale_in_waits_for_every_cluster_to_pass_its_minimum_lifetime() {
        let mut pool = crate::scale::replay::pool_of(&[Rpu(32), Rpu(16)]);
        let now = Instant::from_secs_f64(3_600.0);
        pool.clusters[1].ready_at = now - Duration::from_secs(60);
        let mut autoscaler = after_light_load(now, 10);
        autoscaler.evaluate(now, &pool, &planner());
        assert!(!autoscaler.decisions().any(|d| matches!(d, ScaleDecision::ScaleIn { .. })), "a cluster ready a minute ago is not judged yet");
        let off = AutoscalerConfig { scale_in: false, ..AutoscalerConfig::default() };
        let mut disabled = Autoscaler::new(off, AutoscalerPolicy::SLOGATE, BillingConfig::default());
        disabled.windows = after_light_load(now, 10).windows;
        disabled.evaluate(now, &crate::scale::replay::pool_of(&[Rpu(32)]), &planner());
        assert!(!disabled.decisions().any(|d| matches!(d, ScaleDecision::ScaleIn { .. })), "scale_in = false never replays");
    }

    #[test]
    fn a_selection_of_several_clusters_spins_up_each_within_the_cluster_limit() {
        let pool = crate::scale::replay::pool_of(&[Rpu(8)]);
        let config = AutoscalerConfig { max_clusters: 3, max_spinups_at_once: 4, ..AutoscalerConfig::default() };
        let mut autoscaler = Autoscaler::new(config, AutoscalerPolicy::SLOGATE, BillingConfig::default());
        let now = Instant::from_secs_f64(1_000.0);
        for i in 0..300u64 {
            let arrival = Instant::from_secs_f64(700.0 + i as f64);
            autoscaler.windows.record_arrival(arrival, ArrivalRecord { query: QueryId(i), template: TemplateId(1), slo: Slo { latency: Duration::from_secs(30) }, arrival });
        }
        autoscaler.select(now, &pool, &planner(), SelectorMode::AddCluster, BTreeSet::new());
        let Some(ScaleDecision::Selection { selection, .. }) = autoscaler.decisions().find(|d| matches!(d, ScaleDecision::Selection { .. })) else { panic!("a selection is recorded") };
        let copies = selection.copies;
        assert!(copies >= 2, "{selection:?}");
        let spinups = std::iter::from_fn(|| autoscaler.poll_command()).filter(|c| matches!(c, ClusterCommand::SpinUp { .. })).count();
        assert_eq!(spinups, copies);
        assert!(spinups < 3, "max_clusters = 3 holds: {spinups} added to one");
    }

    #[test]
    fn planned_spinups_fire_in_time_order_within_the_cluster_limit() {
        let pool = crate::scale::replay::pool_of(&[Rpu(16)]);
        let router = crate::route::RoundRobin::default();
        let config = AutoscalerConfig { max_clusters: 2, ..AutoscalerConfig::default() };
        let at = Instant::from_secs_f64;
        let schedule = vec![ScheduledSpinup { at: at(100.0), size: Rpu(32) }, ScheduledSpinup { at: at(50.0), size: Rpu(8) }];
        let mut autoscaler = Autoscaler::new(config, AutoscalerPolicy::SLOGATE, BillingConfig::default()).with_schedule(schedule);
        assert_eq!(autoscaler.poll_timeout(), Some(at(50.0)));
        autoscaler.handle_timeout(at(50.0), &pool, &router);
        assert_eq!(autoscaler.poll_command(), Some(ClusterCommand::SpinUp { size: Rpu(8) }));
        assert_eq!(autoscaler.poll_timeout(), Some(at(100.0)));
        // The 8-RPU cluster is starting: with two live clusters the 32-RPU
        // spinup is skipped, and says why.
        let mut grown = pool.clone();
        grown.clusters.push(crate::model::ClusterView { id: ClusterId(1), size: Rpu(8), state: ClusterState::Starting, ..pool.clusters[0].clone() });
        autoscaler.handle_timeout(at(100.0), &grown, &router);
        assert_eq!(autoscaler.poll_command(), None);
        assert!(matches!(autoscaler.decisions().last(), Some(ScaleDecision::Skipped { reason, .. }) if reason.contains("maximum")));
        assert_eq!(autoscaler.schedule().count(), 0);
    }

    #[test]
    fn a_daily_schedule_fires_each_occurrence_once_a_day() {
        // Days of 1,000 virtual seconds (86.4x compression); spinups at
        // 06:00 and 18:00; set at 12:00 of day 0, so day 0's 06:00 is past.
        let pool = crate::scale::replay::pool_of(&[Rpu(16)]);
        let router = crate::route::RoundRobin::default();
        let daily = DailySchedule {
            spinups: vec![ScheduledSpinup { at: Instant::from_secs_f64(21_600.0), size: Rpu(8) }, ScheduledSpinup { at: Instant::from_secs_f64(64_800.0), size: Rpu(16) }],
            day_start: Instant::ZERO,
            day_length: Duration::from_secs(1_000),
        };
        let config = AutoscalerConfig { max_clusters: 100, ..AutoscalerConfig::default() };
        let mut autoscaler = Autoscaler::new(config, AutoscalerPolicy::SLOGATE, BillingConfig::default());
        autoscaler.set_daily_schedule(Instant::from_secs_f64(500.0), daily);
        let mut fired = Vec::new();
        while let Some(at) = autoscaler.poll_timeout().filter(|at| *at < Instant::from_secs_f64(3_000.0)) {
            autoscaler.handle_timeout(at, &pool, &router);
            while let Some(ClusterCommand::SpinUp { size }) = autoscaler.poll_command() {
                fired.push((at.as_secs_f64().round(), size.0));
            }
        }
        assert_eq!(fired, vec![(750.0, 16), (1_250.0, 8), (1_750.0, 16), (2_250.0, 8), (2_750.0, 16)]);
    }
}
