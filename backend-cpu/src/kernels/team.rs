//! [`Team`]: helper threads that stay awake between kernels, for the many short parallel loops of
//! a model forward.
//!
//! A decoder layer runs a dozen kernels of 20 µs to 2 ms each. A rayon worker that finds no work
//! goes to sleep within microseconds, and waking it (a futex wake, an inter-processor interrupt on
//! a VM) takes tens of microseconds, so every parallel kernel started with one thread and ended
//! waiting for the other: measured, a 1.2 ms linear ran at 150 GFLOP/s on 2 threads where a long
//! one reaches 200. A team helper instead spins (yielding the CPU to anything runnable) for
//! [`SPIN`] after each job before it parks, like llama.cpp's threadpool, so the next kernel starts
//! on every thread at once.
//!
//! [`Team::run`] hands out item indices `0..n` through one atomic counter, in shares that shrink
//! as the items run out ([`claim`]); the calling thread works on them too, so a helper that is
//! still waking up just finds the job done. The caller returns once every helper that joined the
//! job has left it (late helpers see the job closed and back out without touching it), which is
//! what lets a job borrow the caller's stack.

use super::read_ahead::ReadAhead;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper keeps spinning before it parks.
const SPIN: Duration = Duration::from_millis(2);

/// The job being run: `call(data, i)` runs item `i`. `data` points at the caller's closure, which
/// outlives the job (see [`Team::run`]).
#[derive(Clone, Copy)]
struct Job {
    call: unsafe fn(*const (), usize),
    data: *const (),
    items: usize,
    /// Memory a helper prefetches once it runs out of items, and the end of the items helpers
    /// take (see [`super::read_ahead`]).
    read_ahead: ReadAhead,
}

// SAFETY: `data` points at a `Sync` closure (enforced by `Team::run`'s bound).
unsafe impl Send for Job {}

struct Shared {
    /// The threads that work on a job: the helpers and the caller.
    parties: usize,
    /// Bumped once per job; helpers wait for it to change.
    generation: AtomicUsize,
    job: Mutex<Option<Job>>,
    /// Items taken: from the front in the low 32 bits, from the back in the high ones ([`claim`]).
    next: AtomicU64,
    /// Set when the caller has finished the items it could take: helpers that join later back out.
    closed: AtomicBool,
    /// Helpers inside the current job.
    active: AtomicUsize,
    /// A helper's job panicked.
    panicked: AtomicBool,
    parked: AtomicUsize,
    /// Bytes the helpers have prefetched for read-aheads (for tests).
    read_ahead_bytes: AtomicUsize,
    wake: (Mutex<()>, Condvar),
    stop: AtomicBool,
}

/// Helper threads plus the calling thread (see the module docs).
pub(crate) struct Team {
    shared: Arc<Shared>,
    /// One job at a time; a second caller (another thread, or a job calling back in) runs inline.
    busy: Mutex<()>,
    helpers: Vec<JoinHandle<()>>,
}

