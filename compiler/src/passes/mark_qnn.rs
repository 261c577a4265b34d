//! MarkQnnGraph: which graphs and ops run on the NPU (mllm's `MarkQnnGraphPass`).
//!
//! Every subgraph named in `graph_on_qnn`, every graph reachable from it through calls, and every
//! linalg op in those graphs gets `using_qnn:true`. Then the first top-level op of `@main` with each
//! name in `op_on_qnn` (the `lm_head`) is marked too. Unlike mllm, a name that matches nothing is an
//! error instead of being skipped.

use super::graph::{callee, subgraph_slots};
use super::pipeline::check_graph_name;
use super::{Pass, PassError};
use crate::aot_config::AotConfig;
use mllm_dsl::ir::{Attr, Node, Program};
use std::collections::HashSet;

/// The attribute mllm's lowering checks on graphs and ops.
pub const USING_QNN: &str = "using_qnn";

pub struct MarkQnnGraph<'a> {
    config: &'a AotConfig,
}

impl<'a> MarkQnnGraph<'a> {
    pub fn new(config: &'a AotConfig) -> Self {
        MarkQnnGraph { config }
    }
}

const PASS: &str = "MarkQnnGraph";

impl Pass for MarkQnnGraph<'_> {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "mark_qnn_graph"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let slots = subgraph_slots(p);
        let mut marked = HashSet::new();
        for (i, name) in self.config.graph_on_qnn.iter().enumerate() {
            check_graph_name(p, name, i)?;
            let mut stack = vec![slots[name]];
            while let Some(g) = stack.pop() {
                if !marked.insert(g) {
                    continue;
                }
                let sg = p.graph_mut(g);
                sg.attrs.insert(USING_QNN.into(), Attr::Bool(true));
                for n in &mut sg.region.body {
                    if let Node::Linalg(op) = n {
                        op.attrs.insert(USING_QNN.into(), Attr::Bool(true));
                    }
                }
                for n in &p.graph(g).region.body {
                    if let Node::Call(c) = n {
                        stack.push(callee(&slots, c, PASS)?);
                    }
                }
            }
        }
        for (i, name) in self.config.op_on_qnn.iter().enumerate() {
            let op = p.main.body.iter_mut().find_map(|n| match n {
                Node::Linalg(op) if op.name.as_deref() == Some(name.as_str()) => Some(op),
                _ => None,
            });
            match op {
                Some(op) => {
                    op.attrs.insert(USING_QNN.into(), Attr::Bool(true));
                }
                None => {
                    return Err(PassError::config(
                        format!("op_on_qnn[{i}]"),
                        format!("names `{name}`, but @main has no top-level op with that name"),
                    ))
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::tests::{tiny_config, tiny_program};

    #[test]
    fn marks_named_graphs_everything_they_call_and_the_head() {
        let mut p = tiny_program();
        MarkQnnGraph::new(&tiny_config()).run(&mut p).unwrap();
        for g in p.subgraphs() {
            let marked = g.attrs.get(USING_QNN) == Some(&Attr::Bool(true));
            assert_eq!(marked, g.symbol != "init", "@{}", g.symbol);
            for n in &g.region.body {
                if let Node::Linalg(op) = n {
                    assert_eq!(op.attrs.get(USING_QNN), Some(&Attr::Bool(true)), "{:?}", op.name);
                }
            }
        }
        let head = p.main.body.iter().find_map(|n| match n {
            Node::Linalg(op) => Some(op),
            _ => None,
        });
        assert_eq!(head.unwrap().attrs.get(USING_QNN), Some(&Attr::Bool(true)));
    }

    #[test]
    fn only_listed_graphs_are_marked() {
        let mut p = tiny_program();
        let mut cfg = tiny_config();
        cfg.graph_on_qnn = vec!["model.layers.0.self_attn".into()];
        cfg.op_on_qnn = vec![];
        MarkQnnGraph::new(&cfg).run(&mut p).unwrap();
        let marked: Vec<&str> =
            p.subgraphs().filter(|g| g.attrs.contains_key(USING_QNN)).map(|g| g.symbol.as_str()).collect();
        assert_eq!(marked, ["model.layers.0.self_attn"]);
    }

    #[test]
    fn unknown_names_are_config_errors() {
        let mut cfg = tiny_config();
        cfg.graph_on_qnn = vec!["model".into(), "modle".into()];
        let err = MarkQnnGraph::new(&cfg).run(&mut tiny_program()).unwrap_err().to_string();
        assert!(err.contains("graph_on_qnn[1]") && err.contains("`modle`") && err.contains("model"), "{err}");
        let mut cfg = tiny_config();
        cfg.op_on_qnn = vec!["lm_haed".into()];
        let err = MarkQnnGraph::new(&cfg).run(&mut tiny_program()).unwrap_err().to_string();
        assert!(err.contains("op_on_qnn[0]") && err.contains("lm_haed"), "{err}");
    }
}
