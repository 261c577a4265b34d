//! Fused steps (`mllm_dsl::fused`): a backend that fuses a step computes it with the step's QDQ
//! points resolved in the calling module; any other backend, and a trace, run the written-out ops;
//! the points count as used either way.

use mllm_dsl::backend::{Backend, BackendError, Storage};
use mllm_dsl::fused::{fused, Fused, Point};
use mllm_dsl::op::OpKind;
use mllm_dsl::prelude::*;
use mllm_dsl::{QdqAttr, QdqKind, TensorType};
use std::sync::{Arc, Mutex};

/// Computes `Neg`; fuses the RoPE step (when `fuses`) as `-10 x`, recording the points it got.
struct Fuser {
    fuses: bool,
    fused_points: Mutex<Vec<String>>,
    fused_kinds: Mutex<Vec<QdqKind>>,
}

impl Fuser {
    fn new(fuses: bool) -> Arc<Fuser> {
        Arc::new(Fuser { fuses, fused_points: Mutex::new(Vec::new()), fused_kinds: Mutex::new(Vec::new()) })
    }
}

impl Backend for Fuser {
    fn name(&self) -> &str {
        "fuser"
    }

    fn execute(&self, op: &OpKind, inputs: &[&Tensor], _out: &TensorType) -> Result<Storage, BackendError> {
        match (op, inputs[0].as_f32()) {
            (OpKind::Neg, Some(x)) => Ok(Storage::F32(x.iter().map(|v| -v).collect())),
            _ => Err(BackendError::Op(format!("fuser cannot compute {}", op.type_name()))),
        }
    }

    fn qdq(&self, x: &Tensor, _point: &QdqAttr) -> Result<Tensor, BackendError> {
        Ok(x.clone())
    }

    fn fuses(&self, kind: Fused) -> bool {
        self.fuses && kind == Fused::RotateHalfRope
    }

    fn fused(&self, _kind: Fused, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        self.fused_points.lock().unwrap().extend(points.iter().map(|p| p.key.clone()));
        self.fused_kinds.lock().unwrap().extend(points.iter().map(|p| p.kind.clone()));
        let x: Vec<f32> = inputs[0].as_f32()?.iter().map(|v| -10.0 * v).collect();
        let backend = inputs[0].backend()?.clone();
        Some(Tensor::from_f32(x, inputs[0].shape().to_vec(), backend).map_err(|e| BackendError::Op(e.to_string())))
    }
}

/// One step `neg` with one QDQ point, fused or written out; `twice` runs it twice in one call;
/// `fixed` makes the point a fixed one. (`proj` is unused: a module needs a layer.)
#[module]
struct Block {
    proj: Linear,
    #[module(skip)]
    twice: bool,
    #[module(skip)]
    fixed: bool,
}

const FIXED: QdqKind = QdqKind::Fixed { scale: 0.5, zero_point: 3 };

#[module]
impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let step = |x: &Tensor| {
            if self.fixed {
                let point = Point { name: "neg_qdq", kind: FIXED };
                fused(Fused::RotateHalfRope, &[x], &[point], || qdq!(fixed x.neg()?, "neg_qdq", scale = 0.5, zp = 3))
            } else {
                fused(Fused::RotateHalfRope, &[x], &["neg_qdq"], || qdq!(x.neg()?, "neg_qdq"))
            }
        };
        let y = step(x)?;
        if self.twice {
            step(&y)
        } else {
            Ok(y)
        }
    }
}

fn block(twice: bool) -> Block {
    let mut b = Block { proj: Linear::new(2, 2), twice, fixed: false };
    b.bind("model.block", &ParamSource::Symbolic(ParamFormat::Float)).unwrap();
    b
}

#[test]
fn a_fusing_backend_computes_the_step_with_the_modules_points() {
    let backend = Fuser::new(true);
    let x = Tensor::from_f32(vec![1.0, -2.0], vec![1, 2], backend.clone()).unwrap();
    let y = block(false).forward(&x).unwrap();
    assert_eq!(y.as_f32().unwrap(), [-10.0, 20.0]);
    assert_eq!(*backend.fused_points.lock().unwrap(), ["model.block.neg_qdq"]);
    assert_eq!(*backend.fused_kinds.lock().unwrap(), [QdqKind::Activation]);
}

#[test]
fn a_points_kind_reaches_the_backend() {
    let backend = Fuser::new(true);
    let x = Tensor::from_f32(vec![1.0, -2.0], vec![1, 2], backend.clone()).unwrap();
    let b = Block { fixed: true, ..block(false) };
    assert_eq!(b.forward(&x).unwrap().as_f32().unwrap(), [-10.0, 20.0]);
    assert_eq!(*backend.fused_points.lock().unwrap(), ["model.block.neg_qdq"]);
    assert_eq!(*backend.fused_kinds.lock().unwrap(), [FIXED]);
}

#[test]
fn other_backends_and_traces_run_the_written_out_ops() {
    let backend = Fuser::new(false);
    let x = Tensor::from_f32(vec![1.0, -2.0], vec![1, 2], backend.clone()).unwrap();
    assert_eq!(block(false).forward(&x).unwrap().as_f32().unwrap(), [-1.0, 2.0]);
    assert!(backend.fused_points.lock().unwrap().is_empty());
    let b = block(false);
    let program = trace(&[TraceInput::new("x", [1, 2], DType::F32)], |x| b.forward(&x[0])).unwrap();
    let text = program.to_string();
    assert!(text.contains("act(\"model.block.neg_qdq\")"), "{text}");
}

#[test]
fn a_fused_steps_points_count_as_used() {
    for fuses in [true, false] {
        let x = Tensor::from_f32(vec![1.0], vec![1, 1], Fuser::new(fuses)).unwrap();
        let err = block(true).forward(&x).unwrap_err().to_string();
        assert!(err.contains("neg_qdq") && err.contains("already used"), "fuses {fuses}: {err}");
    }
}
