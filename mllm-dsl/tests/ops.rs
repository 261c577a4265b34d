//! Shape and dtype inference of every op, under tracing.
//!
//! Each op is called inside a small `#[module]` bound at `model.layers.0.mlp`. Valid calls check the
//! inferred output type and the recorded op; invalid calls check the typed [`Error::Op`]: the op's
//! name, the module path, the shapes in the message, and the call site (this file, the line of the
//! call, via `line!()`).

use mllm_dsl::ir::LinalgOp;
use mllm_dsl::op::{OpKind, ReduceKind};
use mllm_dsl::prelude::*;
use mllm_dsl::{tensor, CallSite, Program, TensorType};

const PATH: &str = "model.layers.0.mlp";

/// Holds one layer of each kind so that layer ops are checked too.
#[module]
struct Block {
    proj: Linear,
    conv: Conv2d,
    norm: RmsNorm,
    embed: Embedding,
}

#[module]
impl Block {
    /// Runs `f` inside this module's scope.
    fn forward(&self, inputs: &[Tensor], f: impl FnOnce(&Self, &[Tensor]) -> Result<Tensor>) -> Result<Tensor> {
        f(self, inputs)
    }
}

fn input(shape: &[usize], dtype: DType) -> TraceInput {
    TraceInput::new("x", shape.to_vec(), dtype)
}

fn f32(shape: &[usize]) -> TraceInput {
    input(shape, DType::F32)
}

fn u16(shape: &[usize]) -> TraceInput {
    input(shape, DType::U16Asym)
}

/// Traces `f` inside a `Block` bound at [`PATH`] with parameters of `format`.
fn run_with(
    format: ParamFormat,
    inputs: &[TraceInput],
    f: impl FnOnce(&Block, &[Tensor]) -> Result<Tensor>,
) -> Result<Program> {
    let mut block = Block {
        proj: Linear::new(8, 16),
        conv: Conv2d::new(8, 16),
        norm: RmsNorm::new(8, 1e-6),
        embed: Embedding::new(32, 8),
    };
    block.bind(PATH, &ParamSource::Symbolic(format))?;
    trace(inputs, |t| block.forward(t, f))
}

fn run(inputs: &[TraceInput], f: impl FnOnce(&Block, &[Tensor]) -> Result<Tensor>) -> Result<Program> {
    run_with(ParamFormat::Float, inputs, f)
}

/// The program's output type and the op that produced it.
fn produced(p: &Program) -> (TensorType, LinalgOp) {
    let out = p.main.outputs[0];
    let op = p.linalg_ops().into_iter().find(|op| op.outputs.contains(&out)).expect("an op defines the output");
    (p.value(out).ty.clone(), op.clone())
}

/// Runs a valid call and returns `(output shape, output dtype, recorded op kind)`.
fn ok(inputs: &[TraceInput], f: impl FnOnce(&Block, &[Tensor]) -> Result<Tensor>) -> (Vec<usize>, DType, OpKind) {
    let p = run(inputs, f).unwrap_or_else(|e| panic!("valid call failed: {e}"));
    let (ty, op) = produced(&p);
    (ty.shape, ty.dtype, op.kind)
}

/// `(error, line of the invocation)`: keep each invocation on one line so that the call site inside
/// it is on that line.
macro_rules! fails {
    ($inputs:expr, $f:expr) => {
        (run(&$inputs, $f).expect_err("the call must fail"), line!())
    };
}

/// Checks an `Error::Op`: op name, module path, call site, and that the message names `parts`.
#[track_caller]
fn assert_op_err((err, line): (Error, u32), op: &str, parts: &[&str]) {
    let text = err.to_string();
    let Error::Op { op: got_op, module_path, site, message } = err else {
        panic!("expected Error::Op from {op}, got {err:?}");
    };
    assert_eq!(got_op, op, "{text}");
    assert_eq!(module_path, PATH, "{text}");
    assert_eq!((site.0.file(), site.0.line()), (file!(), line), "call site of: {text}");
    for part in parts {
        assert!(message.contains(part), "message of {op} should mention `{part}`: {message}");
    }
    assert!(text.starts_with(&format!("{op} in module `{PATH}` at {}:{line}:", file!())), "{text}");
}

