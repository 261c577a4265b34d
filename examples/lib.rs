//! What the example mains share: the command-line flags several of them take ([`flags`]) and,
//! on hosts, the memory allocator every one of them runs with.

pub mod flags;

pub use flags::*;

/// mimalloc instead of the system allocator (glibc's malloc on Linux). The CPU backend runs a
/// model op by op, and each op makes and drops a few small blocks (its tensor, its shape, its
/// output): about 9,800 allocations a SmolLM2-135M decode step, two thirds of them 32-127 bytes.
/// On a 2-core Xeon VM, int4 decode with mimalloc against glibc, alternating runs: SmolLM2-135M
/// 1.05x (faster in 6 of 6), Qwen3-0.6B shapes 1.03x (6 of 6), prefill and bf16 unchanged. Built
/// without its transparent-huge-page advice (`no_thp`): with it, partly used 2 MiB heap pages
/// added 40 MB to SmolLM2's peak RSS (10 MB without). Android keeps bionic's allocator (the
/// phone build is checked without a C cross compiler).
#[cfg(not(target_os = "android"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
