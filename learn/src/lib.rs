//! # slogate-learn
//!
//! Trains Iconq+ ([`slogate_core::predict::iconq`]) with candle on the CPU,
//! from the training rows core builds out of an execution log, and returns
//! the weights core's native inference reads.
//!
//! # Layout
//!
//! - [`TrainConfig`]: widths, steps, batch, learning rate (decayed along a
//!   cosine to a share of itself by the last step), seed, and the share of
//!   rows held out to score the model.
//! - [`train`]: the training loop. The LSTMs are unrolled by hand over
//!   padded, masked batches (a padded step keeps the state), in PyTorch's
//!   gate order, so that the weights mean exactly what core's
//!   [`slogate_core::predict::iconq::Lstm::step`] computes.
//! - [`TrainReport`]: what it learned from and how well the model scores on
//!   the held-out rows.
//!
//! The loss is AutoSLO's (§8.3.2): the absolute error in log space (the log
//! of the Q-error) for exact labels, and for censored ones (timeouts,
//! sampled prefixes) only the part below the lower bound.
//!
//! # Properties
//!
//! - (A) The same rows, configuration and seed give the same weights: the
//!   initial weights and the batches come from a seeded RNG, and candle's
//!   CPU kernels are deterministic on one thread.
//! - (B) The weights pass [`IconqWeights::check`], and candle's forward pass
//!   and core's native one agree on every row (to float rounding).

use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};
use slogate_core::predict::iconq::{CONTEXT_FEATURES, Dense, Example, FEATURE_SCHEMA_VERSION, FEATURES, Hidden, IconqWeights, Lstm, Reads, TARGET_FEATURES, clip, context_features};

/// The crate's error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// candle failed.
    #[error("training failed: {0}")]
    Candle(#[from] candle_core::Error),
    /// Nothing to learn from.
    #[error("no training rows: {0}")]
    NoRows(String),
}

/// The crate's result.
pub type Result<T> = std::result::Result<T, Error>;

/// How to train.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Hidden width of each LSTM.
    pub lstm_hidden: usize,
    /// Width of the head's hidden layer.
    pub head_hidden: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Rows per step.
    pub batch: usize,
    /// AdamW's learning rate at the first step.
    pub learning_rate: f64,
    /// The learning rate at the last step, as a share of the first: the
    /// rate follows a cosine from one to the other (1: constant).
    pub final_learning_rate_share: f64,
    /// Seeds the initial weights, the split and the batches.
    pub seed: u64,
    /// Share of the rows held out to score the model.
    pub held_out_share: f64,
    /// Neighbours read per side, at most (the nearest to the target's
    /// arrival are kept).
    pub neighbours_max: usize,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig { lstm_hidden: 32, head_hidden: 32, steps: 2000, batch: 128, learning_rate: 0.005, final_learning_rate_share: 0.05, seed: 1, held_out_share: 0.2, neighbours_max: 32 }
    }
}

/// Q-error percentiles.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QErrors {
    /// Rows scored (exact labels only).
    pub rows: usize,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
}

/// What a training run learned from and how it scores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainReport {
    /// Rows trained on (of which censored).
    pub train_rows: usize,
    /// Censored rows among them.
    pub train_censored: usize,
    /// Rows held out.
    pub held_out_rows: usize,
    /// The loss over the last 50 steps, mean.
    pub final_loss: f64,
    /// Q-error on the held-out executions, reading every neighbour.
    pub held_out: QErrors,
    /// The same, reading only the neighbours running at arrival (what a
    /// router knows when it places the query).
    pub held_out_at_arrival: QErrors,
    /// The configuration.
    pub config: TrainConfig,
}

/// The percentiles of `errors` (Q-errors).
pub fn q_errors(mut errors: Vec<f64>) -> QErrors {
    errors.sort_by(f64::total_cmp);
    let at = |q: f64| slogate_core::stats::percentile(&errors, q);
    QErrors { rows: errors.len(), p50: at(0.5), p90: at(0.9), p95: at(0.95) }
}

