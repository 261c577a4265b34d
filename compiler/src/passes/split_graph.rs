//! SplitLLMGraph: the nested model graph becomes one flat QNN graph per chunk size (mllm's
//! `SplitLLMGraphPass`, whose only supported split is 1).
//!
//! `S` is the chunk length, dim 1 of the model's first input (the ids `[1, S]`). A new subgraph
//! `model.0.s<S>` (attribute `use_qnn`) receives every op and constant reachable from `@model`, in
//! walk order, each tagged with `qnn_context_name:"context.0"` and `qnn_graph_name:"model.0.s<S>"`.
//! Its inputs and outputs are `@model`'s; `@model` shrinks to a call of it. All other subgraphs
//! except `@init` are deleted. Values keep their ids: a call's inputs and outputs are the callee's
//! region inputs and outputs, so inlining needs no renaming (checked).

use super::graph::{callee, module_of, node, subgraph_slots, top_call, walk_from, Visit};
use super::pipeline::check_split_graph;
use super::{Pass, PassError};
use crate::aot_config::AotConfig;
use mllm_dsl::ir::{Attr, Attrs, CallGraph, Node, Program, Region, SubGraph};

pub struct SplitLlmGraph<'a> {
    config: &'a AotConfig,
}

impl<'a> SplitLlmGraph<'a> {
    pub fn new(config: &'a AotConfig) -> Self {
        SplitLlmGraph { config }
    }
}

const PASS: &str = "SplitLLMGraph";

/// The QNN context all graphs of a split-1 model live in.
pub const CONTEXT_NAME: &str = "context.0";

/// `model.0.s<S>`: mllm's graph name for chunk length `S`.
pub fn graph_name(chunk: usize) -> String {
    shard_graph_name(0, chunk)
}

/// `model.<i>.s<S>`: the graph name for chunk length `S` in shard `i` of a model split into
/// several context binaries (shard 0 of a one-binary model is [`graph_name`]).
pub fn shard_graph_name(shard: usize, chunk: usize) -> String {
    format!("model.{shard}.s{chunk}")
}

/// `(shard, chunk)` of a name `model.<i>.s<S>` (decimal digits only); `None` for any other name.
pub fn parse_graph_name(name: &str) -> Option<(usize, usize)> {
    let (shard, chunk) = name.strip_prefix("model.")?.split_once(".s")?;
    let number = |s: &str| if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) { s.parse().ok() } else { None };
    Some((number(shard)?, number(chunk)?))
}

impl Pass for SplitLlmGraph<'_> {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "split_llm_graph"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        check_split_graph(self.config)?;
        let (_, call) = top_call(p, PASS)?;
        if call.symbol != "model" {
            return Err(PassError::structure(
                PASS,
                format!("the top-level call targets @{}; the LLM graph must be the module `model`", call.symbol),
            ));
        }
        let slots = subgraph_slots(p);
        let model = callee(&slots, call, PASS)?;
        let model_graph = p.graph(model);
        let (inputs, outputs) = (model_graph.region.inputs.clone(), model_graph.region.outputs.clone());
        let chunk = match inputs.first().map(|v| &p.value(*v).ty.shape[..]) {
            Some(&[_, s]) => s,
            other => {
                return Err(PassError::structure(
                    PASS,
                    format!("@model's first input must be the token ids [1, S], found shape {other:?}"),
                ))
            }
        };
        let flat_name = graph_name(chunk);
        if slots.contains_key(&flat_name) {
            return Err(PassError::structure(PASS, format!("@{flat_name} already exists (split twice?)")));
        }

        let mut body = Vec::new();
        for visit in walk_from(p, model, PASS)? {
            let Visit::Node(r) = visit else { continue };
            match node(p, r) {
                Node::Call(c) => {
                    let target = callee(&slots, c, PASS)?;
                    let g = p.graph(target);
                    if g.region.inputs != c.inputs || g.region.outputs != c.outputs {
                        return Err(PassError::structure(
                            PASS,
                            format!(
                                "the call of @{} in `{}` passes other values than the subgraph's region declares; \
                                 cannot inline it",
                                c.symbol,
                                module_of(p, r.graph)
                            ),
                        ));
                    }
                }
                Node::Linalg(op) => {
                    let mut op = op.clone();
                    op.attrs.insert("qnn_context_name".into(), Attr::Str(CONTEXT_NAME.into()));
                    op.attrs.insert("qnn_graph_name".into(), Attr::Str(flat_name.clone()));
                    body.push(Node::Linalg(op));
                }
                other @ Node::Constant { .. } => body.push(other.clone()),
                _ => {}
            }
        }
        body.push(Node::Return(outputs.clone()));
        let mut attrs = Attrs::new();
        attrs.insert("use_qnn".into(), Attr::Bool(true));
        let flat = SubGraph {
            symbol: flat_name.clone(),
            device: None,
            attrs,
            region: Region { inputs: inputs.clone(), outputs: outputs.clone(), body },
        };

        let old = std::mem::take(&mut p.main.body);
        for n in old {
            match n {
                Node::SubGraph(mut g) if g.symbol == "model" => {
                    g.region.body = vec![
                        Node::Call(CallGraph {
                            symbol: flat_name.clone(),
                            inputs: inputs.clone(),
                            outputs: outputs.clone(),
                        }),
                        Node::Return(outputs.clone()),
                    ];
                    p.main.body.push(Node::SubGraph(g));
                    p.main.body.push(Node::SubGraph(flat.clone()));
                }
                Node::SubGraph(g) if g.symbol != "init" => {}
                other => p.main.body.push(other),
            }
        }
        Ok(())
    }
}
