//! What a traced [`Program`] says about quantization, for tools that run the model eagerly
//! (fake-quant, calibration, accuracy reports) and need to know its QDQ points up front.
//!
//! - [`qdq_points`]: every QDQ point of the model file, once per key, in program order. A
//!   fake-quant run resolves all of them against the checkpoint before the first token, so a
//!   missing or malformed parameter is an error at load time, not in the middle of a generation.
//! - [`concat_groups`]: concatenations whose inputs carry different QDQ points. mllm's compiler
//!   gives a Concat's output its first input's encoding and requires all inputs to be equal
//!   (`PTQPass`), which pymllm guarantees with a `ConcatObserver` linking the inputs' observers.
//!   In Qwen3 that is rotate_half's `cat(-x2, x1)`: `x1` is a slice of the `q/k_norm_output_qdq`
//!   value and `-x2` carries `q/k_rope_neg_half_qdq`.
//! - [`linear_inputs`]: the QDQ point each linear's input comes from (for GPTQ-style statistics).
//! - [`layer_output_points`]: the QDQ point sitting on each decoder layer's output value (the next
//!   layer's `input_layernorm_input_qdq`, the last layer's `model.norm_input_qdq`); QDQ is metadata
//!   on a value, so the layer's output *is* that point's input.

use std::collections::{HashMap, HashSet};

use mllm_dsl::ir::{LinalgOp, Node, Program, Region, ValueId};
use mllm_dsl::op::OpKind;
use mllm_dsl::qdq::QdqAttr;

/// Why a program's QDQ points are inconsistent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PointsError {
    #[error("QDQ key `{key}` is used with two different kinds ({first} and {second}); each key names one point")]
    ConflictingKinds { key: String, first: String, second: String },
}

/// Every QDQ point of `program` (op outputs, constants, parameters and graph inputs), one per key,
/// in the order the values were created. The same key on several values (a KV point on the new
/// K and on the past-K graph input) is one point; the same key with two kinds is an error.
pub fn qdq_points(program: &Program) -> Result<Vec<QdqAttr>, PointsError> {
    let mut seen: HashMap<&str, &QdqAttr> = HashMap::new();
    let mut out = Vec::new();
    for def in &program.values {
        let Some(q) = def.qdq.as_ref() else { continue };
        match seen.get(q.key.as_str()) {
            Some(first) if first.kind != q.kind => {
                return Err(PointsError::ConflictingKinds {
                    key: q.key.clone(),
                    first: first.to_string(),
                    second: q.to_string(),
                })
            }
            Some(_) => {}
            None => {
                seen.insert(&q.key, q);
                out.push(q.clone());
            }
        }
    }
    Ok(out)
}

/// A sub-range `start..end` of dimension `dim` of a QDQ point's tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceOf {
    pub dim: usize,
    pub start: usize,
    pub end: usize,
}

/// One input of a concatenation: the QDQ point whose tensor it is (or a slice of).
#[derive(Clone, Debug, PartialEq)]
pub struct ConcatMember {
    pub point: QdqAttr,
    /// `None`: the whole tensor (possibly viewed or transposed, which keeps its values).
    pub slice: Option<SliceOf>,
}

/// A concatenation whose inputs come from at least two different QDQ points.
#[derive(Clone, Debug, PartialEq)]
pub struct ConcatGroup {
    /// The Concat op's name (`model.layers.0.self_attn.Concat.0`).
    pub op: String,
    /// In the op's input order.
    pub members: Vec<ConcatMember>,
}

/// `groups` with every two that share a QDQ point merged into one (op names joined by `+`), in
/// order of first appearance: one range must then hold for all their points (Phi-3's q and k
/// rotate_half concatenations both read the fused qkv projection's point).
pub fn merge_overlapping(groups: &[ConcatGroup]) -> Vec<ConcatGroup> {
    let mut merged: Vec<ConcatGroup> = Vec::new();
    for g in groups {
        let keys = g.keys();
        let overlapping: Vec<usize> =
            (0..merged.len()).filter(|&i| merged[i].keys().iter().any(|k| keys.contains(k))).collect();
        let Some((&first, rest)) = overlapping.split_first() else {
            merged.push(g.clone());
            continue;
        };
        for &i in rest.iter().rev() {
            let other = merged.remove(i);
            merged[first].op = format!("{}+{}", merged[first].op, other.op);
            merged[first].members.extend(other.members);
        }
        merged[first].op = format!("{}+{}", merged[first].op, g.op);
        merged[first].members.extend(g.members.iter().cloned());
    }
    merged
}

