//! The Retrainer actor: one per pool that predicts with Iconq+
//! (`predictor = "iconq"`), a thin shell that retrains the model off the
//! routing path and swaps it into the pool's router.
//!
//! A run starts on demand ([`StartRetraining`], `POST
//! /v1/pools/{pool}/predictor/retrain`) or every `every` of real time. It
//! reads the execution log (the pool's executions, those logged with their
//! timeline), and hands them with the model in force to the trainer it
//! was given ([`TrainModel`]: the node's, with candle) on a thread of its
//! own. The trainer holds executions out, fits on the rest and scores the
//! candidate and the model in force on the same held-out executions; core
//! decides ([`slogate_core::predict::iconq::replaces`]) whether the
//! candidate replaces it. A candidate that scores worse is dropped and the
//! model in force stays. An installed model is installed in the router
//! atomically, between two routing decisions ([`InstallModel`]), and kept
//! in `state_dir` as a model directory (`model.json`, `model.onnx`,
//! `model-info.json`): a restarted node starts the pool on it, and the
//! Retrainer reads its description from there.

use std::path::PathBuf;
use std::sync::Arc;

use actix::prelude::*;
use serde::{Deserialize, Serialize};
use slogate_core::model::PoolId;
use slogate_core::predict::iconq::{HeldOutScore, IconqWeights, replaces};
use slogate_core::reservoir::ExecutionRecord;

use crate::clock::unix_now_s;
use crate::reservoir::{GetRecentExecutions, ReservoirActor};
use crate::router::{InstallModel, RouterShard};
use crate::{Error, Result};

/// What a trainer returns: the candidate model and how it and the model
/// in force scored on the same held-out executions.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// The candidate's weights.
    pub weights: Arc<IconqWeights>,
    /// Its held-out score.
    pub score: HeldOutScore,
    /// The model in force's, on the same executions.
    pub current_score: HeldOutScore,
    /// Executions it was trained on.
    pub training_executions: usize,
    /// Executions held out to score it.
    pub held_out_executions: usize,
}

/// Trains a candidate from the pool's executions, given the model in
/// force. Runs on a thread of its own; takes seconds to minutes.
pub type TrainModel = Arc<dyn Fn(&[ExecutionRecord], &IconqWeights) -> std::result::Result<Candidate, String> + Send + Sync>;

/// What a Retrainer is given.
#[derive(Clone)]
pub struct RetrainerSettings {
    /// Real time between scheduled runs; `None` runs on demand only.
    pub every: Option<std::time::Duration>,
    /// Fewer executions with a timeline than this, and a run trains
    /// nothing (it says so).
    pub min_executions: usize,
    /// The most recent executions read.
    pub executions_max: usize,
    /// Where an installed model is kept (`model.json`, `model.onnx` and
    /// `model-info.json`).
    pub state_dir: PathBuf,
    /// The trainer.
    pub train: TrainModel,
}

/// The kept model's description in a state directory; written last, so a
/// directory that has it holds a whole model.
const INFO_FILE: &str = "model-info.json";

/// Whether `state_dir` holds a model a Retrainer installed and kept (a
/// restarted node starts the pool on it rather than on the configured
/// one).
pub fn holds_kept_model(state_dir: &std::path::Path) -> bool {
    state_dir.join(INFO_FILE).is_file()
}

/// The model in force and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// 1 for the model the pool started with, then one more per model
    /// installed.
    pub version: u64,
    /// `config` (the model directory the pool names) or `retrained`.
    pub source: String,
    /// When it was installed, Unix seconds (`None` for the configured one).
    pub installed_at_unix_s: Option<i64>,
    /// Executions it was trained on (`None` when not known).
    pub training_executions: Option<usize>,
    /// Its held-out Q-error when it was installed (`None` when not known).
    pub held_out: Option<HeldOutScore>,
}

/// How the last run ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunOutcome {
    /// Whether the candidate replaced the model in force.
    pub installed: bool,
    /// Why, in words.
    pub reason: String,
    /// The candidate's held-out score.
    pub candidate: HeldOutScore,
    /// The model in force's, on the same executions.
    pub current: HeldOutScore,
    /// Executions trained on, and held out.
    pub training_executions: usize,
    /// Executions held out.
    pub held_out_executions: usize,
    /// Seconds the run took.
    pub duration_s: f64,
}

