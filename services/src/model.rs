//! A trained Iconq+ model as the node and `eval` read it: the directory
//! `slogate train-predictor` writes (`model.json`, `model.onnx`,
//! `metadata.json`).
//!
//! [`load`] reads and checks the weights (`model.json`: the shapes and the
//! feature schema). With the `onnx` feature, `check_onnx` also runs
//! `model.onnx` in ONNX Runtime and holds it to the native model on probe
//! rows, so that a model whose two forms disagree, or a missing or wrong
//! ONNX Runtime library, stops the node at start rather than at a query.

use std::path::Path;
use std::sync::Arc;

use slogate_core::predict::iconq::IconqWeights;

use crate::{Error, Result};

/// The weights in `dir/model.json`, checked.
pub fn load(dir: &Path) -> Result<Arc<IconqWeights>> {
    let path = dir.join("model.json");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::Config(format!("cannot read the Iconq+ model {}: {e} (write one with `slogate train-predictor --out DIR`)", path.display())))?;
    let weights: IconqWeights = serde_json::from_str(&text)
        .map_err(|e| Error::Config(format!("{} is not an Iconq+ model: {e}", path.display())))?;
    weights
        .check()
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    Ok(Arc::new(weights))
}

/// Runs `dir/model.onnx` in ONNX Runtime (the library at `library`, else
/// `ORT_DYLIB_PATH`) and checks that it gives what `weights` give
/// natively on probe rows of every length up to the model's limit, to
/// 1e-5. Returns ONNX Runtime's version.
#[cfg(feature = "onnx")]
pub fn check_onnx(dir: &Path, weights: &IconqWeights, library: Option<&Path>) -> Result<String> {
    use slogate_core::model::Rpu;
    use slogate_core::predict::iconq::{
        FEATURES, Member, context_features, interaction, target_features,
    };
    use slogate_onnx::graph::Row;
    use slogate_onnx::runtime::{IconqSession, OnnxRuntime};
    let path = dir.join("model.onnx");
    let bytes = std::fs::read(&path)
        .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
    let runtime =
        OnnxRuntime::from_config_or_env(library).map_err(|e| Error::Config(e.to_string()))?;
    let mut session = IconqSession::new(runtime, &bytes)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    let member = |i: usize| Member {
        isolated_s: 0.1 * 1.7f64.powi((i % 12) as i32),
        arrival_s: (i * 7 % 60) as f64,
    };
    let size = Rpu(8);
    let vectors: Vec<[f32; FEATURES]> = (0..weights.neighbours_max)
        .map(|i| interaction(member(1000), member(i), size))
        .collect();
    let target = target_features(3.0, size);
    let lengths: Vec<(usize, usize)> = (0..=weights.neighbours_max)
        .step_by(4.max(weights.neighbours_max / 8))
        .map(|n| (n, weights.neighbours_max - n))
        .collect();
    let rows: Vec<Row<'_>> = lengths
        .iter()
        .map(|&(b, a)| Row {
            target,
            context: context_features(b, a, false),
            before: &vectors[..b],
            after: &vectors[..a],
        })
        .collect();
    let outputs = session
        .run(&rows)
        .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
    for (&(b, a), onnx) in lengths.iter().zip(&outputs) {
        let native = weights.head(
            &weights.memory(&vectors[..b], &vectors[..a]),
            &target,
            false,
        );
        if (native - onnx.residual).abs() > 1e-5 {
            return Err(Error::Config(format!(
                "{} disagrees with model.json ({b} neighbours before, {a} after: ONNX Runtime {}, native {native}); retrain or re-export the model",
                path.display(),
                onnx.residual
            )));
        }
    }
    Ok(runtime.version())
}
