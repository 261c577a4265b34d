//! Batched products whose right operand is assembled from pieces that are never copied together:
//! an attention layer's `repeat_interleave(cat(past, new))` keys or values, read where they lie.
//!
//! The right operand `[batches, K, N]` is `parts` joined along K (values: past rows, then the new
//! rows) or along N (keys: past columns, then the new ones), and each source batch may serve
//! several consecutive output batches (GQA's repeat-interleave of KV heads). A K-joined product
//! is the sum of one product per part over the matching columns of the left operand; an N-joined
//! one writes each part's product into its own columns of the output.

use super::matmul::{product_into, Dims, LinearStrategy, MatView, MIN_PARALLEL_MACS};
use super::threads::current;
use super::KernelError;

/// The dim of each right matrix along which its parts are joined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinAxis {
    /// Rows (the contracted dim).
    K,
    /// Columns.
    N,
}

/// `repeat_interleave` over batch dims seen as `[outer, size, inner]` in the source: output batch
/// `(o, s * times + j, t)` reads source batch `(o, s, t)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchRepeat {
    pub outer: usize,
    pub size: usize,
    pub times: usize,
    pub inner: usize,
}

impl BatchRepeat {
    /// `batches` source batches, each used once.
    pub fn none(batches: usize) -> Self {
        BatchRepeat { outer: 1, size: batches, times: 1, inner: 1 }
    }

    fn source_batches(&self) -> usize {
        self.outer * self.size * self.inner
    }

    fn output_batches(&self) -> usize {
        self.source_batches() * self.times
    }

    fn source(&self, b: usize) -> usize {
        let t = b % self.inner;
        let rest = b / self.inner;
        let s = (rest % (self.size * self.times)) / self.times;
        let o = rest / (self.size * self.times);
        (o * self.size + s) * self.inner + t
    }
}

/// The right operand of [`matmul_parts`].
#[derive(Debug, Clone)]
pub struct RhsParts<'a> {
    /// Each part is `[source batches, rows, cols]` row-major, with its extent along `axis` (its
    /// other dim is the full N or K).
    pub parts: Vec<(&'a [f32], usize)>,
    pub axis: JoinAxis,
    pub k: usize,
    pub n: usize,
    pub batches: BatchRepeat,
}

/// `a[B, M, K] @ rhs[B, K, N] -> [B, M, N]` with `B = rhs.batches`' output batches.
pub fn matmul_parts(a: &[f32], m: usize, rhs: &RhsParts<'_>) -> Result<Vec<f32>, KernelError> {
    const OP: &str = "matmul_parts";
    let (k, n) = (rhs.k, rhs.n);
    let batches = rhs.batches.output_batches();
    super::shape::check_len(OP, "a", a, &[batches, m, k])?;
    let joined: usize = rhs.parts.iter().map(|p| p.1).sum();
    let full = match rhs.axis {
        JoinAxis::K => k,
        JoinAxis::N => n,
    };
    if joined != full || rhs.batches.times == 0 {
        return Err(KernelError::InvalidArgument {
            op: OP,
            reason: format!(
                "parts span {joined} along {:?} but the operand has {full} (repeat {:?})",
                rhs.axis, rhs.batches
            ),
        });
    }
    for &(data, extent) in &rhs.parts {
        let (rows, cols) = match rhs.axis {
            JoinAxis::K => (extent, n),
            JoinAxis::N => (k, extent),
        };
        super::shape::check_len(OP, "part", data, &[rhs.batches.source_batches(), rows, cols])?;
    }
    let mut out = vec![0.0f32; batches * m * n];
    if out.is_empty() {
        return Ok(out);
    }
    let ctx = current();
    let threads = ctx.for_work(batches * m * n * k, MIN_PARALLEL_MACS);
    // One output matrix; `threads` is how many threads its products may use.
    let one = |b: usize, dst: &mut [f32], threads: usize| {
        let src = rhs.batches.source(b);
        let mut offset = 0;
        for (i, &(data, extent)) in rhs.parts.iter().enumerate() {
            let (dims, dst, accumulate, lhs, part) = match rhs.axis {
                JoinAxis::K => (
                    Dims { m, n, k: extent },
                    &mut dst[..],
                    i > 0,
                    MatView::rows(a, b * m * k + offset, k),
                    MatView::row_major(data, src * extent * n, n),
                ),
                JoinAxis::N => (
                    Dims { m, n: extent, k },
                    &mut dst[offset..],
                    false,
                    MatView::row_major(a, b * m * k, k),
                    MatView::row_major(data, src * k * extent, extent),
                ),
            };
            product_into(&ctx, threads, LinearStrategy::Auto, dims, dst, n, accumulate, lhs, part);
            offset += extent;
        }
    };
    if threads > 1 && batches >= threads {
        ctx.for_each_chunk_mut(&mut out, m * n, |b, dst| one(b, dst, 1));
    } else {
        for (b, dst) in out.chunks_exact_mut(m * n).enumerate() {
            one(b, dst, threads);
        }
    }
    Ok(out)
}
