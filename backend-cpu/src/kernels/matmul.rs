//! Matrix products: batched `matmul` with numpy broadcasting and the `linear` layers, all on the
//! `gemm` crate.
//!
//! Weights are read in place through gemm's strides: `[K, N]` (HWIO 1x1-conv layout) and
//! `[N, K]` (PyTorch `nn.Linear` layout) cost no transpose copy. A bias is written into the output
//! first and gemm accumulates onto it, so it costs no extra pass.
//!
//! Threading (one level only). A single product either runs as one gemm call with
//! `Parallelism::Rayon(threads)` or as rayon tasks over contiguous column (N) chunks, each a
//! single-threaded gemm. gemm's matrix-vector path (M = 1, decode) is single-threaded, so for
//! M = 1 only the N split uses the second core; [`LinearStrategy::Auto`] picks whichever measured
//! faster (N split below 64 rows, gemm's threads from 64 rows). Batched products with at least as
//! many matrices as threads run one single-threaded gemm per matrix in parallel instead. Products
//! of up to four rows (decode attention) skip gemm (see `few_rows_product`).

use gemm::Parallelism;

use super::shape::{broadcast_shape_for, broadcast_strides, check_len, contiguous_strides, numel};
use super::threads::{current, SendPtr, ThreadCtx};
use super::KernelError;

/// Below this many multiply-adds a product stays on the calling thread.
pub(super) const MIN_PARALLEL_MACS: usize = 1 << 17;

/// Products with fewer rows than this (and more than one) are cut along K, see [`depth_block`].
const SMALL_M_LIMIT: usize = 64;

/// Depth of each K block for small-M products over a row-major right operand (measured best:
/// 32 below 16 rows, 48 from 16 rows).
const SMALL_M_DEPTH: [usize; 2] = [32, 48];

/// A right operand whose rows are at least this many floats apart counts as long-rowed.
const LONG_ROW: usize = 256;

/// Column chunks of the N split are multiples of this many floats (one 64-byte cache line).
const SPLIT_N_ALIGN: usize = 16;

/// How one matrix product is spread over the configured threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearStrategy {
    /// Pick per problem shape (see the module docs).
    Auto,
    /// One gemm call with `Parallelism::Rayon(threads)`.
    GemmThreads,
    /// Rayon tasks over contiguous N (column) chunks, each running a single-threaded gemm.
    SplitN,
}

/// Memory layout of a linear layer's weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightLayout {
    /// Row-major `[K, N]` (in features x out features), e.g. a HWIO 1x1 conv weight `[1,1,In,Out]`.
    KN,
    /// Row-major `[N, K]` (out features x in features), PyTorch `nn.Linear.weight`.
    NK,
}

