//! PTQ: every spec gets its numbers (mllm's `PTQPass`).
//!
//! 1. Weights. A Conv2D's LPBQ weight refers to `<op>.weight` (int4 codes in int8, 0..=15),
//!    `<op>.scale1` (u8, 0..=16) and `<op>.scale2` (f32); their dtypes are checked and their codes
//!    range-checked when the provider holds data, but nothing is copied: the spec keeps the prefix.
//!    RMSNorm and Embedding weights take `<op>.scale` / `<op>.zero_point`. A linear stored as
//!    per-channel int8 (`<op>.weight` int8 codes -127..=127 and `<op>.scale` f32 `[Out]`, no
//!    `scale1`: one a mixed-precision recipe raised to 8 bits) gets the per-channel spec instead
//!    of LPBQ, and its value becomes `Int8`.
//! 2. Values. A value with a QDQ point solves its spec with that point's parameters
//!    ([`qdq_params`]); values sharing the spec are solved with it. Two QDQ points with different
//!    parameters on one shared spec are an error (mllm silently keeps the first).
//! 3. Constants. A scalar constant with a solved spec is quantized with mllm's rule
//!    (`clamp(round(v / scale) + zero_point)`, [`quantize_constant`]) into a static code: its dtype
//!    becomes the spec's storage type and the code is the `quantized` attribute. The float value
//!    stays in `constant`, for float execution of the program.
//! 4. Every spec used by an op must now be solved; the error names the op, the value and why.
//! 5. The inputs of each Concat must agree in scale and zero point (a shared output spec cannot
//!    represent both otherwise); mllm only logs this, here it is an error.

use super::graph::{
    callee, describe_value, linalg, module_of, op_name, subgraph_slots, top_call, walk_from, walk_ops, NodeRef,
};
use super::params::{qdq_params, QuantParamProvider};
use super::{Pass, PassError};
use crate::quant::fake_quant::quantize_constant;
use crate::quant::spec::QuantParams;
use mllm_dsl::dtype::DType;
use mllm_dsl::ir::{Program, QuantSpecKind, SpecParams, ValueId};
use mllm_dsl::op::OpKind;

pub struct Ptq<'a> {
    params: &'a dyn QuantParamProvider,
}

impl<'a> Ptq<'a> {
    pub fn new(params: &'a dyn QuantParamProvider) -> Self {
        Ptq { params }
    }
}

const PASS: &str = "PTQ";

/// Range of stored LPBQ codes (int4 nibbles) and level-0 block scales, as mllm's PTQ asserts.
const LPBQ_CODE_RANGE: (i64, i64) = (0, 15);
const LPBQ_SCALE1_RANGE: (i64, i64) = (0, 16);
/// Range of stored per-channel int8 codes (symmetric: -128 unused).
const INT8_CODE_RANGE: (i64, i64) = (-127, 127);

/// Where a value sits on an op, for messages.
#[derive(Clone, Copy)]
enum Role {
    Input(usize),
    Output(usize),
}

impl Role {
    fn text(self) -> String {
        match self {
            Role::Input(i) => format!("input {i} of"),
            Role::Output(i) => format!("output {i} of"),
        }
    }
}

impl Pass for Ptq<'_> {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "ptq"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let (_, call) = top_call(p, PASS)?;
        let start = callee(&subgraph_slots(p), call, PASS)?;
        let walk = walk_from(p, start, PASS)?;
        let ops = walk_ops(p, &walk);
        for &r in &ops {
            self.solve_weights(p, r)?;
        }
        for &r in &ops {
            let op = linalg(p, r);
            let values: Vec<(ValueId, Role)> = op
                .inputs
                .iter()
                .enumerate()
                .map(|(i, v)| (*v, Role::Input(i)))
                .chain(op.outputs.iter().enumerate().map(|(i, v)| (*v, Role::Output(i))))
                .collect();
            for (v, role) in values {
                self.solve_value(p, r, v, role)?;
            }
        }
        for &r in &ops {
            quantize_constants(p, r);
        }
        for &r in &ops {
            check_solved(p, r)?;
        }
        for &r in &ops {
            check_concat(p, r)?;
        }
        Ok(())
    }
}

