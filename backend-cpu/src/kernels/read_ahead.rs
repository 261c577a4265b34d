//! Read-ahead of the next weight matrices while a decode step does serial work.
//!
//! A decode step alternates linears, which stream their weights with every thread, and serial
//! stretches (norms, QDQ points, attention, the glue between ops) in which one thread works and
//! the memory bus idles. Between two linears the team helper has nothing to do, so it prefetches
//! the matrices that come next into the caches: the next linears then find part of their weights
//! there instead of in DRAM.
//!
//! Where the helper puts what it reads is a [`Policy`]. The default reads the *end* of the next
//! matrix, its own share, into the helper's own L2 (last line first), and the helper then
//! multiplies that share itself, taking the product's items from the back while the caller takes
//! them from the front: on the Intel Xeon VMs measured, a line another core fetched comes no
//! faster than from DRAM (`scripts/cross-core-read.c`: one reader of 2-32 MiB the other core had
//! touched, 8-21 GB/s against 10-17 cold, run to run), and on a Zen 4 VM, whose L3 holds what a
//! core's L2 evicts and serves every core, reading the next matrices from their start for the
//! caller to find in L3 ([`Policy::Shared`]) decoded no faster than no read-ahead at all.
//!
//! The calling thread reads ahead too, in the one gap it has: once it runs out of a product's
//! items it waits for the helpers' last ones, and meanwhile it reads the *start* of the next
//! matrix, where its own items there begin, into its L2 ([`ReadAhead::caller`]). SmolLM2-135M
//! int4 decode on a 2-core Xeon VM (AMX, AVX512-FP16), `bench_cpu --with-env`, 8 rounds: 1-row
//! linears 2.79 against 2.94 ms a step with the caller spinning idle, decode 1.07x (higher in 6
//! of 8 rounds); Qwen3-0.6B shapes, whose items are longer than such waits, unchanged (6 rounds).
//!
//! Which matrices come next is learnt, not declared: a decode step runs the same linears in the
//! same order every time, so each matrix remembers ([`Successor`]) the one that ran after it on
//! the calling thread, and a product hands the memory ([`Spans`]) of the few that followed it
//! last time to the helper with its job. A wrong guess costs bandwidth, never correctness:
//! prefetch instructions only hint the caches and never fault, even on memory freed since.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Bytes per prefetch instruction (a cache line).
const LINE: usize = 64;

/// Byte ranges of at most this many matrices (two each: panels and scales) in one read-ahead.
const MAX_MATRICES: usize = 4;

/// How far ahead a read-ahead reaches along the learnt order (a larger matrix is cut there): a
/// long gap (a layer's attention, before a 1 MiB `o_proj`) runs on into the matrices after the
/// next, and a quarter of a 32 MiB L3 leaves the rest of the step's working set in place.
/// Measured on Qwen3-0.6B shapes (1-row linear time per step against no read-ahead): next matrix
/// only −4 %, 4 MiB −6 %, 8 MiB (4 matrices) −11 %, 8 matrices up to 16 or 32 MiB no better.
const BUDGET: usize = 8 << 20;

/// How much of the next matrix's end a helper reads into its own L2 ([`Policy::OwnShare`]): a
/// quarter of the 2 MiB L2 of the Xeon measured. Per Qwen3-0.6B decode step, 1-row linear time
/// against the shared read-ahead, 8 alternating rounds: 16.6-19.6 ms against 18.1-20.2 ms with
/// 512 KiB; 1 MiB and 2 MiB gained less, 256 KiB no more.
const OWN_SHARE_BUDGET: usize = 512 << 10;

/// How much of the next matrix's start the calling thread reads into its own L2 while it waits
/// for the helpers' last items ([`ReadAhead::caller`]): more than such a wait covers.
const CALLER_BUDGET: usize = 64 << 10;

