//! bf16 products on AMX tiles (Intel AMX-BF16): `tdpbf16ps` multiplies a 16-row tile of bf16
//! pairs (16 rows × 32 values of `x`) with a 32 × 16 tile of the panel and adds the 16 × 16
//! products, each summed over 32 values, into an f32 tile: 8,192 multiply-adds an instruction,
//! against the 32 of `vdpbf16ps`. The products are the same exact bf16 products summed in f32
//! (the instruction treats bf16 denormals as zero, as `vdpbf16ps` does); only the order of the
//! f32 sums differs.
//!
//! A B tile row holds one pair of panel rows for 16 columns, the two values of a column side by
//! side. Interleaving two bf16 panel rows word by word (`vpunpcklwd` / `vpunpckhwd`, as the
//! `vdpbf16ps` tile does in registers) gives such rows for the columns of
//! [`super::bf16_dot::UNPACKED_LO`] and [`super::bf16_dot::UNPACKED_HI`]. The panel is laid out
//! that way 32 rows at a time into two 2 KiB buffers that stay in L1: the vector units lay out
//! the next 32 rows while the tile unit multiplies the current ones (laying out the whole panel
//! first, then multiplying, took about as long as the products themselves). The sums come out
//! in those column orders and are put back in column order once, when the tile is stored.
//!
//! Linux grants a process the AMX register state only on request (`arch_prctl`
//! `ARCH_REQ_XCOMP_PERM`); [`available`] asks once, and a CPU or kernel without it leaves the
//! `vdpbf16ps` tile in charge.

use super::bf16_dot::store_row;
use super::packed::PANEL;
use std::arch::asm;
use std::arch::x86_64::*;

/// Rows of `x` per A tile and columns per C tile.
pub(crate) const TILE_ROWS: usize = 16;
/// Values of `x` (32 bf16, 16 pairs) per A tile row: K must be a multiple of it.
pub(crate) const TILE_K: usize = 32;
/// Fewer rows than this stay on the `vdpbf16ps` tile: every A tile is 16 rows and every panel
/// is laid out again, whatever the row count, so a decode row (1 to 4 rows) would pay both for
/// the few products it needs.
pub(crate) const MIN_ROWS: usize = 8;

/// Whether this CPU and kernel run [`panel_product`] (asked once per process).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| cpu_has_amx_bf16() && super::bf16_dot::available() && os_grants_tiles())
}

