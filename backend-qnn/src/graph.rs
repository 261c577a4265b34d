//! An owned model of one lowered QNN graph: tensors, nodes, ordered inputs and outputs.
//!
//! The model mirrors what the QNN C API receives (`QnnTypes.h`, `QnnInterface.h`): tensors carry their
//! `Qnn_TensorType_t`, `Qnn_DataType_t`, dims and quantization encoding; nodes carry the op
//! package, op type, named params (scalar or static tensor) and *positional* input/output tensor
//! names. Graph inputs/outputs are ordered because the runtime binds them by position
//! (mllm/backends/qnn/aot/QnnWrappersAPI.cpp).
//!
//! Static data is held by reference count ([`StaticData`]) so the prefill and decode graphs of one
//! context can point at the same weight bytes without copies (they share weights by name, mllm/backends/qnn/aot/QnnWrappersAPI.cpp).
//!
//! [`GraphBuilder`] is the construction API a lowering pass uses; `finish` validates.

use std::collections::HashMap;
use std::sync::Arc;

use crate::dtype::{DataType, TensorType};
use crate::encoding::{Encoding, Int4Storage};
use crate::opdef::OpType;
use crate::validate::{validate, ValidationError};

/// The op package of every built-in QNN op.
pub const QNN_OP_PACKAGE: &str = "qti.aisw";

/// Immutable bytes of a static tensor, shared by reference count.
///
/// Cloning never copies bytes, so graphs that share a weight share one buffer, and the SDK
/// layer keeps a clone alive while QNN may read it. Anything that derefs to bytes can back it
/// (a `Vec<u8>`, an `Arc<[u8]>`, a memory map, ...).
#[derive(Clone)]
pub struct StaticData(Arc<dyn AsRef<[u8]> + Send + Sync>);

impl StaticData {
    /// Wraps an owner of bytes without copying them.
    pub fn new(owner: impl AsRef<[u8]> + Send + Sync + 'static) -> StaticData {
        StaticData(Arc::new(owner))
    }

    /// Little-endian f32 values.
    pub fn from_f32(values: &[f32]) -> StaticData {
        StaticData::new(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
    }

    /// Little-endian u16 values (uint16 fixed-point codes).
    pub fn from_u16(values: &[u16]) -> StaticData {
        StaticData::new(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
    }

    /// Little-endian i32 values.
    pub fn from_i32(values: &[i32]) -> StaticData {
        StaticData::new(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
    }

    /// Little-endian u32 values.
    pub fn from_u32(values: &[u32]) -> StaticData {
        StaticData::new(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
    }

    /// The bytes, in QNN's dense row-major layout.
    pub fn bytes(&self) -> &[u8] {
        (*self.0).as_ref()
    }

    pub fn len(&self) -> usize {
        self.bytes().len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes().is_empty()
    }

    /// True when both refer to the same buffer (shared weights).
    pub fn shares_buffer_with(&self, other: &StaticData) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for StaticData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StaticData({} bytes)", self.len())
    }
}

/// Equal bytes; a shared buffer is equal without comparing them.
impl PartialEq for StaticData {
    fn eq(&self, other: &StaticData) -> bool {
        self.shares_buffer_with(other) || self.bytes() == other.bytes()
    }
}

impl Eq for StaticData {}

/// One tensor of a graph (or of a tensor param).
#[derive(Clone, Debug, PartialEq)]
pub struct QnnTensor {
    pub name: String,
    pub tensor_type: TensorType,
    pub dtype: DataType,
    pub dims: Vec<u32>,
    pub encoding: Encoding,
    /// Present exactly for `STATIC` tensors.
    pub data: Option<StaticData>,
}

impl QnnTensor {
    pub fn new(
        name: impl Into<String>,
        tensor_type: TensorType,
        dtype: DataType,
        dims: &[u32],
        encoding: Encoding,
    ) -> QnnTensor {
        QnnTensor { name: name.into(), tensor_type, dtype, dims: dims.to_vec(), encoding, data: None }
    }

    /// A `STATIC` tensor with data.
    pub fn new_static(
        name: impl Into<String>,
        dtype: DataType,
        dims: &[u32],
        encoding: Encoding,
        data: StaticData,
    ) -> QnnTensor {
        QnnTensor { data: Some(data), ..QnnTensor::new(name, TensorType::Static, dtype, dims, encoding) }
    }

    pub fn rank(&self) -> usize {
        self.dims.len()
    }

    pub fn numel(&self) -> u64 {
        self.dims.iter().map(|&d| u64::from(d)).product()
    }
}

/// `Qnn_Scalar_t`: a typed scalar param.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    Bool8(bool),
    Int8(i8),
    Int16(i16),
    Int32(i32),
    Int64(i64),
    UInt8(u8),
    UInt16(u16),
    UInt32(u32),
    UInt64(u64),
    Float32(f32),
    Float64(f64),
}

impl Scalar {
    pub fn dtype(&self) -> DataType {
        match self {
            Scalar::Bool8(_) => DataType::Bool8,
            Scalar::Int8(_) => DataType::Int8,
            Scalar::Int16(_) => DataType::Int16,
            Scalar::Int32(_) => DataType::Int32,
            Scalar::Int64(_) => DataType::Int64,
            Scalar::UInt8(_) => DataType::UInt8,
            Scalar::UInt16(_) => DataType::UInt16,
            Scalar::UInt32(_) => DataType::UInt32,
            Scalar::UInt64(_) => DataType::UInt64,
            Scalar::Float32(_) => DataType::Float32,
            Scalar::Float64(_) => DataType::Float64,
        }
    }

    /// The value as an integer, for integer and bool scalars.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Scalar::Bool8(b) => i64::from(b),
            Scalar::Int8(v) => v.into(),
            Scalar::Int16(v) => v.into(),
            Scalar::Int32(v) => v.into(),
            Scalar::Int64(v) => v,
            Scalar::UInt8(v) => v.into(),
            Scalar::UInt16(v) => v.into(),
            Scalar::UInt32(v) => v.into(),
            Scalar::UInt64(v) => i64::try_from(v).ok()?,
            Scalar::Float32(_) | Scalar::Float64(_) => return None,
        })
    }

    /// The value as a float, for float scalars.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Scalar::Float32(v) => Some(v.into()),
            Scalar::Float64(v) => Some(v),
            _ => None,
        }
    }
}