/// Where a helper's read-ahead goes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Policy {
    /// The next matrices from their start, up to [`BUDGET`], for a cache every core reads.
    Shared,
    /// The end of the next matrix, up to [`OWN_SHARE_BUDGET`], which the helper multiplies itself.
    OwnShare,
    /// No read-ahead.
    Off,
}

/// The environment variable that picks the [`Policy`]: `shared`, `own` or `off`; unset, `own`.
pub const READ_AHEAD_ENV: &str = "MLLM_CPU_READ_AHEAD";

impl Policy {
    /// The policy of this process ([`crate::knobs`]). `own` on AMD too: SmolLM2-135M int4
    /// decode on a 2-core Zen 4 VM, `bench_cpu --with-env MLLM_CPU_READ_AHEAD=own` against
    /// `shared`, 12 rounds twice: faster in 12 and 10 of 12 rounds (1.10x and 1.16x at the
    /// median of the rounds), 39 of 58 over five runs in all; Qwen3-0.6B shapes unchanged
    /// (faster in 15 of 30 rounds over three runs, prefill 0.93-1.12x per run).
    pub(crate) fn current() -> Policy {
        static POLICY: crate::knobs::Cached = crate::knobs::Cached::new();
        let choices = [("shared", Policy::Shared), ("own", Policy::OwnShare), ("off", Policy::Off)];
        POLICY.get(&choices.map(|c| c.1), || {
            super::vendor::hint_from_env(READ_AHEAD_ENV, &choices, Policy::OwnShare, Policy::OwnShare)
        })
    }

    /// How many of the matrices that follow a product its read-ahead reaches.
    pub(crate) fn matrices_ahead(self) -> usize {
        match self {
            Policy::Shared => MAX_MATRICES,
            Policy::OwnShare => 1,
            Policy::Off => 0,
        }
    }

    /// What a product whose learnt successors are `ahead` hands the team.
    pub(crate) fn plan(self, ahead: Spans) -> ReadAhead {
        match self {
            Policy::Shared => ReadAhead { spans: ahead, from_back: false, caller: Spans::default() },
            Policy::OwnShare => ReadAhead {
                spans: ahead.end_of_first(OWN_SHARE_BUDGET),
                from_back: true,
                caller: ahead.start_of_first(CALLER_BUDGET),
            },
            Policy::Off => ReadAhead::default(),
        }
    }
}

/// What a product hands the team: the memory its helpers read ahead once its items run out, and
/// which end of its items they take.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ReadAhead {
    pub(crate) spans: Spans,
    /// The helpers take the items from the back: under [`Policy::OwnShare`] that is the share of
    /// the matrix they read ahead before the product. They then also read it ahead from its end
    /// backwards, so that a read-ahead the next product cuts short (the gap between two linears
    /// is often shorter than the read) has fetched the items a helper takes first. Per Qwen3-0.6B
    /// decode step, 8 alternating rounds: 1-row linears lower in 6, median 17.2 ms against 17.9
    /// ms front to back; a 1 MiB budget read backwards gained nothing (18.0 ms).
    pub(crate) from_back: bool,
    /// The start of the next matrix, which the calling thread takes first when the helpers take
    /// the back ([`Policy::OwnShare`]): it reads it into its own L2 while it waits for the
    /// helpers' last items of this product, instead of spinning idle.
    pub(crate) caller: Spans,
}

impl ReadAhead {
    /// Prefetches up to `lines` cache lines from `cursor`, the bytes already covered (from the
    /// front, or from the end backwards if [`from_back`](Self::from_back)), and advances it;
    /// returns the bytes covered (0 once all are).
    pub(crate) fn prefetch(&self, cursor: &mut usize, lines: usize) -> usize {
        if self.from_back {
            self.spans.prefetch_back(cursor, lines)
        } else {
            self.spans.prefetch(cursor, lines)
        }
    }