/// CPUID leaf 7, subleaf 0, EDX: bit 22 AMX-BF16, bit 24 AMX-TILE (Intel SDM vol. 2, CPUID).
fn cpu_has_amx_bf16() -> bool {
    // CPUID leaf 0 reports the highest leaf; leaf 7 is read only when it exists.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// Linux: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (syscall 158, code 0x1023,
/// feature 18) returns 0 once the process may use the tile data registers.
#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    let ret: i64;
    // SAFETY: the arch_prctl syscall only changes this process's permitted xsave features; it
    // reads no memory of ours. `syscall` clobbers rcx and r11.
    unsafe {
        asm!("syscall", inlateout("rax") 158i64 => ret, in("rdi") 0x1023i64, in("rsi") 18i64,
             lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// Whether [`panel_product`] applies to a product of `rows` rows and `k` values.
pub(crate) fn applies(rows: usize, k: usize) -> bool {
    rows >= MIN_ROWS && k > 0 && k.is_multiple_of(TILE_K) && available()
}

/// Palette 1 with tiles 0-7 all 16 rows of 64 bytes: C tiles 0-3, A tiles 4-5, B tiles 6-7.
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

const CONFIG: TileConfig = {
    let mut b = [0u8; 64];
    b[0] = 1;
    let mut t = 0;
    while t < 8 {
        b[16 + 2 * t] = 64;
        b[48 + t] = TILE_ROWS as u8;
        t += 1;
    }
    TileConfig(b)
};

/// How far ahead of its loads [`lay_out`] asks for the panel (4 blocks of 32 rows): the panel
/// comes from DRAM in a model's prefill. Alternating runs, Qwen3-0.6B's 128-token prefill in
/// chunks of 32, `Conv2D (rows)`: 289–340 ms with it against 292–430 ms without.
const AHEAD_BYTES: usize = 8192;

/// Two B tiles (16 pair rows × 16 lanes each): one block of [`TILE_K`] panel rows laid out.
#[repr(C, align(64))]
struct BlockLayout([u32; 512]);

/// `c[r, 0..cols] = init[0..cols] + x[r, :] @ panel` for `r` in `0..rows`, as
/// [`super::bf16_dot::panel_product`] computes it, on AMX tiles.
///
/// # Safety
/// [`applies`]`(rows, k)`; `x` holds `rows.next_multiple_of(TILE_ROWS)` readable rows of
/// `k / 2` pairs (the rows past `rows` are read, their sums dropped), `panel` `k * PANEL` bf16,
/// `c` `rows` rows of stride `ldc` with `cols <= PANEL` writable f32 each, not aliased during the
/// call.
#[target_feature(enable = "avx512f,avx512bw")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn panel_product(
    x: *const u32,
    rows: usize,
    k: usize,
    panel: *const u16,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    init: &[f32; PANEL],
) {
    let stride = k / 2 * 4;
    let blocks = k / TILE_K;
    // The next block is laid out while the tile unit multiplies the current one.
    let mut ring = [BlockLayout([0; 512]), BlockLayout([0; 512])];
    // The C tiles stored: [A tile][lo, hi][16 rows × 16 lanes].
    let mut sums = [[[0f32; 256]; 2]; 2];
    asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
    let mut r = 0;
    while r < rows {
        let two = rows - r > TILE_ROWS;
        let a0 = x.add(r * k / 2).cast::<u8>();
        let a1 = a0.add(TILE_ROWS * stride);
        asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
        lay_out(panel, 0, &mut ring[0]);
        for kb in 0..blocks {
            let b = ring[kb % 2].0.as_ptr().cast::<u8>();
            let a = kb * 64;
            asm!(
                "tileloadd tmm6, [{blo} + {bs}*1]",
                "tileloadd tmm7, [{bhi} + {bs}*1]",
                "tileloadd tmm4, [{a0} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                blo = in(reg) b, bhi = in(reg) b.add(1024), bs = in(reg) 64usize,
                a0 = in(reg) a0.add(a), s = in(reg) stride,
                options(nostack, readonly),
            );
            if two {
                asm!(
                    "tileloadd tmm5, [{a1} + {s}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a1 = in(reg) a1.add(a), s = in(reg) stride,
                    options(nostack, readonly),
                );
            }
            if kb + 1 < blocks {
                lay_out(panel, kb + 1, &mut ring[(kb + 1) % 2]);
            }
        }
        asm!(
            "tilestored [{c0} + {s}*1], tmm0",
            "tilestored [{c1} + {s}*1], tmm1",
            "tilestored [{c2} + {s}*1], tmm2",
            "tilestored [{c3} + {s}*1], tmm3",
            c0 = in(reg) sums[0][0].as_mut_ptr(), c1 = in(reg) sums[0][1].as_mut_ptr(),
            c2 = in(reg) sums[1][0].as_mut_ptr(), c3 = in(reg) sums[1][1].as_mut_ptr(),
            s = in(reg) 64usize,
            options(nostack),
        );
        let n = (rows - r).min(2 * TILE_ROWS);
        store(&sums, n, c.add(r * ldc), ldc, cols, init);
        r += n;
    }
    asm!("tilerelease", options(nostack, nomem));
}

/// Lays out panel rows `32 * block..32 * block + 32` as B tiles: the `vpunpcklwd` tile (16 pair
/// rows of the columns of `UNPACKED_LO`), then the `vpunpckhwd` tile.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn lay_out(panel: *const u16, block: usize, dst: &mut BlockLayout) {
    let dst = dst.0.as_mut_ptr();
    for i in 0..16 {
        let j = block * 16 + i;
        // (A prefetch past the panel's end is harmless.)
        let ahead = panel.add(2 * j * PANEL).cast::<i8>().wrapping_add(AHEAD_BYTES);
        _mm_prefetch::<_MM_HINT_T0>(ahead);
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
        let a = _mm512_loadu_si512(panel.add(2 * j * PANEL).cast());
        let b = _mm512_loadu_si512(panel.add((2 * j + 1) * PANEL).cast());
        _mm512_store_si512(dst.add(i * 16).cast(), _mm512_unpacklo_epi16(a, b));
        _mm512_store_si512(dst.add(256 + i * 16).cast(), _mm512_unpackhi_epi16(a, b));
    }
}

/// Rows `0..n` of the stored C tiles, back in column order, plus `init`, into `c`.
#[target_feature(enable = "avx512f")]
unsafe fn store(sums: &[[[f32; 256]; 2]; 2], n: usize, c: *mut f32, ldc: usize, cols: usize, init: &[f32; PANEL]) {
    for i in 0..n {
        let (t, row) = (i / TILE_ROWS, i % TILE_ROWS);
        let lo = _mm512_loadu_ps(sums[t][0].as_ptr().add(row * 16));
        let hi = _mm512_loadu_ps(sums[t][1].as_ptr().add(row * 16));
        store_row(lo, hi, c.add(i * ldc), cols, init);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tile against f64 sums of the same bf16 values, for row counts around the 16- and
    /// 32-row blocks, K of one and three tile depths, a full and a partial panel, with `init`.
    /// (Reports, and checks nothing, on a CPU or kernel without AMX-BF16.)
    #[test]
    fn tile_products_equal_the_bf16_sums() {
        if !available() {
            eprintln!("AMX-BF16 is not on this CPU or not granted by its kernel: the AMX tile is not run here");
            return;
        }
        let mut rng = crate::rng::SplitMix64::new(7);
        let mut next = move || rng.uniform_pm1();
        for k in [32, 96] {
            let w: Vec<half::bf16> = (0..k * PANEL).map(|_| half::bf16::from_f32(next())).collect();
            // Panel rows in the bf16 slot order.
            let mut panel = vec![0u16; k * PANEL];
            for r in 0..k {
                for c in 0..PANEL {
                    panel[r * PANEL + super::super::packed::bf16_slot(c)] = w[r * PANEL + c].to_bits();
                }
            }
            let init: [f32; PANEL] = std::array::from_fn(|_| next());
            for rows in [8, 16, 17, 32, 45] {
                let x: Vec<f32> = (0..rows * k).map(|_| next()).collect();
                // SAFETY: available() includes AVX-512 BF16; x holds rows * k values.
                let pairs = unsafe { super::super::bf16_dot::pairs(&x, rows, k, TILE_ROWS) };
                for cols in [PANEL, 20] {
                    let ldc = cols + 3;
                    let mut c = vec![f32::NAN; rows * ldc];
                    // SAFETY: applies(rows, k); pairs is padded by 16 rows; c holds rows rows of ldc.
                    unsafe { panel_product(pairs.as_ptr(), rows, k, panel.as_ptr(), c.as_mut_ptr(), ldc, cols, &init) };
                    for r in 0..rows {
                        for j in 0..ldc {
                            let got = c[r * ldc + j];
                            if j >= cols {
                                assert!(got.is_nan(), "rows {rows} k {k} cols {cols}: wrote column {j} of row {r}");
                                continue;
                            }
                            let want = init[j] as f64
                                + (0..k)
                                    .map(|i| half::bf16::from_f32(x[r * k + i]).to_f64() * w[i * PANEL + j].to_f64())
                                    .sum::<f64>();
                            let tol = 1e-6 * (k as f64 + 1.0);
                            assert!(
                                (got as f64 - want).abs() <= tol,
                                "rows {rows} k {k} cols {cols} [{r}, {j}]: {got} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
