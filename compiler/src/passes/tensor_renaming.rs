//! TensorRenaming: every tensor of a flat QNN graph gets a stable, QNN-safe name (attribute
//! `name`). mllm's pass of that name is an empty file; its QNN tensors are named after value uuids,
//! which change from run to run.
//!
//! Names depend only on the program's structure, never on value ids:
//! - graph inputs and outputs get the runtime's names (`input_ids`, `past_key_3`, `logits`, ...);
//! - parameters are named after their checkpoint key (`model.layers.0.mlp.up_proj.weight` →
//!   `model_layers_0_mlp_up_proj_weight`), so the `s32` and `s1` graphs of one context name each
//!   shared static tensor identically;
//! - a constant is named after its first consumer and operand (`<op>_in<k>`), an op output after
//!   its op (`<op>_out<k>`).
//!
//! Characters outside `[A-Za-z0-9_]` become `_`; a leading digit gets a `t_` prefix; a name that is
//! already taken gets `_<n>` appended, in walk order.

use super::tensor_io::IoContract;
use super::{Pass, PassError};
use mllm_dsl::ir::{Attr, GraphId, Node, Program, ValueId};
use std::collections::{HashMap, HashSet};

pub struct TensorRenaming;

const PASS: &str = "TensorRenaming";

impl Pass for TensorRenaming {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "tensor_renaming"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let flat: Vec<GraphId> =
            p.graph_ids().filter(|&g| p.graph(g).attrs.get("use_qnn") == Some(&Attr::Bool(true))).collect();
        if flat.is_empty() {
            return Err(PassError::structure(PASS, "no flat QNN graph (use_qnn) to rename; run SplitLLMGraph first"));
        }
        for g in flat {
            let graph = p.graph(g);
            let symbol = graph.symbol.clone();
            let region = &graph.region;
            let types = |vs: &[ValueId]| vs.iter().map(|v| p.value(*v).ty.clone()).collect::<Vec<_>>();
            let layers = region.inputs.len().saturating_sub(3) / 2;
            let contract = IoContract::check(&types(&region.inputs), &types(&region.outputs), layers)
                .map_err(|m| PassError::structure(PASS, format!("@{symbol}: {m} (run MarkTensorIO first)")))?;
            let mut names = Names::default();
            for (i, v) in region.inputs.iter().enumerate() {
                names.assign(*v, &contract.input_name(i));
            }
            for (i, v) in region.outputs.iter().enumerate() {
                names.assign(*v, &contract.output_name(i));
            }
            for n in &region.body {
                let Node::Linalg(op) = n else { continue };
                let op_name = op.name.clone().unwrap_or_else(|| op.kind.type_name().to_string());
                for (k, &v) in op.inputs.iter().enumerate() {
                    let def = p.value(v);
                    if let Some(sym) = &def.symbol {
                        names.assign(v, sym);
                    } else if def.constant.is_some() {
                        names.assign(v, &format!("{op_name}_in{k}"));
                    }
                }
                for (k, &v) in op.outputs.iter().enumerate() {
                    names.assign(v, &format!("{op_name}_out{k}"));
                }
            }
            for (v, name) in names.by_value {
                p.value_mut(v).name = Some(name);
            }
        }
        Ok(())
    }
}

#[derive(Default)]
struct Names {
    by_value: HashMap<ValueId, String>,
    taken: HashSet<String>,
}

impl Names {
    fn assign(&mut self, v: ValueId, base: &str) {
        if self.by_value.contains_key(&v) {
            return;
        }
        let base = qnn_safe(base);
        let mut name = base.clone();
        let mut n = 1;
        while !self.taken.insert(name.clone()) {
            name = format!("{base}_{n}");
            n += 1;
        }
        self.by_value.insert(v, name);
    }
}

/// `[A-Za-z0-9_]` only, not starting with a digit.
pub fn qnn_safe(name: &str) -> String {
    let mut s: String = name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
    if s.is_empty() || s.starts_with(|c: char| c.is_ascii_digit()) {
        s.insert_str(0, "t_");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_qnn_safe() {
        assert_eq!(qnn_safe("model.layers.0.mlp.up_proj.weight"), "model_layers_0_mlp_up_proj_weight");
        assert_eq!(qnn_safe("0abc"), "t_0abc");
        assert_eq!(qnn_safe(""), "t_");
        assert_eq!(qnn_safe("a-b c"), "a_b_c");
    }

    #[test]
    fn collisions_get_suffixes_in_order() {
        let mut n = Names::default();
        n.assign(ValueId(0), "a.b");
        n.assign(ValueId(1), "a_b");
        n.assign(ValueId(2), "a-b");
        n.assign(ValueId(0), "other");
        assert_eq!(n.by_value[&ValueId(0)], "a_b");
        assert_eq!(n.by_value[&ValueId(1)], "a_b_1");
        assert_eq!(n.by_value[&ValueId(2)], "a_b_2");
    }
}
