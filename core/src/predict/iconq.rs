//! Iconq+ (AutoSLO §4): a concurrency-aware latency model that reads a
//! query's neighbours as a sequence, with an LSTM, instead of counting
//! them.
//!
//! For a target query `q` on a cluster of size `s`, each neighbour `n` (a
//! query whose run overlaps `q`'s) gives an **interaction vector**
//! ([`interaction`], [`FEATURE_NAMES`]): both queries' isolated estimates at
//! `s` (`ℓ̂_q`, `ℓ̂_n`, from an estimator trained on executions that ran
//! alone), when `n` arrived relative to `q`, how long `n` had run and was
//! predicted still to run when `q` arrived, and §4.2's size features (the
//! size, its log, its inverse, `ℓ̂·s` for each, and `(ℓ̂_q+ℓ̂_n)/s`).
//! Neighbours that arrived before `q` feed one LSTM and those that arrived
//! after feed another, both in chronological order (§4.4), so that a new
//! arrival advances a running query's "after" state by one step: an
//! incremental prediction is O(1) per running query, O(neighbours) per
//! arrival. A dense head reads both final hidden states, `q`'s own
//! features ([`target_features`]) and the context ([`context_features`]:
//! how many neighbours each side, and whether the later ones are all there
//! are) and gives the log of the latency relative to a **base
//! prediction**: the concurrency-aware predictor's from the queries running
//! at `q`'s arrival ([`Estimates`]). The model predicts in log space and
//! refines the count-based estimate with what the sequences say. (Iconq
//! starts from the isolated estimate alone; starting from the count-based
//! one kept the predictions at arrival, where the later neighbours are not
//! known yet, from a heavy under-prediction tail: on the emulator's
//! training run, seed 1, held-out p95 Q-error 4.77 against 247.56.)
//!
//! Rows come three ways ([`Reads`]): every neighbour the execution had,
//! with its latency (the neighbours after it complete); only those running
//! when it arrived, with its final latency (what a router knows when it
//! places it, the later ones to come); and sampled prefixes, as lower
//! bounds.
//!
//! [`IconqPredictor`] runs the model on the router's path from the same
//! weights laid out for speed (private `Kernels`: each LSTM's two weight
//! matrices fused and stored by column, so that a step is one
//! column-order matrix–vector product that vectorises; a branch-free
//! polynomial `exp`; the head's hidden layer split so that the part a
//! query's memory fixes is computed once, [`HeadCache`]; and what a
//! running query brings to the next arrival, its features' own terms, its
//! estimates and the part of its next LSTM step that does not depend on
//! the newcomer, kept with its memory until the base refits,
//! [`StepCache`]: every arrival scores every cluster, and only the chosen
//! cluster's memories change; a placement is scored with the step and the
//! head on the stack, and only the committed one builds the running
//! queries' stepped memories, property (I)). The weights' own methods are
//! the plain reference it is tested against.
//!
//! The weights ([`IconqWeights`]) are trained elsewhere (the `slogate-learn`
//! crate, with candle) on [`examples`] built from an execution log; the
//! LSTM here uses PyTorch's (and candle's) gate order, i, f, g, o.
//! The censored rows (§4.3): a query that was still
//! running when a later neighbour arrived took at least that long with
//! only the neighbours before it, so the prefix is a lower bound; timeouts
//! are lower bounds too.
//!
//! # Properties
//!
//! - (A) Incremental and full inference agree: advancing the "after" state
//!   one arrival at a time gives the prediction a full pass over the same
//!   neighbours gives (to float rounding).
//! - (B) Predictions are positive and finite for any finite inputs.
//! - (C) [`examples`] is deterministic in its seed, a censored example's
//!   label never exceeds its execution's latency, and, asked for rows at
//!   arrival, it gives every execution exactly one (its every-neighbour
//!   row without the later neighbours), whether or not a later query
//!   overlapped it.
//! - (D) [`IconqPredictor`]'s placements predict positive latencies and
//!   never lower a running query's prediction (the monotonicity guard),
//!   and each query's memory is what a full pass over its neighbours so
//!   far reads (A, through the router's interface).
//! - (E) [`replaces`] never prefers a candidate that scored worse at p90;
//!   after [`LatencyPredictor::install_model`], no memory the previous
//!   model read is continued.
//! - (F) The predictor's layout computes what the reference computes
//!   (states to 1e-5, predictions to 1e-4 relative), with or without the
//!   head's cache.
//! - (G) The kernels' AVX2 build, chosen at run time when the CPU has it,
//!   computes bit for bit what the baseline build computes: a decision
//!   does not depend on the machine it is made on.
//! - (H) What a running query's memory caches for the next arrival
//!   ([`StepCache`]) changes no prediction: a placement from cached memories
//!   predicts, to the bit, what it predicts from the same memories with
//!   empty caches, and still does after the base predictor refits.
//! - (I) Scoring a placement ([`LatencyPredictor::score_placement`], which
//!   builds no running query's stepped memory) predicts, to the bit, what
//!   predicting from the stepped memories gives, with or without the
//!   head's and the step's caches; completing it
//!   ([`LatencyPredictor::complete_placement`]) gives, to the bit and
//!   memories included, the placement that stepping every running query's
//!   memory by the newcomer gives.

use std::sync::Arc;

use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde::{Deserialize, Serialize};

use crate::model::{Rpu, TemplateId};
use crate::predict::LatencyPredictor;
use crate::predict::isolated::{IsolatedConfig, IsolatedEstimator};
use crate::reservoir::ExecutionRecord;
use crate::time::Duration;

/// The version of the feature schema below: a model trained on another
/// is refused.
pub const FEATURE_SCHEMA_VERSION: u32 = 1;

/// Features of one interaction vector.
pub const FEATURES: usize = 11;

/// Their names, in order.
pub const FEATURE_NAMES: [&str; FEATURES] = [
    "ln_isolated_target_s",
    "ln_isolated_neighbour_s",
    "signed_ln_arrival_gap_s",
    "ln_neighbour_elapsed_at_target_arrival_s",
    "ln_neighbour_remaining_at_target_arrival_s",
    "size_over_32",
    "log2_size_over_5",
    "32_over_size",
    "ln_isolated_target_x_size",
    "ln_isolated_neighbour_x_size",
    "ln_pair_isolated_over_size",
];

/// Features of the target query itself.
pub const TARGET_FEATURES: usize = 5;

/// Features of what was read: `ln(1 + before)` and `ln(1 + after)`
/// neighbours, unclipped (the LSTMs read at most
/// [`IconqWeights::neighbours_max`] a side; the counts say how many there
/// were), and whether the neighbours after the target are all there are
/// (1: the query ended, as when scoring a finished execution; 0: more may
/// come, as when a router places it or it is still running, and the model
/// predicts its final latency from what it knows so far).
pub const CONTEXT_FEATURES: usize = 3;

/// The context features of `before` and `after` neighbours, the latter
/// `complete` or not.
pub fn context_features(before: usize, after: usize, complete: bool) -> [f32; CONTEXT_FEATURES] {
    [(before as f64).ln_1p() as f32, (after as f64).ln_1p() as f32, f32::from(u8::from(complete))]
}

/// One query as the features see it: its isolated estimate on the cluster
/// and its arrival.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Member {
    /// Its isolated latency estimate at the cluster's size, seconds.
    pub isolated_s: f64,
    /// Its arrival, seconds on any clock both members share.
    pub arrival_s: f64,
}

fn ln_seconds(seconds: f64) -> f64 {
    seconds.max(1e-3).ln()
}

fn size_features(size: Rpu) -> (f64, f64, f64) {
    let s = f64::from(size.0.max(1));
    (s / 32.0, s.log2() / 5.0, 32.0 / s)
}

/// The interaction vector of `neighbour` for `target` on a cluster of
/// `size`.
pub fn interaction(target: Member, neighbour: Member, size: Rpu) -> [f32; FEATURES] {
    Terms::new(target, size).interaction(&Terms::new(neighbour, size))
}

/// What the interaction features read of one query on a cluster of one
/// size: computed once per query, as the predictor pairs it with every
/// neighbour ([`Terms::interaction`] is [`interaction`], to the bit).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Terms {
    member: Member,
    size: Rpu,
    /// The features that depend on this query alone, in the order
    /// [`OWN_FEATURES`] names: `ln ℓ̂`, the size's three, `ln(ℓ̂·s)`.
    own: [f32; OWN_FEATURES.len()],
    /// `ln(1 + ℓ̂)`: a later neighbour's predicted remaining time's
    /// feature, the same for every target.
    ln_1p_isolated: f64,
}

impl Terms {
    fn new(member: Member, size: Rpu) -> Terms {
        let (size_scaled, log_size, inverse_size) = size_features(size);
        let s = f64::from(size.0.max(1));
        let own = [ln_seconds(member.isolated_s), size_scaled, log_size, inverse_size, ln_seconds(member.isolated_s * s)].map(|x| x as f32);
        Terms { member, size, own, ln_1p_isolated: member.isolated_s.ln_1p() }
    }

    /// The interaction vector of `neighbour` for this query, the target.
    fn interaction(&self, neighbour: &Terms) -> [f32; FEATURES] {
        let (target, them) = (self.member, neighbour.member);
        let s = f64::from(self.size.0.max(1));
        let gap = them.arrival_s - target.arrival_s;
        let ln_1p_gap = gap.abs().ln_1p();
        self.interaction_from(neighbour, ln_1p_gap, ln_seconds((target.isolated_s + them.isolated_s) / s))
    }

    /// [`Terms::interaction`] both ways, `(self reads other, other reads
    /// self)`, to the bit, computing the logarithms the two share once:
    /// the gap between the arrivals and the pair's summed estimate. A
    /// placement pairs the newcomer with every running query so. Both at
    /// one size.
    fn interactions_both_ways(&self, other: &Terms) -> ([f32; FEATURES], [f32; FEATURES]) {
        debug_assert_eq!(self.size, other.size, "a pair on one cluster");
        let s = f64::from(self.size.0.max(1));
        // `b − a` is `−(a − b)` exactly, so the gap's size is the same
        // both ways; the sum is commutative.
        let ln_1p_gap = (other.member.arrival_s - self.member.arrival_s).abs().ln_1p();
        let ln_sum = ln_seconds((self.member.isolated_s + other.member.isolated_s) / s);
        (self.interaction_from(other, ln_1p_gap, ln_sum), other.interaction_from(self, ln_1p_gap, ln_sum))
    }

    /// [`Terms::interaction`] given `ln(1 + |gap|)` and `ln_sum`, the log
    /// of the summed estimates per RPU.
    #[inline(always)]
    fn interaction_from(&self, neighbour: &Terms, ln_1p_gap: f64, ln_sum: f64) -> [f32; FEATURES] {
        let (target, them) = (self.member, neighbour.member);
        let gap = them.arrival_s - target.arrival_s;
        // When the target arrived, how long the neighbour had run and how
        // long it was predicted still to run (zero for a later neighbour).
        // The elapsed time is `|gap|` or `+0` (the difference of two equal
        // arrivals is `+0`), so its log is the gap's or zero.
        let elapsed = (target.arrival_s - them.arrival_s).max(0.0);
        let ln_1p_elapsed = if elapsed > 0.0 { ln_1p_gap } else { 0.0 };
        let ln_1p_remaining = if gap < 0.0 { (them.isolated_s - elapsed).max(0.0).ln_1p() } else { neighbour.ln_1p_isolated };
        let [ln_isolated, size_scaled, log_size, inverse_size, ln_isolated_x_size] = self.own;
        [
            ln_isolated,
            neighbour.own[0],
            (gap.signum() * ln_1p_gap) as f32,
            ln_1p_elapsed as f32,
            ln_1p_remaining as f32,
            size_scaled,
            log_size,
            inverse_size,
            ln_isolated_x_size,
            neighbour.own[4],
            ln_sum as f32,
        ]
    }
}

