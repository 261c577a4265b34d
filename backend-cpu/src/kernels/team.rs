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
//! [`Team::run`] hands out item indices `0..n` through one atomic counter; the calling thread
//! works on them too, so a helper that is still waking up just finds the job done. The caller
//! returns once every helper that joined the job has left it (late helpers see the job closed and
//! back out without touching it), which is what lets a job borrow the caller's stack.

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
        if items <= 1 || items > u32::MAX as usize || self.helpers.is_empty() || IN_JOB.with(|j| j.get()) {
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
            while let Some(i) = claim(&s.next, items, false) {
                f(i);
            }
        }));
        IN_JOB.with(|j| j.set(false));
        // Close the job, then wait for the helpers inside it: a helper that joins after the close
        // sees it and leaves without reading the job (both sides use SeqCst, see `helper`).
        s.closed.store(true, SeqCst);
        while s.active.load(SeqCst) != 0 {
            std::hint::spin_loop();
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

/// Takes the next item of `0..items` from the front (`from_back == false`) or the back: one
/// atomic add on the counter of its end, which also reads the other end's, so each item is taken
/// once and a taker that finds the two ends met stops.
fn claim(next: &AtomicU64, items: usize, from_back: bool) -> Option<usize> {
    let taken = next.fetch_add(if from_back { 1 << 32 } else { 1 }, SeqCst);
    let (front, back) = ((taken & 0xffff_ffff) as usize, (taken >> 32) as usize);
    (front + back < items).then(|| if from_back { items - 1 - back } else { front })
}

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
                while let Some(i) = claim(&s.next, job.items, job.read_ahead.from_back) {
                    // SAFETY: the caller keeps the closure alive while `active` counts this helper.
                    unsafe { (job.call)(job.data, i) };
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
                    let read_ahead = ReadAhead { spans: Spans::default(), from_back };
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
        let next = AtomicU64::new(0);
        // front, back, back, front, ... over 5 items: 0, 4, 3, 1, 2, then nothing from either end.
        let order = [false, true, true, false, false, true, false];
        let taken: Vec<Option<usize>> = order.iter().map(|&back| claim(&next, 5, back)).collect();
        assert_eq!(taken, [Some(0), Some(4), Some(3), Some(1), Some(2), None, None]);
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
        team.run_then(100, helper_joined, ReadAhead { spans, from_back: false });
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
