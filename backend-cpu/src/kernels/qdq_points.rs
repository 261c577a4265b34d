//! A fused kernel's QDQ points ([`mllm_dsl::fused`]): each a fake quantizer, or `None`, the
//! identity (float mode); and the block loop of the elementwise fused steps.

use super::KernelError;
use compiler::quant::FakeQuantizer;
use std::mem::MaybeUninit;

/// `N` points in the model's order.
pub type QdqPoints<'a, const N: usize> = [Option<&'a FakeQuantizer>; N];

/// `v` through point `p`.
#[inline(always)]
pub(crate) fn fake(p: Option<&FakeQuantizer>, v: f32) -> f32 {
    p.map_or(v, |q| q.fake(v))
}

/// `values` through point `p`, in place (inlined, so a caller's `simd::widest` widens the loop).
#[inline(always)]
pub(crate) fn fake_in_place(p: Option<&FakeQuantizer>, values: &mut [f32]) {
    if let Some(q) = p {
        q.apply_in_place(values)
    }
}

/// Values per block of an elementwise fused step (8 KiB of f32: its steps run in L1).
const BLOCK_VALUES: usize = 2048;

/// From this many values an elementwise fused step runs on the team (a prefill chunk; a decode
/// step's widths run inline).
const PARALLEL_VALUES: usize = 1 << 14;

/// `step(a, b, out)` on each block of [`BLOCK_VALUES`] of two inputs and the output, which must
/// all have one length (else an error naming `op` and the inputs `names`), widened to the CPU's
/// widest vectors (`step` inlined).
pub(crate) fn zip_blocks(
    op: &'static str,
    names: [&str; 2],
    (a, b): (&[f32], &[f32]),
    out: &mut [MaybeUninit<f32>],
    step: impl Fn(&[f32], &[f32], &mut [MaybeUninit<f32>]) + Sync,
) -> Result<(), KernelError> {
    if a.len() != out.len() || b.len() != out.len() {
        return Err(KernelError::InvalidArgument {
            op,
            reason: format!(
                "{} of {} values, {} of {} and an output of {} (all equal expected)",
                names[0],
                a.len(),
                names[1],
                b.len(),
                out.len()
            ),
        });
    }
    let block = |i: usize, out: &mut [MaybeUninit<f32>]| {
        let range = i * BLOCK_VALUES..i * BLOCK_VALUES + out.len();
        mllm_dsl::simd::widest(
            #[inline(always)]
            || step(&a[range.clone()], &b[range.clone()], out),
        )
    };
    super::threads::for_blocks(out, BLOCK_VALUES, PARALLEL_VALUES, block);
    Ok(())
}
