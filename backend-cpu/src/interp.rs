//! [`Interpreter`]: runs an IR [`Program`] at any pipeline stage on the CPU, to prove that passes
//! preserve what the model computes.
//!
//! It executes nested subgraphs and calls (before SplitLLMGraph) as well as the flat graph (after
//! it), with the eager executor's kernels: every op goes through [`CpuBackend`]'s
//! [`Backend::execute`](mllm_dsl::Backend::execute) on materialized tensors, so a float run is bitwise identical to the eager
//! model. Parameters are loaded from a [`WeightStore`] by symbol, in the role the op reading them
//! gives them.
//!
//! In [`Mode::FakeQuant`] every value is fake-quantized where it is defined, with
//! - its solved per-tensor spec, once PTQ has run (so values that merely share a spec are
//!   quantized too, which is exact: shared specs only span ops that move data);
//! - otherwise its QDQ point, with parameters from a [`QuantParamProvider`] (the trace stage);
//!
//! and a constant PTQ quantized is replaced by its dequantized code, which is what the NPU sees.
//! Fake quantization is torch's ([`FakeQuantizer`]), the same arithmetic as eager fake-quant runs.

use crate::executor::CpuBackend;
use compiler::passes::{qdq_params, ParamError, QuantParamProvider};
use compiler::quant::fake_quant::{dequantize, FakeQuantizer};
use compiler::quant::spec::QuantParams;
use mllm_dsl::backend::Storage;
use mllm_dsl::ir::{LinalgOp, Node, Program, Region, SubGraph, ValueId};
use mllm_dsl::module::{ParamRequest, ParamRole, WeightStore};
use mllm_dsl::op::OpKind;
use mllm_dsl::{BackendRef, Tensor};
use std::collections::HashMap;

/// How QDQ points and specs are treated.
#[derive(Clone, Copy)]
pub enum Mode<'a> {
    /// Quantization metadata is ignored: the float model.
    Float,
    /// Values are fake-quantized with their specs or QDQ points (parameters from the provider).
    FakeQuant(&'a dyn QuantParamProvider),
}

#[derive(Debug, thiserror::Error)]
pub enum InterpError {
    #[error("interpreter: op `{op}` in `{module}`: {message}")]
    Op { op: String, module: String, message: String },
    #[error("interpreter: parameter @{symbol}: {source}")]
    Param {
        symbol: String,
        #[source]
        source: mllm_dsl::Error,
    },
    #[error("interpreter: input {index}: {message}")]
    Input { index: usize, message: String },
    #[error("interpreter: fake-quantizing {what}: {source}")]
    Quant {
        what: String,
        #[source]
        source: ParamError,
    },
    #[error("interpreter: {0}")]
    Program(String),
}

/// Nesting limit for calls (a cycle in the call graph would otherwise never end).
const MAX_DEPTH: usize = 64;

/// Runs one program.
pub struct Interpreter<'a> {
    program: &'a Program,
    weights: &'a dyn WeightStore,
    mode: Mode<'a>,
    backend: BackendRef,
    graphs: HashMap<&'a str, &'a SubGraph>,
    roles: HashMap<ValueId, ParamRole>,
    overrides: HashMap<String, Tensor>,
}

impl<'a> Interpreter<'a> {
    pub fn new(program: &'a Program, weights: &'a dyn WeightStore, mode: Mode<'a>) -> Self {
        let graphs = program.subgraphs().map(|g| (g.symbol.as_str(), g)).collect();
        let mut roles = HashMap::new();
        for op in program.linalg_ops() {
            for (i, role) in weight_roles(&op.kind).iter().enumerate() {
                if let (Some(role), Some(&v)) = (role, op.inputs.get(i)) {
                    if program.value(v).symbol.is_some() {
                        roles.entry(v).or_insert(*role);
                    }
                }
            }
        }
        Interpreter { program, weights, mode, backend: CpuBackend::float(), graphs, roles, overrides: HashMap::new() }
    }

    /// Multiplies grid rows by int4 weights as `products` says (integers by default, as the
    /// eager backend does).
    pub fn with_grid_products(mut self, products: crate::GridProducts) -> Self {
        self.backend = CpuBackend::configured(None, products);
        self
    }

    /// Uses `tensor` for the parameter `symbol` instead of loading it (e.g. RoPE tables a model
    /// computes when the checkpoint lacks them).
    pub fn with_param(mut self, symbol: &str, tensor: Tensor) -> Self {
        self.overrides.insert(symbol.to_string(), tensor);
        self
    }

