//! Quantization specs: how a value is stored on the NPU (mllm's `QuantizationSpec*`), and the
//! program-level table that lets several values share one spec.
//!
//! mllm attaches spec *objects* to values and shares them by pointer: a view's output gets the very
//! spec of its input, so solving one solves both. Here a spec lives once in [`Program::specs`] and
//! values refer to it by [`SpecId`] (value attribute `spec:$model.norm`), which makes the sharing
//! explicit in the printed IR. The printer names a spec after the first value (in print order) that
//! refers to it and prints the table after `@main`:
//!
//! ```text
//! quant.specs {
//!     $0 = Raw(Int32)
//!     $model.layers.1.Add.1 = AsymPerTensor(0, 65535, UInt16, Float32, Int32) [from:"model.norm_input_qdq", scale:1.2e-4, zero_point:31000]
//!     $lm_head.weight = LPBQ(-7, 7, 16, 3, 4, Int4LPBQ, Float32) [blocks:2, channels:128, from:"lm_head"]
//! }
//! ```
//!
//! Tables from printers that numbered specs (`s0 = ...`, `spec:s0`) still parse.
//!
//! A spec is *solved* when its parameters are known ([`SpecParams`]); `Raw` needs none. Per-tensor
//! parameters are small and stored inline; LPBQ parameters are references (checkpoint keys) to the
//! weight's codes and scales, which stay wherever the weights live.
//!
//! [`Program::specs`]: super::Program::specs

use super::{Attr, Attrs};
use crate::dtype::{DType, UnknownName};
use std::fmt;

/// Index of a spec in [`Program::specs`](super::Program::specs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpecId(pub u32);

impl SpecId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for SpecId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}", self.0)
    }
}

/// The shape of a quantization spec: kind and integer range, without parameters.
#[derive(Clone, Debug, PartialEq)]
pub enum QuantSpecKind {
    /// Not quantized: the value keeps its dtype (ids, masks as bool, float intermediates).
    Raw { dtype: DType },
    /// `real = scale * (q - zp)` with an implied zero point (the middle of the range: 128 for u8).
    SymPerTensor { quant_min: i32, quant_max: i32, quant_to: DType, scale_type: DType },
    /// `real = scale * (q - zero_point)`.
    AsymPerTensor { quant_min: i32, quant_max: i32, quant_to: DType, scale_type: DType, zero_point_type: DType },
    /// Low-power blockwise quantization of a linear weight: int4 codes, per-block integer scales
    /// (`scale_level_0_bitwidth` bits) and per-channel float scales along `ch_axis`.
    Lpbq {
        quant_min: i32,
        quant_max: i32,
        block_size: usize,
        ch_axis: usize,
        scale_level_0_bitwidth: u32,
        quant_to: DType,
        scale_1_type: DType,
    },
    /// Per-channel symmetric quantization of a weight along `ch_axis`: `real = scale[c] * q`, zero
    /// point 0 (the 8-bit linears of a mixed-precision checkpoint: int8 codes -127..=127).
    SymPerChannel { quant_min: i32, quant_max: i32, ch_axis: usize, quant_to: DType, scale_type: DType },
}

impl QuantSpecKind {
    /// mllm's `genSimpleQuantizationSpecAttr`: the spec a value of `dtype` gets when no rule says
    /// otherwise. `None` for dtypes that need a rule (LPBQ weights).
    pub fn simple(dtype: DType) -> Option<QuantSpecKind> {
        Some(match dtype {
            DType::U16Asym => QuantSpecKind::AsymPerTensor {
                quant_min: 0,
                quant_max: 65535,
                quant_to: DType::U16,
                scale_type: DType::F32,
                zero_point_type: DType::I32,
            },
            DType::U8Sym => QuantSpecKind::SymPerTensor {
                quant_min: 0,
                quant_max: 255,
                quant_to: DType::U8,
                scale_type: DType::F32,
            },
            DType::I4Lpbq => return None,
            other => QuantSpecKind::Raw { dtype: other },
        })
    }

    /// The u16 per-tensor asymmetric spec of activations (and of norm / embedding weights).
    pub fn u16_asym() -> QuantSpecKind {
        QuantSpecKind::simple(DType::U16Asym).expect("u16 asym has a simple spec")
    }

