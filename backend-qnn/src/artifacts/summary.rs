//! A plain-text summary of a graph: ops by type, tensors by role and dtype, static bytes and
//! multiply-accumulates, and its node-by-node [`structure`], for reviewing what a lowering produced.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write;

use crate::dtype::{DataType, TensorType};
use crate::encoding::Encoding;
use crate::graph::{Param, QnnGraph, QnnNode, QnnTensor};
use crate::opdef::OpType;

/// Counts describing one graph. Maps are ordered so the rendering is deterministic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphSummary {
    pub name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub nodes: usize,
    pub ops_by_type: BTreeMap<String, usize>,
    /// `(dtype, tensor type)` -> count, over graph tensors.
    pub tensors_by_dtype: BTreeMap<(String, String), usize>,
    /// dtype -> bytes of static data in graph tensors and tensor params.
    pub static_bytes_by_dtype: BTreeMap<String, u64>,
    pub static_bytes: u64,
    /// Elements of STATIC graph tensors (weights and constants).
    pub parameters: u64,
    /// Multiply-accumulates per run of Conv2d, MatMul and FullyConnected.
    pub macs: u64,
}

/// Multiply-accumulates of one node (0 for ops without a matrix product).
pub fn node_macs(node: &QnnNode, graph: &QnnGraph, index: &HashMap<&str, usize>) -> u64 {
    let tensor = |name: &str| -> Option<&QnnTensor> { index.get(name).map(|&i| &graph.tensors[i]) };
    let dims = |i: usize| -> Vec<u64> {
        node.inputs
            .get(i)
            .and_then(|n| tensor(n))
            .map(|t| t.dims.iter().map(|&d| u64::from(d)).collect())
            .unwrap_or_default()
    };
    let out: Vec<u64> = node
        .outputs
        .first()
        .and_then(|n| tensor(n))
        .map(|t| t.dims.iter().map(|&d| u64::from(d)).collect())
        .unwrap_or_default();
    let numel = |d: &[u64]| d.iter().product::<u64>();
    match node.op_type {
        // Each output element takes kh * kw * Cin/group products.
        OpType::Conv2d => {
            let f = dims(1);
            if f.len() == 4 {
                numel(&out) * f[0] * f[1] * f[2]
            } else {
                0
            }
        }
        // Each output element takes In products.
        OpType::FullyConnected => dims(1).get(1).map_or(0, |k| numel(&out) * k),
        // Each output element takes K products; K is the contracted dim of in[1].
        OpType::MatMul => {
            let b = dims(1);
            let transposed = matches!(
                node.param("transpose_in1"),
                Some(Param::Scalar(s)) if s.as_i64() == Some(1)
            );
            let r = b.len();
            if r < 2 {
                0
            } else {
                numel(&out) * if transposed { b[r - 1] } else { b[r - 2] }
            }
        }
        _ => 0,
    }
}

/// Summarize a (validated) graph.
pub fn summarize(graph: &QnnGraph) -> GraphSummary {
    let index = graph.tensor_index();
    let mut ops_by_type = BTreeMap::new();
    let mut macs = 0;
    let mut static_bytes_by_dtype: BTreeMap<String, u64> = BTreeMap::new();
    for node in &graph.nodes {
        *ops_by_type.entry(node.op_type.as_str().to_string()).or_insert(0) += 1;
        macs += node_macs(node, graph, &index);
        for (_, p) in &node.params {
            if let Param::Tensor(t) = p {
                if let Some(d) = &t.data {
                    *static_bytes_by_dtype.entry(t.dtype.short_name().to_string()).or_insert(0) += d.len() as u64;
                }
            }
        }
    }
    let mut tensors_by_dtype = BTreeMap::new();
    let mut parameters = 0;
    for t in &graph.tensors {
        *tensors_by_dtype
            .entry((t.dtype.short_name().to_string(), t.tensor_type.short_name().to_string()))
            .or_insert(0) += 1;
        if let Some(d) = &t.data {
            *static_bytes_by_dtype.entry(t.dtype.short_name().to_string()).or_insert(0) += d.len() as u64;
        }
        if t.tensor_type == TensorType::Static {
            parameters += t.numel();
        }
    }
    GraphSummary {
        name: graph.name.clone(),
        inputs: graph.inputs.clone(),
        outputs: graph.outputs.clone(),
        nodes: graph.nodes.len(),
        ops_by_type,
        tensors_by_dtype,
        static_bytes: static_bytes_by_dtype.values().sum(),
        static_bytes_by_dtype,
        parameters,
        macs,
    }
}

