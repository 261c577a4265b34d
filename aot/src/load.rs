//! A checkpoint directory as a model on the CPU: the model file its `model_type` names, built and
//! bound to the checkpoint's tensors on a backend (float, fake-quant, or calibration observers).

use std::path::Path;
use std::sync::Arc;

use crate::error::{bail, ensure, Context, Result};
use backend_cpu::kernels::Grid;
use backend_cpu::quant::{is_quantized_checkpoint, FakeQuantHook, QdqParams};
use backend_cpu::{Bf16Products, CheckpointStore, CpuBackend, CpuChunkModel, GridProducts, QuantizedWeights};
use checkpoint::SafetensorsCheckpoint;
use compiler::quant::points::qdq_points;
use mllm_dsl::module::ParamSource;
use mllm_dsl::{BackendRef, CausalLm, ParamFormat, Program};
use models::hf::HfConfig;

use crate::trace::trace_model;
use models::io::{kv_qdq, KvCache};
use models::keys::ROPE_SIN_TABLE;

/// A checkpoint loaded for eager CPU execution.
pub struct CpuModel {
    pub config: HfConfig,
    pub model: CpuChunkModel,
    /// Checkpoint tensors nothing asked for.
    pub unused: Vec<String>,
    /// QDQ points quantize (a quantized checkpoint run in fake-quant mode).
    pub fake_quant: bool,
    /// Bytes of the linear weight matrices a decode step reads ([`CheckpointStore::matrix_bytes`]).
    pub matrix_bytes: usize,
    /// In fake-quant mode, per layer the 8-bit grids of the K and V QDQ points every cached K and
    /// V lies on: the model can keep its KV cache as those codes ([`CpuChunkModel::into_kv8`]).
    pub kv8_grids: Option<Vec<[Grid; 2]>>,
}

/// How to run a checkpoint directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// Fake-quant when the checkpoint is quantized (pymllm's export or this project's), else float.
    Auto,
    /// Float, even for a quantized checkpoint: its weights are decoded and QDQ points do nothing.
    Float,
}

/// The model file of `hf` for `max_positions` RoPE rows, its parameters bound from `params`
/// (the checkpoint of `dir`, named in errors).
pub fn build_model(hf: &HfConfig, max_positions: usize, params: &ParamSource, dir: &Path) -> Result<Box<dyn CausalLm>> {
    let mut model = models::build(hf, max_positions)?;
    model.bind_params(params).with_context(|| format!("loading {}", dir.display()))?;
    Ok(model)
}

/// The checkpoint of `dir` opened on `backend` and the model file of `hf` bound to it; the store
/// tells afterwards which tensors nothing asked for.
pub fn open_model(
    dir: &Path,
    hf: &HfConfig,
    max_positions: usize,
    backend: &BackendRef,
) -> Result<(Box<dyn CausalLm>, CheckpointStore)> {
    let store = CheckpointStore::for_config(dir, backend.clone(), hf)?;
    let model = build_model(hf, max_positions, &ParamSource::Store(&store), dir)?;
    Ok((model, store))
}

/// The fake-quant backend of a quantized checkpoint: every QDQ point of the model file (`traced`,
/// [`trace_model`]) with its stored parameters; grid rows times int4 weights multiplied as
/// `products` says.
pub fn fake_quant_backend(
    ckpt: &SafetensorsCheckpoint,
    traced: &Program,
    products: GridProducts,
) -> Result<BackendRef> {
    Ok(CpuBackend::configured(Some(fake_quant_hook(ckpt, traced)?.0), products))
}

/// The fake-quant hook of a quantized checkpoint and the checkpoint keys its parameters came from.
fn fake_quant_hook(ckpt: &SafetensorsCheckpoint, traced: &Program) -> Result<(Arc<FakeQuantHook>, Vec<String>)> {
    let points = qdq_points(traced)?;
    let params = QdqParams::from_checkpoint(ckpt, &points)
        .with_context(|| format!("reading the QDQ parameters of {}", ckpt.root().display()))?;
    Ok((Arc::new(FakeQuantHook::new(&params)), params.source_keys().to_vec()))
}

/// Per layer, the grids of the K and V cache QDQ points (`models::io::kv_qdq`) when every one of
/// them is 8-bit (codes `0..=255`), else `None`.
fn kv8_grids(hook: &FakeQuantHook, layers: usize) -> Option<Vec<[Grid; 2]>> {
    let grid = |l, which| {
        let p = hook.params(&kv_qdq(l, which).key)?;
        (p.qmin == 0 && p.qmax == 255).then_some(Grid { scale: p.scale, zero_point: p.zero_point })
    };
    (0..layers).map(|l| Some([grid(l, KvCache::Key)?, grid(l, KvCache::Value)?])).collect()
}

