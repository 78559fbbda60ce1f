//! The Tuner actor: one per tuned pool, a thin shell around core's policy
//! tuner ([`slogate_core::tune::tune_pool`]).
//!
//! A run starts on demand ([`StartTuning`], `POST
//! /v1/pools/{pool}/tune`) or every `every` of real time. It gathers a copy
//! of the reservoir's tables, the pool's latest SLO per template and a fork
//! of the router, then runs the pipeline on a thread of its own (it takes
//! seconds to minutes), reporting its phase in [`GetState`]. The target is
//! tomorrow (UTC) and the history the `history_days` before it. When the
//! run ends, the chosen configuration is written to `state_path` (so a
//! restart keeps it) and applied to the pool's Autoscaler, which fires its
//! planned spinups every day at their times of day.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use slogate_core::model::PoolId;
use slogate_core::objective::Outcome;
use slogate_core::scale::AutoscalerConfig;
use slogate_core::time::Duration;
use slogate_core::tune::{BatchSetup, Calibration, ExecutionConfig, SloBook, TuningConfig, TuningPhase, tune_pool};

use crate::autoscaler::{ApplyTuning, AutoscalerActor};
use crate::clock::unix_now_s;
use crate::reservoir::{GetRecentExecutions, GetSnapshot, ReservoirActor};
use crate::router::{ForkPlanner, GetSloBook, RouterShard};
use crate::{Error, Result};

/// What a Tuner is given.
#[derive(Clone, Debug)]
pub struct TunerSettings {
    /// Real time between scheduled runs; `None` for on demand only.
    pub every: Option<std::time::Duration>,
    /// Days of history before the target day.
    pub history_days: u32,
    /// The pipeline's settings.
    pub config: TuningConfig,
    /// The planner's pool and platform.
    pub setup: BatchSetup,
    /// The knobs the tuner starts from.
    pub base_knobs: AutoscalerConfig,
    /// The SLO of forecast queries of templates the pool has not seen.
    pub default_slo: Duration,
    /// Where the chosen configuration is kept.
    pub state_path: PathBuf,
}

/// A finished run's choice, as persisted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TunedConfig {
    /// The target day, days since 1970-01-01.
    pub day: i32,
    /// Days of history it was given.
    pub history_days: u32,
    /// The configuration: planned spinups (time after 00:00 UTC) and knobs.
    pub config: ExecutionConfig,
    /// Its expected VR and cost per day on the validation forecasts.
    pub expected: Outcome,
    /// The base configuration's, on the same forecasts.
    #[serde(default)]
    pub base_expected: Option<Outcome>,
    /// Whether the tuned configuration beat the base there; if not, the
    /// base configuration is what `config` holds.
    #[serde(default)]
    pub accepted: bool,
    /// Forecast queries per day, on average.
    pub forecast_queries_per_day: f64,
    /// Simulations run.
    pub simulations: usize,
    /// Wall-clock seconds the run took.
    pub duration_s: f64,
    /// Wall-clock UNIX seconds when it finished.
    pub finished_at_unix_s: i64,
    /// What the planner's warehouse learned from the execution log (slots
    /// per size, latency spread around the predictions).
    #[serde(default)]
    pub calibration: Calibration,
}

/// The most recent logged executions the planner calibrates on.
pub const CALIBRATION_EXECUTIONS_MAX: usize = 50_000;

/// Starts a run now, unless one is going.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct StartTuning {
    /// Why (`operator`, `schedule`).
    pub reason: String,
}

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "TunerState")]
pub struct GetState;

/// Adopts a configuration another node's Tuner chose for this pool (the
/// pool moved here): persisted and applied as if this Tuner had chosen
/// it, unless the configuration in force here finished later. Returns
/// whether it was adopted.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct Adopt {
    /// The configuration.
    pub tuned: TunedConfig,
    /// Where it came from, for the Autoscaler's state.
    pub source: String,
}

/// A run's end, from its thread.
#[derive(Message)]
#[rtype(result = "()")]
struct TuningFinished(std::result::Result<TunedConfig, String>);

