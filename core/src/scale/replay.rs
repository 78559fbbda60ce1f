//! The planner's replay and the spinup size selector (AutoSLO §6.3,
//! Algorithm 3).
//!
//! The replay is the **planner's** simulator: completions come from the
//! router's predictor, never from the world. It starts from the pool as
//! observed at the decision time `t_d` (the running queries, with the
//! router's current predictions for them), issues copies of the arrival
//! window back to back (copy `k` of a query that arrived at `a` arrives at
//! `a + (k + 1)·w`, at most `max_replay_copies` copies), routes each with a
//! fork of the live router, and completes each placed query when the
//! router's guarded prediction for it says so, releasing it without
//! learning.
//!
//! The selector simulates the preparation period up to `t_d + δ` once,
//! snapshots it, and from the snapshot evaluates "do nothing" and each
//! candidate size (a cluster added, or for vertical scaling a cluster that
//! replaces the others, ready at `t_d + δ`) until μ queries issued after
//! that instant have completed; outstanding ones count with their predicted
//! latency. It chooses by BestWithTarget against `target`: "do nothing"
//! wins ties, and among sizes tied for best the largest wins.
//!
//! **Escalation** (an extension of Algorithm 3). Adding one cluster per
//! trigger is slow under a heavy overload: the trigger waits for the new
//! cluster and then for θ fresh observations before it can fire again,
//! while the backlog grows. So when adding clusters, if even the best
//! candidate misses the target, the selector also replays 2, 3, … copies
//! of the best single size, up to `max_added`, stopping at the first that
//! meets it; BestWithTarget then chooses among all of them, and among equal
//! outcomes the fewest copies win. Each
//! candidate's replay also stops `horizon` after the new cluster is ready,
//! which bounds the effort when the pool is so overloaded that μ
//! completions would take hours of simulated time.
//!
//! **Saturation** (another extension). When every candidate misses every
//! SLO it measures (a cold burst the predictions call hopeless, a margin
//! that says every query misses), the violation rate no longer tells the
//! candidates apart, and BestWithTarget would always do nothing, the
//! cheapest. The selector then compares how late the measured queries are
//! on average: the candidates within [`SATURATED_LATENESS_SLACK`] of the
//! least lateness tie, and the cheapest of them wins.
//!
//! # Properties
//!
//! - (A) The selector never returns a size whose outcome does not strictly
//!   beat doing nothing under BestWithTarget; when every candidate misses
//!   every SLO, a size that is neither cheaper than doing nothing nor
//!   better than doing nothing's mean lateness by more than
//!   [`SATURATED_LATENESS_SLACK`] of the least.
//! - (B) It reads only the pool, the arrival window and a fork of the
//!   router: the live router is untouched.
//! - (C) Deterministic: the same inputs give the same choice.
//! - (D) Bounded: at most `max_replay_copies` copies of the window are
//!   issued per candidate, and none after `t_d + δ + horizon`.
//! - (E) It adds at most `max_added` clusters, tries several only when no
//!   single cluster meets the target, and never replaces with several.

use serde::{Deserialize, Serialize};

use crate::billing::{BillingConfig, BillingTimer};
use crate::model::{ClusterId, ClusterState, ClusterView, Pool, PoolId, Query, QueryId, Rpu, RunningQuery, Slo, Target};
use crate::objective::Outcome;
use crate::route::{PlanningRouter, Routing};
use crate::scale::windows::ArrivalRecord;
use crate::time::{Duration, Instant};

/// Replayed queries get ids from here up, clear of real ones.
const REPLAY_ID_BASE: u64 = 1 << 62;

/// The selector's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SelectorConfig {
    /// Candidate sizes.
    pub sizes: Vec<Rpu>,
    /// Spinup delay δ.
    pub spinup_delay: Duration,
    /// The arrival window's width w.
    pub window: Duration,
    /// Completions after the new cluster is ready to simulate (μ).
    pub completions: usize,
    /// At most this many copies of the window.
    pub max_replay_copies: usize,
    /// The replay stops at most this long after the new cluster is ready,
    /// even short of μ completions (outstanding queries then count with
    /// their predictions): it bounds the effort under overload.
    pub horizon: Duration,
    /// τ_target for BestWithTarget.
    pub target: f64,
    /// Clusters one selection may add at most. When no single cluster gets
    /// under the target, the selector also tries 2, 3, … copies of the best
    /// single size, up to this many (1: Algorithm 3's single cluster).
    pub max_added: usize,
    /// Threads the candidates' replays run on (1: the caller's thread).
    pub threads: usize,
    /// Billing terms for the cost estimate.
    pub billing: BillingConfig,
}