/// The target's own features on a cluster of `size`.
pub fn target_features(isolated_s: f64, size: Rpu) -> [f32; TARGET_FEATURES] {
    let (size_scaled, log_size, inverse_size) = size_features(size);
    [ln_seconds(isolated_s), size_scaled, log_size, inverse_size, ln_seconds(isolated_s * f64::from(size.0.max(1)))].map(|x| x as f32)
}

/// An LSTM layer's weights, PyTorch's layout and gate order (i, f, g, o):
/// `w_ih` is `4H × I` and `w_hh` `4H × H`, row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lstm {
    /// Input width `I`.
    pub input: usize,
    /// Hidden width `H`.
    pub hidden: usize,
    /// Input weights.
    pub w_ih: Vec<f32>,
    /// Recurrent weights.
    pub w_hh: Vec<f32>,
    /// Input bias, `4H`.
    pub b_ih: Vec<f32>,
    /// Recurrent bias, `4H`.
    pub b_hh: Vec<f32>,
}

/// An LSTM's state: hidden then cell, `2H` values.
#[derive(Clone, Debug, PartialEq)]
pub struct LstmState(pub Vec<f32>);

/// `eˣ` without libm, branch-free, so that a loop over a slice of them
/// compiles to SIMD: Cephes' `expf` (range reduction by `ln 2` in two
/// parts, a degree-5 polynomial, the exponent set through the bits),
/// within 2e-7 relative of libm's over the clamped range; below −87 it
/// gives about 1.6e-38 and above 88 about 1.7e38 instead of 0 and ∞.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // 1.5 · 2²³: adding it rounds to an integer held in the low bits.
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUNDER;
    let n = shifted - ROUNDER;
    let r = x - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 0.166_666_65) * r + 0.5;
    let polynomial = p * r * r + r + 1.0;
    let exponent = (shifted.to_bits() as i32).wrapping_sub(0x4B40_0000);
    polynomial * f32::from_bits((exponent + 127).wrapping_shl(23) as u32)
}

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `tanh` through `exp`: `2σ(2x) − 1`, within 1e-6 of libm's `tanhf`,
/// which goes through `expm1` and took a third of an LSTM step's time.
#[inline(always)]
fn tanh(x: f32) -> f32 {
    2.0 / (1.0 + exp(-2.0 * x)) - 1.0
}

/// The state after an LSTM step from gate pre-activations `gates` (four
/// blocks of `H`, PyTorch's order i, f, g, o) and the cell `c`.
fn activate(mut gates: Vec<f32>, c: &[f32]) -> LstmState {
    activate_slice(&mut gates, c);
    gates.truncate(2 * c.len());
    LstmState(gates)
}

/// [`activate`] in place: the new hidden state and cell in `gates`'
/// first two blocks.
fn activate_slice(gates: &mut [f32], c: &[f32]) {
    // On the widest instructions the CPU has (see [`wide`]).
    pulp::Arch::new().dispatch(wide::Activate { gates, c });
}

/// [`activate`]'s arithmetic: the new hidden state and cell in place of
/// the gates' first two blocks.
#[inline(always)]
fn activate_in_place(gates: &mut [f32], c: &[f32]) {
    let hidden = c.len();
    // Each gate block through its activation, a slice at a time (so that
    // the loops vectorise): i, f and o squash, g is tanh.
    let (squashed, rest) = gates.split_at_mut(2 * hidden);
    let (g, o) = rest.split_at_mut(hidden);
    for v in squashed.iter_mut() {
        *v = sigmoid(*v);
    }
    for v in o.iter_mut() {
        *v = sigmoid(*v);
    }
    for v in g.iter_mut() {
        *v = tanh(*v);
    }
    // The new state in place of i and f: each unit reads only its own
    // gates (zipped, not indexed, so that no bounds check keeps the loops
    // scalar).
    let (i, f) = squashed.split_at_mut(hidden);
    for (((f, &c), &i), &g) in f.iter_mut().zip(c).zip(i.iter()).zip(g.iter()) {
        *f = *f * c + i * g;
    }
    for ((i, &o), &f) in i.iter_mut().zip(o.iter()).zip(f.iter()) {
        *i = o * tanh(f);
    }
}

/// `out += Σ_j z_j · column_j`, the columns `out.len()` long and back to
/// back: a matrix–vector product in column order, which compiles to SIMD
/// along the outputs (three times the row order's speed for an LSTM's
/// gates). Outputs go in blocks of `BLOCK` held in registers across the
/// columns, the rest in blocks of 32, 16 and 8 (a head of 32 outputs is
/// narrower than AVX's block of 64), then one by one; each output still
/// sums its columns in order, so the result is the same whatever the
/// blocks or the vector width (see [`wide`]).
#[inline(always)]
fn add_columns_in_blocks<const BLOCK: usize>(out: &mut [f32], columns: &[f32], z: &[f32]) {
    let n = out.len();
    let mut start = 0;
    while start + BLOCK <= n {
        add_block::<BLOCK>(out, columns, z, start);
        start += BLOCK;
    }
    if BLOCK > 32 && start + 32 <= n {
        add_block::<32>(out, columns, z, start);
        start += 32;
    }
    if BLOCK > 16 && start + 16 <= n {
        add_block::<16>(out, columns, z, start);
        start += 16;
    }
    if BLOCK > 8 && start + 8 <= n {
        add_block::<8>(out, columns, z, start);
        start += 8;
    }
    if start < n {
        for (column, &zj) in columns.chunks_exact(n).zip(z) {
            for (o, w) in out[start..].iter_mut().zip(&column[start..]) {
                *o += w * zj;
            }
        }
    }
}

/// [`add_columns_in_blocks`]'s outputs `start..start + BLOCK`, held in
/// registers across the columns.
#[inline(always)]
fn add_block<const BLOCK: usize>(out: &mut [f32], columns: &[f32], z: &[f32], start: usize) {
    let n = out.len();
    let mut block = [0.0f32; BLOCK];
    block.copy_from_slice(&out[start..start + BLOCK]);
    for (column, &zj) in columns.chunks_exact(n).zip(z) {
        for (o, w) in block.iter_mut().zip(&column[start..start + BLOCK]) {
            *o += w * zj;
        }
    }
    out[start..start + BLOCK].copy_from_slice(&block);
}

/// [`add_columns_in_blocks`] on the widest instructions the CPU has (see
/// [`wide`]): blocks of 32 outputs at the baseline's four lanes, of 64
/// (eight of AVX's sixteen registers) at eight.
fn add_columns(out: &mut [f32], columns: &[f32], z: &[f32]) {
    match pulp::Arch::new() {
        pulp::Arch::Scalar => add_columns_in_blocks::<32>(out, columns, z),
        wider => wider.dispatch(wide::AddColumns { out, columns, z }),
    }
}

/// The kernels as `pulp` operations: `pulp` detects the CPU's widest
/// instructions once (x86-64-v3, AVX2, where it has them; the build
/// assumes only the baseline, so a node runs wherever it is copied) and
/// runs the operation compiled for them, keeping the target-feature
/// dispatch (and its `unsafe`) out of this crate.
///
/// **Bit-identical to the baseline build.** Every kernel is elementwise
/// or sums each output in a fixed order, so the vector width changes how
/// many outputs go at once, not what each one is; and Rust never fuses a
/// multiply and an add into one rounding (an FMA) unless asked to with
/// `mul_add`, which these kernels do not. A decision is the same on any
/// x86-64 machine (property (G) compares the two builds).
mod wide {
    use pulp::{Simd, WithSimd};

    /// [`super::add_columns_in_blocks`] in blocks of 64.
    pub(super) struct AddColumns<'a> {
        pub(super) out: &'a mut [f32],
        pub(super) columns: &'a [f32],
        pub(super) z: &'a [f32],
    }

    impl WithSimd for AddColumns<'_> {
        type Output = ();

        #[inline(always)]
        fn with_simd<S: Simd>(self, _simd: S) {
            super::add_columns_in_blocks::<64>(self.out, self.columns, self.z)
        }
    }

    /// [`super::activate_in_place`].
    pub(super) struct Activate<'a> {
        pub(super) gates: &'a mut [f32],
        pub(super) c: &'a [f32],
    }

    impl WithSimd for Activate<'_> {
        type Output = ();

        #[inline(always)]
        fn with_simd<S: Simd>(self, _simd: S) {
            super::activate_in_place(self.gates, self.c)
        }
    }
}

/// `rows` (`n × m`, row-major) as columns (`m` back-to-back columns of `n`).
fn transpose(rows: &[f32], n: usize, m: usize) -> Vec<f32> {
    let mut columns = vec![0.0; n * m];
    for i in 0..n {
        for j in 0..m {
            columns[j * n + i] = rows[i * m + j];
        }
    }
    columns
}

/// The interaction features that depend only on the query whose memory
/// reads the neighbour, and on the size (its isolated estimate and the
/// size features): when a later neighbour arrives, they are what they
/// were for the one before. With the memory's hidden state, their part of
/// the after-LSTM's next step is fixed between arrivals
/// ([`StepCache`]).
const OWN_FEATURES: [usize; 5] = [0, 5, 6, 7, 8];

/// The others: the neighbour's isolated estimate, the pair's timing and
/// their sum.
const ARRIVAL_FEATURES: [usize; 6] = [1, 2, 3, 4, 9, 10];

/// An LSTM's weights laid out for inference: `[W_hh | W_ih]` as columns
/// over the hidden state and the input together (the input's columns in
/// the order [`OWN_FEATURES`], [`ARRIVAL_FEATURES`]), and the two biases
/// summed. A step sums the columns in that order, so that its part up to
/// the arrival's features ([`LstmKernel::partial`]) can be kept and
/// finished later ([`LstmKernel::finish`]) to the same bits.
/// [`Lstm::step`] is the plain reference it is tested against.
#[derive(Clone, Debug)]
struct LstmKernel {
    hidden: usize,
    columns: Vec<f32>,
    bias: Vec<f32>,
}

impl LstmKernel {
    fn new(lstm: &Lstm) -> Self {
        let gates = 4 * lstm.hidden;
        let inputs = transpose(&lstm.w_ih, gates, lstm.input);
        let mut columns = transpose(&lstm.w_hh, gates, lstm.hidden);
        for &feature in OWN_FEATURES.iter().chain(&ARRIVAL_FEATURES) {
            columns.extend_from_slice(&inputs[feature * gates..(feature + 1) * gates]);
        }
        LstmKernel { hidden: lstm.hidden, columns, bias: lstm.b_ih.iter().zip(&lstm.b_hh).map(|(a, b)| a + b).collect() }
    }

    fn initial(&self) -> LstmState {
        LstmState(vec![0.0; 2 * self.hidden])
    }

    fn step(&self, state: &LstmState, x: &[f32; FEATURES]) -> LstmState {
        self.finish(self.partial(state, &OWN_FEATURES.map(|feature| x[feature])), state, x)
    }