/// `x[M, K] @ W[K, N] (+ bias[N])` with `W` row-major `[K, N]`.
pub fn linear_kn(
    x: &[f32],
    m: usize,
    k: usize,
    w_kn: &[f32],
    n: usize,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, KernelError> {
    linear_with(WeightLayout::KN, x, m, k, w_kn, n, bias, LinearStrategy::Auto)
}

/// `x[M, K] @ W[N, K]^T (+ bias[N])` with `W` row-major `[N, K]` (PyTorch layout), read through
/// strides without a transposed copy.
pub fn linear_nk(
    x: &[f32],
    m: usize,
    k: usize,
    w_nk: &[f32],
    n: usize,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, KernelError> {
    linear_with(WeightLayout::NK, x, m, k, w_nk, n, bias, LinearStrategy::Auto)
}

/// A linear layer with an explicit weight layout and threading strategy (the bench compares
/// strategies through this; model code should call [`linear_kn`] or [`linear_nk`]).
#[allow(clippy::too_many_arguments)]
pub fn linear_with(
    layout: WeightLayout,
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
    strategy: LinearStrategy,
) -> Result<Vec<f32>, KernelError> {
    const OP: &str = "linear";
    check_len(OP, "x", x, &[m, k])?;
    let (w_shape, rhs) = match layout {
        WeightLayout::KN => ([k, n], MatView { data: w, offset: 0, row_stride: n, col_stride: 1 }),
        WeightLayout::NK => ([n, k], MatView { data: w, offset: 0, row_stride: 1, col_stride: k }),
    };
    check_len(OP, "weight", w, &w_shape)?;
    let mut out = vec![0.0f32; m * n];
    let accumulate = match bias {
        Some(bias) => {
            check_len(OP, "bias", bias, &[n])?;
            if n > 0 {
                for row in out.chunks_exact_mut(n) {
                    row.copy_from_slice(bias);
                }
            }
            true
        }
        None => false,
    };
    let lhs = MatView { data: x, offset: 0, row_stride: k, col_stride: 1 };
    let ctx = current();
    let threads = ctx.for_work(m * n * k, MIN_PARALLEL_MACS);
    product_into(&ctx, threads, strategy, Dims { m, n, k }, &mut out, n, accumulate, lhs, rhs);
    Ok(out)
}

/// Batched matrix product `[.., M, K] x [.., K, N] -> [.., M, N]` with numpy broadcasting over the
/// leading (batch) dims, e.g. `[1, H, S, D] x [1, H, D, T]`. As in numpy, a 1-D left operand is a
/// row vector and a 1-D right operand a column vector, and that dim is dropped from the result.
pub fn matmul(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "matmul";
    check_len(OP, "a", a, a_shape)?;
    check_len(OP, "b", b, b_shape)?;
    for (operand, shape) in [("a", a_shape), ("b", b_shape)] {
        if shape.is_empty() {
            return Err(KernelError::RankTooLow { op: OP, operand, shape: shape.to_vec(), min_rank: 1 });
        }
    }
    let (a_batch, m, k_a) = match a_shape {
        [k] => (&a_shape[..0], 1, *k),
        [batch @ .., m, k] => (batch, *m, *k),
        [] => unreachable!("rank checked above"),
    };
    let (b_batch, k_b, n) = match b_shape {
        [k] => (&b_shape[..0], *k, 1),
        [batch @ .., k, n] => (batch, *k, *n),
        [] => unreachable!("rank checked above"),
    };
    if k_a != k_b {
        return Err(KernelError::InnerDimMismatch { op: OP, a: a_shape.to_vec(), b: b_shape.to_vec(), k_a, k_b });
    }
    let k = k_a;
    let out_batch = broadcast_shape_for(OP, a_batch, b_batch)?;
    let mut out_shape = out_batch.clone();
    if a_shape.len() >= 2 {
        out_shape.push(m);
    }
    if b_shape.len() >= 2 {
        out_shape.push(n);
    }
    let batches = numel(&out_batch);
    let mut out = vec![0.0f32; batches * m * n];
    if out.is_empty() {
        return Ok((out, out_shape));
    }

    let a_strides = broadcast_strides(a_batch, &out_batch);
    let b_strides = broadcast_strides(b_batch, &out_batch);
    let ctx = current();

    // A right operand shared by every batch, against a left operand with no broadcast batch dims,
    // is a single [B*M, K] x [K, N] product: one big gemm instead of B small ones.
    let b_shared = b_strides.iter().all(|&s| s == 0);
    let dense = contiguous_strides(&out_batch);
    let a_dense = (0..out_batch.len()).all(|d| out_batch[d] == 1 || a_strides[d] == dense[d]);
    if batches > 1 && b_shared && a_dense {
        let rows = batches * m;
        let threads = ctx.for_work(rows * n * k, MIN_PARALLEL_MACS);
        product_into(
            &ctx,
            threads,
            LinearStrategy::Auto,
            Dims { m: rows, n, k },
            &mut out,
            n,
            false,
            MatView::row_major(a, 0, k),
            MatView::row_major(b, 0, n),
        );
        return Ok((out, out_shape));
    }

    let batch_index = contiguous_strides(&out_batch);
    let offsets: Vec<(usize, usize)> = (0..batches)
        .map(|i| {
            let (mut a_off, mut b_off) = (0, 0);
            for (d, &step) in batch_index.iter().enumerate() {
                let idx = (i / step) % out_batch[d];
                a_off += idx * a_strides[d];
                b_off += idx * b_strides[d];
            }
            (a_off * m * k, b_off * k * n)
        })
        .collect();
    let dims = Dims { m, n, k };
    let threads = ctx.for_work(batches * m * n * k, MIN_PARALLEL_MACS);
    // Matrix `i` of the batch; `threads` is how many threads its product may use.
    let one = |i: usize, dst: &mut [f32], threads: usize| {
        let (a_off, b_off) = offsets[i];
        let (lhs, rhs) = (MatView::row_major(a, a_off, k), MatView::row_major(b, b_off, n));
        product_into(&ctx, threads, LinearStrategy::Auto, dims, dst, n, false, lhs, rhs);
    };
    if threads > 1 && batches >= threads {
        // Coarse level: one single-threaded gemm per matrix, matrices spread over the threads.
        ctx.for_each_chunk_mut(&mut out, m * n, |i, dst| one(i, dst, 1));
    } else {
        for (i, dst) in out.chunks_exact_mut(m * n).enumerate() {
            one(i, dst, threads);
        }
    }
    Ok((out, out_shape))
}

/// Sizes of one product `[M, K] x [K, N]`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

/// A read-only strided matrix inside a slice: element `(r, c)` is
/// `data[offset + r * row_stride + c * col_stride]`.
#[derive(Clone, Copy)]
pub(super) struct MatView<'a> {
    data: &'a [f32],
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl<'a> MatView<'a> {
    pub(super) fn row_major(data: &'a [f32], offset: usize, cols: usize) -> Self {
        MatView { data, offset, row_stride: cols, col_stride: 1 }
    }

    /// Rows of contiguous elements `row_stride` apart (a column range of a wider matrix).
    pub(super) fn rows(data: &'a [f32], offset: usize, row_stride: usize) -> Self {
        MatView { data, offset, row_stride, col_stride: 1 }
    }

    /// Asserts (internal invariant, established by the public shape checks) that a `rows x cols`
    /// view lies inside `data`, which makes the raw-pointer gemm call sound.
    fn assert_fits(&self, rows: usize, cols: usize) {
        if rows == 0 || cols == 0 {
            return;
        }
        let last = self.offset + (rows - 1) * self.row_stride + (cols - 1) * self.col_stride;
        assert!(last < self.data.len(), "matrix view exceeds its slice");
    }
}

/// Depth (K) of each gemm call. gemm does not repack the left operand when M is small, and then
/// walks a row-major right operand (`[K, N]`, long rows) down its columns with a stride of N floats
/// for the whole depth, which thrashes cache sets and the TLB (measured 5-10 GFLOP/s for
/// M = 2..48, K = 1024, N = 3072). Cutting K into blocks of [`SMALL_M_DEPTH`] rows, accumulating
/// into dst, keeps the touched rows of the weight resident (15-55 GFLOP/s on the same shapes).
/// M = 1 takes gemm's matrix-vector path and larger M is repacked by gemm, so both keep full depth.
fn depth_block(dims: Dims, rhs: &MatView<'_>) -> usize {
    let row_major_long_rows = rhs.col_stride == 1 && rhs.row_stride >= LONG_ROW;
    if (2..SMALL_M_LIMIT).contains(&dims.m) && row_major_long_rows {
        SMALL_M_DEPTH[usize::from(dims.m >= 16)]
    } else {
        dims.k.max(1)
    }
}

/// Which strategy `Auto` resolves to. gemm's matrix-vector path (M = 1) is single-threaded and
/// small-M products are cut into many shallow gemm calls (see [`depth_block`]) that would each
/// synchronise gemm's threads, so below [`SMALL_M_LIMIT`] rows the N split is used; from there on
/// gemm's own threading measured as fast or faster.
fn resolve(strategy: LinearStrategy, dims: Dims) -> LinearStrategy {
    match strategy {
        LinearStrategy::Auto if dims.m < SMALL_M_LIMIT => LinearStrategy::SplitN,
        LinearStrategy::Auto => LinearStrategy::GemmThreads,
        other => other,
    }
}

/// `dst[M, N] (+)= lhs[M, K] * rhs[K, N]` with `dst` contiguous row-major, using up to `threads`
/// threads of `ctx` (1 = the calling thread only).
#[allow(clippy::too_many_arguments)]
pub(super) fn product_into(
    ctx: &ThreadCtx,
    threads: usize,
    strategy: LinearStrategy,
    dims: Dims,
    dst: &mut [f32],
    ldc: usize,
    accumulate: bool,
    lhs: MatView<'_>,
    rhs: MatView<'_>,
) {
    let Dims { m, n, k } = dims;
    lhs.assert_fits(m, k);
    rhs.assert_fits(k, n);
    if m == 0 || n == 0 {
        return;
    }
    assert!(ldc >= n && dst.len() >= (m - 1) * ldc + n, "destination size");
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * ldc..r * ldc + n].fill(0.0);
            }
        }
        return;
    }
    // Shared with gemm's tasks: the operands are only read, borrowed for the whole call; each
    // task writes its own columns of `dst`.
    let lhs_ptr = SendPtr(lhs.data[lhs.offset..].as_ptr() as *mut f32);
    let rhs_ptr = SendPtr(rhs.data[rhs.offset..].as_ptr() as *mut f32);
    let dst_ptr = SendPtr(dst.as_mut_ptr());
    let rows_of_rows = lhs.col_stride == 1 && rhs.col_stride == 1;
    let k_block = depth_block(dims, &rhs);
    let call = |n0: usize, cols: usize, parallelism: Parallelism| {
        if m <= SMALL_M && rows_of_rows {
            // SAFETY: as for gemm below.
            unsafe {
                few_rows_product(FewRows {
                    m,
                    n: cols,
                    k,
                    dst: dst_ptr.get().add(n0),
                    ldc,
                    accumulate,
                    lhs: lhs_ptr.get(),
                    lda: lhs.row_stride,
                    rhs: rhs_ptr.get().add(n0),
                    ldb: rhs.row_stride,
                })
            };
            return;
        }
        let mut k0 = 0;
        while k0 < k {
            let depth = k_block.min(k - k0);
            // SAFETY: the views were checked to lie inside their slices, so rows k0..k0+depth and
            // columns n0..n0+cols are inside them; columns n0..n0+cols of dst (row stride ldc) are
            // inside `dst`, which is exclusively borrowed, and concurrent calls get disjoint
            // column ranges.
            unsafe {
                gemm::gemm(
                    m,
                    cols,
                    depth,
                    dst_ptr.get().add(n0),
                    1,
                    ldc as isize,
                    accumulate || k0 > 0,
                    lhs_ptr.get().add(k0 * lhs.col_stride),
                    lhs.col_stride as isize,
                    lhs.row_stride as isize,
                    rhs_ptr.get().add(k0 * rhs.row_stride + n0 * rhs.col_stride),
                    rhs.col_stride as isize,
                    rhs.row_stride as isize,
                    1.0,
                    1.0,
                    false,
                    false,
                    false,
                    parallelism,
                );
            }
            k0 += depth;
        }
    };
    if threads <= 1 {
        call(0, n, Parallelism::None);
        return;
    }
    match resolve(strategy, dims) {
        LinearStrategy::SplitN => {
            let chunk = n.div_ceil(threads).next_multiple_of(SPLIT_N_ALIGN).min(n);
            let chunks = n.div_ceil(chunk);
            ctx.for_each_index(chunks, |c| {
                let n0 = c * chunk;
                call(n0, chunk.min(n - n0), Parallelism::None);
            });
        }
        _ => ctx.install(|| call(0, n, Parallelism::Rayon(threads))),
    }
}