/// What the selector considers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectorMode {
    /// Add one cluster next to the existing ones.
    AddCluster,
    /// One new cluster replaces the existing ones once ready (vertical).
    Replace,
}

/// One candidate's simulated outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CandidateOutcome {
    /// The size added (or replacing), `None` for doing nothing.
    pub size: Option<Rpu>,
    /// How many clusters of `size` are added (1 but for the escalation
    /// candidates; 0 for doing nothing).
    pub copies: usize,
    /// Simulated violation rate among queries issued after `t_d + δ`.
    pub violation_rate: f64,
    /// Simulated cost from `t_d` until the replay ends and its clusters
    /// drain, dollars.
    pub cost_usd: f64,
    /// Queries issued after `t_d + δ` that completed in the replay.
    pub completed: usize,
    /// Those still outstanding at the end (counted with predictions).
    pub outstanding: usize,
    /// How late the measured queries that miss their SLO are, in all
    /// (outstanding ones by their predicted end; a query the router
    /// rejects adds nothing), seconds.
    #[serde(default)]
    pub lateness_s: f64,
}

impl CandidateOutcome {
    /// How late a measured query is on average (0 for those that meet
    /// their SLO), seconds.
    pub fn mean_lateness_s(&self) -> f64 {
        self.lateness_s / (self.completed + self.outstanding).max(1) as f64
    }
}

/// When every candidate misses every SLO, those whose mean lateness is
/// within this share above the least are tied, and the cheapest of them
/// wins: a spinup must cut the lateness by about a tenth to be paid for.
pub const SATURATED_LATENESS_SLACK: f64 = 0.1;

/// The selector's answer, with every candidate for the decision record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// Every candidate, "do nothing" first.
    pub candidates: Vec<CandidateOutcome>,
    /// The size to spin up, or `None` to do nothing.
    pub choice: Option<Rpu>,
    /// How many clusters of that size (0 with no choice).
    pub copies: usize,
    /// Replayed arrivals over all candidates (a measure of effort).
    pub replayed_arrivals: usize,
}

#[derive(Clone, Copy, Debug)]
struct Placed {
    id: QueryId,
    arrival: Instant,
    slo: Slo,
    measured: bool,
}

/// One replay in progress (also [`super::scale_in`]'s).
pub(super) struct Replay<'a> {
    now: Instant,
    router: Box<dyn PlanningRouter>,
    pool: Pool,
    ready_at: Vec<Instant>,
    billing: Vec<BillingTimer>,
    /// Per cluster (pool order), the queries placed there.
    placed: Vec<Vec<Placed>>,
    /// Per cluster, its earliest predicted completion, refreshed whenever
    /// the cluster changes.
    earliest: Vec<Option<(Instant, QueryId)>>,
    window: &'a [ArrivalRecord],
    window_width: Duration,
    copy: usize,
    position: usize,
    max_copies: usize,
    next_id: u64,
    measure_from: Instant,
    replace_others_at: Option<usize>,
    completed: usize,
    violations: usize,
    lateness_s: f64,
    pub(super) arrivals: usize,
    /// Offloads to the elastic tier: `(predicted end, query)` and their
    /// placement.
    offloaded: Vec<(Instant, QueryId, Placed)>,
    elastic_cost_usd: f64,
}

enum Event {
    Completion(usize),
    Offload(usize),
    Ready(usize),
    Arrival,
}

impl<'a> Replay<'a> {
    /// A replay of `window` from the pool as it is at `now`, counting the
    /// queries that arrive from `measure_from` on.
    pub(super) fn start(now: Instant, measure_from: Instant, pool: &Pool, router: &dyn PlanningRouter, window: &'a [ArrivalRecord], config: &SelectorConfig) -> Self {
        let mut billing = Vec::new();
        let mut placed = Vec::new();
        let mut ready_at = Vec::new();
        for cluster in &pool.clusters {
            let mut timer = BillingTimer::new(config.billing.clone(), cluster.size);
            let mut here = Vec::new();
            // Queries the router did not place have no prediction to
            // complete by; the replay leaves them out.
            for running in cluster.running.iter().filter(|r| router.predicted_latency(r.id).is_some()) {
                timer.handle_query_start(now);
                here.push(Placed { id: running.id, arrival: running.arrival, slo: running.slo, measured: false });
            }
            placed.push(here);
            billing.push(timer);
            ready_at.push(cluster.ready_at);
        }
        let clusters = pool.clusters.len();
        let mut replay = Replay {
            now,
            router: router.fork(),
            pool: pool.clone(),
            ready_at,
            billing,
            placed,
            earliest: vec![None; clusters],
            window,
            window_width: config.window,
            copy: 0,
            position: 0,
            max_copies: config.max_replay_copies,
            next_id: REPLAY_ID_BASE,
            measure_from,
            replace_others_at: None,
            completed: 0,
            violations: 0,
            lateness_s: 0.0,
            arrivals: 0,
            offloaded: Vec::new(),
            elastic_cost_usd: 0.0,
        };
        for cluster in 0..clusters {
            replay.refresh(cluster);
        }
        replay
    }

