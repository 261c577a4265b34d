//! Quantization encodings (`Qnn_QuantizeParams_t`) and the exact integer <-> real mappings.
//!
//! QNN's convention (`QnnTypes.h`) is
//! `real = scale * (q + offset)` with `scale > 0`, so a QNN `offset` is the *negated* zero point.
//! The sign flip lives in [`ScaleOffset::from_zero_point`] and nowhere else.
//!
//! Encodings modelled here (the ones an LLM lowering needs):
//! - `UNDEFINED` for float / integer / bool tensors;
//! - `SCALE_OFFSET`: per-tensor affine; uint16 activations (offset in [-65535, 0]) and the uint8
//!   "symmetric" KV cache, which QNN spells as `offset = -128` (`QnnTypes.h`; mllm's parseQnnQuantizeParamFromIR);
//! - `AXIS_SCALE_OFFSET`: per-channel (`axis` indexes the channel dimension);
//! - `BLOCKWISE_EXPANSION` (LPBQ): `axis` = output channel, per-channel `scaleOffsets` with offset 0
//!   ("scale2"), and per-block integer multipliers `blocksScale8` ("scale1") laid out
//!   `[channel][block]` with `numBlocksPerAxis = In / block_size`, `blockScaleBitwidth = 4` in
//!   8-bit storage (`QnnTypes.h`; ExecuTorch backends/qualcomm/builders/node_visitor.py; mllm's QNNTensorWrapper::setBlockwiseQuantization). Dequantization:
//!   `w[i, o] = (q + offset_o) * scale2[o] * scale1[o][i / block_size]`.
//!
//! Rounding: real -> integer uses round-half-to-even. QNN does not document the HTP's rounding;
//! half-even is what PyTorch's `fake_quantize_per_tensor_affine` (`std::nearbyint`) does, which
//! is how both executorch and pymllm calibrate (ExecuTorch backends/qualcomm/quantizer; pymllm's observers), and what the
//! LPBQ scale construction uses (`torch.round`). Arithmetic is done in f64 and rounded to f32
//! once, so dequantized values are the correctly rounded f32 of the exact product.
//!
//! 4-bit weight storage ([`Int4Storage`]): the public sources disagree on how 4-bit weights are
//! laid out in the client buffer (`QnnTypes.h`; ExecuTorch backends/qualcomm/builders/node_visitor.py):
//! - the QnnTypes.h note says 4-bit types are "tightly packed", two per byte, lower nibble first;
//! - mllm tags LPBQ weights `SFIXED_POINT_4` but writes one value per byte, masked to the low
//!   nibble (`w & 0x0F`, `sizeof(mllm_int4_t) == 1`, dataSize = numel; mllm's QNNTensorWrapper::setBlockwiseQuantization);
//! - executorch tags them `SFIXED_POINT_8` and stores -7..7 sign-extended in int8 containers, the
//!   CI-tested `16a4w_block` route (ExecuTorch backends/qualcomm/builders/node_visitor.py).
//!
//! We follow mllm by default ([`Int4Storage::LowNibble`]) because mllm's Qwen3 AOT flow is the
//! flow this crate replaces, and keep the other two selectable per graph.
//!
//! Checked against Qualcomm's QAIRT 2.51 x86_64 HTP backend (`tests/sdk_real_models.rs`): it
//! refuses `SFIXED_POINT_4` tensors at creation ("tensor datatype 772 not supported", 7004),
//! and with [`Int4Storage::Int8Container`] every fixture validates, finalizes and executes in
//! HTP emulation within 48–68 dB of the reference interpreter. Context binaries for the real
//! backend must therefore be lowered with `Int8Container`.

use std::sync::Arc;

use crate::dtype::DataType;

/// `Qnn_Definition_t` values.
pub mod definition {
    pub const IMPL_GENERATED: u32 = 0;
    pub const DEFINED: u32 = 1;
    pub const UNDEFINED: u32 = 0x7FFF_FFFF;
}

/// `Qnn_QuantizationEncoding_t` values (`Qnn_QuantizeParams_t` in `QnnTypes.h`).
pub mod encoding_value {
    pub const SCALE_OFFSET: u32 = 0;
    pub const AXIS_SCALE_OFFSET: u32 = 1;
    pub const BW_SCALE_OFFSET: u32 = 2;
    pub const BW_AXIS_SCALE_OFFSET: u32 = 3;
    pub const BLOCK: u32 = 4;
    pub const BLOCKWISE_EXPANSION: u32 = 5;
    pub const VECTOR: u32 = 6;
    pub const UNDEFINED: u32 = 0x7FFF_FFFF;
}

