//! ONNX Runtime, loaded from a shared library at run time, running
//! Iconq+'s graph ([`crate::graph`]).
//!
//! [`OnnxRuntime::load`] loads the library once per process (ONNX Runtime
//! allows one environment per process) and checks it: the file must exist,
//! export ONNX Runtime's API and be at least the version `ort` was built
//! for. Loading again with the same path is free; with another path it is
//! an error, since the first library stays loaded.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::TensorRef;
use slogate_core::predict::iconq::LstmState;

use crate::Error;
use crate::graph::{Batch, OUTPUTS, Row};

/// The environment variable that names the library when the config
/// doesn't.
pub const DYLIB_ENV: &str = "ORT_DYLIB_PATH";

/// A loaded, checked ONNX Runtime.
#[derive(Clone, Copy, Debug)]
pub struct OnnxRuntime {
    environment: &'static Environment,
}

/// The library this process loaded, and its environment.
static LOADED: OnceLock<(PathBuf, Environment)> = OnceLock::new();
static LOADING: Mutex<()> = Mutex::new(());

impl OnnxRuntime {
    /// ONNX Runtime from `configured`, else from `ORT_DYLIB_PATH`.
    pub fn from_config_or_env(configured: Option<&Path>) -> Result<OnnxRuntime, Error> {
        match configured {
            Some(path) => OnnxRuntime::load(path),
            None => match std::env::var_os(DYLIB_ENV) {
                Some(path) if !path.is_empty() => OnnxRuntime::load(Path::new(&path)),
                _ => Err(Error::NoLibrary),
            },
        }
    }

    /// ONNX Runtime from the library at `path`, checked.
    pub fn load(path: &Path) -> Result<OnnxRuntime, Error> {
        let _one_at_a_time = LOADING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let library_error = |reason: String| Error::Library { path: path.display().to_string(), reason };
        if let Some((loaded, environment)) = LOADED.get() {
            return if loaded == path {
                Ok(OnnxRuntime { environment })
            } else {
                Err(library_error(format!("this process already loaded ONNX Runtime from {}", loaded.display())))
            };
        }
        if !path.is_file() {
            return Err(library_error("no such file".into()));
        }
        let environment = ort::init_from(path)
            .map_err(|e| library_error(e.to_string()))?
            .with_name("slogate")
            .build()
            .map_err(|e| library_error(e.to_string()))?;
        let (_, environment) = LOADED.get_or_init(|| (path.to_path_buf(), environment));
        Ok(OnnxRuntime { environment })
    }

    /// The library's version: its release branch from the build
    /// information, else the version in its file name.
    pub fn version(&self) -> String {
        let from_build = ort::info().split(',').find_map(|part| part.trim().strip_prefix("git-branch=rel-").map(str::to_owned));
        let from_file = || {
            let (path, _) = LOADED.get()?;
            let name = path.file_name()?.to_string_lossy().into_owned();
            name.split_once(".so.").map(|(_, version)| version.to_owned())
        };
        from_build.or_else(from_file).unwrap_or_else(|| "unknown".into())
    }
}

/// What the graph gives for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct RowOutput {
    /// `ln(latency / base)`.
    pub residual: f32,
    /// The "before" LSTM's final state (hidden then cell).
    pub before: LstmState,
    /// The "after" LSTM's final state.
    pub after: LstmState,
}

/// One session over one model: one per worker, since a run takes
/// `&mut self`.
pub struct IconqSession {
    session: Session,
}

impl std::fmt::Debug for IconqSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IconqSession").finish_non_exhaustive()
    }
}

fn runtime_error(e: impl std::fmt::Display) -> Error {
    Error::Runtime(e.to_string())
}

impl IconqSession {
    /// A session over the model's bytes (`model.onnx`), on one thread.
    pub fn new(runtime: OnnxRuntime, model: &[u8]) -> Result<IconqSession, Error> {
        let session = Session::builder(runtime.environment)
            .map_err(runtime_error)?
            .with_optimization_level(GraphOptimizationLevel::Level3)
            .map_err(runtime_error)?
            .with_intra_threads(1)
            .map_err(runtime_error)?
            .commit_from_memory(model)
            .map_err(runtime_error)?;
        let names: Vec<&str> = session.outputs().iter().map(|o| o.name()).collect();
        if names != OUTPUTS {
            return Err(Error::Runtime(format!("the model's outputs are {names:?}, not Iconq+'s {OUTPUTS:?}")));
        }
        Ok(IconqSession { session })
    }

    /// Runs the rows as one batch.
    pub fn run(&mut self, rows: &[Row<'_>]) -> Result<Vec<RowOutput>, Error> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        let batch = Batch::pack(rows);
        let features = slogate_core::predict::iconq::FEATURES;
        let n = batch.rows;
        let inputs = ort::inputs![
            "before" => TensorRef::from_array_view(([batch.before_steps, n, features], batch.before.as_slice())).map_err(runtime_error)?,
            "before_lens" => TensorRef::from_array_view(([n], batch.before_lens.as_slice())).map_err(runtime_error)?,
            "after" => TensorRef::from_array_view(([batch.after_steps, n, features], batch.after.as_slice())).map_err(runtime_error)?,
            "after_lens" => TensorRef::from_array_view(([n], batch.after_lens.as_slice())).map_err(runtime_error)?,
            "target" => TensorRef::from_array_view(([n, batch.target.len() / n], batch.target.as_slice())).map_err(runtime_error)?,
            "context" => TensorRef::from_array_view(([n, batch.context.len() / n], batch.context.as_slice())).map_err(runtime_error)?,
        ];
        let outputs = self.session.run(inputs).map_err(runtime_error)?;
        let mut tensors = Vec::with_capacity(OUTPUTS.len());
        for name in OUTPUTS {
            let (_, values) = outputs[name].try_extract_tensor::<f32>().map_err(runtime_error)?;
            tensors.push(values.to_vec());
        }
        let width = |values: &Vec<f32>| values.len() / n;
        let state = |h: &Vec<f32>, c: &Vec<f32>, row: usize| {
            let (hw, cw) = (width(h), width(c));
            LstmState(h[row * hw..(row + 1) * hw].iter().chain(&c[row * cw..(row + 1) * cw]).copied().collect())
        };
        Ok((0..n)
            .map(|row| RowOutput { residual: tensors[0][row], before: state(&tensors[1], &tensors[2], row), after: state(&tensors[3], &tensors[4], row) })
            .collect())
    }
}

/// ONNX Runtime's library as `ORT_DYLIB_PATH` names it, else in `venv`
/// ([`library_in_venv`]).
pub fn library_from_env_or_venv(venv: &Path) -> Option<PathBuf> {
    std::env::var_os(DYLIB_ENV).filter(|p| !p.is_empty()).map(PathBuf::from).or_else(|| library_in_venv(venv))
}

/// ONNX Runtime's library inside a Python environment's `onnxruntime`
/// wheel (`lib/python3.*/site-packages/onnxruntime/capi/`), if there.
pub fn library_in_venv(venv: &Path) -> Option<PathBuf> {
    let lib = std::fs::read_dir(venv.join("lib")).ok()?;
    let mut found: Vec<PathBuf> = lib
        .flatten()
        .filter(|python| python.file_name().to_string_lossy().starts_with("python3"))
        .filter_map(|python| std::fs::read_dir(python.path().join("site-packages/onnxruntime/capi")).ok())
        .flat_map(|capi| capi.flatten().map(|entry| entry.path()))
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("libonnxruntime.so.")))
        .collect();
    found.sort();
    found.pop()
}
