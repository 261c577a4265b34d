//! Writing a quantized checkpoint in pymllm's key scheme and dtypes, so it loads unchanged in this
//! project ([`CheckpointStore`](crate::CheckpointStore) + [`FakeQuantHook`](super::FakeQuantHook))
//! and in mllm (`mllm-convertor` → `compile`).
//!
//! What is written comes from the model file's parameters, as a trace with
//! [`ParamFormat::QnnW4A16`](mllm_dsl::ParamFormat) types them ([`plan_export`]):
//!
//! | parameter | tensors | how |
//! |---|---|---|
//! | LPBQ linear (`I4Lpbq`) | `<op>.weight` i8 `[1,1,In,Out]` nibbles, `<op>.scale1` u8 `[Out*In/bs]`, `<op>.scale2` f32 `[Out]` | [`quantize_lpbq`] |
//! | a linear raised to 8 bits ([`LinearQuantizer::set_eight_bit`]) | `<op>.weight` i8 `[1,1,In,Out]` codes -127..=127, `<op>.scale` f32 `[Out]` | [`Int8Channel`](compiler::quant::int8_channel::Int8Channel) |
//! | norm / embedding (`U16Asym`) | `<op>.weight` u16, `<op>.scale` f32 `[1]`, `<op>.zero_point` i32 `[1]` | [`quantize_u16_weight`] |
//! | RoPE table (`U16Asym` with a RoPE QDQ) | `model.mllm_max_{sin,cos}_embedding` u16 `[1,L,D]` | [`export_u16`] with the table's QDQ parameters |
//! | anything else (biases) | f32 as stored | copied |
//! | every QDQ point but globals | `<key>.fake_quant.scale` f32 `[1]`, `.zero_point` i32 `[1]` | calibration |
//!
//! A tied `lm_head.weight` is quantized from `model.embed_tokens.weight`, as pymllm copies it.
//! pymllm's observer bookkeeping (`activation_post_process.*`, `*_enabled`) is not written:
//! nothing reads it. `config.json` is the source's with `linear_block_size` set.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use compiler::aot_config::AotConfig;
use compiler::quant::lpbq::LpbqShape;
use mllm_dsl::files::write_json_atomic;
use mllm_dsl::ir::{Node, Program, SpecParams};

use super::linear::{LinearExport, LinearQuantizer};
use compiler::quant::uint16::export_u16;
use compiler::quant::{quantize_u16_weight, QuantParams};
use mllm_dsl::{DType, QdqKind};
use rayon::prelude::*;

use super::error::QuantizationError;
use super::params::QdqParams;
use checkpoint::{write_safetensors_atomic, CheckpointError, SafetensorsCheckpoint, StDtype, TensorBytes};

/// One model parameter and how it is exported.
#[derive(Clone, Debug, PartialEq)]
pub enum ParamPlan {
    /// A linear weight; `hwio` when the model file takes it as a 1x1 conv's `[1, 1, In, Out]`.
    Lpbq {
        key: String,
        op: String,
        out_features: usize,
        in_features: usize,
        block_size: usize,
        hwio: bool,
    },
    /// A norm or embedding weight of this shape.
    Uint16 {
        key: String,
        op: String,
        shape: Vec<usize>,
    },
    /// A RoPE table, quantized with the parameters of QDQ point `point`.
    Rope {
        key: String,
        point: String,
        shape: Vec<usize>,
    },
    Float {
        key: String,
        shape: Vec<usize>,
    },
}

impl ParamPlan {
    pub fn key(&self) -> &str {
        match self {
            ParamPlan::Lpbq { key, .. }
            | ParamPlan::Uint16 { key, .. }
            | ParamPlan::Rope { key, .. }
            | ParamPlan::Float { key, .. } => key,
        }
    }
}

/// Every parameter of a model file with its export, plus the one LPBQ block size pymllm's
/// `config.json` records.
#[derive(Clone, Debug, PartialEq)]
pub struct ExportPlan {
    pub params: Vec<ParamPlan>,
    pub block_size: usize,
}

