//! The machine's memory read bandwidth, as the benches' rooflines divide by it: a sum over a
//! buffer far larger than the caches, split across `threads` scoped threads, best of `passes`.

use std::time::Instant;

/// Bytes per second read by `threads` threads summing a 1 GiB buffer, best of `passes`.
pub fn read_bandwidth(threads: usize, passes: usize) -> f64 {
    let words = (1usize << 30) / 8;
    let buf: Vec<u64> = (0..words as u64).collect();
    let part = words.div_ceil(threads.max(1));
    let mut best = 0.0f64;
    for _ in 0..passes {
        let start = Instant::now();
        let sum: u64 = std::thread::scope(|s| {
            let handles: Vec<_> = buf
                .chunks(part)
                .map(|c| {
                    s.spawn(move || {
                        mllm_dsl::simd::widest(
                            #[inline(always)]
                            || c.iter().fold(0u64, |a, &b| a.wrapping_add(b)),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap_or(0)).fold(0, u64::wrapping_add)
        });
        std::hint::black_box(sum);
        best = best.max((words * 8) as f64 / start.elapsed().as_secs_f64());
    }
    best
}
