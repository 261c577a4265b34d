//! Weight matrices packed for the linear kernels, kept in their checkpoint precision (bf16 or f32),
//! and the products and row gathers that read them.
//!
//! A [`PackedMatrix`] is the `[K, N]` (in features × out features) matrix of `y = x @ W`, cut into
//! panels of [`PANEL`] output columns: panel `p` holds rows `k = 0..K` of columns
//! `32p..32p + 32` one after the other, the last panel zero-padded. A matrix product then streams
//! each panel once, front to back, for any number of input rows — the layout a decode step (one
//! row, memory-bound) and a prefill chunk (many rows, compute-bound) both want.
//!
//! bf16 panels halve the bytes a decode step reads. Their values are widened to f32 in registers
//! (a bf16 is the upper half of an f32, so this is exact) and all arithmetic is f32. Inside a bf16
//! panel row, column `c < 16` sits at slot `2c` and column `16 + c` at slot `2c + 1`: one 64-byte
//! load then yields both halves with a shift and a mask (see [`super::packed_tile`]).
//!
//! A tied embedding (the table `[V, H]` that is also the LM head `[H, V]`) is one packed matrix:
//! its rows are the matrix's columns ([`PackedMatrix::gather_columns`]).
//!
//! LPBQ int4 weights stay 4-bit ([`Int4Panels`], built by [`super::Int4Packer`]): a panel row is 16
//! bytes, byte `j` holding column `j` in its low nibble and column `16 + j` in its high nibble;
//! each panel carries its `u8` block scales (`scale1`, one per block of `K` rows and column) and
//! the matrix its per-column `scale2`. The kernels widen the nibbles and apply `scale1` inside the
//! inner loop and `scale2` once per output ([`super::packed_int4`]).

use rayon::prelude::*;

use super::grid_int4::{self, Grid, GridRows};
use super::packed_int4::Int4Panels;
use super::packed_tile::{self, Isa, MAX_ROWS};
use super::read_ahead::{Policy, Spans, Successor};
use super::threads::{current, SendPtr, ThreadCtx};
use super::weight_memory::WeightBuf;
use super::KernelError;
use bytemuck::Zeroable;

/// Output columns per panel.
pub const PANEL: usize = 32;

/// Below this many multiply-adds a product stays on the calling thread.
const MIN_PARALLEL_MACS: usize = 1 << 17;

/// The most weight bytes one of a product's parallel items reads (see `product`).
const MAX_ITEM_BYTES: usize = 512 << 10;

/// Input rows per outer block: the block's rows of `x` stay in L2 while the panels stream past.
/// A multiple of every tile height, so blocks start on tile boundaries of the packed rows.
const ROW_BLOCK: usize = 10 * MAX_ROWS;

/// Element storage of the panels.
#[derive(Clone, PartialEq)]
pub enum PackedElems {
    /// bf16 bit patterns, in the slot order described in the module docs.
    Bf16(WeightBuf<u16>),
    /// f32 values, columns in natural order.
    F32(WeightBuf<f32>),
    /// LPBQ int4 codes with their block and channel scales.
    Int4(Int4Panels),
}

/// A `[K, N]` weight matrix in panels of [`PANEL`] columns (see the module docs).
#[derive(Clone, PartialEq)]
pub struct PackedMatrix {
    k: usize,
    n: usize,
    elems: PackedElems,
    /// The matrix multiplied after this one last time (see [`super::read_ahead`]).
    successor: Successor,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let dtype = match self.elems {
            PackedElems::Bf16(_) => "bf16",
            PackedElems::F32(_) => "f32",
            PackedElems::Int4(_) => "int4",
        };
        write!(f, "PackedMatrix({dtype}, K={}, N={})", self.k, self.n)
    }
}

/// Slot of column `c` (`0..PANEL`) inside a bf16 panel row.
#[inline]
pub(super) fn bf16_slot(c: usize) -> usize {
    if c < PANEL / 2 {
        2 * c
    } else {
        2 * (c - PANEL / 2) + 1
    }
}

#[inline]
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

