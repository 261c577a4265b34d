//! The SDK-facing half of the QNN backend: turning graph descriptions into an HTP context
//! binary through Qualcomm's QNN C API.
//!
//! # Layers
//!
//! - [`desc`] and [`config`]: plain descriptors of tensors (dtype, dims, quantization
//!   encodings incl. LPBQ blockwise expansion, static data), op configs, graphs, and the HTP
//!   target (SoC, VTCM, signed PD, precision, O-level, weight sharing).
//! - [`QnnApi`]: the compile-side C API as a trait, one method per C entry point.
//! - [`build_context_binary`]: the call sequence (one weight-sharing context, graphs in order,
//!   tensors on first use, STATIC weights created in each graph (shared by the weight-sharing context), validate before add, finalize,
//!   serialize, free) written once against the trait.
//! - [`graph_descs`]: lowered [`crate::QnnGraph`]s as [`GraphDesc`]s (static buffers shared, not copied).
//! - [`QnnExecApi`]: the run-side API (load a binary, retrieve graphs, execute), which
//!   [`crate::QnnChunkModel`] drives; `SdkApi` implements it through the FFI
//!   (`SdkApi::load_for_execution`; [`open_context_binary_with_sdk`] opens a binary as a chunk
//!   model in one call), and [`EmulatedHtp`] on the CPU with the reference interpreter, as the
//!   SDK-free stand-in for the SDK's HTP emulation.
//! - [`RecordingApi`]: records every call as a readable line and returns fake handles and a
//!   deterministic fake binary, so the exact sequence is testable without the SDK.
//! - `SdkApi` (cargo feature `qnn-sdk`): the real thing. `build.rs` runs bindgen over
//!   `$QNN_SDK_ROOT/include/QNN` (output in `OUT_DIR`, never committed: the headers are under
//!   Qualcomm's EULA), and `libQnnHtp.so` / `libQnnSystem.so` are opened with `libloading`.
//!
//! # Building a context binary with the SDK
//!
//! 1. Install the QAIRT SDK and libclang (Debian: `apt-get install libclang-dev`).
//! 2. Build with the feature and the SDK root (absolute path):
//!    `QNN_SDK_ROOT=/opt/qcom/aistack/qairt/<ver> cargo build -p backend-qnn --features qnn-sdk`.
//! 3. At run time the backend library is found at `$QNN_SDK_ROOT/lib/x86_64-linux-clang/`
//!    (the root seen at build time is the fallback), or pass explicit paths:
//!
//! ```ignore
//! use backend_qnn::sdk::{build_context_binary, HtpOptions, LibraryPaths, SdkApi};
//! let mut api = SdkApi::load(&LibraryPaths::from_env()?)?;
//! let binary = build_context_binary(&[prefill, decode], &HtpOptions::sm8650(), &mut api)?;
//! std::fs::write("qwen3.bin", binary)?;
//! ```
//!
//! [`build_context_binary_with_sdk`] does the same in one call and, in a build without the
//! feature, returns [`SdkError::NotBuilt`] explaining how to enable it.
//!
//! # What CI proves without the SDK
//!
//! - The call sequence: an insta snapshot of the [`RecordingApi`] log for a two-graph toy
//!   (`snapshots/qnn__sdk__call_sequence.snap`), plus assertions on ordering, weight sharing,
//!   graph checks and error propagation (`tests/sdk_driver.rs`; plain `cargo test`, no
//!   libclang needed).
//! - The FFI path (`tests/sdk_ffi.rs`), run as
//!   `QNN_SDK_ROOT=$PWD/backend-qnn/tests/cleanroom cargo test -p backend-qnn --features qnn-sdk`
//!   (CI must first `apt-get install -y libclang-dev` for bindgen, and have a C compiler).
//!   `tests/cleanroom/include/QNN` holds test-only headers written from our own notes, not
//!   Qualcomm's. bindgen runs over them, a mock provider (`tests/cleanroom/mock_provider.c`)
//!   is compiled against the same headers into `lib/x86_64-linux-clang/libQnnHtp.so`, loaded
//!   through `SdkApi`, and must log exactly the calls and arguments, decoded back from the C
//!   structs, that [`RecordingApi`] logs for the same graphs, and serialize the same binary,
//!   which `SystemApi` then reads back. This covers dlopen, provider selection and version
//!   checks, the versioned table, struct filling (encodings, configs, platform info, by-value
//!   op configs), buffer lifetimes, error codes and cleanup order; unit tests compare our
//!   numeric codes and struct sizes with the headers in use.
//! - The execute path through the FFI (same test file): the mock loads the binary it serialized
//!   (`contextCreateFromBinary`), retrieves graphs by name, and in `graphExecute` checks every
//!   tensor against the graph's recorded I/O (ids, names, types, dims, scale/offset, buffer
//!   sizes) and fills the outputs with a fixed function of the input bytes; one prefill and one
//!   decode step of the tiny Qwen3 pair through [`crate::QnnChunkModel`] must deliver exactly
//!   that function's bytes to the runtime (logits dequantized with the encodings `SystemApi`
//!   read from the binary), and the mock's log must show the digests of the bytes written.
//!
//! # Qualcomm's libraries as the judge
//!
//! `scripts/fetch-qnn-sdk` fetches Qualcomm's x86_64 QNN libraries (QAIRT 2.51, from PyPI's
//! onnxruntime-qnn wheel) into the cache; [`ffi::LibraryPaths::real`] finds them (or a QAIRT
//! SDK through `QNN_SDK_ROOT`). `tests/sdk_real.rs` builds with the real `libQnnHtp.so`, reads
//! the binary back with the real `libQnnSystem.so`, and fails (naming the script) when they
//! are absent. The clean-room headers carry the layouts established against those libraries
//! (`ffi` unit test `layouts_match_qualcomms_libraries`).
//!
pub mod api;
pub mod config;
pub mod desc;
pub mod driver;
pub mod emulated;
pub mod exec;
pub mod from_graph;
pub mod phases;
pub mod recording;
pub mod render;