    /// Re-reads the router's earliest predicted completion on a cluster.
    fn refresh(&mut self, cluster: usize) {
        let now = self.now;
        self.earliest[cluster] = self.router.earliest_completion(self.pool.clusters[cluster].id).map(|(at, id)| (at.max(now), id));
    }

    pub(super) fn fork(&self) -> Replay<'a> {
        Replay {
            now: self.now,
            router: self.router.fork(),
            pool: self.pool.clone(),
            ready_at: self.ready_at.clone(),
            billing: self.billing.clone(),
            placed: self.placed.clone(),
            earliest: self.earliest.clone(),
            window: self.window,
            window_width: self.window_width,
            copy: self.copy,
            position: self.position,
            max_copies: self.max_copies,
            next_id: self.next_id,
            measure_from: self.measure_from,
            replace_others_at: self.replace_others_at,
            completed: self.completed,
            violations: self.violations,
            lateness_s: self.lateness_s,
            arrivals: self.arrivals,
            offloaded: self.offloaded.clone(),
            elastic_cost_usd: self.elastic_cost_usd,
        }
    }

    fn next_arrival_at(&self) -> Option<Instant> {
        if self.copy >= self.max_copies {
            return None;
        }
        let record = self.window.get(self.position)?;
        Some(record.arrival + self.window_width.mul_f64((self.copy + 1) as f64))
    }

    /// The next event: completions, then clusters becoming ready, then
    /// arrivals at equal instants.
    fn next_event(&self) -> Option<(Instant, Event)> {
        let completion = self
            .earliest
            .iter()
            .enumerate()
            .filter_map(|(cluster, earliest)| earliest.map(|(at, id)| (at, id, cluster)))
            .min()
            .map(|(at, _, cluster)| (at, Event::Completion(cluster)));
        let ready = self
            .pool
            .clusters
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state == ClusterState::Starting)
            .map(|(i, _)| (self.ready_at[i].max(self.now), i))
            .min()
            .map(|(at, i)| (at, Event::Ready(i)));
        let arrival = self.next_arrival_at().map(|at| (at.max(self.now), Event::Arrival));
        let offload = self.offloaded.iter().enumerate().map(|(i, (end, id, _))| (*end, *id, i)).min().map(|(at, _, i)| (at, Event::Offload(i)));
        [completion, offload, ready, arrival].into_iter().flatten().min_by_key(|(at, event)| {
            (
                *at,
                match event {
                    Event::Completion(_) | Event::Offload(_) => 0,
                    Event::Ready(_) => 1,
                    Event::Arrival => 2,
                },
            )
        })
    }

    /// Runs events strictly before `until`, or until `stop` holds.
    pub(super) fn run(&mut self, until: Instant, stop: &dyn Fn(&Replay<'_>) -> bool) {
        while !stop(self) {
            let Some((at, event)) = self.next_event() else { return };
            if at >= until {
                return;
            }
            self.now = at;
            match event {
                Event::Completion(index) => self.complete(index),
                Event::Offload(index) => {
                    let (_, id, placed) = self.offloaded.swap_remove(index);
                    if placed.measured {
                        self.count(placed, self.now - placed.arrival);
                    }
                    self.router.release(self.now, id);
                }
                Event::Ready(index) => self.make_ready(index),
                Event::Arrival => self.arrive(),
            }
        }
    }

    /// Completes the earliest query on `cluster`.
    fn complete(&mut self, cluster: usize) {
        let (_, id) = self.earliest[cluster].expect("a completion event has a query");
        let index = self.placed[cluster].iter().position(|p| p.id == id).expect("the router predicts only placed queries");
        let placed = self.placed[cluster].swap_remove(index);
        if placed.measured {
            self.count(placed, self.now - placed.arrival);
        }
        self.router.release(self.now, placed.id);
        self.billing[cluster].handle_query_end(self.now);
        let running = &mut self.pool.clusters[cluster].running;
        if let Some(position) = running.iter().position(|r| r.id == placed.id) {
            running.swap_remove(position);
        }
        self.refresh(cluster);
    }

    /// Counts a measured query that completed after `latency`.
    fn count(&mut self, placed: Placed, latency: Duration) {
        self.completed += 1;
        if !placed.slo.is_met_by(latency) {
            self.violations += 1;
            self.lateness_s += (latency - placed.slo.latency).as_secs_f64();
        }
    }

    fn make_ready(&mut self, index: usize) {
        self.pool.clusters[index].state = ClusterState::Ready;
        if self.replace_others_at == Some(index) {
            for (other, cluster) in self.pool.clusters.iter_mut().enumerate() {
                if other != index && matches!(cluster.state, ClusterState::Ready | ClusterState::Starting) {
                    cluster.state = ClusterState::Draining;
                }
            }
        }
    }

    fn arrive(&mut self) {
        let record = &self.window[self.position];
        let query = Query {
            id: QueryId(self.next_id),
            pool: self.pool.id.clone(),
            template: record.template,
            slo: record.slo,
            arrival: self.now,
        };
        self.next_id += 1;
        self.position += 1;
        if self.position == self.window.len() {
            self.position = 0;
            self.copy += 1;
        }
        self.arrivals += 1;
        let measured = self.now >= self.measure_from;
        let target = match self.router.route(self.now, &query, &self.pool) {
            Routing::Dispatch(decision) => match decision.target {
                Target::Cluster(id) => self.pool.clusters.iter().position(|c| c.id == id),
                Target::Elastic => {
                    // The tier runs it alone: it completes when predicted,
                    // and bills what the router estimated.
                    let predicted = decision.predicted_latency.unwrap_or(Duration::ZERO);
                    let placed = Placed { id: query.id, arrival: query.arrival, slo: query.slo, measured };
                    self.offloaded.push((self.now + predicted, query.id, placed));
                    self.elastic_cost_usd += self.router.elastic_cost_estimate_usd(predicted);
                    return;
                }
            },
            Routing::Reject { .. } => None,
        };
        let Some(cluster) = target else {
            if measured {
                self.completed += 1;
                self.violations += 1;
            }
            return;
        };
        self.billing[cluster].handle_query_start(self.now);
        self.pool.clusters[cluster].running.push(RunningQuery {
            id: query.id,
            template: query.template,
            slo: query.slo,
            arrival: query.arrival,
            dispatched: self.now,
        });
        self.placed[cluster].push(Placed { id: query.id, arrival: query.arrival, slo: query.slo, measured });
        self.refresh(cluster);
    }

    /// Routes nothing more to `cluster`; its running queries finish.
    pub(super) fn drain(&mut self, cluster: ClusterId) {
        if let Some(view) = self.pool.clusters.iter_mut().find(|c| c.id == cluster) {
            view.state = ClusterState::Draining;
        }
    }

    pub(super) fn add_cluster(&mut self, size: Rpu, ready_at: Instant, replace: bool) {
        let id = ClusterId(self.pool.clusters.iter().map(|c| c.id.0 + 1).max().unwrap_or(0));
        self.pool.clusters.push(ClusterView { id, size, state: ClusterState::Starting, requested_at: self.now, ready_at, running: Vec::new() });
        self.ready_at.push(ready_at);
        self.billing.push(BillingTimer::new(self.billing_config(), size));
        self.placed.push(Vec::new());
        self.earliest.push(None);
        if replace {
            self.replace_others_at = Some(self.pool.clusters.len() - 1);
        }
    }

    fn billing_config(&self) -> BillingConfig {
        self.billing.first().map(|b| b.config().clone()).unwrap_or_default()
    }

    pub(super) fn outcome(&self, size: Option<Rpu>, copies: usize) -> CandidateOutcome {
        let mut violations = self.violations;
        let mut lateness_s = self.lateness_s;
        let mut outstanding = 0;
        let mut count_outstanding = |placed: &Placed, end: Instant| {
            outstanding += 1;
            let latency = end - placed.arrival;
            if !placed.slo.is_met_by(latency) {
                violations += 1;
                lateness_s += (latency - placed.slo.latency).as_secs_f64();
            }
        };
        let mut drain: Vec<Instant> = vec![self.now; self.pool.clusters.len()];
        for (cluster, here) in self.placed.iter().enumerate() {
            let predicted: std::collections::HashMap<QueryId, Duration> =
                self.router.predicted_latencies(self.pool.clusters[cluster].id).into_iter().collect();
            for placed in here {
                let end = (placed.arrival + predicted.get(&placed.id).copied().unwrap_or(Duration::ZERO)).max(self.now);
                drain[cluster] = drain[cluster].max(end);
                if placed.measured {
                    count_outstanding(placed, end);
                }
            }
        }
        for (end, _, placed) in &self.offloaded {
            if placed.measured {
                count_outstanding(placed, *end);
            }
        }
        let measured = self.completed + outstanding;
        let cost_usd = self.elastic_cost_usd
            + self.billing.iter().zip(&drain).map(|(b, d)| b.cost_usd(self.now) + b.cost_until_drained_usd(self.now, *d)).sum::<f64>();
        CandidateOutcome {
            size,
            copies,
            violation_rate: if measured == 0 { 0.0 } else { violations as f64 / measured as f64 },
            cost_usd,
            completed: self.completed,
            outstanding,
            lateness_s,
        }
    }
}