    /// Runs `@main` on `inputs` (in `@main`'s input order) and returns its outputs.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, InterpError> {
        let mut env = self.run_env(inputs)?;
        self.program.main.outputs.iter().map(|&v| self.get(&mut env, v, "@main")).collect()
    }

    /// Runs `@main` on `inputs` and returns every value it computed or loaded, indexed by
    /// [`ValueId::index`] (`None` for values never reached): to compare two stages of a program
    /// op by op and find the first value on which they disagree.
    pub fn run_all_values(&self, inputs: &[Tensor]) -> Result<Vec<Option<Tensor>>, InterpError> {
        Ok(self.run_env(inputs)?.values)
    }

    fn run_env(&self, inputs: &[Tensor]) -> Result<Env, InterpError> {
        let p = self.program;
        if inputs.len() != p.main.inputs.len() {
            return Err(InterpError::Program(format!(
                "@main takes {} inputs, got {}",
                p.main.inputs.len(),
                inputs.len()
            )));
        }
        let mut env = Env { values: vec![None; p.values.len()] };
        for (index, (t, &v)) in inputs.iter().zip(&p.main.inputs).enumerate() {
            let ty = &p.value(v).ty;
            if t.shape() != ty.shape.as_slice() {
                let message = format!("expected shape {:?}, got {:?}", ty.shape, t.shape());
                return Err(InterpError::Input { index, message });
            }
            let kind_ok = match t.storage() {
                Some(Storage::I64(_)) => ty.dtype.is_index(),
                Some(Storage::F32(_) | Storage::Native(_)) => !ty.dtype.is_index(),
                None => false,
            };
            if !kind_ok {
                let message = format!("expected eager {} data, got {t:?}", ty.dtype);
                return Err(InterpError::Input { index, message });
            }
            let t = self.quantize(v, t.with_type(ty.clone()), &format!("graph input {index}"))?;
            env.values[v.index()] = Some(t);
        }
        self.region(&p.main, "@main", &mut env, 0)?;
        Ok(env)
    }

    fn region(&self, r: &Region, module: &str, env: &mut Env, depth: usize) -> Result<(), InterpError> {
        if depth > MAX_DEPTH {
            return Err(InterpError::Program(format!("calls nest deeper than {MAX_DEPTH} at `{module}` (a cycle?)")));
        }
        for n in &r.body {
            match n {
                Node::Linalg(op) => self.op(op, module, env)?,
                Node::Constant { value, .. } => {
                    let t = self.constant(*value)?;
                    env.values[value.index()] = Some(t);
                }
                Node::Call(c) => {
                    let g = self.graphs.get(c.symbol.as_str()).ok_or_else(|| {
                        InterpError::Program(format!("`{module}` calls @{}, which is not defined", c.symbol))
                    })?;
                    if g.region.inputs.len() != c.inputs.len() || g.region.outputs.len() != c.outputs.len() {
                        return Err(InterpError::Program(format!(
                            "the call of @{} in `{module}` does not match the subgraph's inputs and outputs",
                            c.symbol
                        )));
                    }
                    for (&from, &to) in c.inputs.iter().zip(&g.region.inputs) {
                        let t = self.get(env, from, module)?;
                        env.values[to.index()] = Some(t);
                    }
                    self.region(&g.region, &g.symbol, env, depth + 1)?;
                    for (&from, &to) in g.region.outputs.iter().zip(&c.outputs) {
                        let t = self.get(env, from, &g.symbol)?;
                        env.values[to.index()] = Some(t);
                    }
                }
                // Subgraphs are definitions (run when called); parameters load on first use.
                Node::SubGraph(_) | Node::Register { .. } | Node::Return(_) | Node::Comment(_) => {}
            }
        }
        Ok(())
    }

    fn op(&self, op: &LinalgOp, module: &str, env: &mut Env) -> Result<(), InterpError> {
        let name = op.name.clone().unwrap_or_else(|| op.kind.type_name().to_string());
        let err = |message: String| InterpError::Op { op: name.clone(), module: module.to_string(), message };
        let inputs = op.inputs.iter().map(|&v| self.get(env, v, module)).collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let [out] = op.outputs[..] else {
            return Err(err(format!("expected one output, found {}", op.outputs.len())));
        };
        let ty = self.program.value(out).ty.clone();
        let storage = self.backend.execute(&op.kind, &refs, &ty).map_err(|e| err(e.to_string()))?;
        let t = Tensor::from_storage(ty, storage, self.backend.clone()).map_err(|e| err(e.to_string()))?;
        // An op that only moves values already on its output's grid leaves them on it: quantizing
        // again is the identity in value, but it would materialize lazy joins (concatenated K/V)
        // that the eager model keeps, and the matmul then sums in another order than eager does.
        let t =
            if self.moves_values_on_grid(op, out) { t } else { self.quantize(out, t, &format!("output of `{name}`"))? };
        env.values[out.index()] = Some(t);
        Ok(())
    }

    /// Whether `op` (a pure data movement: view, transpose, slice, concat, repeat, gather,
    /// embedding lookup) produces `out` from inputs that are all quantized with `out`'s own
    /// per-tensor parameters, so every output element is already on the output's grid.
    fn moves_values_on_grid(&self, op: &LinalgOp, out: ValueId) -> bool {
        let Mode::FakeQuant(_) = self.mode else { return false };
        let data_inputs: &[ValueId] = match op.kind {
            OpKind::View { .. }
            | OpKind::Transpose { .. }
            | OpKind::Permute { .. }
            | OpKind::Unsqueeze { .. }
            | OpKind::Slice { .. }
            | OpKind::Concat { .. }
            | OpKind::Repeat { .. } => &op.inputs,
            OpKind::Gather { .. } => &op.inputs[..1],
            OpKind::Embedding => &op.inputs[1..2],
            _ => return false,
        };
        let Some(grid) = self.spec_params(out) else { return false };
        !data_inputs.is_empty() && data_inputs.iter().all(|&v| self.spec_params(v) == Some(grid))
    }

    /// A defined value, loading parameters on first use.
    fn get(&self, env: &mut Env, v: ValueId, module: &str) -> Result<Tensor, InterpError> {
        if let Some(t) = &env.values[v.index()] {
            return Ok(t.clone());
        }
        let def = self.program.value(v);
        let Some(symbol) = &def.symbol else {
            return Err(InterpError::Program(format!("`{module}` reads a value that was never computed ({def:?})")));
        };
        let t = match self.overrides.get(symbol) {
            Some(t) => t.with_type(def.ty.clone()),
            None => {
                let role = self.roles.get(&v).copied().unwrap_or(ParamRole::NormWeight);
                let req = ParamRequest { key: symbol, module_path: module, role, shape: &def.ty.shape };
                let t =
                    self.weights.load(&req).map_err(|source| InterpError::Param { symbol: symbol.clone(), source })?;
                t.with_type(def.ty.clone())
            }
        };
        let t = self.quantize(v, t, &format!("parameter @{symbol}"))?;
        env.values[v.index()] = Some(t.clone());
        Ok(t)
    }

    /// A scalar constant: its float value, or in fake-quant mode what the NPU sees.
    fn constant(&self, v: ValueId) -> Result<Tensor, InterpError> {
        let def = self.program.value(v);
        let value = def.constant.ok_or_else(|| InterpError::Program(format!("constant without a value: {def:?}")))?;
        let mut x = value;
        if let Mode::FakeQuant(provider) = self.mode {
            match (def.quantized, self.spec_params(v)) {
                (Some(code), Some(params)) => x = dequantize(code as i32, &params),
                _ => {
                    if let Some(params) = self.params_of(v, provider, "a constant")? {
                        x = FakeQuantizer::new(&params).fake(value);
                    }
                }
            }
        }
        let storage = Storage::F32(vec![x].into());
        Tensor::from_storage(def.ty.clone(), storage, self.backend.clone())
            .map_err(|e| InterpError::Program(e.to_string()))
    }

    /// Per-tensor parameters of a solved spec.
    fn spec_params(&self, v: ValueId) -> Option<QuantParams> {
        let spec = self.program.value_spec(v)?;
        let (scale, zero_point) = spec.per_tensor()?;
        let (qmin, qmax) = spec.kind.per_tensor_range()?;
        Some(QuantParams { scale, zero_point, qmin, qmax })
    }

    fn params_of(
        &self,
        v: ValueId,
        provider: &dyn QuantParamProvider,
        what: &str,
    ) -> Result<Option<QuantParams>, InterpError> {
        if let Some(p) = self.spec_params(v) {
            return Ok(Some(p));
        }
        match self.program.value(v).qdq.as_ref() {
            Some(q) => qdq_params(q, provider)
                .map(Some)
                .map_err(|source| InterpError::Quant { what: format!("{what} (QDQ {q})"), source }),
            None => Ok(None),
        }
    }

    fn quantize(&self, v: ValueId, t: Tensor, what: &str) -> Result<Tensor, InterpError> {
        let Mode::FakeQuant(provider) = self.mode else { return Ok(t) };
        let Some(params) = self.params_of(v, provider, what)? else { return Ok(t) };
        let Some(data) = crate::executor::real_values(&t) else {
            return Err(InterpError::Program(format!("{what} has quantization parameters but integer data")));
        };
        let mut out = data.to_vec();
        FakeQuantizer::new(&params).apply_in_place(&mut out);
        // Kept with its grid, as the eager backend keeps a QDQ output, so the linears after it
        // run the same kernels (the same sums) as the eager model.
        let storage = match crate::on_grid::u16_grid(params.scale, params.zero_point, params.qmin, params.qmax) {
            Some(grid) => Storage::Native(std::sync::Arc::new(crate::on_grid::OnGrid { values: out.into(), grid })),
            None => Storage::F32(out.into()),
        };
        Tensor::from_storage(t.ty().clone(), storage, self.backend.clone())
            .map_err(|e| InterpError::Program(e.to_string()))
    }
}

