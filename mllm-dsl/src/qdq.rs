//! QDQ points: where the NPU graph needs a quantized tensor.
//!
//! A QDQ point is metadata, not an op (mllm/nn ptq QDQ modules): it names the checkpoint entries that hold the
//! scale / zero point of a value. `qdq!(x, "up_proj_input_qdq")` in module `model.layers.0.mlp` resolves
//! to the key `model.layers.0.mlp.up_proj_input_qdq`, whose parameters live at
//! `<key>.fake_quant.scale` and `<key>.fake_quant.zero_point`.

use std::fmt;

/// mllm's QDQ helpers, one variant each.
#[derive(Clone, Debug, PartialEq)]
pub enum QdqKind {
    /// `ptq::QDQ` on an activation: uint16 per-tensor asymmetric (0..65535).
    Activation,
    /// `ptq::QDQ_KV`: uint8 "symmetric" (0..255) with zero point 128.
    KvCache,
    /// `FixedActivationQDQ`: parameters fixed by the model, e.g. the sigmoid output (1/65536, 0).
    Fixed { scale: f32, zero_point: i32 },
    /// A scalar constant with its own QDQ (`scaling_qdq`, `neg_20_qdq`).
    Constant,
    /// `ptq::QDQ_ROPE`: the sin/cos tables, stored pre-quantized as uint16.
    Rope,
    /// `ptq::QDQ_CONSTANT`: a top-level key without module prefix and without `.fake_quant`, whose
    /// parameters are fixed at compile time (`constant_zero`, `causal_mask`).
    Global { scale: f32, zero_point: i32 },
}

impl QdqKind {
    /// The printed tag: `act`, `kv`, `fixed`, `const`, `rope`, `global`.
    pub fn tag(&self) -> &'static str {
        match self {
            QdqKind::Activation => "act",
            QdqKind::KvCache => "kv",
            QdqKind::Fixed { .. } => "fixed",
            QdqKind::Constant => "const",
            QdqKind::Rope => "rope",
            QdqKind::Global { .. } => "global",
        }
    }

    /// The integer range of the quantized type.
    pub fn qrange(&self) -> (i32, i32) {
        match self {
            QdqKind::KvCache => (0, 255),
            _ => (0, 65535),
        }
    }
}

/// Suffix of a calibrated QDQ point's scale key.
const FAKE_QUANT_SCALE: &str = ".fake_quant.scale";

/// A resolved QDQ point: its kind and its full checkpoint key prefix.
#[derive(Clone, Debug, PartialEq)]
pub struct QdqAttr {
    pub kind: QdqKind,
    /// `model.layers.0.mlp.up_proj_input_qdq` (no `.fake_quant` suffix).
    pub key: String,
}

impl QdqAttr {
    /// Checkpoint key of the scale (`<key>.fake_quant.scale`, or `<key>.scale` for globals).
    pub fn scale_key(&self) -> String {
        match self.kind {
            QdqKind::Global { .. } => format!("{}.scale", self.key),
            _ => format!("{}{FAKE_QUANT_SCALE}", self.key),
        }
    }

    /// Checkpoint key of the zero point.
    pub fn zero_point_key(&self) -> String {
        match self.kind {
            QdqKind::Global { .. } => format!("{}.zero_point", self.key),
            _ => format!("{}.fake_quant.zero_point", self.key),
        }
    }

    /// Whether `key` is the checkpoint key of a calibrated QDQ point's scale
    /// (`<key>.fake_quant.scale`, [`QdqAttr::scale_key`] of a non-global point).
    pub fn is_calibrated_scale_key(key: &str) -> bool {
        key.ends_with(FAKE_QUANT_SCALE)
    }

    /// Parameters fixed by the model itself (no checkpoint lookup needed).
    pub fn fixed_params(&self) -> Option<(f32, i32)> {
        match self.kind {
            QdqKind::Fixed { scale, zero_point } | QdqKind::Global { scale, zero_point } => Some((scale, zero_point)),
            _ => None,
        }
    }
}

impl fmt::Display for QdqAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            QdqKind::Fixed { scale, zero_point } | QdqKind::Global { scale, zero_point } => {
                write!(f, "{}({:?}, {:?}, {})", self.kind.tag(), self.key, scale, zero_point)
            }
            _ => write!(f, "{}({:?})", self.kind.tag(), self.key),
        }
    }
}

/// Joins a module path and a QDQ name into the checkpoint key prefix.
pub fn qdq_key(module_path: &str, name: &str) -> String {
    if module_path.is_empty() {
        return name.to_string();
    }
    // Built directly rather than by `format!`: eager runs make one key per QDQ point and call
    // (about a thousand per decode step), and the formatting machinery cost more than the copy.
    let mut key = String::with_capacity(module_path.len() + 1 + name.len());
    key.push_str(module_path);
    key.push('.');
    key.push_str(name);
    key
}