impl PackedMatrix {
    /// Packs bf16 bit patterns stored as `[N, K]` rows (the layout of an HF linear weight
    /// `[out, in]` and of an embedding table `[vocab, hidden]`).
    pub fn from_rows_bf16(n: usize, k: usize, rows: &[u16]) -> Result<Self, KernelError> {
        check_rows("pack_bf16", n, k, rows.len())?;
        let elems = PackedElems::Bf16(pack(n, k, |c, kk| rows[c * k + kk], bf16_slot));
        Ok(PackedMatrix { k, n, elems, successor: Successor::default() })
    }

    /// Packs f32 values stored as `[N, K]` rows.
    pub fn from_rows_f32(n: usize, k: usize, rows: &[f32]) -> Result<Self, KernelError> {
        check_rows("pack_f32", n, k, rows.len())?;
        let elems = PackedElems::F32(pack(n, k, |c, kk| rows[c * k + kk], |c| c));
        Ok(PackedMatrix { k, n, elems, successor: Successor::default() })
    }

    /// A matrix of LPBQ int4 codes (see [`super::Int4Packer`]).
    pub(crate) fn from_int4(k: usize, n: usize, panels: Int4Panels) -> Self {
        PackedMatrix { k, n, elems: PackedElems::Int4(panels), successor: Successor::default() }
    }

    /// Rows of `x` this matrix multiplies (`K`, in features).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Output columns (`N`, out features).
    pub fn n(&self) -> usize {
        self.n
    }

    pub fn elems(&self) -> &PackedElems {
        &self.elems
    }

    /// Bytes held by the panels.
    pub fn bytes(&self) -> usize {
        match &self.elems {
            PackedElems::Bf16(v) => v.len() * 2,
            PackedElems::F32(v) => v.len() * 4,
            PackedElems::Int4(p) => p.bytes(),
        }
    }

    fn panels(&self) -> usize {
        self.n.div_ceil(PANEL)
    }

    /// The memory a product streams: the panels, and an int4 matrix's block scales.
    fn spans(&self) -> Spans {
        match &self.elems {
            PackedElems::Bf16(v) => Spans::of(&[bytemuck::cast_slice(v)]),
            PackedElems::F32(v) => Spans::of(&[bytemuck::cast_slice(v)]),
            PackedElems::Int4(p) => Spans::of(&p.streamed()),
        }
    }

    /// `W[kk, c]` as f32.
    #[inline]
    fn get(&self, kk: usize, c: usize) -> f32 {
        let base = ((c / PANEL) * self.k + kk) * PANEL;
        match &self.elems {
            PackedElems::Bf16(v) => bf16_to_f32(v[base + bf16_slot(c % PANEL)]),
            PackedElems::F32(v) => v[base + c % PANEL],
            PackedElems::Int4(p) => p.get(self.k, kk, c),
        }
    }

    /// `out[i, :] = W[:, ids[i]]`, i.e. rows of the `[N, K]` table this matrix was packed from
    /// (an embedding lookup). Ids must lie in `0..N`.
    pub fn gather_columns(&self, ids: &[i64]) -> Result<Vec<f32>, KernelError> {
        let mut out = Vec::with_capacity(ids.len() * self.k);
        for (position, &id) in ids.iter().enumerate() {
            let c = usize::try_from(id).ok().filter(|&c| c < self.n).ok_or(KernelError::IndexOutOfRange {
                op: "gather_columns",
                index: id,
                position,
                dim: 0,
                bound: self.n,
            })?;
            out.extend((0..self.k).map(|kk| self.get(kk, c)));
        }
        Ok(out)
    }

    /// The matrix as row-major f32 `[K, N]` (a HWIO 1×1 conv weight).
    pub fn to_kn_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.k * self.n];
        for (kk, row) in out.chunks_exact_mut(self.n.max(1)).enumerate() {
            for (c, o) in row.iter_mut().enumerate() {
                *o = self.get(kk, c);
            }
        }
        out
    }

    /// The matrix as row-major f32 `[N, K]` (the table it was packed from).
    pub fn to_nk_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.k * self.n];
        for (c, row) in out.chunks_exact_mut(self.k.max(1)).enumerate() {
            for (kk, o) in row.iter_mut().enumerate() {
                *o = self.get(kk, c);
            }
        }
        out
    }
}

fn check_rows(op: &'static str, n: usize, k: usize, len: usize) -> Result<(), KernelError> {
    super::shape::check_len_of(op, "rows", len, &[n, k])
}

