//! RoPE tables as mllm's QNN models take them: `[1, L, head_dim]` sin/cos rows for positions `0..L`,
//! gathered by position id inside the graph. The inverse frequencies come from the config
//! (`mllm_dsl::config::hf::default_inv_freq`, `HfConfig::rope_inv_freq`).

/// `(sin, cos)` tables, each `[1, len, 2 * inv_freq.len()]` flattened: row `p` is
/// `f(p * inv_freq) ++ f(p * inv_freq)` (HF's `cat(freqs, freqs)`), computed in f32 as HF does.
pub fn sin_cos_tables(inv_freq: &[f32], len: usize) -> (Vec<f32>, Vec<f32>) {
    let half = inv_freq.len();
    let mut sin = vec![0.0; len * 2 * half];
    let mut cos = vec![0.0; len * 2 * half];
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
    (sin, cos)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::config::hf::default_inv_freq;

    #[test]
    fn tables_follow_hf_layout() {
        let inv = default_inv_freq(10_000.0, 4);
        assert_eq!(inv, vec![1.0, 0.01]);
        let (sin, cos) = sin_cos_tables(&inv, 3);
        // position 2: angles [2, 0.02, 2, 0.02]
        assert_eq!(&sin[8..12], &[2f32.sin(), 0.02f32.sin(), 2f32.sin(), 0.02f32.sin()]);
        assert_eq!(&cos[0..4], &[1.0; 4]);
    }
}
