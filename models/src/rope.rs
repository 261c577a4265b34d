//! RoPE tables as mllm's QNN models take them: `[1, L, head_dim]` sin/cos rows for positions `0..L`,
//! gathered by position id inside the graph. The inverse frequencies come from the config
//! (`crate::hf::default_inv_freq`, `HfConfig::rope_inv_freq`).

/// Why the RoPE tables could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RopeTableError {
    #[error("RoPE tables of {len} positions x {width} values overflow the address space")]
    Overflow { len: usize, width: usize },
    #[error("cannot allocate the RoPE tables: {len} positions x {width} values ({bytes} bytes each)")]
    OutOfMemory { len: usize, width: usize, bytes: usize },
}

/// `(sin, cos)` tables, each `[1, len, 2 * inv_freq.len()]` flattened: row `p` is
/// `f(p * inv_freq) ++ f(p * inv_freq)` (HF's `cat(freqs, freqs)`), computed in f32 as HF does.
/// The size product is checked and the buffers reserved fallibly, so a huge `len` is an error,
/// never a wrapped size or an allocation abort.
pub fn sin_cos_tables(inv_freq: &[f32], len: usize) -> Result<(Vec<f32>, Vec<f32>), RopeTableError> {
    let half = inv_freq.len();
    let width = half.checked_mul(2).ok_or(RopeTableError::Overflow { len, width: usize::MAX })?;
    let total = len.checked_mul(width).ok_or(RopeTableError::Overflow { len, width })?;
    let bytes = total.checked_mul(size_of::<f32>()).ok_or(RopeTableError::Overflow { len, width })?;
    let zeros = || -> Result<Vec<f32>, RopeTableError> {
        let mut v = Vec::new();
        v.try_reserve_exact(total).map_err(|_| RopeTableError::OutOfMemory { len, width, bytes })?;
        v.resize(total, 0.0);
        Ok(v)
    };
    let (mut sin, mut cos) = (zeros()?, zeros()?);
    for p in 0..len {
        for (i, f) in inv_freq.iter().enumerate() {
            let angle = p as f32 * f;
            let row = p * 2 * half;
            let (s, c) = angle.sin_cos();
            sin[row + i] = s;
            sin[row + half + i] = s;
            cos[row + i] = c;
            cos[row + half + i] = c;
        }
    }
    Ok((sin, cos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::default_inv_freq;

    #[test]
    fn tables_follow_hf_layout() {
        let inv = default_inv_freq(10_000.0, 4);
        assert_eq!(inv, vec![1.0, 0.01]);
        let (sin, cos) = sin_cos_tables(&inv, 3).unwrap();
        // position 2: angles [2, 0.02, 2, 0.02]
        assert_eq!(&sin[8..12], &[2f32.sin(), 0.02f32.sin(), 2f32.sin(), 0.02f32.sin()]);
        assert_eq!(&cos[0..4], &[1.0; 4]);
    }

    /// `--context 2^62` once wrapped the size product to 0 (issue 14): now an error either way.
    #[test]
    fn huge_tables_are_errors_not_wraps_or_aborts() {
        let inv = default_inv_freq(10_000.0, 64);
        let err = sin_cos_tables(&inv, 1 << 62).unwrap_err();
        assert!(matches!(err, RopeTableError::Overflow { len, width: 64 } if len == 1 << 62), "{err}");
        let err = sin_cos_tables(&inv, 1 << 50).unwrap_err();
        assert!(matches!(err, RopeTableError::OutOfMemory { width: 64, .. }), "{err}");
        assert!(err.to_string().contains("cannot allocate the RoPE tables"), "{err}");
    }
}
