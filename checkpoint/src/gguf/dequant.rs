//! ggml tensor types and their dequantization to f32, bit-exact with ggml's reference
//! dequantization (`dequantize_row_*` in ggml-quants.c; the `gguf` Python package does the same
//! arithmetic): every element is one f32 multiply (and one add for Q4_1) of the f16 block scale
//! converted to f32, in that order, without fused multiply-add.

use half::f16;

/// A tensor element type this reader can dequantize, with the ggml type id it is stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types)] // ggml's own type names
pub enum GgmlType {
    F32,
    F16,
    BF16,
    /// Blocks of 32: f16 scale `d`, 16 bytes of 4-bit values `q`; `x = (q - 8) * d`.
    Q4_0,
    /// Blocks of 32: f16 scale `d`, f16 minimum `m`, 16 bytes of 4-bit values `q`; `x = q * d + m`.
    Q4_1,
    /// Blocks of 32: f16 scale `d`, 32 signed bytes `q`; `x = q * d`.
    Q8_0,
    /// Blocks of 32: f16 scale `d`, 32 fifth bits `qh` (u32), 16 bytes of low nibbles;
    /// `x = (q - 16) * d` with `q` the 5-bit value.
    Q5_0,
    /// Super-blocks of 256: f16 `d` and `dmin`, 12 bytes packing eight 6-bit scales and mins,
    /// 128 bytes of 4-bit values; sub-block `s` of 32: `x = (d * sc_s) * q - dmin * m_s`.
    Q4_K,
    /// Super-blocks of 256: 128 bytes of low nibbles, 64 bytes of high 2-bit pairs, 16 signed
    /// 8-bit scales, f16 `d`; `x = (d * sc) * (q - 32)` with `q` the 6-bit value.
    Q6_K,
}

/// The types [`GgmlType::from_id`] accepts, for error messages.
pub const SUPPORTED_TYPES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K";

/// A ggml tensor type this reader cannot dequantize (its name, or `type id N` when unknown).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}")]
pub struct UnsupportedGgmlType {
    pub name: String,
}

