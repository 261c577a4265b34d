//! MergeLLMHeadIntoMainGraph: the top-level `lm_head` moves into the model graph (mllm's
//! `MergeLLMHeadIntoMainGraphPass`), so one QNN graph produces the logits.
//!
//! The op named `lm_head` (or `lm_head_out`) in `@main` is moved just before the model graph's
//! return, together with the ops after it that compute the logits from its output (Gemma's final
//! softcapping, with its constants); the model graph then returns the logits where it returned the
//! head's input, and the call in `@main` defines them directly. Parameters (the head's weight) are
//! global values and need no plumbing. The head must read exactly one activation, which must be an
//! output of the model call used by nothing else; the ops after it may read only global values and
//! what the head and they define, and exactly one of their values must be an output of `@main`.

use super::graph::{callee, module_of, op_name, region_mut, subgraph_slots, top_call};
use super::mark_qnn::USING_QNN;
use super::{Pass, PassError};
use mllm_dsl::ir::{Node, Program, ValueId};
use std::collections::HashSet;

pub struct MergeLlmHead;

const PASS: &str = "MergeLLMHeadIntoMainGraph";

/// Names mllm recognizes as the head.
const HEAD_NAMES: [&str; 2] = ["lm_head", "lm_head_out"];

impl Pass for MergeLlmHead {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "merge_llm_head"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let (call_at, call) = top_call(p, PASS)?;
        let graph = callee(&subgraph_slots(p), call, PASS)?;
        let call_outputs = call.outputs.clone();
        let head = p.main.body.iter().enumerate().find_map(|(i, n)| match n {
            Node::Linalg(op) if HEAD_NAMES.contains(&op.name.as_deref().unwrap_or("")) => Some((i, op)),
            _ => None,
        });
        let Some((head_at, head)) = head else {
            return Ok(()); // No head: nothing to merge, as in mllm.
        };
        let name = op_name(head);
        let err = |value: String, message: String| PassError::Op {
            pass: PASS,
            op: name.clone(),
            module: "@main".into(),
            value,
            message,
        };
        if head_at < call_at {
            return Err(err("the op".into(), "comes before the model call it reads from".into()));
        }
        // Parameters are globals; the activation inputs are what the head reads from the graph.
        let activations: Vec<ValueId> = head.inputs.iter().copied().filter(|v| p.value(*v).symbol.is_none()).collect();
        let [x] = activations[..] else {
            return Err(err(
                format!("{} activation inputs", activations.len()),
                "the head must read exactly one activation (the model's hidden state)".into(),
            ));
        };
        let [y] = head.outputs[..] else {
            return Err(err(format!("{} outputs", head.outputs.len()), "the head must have one output".into()));
        };
        if !call_outputs.contains(&x) {
            return Err(err(
                super::graph::describe_value(p, x),
                format!("the head's input is not an output of the call of @{}", module_of(p, Some(graph))),
            ));
        }
        let other_use = p.main.body.iter().enumerate().any(|(i, n)| {
            i != head_at
                && match n {
                    Node::Linalg(op) => op.inputs.contains(&x),
                    Node::Call(c) => c.inputs.contains(&x),
                    _ => false,
                }
        });
        if other_use {
            return Err(err(
                super::graph::describe_value(p, x),
                "the head's input is also used elsewhere in @main, so the graph cannot return the logits instead"
                    .into(),
            ));
        }
        // The head and every op after the call (the logits' epilogue, e.g. softcapping and its
        // constants) move; parameter registrations stay (they are global).
        let moves = |n: &Node| matches!(n, Node::Linalg(_) | Node::Constant { .. });
        let tail: Vec<usize> = (call_at + 1..p.main.body.len()).filter(|&i| moves(&p.main.body[i])).collect();
        let mut defined: HashSet<ValueId> = HashSet::new();
        for &i in &tail {
            match &p.main.body[i] {
                Node::Linalg(op) if i < head_at => {
                    return Err(err(op_name(op), "an op runs between the model call and the head".into()));
                }
                Node::Linalg(op) => {
                    // The head reads only `x` (checked above); the ops after it only what moves.
                    let foreign = op.inputs.iter().find(|v| p.value(**v).symbol.is_none() && !defined.contains(v));
                    if let (Some(&v), true) = (foreign, i > head_at) {
                        return Err(PassError::Op {
                            pass: PASS,
                            op: op_name(op),
                            module: "@main".into(),
                            value: super::graph::describe_value(p, v),
                            message: "an op after the head reads a value the head and the ops after it do not \
                                      define, so it cannot move into the model graph"
                                .into(),
                        });
                    }
                    defined.extend(op.outputs.iter().copied());
                }
                Node::Constant { value, .. } => {
                    defined.insert(*value);
                }
                _ => {}
            }
        }
        let results: Vec<ValueId> = p.main.outputs.iter().copied().filter(|v| defined.contains(v)).collect();
        let [logits] = results[..] else {
            return Err(err(
                format!("{} outputs of @main defined after the call", results.len()),
                "exactly one output of @main (the logits) must come from the head and the ops after it".into(),
            ));
        };
        let mut moved = Vec::with_capacity(tail.len());
        for &i in tail.iter().rev() {
            moved.push(p.main.body.remove(i));
        }
        moved.reverse();
        // The epilogue runs where the head runs: on QNN when MarkQnnGraph put the head there.
        let head_qnn = moved.iter().find_map(|n| match n {
            Node::Linalg(op) if op.outputs == [y] => op.attrs.get(USING_QNN).cloned(),
            _ => None,
        });
        if let Some(attr) = head_qnn {
            for n in &mut moved {
                if let Node::Linalg(op) = n {
                    op.attrs.entry(USING_QNN.into()).or_insert_with(|| attr.clone());
                }
            }
        }
        let replace = |vs: &mut Vec<ValueId>| vs.iter_mut().filter(|v| **v == x).for_each(|v| *v = logits);
        // @main: its one call (`top_call`) now defines the logits; the head's input no longer
        // leaves the graph.
        for n in &mut p.main.body {
            if let Node::Call(c) = n {
                replace(&mut c.outputs);
            }
        }
        let r = region_mut(p, Some(graph));
        replace(&mut r.outputs);
        let Some((ret, Node::Return(vs))) = r.body.iter_mut().enumerate().rfind(|(_, n)| matches!(n, Node::Return(_)))
        else {
            return Err(PassError::structure(PASS, format!("@{} has no cf.ReturnOp", module_of(p, Some(graph)))));
        };
        replace(vs);
        r.body.splice(ret..ret, moved);
        debug_assert!(y == logits || defined.contains(&y));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::passes::tests::tiny_program;