/// `Qnn_Param_t`: a named op parameter.
#[derive(Clone, Debug, PartialEq)]
pub enum Param {
    Scalar(Scalar),
    /// Must be a `STATIC` tensor.
    Tensor(QnnTensor),
}

/// One op instance.
#[derive(Clone, Debug, PartialEq)]
pub struct QnnNode {
    pub name: String,
    pub package: String,
    pub op_type: OpType,
    /// Named, unordered in QNN; kept in insertion order for deterministic output.
    pub params: Vec<(String, Param)>,
    /// Positional input tensor names.
    pub inputs: Vec<String>,
    /// Positional output tensor names.
    pub outputs: Vec<String>,
}

impl QnnNode {
    pub fn param(&self, name: &str) -> Option<&Param> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, p)| p)
    }
}

/// One QNN graph, as handed to `graphCreate` + `tensorCreateGraphTensor` + `graphAddNode`.
#[derive(Clone, Debug, PartialEq)]
pub struct QnnGraph {
    pub name: String,
    /// Graph tensors (inputs, outputs, intermediates, weights); param tensors live in their node.
    pub tensors: Vec<QnnTensor>,
    /// Nodes in dependency order.
    pub nodes: Vec<QnnNode>,
    /// `APP_WRITE` tensors in binding order.
    pub inputs: Vec<String>,
    /// `APP_READ` tensors in binding order.
    pub outputs: Vec<String>,
    /// Byte layout of 4-bit static data in this graph.
    pub int4_storage: Int4Storage,
}

impl QnnGraph {
    /// The sub-graph of `nodes` (a range of this graph's nodes, in order), for comparing a part
    /// of a graph on a backend with a reference: tensors the range reads but does not produce
    /// become its inputs (`APP_WRITE`, in order of first use; statics stay static), the last
    /// node's outputs its outputs (`APP_READ`), everything else `NATIVE`. A range starting at 0
    /// is the graph cut after its last node. `None` for an empty or out-of-range `nodes`.
    pub fn window(&self, nodes: std::ops::Range<usize>) -> Option<QnnGraph> {
        let picked = self.nodes.get(nodes)?;
        let last = picked.last()?;
        let produced: std::collections::HashSet<&String> = picked.iter().flat_map(|n| &n.outputs).collect();
        let index = self.tensor_index();
        let mut seen = std::collections::HashSet::new();
        let mut window = QnnGraph {
            name: self.name.clone(),
            tensors: Vec::new(),
            nodes: picked.to_vec(),
            inputs: Vec::new(),
            outputs: last.outputs.clone(),
            int4_storage: self.int4_storage,
        };
        for name in picked.iter().flat_map(|n| n.inputs.iter().chain(&n.outputs)) {
            let Some(&i) = index.get(name.as_str()).filter(|_| seen.insert(name)) else { continue };
            let mut t = self.tensors[i].clone();
            if t.tensor_type != TensorType::Static {
                t.tensor_type = if !produced.contains(name) {
                    window.inputs.push(name.clone());
                    TensorType::AppWrite
                } else if last.outputs.contains(name) {
                    TensorType::AppRead
                } else {
                    TensorType::Native
                };
            }
            window.tensors.push(t);
        }
        Some(window)
    }