    /// Where a read-ahead at `cursor` stands in `next`, the next product's ([`Spans::carry`] for
    /// reads from the front; a read from the back carries over only to the same memory).
    pub(crate) fn carry(&self, cursor: usize, next: &ReadAhead) -> usize {
        match (self.from_back, next.from_back) {
            (false, false) => self.spans.carry(cursor, &next.spans),
            _ if self == next => cursor,
            _ => 0,
        }
    }
}

/// Byte ranges to prefetch, in order: the panels and scales of one or more matrices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Spans {
    /// `(address, bytes)`; unused entries have zero bytes.
    spans: [(usize, usize); 2 * MAX_MATRICES],
}

impl Spans {
    /// The memory of one matrix: `parts` front to back (at most two; empty slices are skipped).
    pub(crate) fn of(parts: &[&[u8]]) -> Spans {
        let mut spans = Spans::default();
        for (slot, part) in spans.spans.iter_mut().zip(parts.iter().filter(|p| !p.is_empty()).take(2)) {
            *slot = (part.as_ptr() as usize, part.len());
        }
        spans
    }

    /// The end of the first matrix, `budget` bytes in all (see [`Spans::first_cut`]).
    pub(crate) fn end_of_first(&self, budget: usize) -> Spans {
        self.first_cut(budget, true)
    }

    /// The start of the first matrix, `budget` bytes in all (see [`Spans::first_cut`]).
    pub(crate) fn start_of_first(&self, budget: usize) -> Spans {
        self.first_cut(budget, false)
    }

    /// The first matrix cut to `budget` bytes in all, each of its spans (panels, scales) to the
    /// same fraction: at its end, where its last panels lie, or at its start.
    fn first_cut(&self, budget: usize, at_end: bool) -> Spans {
        let mut out = Spans::default();
        let total = self.spans[0].1 + self.spans[1].1;
        for (slot, &(addr, len)) in out.spans[..2].iter_mut().zip(&self.spans[..2]) {
            let keep = if total <= budget { len } else { (len as u128 * budget as u128 / total as u128) as usize };
            *slot = if at_end { (addr + len - keep, keep) } else { (addr, keep) };
        }
        out
    }

    /// Total bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.spans.iter().map(|s| s.1).sum()
    }

    /// `self` with `next` (one matrix) appended as matrix `at`, cut at [`BUDGET`] bytes in all.
    fn with(mut self, at: usize, next: &Spans) -> Spans {
        let mut room = BUDGET.saturating_sub(self.bytes());
        for (slot, &(addr, len)) in self.spans[2 * at..2 * at + 2].iter_mut().zip(&next.spans[..2]) {
            *slot = (addr, len.min(room));
            room -= slot.1;
        }
        self
    }

    /// Where `cursor`, a position in `self`, lies in `next` when `next` starts with a matrix of
    /// `self` (the next product's read-ahead, one matrix further along the same order): what
    /// was read ahead already is not walked again.
    pub(crate) fn carry(&self, cursor: usize, next: &Spans) -> usize {
        let first = next.spans[0];
        match self.spans.iter().position(|&s| s == first && s.1 > 0) {
            Some(j) => cursor.saturating_sub(self.spans[..j].iter().map(|s| s.1).sum()),
            None => 0,
        }
    }

    /// [`Spans::prefetch`] from the end: `cursor` counts the bytes covered backwards from the
    /// last span's end, across the spans last to first.
    pub(crate) fn prefetch_back(&self, cursor: &mut usize, lines: usize) -> usize {
        let (start, mut skip, mut budget) = (*cursor, *cursor, lines * LINE);
        for &(addr, len) in self.spans.iter().rev() {
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = budget.min(len - skip);
            // Bytes `[len - skip - take, len - skip)` of this span, last line first.
            let (low, mut offset) = (len - skip - take, len - skip);
            while offset > low {
                offset = offset.saturating_sub(LINE).max(low);
                prefetch_line(addr.wrapping_add(offset));
            }
            *cursor += take;
            budget -= take;
            skip = 0;
            if budget == 0 {
                break;
            }
        }
        *cursor - start
    }

    /// Prefetches up to `lines` cache lines from byte `cursor` (counted across the spans) and
    /// advances it; returns the bytes covered (0 once the cursor is at the end).
    pub(crate) fn prefetch(&self, cursor: &mut usize, lines: usize) -> usize {
        let mut skip = *cursor;
        let mut budget = lines * LINE;
        let start = *cursor;
        for &(addr, len) in &self.spans {
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = budget.min(len - skip);
            let mut offset = skip;
            while offset < skip + take {
                prefetch_line(addr.wrapping_add(offset));
                offset += LINE;
            }
            *cursor += take;
            budget -= take;
            skip = 0;
            if budget == 0 {
                break;
            }
        }
        *cursor - start
    }
}