thread_local! {
    /// Whether this thread is running a team item (nested calls run inline).
    static IN_JOB: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Team {
    /// A team of `helpers` threads (the caller makes `helpers + 1`).
    pub(crate) fn new(helpers: usize) -> std::io::Result<Team> {
        let shared = Arc::new(Shared {
            parties: helpers + 1,
            generation: AtomicUsize::new(0),
            job: Mutex::new(None),
            next: AtomicU64::new(0),
            closed: AtomicBool::new(true),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            read_ahead_bytes: AtomicUsize::new(0),
            wake: (Mutex::new(()), Condvar::new()),
            stop: AtomicBool::new(false),
        });
        let helpers = (0..helpers)
            .map(|i| {
                let shared = shared.clone();
                std::thread::Builder::new().name(format!("mllm-team-{i}")).spawn(move || helper(&shared))
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Team { shared, busy: Mutex::new(()), helpers })
    }

    /// Runs `f(i)` for every `i` in `0..items`, on the helpers and the calling thread, and returns
    /// when all are done. Panics if an item panicked.
    pub(crate) fn run<F: Fn(usize) + Sync>(&self, items: usize, f: F) {
        self.run_then(items, f, ReadAhead::default())
    }

    /// [`Team::run`], the helpers taking the items from the end `read_ahead` says and then
    /// prefetching its memory until the next job comes (the caller does not wait for that).
    pub(crate) fn run_then<F: Fn(usize) + Sync>(&self, items: usize, f: F, read_ahead: ReadAhead) {
        let inline = || (0..items).for_each(&f);
        if items <= 1 || items > MAX_ITEMS || self.helpers.is_empty() || IN_JOB.with(|j| j.get()) {
            return inline();
        }
        let Ok(_busy) = self.busy.try_lock() else { return inline() };
        unsafe fn call<F: Fn(usize)>(data: *const (), i: usize) {
            // SAFETY: `data` is the `&F` published below, alive until `run` returns.
            unsafe { (*(data as *const F))(i) }
        }
        let s = &*self.shared;
        *s.job.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Job { call: call::<F>, data: &f as *const F as *const (), items, read_ahead });
        s.next.store(0, SeqCst);
        s.closed.store(false, SeqCst);
        s.generation.fetch_add(1, SeqCst);
        if s.parked.load(SeqCst) > 0 {
            let _guard = s.wake.0.lock().unwrap_or_else(PoisonError::into_inner);
            s.wake.1.notify_all();
        }
        IN_JOB.with(|j| j.set(true));
        let mine = catch_unwind(AssertUnwindSafe(|| {
            while let Some(taken) = claim(&s.next, items, s.parties, false) {
                taken.for_each(&f);
            }
        }));
        IN_JOB.with(|j| j.set(false));
        // Close the job, then wait for the helpers inside it: a helper that joins after the close
        // sees it and leaves without reading the job (both sides use SeqCst, see `helper`).
        s.closed.store(true, SeqCst);
        // While the helpers finish their last items, read the start of the next matrix (this
        // thread's first items there) instead of spinning idle.
        let mut cursor = 0;
        while s.active.load(SeqCst) != 0 {
            if read_ahead.caller.prefetch(&mut cursor, CALLER_READ_AHEAD_LINES) == 0 {
                std::hint::spin_loop();
            }
        }
        *s.job.lock().unwrap_or_else(PoisonError::into_inner) = None;
        if let Err(panic) = mine {
            std::panic::resume_unwind(panic);
        }
        if s.panicked.swap(false, SeqCst) {
            panic!("a parallel kernel item panicked on a team thread");
        }
    }
}

impl Drop for Team {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.generation.fetch_add(1, SeqCst);
        {
            let _guard = self.shared.wake.0.lock().unwrap_or_else(PoisonError::into_inner);
            self.shared.wake.1.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

/// The most items a job hands out through the counter: each end's 32-bit count may overshoot
/// `items` by its last share, so it stays below 2^32 (larger jobs run inline).
const MAX_ITEMS: usize = (u32::MAX / 2) as usize;

/// Takes the next items of `0..items` from the front (`from_back == false`) or the back: a
/// `1 / (2 * parties)` share of what is left, at least one item (guided scheduling: few claims
/// while much is left, single items at the end, where the threads should finish together). One
/// atomic add on the counter of its end also reads the other end's: a share is clipped where the
/// other end has got to, so each item is taken once, and a taker that finds the ends met stops.
/// Each claim moves the counter's cache line between cores, and a 1-row linear of SmolLM2's sizes
/// streams for about 15 µs in 16 items: against one item per claim, the decode row of
/// `bench_int4 --cols 576 --matrices 1000 --repeats 3` (336 KB matrices) streamed faster in 8 of
/// 10 alternating runs on the Intel VM (medians 21.8 against 20.4 GB/s).
fn claim(next: &AtomicU64, items: usize, parties: usize, from_back: bool) -> Option<std::ops::Range<usize>> {
    let ends = |counter: u64| ((counter & 0xffff_ffff) as usize, (counter >> 32) as usize);
    let (front, back) = ends(next.load(Relaxed));
    let share = (items.saturating_sub(front + back) / (2 * parties)).max(1);
    let (front, back) = ends(next.fetch_add(if from_back { (share as u64) << 32 } else { share as u64 }, SeqCst));
    if front + back >= items {
        return None;
    }
    let end = items - back;
    Some(if from_back { end.saturating_sub(share).max(front)..end } else { front..(front + share).min(end) })
}

/// Cache lines the caller prefetches between two looks at whether the helpers are done (512
/// bytes: a look every few hundred nanoseconds at most, so the wait ends as the helpers do).
const CALLER_READ_AHEAD_LINES: usize = 8;

/// Cache lines a waiting helper prefetches between two looks for a new job (4 KiB).
const READ_AHEAD_LINES: usize = 64;

fn helper(s: &Shared) {
    let mut seen = s.generation.load(SeqCst);
    // The last read-ahead handed out and how far it got: a job without one (attention, a QDQ
    // point) between two linears leaves it to be resumed.
    let (mut read_ahead, mut cursor) = (ReadAhead::default(), 0);
    loop {
        // Wait for the next job: read ahead, then spin, yielding the CPU to anything runnable,
        // then park.
        let mut start = Instant::now();
        let (mut spins, mut reading) = (0u32, false);
        // A helper that starts late may take `seen` after the team was dropped: check `stop` too.
        while s.generation.load(SeqCst) == seen && !s.stop.load(SeqCst) {
            let bytes = read_ahead.prefetch(&mut cursor, READ_AHEAD_LINES);
            if bytes > 0 {
                s.read_ahead_bytes.fetch_add(bytes, Relaxed);
                reading = true;
                continue;
            }
            if reading {
                // The spin before parking counts from the end of the read-ahead.
                (reading, start) = (false, Instant::now());
            }
            spins += 1;
            if spins.is_multiple_of(64) {
                if start.elapsed() > SPIN {
                    park(s, seen);
                } else {
                    std::thread::yield_now();
                }
            } else {
                std::hint::spin_loop();
            }
        }
        seen = s.generation.load(SeqCst);
        if s.stop.load(SeqCst) {
            return;
        }
        // Join the job unless the caller already closed it (or moved on to a newer one).
        s.active.fetch_add(1, SeqCst);
        if s.closed.load(SeqCst) || s.generation.load(SeqCst) != seen {
            s.active.fetch_sub(1, SeqCst);
            continue;
        }
        let job = *s.job.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(job) = job {
            let next = job.read_ahead;
            if next.spans.bytes() > 0 {
                (read_ahead, cursor) = (next, read_ahead.carry(cursor, &next));
            }
            IN_JOB.with(|j| j.set(true));
            let result = catch_unwind(AssertUnwindSafe(|| {
                while let Some(taken) = claim(&s.next, job.items, s.parties, job.read_ahead.from_back) {
                    for i in taken {
                        // SAFETY: the caller keeps the closure alive while `active` counts this
                        // helper.
                        unsafe { (job.call)(job.data, i) };
                    }
                }
            }));
            IN_JOB.with(|j| j.set(false));
            if result.is_err() {
                s.panicked.store(true, SeqCst);
            }
        }
        s.active.fetch_sub(1, SeqCst);
    }
}

/// Sleeps until the generation moves past `seen` (see the lost-wakeup argument in [`Team::run`]:
/// the caller bumps the generation before reading `parked`, the helper counts itself parked
/// before re-reading the generation under the lock).
fn park(s: &Shared, seen: usize) {
    s.parked.fetch_add(1, SeqCst);
    let mut guard = s.wake.0.lock().unwrap_or_else(PoisonError::into_inner);
    while s.generation.load(SeqCst) == seen && !s.stop.load(SeqCst) {
        guard = s.wake.1.wait(guard).unwrap_or_else(PoisonError::into_inner);
    }
    drop(guard);
    s.parked.fetch_sub(1, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::read_ahead::Spans;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_item_runs_once_across_many_jobs() {
        let team = Team::new(2).unwrap();
        for from_back in [false, true] {
            for items in [0, 1, 2, 3, 17, 1000] {
                for _ in 0..50 {
                    let hits: Vec<AtomicU64> = (0..items).map(|_| AtomicU64::new(0)).collect();
                    let read_ahead = ReadAhead { spans: Spans::default(), from_back, caller: Spans::default() };
                    team.run_then(
                        items,
                        |i| {
                            hits[i].fetch_add(1, SeqCst);
                        },
                        read_ahead,
                    );
                    assert!(
                        hits.iter().all(|h| h.load(SeqCst) == 1),
                        "{items} items, helpers from the back {from_back}"
                    );
                }
            }
        }
    }

    #[test]
    fn claims_meet_in_the_middle() {
        // Two parties: each claim takes a quarter of what is left, at least one item. Over 100
        // items, front then back then front: 0..25, 82..100 (18 of 75), 25..39 (14 of 57).
        let next = AtomicU64::new(0);
        let order = [false, true, false];
        let taken: Vec<_> = order.iter().map(|&back| claim(&next, 100, 2, back)).collect();
        assert_eq!(taken, [Some(0..25), Some(82..100), Some(25..39)]);
        // Over 5 items every claim is a single item: 0, 4, 3, 1, 2, then nothing from either end.
        let next = AtomicU64::new(0);
        let order = [false, true, true, false, false, true, false];
        let taken: Vec<_> = order.iter().map(|&back| claim(&next, 5, 2, back)).collect();
        assert_eq!(taken, [Some(0..1), Some(4..5), Some(3..4), Some(1..2), Some(2..3), None, None]);
    }

    /// Shares from both ends, in any interleaving, cover every item once and end at the meeting
    /// point, also when a share is clipped by the other end's last one.
    #[test]
    fn shares_cover_every_item_once() {
        for items in [1, 2, 3, 7, 16, 17, 100, 1000] {
            for parties in [1, 2, 3, 8] {
                for pattern in 0u32..64 {
                    let next = AtomicU64::new(0);
                    let mut hits = vec![0u32; items];
                    for step in 0.. {
                        let from_back = pattern >> (step % 6) & 1 == 1;
                        match claim(&next, items, parties, from_back) {
                            Some(taken) => taken.for_each(|i| hits[i] += 1),
                            None => break,
                        }
                    }
                    assert!(hits.iter().all(|&h| h == 1), "{items} items, {parties} parties, pattern {pattern}");
                }
            }
        }
    }

    #[test]
    fn parked_helpers_wake_up_and_nested_calls_run_inline() {
        let team = Team::new(1).unwrap();
        std::thread::sleep(SPIN * 3); // the helper parks
        let sum = AtomicU64::new(0);
        team.run(64, |i| {
            // A nested call runs inline on this thread.
            team.run(2, |j| {
                sum.fetch_add((i * 2 + j) as u64, SeqCst);
            });
        });
        assert_eq!(sum.load(SeqCst), (0..128).sum::<u64>());
    }

    #[test]
    fn concurrent_callers_are_served() {
        let team = Arc::new(Team::new(1).unwrap());
        let total = Arc::new(AtomicU64::new(0));
        let callers: Vec<_> = (0..4)
            .map(|_| {
                let (team, total) = (team.clone(), total.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        team.run(10, |i| {
                            total.fetch_add(i as u64, SeqCst);
                        });
                    }
                })
            })
            .collect();
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(total.load(SeqCst), 4 * 100 * 45);
    }

    /// A helper that runs out of items reads the job's read-ahead to its end, resumes it after a
    /// job without one, and the caller does not wait for it.
    #[test]
    fn helpers_read_ahead_between_jobs() {
        let team = Team::new(1).unwrap();
        let memory = vec![1u8; 8 << 20];
        let spans = Spans::of(&[&memory]);
        // Only a helper that joins a job takes its read-ahead, and on a loaded machine the helper
        // may start after the first job, or wake after the caller finished it. So wait until the
        // helper has parked (it is then waiting for the next job), and let the caller's items wait
        // until the helper has run one; then a job without a read-ahead.
        let start = Instant::now();
        while team.shared.parked.load(SeqCst) == 0 {
            assert!(start.elapsed() < Duration::from_secs(20), "the helper never parked");
            std::thread::yield_now();
        }
        let (caller, joined) = (std::thread::current().id(), AtomicBool::new(false));
        let helper_joined = |_| {
            if std::thread::current().id() != caller {
                joined.store(true, SeqCst);
            }
            while !joined.load(SeqCst) {
                assert!(start.elapsed() < Duration::from_secs(20), "the helper never joined the job");
                std::thread::yield_now();
            }
        };
        team.run_then(100, helper_joined, ReadAhead { spans, from_back: false, caller: spans });
        team.run(100, |_| std::thread::sleep(Duration::from_micros(200)));
        while team.shared.read_ahead_bytes.load(SeqCst) < memory.len() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "read ahead {} bytes",
                team.shared.read_ahead_bytes.load(SeqCst)
            );
            std::thread::yield_now();
        }
        assert_eq!(team.shared.read_ahead_bytes.load(SeqCst), memory.len());
    }

    #[test]
    fn a_panicking_item_panics_the_caller_and_the_team_still_works() {
        let team = Team::new(1).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            team.run(100, |i| {
                if i == 57 {
                    panic!("item 57");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicU64::new(0);
        team.run(10, |_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 10);
    }
}