/// Builds the panels: `value(c, kk)` reads source element (column `c`, row `kk`) and `slot(c)`
/// places column `c % PANEL` inside a panel row. Panels are filled in parallel.
fn pack<T: Copy + Zeroable + Send + Sync>(
    n: usize,
    k: usize,
    value: impl Fn(usize, usize) -> T + Sync,
    slot: impl Fn(usize) -> usize + Sync,
) -> WeightBuf<T> {
    let panels = n.div_ceil(PANEL);
    let mut out = WeightBuf::zeroed(panels * k * PANEL);
    if out.is_empty() {
        return out;
    }
    let fill = |p: usize, panel: &mut [T]| {
        for c in 0..PANEL.min(n - p * PANEL) {
            let s = slot(c);
            for kk in 0..k {
                panel[kk * PANEL + s] = value(p * PANEL + c, kk);
            }
        }
    };
    let ctx = current();
    ctx.install(|| out.par_chunks_mut(k * PANEL).enumerate().for_each(|(p, panel)| fill(p, panel)));
    out
}

/// `x[M, K] @ W[K, N] (+ bias[N])` with `W` packed, accumulating in f32.
pub fn linear_packed(x: &[f32], m: usize, w: &PackedMatrix, bias: Option<&[f32]>) -> Result<Vec<f32>, KernelError> {
    linear_packed_with(packed_tile::detect(), x, m, w, bias)
}

/// [`linear_packed`] for an `x` whose values lie on `grid` (a QDQ point's output): its rows times
/// an int4 matrix then run in integers ([`super::grid_int4`]) where this CPU can. Rows not on the
/// grid take the f32 tiles; both give the same sums up to f32 rounding order.
pub fn linear_packed_on_grid(
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    grid: Option<Grid>,
) -> Result<Vec<f32>, KernelError> {
    let coded = grid_rows(x, m, w, grid);
    product(packed_tile::detect(), x, m, w, bias, coded.as_ref().map_or(Coded::None, Coded::Grid))
}

/// The environment variable that keeps int4 products on the f32 tiles (`f32`), to compare them.
pub const INT4_TILE_ENV: &str = "MLLM_CPU_INT4_TILE";

/// Whether [`INT4_TILE_ENV`] allows the integer tile ([`crate::knobs`]).
fn integer_tile_allowed() -> bool {
    static ALLOWED: crate::knobs::Cached = crate::knobs::Cached::new();
    ALLOWED.get(&[true, false], || crate::knobs::var(INT4_TILE_ENV).is_none_or(|v| v != "f32"))
}

/// Whether [`linear_packed_on_grid`] runs this product in integers.
pub fn runs_on_grid(x: &[f32], m: usize, w: &PackedMatrix, grid: Option<Grid>) -> bool {
    grid_rows(x, m, w, grid).is_some()
}

/// `x` coded for the integer tile, when it applies: an int4 matrix with blocks of a multiple of 4
/// rows (at most [`grid_int4::MAX_BLOCK`]), a CPU with the tile's features, every value on `grid`,
/// and not [`INT4_TILE_ENV`]`=f32`.
fn grid_rows(x: &[f32], m: usize, w: &PackedMatrix, grid: Option<Grid>) -> Option<GridRows> {
    match (&w.elems, grid) {
        (PackedElems::Int4(p), Some(grid))
            if x.len() == m * w.k && integer_tile_allowed() && grid_int4::available() =>
        {
            GridRows::new(x, m, grid, p.block_size())
        }
        _ => None,
    }
}

