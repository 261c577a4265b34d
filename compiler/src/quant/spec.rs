//! Per-tensor quantization parameters and the kinds of QDQ points in mllm's Qwen3 recipe.
//!
//! A QDQ point attaches a scale and zero point to a value; it is metadata, not an op. Its kind
//! decides how the parameters are found (observed during calibration, or fixed) and how the value
//! is stored on the NPU:
//!
//! | kind | storage | range | parameters |
//! |---|---|---|---|
//! | [`QdqKind::Activation`] | u16 | 0..=65535 | MinMax observer, per-tensor affine, eps 1e-4/65535 |
//! | [`QdqKind::KvCache`] | u8 | 0..=255 | MinMax observer, "symmetric" quint8: zero point 128 |
//! | [`QdqKind::Fixed`] | u16 | 0..=65535 | given, e.g. sigmoid output 1/65536 with zero point 0 |
//! | [`QdqKind::Constant`] | u16 | 0..=65535 | observed like an activation; the value becomes a static u16 |
//! | [`QdqKind::RopeTable`] | u16 | 0..=65535 | observed like an activation; the table is exported as u16 |

use super::observer::{MinMaxObserver, ObserverScheme};
use super::QuantError;

/// Smallest u16 code.
pub const U16_QMIN: i32 = 0;
/// Largest u16 code.
pub const U16_QMAX: i32 = 65535;
/// Smallest u8 code.
pub const U8_QMIN: i32 = 0;
/// Largest u8 code.
pub const U8_QMAX: i32 = 255;
/// Zero point torch gives a `per_tensor_symmetric` observer of dtype uint8 (the KV cache); QNN
/// encodes it as the fixed offset -128.
pub const KV_ZERO_POINT: i32 = 128;

/// Observer eps of every 16-bit QDQ in pymllm (`DEFAULT_EPS_16BIT = 0.0001 / 65535`), stored by
/// torch as an `f32` buffer.
pub const EPS_16BIT: f32 = (1e-4_f64 / 65535.0) as f32;
/// Observer eps of 8-bit QDQs in pymllm (`DEFAULT_EPS_8BIT = 0.0001 / 255`), as `f32`.
pub const EPS_8BIT: f32 = (1e-4_f64 / 255.0) as f32;

/// Scale of the sigmoid output QDQ (`FixedActivationQDQ(scale=1/65536, zero_point=0)`).
pub const SIGMOID_SCALE: f32 = 1.0 / 65536.0;

/// Per-tensor affine parameters: `real = (q - zero_point) * scale`, `q` in `qmin..=qmax`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QuantParams {
    pub scale: f32,
    pub zero_point: i32,
    pub qmin: i32,
    pub qmax: i32,
}

impl QuantParams {
    /// Checks what torch's fake-quant kernels require (zero point inside the range) plus what a
    /// deployable encoding needs (a finite, positive scale and a non-empty range).
    pub fn new(scale: f32, zero_point: i32, qmin: i32, qmax: i32) -> Result<Self, QuantError> {
        let invalid = |reason| QuantError::InvalidParams { scale, zero_point, qmin, qmax, reason };
        if !(scale.is_finite() && scale > 0.0) {
            return Err(invalid("scale must be finite and greater than 0"));
        }
        if qmin >= qmax {
            return Err(invalid("qmin must be less than qmax"));
        }
        if zero_point < qmin || zero_point > qmax {
            return Err(invalid("zero_point must lie within qmin..=qmax"));
        }
        Ok(Self { scale, zero_point, qmin, qmax })
    }

    /// u16 per-tensor asymmetric (activations, norm and embedding weights, RoPE tables).
    pub fn u16_affine(scale: f32, zero_point: i32) -> Result<Self, QuantError> {
        Self::new(scale, zero_point, U16_QMIN, U16_QMAX)
    }

    /// The KV cache's u8 "symmetric" parameters: range 0..=255 with zero point 128.
    pub fn kv_u8(scale: f32) -> Result<Self, QuantError> {
        Self::new(scale, KV_ZERO_POINT, U8_QMIN, U8_QMAX)
    }

    /// The sigmoid output's fixed parameters: scale 1/65536, zero point 0, u16 range.
    pub fn sigmoid_output() -> Self {
        Self { scale: SIGMOID_SCALE, zero_point: 0, qmin: U16_QMIN, qmax: U16_QMAX }
    }

    /// The offset QNN's `SCALE_OFFSET` encoding wants: QNN dequantizes as `scale * (q + offset)`.
    pub fn qnn_offset(&self) -> i32 {
        -self.zero_point
    }

    /// Whether every code fits `storage`.
    pub fn fits(&self, storage: StorageType) -> bool {
        let (lo, hi) = storage.range();
        self.qmin >= lo && self.qmax <= hi
    }
}

