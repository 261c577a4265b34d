//! LLM2QnnLowering: the final IR of the AOT pass pipeline becomes [`QnnGraph`]s
//! (mllm/backends/qnn/aot/passes and mllm/backends/qnn/aot/visitor).
//!
//! # Input
//!
//! A program after `TensorRenaming`: one flat graph `model.<i>.s<S>` (attribute `use_qnn`) per
//! chunk size, I/O marked, every value named (attribute `name`) and carrying a solved
//! quantization spec, constants quantized, weights referenced by symbol (registered in `@init`)
//! and read from a [`QuantParamProvider`] (the checkpoint PTQ used).
//!
//! # Output
//!
//! One [`QnnGraph`] per flat graph, named like it, validated:
//! - tensors (mllm's QnnWrappersAPI.cpp): region inputs are `APP_WRITE`, in region order; region outputs `APP_READ`,
//!   in region order (the runtime binds both positionally); registered parameters and constants
//!   `STATIC`; everything else `NATIVE`. Tensor names are the IR names, node names the op names.
//! - data types and encodings (mllm's QNNUtils.cpp): see `encode.rs`; LPBQ weights see `weights.rs`.
//! - ops (mllm/backends/qnn/aot/visitor, package `qti.aisw`):
//!
//! | IR op | QNN op | inputs | params |
//! |---|---|---|---|
//! | Conv2D | `Conv2d` | x NHWC, HWIO filter, [bias] | `stride` [1,1], `pad_amount` [[0,0],[0,0]], `dilation` [1,1] |
//! | Add / Sub / Mul / Neg | `ElementWiseAdd` / `…Subtract` / `…Multiply` / `…Neg` | 2 / 2 / 2 / 1 | |
//! | Equal / Where | `ElementWiseEqual` / `ElementWiseSelect` | 2 / cond, true, false | |
//! | Sigmoid | `Sigmoid` | 1 | |
//! | Softmax | `Softmax` | 1 | `axis`, `beta` 1.0 |
//! | RMSNorm | `RmsNorm` | x, gamma, zero beta | `epsilon`, `axes` [rank-1] |
//! | Transpose / Permute | `Transpose` | 1 | `perm` |
//! | View / Unsqueeze | `Reshape` | 1 | (output dims) |
//! | Concat | `Concat` | n | `axis` |
//! | Embedding | `Gather` | **table first**, ids | `axis` 0 |
//! | Gather | `Gather` | table, indices | `axis` |
//! | Repeat (GQA) | `Gather` | x, static head indices | `axis` (see below) |
//! | Slice | `StridedSlice` | 1 | `ranges` [rank,3] |
//! | ReduceMin / Max / Mean | `ReduceMin` / `ReduceMax` / `ReduceMean` | 1 | `axes` [dim], `keep_dims` |
//! | MatMul | `MatMul` | 2 | |
//! | CastType | `Dequantize` (fixed→float), `Quantize` (float→fixed), `Convert` (fixed→fixed), `Cast` (others) | 1 | |
//!
//! Conv2D bias: QNN's quantized conv takes an `INT_32`-coded bias (`SFIXED_POINT_32`, per output
//! channel scale = input scale × weight channel scale, offset 0; `weights.rs`), made from the
//! float bias the IR carries (Qwen2's q/k/v projections).
//!
//! RMSNorm: QNN's optional beta is given explicitly as zeros (mllm's `<op>_runtime_bias`): a
//! u16 tensor with the output's scale and offset 0 when the output is quantized.
//!
//! **GQA repeat.** The IR's `Repeat` is `repeat_interleave` (query head `h` reads KV head
//! `h / groups`, HF's `repeat_kv`). mllm lowers it to `Tile`, which repeats the whole head block
//! (`h mod kv_heads`) and pairs query heads with the wrong KV heads. We lower it to one `Gather`
//! on the head axis with the static `INT_32` indices `[0,..,0, 1,..,1, ..]` (`h / groups` for
//! every output head), named `<op>_indices`: a pure copy of codes, exactly repeat-interleave,
//! and one op instead of Reshape + Concat + Reshape. The tiny-Qwen3 test shows both that this
//! matches the CPU run and that Tile's index order would not.
//!
//! # Weight sharing
//!
//! A [`QnnLowering`] keeps every `STATIC` tensor it has made, by name. Lowering the prefill and
//! decode programs with the same instance gives both graphs the very same weight buffers
//! (`Arc`, read from the checkpoint once), which is what the one weight-sharing context needs
//! (the backend stores same-named statics once per context). A static of the same name that differs
//! between graphs is an error.
//!
//! # Errors
//!
//! Anything that cannot be lowered is a [`LowerError`] naming the graph and the op, value or
//! checkpoint key; the finished graph must pass [`validate`](crate::validate()).

