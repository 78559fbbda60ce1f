//! `slogate train-predictor`: trains Iconq+ (the learned, concurrency-aware
//! latency model, `slogate_core::predict::iconq`) from an execution log
//! and writes it to a directory:
//!
//! - `model.json`: the weights core's native inference reads;
//! - `model.onnx`: the same model as an ONNX graph (`slogate_onnx::graph`),
//!   for ONNX Runtime;
//! - `metadata.json`: the feature schema (its version and the features'
//!   names), what it learned from, the seed and configuration, and its
//!   Q-error on held-out rows next to the concurrency-aware predictor's on
//!   the same executions.
//!
//! The log is a stopped node's data directory (its reservoir's execution
//! log), a JSON-lines file of execution records, or `--simulate SEED`: the
//! emulator's training run (BaseWorkload at λ 0.05, 0.1 and 0.2 on 4, 8,
//! 16 and 32 RPU). Only executions logged with their timeline (lane and
//! arrival) can be read as sequences; the others are counted and skipped.
//! The same log, seed and configuration give the same model.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use slogate_core::predict::iconq::RowSampling;
use slogate_core::reservoir::ExecutionRecord;

use crate::{Error, Result};

/// What to train from and where to write.
#[derive(Clone, Debug)]
pub struct TrainRequest {
    /// Where the executions come from.
    pub source: LogSource,
    /// The output directory.
    pub out: PathBuf,
    /// Seeds the model, the held-out split and the censored samples.
    pub seed: u64,
    /// Optimiser steps (default: the trainer's).
    pub steps: Option<usize>,
}

/// An execution log.
#[derive(Clone, Debug)]
pub enum LogSource {
    /// A stopped node's data directory (or its reservoir folder), or a
    /// JSON-lines file of execution records.
    Path(PathBuf),
    /// The emulator's training run with this seed.
    Simulated(u64),
}

/// Reads the executions of `source`.
pub fn read_log(source: &LogSource) -> Result<Vec<ExecutionRecord>> {
    match source {
        LogSource::Simulated(seed) => Ok(crate::eval::training_executions(&[4, 8, 16, 32], *seed)),
        LogSource::Path(path) if path.is_dir() => {
            use slogate_actors::reservoir::{ReservoirStore, SledStore};
            let folder = crate::tune::reservoir_folder(path);
            let store = SledStore::open(&folder)
                .map_err(|e| Error::Node(format!("cannot open the reservoir in {} (is the node still running?): {e}", folder.display())))?;
            store.recent_executions(EXECUTIONS_MAX).map_err(|e| Error::Node(e.to_string()))
        }
        LogSource::Path(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            text.lines()
                .enumerate()
                .filter(|(_, line)| !line.trim().is_empty())
                .map(|(n, line)| {
                    serde_json::from_str(line).map_err(|e| Error::Config(format!("{}:{}: not an execution record: {e}", path.display(), n + 1)))
                })
                .collect()
        }
    }
}

/// The most executions read from a reservoir.
const EXECUTIONS_MAX: usize = 200_000;

/// `metadata.json`.
#[derive(Clone, Debug, Serialize)]
pub struct Metadata {
    /// The feature schema's version.
    pub feature_schema_version: u32,
    /// The interaction vector's features, in order.
    pub features: Vec<&'static str>,
    /// Executions in the log.
    pub executions: usize,
    /// Of which logged with a timeline (the others are skipped).
    pub executions_with_timeline: usize,
    /// The seed.
    pub seed: u64,
    /// The rows made of each execution.
    pub sampling: RowSampling,
    /// The training report (rows, loss, held-out Q-error, configuration).
    pub training: slogate_learn::TrainReport,
    /// The concurrency-aware predictor, fitted on the training executions,
    /// on the held-out ones (predicting from the queries running at
    /// arrival, as it does; the learned model reads every neighbour).
    pub concurrency_aware_held_out: slogate_learn::QErrors,
    /// The ONNX graph beside the weights.
    pub onnx: OnnxMetadata,
}