pub use api::{
    ApiError, BackendHandle, BoundParam, BoundParamValue, BoundTensor, ContextHandle, DeviceHandle, GraphHandle,
    LogHandle, MarshalError, MetadataError, OpConfig, QnnApi, TensorId,
};
pub use config::{
    ContextConfig, DeviceConfig, GraphConfig, GraphOptions, HtpArch, HtpDeviceOptions, HtpOptimization, HtpOptions,
    HtpPlatformInfo, LogLevel, OptionsError, Precision,
};
pub use desc::{
    BlockwiseExpansion, DataType, Encoding, GraphDesc, NameError, OpDesc, ParamDesc, ParamValue, Scalar, ScaleOffset,
    StaticData, TensorDesc, TensorError, TensorProblem, TensorType, QTI_AISW,
};
pub use driver::{build_context_binary, check_graphs, BuildError, GraphProblem, NodeProblem};
pub use emulated::EmulatedHtp;
pub use exec::{IoBindingError, QnnExecApi};
pub use from_graph::{graph_descs, ConvertError};
pub use phases::{BuildPhase, PhaseObserver};
pub use recording::{RecordedCall, RecordingApi};

use thiserror::Error;

/// How to get SDK support, for error messages.
pub const ENABLE_SDK_HINT: &str =
    "build with --features qnn-sdk and set QNN_SDK_ROOT=/path/to/qairt/<ver> (libclang is needed for bindgen)";

