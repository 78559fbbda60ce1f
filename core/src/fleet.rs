//! Request-level services (Spandana's setting): a fleet of provisioned
//! instances, each a FIFO queue in front of a few workers, and the elastic
//! tier, in virtual time. It is built for millions of requests: with FIFO
//! service a request's start and finish are known when it is dispatched,
//! so the engine needs no event per request, only a heap of running
//! offloads (to keep the tier's warm pool right) and the control loop's
//! ticks.
//!
//! A [`FleetPolicy`] combines three choices, which together express every
//! policy of Spandana's evaluation and slogate's own:
//!
//! - [`Dispatch`]: which instance a request goes to (round-robin, as a
//!   Kubernetes service does, or least-loaded, as a central balancer);
//! - [`Offload`]: when it goes to the elastic tier instead (never; when the
//!   instance's bounded queue is full, Spandana's SLO Director; when the
//!   instance's served rate this second passes a fixed share of its
//!   capacity, Libra-style; or when its predicted latency on the instance,
//!   from what an operator sees (idle workers, queue length), exceeds a
//!   margin of the SLO and the tier's warm latency meets it, slogate);
//! - [`Scaling`]: how many instances run (fixed; Kubernetes' HPA on a
//!   utilisation target with its scale-down stabilisation window; or
//!   Spandana's SRO cost minimiser over the recent per-second load).
//!
//! The fleet is **ground truth**: service times carry lognormal noise the
//! policies do not see. The policies see queue lengths, the configured
//! idle service time, and their own observations.
//!
//! # Properties
//!
//! - (A) Every request gets exactly one outcome, on an instance or the
//!   elastic tier.
//! - (B) An instance serves its requests in arrival order, at most
//!   `workers_per_instance` at once.
//! - (C) A run is a pure function of its inputs and seed.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::elastic::{ElasticConfig, ElasticPool, ProvisionedBilling};
use crate::model::QueryId;
use crate::scale::sro::{SroConfig, optimise_instances};
use crate::stats::percentile;
use crate::time::{Duration, Instant};
use crate::stats::noise_factor;

/// How often slogate's margin adapts.
const MARGIN_WINDOW: Duration = Duration::from_secs(10);

/// The service and its platform.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetConfig {
    /// One request's latency on an idle instance.
    pub service_time: Duration,
    /// σ of the lognormal noise on each request's service time.
    pub noise_sigma: f64,
    /// Requests one instance serves at once.
    pub workers_per_instance: u32,
    /// From an instance's request to its first request.
    pub startup_delay: Duration,
    /// Instances at the start (ready).
    pub initial_instances: u32,
    /// Instances at most.
    pub max_instances: u32,
    /// Per-instance billing (EC2-like).
    pub billing: ProvisionedBilling,
    /// The elastic tier, priced per request.
    pub elastic: ElasticConfig,
    /// The latency SLO of every request.
    pub slo: Duration,
    /// Seeds the noise.
    pub seed: u64,
}

impl FleetConfig {
    /// Spandana's setting for a service with idle latency `service_time`:
    /// SLO 10×, m5a.large instances ($0.086 per hour, 2 workers, 60 s to
    /// start), Lambda at 1 GB with 250 ms cold starts and the same speed.
    pub fn spandana(service_time: Duration, initial_instances: u32, seed: u64) -> Self {
        FleetConfig {
            service_time,
            noise_sigma: 0.3,
            workers_per_instance: 2,
            startup_delay: Duration::from_secs(60),
            initial_instances,
            max_instances: 1_000,
            billing: ProvisionedBilling { price_per_hour_usd: 0.086, minimum: Duration::from_secs(60) },
            elastic: ElasticConfig {
                cold_start: Duration::from_millis(250),
                keep_alive: Duration::from_secs(600),
                speed_factor: 1.0,
                concurrency_limit: 1_000,
                workers_per_query: 1,
                memory_mb: 1_024,
                ..ElasticConfig::default()
            },
            slo: service_time.mul_f64(10.0),
            seed,
        }
    }

    /// Requests per second one instance serves at full utilisation.
    pub fn capacity_rps(&self) -> f64 {
        f64::from(self.workers_per_instance) / self.service_time.as_secs_f64()
    }
}

/// Which instance takes a request.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Dispatch {
    /// In turn.
    RoundRobin,
    /// The one whose next free worker frees first.
    LeastLoaded,
}

