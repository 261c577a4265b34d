//! Registered parameters as `STATIC` QNN tensors, built from the checkpoint's stored bytes.
//!
//! - uint16 weights (embedding, RMSNorm gammas, RoPE tables): the stored `u16` codes as they
//!   are, with the value's `SCALE_OFFSET` encoding (offset = -zero_point).
//! - LPBQ weights (every projection, mllm-anchor §5.4): pymllm's export under the op prefix
//!   `<op>.{weight, scale1, scale2}`: HWIO `[1, 1, In, Out]` int4 codes in the low nibble of
//!   int8 (`-7..=7 & 0x0F`), `scale1` u8 `[Out][In/block]` block multipliers, `scale2` f32
//!   `[Out]` channel scales. They become one `BLOCKWISE_EXPANSION` encoding with `axis = 3`
//!   (the output channel), `scaleOffsets[o] = {scale2[o], 0}`, `numBlocksPerAxis = In/block`,
//!   `blockScaleBitwidth` = the spec's level-0 bits (4) in 8-bit storage, `blocksScale8` =
//!   `scale1`; the codes are re-encoded in the graph's [`Int4Storage`] (for the default,
//!   [`Int4Storage::LowNibble`], the stored bytes unchanged).
//! - float / int32 weights: the stored bytes, no encoding.
//!
//! Every stored dtype and shape is checked against the IR value and the spec; a mismatch names
//! the checkpoint key.

use mllm_dsl::ir::{Program, QuantSpecKind, SpecParams, ValueId};
use mllm_dsl::passes::QuantParamProvider;
use mllm_dsl::DType;

use crate::dtype::DataType;
use crate::encoding::{BlockScales, BlockwiseExpansion, Encoding, Int4Storage, ScaleOffset};
use crate::graph::{QnnTensor, StaticData};

use super::encode;

/// Why a weight could not be built; `key` is the checkpoint key concerned.
#[derive(Debug)]
pub(super) struct WeightError {
    pub key: String,
    pub detail: String,
}

fn fail(key: &str, detail: impl Into<String>) -> WeightError {
    WeightError { key: key.to_string(), detail: detail.into() }
}

/// Reads `key` and checks its stored dtype and shape.
fn stored(provider: &dyn QuantParamProvider, key: &str, dtype: DType, shape: &[usize]) -> Result<Vec<u8>, WeightError> {
    let info = provider
        .tensor(key)
        .map_err(|e| fail(key, e.to_string()))?
        .ok_or_else(|| fail(key, format!("is missing from {}", provider.name())))?;
    if info.dtype != dtype || info.shape != shape {
        return Err(fail(key, format!("is stored as {} {:?}, expected {dtype} {shape:?}", info.dtype, info.shape)));
    }
    provider.read_bytes(key).map_err(|e| fail(key, e.to_string()))
}

/// The static tensor named `name` for the registered value `v` (symbol `symbol`).
pub(super) fn weight_tensor(
    p: &Program,
    v: ValueId,
    symbol: &str,
    name: &str,
    provider: &dyn QuantParamProvider,
    int4: Int4Storage,
) -> Result<QnnTensor, WeightError> {
    let def = p.value(v);
    let shape = &def.ty.shape;
    let dims = encode::dims(shape).map_err(|d| fail(symbol, d))?;
    if def.ty.dtype == DType::I4Lpbq {
        return lpbq(p, v, symbol, name, &dims, provider, int4);
    }
    let (dtype, encoding) = encode::value_type(p, v).map_err(|d| fail(symbol, d))?;
    let stored_dtype = match dtype {
        DataType::UFixedPoint16 => DType::U16,
        DataType::Float32 => DType::F32,
        DataType::Float16 => DType::F16,
        DataType::Int32 => DType::I32,
        DataType::Int8 => DType::I8,
        DataType::UInt8 => DType::U8,
        other => return Err(fail(symbol, format!("{} weights ({other}) are not stored in checkpoints", def.ty.dtype))),
    };
    let bytes = stored(provider, symbol, stored_dtype, shape)?;
    Ok(QnnTensor::new_static(name, dtype, &dims, encoding, StaticData::new(bytes)))
}

