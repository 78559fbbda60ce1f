//! The concurrency-aware predictor: a joint log-linear model of isolated
//! latency and how it stretches with overlapping queries, fitted by
//! backfitting over a bounded window of recent executions.
//!
//! ```text
//! log latency = a[template] + s[size] + d[template, size]
//!             + β[template] · (g[bin(neighbours)] + h[size, bin(neighbours)])
//! ```
//!
//! - `a` is the template's base cost and `s` the size's speed; sizes never
//!   seen are scaled from the nearest seen one with a size exponent α fitted
//!   over the seen sizes' `s`.
//! - `d` is a template's own deviation at a size, shrunk towards zero.
//! - `g` is the slowdown curve shared by all sizes, in half-octave bins of
//!   the neighbour count; `h` is a size's deviation from it, shrunk.
//! - `β` is the template's sensitivity to interference (short queries that
//!   ride a fast lane barely stretch; scans stretch more), shrunk towards 1.
//!
//! Fitting the isolated latency and the interference *jointly* is what lets
//! it learn from loaded clusters: on a busy warehouse, few executions run
//! alone, and estimating the isolated latency from those few confounds
//! noise with interference. Censored executions (timeouts, cut short) enter
//! as lower bounds: in each pass, their target is `max(observed, predicted)`.
//!
//! After a fit, each size's curve `g + h`, over the bins where that size has
//! at least `min_rows_per_bin` executions, is made monotone
//! (pool-adjacent-violators, weighted by counts) and interpolated in
//! `log(1 + neighbours)`; a size with fewer than two such bins uses the
//! shared curve. Beyond the busiest bin seen, a curve extends with the
//! last segment's slope clamped to `[0, 1]` (processor sharing stretches at
//! most linearly); with one bin seen, with the prior curve's shape. It
//! refits each time it has learned an eighth more observations (after
//! each of the first fifteen) and at most every `refit_every`,
//! warm-starting from the previous fit.
//!
//! The model predicts every execution of one template on one size in one
//! neighbour bin alike, so each backfitting pass reads those *cells* (their
//! counts and summed log latencies; censored executions are imputed one by
//! one) instead of the executions: passes over a few thousand cells at
//! most, not ten passes of six over 16,384 executions.
//!
//! # Properties
//!
//! - (A) For a fixed template and size, the prediction never decreases as
//!   the neighbour count grows.
//! - (B) Before any observation, predictions are the prior isolated latency
//!   times the prior curve `1 + neighbours / 2`; with only isolated
//!   executions, the fitted isolated latency times that prior curve.
//! - (C) Memory is bounded by `window` executions; the parameters cover only
//!   the templates and sizes in the window.
//! - (D) The fit is deterministic: the same observations in the same order
//!   give the same predictions.
//! - (E) A deferred fit is the same fit: with [`ConcurrencyAware::defer_fits`],
//!   a refit that falls due is handed out as a [`FitJob`] (a copy of the
//!   window and the warm start) instead of running inside `observe`; the
//!   caller runs it anywhere and installs the [`Fit`]. Run and installed at
//!   once, it gives predictions identical to the inline fit's. Until then
//!   the previous fit keeps predicting.
//! - (F) The cells are a regrouping, not an approximation: the fitted
//!   parameters are those of the same backfitting run execution by
//!   execution, up to float rounding.
//! - (G) The cells are kept as executions enter and leave the window, in
//!   exact fixed-point sums: always equal to grouping the window afresh, so
//!   a refit copies a few thousand cells, not the window.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::model::{Rpu, TemplateId};
use crate::predict::{LatencyPredictor, Observation};
use crate::recency::RecentKeys;
use crate::stats::median;
use crate::time::Duration;

/// Neighbour bins, half-octaves: inclusive upper bounds.
const BIN_UPPER: [u32; 19] = [0, 1, 2, 3, 5, 7, 11, 15, 22, 31, 45, 63, 90, 127, 181, 255, 362, 511, u32::MAX];
const BINS: usize = BIN_UPPER.len();

fn bin_of(neighbours: u32) -> usize {
    BIN_UPPER.iter().position(|&upper| neighbours <= upper).expect("the last bin is unbounded")
}

/// The prior slowdown curve, in log space, at `x = log(1 + neighbours)`.
fn prior_log_slowdown(x: f64) -> f64 {
    (1.0 + x.exp_m1() / 2.0).ln()
}

/// Predictor settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// Executions kept for fitting.
    pub window: usize,
    /// The most observations between refits (a young window refits
    /// sooner: each time it has grown by an eighth).
    pub refit_every: u64,
    /// Backfitting passes of the first fit.
    pub cold_fit_iterations: u32,
    /// Backfitting passes of each later, warm-started fit.
    pub warm_fit_iterations: u32,
    /// Pseudo-count shrinking a template's per-size deviation to zero.
    pub template_size_shrinkage: f64,
    /// Pseudo-count shrinking a size's curve to the shared one.
    pub size_curve_shrinkage: f64,
    /// Pseudo-count shrinking a template's sensitivity to 1.
    pub sensitivity_shrinkage: f64,
    /// Executions a size needs in a neighbour bin for its curve to use it.
    pub min_rows_per_bin: f64,
    /// α while fewer than two sizes have been seen.
    pub default_size_exponent: f64,
    /// Isolated latency at 16 RPU assumed before anything is observed.
    pub prior_latency_16: Duration,
    /// Templates whose lifetime execution counts are kept; the least
    /// recently seen beyond it is forgotten (the fit itself only holds the
    /// window's templates).
    pub templates_max: usize,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig {
            window: 16_384,
            refit_every: 256,
            cold_fit_iterations: 40,
            warm_fit_iterations: 10,
            template_size_shrinkage: 16.0,
            size_curve_shrinkage: 16.0,
            sensitivity_shrinkage: 16.0,
            min_rows_per_bin: 5.0,
            default_size_exponent: 0.8,
            prior_latency_16: Duration::from_secs(3),
            templates_max: 10_000,
        }
    }
}

/// A monotone curve: `(log(1 + neighbours), log slowdown)` points with
/// increasing x and non-decreasing y.
#[derive(Clone, Debug, Default, PartialEq)]
struct Curve {
    points: Vec<(f64, f64)>,
}

impl Curve {
    /// Pool-adjacent-violators over `(x, y, weight)` blocks in x order.
    fn monotone(blocks_in: impl IntoIterator<Item = (f64, f64, f64)>) -> Curve {
        let mut blocks: Vec<(f64, f64, f64)> = Vec::new();
        for block in blocks_in {
            blocks.push(block);
            while blocks.len() >= 2 && blocks[blocks.len() - 2].1 > blocks[blocks.len() - 1].1 {
                let (x1, y1, w1) = blocks.pop().expect("two blocks");
                let (x0, y0, w0) = blocks.pop().expect("two blocks");
                let w = w0 + w1;
                blocks.push(((x0 * w0 + x1 * w1) / w, (y0 * w0 + y1 * w1) / w, w));
            }
        }
        Curve { points: blocks.into_iter().map(|(x, y, _)| (x, y)).collect() }
    }