/// Every op has a test below: adding an op without one fails to compile here.
#[test]
fn every_op_is_covered() {
    fn test_of(kind: &OpKind) -> &'static str {
        match kind {
            OpKind::View { .. } => "view",
            OpKind::Transpose { .. } => "transpose",
            OpKind::Permute { .. } => "permute",
            OpKind::Unsqueeze { .. } => "unsqueeze",
            OpKind::Slice { .. } => "slice",
            OpKind::Concat { .. } => "concat",
            OpKind::Repeat { .. } => "repeat_interleave",
            OpKind::MatMul => "matmul",
            OpKind::Add | OpKind::Sub | OpKind::Mul => "add_sub_mul",
            OpKind::Neg | OpKind::Sigmoid | OpKind::Silu => "unary",
            OpKind::Softmax { .. } => "softmax",
            OpKind::RmsNorm { .. } => "rms_norm",
            OpKind::Embedding => "embedding",
            OpKind::Gather { .. } => "gather",
            OpKind::Conv2d => "conv2d",
            OpKind::Linear => "linear",
            OpKind::Reduce { .. } => "reduce",
            OpKind::Equal => "equal",
            OpKind::Where => "where_cond",
            OpKind::Cast { .. } => "cast",
        }
    }
    assert_eq!(test_of(&OpKind::Equal), "equal");
}

#[test]
fn view() {
    let (s, d, k) = ok(&[f32(&[2, 3, 4])], |_, t| t[0].view(&[-1, 4]));
    assert_eq!((s, d, k), (vec![6, 4], DType::F32, OpKind::View { shape: vec![-1, 4] }));
    assert_eq!(ok(&[u16(&[2, 3, 4])], |_, t| t[0].reshape(&[2, 12])).0, [2, 12]);
    assert_eq!(ok(&[u16(&[2, 3, 4])], |_, t| t[0].view(&[1, 1, -1, 12])).0, [1, 1, 2, 12]);

    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].view(&[-1, -1])), "View", &["[-1, -1]", "more than one -1"]);
    assert_op_err(
        fails!([f32(&[2, 3, 4])], |_, t| t[0].view(&[5, -1])),
        "View",
        &["[2, 3, 4]", "24 elements", "[5, -1]"],
    );
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].view(&[2, 13])), "View", &["[2, 3, 4]", "[2, 13]"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].view(&[-2, 12])), "View", &["negative dim -2"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].view(&[0, -1])), "View", &["[2, 3, 4]", "[0, -1]"]);
}

#[test]
fn transpose() {
    let (s, d, k) = ok(&[u16(&[2, 3, 4])], |_, t| t[0].transpose(-1, 0));
    assert_eq!((s, d, k), (vec![4, 3, 2], DType::U16Asym, OpKind::Transpose { dim0: 2, dim1: 0 }));
    assert_eq!(ok(&[f32(&[1, 4, 2, 8])], |_, t| t[0].transpose(1, -2)).0, [1, 2, 4, 8]);

    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].transpose(0, 3)), "Transpose", &["dim 3", "[2, 3, 4]"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].transpose(-4, 0)), "Transpose", &["dim -4", "[2, 3, 4]"]);
}

#[test]
fn permute() {
    let (s, d, k) = ok(&[u16(&[2, 3, 4])], |_, t| t[0].permute(&[2, 0, 1]));
    assert_eq!((s, d, k), (vec![4, 2, 3], DType::U16Asym, OpKind::Permute { perm: vec![2, 0, 1] }));

    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].permute(&[0, 0, 1])), "Permute", &["[0, 0, 1]", "[2, 3, 4]"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].permute(&[1, 0])), "Permute", &["[1, 0]", "[2, 3, 4]"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].permute(&[0, 1, 3])), "Permute", &["[0, 1, 3]", "[2, 3, 4]"]);
}

#[test]
fn unsqueeze() {
    assert_eq!(
        ok(&[f32(&[2, 3])], |_, t| t[0].unsqueeze(-1)),
        (vec![2, 3, 1], DType::F32, OpKind::Unsqueeze { dim: 2 })
    );
    assert_eq!(
        ok(&[f32(&[2, 3])], |_, t| t[0].unsqueeze(-3)),
        (vec![1, 2, 3], DType::F32, OpKind::Unsqueeze { dim: 0 })
    );
    assert_eq!(ok(&[u16(&[2, 3])], |_, t| t[0].unsqueeze(1)).0, [2, 1, 3]);

    assert_op_err(fails!([f32(&[2, 3])], |_, t| t[0].unsqueeze(3)), "Unsqueeze", &["dim 3", "[2, 3]"]);
    assert_op_err(fails!([f32(&[2, 3])], |_, t| t[0].unsqueeze(-4)), "Unsqueeze", &["dim -4", "[2, 3]"]);
}

