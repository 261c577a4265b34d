//! LLMQuantRecipe: every value of the model graph gets a quantization spec (mllm's
//! `LLMQuantRecipePass`). Specs say how a value is stored (kind, range); [`Ptq`](super::Ptq) fills
//! in the numbers.
//!
//! The walk starts at the model graph and follows calls in program order. Graph inputs without a
//! spec get the simple spec of their dtype (u16 asymmetric for activations, u8 symmetric for the
//! KV cache, `Raw` for ids and floats). Then each op gets its rule (mllm/backends/qnn/aot/passes):
//!
//! | op | output spec |
//! |---|---|
//! | View, Unsqueeze, Permute, Transpose, Repeat, Slice, Gather | **shared** with input 0 |
//! | Concat | **shared** with input 0 (all inputs must later agree, see PTQ) |
//! | Embedding | **shared** with the weight (u16 asymmetric) |
//! | Conv2D | own u16 asymmetric; weight: LPBQ with the config's block size; bias: `Raw(Float32)` |
//! | RMSNorm | own; weight: u16 asymmetric |
//! | Add, Sub, Mul | own; a constant second input gets a copy of input 0's kind |
//! | MatMul, Where, Sigmoid, SiLU, Neg, Softmax, Reduce*, CastType | own |
//! | Equal | `Raw(Bool)`; a constant second input is forced to u16 asymmetric |
//!
//! "Shared" means the same [`SpecId`](mllm_dsl::ir::SpecId): solving one value solves all of them,
//! which is exactly what a pure data movement needs. Ops with no rule (Linear: mllm's legacy path,
//! whose lowering is broken — trace linears as 1×1 convs) are errors, as are inputs that should
//! already have a spec and do not.

use super::graph::{callee, describe_value, module_of, op_name, subgraph_slots, top_call, walk_from, Visit};
use super::pipeline::block_size_for;
use super::{Pass, PassError};
use crate::aot_config::AotConfig;
use mllm_dsl::dtype::DType;
use mllm_dsl::ir::{LinalgOp, Node, Program, QuantSpec, QuantSpecKind, SpecId, ValueId};
use mllm_dsl::op::OpKind;

pub struct LlmQuantRecipe<'a> {
    config: &'a AotConfig,
}

impl<'a> LlmQuantRecipe<'a> {
    pub fn new(config: &'a AotConfig) -> Self {
        LlmQuantRecipe { config }
    }
}

const PASS: &str = "LLMQuantRecipe";

impl Pass for LlmQuantRecipe<'_> {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "llm_quant_recipe"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let (_, call) = top_call(p, PASS)?;
        let start = callee(&subgraph_slots(p), call, PASS)?;
        for visit in walk_from(p, start, PASS)? {
            match visit {
                Visit::Enter(g) => {
                    let sg = p.graph(g);
                    let (inputs, symbol) = (sg.region.inputs.clone(), sg.symbol.clone());
                    for v in inputs {
                        ensure_simple(p, v).map_err(|e| PassError::Op {
                            pass: PASS,
                            op: format!("@{symbol}"),
                            module: symbol.clone(),
                            value: describe_value(p, v),
                            message: e.message,
                        })?;
                    }
                }
                Visit::Node(r) => {
                    if let Node::Linalg(op) = super::graph::node(p, r) {
                        let op = op.clone();
                        let module = module_of(p, r.graph);
                        self.apply(p, &op, &module)?;
                    }
                }
            }
        }
        Ok(())
    }
}

/// Why a rule failed: which operand and what is wrong.
struct RuleError {
    value: Option<ValueId>,
    message: String,
}

fn fail(value: ValueId, message: impl Into<String>) -> RuleError {
    RuleError { value: Some(value), message: message.into() }
}