/// Asks for every cache line of `data` in the L2 cache (a hint: it reads nothing and never
/// faults).
pub(crate) fn prefetch_all<T>(data: &[T]) {
    prefetch_bytes(data.as_ptr() as usize, std::mem::size_of_val(data));
}

/// Asks for every cache line of the `bytes` bytes from address `start` in the L2 cache. Any
/// address is fine: a prefetch never faults.
#[inline(always)]
pub(crate) fn prefetch_bytes(start: usize, bytes: usize) {
    let end = start + bytes;
    let mut line = start & !63;
    while line < end {
        prefetch_line(line);
        line += 64;
    }
}

#[inline(always)]
fn prefetch_line(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint to the caches; it reads nothing and never faults, whatever
    // the address.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        _mm_prefetch::<_MM_HINT_T1>(addr as *const i8)
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// A matrix's place in the learnt order: the memory of the matrix that ran after it last time,
/// and that one's node. The link is weak: the order of a decode step is a cycle, which strong
/// links would keep alive after the model is dropped.
#[derive(Default)]
struct Node {
    next: Spans,
    after: Weak<Mutex<Node>>,
}

/// A matrix's [`Node`], shared with the thread-local record of the last matrix run. A clone of a
/// matrix starts with no successor (it is another matrix, with its own order).
#[derive(Default)]
pub(crate) struct Successor(Arc<Mutex<Node>>);

impl Clone for Successor {
    fn clone(&self) -> Self {
        Successor::default()
    }
}

impl PartialEq for Successor {
    /// Bookkeeping, not part of a matrix's value.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

thread_local! {
    /// The node of the last matrix this thread multiplied.
    static LAST: RefCell<Option<Arc<Mutex<Node>>>> = const { RefCell::new(None) };
}

fn lock(node: &Mutex<Node>) -> std::sync::MutexGuard<'_, Node> {
    node.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Successor {
    /// Records that the matrix owning this slot, whose memory is `spans`, runs now: it becomes
    /// the successor of the matrix this thread ran last. Returns the memory to read ahead while
    /// this product finishes and what follows it runs: the (at most `matrices`) matrices that
    /// followed it last time, in order, up to [`BUDGET`] bytes.
    pub(crate) fn runs(&self, spans: Spans, matrices: usize) -> Spans {
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            if let Some(previous) = last.as_ref().filter(|p| !Arc::ptr_eq(p, &self.0)) {
                *lock(previous) = Node { next: spans, after: Arc::downgrade(&self.0) };
            }
            *last = Some(self.0.clone());
        });
        let mut ahead = Spans::default();
        let mut node = self.0.clone();
        for at in 0..matrices.min(MAX_MATRICES) {
            let (next, after) = {
                let node = lock(&node);
                (node.next, node.after.upgrade())
            };
            // Back at this matrix (an order of few matrices): it is being read now.
            if next.bytes() == 0 || next.spans[0] == spans.spans[0] {
                break;
            }
            ahead = ahead.with(at, &next);
            match after {
                Some(after) if ahead.bytes() < BUDGET && !Arc::ptr_eq(&after, &self.0) => node = after,
                _ => break,
            }
        }
        ahead
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_walks_both_spans_once() {
        let (a, b) = (vec![0u8; 1000], vec![0u8; 300]);
        let spans = Spans::of(&[&a, &[], &b]);
        assert_eq!(spans.bytes(), 1300);
        let mut cursor = 0;
        let mut calls = 0;
        while spans.prefetch(&mut cursor, 4) > 0 {
            calls += 1;
        }
        assert_eq!(cursor, 1300);
        // 256 bytes a call: 1000 = 3 * 256 + 232, then 24 + 256 + 20 of the second span.
        assert_eq!(calls, 6);
    }

    #[test]
    fn the_cursor_walks_both_spans_once_from_the_back() {
        let (a, b) = (vec![0u8; 1000], vec![0u8; 300]);
        let spans = Spans::of(&[&a, &b]);
        let mut cursor = 0;
        let mut steps = Vec::new();
        loop {
            let bytes = spans.prefetch_back(&mut cursor, 4);
            if bytes == 0 {
                break;
            }
            steps.push(bytes);
        }
        assert_eq!(cursor, 1300);
        // 256 bytes a call: 256 of the second span, then its first 44 and the first span's last
        // 212, then 256, 256, 256 and the first span's first 20.
        assert_eq!(steps, [256, 256, 256, 256, 256, 20]);
        // A read-ahead from the back resumes only on the same memory.
        let back = ReadAhead { spans, from_back: true, caller: Spans::default() };
        assert_eq!(back.carry(700, &back), 700);
        let caller = Spans::default();
        assert_eq!(back.carry(700, &ReadAhead { spans: Spans::of(&[&a]), from_back: true, caller }), 0);
        assert_eq!(back.carry(700, &ReadAhead { spans, from_back: false, caller }), 0);
    }

    /// One matrix's spans: `bytes` at `addr` and 64 bytes of scales after them.
    fn matrix(addr: usize, bytes: usize) -> Spans {
        let mut spans = Spans::default();
        spans.spans[..2].copy_from_slice(&[(addr, bytes), (addr + bytes, 64)]);
        spans
    }

    fn chain(parts: &[Spans]) -> Spans {
        parts.iter().enumerate().fold(Spans::default(), |acc, (at, m)| acc.with(at, m))
    }

    #[test]
    fn each_matrix_learns_the_ones_run_after_it() {
        let (a, b, c) = (Successor::default(), Successor::default(), Successor::default());
        let (sa, sb, sc) = (matrix(1 << 20, 1000), matrix(2 << 20, 2000), matrix(3 << 20, 3000));
        assert_eq!(a.runs(sa, MAX_MATRICES), Spans::default());
        assert_eq!(b.runs(sb, MAX_MATRICES), Spans::default());
        assert_eq!(c.runs(sc, MAX_MATRICES), Spans::default());
        // The second pass over the same order: each sees the others, in order, up to itself.
        assert_eq!(a.runs(sa, MAX_MATRICES), chain(&[sb, sc]));
        assert_eq!(b.runs(sb, MAX_MATRICES), chain(&[sc, sa]));
        // Running a matrix twice in a row does not make it its own successor.
        assert_eq!(b.runs(sb, MAX_MATRICES), chain(&[sc, sa]));
        assert_eq!(c.runs(sc, MAX_MATRICES), chain(&[sa, sb]));
        // A read-ahead of one matrix looks no further.
        assert_eq!(c.runs(sc, 1), sa);
        assert_eq!(c.runs(sc, 0), Spans::default());
        // A dropped matrix ends the chain.
        drop(b);
        assert_eq!(a.runs(sa, MAX_MATRICES), matrix(2 << 20, 2000));
    }

    /// What the first of matrices of `sizes` bytes reads ahead once they ran twice in order.
    fn read_ahead_of_the_first(sizes: &[usize]) -> (Spans, Vec<Spans>) {
        let nodes: Vec<Successor> = sizes.iter().map(|_| Successor::default()).collect();
        let spans: Vec<Spans> = sizes.iter().enumerate().map(|(i, &n)| matrix((i + 1) << 24, n)).collect();
        for _ in 0..2 {
            for (node, s) in nodes.iter().zip(&spans) {
                node.runs(*s, MAX_MATRICES);
            }
        }
        (nodes[0].runs(spans[0], MAX_MATRICES), spans)
    }

    #[test]
    fn a_read_ahead_stops_at_the_budget_and_at_four_matrices() {
        let (ahead, _) = read_ahead_of_the_first(&[1000, 3 << 20, 3 << 20, 4 << 20, 1000]);
        assert_eq!(ahead.bytes(), BUDGET);
        // The third matrix ahead is cut where the budget ends.
        assert_eq!(ahead.spans[4], ((4 << 24), BUDGET - 2 * ((3 << 20) + 64)));
        assert_eq!(ahead.spans[5].1, 0);
        // Small matrices: four ahead, not five.
        let (ahead, spans) = read_ahead_of_the_first(&[1000; 6]);
        assert_eq!(ahead, chain(&spans[1..5]));
    }

    #[test]
    fn the_own_share_is_the_end_of_the_next_matrix() {
        let (ahead, spans) = read_ahead_of_the_first(&[1000, 3 << 20, 1000]);
        // The second matrix's panels (3 MiB) and scales (64 bytes), each cut to the same fraction
        // at its end: 512 KiB in all.
        let plan = Policy::OwnShare.plan(ahead);
        assert!(plan.from_back);
        let (panels, scales) = (plan.spans.spans[0], plan.spans.spans[1]);
        let (addr, len) = spans[1].spans[0];
        assert_eq!(panels.0 + panels.1, addr + len, "the panels' end");
        assert_eq!(scales.0 + scales.1, spans[1].spans[1].0 + 64, "the scales' end");
        assert!(plan.spans.bytes() <= OWN_SHARE_BUDGET && plan.spans.bytes() > OWN_SHARE_BUDGET - 2);
        assert_eq!(plan.spans.spans[2..], [(0, 0); 2 * MAX_MATRICES - 2]);
        // The caller's share is the same matrix's start, cut alike at CALLER_BUDGET.
        let (panels, scales) = (plan.caller.spans[0], plan.caller.spans[1]);
        assert_eq!((panels.0, scales.0), (addr, spans[1].spans[1].0), "the starts");
        assert!(plan.caller.bytes() <= CALLER_BUDGET && plan.caller.bytes() > CALLER_BUDGET - 2);
        assert_eq!(plan.caller.spans[2..], [(0, 0); 2 * MAX_MATRICES - 2]);
        // A matrix under the budget is read whole; the shared policy keeps the learnt order.
        let (ahead, spans) = read_ahead_of_the_first(&[1000, 2000, 3000]);
        assert_eq!(Policy::OwnShare.plan(ahead).spans, spans[1]);
        assert_eq!(Policy::OwnShare.plan(ahead).caller, spans[1]);
        assert_eq!(Policy::Shared.plan(ahead), ReadAhead { spans: ahead, from_back: false, caller: Spans::default() });
        assert_eq!(Policy::Off.plan(ahead), ReadAhead::default());
    }

    #[test]
    fn progress_carries_over_to_the_next_products_read_ahead() {
        let (m1, m2, m3) = (matrix(1 << 20, 1000), matrix(2 << 20, 2000), matrix(3 << 20, 3000));
        let now = chain(&[m1, m2]);
        let next = chain(&[m2, m3]);
        // 1500 bytes in: 436 bytes into m2's 2000 (m1 is 1000 + 64).
        assert_eq!(now.carry(1500, &next), 436);
        // Not yet at m2: start m2 from its beginning.
        assert_eq!(now.carry(500, &next), 0);
        // A read-ahead of other matrices starts over.
        assert_eq!(now.carry(1500, &chain(&[m3])), 0);
    }
}