/// Reads the parameters off a trace made with `ParamFormat::QnnW4A16`, and checks the LPBQ block
/// sizes: the AOT config's block size of each linear must agree with the HF config's
/// `linear_block_size` (when it has one) and divide the linear's input width, and all linears
/// must share one block size (pymllm's `config.json` holds a single `linear_block_size`).
pub fn plan_export(
    program: &Program,
    aot: &AotConfig,
    hf_linear_block_size: Option<usize>,
) -> Result<ExportPlan, QuantizationError> {
    let init = program
        .subgraph("init")
        .ok_or_else(|| QuantizationError::Report("the traced program has no @init subgraph".into()))?;
    let mut params = Vec::new();
    let mut widths = Vec::new();
    for node in &init.region.body {
        let Node::Register { value, .. } = node else { continue };
        let def = program.value(*value);
        let Some(key) = def.symbol.clone() else { continue };
        let shape = def.ty.shape.clone();
        let op = key.strip_suffix(".weight").unwrap_or(&key).to_string();
        let plan = match def.ty.dtype {
            DType::I4Lpbq => {
                let (out_features, in_features, hwio) = match shape.as_slice() {
                    [1, 1, i, o] => (*o, *i, true),
                    [o, i] => (*o, *i, false),
                    _ => {
                        return Err(QuantizationError::Param {
                            key,
                            problem: format!("an LPBQ weight must be [1, 1, In, Out] or [Out, In], found {shape:?}"),
                        })
                    }
                };
                widths.push((op.clone(), in_features));
                let (block_size, _) = aot.linear_block_size(&op)?;
                ParamPlan::Lpbq { key, op, out_features, in_features, block_size, hwio }
            }
            DType::U16Asym => match def.qdq.as_ref() {
                Some(q) if q.kind == QdqKind::Rope => ParamPlan::Rope { key, point: q.key.clone(), shape },
                _ => ParamPlan::Uint16 { key, op, shape },
            },
            _ => ParamPlan::Float { key, shape },
        };
        params.push(plan);
    }
    aot.check_block_size(hf_linear_block_size, &widths)?;
    let mut sizes: BTreeMap<usize, String> = BTreeMap::new();
    for p in &params {
        if let ParamPlan::Lpbq { op, block_size, .. } = p {
            sizes.entry(*block_size).or_insert_with(|| op.clone());
        }
    }
    let block_size = match sizes.len() {
        0 => hf_linear_block_size.unwrap_or(aot.linear_block_size("lm_head")?.0),
        1 => *sizes.keys().next().expect("one entry"),
        _ => {
            let list: Vec<String> = sizes.iter().map(|(bs, op)| format!("{bs} (e.g. `{op}`)")).collect();
            return Err(QuantizationError::BlockSize(format!(
                "the AOT config gives the linears different block sizes ({}), but pymllm's config.json holds a \
                 single `linear_block_size`",
                list.join(", ")
            )));
        }
    };
    Ok(ExportPlan { params, block_size })
}

/// Owned data of one output tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    I8(Vec<i8>),
    U8(Vec<u8>),
    U16(Vec<u16>),
    I32(Vec<i32>),
    F32(Vec<f32>),
}

impl TensorData {
    pub fn dtype(&self) -> StDtype {
        match self {
            TensorData::I8(_) => StDtype::I8,
            TensorData::U8(_) => StDtype::U8,
            TensorData::U16(_) => StDtype::U16,
            TensorData::I32(_) => StDtype::I32,
            TensorData::F32(_) => StDtype::F32,
        }
    }

    /// Little-endian bytes (every supported host is little-endian; see the compile check below).
    pub fn bytes(&self) -> &[u8] {
        match self {
            TensorData::I8(v) => bytemuck::cast_slice(v),
            TensorData::U8(v) => v,
            TensorData::U16(v) => bytemuck::cast_slice(v),
            TensorData::I32(v) => bytemuck::cast_slice(v),
            TensorData::F32(v) => bytemuck::cast_slice(v),
        }
    }
}

#[cfg(target_endian = "big")]
compile_error!("the checkpoint writer reinterprets host memory as little-endian safetensors data");

/// One output tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct OutTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: TensorData,
}

impl OutTensor {
    fn new(name: impl Into<String>, shape: Vec<usize>, data: TensorData) -> Self {
        OutTensor { name: name.into(), shape, data }
    }
}

/// The quantized weights of a model, ready to be written.
#[derive(Clone, Debug, Default)]
pub struct QuantizedWeights {
    pub tensors: Vec<OutTensor>,
    /// Bytes of the source tensors read (each once).
    pub input_bytes: u64,
    /// Time spent reading (and converting to f32) the source tensors, summed over threads.
    pub read_seconds: f64,
    /// Time spent quantizing, summed over threads.
    pub quantize_seconds: f64,
}

/// Where a parameter's float data comes from: itself, or the embedding for a tied lm_head.
fn source_key<'a>(ckpt: &SafetensorsCheckpoint, key: &'a str, tie_word_embeddings: bool) -> &'a str {
    models::keys::data_key(key, tie_word_embeddings, |k| ckpt.contains(k))
}