/// Starts a run now, unless one is going.
#[derive(Message)]
#[rtype(result = "Result<()>")]
pub struct StartRetraining {
    /// Why (`operator`, `schedule`).
    pub reason: String,
}

/// Reads the observable state.
#[derive(Message)]
#[rtype(result = "RetrainerState")]
pub struct GetState;

/// A run's end, from its thread.
#[derive(Message)]
#[rtype(result = "()")]
struct RetrainingFinished(std::result::Result<(Candidate, f64), String>);

/// The Retrainer's observable state.
#[derive(Clone, Debug, Serialize)]
pub struct RetrainerState {
    /// The pool.
    pub pool: PoolId,
    /// The model in force.
    pub model: ModelInfo,
    /// Whether a run is going.
    pub running: bool,
    /// Why the current or last run started.
    pub reason: Option<String>,
    /// Runs finished (installed or not).
    pub runs: u64,
    /// Runs that failed.
    pub failures: u64,
    /// The last failure's reason.
    pub last_error: Option<String>,
    /// How the last finished run ended.
    pub last_run: Option<RunOutcome>,
    /// Real seconds between scheduled runs, if scheduled.
    pub every_s: Option<f64>,
    /// The fewest executions a run trains on.
    pub min_executions: usize,
}

/// The actor. See the module docs.
pub struct RetrainerActor {
    pool: PoolId,
    settings: RetrainerSettings,
    router: Addr<RouterShard>,
    reservoir: Addr<ReservoirActor>,
    weights: Arc<IconqWeights>,
    model: ModelInfo,
    running: bool,
    started_at: Option<std::time::Instant>,
    reason: Option<String>,
    runs: u64,
    failures: u64,
    last_error: Option<String>,
    last_run: Option<RunOutcome>,
}

impl RetrainerActor {
    /// A retrainer for `pool`, whose router started with `weights`
    /// (described by `model`; the description a run kept in
    /// `settings.state_dir` is read when it starts).
    pub fn new(pool: PoolId, settings: RetrainerSettings, router: Addr<RouterShard>, reservoir: Addr<ReservoirActor>, weights: Arc<IconqWeights>, model: ModelInfo) -> Self {
        RetrainerActor {
            pool,
            settings,
            router,
            reservoir,
            weights,
            model,
            running: false,
            started_at: None,
            reason: None,
            runs: 0,
            failures: 0,
            last_error: None,
            last_run: None,
        }
    }

    fn model_path(&self) -> PathBuf {
        self.settings.state_dir.join("model.json")
    }

    fn info_path(&self) -> PathBuf {
        self.settings.state_dir.join(INFO_FILE)
    }