    /// A step's gate pre-activations from the bias, the hidden state and
    /// the input's [`OWN_FEATURES`], `own`.
    fn partial(&self, state: &LstmState, own: &[f32; OWN_FEATURES.len()]) -> Vec<f32> {
        let mut gates = self.bias.clone();
        self.add_own_part(&mut gates, state, own);
        gates
    }

    /// [`LstmKernel::partial`] into `gates` (`4H` long).
    fn partial_into(&self, gates: &mut [f32], state: &LstmState, own: &[f32; OWN_FEATURES.len()]) {
        gates.copy_from_slice(&self.bias);
        self.add_own_part(gates, state, own);
    }

    /// `gates += W_h h + W_own own`, the columns in the layout's order.
    fn add_own_part(&self, gates: &mut [f32], state: &LstmState, own: &[f32; OWN_FEATURES.len()]) {
        let n = gates.len();
        let (hidden_columns, own_columns) = self.columns.split_at(self.hidden * n);
        add_columns(gates, hidden_columns, &state.0[..self.hidden]);
        add_columns(gates, &own_columns[..OWN_FEATURES.len() * n], own);
    }

    /// The step from its [`LstmKernel::partial`] `gates`: `x`'s
    /// [`ARRIVAL_FEATURES`] added, then the activations.
    fn finish(&self, mut gates: Vec<f32>, state: &LstmState, x: &[f32; FEATURES]) -> LstmState {
        self.finish_in_place(&mut gates, state, x);
        gates.truncate(2 * self.hidden);
        LstmState(gates)
    }

    /// [`LstmKernel::finish`] in place: the new hidden state and cell in
    /// `gates`' first `2H` values.
    fn finish_in_place(&self, gates: &mut [f32], state: &LstmState, x: &[f32; FEATURES]) {
        let n = gates.len();
        add_columns(gates, &self.columns[(self.hidden + OWN_FEATURES.len()) * n..], &ARRIVAL_FEATURES.map(|feature| x[feature]));
        activate_slice(gates, &state.0[self.hidden..]);
    }
}

/// [`IconqWeights`] laid out for inference (the predictor's hot path):
/// each LSTM as an [`LstmKernel`], the head's hidden layer as columns.
/// Computes what the weights' own methods compute, to float rounding.
#[derive(Clone, Debug)]
struct Kernels {
    before: LstmKernel,
    after: LstmKernel,
    head_columns: Vec<f32>,
    head_bias: Vec<f32>,
    out: Dense,
    neighbours_max: usize,
    /// Which of a predictor's models these are: tags the memories they
    /// read.
    generation: u64,
}

impl Kernels {
    fn new(weights: &IconqWeights, generation: u64) -> Self {
        let inputs = weights.before.hidden + weights.after.hidden + TARGET_FEATURES + CONTEXT_FEATURES;
        Kernels {
            before: LstmKernel::new(&weights.before),
            after: LstmKernel::new(&weights.after),
            head_columns: transpose(&weights.hidden.w, weights.hidden.width, inputs),
            head_bias: weights.hidden.b.clone(),
            out: weights.out.clone(),
            neighbours_max: weights.neighbours_max,
            generation,
        }
    }

    /// [`IconqWeights::memory`], tagged with these kernels' generation.
    fn memory(&self, before: &[[f32; FEATURES]], after: &[[f32; FEATURES]]) -> Memory {
        let (before_count, after_count) = (before.len(), after.len());
        let (before, after) = clip(before, after, self.neighbours_max);
        let before = before.iter().fold(self.before.initial(), |state, x| self.before.step(&state, x));
        let after = after.iter().fold(self.after.initial(), |state, x| self.after.step(&state, x));
        Memory { before: Arc::new(before), after, before_count, after_count, generation: self.generation, head_cache: None, step_cache: StepCache::default() }
    }

    /// [`IconqWeights::read_later`], keeping what of the head's cache the
    /// step leaves valid; `partial`, when given, is the after-LSTM's
    /// [`LstmKernel::partial`] for this memory and `neighbour`'s own
    /// features.
    fn read_later(&self, memory: &Memory, neighbour: &[f32; FEATURES], partial: Option<&[f32]>) -> Memory {
        let stepped = memory.after_count < self.neighbours_max;
        let after = if stepped {
            let gates = match partial {
                Some(gates) => gates.to_vec(),
                None => self.after.partial(&memory.after, &OWN_FEATURES.map(|feature| neighbour[feature])),
            };
            self.after.finish(gates, &memory.after, neighbour)
        } else {
            memory.after.clone()
        };
        let head_cache = memory.head_cache.clone().map(|cache| if stepped { HeadCache { with_after: None, ..cache } } else { cache });
        memory.with_one_more_later(after, head_cache)
    }

    /// [`IconqWeights::predict_from`], reusing what `memory`'s head cache
    /// holds and filling it.
    fn predict_from(&self, memory: &mut Memory, query: Estimates, size: Rpu, complete: bool) -> f64 {
        let width = self.head_bias.len();
        let (before, after) = (self.before.hidden, self.after.hidden);
        let columns = |from: usize, to: usize| &self.head_columns[from * width..to * width];
        let valid = memory.head_cache.take().filter(|cache| cache.isolated_s == query.isolated_s && cache.size == size);
        let mut cache = valid.unwrap_or_else(|| {
            let mut partial = vec![0.0; width];
            self.before_and_target(&mut partial, memory, query, size);
            HeadCache { isolated_s: query.isolated_s, size, before_and_target: Arc::from(partial), with_after: None }
        });
        // The hidden layer in place (on the stack at the trainer's widths).
        let (mut on_stack, mut on_heap) = ([0.0f32; HEAD_ON_STACK], Vec::new());
        let hidden = scratch(&mut on_stack, &mut on_heap, width);
        match &cache.with_after {
            Some(with_after) => hidden.copy_from_slice(with_after),
            None => {
                hidden.copy_from_slice(&cache.before_and_target);
                add_columns(hidden, columns(before, before + after), &memory.after.0[..after]);
                // Kept only once the after-LSTM has stopped stepping: until
                // then the next arrival changes it.
                if memory.after_count >= self.neighbours_max {
                    cache.with_after = Some(Arc::from(&*hidden));
                }
            }
        }
        memory.head_cache = Some(cache);
        self.head_output(hidden, memory.before_count, memory.after_count, complete, query)
    }

    /// What [`Kernels::read_later`] of `neighbour`, then
    /// [`Kernels::predict_from`] (the later neighbours not complete),
    /// predict, to the bit, without building the stepped memory or filling
    /// any cache: scoring a placement that may not be committed. The step
    /// and the head's hidden layer are computed on the stack.
    fn predict_after_later(&self, memory: &Memory, neighbour: &[f32; FEATURES], partial: Option<&[f32]>, query: Estimates, size: Rpu) -> f64 {
        let stepped = memory.after_count < self.neighbours_max;
        let (mut gates_on_stack, mut gates_on_heap) = ([0.0f32; GATES_ON_STACK], Vec::new());
        let after: &[f32] = if stepped {
            let gates = scratch(&mut gates_on_stack, &mut gates_on_heap, 4 * self.after.hidden);
            match partial {
                Some(partial) => gates.copy_from_slice(partial),
                None => self.after.partial_into(gates, &memory.after, &OWN_FEATURES.map(|feature| neighbour[feature])),
            }
            self.after.finish_in_place(gates, &memory.after, neighbour);
            &gates[..self.after.hidden]
        } else {
            &memory.after.0[..self.after.hidden]
        };
        let width = self.head_bias.len();
        let (before, after_width) = (self.before.hidden, self.after.hidden);
        let (mut on_stack, mut on_heap) = ([0.0f32; HEAD_ON_STACK], Vec::new());
        let hidden = scratch(&mut on_stack, &mut on_heap, width);
        // The stepped memory's cache is this one's, its after-state part
        // dropped if the step moved that state.
        let cache = memory.head_cache.as_ref().filter(|cache| cache.isolated_s == query.isolated_s && cache.size == size);
        match cache.and_then(|cache| cache.with_after.as_ref().filter(|_| !stepped)) {
            Some(with_after) => hidden.copy_from_slice(with_after),
            None => {
                match cache {
                    Some(cache) => hidden.copy_from_slice(&cache.before_and_target),
                    None => self.before_and_target(hidden, memory, query, size),
                }
                add_columns(hidden, &self.head_columns[before * width..(before + after_width) * width], after);
            }
        }
        self.head_output(hidden, memory.before_count, memory.after_count + 1, false, query)
    }

    /// The head's hidden layer's part that `memory`'s before-state and the
    /// target's features give, bias first, into `out`: what
    /// [`HeadCache`] keeps.
    fn before_and_target(&self, out: &mut [f32], memory: &Memory, query: Estimates, size: Rpu) {
        let width = self.head_bias.len();
        let (before, after) = (self.before.hidden, self.after.hidden);
        let columns = |from: usize, to: usize| &self.head_columns[from * width..to * width];
        out.copy_from_slice(&self.head_bias);
        add_columns(out, columns(0, before), &memory.before.0[..before]);
        add_columns(out, columns(before + after, before + after + TARGET_FEATURES), &target_features(query.isolated_s, size));
    }

    /// The prediction from the head's hidden layer without its context
    /// part, `hidden` (which it finishes in place): the context added, the
    /// ReLU, the output, and the base prediction scaled by its exponential.
    fn head_output(&self, hidden: &mut [f32], before_count: usize, after_count: usize, complete: bool, query: Estimates) -> f64 {
        let width = self.head_bias.len();
        let counts = context_features(before_count, after_count, complete);
        add_columns(hidden, &self.head_columns[(self.before.hidden + self.after.hidden + TARGET_FEATURES) * width..], &counts);
        let residual = f64::from(hidden.iter().zip(&self.out.w).map(|(h, w)| h.max(0.0) * w).sum::<f32>() + self.out.b);
        query.base_s.max(1e-3) * residual.clamp(-20.0, 20.0).exp()
    }
}

/// An LSTM step's gates are computed on the stack up to this many (the
/// trainer's default LSTM of 32 has 128).
const GATES_ON_STACK: usize = 256;

/// `len` values of scratch: on `stack` when they fit, else in `heap`.
fn scratch<'a, const N: usize>(stack: &'a mut [f32; N], heap: &'a mut Vec<f32>, len: usize) -> &'a mut [f32] {
    if len <= N {
        &mut stack[..len]
    } else {
        heap.resize(len, 0.0);
        heap
    }
}

/// The head's hidden layer is computed on the stack up to this width
/// (the trainer's default is 32).
const HEAD_ON_STACK: usize = 64;

/// `a · b` over eight lanes (so that the compiler can use SIMD: a plain
/// sum must keep its order), then the lanes and the tail.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a_chunks, b_chunks) = (a.chunks_exact(8), b.chunks_exact(8));
    let (a_tail, b_tail) = (a_chunks.remainder(), b_chunks.remainder());
    for (x, y) in a_chunks.zip(b_chunks) {
        for lane in 0..8 {
            lanes[lane] += x[lane] * y[lane];
        }
    }
    lanes.iter().sum::<f32>() + a_tail.iter().zip(b_tail).map(|(x, y)| x * y).sum::<f32>()
}

impl Lstm {
    /// The zero state a sequence starts from.
    pub fn initial(&self) -> LstmState {
        LstmState(vec![0.0; 2 * self.hidden])
    }

    /// Whether the shapes agree.
    pub fn is_consistent(&self) -> bool {
        let gates = 4 * self.hidden;
        self.w_ih.len() == gates * self.input && self.w_hh.len() == gates * self.hidden && self.b_ih.len() == gates && self.b_hh.len() == gates
    }

