//! The machine's memory read bandwidth, as the benches' rooflines divide by it: a sum over a
//! buffer far larger than the caches, split across `threads` scoped threads, best of `passes`.
//!
//! The buffer is memory of the packed weights' kind ([`backend_cpu::kernels::WeightBuf`]: on
//! transparent huge pages where Linux grants them), so the roofline is what the weight stream
//! could reach. On 4 KiB pages the same passes can read up to a fifth slower
//! (`scripts/page-size-read.c`), which would flatter every fraction of the roofline.

use std::time::Instant;

/// Bytes per second read by `threads` threads summing a 1 GiB buffer, best of `passes`.
pub fn read_bandwidth(threads: usize, passes: usize) -> f64 {
    let words = (1usize << 30) / 8;
    let mut buf = backend_cpu::kernels::WeightBuf::<u64>::zeroed(words);
    for (i, w) in buf.iter_mut().enumerate() {
        *w = i as u64;
    }
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
