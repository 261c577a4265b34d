//! torch-exact per-tensor fake quantization, integer codes, and mllm's constant rule.
//!
//! torch's CPU kernel for `fake_quantize_per_tensor_affine` computes, in this order and in `f32`:
//! `inv_scale = 1 / scale`; `q = zero_point + nearbyint(x * inv_scale)`; `q = clamp(q, qmin, qmax)`;
//! `out = (q - zero_point) * scale`. `nearbyint` rounds half to even, and a NaN input clamps to
//! `qmin`. [`FakeQuantizer`] performs exactly these steps, so calibration and fake-quant runs
//! match pymllm's numbers.
//!
//! The export paths of pymllm round differently (`round(x / scale + zero_point)`); they live in
//! [`uint16`](super::uint16). mllm's C++ compiler quantizes scalar constants in yet another way
//! ([`quantize_constant`]).

use super::rounding::{round_half_even, round_half_even_within_limit};
use super::spec::{QuantParams, StorageType};
use super::QuantError;

/// Where [`FakeQuantizer::code`] cuts `x * inv_scale` when the code range, offset by the zero
/// point, lies well inside it (every u8 / u16 encoding): 2^22, up to which
/// [`round_half_even_within_limit`] is exact.
const ROUNDING_LIMIT: f32 = 4_194_304.0;

/// Precomputed form of [`QuantParams`] for per-element loops.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FakeQuantizer {
    params: QuantParams,
    inv_scale: f32,
    zero_point: f32,
    qmin: f32,
    qmax: f32,
    /// Whether products may be cut at [`ROUNDING_LIMIT`] without changing any code.
    cut: bool,
}

impl FakeQuantizer {
    pub fn new(params: &QuantParams) -> Self {
        Self {
            params: *params,
            // torch: `float inv_scale = 1.0f / sc;`
            inv_scale: 1.0 / params.scale,
            zero_point: params.zero_point as f32,
            qmin: params.qmin as f32,
            qmax: params.qmax as f32,
            cut: [params.qmin, params.qmax, params.zero_point].iter().all(|v| v.unsigned_abs() < 1 << 20),
        }
    }

    pub fn params(&self) -> &QuantParams {
        &self.params
    }

    /// The clamped integer code torch's fake-quant kernel computes for `x`.
    #[inline(always)]
    pub fn code(&self, x: f32) -> i32 {
        self.clamped(x) as i32
    }

    /// [`code`](Self::code) as the f32 it is computed in.
    #[inline(always)]
    fn clamped(&self, x: f32) -> f32 {
        // `z_point + nearbyint(x * inv_scale)` is an f32 sum in torch; `max`/`min` send NaN to
        // qmin exactly as `fmin(fmax(q, qmin), qmax)` does.
        let v = x * self.inv_scale;
        if self.cut {
            // Products beyond +-2^22 clamp to the range's end either way, so they are cut there
            // first and the rounding needs no branch (the loops vectorize); NaN becomes -2^22
            // (`NaN > -2^22` is false), which clamps to qmin as before. The code is never NaN
            // or -0 after the cut, so the last two selects are `max`/`min` as well.
            let cut = select_min(select_max(v, -ROUNDING_LIMIT), ROUNDING_LIMIT);
            let q = self.zero_point + round_half_even_within_limit(cut);
            select_min(select_max(q, self.qmin), self.qmax)
        } else {
            (self.zero_point + round_half_even(v)).max(self.qmin).min(self.qmax)
        }
    }

    /// `x` quantized and dequantized again.
    #[inline(always)]
    pub fn fake(&self, x: f32) -> f32 {
        if self.cut {
            self.fake_in_f32(x)
        } else {
            (self.code(x) - self.params.zero_point) as f32 * self.params.scale
        }
    }

    /// [`fake`](Self::fake) for an encoding whose codes and zero point are below 2^20 (`cut`):
    /// `code - zero_point` is then exact in f32, so the value is the integer form's without its
    /// float-to-int conversion, which does not vectorize (it saturates and maps NaN to 0).
    #[inline(always)]
    fn fake_in_f32(&self, x: f32) -> f32 {
        (self.clamped(x) - self.zero_point) * self.params.scale
    }

    /// Fake-quantizes `xs` in place. Inlined so a caller's target features (`simd::widest`)
    /// widen the loop.
    #[inline]
    pub fn apply_in_place(&self, xs: &mut [f32]) {
        if self.cut {
            xs.iter_mut().for_each(|x| *x = self.fake_in_f32(*x));
        } else {
            xs.iter_mut().for_each(|x| *x = self.fake(*x));
        }
    }