/// The Tuner's observable state.
#[derive(Clone, Debug, Serialize)]
pub struct TunerState {
    /// The pool.
    pub pool: PoolId,
    /// Whether a run is going.
    pub running: bool,
    /// Its phase, or the last run's.
    pub phase: Option<TuningPhase>,
    /// Why the current or last run started.
    pub reason: Option<String>,
    /// Runs finished.
    pub runs: u64,
    /// Runs that failed.
    pub failures: u64,
    /// The last failure's reason.
    pub last_error: Option<String>,
    /// The configuration in force, with what it was expected to do.
    pub active: Option<TunedConfig>,
    /// Real seconds between scheduled runs, if scheduled.
    pub every_s: Option<f64>,
    /// Days of history each run reads.
    pub history_days: u32,
}

/// The actor. See the module docs.
pub struct TunerActor {
    pool: PoolId,
    settings: TunerSettings,
    /// The node's clock, for its calendar (the target day).
    clock: crate::clock::VirtualClock,
    router: Addr<RouterShard>,
    reservoir: Addr<ReservoirActor>,
    autoscaler: Addr<AutoscalerActor>,
    phase: Arc<Mutex<Option<TuningPhase>>>,
    running: bool,
    reason: Option<String>,
    runs: u64,
    failures: u64,
    last_error: Option<String>,
    active: Option<TunedConfig>,
    gate: Option<crate::autoscaler::OwnershipGate>,
}

impl TunerActor {
    /// The tuner runs only while `gate` says this node decides for the
    /// pool; a run asked of a node that does not is refused.
    pub fn with_gate(mut self, gate: crate::autoscaler::OwnershipGate) -> Self {
        self.gate = Some(gate);
        self
    }

    /// A tuner for `pool`; a configuration persisted at
    /// `settings.state_path` is loaded and applied when it starts.
    pub fn new(
        pool: PoolId,
        settings: TunerSettings,
        clock: crate::clock::VirtualClock,
        router: Addr<RouterShard>,
        reservoir: Addr<ReservoirActor>,
        autoscaler: Addr<AutoscalerActor>,
    ) -> Self {
        TunerActor {
            pool,
            clock,
            settings,
            router,
            reservoir,
            autoscaler,
            phase: Arc::new(Mutex::new(None)),
            running: false,
            reason: None,
            runs: 0,
            failures: 0,
            last_error: None,
            active: None,
            gate: None,
        }
    }

    fn apply(&self, tuned: &TunedConfig, source: &str) {
        self.autoscaler.do_send(ApplyTuning {
            knobs: tuned.config.knobs.clone(),
            daily: tuned.config.spinups.clone(),
            expected: Some(tuned.expected),
            source: source.to_owned(),
        });
    }

    fn persist(&self, tuned: &TunedConfig) -> std::io::Result<()> {
        let path = &self.settings.state_path;
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        crate::replace_file(path, &serde_json::to_vec_pretty(tuned).expect("a tuned configuration serialises"))
    }