/// Products with at most this many rows of contiguous operands (decode-step attention: the query
/// rows of one KV head against its keys or values) skip gemm, whose packing and dispatch cost more
/// than the arithmetic there.
pub(super) const SMALL_M: usize = 4;

/// The operands of `dst[m, n] (+)= lhs[m, k] * rhs[k, n]` for the few-row products, built once
/// and handed down through their dispatch layers; `T` is the right operand's element (f32 values
/// or 8-bit codes).
///
/// # Safety
/// The functions taking it require: `lhs` has `m` rows of `k` (stride `lda`), `rhs` `k` rows of
/// `n` (stride `ldb`), `dst` `m` writable rows of `n` (stride `ldc`), all contiguous within a row
/// and `dst` not aliased.
#[derive(Clone, Copy)]
pub(super) struct FewRows<T> {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) dst: *mut f32,
    pub(super) ldc: usize,
    /// Add to `dst` rather than overwrite it.
    pub(super) accumulate: bool,
    pub(super) lhs: *const f32,
    pub(super) lda: usize,
    pub(super) rhs: *const T,
    pub(super) ldb: usize,
}

/// `dst[i, :] (+)= Σ_p lhs[i, p] * rhs[p, :]` for `i < m`: every operand is read front to back,
/// and `rhs` once for all `m` rows.
///
/// # Safety
/// See [`FewRows`].
unsafe fn few_rows_product(ops: FewRows<f32>) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return few_rows_avx512::product(ops);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            return few_rows_avx2(ops);
        }
    }
    few_rows_body(ops)
}