impl ConcatGroup {
    /// The distinct keys of the members, in member order.
    pub fn keys(&self) -> Vec<&str> {
        let mut keys: Vec<&str> = Vec::new();
        for m in &self.members {
            if !keys.contains(&m.point.key.as_str()) {
                keys.push(&m.point.key);
            }
        }
        keys
    }
}

/// Concatenations whose inputs trace back to two or more distinct QDQ points, in program order.
///
/// An input resolves to a point when its value carries the QDQ, when it is that value after ops
/// that only move values (View, Transpose, Permute, Unsqueeze, Repeat, Cast), or when it is a
/// Slice of such a value. Only a single slice taken straight from the QDQ value maps back to the
/// point's layout (`slice`); slices of slices (Phi-3's rotate_half of a head split off the fused
/// qkv projection) and a slice of a moved value (Llama's and Qwen2's rotate_half slices the
/// transposed projection output, Qwen3's the q/k norm output itself) is a member with no slice,
/// observed over the point's whole tensor, a superset of what enters the concatenation. Inputs
/// that resolve to nothing are left out of the group.
pub fn concat_groups(program: &Program) -> Vec<ConcatGroup> {
    let ops = program.linalg_ops();
    let producer: HashMap<ValueId, &LinalgOp> =
        ops.iter().flat_map(|&op| op.outputs.iter().map(move |&o| (o, op))).collect();
    let resolve = |start: ValueId| -> Option<ConcatMember> {
        let mut v = start;
        let mut slice = None;
        let mut slices = 0;
        loop {
            if let Some(q) = program.value(v).qdq.as_ref() {
                // Two slices compose to one the member does not record: the whole tensor.
                let slice = if slices == 1 { slice } else { None };
                return Some(ConcatMember { point: q.clone(), slice });
            }
            let op = producer.get(&v)?;
            match &op.kind {
                OpKind::View { .. }
                | OpKind::Transpose { .. }
                | OpKind::Permute { .. }
                | OpKind::Unsqueeze { .. }
                | OpKind::Repeat { .. }
                | OpKind::Cast { .. } => v = op.inputs[0],
                OpKind::Slice { dim, start, end } => {
                    slices += 1;
                    if program.value(op.inputs[0]).qdq.as_ref().is_some() {
                        slice = Some(SliceOf { dim: *dim, start: *start, end: *end });
                    }
                    v = op.inputs[0];
                }
                _ => return None,
            }
        }
    };
    ops.iter()
        .filter(|op| matches!(op.kind, OpKind::Concat { .. }))
        .map(|op| ConcatGroup {
            op: op.name.clone().unwrap_or_default(),
            members: op.inputs.iter().filter_map(|&v| resolve(v)).collect(),
        })
        .filter(|g| g.keys().len() >= 2)
        .collect()
}

/// The QDQ point on each decoder layer's output: for every module call whose symbol ends in a
/// list index (`model.layers.3`), the point carried by its first output, keyed by the symbol.
/// Calls whose first output has no QDQ are listed with `None`.
pub fn layer_output_points(program: &Program) -> Vec<(String, Option<QdqAttr>)> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    visit_calls(&program.main, &mut |symbol, outputs| {
        let is_list_item = symbol.rsplit_once('.').is_some_and(|(_, last)| last.parse::<usize>().is_ok());
        if is_list_item && seen.insert(symbol.to_string()) {
            let point = outputs.first().and_then(|&v| program.value(v).qdq.as_ref()).cloned();
            out.push((symbol.to_string(), point));
        }
    });
    out
}

fn visit_calls(region: &Region, f: &mut dyn FnMut(&str, &[ValueId])) {
    for node in &region.body {
        match node {
            Node::Call(c) => f(&c.symbol, &c.outputs),
            Node::SubGraph(g) => visit_calls(&g.region, f),
            _ => {}
        }
    }
}