    fn start(&mut self, reason: String, ctx: &mut Context<Self>) -> Result<()> {
        if self.running {
            return Err(Error::TuningInProgress(self.pool.to_string()));
        }
        if self.gate.as_ref().is_some_and(|gate| !gate()) {
            return Err(Error::Unsupported(format!("this node does not own pool `{}` now; its owner tunes it", self.pool)));
        }
        self.running = true;
        self.reason = Some(reason);
        *self.phase.lock().expect("the phase lock is never poisoned") = Some(TuningPhase::Forecasting);
        let (router, reservoir, pool) = (self.router.clone(), self.reservoir.clone(), self.pool.clone());
        let gather = async move {
            let tables = reservoir.send(GetSnapshot).await.map_err(|_| "the reservoir is not answering".to_owned())?;
            let slos = router.send(GetSloBook { pool: pool.clone() }).await.map_err(|_| "the router shard is not answering".to_owned())?.map_err(|e| e.to_string())?;
            let (planner, _) = router.send(ForkPlanner { pool }).await.map_err(|_| "the router shard is not answering".to_owned())?.map_err(|e| e.to_string())?;
            let executions = reservoir
                .send(GetRecentExecutions { limit: CALIBRATION_EXECUTIONS_MAX })
                .await
                .map_err(|_| "the reservoir is not answering".to_owned())?
                .map_err(|e| format!("cannot read the execution log: {e}"))?;
            Ok::<_, String>((tables, slos, planner, executions))
        };
        ctx.spawn(gather.into_actor(self).map(|gathered, actor, ctx| {
            let (tables, slos, planner, executions) = match gathered {
                Ok(parts) => parts,
                Err(reason) => return ctx.notify(TuningFinished(Err(reason))),
            };
            let mut settings = actor.settings.clone();
            let phase = Arc::clone(&actor.phase);
            let me = ctx.address();
            let calendar_now_s = actor.clock.calendar_now_s();
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let day = (calendar_now_s / 86_400.0).floor() as i32 + 1;
                let history = day - settings.history_days as i32..day;
                let book = SloBook { by_template: slos, default: settings.default_slo };
                let base = ExecutionConfig { spinups: Vec::new(), knobs: settings.base_knobs.clone() };
                let calibration = Calibration::learn(planner.fork_predictor().as_ref(), &executions);
                settings.setup.terms.calibration = calibration.clone();
                let report = tune_pool(&tables, day, history, &book, &settings.setup, planner.as_ref(), &base, &settings.config, &mut |p| {
                    *phase.lock().expect("the phase lock is never poisoned") = Some(p);
                });
                me.do_send(TuningFinished(Ok(TunedConfig {
                    day,
                    history_days: settings.history_days,
                    config: report.config,
                    expected: report.expected,
                    base_expected: report.base_expected,
                    accepted: report.accepted,
                    forecast_queries_per_day: report.forecast_queries_per_day,
                    simulations: report.simulations,
                    duration_s: started.elapsed().as_secs_f64(),
                    finished_at_unix_s: unix_now_s() as i64,
                    calibration,
                })));
            });
        }));
        Ok(())
    }
}

impl Actor for TunerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        match std::fs::read(&self.settings.state_path) {
            Ok(bytes) => match serde_json::from_slice::<TunedConfig>(&bytes) {
                Ok(tuned) => {
                    self.apply(&tuned, "tuner (restored)");
                    self.active = Some(tuned);
                }
                Err(e) => self.last_error = Some(format!("{} does not decode: {e}", self.settings.state_path.display())),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => self.last_error = Some(format!("cannot read {}: {e}", self.settings.state_path.display())),
        }
        if let Some(every) = self.settings.every {
            ctx.run_interval(every, |actor, ctx| {
                let _ = actor.start("schedule".to_owned(), ctx);
            });
        }
    }
}

impl Handler<StartTuning> for TunerActor {
    type Result = Result<()>;

    fn handle(&mut self, message: StartTuning, ctx: &mut Self::Context) -> Self::Result {
        self.start(message.reason, ctx)
    }
}

impl Handler<TuningFinished> for TunerActor {
    type Result = ();

    fn handle(&mut self, message: TuningFinished, _ctx: &mut Self::Context) {
        self.running = false;
        match message.0 {
            Ok(tuned) => {
                self.runs += 1;
                if let Err(e) = self.persist(&tuned) {
                    self.failures += 1;
                    self.last_error = Some(format!("cannot write {}: {e}", self.settings.state_path.display()));
                }
                self.apply(&tuned, "tuner");
                self.active = Some(tuned);
            }
            Err(reason) => {
                self.failures += 1;
                self.last_error = Some(reason);
                *self.phase.lock().expect("the phase lock is never poisoned") = None;
            }
        }
    }
}

impl Handler<Adopt> for TunerActor {
    type Result = bool;

    fn handle(&mut self, message: Adopt, _ctx: &mut Self::Context) -> bool {
        if self.active.as_ref().is_some_and(|active| active.finished_at_unix_s >= message.tuned.finished_at_unix_s) {
            return false;
        }
        if let Err(e) = self.persist(&message.tuned) {
            self.last_error = Some(format!("cannot write {}: {e}", self.settings.state_path.display()));
        }
        self.apply(&message.tuned, &message.source);
        self.active = Some(message.tuned);
        true
    }
}

impl Handler<GetState> for TunerActor {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(TunerState {
            pool: self.pool.clone(),
            running: self.running,
            phase: *self.phase.lock().expect("the phase lock is never poisoned"),
            reason: self.reason.clone(),
            runs: self.runs,
            failures: self.failures,
            last_error: self.last_error.clone(),
            active: self.active.clone(),
            every_s: self.settings.every.map(|e| e.as_secs_f64()),
            history_days: self.settings.history_days,
        })
    }
}