#[test]
fn slice() {
    let (s, d, k) = ok(&[u16(&[2, 8])], |_, t| t[0].slice(-1, 2, 6));
    assert_eq!((s, d, k), (vec![2, 4], DType::U16Asym, OpKind::Slice { dim: 1, start: 2, end: 6 }));
    assert_eq!(ok(&[f32(&[2, 8])], |_, t| t[0].slice(0, 1, 2)).0, [1, 8]);
    assert_eq!(ok(&[f32(&[2, 8])], |_, t| t[0].slice(1, 3, 3)).0, [2, 0]);

    assert_op_err(fails!([f32(&[2, 8])], |_, t| t[0].slice(1, 4, 9)), "Slice", &["4..9", "dim 1", "[2, 8]"]);
    assert_op_err(fails!([f32(&[2, 8])], |_, t| t[0].slice(1, 5, 3)), "Slice", &["5..3", "[2, 8]"]);
    assert_op_err(fails!([f32(&[2, 8])], |_, t| t[0].slice(2, 0, 1)), "Slice", &["dim 2", "[2, 8]"]);
}

#[test]
fn concat() {
    let ins = [input(&[1, 2, 8, 3], DType::U8Sym), input(&[1, 2, 8, 5], DType::U8Sym)];
    let (s, d, k) = ok(&ins, |_, t| Tensor::cat(&[&t[0], &t[1]], -1));
    assert_eq!((s, d, k), (vec![1, 2, 8, 8], DType::U8Sym, OpKind::Concat { dim: 3 }));
    let three = [f32(&[1, 2]), f32(&[3, 2]), f32(&[4, 2])];
    assert_eq!(ok(&three, |_, t| Tensor::cat(&[&t[0], &t[1], &t[2]], 0)).0, [8, 2]);

    let ins = [f32(&[1, 2, 8, 3]), f32(&[1, 3, 8, 5])];
    let parts = ["[1, 2, 8, 3]", "[1, 3, 8, 5]", "dim 3"];
    assert_op_err(fails!(ins, |_, t| Tensor::cat(&[&t[0], &t[1]], -1)), "Concat", &parts);
    let ins = [f32(&[1, 2, 3]), f32(&[1, 2, 8, 3])];
    assert_op_err(fails!(ins, |_, t| Tensor::cat(&[&t[0], &t[1]], 0)), "Concat", &["[1, 2, 3]", "[1, 2, 8, 3]"]);
    let ins = [f32(&[1, 2]), input(&[1, 2], DType::U8Sym)];
    assert_op_err(fails!(ins, |_, t| Tensor::cat(&[&t[0], &t[1]], 1)), "Concat", &["Float32", "UInt8PerTensorSym"]);
    assert_op_err(fails!([f32(&[1, 2])], |_, t| Tensor::cat(&[&t[0]], 2)), "Concat", &["dim 2", "[1, 2]"]);
    assert_op_err(fails!([f32(&[1, 2])], |_, _| Tensor::cat(&[], 0)), "Concat", &["at least one tensor"]);
}

#[test]
fn repeat_interleave() {
    let (s, d, k) = ok(&[input(&[1, 2, 8, 4], DType::U8Sym)], |_, t| t[0].repeat_interleave(2, 1));
    assert_eq!((s, d, k), (vec![1, 4, 8, 4], DType::U8Sym, OpKind::Repeat { dim: 1, times: 2 }));
    assert_eq!(ok(&[f32(&[2, 3])], |_, t| t[0].repeat_interleave(3, -1)).0, [2, 9]);

    assert_op_err(
        fails!([f32(&[1, 2, 8, 4])], |_, t| t[0].repeat_interleave(2, 4)),
        "Repeat",
        &["dim 4", "[1, 2, 8, 4]"],
    );
}