/// When a request goes to the elastic tier.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Offload {
    /// Never.
    Never,
    /// When the chosen instance already has this many requests waiting
    /// (Spandana's SLO Director).
    QueueBound {
        /// The bound.
        max_waiting: u32,
        /// The director's pacing (its leaky bucket), if it paces.
        pacing: Option<Pacing>,
    },
    /// When the chosen instance has served this share of its capacity in
    /// the current second (Libra-style fixed ratio).
    RateShare {
        /// The share, e.g. 0.8.
        share: f64,
    },
    /// When the request's predicted latency on the instance (its queue's
    /// wait plus the idle service time) exceeds `margin` of the SLO and the
    /// tier's warm latency meets it (slogate). The margin leaves room for
    /// the service-time noise the prediction does not see.
    PredictedSlo {
        /// Share of the SLO a request may be predicted to take (the start,
        /// if `budget` adapts it).
        margin: f64,
        /// The violation budget to spend: every 10 s the margin moves by
        /// the violations observed (at completion) in the last 10 s, up by
        /// 0.01 while they stay under a quarter of the budget, down by 0.05
        /// once they pass half of it, within [0.5, 1].
        budget: Option<f64>,
    },
}

/// The SLO Director's pacing (Spandana §6.2): it forwards the requests of
/// its queue to the instance no faster than one per `1 / rps_max`, and
/// lengthens that interval while the instance's response latency (from
/// forwarding to response) exceeds the SLO.
///
/// The director sees a response when it completes: each response over the
/// SLO multiplies the interval by `backoff` (at most `max_slowdown` × the
/// base), each response within it shrinks the interval by `recovery`
/// towards the base.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pacing {
    /// The instance's profiled maximum sustainable rate, requests/s.
    pub rps_max: f64,
    /// Interval multiplier per response over the SLO, > 1.
    pub backoff: f64,
    /// Interval multiplier per response within the SLO, in (0, 1].
    pub recovery: f64,
    /// The interval never exceeds this multiple of `1 / rps_max`.
    pub max_slowdown: f64,
}

impl Pacing {
    /// Pacing at `rps_max` with a 1.25× backoff, a 0.99× recovery and at
    /// most a 4× slowdown.
    pub fn at(rps_max: f64) -> Self {
        Pacing { rps_max, backoff: 1.25, recovery: 0.99, max_slowdown: 4.0 }
    }

    fn base_interval(&self) -> Duration {
        Duration::from_secs_f64(1.0 / self.rps_max.max(1e-9))
    }
}

/// How many instances run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Scaling {
    /// Always the initial count.
    Fixed,
    /// Kubernetes' HPA: every `interval`, `ceil(n × utilisation / target)`;
    /// scale-up at once, scale-down to the highest recommendation of the
    /// last `scale_down_window`.
    Hpa {
        /// Target utilisation.
        target: f64,
        /// Control interval.
        interval: Duration,
        /// Scale-down stabilisation window.
        scale_down_window: Duration,
    },
    /// Spandana's SRO every `interval` over the last `window`'s per-second
    /// load, with `rps_share` of an instance's capacity as its `RPS_max`.
    Sro {
        /// Control interval.
        interval: Duration,
        /// Load profile length.
        window: Duration,
        /// Share of capacity an instance serves within the SLO.
        rps_share: f64,
    },
}

/// A complete policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetPolicy {
    /// Its name in reports.
    pub name: String,
    /// Instance choice.
    pub dispatch: Dispatch,
    /// Offload rule.
    pub offload: Offload,
    /// Capacity.
    pub scaling: Scaling,
}

