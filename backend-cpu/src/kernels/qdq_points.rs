//! A fused kernel's QDQ points ([`mllm_dsl::fused`]): each a fake quantizer, or `None`, the
//! identity (float mode).

use compiler::quant::FakeQuantizer;

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
