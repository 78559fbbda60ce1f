//! What the runtime tests share: where the library is, and weights.

use std::path::PathBuf;

use rand::{Rng, SeedableRng, rngs::SmallRng};
use slogate_core::predict::iconq::{CONTEXT_FEATURES, Dense, FEATURE_SCHEMA_VERSION, FEATURES, Hidden, IconqWeights, Lstm, TARGET_FEATURES};

/// ONNX Runtime's library: `ORT_DYLIB_PATH`, else the wheel in the venv
/// `.ci/run` makes.
pub fn library() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ci-venv");
    slogate_onnx::runtime::library_from_env_or_venv(&venv)
        .unwrap_or_else(|| panic!("no ONNX Runtime library: set ORT_DYLIB_PATH, or run .ci/run, which installs the onnxruntime wheel into {}", venv.display()))
}

/// Weights drawn from `seed`, at the scale training leaves them.
pub fn random_weights(hidden: usize, width: usize, neighbours_max: usize, seed: u64) -> IconqWeights {
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-0.4f32..0.4)).collect::<Vec<f32>>();
    let mut lstm = || Lstm { input: FEATURES, hidden, w_ih: draw(4 * hidden * FEATURES), w_hh: draw(4 * hidden * hidden), b_ih: draw(4 * hidden), b_hh: draw(4 * hidden) };
    let (before, after) = (lstm(), lstm());
    let mut draw = |n: usize| (0..n).map(|_| rng.random_range(-0.4f32..0.4)).collect::<Vec<f32>>();
    let head_inputs = 2 * hidden + TARGET_FEATURES + CONTEXT_FEATURES;
    IconqWeights {
        schema_version: FEATURE_SCHEMA_VERSION,
        before,
        after,
        hidden: Hidden { width, w: draw(width * head_inputs), b: draw(width) },
        out: Dense { w: draw(width), b: 0.05 },
        neighbours_max,
    }
}