/// [`linear_packed`] on an explicit instruction set (tests compare them; `isa` must be
/// available on this CPU, see [`available_isas`]).
pub fn linear_packed_with(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, KernelError> {
    product(isa, x, m, w, bias, Coded::None)
}

/// [`linear_packed`] with bf16 products when `w` is bf16: each row of `x` rounded to bf16 (to
/// nearest even) and multiplied exactly, the sums in f32 — on a CPU with AMX-BF16 the
/// `tdpbf16ps` tile runs prefill chunks ([`super::amx_bf16`]); on AMD's with AVX-512 BF16
/// `vdpbf16ps` ([`super::bf16_dot`]), twice the multiply rate of f32 products there; elsewhere
/// the rounded rows take the f32 tiles ([`Bf16Tile::detect`]). Other matrices take [`linear_packed`]. The
/// activations keep 8 significant bits instead of 24, so the result is not the float references'
/// (see `CpuBackend`'s `Bf16Products`).
pub fn linear_packed_bf16(
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, KernelError> {
    linear_packed_bf16_with(Bf16Tile::detect(), x, m, w, bias)
}

/// The environment variable that picks the tile of bf16 products, to compare them: `dot` (the
/// `vdpbf16ps` tile, AMX off) or `f32` (the rounded rows on the f32 tiles).
pub const BF16_TILE_ENV: &str = "MLLM_CPU_BF16_TILE";

/// The tile that runs bf16 products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Tile {
    /// AMX-BF16 `tdpbf16ps` for products of 8 rows or more with K a multiple of 32, `vdpbf16ps`
    /// for the others.
    Amx,
    /// AVX-512 BF16 `vdpbf16ps`.
    Dot,
    /// The rows rounded to bf16, multiplied on this instruction set's f32 tiles.
    Rounded(Isa),
}

impl Bf16Tile {
    /// Whether this CPU runs the tile.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Bf16Tile::Amx => super::amx_bf16::available(),
            #[cfg(target_arch = "x86_64")]
            Bf16Tile::Dot => super::bf16_dot::available(),
            Bf16Tile::Rounded(isa) => isa.available(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The tiles this CPU runs, fastest first.
    pub fn all_available() -> Vec<Bf16Tile> {
        let rounded = Isa::ALL.into_iter().map(Bf16Tile::Rounded);
        [Bf16Tile::Amx, Bf16Tile::Dot].into_iter().chain(rounded).filter(|t| t.available()).collect()
    }

    /// The fastest tile here, or the one [`BF16_TILE_ENV`] names (read once): AMX where the CPU
    /// has it; else `vdpbf16ps` on AMD, whose Zen 4 issues it at twice the multiply-adds of its
    /// one 512-bit FMA a cycle (`bench_linear`, 32 rows: 113 against 54 G/s on one core); else
    /// the rounded rows on the f32 tiles. Intel's server cores issue two FMAs a cycle, and with
    /// AMX withheld (an Emerald Rapids VM) `vdpbf16ps` ran at half their rate (41 against 80 G/s
    /// on one core; a decode row, memory-bound, the same).
    pub fn detect() -> Bf16Tile {
        static DETECTED: std::sync::OnceLock<Bf16Tile> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            let rounded = Bf16Tile::all_available().into_iter().find(|t| matches!(t, Bf16Tile::Rounded(_)));
            let rounded = rounded.unwrap_or(Bf16Tile::Rounded(Isa::Portable));
            let pick = |tile: Bf16Tile| Some(tile).filter(|t| t.available());
            let chosen = match std::env::var(BF16_TILE_ENV).as_deref() {
                Ok("dot") => pick(Bf16Tile::Dot),
                Ok("f32") => Some(rounded),
                _ => pick(Bf16Tile::Amx).or_else(|| pick(Bf16Tile::Dot).filter(|_| super::vendor::is_amd())),
            };
            chosen.unwrap_or(rounded)
        })
    }
}

/// [`linear_packed_bf16`] on an explicit tile (tests compare them; `tile` must be available, see
/// [`Bf16Tile::all_available`]).
pub fn linear_packed_bf16_with(
    tile: Bf16Tile,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
) -> Result<Vec<f32>, KernelError> {
    let isa = match tile {
        Bf16Tile::Rounded(isa) => isa,
        _ => Isa::Avx512,
    };
    if !matches!(w.elems, PackedElems::Bf16(_)) {
        return product(isa, x, m, w, bias, Coded::None);
    }
    super::shape::check_len("linear_packed", "x", x, &[m, w.k])?;
    if !tile.available() {
        let reason = format!("{tile:?} is not supported by this CPU");
        return Err(KernelError::InvalidArgument { op: "linear_packed", reason });
    }
    #[cfg(target_arch = "x86_64")]
    if matches!(tile, Bf16Tile::Amx | Bf16Tile::Dot) {
        let amx = tile == Bf16Tile::Amx && super::amx_bf16::applies(m.min(ROW_BLOCK), w.k);
        // AMX tiles read whole blocks of 16 rows.
        let pad = if amx { super::amx_bf16::TILE_ROWS } else { 0 };
        // SAFETY: the CPU has the instructions (checked above) and x holds m rows of K.
        let pairs = unsafe { super::bf16_dot::pairs(x, m, w.k, pad) };
        return product(isa, x, m, w, bias, Coded::Bf16Pairs { pairs: &pairs, amx });
    }
    let rounded: Vec<f32> = x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
    product(isa, &rounded, m, w, bias, Coded::None)
}