    /// An index from tensor name to position in `tensors` (first occurrence wins).
    pub fn tensor_index(&self) -> HashMap<&str, usize> {
        let mut index = HashMap::with_capacity(self.tensors.len());
        for (i, t) in self.tensors.iter().enumerate() {
            index.entry(t.name.as_str()).or_insert(i);
        }
        index
    }

    /// Linear lookup; use [`QnnGraph::tensor_index`] for many lookups.
    pub fn tensor(&self, name: &str) -> Option<&QnnTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Total bytes of static data in graph tensors and tensor params.
    pub fn static_bytes(&self) -> u64 {
        self.tensors_and_params().filter_map(|t| t.data.as_ref()).map(|d| d.len() as u64).sum()
    }

    /// The graph's tensors and its nodes' tensor params: every tensor that may carry static data.
    pub fn tensors_and_params(&self) -> impl Iterator<Item = &QnnTensor> {
        let params = self.nodes.iter().flat_map(|n| &n.params).filter_map(|(_, p)| match p {
            Param::Tensor(t) => Some(t),
            Param::Scalar(_) => None,
        });
        self.tensors.iter().chain(params)
    }

    /// [`Self::tensors_and_params`], mutable.
    pub fn tensors_and_params_mut(&mut self) -> impl Iterator<Item = &mut QnnTensor> {
        let params = self.nodes.iter_mut().flat_map(|n| &mut n.params).filter_map(|(_, p)| match p {
            Param::Tensor(t) => Some(t),
            Param::Scalar(_) => None,
        });
        self.tensors.iter_mut().chain(params)
    }
}

/// A tensor name handed back by the builder.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorRef(pub String);

impl AsRef<str> for TensorRef {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TensorRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Incremental graph construction for a lowering pass. Nothing is checked until
/// [`GraphBuilder::finish`], which runs the full validator.
#[derive(Debug)]
pub struct GraphBuilder {
    graph: QnnGraph,
    index: HashMap<String, usize>,
}

impl GraphBuilder {
    pub fn new(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder {
            graph: QnnGraph {
                name: name.into(),
                tensors: Vec::new(),
                nodes: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
                int4_storage: Int4Storage::default(),
            },
            index: HashMap::new(),
        }
    }

    /// Choose the 4-bit static-data convention (default [`Int4Storage::LowNibble`]).
    pub fn int4_storage(mut self, storage: Int4Storage) -> GraphBuilder {
        self.graph.int4_storage = storage;
        self
    }

    fn push_tensor(&mut self, tensor: QnnTensor) -> TensorRef {
        let name = tensor.name.clone();
        self.index.entry(name.clone()).or_insert(self.graph.tensors.len());
        self.graph.tensors.push(tensor);
        TensorRef(name)
    }

    /// A graph input (`APP_WRITE`), appended to the input binding order.
    pub fn input(&mut self, name: impl Into<String>, dtype: DataType, dims: &[u32], encoding: Encoding) -> TensorRef {
        let r = self.push_tensor(QnnTensor::new(name, TensorType::AppWrite, dtype, dims, encoding));
        self.graph.inputs.push(r.0.clone());
        r
    }

    /// A weight or constant (`STATIC`).
    pub fn static_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DataType,
        dims: &[u32],
        encoding: Encoding,
        data: StaticData,
    ) -> TensorRef {
        self.push_tensor(QnnTensor::new_static(name, dtype, dims, encoding, data))
    }

    /// Add an already built tensor (any type). Inputs/outputs are not registered.
    pub fn tensor(&mut self, tensor: QnnTensor) -> TensorRef {
        self.push_tensor(tensor)
    }