/// Why [`build_context_binary_with_sdk`] failed.
#[derive(Debug, Error)]
pub enum SdkError {
    /// This build has no QNN SDK support.
    #[error("backend-qnn was built without QNN SDK support: {ENABLE_SDK_HINT}")]
    NotBuilt,
    /// The SDK libraries could not be loaded.
    #[cfg(feature = "qnn-sdk")]
    #[error(transparent)]
    Load(#[from] ffi::LoadError),
    /// A QNN library is not where `QNN_SDK_ROOT` says it is.
    #[cfg(feature = "qnn-sdk")]
    #[error("QNN library {} not found: set QNN_SDK_ROOT to the QAIRT SDK root (the directory holding lib/)", path.display())]
    MissingLibrary { path: std::path::PathBuf },
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The context binary could not be opened as a chunk model.
    #[error(transparent)]
    Model(#[from] crate::QnnModelError),
}

/// Whether this build can talk to a real QNN backend.
pub const fn sdk_available() -> bool {
    cfg!(feature = "qnn-sdk")
}

/// Checks, before any work is done, that [`build_context_binary_with_sdk`] can run: this build has
/// SDK support and both QNN libraries exist where they will be loaded from (`QNN_SDK_ROOT`).
pub fn check_sdk_libraries() -> Result<(), SdkError> {
    #[cfg(feature = "qnn-sdk")]
    {
        let paths = LibraryPaths::from_env()?;
        let missing = [paths.backend, paths.system].into_iter().find(|p| !p.is_file());
        missing.map_or(Ok(()), |path| Err(SdkError::MissingLibrary { path }))
    }
    #[cfg(not(feature = "qnn-sdk"))]
    Err(SdkError::NotBuilt)
}

/// Builds the context binary with the QNN SDK located through `QNN_SDK_ROOT`.
///
/// Without the `qnn-sdk` feature this always returns [`SdkError::NotBuilt`], whose message
/// says how to enable it; the graphs are still checked so callers see description errors.
pub fn build_context_binary_with_sdk(graphs: &[GraphDesc], target: &HtpOptions) -> Result<Vec<u8>, SdkError> {
    build_context_binary_with_sdk_observed(graphs, target, &mut |_| {})
}

/// [`build_context_binary_with_sdk`], calling `on_phase` as the backend enters each
/// [`BuildPhase`] (benches time and measure the phases this way).
pub fn build_context_binary_with_sdk_observed(
    graphs: &[GraphDesc],
    target: &HtpOptions,
    on_phase: &mut dyn FnMut(BuildPhase),
) -> Result<Vec<u8>, SdkError> {
    #[cfg(feature = "qnn-sdk")]
    {
        let mut api = SdkApi::load(&LibraryPaths::from_env()?)?;
        Ok(build_context_binary(graphs, target, &mut PhaseObserver::new(&mut api, on_phase))?)
    }
    #[cfg(not(feature = "qnn-sdk"))]
    {
        let _ = on_phase;
        // Report invalid input as such, so callers fix their graphs before installing an SDK.
        target.check().map_err(BuildError::from)?;
        driver::check_graphs(graphs)?;
        Err(SdkError::NotBuilt)
    }
}

/// The execute API of this build's QNN SDK support: [`SdkApi`] with the `qnn-sdk` feature,
/// an uninhabited type without it (so code naming [`SdkChunkModel`] compiles either way).
#[cfg(feature = "qnn-sdk")]
pub type SdkExecApi = ffi::SdkApi;

/// The execute API of this build's QNN SDK support: none (no value of this type exists).
#[cfg(not(feature = "qnn-sdk"))]
#[derive(Debug)]
pub enum SdkExecApi {}

#[cfg(not(feature = "qnn-sdk"))]
impl QnnExecApi for SdkExecApi {
    fn context_create_from_binary(&mut self, _: &[u8]) -> Result<ContextHandle, ApiError> {
        match *self {}
    }
    fn graph_retrieve(&mut self, _: ContextHandle, _: &str) -> Result<GraphHandle, ApiError> {
        match *self {}
    }
    fn graph_execute(&mut self, _: GraphHandle, _: &[&[u8]], _: &mut [&mut [u8]]) -> Result<(), ApiError> {
        match *self {}
    }
    fn context_free(&mut self, _: ContextHandle) -> Result<(), ApiError> {
        match *self {}
    }
}

/// A context binary run by the QNN SDK's backend library as the runtime's chunk model.
pub type SdkChunkModel = crate::QnnChunkModel<SdkExecApi>;

/// Opens `binary` with the QNN SDK found through `QNN_SDK_ROOT` (`libQnnHtp.so`, on x86 its HTP
/// emulation, and `libQnnSystem.so` for the graph I/O), every graph of the binary bound as
/// [`crate::QnnChunkModel::from_binary`] does; `lowered` (the graphs the binary was built from)
/// supplies I/O encodings a binary's metadata lacks. Without the `qnn-sdk` feature:
/// [`SdkError::NotBuilt`], which says how to enable it.
pub fn open_context_binary_with_sdk(
    binary: &[u8],
    lowered: Option<&[crate::QnnGraph]>,
) -> Result<SdkChunkModel, SdkError> {
    #[cfg(feature = "qnn-sdk")]
    {
        let api = SdkApi::load_for_execution(&LibraryPaths::from_env()?)?;
        Ok(crate::QnnChunkModel::from_binary(api, binary, lowered)?)
    }
    #[cfg(not(feature = "qnn-sdk"))]
    {
        let _ = (binary, lowered);
        Err(SdkError::NotBuilt)
    }
}

#[cfg(feature = "qnn-sdk")]
pub mod ffi;
#[cfg(feature = "qnn-sdk")]
pub use ffi::{LibraryPaths, LoadError, SdkApi, SystemApi};

#[cfg(all(test, not(feature = "qnn-sdk")))]
mod tests {
    use super::*;

    #[test]
    fn without_the_feature_the_error_says_how_to_enable_it() {
        assert!(!sdk_available());
        let err = build_context_binary_with_sdk(&[], &HtpOptions::sm8650()).unwrap_err();
        assert!(matches!(err, SdkError::Build(BuildError::InvalidGraph { .. })), "{err}");
        let graph = GraphDesc { name: "g".into(), tensors: vec![], inputs: vec![], outputs: vec![], nodes: vec![] };
        let err = build_context_binary_with_sdk(&[graph], &HtpOptions::sm8650()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("--features qnn-sdk"), "{msg}");
        assert!(msg.contains("QNN_SDK_ROOT=/path/to/qairt/<ver>"), "{msg}");
    }
}