    fn log_slowdown(&self, neighbours: u32) -> f64 {
        self.log_slowdown_at(f64::from(neighbours).ln_1p(), &mut 0)
    }

    /// The curve at `x = log(1 + neighbours)`. `segment` is where the
    /// search for `x`'s segment starts, and is left at the segment found:
    /// a caller reading increasing `x`s passes the same one along (the
    /// answers are those of a search from the start).
    fn log_slowdown_at(&self, x: f64, segment: &mut usize) -> f64 {
        match self.points.as_slice() {
            [] => prior_log_slowdown(x),
            [(x0, y0)] => y0 + (prior_log_slowdown(x) - prior_log_slowdown(*x0)).max(0.0),
            points => {
                if x <= points[0].0 {
                    return points[0].1;
                }
                while *segment + 1 < points.len() {
                    let ((x0, y0), (x1, y1)) = (points[*segment], points[*segment + 1]);
                    if x <= x1 {
                        return y0 + (y1 - y0) * (x - x0) / (x1 - x0).max(1e-12);
                    }
                    *segment += 1;
                }
                let ((x0, y0), (x1, y1)) = (points[points.len() - 2], points[points.len() - 1]);
                let slope = ((y1 - y0) / (x1 - x0).max(1e-12)).clamp(0.0, 1.0);
                y1 + slope * (x - x1)
            }
        }
    }

    /// The curve at each of `xs`, which increase.
    fn tabulate(&self, xs: &[f64]) -> Vec<f64> {
        let mut segment = 0;
        xs.iter().map(|&x| self.log_slowdown_at(x, &mut segment)).collect()
    }
}

/// The fitted parameters, keyed for prediction.
#[derive(Clone, Debug, Default)]
struct Fitted {
    base: HashMap<TemplateId, f64>,
    sensitivity: HashMap<TemplateId, f64>,
    template_size: HashMap<(TemplateId, Rpu), f64>,
    size: BTreeMap<Rpu, f64>,
    /// The shared curve `g` and the per-size deviations `h`, raw (for warm
    /// starts).
    shared_raw: [f64; BINS],
    size_raw: BTreeMap<Rpu, [f64; BINS]>,
    /// Monotone curves for prediction.
    shared_curve: Curve,
    size_curves: BTreeMap<Rpu, Curve>,
    /// Median base, for templates never seen.
    unseen_base: f64,
    size_exponent: f64,
    /// The hot path: per seen `(template, size)`, `a + s + d`, `β` and
    /// the index of the size's table in `tables`.
    keyed: HashMap<(TemplateId, Rpu), (f64, f64, usize), KeyHasher>,
    /// Per seen size (in size order), its curve tabulated for `0..TABLE`
    /// neighbours.
    tables: Vec<Vec<f64>>,
}

/// Neighbour counts tabulated per size; larger ones interpolate.
const TABLE: usize = 4_096;

/// `log(1 + n)` for each tabulated neighbour count `n`, computed once.
static TABLE_XS: std::sync::LazyLock<Vec<f64>> = std::sync::LazyLock::new(|| (0..TABLE).map(|n| (n as f64).ln_1p()).collect());

/// A fast hasher for the small integer keys of the prediction hot path
/// (the router predicts every running query on every arrival).
#[derive(Clone, Copy, Debug, Default)]
struct KeyHasher;

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = MultiplyHasher;
    fn build_hasher(&self) -> MultiplyHasher {
        MultiplyHasher(0)
    }
}

/// Multiply-rotate hashing (as in rustc's FxHash).
#[derive(Clone, Copy, Debug)]
struct MultiplyHasher(u64);

impl std::hash::Hasher for MultiplyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }
    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// See the module docs.
#[derive(Clone, Debug)]
pub struct ConcurrencyAware {
    config: ConcurrencyConfig,
    /// Shared with this predictor's clones until one of them learns (the
    /// planner's forks never do): a fork costs no copy of the window.
    learned: Arc<Learned>,
    /// Shared with a [`FitJob`] as its warm start, without a copy.
    fitted: Option<Arc<Fitted>>,
    /// Fits installed: `predict` answers as it did while this stays.
    fits_installed: u64,
    observations: u64,
    /// `observations` when the last refit fell due.
    fell_due_at: u64,
    /// Refits are handed out ([`ConcurrencyAware::take_fit_job`]) rather
    /// than run in `observe`.
    deferred_fits: bool,
    /// A deferred refit fell due and was not yet handed out.
    fit_due: bool,
    /// Executions learned per template, ever (not only the window's), for
    /// the most recently seen `templates_max` templates.
    per_template: HashMap<TemplateId, u64>,
    templates: RecentKeys<TemplateId>,
}

/// What the fit learns from.
#[derive(Clone, Debug, Default)]
struct Learned {
    window: VecDeque<Windowed>,
    /// The window's executions by cell, kept as they enter and leave.
    cells: WindowCells,
}

/// An execution in the window, with its log latency (computed once, not
/// at each of the refits it takes part in).
#[derive(Clone, Copy, Debug)]
struct Windowed {
    observation: Observation,
    log_latency: f64,
}

impl Windowed {
    fn new(observation: Observation) -> Self {
        Windowed { observation, log_latency: observation.latency.as_secs_f64().max(1e-6).ln() }
    }
}

/// Fixed-point sums, in units of 2^-64: a value is truncated to whole
/// units (which changes no log latency of at least 2^-12 in magnitude:
/// every one but those within 0.03% of a second), and sums of units are
/// exact, whatever the order, so an execution added and later removed
/// leaves no trace.
const FIXED_UNITS: f64 = 18_446_744_073_709_551_616.0;

fn to_fixed(value: f64) -> i128 {
    (value * FIXED_UNITS) as i128
}

fn from_fixed(sum: i128) -> f64 {
    sum as f64 / FIXED_UNITS
}

/// A cell's key: template, size, neighbour bin.
type CellKey = (TemplateId, Rpu, u8);

/// One cell's executions in the window.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct CellSums {
    count: u32,
    /// The log latencies of those not censored.
    exact_sum: i128,
}

/// The window's executions grouped by cell, kept incrementally (property
/// G: always equal to grouping the window afresh).
#[derive(Clone, Debug, Default, PartialEq)]
struct WindowCells {
    cells: BTreeMap<CellKey, CellSums>,
    bin_count: [u64; BINS],
    bin_x_sum: [i128; BINS],
    /// The censored executions' cells and log latencies, oldest first:
    /// they leave the window in the order they entered it.
    censored: VecDeque<(CellKey, f64)>,
}