/// How many positions a quantized checkpoint's RoPE tables cover (`[1, L, head_dim]` rows);
/// `None` when it has no tables.
pub fn rope_positions(ckpt: &SafetensorsCheckpoint) -> Result<Option<usize>> {
    match ckpt.info(ROPE_SIN_TABLE) {
        Ok((_, &[1, rows, _])) => Ok(Some(rows)),
        Ok((_, shape)) => {
            bail!("{}: `{ROPE_SIN_TABLE}` has shape {shape:?}, expected [1, L, head_dim]", ckpt.root().display())
        }
        Err(_) => Ok(None),
    }
}

/// Float CPU execution of `dir` (config.json + safetensors).
pub fn load_float(dir: &Path, context_len: usize) -> Result<CpuModel> {
    load_float_with(dir, context_len, Bf16Products::F32)
}

/// [`load_float`] with bf16 weights multiplied as `bf16` says ([`Bf16Products::Bf16`]: inputs
/// rounded to bf16, about twice the prefill speed on CPUs with AMX or on AMD's with AVX-512 BF16).
pub fn load_float_with(dir: &Path, context_len: usize, bf16: Bf16Products) -> Result<CpuModel> {
    let config = HfConfig::from_dir(dir)?;
    let backend = CpuBackend::float_with(bf16);
    let (model, store) = open_model(dir, &config, context_len, &backend)?;
    let unused = store.unused_keys();
    let matrix_bytes = store.matrix_bytes();
    Ok(CpuModel {
        config,
        model: CpuChunkModel::new(model, backend, context_len),
        unused,
        fake_quant: false,
        matrix_bytes,
        kv8_grids: None,
    })
}

/// Loads `dir` for eager CPU execution, in fake-quant mode when it holds a quantized checkpoint
/// (unless `mode` is [`RunMode::Float`]). A quantized checkpoint's RoPE tables fix how many
/// positions the model covers; `context_len` must not exceed them.
pub fn load_model(dir: &Path, context_len: usize, mode: RunMode) -> Result<CpuModel> {
    load_model_with(dir, context_len, mode, QuantizedWeights::Packed)
}

/// [`load_model`] holding a quantized checkpoint's weights as `weights` says (LPBQ int4 and uint16
/// embeddings as stored, the default, or decoded to f32: the same values either way).
pub fn load_model_with(dir: &Path, context_len: usize, mode: RunMode, weights: QuantizedWeights) -> Result<CpuModel> {
    let ckpt = SafetensorsCheckpoint::open(dir)?;
    if !is_quantized_checkpoint(&ckpt) {
        return load_float(dir, context_len);
    }
    let config = HfConfig::from_dir(dir)?;
    let max_positions = rope_positions(&ckpt)?.unwrap_or(context_len);
    ensure!(
        context_len <= max_positions,
        "{}: the checkpoint's RoPE tables cover {max_positions} positions; a context of {context_len} needs more",
        dir.display()
    );
    let traced = trace_model(&config, max_positions, ParamFormat::Float)?;
    let (backend, used, kv8_grids): (BackendRef, Vec<String>, _) = match mode {
        RunMode::Auto => {
            let (hook, used) = fake_quant_hook(&ckpt, &traced)?;
            let grids = kv8_grids(&hook, config.num_hidden_layers);
            (CpuBackend::with_qdq(hook), used, grids)
        }
        // Deliberately ignored, so not worth an "unused" warning.
        RunMode::Float => {
            let points = qdq_points(&traced)?;
            (CpuBackend::float(), points.iter().flat_map(|p| [p.scale_key(), p.zero_point_key()]).collect(), None)
        }
    };
    let store = CheckpointStore::for_config(dir, backend.clone(), &config)?.with_quantized(weights);
    let model = build_model(&config, max_positions, &ParamSource::Store(&store), dir)?;
    for key in used.iter().filter(|k| store.checkpoint().contains(k)) {
        store.checkpoint().mark_used(key)?;
    }
    let unused = store.unused_keys();
    Ok(CpuModel {
        config,
        model: CpuChunkModel::new(model, backend, context_len),
        unused,
        fake_quant: mode == RunMode::Auto,
        matrix_bytes: store.matrix_bytes(),
        kv8_grids,
    })
}