/// Each execution's every-neighbour row of `rows` as a router reads it:
/// only the neighbours running at its arrival, its final latency the
/// label.
pub fn at_arrival(rows: &[Example]) -> Vec<Example> {
    rows.iter().filter(|r| r.reads == Reads::Every).map(|r| Example { after: Vec::new(), reads: Reads::AtArrival, ..r.clone() }).collect()
}

/// A model's Q-error on one row: its prediction against the row's label
/// (for a censored row, against the lower bound).
pub fn row_q_error(weights: &IconqWeights, row: &Example) -> f64 {
    let memory = weights.memory(&row.before, &row.after);
    let predicted = f64::from(weights.head(&memory, &row.target, row.reads == Reads::Every)) + f64::from(row.ln_base_s);
    (predicted - f64::from(row.ln_latency_s)).abs().exp()
}

/// The Q-error percentiles of a model on `rows` (exact labels only).
pub fn score(weights: &IconqWeights, rows: &[Example]) -> QErrors {
    q_errors(rows.iter().filter(|row| !row.censored).map(|row| row_q_error(weights, row)).collect())
}

/// The neighbours a row is read with ([`clip`]).
pub fn clipped(row: &Example, max: usize) -> (&[[f32; FEATURES]], &[[f32; FEATURES]]) {
    clip(&row.before, &row.after, max)
}

struct LstmVars {
    w_ih: Var,
    w_hh: Var,
    b_ih: Var,
    b_hh: Var,
    hidden: usize,
}

struct Model {
    before: LstmVars,
    after: LstmVars,
    hidden_w: Var,
    hidden_b: Var,
    out_w: Var,
    out_b: Var,
}

fn uniform(rng: &mut SmallRng, n: usize, bound: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-bound..bound)).collect()
}

impl Model {
    fn new(config: &TrainConfig, rng: &mut SmallRng, device: &Device) -> Result<Model> {
        let h = config.lstm_hidden;
        let lstm = |rng: &mut SmallRng| -> Result<LstmVars> {
            // PyTorch's initialisation: U(−1/√H, 1/√H).
            let bound = 1.0 / (h as f32).sqrt();
            Ok(LstmVars {
                w_ih: Var::from_slice(&uniform(rng, 4 * h * FEATURES, bound), (4 * h, FEATURES), device)?,
                w_hh: Var::from_slice(&uniform(rng, 4 * h * h, bound), (4 * h, h), device)?,
                b_ih: Var::from_slice(&uniform(rng, 4 * h, bound), 4 * h, device)?,
                b_hh: Var::from_slice(&uniform(rng, 4 * h, bound), 4 * h, device)?,
                hidden: h,
            })
        };
        let before = lstm(rng)?;
        let after = lstm(rng)?;
        let inputs = 2 * h + TARGET_FEATURES + CONTEXT_FEATURES;
        let width = config.head_hidden;
        let bound = 1.0 / (inputs as f32).sqrt();
        Ok(Model {
            before,
            after,
            hidden_w: Var::from_slice(&uniform(rng, width * inputs, bound), (width, inputs), device)?,
            hidden_b: Var::from_slice(&uniform(rng, width, bound), width, device)?,
            out_w: Var::from_slice(&uniform(rng, width, 1.0 / (width as f32).sqrt()), (1, width), device)?,
            out_b: Var::from_slice(&[0.0f32], 1, device)?,
        })
    }

    fn vars(&self) -> Vec<Var> {
        let mut vars = Vec::new();
        for lstm in [&self.before, &self.after] {
            vars.extend([lstm.w_ih.clone(), lstm.w_hh.clone(), lstm.b_ih.clone(), lstm.b_hh.clone()]);
        }
        vars.extend([self.hidden_w.clone(), self.hidden_b.clone(), self.out_w.clone(), self.out_b.clone()]);
        vars
    }

