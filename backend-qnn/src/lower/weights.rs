//! Registered parameters as `STATIC` QNN tensors, built from the checkpoint's stored bytes.
//!
//! - uint16 weights (embedding, RMSNorm gammas, RoPE tables): the stored `u16` codes as they
//!   are, with the value's `SCALE_OFFSET` encoding (offset = -zero_point).
//! - LPBQ weights (every projection, mllm's QNNTensorWrapper::setBlockwiseQuantization): pymllm's export under the op prefix
//!   `<op>.{weight, scale1, scale2}`: HWIO `[1, 1, In, Out]` int4 codes in the low nibble of
//!   int8 (`-7..=7 & 0x0F`), `scale1` u8 `[Out][In/block]` block multipliers, `scale2` f32
//!   `[Out]` channel scales. They become one `BLOCKWISE_EXPANSION` encoding with `axis = 3`
//!   (the output channel), `scaleOffsets[o] = {scale2[o], 0}`, `numBlocksPerAxis = In/block`,
//!   `blockScaleBitwidth` = the spec's level-0 bits (4) in 8-bit storage, `blocksScale8` =
//!   `scale1`; the codes are re-encoded in the graph's [`Int4Storage`] (for the default,
//!   [`Int4Storage::LowNibble`], the stored bytes unchanged).
//! - per-channel int8 weights (the linears a mixed-precision checkpoint raises to 8 bits:
//!   `<op>.weight` int8 HWIO codes -127..=127, `<op>.scale` f32 `[Out]`): `SFIXED_POINT_8` with an
//!   `AXIS_SCALE_OFFSET` encoding on axis 3 (the output channel), offsets 0.
//! - float / int32 weights: the stored bytes, no encoding.
//!
//! Every stored dtype and shape is checked against the IR value and the spec; a mismatch names
//! the checkpoint key.

use compiler::passes::{ParamError, QuantParamProvider};
use mllm_dsl::ir::{Program, QuantSpecKind, SpecParams, ValueId};
use mllm_dsl::DType;

use crate::dtype::DataType;
use crate::encoding::{BlockScales, BlockwiseExpansion, Encoding, EncodingError, Int4Storage, ScaleOffset};
use crate::graph::{QnnTensor, StaticData};

use super::encode::{self, EncodeError};

/// Why a weight could not be built; `key` is the checkpoint key concerned.
#[derive(Debug)]
pub(super) struct WeightError {
    pub key: String,
    pub problem: WeightProblem,
}