/// Rows of `x` in a second form some tiles read instead of the f32 values.
#[derive(Clone, Copy)]
enum Coded<'a> {
    /// Only the f32 rows.
    None,
    /// Coded on their grid for the integer tile ([`grid_rows`]).
    Grid(&'a GridRows),
    /// Rounded to bf16 in pairs for the `vdpbf16ps` tile of bf16 panels ([`super::bf16_dot::pairs`]),
    /// padded with 16 zero rows when `amx`: row blocks of 8 rows or more then take the AMX tile.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    Bf16Pairs { pairs: &'a [u32], amx: bool },
}

/// The product, reading `coded` where a tile for it applies.
fn product(
    isa: Isa,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    bias: Option<&[f32]>,
    coded: Coded<'_>,
) -> Result<Vec<f32>, KernelError> {
    check(isa, x, m, w, bias)?;
    let (k, n) = (w.k, w.n);
    if m * n == 0 {
        return Ok(Vec::new());
    }
    // Not zeroed first: the tiles write every element (a prefill chunk's outputs are hundreds of
    // KB, and zeroing them was a tenth of the product's time).
    let mut out: Vec<f32> = Vec::with_capacity(m * n);
    let ctx = current();
    let threads = ctx.for_work(m * n * k, MIN_PARALLEL_MACS);
    let job = Panels { isa, x, m, w, bias, coded, dst: SendPtr(out.as_mut_ptr()) };
    run_jobs(&ctx, threads, std::slice::from_ref(&job));
    // SAFETY: the capacity is m * n, and the panels 0..panels (columns 0..n) times the row
    // blocks (rows 0..m) above wrote every element once.
    unsafe { out.set_len(m * n) };
    Ok(out)
}

/// Several products of the same rows `x` (`[M, K]`) as one parallel job: `x @ W_j (+ bias_j)` for
/// each `(W_j, bias_j)` of `products`, every matrix of `K` rows. A decode step's linears that read
/// one input (a layer's q, k and v projections; gate and up) are each too short to be worth a job
/// of their own: the threads' start and finish, a couple of µs a job on a 2-core VM, was as long
/// as streaming a 576 × 192 int4 matrix, which ran on one thread. As one job they share both, and
/// the small matrices stream on every thread. Each result equals [`linear_packed_on_grid`]'s for
/// its matrix bit for bit (the same tiles over the same panels).
pub fn linears_packed_on_grid(
    x: &[f32],
    m: usize,
    products: &[(&PackedMatrix, Option<&[f32]>)],
    grid: Option<Grid>,
) -> Result<Vec<Vec<f32>>, KernelError> {
    let isa = packed_tile::detect();
    for &(w, bias) in products {
        check(isa, x, m, w, bias)?;
    }
    // The rows coded once per block size (the integer tile's coding depends on it).
    let mut coded: Vec<(usize, Option<GridRows>)> = Vec::new();
    for &(w, _) in products {
        if !coded.iter().any(|(block, _)| *block == block_size(w)) {
            coded.push((block_size(w), grid_rows(x, m, w, grid)));
        }
    }
    let coded_for = |w: &PackedMatrix| {
        let rows = coded.iter().find(|(block, _)| *block == block_size(w)).and_then(|(_, rows)| rows.as_ref());
        rows.map_or(Coded::None, Coded::Grid)
    };
    let mut outs: Vec<Vec<f32>> = products.iter().map(|(w, _)| Vec::with_capacity(m * w.n)).collect();
    let jobs: Vec<Panels<'_>> = products
        .iter()
        .zip(&mut outs)
        .map(|(&(w, bias), out)| Panels { isa, x, m, w, bias, coded: coded_for(w), dst: SendPtr(out.as_mut_ptr()) })
        .collect();
    let macs: usize = products.iter().map(|(w, _)| m * w.n * w.k).sum();
    let ctx = current();
    let threads = ctx.for_work(macs, MIN_PARALLEL_MACS);
    run_jobs(&ctx, threads, &jobs);
    drop(jobs);
    for (out, (w, _)) in outs.iter_mut().zip(products) {
        // SAFETY: the capacity is m * n, and the items above covered the panels 0..panels of
        // this matrix once, each writing its columns of every row.
        unsafe { out.set_len(m * w.n) };
    }
    Ok(outs)
}