/// [`few_rows_product`]'s loop in plain Rust, compiled once per instruction set by the wrappers
/// below so the compiler vectorises the row update with the widest registers available. It
/// updates each output row in memory once per `p`.
#[inline(always)]
unsafe fn few_rows_body(ops: FewRows<f32>) {
    let FewRows { m, n, k, dst, ldc, accumulate, lhs, lda, rhs, ldb } = ops;
    for i in 0..m {
        let out = std::slice::from_raw_parts_mut(dst.add(i * ldc), n);
        if !accumulate {
            out.fill(0.0);
        }
        for p in 0..k {
            let s = *lhs.add(i * lda + p);
            let row = std::slice::from_raw_parts(rhs.add(p * ldb), n);
            for (o, &w) in out.iter_mut().zip(row) {
                *o += s * w;
            }
        }
    }
}

/// `dst[i, :] (+)= Σ_p lhs[i, p] * decode(rhs[p, :])` for `i < m`: [`few_rows_product`] with a
/// right operand of 8-bit codes standing for `(u - zero_point) * scale` (a KV cache kept as its
/// KV8 codes). Each code is decoded in registers as `decode_u8` computes it, so the result equals
/// the product over the decoded values bit for bit. Returns `false`, having done nothing, on CPUs
/// without AVX-512 BW and VL (the caller then decodes the operand first).
///
/// # Safety
/// See [`FewRows`], `rhs` holding `k` rows of `n` codes (stride `ldb`).
pub(super) unsafe fn few_rows_product_u8(ops: FewRows<u8>, grid: super::Grid) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
        {
            few_rows_avx512::product_u8(ops, grid);
            return true;
        }
    }
    let _ = (ops, grid);
    false
}

