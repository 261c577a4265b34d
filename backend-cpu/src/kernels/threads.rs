//! The parallelism knob: how many threads the kernels may use, and the threads they run on.
//!
//! [`set_num_threads`] fixes the count `n` for every later kernel call, so a bench can compare 1
//! against 2 threads. It builds two things of that size: a [`Team`] (the calling thread plus
//! `n - 1` helpers that stay awake between kernels), which runs the kernels' chunked loops
//! ([`ThreadCtx::for_each_index`]), and a rayon pool, for gemm's own multi-threaded calls
//! (`Parallelism::Rayon(n)`), packing at load time, and [`run_in_pool`], which runs a whole
//! forward on a pool thread. Kernels use a single level of parallelism: either chunks with
//! single-threaded gemm/loops inside, or one multi-threaded gemm call, never both. Small problems
//! stay on the calling thread.

use std::sync::{Arc, Mutex, PoisonError};

use rayon::ThreadPool;

use super::read_ahead::ReadAhead;
use super::team::Team;
use super::KernelError;
use std::mem::MaybeUninit;

/// The configured count and its pool.
#[derive(Clone)]
pub(crate) struct ThreadCtx {
    pub threads: usize,
    /// A rayon pool of exactly `threads` threads, one thread too, so that rayon iterators run
    /// through [`ThreadCtx::install`] never fall back to rayon's global pool (one thread a core).
    /// `None` only when no pool could be built.
    pool: Option<Arc<ThreadPool>>,
    /// `threads - 1` helpers that stay awake between kernels (see [`Team`]).
    team: Option<Arc<Team>>,
}

static CURRENT: Mutex<Option<ThreadCtx>> = Mutex::new(None);

/// Sets how many threads later kernel calls may use; `0` means the machine's available
/// parallelism, and more than that is capped to it with a warning on stderr (extra threads only
/// contend for the same cores, and `--threads 100000` would spawn without limit). Builds a
/// dedicated rayon pool of that size.
pub fn set_num_threads(threads: usize) -> Result<(), KernelError> {
    let ctx = build_ctx(threads)?;
    *CURRENT.lock().unwrap_or_else(PoisonError::into_inner) = Some(ctx);
    Ok(())
}

/// The number of threads kernels currently use (the machine's available parallelism until
/// [`set_num_threads`] is called).
pub fn num_threads() -> usize {
    current().threads
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn build_ctx(threads: usize) -> Result<ThreadCtx, KernelError> {
    let available = default_threads();
    let threads = match threads {
        0 => available,
        n if n > available => {
            eprintln!("warning: {n} threads requested, using the machine's {available}");
            available
        }
        n => n,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("mllm-kernels-{i}"))
        .build()
        .map_err(|e| KernelError::ThreadPool { threads, reason: e.to_string() })?;
    let pool = Some(Arc::new(pool));
    let team = if threads > 1 {
        let team = Team::new(threads - 1).map_err(|e| KernelError::ThreadPool { threads, reason: e.to_string() })?;
        Some(Arc::new(team))
    } else {
        None
    };
    Ok(ThreadCtx { threads, pool, team })
}

/// Runs `f` on a thread of the kernel pool (of one thread when single-threaded).
///
/// Kernels called inside split their work by work stealing from that thread: the caller starts on
/// its share at once and a sleeping helper joins when it wakes. Called from outside, every
/// parallel kernel is instead injected into the pool while the caller sleeps until it is done, a
/// round trip that wakes two sleeping threads (tens of microseconds on a VM), longer than most
/// element-wise ops of a decoder layer take. Run a prefill chunk's forward through this (its gemm
/// calls are rayon tasks); a decode step, whose kernels all run on the team, runs on the calling
/// thread instead (`CpuChunkModel::run_chunk`).
pub fn run_in_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    current().install(f)
}

/// The current configuration, created with the default count on first use (single-threaded if
/// the pool cannot be built).
pub(crate) fn current() -> ThreadCtx {
    let mut guard = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
    guard.get_or_insert_with(|| build_ctx(0).unwrap_or(ThreadCtx { threads: 1, pool: None, team: None })).clone()
}

/// The configuration when `work` units are worth splitting over more than one thread (at least
/// `min_work` of them), else `None` without reading it: most kernels of a decode step are that
/// small, and reading the configuration locks a mutex and counts two references (perf put
/// [`current`] at 2 % of a SmolLM2 decode step's leader, called by every QDQ point).
pub(crate) fn parallel_ctx(work: usize, min_work: usize) -> Option<ThreadCtx> {
    if work < min_work {
        return None;
    }
    let ctx = current();
    (ctx.threads > 1).then_some(ctx)
}

impl ThreadCtx {
    /// Threads worth using for `work` units when parallelism only pays from `min_work` units.
    pub fn for_work(&self, work: usize, min_work: usize) -> usize {
        if work < min_work {
            1
        } else {
            self.threads
        }
    }

    /// Runs `f(i)` for every `i` in `0..items` on the team and the calling thread (inline when
    /// single-threaded). For the short loops of a forward pass; see [`Team`].
    pub fn for_each_index(&self, items: usize, f: impl Fn(usize) + Sync) {
        match &self.team {
            Some(team) => team.run(items, f),
            None => (0..items).for_each(f),
        }
    }

    /// [`ThreadCtx::for_each_index`], the helpers then reading `read_ahead` into the caches while
    /// the calling thread goes on (see [`super::read_ahead`]).
    pub(crate) fn for_each_index_then(&self, items: usize, f: impl Fn(usize) + Sync, read_ahead: ReadAhead) {
        match &self.team {
            Some(team) => team.run_then(items, f, read_ahead),
            None => (0..items).for_each(f),
        }
    }

