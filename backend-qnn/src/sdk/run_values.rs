//! A context binary's graphs executed on [`TensorValue`]s through any [`QnnExecApi`]: inputs
//! written as client buffers of their data type, outputs read back as values of the graph's
//! output tensors. What the ledger's HTP rows and the per-op comparisons run on Qualcomm's
//! backend; the runtime's chunk model ([`crate::QnnChunkModel`]) has its own, cache-aware path.

use std::collections::HashMap;

use thiserror::Error;

use super::api::{ApiError, QnnApi};
use super::config::HtpOptions;
use super::driver::build_context_binary;
use super::exec::{io_element_bytes, read_codes, write_codes, QnnExecApi};
use crate::graph::QnnGraph;
use crate::interp::{InterpError, TensorValue};

/// Why a graph could not be run on values.
#[derive(Debug, Error)]
pub enum RunValuesError {
    #[error("graph `{graph}`: {source}")]
    Api {
        graph: String,
        #[source]
        source: ApiError,
    },
    #[error("graph `{graph}`, tensor `{tensor}`: {detail}")]
    Io { graph: String, tensor: String, detail: String },
    #[error("graph `{graph}`: {source}")]
    Value {
        graph: String,
        #[source]
        source: InterpError,
    },
}

/// Nodes `nodes` of `graph` as their own graph ([`QnnGraph::window`]), built for `options` through
/// `build` (one unshared context) and run once through `exec` on `values`, which must hold every
/// tensor the window reads from outside (e.g. the reference interpreter's `run_all`): the
/// window's last node's outputs as the backend computes them. Cutting a graph this way finds the
/// first node a backend computes differently (how the HTP chunk-8 disagreement was found,
/// `docs/ledger.md`); note a backend may crash instead of returning.
pub fn run_window_on_values(
    build: &mut dyn QnnApi,
    exec: &mut dyn QnnExecApi,
    options: &HtpOptions,
    graph: &QnnGraph,
    nodes: std::ops::Range<usize>,
    values: &HashMap<String, TensorValue>,
) -> Result<Vec<TensorValue>, RunValuesError> {
    let window = graph.window(nodes.clone()).ok_or_else(|| RunValuesError::Io {
        graph: graph.name.clone(),
        tensor: "<nodes>".into(),
        detail: format!("nodes {nodes:?} are not a non-empty range of the graph's {} nodes", graph.nodes.len()),
    })?;
    let inputs = window
        .inputs
        .iter()
        .map(|name| {
            values.get(name).cloned().ok_or_else(|| RunValuesError::Io {
                graph: graph.name.clone(),
                tensor: name.clone(),
                detail: format!("read by nodes {nodes:?} but no value was given"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let build_err =
        |detail: String| RunValuesError::Io { graph: graph.name.clone(), tensor: "<window>".into(), detail };
    let options = HtpOptions { weight_sharing: false, ..*options };
    let binary =
        build_context_binary(std::slice::from_ref(&window), &options, build).map_err(|e| build_err(e.to_string()))?;
    let mut outputs = run_binary_on_values(exec, &binary, &[(&window, &inputs)])?;
    Ok(outputs.remove(0))
}

/// Loads `binary` once, runs each `(graph, inputs)` of `runs` (graphs looked up by name) and frees
/// the context; the outputs of each run, in the graph's output order.
pub fn run_binary_on_values(
    api: &mut dyn QnnExecApi,
    binary: &[u8],
    runs: &[(&QnnGraph, &[TensorValue])],
) -> Result<Vec<Vec<TensorValue>>, RunValuesError> {
    let whole = |source| RunValuesError::Api { graph: "<context>".into(), source };
    let context = api.context_create_from_binary(binary).map_err(whole)?;
    let results: Result<Vec<_>, _> = runs
        .iter()
        .map(|(graph, inputs)| {
            let handle = api
                .graph_retrieve(context, &graph.name)
                .map_err(|source| RunValuesError::Api { graph: graph.name.clone(), source })?;
            run_graph(api, handle, graph, inputs)
        })
        .collect();
    // Free even after a failure; the first error wins.
    let freed = api.context_free(context).map_err(whole);
    let outputs = results?;
    freed?;
    Ok(outputs)
}

/// One execution of `graph` (retrieved as `handle`) on `inputs`, given in binding order.
fn run_graph(
    api: &mut dyn QnnExecApi,
    handle: super::api::GraphHandle,
    graph: &QnnGraph,
    inputs: &[TensorValue],
) -> Result<Vec<TensorValue>, RunValuesError> {
    let io = |tensor: &str, detail: String| RunValuesError::Io {
        graph: graph.name.clone(),
        tensor: tensor.to_string(),
        detail,
    };
    if inputs.len() != graph.inputs.len() {
        let detail = format!("{} inputs given, the graph has {}", inputs.len(), graph.inputs.len());
        return Err(io("<inputs>", detail));
    }
    let meta = |name: &String| graph.tensor(name).ok_or_else(|| io(name, "is not a tensor of the graph".into()));
    let mut input_bytes = Vec::with_capacity(inputs.len());
    for (name, value) in graph.inputs.iter().zip(inputs) {
        let m = meta(name)?;
        if value.dtype != m.dtype || value.dims != m.dims {
            let detail = format!("value is {} {:?}, the tensor {} {:?}", value.dtype, value.dims, m.dtype, m.dims);
            return Err(io(name, detail));
        }
        let codes = value.codes().ok_or_else(|| io(name, "holds no integer codes".into()))?;
        let width = io_element_bytes(m.dtype).ok_or_else(|| io(name, format!("{} is no I/O type", m.dtype)))?;
        let mut bytes = vec![0u8; codes.len() * width];
        write_codes(m.dtype, codes, &mut bytes).ok_or_else(|| io(name, "a code is outside the type".into()))?;
        input_bytes.push(bytes);
    }
    let metas = graph.outputs.iter().map(meta).collect::<Result<Vec<_>, _>>()?;
    let mut outputs = Vec::with_capacity(metas.len());
    for m in &metas {
        let width = io_element_bytes(m.dtype).ok_or_else(|| io(&m.name, format!("{} is no I/O type", m.dtype)))?;
        outputs.push(vec![0u8; m.numel() as usize * width]);
    }
    let input_refs: Vec<&[u8]> = input_bytes.iter().map(Vec::as_slice).collect();
    let mut output_refs: Vec<&mut [u8]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
    api.graph_execute(handle, &input_refs, &mut output_refs)
        .map_err(|source| RunValuesError::Api { graph: graph.name.clone(), source })?;
    metas
        .iter()
        .zip(&outputs)
        .map(|(m, bytes)| {
            let codes = read_codes(m.dtype, bytes).ok_or_else(|| io(&m.name, "output holds no codes".into()))?;
            TensorValue::from_codes(m, codes)
                .map_err(|source| RunValuesError::Value { graph: graph.name.clone(), source })
        })
        .collect()
}