/// [`few_rows_product`] with the output held in registers: a tile of `M` rows and `V` vectors of
/// 16 columns (at most 16 accumulators) runs down all of K, loading each `rhs` vector once for
/// the `M` rows (the plain loop loads and stores an output vector per multiply-add, and reads
/// `rhs` once per row). The right operand's elements are f32 values or 8-bit codes ([`Load`]).
#[cfg(target_arch = "x86_64")]
mod few_rows_avx512 {
    use super::FewRows;
    use crate::kernels::prefetch_bytes;
    use std::arch::x86_64::*;

    /// How the tile reads 16 (or, masked, fewer) right-operand elements as f32 values.
    trait Load: Copy {
        type Elem: Copy;
        unsafe fn load(self, mask: u16, p: *const Self::Elem) -> __m512;
    }

    #[derive(Clone, Copy)]
    struct F32s;

    impl Load for F32s {
        type Elem = f32;
        #[inline(always)]
        unsafe fn load(self, mask: u16, p: *const f32) -> __m512 {
            _mm512_maskz_loadu_ps(mask, p)
        }
    }

    /// Codes decoded as `(u - zero_point) * scale`, the f32 operations of `decode_u8`.
    #[derive(Clone, Copy)]
    struct U8s {
        zero_point: __m512,
        scale: __m512,
    }