    /// Fake-quantizes `input` into `output` (same length). Inlined like
    /// [`apply_in_place`](Self::apply_in_place).
    #[inline]
    pub fn apply(&self, input: &[f32], output: &mut [f32]) -> Result<(), QuantError> {
        self.map_into(input, output, |o, v| *o = v)
    }

    /// [`apply`](Self::apply) into memory not yet initialized (a fresh buffer's spare capacity,
    /// which then needs no zeroing first); every element of `output` is written.
    #[inline]
    pub fn apply_uninit(&self, input: &[f32], output: &mut [std::mem::MaybeUninit<f32>]) -> Result<(), QuantError> {
        self.map_into(input, output, |o, v| _ = o.write(v))
    }

    /// The length check and loop of [`apply`](Self::apply) and
    /// [`apply_uninit`](Self::apply_uninit): `set(output[i], fake(input[i]))`.
    #[inline(always)]
    fn map_into<O>(&self, input: &[f32], output: &mut [O], set: impl Fn(&mut O, f32)) -> Result<(), QuantError> {
        if input.len() != output.len() {
            return Err(QuantError::LengthMismatch {
                what: "fake-quant output buffer",
                expected: input.len(),
                found: output.len(),
            });
        }
        let pairs = output.iter_mut().zip(input);
        if self.cut {
            pairs.for_each(|(o, &x)| set(o, self.fake_in_f32(x)));
        } else {
            pairs.for_each(|(o, &x)| set(o, self.fake(x)));
        }
        Ok(())
    }
}

/// `a` if it is above `b`, else `b` (also when either is NaN): exactly what x86's max
/// instruction computes, so one instruction where `f32::max` (the non-NaN operand) takes three.
#[inline(always)]
fn select_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// `a` if it is below `b`, else `b` (also when either is NaN): x86's min instruction.
#[inline(always)]
fn select_min(a: f32, b: f32) -> f32 {
    if a < b {
        a
    } else {
        b
    }
}

/// torch's `fake_quantize_per_tensor_affine` for one value.
pub fn fake_quantize(x: f32, params: &QuantParams) -> f32 {
    FakeQuantizer::new(params).fake(x)
}

/// The integer code of `x` with torch's fake-quant rounding (`round(x * (1/scale)) + zp`, clamped).
pub fn quantize(x: f32, params: &QuantParams) -> i32 {
    FakeQuantizer::new(params).code(x)
}

/// `(q - zero_point) * scale` in `f32` (one rounding: the integer difference is exact).
pub fn dequantize(q: i32, params: &QuantParams) -> f32 {
    (q - params.zero_point) as f32 * params.scale
}

/// Codes of `xs` for u16 storage, with fake-quant rounding.
pub fn quantize_slice_u16(xs: &[f32], params: &QuantParams) -> Result<Vec<u16>, QuantError> {
    check_storage(params, StorageType::U16)?;
    let fq = FakeQuantizer::new(params);
    Ok(xs.iter().map(|&x| fq.code(x) as u16).collect())
}

/// Codes of `xs` for u8 storage (the KV cache), with fake-quant rounding.
pub fn quantize_slice_u8(xs: &[f32], params: &QuantParams) -> Result<Vec<u8>, QuantError> {
    check_storage(params, StorageType::U8)?;
    let fq = FakeQuantizer::new(params);
    Ok(xs.iter().map(|&x| fq.code(x) as u8).collect())
}

/// Real values of u16 codes.
pub fn dequantize_slice_u16(codes: &[u16], params: &QuantParams) -> Vec<f32> {
    codes.iter().map(|&q| dequantize(i32::from(q), params)).collect()
}

/// Real values of u8 codes.
pub fn dequantize_slice_u8(codes: &[u8], params: &QuantParams) -> Vec<f32> {
    codes.iter().map(|&q| dequantize(i32::from(q), params)).collect()
}

fn check_storage(params: &QuantParams, storage: StorageType) -> Result<(), QuantError> {
    if params.fits(storage) {
        Ok(())
    } else {
        Err(QuantError::StorageRange { params: *params, storage })
    }
}

