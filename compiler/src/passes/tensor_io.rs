//! MarkTensorIO: the model graph's inputs and outputs, tagged and in mllm's positional I/O
//! contract (mllm's `MarkTensorIOPass`, mllm's MarkTensorIOPass).
//!
//! QNN binds graph tensors by position, and mllm's runtime feeds them in this order:
//!
//! | inputs | | outputs | |
//! |---|---|---|---|
//! | 0 `input_ids` | Int32 `[1, S]` | 0 `logits` | UInt16PerTensorAsy `[1, 1, S, V]` |
//! | 1 `position_ids` | Int32 `[S]` | 1+l `present_key_l` | UInt8PerTensorSym `[1, Hkv, D, S]` |
//! | 2 `attention_mask` | UInt16PerTensorAsy `[1, 1, S, C]` | 1+L+l `present_value_l` | UInt8PerTensorSym `[1, Hkv, S, D]` |
//! | 3+l `past_key_l` | UInt8PerTensorSym `[1, Hkv, D, C-S]` | | |
//! | 3+L+l `past_value_l` | UInt8PerTensorSym `[1, Hkv, C-S, D]` | | |
//!
//! The trace's inputs are in this order already, but a subgraph lists the values it reads in
//! first-use order; this pass reorders the model graph's (and the flat graph's) inputs and outputs
//! to `@main`'s, checks every position against the contract (with `L` from the config's
//! `quant_recipe.layers`), and marks the values `qnn_graph_inputs:true` / `qnn_graph_outputs:true`.

use super::graph::{callee, describe_value, subgraph_slots, top_call};
use super::pipeline::check_split_graph;
use super::{Pass, PassError};
use crate::aot_config::AotConfig;
use mllm_dsl::dtype::{fmt_shape, DType, TensorType};
use mllm_dsl::ir::{Node, Program, ValueId};
use std::collections::HashSet;

pub struct MarkTensorIo<'a> {
    config: &'a AotConfig,
}

impl<'a> MarkTensorIo<'a> {
    pub fn new(config: &'a AotConfig) -> Self {
        MarkTensorIo { config }
    }
}

const PASS: &str = "MarkTensorIO";

/// The sizes behind the I/O contract of one compiled graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoContract {
    pub layers: usize,
    /// `S`: tokens per call.
    pub chunk: usize,
    /// `C`: the context length (past cache columns plus the chunk).
    pub context: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
}

impl IoContract {
    /// Reads the sizes from the graph's input and output types and checks every position; `layers`
    /// is the expected layer count.
    pub fn check(inputs: &[TensorType], outputs: &[TensorType], layers: usize) -> Result<IoContract, IoContractError> {
        let (n_in, n_out) = (3 + 2 * layers, 1 + 2 * layers);
        if inputs.len() != n_in || outputs.len() != n_out {
            return Err(IoContractError::Arity {
                layers,
                want_inputs: n_in,
                want_outputs: n_out,
                inputs: inputs.len(),
                outputs: outputs.len(),
            });
        }
        let rank = |position: &'static str, expected: &'static str| IoContractError::Rank { position, expected };
        let chunk = *inputs[0].shape.get(1).ok_or(rank("input 0 (input_ids)", "[1, S]"))?;
        let context = *inputs[2].shape.get(3).ok_or(rank("input 2 (attention_mask)", "[1, P, S, C]"))?;
        // One mask plane, or two (full causal, sliding window) for models with sliding-window layers.
        let planes = if inputs[2].shape.get(1) == Some(&2) { 2 } else { 1 };
        let (kv_heads, head_dim) = match inputs.get(3).map(|t| &t.shape[..]) {
            Some(&[1, h, d, _]) => (h, d),
            _ if layers == 0 => (0, 0),
            _ => return Err(rank("input 3 (past_key_0)", "[1, Hkv, D, C-S]")),
        };
        let vocab = *outputs[0].shape.get(3).ok_or(rank("output 0 (logits)", "[1, 1, S, V]"))?;
        let c = IoContract { layers, chunk, context, kv_heads, head_dim, vocab };
        if context < chunk {
            return Err(IoContractError::ChunkExceedsContext { context, chunk });
        }
        let past = context - chunk;
        let expect =
            |side: &'static str, index: usize, name: String, found: &TensorType, dtype: DType, shape: Vec<usize>| {
                if found.dtype != dtype || found.shape != shape {
                    return Err(IoContractError::Mismatch { side, index, name, dtype, shape, found: found.clone() });
                }
                Ok(())
            };
        for (i, t) in inputs.iter().enumerate() {
            let (dtype, shape) = match i {
                0 => (DType::I32, vec![1, chunk]),
                1 => (DType::I32, vec![chunk]),
                2 => (DType::U16Asym, vec![1, planes, chunk, context]),
                i if i < 3 + layers => (DType::U8Sym, vec![1, kv_heads, head_dim, past]),
                _ => (DType::U8Sym, vec![1, kv_heads, past, head_dim]),
            };
            expect("input", i, c.input_name(i), t, dtype, shape)?;
        }
        for (i, t) in outputs.iter().enumerate() {
            let (dtype, shape) = match i {
                0 => (DType::U16Asym, vec![1, 1, chunk, vocab]),
                i if i < 1 + layers => (DType::U8Sym, vec![1, kv_heads, head_dim, chunk]),
                _ => (DType::U8Sym, vec![1, kv_heads, chunk, head_dim]),
            };
            expect("output", i, c.output_name(i), t, dtype, shape)?;
        }
        Ok(c)
    }

    /// mllm runtime's name of graph input `i`.
    pub fn input_name(&self, i: usize) -> String {
        match i {
            0 => "input_ids".into(),
            1 => "position_ids".into(),
            2 => "attention_mask".into(),
            i if i < 3 + self.layers => format!("past_key_{}", i - 3),
            i => format!("past_value_{}", i - 3 - self.layers),
        }
    }

    /// mllm runtime's name of graph output `i`.
    pub fn output_name(&self, i: usize) -> String {
        match i {
            0 => "logits".into(),
            i if i < 1 + self.layers => format!("present_key_{}", i - 1),
            i => format!("present_value_{}", i - 1 - self.layers),
        }
    }
}