    impl Load for U8s {
        type Elem = u8;
        #[inline(always)]
        unsafe fn load(self, mask: u16, p: *const u8) -> __m512 {
            let codes = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(mask, p as *const i8));
            _mm512_mul_ps(_mm512_sub_ps(_mm512_cvtepi32_ps(codes), self.zero_point), self.scale)
        }
    }

    /// # Safety
    /// See [`FewRows`]; AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn product(ops: FewRows<f32>) {
        groups(ops, F32s);
    }

    /// # Safety
    /// See [`super::few_rows_product_u8`]; AVX-512 F, BW and VL.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn product_u8(ops: FewRows<u8>, grid: crate::kernels::Grid) {
        let load = U8s { zero_point: _mm512_set1_ps(grid.zero_point as f32), scale: _mm512_set1_ps(grid.scale) };
        groups(ops, load);
    }

    /// The rows in groups of at most four; each group is a [`FewRows`] of its own.
    #[inline(always)]
    unsafe fn groups<L: Load>(ops: FewRows<L::Elem>, load: L) {
        let mut i = 0;
        while i < ops.m {
            let rows = (ops.m - i).min(4);
            let group = FewRows { m: rows, dst: ops.dst.add(i * ops.ldc), lhs: ops.lhs.add(i * ops.lda), ..ops };
            match rows {
                1 => columns::<1, 8, L>(group, load),
                2 => columns::<2, 8, L>(group, load),
                3 => columns::<3, 5, L>(group, load),
                _ => columns::<4, 4, L>(group, load),
            }
            i += rows;
        }
    }

    /// All of `n`: tiles of `16 * V` columns, then the rest in one tile of 1, 2, 4 or `V`
    /// vectors (the last masked). Each tile walks all `k` rows of its columns, and in a decode
    /// step those rows come from DRAM: one walk for the rest, not one per 16 columns (a K cache
    /// of 160 positions was three walks on Qwen3-0.6B and six on SmolLM2's 3-row groups).
    #[inline(always)]
    unsafe fn columns<const M: usize, const V: usize, L: Load>(ops: FewRows<L::Elem>, load: L) {
        let n = ops.n;
        let mut c = 0;
        while n - c >= 16 * V {
            tile::<M, V, L>(c, 16 * V, ops, load);
            c += 16 * V;
        }
        let cols = n - c;
        match cols.div_ceil(16) {
            0 => {}
            1 => tile::<M, 1, L>(c, cols, ops, load),
            2 => tile::<M, 2, L>(c, cols, ops, load),
            3 | 4 if V > 4 => tile::<M, 4, L>(c, cols, ops, load),
            _ => tile::<M, V, L>(c, cols, ops, load),
        }
    }

    /// How many rows ahead [`tile`] prefetches the right operand: a head's whole part of a
    /// transposed K cache (head_dim rows) at once.
    const AHEAD: usize = 128;

    /// Columns `c..c + cols` (`cols <= 16 * V`) of the `M` rows (`ops.m` is `M`).
    #[inline(always)]
    unsafe fn tile<const M: usize, const V: usize, L: Load>(c: usize, cols: usize, ops: FewRows<L::Elem>, load: L) {
        let FewRows { k, dst, ldc, accumulate, lhs, lda, rhs, ldb, .. } = ops;
        let mut masks = [0u16; V];
        for (j, mask) in masks.iter_mut().enumerate() {
            let left = cols.saturating_sub(16 * j).min(16);
            *mask = if left == 16 { u16::MAX } else { (1u16 << left) - 1 };
        }
        let mut acc = [[_mm512_setzero_ps(); V]; M];
        // Rows of a transposed K cache lie a context apart, a stride the hardware prefetchers
        // do not follow, and a decode step finds them evicted by its weight streaming. The tile
        // asks for its part of the first `AHEAD` rows at once, then `AHEAD` rows on: many misses
        // in flight at the L2, where prefetching 16 rows ahead into L1 kept few (measured on
        // Qwen3-0.6B's decode: "MatMul (1 row)" 175 -> 129 ms over 128 steps, medians of 4-5;
        // 64 rows ahead into L1 172 ms, into L2 146 ms).
        let row_bytes = cols * std::mem::size_of::<L::Elem>();
        for p in 0..AHEAD.min(k) {
            prefetch_bytes(rhs.add(p * ldb + c) as usize, row_bytes);
        }
        for p in 0..k {
            let row = rhs.add(p * ldb + c);
            if p + AHEAD < k {
                prefetch_bytes(row.add(AHEAD * ldb) as usize, row_bytes);
            }
            let mut w = [_mm512_setzero_ps(); V];
            for (j, w) in w.iter_mut().enumerate() {
                *w = load.load(masks[j], row.add(16 * j));
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let s = _mm512_set1_ps(*lhs.add(i * lda + p));
                for (a, &w) in acc.iter_mut().zip(&w) {
                    *a = _mm512_fmadd_ps(s, w, *a);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            let out = dst.add(i * ldc + c);
            for (j, &a) in acc.iter().enumerate() {
                let o = out.add(16 * j);
                let a = if accumulate { _mm512_add_ps(a, _mm512_maskz_loadu_ps(masks[j], o)) } else { a };
                _mm512_mask_storeu_ps(o, masks[j], a);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn few_rows_avx2(ops: FewRows<f32>) {
    few_rows_body(ops)
}