/// `Qnn_BlockwiseExpansionBlockScaleStorageType_t` values.
pub mod block_scale_storage {
    pub const STORAGE_8: u32 = 0;
    pub const STORAGE_16: u32 = 1;
}

/// How values of a 4-bit type are laid out in a static buffer. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Int4Storage {
    /// One value per byte in the low nibble, high nibble zero (`q & 0x0F`); mllm's convention.
    #[default]
    LowNibble,
    /// One value per byte, sign-extended to a full int8 (executorch stores -7..7 this way and
    /// tags the tensor `SFIXED_POINT_8`).
    Int8Container,
    /// Two values per byte, lower nibble first (the QnnTypes.h note on 4-bit types).
    Packed,
}

impl Int4Storage {
    /// The data type a lowering should give a signed 4-bit weight under this convention.
    pub const fn signed_weight_dtype(self) -> DataType {
        match self {
            Int4Storage::LowNibble | Int4Storage::Packed => DataType::SFixedPoint4,
            Int4Storage::Int8Container => DataType::SFixedPoint8,
        }
    }

    /// Encode 4-bit values (each in -8..=7 when `signed`, 0..=15 otherwise) into bytes.
    pub fn encode(self, values: &[i8], signed: bool) -> Result<Vec<u8>, EncodingError> {
        let (lo, hi) = if signed { (-8, 7) } else { (0, 15) };
        if let Some((index, &v)) = values.iter().enumerate().find(|(_, &v)| i32::from(v) < lo || i32::from(v) > hi) {
            return Err(EncodingError::Int4OutOfRange { index, value: v.into() });
        }
        Ok(match self {
            Int4Storage::LowNibble => values.iter().map(|&v| (v as u8) & 0x0F).collect(),
            Int4Storage::Int8Container => values.iter().map(|&v| v as u8).collect(),
            Int4Storage::Packed => values
                .chunks(2)
                .map(|pair| {
                    let low = (pair[0] as u8) & 0x0F;
                    let high = pair.get(1).map_or(0, |&v| (v as u8) & 0x0F);
                    low | (high << 4)
                })
                .collect(),
        })
    }

    /// This layout's bytes of signed 4-bit codes stored as pymllm does, one per byte in the low
    /// nibble (`q & 0x0F`, high nibble zero, checked by the caller): one allocation, straight from
    /// `nibbles` (the LM head of a 1.7B model is 311 MB).
    pub fn from_low_nibbles(self, nibbles: &[u8]) -> Arc<[u8]> {
        let signed = |b: u8| if b >= 8 { b.wrapping_sub(16) } else { b };
        match self {
            Int4Storage::LowNibble => Arc::from(nibbles),
            Int4Storage::Int8Container => nibbles.iter().map(|&b| signed(b)).collect(),
            Int4Storage::Packed => {
                nibbles.chunks(2).map(|pair| (pair[0] & 0x0F) | (pair.get(1).map_or(0, |&b| b & 0x0F) << 4)).collect()
            }
        }
    }

    /// Decode `numel` 4-bit values from `bytes`. The caller has checked the byte count.
    pub fn decode(self, bytes: &[u8], numel: usize, signed: bool) -> Vec<i64> {
        let nibble = |n: u8| -> i64 {
            let n = i64::from(n & 0x0F);
            if signed && n >= 8 {
                n - 16
            } else {
                n
            }
        };
        match self {
            Int4Storage::LowNibble => bytes[..numel].iter().map(|&b| nibble(b)).collect(),
            Int4Storage::Int8Container => {
                bytes[..numel].iter().map(|&b| if signed { i64::from(b as i8) } else { i64::from(b) }).collect()
            }
            Int4Storage::Packed => (0..numel)
                .map(|i| {
                    let b = bytes[i / 2];
                    nibble(if i % 2 == 0 { b } else { b >> 4 })
                })
                .collect(),
        }
    }
}

/// `Qnn_ScaleOffset_t`: `real = scale * (q + offset)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScaleOffset {
    pub scale: f32,
    pub offset: i32,
}