impl FleetPolicy {
    /// The policies of Spandana's evaluation and slogate's, by name.
    pub const NAMES: [&'static str; 5] = ["hpa-60", "libra", "spandana", "spandana-central", "slogate"];

    /// Kubernetes' HPA at `target` utilisation (15 s interval, 300 s
    /// scale-down window), round-robin, no offload.
    pub fn hpa(target: f64) -> Self {
        FleetPolicy {
            name: format!("hpa-{:.0}", target * 100.0),
            dispatch: Dispatch::RoundRobin,
            offload: Offload::Never,
            scaling: Scaling::Hpa { target, interval: Duration::from_secs(15), scale_down_window: Duration::from_secs(300) },
        }
    }

    /// A named policy for `config`, spending a violation `budget`:
    ///
    /// - `hpa-60`: [`FleetPolicy::hpa`] at 60%;
    /// - `libra`: HPA-60, and an instance offloads once it has served 80%
    ///   of its capacity within the current second;
    /// - `spandana`: round-robin, the SLO Director's bounded queue (the
    ///   waiting requests whose queueing leaves 30% of the SLO's slack for
    ///   service-time noise) paced at the instance's capacity, the SRO
    ///   every minute over five;
    /// - `spandana-central`: the same behind a least-loaded balancer;
    /// - `slogate`: least-loaded, offload by predicted latency with a margin
    ///   that starts at 85% of the SLO and adapts to spend `budget`, the
    ///   SRO.
    pub fn named(name: &str, config: &FleetConfig, budget: f64) -> Option<Self> {
        let sro = Scaling::Sro { interval: Duration::from_secs(60), window: Duration::from_secs(300), rps_share: 0.9 };
        let slack = config.slo.as_secs_f64() / config.service_time.as_secs_f64() - 1.0;
        let director_queue = ((slack * f64::from(config.workers_per_instance) * 0.7).floor() as u32).max(1);
        let director = Offload::QueueBound { max_waiting: director_queue, pacing: Some(Pacing::at(config.capacity_rps())) };
        let (dispatch, offload, scaling) = match name {
            "hpa-60" => return Some(FleetPolicy::hpa(0.6)),
            "libra" => (Dispatch::RoundRobin, Offload::RateShare { share: 0.8 }, FleetPolicy::hpa(0.6).scaling),
            "spandana" => (Dispatch::RoundRobin, director, sro),
            "spandana-central" => (Dispatch::LeastLoaded, director, sro),
            "slogate" => (Dispatch::LeastLoaded, Offload::PredictedSlo { margin: 0.85, budget: Some(budget) }, sro),
            _ => return None,
        };
        Some(FleetPolicy { name: name.to_owned(), dispatch, offload, scaling })
    }
}

/// One run's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetSummary {
    /// Requests.
    pub requests: u64,
    /// Of which missed the SLO.
    pub violations: u64,
    /// `violations / requests`.
    pub violation_rate: f64,
    /// Offloaded to the elastic tier.
    pub offloaded: u64,
    /// Instances' bill, dollars.
    pub instance_cost_usd: f64,
    /// The elastic tier's bill, dollars.
    pub elastic_cost_usd: f64,
    /// Instance-hours provisioned (requested until stopped).
    pub instance_hours: f64,
    /// Busy worker time over ready worker time.
    pub utilisation: f64,
    /// Latency percentiles over all requests, milliseconds.
    pub latency_ms_p50: f64,
    /// 99th percentile.
    pub latency_ms_p99: f64,
    /// p99 latency per `series_step`, milliseconds.
    pub p99_ms_series: Vec<f64>,
    /// The series' step, seconds.
    pub series_step_s: f64,
}

impl FleetSummary {
    /// Instances plus elastic.
    pub fn cost_usd(&self) -> f64 {
        self.instance_cost_usd + self.elastic_cost_usd
    }
}

#[derive(Clone, Debug)]
struct Instance {
    requested: Instant,
    ready_at: Instant,
    stopped: Option<Instant>,
    /// Each worker's next free instant.
    free_at: Vec<Instant>,
    /// Start instants of requests not yet started, ascending.
    waiting: VecDeque<Instant>,
    /// Served in the current second (Libra), and which second.
    served_second: (u64, u32),
    busy_s: f64,
    /// The SLO Director's pacing: the earliest next forward, the current
    /// interval, and the responses it has yet to see `(finish, over the
    /// SLO)`, earliest first.
    next_forward: Instant,
    pacing_interval: Duration,
    responses: BinaryHeap<Reverse<(Instant, bool)>>,
}

impl Instance {
    fn new(requested: Instant, ready_at: Instant, workers: u32) -> Self {
        Instance {
            requested,
            ready_at,
            stopped: None,
            free_at: vec![ready_at; workers as usize],
            waiting: VecDeque::new(),
            served_second: (u64::MAX, 0),
            busy_s: 0.0,
            next_forward: ready_at,
            pacing_interval: Duration::ZERO,
            responses: BinaryHeap::new(),
        }
    }

