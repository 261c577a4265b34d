//! Batched products whose right operand is assembled from pieces that are never copied together:
//! an attention layer's `repeat_interleave(cat(past, new))` keys or values, read where they lie.
//!
//! The right operand `[batches, K, N]` is `parts` joined along K (values: past rows, then the new
//! rows) or along N (keys: past columns, then the new ones), and each source batch may serve
//! several consecutive output batches (GQA's repeat-interleave of KV heads). A K-joined product
//! is the sum of one product per part over the matching columns of the left operand; an N-joined
//! one writes each part's product into its own columns of the output.

use super::grid_int4::Grid;
use super::matmul::{
    few_rows_product_u8, product_into, Dims, FewRows, LinearStrategy, MatView, MIN_PARALLEL_MACS, SMALL_M,
};
use super::read_ahead::prefetch_bytes;
use super::threads::{current, ThreadCtx};
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

    pub(super) fn output_batches(&self) -> usize {
        self.source_batches() * self.times
    }

    pub(super) fn source(&self, b: usize) -> usize {
        let t = b % self.inner;
        let rest = b / self.inner;
        let s = (rest % (self.size * self.times)) / self.times;
        let o = rest / (self.size * self.times);
        (o * self.size + s) * self.inner + t
    }
}

/// One part of a right operand: `[source batches, rows, cols]` with its extent along the join
/// axis (its other dim is the full N or K); element `(b, r, c)` is
/// `data[b * batch_stride + r * row_stride + c]`.
#[derive(Debug, Clone, Copy)]
pub struct RhsPart<'a> {
    pub data: PartData<'a>,
    pub extent: usize,
    pub batch_stride: usize,
    pub row_stride: usize,
}

/// The elements of an [`RhsPart`].
#[derive(Debug, Clone, Copy)]
pub enum PartData<'a> {
    F32(&'a [f32]),
    /// 8-bit codes `u` of the values `(u - zero_point) * scale` (a KV cache kept as the codes its
    /// QDQ points define: a quarter of the bytes an attention product reads).
    U8 {
        codes: &'a [u8],
        grid: Grid,
    },
}

impl PartData<'_> {
    fn len(&self) -> usize {
        match self {
            PartData::F32(v) => v.len(),
            PartData::U8 { codes, .. } => codes.len(),
        }
    }
}

impl<'a> From<&'a [f32]> for PartData<'a> {
    fn from(v: &'a [f32]) -> Self {
        PartData::F32(v)
    }
}

/// `(u - zero_point) * scale`: the value a code stands for, in the same f32 operations as the
/// fake quantizer that produced it (`u - zero_point` is exact), so products over decoded codes
/// equal products over the stored values bit for bit.
#[inline(always)]
pub fn decode_u8(u: u8, grid: Grid) -> f32 {
    (f32::from(u) - grid.zero_point as f32) * grid.scale
}

thread_local! {
    /// Decoded `U8` part matrices, reused: one `[rows, cols]` matrix at a time.
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on source batch `src` of a `U8` part decoded into a dense `[rows, cols]` matrix:
/// the codes come from memory once, a quarter of the f32 bytes, and the product then reads the
/// decoded matrix from cache.
fn with_decoded<R>(
    codes: &[u8],
    grid: Grid,
    part: &RhsPart<'_>,
    src: usize,
    (rows, cols): (usize, usize),
    f: impl FnOnce(&[f32]) -> R,
) -> R {
    DECODED.with(|cell| {
        let mut buf = cell.take();
        buf.clear();
        buf.reserve(rows * cols);
        mllm_dsl::simd::widest(
            #[inline(always)]
            || {
                for r in 0..rows {
                    let at = src * part.batch_stride + r * part.row_stride;
                    buf.extend(codes[at..at + cols].iter().map(|&u| decode_u8(u, grid)));
                }
            },
        );
        let result = f(&buf);
        cell.replace(buf);
        result
    })
}

impl RhsPart<'_> {
    /// Asks for the `rows x cols` elements of source batch `src` in the L2 cache (a hint).
    pub(super) fn prefetch(&self, src: usize, rows: usize, cols: usize) {
        let (base, size) = match self.data {
            PartData::F32(v) => (v.as_ptr() as usize, std::mem::size_of::<f32>()),
            PartData::U8 { codes, .. } => (codes.as_ptr() as usize, 1),
        };
        for r in 0..rows {
            prefetch_bytes(base + (src * self.batch_stride + r * self.row_stride) * size, cols * size);
        }
    }
}

