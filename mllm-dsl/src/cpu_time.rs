//! Where a step's time goes: wall and CPU seconds of this process, side by side
//! ([`Stopwatch`]). On a machine shared with other work the wall time grows with the load while
//! the CPU time (every thread of the process, user + system) stays what the step costs; the ratio
//! of the two shows how many cores a step kept busy.
//!
//! ```
//! use mllm_dsl::cpu_time::Stopwatch;
//! let watch = Stopwatch::start();
//! let sum: u64 = (0..1_000_000u64).sum();
//! let spent = watch.elapsed();
//! assert!(spent.wall >= 0.0 && spent.cpu >= 0.0, "{sum}");
//! ```

use std::ops::{Add, AddAssign, Sub};
use std::time::Instant;

use rustix::time::{clock_gettime, ClockId};

/// CPU seconds this process has used so far, all threads, user + system
/// (`CLOCK_PROCESS_CPUTIME_ID`; threads that already ended are included).
pub fn process_cpu_seconds() -> f64 {
    let t = clock_gettime(ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// A span of time as the wall clock and as this process's CPU time saw it, in seconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spent {
    pub wall: f64,
    pub cpu: f64,
}

impl Add for Spent {
    type Output = Spent;
    fn add(self, o: Spent) -> Spent {
        Spent { wall: self.wall + o.wall, cpu: self.cpu + o.cpu }
    }
}

impl AddAssign for Spent {
    fn add_assign(&mut self, o: Spent) {
        *self = *self + o;
    }
}

impl Sub for Spent {
    type Output = Spent;
    fn sub(self, o: Spent) -> Spent {
        Spent { wall: self.wall - o.wall, cpu: self.cpu - o.cpu }
    }
}

/// Wall and process CPU time since [`Stopwatch::start`].
#[derive(Clone, Copy, Debug)]
pub struct Stopwatch {
    wall: Instant,
    cpu: f64,
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        Stopwatch { wall: Instant::now(), cpu: process_cpu_seconds() }
    }

    /// The time since [`Stopwatch::start`].
    pub fn elapsed(&self) -> Spent {
        Spent { wall: self.wall.elapsed().as_secs_f64(), cpu: (process_cpu_seconds() - self.cpu).max(0.0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_counts_every_thread_and_wall_time_counts_sleep() {
        let watch = Stopwatch::start();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(watch.elapsed().wall >= 0.05);
        // A second thread spins until it has used 100 ms of CPU itself (however loaded the machine).
        let watch = Stopwatch::start();
        std::thread::spawn(|| {
            let own = || {
                let t = clock_gettime(ClockId::ThreadCPUTime);
                t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
            };
            let start = own();
            let mut x = 0u64;
            while own() - start < 0.1 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
        })
        .join()
        .unwrap();
        let spent = watch.elapsed();
        assert!(spent.cpu >= 0.1, "a thread that used 100 ms of CPU is missing from {spent:?}");
    }
}