/// Algorithm 3: the size to spin up at `now`, or `None` for doing nothing.
pub fn select_spinup_size(
    now: Instant,
    pool: &Pool,
    router: &dyn PlanningRouter,
    window: &[ArrivalRecord],
    config: &SelectorConfig,
    mode: SelectorMode,
) -> Selection {
    let available = now + config.spinup_delay;
    let mut preparation = Replay::start(now, available, pool, router, window, config);
    preparation.run(available, &|_| false);
    preparation.now = preparation.now.max(now);

    let options: Vec<(Option<Rpu>, usize)> = std::iter::once((None, 0)).chain(config.sizes.iter().map(|s| (Some(*s), 1))).collect();
    let evaluate = |(size, copies): (Option<Rpu>, usize), mut replay: Replay<'_>| {
        if let Some(size) = size {
            for _ in 0..copies {
                replay.add_cluster(size, available, mode == SelectorMode::Replace);
            }
        }
        let mu = config.completions.max(1);
        replay.run(available + config.horizon, &|r| r.completed >= mu);
        (replay.outcome(size, copies), replay.arrivals)
    };
    let mut candidates = evaluate_all(&options, &preparation, config.threads, &evaluate);
    // Escalation: while the best candidate so far misses the target, try
    // one more copy of the best single size.
    if mode == SelectorMode::AddCluster {
        let best_single = best_index(&candidates, config.target).and_then(|i| candidates[i].0.size);
        let mut copies = 1;
        while let Some(size) = best_single.filter(|_| copies < config.max_added) {
            let best = best_index(&candidates, config.target).expect("candidates are listed");
            if candidates[best].0.violation_rate <= config.target {
                break;
            }
            copies += 1;
            candidates.extend(evaluate_all(&[(Some(size), copies)], &preparation, 1, &evaluate));
        }
    }
    let replayed_arrivals = candidates.iter().map(|(_, arrivals)| arrivals).sum();
    let candidates: Vec<CandidateOutcome> = candidates.into_iter().map(|(outcome, _)| outcome).collect();
    let (choice, copies) = choose(&candidates, config.target);
    Selection { candidates, choice, copies, replayed_arrivals }
}