/// Runs `jobs`, products of the same rows, as one parallel job on `threads` threads (serially on
/// one).
fn run_jobs(ctx: &ThreadCtx, threads: usize, jobs: &[Panels<'_>]) {
    let panels: usize = jobs.iter().map(|job| job.w.panels()).sum();
    if threads <= 1 || panels < 2 {
        jobs.iter().for_each(|job| job.run(0, job.w.panels()));
        return;
    }
    // Eight chunks per thread, so a thread slowed by other load is balanced out and the caller
    // waits less for the last chunk (alternating runs: prefill 268.7 vs 263.2 tok/s median
    // against four), and at most `MAX_ITEM_BYTES` of weights each: a thread that ran out of
    // chunks waits for the other's last one, and a sixteenth of a 78 MB `lm_head` (a decode row
    // reads it once) is 400 µs of streaming. Chunks are of one size across the matrices.
    let bytes: usize = jobs.iter().map(|job| job.w.spans().bytes()).sum();
    let chunks = (threads * 8).max(bytes.div_ceil(MAX_ITEM_BYTES));
    let chunk = panels.div_ceil(chunks).max(1);
    let chunks_of = |job: &Panels<'_>| job.w.panels().div_ceil(chunk);
    let items: usize = jobs.iter().map(chunks_of).sum();
    // Item `i` as (job, chunk): the first matrix's chunks split around the others'. The caller
    // takes items from the front and the helpers from the back, so each starts on the part of
    // the first matrix it read ahead while the job before ran (`Policy::OwnShare`: the caller
    // its start, a helper its end).
    let front = chunks_of(&jobs[0]).div_ceil(2);
    let item = |i: usize| -> (usize, usize) {
        let Some(mut i) = i.checked_sub(front) else { return (0, i) };
        for (j, job) in jobs.iter().enumerate().skip(1) {
            match i.checked_sub(chunks_of(job)) {
                Some(rest) => i = rest,
                None => return (j, i),
            }
        }
        (0, front + i)
    };
    // Every matrix joins the learnt order as it would alone; the job reads ahead what followed
    // the last one.
    let policy = Policy::current();
    let mut ahead = Spans::default();
    for job in jobs {
        ahead = job.w.successor.runs(job.w.spans(), policy.matrices_ahead());
    }
    let read_ahead = policy.plan(ahead);
    let run = |i: usize| {
        let (j, c) = item(i);
        jobs[j].run(c * chunk, jobs[j].w.panels().min((c + 1) * chunk));
    };
    ctx.for_each_index_then(items, run, read_ahead);
}

/// The block size of an int4 matrix (0 for float ones, which the integer tile does not read).
fn block_size(w: &PackedMatrix) -> usize {
    match &w.elems {
        PackedElems::Int4(p) => p.block_size(),
        _ => 0,
    }
}

/// The operands' shapes, and the instruction set on this CPU.
fn check(isa: Isa, x: &[f32], m: usize, w: &PackedMatrix, bias: Option<&[f32]>) -> Result<(), KernelError> {
    const OP: &str = "linear_packed";
    super::shape::check_len(OP, "x", x, &[m, w.k])?;
    if let Some(b) = bias {
        super::shape::check_len(OP, "bias", b, &[w.n])?;
    }
    if !isa.available() {
        return Err(KernelError::InvalidArgument { op: OP, reason: format!("{isa:?} is not supported by this CPU") });
    }
    Ok(())
}

/// One product's panels, run a range at a time by the threads of a job: each range writes its
/// own columns of every output row.
struct Panels<'a> {
    isa: Isa,
    x: &'a [f32],
    m: usize,
    w: &'a PackedMatrix,
    bias: Option<&'a [f32]>,
    coded: Coded<'a>,
    /// The `m * n` output, allocated and not initialized.
    dst: SendPtr<f32>,
}

// SAFETY: concurrent `run` calls write disjoint panels of `dst` and only read the rest.
unsafe impl Sync for Panels<'_> {}