    /// One step: the state after reading `x` (`I` values) in `state`.
    pub fn step(&self, state: &LstmState, x: &[f32]) -> LstmState {
        let (h, c) = state.0.split_at(self.hidden);
        let gates: Vec<f32> = (0..4 * self.hidden)
            .map(|row| {
                let input = dot(&self.w_ih[row * self.input..(row + 1) * self.input], x);
                let recurrent = dot(&self.w_hh[row * self.hidden..(row + 1) * self.hidden], h);
                input + recurrent + self.b_ih[row] + self.b_hh[row]
            })
            .collect();
        activate(gates, c)
    }

    /// The hidden part of a state.
    pub fn hidden_of<'a>(&self, state: &'a LstmState) -> &'a [f32] {
        &state.0[..self.hidden]
    }
}

/// A dense layer to one output: `w · x + b`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dense {
    /// Weights, one per input.
    pub w: Vec<f32>,
    /// Bias.
    pub b: f32,
}

/// A hidden dense layer with ReLU: `relu(W x + b)`, `W` row-major.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hidden {
    /// Output width.
    pub width: usize,
    /// Weights, `width × inputs`.
    pub w: Vec<f32>,
    /// Biases, `width`.
    pub b: Vec<f32>,
}

/// Iconq+'s weights. See the module docs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IconqWeights {
    /// [`FEATURE_SCHEMA_VERSION`] it was trained on.
    pub schema_version: u32,
    /// The LSTM over the neighbours that arrived before the target.
    pub before: Lstm,
    /// The LSTM over those that arrived after it.
    pub after: Lstm,
    /// The head's hidden layer, over `[h_before, h_after, target features]`.
    pub hidden: Hidden,
    /// The head's output: `ln(latency / ℓ̂_q)`.
    pub out: Dense,
    /// Neighbours read per side, at most: the last ones before the target
    /// and the first ones after it (the nearest to its arrival).
    pub neighbours_max: usize,
}

/// The neighbours a model reads of `before` and `after` (see
/// [`IconqWeights::neighbours_max`]).
pub fn clip<'a, T>(before: &'a [T], after: &'a [T], max: usize) -> (&'a [T], &'a [T]) {
    (&before[before.len().saturating_sub(max)..], &after[..after.len().min(max)])
}

impl IconqWeights {
    /// Weights of LSTMs of `hidden` and a head of `width` reading up to
    /// `neighbours_max` neighbours a side, drawn uniformly in ±0.3 from
    /// `seed` (small enough to keep the gates in their sensitive range):
    /// for tests and benchmarks, whose work depends on the shapes, not on
    /// what was learned.
    pub fn random(hidden: usize, width: usize, neighbours_max: usize, seed: u64) -> IconqWeights {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-0.3f32..0.3)).collect::<Vec<f32>>();
        let lstm = |draw: &mut dyn FnMut(usize) -> Vec<f32>| Lstm { input: FEATURES, hidden, w_ih: draw(4 * hidden * FEATURES), w_hh: draw(4 * hidden * hidden), b_ih: draw(4 * hidden), b_hh: draw(4 * hidden) };
        let (before, after) = (lstm(&mut draw), lstm(&mut draw));
        let head_inputs = 2 * hidden + TARGET_FEATURES + CONTEXT_FEATURES;
        IconqWeights {
            schema_version: FEATURE_SCHEMA_VERSION,
            before,
            after,
            hidden: Hidden { width, w: draw(width * head_inputs), b: draw(width) },
            out: Dense { w: draw(width), b: 0.1 },
            neighbours_max,
        }
    }

    /// Checks the shapes and the schema; says what is wrong.
    pub fn check(&self) -> Result<(), String> {
        if self.schema_version != FEATURE_SCHEMA_VERSION {
            return Err(format!("the model was trained on feature schema {}, this build reads {FEATURE_SCHEMA_VERSION}", self.schema_version));
        }
        for (name, lstm) in [("before", &self.before), ("after", &self.after)] {
            if lstm.input != FEATURES || !lstm.is_consistent() {
                return Err(format!("the {name} LSTM's shapes are wrong (input {}, hidden {})", lstm.input, lstm.hidden));
            }
        }
        let head_inputs = self.before.hidden + self.after.hidden + TARGET_FEATURES + CONTEXT_FEATURES;
        if self.hidden.w.len() != self.hidden.width * head_inputs || self.hidden.b.len() != self.hidden.width || self.out.w.len() != self.hidden.width {
            return Err("the head's shapes are wrong".into());
        }
        Ok(())
    }

    /// `ln(latency / ℓ̂_q)` from what the model read (`complete`: every
    /// later neighbour) and the target's features.
    pub fn head(&self, memory: &Memory, target: &[f32; TARGET_FEATURES], complete: bool) -> f32 {
        let counts = context_features(memory.before_count, memory.after_count, complete);
        let inputs: Vec<f32> = self
            .before
            .hidden_of(&memory.before)
            .iter()
            .chain(self.after.hidden_of(&memory.after))
            .chain(target.iter())
            .chain(counts.iter())
            .copied()
            .collect();
        let width = inputs.len();
        let hidden: Vec<f32> = (0..self.hidden.width)
            .map(|row| (dot(&self.hidden.w[row * width..(row + 1) * width], &inputs) + self.hidden.b[row]).max(0.0))
            .collect();
        dot(&self.out.w, &hidden) + self.out.b
    }

    /// The predicted latency, seconds, from a full pass over the
    /// neighbours before and after the target (each chronological;
    /// `complete`: no more will come).
    pub fn predict_s(&self, query: Estimates, size: Rpu, before: &[[f32; FEATURES]], after: &[[f32; FEATURES]], complete: bool) -> f64 {
        let memory = self.memory(before, after);
        self.predict_from(&memory, query, size, complete)
    }

    /// The states after reading the neighbours (clipped to
    /// [`IconqWeights::neighbours_max`] a side).
    pub fn memory(&self, before: &[[f32; FEATURES]], after: &[[f32; FEATURES]]) -> Memory {
        let (before_count, after_count) = (before.len(), after.len());
        let (before, after) = clip(before, after, self.neighbours_max);
        let before = before.iter().fold(self.before.initial(), |state, x| self.before.step(&state, x));
        let after = after.iter().fold(self.after.initial(), |state, x| self.after.step(&state, x));
        Memory { before: Arc::new(before), after, before_count, after_count, generation: 0, head_cache: None, step_cache: StepCache::default() }
    }

    /// `memory` after one more neighbour arrived (read while fewer than
    /// [`IconqWeights::neighbours_max`] have, counted always): an
    /// incremental prediction's O(1) update.
    pub fn read_later(&self, memory: &Memory, neighbour: &[f32; FEATURES]) -> Memory {
        let after = if memory.after_count < self.neighbours_max { self.after.step(&memory.after, neighbour) } else { memory.after.clone() };
        memory.with_one_more_later(after, None)
    }

    /// The predicted latency, seconds, from the states.
    pub fn predict_from(&self, memory: &Memory, query: Estimates, size: Rpu, complete: bool) -> f64 {
        let residual = f64::from(self.head(memory, &target_features(query.isolated_s, size), complete));
        query.base_s.max(1e-3) * residual.clamp(-20.0, 20.0).exp()
    }
}

/// A model's Q-error percentiles on held-out executions (exact labels).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct HeldOutScore {
    /// Rows scored.
    pub rows: usize,
    /// Median Q-error.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 95th percentile.
    pub p95: f64,
}

/// Whether a retrained `candidate` replaces the model in force, both
/// scored on the same held-out executions: when it is no worse at the
/// 90th percentile, the tail whose under-predictions become SLO
/// violations, and it scored rows at all. Never replaces a model with one
/// that scored worse (E).
pub fn replaces(candidate: &HeldOutScore, current: &HeldOutScore) -> bool {
    candidate.rows > 0 && candidate.p90.is_finite() && (candidate.p90 <= current.p90 || !current.p90.is_finite())
}

/// What the model starts from for one query on a cluster: its isolated
/// estimate (a feature) and the base prediction it refines (the
/// concurrency-aware predictor's, from the queries running at arrival).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimates {
    /// The isolated estimate, seconds.
    pub isolated_s: f64,
    /// The base prediction, seconds.
    pub base_s: f64,
}

impl IconqWeights {
    /// The estimates' features' floor: a prediction is never below 1 ms.
    pub const FLOOR_S: f64 = 1e-3;
}

/// What the model has read of one query's neighbours.
#[derive(Clone, Debug, PartialEq)]
pub struct Memory {
    /// After the neighbours that arrived before it.
    pub before: Arc<LstmState>,
    /// After those that arrived after it, so far.
    pub after: LstmState,
    /// How many arrived before it.
    pub before_count: usize,
    /// How many arrived after it, so far.
    pub after_count: usize,
    /// Which of a predictor's models read it ([`IconqPredictor`] counts
    /// the models it was given; a memory another model read is not
    /// continued).
    pub generation: u64,
    /// What the predictor's head computed of it that the next arrival
    /// does not change.
    pub head_cache: Option<HeadCache>,
    /// What the predictor computed of the after-LSTM's next step.
    pub step_cache: StepCache,
}

/// What the predictor computed of a running query for the next arrival
/// that its memory and the base's predictions fix: the query's terms and
/// estimates, and the part of the after-LSTM's next step that its hidden
/// state and its own features (its isolated estimate and the size) give. An arrival scores a
/// placement on every cluster, and each placement steps every running
/// query's memory by the newcomer; the step then adds only the newcomer's
/// features. Filled on first use and refilled after the base refits
/// (interior, as the memory is shared by every placement that reads it);
/// never carried to the stepped memory, nor to a clone. Opaque; a cache,
/// so any two compare equal.
#[derive(Debug, Default)]
pub struct StepCache(std::sync::Mutex<Option<Arc<OwnStep>>>);

impl Clone for StepCache {
    fn clone(&self) -> StepCache {
        StepCache::default()
    }
}

impl PartialEq for StepCache {
    fn eq(&self, _other: &StepCache) -> bool {
        true
    }
}

/// What a [`StepCache`] holds: for one predictions version of the base
/// and one size, the query's terms and estimates, and the after-LSTM's
/// partial step (while its memory still steps).
#[derive(Debug)]
struct OwnStep {
    version: Option<u64>,
    terms: Terms,
    estimates: Estimates,
    gates: Option<Box<[f32]>>,
}

impl Memory {
    /// This memory after one more later neighbour: `after` is the
    /// after-LSTM's state now (stepped, or as it was once it stopped
    /// stepping), `head_cache` what of the head's cache still holds.
    fn with_one_more_later(&self, after: LstmState, head_cache: Option<HeadCache>) -> Memory {
        Memory {
            before: self.before.clone(),
            after,
            before_count: self.before_count,
            after_count: self.after_count + 1,
            generation: self.generation,
            head_cache,
            step_cache: StepCache::default(),
        }
    }
}

/// The part of the head's hidden layer a query's memory fixes: its
/// "before" state and its own features (fixed once it is placed), and
/// with them its "after" state (fixed once it has read
/// [`IconqWeights::neighbours_max`] later neighbours); only the context
/// (how many came after) changes with each arrival then. Opaque; kept
/// by [`IconqPredictor`] in each query's memory.
#[derive(Clone, Debug, PartialEq)]
pub struct HeadCache {
    isolated_s: f64,
    size: Rpu,
    before_and_target: Arc<[f32]>,
    with_after: Option<Arc<[f32]>>,
}

