//! ONNX Runtime runs the written graph and agrees with core's native
//! LSTM and head to 1e-5 on every output.
#![cfg(feature = "runtime")]

mod common;

use rand::{Rng, SeedableRng, rngs::SmallRng};
use slogate_core::predict::iconq::{FEATURES, TARGET_FEATURES, context_features};
use slogate_onnx::graph::{Row, iconq_model_bytes};
use slogate_onnx::runtime::{IconqSession, OnnxRuntime};

/// A row's neighbours before and after the target, its features, and
/// whether the later neighbours are complete.
type Sequences = (Vec<[f32; FEATURES]>, Vec<[f32; FEATURES]>, [f32; TARGET_FEATURES], bool);

fn vectors(rng: &mut SmallRng, n: usize) -> Vec<[f32; FEATURES]> {
    (0..n).map(|_| std::array::from_fn(|_| rng.random_range(-3.0f32..3.0))).collect()
}

#[test]
fn onnx_runtime_matches_the_native_pass_on_every_output_to_1e5() {
    let runtime = OnnxRuntime::load(&common::library()).expect("ONNX Runtime loads");
    assert!(runtime.version().starts_with("1."), "ONNX Runtime's version: {}", runtime.version());
    for (seed, hidden, width) in [(1, 32, 32), (2, 16, 8), (3, 8, 4)] {
        let weights = slogate_core::predict::iconq::IconqWeights::random(hidden, width, 64, seed);
        let mut session = IconqSession::new(runtime, &iconq_model_bytes(&weights).unwrap()).unwrap();
        let mut rng = SmallRng::seed_from_u64(seed);
        // Rows of every shape: empty sides, one step, long ones, complete or not.
        let sequences: Vec<Sequences> = (0..40)
            .map(|i| {
                let (b, a) = match i % 4 {
                    0 => (0, 0),
                    1 => (rng.random_range(1..5), 0),
                    2 => (0, rng.random_range(1..40)),
                    _ => (rng.random_range(1..64), rng.random_range(1..64)),
                };
                (vectors(&mut rng, b), vectors(&mut rng, a), std::array::from_fn(|_| rng.random_range(-2.0f32..2.0)), rng.random_bool(0.5))
            })
            .collect();
        let rows: Vec<Row<'_>> = sequences
            .iter()
            .map(|(before, after, target, complete)| Row { target: *target, context: context_features(before.len(), after.len(), *complete), before, after })
            .collect();
        let outputs = session.run(&rows).expect("a batch runs");
        assert_eq!(outputs.len(), rows.len());
        for (row, ((before, after, target, complete), onnx)) in sequences.iter().zip(&outputs).enumerate() {
            let memory = weights.memory(before, after);
            let native = weights.head(&memory, target, *complete);
            let close = |a: &[f32], b: &[f32]| a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-5);
            assert!((native - onnx.residual).abs() <= 1e-5, "seed {seed} row {row}: residual native {native} onnx {}", onnx.residual);
            assert!(close(&memory.before.0, &onnx.before.0), "seed {seed} row {row}: the before state differs");
            assert!(close(&memory.after.0, &onnx.after.0), "seed {seed} row {row}: the after state differs");
        }
        // One row at a time gives what the batch gave.
        let alone = session.run(&rows[3..4]).unwrap();
        assert!((alone[0].residual - outputs[3].residual).abs() <= 1e-6);
    }
}

#[test]
fn the_native_step_continues_where_onnx_runtime_s_pass_ended() {
    let runtime = OnnxRuntime::load(&common::library()).unwrap();
    let weights = slogate_core::predict::iconq::IconqWeights::random(32, 32, 64, 7);
    let mut session = IconqSession::new(runtime, &iconq_model_bytes(&weights).unwrap()).unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let (before, after) = (vectors(&mut rng, 20), vectors(&mut rng, 12));
    let target = [0.5, 0.25, 0.2, 4.0, 1.0];
    let first = session.run(&[Row { target, context: context_features(20, 11, false), before: &before, after: &after[..11] }]).unwrap();
    let continued = weights.after.step(&first[0].after, &after[11]);
    let full = session.run(&[Row { target, context: context_features(20, 12, false), before: &before, after: &after }]).unwrap();
    assert!(continued.0.iter().zip(&full[0].after.0).all(|(x, y)| (x - y).abs() <= 1e-5));
}

#[test]
fn the_same_weights_write_the_same_model_bytes() {
    let weights = slogate_core::predict::iconq::IconqWeights::random(16, 8, 32, 3);
    assert_eq!(iconq_model_bytes(&weights).unwrap(), iconq_model_bytes(&weights).unwrap());
    let mut broken = weights.clone();
    broken.before.w_hh.pop();
    assert!(iconq_model_bytes(&broken).unwrap_err().to_string().contains("before LSTM"));
}