impl WindowCells {
    #[cfg(test)]
    fn of(window: &[Windowed]) -> Self {
        let mut cells = WindowCells::default();
        for w in window {
            cells.add(w);
        }
        cells
    }

    fn key(w: &Windowed) -> CellKey {
        let bin = u8::try_from(bin_of(w.observation.neighbours)).expect("fewer than 256 bins");
        (w.observation.template, w.observation.size, bin)
    }

    fn add(&mut self, w: &Windowed) {
        let key = WindowCells::key(w);
        let cell = self.cells.entry(key).or_default();
        cell.count += 1;
        if w.observation.censored {
            self.censored.push_back((key, w.log_latency));
        } else {
            cell.exact_sum += to_fixed(w.log_latency);
        }
        self.bin_count[usize::from(key.2)] += 1;
        self.bin_x_sum[usize::from(key.2)] += to_fixed(f64::from(w.observation.neighbours).ln_1p());
    }

    fn remove(&mut self, w: &Windowed) {
        let key = WindowCells::key(w);
        let std::collections::btree_map::Entry::Occupied(mut entry) = self.cells.entry(key) else {
            debug_assert!(false, "a windowed execution has its cell");
            return;
        };
        let cell = entry.get_mut();
        cell.count -= 1;
        if w.observation.censored {
            let oldest = self.censored.pop_front();
            debug_assert_eq!(oldest.map(|(key, _)| key), Some(key), "the oldest censored execution leaves first");
        } else {
            cell.exact_sum -= to_fixed(w.log_latency);
        }
        if cell.count == 0 {
            entry.remove();
        }
        self.bin_count[usize::from(key.2)] -= 1;
        self.bin_x_sum[usize::from(key.2)] -= to_fixed(f64::from(w.observation.neighbours).ln_1p());
    }

    /// What a fit reads: a copy, O(cells + censored executions).
    fn fit_input(&self) -> FitInput {
        FitInput {
            cells: self.cells.iter().map(|(key, sums)| (*key, f64::from(sums.count), from_fixed(sums.exact_sum))).collect(),
            censored: self.censored.iter().copied().collect(),
            bin_count: self.bin_count.map(|n| n as f64),
            bin_x_sum: self.bin_x_sum.map(from_fixed),
        }
    }
}

/// A fit's data: per cell in key order its key, executions and summed
/// exact log latencies; each censored execution's cell and log latency;
/// per bin its executions and their `log(1 + neighbours)` summed.
#[derive(Clone, Debug)]
struct FitInput {
    cells: Vec<(CellKey, f64, f64)>,
    censored: Vec<(CellKey, f64)>,
    bin_count: [f64; BINS],
    bin_x_sum: [f64; BINS],
}

/// The executions of one template on one size in one neighbour bin: the
/// backfitting's model predicts them alike, so each pass reads their
/// count and the sum of their targets instead of each execution.
struct Cell {
    /// Executions.
    count: f64,
    /// Their log latencies summed, censored ones excepted.
    exact_sum: f64,
    /// The pass's targets summed: `exact_sum` plus each censored
    /// execution's `max(observed, predicted)` as of the pass.
    target_sum: f64,
    template: usize,
    size: usize,
    template_size: usize,
    bin: usize,
}

/// The backfitting's parameters over the cells' dense indices.
struct Params {
    base: Vec<f64>,
    sensitivity: Vec<f64>,
    speed: Vec<f64>,
    deviation: Vec<f64>,
    shared: [f64; BINS],
    per_size: Vec<[f64; BINS]>,
}

impl Params {
    /// The cell's log slowdown curve at its bin, `g + h`.
    fn curve(&self, r: &Cell) -> f64 {
        self.shared[r.bin] + self.per_size[r.size][r.bin]
    }

    /// The cell's predicted log latency.
    fn predict(&self, r: &Cell) -> f64 {
        self.base[r.template] + self.speed[r.size] + self.deviation[r.template_size] + self.sensitivity[r.template] * self.curve(r)
    }

    /// The cell's residuals against its targets, summed.
    fn residual(&self, r: &Cell) -> f64 {
        r.target_sum - r.count * self.predict(r)
    }
}


impl ConcurrencyAware {
    /// An untrained predictor.
    pub fn new(config: ConcurrencyConfig) -> Self {
        let templates = RecentKeys::new(config.templates_max);
        ConcurrencyAware {
            config,
            learned: Arc::default(),
            fitted: None,
            fits_installed: 0,
            observations: 0,
            fell_due_at: 0,
            deferred_fits: false,
            fit_due: false,
            per_template: HashMap::new(),
            templates,
        }
    }

    /// From now on, a refit that falls due is not run inside `observe` but
    /// handed out by [`ConcurrencyAware::take_fit_job`] (property E): a
    /// live router runs it off its thread.
    pub fn defer_fits(&mut self) {
        self.deferred_fits = true;
    }

    /// The refit that fell due since the last one handed out, if any.
    pub fn take_fit_job(&mut self) -> Option<FitJob> {
        let Learned { window, cells } = &*self.learned;
        if !std::mem::take(&mut self.fit_due) || window.is_empty() {
            return None;
        }
        Some(FitJob { config: self.config.clone(), executions: window.len(), input: cells.fit_input(), previous: self.fitted.clone() })
    }

    /// Installs a fit run from a [`FitJob`]: predictions use it from now on.
    pub fn install_fit(&mut self, fit: Fit) {
        self.fitted = Some(fit.0);
        self.fits_installed += 1;
    }

    /// The fitted size-scaling exponent α (`ℓ(s) ∝ s^-α`).
    pub fn size_exponent(&self) -> f64 {
        self.fitted.as_ref().map_or(self.config.default_size_exponent, |f| f.size_exponent)
    }

    /// Refits every parameter to the window, warm-starting from the last
    /// fit.
    pub fn fit(&mut self) {
        let Learned { window, cells } = &*self.learned;
        if window.is_empty() {
            return;
        }
        self.fitted = Some(Arc::new(fit_cells(&self.config, &cells.fit_input(), self.fitted.as_deref())));
        self.fits_installed += 1;
    }
}

/// A refit detached from its predictor: a copy of the window's cells and
/// the previous fit to warm-start from. [`FitJob::run`] is pure, so it can
/// run on any thread.
#[derive(Clone, Debug)]
pub struct FitJob {
    config: ConcurrencyConfig,
    executions: usize,
    input: FitInput,
    previous: Option<Arc<Fitted>>,
}

impl FitJob {
    /// Executions it fits.
    pub fn len(&self) -> usize {
        self.executions
    }