    fn persist(&self) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.settings.state_dir)?;
        let onnx = slogate_onnx::graph::iconq_model_bytes(&self.weights).map_err(std::io::Error::other)?;
        // The info last: a directory with it is complete.
        for (path, bytes) in [
            (self.model_path(), serde_json::to_vec(self.weights.as_ref()).expect("weights serialise")),
            (self.settings.state_dir.join("model.onnx"), onnx),
            (self.info_path(), serde_json::to_vec_pretty(&self.model).expect("model info serialises")),
        ] {
            crate::replace_file(&path, &bytes)?;
        }
        Ok(())
    }

    /// Reads the kept model's description (`model-info.json`): the node
    /// started the pool's router on the kept model itself, and gave it
    /// here as the model in force.
    fn restore(&mut self) -> std::result::Result<(), String> {
        let info = match std::fs::read(self.info_path()) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("cannot read {}: {e}", self.info_path().display())),
        };
        self.model = serde_json::from_slice(&info).map_err(|e| format!("{} does not decode: {e}", self.info_path().display()))?;
        Ok(())
    }

    fn start(&mut self, reason: String, ctx: &mut Context<Self>) -> Result<()> {
        if self.running {
            return Err(Error::RetrainingInProgress(self.pool.to_string()));
        }
        self.running = true;
        self.started_at = Some(std::time::Instant::now());
        self.reason = Some(reason);
        let (reservoir, pool) = (self.reservoir.clone(), self.pool.clone());
        let (limit, min_executions) = (self.settings.executions_max, self.settings.min_executions);
        let gather = async move {
            let executions = reservoir
                .send(GetRecentExecutions { limit })
                .await
                .map_err(|_| "the reservoir is not answering".to_owned())?
                .map_err(|e| format!("cannot read the execution log: {e}"))?;
            let pool_executions: Vec<ExecutionRecord> = executions.into_iter().filter(|r| r.timeline.as_ref().is_some_and(|t| t.in_pool(&pool))).collect();
            if pool_executions.len() < min_executions {
                return Err(format!("{} of the pool's executions are logged with their timeline; a run needs at least {min_executions}", pool_executions.len()));
            }
            Ok(pool_executions)
        };
        ctx.spawn(gather.into_actor(self).map(|gathered, actor, ctx| {
            let executions = match gathered {
                Ok(executions) => executions,
                Err(reason) => return ctx.notify(RetrainingFinished(Err(reason))),
            };
            let (train, current, me) = (actor.settings.train.clone(), actor.weights.clone(), ctx.address());
            std::thread::spawn(move || {
                let started = std::time::Instant::now();
                let result = train(&executions, &current).map(|candidate| (candidate, started.elapsed().as_secs_f64()));
                me.do_send(RetrainingFinished(result));
            });
        }));
        Ok(())
    }
}

impl Actor for RetrainerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Err(e) = self.restore() {
            self.last_error = Some(e);
        }
        if let Some(every) = self.settings.every {
            ctx.run_interval(every, |actor, ctx| {
                let _ = actor.start("schedule".to_owned(), ctx);
            });
        }
    }
}

impl Handler<StartRetraining> for RetrainerActor {
    type Result = Result<()>;

    fn handle(&mut self, message: StartRetraining, ctx: &mut Self::Context) -> Self::Result {
        self.start(message.reason, ctx)
    }
}

impl Handler<RetrainingFinished> for RetrainerActor {
    type Result = ();

    fn handle(&mut self, message: RetrainingFinished, _ctx: &mut Self::Context) {
        self.running = false;
        let (candidate, duration_s) = match message.0 {
            Ok(finished) => finished,
            Err(reason) => {
                self.failures += 1;
                self.last_error = Some(reason);
                return;
            }
        };
        self.runs += 1;
        let installed = replaces(&candidate.score, &candidate.current_score);
        let reason = if installed {
            format!("installed: held-out p90 Q-error {:.2}, the model in force's {:.2}", candidate.score.p90, candidate.current_score.p90)
        } else {
            format!("kept the model in force: the candidate's held-out p90 Q-error {:.2} is worse than its {:.2}", candidate.score.p90, candidate.current_score.p90)
        };
        if installed {
            self.router.do_send(InstallModel { pool: self.pool.clone(), weights: candidate.weights.clone() });
            self.weights = candidate.weights.clone();
            self.model = ModelInfo {
                version: self.model.version + 1,
                source: "retrained".into(),
                installed_at_unix_s: Some(unix_now_s() as i64),
                training_executions: Some(candidate.training_executions),
                held_out: Some(candidate.score),
            };
            if let Err(e) = self.persist() {
                self.last_error = Some(format!("the new model is in force but cannot be kept in {}: {e}", self.settings.state_dir.display()));
            }
        }
        self.last_run = Some(RunOutcome {
            installed,
            reason,
            candidate: candidate.score,
            current: candidate.current_score,
            training_executions: candidate.training_executions,
            held_out_executions: candidate.held_out_executions,
            duration_s,
        });
    }
}

impl Handler<GetState> for RetrainerActor {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _message: GetState, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(RetrainerState {
            pool: self.pool.clone(),
            model: self.model.clone(),
            running: self.running,
            reason: self.reason.clone(),
            runs: self.runs,
            failures: self.failures,
            last_error: self.last_error.clone(),
            last_run: self.last_run.clone(),
            every_s: self.settings.every.map(|e| e.as_secs_f64()),
            min_executions: self.settings.min_executions,
        })
    }
}