    /// The director sees the responses finished by `now` and adapts its
    /// pacing interval (see [`Pacing`]).
    fn observe_responses(&mut self, now: Instant, pacing: &Pacing) {
        let base = pacing.base_interval();
        if self.pacing_interval < base {
            self.pacing_interval = base;
        }
        while let Some(Reverse((finish, over))) = self.responses.peek().copied() {
            if finish > now {
                break;
            }
            self.responses.pop();
            let factor = if over { pacing.backoff } else { pacing.recovery };
            self.pacing_interval = self.pacing_interval.mul_f64(factor).clamp(base, base.mul_f64(pacing.max_slowdown));
        }
    }

    fn earliest_worker(&self) -> (usize, Instant) {
        self.free_at.iter().copied().enumerate().min_by_key(|(i, at)| (*at, *i)).expect("an instance has workers")
    }

    fn waiting_at(&mut self, now: Instant) -> u32 {
        while self.waiting.front().is_some_and(|start| *start <= now) {
            self.waiting.pop_front();
        }
        self.waiting.len() as u32
    }

    fn usable(&self, now: Instant) -> bool {
        self.stopped.is_none() && self.ready_at <= now
    }
}

/// Runs `policy` on `arrivals` (ascending) with `config`. See the module
/// docs.
pub fn simulate(config: &FleetConfig, policy: &FleetPolicy, arrivals: impl IntoIterator<Item = Instant>) -> FleetSummary {
    let mut engine = Engine::new(config, policy);
    for at in arrivals {
        engine.arrive(at);
    }
    engine.finish()
}

struct Engine<'a> {
    config: &'a FleetConfig,
    policy: &'a FleetPolicy,
    instances: Vec<Instance>,
    next_round_robin: usize,
    elastic: ElasticPool,
    /// Running offloads: `(finish, execution time µs without the cold
    /// start)`.
    elastic_running: BinaryHeap<Reverse<(Instant, u64)>>,
    /// slogate's view of the tier's speed: the sum of log(execution / idle
    /// latency) over the offloads it saw complete, and how many.
    elastic_seen: (f64, u64),
    elastic_cost_usd: f64,
    next_tick: Option<Instant>,
    /// Arrivals per second, for the SRO's profile.
    per_second: Vec<f64>,
    /// Busy worker-seconds and ready worker-seconds since the last tick.
    window_busy_s: f64,
    last_tick: Instant,
    /// HPA recommendations `(at, count)` within the scale-down window.
    recommendations: VecDeque<(Instant, u32)>,
    usable: Vec<usize>,
    usable_until: Instant,
    usable_stale: bool,
    latencies_ms: Vec<f32>,
    arrivals_s: Vec<f32>,
    violations: u64,
    offloaded: u64,
    now: Instant,
    /// slogate's current margin, and the completions it has yet to see:
    /// `(finish, violated)`, earliest first.
    margin: f64,
    unseen: BinaryHeap<Reverse<(Instant, bool)>>,
    margin_window: (Instant, u64, u64),
}

impl<'a> Engine<'a> {
    fn new(config: &'a FleetConfig, policy: &'a FleetPolicy) -> Self {
        let instances = (0..config.initial_instances.max(1)).map(|_| Instance::new(Instant::ZERO, Instant::ZERO, config.workers_per_instance)).collect();
        let next_tick = match policy.scaling {
            Scaling::Fixed => None,
            Scaling::Hpa { interval, .. } | Scaling::Sro { interval, .. } => Some(Instant::ZERO + interval),
        };
        Engine {
            config,
            policy,
            instances,
            next_round_robin: 0,
            elastic: ElasticPool::new(),
            elastic_running: BinaryHeap::new(),
            elastic_seen: (0.0, 0),
            elastic_cost_usd: 0.0,
            next_tick,
            per_second: Vec::new(),
            window_busy_s: 0.0,
            last_tick: Instant::ZERO,
            recommendations: VecDeque::new(),
            usable: Vec::new(),
            usable_until: Instant::ZERO,
            usable_stale: true,
            latencies_ms: Vec::new(),
            arrivals_s: Vec::new(),
            violations: 0,
            offloaded: 0,
            now: Instant::ZERO,
            margin: match policy.offload {
                Offload::PredictedSlo { margin, .. } => margin,
                _ => 1.0,
            },
            unseen: BinaryHeap::new(),
            margin_window: (Instant::ZERO + MARGIN_WINDOW, 0, 0),
        }
    }

