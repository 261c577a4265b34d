//! Resident memory of this process, for benches: the current and peak resident set from
//! `/proc/self/status` (`VmRSS`, `VmHWM`), how much of it is anonymous memory on transparent huge
//! pages (`AnonHugePages` of `/proc/self/smaps_rollup`), and resetting the peak so one step can be
//! measured on its own (`/proc/self/clear_refs`, value 5); beside it the CPU time the process used
//! (`/proc/self/stat`), which a loaded machine inflates far less than wall time. Linux only;
//! elsewhere every call returns an error.
//!
//! ```no_run
//! use mllm_dsl::memory::{peak_rss_bytes, reset_peak_rss};
//! let reset = reset_peak_rss().is_ok(); // false: the figure also covers what came before
//! let big = vec![1u8; 1 << 28];
//! println!("step peak: {} MB (reset: {reset})", peak_rss_bytes()? / 1_000_000);
//! # drop(big);
//! # Ok::<(), mllm_dsl::memory::MemoryError>(())
//! ```

use thiserror::Error;

const STATUS: &str = "/proc/self/status";
const SMAPS_ROLLUP: &str = "/proc/self/smaps_rollup";
const CLEAR_REFS: &str = "/proc/self/clear_refs";
const STAT: &str = "/proc/self/stat";
/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`, 100 on every Linux ABI).
const USER_HZ: f64 = 100.0;

/// Why a memory figure could not be read.
#[derive(Debug, Error)]
pub enum MemoryError {
    #[error("reading {path}: {source}")]
    Io { path: &'static str, source: std::io::Error },
    #[error("{path} has no `{field}:` line in kB")]
    MissingField { path: &'static str, field: &'static str },
    #[error("{STAT} has no user and system times after the command name")]
    MalformedStat,
}

/// The peak resident set (`VmHWM`) in bytes, since the process started or the last
/// [`reset_peak_rss`].
pub fn peak_rss_bytes() -> Result<u64, MemoryError> {
    kb_field(STATUS, "VmHWM")
}

/// The current resident set (`VmRSS`) in bytes.
pub fn rss_bytes() -> Result<u64, MemoryError> {
    kb_field(STATUS, "VmRSS")
}

/// Anonymous memory of this process on transparent huge pages (`AnonHugePages`), in bytes: a
/// bench can tell whether the weights it streams got the huge pages they were advised onto.
pub fn anon_huge_page_bytes() -> Result<u64, MemoryError> {
    kb_field(SMAPS_ROLLUP, "AnonHugePages")
}

/// Sets the peak resident set to the current one, so the next [`peak_rss_bytes`] covers only
/// what happens from now on.
pub fn reset_peak_rss() -> Result<(), MemoryError> {
    std::fs::write(CLEAR_REFS, "5").map_err(|source| MemoryError::Io { path: CLEAR_REFS, source })
}

/// User plus system CPU seconds of all threads of this process so far (10 ms resolution).
pub fn cpu_seconds() -> Result<f64, MemoryError> {
    let stat = std::fs::read_to_string(STAT).map_err(|source| MemoryError::Io { path: STAT, source })?;
    parse_cpu_ticks(&stat).map(|ticks| ticks as f64 / USER_HZ).ok_or(MemoryError::MalformedStat)
}

/// utime + stime (fields 14 and 15) of a `stat` line; the command name (field 2) is
/// parenthesized and may hold spaces, so fields are counted after its closing parenthesis.
fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// `field` of the `field: N kB` lines of `path`, in bytes.
fn kb_field(path: &'static str, field: &'static str) -> Result<u64, MemoryError> {
    let text = std::fs::read_to_string(path).map_err(|source| MemoryError::Io { path, source })?;
    parse_kb(&text, field).map(|kb| kb * 1024).ok_or(MemoryError::MissingField { path, field })
}

/// `field:   1234 kB` of a `status` or `smaps_rollup` text, in kB.
fn parse_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    line.trim().strip_suffix("kB")?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_parsed_by_exact_field() {
        let status = "VmHWMX:\t1 kB\nVmHWM:\t  123456 kB\nVmRSS:\t   2048 kB\nVmBad:\t12 MB\n";
        assert_eq!(parse_kb(status, "VmHWM"), Some(123_456));
        assert_eq!(parse_kb(status, "VmRSS"), Some(2048));
        assert_eq!(parse_kb(status, "VmBad"), None);
        assert_eq!(parse_kb(status, "VmSwap"), None);
    }

    #[test]
    fn stat_times_are_read_after_the_command_name() {
        // Fields 3.. of `man 5 proc`: state, ppid, pgrp, session, tty_nr, tpgid, flags, minflt,
        // cminflt, majflt, cmajflt, then utime 250 and stime 30.
        let stat = "4242 (a b) c) R 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 1 0\n";
        assert_eq!(parse_cpu_ticks(stat), Some(280));
        assert_eq!(parse_cpu_ticks("4242 (x) R 1 2"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_peak_covers_a_fresh_allocation() {
        reset_peak_rss().unwrap();
        let before = peak_rss_bytes().unwrap();
        // black_box: an optimized build may otherwise drop the unused allocation.
        let touched = std::hint::black_box(vec![7u8; 64 << 20]);
        let after = peak_rss_bytes().unwrap();
        assert!(after >= before + (60 << 20), "peak {before} -> {after} after touching 64 MiB");
        assert!(rss_bytes().unwrap() >= 60 << 20);
        drop(touched);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_are_counted_within_the_resident_set() {
        let huge = anon_huge_page_bytes().unwrap();
        assert!(huge <= rss_bytes().unwrap(), "AnonHugePages {huge} above VmRSS");
        assert_eq!(huge % (4 << 10), 0, "AnonHugePages {huge} is not in whole pages");
    }
}