/// The index of the best candidate (see [`best_position`]).
fn best_index(candidates: &[(CandidateOutcome, usize)], target: f64) -> Option<usize> {
    let all: Vec<&CandidateOutcome> = candidates.iter().map(|(c, _)| c).collect();
    best_position(&all, target)
}

/// Evaluates each option on a fork of `preparation`, on `threads` threads,
/// in option order (so the result does not depend on the thread count).
pub(super) fn evaluate_all<'a, T, R, F>(options: &[T], preparation: &Replay<'a>, threads: usize, evaluate: &F) -> Vec<R>
where
    T: Copy + Send,
    R: Send,
    F: Fn(T, Replay<'a>) -> R + Sync,
{
    // The candidates are independent replays from the same snapshot: they
    // run on `config.threads` threads, and come back in candidate order, so
    // the choice does not depend on the thread count.
    let forks: Vec<(T, Replay<'a>)> = options.iter().map(|option| (*option, preparation.fork())).collect();
    let threads = threads.clamp(1, forks.len().max(1));
    let mut results: Vec<R> = Vec::with_capacity(forks.len());
    if threads == 1 {
        results.extend(forks.into_iter().map(|(option, replay)| evaluate(option, replay)));
    } else {
        let mut chunks: Vec<Vec<(T, Replay<'a>)>> = (0..threads).map(|_| Vec::new()).collect();
        for (index, fork) in forks.into_iter().enumerate() {
            chunks[index % threads].push(fork);
        }
        let mut by_chunk: Vec<Vec<R>> = std::thread::scope(|scope| {
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|chunk| scope.spawn(|| chunk.into_iter().map(|(option, replay)| evaluate(option, replay)).collect::<Vec<_>>()))
                .collect();
            handles.into_iter().map(|h| h.join().expect("a candidate's replay does not panic")).collect()
        });
        // Undo the round-robin split.
        let mut iterators: Vec<_> = by_chunk.iter_mut().map(|c| c.drain(..)).collect();
        for index in 0..options.len() {
            results.push(iterators[index % threads].next().expect("one result per candidate"));
        }
    }
    results
}

/// "Do nothing" (the first candidate) unless a size strictly beats it; the
/// largest among the sizes tied for best, with the fewest copies. When
/// every candidate misses every SLO, by lateness instead (see
/// [`best_position`]).
fn choose(candidates: &[CandidateOutcome], target: f64) -> (Option<Rpu>, usize) {
    let all: Vec<&CandidateOutcome> = candidates.iter().collect();
    let Some(best) = best_position(&all, target) else { return (None, 0) };
    if saturated(&all) {
        return (candidates[best].size, candidates[best].copies);
    }
    let outcome = |c: &CandidateOutcome| Outcome { violations: c.violation_rate, cost_usd: c.cost_usd };
    let best = outcome(&candidates[best]);
    if outcome(&candidates[0]).cmp_with_target(&best, target).is_eq() {
        return (None, 0);
    }
    candidates
        .iter()
        .filter(|c| c.size.is_some() && outcome(c).cmp_with_target(&best, target).is_eq())
        .max_by_key(|c| (c.size, std::cmp::Reverse(c.copies)))
        .map_or((None, 0), |c| (c.size, c.copies))
}

/// Whether every candidate misses every SLO it measures: the violation
/// rate then tells them apart no more.
fn saturated(candidates: &[&CandidateOutcome]) -> bool {
    !candidates.is_empty() && candidates.iter().all(|c| c.violation_rate >= 1.0)
}

/// The best candidate's position: under BestWithTarget, or, when the
/// replay is saturated, the cheapest of those whose mean lateness is
/// within [`SATURATED_LATENESS_SLACK`] of the least (so a size must make
/// the misses clearly less late than doing nothing, the cheapest, to be
/// chosen; the first listed on ties).
fn best_position(candidates: &[&CandidateOutcome], target: f64) -> Option<usize> {
    // Saturated, it is BestWithTarget again, on mean lateness with the
    // target just above the least.
    let (outcomes, target): (Vec<Outcome>, f64) = if saturated(candidates) {
        let lateness: Vec<Outcome> = candidates.iter().map(|c| Outcome { violations: c.mean_lateness_s(), cost_usd: c.cost_usd }).collect();
        let least = lateness.iter().map(|o| o.violations).fold(f64::INFINITY, f64::min);
        (lateness, least * (1.0 + SATURATED_LATENESS_SLACK))
    } else {
        (candidates.iter().map(|c| Outcome { violations: c.violation_rate, cost_usd: c.cost_usd }).collect(), target)
    };
    crate::objective::best_with_target(&outcomes, target)
}

/// An empty pool with one ready cluster per size: a helper for tests and
/// benchmarks that need a fleet.
pub fn pool_of(sizes: &[Rpu]) -> Pool {
    Pool {
        id: PoolId::default(),
        clusters: sizes
            .iter()
            .enumerate()
            .map(|(i, size)| ClusterView {
                id: ClusterId(i as u32),
                size: *size,
                state: ClusterState::Ready,
                requested_at: Instant::ZERO,
                ready_at: Instant::ZERO,
                running: Vec::new(),
            })
            .collect(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::model::TemplateId;
    use crate::predict::{ConcurrencyAware, LatencyPredictor, Observation};
    use crate::predict::concurrency::ConcurrencyConfig;
    use crate::route::RoutingPolicy;
    use crate::route::slo::SloRouter;

    /// A predictor taught a simple law: 20 s isolated at 16 RPU, scaling
    /// inversely with size, stretched by (1 + neighbours / 4).
    fn router() -> SloRouter<ConcurrencyAware> {
        router_with_slowdown(|size| 16.0 / size)
    }

    /// A predictor taught 20 s isolated at 16 RPU, times `slowdown(size)`,
    /// stretched by (1 + neighbours / 4), for template 1 on 4 to 32 RPU.
    pub(in crate::scale) fn router_with_slowdown(slowdown: impl Fn(f64) -> f64) -> SloRouter<ConcurrencyAware> {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for round in 0..4 {
            for size in [4u32, 8, 16, 32] {
                for n in [0u32, 1, 2, 4, 8, 16, 32] {
                    let latency = 20.0 * slowdown(f64::from(size)) * (1.0 + f64::from(n) / 4.0) * (1.0 + 0.01 * f64::from(round));
                    p.observe(&Observation { template: TemplateId(1), size: Rpu(size), neighbours: n, latency: Duration::from_secs_f64(latency), censored: false });
                }
            }
        }
        p.fit();
        SloRouter::new("slogate", p, BillingConfig::default())
    }

    /// `rate_per_s` template-1 arrivals with `slo_s` SLOs over the 300 s
    /// before t = 1,000 s.
    pub(in crate::scale) fn window(rate_per_s: f64, slo_s: f64) -> Vec<ArrivalRecord> {
        let count = (300.0 * rate_per_s).round() as u64;
        (0..count)
            .map(|i| ArrivalRecord {
                query: QueryId(i),
                template: TemplateId(1),
                slo: Slo { latency: Duration::from_secs_f64(slo_s) },
                arrival: Instant::from_secs_f64(1_000.0 - 300.0 + i as f64 / rate_per_s),
            })
            .collect()
    }

    fn config() -> SelectorConfig {
        let knobs = crate::scale::AutoscalerConfig { sizes: vec![Rpu(8), Rpu(16), Rpu(32)], ..crate::scale::AutoscalerConfig::default() };
        knobs.selector_config(BillingConfig::default())
    }

    #[test]
    fn an_overloaded_cluster_gets_help() {
        let r = router();
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(8)]), &r, &window(0.2, 60.0), &config(), SelectorMode::AddCluster);
        let nothing = &selection.candidates[0];
        assert!(nothing.violation_rate > 0.5, "{selection:?}");
        let chosen = selection.choice.expect("a spinup helps");
        let chosen_outcome = selection.candidates.iter().find(|c| c.size == Some(chosen)).expect("listed");
        assert!(chosen_outcome.violation_rate < nothing.violation_rate, "{selection:?}");
    }

    #[test]
    fn a_router_that_knows_it_under_predicts_still_finds_the_help() {
        // Its margin learned that queries take ten times the prediction:
        // at the decision quantile, every query misses everywhere.
        let mut r = router();
        let slow: Vec<Observation> = (0..64)
            .map(|n| Observation { template: TemplateId(1), size: Rpu(16), neighbours: n % 4, latency: Duration::from_secs_f64(200.0 * (1.0 + f64::from(n % 4) / 4.0)), censored: false })
            .collect();
        r.warm_margin(&slow);
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(8)]), &r, &window(0.2, 60.0), &config(), SelectorMode::AddCluster);
        let nothing = &selection.candidates[0];
        let chosen = selection.choice.unwrap_or_else(|| panic!("a spinup helps: {selection:?}"));
        let chosen_outcome = selection.candidates.iter().find(|c| c.size == Some(chosen)).expect("listed");
        assert!(chosen_outcome.violation_rate < nothing.violation_rate, "{selection:?}");
    }

    #[test]
    fn a_pool_where_every_query_misses_anyway_still_gets_help_against_lateness() {
        // 1 s SLOs on 20 s queries: every placement misses, so only how
        // late they are tells the candidates apart.
        let r = router();
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(8)]), &r, &window(0.2, 1.0), &config(), SelectorMode::AddCluster);
        assert!(selection.candidates.iter().all(|c| c.violation_rate >= 1.0), "saturated: {selection:?}");
        let chosen = selection.choice.unwrap_or_else(|| panic!("a spinup cuts the lateness: {selection:?}"));
        let chosen_outcome = selection.candidates.iter().find(|c| c.size == Some(chosen) && c.copies == selection.copies).expect("listed");
        assert!(chosen_outcome.mean_lateness_s() < selection.candidates[0].mean_lateness_s() / (1.0 + SATURATED_LATENESS_SLACK), "{selection:?}");
    }

    #[test]
    fn a_pool_where_every_query_misses_by_the_same_either_way_does_nothing() {
        // A trickle with 1 s SLOs: each query runs alone and misses by the
        // same wherever it goes, so a spinup buys nothing.
        let r = router();
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(32)]), &r, &window(0.002, 1.0), &config(), SelectorMode::AddCluster);
        assert!(selection.candidates.iter().all(|c| c.violation_rate >= 1.0), "saturated: {selection:?}");
        assert_eq!(selection.choice, None, "{selection:?}");
    }

    #[test]
    fn an_overload_no_single_cluster_fixes_gets_several_clusters_at_once() {
        let r = router();
        let (pool, window) = (pool_of(&[Rpu(8)]), window(1.0, 60.0));
        let at = Instant::from_secs_f64(1_000.0);
        let single = select_spinup_size(at, &pool, &r, &window, &SelectorConfig { max_added: 1, ..config() }, SelectorMode::AddCluster);
        assert!(single.candidates.iter().all(|c| c.violation_rate > config().target), "no single cluster meets the target: {single:?}");
        assert_eq!(single.copies, 1, "{single:?}");
        let several = select_spinup_size(at, &pool, &r, &window, &SelectorConfig { max_added: 3, ..config() }, SelectorMode::AddCluster);
        assert!(several.copies >= 2, "{several:?}");
        let chosen = several.candidates.iter().find(|c| c.size == several.choice && c.copies == several.copies).expect("listed");
        let best_single = single.candidates.iter().map(|c| c.violation_rate).fold(f64::INFINITY, f64::min);
        assert!(chosen.violation_rate < best_single, "{several:?}");
        assert!(several.candidates.iter().all(|c| c.copies <= 3));
    }

    #[test]
    fn a_quiet_pool_on_the_cheapest_size_does_nothing() {
        let r = router();
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(8)]), &r, &window(0.01, 600.0), &config(), SelectorMode::AddCluster);
        assert_eq!(selection.choice, None, "{selection:?}");
    }

    #[test]
    fn a_cheaper_cluster_is_added_when_it_meets_the_slos_for_less() {
        // Usage-based billing: an idle cluster costs nothing, so a small
        // cluster that meets loose SLOs undercuts a big one.
        let r = router();
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(32)]), &r, &window(0.01, 600.0), &config(), SelectorMode::AddCluster);
        assert_eq!(selection.choice, Some(Rpu(8)), "{selection:?}");
        assert!(selection.candidates[1].cost_usd < selection.candidates[0].cost_usd);
    }

    #[test]
    fn the_live_router_is_untouched() {
        let r = router();
        let before = r.clone();
        let _ = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(8)]), &r, &window(0.5, 60.0), &config(), SelectorMode::AddCluster);
        assert_eq!(format!("{:?}", r.last_scores()), format!("{:?}", before.last_scores()));
        assert_eq!(r.predicted_latency(QueryId(REPLAY_ID_BASE)), None);
    }

    #[test]
    fn the_choice_does_not_depend_on_the_thread_count() {
        let r = router();
        let run = |threads| {
            let c = SelectorConfig { threads, ..config() };
            select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(8)]), &r, &window(0.2, 60.0), &c, SelectorMode::AddCluster)
        };
        let one = run(1);
        assert_eq!(one, run(2));
        assert_eq!(one, run(3));
    }

    #[test]
    fn replay_copies_are_capped() {
        let r = router();
        let c = SelectorConfig { max_replay_copies: 2, completions: 10_000, ..config() };
        let w = window(0.1, 60.0);
        let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(16)]), &r, &w, &c, SelectorMode::AddCluster);
        assert!(selection.replayed_arrivals <= 2 * w.len() * selection.candidates.len(), "{}", selection.replayed_arrivals);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn a_spinup_is_chosen_only_if_it_strictly_beats_doing_nothing(
            rate in 0.005f64..0.4,
            slo_s in 10.0f64..400.0,
            start in prop::sample::select(vec![4u32, 8, 16]),
            replace in any::<bool>(),
            max_added in 1usize..4,
        ) {
            let r = router();
            let mode = if replace { SelectorMode::Replace } else { SelectorMode::AddCluster };
            let c = SelectorConfig { max_added, ..config() };
            let selection = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(start)]), &r, &window(rate, slo_s), &c, mode);
            let again = select_spinup_size(Instant::from_secs_f64(1_000.0), &pool_of(&[Rpu(start)]), &r, &window(rate, slo_s), &c, mode);
            prop_assert_eq!(&selection, &again, "deterministic");
            if let Some(size) = selection.choice {
                let chosen = selection.candidates.iter().find(|c| c.size == Some(size) && c.copies == selection.copies).expect("listed");
                let nothing = &selection.candidates[0];
                if selection.candidates.iter().all(|c| c.violation_rate >= 1.0) {
                    let least = selection.candidates.iter().map(CandidateOutcome::mean_lateness_s).fold(f64::INFINITY, f64::min);
                    prop_assert!(chosen.cost_usd < nothing.cost_usd || nothing.mean_lateness_s() > least * (1.0 + SATURATED_LATENESS_SLACK), "{:?}", selection);
                    prop_assert!(chosen.mean_lateness_s() <= least * (1.0 + SATURATED_LATENESS_SLACK), "{:?}", selection);
                } else {
                    let outcome = |c: &CandidateOutcome| Outcome { violations: c.violation_rate, cost_usd: c.cost_usd };
                    prop_assert!(outcome(chosen).cmp_with_target(&outcome(nothing), c.target).is_lt(), "{:?}", selection);
                }
            }
            prop_assert!(selection.copies <= max_added, "{:?}", selection);
            let several = selection.candidates.iter().any(|cand| cand.copies > 1);
            prop_assert!(!several || mode == SelectorMode::AddCluster, "a replacement is one cluster: {:?}", selection);
            let single_meets = selection.candidates.iter().any(|cand| cand.copies <= 1 && cand.violation_rate <= c.target);
            prop_assert!(!(several && single_meets), "several clusters are tried only when no single one meets the target: {:?}", selection);
        }
    }
}