    /// Whether it has nothing to fit (never, as handed out).
    pub fn is_empty(&self) -> bool {
        self.executions == 0
    }

    /// Fits, as [`ConcurrencyAware::fit`] would have.
    pub fn run(self) -> Fit {
        Fit(Arc::new(fit_cells(&self.config, &self.input, self.previous.as_deref())))
    }
}

/// A finished fit, for [`ConcurrencyAware::install_fit`].
#[derive(Clone, Debug)]
pub struct Fit(Arc<Fitted>);

/// Fits every parameter to the cells of `input`, warm-starting from
/// `previous`.
fn fit_cells(config: &ConcurrencyConfig, input: &FitInput, previous: Option<&Fitted>) -> Fitted {
    let iterations = if previous.is_some() { config.warm_fit_iterations } else { config.cold_fit_iterations };

    // Dense indices in key order: the cells are sorted by template, then
    // size, so a template's and a pair's cells are consecutive.
    let mut templates: Vec<TemplateId> = Vec::new();
    let mut sizes: Vec<Rpu> = Vec::new();
    let mut pairs: Vec<(TemplateId, Rpu)> = Vec::new();
    let FitInput { bin_count, bin_x_sum, .. } = *input;
    let mut cells: Vec<Cell> = Vec::with_capacity(input.cells.len());
    for &((template_id, size_id, bin), count, exact_sum) in &input.cells {
        if templates.last() != Some(&template_id) {
            templates.push(template_id);
        }
        if pairs.last() != Some(&(template_id, size_id)) {
            pairs.push((template_id, size_id));
        }
        let size = sizes.iter().position(|s| *s == size_id).unwrap_or_else(|| {
            sizes.push(size_id);
            sizes.len() - 1
        });
        let bin = usize::from(bin);
        cells.push(Cell { count, exact_sum, target_sum: 0.0, template: templates.len() - 1, size, template_size: pairs.len() - 1, bin });
    }
    // Each censored execution's cell.
    let censored: Vec<(usize, f64)> = input
        .censored
        .iter()
        .map(|(key, log_latency)| (input.cells.binary_search_by(|(k, _, _)| k.cmp(key)).expect("a censored execution has its cell"), *log_latency))
        .collect();

    // Parameters, warm-started.
    let old = previous;
    let mut params = Params {
        base: templates.iter().map(|t| old.and_then(|f| f.base.get(t).copied()).unwrap_or(0.0)).collect(),
        sensitivity: templates.iter().map(|t| old.and_then(|f| f.sensitivity.get(t).copied()).unwrap_or(1.0)).collect(),
        speed: sizes.iter().map(|s| old.and_then(|f| f.size.get(s).copied()).unwrap_or(0.0)).collect(),
        deviation: pairs.iter().map(|p| old.and_then(|f| f.template_size.get(p).copied()).unwrap_or(0.0)).collect(),
        shared: old.map_or([0.0; BINS], |f| f.shared_raw),
        per_size: sizes.iter().map(|s| old.and_then(|f| f.size_raw.get(s).copied()).unwrap_or([0.0; BINS])).collect(),
    };

    // Executions per key, for the additive terms' means.
    let counts = |len: usize, key: fn(&Cell) -> usize| {
        let mut count = vec![0.0; len];
        for r in &cells {
            count[key(r)] += r.count;
        }
        count
    };
    let template_count = counts(templates.len(), |c| c.template);
    let size_count = counts(sizes.len(), |c| c.size);
    let template_size_count = counts(pairs.len(), |c| c.template_size);

    // Each step sums the residuals under the parameters as they stand
    // (one pass over the cells) and then updates its own parameters.
    let mut sum = Vec::new();
    for _ in 0..iterations {
        // Censored executions are imputed as max(bound, current
        // prediction).
        for cell in &mut cells {
            cell.target_sum = cell.exact_sum;
        }
        for &(i, log_latency) in &censored {
            let predicted = params.predict(&cells[i]);
            cells[i].target_sum += log_latency.max(predicted);
        }

        // Additive terms: new = (Σ residual + n·old) / (n + shrinkage).
        let additive = |sum: &mut Vec<f64>, params: &Params, key: fn(&Cell) -> usize, len: usize| {
            sum.clear();
            sum.resize(len, 0.0);
            for r in &cells {
                sum[key(r)] += params.residual(r);
            }
        };
        let update = |values: &mut [f64], sum: &[f64], count: &[f64], shrinkage: f64| {
            for (k, value) in values.iter_mut().enumerate() {
                *value = (sum[k] + count[k] * *value) / (count[k] + shrinkage).max(1e-12);
            }
        };
        additive(&mut sum, &params, |c| c.template, templates.len());
        update(&mut params.base, &sum, &template_count, 0.0);
        additive(&mut sum, &params, |c| c.size, sizes.len());
        update(&mut params.speed, &sum, &size_count, 0.0);
        additive(&mut sum, &params, |c| c.template_size, pairs.len());
        update(&mut params.deviation, &sum, &template_size_count, config.template_size_shrinkage);

        // Curves: regress the partial residual on β.
        let (mut num, mut den) = ([0.0; BINS], [0.0; BINS]);
        for r in &cells {
            let e = params.residual(r);
            let b = params.sensitivity[r.template];
            num[r.bin] += b * (e + r.count * b * params.shared[r.bin]);
            den[r.bin] += r.count * b * b;
        }
        for bin in 0..BINS {
            if den[bin] > 1e-12 {
                params.shared[bin] = num[bin] / den[bin];
            }
        }
        let (mut num, mut den) = (vec![[0.0; BINS]; sizes.len()], vec![[0.0; BINS]; sizes.len()]);
        for r in &cells {
            let e = params.residual(r);
            let b = params.sensitivity[r.template];
            num[r.size][r.bin] += b * (e + r.count * b * params.per_size[r.size][r.bin]);
            den[r.size][r.bin] += r.count * b * b;
        }
        for (size, curve) in params.per_size.iter_mut().enumerate() {
            for bin in 0..BINS {
                curve[bin] = num[size][bin] / (den[size][bin] + config.size_curve_shrinkage).max(1e-12);
            }
        }

        // Sensitivities, shrunk towards 1 and kept non-negative.
        let (mut num, mut den) = (vec![0.0; templates.len()], vec![0.0; templates.len()]);
        for r in &cells {
            let e = params.residual(r);
            let g = params.curve(r);
            num[r.template] += g * (e + r.count * params.sensitivity[r.template] * g);
            den[r.template] += r.count * g * g;
        }
        for (t, b) in params.sensitivity.iter_mut().enumerate() {
            *b = ((num[t] + config.sensitivity_shrinkage) / (den[t] + config.sensitivity_shrinkage).max(1e-12)).clamp(0.0, 8.0);
        }

        // Anchor the shared curve at its least-loaded bin; the bases
        // absorb the shift.
        if let Some(first) = (0..BINS).find(|&bin| bin_count[bin] > 0.0) {
            let shift = params.shared[first];
            for value in params.shared.iter_mut() {
                *value -= shift;
            }
            for (t, b) in params.base.iter_mut().enumerate() {
                *b += params.sensitivity[t] * shift;
            }
        }
    }
    let Params { base, sensitivity, speed, deviation, shared, per_size } = params;

    // Prediction tables.
    let bin_x = |bin: usize| bin_x_sum[bin] / bin_count[bin];
    let shared_curve = Curve::monotone((0..BINS).filter(|&b| bin_count[b] > 0.0).map(|b| (bin_x(b), shared[b], bin_count[b])));
    let mut size_counts = vec![[0.0; BINS]; sizes.len()];
    for r in &cells {
        size_counts[r.size][r.bin] += r.count;
    }
    let size_curves: BTreeMap<Rpu, Curve> = sizes
        .iter()
        .enumerate()
        .map(|(z, size)| {
            // Only the bins this size has seen: beyond them, its own
            // curve extends (other sizes' congestion says little about
            // a bigger cluster's).
            let seen = |b: usize| size_counts[z][b] >= config.min_rows_per_bin;
            let curve = if (0..BINS).filter(|&b| seen(b)).count() >= 2 {
                Curve::monotone((0..BINS).filter(|&b| seen(b)).map(|b| (bin_x(b), shared[b] + per_size[z][b], size_counts[z][b])))
            } else {
                shared_curve.clone()
            };
            (*size, curve)
        })
        .collect();
    let size_exponent = if sizes.len() >= 2 {
        let xs: Vec<f64> = sizes.iter().map(|s| f64::from(s.0.max(1)).ln()).collect();
        let (mx, my) = (xs.iter().sum::<f64>() / xs.len() as f64, speed.iter().sum::<f64>() / speed.len() as f64);
        let sxx: f64 = xs.iter().map(|x| (x - mx) * (x - mx)).sum();
        let sxy: f64 = xs.iter().zip(&speed).map(|(x, y)| (x - mx) * (y - my)).sum();
        if sxx > 1e-12 { (-sxy / sxx).clamp(0.0, 1.5) } else { config.default_size_exponent }
    } else {
        config.default_size_exponent
    };
    let speed_of: HashMap<Rpu, f64> = sizes.iter().copied().zip(speed.iter().copied()).collect();
    let table_of: HashMap<Rpu, usize> = size_curves.keys().enumerate().map(|(index, size)| (*size, index)).collect();
    let keyed = pairs
        .iter()
        .zip(&deviation)
        .map(|(&(t, z), d)| {
            let ti = templates.binary_search(&t).expect("a pair's template is fitted");
            ((t, z), (base[ti] + speed_of[&z] + d, sensitivity[ti], table_of[&z]))
        })
        .collect();
    let tables = size_curves.values().map(|curve| curve.tabulate(&TABLE_XS)).collect();
    Fitted {
        keyed,
        tables,
        unseen_base: median(&base),
        base: templates.iter().copied().zip(base).collect(),
        sensitivity: templates.iter().copied().zip(sensitivity).collect(),
        template_size: pairs.iter().copied().zip(deviation).collect(),
        size: sizes.iter().copied().zip(speed).collect(),
        shared_raw: shared,
        size_raw: sizes.iter().copied().zip(per_size).collect(),
        shared_curve,
        size_curves,
        size_exponent,
    }
}