impl GgmlType {
    /// The type with ggml id `id` (`enum ggml_type`), or the type's name when this reader cannot
    /// dequantize it.
    pub fn from_id(id: u32) -> Result<Self, UnsupportedGgmlType> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            6 => GgmlType::Q5_0,
            8 => GgmlType::Q8_0,
            12 => GgmlType::Q4_K,
            14 => GgmlType::Q6_K,
            30 => GgmlType::BF16,
            other => return Err(UnsupportedGgmlType { name: ggml_type_name(other) }),
        })
    }

    /// Elements per block (1 for the plain float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0 => 32,
            GgmlType::Q4_K | GgmlType::Q6_K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q4_K => 2 + 2 + 12 + 128,
            GgmlType::Q6_K => 128 + 64 + 16 + 2,
        }
    }

    /// Bytes of `elements` values, or `None` when `elements` is not a whole number of blocks or
    /// the size overflows.
    pub fn bytes_for(self, elements: u64) -> Option<u64> {
        let block = self.block_len() as u64;
        if !elements.is_multiple_of(block) {
            return None;
        }
        (elements / block).checked_mul(self.block_bytes() as u64)
    }

    /// Dequantizes `bytes` (a whole number of blocks) into `out`, which must hold
    /// `bytes.len() / block_bytes * block_len` values.
    pub fn dequantize(self, bytes: &[u8], out: &mut [f32]) {
        let (bb, bl) = (self.block_bytes(), self.block_len());
        assert_eq!(bytes.len() % bb, 0, "dequantize: partial block");
        assert_eq!(bytes.len() / bb * bl, out.len(), "dequantize: output size");
        let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
        for (block, y) in bytes.chunks_exact(bb).zip(out.chunks_exact_mut(bl)) {
            match self {
                GgmlType::F32 => y[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]),
                GgmlType::F16 => y[0] = f16_at(block, 0),
                GgmlType::BF16 => y[0] = half::bf16::from_le_bytes([block[0], block[1]]).to_f32(),
                GgmlType::Q4_0 => {
                    let d = f16_at(block, 0);
                    for (j, &q) in block[2..].iter().enumerate() {
                        y[j] = ((q & 0x0F) as i32 - 8) as f32 * d;
                        y[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                    }
                }
                GgmlType::Q4_1 => {
                    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
                    for (j, &q) in block[4..].iter().enumerate() {
                        y[j] = (q & 0x0F) as f32 * d + m;
                        y[j + 16] = (q >> 4) as f32 * d + m;
                    }
                }
                GgmlType::Q8_0 => {
                    let d = f16_at(block, 0);
                    for (j, &q) in block[2..].iter().enumerate() {
                        y[j] = q as i8 as f32 * d;
                    }
                }
                GgmlType::Q5_0 => {
                    let d = f16_at(block, 0);
                    let qh = u32::from_le_bytes([block[2], block[3], block[4], block[5]]);
                    for (j, &q) in block[6..].iter().enumerate() {
                        // Bit j of qh is value j's fifth bit, bit j + 16 value (j + 16)'s.
                        let lo = ((q & 0x0F) as u32 | ((qh >> j) & 1) << 4) as i32 - 16;
                        let hi = ((q >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i32 - 16;
                        y[j] = lo as f32 * d;
                        y[j + 16] = hi as f32 * d;
                    }
                }
                GgmlType::Q4_K => {
                    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
                    let scales = &block[4..16];
                    let qs = &block[16..];
                    // 64 values per pass: sub-block 2p from the low nibbles of 32 bytes, 2p + 1
                    // from their high nibbles.
                    for (p, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                        let (sc0, m0) = k4_scale_min(2 * p, scales);
                        let (sc1, m1) = k4_scale_min(2 * p + 1, scales);
                        let (d0, dm0) = (d * sc0 as f32, dmin * m0 as f32);
                        let (d1, dm1) = (d * sc1 as f32, dmin * m1 as f32);
                        for (l, &b) in q.iter().enumerate() {
                            y[l] = d0 * (b & 0x0F) as f32 - dm0;
                            y[l + 32] = d1 * (b >> 4) as f32 - dm1;
                        }
                    }
                }
                GgmlType::Q6_K => {
                    let (ql, rest) = block.split_at(128);
                    let (qh, rest) = rest.split_at(64);
                    let (sc, d) = rest.split_at(16);
                    let d = f16_at(d, 0);
                    // Two halves of 128 values: 64 bytes of low nibbles, 32 of high pairs, 8 scales.
                    for half in 0..2 {
                        let (ql, qh, sc) = (&ql[64 * half..], &qh[32 * half..], &sc[8 * half..]);
                        let y = &mut y[128 * half..];
                        for l in 0..32 {
                            let is = l / 16;
                            let q = |low: u8, shift: u32| (low as i32 | (((qh[l] >> shift) & 3) as i32) << 4) - 32;
                            let qs =
                                [q(ql[l] & 0x0F, 0), q(ql[l + 32] & 0x0F, 2), q(ql[l] >> 4, 4), q(ql[l + 32] >> 4, 6)];
                            for (i, q) in qs.into_iter().enumerate() {
                                y[l + 32 * i] = d * sc[is + 2 * i] as i8 as f32 * q as f32;
                            }
                        }
                    }
                }
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::BF16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
            GgmlType::Q5_0 => "Q5_0",
            GgmlType::Q4_K => "Q4_K",
            GgmlType::Q6_K => "Q6_K",
        }
    }
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K super-block: 6 bits each, sub-blocks 0-3 in the
/// low 6 bits of bytes `j` and `j + 4`, sub-blocks 4-7 split between the nibbles of byte `j + 4` and
/// the top 2 bits of bytes `j - 4` and `j`.
fn k4_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// ggml's name for a type id, for error messages about types this reader does not dequantize.
fn ggml_type_name(id: u32) -> String {
    const NAMES: [&str; 31] = [
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
        "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16",
        "I32", "I64", "F64", "IQ1_M", "BF16",
    ];
    match NAMES.get(id as usize) {
        Some(name) => format!("{name} (id {id})"),
        None => format!("unknown id {id}"),
    }
}