    /// Start a node of `op_type` in package `qti.aisw`.
    pub fn node(&mut self, name: impl Into<String>, op_type: OpType) -> NodeBuilder<'_> {
        NodeBuilder {
            builder: self,
            node: QnnNode {
                name: name.into(),
                package: QNN_OP_PACKAGE.to_string(),
                op_type,
                params: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
        }
    }

    /// Turn a node output into a graph output (`APP_READ`) at the end of the output order.
    /// Unknown names are kept and reported by validation.
    pub fn mark_output(&mut self, tensor: impl AsRef<str>) {
        let name = tensor.as_ref();
        if let Some(&i) = self.index.get(name) {
            let t = &mut self.graph.tensors[i];
            if t.tensor_type == TensorType::Native {
                t.tensor_type = TensorType::AppRead;
            }
        }
        self.graph.outputs.push(name.to_string());
    }

    /// The tensor registered under `name`, if any.
    pub fn get(&self, name: &str) -> Option<&QnnTensor> {
        self.index.get(name).map(|&i| &self.graph.tensors[i])
    }

    /// Validate and return the graph.
    pub fn finish(self) -> Result<QnnGraph, ValidationError> {
        validate(&self.graph)?;
        Ok(self.graph)
    }

    /// Return the graph without validating (for tests of the validator itself).
    pub fn finish_unchecked(self) -> QnnGraph {
        self.graph
    }
}

/// Builds one node; `finish` appends it to the graph and returns its outputs.
#[derive(Debug)]
pub struct NodeBuilder<'b> {
    builder: &'b mut GraphBuilder,
    node: QnnNode,
}

