//! Asking Linux for 2 MiB pages under long-lived, large buffers: the KV cache here, the CPU
//! backend's packed weights.
//!
//! Both are read in patterns that cross many 4 KiB pages per step (every weight panel once per
//! decoded token; a layer's keys one row per head dimension, each row a context wide), so each
//! 4 KiB costs a TLB miss and stops the hardware prefetchers at its boundary. In THP's `madvise`
//! mode, a common distribution default, Linux backs anonymous memory with huge pages only where
//! the range was advised `MADV_HUGEPAGE` before its pages were first touched, and only whole,
//! aligned 2 MiB pages. The advice is a hint: where THP is off, or on other systems, the memory
//! keeps ordinary pages and nothing else changes.

/// Size and alignment of a huge page on x86-64 and arm64 Linux.
pub const HUGE_PAGE: usize = 2 << 20;

/// Advises the whole 2 MiB pages inside `bytes` bytes at `start` onto huge pages.
///
/// The range must be memory the caller owns; advice never changes what it holds.
pub fn advise(start: *const u8, bytes: usize) {
    let start = start as usize;
    let (first, last) = (start.next_multiple_of(HUGE_PAGE), (start + bytes) / HUGE_PAGE * HUGE_PAGE);
    if last > first {
        advise_range(first, last - first);
    }
}

#[cfg(target_os = "linux")]
fn advise_range(start: usize, len: usize) {
    // SAFETY: MADV_HUGEPAGE changes how the kernel backs the pages, never their contents; a
    // failure (THP compiled out) leaves them as they were, so its result is not needed.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise_range(_: usize, _: usize) {}

/// The `VmFlags` of the mapping that holds `addr`, read from `/proc/self/smaps` (`hg` marks an
/// advised one); `None` off Linux or when no mapping holds it. For checking that advice took.
pub fn vm_flags(addr: usize) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let mut in_vma = false;
    for line in smaps.lines() {
        let range = line.split_once(' ').and_then(|(r, _)| r.split_once('-'));
        if let Some((lo, hi)) = range {
            if let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)) {
                in_vma = (lo..hi).contains(&addr);
                continue;
            }
        }
        if in_vma {
            if let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.trim().to_string());
            }
        }
    }
    None
}