impl LlmQuantRecipe<'_> {
    fn apply(&self, p: &mut Program, op: &LinalgOp, module: &str) -> Result<(), PassError> {
        // Already processed (a second run, or a program that came with specs).
        if op.outputs.iter().all(|v| p.value(*v).spec.is_some()) {
            return Ok(());
        }
        let result = match &op.kind {
            OpKind::Linear => {
                return Err(PassError::NoRecipeRule {
                    pass: PASS,
                    op: op_name(op),
                    op_type: op.kind.type_name(),
                    module: module.to_string(),
                    hint: " (mllm's Linear recipe is legacy and its lowering is broken; write linears as \
                           nn::Conv2d, the 1x1 NHWC form the QNN LPBQ recipe expects)"
                        .into(),
                })
            }
            OpKind::View { .. }
            | OpKind::Unsqueeze { .. }
            | OpKind::Permute { .. }
            | OpKind::Transpose { .. }
            | OpKind::Repeat { .. }
            | OpKind::Slice { .. }
            | OpKind::Gather { .. } => self.share_first(p, op),
            OpKind::Concat { .. } => op
                .inputs
                .iter()
                .try_for_each(|&v| ensure_simple(p, v).map(|_| ()))
                .and_then(|_| self.share_first(p, op)),
            OpKind::Embedding => self.embedding(p, op),
            OpKind::Conv2d => self.conv2d(p, op),
            OpKind::RmsNorm { .. } => self.rms_norm(p, op),
            OpKind::Add | OpKind::Sub | OpKind::Mul => self.elementwise(p, op),
            OpKind::MatMul | OpKind::Where => {
                op.inputs.iter().try_for_each(|&v| require_spec(p, v)).and_then(|_| own_output(p, op))
            }
            OpKind::Cast { .. } => require_spec(p, op.inputs[0]).and_then(|_| own_output(p, op)),
            OpKind::Sigmoid | OpKind::Silu | OpKind::Neg | OpKind::Softmax { .. } | OpKind::Reduce { .. } => {
                ensure_simple(p, op.inputs[0]).and_then(|_| own_output(p, op))
            }
            OpKind::Equal => self.equal(p, op),
        };
        result.map_err(|e| PassError::Op {
            pass: PASS,
            op: op_name(op),
            module: module.to_string(),
            value: e.value.map_or_else(|| "the op".to_string(), |v| describe_value(p, v)),
            message: e.message,
        })
    }

    /// The output shares input 0's spec (created if the input has none).
    fn share_first(&self, p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
        let x = op.inputs[0];
        let spec = ensure_simple(p, x)?;
        for &o in &op.outputs {
            p.set_value_spec(o, spec);
        }
        Ok(())
    }

    fn embedding(&self, p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
        let (ids, w) = (op.inputs[0], op.inputs[1]);
        ensure_simple(p, ids)?;
        let spec = u16_weight(p, w)?;
        p.set_value_spec(op.outputs[0], spec);
        Ok(())
    }

    fn rms_norm(&self, p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
        let x = op.inputs[0];
        ensure_simple(p, x)?;
        u16_weight(p, op.inputs[1])?;
        own_output(p, op)
    }

    fn conv2d(&self, p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
        let (x, w) = (op.inputs[0], op.inputs[1]);
        require_spec(p, x)?;
        let wty = &p.value(w).ty;
        if p.value(w).symbol.is_none() || wty.rank() != 4 {
            return Err(fail(w, "the weight must be a registered HWIO [1, 1, In, Out] parameter"));
        }
        let in_features = wty.shape[2];
        let name = op.name.clone().unwrap_or_default();
        let block_size = block_size_for(self.config, &name, in_features)
            .map_err(|e| RuleError { value: Some(w), message: e.to_string() })?;
        let want = QuantSpecKind::lpbq_hwio(block_size);
        match p.value_spec(w) {
            None => {
                let spec = p.add_spec(QuantSpec::new(want));
                p.set_value_spec(w, spec);
            }
            Some(existing) if existing.kind == want => {}
            Some(existing) => {
                return Err(fail(
                    w,
                    format!("the weight already has spec {} (shared by another op?), wanted {want}", existing.kind),
                ))
            }
        }
        if let Some(&b) = op.inputs.get(2) {
            // The bias stays a float parameter here (pymllm adds it in float); the lowering
            // quantizes it to QNN's int32 bias, whose scale derives from the input and weight.
            let (bdef, out_features) = (p.value(b), p.value(w).ty.shape[3]);
            if bdef.symbol.is_none() || bdef.ty.dtype != DType::F32 || bdef.ty.shape != [out_features] {
                let found = bdef.ty.to_string();
                return Err(fail(
                    b,
                    format!("a Conv2D bias must be a registered Float32 [{out_features}] parameter, found {found}"),
                ));
            }
            ensure_simple(p, b)?;
        }
        let spec = p.add_spec(QuantSpec::new(QuantSpecKind::u16_asym()));
        p.set_value_spec(op.outputs[0], spec);
        Ok(())
    }

    fn elementwise(&self, p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
        let (a, b) = (op.inputs[0], op.inputs[1]);
        let kind = p
            .value_spec(a)
            .map(|s| s.kind.clone())
            .ok_or_else(|| fail(a, "input 0 has no quantization spec (the op that produces it got no recipe)"))?;
        if p.value(b).spec.is_none() {
            if p.value(b).constant.is_none() {
                return Err(fail(b, "input 1 has no quantization spec and is not a constant"));
            }
            // A constant takes input 0's kind, with its own parameters (from its own QDQ).
            let spec = p.add_spec(QuantSpec::new(kind));
            p.set_value_spec(b, spec);
        }
        own_output(p, op)
    }

    fn equal(&self, p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
        let (a, b) = (op.inputs[0], op.inputs[1]);
        require_spec(p, a)?;
        if p.value(b).spec.is_none() {
            let def = p.value(b);
            if def.constant.is_none() {
                return Err(fail(b, "input 1 has no quantization spec and is not a constant"));
            }
            if !matches!(def.ty.dtype, DType::F32 | DType::U16 | DType::U16Asym) {
                return Err(fail(b, format!("a compared constant must be Float32 or UInt16, got {}", def.ty.dtype)));
            }
            let spec = p.add_spec(QuantSpec::new(QuantSpecKind::u16_asym()));
            p.set_value_spec(b, spec);
        }
        let spec = p.add_spec(QuantSpec::new(QuantSpecKind::Raw { dtype: DType::Bool }));
        p.set_value_spec(op.outputs[0], spec);
        Ok(())
    }
}

