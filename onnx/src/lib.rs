//! Iconq+ as an ONNX model, and (feature `runtime`) run by ONNX Runtime.
//!
//! Layout:
//! - [`proto`]: the ONNX protobuf messages the graph needs, as prost
//!   structs (no protoc, no onnx.proto at build time);
//! - [`graph`]: Iconq+'s weights
//!   ([`IconqWeights`](slogate_core::predict::iconq::IconqWeights)) as `model.onnx` (`slogate train-predictor` writes it beside
//!   `model.json`), and [`graph::Batch`], rows packed as the graph's
//!   inputs;
//! - `runtime` (feature `runtime`): ONNX Runtime through `ort`, the
//!   shared library loaded at run time from a path given in config or in
//!   `ORT_DYLIB_PATH` (the PyPI `onnxruntime` wheel ships it) and checked
//!   when loaded, so that a missing or wrong library is an error at start,
//!   never a panic on the first query. One `runtime::IconqSession` per
//!   worker (`Session::run` takes `&mut self`).
//!
//! Core's native LSTM step stays the incremental hot path: ONNX Runtime
//! runs full passes (a batch of rows at once), and the tests hold the two
//! to 1e-5 on every output.

pub mod graph;
pub mod proto;
#[cfg(feature = "runtime")]
pub mod runtime;

/// What can go wrong writing or running the model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The weights are not a model this build can write.
    #[error("the model's weights are unusable: {0}")]
    Weights(String),
    /// No ONNX Runtime library was named.
    #[error("no ONNX Runtime library: set `onnxruntime_path` in the config or ORT_DYLIB_PATH to libonnxruntime.so (the PyPI `onnxruntime` wheel has it under onnxruntime/capi/)")]
    NoLibrary,
    /// The library could not be loaded, or is not ONNX Runtime, or is too old.
    #[error("cannot use ONNX Runtime from {path}: {reason}")]
    Library {
        /// The path tried.
        path: String,
        /// Why.
        reason: String,
    },
    /// ONNX Runtime refused the model or a run.
    #[error("ONNX Runtime: {0}")]
    Runtime(String),
}