impl Ptq<'_> {
    fn op_error(&self, p: &Program, r: NodeRef, v: ValueId, message: String) -> PassError {
        PassError::Op {
            pass: PASS,
            op: op_name(linalg(p, r)),
            module: module_of(p, r.graph),
            value: describe_value(p, v),
            message,
        }
    }

    fn param_error(&self, p: &Program, r: NodeRef, v: ValueId, source: super::ParamError) -> PassError {
        PassError::Param {
            pass: PASS,
            op: op_name(linalg(p, r)),
            module: module_of(p, r.graph),
            value: describe_value(p, v),
            source: Box::new(source),
        }
    }

    /// Solves the weight spec of a Conv2D (LPBQ), RMSNorm or Embedding (u16 per-tensor).
    fn solve_weights(&self, p: &mut Program, r: NodeRef) -> Result<(), PassError> {
        let op = linalg(p, r);
        if !matches!(op.kind, OpKind::Conv2d | OpKind::RmsNorm { .. } | OpKind::Embedding) || op.inputs.len() < 2 {
            return Ok(());
        }
        let w = op.inputs[1];
        let Some(sid) = p.value(w).spec else { return Ok(()) };
        if p.spec(sid).is_solved() {
            return Ok(());
        }
        let symbol = p.value(w).symbol.clone().unwrap_or_default();
        let Some(prefix) = symbol.strip_suffix(".weight").map(str::to_string) else {
            return Err(self.op_error(p, r, w, format!("weight symbol `{symbol}` does not end in `.weight`")));
        };
        let params = match p.spec(sid).kind.clone() {
            QuantSpecKind::Lpbq { .. } if self.is_int8_linear(&prefix).map_err(|e| self.param_error(p, r, w, e))? => {
                // A linear a mixed-precision recipe raised to 8 bits: per-channel int8 instead.
                let ir_shape = p.value(w).ty.shape.clone();
                let weight_key = SpecParams::weight_key(&prefix);
                self.expect_tensor(p, r, w, &weight_key, DType::I8, Some(&ir_shape))?;
                self.check_range(p, r, w, &weight_key, INT8_CODE_RANGE)?;
                let channels = match ir_shape[..] {
                    [1, 1, _, out] => out,
                    _ => {
                        let m = format!("an int8 linear weight must be HWIO [1, 1, In, Out], found {ir_shape:?}");
                        return Err(self.op_error(p, r, w, m));
                    }
                };
                let scales_key = SpecParams::scale_key(&prefix);
                self.expect_tensor(p, r, w, &scales_key, DType::F32, Some(&[channels]))?;
                p.spec_mut(sid).kind = QuantSpecKind::int8_per_channel_hwio();
                p.value_mut(w).ty.dtype = DType::I8;
                SpecParams::PerChannel { from: prefix, channels }
            }
            QuantSpecKind::Lpbq { .. } => {
                let weight_key = SpecParams::weight_key(&prefix);
                let ir_shape = p.value(w).ty.shape.clone();
                self.expect_tensor(p, r, w, &weight_key, DType::I8, Some(&ir_shape))?;
                self.check_range(p, r, w, &weight_key, LPBQ_CODE_RANGE)?;
                let scale1_key = SpecParams::lpbq_scale1_key(&prefix);
                self.expect_tensor(p, r, w, &scale1_key, DType::U8, None)?;
                self.check_range(p, r, w, &scale1_key, LPBQ_SCALE1_RANGE)?;
                self.expect_tensor(p, r, w, &SpecParams::lpbq_scale2_key(&prefix), DType::F32, None)?;
                SpecParams::Lpbq { from: prefix, blocks: None, channels: None }
            }
            QuantSpecKind::AsymPerTensor { quant_min, quant_max, .. } => {
                let ir_shape = p.value(w).ty.shape.clone();
                self.expect_tensor(p, r, w, &symbol, DType::U16, Some(&ir_shape))?;
                let err = |e| self.param_error(p, r, w, e);
                let scale = self.params.scalar_f32(&SpecParams::scale_key(&prefix)).map_err(err)?;
                let zero_point = self.params.scalar_i32(&SpecParams::zero_point_key(&prefix)).map_err(err)?;
                QuantParams::new(scale, zero_point, quant_min, quant_max).map_err(|e| {
                    self.param_error(p, r, w, self.params.error(&SpecParams::scale_key(&prefix), e.to_string()))
                })?;
                SpecParams::PerTensor { scale, zero_point, from: prefix }
            }
            other => return Err(self.op_error(p, r, w, format!("no rule solves a {other} weight"))),
        };
        p.spec_mut(sid).params = Some(params);
        Ok(())
    }

    /// Whether the linear `prefix` is stored as per-channel int8: no LPBQ `scale1`, an f32
    /// `scale` and int8 codes.
    fn is_int8_linear(&self, prefix: &str) -> Result<bool, super::ParamError> {
        if self.params.tensor(&SpecParams::lpbq_scale1_key(prefix))?.is_some() {
            return Ok(false);
        }
        let scales = self.params.tensor(&SpecParams::scale_key(prefix))?;
        let codes = self.params.tensor(&SpecParams::weight_key(prefix))?;
        Ok(matches!((scales, codes), (Some(s), Some(c)) if s.dtype == DType::F32 && c.dtype == DType::I8))
    }

    /// Checks that `key` is stored with `dtype` (and `shape`, if given).
    fn expect_tensor(
        &self,
        p: &Program,
        r: NodeRef,
        w: ValueId,
        key: &str,
        dtype: DType,
        shape: Option<&[usize]>,
    ) -> Result<(), PassError> {
        let err = |m: String| self.param_error(p, r, w, self.params.error(key, m));
        let t = self.params.tensor(key).map_err(|e| self.param_error(p, r, w, e))?;
        let t = t.ok_or_else(|| err("missing (PTQ needs it to solve the weight's spec)".into()))?;
        if t.dtype != dtype {
            return Err(err(format!("stored as {}, expected {dtype}", t.dtype)));
        }
        if let Some(shape) = shape {
            if t.numel() != shape.iter().product::<usize>() {
                return Err(err(format!("has shape {:?}, but the IR value has shape {shape:?}", t.shape)));
            }
        }
        Ok(())
    }

    fn check_range(
        &self,
        p: &Program,
        r: NodeRef,
        w: ValueId,
        key: &str,
        (lo, hi): (i64, i64),
    ) -> Result<(), PassError> {
        match self.params.int_range(key).map_err(|e| self.param_error(p, r, w, e))? {
            Some((min, max)) if min < lo || max > hi => Err(self.param_error(
                p,
                r,
                w,
                self.params.error(key, format!("values span {min}..={max}, expected codes within {lo}..={hi}")),
            )),
            _ => Ok(()),
        }
    }

    /// Solves a value's per-tensor spec from its QDQ point; checks agreement with a spec that is
    /// already solved (through another value sharing it).
    fn solve_value(&self, p: &mut Program, r: NodeRef, v: ValueId, role: Role) -> Result<(), PassError> {
        let Some(sid) = p.value(v).spec else { return Ok(()) };
        let kind = p.spec(sid).kind.clone();
        let Some((qmin, qmax)) = kind.per_tensor_range() else { return Ok(()) };
        let Some(point) = p.value(v).qdq.clone() else { return Ok(()) };
        let q = qdq_params(&point, self.params).map_err(|e| self.param_error(p, r, v, e))?;
        let what = || format!("{} `{}`", role.text(), op_name(linalg(p, r)));
        if (q.qmin, q.qmax) != (qmin, qmax) {
            return Err(self.op_error(
                p,
                r,
                v,
                format!(
                    "QDQ {point} quantizes to {}..={}, but the value's spec is {kind} ({})",
                    q.qmin,
                    q.qmax,
                    what()
                ),
            ));
        }
        if let Some(zp) = kind.implied_zero_point() {
            if q.zero_point != zp {
                return Err(self.op_error(
                    p,
                    r,
                    v,
                    format!("QDQ {point} has zero point {}, but the symmetric spec {kind} implies {zp}", q.zero_point),
                ));
            }
        }
        match &p.spec(sid).params {
            None => {
                p.spec_mut(sid).params =
                    Some(SpecParams::PerTensor { scale: q.scale, zero_point: q.zero_point, from: point.key.clone() });
                Ok(())
            }
            Some(SpecParams::PerTensor { scale, zero_point, .. })
                if scale.to_bits() == q.scale.to_bits() && *zero_point == q.zero_point =>
            {
                Ok(())
            }
            Some(SpecParams::PerTensor { scale, zero_point, from }) => Err(self.op_error(
                p,
                r,
                v,
                format!(
                    "its spec is shared with values quantized by `{from}` (scale {scale:e}, zero point {zero_point}), \
                     but its own QDQ {point} has scale {:e}, zero point {}; one shared spec cannot hold both",
                    q.scale, q.zero_point
                ),
            )),
            Some(other) => Err(self.op_error(p, r, v, format!("QDQ {point} on a value whose spec has {other:?}"))),
        }
    }
}