/// One training row: a target's features, its neighbours' interaction
/// vectors before and after it, and its latency's log (a lower bound when
/// censored).
#[derive(Clone, Debug, PartialEq)]
pub struct Example {
    /// The target's features.
    pub target: [f32; TARGET_FEATURES],
    /// `ln` of the base prediction (the concurrency-aware predictor's, from
    /// the queries running at arrival): the model predicts relative to it.
    pub ln_base_s: f32,
    /// Interaction vectors of the neighbours that arrived before it.
    pub before: Vec<[f32; FEATURES]>,
    /// Those of the neighbours that arrived after it (a prefix, for a
    /// sampled censored row).
    pub after: Vec<[f32; FEATURES]>,
    /// `ln` of its latency in seconds.
    pub ln_latency_s: f32,
    /// Whether the label is only a lower bound.
    pub censored: bool,
    /// The cluster size, for reports.
    pub size: Rpu,
    /// The execution's index in the log it came from.
    pub execution: usize,
    /// Which of its neighbours the row reads.
    pub reads: Reads,
}

impl Example {
    /// The row without §4.2's size features (the ablation "−size"): the
    /// size columns of every interaction vector and of the target's
    /// features zeroed, the isolated estimates kept.
    pub fn without_size_features(&mut self) {
        const SIZE_COLUMNS: std::ops::RangeInclusive<usize> = 5..=10;
        for vector in self.before.iter_mut().chain(self.after.iter_mut()) {
            vector[SIZE_COLUMNS].fill(0.0);
        }
        self.target[1..].fill(0.0);
    }
}

/// Which neighbours a training row reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reads {
    /// Every neighbour the execution had (the label is its latency).
    Every,
    /// Those running when it arrived (the label is its final latency).
    AtArrival,
    /// Those before a later neighbour (the label is a lower bound).
    Prefix,
}

/// The isolated estimator the features read, trained on a log (its
/// isolated and lightly loaded executions; see [`IsolatedEstimator`]).
pub fn isolated_estimator(log: &[ExecutionRecord]) -> IsolatedEstimator {
    let mut estimator = IsolatedEstimator::new(IsolatedConfig::default());
    for record in log {
        estimator.observe(&record.observation());
    }
    estimator.refit_size_exponent();
    estimator
}

/// Which rows [`examples`] makes of each execution.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RowSampling {
    /// The chance, per later neighbour, of a censored row that stops before
    /// it, labelled with the time it arrived (§4.3).
    pub censored_share: f64,
    /// Also a row as the router sees the query when it places it: only the
    /// neighbours running at its arrival, labelled with its final latency
    /// (what later arrivals will add is learned from the log's load). Every
    /// execution gets one, those no later query overlapped too: rows of
    /// only the overlapped ones would teach the model, at arrival, that a
    /// later query always comes (a slowdown the router then predicts for
    /// every query on a quiet cluster).
    pub arrival_rows: bool,
    /// Seeds the sampling.
    pub seed: u64,
}

impl Default for RowSampling {
    fn default() -> Self {
        RowSampling { censored_share: 0.05, arrival_rows: true, seed: 1 }
    }
}

/// Training rows from `log` (executions without a timeline are skipped):
/// one per execution with every neighbour it had, and those `sampling`
/// asks for. Deterministic in its seed.
pub fn examples(log: &[ExecutionRecord], isolated: &IsolatedEstimator, base: &dyn LatencyPredictor, sampling: &RowSampling) -> Vec<Example> {
    let censored_share = sampling.censored_share;
    let neighbours = crate::reservoir::overlaps(log);
    let mut rng = SmallRng::seed_from_u64(sampling.seed);
    let mut rows = Vec::new();
    for (index, record) in log.iter().enumerate() {
        let Some(timeline) = &record.timeline else { continue };
        let size = record.size;
        let (target, before, after) = logged_sequences(log, &neighbours[index], index, isolated);
        let base = Example {
            target: target_features(target.isolated_s, size),
            ln_base_s: ln_seconds(base.predict(record.template, size, record.neighbours_at_dispatch).as_secs_f64()) as f32,
            before,
            after: Vec::new(),
            ln_latency_s: ln_seconds(record.latency.as_secs_f64()) as f32,
            censored: record.censored,
            size,
            execution: index,
            reads: Reads::Every,
        };
        for (k, &(arrived_s, _)) in after.iter().enumerate() {
            let ran_s = arrived_s - timeline.arrival_s;
            if ran_s > 0.0 && rng.random_bool(censored_share.clamp(0.0, 1.0)) {
                rows.push(Example {
                    after: after[..k].iter().map(|(_, v)| *v).collect(),
                    ln_latency_s: ln_seconds(ran_s.min(record.latency.as_secs_f64())) as f32,
                    censored: true,
                    reads: Reads::Prefix,
                    ..base.clone()
                });
            }
        }
        if sampling.arrival_rows {
            rows.push(Example { after: Vec::new(), reads: Reads::AtArrival, ..base.clone() });
        }
        rows.push(Example { after: after.into_iter().map(|(_, v)| v).collect(), ..base });
    }
    rows
}

/// Execution `index` of `log` as the model reads it: the target, and the
/// interaction vectors of `neighbours` (indices into the log) that
/// arrived before it (in the log's order on a tie) and after it, the
/// latter with their arrivals.
#[allow(clippy::type_complexity)]
fn logged_sequences(log: &[ExecutionRecord], neighbours: &[usize], index: usize, isolated: &IsolatedEstimator) -> (Member, Vec<[f32; FEATURES]>, Vec<(f64, [f32; FEATURES])>) {
    let size = log[index].size;
    let member = |r: &ExecutionRecord| Member { isolated_s: isolated.estimate(r.template, size).as_secs_f64(), arrival_s: r.timeline.as_ref().map_or(0.0, |t| t.arrival_s) };
    let target = member(&log[index]);
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for &other in neighbours {
        let them = member(&log[other]);
        let vector = interaction(target, them, size);
        if them.arrival_s < target.arrival_s || (them.arrival_s == target.arrival_s && other < index) {
            before.push(vector);
        } else {
            after.push((them.arrival_s, vector));
        }
    }
    (target, before, after)
}

/// A trained model with the isolated estimator its features read and the
/// base predictor it refines: what a predictor needs at inference.
#[derive(Clone)]
pub struct IconqModel {
    /// The weights.
    pub weights: Arc<IconqWeights>,
    /// The isolated estimates.
    pub isolated: Arc<IsolatedEstimator>,
    /// The base predictor.
    pub base: Arc<dyn LatencyPredictor + Send + Sync>,
}

impl IconqModel {
    /// The predicted latency of one logged execution from `neighbours` of
    /// it in the log (`complete`: all of them; the Q-error evaluations use
    /// it).
    pub fn predict_logged(&self, log: &[ExecutionRecord], neighbours: &[usize], index: usize, complete: bool) -> Duration {
        let record = &log[index];
        let size = record.size;
        let (target, before, after) = logged_sequences(log, neighbours, index, &self.isolated);
        let after: Vec<[f32; FEATURES]> = after.into_iter().map(|(_, v)| v).collect();
        let base_s = self.base.predict(record.template, size, record.neighbours_at_dispatch).as_secs_f64();
        Duration::from_secs_f64(self.weights.predict_s(Estimates { isolated_s: target.isolated_s, base_s }, size, &before, &after, complete))
    }
}

/// Iconq+ as a [`LatencyPredictor`] for the router and the planner: a
/// placement reads the queries running on the cluster as the new query's
/// earlier neighbours, and advances each running query's memory by the new
/// arrival, O(1) each ([`IconqWeights::read_later`]); the running query's
/// prediction moves towards what its memory now predicts by the share of
/// its remaining time the newcomer overlaps
/// ([`crate::predict::overlap_update`], as the count-based predictors'
/// placements do). Predictions are
/// judged as the router needs them: the final latency from what is known
/// so far (the later neighbours not complete). Everything else (the base
/// prediction, the isolated estimates the features read, the count-based
/// `predict`, the refits) is the concurrency-aware predictor's, which
/// keeps learning online.
#[derive(Clone)]
pub struct IconqPredictor {
    base: crate::predict::ConcurrencyAware,
    weights: Arc<IconqWeights>,
    /// The weights laid out for the hot path, with the count of models
    /// installed since the first.
    kernels: Arc<Kernels>,
}

impl IconqPredictor {
    /// The model `weights` over `base`.
    ///
    /// # Errors
    ///
    /// If the weights fail [`IconqWeights::check`].
    pub fn new(base: crate::predict::ConcurrencyAware, weights: Arc<IconqWeights>) -> Result<Self, String> {
        weights.check()?;
        Ok(IconqPredictor { base, kernels: Arc::new(Kernels::new(&weights, 0)), weights })
    }

    /// The weights it predicts with.
    pub fn weights(&self) -> &Arc<IconqWeights> {
        &self.weights
    }

    /// The base predictor.
    pub fn base_mut(&mut self) -> &mut crate::predict::ConcurrencyAware {
        &mut self.base
    }

    /// Running query `r`'s terms and estimates at `size`, and the
    /// after-LSTM's partial step for its `memory` (while that still
    /// steps), for the base's predictions `version`: from the memory's
    /// cache when it was filled for them (every arrival scores `r`'s
    /// cluster, and the memory changes only when a query is placed
    /// there), else computed, and kept when the cache is empty.
    fn own_step(&self, r: &crate::predict::QueryState, memory: Option<&Memory>, size: Rpu, version: Option<u64>) -> Arc<OwnStep> {
        let compute = || {
            let isolated_s = self.base.isolated(r.template, size).as_secs_f64();
            let terms = Terms::new(Member { isolated_s, arrival_s: r.arrival.as_secs_f64() }, size);
            let estimates = Estimates { isolated_s, base_s: self.base.predict(r.template, size, r.neighbours_at_dispatch).as_secs_f64() };
            let gates = memory.filter(|m| m.after_count < self.kernels.neighbours_max).map(|m| self.kernels.after.partial(&m.after, &terms.own).into_boxed_slice());
            Arc::new(OwnStep { version, terms, estimates, gates })
        };
        match memory {
            Some(memory) if version.is_some() => {
                // Never contended: a router's placements run on its thread.
                let mut slot = memory.step_cache.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                match &*slot {
                    Some(cached) if cached.version == version && cached.terms.size == size => cached.clone(),
                    _ => slot.insert(compute()).clone(),
                }
            }
            _ => compute(),
        }
    }
}

impl LatencyPredictor for IconqPredictor {
    fn name(&self) -> &str {
        "iconq"
    }

    fn observe(&mut self, observation: &crate::predict::Observation) {
        self.base.observe(observation);
    }

    fn isolated(&self, template: TemplateId, size: Rpu) -> Duration {
        self.base.isolated(template, size)
    }

    fn template_observations(&self, template: TemplateId) -> u64 {
        self.base.template_observations(template)
    }

    fn predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> Duration {
        self.base.predict(template, size, neighbours)
    }

    fn defer_fits(&mut self) {
        self.base.defer_fits();
    }

    fn take_fit_job(&mut self) -> Option<crate::predict::FitJob> {
        self.base.take_fit_job()
    }

    fn install_fit(&mut self, fit: crate::predict::Fit) {
        self.base.install_fit(fit);
    }

    fn install_model(&mut self, weights: Arc<IconqWeights>) -> Result<(), String> {
        weights.check()?;
        self.kernels = Arc::new(Kernels::new(&weights, self.kernels.generation + 1));
        self.weights = weights;
        Ok(())
    }