fn require_spec(p: &Program, v: ValueId) -> Result<(), RuleError> {
    match p.value(v).spec {
        Some(_) => Ok(()),
        None => Err(fail(v, "this input has no quantization spec (the op that produces it got no recipe)")),
    }
}

/// The value's spec, or a new simple spec for its dtype.
fn ensure_simple(p: &mut Program, v: ValueId) -> Result<SpecId, RuleError> {
    if let Some(s) = p.value(v).spec {
        return Ok(s);
    }
    let dtype = p.value(v).ty.dtype;
    let kind = QuantSpecKind::simple(dtype).ok_or_else(|| {
        fail(v, format!("a {dtype} value needs an explicit rule (it is only valid as a linear weight)"))
    })?;
    let spec = p.add_spec(QuantSpec::new(kind));
    p.set_value_spec(v, spec);
    Ok(spec)
}

/// Each output gets its own simple spec (deliberately not shared, so PTQ solves it on its own).
fn own_output(p: &mut Program, op: &LinalgOp) -> Result<(), RuleError> {
    for &o in &op.outputs {
        if p.value(o).spec.is_none() {
            ensure_simple(p, o)?;
        }
    }
    Ok(())
}

/// A norm or embedding weight: stored uint16, per-tensor asymmetric (mllm retags plain uint16).
fn u16_weight(p: &mut Program, w: ValueId) -> Result<SpecId, RuleError> {
    let def = p.value(w);
    if def.symbol.is_none() {
        return Err(fail(w, "the weight must be a registered parameter"));
    }
    if !matches!(def.ty.dtype, DType::U16 | DType::U16Asym) {
        return Err(fail(
            w,
            format!("the weight must be stored as uint16 (trace with ParamFormat::QnnW4A16), got {}", def.ty.dtype),
        ));
    }
    p.value_mut(w).ty.dtype = DType::U16Asym;
    Ok(match p.value(w).spec {
        Some(s) => s,
        None => {
            let s = p.add_spec(QuantSpec::new(QuantSpecKind::u16_asym()));
            p.set_value_spec(w, s);
            s
        }
    })
}