impl ConcurrencyAware {
    fn log_predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> f64 {
        let log_size = |s: Rpu| f64::from(s.0.max(1)).ln();
        let Some(f) = &self.fitted else {
            let isolated = self.config.prior_latency_16.as_secs_f64().ln() - self.config.default_size_exponent * (log_size(size) - log_size(Rpu(16)));
            return isolated + prior_log_slowdown(f64::from(neighbours).ln_1p());
        };
        if let Some(&(offset, sensitivity, table)) = f.keyed.get(&(template, size))
            && let Some(slowdown) = f.tables[table].get(neighbours as usize)
        {
            return offset + sensitivity * slowdown;
        }
        let speed = f.size.get(&size).copied().unwrap_or_else(|| {
            let (nearest, speed) = f
                .size
                .iter()
                .min_by(|(a, _), (b, _)| (log_size(**a) - log_size(size)).abs().total_cmp(&(log_size(**b) - log_size(size)).abs()).then(a.cmp(b)))
                .expect("a fit has at least one size");
            speed - f.size_exponent * (log_size(size) - log_size(*nearest))
        });
        let base = f.base.get(&template).copied().unwrap_or(f.unseen_base);
        let deviation = f.template_size.get(&(template, size)).copied().unwrap_or(0.0);
        let sensitivity = f.sensitivity.get(&template).copied().unwrap_or(1.0);
        let curve = f.size_curves.get(&size).unwrap_or(&f.shared_curve);
        base + speed + deviation + sensitivity * curve.log_slowdown(neighbours)
    }
}

impl LatencyPredictor for ConcurrencyAware {
    fn name(&self) -> &str {
        "concurrency-aware"
    }

    fn observe(&mut self, observation: &Observation) {
        let Learned { window, cells } = Arc::make_mut(&mut self.learned);
        if window.len() == self.config.window.max(1)
            && let Some(oldest) = window.pop_front()
        {
            cells.remove(&oldest);
        }
        let windowed = Windowed::new(*observation);
        cells.add(&windowed);
        window.push_back(windowed);
        self.observations += 1;
        if let Some(forgotten) = self.templates.touch(&observation.template) {
            self.per_template.remove(&forgotten);
        }
        *self.per_template.entry(observation.template).or_default() += 1;
        // A young window refits each time it has grown by an eighth, so a
        // fresh node's predictions firm up within its first few hundred
        // queries (a fit over n rows every n / 8 observations costs less
        // per observation than the full window's every `refit_every`).
        let gap = (self.observations / 8).clamp(1, self.config.refit_every.max(1));
        if self.observations - self.fell_due_at >= gap {
            self.fell_due_at = self.observations;
            if self.deferred_fits {
                self.fit_due = true;
            } else {
                self.fit();
            }
        }
    }

    fn defer_fits(&mut self) {
        ConcurrencyAware::defer_fits(self);
    }

    fn take_fit_job(&mut self) -> Option<FitJob> {
        ConcurrencyAware::take_fit_job(self)
    }

    fn install_fit(&mut self, fit: Fit) {
        ConcurrencyAware::install_fit(self, fit);
    }

    fn template_observations(&self, template: TemplateId) -> u64 {
        self.per_template.get(&template).copied().unwrap_or(0)
    }