    fn predict_placement(
        &self,
        now: crate::time::Instant,
        query: &crate::model::Query,
        size: Rpu,
        running: &[crate::predict::QueryState],
        next: Option<&[Duration]>,
    ) -> crate::predict::Placement {
        let mut placement = self.score_placement(now, query, size, running, next);
        self.complete_placement(now, query, size, running, &mut placement);
        placement
    }

    /// The newcomer reads the running queries as its earlier neighbours
    /// (its memory comes with the placement), and each running query's
    /// prediction is what its memory predicts once it has read the
    /// newcomer; the stepped memories are built only by
    /// [`LatencyPredictor::complete_placement`], for the placement a
    /// router commits.
    fn score_placement(
        &self,
        now: crate::time::Instant,
        query: &crate::model::Query,
        size: Rpu,
        running: &[crate::predict::QueryState],
        _next: Option<&[Duration]>,
    ) -> crate::predict::Placement {
        let version = self.base.predictions_version();
        let newcomer = self.newcomer_terms(query, size);
        let memories = self.continued_memories(running);
        let owns: Vec<Arc<OwnStep>> = running.iter().zip(&memories).map(|(r, &memory)| self.own_step(r, memory, size, version)).collect();
        // The newcomer's view of each running query and each one's view of
        // the newcomer, both at once.
        let pairs: Vec<([f32; FEATURES], [f32; FEATURES])> = owns.iter().map(|own| newcomer.interactions_both_ways(&own.terms)).collect();
        let mut earlier: Vec<usize> = (0..running.len()).collect();
        earlier.sort_by_key(|&i| (running[i].arrival, running[i].query));
        let before: Vec<[f32; FEATURES]> = earlier.iter().map(|&i| pairs[i].0).collect();
        let mut memory = self.kernels.memory(&before, &[]);
        let count = running.len() as u32;
        let estimates = Estimates { isolated_s: newcomer.member.isolated_s, base_s: self.base.predict(query.template, size, count).as_secs_f64() };
        let predicted = Duration::from_secs_f64(self.kernels.predict_from(&mut memory, estimates, size, false));
        // Built only if some running query has no memory to continue.
        let empty = std::cell::OnceCell::new();
        let updated = running
            .iter()
            .zip(memories)
            .zip(&owns)
            .zip(&pairs)
            .map(|(((r, continued), own), (_, later))| {
                let fresh = match continued {
                    Some(memory) => self.kernels.predict_after_later(memory, later, own.gates.as_deref(), own.estimates, size),
                    None => self.kernels.predict_after_later(empty.get_or_init(|| self.kernels.memory(&[], &[])), later, None, own.estimates, size),
                };
                // Field by field: cloning `r` would clone its memory's
                // `Arc` only to drop it.
                crate::predict::QueryState {
                    query: r.query,
                    template: r.template,
                    arrival: r.arrival,
                    neighbours_at_dispatch: r.neighbours_at_dispatch,
                    neighbours: r.neighbours + 1,
                    predicted: crate::predict::overlap_update(r.predicted, Duration::from_secs_f64(fresh), now - r.arrival, predicted),
                    memory: None,
                }
            })
            .collect();
        crate::predict::Placement {
            query: crate::predict::QueryState {
                query: query.id,
                template: query.template,
                arrival: query.arrival,
                neighbours_at_dispatch: count,
                neighbours: count,
                predicted,
                memory: Some(Arc::new(memory)),
            },
            running: updated,
        }
    }

    /// Each running query's memory after reading the newcomer, with its
    /// head's cache filled as predicting from it fills it.
    fn complete_placement(
        &self,
        _now: crate::time::Instant,
        query: &crate::model::Query,
        size: Rpu,
        running: &[crate::predict::QueryState],
        placement: &mut crate::predict::Placement,
    ) {
        let version = self.base.predictions_version();
        let newcomer = self.newcomer_terms(query, size);
        let memories = self.continued_memories(running);
        for ((r, continued), updated) in running.iter().zip(memories).zip(&mut placement.running) {
            let own = self.own_step(r, continued, size, version);
            let later = own.terms.interaction(&newcomer);
            let mut memory = match continued {
                Some(memory) => self.kernels.read_later(memory, &later, own.gates.as_deref()),
                None => self.kernels.read_later(&self.kernels.memory(&[], &[]), &later, None),
            };
            self.kernels.predict_from(&mut memory, own.estimates, size, false);
            updated.memory = Some(Arc::new(memory));
        }
    }
}

impl IconqPredictor {
    /// The newcomer's terms at `size`.
    fn newcomer_terms(&self, query: &crate::model::Query, size: Rpu) -> Terms {
        Terms::new(Member { isolated_s: self.base.isolated(query.template, size).as_secs_f64(), arrival_s: query.arrival.as_secs_f64() }, size)
    }