/// The integer type a quantized value is stored in on the NPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StorageType {
    U8,
    U16,
}

impl StorageType {
    /// Full code range of the type.
    pub fn range(self) -> (i32, i32) {
        match self {
            StorageType::U8 => (U8_QMIN, U8_QMAX),
            StorageType::U16 => (U16_QMIN, U16_QMAX),
        }
    }
}

/// What a QDQ point is, which fixes how its parameters are found and how its value is stored.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum QdqKind {
    /// `ActivationQDQ(bits=16)`: u16 per-tensor affine from a MinMax observer.
    Activation,
    /// `ActivationQDQ(bits=8, qscheme=per_tensor_symmetric)`: the KV cache, u8 with zero point 128.
    KvCache,
    /// `FixedActivationQDQ`: parameters given up front (the sigmoid output).
    Fixed(QuantParams),
    /// A scalar constant (`scaling_qdq`, `neg_20_qdq`): observed like an activation, then the
    /// compiler turns the value into a static u16 (see
    /// [`quantize_constant`](super::fake_quant::quantize_constant)).
    Constant,
    /// A RoPE sin/cos table: observed like an activation, then exported as u16 with the export
    /// rounding of [`export_u16`](super::uint16::export_u16).
    RopeTable,
}

impl QdqKind {
    /// The storage type of values at this point.
    pub fn storage(&self) -> StorageType {
        match self {
            QdqKind::KvCache => StorageType::U8,
            QdqKind::Fixed(p) if p.fits(StorageType::U8) => StorageType::U8,
            _ => StorageType::U16,
        }
    }

    /// A fresh observer for calibrating this point, or `None` when the parameters are fixed.
    pub fn observer(&self) -> Option<MinMaxObserver> {
        match self {
            QdqKind::Activation | QdqKind::Constant | QdqKind::RopeTable => {
                Some(MinMaxObserver::new(ObserverScheme::activation_u16()))
            }
            QdqKind::KvCache => Some(MinMaxObserver::new(ObserverScheme::KvSymmetricU8 { eps: EPS_8BIT })),
            QdqKind::Fixed(_) => None,
        }
    }

    /// The fixed parameters, if this kind has them.
    pub fn fixed_params(&self) -> Option<QuantParams> {
        match self {
            QdqKind::Fixed(p) => Some(*p),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_constants_are_the_f32_rounding_of_the_python_doubles() {
        // 0.0001 / 65535 = 1.5259021896696422e-09 in double; torch stores it as f32.
        assert_eq!(EPS_16BIT, 1.525_902_2e-9_f32);
        assert_eq!(EPS_16BIT as f64, (1.525_902_189_669_642_2e-9_f64 as f32) as f64);
        assert_eq!(EPS_8BIT, (3.921_568_627_450_98e-7_f64) as f32);
    }

    #[test]
    fn params_validation_names_the_problem() {
        assert!(QuantParams::u16_affine(0.5, 100).is_ok());
        for (s, zp, lo, hi) in [
            (0.0f32, 0, 0, 10),
            (-1.0, 0, 0, 10),
            (f32::NAN, 0, 0, 10),
            (f32::INFINITY, 0, 0, 10),
            (1.0, 11, 0, 10),
            (1.0, -1, 0, 10),
            (1.0, 0, 10, 10),
        ] {
            let err = QuantParams::new(s, zp, lo, hi).unwrap_err();
            assert!(matches!(err, QuantError::InvalidParams { .. }), "{s} {zp} {lo} {hi}");
        }
        let kv = QuantParams::kv_u8(0.01).unwrap();
        assert_eq!((kv.zero_point, kv.qmin, kv.qmax), (128, 0, 255));
        assert_eq!(kv.qnn_offset(), -128);
    }

    #[test]
    fn kinds_map_to_storage_and_observers() {
        assert_eq!(QdqKind::Activation.storage(), StorageType::U16);
        assert_eq!(QdqKind::KvCache.storage(), StorageType::U8);
        let sig = QdqKind::Fixed(QuantParams::sigmoid_output());
        assert_eq!(sig.storage(), StorageType::U16);
        assert!(sig.observer().is_none());
        assert_eq!(sig.fixed_params().unwrap().scale, 1.0 / 65536.0);
        let fixed_u8 = QdqKind::Fixed(QuantParams::new(0.1, 3, 0, 255).unwrap());
        assert_eq!(fixed_u8.storage(), StorageType::U8);
        assert!(QdqKind::Constant.observer().is_some());
        assert!(matches!(QdqKind::KvCache.observer().unwrap().scheme(), ObserverScheme::KvSymmetricU8 { .. }));
    }
}
