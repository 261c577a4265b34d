//! Masked attention over a joined KV cache in one pass per KV head
//! ([`mllm_dsl::fused::Fused::Attention`]).
//!
//! Written out, a decode step's attention is two products over the past ++ new keys and values
//! ([`super::matmul_parts`]), a QDQ point after each and the masked softmax between them
//! ([`super::masked_softmax`]): three parallel jobs and two serial stretches per layer, with
//! a dozen ops dispatched around them. Here each KV head's query rows go through all of it at
//! once, on the thread that took the head: the scores stay in its cache and the softmax runs
//! on every thread. Each step is the written-out step's own arithmetic (the same products per
//! head, the same quantizers, the same softmax row), so the values equal the ops' bit for bit.

use super::matmul::MIN_PARALLEL_MACS;
use super::matmul_parts::{check_parts, check_rhs, for_each_group, group_product, RhsParts};
use super::qdq_points::{fake_in_place, QdqPoints};
use super::softmax::{masked_row, MaskedSoftmaxConstants};
use super::threads::current;
use super::KernelError;

/// The points of [`attention`] in the model's order: the scores (`qk_matmul_output`), the five
/// of [`super::masked_softmax`], the output (`attn_value_matmul_output`).
pub type AttentionPoints<'a> = QdqPoints<'a, 7>;

/// `q7(softmax_masked(q0(q @ keys)) @ values)` for `q [B, S, D]` (B query heads of S rows),
/// `keys [B, D, T]` and `values [B, T, D]` given as parts ([`RhsParts`]; the same batch repeat,
/// keys joined along T's columns, values along T's rows), the masked softmax of
/// [`super::masked_softmax`] with the `mask [S, T]` and its constants in between: `[B, S, D]`.
pub fn attention(
    q: &[f32],
    s: usize,
    keys: &RhsParts<'_>,
    values: &RhsParts<'_>,
    mask: &[f32],
    c: MaskedSoftmaxConstants,
    points: &AttentionPoints<'_>,
) -> Result<Vec<f32>, KernelError> {
    const OP: &str = "attention";
    check_parts(OP, q, s, keys)?;
    let (d, t, batches) = (keys.k, keys.n, keys.batches.output_batches());
    let probabilities_fit = values.k == t && values.n == d && values.batches == keys.batches;
    if !probabilities_fit || mask.len() != s * t {
        return Err(KernelError::InvalidArgument {
            op: OP,
            reason: format!(
                "keys [{batches}, {d}, {t}] against values [{}, {}, {}] ({:?} and {:?}) and a mask of {} values \
                 (expected the values [{batches}, {t}, {d}] repeated alike, a mask [{s}, {t}])",
                values.batches.output_batches(),
                values.k,
                values.n,
                keys.batches,
                values.batches,
                mask.len()
            ),
        });
    }
    check_rhs(OP, values)?;
    let mut out = vec![0.0f32; batches * s * d];
    if out.is_empty() {
        return Ok(out);
    }
    let group = keys.group();
    let rows = group * s;
    let softmax_points = [points[1], points[2], points[3], points[4], points[5]];
    let ctx = current();
    let head = |g: usize, dst: &mut [f32], threads: usize| {
        // The head's values are read last: asked for now, they come in while the scores are made.
        let src = values.batches.source(g * group);
        for part in &values.parts {
            part.prefetch(src, part.extent, d);
        }
        // The scores, the probabilities and a softmax row, in one buffer.
        let mut scratch = vec![0.0f32; 2 * rows * t + t];
        let (scores, rest) = scratch.split_at_mut(rows * t);
        let (probabilities, w) = rest.split_at_mut(rows * t);
        group_product(&ctx, threads, &q[g * rows * d..(g + 1) * rows * d], s, keys, g, scores);
        mllm_dsl::simd::widest(
            #[inline(always)]
            || fake_in_place(points[0], scores),
        );
        // Row r of the group is row r % S of its head; S divides the rows before the group.
        for (r, (src, dst)) in scores.chunks_exact(t).zip(probabilities.chunks_exact_mut(t)).enumerate() {
            masked_row(src, &mask[(r % s) * t..(r % s + 1) * t], c, &softmax_points, w, dst);
        }
        group_product(&ctx, threads, probabilities, s, values, g, dst);
        mllm_dsl::simd::widest(
            #[inline(always)]
            || fake_in_place(points[6], dst),
        );
    };
    // The products are `matmul_parts`' (`B S T D` multiply-adds each), split as it splits them
    // where that changes how a product runs. A head here also runs its softmax, so heads go to
    // the threads from a quarter of the work `matmul_parts` splits at: SmolLM2-135M's 3 KV heads
    // at 160 positions (98 K multiply-adds a product) took 17 us a layer on one thread.
    for_each_group(&ctx, keys, &mut out, batches * s * t * d, MIN_PARALLEL_MACS / 4, head);
    Ok(out)
}