mod broadcast;
mod encode;
mod ops;
mod weights;

use std::collections::{HashMap, HashSet};

use compiler::passes::{ParamError, QuantParamProvider};
use mllm_dsl::ir::{Attr, Node, Program, SubGraph, ValueId};

pub use encode::EncodeError;
pub use weights::WeightProblem;

use crate::encoding::Int4Storage;
use crate::graph::{GraphBuilder, QnnGraph, QnnTensor};
use crate::validate::ValidationError;

/// Choices the IR does not fix.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LowerOptions {
    /// Byte layout of 4-bit weights (default mllm's low nibble; see `encoding.rs`).
    pub int4_storage: Int4Storage,
    /// How a `Where` whose value operands are smaller than its output is lowered (default
    /// mllm's: the `ElementWiseSelect` broadcasts them itself).
    pub select_broadcast: SelectBroadcast,
}

impl LowerOptions {
    /// What Qualcomm's HTP backend (QAIRT 2.51) needs: int4 weights in 8-bit containers (it
    /// refuses `SFIXED_POINT_4`) and value operands of `ElementWiseSelect` broadcast explicitly
    /// (see [`SelectBroadcast::Explicit`]).
    pub fn qualcomm_htp() -> LowerOptions {
        LowerOptions { int4_storage: Int4Storage::Int8Container, select_broadcast: SelectBroadcast::Explicit }
    }
}

/// The lowering of a `Where` (`ElementWiseSelect`) whose true/false operand has fewer elements
/// than the output, such as attention's masked fill `where(mask, scores, rowmin - 20)` with
/// `rowmin` `[1, H, S, 1]` against scores `[1, H, S, T]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SelectBroadcast {
    /// The select broadcasts its operands (mllm's graph).
    #[default]
    Implicit,
    /// Each smaller operand is first broadcast to the output shape by an `ElementWiseAdd` of a
    /// static zero tensor (exact: the sum keeps the operand's encoding). Qualcomm's HTP backend
    /// (QAIRT 2.51, x86 emulation) computes the implicit form wrongly in the attention pattern
    /// (the operand is ReduceMin + Add over the QK MatMul's scores, the select feeds Softmax):
    /// at chunk sizes 8, 12, 16, 24 and 32 the logits were noise, or the execution crashed
    /// (`docs/ledger.md`; `examples/tests/qnn_htp.rs` runs chunk 32).
    Explicit,
}

/// Why a program could not be lowered.
#[derive(Debug, thiserror::Error)]
pub enum LowerError {
    #[error(
        "the program has no flat QNN graph (`model.<i>.s<S>` with use_qnn); run the AOT pipeline \
         through TensorRenaming first"
    )]
    NoGraph,
    #[error("graph `{graph}`: {detail}")]
    Graph { graph: String, detail: String },
    #[error("graph `{graph}`: op `{op}` ({kind}): {detail}")]
    Op { graph: String, op: String, kind: &'static str, detail: String },
    #[error("graph `{graph}`: value {value}: {detail}")]
    Value { graph: String, value: String, detail: String },
    #[error("graph `{graph}`: value {value}: {source}")]
    Type {
        graph: String,
        value: String,
        #[source]
        source: EncodeError,
    },
    #[error("graph `{graph}`: weight `{key}`: {source}")]
    Weight {
        graph: String,
        key: String,
        #[source]
        source: WeightProblem,
    },
    #[error("graph `{graph}`: {source}")]
    Param {
        graph: String,
        #[source]
        source: ParamError,
    },
    #[error("lowered graph `{graph}` is invalid: {source}")]
    Invalid {
        graph: String,
        #[source]
        source: ValidationError,
    },
}

/// Lowers programs to QNN graphs, sharing static tensors between all graphs it lowers.
pub struct QnnLowering<'w> {
    weights: &'w dyn QuantParamProvider,
    options: LowerOptions,
    /// Every static tensor made so far, by tensor name.
    statics: HashMap<String, QnnTensor>,
    /// The IR type and spec each weight was read for, by tensor name: a later graph reuses the
    /// buffer only for the same type and spec.
    weight_types: HashMap<String, String>,
}