    /// mllm's LPBQ spec of a Conv2D weight in HWIO layout: codes -7..=7 in int4, 4-bit block
    /// scales, per-channel f32 scales along the output axis 3.
    pub fn lpbq_hwio(block_size: usize) -> QuantSpecKind {
        QuantSpecKind::Lpbq {
            quant_min: -7,
            quant_max: 7,
            block_size,
            ch_axis: 3,
            scale_level_0_bitwidth: 4,
            quant_to: DType::I4Lpbq,
            scale_1_type: DType::F32,
        }
    }

    /// Per-channel symmetric int8 of a Conv2D weight in HWIO layout: codes -127..=127, f32
    /// scales along the output axis 3.
    pub fn int8_per_channel_hwio() -> QuantSpecKind {
        QuantSpecKind::SymPerChannel {
            quant_min: -127,
            quant_max: 127,
            ch_axis: 3,
            quant_to: DType::I8,
            scale_type: DType::F32,
        }
    }

    /// mllm's printed kind name.
    pub fn name(&self) -> &'static str {
        match self {
            QuantSpecKind::Raw { .. } => "Raw",
            QuantSpecKind::SymPerTensor { .. } => "SymPerTensor",
            QuantSpecKind::AsymPerTensor { .. } => "AsymPerTensor",
            QuantSpecKind::Lpbq { .. } => "LPBQ",
            QuantSpecKind::SymPerChannel { .. } => "SymPerChannel",
        }
    }

    /// The integer range of per-tensor kinds.
    pub fn per_tensor_range(&self) -> Option<(i32, i32)> {
        match *self {
            QuantSpecKind::SymPerTensor { quant_min, quant_max, .. }
            | QuantSpecKind::AsymPerTensor { quant_min, quant_max, .. } => Some((quant_min, quant_max)),
            _ => None,
        }
    }

    /// The zero point a symmetric spec implies: the middle of its range (128 for 0..=255, 0 for
    /// -128..=127), which QNN encodes as a fixed offset.
    pub fn implied_zero_point(&self) -> Option<i32> {
        match *self {
            QuantSpecKind::SymPerTensor { quant_min, quant_max, .. } => Some((quant_min + quant_max + 1).div_euclid(2)),
            _ => None,
        }
    }

    /// Whether values of this kind need parameters.
    pub fn needs_params(&self) -> bool {
        !matches!(self, QuantSpecKind::Raw { .. })
    }

    /// The kind's fields, in mllm's printed order.
    fn args(&self) -> Vec<String> {
        match self {
            QuantSpecKind::Raw { dtype } => vec![dtype.to_string()],
            QuantSpecKind::SymPerTensor { quant_min, quant_max, quant_to, scale_type } => {
                vec![quant_min.to_string(), quant_max.to_string(), quant_to.to_string(), scale_type.to_string()]
            }
            QuantSpecKind::AsymPerTensor { quant_min, quant_max, quant_to, scale_type, zero_point_type } => vec![
                quant_min.to_string(),
                quant_max.to_string(),
                quant_to.to_string(),
                scale_type.to_string(),
                zero_point_type.to_string(),
            ],
            QuantSpecKind::Lpbq {
                quant_min,
                quant_max,
                block_size,
                ch_axis,
                scale_level_0_bitwidth,
                quant_to,
                scale_1_type,
            } => vec![
                quant_min.to_string(),
                quant_max.to_string(),
                block_size.to_string(),
                ch_axis.to_string(),
                scale_level_0_bitwidth.to_string(),
                quant_to.to_string(),
                scale_1_type.to_string(),
            ],
            QuantSpecKind::SymPerChannel { quant_min, quant_max, ch_axis, quant_to, scale_type } => vec![
                quant_min.to_string(),
                quant_max.to_string(),
                ch_axis.to_string(),
                quant_to.to_string(),
                scale_type.to_string(),
            ],
        }
    }

    /// Rebuilds a kind from its printed name and fields (the parser's inverse of `Display`).
    pub fn from_parts(name: &str, args: &[String]) -> Result<QuantSpecKind, SpecSyntaxError> {
        let want = |n: usize| -> Result<(), SpecSyntaxError> {
            if args.len() == n {
                Ok(())
            } else {
                Err(SpecSyntaxError::FieldCount { kind: name.to_string(), want: n, found: args.len() })
            }
        };
        let field = |i: usize, expected: &'static str| SpecSyntaxError::Field {
            kind: name.to_string(),
            index: i,
            expected,
            found: args[i].clone(),
        };
        let int = |i: usize| -> Result<i32, SpecSyntaxError> { args[i].parse().map_err(|_| field(i, "an integer")) };
        let dtype = |i: usize| -> Result<DType, SpecSyntaxError> { Ok(args[i].parse::<DType>()?) };
        let count = |i: usize| -> Result<usize, SpecSyntaxError> {
            args[i].parse().map_err(|_| field(i, "a non-negative integer"))
        };
        Ok(match name {
            "Raw" => {
                want(1)?;
                QuantSpecKind::Raw { dtype: dtype(0)? }
            }
            "SymPerTensor" => {
                want(4)?;
                QuantSpecKind::SymPerTensor {
                    quant_min: int(0)?,
                    quant_max: int(1)?,
                    quant_to: dtype(2)?,
                    scale_type: dtype(3)?,
                }
            }
            "AsymPerTensor" => {
                want(5)?;
                QuantSpecKind::AsymPerTensor {
                    quant_min: int(0)?,
                    quant_max: int(1)?,
                    quant_to: dtype(2)?,
                    scale_type: dtype(3)?,
                    zero_point_type: dtype(4)?,
                }
            }
            "LPBQ" => {
                want(7)?;
                QuantSpecKind::Lpbq {
                    quant_min: int(0)?,
                    quant_max: int(1)?,
                    block_size: count(2)?,
                    ch_axis: count(3)?,
                    scale_level_0_bitwidth: count(4)? as u32,
                    quant_to: dtype(5)?,
                    scale_1_type: dtype(6)?,
                }
            }
            "SymPerChannel" => {
                want(5)?;
                QuantSpecKind::SymPerChannel {
                    quant_min: int(0)?,
                    quant_max: int(1)?,
                    ch_axis: count(2)?,
                    quant_to: dtype(3)?,
                    scale_type: dtype(4)?,
                }
            }
            other => return Err(SpecSyntaxError::UnknownKind(other.to_string())),
        })
    }
}

