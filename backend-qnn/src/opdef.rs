//! Op definitions (package `qti.aisw`) for the ops a Qwen3 / Qwen2 / Llama lowering emits.
//!
//! Each [`OpDef`] records the positional inputs (required / optional), the named params (scalar
//! or tensor, accepted dtypes, tensor shape rule, default) and the output count. Facts come from
//! Qualcomm's op definitions (QnnOpDef.h names; the op builders of ExecuTorch, mllm's mllm/backends/qnn/aot/visitor and onnxruntime's QNN EP).
//! Where the op definition gives a default the param is optional; where it gives none the param is mandatory
//! (the lowering always sets it). Per-op dtype and shape rules that need tensor metadata live in
//! `validate.rs`; the interpreter (`interp.rs`) implements the semantics.
//!
//! Layout conventions: tensors are dense row-major; `Conv2d` takes NHWC activations and HWIO
//! filters (`[kh, kw, Cin/group, Cout]`); `FullyConnected` weights are `[Out, In]`.

use crate::dtype::DataType;
use crate::graph::Scalar;

/// Every op type the table knows, with its QNN type name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpType {
    Conv2d,
    ElementWiseAdd,
    ElementWiseMultiply,
    ElementWiseSubtract,
    ElementWiseNeg,
    ElementWiseEqual,
    ElementWiseSelect,
    Sigmoid,
    Softmax,
    RmsNorm,
    Transpose,
    Reshape,
    Concat,
    Gather,
    StridedSlice,
    ReduceMin,
    ReduceMax,
    ReduceMean,
    Convert,
    Cast,
    Quantize,
    Dequantize,
    MatMul,
    FullyConnected,
}

/// Every op in the table.
pub const ALL_OPS: [OpType; 24] = [
    OpType::Conv2d,
    OpType::ElementWiseAdd,
    OpType::ElementWiseMultiply,
    OpType::ElementWiseSubtract,
    OpType::ElementWiseNeg,
    OpType::ElementWiseEqual,
    OpType::ElementWiseSelect,
    OpType::Sigmoid,
    OpType::Softmax,
    OpType::RmsNorm,
    OpType::Transpose,
    OpType::Reshape,
    OpType::Concat,
    OpType::Gather,
    OpType::StridedSlice,
    OpType::ReduceMin,
    OpType::ReduceMax,
    OpType::ReduceMean,
    OpType::Convert,
    OpType::Cast,
    OpType::Quantize,
    OpType::Dequantize,
    OpType::MatMul,
    OpType::FullyConnected,
];

impl OpType {
    /// The QNN op type string passed as `typeName`.
    pub const fn as_str(self) -> &'static str {
        match self {
            OpType::Conv2d => "Conv2d",
            OpType::ElementWiseAdd => "ElementWiseAdd",
            OpType::ElementWiseMultiply => "ElementWiseMultiply",
            OpType::ElementWiseSubtract => "ElementWiseSubtract",
            OpType::ElementWiseNeg => "ElementWiseNeg",
            OpType::ElementWiseEqual => "ElementWiseEqual",
            OpType::ElementWiseSelect => "ElementWiseSelect",
            OpType::Sigmoid => "Sigmoid",
            OpType::Softmax => "Softmax",
            OpType::RmsNorm => "RmsNorm",
            OpType::Transpose => "Transpose",
            OpType::Reshape => "Reshape",
            OpType::Concat => "Concat",
            OpType::Gather => "Gather",
            OpType::StridedSlice => "StridedSlice",
            OpType::ReduceMin => "ReduceMin",
            OpType::ReduceMax => "ReduceMax",
            OpType::ReduceMean => "ReduceMean",
            OpType::Convert => "Convert",
            OpType::Cast => "Cast",
            OpType::Quantize => "Quantize",
            OpType::Dequantize => "Dequantize",
            OpType::MatMul => "MatMul",
            OpType::FullyConnected => "FullyConnected",
        }
    }

    /// The op with this QNN type name.
    pub fn from_name(name: &str) -> Option<OpType> {
        ALL_OPS.iter().copied().find(|op| op.as_str() == name)
    }

    /// This op's definition.
    pub fn def(self) -> &'static OpDef {
        op_def(self)
    }
}

impl std::fmt::Display for OpType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One positional input.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InputSpec {
    pub name: &'static str,
    pub required: bool,
}