impl<'w> QnnLowering<'w> {
    /// Weights and their stored bytes come from `weights` (the checkpoint PTQ read).
    pub fn new(weights: &'w dyn QuantParamProvider, options: LowerOptions) -> QnnLowering<'w> {
        QnnLowering { weights, options, statics: HashMap::new(), weight_types: HashMap::new() }
    }

    /// Lowers every flat QNN graph of `program`, sorted by name (mllm's order).
    pub fn lower_program(&mut self, program: &Program) -> Result<Vec<QnnGraph>, LowerError> {
        let mut names: Vec<&str> =
            program.subgraphs().filter(|g| is_flat_qnn_graph(g)).map(|g| g.symbol.as_str()).collect();
        if names.is_empty() {
            return Err(LowerError::NoGraph);
        }
        names.sort_unstable();
        names.into_iter().map(|n| self.lower_graph(program, n)).collect()
    }

    /// Lowers the flat graph `symbol` of `program`.
    pub fn lower_graph(&mut self, program: &Program, symbol: &str) -> Result<QnnGraph, LowerError> {
        let graph_err = |detail: String| LowerError::Graph { graph: symbol.to_string(), detail };
        let sg = program.subgraph(symbol).ok_or_else(|| graph_err("no such subgraph".into()))?;
        if !is_flat_qnn_graph(sg) {
            return Err(graph_err(
                "is not a flat QNN graph: expected the name `model.<i>.s<S>` and the attribute use_qnn:true \
                 (SplitLLMGraph makes it)"
                    .into(),
            ));
        }
        let builder = GraphBuilder::new(symbol).int4_storage(self.options.int4_storage);
        let mut g = GraphLowering {
            program,
            graph: symbol,
            lowering: self,
            builder,
            names: HashMap::new(),
            statics_in_graph: HashSet::new(),
        };
        g.lower(sg)?;
        g.builder.finish().map_err(|source| LowerError::Invalid { graph: symbol.to_string(), source })
    }

    /// The shared copy of a static tensor: the first one made under its name, if it equals `t`.
    fn share_static(&mut self, graph: &str, t: QnnTensor) -> Result<QnnTensor, LowerError> {
        match self.statics.get(&t.name) {
            Some(known) if *known == t => Ok(known.clone()),
            Some(_) => Err(LowerError::Value {
                graph: graph.to_string(),
                value: format!("`{}`", t.name),
                detail: "a static tensor of this name with different contents exists in another graph; \
                         graphs of one context share statics by name"
                    .into(),
            }),
            None => {
                self.statics.insert(t.name.clone(), t.clone());
                Ok(t)
            }
        }
    }
}

/// mllm's lowering accepts graphs named `^model(\.\d+\.s\d+)?$`; flat ones carry `use_qnn`.
fn is_flat_qnn_graph(g: &SubGraph) -> bool {
    let flat_name = compiler::passes::parse_graph_name(&g.symbol).is_some();
    flat_name && g.attrs.get("use_qnn") == Some(&Attr::Bool(true))
}

/// Characters outside `[A-Za-z0-9_]` become `_` (TensorRenaming's rule), for names the lowering
/// adds (RMSNorm betas, GQA indices).
fn qnn_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect()
}

/// State while lowering one graph.
struct GraphLowering<'p, 'l, 'w> {
    program: &'p Program,
    graph: &'p str,
    lowering: &'l mut QnnLowering<'w>,
    builder: GraphBuilder,
    /// QNN tensor name of every value defined so far in this graph.
    names: HashMap<ValueId, String>,
    statics_in_graph: HashSet<String>,
}