    /// Runs one LSTM over `steps` (each `(x: B×F, mask: B×1)`) and returns
    /// the final hidden state, `B × H`.
    fn run(lstm: &LstmVars, steps: &[(Tensor, Tensor)], batch: usize, device: &Device) -> Result<Tensor> {
        let hidden = lstm.hidden;
        let mut h = Tensor::zeros((batch, hidden), DType::F32, device)?;
        let mut c = Tensor::zeros((batch, hidden), DType::F32, device)?;
        let bias = (lstm.b_ih.as_tensor() + lstm.b_hh.as_tensor())?;
        for (x, mask) in steps {
            let gates = x.matmul(&lstm.w_ih.as_tensor().t()?)?.add(&h.matmul(&lstm.w_hh.as_tensor().t()?)?)?.broadcast_add(&bias)?;
            let chunks = gates.chunk(4, 1)?;
            let i = candle_nn::ops::sigmoid(&chunks[0])?;
            let f = candle_nn::ops::sigmoid(&chunks[1])?;
            let g = chunks[2].tanh()?;
            let o = candle_nn::ops::sigmoid(&chunks[3])?;
            let c_next = f.mul(&c)?.add(&i.mul(&g)?)?;
            let h_next = o.mul(&c_next.tanh()?)?;
            // A padded step keeps the state.
            let keep = mask.affine(-1.0, 1.0)?;
            c = c_next.broadcast_mul(mask)?.add(&c.broadcast_mul(&keep)?)?;
            h = h_next.broadcast_mul(mask)?.add(&h.broadcast_mul(&keep)?)?;
        }
        Ok(h)
    }

    /// The predicted `ln(latency / ℓ̂_q)` of each row of the batch, `B`.
    fn forward(&self, rows: &[&Example], neighbours_max: usize, device: &Device) -> Result<Tensor> {
        let batch = rows.len();
        let side = |pick: &dyn Fn(&Example) -> &[[f32; FEATURES]]| -> Result<Vec<(Tensor, Tensor)>> {
            let longest = rows.iter().map(|r| pick(r).len()).max().unwrap_or(0);
            (0..longest)
                .map(|t| {
                    let mut x = vec![0.0f32; batch * FEATURES];
                    let mut mask = vec![0.0f32; batch];
                    for (b, row) in rows.iter().enumerate() {
                        if let Some(vector) = pick(row).get(t) {
                            x[b * FEATURES..(b + 1) * FEATURES].copy_from_slice(vector);
                            mask[b] = 1.0;
                        }
                    }
                    Ok((Tensor::from_vec(x, (batch, FEATURES), device)?, Tensor::from_vec(mask, (batch, 1), device)?))
                })
                .collect()
        };
        let before = side(&|row| clipped(row, neighbours_max).0)?;
        let after = side(&|row| clipped(row, neighbours_max).1)?;
        let h_before = Model::run(&self.before, &before, batch, device)?;
        let h_after = Model::run(&self.after, &after, batch, device)?;
        let target: Vec<f32> = rows.iter().flat_map(|r| r.target).collect();
        let target = Tensor::from_vec(target, (batch, TARGET_FEATURES), device)?;
        let counts: Vec<f32> = rows.iter().flat_map(|r| context_features(r.before.len(), r.after.len(), r.reads == Reads::Every)).collect();
        let counts = Tensor::from_vec(counts, (batch, CONTEXT_FEATURES), device)?;
        let inputs = Tensor::cat(&[&h_before, &h_after, &target, &counts], 1)?;
        let hidden = inputs.matmul(&self.hidden_w.as_tensor().t()?)?.broadcast_add(self.hidden_b.as_tensor())?.relu()?;
        let out = hidden.matmul(&self.out_w.as_tensor().t()?)?.broadcast_add(self.out_b.as_tensor())?;
        Ok(out.squeeze(D::Minus1)?)
    }