impl fmt::Display for QuantSpecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({})", self.name(), self.args().join(", "))
    }
}

/// A printed quant spec (kind fields or parameter list) that does not read back.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SpecSyntaxError {
    #[error("{kind} takes {want} fields, found {found}")]
    FieldCount { kind: String, want: usize, found: usize },
    /// Field `index` of `kind` is not `expected` ("an integer", "a non-negative integer").
    #[error("{kind} field {index} must be {expected}, found '{found}'")]
    Field { kind: String, index: usize, expected: &'static str, found: String },
    #[error(transparent)]
    DType(#[from] UnknownName),
    #[error("unknown quant spec kind '{0}'")]
    UnknownKind(String),
    #[error("spec parameter 'from' must be a string, found {0:?}")]
    FromNotString(Option<Attr>),
    #[error("spec parameter 'scale' must be a float, found {0}")]
    ScaleNotFloat(Attr),
    #[error("zero_point {0} out of range")]
    ZeroPointRange(i64),
    #[error("spec parameter 'zero_point' must be an integer, found {0:?}")]
    ZeroPointNotInt(Option<Attr>),
    #[error("spec parameter '{key}' must be a non-negative integer, found {found}")]
    NotCount { key: String, found: Attr },
    #[error("unknown spec parameter '{0}'")]
    UnknownParam(String),
}

/// The solved parameters of a spec.
#[derive(Clone, Debug, PartialEq)]
pub enum SpecParams {
    /// Scale and zero point of a per-tensor spec, and the QDQ key (or weight prefix) they came from.
    PerTensor { scale: f32, zero_point: i32, from: String },
    /// An LPBQ weight stored as pymllm exports it under the prefix `from` (the op path):
    /// `<from>.weight` int4 codes (HWIO), `<from>.scale1` integer block scales (`[Out][In/bs]`) and
    /// `<from>.scale2` float channel scales (`[Out]`). The data is referenced, not copied.
    /// `blocks` (per channel) and `channels` are filled in once the layout has been checked.
    Lpbq { from: String, blocks: Option<usize>, channels: Option<usize> },
    /// A per-channel int8 weight stored under the prefix `from`: `<from>.weight` int8 codes (HWIO)
    /// and `<from>.scale` f32 channel scales (`[channels]`). The data is referenced, not copied.
    PerChannel { from: String, channels: usize },
}

impl SpecParams {
    /// Checkpoint key of a quantized weight's codes (LPBQ int4 or per-channel int8).
    pub fn weight_key(prefix: &str) -> String {
        format!("{prefix}.weight")
    }

    /// Checkpoint key of an LPBQ weight's integer block scales.
    pub fn lpbq_scale1_key(prefix: &str) -> String {
        format!("{prefix}.scale1")
    }

    /// Checkpoint key of an LPBQ weight's float channel scales.
    pub fn lpbq_scale2_key(prefix: &str) -> String {
        format!("{prefix}.scale2")
    }

    /// Checkpoint key of a weight's float scales: a per-channel int8 weight's channel scales, or a
    /// per-tensor uint16 weight's one scale.
    pub fn scale_key(prefix: &str) -> String {
        format!("{prefix}.scale")
    }

    /// Checkpoint key of a per-tensor uint16 weight's zero point.
    pub fn zero_point_key(prefix: &str) -> String {
        format!("{prefix}.zero_point")
    }

    /// The weight prefix of an LPBQ weight's block-scale key ([`SpecParams::lpbq_scale1_key`]).
    pub fn lpbq_prefix_of(key: &str) -> Option<&str> {
        key.strip_suffix(".scale1")
    }

    /// The weight prefix of a scale key ([`SpecParams::scale_key`]).
    pub fn scale_prefix_of(key: &str) -> Option<&str> {
        key.strip_suffix(".scale")
    }

    /// Printed as an attribute list after the kind.
    pub(crate) fn to_attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        match self {
            SpecParams::PerTensor { scale, zero_point, from } => {
                a.insert("scale".into(), Attr::Float(*scale));
                a.insert("zero_point".into(), Attr::Int(i64::from(*zero_point)));
                a.insert("from".into(), Attr::Str(from.clone()));
            }
            SpecParams::Lpbq { from, blocks, channels } => {
                a.insert("from".into(), Attr::Str(from.clone()));
                if let Some(b) = blocks {
                    a.insert("blocks".into(), Attr::Int(*b as i64));
                }
                if let Some(c) = channels {
                    a.insert("channels".into(), Attr::Int(*c as i64));
                }
            }
            SpecParams::PerChannel { from, channels } => {
                a.insert("from".into(), Attr::Str(from.clone()));
                a.insert("channel_scales".into(), Attr::Int(*channels as i64));
            }
        }
        a
    }

    /// The parser's inverse of [`to_attrs`](Self::to_attrs).
    pub(crate) fn from_attrs(mut a: Attrs) -> Result<SpecParams, SpecSyntaxError> {
        let from = match a.remove("from") {
            Some(Attr::Str(s)) => s,
            other => return Err(SpecSyntaxError::FromNotString(other)),
        };
        let params = if let Some(scale) = a.remove("scale") {
            let scale = match scale {
                Attr::Float(s) => s,
                other => return Err(SpecSyntaxError::ScaleNotFloat(other)),
            };
            let zero_point = match a.remove("zero_point") {
                Some(Attr::Int(z)) => i32::try_from(z).map_err(|_| SpecSyntaxError::ZeroPointRange(z))?,
                other => return Err(SpecSyntaxError::ZeroPointNotInt(other)),
            };
            SpecParams::PerTensor { scale, zero_point, from }
        } else if let Some(channels) = a.remove("channel_scales") {
            match channels {
                Attr::Int(n) if n >= 0 => SpecParams::PerChannel { from, channels: n as usize },
                other => return Err(SpecSyntaxError::NotCount { key: "channel_scales".into(), found: other }),
            }
        } else {
            let mut count = |k: &str| match a.remove(k) {
                None => Ok(None),
                Some(Attr::Int(n)) if n >= 0 => Ok(Some(n as usize)),
                Some(other) => Err(SpecSyntaxError::NotCount { key: k.to_string(), found: other }),
            };
            SpecParams::Lpbq { from, blocks: count("blocks")?, channels: count("channels")? }
        };
        match a.keys().next() {
            Some(k) => Err(SpecSyntaxError::UnknownParam(k.clone())),
            None => Ok(params),
        }
    }
}