impl GraphLowering<'_, '_, '_> {
    fn lower(&mut self, sg: &SubGraph) -> Result<(), LowerError> {
        let region = &sg.region;
        for &v in &region.inputs {
            let name = self.value_name(v)?;
            let (dtype, encoding) = encode::value_type(self.program, v).map_err(|e| self.type_err(v, e))?;
            let dims = encode::dims(&self.program.value(v).ty.shape).map_err(|e| self.type_err(v, e))?;
            self.builder.input(name.clone(), dtype, &dims, encoding);
            self.names.insert(v, name);
        }
        for node in &region.body {
            match node {
                Node::Linalg(op) => self.lower_op(op)?,
                Node::Constant { value, .. } => {
                    self.operand(*value)?;
                }
                Node::Register { value, .. } => {
                    self.operand(*value)?;
                }
                Node::Return(values) if *values == region.outputs => {}
                Node::Return(_) => {
                    return Err(self.graph_err("its ReturnOp returns other values than the region's outputs".into()))
                }
                Node::Comment(_) => {}
                Node::SubGraph(g) => {
                    return Err(self.graph_err(format!("contains the subgraph @{}; QNN graphs are flat", g.symbol)))
                }
                Node::Call(c) => {
                    return Err(self.graph_err(format!("calls @{}; QNN graphs are flat (run SplitLLMGraph)", c.symbol)))
                }
            }
        }
        for &v in &region.outputs {
            let name = self
                .names
                .get(&v)
                .cloned()
                .ok_or_else(|| self.value_err(v, "is a graph output no op produces".into()))?;
            match self.builder.get(&name).map(|t| t.tensor_type) {
                Some(crate::dtype::TensorType::Native) => self.builder.mark_output(&name),
                other => {
                    return Err(
                        self.value_err(v, format!("graph outputs must be produced by an op, this one is {other:?}"))
                    )
                }
            }
        }
        Ok(())
    }

    /// `name` attribute of a value (TensorRenaming's).
    fn value_name(&self, v: ValueId) -> Result<String, LowerError> {
        match &self.program.value(v).name {
            Some(s) if !s.is_empty() => Ok(s.clone()),
            _ => Err(self.value_err(v, "has no tensor name (run TensorRenaming)".into())),
        }
    }

    /// A value for messages: its name, symbol or id.
    fn describe(&self, v: ValueId) -> String {
        let def = self.program.value(v);
        match (&def.name, &def.symbol) {
            (Some(s), _) => format!("`{s}`"),
            (_, Some(sym)) => format!("@{sym}"),
            _ => format!("%{}", v.0),
        }
    }

    fn value_err(&self, v: ValueId, detail: String) -> LowerError {
        LowerError::Value { graph: self.graph.to_string(), value: self.describe(v), detail }
    }

    fn type_err(&self, v: ValueId, source: EncodeError) -> LowerError {
        LowerError::Type { graph: self.graph.to_string(), value: self.describe(v), source }
    }

    fn graph_err(&self, detail: String) -> LowerError {
        LowerError::Graph { graph: self.graph.to_string(), detail }
    }

    /// The tensor name of an op input, creating static tensors (weights, constants) on first use.
    fn operand(&mut self, v: ValueId) -> Result<String, LowerError> {
        if let Some(name) = self.names.get(&v) {
            return Ok(name.clone());
        }
        let def = self.program.value(v);
        let name = self.value_name(v)?;
        let tensor = if let Some(symbol) = &def.symbol {
            // Read each weight once per lowering; later graphs share the buffer.
            let ir_type = format!("{:?} {:?}", def.ty, self.program.value_spec(v));
            match (self.lowering.statics.get(&name), self.lowering.weight_types.get(&name)) {
                (Some(known), Some(t)) if *t == ir_type => known.clone(),
                (Some(_), _) => {
                    return Err(self.value_err(
                        v,
                        "a static tensor of this name with a different type or quantization exists in another \
                         graph; graphs of one context share statics by name"
                            .into(),
                    ))
                }
                (None, _) => {
                    self.lowering.weight_types.insert(name.clone(), ir_type);
                    let t = self.weight_tensor(v, symbol, &name)?;
                    self.lowering.share_static(self.graph, t)?
                }
            }
        } else if def.constant.is_some() {
            let t = ops::constant_tensor(self.program, v, &name).map_err(|e| self.type_err(v, e))?;
            self.lowering.share_static(self.graph, t)?
        } else {
            return Err(self.value_err(
                v,
                "is used before it is defined in this graph and is neither a parameter nor a constant".into(),
            ));
        };
        self.add_static(tensor)?;
        self.names.insert(v, name.clone());
        Ok(name)
    }

    /// The parameter `symbol` (value `v`) as the static tensor `name`, from the checkpoint.
    fn weight_tensor(&self, v: ValueId, symbol: &str, name: &str) -> Result<QnnTensor, LowerError> {
        weights::weight_tensor(self.program, v, symbol, name, self.lowering.weights, self.lowering.options.int4_storage)
            .map_err(|e| LowerError::Weight { graph: self.graph.to_string(), key: e.key, source: e.problem })
    }

    /// Gemma's norm gamma `1 + w` (`RmsNorm { unit_offset }`), as QNN's RmsNorm takes it: the stored
    /// `w` (uint16) dequantized, plus one, quantized again over `[min(0, lo), max(0, hi)]`.
    fn unit_offset_gamma(&mut self, v: ValueId) -> Result<String, LowerError> {
        let name = format!("{}_plus_one", self.value_name(v)?);
        if let Some(known) = self.names.get(&v).filter(|n| **n == name) {
            return Ok(known.clone());
        }
        let tensor = match self.lowering.statics.get(&name) {
            Some(t) => t.clone(),
            None => {
                let def = self.program.value(v);
                let symbol = def.symbol.clone().ok_or_else(|| self.value_err(v, "is not a parameter".into()))?;
                let stored = self.weight_tensor(v, &symbol, &name)?;
                let t = weights::plus_one(stored).map_err(|detail| self.value_err(v, detail))?;
                self.lowering.share_static(self.graph, t)?
            }
        };
        self.add_static(tensor)?;
        Ok(name)
    }

    /// Adds a (shared) static tensor to this graph once.
    fn add_static(&mut self, t: QnnTensor) -> Result<(), LowerError> {
        if self.statics_in_graph.insert(t.name.clone()) {
            if self.builder.get(&t.name).is_some() {
                return Err(self.graph_err(format!("tensor name `{}` is used twice", t.name)));
            }
            self.builder.tensor(t);
        }
        Ok(())
    }
}