    fn weights(&self, neighbours_max: usize) -> Result<IconqWeights> {
        let flat = |var: &Var| -> Result<Vec<f32>> { Ok(var.as_tensor().flatten_all()?.to_vec1::<f32>()?) };
        let lstm = |vars: &LstmVars| -> Result<Lstm> {
            Ok(Lstm { input: FEATURES, hidden: vars.hidden, w_ih: flat(&vars.w_ih)?, w_hh: flat(&vars.w_hh)?, b_ih: flat(&vars.b_ih)?, b_hh: flat(&vars.b_hh)? })
        };
        let hidden_b = flat(&self.hidden_b)?;
        Ok(IconqWeights {
            schema_version: FEATURE_SCHEMA_VERSION,
            before: lstm(&self.before)?,
            after: lstm(&self.after)?,
            hidden: Hidden { width: hidden_b.len(), w: flat(&self.hidden_w)?, b: hidden_b },
            out: Dense { w: flat(&self.out_w)?, b: flat(&self.out_b)?[0] },
            neighbours_max,
        })
    }
}

/// The loss of a batch: |error| in log space for exact labels, the part
/// below the bound for censored ones.
fn loss(predicted: &Tensor, rows: &[&Example], device: &Device) -> Result<Tensor> {
    let labels: Vec<f32> = rows.iter().map(|r| r.ln_latency_s - r.ln_base_s).collect();
    let censored: Vec<f32> = rows.iter().map(|r| f32::from(u8::from(r.censored))).collect();
    let labels = Tensor::from_vec(labels, rows.len(), device)?;
    let censored = Tensor::from_vec(censored, rows.len(), device)?;
    let error = labels.sub(predicted)?;
    // Exact: |label − predicted|; censored: max(0, label − predicted).
    let exact = error.abs()?;
    let below = error.relu()?;
    let exact_share = censored.affine(-1.0, 1.0)?;
    Ok(exact.mul(&exact_share)?.add(&below.mul(&censored)?)?.mean_all()?)
}

/// The learning rate at `step`: a cosine from `learning_rate` down to
/// `learning_rate × final_learning_rate_share` at the last step.
fn learning_rate_at(config: &TrainConfig, step: usize) -> f64 {
    let progress = step as f64 / config.steps.saturating_sub(1).max(1) as f64;
    let last = config.learning_rate * config.final_learning_rate_share;
    last + (config.learning_rate - last) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
}

/// The executions held out of `rows`: a seeded share of them, every row
/// of an execution (its censored samples too) on the same side.
pub fn held_out_executions(rows: &[Example], config: &TrainConfig) -> std::collections::BTreeSet<usize> {
    held_out_of(rows.iter().map(|r| r.execution), config)
}

/// The executions held out of those indexed `executions` (the same set
/// [`held_out_executions`] picks of their rows).
pub fn held_out_of(executions: impl Iterator<Item = usize>, config: &TrainConfig) -> std::collections::BTreeSet<usize> {
    let mut executions: Vec<usize> = executions.collect();
    executions.sort_unstable();
    executions.dedup();
    let mut rng = SmallRng::seed_from_u64(config.seed ^ 0x005E_ED0F_4E1D);
    executions.shuffle(&mut rng);
    let count = ((executions.len() as f64) * config.held_out_share.clamp(0.0, 0.9)).round() as usize;
    executions[..count].iter().copied().collect()
}

