//! OpNaming: every op of the model graph gets a unique, deterministic name (mllm's `OpNamingPass`).
//!
//! QNN node names are op names, so they must exist and be unique. Starting at the one top-level
//! call, each reachable subgraph is visited; an unnamed op becomes `<subgraph>.<OpType>.<k>` with
//! `k` counting per op type within the subgraph, exactly as mllm names them.
//!
//! The trace already names anonymous ops after the *module path*, which equals the subgraph symbol
//! except for a module called twice: its second subgraph is `<path>_1` but its ops still say
//! `<path>.…`. Those names are re-rooted at the subgraph symbol, and any remaining duplicate is an
//! error naming both ops.

use super::graph::{linalg_mut, module_of, top_call, walk_from, walk_ops, NodeRef};
use super::{Pass, PassError};
use mllm_dsl::ir::{GraphId, Node, Program};
use std::collections::HashMap;

pub struct OpNaming;

const PASS: &str = "OpNaming";

impl Pass for OpNaming {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "op_naming"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let (_, call) = top_call(p, PASS)?;
        let start = super::graph::callee(&super::graph::subgraph_slots(p), call, PASS)?;
        let walk = walk_from(p, start, PASS)?;
        let ops = walk_ops(p, &walk);
        // Per subgraph and op type, how many unnamed ops were named so far.
        let mut counters: HashMap<(Option<GraphId>, &'static str), usize> = HashMap::new();
        let mut seen: HashMap<String, NodeRef> = HashMap::new();
        for r in ops {
            let symbol = module_of(p, r.graph);
            let op = linalg_mut(p, r);
            let name = match op.name.take() {
                None => {
                    let type_name = op.kind.type_name();
                    let k = counters.entry((r.graph, type_name)).or_insert(0);
                    *k += 1;
                    format!("{symbol}.{type_name}.{}", *k - 1)
                }
                Some(name) => reroot(&name, &symbol),
            };
            op.name = Some(name.clone());
            if let Some(first) = seen.insert(name.clone(), r) {
                return Err(PassError::Op {
                    pass: PASS,
                    op: name,
                    module: symbol,
                    value: "its name".into(),
                    message: format!(
                        "the same name is already used by an op in `{}`; QNN node names must be unique",
                        module_of(p, first.graph)
                    ),
                });
            }
        }
        // Top-level ops (the lm_head) keep their names but must not collide either.
        for n in &p.main.body {
            if let Node::Linalg(op) = n {
                if let Some(name) = &op.name {
                    if seen.contains_key(name) {
                        return Err(PassError::Op {
                            pass: PASS,
                            op: name.clone(),
                            module: "@main".into(),
                            value: "its name".into(),
                            message: "the same name is used by an op of the model graph".into(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// `model.layers.0.mlp.View.0` in subgraph `model.layers.0.mlp_1` → `model.layers.0.mlp_1.View.0`.
fn reroot(name: &str, symbol: &str) -> String {
    let Some((path, _)) = symbol.rsplit_once('_') else { return name.to_string() };
    let repeated = symbol[path.len() + 1..].bytes().all(|b| b.is_ascii_digit());
    match name.strip_prefix(path).and_then(|rest| rest.strip_prefix('.')) {
        Some(rest) if repeated => format!("{symbol}.{rest}"),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::tests::tiny_program;
    use mllm_dsl::ir::Node;

    #[test]
    fn reroots_names_of_repeated_module_calls() {
        assert_eq!(reroot("model.mlp.View.0", "model.mlp_1"), "model.mlp_1.View.0");
        assert_eq!(reroot("model.mlp.up", "model.mlp_12"), "model.mlp_12.up");
        assert_eq!(reroot("model.mlp.View.0", "model.mlp"), "model.mlp.View.0");
        assert_eq!(reroot("other.View.0", "model.mlp_1"), "other.View.0");
        assert_eq!(reroot("model.my_proj.View.0", "model.my_proj"), "model.my_proj.View.0");
    }

    #[test]
    fn names_unnamed_ops_per_subgraph_and_type() {
        let mut p = tiny_program();
        // Forget the trace's names of anonymous ops; layer ops keep theirs.
        let mut forgotten = Vec::new();
        for n in &mut p.main.body {
            if let Node::SubGraph(sg) = n {
                for n in &mut sg.region.body {
                    if let Node::Linalg(op) = n {
                        if op.name.as_ref().is_some_and(|name| name.contains(&format!(".{}.", op.kind.type_name()))) {
                            forgotten.push(op.name.take().unwrap());
                        }
                    }
                }
            }
        }
        assert!(forgotten.len() > 20);
        OpNaming.run(&mut p).unwrap();
        // mllm's scheme gives back exactly the trace's names.
        let mut named: Vec<String> = p.linalg_ops().iter().filter_map(|op| op.name.clone()).collect();
        named.sort();
        forgotten.sort();
        assert!(forgotten.iter().all(|f| named.binary_search(f).is_ok()), "{forgotten:?}");
    }

    #[test]
    fn duplicate_names_are_reported_with_both_modules() {
        let mut p = tiny_program();
        let ops: Vec<&mut mllm_dsl::ir::LinalgOp> = p
            .main
            .body
            .iter_mut()
            .filter_map(|n| match n {
                Node::SubGraph(sg) if sg.symbol == "model.layers.0.self_attn" => Some(sg),
                _ => None,
            })
            .flat_map(|sg| sg.region.body.iter_mut())
            .filter_map(|n| match n {
                Node::Linalg(op) => Some(op),
                _ => None,
            })
            .collect();
        let first = ops[0].name.clone();
        for op in ops.into_iter().skip(1).take(1) {
            op.name = first.clone();
        }
        let err = OpNaming.run(&mut p).unwrap_err().to_string();
        assert!(err.contains(first.as_deref().unwrap()) && err.contains("model.layers.0.self_attn"), "{err}");
    }
}
