//! One HTP context binary from lowered graphs (mllm's QnnAOTEnv and QNNRuntime::retrieveContext).
//!
//! The AOT config's `target_machine`, mapped to an [`HtpTarget`] (unknown chipsets and
//! arch/chipset mismatches are errors of the config parser), gives the driver's [`HtpOptions`]; the graphs are
//! validated; and [`sdk::build_context_binary`] builds them, in the given order (prefill `model.0.s32` then decode
//! `model.0.s1`), into one context, with weight sharing whenever there is more than one graph.
//!
//! Entry points:
//! - [`build_context_binary`]`(graphs, target, out)`: the one applications call. Builds through
//!   Qualcomm's QNN libraries ([`sdk::LibraryPaths::find`]: `QNN_SDK_ROOT`, else the cache
//!   `scripts/fetch-qnn-sdk` fills) and writes the binary to `out` atomically (temporary name,
//!   sync, rename). Without the libraries it checks everything that needs none and then returns
//!   [`SdkError::Load`], whose message says how to get them.
//! - [`write_context_binary`]: the same through any [`QnnApi`] (CI uses `RecordingApi`).
//! - [`build_context`] / [`build_context_with_sdk`]: the binary in memory.

use std::path::{Path, PathBuf};

use mllm_dsl::files::write_atomic;
use thiserror::Error;

use crate::artifacts::ArtifactError;
use crate::graph::QnnGraph;
use crate::sdk::{self, BuildError, HtpOptions, QnnApi, SdkError};
use crate::target::{HtpTarget, TargetError};
use crate::validate::{validate, ValidationError};

/// Why a context binary could not be built.
#[derive(Debug, Error)]
pub enum ContextError {
    #[error("lowered graph `{graph}` is invalid: {source}")]
    Invalid {
        graph: String,
        #[source]
        source: ValidationError,
    },
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error(transparent)]
    Sdk(#[from] SdkError),
    #[error("writing the context binary: {0}")]
    Write(#[from] ArtifactError),
}

/// A context binary written to disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenContext {
    pub path: PathBuf,
    /// Size of the binary in bytes.
    pub bytes: u64,
    /// The graphs it holds, in build order (e.g. `model.0.s32`, `model.0.s1`).
    pub graphs: Vec<String>,
}

/// The HTP options the driver receives with `graphs` on `target` (weight sharing on for more
/// than one graph), after validating every graph.
pub fn context_options(graphs: &[QnnGraph], target: &HtpTarget) -> Result<HtpOptions, ContextError> {
    for g in graphs {
        validate(g).map_err(|source| ContextError::Invalid { graph: g.name.clone(), source })?;
    }
    Ok(target.htp_options(graphs.len() > 1)?)
}

/// Builds `graphs` into one context for `target` through `api` and returns the binary.
pub fn build_context(graphs: &[QnnGraph], target: &HtpTarget, api: &mut dyn QnnApi) -> Result<Vec<u8>, ContextError> {
    let options = context_options(graphs, target)?;
    Ok(sdk::build_context_binary(graphs, &options, api)?)
}

/// Builds `graphs` into one weight-sharing context for `target` with Qualcomm's QNN libraries
/// ([`sdk::LibraryPaths::find`]) and writes the binary to `out` atomically. Without the
/// libraries: every check that needs none, then [`SdkError::Load`], which says how to get
/// them; nothing is written.
pub fn build_context_binary(
    graphs: &[QnnGraph],
    target: &HtpTarget,
    out: &Path,
) -> Result<WrittenContext, ContextError> {
    let binary = build_context_with_sdk(graphs, target)?;
    write_binary(graphs, &binary, out)
}

/// [`build_context_binary`] through `api` (any [`QnnApi`]: the SDK, the recording API in CI).
pub fn write_context_binary(
    graphs: &[QnnGraph],
    target: &HtpTarget,
    api: &mut dyn QnnApi,
    out: &Path,
) -> Result<WrittenContext, ContextError> {
    let binary = build_context(graphs, target, api)?;
    write_binary(graphs, &binary, out)
}

fn write_binary(graphs: &[QnnGraph], binary: &[u8], out: &Path) -> Result<WrittenContext, ContextError> {
    write_atomic(out, |w| w.write_all(binary)).map_err(ArtifactError::from)?;
    Ok(WrittenContext {
        path: out.to_path_buf(),
        bytes: binary.len() as u64,
        graphs: graphs.iter().map(|g| g.name.clone()).collect(),
    })
}

/// [`build_context`] with Qualcomm's QNN libraries ([`sdk::LibraryPaths::find`]); without them
/// an error saying how to get them, after every check that needs none.
pub fn build_context_with_sdk(graphs: &[QnnGraph], target: &HtpTarget) -> Result<Vec<u8>, ContextError> {
    let options = context_options(graphs, target)?;
    Ok(sdk::build_context_binary_with_sdk(graphs, &options)?)
}