/// Quantizes every LPBQ, uint16 and float parameter of `plan` from the float checkpoint `source`
/// (RoPE tables come from calibration; see [`write_quantized_checkpoint`]). Parameters sharing a
/// source tensor (a tied lm_head) read it once.
///
/// Source tensors are processed in parallel on [`num_threads`](crate::kernels::num_threads)
/// threads, so one thread's reading (conversion to f32 is sequential per tensor) overlaps the
/// other's quantization; the output keeps plan order. `progress(done, total, key)` is called after
/// each source tensor, from any thread.
pub fn quantize_weights(
    plan: &ExportPlan,
    source: &SafetensorsCheckpoint,
    tie_word_embeddings: bool,
    progress: &(dyn Fn(usize, usize, &str) + Sync),
) -> Result<QuantizedWeights, QuantizationError> {
    quantize_weights_with(plan, source, tie_word_embeddings, &LinearQuantizer::rtn(), progress)
}

/// [`quantize_weights`] with the linears rounded by `linears` (a [`WeightMethod`](super::WeightMethod)).
pub fn quantize_weights_with(
    plan: &ExportPlan,
    source: &SafetensorsCheckpoint,
    tie_word_embeddings: bool,
    linears: &LinearQuantizer,
    progress: &(dyn Fn(usize, usize, &str) + Sync),
) -> Result<QuantizedWeights, QuantizationError> {
    // Group by source tensor, keeping plan order of first use.
    let mut groups: Vec<(&str, Vec<&ParamPlan>)> = Vec::new();
    for p in plan.params.iter().filter(|p| !matches!(p, ParamPlan::Rope { .. })) {
        let src = source_key(source, p.key(), tie_word_embeddings);
        match groups.iter_mut().find(|(s, _)| *s == src) {
            Some((_, ps)) => ps.push(p),
            None => groups.push((src, vec![p])),
        }
    }
    let total = groups.len();
    let done = AtomicUsize::new(0);
    let threads = crate::kernels::num_threads();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .map_err(|e| QuantizationError::Report(format!("cannot start {threads} quantization threads: {e}")))?;
    let quantize_group = |(src, params): &(&str, Vec<&ParamPlan>)| -> Result<QuantizedWeights, QuantizationError> {
        let (dtype, shape) = source.info(src)?;
        let shape = shape.to_vec();
        let mut out = QuantizedWeights {
            input_bytes: (shape.iter().product::<usize>() * dtype.bitsize() / 8) as u64,
            ..Default::default()
        };
        let t0 = Instant::now();
        let data = source.read_float_param(src)?;
        let t1 = Instant::now();
        for p in params {
            quantize_param(p, src, &shape, &data, linears, &mut out.tensors)?;
        }
        out.read_seconds = (t1 - t0).as_secs_f64();
        out.quantize_seconds = t1.elapsed().as_secs_f64();
        progress(done.fetch_add(1, Ordering::Relaxed) + 1, total, src);
        Ok(out)
    };
    let parts: Vec<Result<QuantizedWeights, QuantizationError>> =
        pool.install(|| groups.par_iter().map(quantize_group).collect());
    let mut out = QuantizedWeights::default();
    for part in parts {
        let part = part?;
        out.tensors.extend(part.tensors);
        out.input_bytes += part.input_bytes;
        out.read_seconds += part.read_seconds;
        out.quantize_seconds += part.quantize_seconds;
    }
    Ok(out)
}