/// The right operand of [`matmul_parts`].
#[derive(Debug, Clone)]
pub struct RhsParts<'a> {
    pub parts: Vec<RhsPart<'a>>,
    pub axis: JoinAxis,
    pub k: usize,
    pub n: usize,
    pub batches: BatchRepeat,
}

impl<'a> RhsParts<'a> {
    /// Parts that are dense row-major `[source batches, rows, cols]`, given as (data, extent).
    pub fn dense(parts: &[(&'a [f32], usize)], axis: JoinAxis, k: usize, n: usize, batches: BatchRepeat) -> Self {
        let parts = parts
            .iter()
            .map(|&(data, extent)| {
                let (rows, cols) = part_dims(axis, extent, k, n);
                RhsPart { data: PartData::F32(data), extent, batch_stride: rows * cols, row_stride: cols }
            })
            .collect();
        RhsParts { parts, axis, k, n, batches }
    }
}

/// (rows, cols) of a part with `extent` along `axis` of a `[k, n]` operand.
fn part_dims(axis: JoinAxis, extent: usize, k: usize, n: usize) -> (usize, usize) {
    match axis {
        JoinAxis::K => (extent, n),
        JoinAxis::N => (k, extent),
    }
}

/// `a[B, M, K] @ rhs[B, K, N] -> [B, M, N]` with `B = rhs.batches`' output batches.
pub fn matmul_parts(a: &[f32], m: usize, rhs: &RhsParts<'_>) -> Result<Vec<f32>, KernelError> {
    check_parts("matmul_parts", a, m, rhs)?;
    let (k, n) = (rhs.k, rhs.n);
    let batches = rhs.batches.output_batches();
    let mut out = vec![0.0f32; batches * m * n];
    if out.is_empty() {
        return Ok(out);
    }
    let ctx = current();
    let group = rhs.group();
    let lhs = |g: usize| &a[g * group * m * k..(g + 1) * group * m * k];
    for_each_group(&ctx, rhs, &mut out, batches * m * n * k, MIN_PARALLEL_MACS, |g, dst, threads| {
        group_product(&ctx, threads, lhs(g), m, rhs, g, dst)
    });
    Ok(out)
}

/// Runs `f(g, dst, threads)` for each group `g` of `rhs` ([`RhsParts::group`]) on its equal
/// chunk `dst` of `out`, `threads` being how many threads its products may use, for products of
/// `work` multiply-adds in all: a group per thread from `per_group_from` multiply-adds on (a
/// group's products on one thread compute what they compute alone, whatever runs beside them),
/// except that with fewer groups than threads, from [`MIN_PARALLEL_MACS`] on, the groups run in
/// turn with every thread on each product.
pub(super) fn for_each_group(
    ctx: &ThreadCtx,
    rhs: &RhsParts<'_>,
    out: &mut [f32],
    work: usize,
    per_group_from: usize,
    f: impl Fn(usize, &mut [f32], usize) + Sync,
) {
    let chunk = out.len() / rhs.groups();
    let product_threads = ctx.for_work(work, MIN_PARALLEL_MACS);
    let per_group = rhs.groups() > 1 && ctx.for_work(work, per_group_from) > 1;
    if per_group && (product_threads == 1 || rhs.groups() >= product_threads) {
        ctx.for_each_chunk_mut(out, chunk, |g, dst| f(g, dst, 1));
    } else {
        for (g, dst) in out.chunks_exact_mut(chunk).enumerate() {
            f(g, dst, product_threads);
        }
    }
}

/// Checks that `a` is `[B, m, k]` for `rhs`' output batches and that every part lies inside its
/// data ([`check_rhs`]); `op` names the kernel in the error.
pub(super) fn check_parts(op: &'static str, a: &[f32], m: usize, rhs: &RhsParts<'_>) -> Result<(), KernelError> {
    super::shape::check_len(op, "a", a, &[rhs.batches.output_batches(), m, rhs.k])?;
    check_rhs(op, rhs)
}

/// Checks that the parts of `rhs` span its joined dim and each lies inside its data.
pub(super) fn check_rhs(op: &'static str, rhs: &RhsParts<'_>) -> Result<(), KernelError> {
    let (k, n) = (rhs.k, rhs.n);
    let joined: usize = rhs.parts.iter().map(|p| p.extent).sum();
    let full = match rhs.axis {
        JoinAxis::K => k,
        JoinAxis::N => n,
    };
    if joined != full || rhs.batches.times == 0 {
        return Err(KernelError::InvalidArgument {
            op,
            reason: format!(
                "parts span {joined} along {:?} but the operand has {full} (repeat {:?})",
                rhs.axis, rhs.batches
            ),
        });
    }
    let sources = rhs.batches.source_batches();
    for part in &rhs.parts {
        let (rows, cols) = part_dims(rhs.axis, part.extent, k, n);
        if part.row_stride == cols && part.batch_stride == rows * cols {
            super::shape::check_len_of(op, "part", part.data.len(), &[sources, rows, cols])?;
        } else if sources * rows * cols > 0 {
            let last = (sources - 1) * part.batch_stride + (rows - 1) * part.row_stride + cols;
            if part.row_stride < cols || part.batch_stride < rows * part.row_stride || last > part.data.len() {
                return Err(KernelError::InvalidArgument {
                    op,
                    reason: format!(
                        "a part of {sources} x {rows} x {cols} at strides ({}, {}) does not fit its {} values",
                        part.batch_stride,
                        part.row_stride,
                        part.data.len()
                    ),
                });
            }
        }
    }
    Ok(())
}

impl RhsParts<'_> {
    /// Output batches that read the same source matrix and lie next to each other (GQA's query
    /// heads of one KV head: a repeat with nothing inside it): one product of their stacked rows,
    /// which reads the source once instead of once per batch.
    pub(super) fn group(&self) -> usize {
        if self.batches.inner == 1 {
            self.batches.times
        } else {
            1
        }
    }

    /// How many such groups the output batches make.
    pub(super) fn groups(&self) -> usize {
        self.batches.output_batches() / self.group()
    }
}

/// Group `g`'s product ([`RhsParts::group`]): its `group * m` rows of `lhs` (`[group * m, k]`)
/// against its source matrix, into `dst` (`[group * m, n]`), on up to `threads` threads. The
/// shapes must have passed [`check_parts`].
pub(super) fn group_product(
    ctx: &ThreadCtx,
    threads: usize,
    lhs: &[f32],
    m: usize,
    rhs: &RhsParts<'_>,
    g: usize,
    dst: &mut [f32],
) {
    let (k, n) = (rhs.k, rhs.n);
    let rows = m * rhs.group();
    let src = rhs.batches.source(g * rhs.group());
    let mut offset = 0;
    for (i, p) in rhs.parts.iter().enumerate() {
        let extent = p.extent;
        // The left operand's first element: `rows` rows of stride `k`.
        let lhs_at = match rhs.axis {
            JoinAxis::K => offset,
            JoinAxis::N => 0,
        };
        let (dims, dst, accumulate, a) = match rhs.axis {
            JoinAxis::K => (Dims { m: rows, n, k: extent }, &mut dst[..], i > 0, MatView::rows(lhs, lhs_at, k)),
            JoinAxis::N => {
                (Dims { m: rows, n: extent, k }, &mut dst[offset..], false, MatView::row_major(lhs, lhs_at, k))
            }
        };
        match p.data {
            PartData::F32(data) => {
                let part = MatView::rows(data, src * p.batch_stride, p.row_stride);
                product_into(ctx, threads, LinearStrategy::Auto, dims, dst, n, accumulate, a, part);
            }
            PartData::U8 { codes, grid } => {
                // SAFETY: `dims.m` rows of `dims.k` from `lhs_at` (stride k) lie in `lhs` and
                // `dims.m` rows of `dims.n` (stride n) in `dst` by the shapes checked in
                // `check_parts`; the part's source batch `src`, `dims.k` rows of `dims.n` codes at
                // its row stride, was checked to lie in `codes`.
                let done = dims.m <= SMALL_M
                    && unsafe {
                        few_rows_product_u8(
                            FewRows {
                                m: dims.m,
                                n: dims.n,
                                k: dims.k,
                                dst: dst.as_mut_ptr(),
                                ldc: n,
                                accumulate,
                                lhs: lhs[lhs_at..].as_ptr(),
                                lda: k,
                                rhs: codes[src * p.batch_stride..].as_ptr(),
                                ldb: p.row_stride,
                            },
                            grid,
                        )
                    };
                if !done {
                    let (part_rows, part_cols) = part_dims(rhs.axis, extent, k, n);
                    with_decoded(codes, grid, p, src, (part_rows, part_cols), |decoded| {
                        let part = MatView::rows(decoded, 0, part_cols);
                        product_into(ctx, threads, LinearStrategy::Auto, dims, dst, n, accumulate, a, part);
                    });
                }
            }
        }
        offset += extent;
    }
}
