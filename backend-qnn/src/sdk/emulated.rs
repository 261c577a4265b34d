//! [`EmulatedHtp`]: the CPU stand-in for the QNN SDK's HTP emulation, behind [`QnnExecApi`].
//!
//! With the SDK, `libQnnHtp.so` on x86 loads a context binary and executes its graphs in
//! software. CI has no SDK, so this implementation executes the *lowered graphs the binary was
//! built from* with the crate's reference interpreter ([`crate::interp`]: integer tensors in
//! their encodings, LPBQ weights expanded as encoded). It takes the same client buffers, in the
//! same binding order, as `graphExecute`, so the runtime above it ([`crate::QnnChunkModel`]) is
//! the code that would drive the SDK.
//!
//! The context binaries it accepts are those the recording API (and the clean-room mock
//! provider) serialize: a listing of graph names, node counts and I/O
//! ([`super::render::parse_fake_context_binary`]). On
//! [`context_create_from_binary`](QnnExecApi::context_create_from_binary) every graph the
//! binary lists must be one of the held graphs with exactly the listed node count and I/O
//! (names, types, shapes, encodings, binding order; tensor ids aside), so a binary from other graphs is refused rather
//! than silently run with the wrong weights.

use std::collections::HashMap;

use super::api::{ApiError, ContextHandle, GraphHandle};
use super::exec::{io_element_bytes, read_codes, read_f32, write_codes, QnnExecApi};
use super::render::{parse_fake_context_binary, FakeGraph, FAKE_BINARY_MAGIC};
use crate::dtype::DataType;
use crate::graph::QnnGraph;
use crate::interp::{InterpError, Interpreter, TensorValue, Values};
use crate::io::{GraphIo, IoTensor};

/// Executes lowered graphs on the CPU as the HTP backend would execute the context binary
/// built from them.
#[derive(Debug)]
pub struct EmulatedHtp {
    graphs: Vec<QnnGraph>,
    /// Live contexts: the indices (into `graphs`) of the graphs each one holds.
    contexts: HashMap<u32, Vec<usize>>,
    /// Retrieved graphs: (context, index into `graphs`).
    handles: HashMap<u32, (u32, usize)>,
    next_handle: u32,
}

impl EmulatedHtp {
    /// An emulator for context binaries built from `graphs` (each is validated here).
    pub fn new(graphs: Vec<QnnGraph>) -> Result<EmulatedHtp, InterpError> {
        for g in &graphs {
            Interpreter::new(g)?;
        }
        Ok(EmulatedHtp { graphs, contexts: HashMap::new(), handles: HashMap::new(), next_handle: 1 })
    }

    /// The graphs this emulator can execute.
    pub fn graphs(&self) -> &[QnnGraph] {
        &self.graphs
    }

    fn issue(&mut self) -> u32 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// The binary listing of `graph` as the recording API serializes it, without the ids: they
    /// depend on the build's creation order, not on the graph.
    fn listing(graph: &QnnGraph) -> FakeGraph {
        let io =
            |names: &[String]| names.iter().filter_map(|n| graph.tensor(n)).map(|t| IoTensor::of(t, None)).collect();
        FakeGraph {
            io: GraphIo { name: graph.name.clone(), inputs: io(&graph.inputs), outputs: io(&graph.outputs) },
            nodes: graph.nodes.len() as u32,
        }
    }
}

fn refuse(function: &'static str, reason: impl Into<String>) -> ApiError {
    ApiError::InvalidArgument { function, reason: reason.into() }
}

impl QnnExecApi for EmulatedHtp {
    fn context_create_from_binary(&mut self, binary: &[u8]) -> Result<ContextHandle, ApiError> {
        const F: &str = "contextCreateFromBinary";
        let listed = parse_fake_context_binary(binary).ok_or_else(|| {
            refuse(F, format!("not a context binary this emulator reads (no `{FAKE_BINARY_MAGIC}` listing)"))
        })?;
        let mut held = Vec::new();
        for graph in listed {
            let graph = FakeGraph { io: graph.io.without_ids(), ..graph };
            let index = self.graphs.iter().position(|g| g.name == graph.io.name).ok_or_else(|| {
                refuse(
                    F,
                    format!(
                        "the binary holds graph `{}`, which this emulator was not given (it was given {:?})",
                        graph.io.name,
                        self.graphs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>()
                    ),
                )
            })?;
            if graph != Self::listing(&self.graphs[index]) {
                return Err(refuse(
                    F,
                    format!("the binary's graph `{}` differs from the given graph (node count or I/O)", graph.io.name),
                ));
            }
            held.push(index);
        }
        let handle = self.issue();
        self.contexts.insert(handle, held);
        Ok(ContextHandle(handle))
    }