impl ScaleOffset {
    /// From the usual affine parameters (`real = scale * (q - zero_point)`): offset = -zero_point.
    pub fn from_zero_point(scale: f32, zero_point: i32) -> ScaleOffset {
        ScaleOffset { scale, offset: -zero_point }
    }

    /// uint8 "symmetric" quantization (zero point 128) as QNN spells it: offset -128.
    pub fn uint8_symmetric(scale: f32) -> ScaleOffset {
        ScaleOffset { scale, offset: -128 }
    }

    /// The zero point of the affine convention (`-offset`).
    pub fn zero_point(&self) -> i32 {
        -self.offset
    }

    /// `scale * (q + offset)`, computed exactly in f64 and rounded once to f32.
    pub fn dequantize(&self, q: i64) -> f32 {
        (f64::from(self.scale) * (q as f64 + f64::from(self.offset))) as f32
    }

    /// `clamp(round_half_even(x / scale) - offset, range)`.
    pub fn quantize(&self, x: f32, range: (i64, i64)) -> i64 {
        quantize_with_scale(x, f64::from(self.scale), self.offset, range)
    }
}

fn quantize_with_scale(x: f32, scale: f64, offset: i32, (lo, hi): (i64, i64)) -> i64 {
    if x.is_nan() {
        // NaN has no code; QNN's behaviour is unspecified. Map it to the zero point's code so
        // one bad value cannot poison the integer domain.
        return (-i64::from(offset)).clamp(lo, hi);
    }
    let q = (f64::from(x) / scale).round_ties_even() - f64::from(offset);
    // `as` saturates for out-of-range floats, including infinities.
    (q.clamp(lo as f64, hi as f64)) as i64
}

/// Block scales of a blockwise-expansion encoding, laid out `[channel][block]`.
#[derive(Clone, Debug, PartialEq)]
pub enum BlockScales {
    /// `blocksScale8` (`QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8`).
    U8(Arc<[u8]>),
    /// `blocksScale16` (`..._STORAGE_16`).
    U16(Arc<[u16]>),
}