struct Env {
    values: Vec<Option<Tensor>>,
}

/// The parameter role of each input of an op (`None` for activations).
fn weight_roles(kind: &OpKind) -> Vec<Option<ParamRole>> {
    match kind {
        OpKind::Conv2d => vec![None, Some(ParamRole::Conv2dWeight), Some(ParamRole::Bias)],
        OpKind::Linear => vec![None, Some(ParamRole::LinearWeight), Some(ParamRole::Bias)],
        OpKind::RmsNorm { .. } => vec![None, Some(ParamRole::NormWeight)],
        OpKind::Embedding => vec![None, Some(ParamRole::EmbeddingWeight)],
        OpKind::Gather { .. } => vec![Some(ParamRole::RopeTable), None],
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compiler::passes::SyntheticParams;
    use mllm_dsl::ir::{CallGraph, Node};
    use mllm_dsl::{trace, DType, TraceInput};

    struct NoWeights;

    impl WeightStore for NoWeights {
        fn load(&self, req: &ParamRequest<'_>) -> mllm_dsl::Result<Tensor> {
            Err(mllm_dsl::Error::msg(format!("no weight {}", req.key)))
        }
        fn contains(&self, _key: &str) -> bool {
            false
        }
        fn backend(&self) -> BackendRef {
            CpuBackend::float()
        }
    }

    fn input() -> Tensor {
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.37 - 1.0).collect();
        Tensor::from_f32(data, vec![2, 3], CpuBackend::float()).unwrap()
    }

    /// `softmax(x * x + 1)` with a QDQ point on the product.
    fn compute(x: &Tensor) -> mllm_dsl::Result<Tensor> {
        let sq = mllm_dsl::qdq!(x.mul(x)?, "square_qdq")?;
        sq.add_scalar(1.0)?.softmax(-1)
    }

    fn program() -> Program {
        trace(&[TraceInput::new("x", [2, 3], DType::F32)], |t| compute(&t[0])).unwrap()
    }

    #[test]
    fn float_runs_match_eager_bit_for_bit() {
        let p = program();
        let eager = compute(&input()).unwrap();
        let out = Interpreter::new(&p, &NoWeights, Mode::Float).run(&[input()]).unwrap();
        let (a, b) = (out[0].as_f32().unwrap(), eager.as_f32().unwrap());
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    #[test]
    fn fake_quant_applies_the_qdq_points_parameters() {
        let p = program();
        let params = SyntheticParams::for_program(&p, 16);
        let q = qdq_params(p.values.iter().find_map(|d| d.qdq.as_ref()).unwrap(), &params).unwrap();
        let fq = FakeQuantizer::new(&q);
        let x = input();
        let sq: Vec<f32> = x.as_f32().unwrap().iter().map(|v| fq.fake(v * v)).collect();
        let want = Tensor::from_f32(sq, vec![2, 3], CpuBackend::float())
            .unwrap()
            .add_scalar(1.0)
            .unwrap()
            .softmax(-1)
            .unwrap();
        let out = Interpreter::new(&p, &NoWeights, Mode::FakeQuant(&params)).run(&[x]).unwrap();
        assert_eq!(out[0].as_f32().unwrap(), want.as_f32().unwrap());
        let float = Interpreter::new(&p, &NoWeights, Mode::Float).run(&[input()]).unwrap();
        assert_ne!(out[0].as_f32().unwrap(), float[0].as_f32().unwrap());
    }

    /// Regression (SmolLM2, issue 16): after PTQ the joined V of an attention (past ++ new along
    /// the contraction axis) shares the spec of its parts, so re-quantizing it is the identity in
    /// value; but it materialized the lazy join, and the product then summed the contraction in
    /// one pass instead of part by part as the eager model does, flipping codes of the
    /// next QDQ point by one step, which 30 layers amplified to 8.7 dB at the logits.
    #[test]
    fn data_moved_on_its_grid_keeps_the_eager_kernels() {
        use mllm_dsl::ir::{QuantSpec, QuantSpecKind, SpecParams};
        let (scale, zero_point) = (0.03f32, 128);
        let compute = |t: &[Tensor]| t[0].matmul(&Tensor::cat(&[&t[1], &t[2]], -2)?);
        let inputs = [
            TraceInput::new("weights", [1, 1, 32, 1024], DType::F32),
            TraceInput::new("past", [1, 1, 992, 64], DType::F32),
            TraceInput::new("new", [1, 1, 32, 64], DType::F32),
        ];
        let mut p = trace(&inputs, compute).unwrap();
        // The PTQ'd form: both parts and their join on one u8 grid (SmolLM2's value product:
        // 32 rows, 992 past + 32 new positions of a 1024 context, head_dim 64).
        let spec = p.add_spec(QuantSpec::new(QuantSpecKind::simple(DType::U8Sym).unwrap()));
        p.spec_mut(spec).params = Some(SpecParams::PerTensor { scale, zero_point, from: "kv".into() });
        let cat = p.linalg_ops().iter().find(|op| op.kind.type_name() == "Concat").unwrap().outputs[0];
        for v in [p.main.inputs[1], p.main.inputs[2], cat] {
            p.set_value_spec(v, spec);
        }
        let mut seed = 7u32;
        let mut next = move || {
            seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
            seed >> 8
        };
        let mut grid =
            |n: usize| -> Vec<f32> { (0..n).map(|_| ((next() % 256) as i32 - zero_point) as f32 * scale).collect() };
        let q: Vec<f32> = (0..32 * 1024).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.0131).collect();
        let make = |d: Vec<f32>, s: Vec<usize>| Tensor::from_f32(d, s, CpuBackend::float()).unwrap();
        let x = [
            make(q, vec![1, 1, 32, 1024]),
            make(grid(992 * 64), vec![1, 1, 992, 64]),
            make(grid(32 * 64), vec![1, 1, 32, 64]),
        ];
        let eager = compute(&x).unwrap();
        let out = Interpreter::new(&p, &NoWeights, Mode::FakeQuant(&SyntheticParams::default())).run(&x).unwrap();
        let (a, b) = (out[0].as_f32().unwrap(), eager.as_f32().unwrap());
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "the interpreter differs from eager");
    }

    #[test]
    fn bad_inputs_and_programs_are_errors() {
        let p = program();
        let run =
            |inputs: &[Tensor]| Interpreter::new(&p, &NoWeights, Mode::Float).run(inputs).unwrap_err().to_string();
        assert!(run(&[]).contains("@main takes 1 inputs, got 0"));
        let wrong = Tensor::from_f32(vec![0.0; 6], vec![3, 2], CpuBackend::float()).unwrap();
        assert!(run(&[wrong]).contains("input 0: expected shape [2, 3], got [3, 2]"));
        let ids = Tensor::from_i64(vec![0; 6], vec![2, 3], DType::I32, CpuBackend::float()).unwrap();
        assert!(run(&[ids]).contains("input 0: expected eager Float32 data"));
        let mut broken = p.clone();
        broken.main.body.insert(0, Node::Call(CallGraph { symbol: "nowhere".into(), inputs: vec![], outputs: vec![] }));
        let err = Interpreter::new(&broken, &NoWeights, Mode::Float).run(&[input()]).unwrap_err().to_string();
        assert!(err.contains("`@main` calls @nowhere, which is not defined"), "{err}");
        let params = SyntheticParams::default();
        let err = Interpreter::new(&p, &NoWeights, Mode::FakeQuant(&params)).run(&[input()]).unwrap_err().to_string();
        assert!(err.contains("square_qdq.fake_quant.scale"), "{err}");
    }
}