    fn isolated(&self, template: TemplateId, size: Rpu) -> Duration {
        self.predict(template, size, 0)
    }

    fn predict(&self, template: TemplateId, size: Rpu, neighbours: u32) -> Duration {
        Duration::from_secs_f64(self.log_predict(template, size, neighbours).exp().clamp(1e-6, 1e7))
    }

    fn predictions_version(&self) -> Option<u64> {
        Some(self.fits_installed)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn obs(template: u32, size: u32, neighbours: u32, latency_s: f64) -> Observation {
        Observation { template: TemplateId(template), size: Rpu(size), neighbours, latency: Duration::from_secs_f64(latency_s), censored: false }
    }

    #[test]
    fn a_deferred_predictor_keeps_its_previous_fit_until_a_new_one_is_installed() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        p.defer_fits();
        let prior = p.predict(TemplateId(1), Rpu(16), 0);
        p.observe(&obs(1, 16, 0, 40.0));
        assert_eq!(p.predict(TemplateId(1), Rpu(16), 0), prior, "observing does not fit");
        let job = p.take_fit_job().expect("the first observation makes a fit due");
        assert_eq!(job.len(), 1);
        assert!(p.take_fit_job().is_none(), "a due fit is handed out once");
        p.observe(&obs(1, 16, 0, 40.0));
        assert_eq!(p.predict(TemplateId(1), Rpu(16), 0), prior, "still the previous fit while the job runs");
        p.install_fit(job.run());
        assert!((p.predict(TemplateId(1), Rpu(16), 0).as_secs_f64() - 40.0).abs() < 1.0, "{:?}", p.predict(TemplateId(1), Rpu(16), 0));
    }

