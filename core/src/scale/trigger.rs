//! Scaling triggers (AutoSLO §6.2): when to tear a cluster down, and when
//! SLO trouble calls for the spinup size selector.
//!
//! # Properties
//!
//! - (A) Teardown: a cluster is a candidate only if it is Ready, runs
//!   nothing, has had nothing routed to it for `idle_teardown` and has been
//!   ready for `min_lifetime`; the last Ready cluster is never a candidate
//!   unless `keep_last_cluster` is off.
//! - (B) Spinup (Algorithm 2): it fires only with at least θ observations
//!   since the last change of the active (Ready) cluster set, only when
//!   their violation rate exceeds `trigger_target`, never while a spinup is
//!   in flight or the trigger is suppressed, and a change of the active set
//!   clears the in-flight flag.
//! - (C) Queue@N fires only with N or more queries outstanding, under the
//!   same in-flight and suppression rules.

use std::collections::{BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::model::{ClusterId, ClusterState, ClusterView, Pool, QueryId};
use crate::scale::AutoscalerConfig;
use crate::scale::windows::ObservationWindows;
use crate::time::{Duration, Instant};

/// The clusters the teardown trigger would release at `now`, in id order.
/// `last_routed` holds each cluster's last routing instant; clusters in
/// `going` are already being released and count as gone.
pub fn teardown_candidates(
    now: Instant,
    pool: &Pool,
    going: &BTreeSet<ClusterId>,
    last_routed: &HashMap<ClusterId, Instant>,
    config: &AutoscalerConfig,
) -> Vec<ClusterId> {
    let ready: Vec<&ClusterView> = pool.clusters.iter().filter(|c| c.state == ClusterState::Ready && !going.contains(&c.id)).collect();
    let mut keep = ready.len();
    let mut out = Vec::new();
    for cluster in ready {
        if config.keep_last_cluster && keep <= 1 {
            break;
        }
        if teardown_eligible_at(cluster, last_routed, config).is_some_and(|at| at <= now) {
            out.push(cluster.id);
            keep -= 1;
        }
    }
    out
}

/// When an idle Ready cluster becomes eligible for teardown, if nothing is
/// routed to it meanwhile; `None` if it is not Ready or runs queries.
pub fn teardown_eligible_at(view: &ClusterView, last_routed: &HashMap<ClusterId, Instant>, config: &AutoscalerConfig) -> Option<Instant> {
    if view.state != ClusterState::Ready || !view.running.is_empty() {
        return None;
    }
    let last = last_routed.get(&view.id).copied().unwrap_or(view.ready_at).max(view.ready_at);
    Some((last + config.idle_teardown).max(view.ready_at + config.min_lifetime))
}

/// Which observations the spinup trigger counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TriggerSignal {
    /// Completions only ("Observed", the §8.6 baseline).
    Observed,
    /// Completions plus running queries' predicted violations (Algorithm 2).
    ObservedAndProjected,
}

/// One evaluation of the spinup trigger, as recorded for operators.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerEvaluation {
    /// When.
    pub at: Instant,
    /// Observations since the last cluster-set change (|R| + |D|).
    pub observations: usize,
    /// Their violation rate against the tightened SLO (0 when too few).
    pub violation_rate: f64,
    /// Whether it fired.
    pub fired: bool,
    /// Why it did or did not.
    pub reason: String,
}

/// The spinup trigger's state. See the module docs.
#[derive(Clone, Debug, Default)]
pub struct SpinupTrigger {
    active: Vec<ClusterId>,
    changed_at: Instant,
    in_flight: bool,
    suppressed_until: Instant,
}

impl SpinupTrigger {
    /// Whether a spinup is in flight.
    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// Marks a spinup in flight (or clears the mark).
    pub fn set_in_flight(&mut self, in_flight: bool) {
        self.in_flight = in_flight;
    }

    /// Suppresses the trigger until `until` (after a do-nothing selection).
    pub fn suppress_until(&mut self, until: Instant) {
        self.suppressed_until = self.suppressed_until.max(until);
    }

    /// When the active set last changed.
    pub fn changed_at(&self) -> Instant {
        self.changed_at
    }

    /// Lines 1–4 of Algorithm 2: notices a change of the Ready set.
    fn notice_changes(&mut self, now: Instant, pool: &Pool) {
        let active: Vec<ClusterId> = pool.clusters.iter().filter(|c| c.state == ClusterState::Ready).map(|c| c.id).collect();
        if active != self.active {
            self.active = active;
            self.changed_at = now;
            self.in_flight = false;
        }
    }

