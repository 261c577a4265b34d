//! RMSNorm over the last dim with Hugging Face (Llama/Qwen) semantics:
//! `weight * (x * 1 / sqrt(mean(x^2) + eps))`.
//!
//! HF computes the variance in float32; so does this kernel, summing squares in f32 with eight
//! interleaved partial sums (see [`super::reduce`]) before dividing by the dim size. The multiply
//! order `(x * rsqrt) * weight` and `rsqrt = 1 / sqrt` follow torch's float32 evaluation.

use super::reduce::lane_sum;
use super::shape::check_len;
use super::threads::par_fill_rows;
use super::KernelError;

/// Below this many elements the calling thread does the work.
const MIN_PARALLEL_LEN: usize = 1 << 15;

/// RMSNorm of `x` over its last dim, scaled by `weight` (length = last dim).
pub fn rms_norm(x: &[f32], shape: &[usize], weight: &[f32], eps: f32) -> Result<Vec<f32>, KernelError> {
    const OP: &str = "rms_norm";
    check_len(OP, "x", x, shape)?;
    let Some(&hidden) = shape.last() else {
        return Err(KernelError::RankTooLow { op: OP, operand: "x", shape: shape.to_vec(), min_rank: 1 });
    };
    check_len(OP, "weight", weight, &[hidden])?;
    let mut out = vec![0.0f32; x.len()];
    par_fill_rows(&mut out, hidden, MIN_PARALLEL_LEN, |first, chunk| {
        // Compiled again for the widest vectors (the default target has only SSE2); the same
        // operations in the same order, so the same values.
        mllm_dsl::simd::widest(
            #[inline(always)]
            || {
                for (r, dst) in chunk.chunks_exact_mut(hidden).enumerate() {
                    let src = &x[(first + r) * hidden..(first + r + 1) * hidden];
                    let variance = lane_sum(src, |v| v * v) / hidden as f32;
                    let inv_rms = 1.0 / (variance + eps).sqrt();
                    for ((o, &v), &w) in dst.iter_mut().zip(src).zip(weight) {
                        *o = w * (v * inv_rms);
                    }
                }
            },
        )
    });
    Ok(out)
}