impl BlockScales {
    pub fn len(&self) -> usize {
        match self {
            BlockScales::U8(s) => s.len(),
            BlockScales::U16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> u32 {
        match self {
            BlockScales::U8(s) => u32::from(s[i]),
            BlockScales::U16(s) => u32::from(s[i]),
        }
    }

    /// The `blockScaleStorageType` value.
    pub fn storage_type(&self) -> u32 {
        match self {
            BlockScales::U8(_) => block_scale_storage::STORAGE_8,
            BlockScales::U16(_) => block_scale_storage::STORAGE_16,
        }
    }

    /// Little-endian bytes as they would sit in a client buffer.
    pub fn to_le_bytes(&self) -> Vec<u8> {
        match self {
            BlockScales::U8(s) => s.to_vec(),
            BlockScales::U16(s) => s.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }
}

/// `Qnn_BlockwiseExpansion_t` (LPBQ).
#[derive(Clone, Debug, PartialEq)]
pub struct BlockwiseExpansion {
    /// The output-channel axis (`rank - 1` for HWIO Conv2d filters, 0 for `[Out, In]` weights).
    pub axis: u32,
    /// Per-channel scale ("scale2") with offset 0; length = `dims[axis]`.
    pub scale_offsets: Arc<[ScaleOffset]>,
    /// `In / block_size`.
    pub num_blocks_per_axis: u32,
    /// Bits of the block multipliers (4 for LPBQ).
    pub block_scale_bitwidth: u32,
    /// Integer block multipliers ("scale1"), `[channel][block]`.
    pub block_scales: BlockScales,
}

impl BlockwiseExpansion {
    /// The axis along which blocks run (the input-channel axis) for a weight of rank `rank`:
    /// `rank - 2` when the channel axis is last (HWIO `[1, 1, In, Out]`), `1` for `[Out, In]`.
    /// Other layouts are not modelled.
    pub fn block_axis(&self, rank: usize) -> Option<usize> {
        let axis = self.axis as usize;
        if rank >= 2 && axis == rank - 1 {
            Some(rank - 2)
        } else if rank == 2 && axis == 0 {
            Some(1)
        } else {
            None
        }
    }
}

/// `Qnn_QuantizeParams_t`, restricted to the encodings this crate models.
#[derive(Clone, Debug, PartialEq, Default)]
pub enum Encoding {
    /// `QNN_DEFINITION_UNDEFINED` + `QNN_QUANTIZATION_ENCODING_UNDEFINED`.
    #[default]
    Undefined,
    ScaleOffset(ScaleOffset),
    AxisScaleOffset {
        axis: u32,
        scale_offsets: Arc<[ScaleOffset]>,
    },
    BlockwiseExpansion(BlockwiseExpansion),
}

impl Encoding {
    /// Per-tensor encoding from scale and zero point (offset = -zero_point).
    pub fn from_zero_point(scale: f32, zero_point: i32) -> Encoding {
        Encoding::ScaleOffset(ScaleOffset::from_zero_point(scale, zero_point))
    }

    /// Per-tensor encoding from scale and QNN offset.
    pub fn scale_offset(scale: f32, offset: i32) -> Encoding {
        Encoding::ScaleOffset(ScaleOffset { scale, offset })
    }

    /// The `encodingDefinition` value.
    pub fn definition(&self) -> u32 {
        match self {
            Encoding::Undefined => definition::UNDEFINED,
            _ => definition::DEFINED,
        }
    }

    /// The `quantizationEncoding` value.
    pub fn raw(&self) -> u32 {
        match self {
            Encoding::Undefined => encoding_value::UNDEFINED,
            Encoding::ScaleOffset(_) => encoding_value::SCALE_OFFSET,
            Encoding::AxisScaleOffset { .. } => encoding_value::AXIS_SCALE_OFFSET,
            Encoding::BlockwiseExpansion(_) => encoding_value::BLOCKWISE_EXPANSION,
        }
    }

    /// The C enumerator name of the encoding.
    pub fn c_name(&self) -> &'static str {
        match self {
            Encoding::Undefined => "QNN_QUANTIZATION_ENCODING_UNDEFINED",
            Encoding::ScaleOffset(_) => "QNN_QUANTIZATION_ENCODING_SCALE_OFFSET",
            Encoding::AxisScaleOffset { .. } => "QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET",
            Encoding::BlockwiseExpansion(_) => "QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION",
        }
    }

    /// Dequantize a whole row-major tensor of integer codes with shape `dims`.
    pub fn dequantize(&self, dims: &[u32], codes: &[i64]) -> Result<Vec<f32>, EncodingError> {
        let numel: usize = dims.iter().map(|&d| d as usize).product();
        if codes.len() != numel {
            return Err(EncodingError::CodeCount { expected: numel, found: codes.len() });
        }
        self.dequantize_each(dims, |i| codes[i])
    }

    /// Dequantize the row-major tensor of shape `dims` whose code at flat index `i` is
    /// `code(i)`; lets callers decode packed static bytes without an intermediate code vector.
    pub fn dequantize_each(&self, dims: &[u32], code: impl Fn(usize) -> i64) -> Result<Vec<f32>, EncodingError> {
        let numel: usize = dims.iter().map(|&d| d as usize).product();
        match self {
            Encoding::Undefined => Ok((0..numel).map(|i| code(i) as f32).collect()),
            Encoding::ScaleOffset(so) => Ok((0..numel).map(|i| so.dequantize(code(i))).collect()),
            Encoding::AxisScaleOffset { axis, scale_offsets } => {
                let (outer, channels, inner) = split_at_axis(dims, *axis as usize)?;
                check_len("scale_offsets", channels, scale_offsets.len())?;
                let mut out = Vec::with_capacity(numel);
                for o in 0..outer {
                    for (c, so) in scale_offsets.iter().enumerate() {
                        let base = (o * channels + c) * inner;
                        out.extend((base..base + inner).map(|i| so.dequantize(code(i))));
                    }
                }
                Ok(out)
            }
            Encoding::BlockwiseExpansion(bw) => dequantize_blockwise(bw, dims, code),
        }
    }

    /// Quantize a whole row-major tensor of reals to integer codes in `range`.
    /// Blockwise expansion is a weight-only encoding and cannot be produced by an op.
    pub fn quantize(&self, dims: &[u32], values: &[f32], range: (i64, i64)) -> Result<Vec<i64>, EncodingError> {
        match self {
            Encoding::Undefined => Err(EncodingError::NotQuantizable("UNDEFINED")),
            Encoding::BlockwiseExpansion(_) => Err(EncodingError::NotQuantizable("BLOCKWISE_EXPANSION")),
            Encoding::ScaleOffset(so) => Ok(values.iter().map(|&x| so.quantize(x, range)).collect()),
            Encoding::AxisScaleOffset { axis, scale_offsets } => {
                let (outer, channels, inner) = split_at_axis(dims, *axis as usize)?;
                check_len("scale_offsets", channels, scale_offsets.len())?;
                let mut out = Vec::with_capacity(values.len());
                for o in 0..outer {
                    for (c, so) in scale_offsets.iter().enumerate() {
                        let base = (o * channels + c) * inner;
                        out.extend(values[base..base + inner].iter().map(|&x| so.quantize(x, range)));
                    }
                }
                Ok(out)
            }
        }
    }
}

fn split_at_axis(dims: &[u32], axis: usize) -> Result<(usize, usize, usize), EncodingError> {
    if axis >= dims.len() {
        return Err(EncodingError::AxisOutOfRange { axis, rank: dims.len() });
    }
    let outer = dims[..axis].iter().map(|&d| d as usize).product();
    let inner = dims[axis + 1..].iter().map(|&d| d as usize).product();
    Ok((outer, dims[axis] as usize, inner))
}

fn check_len(what: &'static str, expected: usize, found: usize) -> Result<(), EncodingError> {
    if expected == found {
        Ok(())
    } else {
        Err(EncodingError::Length { what, expected, found })
    }
}

/// `w[.., i, o] = (q + offset_o) * scale2[o] * scale1[o][i / block]`, row-major codes.
/// `scale2 * scale1` is exact in f64 (24 + 16 mantissa bits), so each weight is rounded once.
fn dequantize_blockwise(
    bw: &BlockwiseExpansion,
    dims: &[u32],
    code: impl Fn(usize) -> i64,
) -> Result<Vec<f32>, EncodingError> {
    let rank = dims.len();
    let block_axis = bw.block_axis(rank).ok_or(EncodingError::BlockwiseLayout { axis: bw.axis, rank })?;
    let channel_axis = bw.axis as usize;
    let channels = dims[channel_axis] as usize;
    let inputs = dims[block_axis] as usize;
    let nb = bw.num_blocks_per_axis as usize;
    check_len("scale_offsets", channels, bw.scale_offsets.len())?;
    check_len("block_scales", channels * nb, bw.block_scales.len())?;
    if nb == 0 || !inputs.is_multiple_of(nb) {
        return Err(EncodingError::BlockCount { inputs, num_blocks: nb });
    }
    let block = inputs / nb;
    let numel: usize = dims.iter().map(|&d| d as usize).product();
    let combined =
        |o: usize, b: usize| f64::from(bw.scale_offsets[o].scale) * f64::from(bw.block_scales.get(o * nb + b));
    let offset = |o: usize| f64::from(bw.scale_offsets[o].offset);
    let mut out = Vec::with_capacity(numel);
    let others_are_one = dims.iter().enumerate().all(|(a, &d)| a == channel_axis || a == block_axis || d == 1);
    if others_are_one && channel_axis > block_axis {
        // [.., In, Out]: flat = i * Out + o; refresh the per-channel factors once per block.
        let mut row = vec![0f64; channels];
        for i in 0..inputs {
            if i % block == 0 {
                for (o, r) in row.iter_mut().enumerate() {
                    *r = combined(o, i / block);
                }
            }
            for (o, r) in row.iter().enumerate() {
                out.push((r * (code(i * channels + o) as f64 + offset(o))) as f32);
            }
        }
    } else if others_are_one {
        // [Out, In]: flat = o * In + i.
        for o in 0..channels {
            for b in 0..nb {
                let s = combined(o, b);
                for i in b * block..(b + 1) * block {
                    out.push((s * (code(o * inputs + i) as f64 + offset(o))) as f32);
                }
            }
        }
    } else {
        // Other axes repeat the pattern (the validator rejects this layout; kept total).
        let stride = |axis: usize| -> usize { dims[axis + 1..].iter().map(|&d| d as usize).product() };
        let (ch_stride, in_stride) = (stride(channel_axis), stride(block_axis));
        for flat in 0..numel {
            let o = (flat / ch_stride) % channels;
            let i = (flat / in_stride) % inputs;
            out.push((combined(o, i / block) * (code(flat) as f64 + offset(o))) as f32);
        }
    }
    Ok(out)
}

/// LPBQ parameters from real per-block scales `s[o][b]` (`[channels][num_blocks]`), as executorch
/// (`make_qnn_per_block_config`) and mllm (`scale2 = max/16`, `scale1 = clamp(round(s/scale2),
/// 1, 16)`) construct them (ExecuTorch backends/qualcomm/builders/node_visitor.py; mllm's QNNTensorWrapper::setBlockwiseQuantization):
/// `scale2[o] = max_b s[o][b] / 16`, `scale1[o][b] = clamp(round_half_even(s[o][b] / scale2[o]), 1, 16)`.
pub fn lpbq_from_block_scales(
    block_scales: &[f32],
    channels: usize,
    num_blocks: usize,
) -> Result<BlockwiseExpansionParts, EncodingError> {
    check_len("block_scales", channels * num_blocks, block_scales.len())?;
    let mut scale2 = Vec::with_capacity(channels);
    let mut scale1 = Vec::with_capacity(channels * num_blocks);
    for row in block_scales.chunks(num_blocks.max(1)).take(channels) {
        let max = row.iter().copied().fold(0f32, f32::max);
        if !(max.is_finite() && max > 0.0) {
            return Err(EncodingError::BadScale { what: "block scale maximum", value: max });
        }
        let m = max / 16.0;
        scale2.push(ScaleOffset { scale: m, offset: 0 });
        for &s in row {
            scale1.push((f64::from(s) / f64::from(m)).round_ties_even().clamp(1.0, 16.0) as u8);
        }
    }
    Ok(BlockwiseExpansionParts { scale2, scale1 })
}

/// The two scale arrays of an LPBQ encoding, before they are wrapped into [`BlockwiseExpansion`].
#[derive(Clone, Debug, PartialEq)]
pub struct BlockwiseExpansionParts {
    /// Per-channel `scaleOffsets` (offset 0).
    pub scale2: Vec<ScaleOffset>,
    /// `blocksScale8`, `[channel][block]`, values in 1..=16.
    pub scale1: Vec<u8>,
}

impl BlockwiseExpansionParts {
    /// Wrap into a `BLOCKWISE_EXPANSION` with 4-bit block scales in 8-bit storage.
    pub fn into_encoding(self, axis: u32, num_blocks_per_axis: u32) -> Encoding {
        Encoding::BlockwiseExpansion(BlockwiseExpansion {
            axis,
            scale_offsets: self.scale2.into(),
            num_blocks_per_axis,
            block_scale_bitwidth: 4,
            block_scales: BlockScales::U8(self.scale1.into()),
        })
    }
}

/// Errors from encoding arithmetic (the validator reports structural problems first).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum EncodingError {
    #[error("expected {expected} integer codes, found {found}")]
    CodeCount { expected: usize, found: usize },
    #[error("quantization axis {axis} is out of range for rank {rank}")]
    AxisOutOfRange { axis: usize, rank: usize },
    #[error("{what} has {found} entries, expected {expected}")]
    Length { what: &'static str, expected: usize, found: usize },
    #[error(
        "blockwise expansion with axis {axis} on a rank-{rank} tensor is not modelled \
         (expected HWIO [.., In, Out] with axis rank-1, or [Out, In] with axis 0)"
    )]
    BlockwiseLayout { axis: u32, rank: usize },
    #[error("{inputs} input channels cannot be split into {num_blocks} equal blocks")]
    BlockCount { inputs: usize, num_blocks: usize },
    #[error("cannot quantize to a tensor with {0} encoding")]
    NotQuantizable(&'static str),
    #[error("4-bit value {value} at index {index} is out of range")]
    Int4OutOfRange { index: usize, value: i32 },
    #[error("{what} must be finite and > 0, found {value}")]
    BadScale { what: &'static str, value: f32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enum_values_match_qnn_types_h() {
        assert_eq!(definition::DEFINED, 1);
        assert_eq!(definition::UNDEFINED, 0x7FFF_FFFF);
        assert_eq!(Encoding::Undefined.raw(), 0x7FFF_FFFF);
        assert_eq!(Encoding::scale_offset(1.0, 0).raw(), 0);
        assert_eq!(Encoding::AxisScaleOffset { axis: 0, scale_offsets: Arc::from(vec![]) }.raw(), 1);
        assert_eq!(encoding_value::BLOCKWISE_EXPANSION, 5);
        assert_eq!(block_scale_storage::STORAGE_8, 0);
    }

    #[test]
    fn offset_is_negated_zero_point() {
        let so = ScaleOffset::from_zero_point(0.5, 3);
        assert_eq!(so.offset, -3);
        assert_eq!(so.zero_point(), 3);
        // real = scale * (q + offset): q = 3 is real zero, q = 5 is 1.0.
        assert_eq!(so.dequantize(3), 0.0);
        assert_eq!(so.dequantize(5), 1.0);
        assert_eq!(so.quantize(1.0, (0, 255)), 5);
    }

    #[test]
    fn uint8_symmetric_kv_is_offset_minus_128() {
        let so = ScaleOffset::uint8_symmetric(0.25);
        assert_eq!(so.offset, -128);
        assert_eq!(so.dequantize(128), 0.0);
        assert_eq!(so.dequantize(0), -32.0);
        assert_eq!(so.dequantize(255), 31.75);
        assert_eq!(so.quantize(-100.0, (0, 255)), 0);
        assert_eq!(so.quantize(0.25, (0, 255)), 129);
    }

    #[test]
    fn uint16_mask_encoding_maps_65535_to_zero() {
        // executorch's attention mask: 65535 = attend (0.0), 0 = masked (-255.0), ExecuTorch examples/qualcomm/oss_scripts/llama.
        let so = ScaleOffset { scale: 255.0 / 65535.0, offset: -65535 };
        assert_eq!(so.dequantize(65535), 0.0);
        assert!((so.dequantize(0) + 255.0).abs() < 1e-4);
        assert_eq!(so.quantize(0.0, (0, 65535)), 65535);
        assert_eq!(so.quantize(-255.0, (0, 65535)), 0);
    }

    #[test]
    fn quantize_rounds_half_to_even_and_saturates() {
        let so = ScaleOffset { scale: 1.0, offset: 0 };
        assert_eq!(so.quantize(2.5, (0, 255)), 2);
        assert_eq!(so.quantize(3.5, (0, 255)), 4);
        assert_eq!(so.quantize(-0.5, (-8, 7)), 0);
        assert_eq!(so.quantize(-1.5, (-8, 7)), -2);
        assert_eq!(so.quantize(1e9, (0, 255)), 255);
        assert_eq!(so.quantize(f32::NEG_INFINITY, (0, 255)), 0);
    }

    #[test]
    fn axis_scale_offset_dequantizes_per_channel() {
        let enc = Encoding::AxisScaleOffset {
            axis: 1,
            scale_offsets: vec![ScaleOffset { scale: 1.0, offset: 0 }, ScaleOffset { scale: 0.5, offset: -2 }].into(),
        };
        // dims [2, 2, 1]: channel is the middle axis.
        let real = enc.dequantize(&[2, 2, 1], &[1, 4, 3, 6]).unwrap();
        assert_eq!(real, vec![1.0, 1.0, 3.0, 2.0]);
        let back = enc.quantize(&[2, 2, 1], &real, (0, 255)).unwrap();
        assert_eq!(back, vec![1, 4, 3, 6]);
    }

    fn hwio_lpbq() -> (Encoding, Vec<u32>) {
        // HWIO [1, 1, In = 4, Out = 2], block 2 -> 2 blocks per channel.
        let enc = Encoding::BlockwiseExpansion(BlockwiseExpansion {
            axis: 3,
            scale_offsets: vec![ScaleOffset { scale: 0.5, offset: 0 }, ScaleOffset { scale: 0.25, offset: 0 }].into(),
            num_blocks_per_axis: 2,
            block_scale_bitwidth: 4,
            // [Out][In/block]: o0 -> (1, 3), o1 -> (16, 2)
            block_scales: BlockScales::U8(vec![1u8, 3, 16, 2].into()),
        });
        (enc, vec![1, 1, 4, 2])
    }

    #[test]
    fn blockwise_dequantize_hwio_matches_hand_computation() {
        let (enc, dims) = hwio_lpbq();
        // Row-major [i][o]: codes q[i][o].
        let q = [1i64, -1, 2, -2, 3, 7, -7, -8];
        let real = enc.dequantize(&dims, &q).unwrap();
        // w[i,o] = q * scale2[o] * scale1[o][i/2]
        let expected = [
            1.0 * 0.5 * 1.0,    // i0 o0
            -0.25 * 16.0,       // i0 o1: q = -1
            2.0 * 0.5 * 1.0,    // i1 o0
            -2.0 * 0.25 * 16.0, // i1 o1
            3.0 * 0.5 * 3.0,    // i2 o0
            7.0 * 0.25 * 2.0,   // i2 o1
            -7.0 * 0.5 * 3.0,   // i3 o0
            -8.0 * 0.25 * 2.0,  // i3 o1
        ];
        assert_eq!(real, expected);
    }

    #[test]
    fn blockwise_dequantize_out_in_layout() {
        // [Out = 2, In = 4], axis 0, blocks along axis 1.
        let (Encoding::BlockwiseExpansion(mut bw), _) = hwio_lpbq() else { unreachable!() };
        bw.axis = 0;
        let enc = Encoding::BlockwiseExpansion(bw);
        let q = [1i64, 2, 3, -7, -1, -2, 7, -8];
        let real = enc.dequantize(&[2, 4], &q).unwrap();
        let expected = [
            0.5, 1.0, 4.5, -10.5, // o0: scale2 .5, scale1 (1,1,3,3)
            -4.0, -8.0, 3.5, -4.0, // o1: scale2 .25, scale1 (16,16,2,2)
        ];
        assert_eq!(real, expected);
    }

    #[test]
    fn blockwise_rejects_unmodelled_layout() {
        let (Encoding::BlockwiseExpansion(mut bw), _) = hwio_lpbq() else { unreachable!() };
        bw.axis = 1;
        let err = Encoding::BlockwiseExpansion(bw).dequantize(&[1, 2, 4, 1], &[0; 8]).unwrap_err();
        assert_eq!(err, EncodingError::BlockwiseLayout { axis: 1, rank: 4 });
    }

    #[test]
    fn lpbq_construction_follows_executorch_formula() {
        // Two channels, two blocks each.
        let s = [0.16f32, 0.04, 0.01, 0.32];
        let parts = lpbq_from_block_scales(&s, 2, 2).unwrap();
        assert_eq!(parts.scale2[0].scale, 0.16 / 16.0);
        assert_eq!(parts.scale2[1].scale, 0.32 / 16.0);
        assert!(parts.scale2.iter().all(|so| so.offset == 0));
        // 0.16/0.01 = 16, 0.04/0.01 = 4, 0.01/0.02 = 0.5 -> round to 0 -> clamp 1, 0.32/0.02 = 16
        assert_eq!(parts.scale1, vec![16, 4, 1, 16]);
        assert!(lpbq_from_block_scales(&[0.0, 0.0], 1, 2).is_err());
    }

    #[test]
    fn int4_storage_round_trips() {
        let values = [-8i8, -7, -1, 0, 1, 7, 3];
        for storage in [Int4Storage::LowNibble, Int4Storage::Int8Container, Int4Storage::Packed] {
            let bytes = storage.encode(&values, true).unwrap();
            let decoded = storage.decode(&bytes, values.len(), true);
            assert_eq!(decoded, values.iter().map(|&v| i64::from(v)).collect::<Vec<_>>(), "{storage:?}");
        }
        assert_eq!(Int4Storage::LowNibble.encode(&[-7, 7], true).unwrap(), vec![0x09, 0x07]);
        assert_eq!(Int4Storage::Int8Container.encode(&[-7, 7], true).unwrap(), vec![0xF9, 0x07]);
        // QnnTypes.h example: 10 and 4 pack into 0b0100_1010.
        assert_eq!(Int4Storage::Packed.encode(&[10, 4], false).unwrap(), vec![0b0100_1010]);
        assert_eq!(
            Int4Storage::LowNibble.encode(&[8], true),
            Err(EncodingError::Int4OutOfRange { index: 0, value: 8 })
        );
        // pymllm's low nibbles (-7 stored 0x09, 7 stored 0x07) give each layout's bytes directly.
        assert_eq!(&*Int4Storage::LowNibble.from_low_nibbles(&[0x09, 0x07, 0x08]), &[0x09, 0x07, 0x08]);
        assert_eq!(&*Int4Storage::Int8Container.from_low_nibbles(&[0x09, 0x07, 0x08]), &[0xF9, 0x07, 0xF8]);
        assert_eq!(&*Int4Storage::Packed.from_low_nibbles(&[0x09, 0x07, 0x08]), &[0x79, 0x08]);
        assert_eq!(Int4Storage::LowNibble.signed_weight_dtype(), DataType::SFixedPoint4);
        assert_eq!(Int4Storage::Int8Container.signed_weight_dtype(), DataType::SFixedPoint8);
    }
}