    #[test]
    fn a_clone_shares_the_window_until_it_learns() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for i in 0..100 {
            p.observe(&obs(i % 7, 16, i % 5, 1.0 + f64::from(i)));
        }
        let mut fork = p.clone();
        assert!(Arc::ptr_eq(&p.learned, &fork.learned), "a fork copies nothing");
        fork.observe(&obs(1, 16, 0, 2.0));
        assert!(!Arc::ptr_eq(&p.learned, &fork.learned));
        assert_eq!((p.learned.window.len(), fork.learned.window.len()), (100, 101), "what the fork learns stays its own");
    }

    #[test]
    fn learns_how_latency_stretches_with_neighbours() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for t in 1..=20 {
            let base = f64::from(t);
            p.observe(&obs(t, 16, 0, base));
            for n in [1, 4, 16] {
                p.observe(&obs(t, 16, n, base * (1.0 + f64::from(n))));
            }
        }
        p.fit();
        let alone = p.predict(TemplateId(3), Rpu(16), 0).as_secs_f64();
        let crowded = p.predict(TemplateId(3), Rpu(16), 16).as_secs_f64();
        assert!((alone - 3.0).abs() < 0.05, "{alone}");
        assert!((crowded / alone - 17.0).abs() < 1.0, "{crowded}");
    }

    #[test]
    fn isolated_latency_is_learned_from_loaded_executions_only() {
        // No template ever runs alone; the shared curve links them.
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for t in 1..=30 {
            let base = f64::from(t);
            for n in [2, 8, 32] {
                p.observe(&obs(t, 16, n + (t % 2), base * (1.0 + f64::from(n + (t % 2)) / 4.0)));
            }
        }
        p.fit();
        let ratio = p.predict(TemplateId(7), Rpu(16), 32).as_secs_f64() / p.predict(TemplateId(14), Rpu(16), 32).as_secs_f64();
        assert!((ratio - 0.5).abs() < 0.05, "templates keep their relative cost: {ratio}");
    }

    #[test]
    fn templates_learn_their_own_sensitivity_to_interference() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for round in 0..20 {
            for n in [0, 4, 16, 64] {
                let stretch = 1.0 + f64::from(n) / 4.0;
                p.observe(&obs(1, 16, n, 10.0 * stretch * (1.0 + 0.01 * f64::from(round % 3))));
                p.observe(&obs(2, 16, n, 10.0 * stretch.sqrt() * (1.0 + 0.01 * f64::from(round % 3))));
            }
        }
        p.fit();
        let scan = p.predict(TemplateId(1), Rpu(16), 64).as_secs_f64() / p.predict(TemplateId(1), Rpu(16), 0).as_secs_f64();
        let light = p.predict(TemplateId(2), Rpu(16), 64).as_secs_f64() / p.predict(TemplateId(2), Rpu(16), 0).as_secs_f64();
        assert!(scan > 12.0 && light < 7.0, "scan x{scan:.2}, light x{light:.2}");
    }

    #[test]
    fn censored_executions_raise_predictions_they_exceed() {
        let mut plain = ConcurrencyAware::new(ConcurrencyConfig::default());
        let mut censored = ConcurrencyAware::new(ConcurrencyConfig::default());
        for p in [&mut plain, &mut censored] {
            for _ in 0..8 {
                p.observe(&obs(1, 16, 0, 10.0));
            }
        }
        censored.observe(&Observation { censored: true, ..obs(1, 16, 0, 1_000.0) });
        plain.fit();
        censored.fit();
        assert!(censored.predict(TemplateId(1), Rpu(16), 0) > plain.predict(TemplateId(1), Rpu(16), 0));
    }

    #[test]
    fn unseen_sizes_scale_with_the_fitted_exponent() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        for t in 1..=10 {
            let base = f64::from(t) * 8.0;
            p.observe(&obs(t, 8, 0, base));
            p.observe(&obs(t, 16, 0, base / 2.0));
        }
        p.fit();
        assert!((p.size_exponent() - 1.0).abs() < 1e-6, "{}", p.size_exponent());
        let at_32 = p.predict(TemplateId(4), Rpu(32), 0).as_secs_f64();
        assert!((at_32 - 8.0).abs() < 0.05, "{at_32}");
    }

    #[test]
    fn without_concurrency_data_the_prior_curve_applies() {
        let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
        let prior = p.predict(TemplateId(1), Rpu(16), 4).as_secs_f64();
        assert!((prior - 3.0 * 3.0).abs() < 1e-3, "{prior}");
        p.observe(&obs(1, 16, 0, 2.0));
        assert!((p.predict(TemplateId(1), Rpu(16), 4).as_secs_f64() - 2.0 * 3.0).abs() < 1e-3);
    }

    /// The backfitting run execution by execution, as first written: each
    /// step computes every execution's residual, then sums them by key.
    mod reference {
        use super::super::*;

        pub(super) struct Raw {
            pub base: HashMap<TemplateId, f64>,
            pub sensitivity: HashMap<TemplateId, f64>,
            pub template_size: HashMap<(TemplateId, Rpu), f64>,
            pub size: HashMap<Rpu, f64>,
            pub shared_raw: [f64; BINS],
            pub size_raw: HashMap<Rpu, [f64; BINS]>,
        }

        /// An execution: template, size, pair, bin, log latency, censored.
        type Row = (usize, usize, usize, usize, f64, bool);

        pub(super) fn fit(config: &ConcurrencyConfig, window: &[Windowed], previous: Option<&Fitted>) -> Raw {
            let iterations = if previous.is_some() { config.warm_fit_iterations } else { config.cold_fit_iterations };
            let mut templates = Vec::new();
            let mut sizes = Vec::new();
            let mut pairs = Vec::new();
            fn index<K: PartialEq>(list: &mut Vec<K>, key: K) -> usize {
                list.iter().position(|k| *k == key).unwrap_or_else(|| {
                    list.push(key);
                    list.len() - 1
                })
            }
            let rows: Vec<Row> = window
                .iter()
                .map(|w| {
                    let o = w.observation;
                    let t = index(&mut templates, o.template);
                    let z = index(&mut sizes, o.size);
                    let p = index(&mut pairs, (o.template, o.size));
                    (t, z, p, bin_of(o.neighbours), w.log_latency, o.censored)
                })
                .collect();
            let mut bin_seen = [false; BINS];
            for r in &rows {
                bin_seen[r.3] = true;
            }
            let mut base: Vec<f64> = templates.iter().map(|t| previous.and_then(|f| f.base.get(t).copied()).unwrap_or(0.0)).collect();
            let mut sensitivity: Vec<f64> = templates.iter().map(|t| previous.and_then(|f| f.sensitivity.get(t).copied()).unwrap_or(1.0)).collect();
            let mut speed: Vec<f64> = sizes.iter().map(|s| previous.and_then(|f| f.size.get(s).copied()).unwrap_or(0.0)).collect();
            let mut deviation: Vec<f64> = pairs.iter().map(|p| previous.and_then(|f| f.template_size.get(p).copied()).unwrap_or(0.0)).collect();
            let mut shared = previous.map_or([0.0; BINS], |f| f.shared_raw);
            let mut per_size: Vec<[f64; BINS]> = sizes.iter().map(|s| previous.and_then(|f| f.size_raw.get(s).copied()).unwrap_or([0.0; BINS])).collect();
            for _ in 0..iterations {
                let predict = |base: &[f64], speed: &[f64], deviation: &[f64], sensitivity: &[f64], shared: &[f64; BINS], per_size: &[[f64; BINS]], r: &Row| {
                    base[r.0] + speed[r.1] + deviation[r.2] + sensitivity[r.0] * (shared[r.3] + per_size[r.1][r.3])
                };
                let targets: Vec<f64> = rows.iter().map(|r| if r.5 { r.4.max(predict(&base, &speed, &deviation, &sensitivity, &shared, &per_size, r)) } else { r.4 }).collect();
                let residuals = |base: &[f64], speed: &[f64], deviation: &[f64], sensitivity: &[f64], shared: &[f64; BINS], per_size: &[[f64; BINS]]| -> Vec<f64> {
                    rows.iter().zip(&targets).map(|(r, y)| y - predict(base, speed, deviation, sensitivity, shared, per_size, r)).collect()
                };
                let additive = |values: &mut Vec<f64>, key: &dyn Fn(&Row) -> usize, e: &[f64], shrinkage: f64| {
                    let (mut sum, mut count) = (vec![0.0; values.len()], vec![0.0; values.len()]);
                    for (r, e) in rows.iter().zip(e) {
                        sum[key(r)] += e;
                        count[key(r)] += 1.0;
                    }
                    for (k, value) in values.iter_mut().enumerate() {
                        *value = (sum[k] + count[k] * *value) / (count[k] + shrinkage).max(1e-12);
                    }
                };
                let e = residuals(&base, &speed, &deviation, &sensitivity, &shared, &per_size);
                additive(&mut base, &|r| r.0, &e, 0.0);
                let e = residuals(&base, &speed, &deviation, &sensitivity, &shared, &per_size);
                additive(&mut speed, &|r| r.1, &e, 0.0);
                let e = residuals(&base, &speed, &deviation, &sensitivity, &shared, &per_size);
                additive(&mut deviation, &|r| r.2, &e, config.template_size_shrinkage);
                let e = residuals(&base, &speed, &deviation, &sensitivity, &shared, &per_size);
                let (mut num, mut den) = ([0.0; BINS], [0.0; BINS]);
                for (r, e) in rows.iter().zip(&e) {
                    let b = sensitivity[r.0];
                    num[r.3] += b * (e + b * shared[r.3]);
                    den[r.3] += b * b;
                }
                for bin in 0..BINS {
                    if den[bin] > 1e-12 {
                        shared[bin] = num[bin] / den[bin];
                    }
                }
                let e = residuals(&base, &speed, &deviation, &sensitivity, &shared, &per_size);
                let (mut num, mut den) = (vec![[0.0; BINS]; sizes.len()], vec![[0.0; BINS]; sizes.len()]);
                for (r, e) in rows.iter().zip(&e) {
                    let b = sensitivity[r.0];
                    num[r.1][r.3] += b * (e + b * per_size[r.1][r.3]);
                    den[r.1][r.3] += b * b;
                }
                for (z, curve) in per_size.iter_mut().enumerate() {
                    for bin in 0..BINS {
                        curve[bin] = num[z][bin] / (den[z][bin] + config.size_curve_shrinkage).max(1e-12);
                    }
                }
                let e = residuals(&base, &speed, &deviation, &sensitivity, &shared, &per_size);
                let (mut num, mut den) = (vec![0.0; templates.len()], vec![0.0; templates.len()]);
                for (r, e) in rows.iter().zip(&e) {
                    let g = shared[r.3] + per_size[r.1][r.3];
                    num[r.0] += g * (e + sensitivity[r.0] * g);
                    den[r.0] += g * g;
                }
                for (t, b) in sensitivity.iter_mut().enumerate() {
                    *b = ((num[t] + config.sensitivity_shrinkage) / (den[t] + config.sensitivity_shrinkage).max(1e-12)).clamp(0.0, 8.0);
                }
                if let Some(first) = (0..BINS).find(|&bin| bin_seen[bin]) {
                    let shift = shared[first];
                    for value in shared.iter_mut() {
                        *value -= shift;
                    }
                    for (t, b) in base.iter_mut().enumerate() {
                        *b += sensitivity[t] * shift;
                    }
                }
            }
            Raw {
                base: templates.iter().copied().zip(base).collect(),
                sensitivity: templates.iter().copied().zip(sensitivity).collect(),
                template_size: pairs.iter().copied().zip(deviation).collect(),
                size: sizes.iter().copied().zip(speed).collect(),
                shared_raw: shared,
                size_raw: sizes.iter().copied().zip(per_size).collect(),
            }
        }
    }

    proptest! {
        #[test]
        fn predictions_never_fall_as_neighbours_grow(
            points in prop::collection::vec((1u32..5, prop::sample::select(vec![4u32, 16, 32]), 0u32..400, 0.1f64..500.0, any::<bool>()), 1..300),
            template in 1u32..6,
            size in prop::sample::select(vec![2u32, 4, 16, 64]),
        ) {
            let mut p = ConcurrencyAware::new(ConcurrencyConfig::default());
            for &(t, s, n, l, censored) in &points {
                p.observe(&Observation { censored, ..obs(t, s, n, l) });
            }
            p.fit();
            let mut last = Duration::ZERO;
            for n in 0..600 {
                let predicted = p.predict(TemplateId(template), Rpu(size), n);
                prop_assert!(predicted + Duration::from_micros(1) >= last, "n={} {} < {}", n, predicted, last);
                last = predicted;
            }
        }

        #[test]
        fn the_window_stays_bounded(n in 1usize..400) {
            let mut p = ConcurrencyAware::new(ConcurrencyConfig { window: 32, ..ConcurrencyConfig::default() });
            for i in 0..n {
                p.observe(&obs((i % 50) as u32, 16, (i % 7) as u32, 1.0 + i as f64));
            }
            prop_assert!(p.learned.window.len() <= 32);
            prop_assert!(p.fitted.as_ref().is_none_or(|f| f.base.len() <= 32));
        }

        #[test]
        fn fitting_is_deterministic(points in prop::collection::vec((1u32..5, 0u32..100, 0.1f64..100.0), 1..100)) {
            let mut a = ConcurrencyAware::new(ConcurrencyConfig::default());
            let mut b = ConcurrencyAware::new(ConcurrencyConfig::default());
            for &(t, n, l) in &points {
                a.observe(&obs(t, 16, n, l));
                b.observe(&obs(t, 16, n, l));
            }
            a.fit();
            b.fit();
            for n in [0, 3, 50] {
                prop_assert_eq!(a.predict(TemplateId(2), Rpu(16), n), b.predict(TemplateId(2), Rpu(16), n));
            }
        }

        #[test]
        fn a_tabulated_curve_reads_as_the_curve_at_each_count(
            bins in prop::collection::vec((0.0f64..7.0, -1.0f64..4.0, 0.5f64..50.0), 0..19),
        ) {
            let mut bins = bins;
            bins.sort_by(|a, b| a.0.total_cmp(&b.0));
            bins.dedup_by(|a, b| a.0 == b.0);
            let curve = Curve::monotone(bins);
            let xs: Vec<f64> = (0..TABLE).map(|n| (n as f64).ln_1p()).collect();
            let table = curve.tabulate(&xs);
            for (n, value) in table.iter().enumerate() {
                prop_assert_eq!(value.to_bits(), curve.log_slowdown(n as u32).to_bits(), "n={}", n);
            }
        }

        /// Property F.
        #[test]
        fn fitting_over_cells_is_fitting_over_executions(
            points in prop::collection::vec((1u32..6, prop::sample::select(vec![4u32, 16, 64]), 0u32..200, 0.1f64..100.0, prop::bool::weighted(0.2)), 1..300),
            warm in any::<bool>(),
        ) {
            let config = ConcurrencyConfig::default();
            let window: Vec<Windowed> = points.iter().map(|&(t, size, n, l, censored)| Windowed::new(Observation { censored, ..obs(t, size, n, l) })).collect();
            let fit = |window: &[Windowed], previous: Option<&Fitted>| fit_cells(&config, &WindowCells::of(window).fit_input(), previous);
            let previous = warm.then(|| fit(&window[..window.len() / 2 + 1], None));
            let fitted = fit(&window, previous.as_ref());
            let reference = reference::fit(&config, &window, previous.as_ref());
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + a.abs().max(b.abs()));
            for (template, value) in &reference.base {
                prop_assert!(close(fitted.base[template], *value), "base {:?}: {} vs {}", template, fitted.base[template], value);
                prop_assert!(close(fitted.sensitivity[template], reference.sensitivity[template]), "sensitivity {:?}", template);
            }
            for (pair, value) in &reference.template_size {
                prop_assert!(close(fitted.template_size[pair], *value), "deviation {:?}", pair);
            }
            for (size, value) in &reference.size {
                prop_assert!(close(fitted.size[size], *value), "speed {:?}", size);
                for bin in 0..BINS {
                    prop_assert!(close(fitted.size_raw[size][bin], reference.size_raw[size][bin]), "curve {:?} bin {}", size, bin);
                }
            }
            for bin in 0..BINS {
                prop_assert!(close(fitted.shared_raw[bin], reference.shared_raw[bin]), "shared bin {}", bin);
            }
        }

        /// Property G.
        #[test]
        fn cells_kept_incrementally_are_the_windows_cells(
            points in prop::collection::vec((1u32..6, prop::sample::select(vec![4u32, 16, 64]), 0u32..200, 1e-7f64..1e6, prop::bool::weighted(0.2)), 1..400),
            window in 1usize..64,
        ) {
            let mut p = ConcurrencyAware::new(ConcurrencyConfig { window, ..ConcurrencyConfig::default() });
            for &(t, size, n, l, censored) in &points {
                p.observe(&Observation { censored, ..obs(t, size, n, l) });
                let windowed: Vec<Windowed> = p.learned.window.iter().copied().collect();
                prop_assert_eq!(&p.learned.cells, &WindowCells::of(&windowed));
            }
            prop_assert!(p.learned.cells.cells.len() <= window);
        }

        /// Property E.
        #[test]
        fn a_deferred_fit_run_and_installed_at_once_predicts_as_the_inline_fit(
            points in prop::collection::vec((1u32..5, prop::sample::select(vec![4u32, 16, 64]), 0u32..100, 0.1f64..100.0, any::<bool>()), 1..120),
        ) {
            let config = ConcurrencyConfig { refit_every: 16, ..ConcurrencyConfig::default() };
            let mut inline = ConcurrencyAware::new(config.clone());
            let mut deferred = ConcurrencyAware::new(config);
            deferred.defer_fits();
            for &(t, size, n, l, censored) in &points {
                let o = Observation { censored, ..obs(t, size, n, l) };
                inline.observe(&o);
                deferred.observe(&o);
                if let Some(job) = deferred.take_fit_job() {
                    deferred.install_fit(job.run());
                }
                for (t, size, n) in [(1, 16, 0), (2, 4, 3), (3, 64, 50), (9, 32, 7)] {
                    prop_assert_eq!(inline.predict(TemplateId(t), Rpu(size), n), deferred.predict(TemplateId(t), Rpu(size), n));
                }
            }
        }
    }
}