fn lpbq(
    p: &Program,
    v: ValueId,
    symbol: &str,
    name: &str,
    dims: &[u32],
    provider: &dyn QuantParamProvider,
    int4: Int4Storage,
) -> Result<QnnTensor, WeightError> {
    let spec = p.value_spec(v).ok_or_else(|| fail(symbol, "LPBQ weight has no quantization spec"))?;
    let QuantSpecKind::Lpbq { quant_min, quant_max, block_size, ch_axis, scale_level_0_bitwidth, .. } = spec.kind
    else {
        return Err(fail(symbol, format!("Int4LPBQ weight has spec {}, expected LPBQ", spec.kind)));
    };
    let Some(SpecParams::Lpbq { from, blocks, channels }) = &spec.params else {
        return Err(fail(symbol, format!("LPBQ spec {} is not solved (run PTQ)", spec.kind)));
    };
    // Conv2d filters are HWIO [1, 1, In, Out]; QNN's blockwise axis is the output channel.
    let &[1, 1, inputs, outputs] = dims else {
        return Err(fail(symbol, format!("LPBQ weight dims {dims:?}: expected HWIO [1, 1, In, Out]")));
    };
    if ch_axis != 3 {
        return Err(fail(symbol, format!("LPBQ channel axis {ch_axis}: the HWIO output channel is axis 3")));
    }
    let (cin, cout) = (inputs as usize, outputs as usize);
    if block_size == 0 || cin % block_size != 0 {
        return Err(fail(symbol, format!("LPBQ block size {block_size} does not divide In = {cin}")));
    }
    let nb = cin / block_size;
    if blocks.is_some_and(|b| b != nb) || channels.is_some_and(|c| c != cout) {
        return Err(fail(
            symbol,
            format!("spec records {blocks:?} blocks x {channels:?} channels, dims give {nb} x {cout}"),
        ));
    }
    let shape = [1, 1, cin, cout];
    let weight_key = SpecParams::lpbq_weight_key(from);
    let mut codes = stored(provider, &weight_key, DType::I8, &shape)?;
    let scale1_key = SpecParams::lpbq_scale1_key(from);
    let scale1 = stored(provider, &scale1_key, DType::U8, &[cout * nb])?;
    let scale2_key = SpecParams::lpbq_scale2_key(from);
    let scale2 = provider.read_f32(&scale2_key).map_err(|e| fail(&scale2_key, e.to_string()))?;
    if scale2.len() != cout {
        return Err(fail(&scale2_key, format!("has {} channel scales, expected Out = {cout}", scale2.len())));
    }
    // pymllm keeps each code in the low nibble (`w & 0x0F`); anything else is a corrupt export.
    // Decoded in place (the LM head alone is 311 MB for Qwen3-1.7B): no second copy is held.
    for (i, b) in codes.iter_mut().enumerate() {
        if *b & 0xF0 != 0 {
            return Err(fail(&weight_key, format!("byte {i} is {b:#04x}; pymllm stores int4 codes as low nibbles")));
        }
        let q = if *b >= 8 { *b as i8 - 16 } else { *b as i8 };
        if !(quant_min..=quant_max).contains(&i32::from(q)) {
            return Err(fail(&weight_key, format!("code {i} is {q}, outside the spec's {quant_min}..={quant_max}")));
        }
        *b = q as u8;
    }
    // Same size and alignment: `collect` reuses the buffer.
    let values: Vec<i8> = codes.into_iter().map(|b| b as i8).collect();
    let data = int4.encode(&values, true).map_err(|e| fail(&weight_key, e.to_string()))?;
    let encoding = Encoding::BlockwiseExpansion(BlockwiseExpansion {
        axis: 3,
        scale_offsets: scale2.iter().map(|&scale| ScaleOffset { scale, offset: 0 }).collect::<Vec<_>>().into(),
        num_blocks_per_axis: nb as u32,
        block_scale_bitwidth: scale_level_0_bitwidth,
        block_scales: BlockScales::U8(scale1.into()),
    });
    Ok(QnnTensor::new_static(name, int4.signed_weight_dtype(), dims, encoding, StaticData::new(data)))
}

/// The `INT_32`-coded bias QNN's quantized Conv2d takes (QNN's and executorch's convention for a
/// derived bias): `SFIXED_POINT_32`, `AXIS_SCALE_OFFSET` on axis 0 with channel `c`'s scale
/// `input scale × weight channel scale` and offset 0, codes `round(bias / scale)`. For an LPBQ
/// weight the channel scale is `scale2[c]` (the channel's largest block scale / 16, what
/// executorch derives for per-block weights); the float bias comes from the checkpoint (pymllm
/// keeps it in float). Its rounding error is half a step of the accumulator, far below the
/// output's u16 step.
pub(super) fn conv_bias_tensor(
    symbol: &str,
    name: &str,
    provider: &dyn QuantParamProvider,
    input: &Encoding,
    filter: &Encoding,
) -> Result<QnnTensor, WeightError> {
    let Encoding::ScaleOffset(x) = input else {
        return Err(fail(symbol, "a Conv2D bias needs a per-tensor quantized input (its scale sets the bias scale)"));
    };
    let channel_scales: Vec<f32> = match filter {
        Encoding::BlockwiseExpansion(bw) => bw.scale_offsets.iter().map(|s| s.scale).collect(),
        Encoding::AxisScaleOffset { scale_offsets, .. } => scale_offsets.iter().map(|s| s.scale).collect(),
        other => {
            return Err(fail(
                symbol,
                format!("a Conv2D bias needs a quantized filter, found encoding {}", other.c_name()),
            ))
        }
    };
    let bias = provider.read_f32(symbol).map_err(|e| fail(symbol, e.to_string()))?;
    if bias.len() != channel_scales.len() {
        return Err(fail(
            symbol,
            format!("has {} values, the filter has {} output channels", bias.len(), channel_scales.len()),
        ));
    }
    let mut scale_offsets = Vec::with_capacity(bias.len());
    let mut codes = Vec::with_capacity(bias.len());
    for (c, (&b, &w)) in bias.iter().zip(&channel_scales).enumerate() {
        let scale = x.scale * w;
        let q = (f64::from(b) / f64::from(scale)).round();
        let fits = scale > 0.0 && scale.is_finite() && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&q);
        if !fits {
            return Err(fail(symbol, format!("channel {c}: bias {b} with scale {scale} does not fit int32 codes")));
        }
        scale_offsets.push(ScaleOffset { scale, offset: 0 });
        codes.push(q as i32);
    }
    let encoding = Encoding::AxisScaleOffset { axis: 0, scale_offsets: scale_offsets.into() };
    let dims = [codes.len() as u32];
    Ok(QnnTensor::new_static(name, DataType::SFixedPoint32, &dims, encoding, StaticData::from_i32(&codes)))
}