/// Positional inputs of an op.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Inputs {
    /// A fixed list; optional ones are at the end.
    Fixed(&'static [InputSpec]),
    /// Any number ≥ `min` of inputs of the same role (Concat).
    Variadic { name: &'static str, min: usize },
}

/// Shape rule of a tensor param.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamShape {
    /// Exactly these dims.
    Fixed(&'static [u32]),
    /// `[rank(in[0])]`.
    InputRank,
    /// `[rank(in[0]), 3]`.
    InputRankBy3,
    /// Rank 1, at least one element.
    Vector,
}

/// Scalar or tensor, with accepted dtypes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamKind {
    Scalar(&'static [DataType]),
    Tensor { dtypes: &'static [DataType], shape: ParamShape },
}

/// Default of an optional param.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamDefault {
    /// Mandatory.
    Required,
    Scalar(Scalar),
    U32s(&'static [u32]),
    /// `rank(in[0]) - 1`.
    LastAxis,
}

/// One named param.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamSpec {
    pub name: &'static str,
    pub kind: ParamKind,
    pub default: ParamDefault,
}

impl ParamSpec {
    pub fn required(&self) -> bool {
        self.default == ParamDefault::Required
    }
}

/// One op definition.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpDef {
    pub op: OpType,
    pub inputs: Inputs,
    pub params: &'static [ParamSpec],
    pub num_outputs: usize,
}

impl OpDef {
    /// `(min, max)` input count; `max` is `None` for variadic ops.
    pub fn input_arity(&self) -> (usize, Option<usize>) {
        match self.inputs {
            Inputs::Fixed(specs) => (specs.iter().filter(|s| s.required).count(), Some(specs.len())),
            Inputs::Variadic { min, .. } => (min, None),
        }
    }

    /// The name of input `i` (for messages).
    pub fn input_name(&self, i: usize) -> &'static str {
        match self.inputs {
            Inputs::Fixed(specs) => specs.get(i).map_or("extra", |s| s.name),
            Inputs::Variadic { name, .. } => name,
        }
    }

    pub fn param(&self, name: &str) -> Option<&'static ParamSpec> {
        self.params.iter().find(|p| p.name == name)
    }
}

const fn req(name: &'static str) -> InputSpec {
    InputSpec { name, required: true }
}

const fn opt(name: &'static str) -> InputSpec {
    InputSpec { name, required: false }
}

const U32: &[DataType] = &[DataType::UInt32];
const I32: &[DataType] = &[DataType::Int32];
const F32: &[DataType] = &[DataType::Float32];
const BOOL: &[DataType] = &[DataType::Bool8];

const fn scalar(name: &'static str, dtypes: &'static [DataType], default: ParamDefault) -> ParamSpec {
    ParamSpec { name, kind: ParamKind::Scalar(dtypes), default }
}

const fn tensor(
    name: &'static str,
    dtypes: &'static [DataType],
    shape: ParamShape,
    default: ParamDefault,
) -> ParamSpec {
    ParamSpec { name, kind: ParamKind::Tensor { dtypes, shape }, default }
}

const NO_PARAMS: &[ParamSpec] = &[];
const UNARY: Inputs = Inputs::Fixed(&[req("in[0]")]);
const BINARY: Inputs = Inputs::Fixed(&[req("in[0]"), req("in[1]")]);
const FALSE: ParamDefault = ParamDefault::Scalar(Scalar::Bool8(false));
const ZERO_U32: ParamDefault = ParamDefault::Scalar(Scalar::UInt32(0));

const CONV2D_PARAMS: &[ParamSpec] = &[
    tensor("stride", U32, ParamShape::Fixed(&[2]), ParamDefault::Required),
    tensor("pad_amount", U32, ParamShape::Fixed(&[2, 2]), ParamDefault::Required),
    tensor("dilation", U32, ParamShape::Fixed(&[2]), ParamDefault::U32s(&[1, 1])),
    scalar("group", U32, ParamDefault::Scalar(Scalar::UInt32(1))),
];
const SOFTMAX_PARAMS: &[ParamSpec] =
    &[scalar("axis", U32, ParamDefault::LastAxis), scalar("beta", F32, ParamDefault::Scalar(Scalar::Float32(1.0)))];
const RMSNORM_PARAMS: &[ParamSpec] =
    &[scalar("epsilon", F32, ParamDefault::Required), tensor("axes", U32, ParamShape::Vector, ParamDefault::Required)];
const TRANSPOSE_PARAMS: &[ParamSpec] = &[tensor("perm", U32, ParamShape::InputRank, ParamDefault::Required)];
const CONCAT_PARAMS: &[ParamSpec] = &[scalar("axis", U32, ParamDefault::Required)];
const GATHER_PARAMS: &[ParamSpec] = &[scalar("axis", I32, ParamDefault::Scalar(Scalar::Int32(0)))];
const STRIDED_SLICE_PARAMS: &[ParamSpec] = &[
    tensor("ranges", I32, ParamShape::InputRankBy3, ParamDefault::Required),
    scalar("begin_mask", U32, ZERO_U32),
    scalar("end_mask", U32, ZERO_U32),
    scalar("shrink_axes", U32, ZERO_U32),
    scalar("new_axes_mask", U32, ZERO_U32),
];
const REDUCE_PARAMS: &[ParamSpec] =
    &[tensor("axes", U32, ParamShape::Vector, ParamDefault::Required), scalar("keep_dims", BOOL, FALSE)];