/// Why a graph's inputs and outputs do not follow mllm's positional LLM I/O contract.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum IoContractError {
    #[error(
        "a {layers}-layer LLM graph has {want_inputs} inputs and {want_outputs} outputs, found {inputs} and {outputs}"
    )]
    Arity { layers: usize, want_inputs: usize, want_outputs: usize, inputs: usize, outputs: usize },
    /// A position whose rank is too small to read a size from.
    #[error("{position} must be {expected}")]
    Rank { position: &'static str, expected: &'static str },
    #[error("the mask has {context} columns, fewer than the chunk's {chunk} tokens")]
    ChunkExceedsContext { context: usize, chunk: usize },
    /// `side` is "input" or "output", `name` mllm runtime's name of that position.
    #[error("{side} {index} ({name}): expected {dtype} {}, found {} {}", fmt_shape(shape), found.dtype, fmt_shape(&found.shape))]
    Mismatch { side: &'static str, index: usize, name: String, dtype: DType, shape: Vec<usize>, found: TensorType },
}

impl Pass for MarkTensorIo<'_> {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "mark_tensor_io"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        check_split_graph(self.config)?;
        if !self.config.quant_recipe.llm_recipe {
            return Err(PassError::config("quant_recipe.llm_recipe", "must be true for the LLM I/O contract"));
        }
        let (_, call) = top_call(p, PASS)?;
        let call_name = format!("graph.CallGraphOp @{}", call.symbol);
        let op_err = |p: &Program, v: ValueId, message: String| PassError::Op {
            pass: PASS,
            op: call_name.clone(),
            module: "@main".into(),
            value: describe_value(p, v),
            message,
        };
        let (ins, outs) = (p.main.inputs.clone(), p.main.outputs.clone());
        let call_ins: HashSet<ValueId> = call.inputs.iter().copied().collect();
        let call_outs: HashSet<ValueId> = call.outputs.iter().copied().collect();
        if let Some(&v) = call.inputs.iter().find(|v| !ins.contains(v)) {
            return Err(op_err(p, v, "a graph input must come straight from @main's inputs, not from an op".into()));
        }
        if let Some(&v) = ins.iter().find(|v| !call_ins.contains(v)) {
            return Err(op_err(p, v, "this input of @main is not read by the model graph".into()));
        }
        if let Some(&v) = outs.iter().find(|v| !call_outs.contains(v)) {
            return Err(op_err(
                p,
                v,
                "this output of @main is not produced by the model graph (was lm_head merged?)".into(),
            ));
        }
        if call.outputs.len() != outs.len() {
            return Err(op_err(p, call.outputs[0], "the model graph returns values @main does not".into()));
        }
        let types = |vs: &[ValueId]| vs.iter().map(|v| p.value(*v).ty.clone()).collect::<Vec<_>>();
        let layers = self.config.quant_recipe.layers as usize;
        IoContract::check(&types(&ins), &types(&outs), layers).map_err(|m| PassError::Structure {
            pass: PASS,
            message: format!("{call_name} breaks mllm's positional I/O contract: {m}"),
        })?;

        // Reorder the call chain @main -> @model -> (@model.0.sS) to the contract order: the one
        // call in @main, then in each graph the call that passes the whole I/O on.
        let slots = subgraph_slots(p);
        let mut graph = callee(&slots, call, PASS)?;
        for n in &mut p.main.body {
            if let Node::Call(c) = n {
                reorder(&mut c.inputs, &ins);
                reorder(&mut c.outputs, &outs);
            }
        }
        loop {
            let sg = p.graph_mut(graph);
            reorder(&mut sg.region.inputs, &ins);
            reorder(&mut sg.region.outputs, &outs);
            let mut next = None;
            for n in &mut sg.region.body {
                match n {
                    Node::Return(vs) if same_set(vs, &outs) => reorder(vs, &outs),
                    Node::Call(c) if same_set(&c.inputs, &ins) && same_set(&c.outputs, &outs) => next = Some(c),
                    _ => {}
                }
            }
            let Some(c) = next else { break };
            reorder(&mut c.inputs, &ins);
            reorder(&mut c.outputs, &outs);
            let symbol = c.symbol.clone();
            graph =
                *slots.get(&symbol).ok_or_else(|| PassError::structure(PASS, format!("@{symbol} is not defined")))?;
        }
        for v in ins {
            p.value_mut(v).graph_input = true;
        }
        for v in outs {
            p.value_mut(v).graph_output = true;
        }
        Ok(())
    }
}

fn same_set(a: &[ValueId], b: &[ValueId]) -> bool {
    a.len() == b.len() && a.iter().all(|v| b.contains(v))
}

/// Puts `vs` into `order`'s order when both hold the same values.
fn reorder(vs: &mut Vec<ValueId>, order: &[ValueId]) {
    if same_set(vs, order) {
        *vs = order.to_vec();
    }
}
