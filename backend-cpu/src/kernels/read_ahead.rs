//! Read-ahead of the next weight matrix while a decode step does serial work.
//!
//! A decode step alternates linears, which stream their weights with every thread, and serial
//! stretches (norms, QDQ points, attention, the glue between ops) in which one thread works and
//! the memory bus idles. Between two linears the team helper has nothing to do, so it prefetches
//! the matrix that comes next into the caches (a 32 MiB L3 holds any one matrix of a 1B model):
//! the next linear then finds part of its weights there instead of in DRAM.
//!
//! Which matrix comes next is learnt, not declared: a decode step runs the same linears in the
//! same order every time, so each matrix remembers ([`Successor`]) the one that ran after it on
//! the calling thread, and a product hands that one's memory ([`Spans`]) to the helper with its
//! job. A wrong guess costs bandwidth, never correctness: prefetch instructions only hint the
//! caches and never fault, even on memory freed since.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes per prefetch instruction (a cache line).
const LINE: usize = 64;

/// Byte ranges to prefetch, in order: a matrix's panels and scales.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Spans {
    /// `(address, bytes)`; unused entries have zero bytes.
    spans: [(usize, usize); 2],
}

impl Spans {
    /// The memory of `parts`, front to back (at most two; empty slices are skipped).
    pub(crate) fn of(parts: &[&[u8]]) -> Spans {
        let mut spans = [(0, 0); 2];
        for (slot, part) in spans.iter_mut().zip(parts.iter().filter(|p| !p.is_empty())) {
            *slot = (part.as_ptr() as usize, part.len());
        }
        Spans { spans }
    }

    /// Total bytes.
    pub(crate) fn bytes(&self) -> usize {
        self.spans.iter().map(|s| s.1).sum()
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

/// What ran after a matrix the last time it ran: shared by a matrix and the thread-local record
/// of the last matrix run, so neither outlives the other's bookkeeping. A clone of a matrix
/// starts with no successor (it is another matrix, with its own order).
#[derive(Default)]
pub(crate) struct Successor(Arc<Mutex<Spans>>);

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
    /// The successor slot of the last matrix this thread multiplied.
    static LAST: RefCell<Option<Arc<Mutex<Spans>>>> = const { RefCell::new(None) };
}

impl Successor {
    /// Records that the matrix owning this slot, whose memory is `spans`, runs now: it becomes
    /// the successor of the matrix this thread ran last. Returns its own successor from the last
    /// time, the memory to read ahead while this product finishes and what follows it runs.
    pub(crate) fn runs(&self, spans: Spans) -> Spans {
        let lock = |slot: &Mutex<Spans>| *slot.lock().unwrap_or_else(PoisonError::into_inner);
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            if let Some(previous) = last.as_ref().filter(|p| !Arc::ptr_eq(p, &self.0)) {
                *previous.lock().unwrap_or_else(PoisonError::into_inner) = spans;
            }
            *last = Some(self.0.clone());
        });
        lock(&self.0)
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
    fn each_matrix_learns_the_one_run_after_it() {
        let (a, b, c) = (Successor::default(), Successor::default(), Successor::default());
        let span = |x: usize| Spans { spans: [(x, 64), (0, 0)] };
        assert_eq!(a.runs(span(1)), Spans::default());
        assert_eq!(b.runs(span(2)), Spans::default());
        assert_eq!(c.runs(span(3)), Spans::default());
        // The second pass over the same order: each sees the one that followed it.
        assert_eq!(a.runs(span(1)), span(2));
        assert_eq!(b.runs(span(2)), span(3));
        // Running a matrix twice in a row does not make it its own successor.
        assert_eq!(b.runs(span(2)), span(3));
        assert_eq!(c.runs(span(3)), span(1));
    }
}
