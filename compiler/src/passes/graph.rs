//! Navigation shared by the passes: the top-level call, subgraphs by symbol, program-order walks
//! that follow calls, and descriptions of values for error messages.
//!
//! Subgraphs all sit in `@main`'s body (the trace creates them flat), so a node is addressed by the
//! handle of its subgraph (or `@main`) and its index in that region.

use super::PassError;
use mllm_dsl::ir::{value_names, CallGraph, GraphId, LinalgOp, Node, Program, Region, ValueId};
use std::collections::{HashMap, HashSet};

/// A node's address: `graph` is the subgraph holding it (`None` for `@main` itself), `node` its
/// index in that region's body.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct NodeRef {
    pub graph: Option<GraphId>,
    pub node: usize,
}

pub(crate) fn region(p: &Program, graph: Option<GraphId>) -> &Region {
    match graph {
        None => &p.main,
        Some(g) => &p.graph(g).region,
    }
}

pub(crate) fn region_mut(p: &mut Program, graph: Option<GraphId>) -> &mut Region {
    match graph {
        None => &mut p.main,
        Some(g) => &mut p.graph_mut(g).region,
    }
}

pub(crate) fn node(p: &Program, r: NodeRef) -> &Node {
    &region(p, r.graph).body[r.node]
}

pub(crate) fn node_mut(p: &mut Program, r: NodeRef) -> &mut Node {
    &mut region_mut(p, r.graph).body[r.node]
}

pub(crate) fn linalg(p: &Program, r: NodeRef) -> &LinalgOp {
    match node(p, r) {
        Node::Linalg(op) => op,
        _ => unreachable!("{r:?} is not a linalg op"),
    }
}

pub(crate) fn linalg_mut(p: &mut Program, r: NodeRef) -> &mut LinalgOp {
    match node_mut(p, r) {
        Node::Linalg(op) => op,
        _ => unreachable!("{r:?} is not a linalg op"),
    }
}

/// The module path a node belongs to: its subgraph's symbol, or `@main`.
pub(crate) fn module_of(p: &Program, graph: Option<GraphId>) -> String {
    match graph {
        None => "@main".into(),
        Some(g) => p.graph(g).symbol.clone(),
    }
}

/// An op's name for messages (`<unnamed MatMul>` before OpNaming).
pub(crate) fn op_name(op: &LinalgOp) -> String {
    op.name.clone().unwrap_or_else(|| format!("<unnamed {}>", op.kind.type_name()))
}

/// Every subgraph's handle, by symbol.
pub(crate) fn subgraph_slots(p: &Program) -> HashMap<String, GraphId> {
    p.graph_ids().map(|g| (p.graph(g).symbol.clone(), g)).collect()
}