/// A data movement between a QDQ point's tensor and a linear's input, replayed on the point's
/// tensor to get the linear's input rows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InputMove {
    Transpose { dim0: usize, dim1: usize },
    Permute { perm: Vec<usize> },
}

/// Where a linear's input comes from: the QDQ point whose tensor, after `moves`, is the input
/// with the linear's input features as its last dimension.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearInput {
    /// The linear's module path (its weight key without `.weight`).
    pub op: String,
    pub point: QdqAttr,
    /// In execution order; views are left out (they keep the values in order).
    pub moves: Vec<InputMove>,
    /// The linear's input width: the moved tensor is `[rows, in_features]` in row-major order.
    pub in_features: usize,
}

/// The input point of every Linear / Conv2D whose data input traces back to a QDQ point through
/// ops that only move values (View, Transpose, Permute), in program order. A linear whose chain
/// reshapes before it transposes (dims would not match the point's tensor) is left out, like
/// linears whose input is no QDQ point.
pub fn linear_inputs(program: &Program) -> Vec<LinearInput> {
    let ops = program.linalg_ops();
    let producer: HashMap<ValueId, &LinalgOp> =
        ops.iter().flat_map(|&op| op.outputs.iter().map(move |&o| (o, op))).collect();
    let resolve = |start: ValueId| -> Option<(QdqAttr, Vec<InputMove>)> {
        let (mut v, mut moves) = (start, Vec::new());
        loop {
            if let Some(q) = &program.value(v).qdq {
                moves.reverse();
                return Some((q.clone(), moves));
            }
            let op = producer.get(&v)?;
            match &op.kind {
                // Walking backwards: a view met after a move runs before it, on other dims.
                OpKind::View { .. } if !moves.is_empty() => return None,
                OpKind::View { .. } => {}
                OpKind::Transpose { dim0, dim1 } => moves.push(InputMove::Transpose { dim0: *dim0, dim1: *dim1 }),
                OpKind::Permute { perm } => moves.push(InputMove::Permute { perm: perm.clone() }),
                _ => return None,
            }
            v = op.inputs[0];
        }
    };
    let mut out = Vec::new();
    for op in ops.iter().filter(|op| matches!(op.kind, OpKind::Conv2d | OpKind::Linear)) {
        let Some(&w) = op.inputs.get(1) else { continue };
        let Some(weight) = program.value(w).symbol.clone() else { continue };
        // Conv2D weights are HWIO [1, 1, In, Out], Linear weights [Out, In].
        let in_features = match (&op.kind, program.value(w).ty.shape.as_slice()) {
            (OpKind::Conv2d, [1, 1, i, _]) | (OpKind::Linear, [_, i]) => *i,
            _ => continue,
        };
        let Some((point, moves)) = op.inputs.first().and_then(|&x| resolve(x)) else { continue };
        let name = weight.strip_suffix(".weight").unwrap_or(&weight).to_string();
        out.push(LinearInput { op: name, point, moves, in_features });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::QdqKind;

    fn group(op: &str, keys: &[&str]) -> ConcatGroup {
        let member =
            |k: &&str| ConcatMember { point: QdqAttr { kind: QdqKind::Activation, key: k.to_string() }, slice: None };
        ConcatGroup { op: op.into(), members: keys.iter().map(member).collect() }
    }

    #[test]
    fn groups_sharing_a_point_merge_and_others_stay() {
        let groups = [group("q", &["q_neg", "qkv"]), group("other", &["a", "b"]), group("k", &["k_neg", "qkv"])];
        let merged = merge_overlapping(&groups);
        assert_eq!(merged.len(), 2);
        assert_eq!((merged[0].op.as_str(), merged[0].keys()), ("q+k", vec!["q_neg", "qkv", "k_neg"]));
        assert_eq!(merged[1], groups[1]);
        // A later group joining two earlier ones merges all three.
        let chain = [group("x", &["a", "b"]), group("y", &["c", "d"]), group("z", &["b", "c"])];
        let merged = merge_overlapping(&chain);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].keys(), ["a", "b", "c", "d"]);
    }
}