#[test]
fn matmul() {
    let (s, d, k) = ok(&[f32(&[2, 1, 4, 8]), f32(&[3, 8, 5])], |_, t| t[0].matmul(&t[1]));
    assert_eq!((s, d, k), (vec![2, 3, 4, 5], DType::F32, OpKind::MatMul));
    assert_eq!(ok(&[f32(&[4, 8]), f32(&[8, 5])], |_, t| t[0].matmul(&t[1])).0, [4, 5]);
    // uint16 activations x uint8 KV (the QNN attention) keep the left operand's dtype.
    let ins = [u16(&[1, 4, 2, 16]), input(&[1, 4, 16, 12], DType::U8Sym)];
    assert_eq!(ok(&ins, |_, t| t[0].matmul(&t[1])), (vec![1, 4, 2, 12], DType::U16Asym, OpKind::MatMul));

    let ins = [f32(&[2, 4, 8]), f32(&[2, 7, 5])];
    assert_op_err(fails!(ins, |_, t| t[0].matmul(&t[1])), "MatMul", &["inner dims", "[2, 4, 8]", "[2, 7, 5]"]);
    let ins = [f32(&[2, 4, 8]), f32(&[3, 8, 5])];
    assert_op_err(fails!(ins, |_, t| t[0].matmul(&t[1])), "MatMul", &["batch dims", "[2, 4, 8]", "[3, 8, 5]"]);
    assert_op_err(fails!([f32(&[8]), f32(&[8, 5])], |_, t| t[0].matmul(&t[1])), "MatMul", &["rank >= 2", "[8]"]);
    let ins = [input(&[4, 8], DType::I32), f32(&[8, 5])];
    assert_op_err(fails!(ins, |_, t| t[0].matmul(&t[1])), "MatMul", &["Int32"]);
}

#[test]
fn add_sub_mul() {
    // Broadcasting.
    let (s, d, k) = ok(&[f32(&[2, 1, 4]), f32(&[3, 1])], |_, t| t[0].add(&t[1]));
    assert_eq!((s, d, k), (vec![2, 3, 4], DType::F32, OpKind::Add));
    assert_eq!(ok(&[f32(&[2, 3]), f32(&[3])], |_, t| t[0].sub(&t[1])), (vec![2, 3], DType::F32, OpKind::Sub));
    assert_eq!(ok(&[u16(&[4, 1]), u16(&[1, 5])], |_, t| t[0].mul(&t[1])), (vec![4, 5], DType::U16Asym, OpKind::Mul));
    // A scalar constant (with or without its QDQ point) combines with a quantized operand, on either side.
    let two = || qdq!(const 2.0, "two_qdq");
    assert_eq!(ok(&[u16(&[1, 4, 8])], |_, t| t[0].add(&two()?)), (vec![1, 4, 8], DType::U16Asym, OpKind::Add));
    assert_eq!(ok(&[u16(&[1, 4, 8])], |_, t| two()?.mul(&t[0])), (vec![1, 4, 8], DType::U16Asym, OpKind::Mul));
    assert_eq!(ok(&[u16(&[1, 4, 8])], |_, t| Tensor::scalar(1.0).sub(&t[0])).1, DType::U16Asym);
    assert_eq!(ok(&[u16(&[1, 4, 8])], |_, t| t[0].add_scalar(0.5)).1, DType::U16Asym);
    assert_eq!(ok(&[u16(&[1, 4, 8])], |_, t| t[0].mul_scalar(0.5)).1, DType::U16Asym);

    assert_op_err(fails!([f32(&[2, 3]), f32(&[4])], |_, t| t[0].add(&t[1])), "Add", &["[2, 3]", "[4]", "broadcast"]);
    let ins = [u16(&[1, 4, 8]), f32(&[1, 4, 8])];
    assert_op_err(fails!(ins, |_, t| t[0].add(&t[1])), "Add", &["UInt16PerTensorAsy", "Float32"]);
    let ins = [input(&[2], DType::Bool), input(&[2], DType::Bool)];
    assert_op_err(fails!(ins, |_, t| t[0].sub(&t[1])), "Sub", &["numeric", "Bool"]);
    assert_op_err(fails!([f32(&[2, 3]), f32(&[3, 2])], |_, t| t[0].mul(&t[1])), "Mul", &["[2, 3]", "[3, 2]"]);
}