/// What is wrong with a stored weight (or its spec); [`super::LowerError::Weight`] adds the graph
/// and the checkpoint key.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum WeightProblem {
    #[error("{0}")]
    Param(#[from] ParamError),
    #[error("{0}")]
    Encode(#[from] EncodeError),
    #[error("{0}")]
    Encoding(#[from] EncodingError),
    #[error("is missing from {provider}")]
    Missing { provider: String },
    #[error("is stored as {found} {found_shape:?}, expected {expected} {shape:?}")]
    Stored { found: DType, found_shape: Vec<usize>, expected: DType, shape: Vec<usize> },
    #[error("{dtype} weights ({qnn}) are not stored in checkpoints")]
    NotStored { dtype: DType, qnn: DataType },
    #[error("LPBQ weight has no quantization spec")]
    NoSpec,
    #[error("Int4LPBQ weight has spec {0}, expected LPBQ")]
    NotLpbq(QuantSpecKind),
    #[error("int8 weight has spec {0}, expected SymPerChannel(-127, 127, 3, Int8, Float32) (HWIO output channel)")]
    NotInt8PerChannel(QuantSpecKind),
    #[error("LPBQ spec {0} is not solved (run PTQ)")]
    Unsolved(QuantSpecKind),
    #[error("LPBQ weight dims {0:?}: expected HWIO [1, 1, In, Out]")]
    NotHwio(Vec<u32>),
    #[error("LPBQ channel axis {0}: the HWIO output channel is axis 3")]
    ChannelAxis(usize),
    #[error("LPBQ block size {block_size} does not divide In = {inputs}")]
    BlockSize { block_size: usize, inputs: usize },
    #[error("spec records {blocks:?} blocks x {channels:?} channels, dims give {dims_blocks} x {dims_channels}")]
    SpecCounts { blocks: Option<usize>, channels: Option<usize>, dims_blocks: usize, dims_channels: usize },
    #[error("has {found} channel scales, expected Out = {expected}")]
    ChannelScales { found: usize, expected: usize },
    #[error("byte {index} is {byte:#04x}; pymllm stores int4 codes as low nibbles")]
    NotLowNibble { index: usize, byte: u8 },
    #[error("code {index} is {code}, outside the spec's {min}..={max}")]
    CodeRange { index: usize, code: i8, min: i32, max: i32 },
    #[error("a Conv2D bias needs a per-tensor quantized input (its scale sets the bias scale)")]
    BiasInput,
    #[error("a Conv2D bias needs a quantized filter, found encoding {0}")]
    BiasFilter(&'static str),
    #[error("has {found} values, the filter has {channels} output channels")]
    BiasLength { found: usize, channels: usize },
    #[error("channel {channel}: bias {bias} with scale {scale} does not fit int32 codes")]
    BiasRange { channel: usize, bias: f32, scale: f32 },
}

fn fail(key: &str, problem: impl Into<WeightProblem>) -> WeightError {
    WeightError { key: key.to_string(), problem: problem.into() }
}

/// Reads `key` and checks its stored dtype and shape.
fn stored(provider: &dyn QuantParamProvider, key: &str, dtype: DType, shape: &[usize]) -> Result<Vec<u8>, WeightError> {
    check_stored(provider, key, dtype, shape)?;
    provider.read_bytes(key).map_err(|e| fail(key, e))
}

/// Checks the stored dtype and shape of `key` without reading it.
fn check_stored(
    provider: &dyn QuantParamProvider,
    key: &str,
    dtype: DType,
    shape: &[usize],
) -> Result<(), WeightError> {
    let info = provider
        .tensor(key)
        .map_err(|e| fail(key, e))?
        .ok_or_else(|| fail(key, WeightProblem::Missing { provider: provider.name() }))?;
    if info.dtype != dtype || info.shape != shape {
        let (found, found_shape) = (info.dtype, info.shape);
        return Err(fail(key, WeightProblem::Stored { found, found_shape, expected: dtype, shape: shape.to_vec() }));
    }
    Ok(())
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
    if let Some(QuantSpecKind::SymPerChannel { .. }) = p.value_spec(v).map(|s| &s.kind) {
        return int8_per_channel(p, v, symbol, name, &dims, provider);
    }
    let (dtype, encoding) = encode::value_type(p, v).map_err(|d| fail(symbol, d))?;
    let stored_dtype = match dtype {
        DataType::UFixedPoint16 => DType::U16,
        DataType::Float32 => DType::F32,
        DataType::Float16 => DType::F16,
        DataType::Int32 => DType::I32,
        DataType::Int8 => DType::I8,
        DataType::UInt8 => DType::U8,
        qnn => return Err(fail(symbol, WeightProblem::NotStored { dtype: def.ty.dtype, qnn })),
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
    let spec = p.value_spec(v).ok_or_else(|| fail(symbol, WeightProblem::NoSpec))?;
    let QuantSpecKind::Lpbq { quant_min, quant_max, block_size, ch_axis, scale_level_0_bitwidth, .. } = spec.kind
    else {
        return Err(fail(symbol, WeightProblem::NotLpbq(spec.kind.clone())));
    };
    let Some(SpecParams::Lpbq { from, blocks, channels }) = &spec.params else {
        return Err(fail(symbol, WeightProblem::Unsolved(spec.kind.clone())));
    };
    // Conv2d filters are HWIO [1, 1, In, Out]; QNN's blockwise axis is the output channel.
    let &[1, 1, inputs, outputs] = dims else {
        return Err(fail(symbol, WeightProblem::NotHwio(dims.to_vec())));
    };
    if ch_axis != 3 {
        return Err(fail(symbol, WeightProblem::ChannelAxis(ch_axis)));
    }
    let (cin, cout) = (inputs as usize, outputs as usize);
    if block_size == 0 || cin % block_size != 0 {
        return Err(fail(symbol, WeightProblem::BlockSize { block_size, inputs: cin }));
    }
    let nb = cin / block_size;
    if blocks.is_some_and(|b| b != nb) || channels.is_some_and(|c| c != cout) {
        let (blocks, channels) = (*blocks, *channels);
        return Err(fail(symbol, WeightProblem::SpecCounts { blocks, channels, dims_blocks: nb, dims_channels: cout }));
    }
    let shape = [1, 1, cin, cout];
    let weight_key = SpecParams::weight_key(from);
    check_stored(provider, &weight_key, DType::I8, &shape)?;
    let scale1_key = SpecParams::lpbq_scale1_key(from);
    let scale1 = stored(provider, &scale1_key, DType::U8, &[cout * nb])?;
    let scale2_key = SpecParams::lpbq_scale2_key(from);
    let scale2 = provider.read_f32(&scale2_key).map_err(|e| fail(&scale2_key, e))?;
    if scale2.len() != cout {
        return Err(fail(&scale2_key, WeightProblem::ChannelScales { found: scale2.len(), expected: cout }));
    }
    // Checked and re-encoded straight from the provider's bytes (the mapping, for a checkpoint):
    // the only allocation is the result.
    let mut codes = None;
    provider
        .with_stored_bytes(&weight_key, &mut |nibbles| {
            codes = Some(lpbq_codes(nibbles, (quant_min, quant_max), int4));
        })
        .map_err(|e| fail(&weight_key, e))?;
    let missing = || WeightProblem::Missing { provider: provider.name() };
    let data = codes.unwrap_or_else(|| Err(missing())).map_err(|e| fail(&weight_key, e))?;
    let encoding = Encoding::BlockwiseExpansion(BlockwiseExpansion {
        axis: 3,
        scale_offsets: scale2.iter().map(|&scale| ScaleOffset { scale, offset: 0 }).collect::<Vec<_>>().into(),
        num_blocks_per_axis: nb as u32,
        block_scale_bitwidth: scale_level_0_bitwidth,
        block_scales: BlockScales::U8(scale1.into()),
    });
    Ok(QnnTensor::new_static(name, int4.signed_weight_dtype(), dims, encoding, StaticData::new(data)))
}

/// A per-channel int8 weight (a linear raised to 8 bits): `SFIXED_POINT_8` codes as stored,
/// `AXIS_SCALE_OFFSET` on the output channel of HWIO `[1, 1, In, Out]` (axis 3) with offset 0.
fn int8_per_channel(
    p: &Program,
    v: ValueId,
    symbol: &str,
    name: &str,
    dims: &[u32],
    provider: &dyn QuantParamProvider,
) -> Result<QnnTensor, WeightError> {
    let spec = p.value_spec(v).ok_or_else(|| fail(symbol, WeightProblem::NoSpec))?;
    let QuantSpecKind::SymPerChannel { quant_min, quant_max, ch_axis: 3, quant_to: DType::I8, .. } = spec.kind else {
        return Err(fail(symbol, WeightProblem::NotInt8PerChannel(spec.kind.clone())));
    };
    let Some(SpecParams::PerChannel { from, channels }) = &spec.params else {
        return Err(fail(symbol, WeightProblem::Unsolved(spec.kind.clone())));
    };
    let &[1, 1, inputs, outputs] = dims else {
        return Err(fail(symbol, WeightProblem::NotHwio(dims.to_vec())));
    };
    let cout = outputs as usize;
    if *channels != cout {
        let (found, expected) = (*channels, cout);
        return Err(fail(symbol, WeightProblem::ChannelScales { found, expected }));
    }
    let weight_key = SpecParams::weight_key(from);
    let codes = stored(provider, &weight_key, DType::I8, &[1, 1, inputs as usize, cout])?;
    if let Some(index) = codes.iter().position(|&b| !(quant_min..=quant_max).contains(&i32::from(b as i8))) {
        let code = codes[index] as i8;
        return Err(fail(&weight_key, WeightProblem::CodeRange { index, code, min: quant_min, max: quant_max }));
    }
    let scales_key = SpecParams::scale_key(from);
    let scales = provider.read_f32(&scales_key).map_err(|e| fail(&scales_key, e))?;
    if scales.len() != cout {
        return Err(fail(&scales_key, WeightProblem::ChannelScales { found: scales.len(), expected: cout }));
    }
    let encoding = Encoding::AxisScaleOffset {
        axis: 3,
        scale_offsets: scales.iter().map(|&scale| ScaleOffset { scale, offset: 0 }).collect::<Vec<_>>().into(),
    };
    Ok(QnnTensor::new_static(name, DataType::SFixedPoint8, dims, encoding, StaticData::new(codes)))
}

/// pymllm's int4 codes (low nibbles, `-8..=7 & 0x0F`) checked against the spec's range and laid
/// out in `int4`; the first bad byte is named.
fn lpbq_codes(
    nibbles: &[u8],
    (min, max): (i32, i32),
    int4: Int4Storage,
) -> Result<std::sync::Arc<[u8]>, WeightProblem> {
    let decode = |b: u8| if b >= 8 { b as i8 - 16 } else { b as i8 };
    let bad = |b: u8| b & 0xF0 != 0 || !(min..=max).contains(&i32::from(decode(b)));
    if let Some(index) = nibbles.iter().position(|&b| bad(b)) {
        let byte = nibbles[index];
        // pymllm keeps each code in the low nibble (`w & 0x0F`); anything else is a corrupt export.
        if byte & 0xF0 != 0 {
            return Err(WeightProblem::NotLowNibble { index, byte });
        }
        return Err(WeightProblem::CodeRange { index, code: decode(byte), min, max });
    }
    Ok(int4.from_low_nibbles(nibbles))
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
        return Err(fail(symbol, WeightProblem::BiasInput));
    };
    let channel_scales: Vec<f32> = match filter {
        Encoding::BlockwiseExpansion(bw) => bw.scale_offsets.iter().map(|s| s.scale).collect(),
        Encoding::AxisScaleOffset { scale_offsets, .. } => scale_offsets.iter().map(|s| s.scale).collect(),
        other => return Err(fail(symbol, WeightProblem::BiasFilter(other.c_name()))),
    };
    let bias = provider.read_f32(symbol).map_err(|e| fail(symbol, e))?;
    if bias.len() != channel_scales.len() {
        return Err(fail(symbol, WeightProblem::BiasLength { found: bias.len(), channels: channel_scales.len() }));
    }
    let mut scale_offsets = Vec::with_capacity(bias.len());
    let mut codes = Vec::with_capacity(bias.len());
    for (c, (&b, &w)) in bias.iter().zip(&channel_scales).enumerate() {
        let scale = x.scale * w;
        let q = (f64::from(b) / f64::from(scale)).round();
        let fits = scale > 0.0 && scale.is_finite() && (f64::from(i32::MIN)..=f64::from(i32::MAX)).contains(&q);
        if !fits {
            return Err(fail(symbol, WeightProblem::BiasRange { channel: c, bias: b, scale }));
        }
        scale_offsets.push(ScaleOffset { scale, offset: 0 });
        codes.push(q as i32);
    }
    let encoding = Encoding::AxisScaleOffset { axis: 0, scale_offsets: scale_offsets.into() };
    let dims = [codes.len() as u32];
    Ok(QnnTensor::new_static(name, DataType::SFixedPoint32, &dims, encoding, StaticData::from_i32(&codes)))
}

/// `t + 1` for a static norm gamma: f32 data directly; uint16 data dequantized, plus one and
/// quantized again with an encoding over `[min(0, lo), max(0, hi)]` of the new values.
pub(super) fn plus_one(t: QnnTensor) -> Result<QnnTensor, String> {
    let data = t.data.as_ref().ok_or("has no static data")?;
    match (t.dtype, &t.encoding) {
        (DataType::Float32, _) => {
            let v: Vec<f32> =
                data.bytes().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) + 1.0).collect();
            Ok(QnnTensor::new_static(t.name, t.dtype, &t.dims, t.encoding, StaticData::from_f32(&v)))
        }
        (DataType::UFixedPoint16, Encoding::ScaleOffset(so)) => {
            let real: Vec<f32> = data
                .bytes()
                .chunks_exact(2)
                .map(|b| so.dequantize(i64::from(u16::from_le_bytes([b[0], b[1]]))) + 1.0)
                .collect();
            let (lo, hi) = real.iter().fold((0f32, 0f32), |(l, h), &x| (l.min(x), h.max(x)));
            let scale = if hi > lo { (hi - lo) / 65535.0 } else { 1.0 / 65535.0 };
            let new = ScaleOffset { scale, offset: (lo / scale).round() as i32 };
            let codes: Vec<u16> = real.iter().map(|&x| new.quantize(x, (0, 65535)) as u16).collect();
            let encoding = Encoding::ScaleOffset(new);
            Ok(QnnTensor::new_static(t.name, t.dtype, &t.dims, encoding, StaticData::from_u16(&codes)))
        }
        (dtype, encoding) => {
            Err(format!("a (1 + w) norm gamma of type {dtype} with encoding {encoding:?} is not supported"))
        }
    }
}