impl NodeBuilder<'_> {
    /// Next positional input.
    pub fn input(mut self, tensor: impl AsRef<str>) -> Self {
        self.node.inputs.push(tensor.as_ref().to_string());
        self
    }

    /// Several positional inputs.
    pub fn inputs<I, S>(mut self, tensors: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.node.inputs.extend(tensors.into_iter().map(|t| t.as_ref().to_string()));
        self
    }

    /// A scalar param.
    pub fn scalar(mut self, name: &str, value: Scalar) -> Self {
        self.node.params.push((name.to_string(), Param::Scalar(value)));
        self
    }

    /// A tensor param with explicit dtype and bytes, named `<node>.<param>` (mllm's convention).
    pub fn tensor_param(mut self, name: &str, dtype: DataType, dims: &[u32], data: StaticData) -> Self {
        let tensor =
            QnnTensor::new_static(format!("{}.{}", self.node.name, name), dtype, dims, Encoding::Undefined, data);
        self.node.params.push((name.to_string(), Param::Tensor(tensor)));
        self
    }

    /// A `UINT_32` tensor param.
    pub fn tensor_param_u32(self, name: &str, dims: &[u32], values: &[u32]) -> Self {
        self.tensor_param(name, DataType::UInt32, dims, StaticData::from_u32(values))
    }

    /// An `INT_32` tensor param.
    pub fn tensor_param_i32(self, name: &str, dims: &[u32], values: &[i32]) -> Self {
        self.tensor_param(name, DataType::Int32, dims, StaticData::from_i32(values))
    }

    /// Next positional output, created as a `NATIVE` tensor.
    pub fn output(mut self, name: impl Into<String>, dtype: DataType, dims: &[u32], encoding: Encoding) -> Self {
        let r = self.builder.push_tensor(QnnTensor::new(name, TensorType::Native, dtype, dims, encoding));
        self.node.outputs.push(r.0);
        self
    }

    /// Next positional output, created as a graph output (`APP_READ`) and appended to the
    /// output order.
    pub fn graph_output(mut self, name: impl Into<String>, dtype: DataType, dims: &[u32], encoding: Encoding) -> Self {
        let r = self.builder.push_tensor(QnnTensor::new(name, TensorType::AppRead, dtype, dims, encoding));
        self.builder.graph.outputs.push(r.0.clone());
        self.node.outputs.push(r.0);
        self
    }

    /// Append the node; returns its outputs in order.
    pub fn finish(self) -> Vec<TensorRef> {
        let outputs = self.node.outputs.iter().cloned().map(TensorRef).collect();
        self.builder.graph.nodes.push(self.node);
        outputs
    }

    /// Append a single-output node and return that output.
    pub fn finish_one(self) -> TensorRef {
        let first = self.node.outputs.first().cloned().unwrap_or_default();
        self.builder.graph.nodes.push(self.node);
        TensorRef(first)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_records_io_order_types_and_param_names() {
        let mut b = GraphBuilder::new("g");
        let x = b.input("x", DataType::Float32, &[1, 4], Encoding::Undefined);
        let y = b.input("y", DataType::Float32, &[1, 4], Encoding::Undefined);
        let sum = b
            .node("add", OpType::ElementWiseAdd)
            .input(&x)
            .input(&y)
            .output("sum", DataType::Float32, &[1, 4], Encoding::Undefined)
            .finish_one();
        let t = b
            .node("t", OpType::Transpose)
            .input(&sum)
            .tensor_param_u32("perm", &[2], &[1, 0])
            .output("t_out", DataType::Float32, &[4, 1], Encoding::Undefined)
            .finish_one();
        b.mark_output(&t);
        b.mark_output(&sum);
        let g = b.finish().unwrap();
        assert_eq!(g.inputs, vec!["x", "y"]);
        assert_eq!(g.outputs, vec!["t_out", "sum"]);
        assert_eq!(g.tensor("sum").unwrap().tensor_type, TensorType::AppRead);
        let Some(Param::Tensor(perm)) = g.nodes[1].param("perm") else { panic!("perm missing") };
        assert_eq!(perm.name, "t.perm");
        assert_eq!(perm.tensor_type, TensorType::Static);
        assert_eq!(g.nodes[0].package, "qti.aisw");
    }

    #[test]
    fn static_data_is_shared_between_graphs() {
        let weight = StaticData::from_f32(&[1.0, 2.0]);
        let mut graphs = Vec::new();
        for name in ["s32", "s1"] {
            let mut b = GraphBuilder::new(name);
            b.static_tensor("w", DataType::Float32, &[2], Encoding::Undefined, weight.clone());
            graphs.push(b.finish_unchecked());
        }
        let a = graphs[0].tensors[0].data.as_ref().unwrap();
        let c = graphs[1].tensors[0].data.as_ref().unwrap();
        assert!(a.shares_buffer_with(c));
        assert_eq!(graphs[0].static_bytes(), 8);
    }

    #[test]
    fn a_window_reads_what_it_does_not_produce_and_outputs_its_last_node() {
        let mut b = GraphBuilder::new("g");
        let x = b.input("x", DataType::Float32, &[1, 4], Encoding::Undefined);
        let w = b.static_tensor("w", DataType::Float32, &[1, 4], Encoding::Undefined, StaticData::from_f32(&[1.0; 4]));
        let f = DataType::Float32;
        let a = b.node("a", OpType::ElementWiseAdd).input(&x).input(&w).output("a", f, &[1, 4], Encoding::Undefined);
        let a = a.finish_one();
        let n = b.node("n", OpType::ElementWiseNeg).input(&a).output("n", f, &[1, 4], Encoding::Undefined).finish_one();
        let m =
            b.node("m", OpType::ElementWiseMultiply).input(&n).input(&a).output("m", f, &[1, 4], Encoding::Undefined);
        let m = m.finish_one();
        b.mark_output(&m);
        let g = b.finish().unwrap();
        let tail = g.window(1..3).unwrap();
        assert_eq!((tail.inputs.as_slice(), tail.outputs.as_slice()), (&["a".to_string()][..], &["m".to_string()][..]));
        let types: Vec<_> = tail.tensors.iter().map(|t| (t.name.as_str(), t.tensor_type)).collect();
        assert_eq!(types, [("a", TensorType::AppWrite), ("n", TensorType::Native), ("m", TensorType::AppRead)]);
        let head = g.window(0..1).unwrap();
        assert_eq!((head.inputs.as_slice(), head.outputs.as_slice()), (&["x".to_string()][..], &["a".to_string()][..]));
        assert_eq!(head.tensor("w").unwrap().tensor_type, TensorType::Static);
        validate(&head).unwrap();
        validate(&tail).unwrap();
        assert!(g.window(2..2).is_none() && g.window(2..9).is_none());
    }

    #[test]
    fn scalar_accessors() {
        assert_eq!(Scalar::Bool8(true).as_i64(), Some(1));
        assert_eq!(Scalar::UInt32(7).dtype(), DataType::UInt32);
        assert_eq!(Scalar::Float32(0.5).as_f64(), Some(0.5));
        assert_eq!(Scalar::Float32(0.5).as_i64(), None);
    }
}