/// Quantizes the scalar constants an op reads, once their specs are solved.
fn quantize_constants(p: &mut Program, r: NodeRef) {
    let inputs = linalg(p, r).inputs.clone();
    for v in inputs {
        let def = p.value(v);
        let (Some(value), Some(spec)) = (def.constant, def.spec) else { continue };
        if def.quantized.is_some() {
            continue;
        }
        let spec = p.spec(spec);
        let (Some((scale, zero_point)), Some((qmin, qmax))) = (spec.per_tensor(), spec.kind.per_tensor_range()) else {
            continue;
        };
        let storage = match spec.kind {
            QuantSpecKind::SymPerTensor { .. } => DType::U8Sym,
            _ => DType::U16Asym,
        };
        let params = QuantParams { scale, zero_point, qmin, qmax };
        // The zero point is part of the formula for both kinds: a symmetric spec's implied zero
        // point is what QNN's fixed offset encodes.
        let code = quantize_constant(value, &params, false);
        let def = p.value_mut(v);
        def.ty.dtype = storage;
        def.quantized = Some(i64::from(code));
    }
}

fn check_solved(p: &Program, r: NodeRef) -> Result<(), PassError> {
    let op = linalg(p, r);
    let roles = op.inputs.iter().enumerate().map(|(i, v)| (*v, Role::Input(i)));
    for (v, role) in roles.chain(op.outputs.iter().enumerate().map(|(i, v)| (*v, Role::Output(i)))) {
        let Some(spec) = p.value_spec(v) else { continue };
        let def = p.value(v);
        let reason = if !spec.is_solved() {
            if def.qdq.as_ref().is_some() {
                "its QDQ point did not solve it".to_string()
            } else {
                "no QDQ point annotates it or any value sharing its spec (add a qdq! where it is produced)".to_string()
            }
        } else if let (Some(q), false) = (def.qdq.as_ref(), spec.kind.needs_params()) {
            format!(
                "it carries QDQ {q} but its spec is {} (not quantized): trace the model with quantized dtypes \
                 (ParamFormat::QnnW4A16)",
                spec.kind
            )
        } else {
            continue;
        };
        let role_text = match role {
            Role::Input(i) => format!("input {i} of"),
            Role::Output(i) => format!("output {i} of"),
        };
        return Err(PassError::UnsolvedSpec(Box::new(super::error::UnsolvedSpec {
            pass: PASS,
            op: op_name(op),
            module: module_of(p, r.graph),
            role: role_text,
            value: describe_value(p, v),
            spec: spec.kind.to_string(),
            reason,
        })));
    }
    Ok(())
}

fn check_concat(p: &Program, r: NodeRef) -> Result<(), PassError> {
    let op = linalg(p, r);
    if !matches!(op.kind, OpKind::Concat { .. }) {
        return Ok(());
    }
    let params = |v: ValueId| p.value_spec(v).and_then(|s| s.per_tensor());
    let Some((s0, z0)) = params(op.inputs[0]) else { return Ok(()) };
    for (i, &v) in op.inputs.iter().enumerate().skip(1) {
        let Some((s, z)) = params(v) else { continue };
        if (s - s0).abs() > 1e-6 * s.abs().max(s0.abs()) || z != z0 {
            return Err(PassError::ConcatMismatch(Box::new(super::error::ConcatMismatch {
                pass: PASS,
                op: op_name(op),
                module: module_of(p, r.graph),
                index: i,
                value: describe_value(p, v),
                scale: s,
                zero_point: z,
                first: describe_value(p, op.inputs[0]),
                first_scale: s0,
                first_zero_point: z0,
            })));
        }
    }
    Ok(())
}