/// Trains on `rows`, holding out [`held_out_executions`] to score the
/// model. See the crate docs.
pub fn train(rows: &[Example], config: &TrainConfig) -> Result<(IconqWeights, TrainReport)> {
    if rows.is_empty() {
        return Err(Error::NoRows("the log has no executions with a timeline".into()));
    }
    let held_out_set = held_out_executions(rows, config);
    let (held_out, training): (Vec<usize>, Vec<usize>) = (0..rows.len()).partition(|&i| held_out_set.contains(&rows[i].execution));
    if training.is_empty() {
        return Err(Error::NoRows(format!("{} rows leave none to train on after holding out {} executions", rows.len(), held_out_set.len())));
    }
    let device = Device::Cpu;
    let mut rng = SmallRng::seed_from_u64(config.seed);
    let model = Model::new(config, &mut rng, &device)?;
    let mut optimiser = AdamW::new(model.vars(), ParamsAdamW { lr: config.learning_rate, weight_decay: 1e-4, ..ParamsAdamW::default() })?;
    let mut recent_losses = std::collections::VecDeque::new();
    for step in 0..config.steps {
        optimiser.set_learning_rate(learning_rate_at(config, step));
        let batch: Vec<&Example> = (0..config.batch.min(training.len())).map(|_| &rows[training[rng.random_range(0..training.len())]]).collect();
        let predicted = model.forward(&batch, config.neighbours_max, &device)?;
        let loss = loss(&predicted, &batch, &device)?;
        optimiser.backward_step(&loss)?;
        if recent_losses.len() == 50 {
            recent_losses.pop_front();
        }
        recent_losses.push_back(f64::from(loss.to_scalar::<f32>()?));
    }
    let weights = model.weights(config.neighbours_max)?;
    let held_out_rows: Vec<Example> = held_out.iter().map(|&i| rows[i].clone()).collect();
    let report = TrainReport {
        train_rows: training.len(),
        train_censored: training.iter().filter(|&&i| rows[i].censored).count(),
        held_out_rows: held_out.len(),
        final_loss: recent_losses.iter().sum::<f64>() / recent_losses.len().max(1) as f64,
        held_out: score(&weights, &held_out_rows.iter().filter(|r| r.reads == Reads::Every).cloned().collect::<Vec<_>>()),
        held_out_at_arrival: score(&weights, &at_arrival(&held_out_rows)),
        config: config.clone(),
    };
    Ok((weights, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use slogate_core::model::Rpu;
    use slogate_core::predict::iconq::{Member, interaction, target_features};

    /// Rows from a synthetic rule: latency = isolated × (1 + 0.5 per
    /// neighbour before + 0.25 per neighbour after).
    fn synthetic(count: usize, seed: u64) -> Vec<Example> {
        let mut rng = SmallRng::seed_from_u64(seed);
        (0..count)
            .map(|n| {
                let isolated_s: f64 = rng.random_range(1.0..30.0);
                let size = Rpu([4, 8, 16, 32][rng.random_range(0..4)]);
                let target = Member { isolated_s, arrival_s: 100.0 };
                let (nb, na) = (rng.random_range(0..6usize), rng.random_range(0..4usize));
                let neighbour = |rng: &mut SmallRng, before: bool| {
                    let gap: f64 = rng.random_range(0.5..20.0);
                    interaction(target, Member { isolated_s: rng.random_range(1.0..30.0), arrival_s: if before { 100.0 - gap } else { 100.0 + gap } }, size)
                };
                let before: Vec<_> = (0..nb).map(|_| neighbour(&mut rng, true)).collect();
                let after: Vec<_> = (0..na).map(|_| neighbour(&mut rng, false)).collect();
                let latency = isolated_s * (1.0 + 0.5 * nb as f64 + 0.25 * na as f64);
                Example {
                    target: target_features(isolated_s, size),
                    ln_base_s: isolated_s.ln() as f32,
                    before,
                    after,
                    ln_latency_s: latency.ln() as f32,
                    censored: false,
                    size,
                    execution: n,
                    reads: slogate_core::predict::iconq::Reads::Every,
                }
            })
            .collect()
    }

    proptest::proptest! {
        #[test]
        fn the_learning_rate_falls_from_the_first_rate_to_its_final_share_and_never_rises(
            steps in 1usize..5_000,
            learning_rate in 1e-4f64..0.1,
            final_share in 0.0f64..=1.0,
        ) {
            let config = TrainConfig { steps, learning_rate, final_learning_rate_share: final_share, ..TrainConfig::default() };
            let rates: Vec<f64> = (0..steps).map(|step| learning_rate_at(&config, step)).collect();
            proptest::prop_assert!((rates[0] - learning_rate).abs() <= 1e-12 * learning_rate);
            if steps > 1 {
                proptest::prop_assert!((rates[steps - 1] - learning_rate * final_share).abs() <= 1e-12 * learning_rate);
            }
            proptest::prop_assert!(rates.windows(2).all(|pair| pair[1] <= pair[0] + 1e-15));
        }
    }

    #[test]
    fn training_learns_a_neighbour_rule_that_the_isolated_estimate_misses() {
        let rows = synthetic(600, 3);
        let config = TrainConfig { steps: 300, lstm_hidden: 16, head_hidden: 16, batch: 64, learning_rate: 0.01, ..TrainConfig::default() };
        let (weights, report) = train(&rows, &config).unwrap();
        weights.check().unwrap();
        // The isolated estimate alone: Q-error (1 + 0.5 b + 0.25 a), a
        // median of about 2 on these rows.
        let mut isolated: Vec<f64> = rows.iter().map(|r| f64::from(r.ln_latency_s - r.ln_base_s).exp()).collect();
        isolated.sort_by(f64::total_cmp);
        let isolated_p50 = isolated[isolated.len() / 2];
        assert!(report.held_out.p50 < 1.25 && report.held_out.p50 < isolated_p50 / 1.5, "{report:?} vs the isolated estimate's median {isolated_p50}");
    }

    #[test]
    fn the_same_rows_and_seed_give_the_same_weights_and_candle_agrees_with_core() {
        let rows = synthetic(120, 5);
        let config = TrainConfig { steps: 20, batch: 16, lstm_hidden: 8, head_hidden: 8, ..TrainConfig::default() };
        let (first, _) = train(&rows, &config).unwrap();
        let (second, _) = train(&rows, &config).unwrap();
        assert_eq!(first, second);
        // candle's forward pass (through the training model) against
        // core's native one, on every row.
        let device = Device::Cpu;
        let mut rng = SmallRng::seed_from_u64(9);
        let model = Model::new(&config, &mut rng, &device).unwrap();
        let weights = model.weights(config.neighbours_max).unwrap();
        let batch: Vec<&Example> = rows.iter().collect();
        let candle: Vec<f32> = model.forward(&batch, config.neighbours_max, &device).unwrap().to_vec1().unwrap();
        for (row, from_candle) in rows.iter().zip(candle) {
            let memory = weights.memory(&row.before, &row.after);
            let native = weights.head(&memory, &row.target, row.reads == Reads::Every);
            assert!((native - from_candle).abs() < 1e-5, "{native} vs {from_candle}");
        }
    }

    #[test]
    fn censored_rows_only_push_predictions_up() {
        // One censored row whose bound is far above the prediction pulls
        // it up; one far below costs nothing.
        let mut rows = synthetic(2, 7);
        rows[0].censored = true;
        rows[0].ln_latency_s = rows[0].ln_base_s + 10.0;
        rows[1].censored = true;
        rows[1].ln_latency_s = rows[1].ln_base_s - 10.0;
        let device = Device::Cpu;
        let mut rng = SmallRng::seed_from_u64(1);
        let model = Model::new(&TrainConfig::default(), &mut rng, &device).unwrap();
        let loss_of = |row: &Example| {
            let predicted = model.forward(&[row], 32, &device).unwrap();
            loss(&predicted, &[row], &device).unwrap().to_scalar::<f32>().unwrap()
        };
        assert_eq!(loss_of(&rows[1]), 0.0, "a bound far below the prediction costs nothing");
        let above = loss_of(&rows[0]);
        assert!(above > 5.0, "a bound far above costs its distance: {above}");
    }
}