    fn live_count(&self) -> usize {
        self.instances.iter().filter(|i| i.stopped.is_none()).count()
    }

    /// Moves slogate's margin by the completions seen in each 10 s window
    /// up to `now` (see [`Offload::PredictedSlo`]).
    fn adapt_margin(&mut self, now: Instant) {
        let Offload::PredictedSlo { budget: Some(budget), .. } = self.policy.offload else { return };
        while self.margin_window.0 <= now {
            let (end, mut seen, mut violated) = self.margin_window;
            while let Some(Reverse((finish, missed))) = self.unseen.peek().copied() {
                if finish > end {
                    break;
                }
                self.unseen.pop();
                seen += 1;
                violated += u64::from(missed);
            }
            if seen > 0 {
                let rate = violated as f64 / seen as f64;
                if rate > 0.5 * budget {
                    self.margin = (self.margin - 0.05).max(0.5);
                } else if rate < 0.25 * budget {
                    self.margin = (self.margin + 0.01).min(1.0);
                }
            }
            self.margin_window = (end + MARGIN_WINDOW, 0, 0);
        }
    }

    /// An offload finished at `done`: the tier's warm pool frees a slot,
    /// and slogate sees how long it executed.
    fn finish_offload(&mut self, done: Instant, executed_us: u64) {
        self.elastic.finish(done, &self.config.elastic);
        let ratio = executed_us as f64 / self.config.service_time.as_micros().max(1) as f64;
        if ratio > 0.0 {
            self.elastic_seen.0 += ratio.ln();
            self.elastic_seen.1 += 1;
        }
    }

    /// slogate's predicted execution time of a request on the tier: the
    /// configured speed as a prior, then the geometric mean of what the
    /// completed offloads took relative to the idle latency.
    fn predicted_elastic_execution(&self) -> Duration {
        match self.elastic_seen {
            (sum, seen) if seen >= 8 => self.config.service_time.mul_f64((sum / seen as f64).exp()),
            _ => self.config.elastic.execution_time(self.config.service_time),
        }
    }

    fn advance(&mut self, now: Instant) {
        self.adapt_margin(now);
        while let Some(Reverse((done, executed_us))) = self.elastic_running.peek().copied() {
            if done > now {
                break;
            }
            self.elastic_running.pop();
            self.finish_offload(done, executed_us);
        }
        while let Some(tick) = self.next_tick.filter(|t| *t <= now) {
            self.tick(tick);
        }
        self.now = now;
    }

    fn tick(&mut self, now: Instant) {
        let ready_worker_s: f64 = self
            .instances
            .iter()
            .filter(|i| i.stopped.is_none())
            .map(|i| (now - i.ready_at.max(self.last_tick)).as_secs_f64().max(0.0) * f64::from(self.config.workers_per_instance))
            .sum();
        let utilisation = if ready_worker_s > 0.0 { self.window_busy_s / ready_worker_s } else { 0.0 };
        self.window_busy_s = 0.0;
        self.last_tick = now;
        let current = self.live_count() as u32;
        let (desired, interval) = match self.policy.scaling {
            Scaling::Fixed => return,
            Scaling::Hpa { target, interval, scale_down_window } => {
                let recommended = ((f64::from(current) * utilisation / target.max(1e-6)).ceil() as u32).max(1);
                self.recommendations.push_back((now, recommended));
                while self.recommendations.front().is_some_and(|(at, _)| *at + scale_down_window < now) {
                    self.recommendations.pop_front();
                }
                let stabilised = self.recommendations.iter().map(|(_, r)| *r).max().unwrap_or(recommended);
                (if recommended > current { recommended } else { stabilised.min(current) }, interval)
            }
            Scaling::Sro { interval, window, rps_share } => {
                let seconds = window.as_micros().div_ceil(1_000_000) as usize;
                let end = (now.as_micros() / 1_000_000) as usize;
                let start = end.saturating_sub(seconds);
                let profile: Vec<f64> = (start..end).map(|s| self.per_second.get(s).copied().unwrap_or(0.0)).collect();
                let sro = SroConfig {
                    rps_max_per_instance: self.config.capacity_rps() * rps_share,
                    instance_price_per_s_usd: self.config.billing.price_per_hour_usd / 3_600.0,
                    elastic_price_per_request_usd: self.config.elastic.invocation_cost_usd(self.config.service_time.mul_f64(1.0 / self.config.elastic.speed_factor)),
                };
                (optimise_instances(&profile, Duration::from_secs(1), &sro).instances, interval)
            }
        };
        let desired = desired.clamp(1, self.config.max_instances) as usize;
        let live = self.live_count();
        if desired > live {
            for _ in live..desired {
                self.instances.push(Instance::new(now, now + self.config.startup_delay, self.config.workers_per_instance));
            }
        } else {
            // Stop the emptiest instances; they finish what they hold.
            let mut excess = live - desired;
            let drain = |instance: &Instance| instance.free_at.iter().copied().max().unwrap_or(now);
            let mut order: Vec<usize> = (0..self.instances.len()).filter(|&i| self.instances[i].stopped.is_none()).collect();
            order.sort_by_key(|&i| (drain(&self.instances[i]), Reverse(i)));
            for i in order {
                if excess == 0 {
                    break;
                }
                let drained = self.instances[i].free_at.iter().copied().max().unwrap_or(now).max(now);
                self.instances[i].stopped = Some(drained);
                excess -= 1;
            }
        }
        self.usable_stale = true;
        self.next_tick = Some(now + interval);
    }