    /// Runs `f(i, chunk)` for the `i`-th chunk of `chunk_len` elements of `out` (the last may be
    /// shorter), in parallel like [`ThreadCtx::for_each_index`].
    pub fn for_each_chunk_mut<T: Send>(&self, out: &mut [T], chunk_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let (len, chunk_len) = (out.len(), chunk_len.max(1));
        let base = SendPtr(out.as_mut_ptr());
        self.for_each_index(len.div_ceil(chunk_len), |i| {
            let start = i * chunk_len;
            let n = chunk_len.min(len - start);
            // SAFETY: chunk i covers [start, start + n) of `out`, disjoint from every other
            // chunk, and each index runs exactly once while `out` is borrowed by this call.
            let chunk = unsafe { std::slice::from_raw_parts_mut(base.get().add(start), n) };
            f(i, chunk)
        });
    }

    /// Runs `f` inside the dedicated pool (directly only if none could be built), so rayon
    /// iterators and gemm's own rayon tasks in `f` use exactly the configured threads.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// A raw pointer that parallel tasks may share: the base of a buffer they write in disjoint
/// parts, or of data borrowed for the whole call that they only read. Soundness is argued at
/// each use.
pub(crate) struct SendPtr<T>(pub(crate) *mut T);

impl<T> Clone for SendPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for SendPtr<T> {}

// SAFETY: see the type docs; every use states why its accesses do not race.
unsafe impl<T: Send> Send for SendPtr<T> {}
unsafe impl<T: Send> Sync for SendPtr<T> {}

impl<T> SendPtr<T> {
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

/// Fills `out` by calling `fill(start, chunk)` on contiguous chunks, in parallel over the pool when
/// `out` has at least `min_len` elements and more than one thread is configured.
pub(crate) fn par_fill(out: &mut [f32], min_len: usize, fill: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let Some(ctx) = parallel_ctx(out.len(), min_len) else {
        fill(0, out);
        return;
    };
    let chunk = fill_chunk(out.len(), ctx.threads);
    ctx.for_each_chunk_mut(out, chunk, |i, c| fill(i * chunk, c));
}

/// Elements per chunk of a parallel fill: a few chunks per thread balance uneven progress, and
/// multiples of 64 keep chunks cache-aligned.
fn fill_chunk(len: usize, threads: usize) -> usize {
    len.div_ceil(threads * 4).next_multiple_of(64)
}

/// `len` elements of fresh memory (not zeroed first) filled by `fill`, or `fill`'s error.
///
/// # Safety
/// When `fill` returns `Ok`, it has written every element of the slice it was given.
pub(crate) unsafe fn try_fill_new<E>(
    len: usize,
    fill: impl FnOnce(&mut [MaybeUninit<f32>]) -> Result<(), E>,
) -> Result<Vec<f32>, E> {
    let mut out: Vec<f32> = Vec::with_capacity(len);
    fill(&mut out.spare_capacity_mut()[..len])?;
    // SAFETY: the capacity is `len` and `fill` wrote all of it (the caller's contract).
    unsafe { out.set_len(len) };
    Ok(out)
}

/// [`par_fill`] into fresh memory (not zeroed first): `len` elements, `fill(start, chunk)`
/// filling the chunk of elements `start..start + chunk.len()`.
///
/// # Safety
/// `fill` writes every element of the chunk it is given.
pub(crate) unsafe fn par_fill_new(
    len: usize,
    min_len: usize,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    let all = |spare: &mut [MaybeUninit<f32>]| {
        match parallel_ctx(len, min_len) {
            None => fill(0, spare),
            Some(ctx) => {
                let chunk = fill_chunk(len, ctx.threads);
                ctx.for_each_chunk_mut(spare, chunk, |i, c| fill(i * chunk, c));
            }
        }
        Ok::<(), std::convert::Infallible>(())
    };
    // SAFETY: the chunks above cover 0..len and `fill` writes each whole (the caller's contract).
    match unsafe { try_fill_new(len, all) } {
        Ok(out) => out,
        Err(never) => match never {},
    }
}

/// `f(i, block)` for the `i`-th block of `block_len` elements of `out` (the last may be shorter):
/// on the team ([`ThreadCtx::for_each_chunk_mut`]) when `out` has at least `min_len` elements,
/// else one block after another on the calling thread. The same blocks either way, so a kernel
/// whose blocks hold intermediates sized for L1 keeps them so.
pub(crate) fn for_blocks<T: Send>(out: &mut [T], block_len: usize, min_len: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    match parallel_ctx(out.len(), min_len) {
        None => out.chunks_mut(block_len.max(1)).enumerate().for_each(|(i, block)| f(i, block)),
        Some(ctx) => ctx.for_each_chunk_mut(out, block_len, f),
    }
}

/// Like [`par_fill`] but chunks hold whole rows of `row_len` elements: `fill(first_row, chunk)`.
/// For kernels whose rows are independent (softmax, norms, reductions).
pub(crate) fn par_fill_rows(
    out: &mut [f32],
    row_len: usize,
    min_len: usize,
    fill: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    if row_len == 0 || out.is_empty() {
        return;
    }
    let rows = out.len() / row_len;
    let ctx = match parallel_ctx(out.len(), min_len) {
        Some(ctx) if rows >= 2 => ctx,
        _ => {
            fill(0, out);
            return;
        }
    };
    let rows_per_chunk = rows.div_ceil(ctx.threads * 4);
    ctx.for_each_chunk_mut(out, rows_per_chunk * row_len, |i, c| fill(i * rows_per_chunk, c));
}
