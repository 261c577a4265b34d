//! A context binary's graphs executed on [`TensorValue`]s through any [`QnnExecApi`]: inputs
//! written as client buffers of their data type, outputs read back as values of the graph's
//! output tensors. What the ledger's HTP rows and the per-op comparisons run on Qualcomm's
//! backend; the runtime's chunk model ([`crate::QnnChunkModel`]) has its own, cache-aware path.

use thiserror::Error;

use super::api::ApiError;
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