/// What `metadata.json` says of `model.onnx`.
#[derive(Clone, Debug, Serialize)]
pub struct OnnxMetadata {
    /// The file.
    pub file: &'static str,
    /// Its IR version.
    pub ir_version: i64,
    /// The `ai.onnx` opset it uses.
    pub opset: i64,
    /// Its inputs, in order.
    pub inputs: Vec<&'static str>,
    /// Its outputs, in order.
    pub outputs: Vec<&'static str>,
}

/// Iconq+ fitted on `log`, and how it scored.
pub struct Fitted {
    /// The model: its weights, the isolated estimates and the base.
    pub model: slogate_core::predict::iconq::IconqModel,
    /// The training report.
    pub report: slogate_learn::TrainReport,
    /// The executions held out (indices into the log).
    pub held_out: BTreeSet<usize>,
    /// Their rows as a router reads them ([`slogate_learn::at_arrival`]:
    /// the report's `held_out_at_arrival` scores these), to score another
    /// model on the same executions.
    pub held_out_at_arrival: Vec<slogate_core::predict::iconq::Example>,
}

/// Fits Iconq+ on `log`. The held-out executions (`config`'s seeded share)
/// teach nothing: not the model, its concurrency-aware base or the
/// isolated estimates its features read; they only score it.
pub fn fit(log: &[ExecutionRecord], config: &slogate_learn::TrainConfig, sampling: &RowSampling) -> Result<Fitted> {
    fit_rows(log, config, sampling, &|_| {})
}

/// [`fit`], each training row passed through `transform` first (an
/// ablation's: the evaluation drops a feature group this way).
pub fn fit_rows(
    log: &[ExecutionRecord],
    config: &slogate_learn::TrainConfig,
    sampling: &RowSampling,
    transform: &dyn Fn(&mut slogate_core::predict::iconq::Example),
) -> Result<Fitted> {
    use slogate_core::predict::iconq::{IconqModel, examples, isolated_estimator};
    let held_out = slogate_learn::held_out_of((0..log.len()).filter(|&i| log[i].timeline.is_some()), config);
    let training: Vec<ExecutionRecord> = log.iter().enumerate().filter(|(i, _)| !held_out.contains(i)).map(|(_, r)| r.clone()).collect();
    let isolated = isolated_estimator(&training);
    let mut base = slogate_core::predict::ConcurrencyAware::new(slogate_core::predict::concurrency::ConcurrencyConfig::default());
    for record in &training {
        slogate_core::predict::LatencyPredictor::observe(&mut base, &record.observation());
    }
    base.fit();
    let mut rows = examples(log, &isolated, &base, sampling);
    rows.iter_mut().for_each(transform);
    let (weights, report) = slogate_learn::train(&rows, config).map_err(|e| Error::Node(e.to_string()))?;
    let model = IconqModel { weights: Arc::new(weights), isolated: Arc::new(isolated), base: Arc::new(base) };
    let held_out_rows: Vec<_> = rows.into_iter().filter(|row| held_out.contains(&row.execution)).collect();
    let held_out_at_arrival = slogate_learn::at_arrival(&held_out_rows);
    Ok(Fitted { model, report, held_out, held_out_at_arrival })
}