    fn graph_retrieve(&mut self, context: ContextHandle, name: &str) -> Result<GraphHandle, ApiError> {
        const F: &str = "graphRetrieve";
        let held = self.contexts.get(&context.0).ok_or_else(|| refuse(F, format!("no live context {context}")))?;
        let index = held
            .iter()
            .copied()
            .find(|&i| self.graphs[i].name == name)
            .ok_or_else(|| refuse(F, format!("{context} has no graph `{name}`")))?;
        let handle = self.issue();
        self.handles.insert(handle, (context.0, index));
        Ok(GraphHandle(handle))
    }

    fn graph_execute(
        &mut self,
        graph: GraphHandle,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), ApiError> {
        const F: &str = "graphExecute";
        let &(_, index) = self.handles.get(&graph.0).ok_or_else(|| refuse(F, format!("no retrieved graph {graph}")))?;
        let g = &self.graphs[index];
        if inputs.len() != g.inputs.len() || outputs.len() != g.outputs.len() {
            return Err(refuse(
                F,
                format!(
                    "graph `{}` binds {} inputs and {} outputs, {} and {} buffers were given",
                    g.name,
                    g.inputs.len(),
                    g.outputs.len(),
                    inputs.len(),
                    outputs.len()
                ),
            ));
        }
        let mut values = Vec::with_capacity(inputs.len());
        for (name, bytes) in g.inputs.iter().zip(inputs) {
            let meta = g.tensor(name).ok_or_else(|| refuse(F, format!("input `{name}` is not a tensor")))?;
            let expected = io_element_bytes(meta.dtype).map(|n| n as u64 * meta.numel());
            if expected != Some(bytes.len() as u64) {
                return Err(refuse(F, format!("input `{name}`: {} bytes, expected {expected:?}", bytes.len())));
            }
            let value = match meta.dtype {
                DataType::Float32 => TensorValue::from_real(meta, &read_f32(bytes)),
                dtype => {
                    let codes = read_codes(dtype, bytes)
                        .ok_or_else(|| refuse(F, format!("input `{name}`: {dtype} buffers are not supported")))?;
                    TensorValue::from_codes(meta, codes)
                }
            };
            values.push(value.map_err(|e| refuse(F, format!("input `{name}`: {e}")))?);
        }
        let interp = Interpreter::new(g).map_err(|e| ApiError::Backend { function: F, reason: e.to_string() })?;
        let results = interp
            .run(&values)
            .map_err(|e| ApiError::Backend { function: F, reason: format!("graph `{}`: {e}", g.name) })?;
        for ((name, value), out) in g.outputs.iter().zip(results).zip(outputs.iter_mut()) {
            let written = match &value.values {
                Values::Codes(codes) => write_codes(value.dtype, codes, out),
                Values::Real(v) if value.dtype == DataType::Float32 && out.len() == v.len() * 4 => {
                    for (x, dst) in v.iter().zip(out.chunks_exact_mut(4)) {
                        dst.copy_from_slice(&x.to_le_bytes());
                    }
                    Some(())
                }
                Values::Real(_) => None,
            };
            written.ok_or_else(|| {
                refuse(
                    F,
                    format!(
                        "output `{name}`: a buffer of {} bytes cannot hold {} {}",
                        out.len(),
                        value.numel(),
                        value.dtype
                    ),
                )
            })?;
        }
        Ok(())
    }

    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError> {
        if self.contexts.remove(&context.0).is_none() {
            return Err(refuse("contextFree", format!("no live context {context}")));
        }
        self.handles.retain(|_, (c, _)| *c != context.0);
        Ok(())
    }
}