impl Panels<'_> {
    /// Columns `[p0 * PANEL, p1 * PANEL)` of every output row.
    fn run(&self, p0: usize, p1: usize) {
        let Panels { isa, x, m, w, bias, coded, dst } = *self;
        let (k, n) = (w.k, w.n);
        for r0 in (0..m).step_by(ROW_BLOCK) {
            let rows = ROW_BLOCK.min(m - r0);
            for p in p0..p1 {
                let cols = PANEL.min(n - p * PANEL);
                // The panel's starting sums: its bias, else zeros shared by every panel (a
                // fresh zeroed array per panel was a memset call each).
                static ZEROS: [f32; PANEL] = [0.0; PANEL];
                let with_bias;
                let init = match bias {
                    Some(b) => {
                        let mut sums = [0.0f32; PANEL];
                        sums[..cols].copy_from_slice(&b[p * PANEL..p * PANEL + cols]);
                        with_bias = sums;
                        &with_bias
                    }
                    None => &ZEROS,
                };
                let panel = PanelRef::new(w, p);
                #[cfg(target_arch = "x86_64")]
                if let (Coded::Bf16Pairs { pairs, amx }, PanelRef::Bf16(b)) = (coded, panel) {
                    // SAFETY: `pairs` holds the m rows of x as pairs, made on a CPU with the
                    // tile's features, and 16 zero rows past them when `amx` (the AMX tile reads
                    // rows r0..r0+rows rounded up to 16, fewer than m+16); the tile writes rows
                    // r0..r0+rows, columns p*PANEL..p*PANEL+cols, and concurrent calls cover
                    // disjoint panels.
                    unsafe {
                        let c = dst.get().add(r0 * n + p * PANEL);
                        let x = pairs.as_ptr().add(r0 * k.div_ceil(2));
                        let next = match (p + 1 < p1).then(|| PanelRef::new(w, p + 1)) {
                            Some(PanelRef::Bf16(next)) => Some(next.as_ptr()),
                            _ => None,
                        };
                        if amx && super::amx_bf16::applies(rows, k) {
                            super::amx_bf16::panel_product(x, rows, k, b.as_ptr(), c, n, cols, init);
                        } else {
                            super::bf16_dot::panel_product(x, rows, k, b.as_ptr(), next, c, n, cols, init);
                        }
                    }
                    continue;
                }
                if let (Coded::Grid(coded), PanelRef::Int4(panel)) = (coded, panel) {
                    // SAFETY: `coded` holds the m rows of x, coded for this matrix's K and blocks
                    // on a CPU with the tile's features; the tile writes rows r0..r0+rows,
                    // columns p*PANEL..p*PANEL+cols, and concurrent calls cover disjoint panels.
                    unsafe {
                        let c = dst.get().add(r0 * n + p * PANEL);
                        grid_int4::panel_product(coded, r0, rows, panel, c, n, cols, init, (p1 - p) * k);
                    }
                    continue;
                }
                // SAFETY: rows r0..r0+rows of x exist (checked length m*k); the tile writes rows
                // r0..r0+rows, columns p*PANEL..p*PANEL+cols of the m*n output, and concurrent
                // calls cover disjoint panel ranges.
                unsafe {
                    packed_tile::panel_product(
                        isa,
                        x.as_ptr().add(r0 * k),
                        rows,
                        k,
                        panel,
                        dst.get().add(r0 * n + p * PANEL),
                        n,
                        cols,
                        init,
                    );
                }
            }
        }
    }
}

/// The instruction sets this CPU can run the packed kernels with, best first.
pub fn available_isas() -> Vec<Isa> {
    Isa::ALL.into_iter().filter(|i| i.available()).collect()
}

/// One panel's elements.
#[derive(Clone, Copy)]
pub(crate) enum PanelRef<'a> {
    Bf16(&'a [u16]),
    F32(&'a [f32]),
    Int4(super::packed_int4::Int4Panel<'a>),
}

impl<'a> PanelRef<'a> {
    fn new(w: &'a PackedMatrix, p: usize) -> Self {
        let len = w.k * PANEL;
        match &w.elems {
            PackedElems::Bf16(v) => PanelRef::Bf16(&v[p * len..(p + 1) * len]),
            PackedElems::F32(v) => PanelRef::F32(&v[p * len..(p + 1) * len]),
            PackedElems::Int4(v) => PanelRef::Int4(v.panel(w.k, p)),
        }
    }
}