/// One quantization spec: its kind and, once solved, its parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantSpec {
    pub kind: QuantSpecKind,
    pub params: Option<SpecParams>,
}

impl QuantSpec {
    pub fn new(kind: QuantSpecKind) -> Self {
        QuantSpec { kind, params: None }
    }

    /// Whether the spec is fully known: `Raw` always is, the others once they have parameters.
    pub fn is_solved(&self) -> bool {
        !self.kind.needs_params() || self.params.is_some()
    }

    /// Per-tensor `(scale, zero_point)` when solved.
    pub fn per_tensor(&self) -> Option<(f32, i32)> {
        match &self.params {
            Some(SpecParams::PerTensor { scale, zero_point, .. }) => Some((*scale, *zero_point)),
            _ => None,
        }
    }
}

impl fmt::Display for QuantSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        if let Some(p) = &self.params {
            write!(f, " {}", super::print::attrs_text(&p.to_attrs()))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::TensorType;
    use crate::ir::{parse, Program, ValueDef};

    const TEXT: &str = r#"@main (%0:tensor<[1, 4], UInt16PerTensorAsy, CPU>[spec:$0]) -> (%v) {
    linalg.CPU.ViewOp <name="v"> [shape:[4]] (%0) -> (%v:tensor<[4], UInt16PerTensorAsy, CPU>[spec:$0])
    linalg.CPU.ViewOp <name="w"> [shape:[1, 4]] (%v) -> (%w:tensor<[1, 4], Int4LPBQ, CPU>[spec:$w])
    linalg.CPU.ViewOp <name="x"> [shape:[4]] (%w) -> (%x:tensor<[4], UInt8PerTensorSym, CPU>[spec:$x])
    cf.ReturnOp (%v) -> ()
}
quant.specs {
    $0 = AsymPerTensor(0, 65535, UInt16, Float32, Int32) [from:"x_qdq", scale:0.5, zero_point:3]
    $w = LPBQ(-7, 7, 16, 3, 4, Int4LPBQ, Float32) [blocks:2, channels:8, from:"lm_head"]
    $x = SymPerTensor(0, 255, UInt8, Float32)
}
"#;

    /// [`TEXT`] as printers that numbered values and specs wrote it; it still reads back.
    const NUMBERED_TEXT: &str = r#"@main (%0:tensor<[1, 4], UInt16PerTensorAsy, CPU>[spec:s0]) -> (%1) {
    linalg.CPU.ViewOp <name="v"> [shape:[4]] (%0) -> (%1:tensor<[4], UInt16PerTensorAsy, CPU>[spec:s0])
    linalg.CPU.ViewOp <name="w"> [shape:[1, 4]] (%1) -> (%2:tensor<[1, 4], Int4LPBQ, CPU>[spec:s1])
    linalg.CPU.ViewOp <name="x"> [shape:[4]] (%2) -> (%3:tensor<[4], UInt8PerTensorSym, CPU>[spec:s2])
    cf.ReturnOp (%1) -> ()
}
quant.specs {
    s0 = AsymPerTensor(0, 65535, UInt16, Float32, Int32) [from:"x_qdq", scale:0.5, zero_point:3]
    s1 = LPBQ(-7, 7, 16, 3, 4, Int4LPBQ, Float32) [blocks:2, channels:8, from:"lm_head"]
    s2 = SymPerTensor(0, 255, UInt8, Float32)
}
"#;

    #[test]
    fn per_channel_specs_round_trip() {
        let text = TEXT.replace("Int4LPBQ, CPU>[spec:$w]", "Int8, CPU>[spec:$w]").replace(
            r#"LPBQ(-7, 7, 16, 3, 4, Int4LPBQ, Float32) [blocks:2, channels:8, from:"lm_head"]"#,
            r#"SymPerChannel(-127, 127, 3, Int8, Float32) [channel_scales:8, from:"lm_head"]"#,
        );
        assert!(text.contains("Int8, CPU>[spec:$w]") && text.contains("SymPerChannel("), "{text}");
        let p = parse(&text).unwrap();
        assert_eq!(p.to_string(), text);
        assert_eq!(p.specs[1].kind, QuantSpecKind::int8_per_channel_hwio());
        assert_eq!(p.specs[1].params, Some(SpecParams::PerChannel { from: "lm_head".into(), channels: 8 }));
        let bad = text.replace("channel_scales:8", "channel_scales:-1");
        assert!(parse(&bad).unwrap_err().to_string().contains("channel_scales"));
    }

    #[test]
    fn spec_tables_round_trip_and_sharing_survives() {
        let p = parse(TEXT).unwrap();
        assert_eq!(p.to_string(), TEXT);
        assert_eq!(parse(NUMBERED_TEXT).unwrap(), p);
        assert_eq!(p.value(p.main.inputs[0]).spec, p.value(p.main.outputs[0]).spec);
        assert_eq!(p.specs.len(), 3);
        assert_eq!(p.specs[0].per_tensor(), Some((0.5, 3)));
        assert_eq!(
            p.specs[1].params,
            Some(SpecParams::Lpbq { from: "lm_head".into(), blocks: Some(2), channels: Some(8) })
        );
        assert!(!p.specs[2].is_solved());
        assert_eq!(p.specs[2].kind.implied_zero_point(), Some(128));
    }

    #[test]
    fn spec_table_errors_are_located() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        let missing = TEXT.replace("    $x = SymPerTensor(0, 255, UInt8, Float32)\n", "");
        assert!(err(&missing).contains("spec $x is used but not in the quant.specs table"), "{}", err(&missing));
        let twice = TEXT.replace("    $x = Sym", "    $w = Raw(Int32)\n    $x = Sym");
        assert!(err(&twice).contains("spec $w defined twice"), "{}", err(&twice));
        let missing = NUMBERED_TEXT.replace("    s2 = SymPerTensor(0, 255, UInt8, Float32)\n", "");
        assert!(err(&missing).contains("spec s2 is used but not in the quant.specs table"), "{}", err(&missing));
        let kind = TEXT.replace("SymPerTensor(0, 255", "SymPerBlock(0, 255");
        assert!(err(&kind).contains("unknown quant spec kind 'SymPerBlock'"), "{}", err(&kind));
        let fields = TEXT.replace("SymPerTensor(0, 255, UInt8, Float32)", "SymPerTensor(0, 255, UInt8)");
        assert!(err(&fields).contains("SymPerTensor takes 4 fields, found 3"), "{}", err(&fields));
        let param = TEXT.replace("zero_point:3]", "zero_point:3, offset:1]");
        assert!(err(&param).contains("unknown spec parameter 'offset'"), "{}", err(&param));
    }

    #[test]
    fn canonical_specs_follow_first_reference_and_drop_unused_ones() {
        let mut p = Program::default();
        let unused = p.add_spec(QuantSpec::new(QuantSpecKind::Raw { dtype: DType::I32 }));
        let b = p.add_spec(QuantSpec::new(QuantSpecKind::u16_asym()));
        let a = p.add_spec(QuantSpec::new(QuantSpecKind::lpbq_hwio(32)));
        let x = p.add_value(ValueDef::new(TensorType::new(vec![2], DType::U16Asym)));
        let y = p.add_value(ValueDef::new(TensorType::new(vec![2], DType::U16Asym)));
        p.set_value_spec(x, a);
        p.set_value_spec(y, b);
        p.main.inputs = vec![x, y];
        p.main.outputs = vec![y];
        assert_ne!(unused, a);
        let c = p.canonicalize();
        assert_eq!(c.specs, vec![p.spec(a).clone(), p.spec(b).clone()]);
        assert_eq!(c.value(c.main.inputs[0]).spec, Some(SpecId(0)));
        assert_eq!(parse(&p.to_string()).unwrap(), c);
    }
}