#[test]
fn unary() {
    assert_eq!(ok(&[u16(&[2, 3])], |_, t| t[0].neg()), (vec![2, 3], DType::U16Asym, OpKind::Neg));
    assert_eq!(ok(&[f32(&[2, 3])], |_, t| t[0].sigmoid()), (vec![2, 3], DType::F32, OpKind::Sigmoid));
    assert_eq!(ok(&[input(&[5], DType::BF16)], |_, t| t[0].silu()), (vec![5], DType::BF16, OpKind::Silu));

    assert_op_err(fails!([input(&[2, 3], DType::I32)], |_, t| t[0].neg()), "Neg", &["Int32"]);
    assert_op_err(fails!([input(&[2, 3], DType::Bool)], |_, t| t[0].sigmoid()), "Sigmoid", &["Bool"]);
    assert_op_err(fails!([input(&[2, 3], DType::I64)], |_, t| t[0].silu()), "SiLU", &["Int64"]);
}

#[test]
fn softmax() {
    let (s, d, k) = ok(&[u16(&[1, 2, 4, 16])], |_, t| t[0].softmax(-1));
    assert_eq!((s, d, k), (vec![1, 2, 4, 16], DType::U16Asym, OpKind::Softmax { dim: 3 }));
    assert_eq!(ok(&[f32(&[3, 5])], |_, t| t[0].softmax(0)).2, OpKind::Softmax { dim: 0 });

    assert_op_err(fails!([f32(&[1, 2, 4, 16])], |_, t| t[0].softmax(4)), "Softmax", &["dim 4", "[1, 2, 4, 16]"]);
    assert_op_err(fails!([f32(&[1, 2, 4, 16])], |_, t| t[0].softmax(-5)), "Softmax", &["dim -5", "[1, 2, 4, 16]"]);
    assert_op_err(fails!([input(&[4, 16], DType::I32)], |_, t| t[0].softmax(-1)), "Softmax", &["Int32"]);
}

#[test]
fn rms_norm() {
    let p = run(&[u16(&[1, 4, 8])], |b, t| b.norm.forward(&t[0])).unwrap();
    let (ty, op) = produced(&p);
    assert_eq!((ty.shape, ty.dtype), (vec![1, 4, 8], DType::U16Asym));
    assert_eq!(op.kind, OpKind::RmsNorm { eps: 1e-6, unit_offset: false });
    assert_eq!(op.name.as_deref(), Some("model.layers.0.mlp.norm"));

    assert_op_err(fails!([f32(&[1, 4, 6])], |b, t| b.norm.forward(&t[0])), "RMSNorm", &["[8]", "[1, 4, 6]"]);
    assert_op_err(fails!([input(&[1, 8], DType::I32)], |b, t| b.norm.forward(&t[0])), "RMSNorm", &["Int32"]);
}

#[test]
fn embedding() {
    let p = run(&[input(&[1, 4], DType::I32)], |b, t| b.embed.forward(&t[0])).unwrap();
    let (ty, op) = produced(&p);
    assert_eq!((ty.shape, ty.dtype, &op.kind), (vec![1, 4, 8], DType::F32, &OpKind::Embedding));
    assert_eq!(op.name.as_deref(), Some("model.layers.0.mlp.embed"));
    // The output has the table's dtype: uint16 in the QNN form.
    let p = run_with(ParamFormat::QnnW4A16, &[input(&[4], DType::I64)], |b, t| b.embed.forward(&t[0])).unwrap();
    assert_eq!(produced(&p).0, TensorType::new(vec![4, 8], DType::U16Asym));

    assert_op_err(fails!([f32(&[1, 4])], |b, t| b.embed.forward(&t[0])), "Embedding", &["Int32/Int64", "Float32"]);
    assert_op_err(fails!([u16(&[1, 4])], |b, t| b.embed.forward(&t[0])), "Embedding", &["UInt16PerTensorAsy"]);
}

