//! ggml tensor types and their dequantization to f32, bit-exact with ggml's reference
//! dequantization (`dequantize_row_*` in ggml-quants.c; the `gguf` Python package does the same
//! arithmetic): every element is one f32 multiply (and one add for Q4_1) of the f16 block scale
//! converted to f32, in that order, without fused multiply-add.

use half::f16;

/// A tensor element type this reader can dequantize, with the ggml type id it is stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// The types [`GgmlType::from_id`] accepts, for error messages.
pub const SUPPORTED_TYPES: &str = "F32, F16, BF16, Q4_0, Q4_1, Q8_0";

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
            8 => GgmlType::Q8_0,
            30 => GgmlType::BF16,
            other => return Err(UnsupportedGgmlType { name: ggml_type_name(other) }),
        })
    }

    /// Elements per block (1 for the plain float types).
    pub fn block_len(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 => 32,
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
        }
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