const CONVERT_PARAMS: &[ParamSpec] =
    &[scalar("dynamic_input_data", BOOL, FALSE), scalar("dynamic_output_data", BOOL, FALSE)];
const MATMUL_PARAMS: &[ParamSpec] = &[scalar("transpose_in0", BOOL, FALSE), scalar("transpose_in1", BOOL, FALSE)];
const FC_PARAMS: &[ParamSpec] = &[scalar("keep_dims", BOOL, FALSE)];

const fn def(op: OpType, inputs: Inputs, params: &'static [ParamSpec]) -> OpDef {
    OpDef { op, inputs, params, num_outputs: 1 }
}

static OP_DEFS: [OpDef; 24] = [
    def(OpType::Conv2d, Inputs::Fixed(&[req("input"), req("filter"), opt("bias")]), CONV2D_PARAMS),
    def(OpType::ElementWiseAdd, BINARY, NO_PARAMS),
    def(OpType::ElementWiseMultiply, BINARY, NO_PARAMS),
    def(OpType::ElementWiseSubtract, BINARY, NO_PARAMS),
    def(OpType::ElementWiseNeg, UNARY, NO_PARAMS),
    def(OpType::ElementWiseEqual, BINARY, NO_PARAMS),
    def(OpType::ElementWiseSelect, Inputs::Fixed(&[req("condition"), req("in[1]"), req("in[2]")]), NO_PARAMS),
    def(OpType::Sigmoid, UNARY, NO_PARAMS),
    def(OpType::Softmax, UNARY, SOFTMAX_PARAMS),
    def(OpType::RmsNorm, Inputs::Fixed(&[req("input"), req("gamma"), opt("beta")]), RMSNORM_PARAMS),
    def(OpType::Transpose, UNARY, TRANSPOSE_PARAMS),
    def(OpType::Reshape, UNARY, NO_PARAMS),
    def(OpType::Concat, Inputs::Variadic { name: "in[i]", min: 1 }, CONCAT_PARAMS),
    def(OpType::Gather, Inputs::Fixed(&[req("input"), req("indices")]), GATHER_PARAMS),
    def(OpType::StridedSlice, UNARY, STRIDED_SLICE_PARAMS),
    def(OpType::ReduceMin, UNARY, REDUCE_PARAMS),
    def(OpType::ReduceMax, UNARY, REDUCE_PARAMS),
    def(OpType::ReduceMean, UNARY, REDUCE_PARAMS),
    def(OpType::Convert, UNARY, CONVERT_PARAMS),
    def(OpType::Cast, UNARY, NO_PARAMS),
    def(OpType::Quantize, UNARY, NO_PARAMS),
    def(OpType::Dequantize, UNARY, NO_PARAMS),
    def(OpType::MatMul, BINARY, MATMUL_PARAMS),
    def(OpType::FullyConnected, Inputs::Fixed(&[req("input"), req("weights"), opt("bias")]), FC_PARAMS),
];

/// The definition of `op`.
pub fn op_def(op: OpType) -> &'static OpDef {
    // The table is in `ALL_OPS` order; the test below keeps it that way.
    &OP_DEFS[ALL_OPS.iter().position(|&o| o == op).unwrap_or(0)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_op_in_order() {
        for (i, op) in ALL_OPS.iter().enumerate() {
            assert_eq!(OP_DEFS[i].op, *op);
            assert_eq!(op.def().op, *op);
            assert_eq!(OpType::from_name(op.as_str()), Some(*op));
            assert_eq!(op.def().num_outputs, 1);
        }
        assert_eq!(OpType::from_name("Tile"), None);
    }

    #[test]
    fn arity_and_defaults() {
        assert_eq!(OpType::Conv2d.def().input_arity(), (2, Some(3)));
        assert_eq!(OpType::RmsNorm.def().input_arity(), (2, Some(3)));
        assert_eq!(OpType::Concat.def().input_arity(), (1, None));
        assert_eq!(OpType::ElementWiseSelect.def().input_arity(), (3, Some(3)));
        let conv = OpType::Conv2d.def();
        assert!(conv.param("stride").unwrap().required());
        assert!(!conv.param("group").unwrap().required());
        assert_eq!(conv.param("dilation").unwrap().default, ParamDefault::U32s(&[1, 1]));
        assert_eq!(OpType::Softmax.def().param("beta").unwrap().default, ParamDefault::Scalar(Scalar::Float32(1.0)));
        assert!(OpType::Conv2d.def().param("bogus").is_none());
    }
}
