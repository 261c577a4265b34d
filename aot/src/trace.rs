//! The model file of a config traced into a program: once per graph (chunk size and context),
//! with symbolic parameters, so no weights are touched.

use crate::error::{Context, Result};
use mllm_dsl::module::ParamSource;
use mllm_dsl::{trace, ParamFormat, Program};
use models::hf::HfConfig;
use models::TransformerConfig;

/// Traces the model file of `hf` once (decode shape: one token, one past position) with symbolic
/// parameters typed as `format`: enough to learn its QDQ points and parameters.
pub fn trace_model(hf: &HfConfig, max_positions: usize, format: ParamFormat) -> Result<Program> {
    trace_graph(hf, max_positions, 1, 2, format)
}

/// Traces the model file of `hf` for one graph: `chunk` new tokens, a mask `context` wide (the
/// past K/V cache holds `context - chunk` positions), parameters typed as `format`.
pub fn trace_graph(
    hf: &HfConfig,
    max_positions: usize,
    chunk: usize,
    context: usize,
    format: ParamFormat,
) -> Result<Program> {
    let cfg = TransformerConfig::from_hf(hf, max_positions);
    let mut model = models::build(hf, max_positions)?;
    model.bind_params(&ParamSource::Symbolic(format))?;
    let inputs = models::io::trace_inputs(&cfg, chunk, context, format);
    let program = trace(&inputs, |t| model.forward_graph(t)).with_context(|| {
        format!("tracing the model file of {} (chunk {chunk}, context {context})", hf.source.display())
    })?;
    Ok(program)
}