/// The one `graph.CallGraphOp` in `@main` (mllm asserts there is exactly one: the call of `@model`).
pub(crate) fn top_call<'a>(p: &'a Program, pass: &'static str) -> Result<(usize, &'a CallGraph), PassError> {
    let calls: Vec<(usize, &CallGraph)> = p
        .main
        .body
        .iter()
        .enumerate()
        .filter_map(|(i, n)| match n {
            Node::Call(c) => Some((i, c)),
            _ => None,
        })
        .collect();
    match calls.as_slice() {
        [one] => Ok(*one),
        [] => Err(PassError::structure(pass, "@main has no graph.CallGraphOp (expected one call of the model graph)")),
        many => Err(PassError::structure(
            pass,
            format!(
                "@main has {} graph.CallGraphOps ({}); expected exactly one call of the model graph",
                many.len(),
                many.iter().map(|(_, c)| format!("@{}", c.symbol)).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// The subgraph a call targets.
pub(crate) fn callee(
    slots: &HashMap<String, GraphId>,
    call: &CallGraph,
    pass: &'static str,
) -> Result<GraphId, PassError> {
    slots.get(&call.symbol).copied().ok_or_else(|| {
        PassError::structure(pass, format!("graph.CallGraphOp calls @{}, which is not defined", call.symbol))
    })
}

/// One step of a program-order walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Visit {
    /// Entering this subgraph (before its nodes).
    Enter(GraphId),
    /// A linalg op, constant or call, in program order; a call is followed by its callee's visits.
    Node(NodeRef),
}

/// Walks the subgraph at `start` and everything it calls, in program order (mllm's recursive
/// `IRWriter::walk` through `CallGraphOp`s). Each subgraph is entered once.
pub(crate) fn walk_from(p: &Program, start: GraphId, pass: &'static str) -> Result<Vec<Visit>, PassError> {
    let slots = subgraph_slots(p);
    let mut out = Vec::new();
    let mut entered = HashSet::new();
    walk_graph(p, start, &slots, &mut entered, &mut out, pass)?;
    Ok(out)
}

fn walk_graph(
    p: &Program,
    g: GraphId,
    slots: &HashMap<String, GraphId>,
    entered: &mut HashSet<GraphId>,
    out: &mut Vec<Visit>,
    pass: &'static str,
) -> Result<(), PassError> {
    if !entered.insert(g) {
        return Ok(());
    }
    out.push(Visit::Enter(g));
    for (i, n) in region(p, Some(g)).body.iter().enumerate() {
        let r = NodeRef { graph: Some(g), node: i };
        match n {
            Node::Linalg(_) | Node::Constant { .. } => out.push(Visit::Node(r)),
            Node::Call(c) => {
                out.push(Visit::Node(r));
                let target = callee(slots, c, pass)?;
                walk_graph(p, target, slots, entered, out, pass)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The linalg ops of a walk, in order.
pub(crate) fn walk_ops(p: &Program, walk: &[Visit]) -> Vec<NodeRef> {
    walk.iter()
        .filter_map(|v| match v {
            Visit::Node(r) if matches!(node(p, *r), Node::Linalg(_)) => Some(*r),
            _ => None,
        })
        .collect()
}

/// A value for error messages: its printed name, what defines it, its type and QDQ point, e.g.
/// `%model.layers.0.input_layernorm (output 0 of model.layers.0.input_layernorm, [1, 4, 32]
/// UInt16PerTensorAsy, qdq act("..."))`.
pub(crate) fn describe_value(p: &Program, v: ValueId) -> String {
    let names = value_names(p);
    let number = names.iter().find(|(x, _)| *x == v).map_or_else(|| "%?".to_string(), |(_, n)| format!("%{n}"));
    let def = p.value(v);
    let mut parts = Vec::new();
    if let Some(origin) = origin(p, v) {
        parts.push(origin);
    }
    parts.push(format!("{} {}", mllm_dsl::dtype::fmt_shape(&def.ty.shape), def.ty.dtype));
    if let Some(q) = def.qdq.as_ref() {
        parts.push(format!("qdq {q}"));
    }
    format!("{number} ({})", parts.join(", "))
}

fn origin(p: &Program, v: ValueId) -> Option<String> {
    if let Some(i) = p.main.inputs.iter().position(|x| *x == v) {
        return Some(format!("graph input {i}"));
    }
    if let Some(sym) = &p.value(v).symbol {
        return Some(format!("parameter @{sym}"));
    }
    if let Some(c) = p.value(v).constant {
        return Some(format!("constant {c:?}"));
    }
    let mut found = None;
    visit_regions(&p.main, &mut |r| {
        for n in &r.body {
            if let Node::Linalg(op) = n {
                if let Some(k) = op.outputs.iter().position(|x| *x == v) {
                    found.get_or_insert_with(|| format!("output {k} of {}", op_name(op)));
                }
            }
        }
    });
    found
}

fn visit_regions(r: &Region, f: &mut dyn FnMut(&Region)) {
    f(r);
    for n in &r.body {
        if let Node::SubGraph(sg) = n {
            visit_regions(&sg.region, f);
        }
    }
}