/// How mllm's `PTQPass` turns a scalar constant into a static code.
///
/// In double precision: `clamp(round(v / scale) + zero_point, qmin, qmax)` where `round` is C's
/// `std::round` (half away from zero, unlike torch). A symmetric spec (`symmetric = true`, the
/// `SymPerTensor` branch) leaves the zero point out. Example: `0.0` with scale `0.001/65535` and
/// zero point 65535 becomes 65535.
pub fn quantize_constant(value: f32, params: &QuantParams, symmetric: bool) -> i32 {
    let mut q = (f64::from(value) / f64::from(params.scale)).round();
    if !symmetric {
        q += f64::from(params.zero_point);
    }
    // C++ casts to int32 before clamping; clamping in f64 first gives the same result for every
    // value the cast can represent and stays defined for the rest.
    if q.is_nan() {
        return params.qmin;
    }
    q.clamp(f64::from(params.qmin), f64::from(params.qmax)) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn u16p(scale: f32, zp: i32) -> QuantParams {
        QuantParams::u16_affine(scale, zp).unwrap()
    }

    /// A literal transcription of torch's kernel, in the widths its C++ uses.
    fn torch_reference(x: f32, sc: f32, zp: i64, qmin: i64, qmax: i64) -> f32 {
        let inv_scale = 1.0f32 / sc;
        let qval_f: f32 = zp as f32 + (x * inv_scale).round_ties_even();
        let qval = f64::from(qval_f).max(qmin as f64).min(qmax as f64) as i64;
        (qval - zp) as f32 * sc
    }

    #[test]
    fn ties_round_to_even() {
        // scale 0.5: x = 0.25 -> 0.5 -> 0 ; 0.75 -> 1.5 -> 2 ; 1.25 -> 2.5 -> 2 ; -0.25 -> -0.5 -> -0
        let p = u16p(0.5, 10);
        assert_eq!(quantize(0.25, &p), 10);
        assert_eq!(quantize(0.75, &p), 12);
        assert_eq!(quantize(1.25, &p), 12);
        assert_eq!(quantize(-0.25, &p), 10);
        assert_eq!(quantize(-0.75, &p), 8);
        assert_eq!(fake_quantize(1.25, &p), 1.0);
        assert_eq!(fake_quantize(0.75, &p), 1.0);
    }

    #[test]
    fn clamps_to_the_range_and_sends_nan_to_qmin() {
        let p = u16p(1.0, 100);
        assert_eq!(quantize(-1000.0, &p), 0);
        assert_eq!(fake_quantize(-1000.0, &p), -100.0);
        assert_eq!(quantize(1e9, &p), 65535);
        assert_eq!(fake_quantize(1e9, &p), 65435.0);
        assert_eq!(quantize(f32::INFINITY, &p), 65535);
        assert_eq!(quantize(f32::NEG_INFINITY, &p), 0);
        assert_eq!(quantize(f32::NAN, &p), 0);
        assert_eq!(fake_quantize(f32::NAN, &p), -100.0);
    }

    #[test]
    fn multiplies_by_the_f32_reciprocal_not_divides() {
        // Find an x where round(x * (1/s)) != round(x / s) and check we follow torch.
        let s = 3.0e-5f32;
        let inv = 1.0f32 / s;
        let mut found = false;
        for k in 0..200_000 {
            let x = f32::from_bits(0x3c00_0000 + k * 31);
            if (x * inv).round_ties_even() != (x / s).round_ties_even() {
                let p = u16p(s, 0);
                assert_eq!(quantize(x, &p) as f32, (x * inv).round_ties_even());
                found = true;
                break;
            }
        }
        assert!(found, "no probe separated the two roundings");
    }

    #[test]
    fn matches_a_transcription_of_the_torch_kernel() {
        let params = [
            (1.5259022e-9f32, 0i32, 0i32, 65535i32),
            (3.051_802e-5, 32768, 0, 65535),
            (0.000_305_185_1, 65535, 0, 65535),
            (0.0123, 128, 0, 255),
            (1.0 / 65536.0, 0, 0, 65535),
            // A range too wide to cut products at 2^22.
            (0.5, 0, -(1 << 24), 1 << 24),
        ];
        let mut x = 0.123_f32;
        for (s, zp, lo, hi) in params {
            let p = QuantParams::new(s, zp, lo, hi).unwrap();
            let fq = FakeQuantizer::new(&p);
            let mut vs = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
            for i in 0..20_000 {
                // A deterministic spread of magnitudes and signs, mostly within the range, some
                // up to 10^7 times beyond it.
                x = (x * 1.618_034 + 0.377).fract() * if i % 2 == 0 { 1.0 } else { -1.0 };
                let beyond = [1.2f32, 1.2, 1.2, 1e3, 1e7][i % 5];
                vs.push(x * s * (hi - lo) as f32 * beyond);
            }
            let want: Vec<u32> =
                vs.iter().map(|&v| torch_reference(v, s, zp as i64, lo as i64, hi as i64).to_bits()).collect();
            for (&v, &w) in vs.iter().zip(&want) {
                assert_eq!(fq.fake(v).to_bits(), w, "x = {v}, params {p:?}");
            }
            // The slice loops (vectorized apart from the scalar form) give the same bits.
            let mut out = vec![0.0; vs.len()];
            fq.apply(&vs, &mut out).unwrap();
            let mut fresh: Vec<f32> = Vec::with_capacity(vs.len());
            fq.apply_uninit(&vs, &mut fresh.spare_capacity_mut()[..vs.len()]).unwrap();
            // SAFETY: `apply_uninit` wrote all vs.len() elements.
            unsafe { fresh.set_len(vs.len()) };
            fq.apply_in_place(&mut vs);
            for (i, (((o, f), inplace), w)) in out.iter().zip(&fresh).zip(&vs).zip(&want).enumerate() {
                assert_eq!((o.to_bits(), f.to_bits(), inplace.to_bits()), (*w, *w, *w), "value {i}, params {p:?}");
            }
        }
    }

    #[test]
    fn dequantize_is_exact_integer_times_scale() {
        let p = QuantParams::kv_u8(0.25).unwrap();
        assert_eq!(dequantize(128, &p), 0.0);
        assert_eq!(dequantize(0, &p), -32.0);
        assert_eq!(dequantize(255, &p), 31.75);
        let codes = quantize_slice_u8(&[-40.0, 0.1, 0.13, 31.8], &p).unwrap();
        assert_eq!(codes, vec![0, 128, 129, 255]);
        assert_eq!(dequantize_slice_u8(&codes, &p), vec![-32.0, 0.0, 0.25, 31.75]);
        assert!(matches!(quantize_slice_u8(&[0.0], &u16p(1.0, 0)), Err(QuantError::StorageRange { .. })));
        let u = u16p(0.5, 3);
        let codes = quantize_slice_u16(&[0.0, 1.0, -1.5], &u).unwrap();
        assert_eq!(codes, vec![3, 5, 0]);
        assert_eq!(dequantize_slice_u16(&codes, &u), vec![0.0, 1.0, -1.5]);
    }

    #[test]
    fn apply_checks_lengths_and_matches_scalar_path() {
        let p = u16p(0.1, 5);
        let fq = FakeQuantizer::new(&p);
        let xs = [0.0f32, 0.05, 0.15, -0.5, -0.6, 1.0];
        let mut out = [0.0f32; 6];
        fq.apply(&xs, &mut out).unwrap();
        let mut inplace = xs;
        fq.apply_in_place(&mut inplace);
        assert_eq!(out, inplace);
        for (o, x) in out.iter().zip(xs) {
            assert_eq!(*o, fake_quantize(x, &p));
        }
        // -0.6 is below the representable minimum (-0.5) and clamps.
        assert_eq!(out[4], (0 - 5) as f32 * 0.1);
        assert!(fq.apply(&xs, &mut [0.0; 5]).is_err());
        assert!(fq.apply_uninit(&xs, &mut [std::mem::MaybeUninit::uninit(); 7]).is_err());
    }

    #[test]
    fn constants_follow_mllms_ptq_rule() {
        let mask = u16p(0.001 / 65535.0, 65535);
        assert_eq!(quantize_constant(0.0, &mask, false), 65535);
        // -20 with neg_20_qdq-like parameters: scale 20/65535, zp 65535 -> 0.
        let neg20 = u16p(20.0 / 65535.0, 65535);
        assert_eq!(quantize_constant(-20.0, &neg20, false), 0);
        // Half away from zero: 2.5 -> 3 (torch would give 2).
        let unit = u16p(1.0, 0);
        assert_eq!(quantize_constant(2.5, &unit, false), 3);
        assert_eq!(quantize(2.5, &unit), 2);
        // Symmetric specs ignore the zero point.
        let kv = QuantParams::kv_u8(0.5).unwrap();
        assert_eq!(quantize_constant(10.0, &kv, true), 20);
        assert_eq!(quantize_constant(1e30, &unit, false), 65535);
        assert_eq!(quantize_constant(f32::NAN, &unit, false), 0);
    }
}
