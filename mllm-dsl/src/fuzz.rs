//! A small mutation fuzzer for the parsers of untrusted files, on the stable toolchain.
//!
//! ```no_run
//! mllm_dsl::fuzz::run("hf_config", &[br#"{"model_type": "qwen3"}"#.to_vec()], |bytes| {
//!     let _ = std::str::from_utf8(bytes).map(|t| t.len()); // the parser under test; must not panic
//! });
//! ```
//!
//! Each target mutates its seed inputs (bit flips, interesting bytes and numbers, cut, repeated
//! and spliced ranges) with a fixed-seed ChaCha generator and calls the target on each. A panic
//! is a crash: the input is written to `target/fuzz-crashes/<target>-<n>.bin` and the run fails,
//! so the input can become a regression test. Runs last `MLLM_FUZZ_SECONDS` (default 2, so CI
//! stays fast; set e.g. 600 for a long local run) and print the number of executions.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Environment variable with the duration of each target, in seconds.
pub const SECONDS_VAR: &str = "MLLM_FUZZ_SECONDS";
/// Inputs grow by at most this much over their seed, so memory stays bounded.
const MAX_LEN: usize = 1 << 16;

/// Tokens that often break parsers of numbers, sizes and JSON.
const INTERESTING: &[&[u8]] = &[
    b"0",
    b"-1",
    b"1e308",
    b"1e-320",
    b"1e39",
    b"-0",
    b"4294967296",
    b"18446744073709551615",
    b"18446744073709551616",
    b"9007199254740993",
    b"100000000",
    b"1e9",
    b"0.5",
    b"null",
    b"true",
    b"[]",
    b"{}",
    b"\"\"",
    b"\"a\"",
    b"\\u0000",
    b"\xff",
    b"\x00",
    b"[[[[[[[[",
    b"}",
    b"]",
    b",",
    b":",
    b"NaN",
    b"inf",
    b"%",
    b"\n",
];

/// Runs `target` on mutations of `seeds` for [`SECONDS_VAR`] seconds; panics with the saved
/// crash file if `target` panics on any input. Returns the number of inputs tried.
pub fn run(name: &str, seeds: &[Vec<u8>], target: impl Fn(&[u8])) -> u64 {
    assert!(!seeds.is_empty(), "fuzz target {name} needs at least one seed");
    let seconds: f64 = std::env::var(SECONDS_VAR).ok().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut rng = ChaCha8Rng::seed_from_u64(
        name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)),
    );
    let mut runs = 0u64;
    // The seeds themselves first, then mutations of mutations (reset to a seed now and then).
    let mut queue: Vec<Vec<u8>> = seeds.to_vec();
    // Expected panics are reported below with their input; the default hook would print each.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    while Instant::now() < deadline || runs < seeds.len() as u64 {
        let input = if (runs as usize) < seeds.len() {
            seeds[runs as usize].clone()
        } else {
            let base = &queue[rng.next_u32() as usize % queue.len()];
            let other = &seeds[rng.next_u32() as usize % seeds.len()];
            mutate(base, other, &mut rng)
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| target(&input)));
        if let Err(payload) = outcome {
            std::panic::set_hook(hook);
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz-crashes");
            let _ = std::fs::create_dir_all(&dir);
            let file = dir.join(format!("{name}-{runs}.bin"));
            let _ = std::fs::write(&file, &input);
            panic!("fuzz target {name} panicked after {runs} runs: {message}; input saved to {}", file.display());
        }
        runs += 1;
        if queue.len() < 256 && rng.next_u32() % 8 == 0 {
            queue.push(input);
        } else if rng.next_u32() % 64 == 0 {
            queue.truncate(seeds.len());
        }
    }
    std::panic::set_hook(hook);
    eprintln!("fuzz {name}: {runs} inputs in {seconds} s, no crash");
    runs
}

/// One to four random edits of `base`; `other` is spliced from.
pub fn mutate(base: &[u8], other: &[u8], rng: &mut ChaCha8Rng) -> Vec<u8> {
    let mut out = base.to_vec();
    let below = |rng: &mut ChaCha8Rng, n: usize| if n == 0 { 0 } else { rng.next_u32() as usize % n };
    for _ in 0..1 + below(rng, 4) {
        let len = out.len();
        match below(rng, 8) {
            0 if len > 0 => {
                let i = below(rng, len);
                out[i] ^= 1 << below(rng, 8);
            }
            1 if len > 0 => {
                let i = below(rng, len);
                out[i] = (rng.next_u32() & 0xff) as u8;
            }
            2 => {
                let token = INTERESTING[below(rng, INTERESTING.len())];
                let at = below(rng, len + 1);
                out.splice(at..at, token.iter().copied());
            }
            3 if len > 0 => {
                // Replace a run of digits (a number in the text) by an interesting token.
                let i = below(rng, len);
                let start =
                    (0..=i).rev().take_while(|&j| out[j].is_ascii_digit() || out[j] == b'.').last().unwrap_or(i);
                let end =
                    (i..len).take_while(|&j| out[j].is_ascii_digit() || out[j] == b'.').last().map_or(i, |e| e + 1);
                let token = INTERESTING[below(rng, INTERESTING.len())];
                out.splice(start..end.max(start), token.iter().copied());
            }
            4 if len > 0 => {
                let a = below(rng, len);
                let b = a + below(rng, (len - a).min(64) + 1);
                out.drain(a..b);
            }
            5 if len > 0 => {
                let a = below(rng, len);
                let b = a + below(rng, (len - a).min(64) + 1);
                let chunk = out[a..b].to_vec();
                let at = below(rng, len + 1);
                out.splice(at..at, chunk);
            }
            6 if !other.is_empty() => {
                let a = below(rng, other.len());
                let b = a + below(rng, other.len() - a + 1);
                let at = below(rng, len + 1);
                let end = (at + below(rng, len - at + 1)).min(len);
                out.splice(at..end, other[a..b].iter().copied());
            }
            _ => out.truncate(below(rng, len + 1)),
        }
        out.truncate(base.len() + MAX_LEN);
    }
    out
}