fn quantize_param(
    p: &ParamPlan,
    src: &str,
    src_shape: &[usize],
    data: &[f32],
    linears: &LinearQuantizer,
    out: &mut Vec<OutTensor>,
) -> Result<(), QuantizationError> {
    let shape_err = |expected: String| QuantizationError::Param {
        key: p.key().to_string(),
        problem: format!("source tensor `{src}` has shape {src_shape:?}; expected {expected}"),
    };
    match p {
        ParamPlan::Lpbq { key, op, out_features, in_features, block_size, .. } => {
            if src_shape != [*out_features, *in_features] {
                return Err(shape_err(format!("[{out_features}, {in_features}] (HF [out, in])")));
            }
            let shape = LpbqShape::new(*out_features, *in_features, *block_size)
                .map_err(|e| QuantizationError::quant(key.clone(), e))?;
            let hwio = vec![1, 1, *in_features, *out_features];
            match linears.export(op, data, shape)? {
                LinearExport::Lpbq(ex) => {
                    let n_blocks = ex.scale1.len();
                    out.push(OutTensor::new(key.clone(), hwio, TensorData::I8(ex.weight_hwio.clone())));
                    out.push(OutTensor::new(
                        SpecParams::lpbq_scale1_key(op),
                        vec![n_blocks],
                        TensorData::U8(ex.scale1.clone()),
                    ));
                    let scale2 = TensorData::F32(ex.scale2.clone());
                    out.push(OutTensor::new(SpecParams::lpbq_scale2_key(op), vec![*out_features], scale2));
                }
                LinearExport::Int8(ex) => {
                    out.push(OutTensor::new(key.clone(), hwio, TensorData::I8(ex.codes_hwio.clone())));
                    let scales = TensorData::F32(ex.scales.clone());
                    out.push(OutTensor::new(SpecParams::scale_key(op), vec![*out_features], scales));
                }
            }
        }
        ParamPlan::Uint16 { key, op, shape } => {
            if shape.iter().product::<usize>() != data.len() {
                return Err(shape_err(format!("{shape:?}")));
            }
            let w = quantize_u16_weight(data).map_err(|e| QuantizationError::quant(key.clone(), e))?;
            out.push(OutTensor::new(key.clone(), shape.clone(), TensorData::U16(w.codes)));
            out.push(OutTensor::new(SpecParams::scale_key(op), vec![1], TensorData::F32(vec![w.params.scale])));
            out.push(OutTensor::new(
                SpecParams::zero_point_key(op),
                vec![1],
                TensorData::I32(vec![w.params.zero_point]),
            ));
        }
        ParamPlan::Float { key, shape } => {
            if shape.iter().product::<usize>() != data.len() {
                return Err(shape_err(format!("{shape:?}")));
            }
            out.push(OutTensor::new(key.clone(), shape.clone(), TensorData::F32(data.to_vec())));
        }
        ParamPlan::Rope { .. } => {}
    }
    Ok(())
}

/// The RoPE tables of `plan`, quantized with their QDQ parameters from `tables` (the float tables
/// calibration saw, by QDQ key).
pub fn quantize_rope_tables(
    plan: &ExportPlan,
    params: &QdqParams,
    tables: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
) -> Result<Vec<OutTensor>, QuantizationError> {
    let mut out = Vec::new();
    for p in &plan.params {
        let ParamPlan::Rope { key, point, shape } = p else { continue };
        let (seen_shape, values) = tables.get(point).ok_or_else(|| QuantizationError::Param {
            key: key.clone(),
            problem: format!("calibration never saw the table at its QDQ point `{point}`"),
        })?;
        if seen_shape != shape {
            return Err(QuantizationError::Param {
                key: key.clone(),
                problem: format!("calibration saw a {seen_shape:?} table at `{point}`, the model declares {shape:?}"),
            });
        }
        let qp: &QuantParams = params.get(point).ok_or_else(|| QuantizationError::Unobserved { key: point.clone() })?;
        let codes = export_u16(values, qp).map_err(|e| QuantizationError::quant(key.clone(), e))?;
        out.push(OutTensor::new(key.clone(), shape.clone(), TensorData::U16(codes)));
    }
    Ok(out)
}

/// Writes `<out_dir>/model.safetensors` (weights, RoPE tables and QDQ parameters) and
/// `<out_dir>/config.json` (the source config with `linear_block_size`), each atomically.
pub fn write_quantized_checkpoint(
    out_dir: &Path,
    source_config: &Path,
    block_size: usize,
    tensors: &[OutTensor],
    params: &QdqParams,
) -> Result<(), QuantizationError> {
    std::fs::create_dir_all(out_dir).map_err(|e| QuantizationError::io(out_dir, e))?;
    let qdq = params.checkpoint_tensors();
    let mut all: Vec<TensorBytes<'_>> =
        tensors.iter().map(|t| (t.name.as_str(), t.data.dtype(), t.shape.as_slice(), t.data.bytes())).collect();
    all.extend(qdq.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice())));
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(out_dir.join("model.safetensors"), &all, &metadata)?;

    let text = mllm_dsl::files::read_text_bounded(source_config, mllm_dsl::files::CONFIG_SIZE_LIMIT)
        .map_err(CheckpointError::from)?;
    let mut config: serde_json::Value = serde_json::from_str(&text).map_err(|e| QuantizationError::Param {
        key: source_config.display().to_string(),
        problem: format!("not valid JSON: {e}"),
    })?;
    let obj = config.as_object_mut().ok_or_else(|| QuantizationError::Param {
        key: source_config.display().to_string(),
        problem: "expected a JSON object".into(),
    })?;
    obj.insert("linear_block_size".into(), serde_json::json!(block_size));
    write_json_atomic(&out_dir.join("config.json"), &config).map_err(CheckpointError::from)?;
    Ok(())
}