    #[test]
    fn head_moves_before_the_return_and_the_graph_returns_logits() {
        let mut p = tiny_program();
        let logits = p.main.outputs[0];
        MergeLlmHead.run(&mut p).unwrap();
        assert!(!p.main.body.iter().any(|n| matches!(n, Node::Linalg(_))), "no top-level ops left");
        let model = p.subgraph("model").unwrap();
        let n = model.region.body.len();
        assert!(matches!(&model.region.body[n - 2], Node::Linalg(op) if op.name.as_deref() == Some("lm_head")));
        assert!(matches!(&model.region.body[n - 1], Node::Return(vs) if vs[0] == logits));
        assert_eq!(model.region.outputs[0], logits);
        let (_, call) = top_call(&p, PASS).unwrap();
        assert_eq!(call.outputs[0], logits);
        // Still closed SSA: the printed program parses back.
        assert_eq!(mllm_dsl::ir::parse(&p.to_string()).unwrap(), p.canonicalize());
    }

    #[test]
    fn no_head_is_a_no_op() {
        let mut p = tiny_program();
        for n in &mut p.main.body {
            if let Node::Linalg(op) = n {
                op.name = Some("classifier".into());
            }
        }
        let before = p.clone();
        MergeLlmHead.run(&mut p).unwrap();
        assert_eq!(p, before);
    }
}