#[test]
fn gather() {
    let ins = [u16(&[1, 16, 8]), input(&[4], DType::I32)];
    let (s, d, k) = ok(&ins, |_, t| t[0].gather(1, &t[1]));
    assert_eq!((s, d, k), (vec![1, 4, 8], DType::U16Asym, OpKind::Gather { dim: 1 }));
    let ins = [f32(&[1, 16, 8]), input(&[2, 3], DType::I64)];
    assert_eq!(ok(&ins, |_, t| t[0].gather(-2, &t[1])), (vec![1, 2, 3, 8], DType::F32, OpKind::Gather { dim: 1 }));

    let ins = [f32(&[1, 16, 8]), f32(&[4])];
    assert_op_err(fails!(ins, |_, t| t[0].gather(1, &t[1])), "Gather", &["Int32/Int64", "Float32"]);
    let ins = [f32(&[1, 16, 8]), input(&[4], DType::I32)];
    assert_op_err(fails!(ins, |_, t| t[0].gather(3, &t[1])), "Gather", &["dim 3", "[1, 16, 8]"]);
}

#[test]
fn conv2d() {
    let p = run(&[u16(&[1, 1, 4, 8])], |b, t| b.conv.forward(&t[0])).unwrap();
    let (ty, op) = produced(&p);
    assert_eq!((ty.shape, ty.dtype, &op.kind), (vec![1, 1, 4, 16], DType::U16Asym, &OpKind::Conv2d));
    assert_eq!(op.name.as_deref(), Some("model.layers.0.mlp.conv"));
    // With LPBQ weights the output keeps the activation's dtype.
    let p = run_with(ParamFormat::QnnW4A16, &[u16(&[1, 1, 4, 8])], |b, t| b.conv.forward(&t[0])).unwrap();
    assert_eq!(produced(&p).0, TensorType::new(vec![1, 1, 4, 16], DType::U16Asym));

    // Channels must be last (NHWC) and match the HWIO weight's In.
    let parts = ["NHWC", "HWIO", "[1, 1, 4, 6]", "[1, 1, 8, 16]"];
    assert_op_err(fails!([f32(&[1, 1, 4, 6])], |b, t| b.conv.forward(&t[0])), "Conv2D", &parts);
    let parts = ["[1, 8, 1, 4]", "[1, 1, 8, 16]"];
    assert_op_err(fails!([f32(&[1, 8, 1, 4])], |b, t| b.conv.forward(&t[0])), "Conv2D", &parts);
    assert_op_err(fails!([f32(&[4, 8])], |b, t| b.conv.forward(&t[0])), "Conv2D", &["[4, 8]", "[1, 1, 8, 16]"]);
}

#[test]
fn linear() {
    let p = run(&[f32(&[2, 3, 8])], |b, t| b.proj.forward(&t[0])).unwrap();
    let (ty, op) = produced(&p);
    assert_eq!((ty.shape, ty.dtype, &op.kind), (vec![2, 3, 16], DType::F32, &OpKind::Linear));
    assert_eq!(op.name.as_deref(), Some("model.layers.0.mlp.proj"));

    let parts = ["[16, 8]", "[2, 6]", "[out, 6]"];
    assert_op_err(fails!([f32(&[2, 6])], |b, t| b.proj.forward(&t[0])), "Linear", &parts);
    assert_op_err(fails!([input(&[2, 8], DType::I32)], |b, t| b.proj.forward(&t[0])), "Linear", &["Int32"]);
}

#[test]
fn reduce() {
    let (s, d, k) = ok(&[u16(&[2, 3, 4])], |_, t| t[0].reduce_max(-1, true));
    assert_eq!((s, d), (vec![2, 3, 1], DType::U16Asym));
    assert_eq!(k, OpKind::Reduce { kind: ReduceKind::Max, dim: 2, keepdim: true });
    let (s, _, k) = ok(&[f32(&[2, 3, 4])], |_, t| t[0].mean(1, false));
    assert_eq!((s, k), (vec![2, 4], OpKind::Reduce { kind: ReduceKind::Mean, dim: 1, keepdim: false }));
    let (s, _, k) = ok(&[f32(&[2, 3, 4])], |_, t| t[0].reduce_min(0, false));
    assert_eq!((s, k), (vec![3, 4], OpKind::Reduce { kind: ReduceKind::Min, dim: 0, keepdim: false }));
    assert_eq!(ok(&[f32(&[5])], |_, t| t[0].reduce_min(0, true)).0, [1]);

    assert_op_err(fails!([input(&[2, 3], DType::Bool)], |_, t| t[0].reduce_min(-1, true)), "ReduceMin", &["Bool"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].mean(3, false)), "ReduceMean", &["dim 3", "[2, 3, 4]"]);
    assert_op_err(fails!([f32(&[2, 3, 4])], |_, t| t[0].reduce_max(-4, true)), "ReduceMax", &["dim -4", "[2, 3, 4]"]);
}

