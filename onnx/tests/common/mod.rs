//! What the runtime tests share: where the library is.

use std::path::PathBuf;


/// ONNX Runtime's library: `ORT_DYLIB_PATH`, else the wheel in the venv
/// `.ci/run` makes.
pub fn library() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/ci-venv");
    slogate_onnx::runtime::library_from_env_or_venv(&venv)
        .unwrap_or_else(|| panic!("no ONNX Runtime library: set ORT_DYLIB_PATH, or run .ci/run, which installs the onnxruntime wheel into {}", venv.display()))
}