/// Trains and writes the model; returns its metadata.
pub fn run(request: &TrainRequest) -> Result<Metadata> {
    use slogate_core::predict::iconq::{FEATURE_NAMES, FEATURE_SCHEMA_VERSION};
    let log = read_log(&request.source)?;
    let with_timeline = log.iter().filter(|r| r.timeline.is_some()).count();
    if with_timeline == 0 {
        return Err(Error::Config(format!(
            "the log has {} executions and none with a timeline (lane and arrival): logs written before this version cannot be read as sequences",
            log.len()
        )));
    }
    let defaults = slogate_learn::TrainConfig::default();
    let config = slogate_learn::TrainConfig { seed: request.seed, steps: request.steps.unwrap_or(defaults.steps), ..defaults };
    let sampling = RowSampling { seed: request.seed, ..RowSampling::default() };
    let fitted = fit(&log, &config, &sampling)?;
    let metadata = Metadata {
        feature_schema_version: FEATURE_SCHEMA_VERSION,
        features: FEATURE_NAMES.to_vec(),
        executions: log.len(),
        executions_with_timeline: with_timeline,
        seed: request.seed,
        sampling,
        concurrency_aware_held_out: base_on(&log, &fitted),
        training: fitted.report.clone(),
        onnx: OnnxMetadata {
            file: "model.onnx",
            ir_version: slogate_onnx::graph::IR_VERSION,
            opset: slogate_onnx::graph::OPSET,
            inputs: slogate_onnx::graph::INPUTS.to_vec(),
            outputs: slogate_onnx::graph::OUTPUTS.to_vec(),
        },
    };
    let onnx = slogate_onnx::graph::iconq_model_bytes(&fitted.model.weights).map_err(|e| Error::Node(e.to_string()))?;
    std::fs::create_dir_all(&request.out).map_err(|e| output(&request.out, e))?;
    write(&request.out.join("model.json"), fitted.model.weights.as_ref())?;
    let onnx_path = request.out.join("model.onnx");
    std::fs::write(&onnx_path, onnx).map_err(|e| output(&onnx_path, e))?;
    write(&request.out.join("metadata.json"), &metadata)?;
    Ok(metadata)
}

/// The concurrency-aware base, fitted on the training executions, on the
/// held-out ones (uncensored): the bar the learned model is read against,
/// on the same executions.
fn base_on(log: &[ExecutionRecord], fitted: &Fitted) -> slogate_learn::QErrors {
    let errors: Vec<f64> = fitted
        .held_out
        .iter()
        .map(|&i| &log[i])
        .filter(|r| !r.censored)
        .map(|r| slogate_core::predict::q_error(fitted.model.base.predict(r.template, r.size, r.neighbours_at_dispatch), r.latency))
        .collect();
    slogate_learn::q_errors(errors)
}

fn write(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("models serialise");
    std::fs::write(path, text + "\n").map_err(|e| output(path, e))
}

fn output(path: &Path, source: std::io::Error) -> Error {
    Error::Output { path: path.display().to_string(), source }
}

/// The node's trainer for its Retrainers
/// ([`slogate_actors::retrainer::TrainModel`]): fits Iconq+ on a pool's
/// executions with `steps` optimiser steps and `seed`, and scores the
/// candidate and the model in force on the same held-out executions, as a
/// router uses them (reading the queries running at arrival). The held-out
/// executions teach neither model nor the estimates their features read.
pub fn retrainer(steps: usize, seed: u64) -> slogate_actors::retrainer::TrainModel {
    use slogate_core::predict::iconq::HeldOutScore;
    Arc::new(move |log: &[ExecutionRecord], current: &slogate_core::predict::iconq::IconqWeights| {
        let config = slogate_learn::TrainConfig { seed, steps, ..slogate_learn::TrainConfig::default() };
        let fitted = fit(log, &config, &RowSampling { seed, ..RowSampling::default() }).map_err(|e| e.to_string())?;
        let held_out = |q: slogate_learn::QErrors| HeldOutScore { rows: q.rows, p50: q.p50, p90: q.p90, p95: q.p95 };
        let with_timeline = log.iter().filter(|r| r.timeline.is_some()).count();
        Ok(slogate_actors::retrainer::Candidate {
            score: held_out(fitted.report.held_out_at_arrival.clone()),
            current_score: held_out(slogate_learn::score(current, &fitted.held_out_at_arrival)),
            weights: fitted.model.weights,
            training_executions: with_timeline - fitted.held_out.len(),
            held_out_executions: fitted.held_out.len(),
        })
    })
}
