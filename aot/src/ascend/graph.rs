//! What the export reads from the traced model file: its linears (module path, shape, bias, the
//! QDQ point their input comes from) and its KV-cache QDQ points with the linear that produces
//! each. Nothing here knows an architecture: it walks the program the model file traces into.

use std::collections::{HashMap, HashSet, VecDeque};

use compiler::quant::points::{linear_inputs, LinearInput};
use mllm_dsl::op::OpKind;
use mllm_dsl::{Program, QdqAttr, QdqKind};

/// One Linear / Conv2D of the model file.
#[derive(Clone, Debug, PartialEq)]
pub struct TracedLinear {
    /// Module path = checkpoint key without `.weight`.
    pub name: String,
    pub out_features: usize,
    pub in_features: usize,
    pub has_bias: bool,
    /// The QDQ point its input comes from, when the model file has one.
    pub input: Option<LinearInput>,
}

/// A KV-cache QDQ point and the linear whose output it caches.
#[derive(Clone, Debug, PartialEq)]
pub struct KvPoint {
    pub point: QdqAttr,
    pub linear: String,
}

/// Every linear of `program` whose weight is a parameter, in program order.
pub fn traced_linears(program: &Program) -> Vec<TracedLinear> {
    let inputs: HashMap<String, LinearInput> = linear_inputs(program).into_iter().map(|l| (l.op.clone(), l)).collect();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for op in program.linalg_ops() {
        if !matches!(op.kind, OpKind::Conv2d | OpKind::Linear) {
            continue;
        }
        let Some(&w) = op.inputs.get(1) else { continue };
        let Some(weight) = program.value(w).symbol.clone() else { continue };
        // Conv2D weights are HWIO [1, 1, In, Out], Linear weights [Out, In].
        let (in_features, out_features) = match (&op.kind, program.value(w).ty.shape.as_slice()) {
            (OpKind::Conv2d, [1, 1, i, o]) | (OpKind::Linear, [o, i]) => (*i, *o),
            _ => continue,
        };
        let name = weight.strip_suffix(".weight").unwrap_or(&weight).to_string();
        if !seen.insert(name.clone()) {
            continue;
        }
        let has_bias = op.inputs.get(2).and_then(|&b| program.value(b).symbol.as_ref()).is_some();
        let input = inputs.get(&name).cloned();
        out.push(TracedLinear { name, out_features, in_features, has_bias, input });
    }
    out
}

/// Every KV-cache QDQ point with the nearest linear upstream of it (through RoPE, norms, casts).
pub fn kv_points(program: &Program) -> Vec<KvPoint> {
    let ops = program.linalg_ops();
    let producer: HashMap<_, _> = ops.iter().flat_map(|&op| op.outputs.iter().map(move |&o| (o, op))).collect();
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for op in &ops {
        for &v in &op.outputs {
            let Some(q) = &program.value(v).qdq else { continue };
            if !matches!(q.kind, QdqKind::KvCache) || !seen.insert(q.key.clone()) {
                continue;
            }
            // Breadth-first up the data inputs: the first linear met is the producer.
            let mut queue = VecDeque::from([v]);
            let mut visited = HashSet::new();
            let mut found = None;
            while let Some(x) = queue.pop_front() {
                if !visited.insert(x) {
                    continue;
                }
                let Some(p) = producer.get(&x) else { continue };
                if matches!(p.kind, OpKind::Conv2d | OpKind::Linear) {
                    let w = p.inputs.get(1).and_then(|&w| program.value(w).symbol.clone());
                    if let Some(w) = w {
                        found = Some(w.strip_suffix(".weight").unwrap_or(&w).to_string());
                        break;
                    }
                }
                queue.extend(p.inputs.iter().copied());
            }
            if let Some(linear) = found {
                out.push(KvPoint { point: q.clone(), linear });
            }
        }
    }
    out
}

/// Whether `pattern` selects linear `name`: a pattern with `*` is a glob over the whole name;
/// without, it names whole dotted segments (`lm_head`, `down_proj`, `model.layers.0`).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    if pattern.contains('*') {
        return glob(pattern.as_bytes(), name.as_bytes());
    }
    name == pattern
        || name.ends_with(&format!(".{pattern}"))
        || name.starts_with(&format!("{pattern}."))
        || name.contains(&format!(".{pattern}."))
}

fn glob(p: &[u8], s: &[u8]) -> bool {
    // Iterative wildcard matching with backtracking to the last `*`.
    let (mut pi, mut si, mut star, mut mark) = (0, 0, None, 0);
    while si < s.len() {
        if pi < p.len() && p[pi] != b'*' && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_dotted_segments_or_glob() {
        assert!(pattern_matches("lm_head", "lm_head"));
        assert!(pattern_matches("down_proj", "model.layers.3.mlp.down_proj"));
        assert!(pattern_matches("model.layers.0", "model.layers.0.self_attn.q_proj"));
        assert!(!pattern_matches("model.layers.1", "model.layers.11.mlp.up_proj"));
        assert!(pattern_matches("model.layers.*.mlp.down_proj", "model.layers.11.mlp.down_proj"));
        assert!(!pattern_matches("model.layers.*.mlp.down_proj", "model.layers.11.mlp.up_proj"));
        assert!(!pattern_matches("proj", "model.layers.0.mlp.up_proj"));
    }
}
