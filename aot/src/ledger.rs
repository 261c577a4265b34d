//! The accuracy ledger: each stage compared with the one before it on the same inputs (logits).
//! `float_vs_reference` (CPU float vs the checkpoint's reference logits), `fakequant_vs_float`
//! (eager fake-quant vs float), `passes_vs_eager` (backend-cpu's IR interpreter on the final IR vs
//! the eager fake-quant model), `qnn_vs_fakequant` (backend-qnn's reference interpreter on the
//! lowered graph vs the CPU fake-quant run of the final IR) and, when Qualcomm's libraries are
//! there, `htp_vs_fakequant` / `htp_vs_interp` (its x86 HTP emulation vs those two; [`crate::htp`]).

use std::path::Path;

use crate::error::{bail, AotError, Context, Result};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::prefill_logits;
use backend_cpu::CpuBackend;
use checkpoint::{SafetensorsCheckpoint, StDtype};
use mllm_dsl::{BackendRef, CausalLm};
use models::hf::HfConfig;

use crate::load::open_model;

/// One row of the accuracy ledger: `test` compared with `reference` on the same inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerEntry {
    /// `float_vs_reference`, `fakequant_vs_float`, `passes_vs_eager` or `qnn_vs_fakequant`.
    pub stage: &'static str,
    /// The graph, for the per-graph stages.
    pub graph: Option<String>,
    /// What was compared on which inputs.
    pub detail: String,
    pub comparison: Comparison,
}

/// A `reference.safetensors` next to a checkpoint: `input_ids` `[1, n]` and the logits `key`.
pub(crate) fn reference_logits(dir: &Path, key: &str) -> Result<Option<(Vec<i64>, Vec<f32>)>> {
    let path = dir.join("reference.safetensors");
    if !path.is_file() {
        return Ok(None);
    }
    let file = SafetensorsCheckpoint::open_file(&path).with_context(|| format!("opening {}", path.display()))?;
    if !file.contains(key) {
        return Ok(None);
    }
    let ids = match file.info("input_ids").with_context(|| format!("{}: tensor `input_ids`", path.display()))?.0 {
        StDtype::I64 => file.read_i64("input_ids")?,
        StDtype::I32 => file.read_i32("input_ids")?.into_iter().map(i64::from).collect(),
        other => bail!("{}: `input_ids` is {other}, expected int64 token ids", path.display()),
    };
    let logits = file.read_f32(key).with_context(|| format!("{}: tensor `{key}`", path.display()))?;
    Ok(Some((ids, logits)))
}

pub(crate) fn compare(reference: &[f32], test: &[f32], vocab: usize) -> Result<Comparison> {
    Comparison::new("logits", reference, test, vocab).map_err(AotError::from)
}

/// `float_vs_reference`: the CPU float model vs the checkpoint's `reference.safetensors` logits.
pub(crate) fn float_vs_reference(dir: &Path, hf: &HfConfig, max_positions: usize) -> Result<Option<LedgerEntry>> {
    let Some((ids, reference)) = reference_logits(dir, "logits")? else { return Ok(None) };
    let backend = CpuBackend::float();
    let (model, _) = open_model(dir, hf, max_positions, &backend)?;
    let logits =
        prefill_logits(model.as_ref(), &backend, None, &ids).context("float prefill of the reference input_ids")?;
    Ok(Some(LedgerEntry {
        stage: "float_vs_reference",
        graph: None,
        detail: format!("CPU float vs reference.safetensors `logits`, prefill of its {} input_ids", ids.len()),
        comparison: compare(&reference, &logits, hf.vocab_size)?,
    }))
}

/// `fakequant_vs_float` for a quantized checkpoint whose `reference.safetensors` carries the float
/// model's logits (`float_logits`, as pymllm's export in the fixtures does).
/// `eager` is the checkpoint's model on its fake-quant `backend`.
pub(crate) fn quantized_vs_reference_float(
    dir: &Path,
    hf: &HfConfig,
    eager: &dyn CausalLm,
    backend: &BackendRef,
) -> Result<Option<LedgerEntry>> {
    let Some((ids, reference)) = reference_logits(dir, "float_logits")? else { return Ok(None) };
    let logits = prefill_logits(eager, backend, None, &ids).context("fake-quant prefill of the reference input_ids")?;
    Ok(Some(LedgerEntry {
        stage: "fakequant_vs_float",
        graph: None,
        detail: format!(
            "eager fake-quant of the checkpoint vs reference.safetensors `float_logits`, prefill of its {} input_ids",
            ids.len()
        ),
        comparison: compare(&reference, &logits, hf.vocab_size)?,
    }))
}
