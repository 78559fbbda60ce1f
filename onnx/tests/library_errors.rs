//! A missing or wrong ONNX Runtime library is a clear error when loaded,
//! not a panic on the first query. (A process of its own: the real
//! library, once loaded, stays loaded.)
#![cfg(feature = "runtime")]

use std::path::Path;

use slogate_onnx::Error;
use slogate_onnx::runtime::OnnxRuntime;

#[test]
fn a_missing_library_file_is_named_in_the_error() {
    let error = OnnxRuntime::load(Path::new("/nonexistent/libonnxruntime.so.1.32.0")).unwrap_err();
    assert!(matches!(&error, Error::Library { path, reason } if path.contains("/nonexistent/") && reason == "no such file"), "{error}");
}

#[test]
fn a_library_that_is_not_onnx_runtime_is_refused() {
    let libm = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"].into_iter().find(|p| Path::new(p).exists()).expect("libm is on the machine");
    let error = OnnxRuntime::load(Path::new(libm)).unwrap_err();
    assert!(matches!(&error, Error::Library { reason, .. } if reason.contains("OrtGetApiBase")), "{error}");
}

#[test]
fn a_file_that_is_no_library_is_refused() {
    let error = OnnxRuntime::load(Path::new(env!("CARGO_MANIFEST_PATH"))).unwrap_err();
    assert!(matches!(&error, Error::Library { reason, .. } if reason.contains("failed to load")), "{error}");
}