    /// The usable instances, rebuilt when an instance starts, stops or
    /// becomes ready (not per request: the hot path only reads it).
    fn refresh_usable(&mut self, now: Instant) {
        if now < self.usable_until && !self.usable_stale {
            return;
        }
        self.usable = (0..self.instances.len()).filter(|&i| self.instances[i].usable(now)).collect();
        self.usable_until =
            self.instances.iter().filter(|i| i.stopped.is_none() && i.ready_at > now).map(|i| i.ready_at).min().unwrap_or(Instant::MAX);
        self.usable_stale = false;
    }

    fn choose_instance(&mut self, now: Instant) -> Option<usize> {
        self.refresh_usable(now);
        if self.usable.is_empty() {
            return None;
        }
        Some(match self.policy.dispatch {
            Dispatch::RoundRobin => {
                let index = self.usable[self.next_round_robin % self.usable.len()];
                self.next_round_robin = self.next_round_robin.wrapping_add(1);
                index
            }
            Dispatch::LeastLoaded => {
                *self.usable.iter().min_by_key(|&&i| (self.instances[i].earliest_worker().1.max(now), i)).expect("non-empty")
            }
        })
    }

    fn arrive(&mut self, at: Instant) {
        self.advance(at);
        let second = (at.as_micros() / 1_000_000) as usize;
        if self.per_second.len() <= second {
            self.per_second.resize(second + 1, 0.0);
        }
        self.per_second[second] += 1.0;
        let id = QueryId(self.latencies_ms.len() as u64);
        let service = self.config.service_time.mul_f64(noise_factor(self.config.seed, id, self.config.noise_sigma));
        let chosen = self.choose_instance(at);
        let offload = match (chosen, self.policy.offload) {
            (None, _) => true,
            (Some(_), Offload::Never) => false,
            (Some(i), Offload::QueueBound { max_waiting, .. }) => self.instances[i].waiting_at(at) >= max_waiting,
            (Some(i), Offload::RateShare { share }) => {
                let (current, served) = self.instances[i].served_second;
                let served = if current == second as u64 { served } else { 0 };
                f64::from(served) >= share * self.config.capacity_rps()
            }
            (Some(i), Offload::PredictedSlo { .. }) => {
                let margin = self.margin;
                // What an operator can see: idle workers and the queue's
                // length; service times are the configured idle latency.
                let instance = &mut self.instances[i];
                let idle = instance.free_at.iter().any(|free| *free <= at);
                let waiting = instance.waiting_at(at);
                let workers = f64::from(self.config.workers_per_instance);
                let wait = if idle { Duration::ZERO } else { self.config.service_time.mul_f64((f64::from(waiting) + 1.0) / workers) };
                let on_instance = wait + self.config.service_time;
                // Cold starts are amortised: offloads keep instances warm
                // for the keep-alive period.
                let elastic = self.predicted_elastic_execution();
                on_instance > self.config.slo.mul_f64(margin) && elastic <= self.config.slo
            }
        };
        let offload = offload && self.elastic.has_capacity(&self.config.elastic) || chosen.is_none();
        let finished = if offload {
            self.offloaded += 1;
            // At the concurrency limit the invocation waits for a slot.
            let start = if self.elastic.has_capacity(&self.config.elastic) {
                at
            } else {
                let Reverse((free, executed_us)) = self.elastic_running.pop().expect("at the limit something runs");
                self.finish_offload(free, executed_us);
                free.max(at)
            };
            let warm = self.elastic.start(start, &self.config.elastic);
            let executed = self.config.elastic.execution_time(service);
            let run = if warm { Duration::ZERO } else { self.config.elastic.cold_start } + executed;
            self.elastic_cost_usd += self.config.elastic.invocation_cost_usd(run);
            self.elastic_running.push(Reverse((start + run, executed.as_micros())));
            start + run
        } else {
            let i = chosen.expect("not offloaded, so an instance was chosen");
            let slo = self.config.slo;
            let instance = &mut self.instances[i];
            let (worker, free) = instance.earliest_worker();
            let mut start = free.max(at);
            if let Offload::QueueBound { pacing: Some(pacing), .. } = &self.policy.offload {
                instance.observe_responses(at, pacing);
                start = start.max(instance.next_forward);
                instance.next_forward = start + instance.pacing_interval;
                instance.responses.push(Reverse((start + service, service > slo)));
            }
            instance.free_at[worker] = start + service;
            if start > at {
                instance.waiting.push_back(start);
            }
            let (current, served) = instance.served_second;
            instance.served_second = if current == second as u64 { (current, served + 1) } else { (second as u64, 1) };
            instance.busy_s += service.as_secs_f64();
            self.window_busy_s += service.as_secs_f64();
            start + service
        };
        let latency = finished - at;
        self.violations += u64::from(latency > self.config.slo);
        if matches!(self.policy.offload, Offload::PredictedSlo { budget: Some(_), .. }) {
            self.unseen.push(Reverse((finished, latency > self.config.slo)));
        }
        self.latencies_ms.push(latency.as_millis_f64() as f32);
        self.arrivals_s.push(at.as_secs_f64() as f32);
    }

