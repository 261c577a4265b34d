//! Qualcomm's own HTP backend in the main job: the context binary for the device and the ledger
//! rows measured on its x86 emulation ([`QualcommHtp`]).
//!
//! The graphs are lowered again from the final IR for Qualcomm's backend
//! ([`LowerOptions::qualcomm_htp`]): int4 weights in 8-bit containers, since QAIRT 2.51's HTP
//! backend refuses `SFIXED_POINT_4` tensors (error 7004), and the attention mask's select with
//! its operands broadcast explicitly, since the backend computes the implicit broadcast wrongly
//! at chunk sizes such as 8 and 32 ([`backend_qnn::SelectBroadcast`]). mllm's artifacts
//! (`qnn/<graph>.{cpp,bin}`) keep mllm's graph and its low-nibble layout.
//! Two binaries are built from them:
//! - `qnn/context.bin`: every graph in one weight-sharing context, for the device;
//! - `qnn/context.x86.bin`: the same graphs without weight sharing, because the x86 emulation
//!   refuses weight-shared binaries at load ("Shared weights buffer isn't supported on this
//!   platform"). This is the binary the `htp_*` ledger rows execute and `generate --qnn-context`
//!   can run on x86.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::error::{Context, Result};
use backend_qnn::context::{build_context, context_options};
use backend_qnn::interp::TensorValue;
use backend_qnn::sdk::{build_context_binary, run_binary_on_values, LibraryPaths, SdkApi};
use backend_qnn::target::HtpTarget;
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use compiler::passes::QuantParamProvider;
use mllm_dsl::files::write_atomic_bytes;
use mllm_dsl::Program;

/// Whether `qwen3_aot` builds the context binary with Qualcomm's backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContextBinary {
    /// When Qualcomm's libraries are found ([`LibraryPaths::find`]); else one warning says how
    /// to get them and everything else runs.
    #[default]
    Auto,
    /// Always: a run without the libraries fails before any work.
    Required,
    /// Never.
    Off,
}

/// A `--context-binary` value other than auto, on or off.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown context binary setting `{name}`; expected auto, on or off")]
pub struct UnknownContextBinary {
    pub name: String,
}

impl std::str::FromStr for ContextBinary {
    type Err = UnknownContextBinary;
    fn from_str(s: &str) -> Result<Self, UnknownContextBinary> {
        match s {
            "auto" => Ok(ContextBinary::Auto),
            "on" => Ok(ContextBinary::Required),
            "off" => Ok(ContextBinary::Off),
            other => Err(UnknownContextBinary { name: other.to_string() }),
        }
    }
}

/// Qualcomm's HTP backend is a process-wide singleton inside `libQnnHtp.so`: two builds or runs
/// at once in one process make it fail validations spuriously, so they take turns.
static ONE_BACKEND_AT_A_TIME: Mutex<()> = Mutex::new(());

pub(crate) fn exclusive() -> MutexGuard<'static, ()> {
    ONE_BACKEND_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The two binaries built by Qualcomm's backend and what is needed to run the x86 one.
pub struct QualcommHtp {
    paths: LibraryPaths,
    /// The graphs as built (8-bit int4 containers), in chunk order.
    graphs: Vec<QnnGraph>,
    emulation_binary: Vec<u8>,
    /// `qnn/context.bin` and `qnn/context.x86.bin`.
    pub written: [PathBuf; 2],
    /// Wall time of Qualcomm's prepare + finalize + serialize, device binary and x86 binary.
    pub seconds: [f64; 2],
    /// The device binary's graphs and I/O as Qualcomm's `libQnnSystem.so` reads them back.
    pub device_info: backend_qnn::sdk::ffi::BinaryInfo,
}

impl QualcommHtp {
    /// Lowers `programs` (each graph's name and final IR, in order) for Qualcomm's backend with
    /// `params` and builds both binaries for `target` into `qnn_dir`.
    pub(crate) fn build(
        paths: LibraryPaths,
        programs: &[(&str, &Program)],
        params: &dyn QuantParamProvider,
        target: &HtpTarget,
        qnn_dir: &Path,
    ) -> Result<QualcommHtp> {
        let mut lowering = QnnLowering::new(params, LowerOptions::qualcomm_htp());
        let mut graphs = Vec::with_capacity(programs.len());
        for &(name, program) in programs {
            let mut lowered = lowering
                .lower_program(program)
                .with_context(|| format!("lowering graph `{name}` for Qualcomm's backend"))?;
            crate::error::ensure!(
                lowered.len() == 1,
                "graph `{name}` lowered to {} QNN graphs, expected 1",
                lowered.len()
            );
            lowered[0].name = name.to_string();
            graphs.extend(lowered);
        }
        let _turn = exclusive();
        let device_path = qnn_dir.join("context.bin");
        let t = Instant::now();
        let mut api = SdkApi::load(&paths)?;
        let device = build_context(&graphs, target, &mut api)
            .with_context(|| format!("building {} with Qualcomm's HTP backend", device_path.display()))?;
        drop(api);
        let device_seconds = t.elapsed().as_secs_f64();
        write_atomic_bytes(&device_path, &device)?;
        let device_info = backend_qnn::sdk::SystemApi::load(&paths.system)?
            .binary_info(&device)
            .map_err(backend_qnn::QnnModelError::from)
            .with_context(|| format!("reading {} back with {}", device_path.display(), paths.system.display()))?;

        let x86_path = qnn_dir.join("context.x86.bin");
        let t = Instant::now();
        let mut options = context_options(&graphs, target)?;
        options.weight_sharing = false;
        let emulation_binary = build_context_binary(&graphs, &options, &mut SdkApi::load(&paths)?)
            .with_context(|| format!("building {} with Qualcomm's HTP backend", x86_path.display()))?;
        let x86_seconds = t.elapsed().as_secs_f64();
        write_atomic_bytes(&x86_path, &emulation_binary)?;
        Ok(QualcommHtp {
            paths,
            graphs,
            emulation_binary,
            written: [device_path, x86_path],
            seconds: [device_seconds, x86_seconds],
            device_info,
        })
    }

    /// Graph `name` of the x86 binary run once on Qualcomm's HTP emulation with `inputs` (values
    /// of the graph's inputs, as the probe gives them): its first output (the logits) as reals.
    pub fn run_logits(&self, name: &str, inputs: &[TensorValue]) -> Result<Vec<f32>> {
        let graph = self.graphs.iter().find(|g| g.name == name).with_context(|| format!("no graph `{name}`"))?;
        let _turn = exclusive();
        let mut api = SdkApi::load_for_execution(&self.paths)?;
        let mut outputs = run_binary_on_values(&mut api, &self.emulation_binary, &[(graph, inputs)])
            .with_context(|| format!("running graph `{name}` on Qualcomm's x86 HTP emulation"))?;
        let logits = outputs.pop().and_then(|o| o.into_iter().next()).context("the graph has no outputs")?;
        Ok(logits.to_real()?)
    }
}