impl GraphSummary {
    /// Aligned plain text, one fact per line.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "graph: {}", self.name);
        let _ = writeln!(s, "inputs ({}): {}", self.inputs.len(), self.inputs.join(", "));
        let _ = writeln!(s, "outputs ({}): {}", self.outputs.len(), self.outputs.join(", "));
        let _ = writeln!(s, "nodes: {}", self.nodes);
        let _ = writeln!(s, "parameters: {}", self.parameters);
        let _ = writeln!(s, "static bytes: {}", self.static_bytes);
        let _ = writeln!(s, "MACs per run: {}", self.macs);
        let _ = writeln!(s, "\nops by type:");
        for (op, n) in &self.ops_by_type {
            let _ = writeln!(s, "  {op:<24} {n:>6}");
        }
        let _ = writeln!(s, "\ntensors by dtype and role:");
        for ((dtype, role), n) in &self.tensors_by_dtype {
            let _ = writeln!(s, "  {dtype:<20} {role:<12} {n:>6}");
        }
        let _ = writeln!(s, "\nstatic bytes by dtype:");
        for (dtype, bytes) in &self.static_bytes_by_dtype {
            let _ = writeln!(s, "  {dtype:<20} {bytes:>12}");
        }
        s
    }
}

/// A graph's structure for review: [`GraphSummary::render`], then one line per node in order —
/// its outputs (dtype, dims, encoding kind), op type, inputs (static ones with dtype, dims and
/// encoding kind) and params (small integer tensors by value). Scales and weights are left out:
/// they come from calibration and are checked by numbers, not by reading.
pub fn structure(graph: &QnnGraph) -> String {
    let mut out = summarize(graph).render();
    out.push_str("\nnodes:\n");
    let index = graph.tensor_index();
    let tensor = |name: &str| index.get(name).map(|&i| &graph.tensors[i]);
    for n in &graph.nodes {
        let outs: Vec<String> = n
            .outputs
            .iter()
            .map(|o| match tensor(o) {
                Some(t) => format!("{o} [{} {:?} {}]", t.dtype, t.dims, encoding_kind(&t.encoding)),
                None => o.clone(),
            })
            .collect();
        let ins: Vec<String> = n
            .inputs
            .iter()
            .map(|i| match tensor(i) {
                Some(t) if t.tensor_type == TensorType::Static => {
                    format!("{i}: {} {:?} {}", t.dtype, t.dims, encoding_kind(&t.encoding))
                }
                _ => i.clone(),
            })
            .collect();
        let params: Vec<String> = n.params.iter().map(|(name, p)| format!("{name}={}", param_text(p))).collect();
        let params = if params.is_empty() { String::new() } else { format!(" {{{}}}", params.join(", ")) };
        let _ = writeln!(out, "{} = {}({}){params}", outs.join(", "), n.op_type.as_str(), ins.join(", "));
    }
    out
}

/// An encoding's kind and layout, without its scales.
pub fn encoding_kind(e: &Encoding) -> String {
    match e {
        Encoding::Undefined => "-".into(),
        Encoding::ScaleOffset(so) if so.offset == -128 => "sym8".into(),
        Encoding::ScaleOffset(_) => "scale_offset".into(),
        Encoding::AxisScaleOffset { axis, .. } => format!("axis_scale_offset(axis {axis})"),
        Encoding::BlockwiseExpansion(bw) => format!("lpbq(axis {}, {} blocks)", bw.axis, bw.num_blocks_per_axis),
    }
}

/// A param as written in [`structure`]: a scalar's value; a static tensor's values when it is a
/// small integer tensor (shapes, permutations, paddings), else its dtype and dims.
fn param_text(p: &Param) -> String {
    match p {
        Param::Scalar(s) => match (s.as_i64(), s.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => format!("{f:?}"),
            (None, None) => format!("{s:?}"),
        },
        Param::Tensor(t) => {
            let ints = |width: usize, signed: bool| -> Option<Vec<i64>> {
                let d = t.data.as_ref()?.bytes();
                (d.len() % width == 0 && d.len() / width <= 16).then(|| {
                    d.chunks(width)
                        .map(|c| match (width, signed) {
                            (4, true) => i32::from_le_bytes(c.try_into().unwrap()).into(),
                            (4, false) => u32::from_le_bytes(c.try_into().unwrap()).into(),
                            _ => 0,
                        })
                        .collect()
                })
            };
            let values = match t.dtype {
                DataType::Int32 => ints(4, true),
                DataType::UInt32 => ints(4, false),
                _ => None,
            };
            match values {
                Some(v) => format!("{v:?}"),
                None => format!("<{} {:?}>", t.dtype, t.dims),
            }
        }
    }
}