    fn finish(mut self) -> FleetSummary {
        let end = self.now;
        let mut instance_cost_usd = 0.0;
        let mut instance_hours = 0.0;
        let mut busy_s = 0.0;
        let mut ready_worker_s = 0.0;
        for instance in &self.instances {
            let stopped = instance.stopped.unwrap_or(end).max(instance.free_at.iter().copied().max().unwrap_or(end)).max(instance.requested);
            instance_cost_usd += self.config.billing.cost_usd(instance.requested, stopped);
            instance_hours += (stopped - instance.requested).as_secs_f64() / 3_600.0;
            busy_s += instance.busy_s;
            ready_worker_s += (stopped.saturating_duration_since(instance.ready_at)).as_secs_f64() * f64::from(self.config.workers_per_instance);
        }
        let requests = self.latencies_ms.len() as u64;
        let step_s = 10.0;
        let buckets = (end.as_secs_f64() / step_s).ceil() as usize + 1;
        let mut by_bucket: Vec<Vec<f64>> = vec![Vec::new(); buckets];
        for (at, latency) in self.arrivals_s.iter().zip(&self.latencies_ms) {
            by_bucket[(f64::from(*at) / step_s) as usize].push(f64::from(*latency));
        }
        let p99_ms_series = by_bucket
            .into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                percentile(&v, 0.99)
            })
            .collect();
        self.latencies_ms.sort_by(f32::total_cmp);
        let sorted: Vec<f64> = self.latencies_ms.iter().map(|&l| f64::from(l)).collect();
        FleetSummary {
            requests,
            violations: self.violations,
            violation_rate: if requests == 0 { 0.0 } else { self.violations as f64 / requests as f64 },
            offloaded: self.offloaded,
            instance_cost_usd,
            elastic_cost_usd: self.elastic_cost_usd,
            instance_hours,
            utilisation: if ready_worker_s > 0.0 { busy_s / ready_worker_s } else { 0.0 },
            latency_ms_p50: percentile(&sorted, 0.5),
            latency_ms_p99: percentile(&sorted, 0.99),
            p99_ms_series,
            series_step_s: step_s,
        }
    }
}

#[cfg(test)]
mod tests;