    fn blocked(&self, now: Instant) -> Option<&'static str> {
        if self.in_flight {
            Some("a spinup is in flight")
        } else if now < self.suppressed_until {
            Some("suppressed after a do-nothing selection")
        } else {
            None
        }
    }

    /// Algorithm 2 at `now`. `predicted` gives a running query's current
    /// predicted latency.
    pub fn evaluate(
        &mut self,
        now: Instant,
        pool: &Pool,
        windows: &ObservationWindows,
        predicted: &dyn Fn(QueryId) -> Option<Duration>,
        signal: TriggerSignal,
        config: &AutoscalerConfig,
    ) -> TriggerEvaluation {
        self.notice_changes(now, pool);
        let since = self.changed_at;
        let tightening = config.trigger_slo_tightening;
        let mut observations = 0usize;
        let mut violations = 0usize;
        if signal == TriggerSignal::ObservedAndProjected {
            for running in pool.clusters.iter().flat_map(|c| &c.running).filter(|r| r.arrival > since) {
                let latency = predicted(running.id).unwrap_or(Duration::ZERO).max(now - running.arrival);
                observations += 1;
                violations += usize::from(latency > running.slo.latency.mul_f64(tightening));
            }
        }
        for done in windows.completions().filter(|c| c.arrival > since) {
            observations += 1;
            violations += usize::from(!done.met(tightening));
        }
        let violation_rate = if observations == 0 { 0.0 } else { violations as f64 / observations as f64 };
        let (fired, reason) = if observations < config.min_observations {
            (false, format!("{observations} observations since the last change, below θ = {}", config.min_observations))
        } else if let Some(blocked) = self.blocked(now) {
            (false, blocked.to_owned())
        } else if violation_rate > config.trigger_target {
            (true, format!("violation rate {} over {observations} observations exceeds τ_trigger = {}", crate::decimal::Fixed::<3>(violation_rate), config.trigger_target))
        } else {
            (false, format!("violation rate {} within τ_trigger = {}", crate::decimal::Fixed::<3>(violation_rate), config.trigger_target))
        };
        if fired {
            self.in_flight = true;
        }
        TriggerEvaluation { at: now, observations, violation_rate: if observations < config.min_observations { 0.0 } else { violation_rate }, fired, reason }
    }

    /// Queue@N: fires with `threshold` or more queries outstanding.
    pub fn evaluate_queue(&mut self, now: Instant, pool: &Pool, threshold: usize) -> TriggerEvaluation {
        self.notice_changes(now, pool);
        let outstanding: usize = pool.clusters.iter().map(|c| c.running.len()).sum();
        let (fired, reason) = if outstanding < threshold {
            (false, format!("{outstanding} outstanding, below {threshold}"))
        } else if let Some(blocked) = self.blocked(now) {
            (false, blocked.to_owned())
        } else {
            (true, format!("{outstanding} outstanding queries, at least {threshold}"))
        };
        if fired {
            self.in_flight = true;
        }
        TriggerEvaluation { at: now, observations: outstanding, violation_rate: 0.0, fired, reason }
    }

    /// A forced trigger (the §8.5 experiment): fires once, unconditionally.
    pub fn force(&mut self, now: Instant, pool: &Pool) -> TriggerEvaluation {
        self.notice_changes(now, pool);
        self.in_flight = true;
        TriggerEvaluation { at: now, observations: 0, violation_rate: 0.0, fired: true, reason: "forced".to_owned() }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::{ClusterView, PoolId, Rpu, RunningQuery, Slo, TemplateId};
    use crate::scale::windows::CompletionRecord;

    fn cluster(id: u32, state: ClusterState, ready_s: f64, running: usize) -> ClusterView {
        ClusterView {
            id: ClusterId(id),
            size: Rpu(16),
            state,
            requested_at: Instant::ZERO,
            ready_at: Instant::from_secs_f64(ready_s),
            running: (0..running)
                .map(|i| RunningQuery {
                    id: QueryId(1_000 * u64::from(id) + i as u64),
                    template: TemplateId(1),
                    slo: Slo { latency: Duration::from_secs(10) },
                    arrival: Instant::from_secs_f64(ready_s + 1.0),
                    dispatched: Instant::from_secs_f64(ready_s + 1.0),
                })
                .collect(),
        }
    }

    fn pool(clusters: Vec<ClusterView>) -> Pool {
        Pool { id: PoolId::default(), clusters }
    }

    fn config() -> AutoscalerConfig {
        AutoscalerConfig { idle_teardown: Duration::from_secs(100), min_lifetime: Duration::from_secs(500), min_observations: 4, ..AutoscalerConfig::default() }
    }

    #[test]
    fn teardown_waits_for_idleness_and_minimum_lifetime() {
        let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 0), cluster(1, ClusterState::Ready, 0.0, 0)]);
        let mut routed = HashMap::new();
        routed.insert(ClusterId(1), Instant::from_secs_f64(450.0));
        let c = config();
        assert!(teardown_candidates(Instant::from_secs_f64(499.0), &p, &BTreeSet::new(), &routed, &c).is_empty(), "too young");
        assert_eq!(teardown_candidates(Instant::from_secs_f64(500.0), &p, &BTreeSet::new(), &routed, &c), vec![ClusterId(0)]);
        assert_eq!(teardown_eligible_at(&p.clusters[1], &routed, &c), Some(Instant::from_secs_f64(550.0)));
    }

    #[test]
    fn the_last_ready_cluster_is_kept_unless_configured() {
        let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 0), cluster(1, ClusterState::Ready, 0.0, 0)]);
        let now = Instant::from_secs_f64(10_000.0);
        assert_eq!(teardown_candidates(now, &p, &BTreeSet::new(), &HashMap::new(), &config()), vec![ClusterId(0)]);
        let all = AutoscalerConfig { keep_last_cluster: false, ..config() };
        assert_eq!(teardown_candidates(now, &p, &BTreeSet::new(), &HashMap::new(), &all), vec![ClusterId(0), ClusterId(1)]);
    }

    #[test]
    fn clusters_already_going_neither_count_nor_go_twice() {
        let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 0), cluster(1, ClusterState::Ready, 0.0, 0)]);
        let going = BTreeSet::from([ClusterId(0)]);
        let now = Instant::from_secs_f64(10_000.0);
        assert!(teardown_candidates(now, &p, &going, &HashMap::new(), &config()).is_empty(), "cluster 1 is the last one staying");
    }

    #[test]
    fn busy_clusters_are_never_torn_down() {
        let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 1), cluster(1, ClusterState::Ready, 0.0, 0)]);
        assert_eq!(teardown_candidates(Instant::from_secs_f64(10_000.0), &p, &BTreeSet::new(), &HashMap::new(), &config()), vec![ClusterId(1)]);
    }

    fn windows_with(violations: usize, met: usize, arrival_s: f64) -> ObservationWindows {
        let mut w = ObservationWindows::new(Duration::from_secs(300), 1_000);
        for i in 0..violations + met {
            let latency = if i < violations { 20.0 } else { 1.0 };
            let at = Instant::from_secs_f64(arrival_s + latency);
            w.record_completion(at, CompletionRecord {
                query: QueryId(i as u64),
                arrival: Instant::from_secs_f64(arrival_s),
                finished: at,
                slo: Slo { latency: Duration::from_secs(10) },
                completed: true,
            });
        }
        w
    }

    #[test]
    fn spinup_fires_once_then_waits_for_the_cluster_set_to_change() {
        let mut t = SpinupTrigger::default();
        let mut p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 0)]);
        let w = windows_with(3, 1, 5.0);
        let none = |_: QueryId| None;
        let now = Instant::from_secs_f64(30.0);
        // The first evaluation records the set at t = 30; the completions
        // arrived before it.
        assert!(!t.evaluate(now, &p, &w, &none, TriggerSignal::Observed, &config()).fired);
        let mut t = SpinupTrigger::default();
        t.notice_changes(Instant::ZERO, &p);
        let first = t.evaluate(now, &p, &w, &none, TriggerSignal::Observed, &config());
        assert!(first.fired, "{first:?}");
        assert!(!t.evaluate(now, &p, &w, &none, TriggerSignal::Observed, &config()).fired, "in flight");
        p.clusters.push(cluster(1, ClusterState::Ready, 30.0, 0));
        let after = t.evaluate(Instant::from_secs_f64(31.0), &p, &w, &none, TriggerSignal::Observed, &config());
        assert!(!after.fired && !t.in_flight(), "the change resets the flag; older completions no longer count");
    }

    #[test]
    fn projected_violations_of_running_queries_count() {
        let mut t = SpinupTrigger::default();
        let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 4)]);
        t.notice_changes(Instant::ZERO, &p);
        let w = ObservationWindows::new(Duration::from_secs(300), 1_000);
        let slow = |_: QueryId| Some(Duration::from_secs(60));
        let now = Instant::from_secs_f64(2.0);
        assert!(!t.clone().evaluate(now, &p, &w, &slow, TriggerSignal::Observed, &config()).fired);
        assert!(t.evaluate(now, &p, &w, &slow, TriggerSignal::ObservedAndProjected, &config()).fired);
    }

    proptest! {
        #[test]
        fn spinup_needs_theta_observations_above_target(violations in 0usize..20, met in 0usize..20, theta in 1usize..30) {
            let c = AutoscalerConfig { min_observations: theta, ..config() };
            let mut t = SpinupTrigger::default();
            let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, 0)]);
            t.notice_changes(Instant::ZERO, &p);
            let w = windows_with(violations, met, 5.0);
            let e = t.evaluate(Instant::from_secs_f64(30.0), &p, &w, &|_| None, TriggerSignal::Observed, &c);
            let n = violations + met;
            let expected = n >= theta && violations as f64 / n as f64 > c.trigger_target;
            prop_assert_eq!(e.fired, expected);
        }

        #[test]
        fn queue_trigger_counts_outstanding_queries(running in 0usize..80, threshold in 1usize..64) {
            let mut t = SpinupTrigger::default();
            let p = pool(vec![cluster(0, ClusterState::Ready, 0.0, running)]);
            prop_assert_eq!(t.evaluate_queue(Instant::from_secs_f64(5.0), &p, threshold).fired, running >= threshold);
        }
    }
}