    /// Each running query's memory, if this model read it: a query placed
    /// by another predictor, or read by a model since replaced, has no
    /// memory this model can continue, and starts from what it can be
    /// told now.
    fn continued_memories<'a>(&self, running: &'a [crate::predict::QueryState]) -> Vec<Option<&'a Memory>> {
        running.iter().map(|r| r.memory.as_deref().filter(|m| m.generation == self.kernels.generation)).collect()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The tests' weights: LSTMs of `hidden`, a head of 8, 64 neighbours
    /// a side.
    /// The interaction features straight from their definitions, each
    /// logarithm taken where it is used: the reference the shared-log
    /// layouts are held to.
    fn plain_interaction(target: Member, them: Member, size: Rpu) -> [f32; FEATURES] {
        let s = f64::from(size.0.max(1));
        let (size_scaled, log_size, inverse_size) = size_features(size);
        let gap = them.arrival_s - target.arrival_s;
        let elapsed = (target.arrival_s - them.arrival_s).max(0.0);
        let remaining = if gap < 0.0 { (them.isolated_s - elapsed).max(0.0) } else { them.isolated_s };
        [
            ln_seconds(target.isolated_s),
            ln_seconds(them.isolated_s),
            gap.signum() * gap.abs().ln_1p(),
            elapsed.ln_1p(),
            remaining.ln_1p(),
            size_scaled,
            log_size,
            inverse_size,
            ln_seconds(target.isolated_s * s),
            ln_seconds(them.isolated_s * s),
            ln_seconds((target.isolated_s + them.isolated_s) / s),
        ]
        .map(|x| x as f32)
    }

    /// A placement as the predictor computed it before scoring and
    /// completing were apart: every running query's memory stepped by the
    /// newcomer and its head's cache filled, each interaction vector
    /// computed on its own. The reference for property (I).
    fn every_memory_built(predictor: &IconqPredictor, query: &crate::model::Query, size: Rpu, running: &[crate::predict::QueryState]) -> crate::predict::Placement {
        let version = predictor.base.predictions_version();
        let now = query.arrival;
        let newcomer = predictor.newcomer_terms(query, size);
        let memories = predictor.continued_memories(running);
        let owns: Vec<Arc<OwnStep>> = running.iter().zip(&memories).map(|(r, &memory)| predictor.own_step(r, memory, size, version)).collect();
        let mut earlier: Vec<usize> = (0..running.len()).collect();
        earlier.sort_by_key(|&i| (running[i].arrival, running[i].query));
        let before: Vec<[f32; FEATURES]> = earlier.iter().map(|&i| newcomer.interaction(&owns[i].terms)).collect();
        let kernels = &predictor.kernels;
        let mut memory = kernels.memory(&before, &[]);
        let count = running.len() as u32;
        let estimates = Estimates { isolated_s: newcomer.member.isolated_s, base_s: predictor.base.predict(query.template, size, count).as_secs_f64() };
        let predicted = Duration::from_secs_f64(kernels.predict_from(&mut memory, estimates, size, false));
        let updated = running
            .iter()
            .zip(memories)
            .zip(&owns)
            .map(|((r, continued), own)| {
                let later = own.terms.interaction(&newcomer);
                let mut stepped = match continued {
                    Some(memory) => kernels.read_later(memory, &later, own.gates.as_deref()),
                    None => kernels.read_later(&kernels.memory(&[], &[]), &later, None),
                };
                let fresh = kernels.predict_from(&mut stepped, own.estimates, size, false);
                crate::predict::QueryState {
                    neighbours: r.neighbours + 1,
                    predicted: crate::predict::overlap_update(r.predicted, Duration::from_secs_f64(fresh), now - r.arrival, predicted),
                    memory: Some(Arc::new(stepped)),
                    ..r.clone()
                }
            })
            .collect();
        let placed = crate::predict::QueryState {
            query: query.id,
            template: query.template,
            arrival: query.arrival,
            neighbours_at_dispatch: count,
            neighbours: count,
            predicted,
            memory: Some(Arc::new(memory)),
        };
        crate::predict::Placement { query: placed, running: updated }
    }

    /// Random weights (LSTMs of 6) reading up to `neighbours_max` a side,
    /// their inference layout, and a source of random interaction vectors
    /// (`n` at a time), all from `seed`.
    fn layout_case(neighbours_max: usize, seed: u64) -> (IconqWeights, Kernels, impl FnMut(usize) -> Vec<[f32; FEATURES]>) {
        let weights = IconqWeights { neighbours_max, ..random_weights(6, seed) };
        let kernels = Kernels::new(&weights, 0);
        let mut rng = SmallRng::seed_from_u64(seed);
        let vectors = move |n: usize| (0..n).map(|_| std::array::from_fn(|_| rng.random_range(-3.0f32..3.0))).collect::<Vec<[f32; FEATURES]>>();
        (weights, kernels, vectors)
    }

    pub(crate) fn random_weights(hidden: usize, seed: u64) -> IconqWeights {
        IconqWeights::random(hidden, 8, 64, seed)
    }

    #[test]
    fn the_polynomial_exp_stays_within_two_ten_millionths_of_libm_s() {
        for i in -86_990..=87_990 {
            let x = i as f32 * 1e-3;
            assert!((exp(x) / x.exp() - 1.0).abs() < 2e-7, "{x}: {} vs {}", exp(x), x.exp());
        }
        assert!(exp(-1e4) > 0.0 && exp(-1e4) < 1e-37 && exp(1e4).is_finite());
    }

    #[test]
    fn the_exp_based_tanh_stays_within_a_millionth_of_libm_s() {
        for i in -20_000..=20_000 {
            let x = i as f32 * 1e-3;
            assert!((tanh(x) - x.tanh()).abs() < 1e-6, "{x}: {} vs {}", tanh(x), x.tanh());
        }
        assert_eq!((tanh(1e4), tanh(-1e4)), (1.0, -1.0));
    }

    #[test]
    fn one_lstm_step_matches_the_gate_equations_by_hand() {
        // One hidden unit, one input: i = σ(1), f = σ(0), g = tanh(0.5),
        // o = σ(−1), from c = 0.2.
        let lstm = Lstm { input: 1, hidden: 1, w_ih: vec![1.0, 0.0, 0.5, -1.0], w_hh: vec![0.0; 4], b_ih: vec![0.0; 4], b_hh: vec![0.0; 4] };
        let next = lstm.step(&LstmState(vec![0.0, 0.2]), &[1.0]);
        let cell = sigmoid(0.0) * 0.2 + sigmoid(1.0) * 0.5f32.tanh();
        assert!((next.0[1] - cell).abs() < 1e-6);
        assert!((next.0[0] - sigmoid(-1.0) * cell.tanh()).abs() < 1e-6);
    }

    #[test]
    fn a_model_with_the_wrong_schema_or_shapes_is_refused_saying_why() {
        let mut weights = random_weights(4, 1);
        assert_eq!(weights.check(), Ok(()));
        weights.schema_version = 99;
        assert!(weights.check().unwrap_err().contains("feature schema 99"));
        let mut weights = random_weights(4, 1);
        weights.after.w_hh.pop();
        assert!(weights.check().unwrap_err().contains("after LSTM"));
    }

    fn timed(lane: &str, template: u32, arrival_s: f64, latency_s: f64, censored: bool) -> ExecutionRecord {
        ExecutionRecord {
            query: crate::model::QueryId(0),
            template: TemplateId(template),
            cluster: crate::model::ClusterId(0),
            size: Rpu(16),
            neighbours_at_dispatch: 0,
            latency: Duration::from_secs_f64(latency_s),
            censored,
            queued: Duration::ZERO,
            ran_alone: false,
            timeline: Some(crate::reservoir::Timeline { lane: lane.into(), arrival_s }),
        }
    }

    /// One lane's executions, each `(template − 1, arrival s, latency s,
    /// timed out)`, with the isolated estimates and the base [`examples`]
    /// reads beside them.
    struct LaneLog {
        log: Vec<ExecutionRecord>,
        isolated: IsolatedEstimator,
        base: crate::predict::StageLike,
    }

    impl LaneLog {
        fn of(runs: &[(u32, f64, f64, bool)]) -> LaneLog {
            let log: Vec<ExecutionRecord> = runs.iter().map(|&(t, at, took, timed_out)| timed("p/c0", 1 + t, at, took, timed_out)).collect();
            LaneLog { isolated: isolated_estimator(&log), base: crate::predict::StageLike::new(IsolatedConfig::default()), log }
        }

        fn examples(&self, sampling: &RowSampling) -> Vec<Example> {
            examples(&self.log, &self.isolated, &self.base, sampling)
        }
    }

    /// Up to 39 executions for [`LaneLog::of`].
    fn lane_runs() -> impl Strategy<Value = Vec<(u32, f64, f64, bool)>> {
        prop::collection::vec((0u32..5, 0.0f64..300.0, 0.5f64..80.0, any::<bool>()), 1..40)
    }

    fn arriving(id: u64, template: u32, at_s: f64) -> crate::model::Query {
        crate::model::Query {
            id: crate::model::QueryId(id),
            pool: crate::model::PoolId::default(),
            template: TemplateId(template),
            slo: crate::model::Slo { latency: Duration::from_secs_f64(60.0) },
            arrival: crate::time::Instant::from_secs_f64(at_s),
        }
    }

    #[test]
    fn weights_that_fail_their_check_are_refused_by_the_predictor() {
        let mut weights = random_weights(4, 2);
        weights.hidden.b.pop();
        let base = crate::predict::ConcurrencyAware::new(crate::predict::concurrency::ConcurrencyConfig::default());
        assert!(IconqPredictor::new(base, Arc::new(weights)).err().unwrap().contains("head"));
    }

    #[test]
    fn after_a_model_swap_no_memory_the_old_model_read_is_continued() {
        let base = crate::predict::ConcurrencyAware::new(crate::predict::concurrency::ConcurrencyConfig::default());
        let mut predictor = IconqPredictor::new(base, Arc::new(random_weights(6, 1))).unwrap();
        let size = Rpu(16);
        let first = predictor.predict_placement(crate::time::Instant::from_secs_f64(0.0), &arriving(0, 3, 0.0), size, &[], None);
        let replacement = Arc::new(random_weights(4, 2));
        predictor.install_model(replacement.clone()).unwrap();
        let second = arriving(1, 5, 1.0);
        let placement = predictor.predict_placement(second.arrival, &second, size, std::slice::from_ref(&first.query), None);
        // The running query starts over under the new model: the one
        // later neighbour it has seen, from the zero state.
        let member = |q: &crate::model::Query| Member { isolated_s: predictor.isolated(q.template, size).as_secs_f64(), arrival_s: q.arrival.as_secs_f64() };
        let expected = replacement.read_later(&replacement.memory(&[], &[]), &interaction(member(&arriving(0, 3, 0.0)), member(&second), size));
        let memory = placement.running[0].memory.as_deref().unwrap();
        assert_eq!((memory.before.0.len(), memory.after.0.len()), (8, 8), "the new model's widths");
        assert!(memory.after.0.iter().zip(&expected.after.0).all(|(a, b)| (a - b).abs() < 1e-5), "{:?} vs {:?}", memory.after, expected.after);
        assert_eq!(memory.generation, 1);
        let mut broken = random_weights(4, 3);
        broken.out.w.pop();
        assert!(predictor.install_model(Arc::new(broken)).is_err(), "a model that fails its check is refused");
    }

    proptest! {
        #[test]
        fn a_retrained_model_replaces_the_one_in_force_only_when_no_worse_at_p90(
            candidate in (1usize..1000, 1.0f64..10.0, 1.0f64..10.0),
            current in (0usize..1000, 1.0f64..10.0, 1.0f64..10.0),
        ) {
            let score = |(rows, p50, p90): (usize, f64, f64)| HeldOutScore { rows, p50, p90, p95: p90 * 1.2 };
            let (candidate, current) = (score(candidate), score(current));
            // (E) Never a candidate that scored worse at p90.
            prop_assert_eq!(replaces(&candidate, &current), candidate.p90 <= current.p90);
            prop_assert!(!replaces(&HeldOutScore { rows: 0, ..candidate }, &current), "a candidate that scored nothing");
        }

        #[test]
        fn placements_carry_each_query_s_memory_as_a_full_pass_would_read_it(
            arrivals in prop::collection::vec((1u32..20, 0.0f64..5.0), 1..10),
            seed in 0u64..500,
        ) {
            let weights = Arc::new(random_weights(6, seed));
            let base = crate::predict::ConcurrencyAware::new(crate::predict::concurrency::ConcurrencyConfig::default());
            let predictor = IconqPredictor::new(base, weights.clone()).unwrap();
            let size = Rpu(16);
            // Queries placed one after another on one cluster, none ending.
            let mut running: Vec<crate::predict::QueryState> = Vec::new();
            let mut at_s = 0.0;
            let mut queries = Vec::new();
            for (i, &(template, gap)) in arrivals.iter().enumerate() {
                at_s += gap;
                let query = arriving(i as u64, template, at_s);
                let now = query.arrival;
                let placement = predictor.predict_placement(now, &query, size, &running, None);
                // (D) Positive, finite, and never lowered.
                prop_assert!(placement.query.predicted > Duration::ZERO);
                for (before, after) in running.iter().zip(&placement.running) {
                    prop_assert!(after.predicted >= before.predicted);
                }
                running = placement.running;
                running.push(placement.query);
                queries.push(query);
            }
            // (A) Each query's memory is what a full pass over its
            // neighbours before and after it reads.
            let member = |q: &crate::model::Query| Member { isolated_s: predictor.isolated(q.template, size).as_secs_f64(), arrival_s: q.arrival.as_secs_f64() };
            for (i, state) in running.iter().enumerate() {
                let target = member(&queries[i]);
                let before: Vec<[f32; FEATURES]> = queries[..i].iter().map(|q| interaction(target, member(q), size)).collect();
                let after: Vec<[f32; FEATURES]> = queries[i + 1..].iter().map(|q| interaction(target, member(q), size)).collect();
                let full = weights.memory(&before, &after);
                let incremental = state.memory.as_deref().expect("the predictor keeps a memory");
                prop_assert_eq!((incremental.before_count, incremental.after_count), (full.before_count, full.after_count));
                for (a, b) in incremental.before.0.iter().chain(&incremental.after.0).zip(full.before.0.iter().chain(&full.after.0)) {
                    prop_assert!((a - b).abs() < 1e-5, "query {}: {} vs {}", i, a, b);
                }
            }
        }

        #[test]
        fn cached_steps_predict_what_an_empty_cache_predicts_before_and_after_the_base_refits(
            arrivals in prop::collection::vec((1u32..20, 0.0f64..5.0), 1..10),
            latencies in prop::collection::vec((1u32..20, 0u32..6, 0.1f64..50.0), 1..20),
            seed in 0u64..500,
        ) {
            let weights = Arc::new(random_weights(6, seed));
            let base = crate::predict::ConcurrencyAware::new(crate::predict::concurrency::ConcurrencyConfig::default());
            let mut predictor = IconqPredictor::new(base, weights).unwrap();
            let size = Rpu(16);
            let mut running: Vec<crate::predict::QueryState> = Vec::new();
            let mut at_s = 0.0;
            for (i, &(template, gap)) in arrivals.iter().enumerate() {
                at_s += gap;
                let query = arriving(i as u64, template, at_s);
                let placement = predictor.predict_placement(query.arrival, &query, size, &running, None);
                running = placement.running;
                running.push(placement.query);
            }
            // The same queries with their memories read afresh: no cache.
            let uncached = |running: &[crate::predict::QueryState]| -> Vec<crate::predict::QueryState> {
                running.iter().map(|r| crate::predict::QueryState { memory: r.memory.as_deref().map(|m| Arc::new(m.clone())), ..r.clone() }).collect()
            };
            // Each prediction, and each memory's states to the bit.
            let bits = |placement: &crate::predict::Placement| -> Vec<(Duration, Vec<u32>)> {
                std::iter::once(&placement.query)
                    .chain(&placement.running)
                    .map(|q| {
                        let memory = q.memory.as_deref().expect("the predictor keeps a memory");
                        (q.predicted, memory.before.0.iter().chain(&memory.after.0).map(|v| v.to_bits()).collect())
                    })
                    .collect()
            };
            let next = arriving(1_000, 3, at_s + 1.0);
            // Twice: the first placement fills the caches, the second reads them.
            for _ in 0..2 {
                let cached = predictor.predict_placement(next.arrival, &next, size, &running, None);
                prop_assert_eq!(bits(&cached), bits(&predictor.predict_placement(next.arrival, &next, size, &uncached(&running), None)));
            }
            // The base refits (its first observations each do): every cache
            // is stale, and none of it is read.
            let version = predictor.base.predictions_version();
            for &(template, neighbours, latency_s) in &latencies {
                predictor.base_mut().observe(&crate::predict::Observation { template: TemplateId(template), size, neighbours, latency: Duration::from_secs_f64(latency_s), censored: false });
            }
            prop_assert_ne!(predictor.base.predictions_version(), version);
            let cached = predictor.predict_placement(next.arrival, &next, size, &running, None);
            prop_assert_eq!(bits(&cached), bits(&predictor.predict_placement(next.arrival, &next, size, &uncached(&running), None)), "seed {}", seed);
        }

        #[test]
        fn scored_then_completed_placements_are_what_building_every_memory_gives(
            arrivals in prop::collection::vec((1u32..20, 0.0f64..5.0, any::<bool>()), 1..16),
            seed in 0u64..500,
        ) {
            // Reading up to 4 a side, so that memories stop stepping too.
            let weights = Arc::new(IconqWeights { neighbours_max: 4, ..random_weights(6, seed) });
            let base = crate::predict::ConcurrencyAware::new(crate::predict::concurrency::ConcurrencyConfig::default());
            let predictor = IconqPredictor::new(base, weights).unwrap();
            let size = Rpu(16);
            let mut running: Vec<crate::predict::QueryState> = Vec::new();
            let mut at_s = 0.0;
            for (i, &(template, gap, oldest_leaves)) in arrivals.iter().enumerate() {
                at_s += gap;
                if oldest_leaves && !running.is_empty() {
                    running.remove(0);
                }
                let query = arriving(i as u64, template, at_s);
                let scored = predictor.score_placement(query.arrival, &query, size, &running, None);
                let reference = every_memory_built(&predictor, &query, size, &running);
                // (I) The scored predictions are the reference's, to the bit.
                prop_assert_eq!(scored.query.predicted, reference.query.predicted, "seed {}", seed);
                for (a, b) in scored.running.iter().zip(&reference.running) {
                    prop_assert_eq!(a.predicted, b.predicted, "seed {}", seed);
                }
                // Completed, the placement is the reference's, memories and
                // their caches included.
                let mut completed = scored;
                predictor.complete_placement(query.arrival, &query, size, &running, &mut completed);
                prop_assert_eq!(&completed, &reference, "seed {}", seed);
                prop_assert_eq!(&predictor.predict_placement(query.arrival, &query, size, &running, None), &reference);
                running = reference.running;
                running.push(reference.query);
            }
        }

        #[test]
        fn the_wide_kernels_compute_bit_for_bit_what_the_baseline_ones_compute(
            seed in 0u64..1000,
            outputs in 1usize..200,
            inputs in 0usize..48,
        ) {
            if matches!(pulp::Arch::new(), pulp::Arch::Scalar) {
                eprintln!("this CPU has no AVX2: the baseline build is the only one, nothing to compare");
                return Ok(());
            }
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-30.0f32..30.0)).collect::<Vec<f32>>();
            let (start, columns, z) = (draw(outputs), draw(outputs * inputs), draw(inputs));
            // (G) The matrix–vector product, blocks and all.
            let (mut baseline, mut wide) = (start.clone(), start.clone());
            add_columns_in_blocks::<32>(&mut baseline, &columns, &z);
            add_columns(&mut wide, &columns, &z);
            prop_assert_eq!(baseline.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), wide.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "seed {}", seed);
            // (G) The gates' activations and the new state, over the
            // whole range the polynomial `exp` clamps.
            let hidden = outputs.div_ceil(4);
            let (gates, cell) = (draw(4 * hidden), draw(hidden));
            let mut baseline = gates.clone();
            activate_in_place(&mut baseline, &cell);
            let wide = activate(gates, &cell).0;
            prop_assert_eq!(baseline[..2 * hidden].iter().map(|v| v.to_bits()).collect::<Vec<_>>(), wide.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "seed {}", seed);
        }

        #[test]
        fn the_inference_layout_computes_what_the_reference_computes(
            seed in 0u64..500,
            lengths in (0usize..12, 0usize..12),
            complete in any::<bool>(),
            isolated_s in 0.01f64..100.0,
        ) {
            let (weights, kernels, mut vectors) = layout_case(8, seed);
            let (before, after) = (vectors(lengths.0), vectors(lengths.1));
            let (reference, mut fast) = (weights.memory(&before, &after), kernels.memory(&before, &after));
            prop_assert_eq!((reference.before_count, reference.after_count), (fast.before_count, fast.after_count));
            for (a, b) in reference.before.0.iter().chain(&reference.after.0).zip(fast.before.0.iter().chain(&fast.after.0)) {
                prop_assert!((a - b).abs() < 1e-5, "{} vs {}", a, b);
            }
            let query = Estimates { isolated_s, base_s: isolated_s * 1.5 };
            let (a, b) = (weights.predict_from(&reference, query, Rpu(8), complete), kernels.predict_from(&mut fast, query, Rpu(8), complete));
            prop_assert!((a / b - 1.0).abs() < 1e-4, "{} vs {}", a, b);
            // The head's cache gives the same prediction, and after one
            // more neighbour it is still the reference's (stepped or not).
            prop_assert_eq!(kernels.predict_from(&mut fast, query, Rpu(8), complete), b);
            let next = vectors(1)[0];
            let mut fast_next = kernels.read_later(&fast, &next, None);
            let reference_next = weights.read_later(&reference, &next);
            let (a, b) = (weights.predict_from(&reference_next, query, Rpu(8), complete), kernels.predict_from(&mut fast_next, query, Rpu(8), complete));
            prop_assert!((a / b - 1.0).abs() < 1e-4, "after one more: {} vs {}", a, b);
            // A changed isolated estimate is not read from the cache.
            let moved = Estimates { isolated_s: isolated_s * 2.0, ..query };
            let (a, b) = (weights.predict_from(&reference_next, moved, Rpu(8), complete), kernels.predict_from(&mut fast_next, moved, Rpu(8), complete));
            prop_assert!((a / b - 1.0).abs() < 1e-4, "a moved estimate: {} vs {}", a, b);
        }

        #[test]
        fn scoring_a_later_neighbour_without_the_memory_predicts_to_the_bit_what_the_stepped_memory_predicts(
            seed in 0u64..500,
            lengths in (0usize..6, 0usize..10),
            cached_head in any::<bool>(),
            moved_estimate in any::<bool>(),
            with_partial in any::<bool>(),
            isolated_s in 0.01f64..100.0,
        ) {
            // Reading up to 6 a side, so that some memories have stopped
            // stepping and keep their after-state's part of the head.
            let (_, kernels, mut vectors) = layout_case(6, seed);
            let (before, after, next) = (vectors(lengths.0), vectors(lengths.1), vectors(1)[0]);
            let query = Estimates { isolated_s, base_s: isolated_s * 1.5 };
            let mut memory = kernels.memory(&before, &after);
            if cached_head {
                kernels.predict_from(&mut memory, query, Rpu(8), false);
            }
            let scored_for = if moved_estimate { Estimates { isolated_s: isolated_s * 2.0, ..query } } else { query };
            let partial = with_partial.then(|| kernels.after.partial(&memory.after, &OWN_FEATURES.map(|feature| next[feature])));
            // (I) What a placement's scoring predicts without building the
            // stepped memory is what predicting from that memory gives.
            let scored = kernels.predict_after_later(&memory, &next, partial.as_deref(), scored_for, Rpu(8));
            let mut stepped = kernels.read_later(&memory, &next, partial.as_deref());
            let built = kernels.predict_from(&mut stepped, scored_for, Rpu(8), false);
            prop_assert_eq!(scored.to_bits(), built.to_bits(), "seed {}: {} vs {}", seed, scored, built);
        }

        #[test]
        fn a_pair_s_interactions_both_ways_are_each_way_s_to_the_bit(
            (arrival_a, arrival_b) in (0.0f64..1e6, 0.0f64..1e6),
            same_arrival in any::<bool>(),
            (isolated_a, isolated_b) in (0.0f64..5e3, 0.0f64..5e3),
            size in 1u32..256,
        ) {
            let a = Terms::new(Member { isolated_s: isolated_a, arrival_s: arrival_a }, Rpu(size));
            let b = Terms::new(Member { isolated_s: isolated_b, arrival_s: if same_arrival { arrival_a } else { arrival_b } }, Rpu(size));
            let bits = |x: [f32; FEATURES]| x.map(f32::to_bits);
            let (a_reads_b, b_reads_a) = a.interactions_both_ways(&b);
            prop_assert_eq!(bits(a_reads_b), bits(plain_interaction(a.member, b.member, Rpu(size))));
            prop_assert_eq!(bits(b_reads_a), bits(plain_interaction(b.member, a.member, Rpu(size))));
            prop_assert_eq!(bits(interaction(a.member, b.member, Rpu(size))), bits(a_reads_b));
        }

        #[test]
        fn incremental_inference_matches_a_full_pass(
            arrivals in prop::collection::vec((0.0f64..100.0, 0.1f64..60.0), 1..12),
            seed in 0u64..1_000,
        ) {
            let weights = random_weights(6, seed);
            let target = Member { isolated_s: 5.0, arrival_s: 50.0 };
            let vectors: Vec<[f32; FEATURES]> = arrivals.iter().map(|&(at, took)| interaction(target, Member { isolated_s: took, arrival_s: at }, Rpu(16))).collect();
            let estimates = Estimates { isolated_s: target.isolated_s, base_s: 7.0 };
            let full = weights.predict_s(estimates, Rpu(16), &[], &vectors, false);
            let mut memory = weights.memory(&[], &[]);
            for vector in &vectors {
                memory = weights.read_later(&memory, vector);
            }
            let incremental = weights.predict_from(&memory, estimates, Rpu(16), false);
            prop_assert!((full - incremental).abs() <= 1e-9 * full.abs().max(1.0), "{} vs {}", full, incremental);
            prop_assert!(full.is_finite() && full > 0.0);
        }

        #[test]
        fn examples_are_deterministic_and_censored_labels_are_lower_bounds(runs in lane_runs(), seed in 0u64..1_000) {
            let lane = LaneLog::of(&runs);
            let sampling = |censored_share: f64| RowSampling { censored_share, arrival_rows: false, seed };
            let rows = lane.examples(&sampling(0.5));
            prop_assert_eq!(&rows, &lane.examples(&sampling(0.5)));
            // Without sampling: one row per execution, labelled with it.
            let full = lane.examples(&sampling(0.0));
            prop_assert_eq!(full.len(), lane.log.len());
            for (row, record) in full.iter().zip(&lane.log) {
                prop_assert_eq!(row.ln_latency_s, ln_seconds(record.latency.as_secs_f64()) as f32);
                prop_assert_eq!(row.censored, record.censored);
            }
            // Sampled rows are censored, and each follows its execution's
            // full row's label from below: rows come per execution, the
            // samples first.
            let sampled = lane.examples(&sampling(1.0));
            let mut next_full = full.iter().peekable();
            let mut pending: Vec<f32> = Vec::new();
            for row in &sampled {
                if next_full.peek().is_some_and(|f| *f == row) {
                    let label = next_full.next().map(|f| f.ln_latency_s).unwrap_or_default();
                    prop_assert!(pending.iter().all(|&p| p <= label + 1e-6), "{:?} above {}", pending, label);
                    pending.clear();
                } else {
                    prop_assert!(row.censored);
                    pending.push(row.ln_latency_s);
                }
            }
            prop_assert!(pending.is_empty() && next_full.next().is_none());
            prop_assert!(sampled.iter().all(|r| r.before.iter().chain(&r.after).all(|v| v.iter().all(|x| x.is_finite()))));
        }

        #[test]
        fn every_execution_gets_one_arrival_row_whether_or_not_a_later_query_overlapped_it(runs in lane_runs(), seed in 0u64..1_000) {
            // A router places a query before it can know whether another
            // will arrive while it runs: the rows that teach the model what
            // it knows then must not be only those of executions that a
            // later query did overlap.
            let lane = LaneLog::of(&runs);
            let rows = lane.examples(&RowSampling { censored_share: 0.0, arrival_rows: true, seed });
            let every: Vec<&Example> = rows.iter().filter(|r| r.reads == Reads::Every).collect();
            let arrival: Vec<&Example> = rows.iter().filter(|r| r.reads == Reads::AtArrival).collect();
            prop_assert_eq!(every.len(), lane.log.len());
            prop_assert_eq!(arrival.len(), lane.log.len());
            for (at_arrival, full) in arrival.iter().zip(&every) {
                prop_assert!(at_arrival.after.is_empty());
                prop_assert_eq!(&Example { after: full.after.clone(), reads: Reads::Every, ..(*at_arrival).clone() }, *full);
            }
        }
    }
}