#[test]
fn equal() {
    let ins = [u16(&[1, 1, 4, 16]), u16(&[1])];
    let (s, d, k) = ok(&ins, |_, t| t[0].eq(&t[1]));
    assert_eq!((s, d, k), (vec![1, 1, 4, 16], DType::Bool, OpKind::Equal));
    assert_eq!(ok(&[f32(&[2, 1]), f32(&[1, 3])], |_, t| t[0].eq(&t[1])).0, [2, 3]);

    assert_op_err(fails!([f32(&[2, 3]), f32(&[2, 4])], |_, t| t[0].eq(&t[1])), "Equal", &["[2, 3]", "[2, 4]"]);
}

#[test]
fn where_cond() {
    let ins = [input(&[1, 1, 4, 16], DType::Bool), u16(&[1, 2, 4, 16]), u16(&[1, 2, 4, 1])];
    let (s, d, k) = ok(&ins, |_, t| t[0].where_cond(&t[1], &t[2]));
    assert_eq!((s, d, k), (vec![1, 2, 4, 16], DType::U16Asym, OpKind::Where));
    // A scalar constant branch takes the other branch's dtype, on either side.
    let ins = [input(&[2, 3], DType::Bool), u16(&[2, 3])];
    assert_eq!(ok(&ins, |_, t| t[0].where_cond(&t[1], &Tensor::scalar(-20.0))).1, DType::U16Asym);
    assert_eq!(ok(&ins, |_, t| t[0].where_cond(&Tensor::scalar(-20.0), &t[1])).1, DType::U16Asym);

    let ins = [f32(&[2, 3]), f32(&[2, 3]), f32(&[2, 3])];
    assert_op_err(fails!(ins, |_, t| t[0].where_cond(&t[1], &t[2])), "Where", &["Bool", "Float32"]);
    let ins = [input(&[1, 1, 4, 16], DType::Bool), f32(&[1, 2, 4, 8]), f32(&[1])];
    let parts = ["[1, 1, 4, 16]", "[1, 2, 4, 8]"];
    assert_op_err(fails!(ins, |_, t| t[0].where_cond(&t[1], &t[2])), "Where", &parts);
    let ins = [input(&[2], DType::Bool), u16(&[2]), f32(&[2])];
    let parts = ["UInt16PerTensorAsy", "Float32"];
    assert_op_err(fails!(ins, |_, t| t[0].where_cond(&t[1], &t[2])), "Where", &parts);
}

#[test]
fn cast() {
    let (s, d, k) = ok(&[f32(&[1, 2, 16, 4])], |_, t| t[0].to(DType::U8Sym));
    assert_eq!((s, d, k), (vec![1, 2, 16, 4], DType::U8Sym, OpKind::Cast { to: DType::U8Sym }));
    assert_eq!(ok(&[input(&[3], DType::U8Sym)], |_, t| t[0].to(DType::F32)).1, DType::F32);

    // Cast takes exactly one input.
    let cast = OpKind::Cast { to: DType::F16 };
    let err = fails!([f32(&[2]), f32(&[2])], |_, t| tensor::apply(cast, &[&t[0], &t[1]], None, CallSite::here()));
    assert_op_err(err, "CastType", &["expects 1 inputs, got 2"]);
}

/// Ops called outside any module report the top-level module, and a traced op is named after its
/// module and type.
#[test]
fn op_names_and_top_level_errors() {
    let p = run(&[f32(&[2, 3])], |_, t| t[0].neg()?.neg()?.transpose(0, 1)).unwrap();
    let names: Vec<_> = p.linalg_ops().iter().map(|op| op.name.clone().unwrap()).collect();
    assert_eq!(names, [format!("{PATH}.Neg.0"), format!("{PATH}.Neg.1"), format!("{PATH}.Transpose.0")]);

    let err = trace(&[f32(&[2, 3])], |t| t[0].view(&[7])).unwrap_err();
    let Error::Op { op, module_path, .. } = &err else { panic!("expected Error::Op, got {err:?}") };
    assert_eq!((op.as_str(), module_path.as_str()), ("View", ""));
    assert!(err.to_string().starts_with("View in module `<top>` at "), "{err}");
}
