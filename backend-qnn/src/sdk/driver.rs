//! [`build_context_binary`]: the compile-side call sequence, written once against [`QnnApi`].
//!
//! The order follows mllm's QNN AOT environment (mllm's QnnAOTEnv):
//!
//! 1. `logCreate` (optional) → `backendCreate` → `deviceCreate(device configs)` →
//!    `contextCreate(weight sharing)`: ONE context for all graphs.
//! 2. Per graph, in the given order (e.g. `model.0.s32` then `model.0.s1`):
//!    `graphCreate(graph configs)`; graph inputs then graph outputs are created first, in
//!    their declared order (the runtime binds I/O positionally in creation order); then per
//!    node: tensors on first use (inputs, then outputs), the node's parameter tensors, then
//!    `backendValidateOpConfig` and `graphAddNode`; finally `graphFinalize`.
//!    Every graph creates its own STATIC tensors: QNN tensor ids belong to one graph (Qualcomm's
//!    HTP backend rejects a node naming another graph's tensor with "Did not find registered
//!    tensor"). Prefill and decode graphs share weights through the context's weight-sharing
//!    config, under which the backend stores STATIC tensors of the same name once.
//!    The backend copies static data when a tensor is created, so [`build_context_binary_owned`]
//!    drops each graph's handles on it once the graph's nodes are added, before `graphFinalize`
//!    (QAIRT 2.51's HTP backend refuses `tensorCreateContextTensor`, "unsupported", so shared
//!    weights cannot be created once for the whole context instead).
//! 3. `contextGetBinarySize` → `contextGetBinary`.
//! 4. `contextFree` → `deviceFree` → `backendFree` → `logFree`, also after a failure.
//!
//! Everything that can be checked without a backend (names, tensors, I/O lists,
//! dependency order, conflicting shared weights) is checked before the first call, so bad
//! input never leaves a half-built context behind.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use thiserror::Error;

use super::api::{
    ApiError, BackendHandle, BoundParam, BoundParamValue, BoundTensor, ContextHandle, DeviceHandle, GraphHandle,
    LogHandle, OpConfig, QnnApi, TensorId,
};
use super::check::{check_c_name, NameError, TensorError};
use super::config::{HtpOptions, OptionsError};
use crate::dtype::TensorType;
use crate::graph::{Param, QnnGraph, QnnNode, QnnTensor};
use crate::opdef::OpType;

/// Why a context binary could not be built.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum BuildError {
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// A graph is inconsistent; nothing was sent to QNN.
    #[error("graph `{graph}`: {problem}")]
    InvalidGraph { graph: String, problem: Box<GraphProblem> },
    /// A tensor is invalid; nothing was sent to QNN.
    #[error("graph `{graph}`: {source}")]
    InvalidTensor { graph: String, source: TensorError },
    /// `backendValidateOpConfig` refused a node.
    #[error("QNN rejected node `{node}` ({op_type}) of graph `{graph}`: {source}")]
    NodeRejected { graph: String, node: String, op_type: OpType, source: ApiError },
    /// Any other call failed; `step` says what was being done.
    #[error("{step}: {source}")]
    Api { step: String, source: ApiError },
    /// The announced binary size does not fit in this process's address space.
    #[error("contextGetBinarySize reported {size} bytes, more than this process can address")]
    BinaryTooLarge { size: u64 },
    /// The backend wrote more than it announced.
    #[error("contextGetBinary reported {written} bytes written into a buffer of {size}")]
    BinaryOverrun { size: u64, written: u64 },
}

/// Builds one QNN context holding `graphs` for `target` and returns its serialized binary.
///
/// All graphs share one context (with `weight_sharing`, the backend stores STATIC tensors of
/// the same name once; each graph still creates its own, see the module docs). Handles are freed before returning, on success and
/// on failure; after a failure the first error is returned and cleanup errors are dropped,
/// since the context is being discarded anyway.
pub fn build_context_binary(
    graphs: &[QnnGraph],
    target: &HtpOptions,
    api: &mut dyn QnnApi,
) -> Result<Vec<u8>, BuildError> {
    build(Cow::Borrowed(graphs), target, api)
}

/// [`build_context_binary`] taking the graphs by value, so that their STATIC data can go
/// early: each graph's handles on its static bytes are dropped as soon as its nodes are added,
/// before its `graphFinalize`. The backend copies static data when a tensor is created
/// (`QnnTensor_createGraphTensor`: "This data will be copied, and may be safely de-allocated
/// after this call returns"), so the bytes are freed once no later graph still holds them: a
/// weight shared by prefill and decode lives until the decode graph has created it. Callers
/// that keep no other handle on the data (the compile bench, which hands over the lowered graphs)
/// thus hold none of it while the backend finalizes and serializes.
pub fn build_context_binary_owned(
    graphs: Vec<QnnGraph>,
    target: &HtpOptions,
    api: &mut dyn QnnApi,
) -> Result<Vec<u8>, BuildError> {
    build(Cow::Owned(graphs), target, api)
}

fn build(mut graphs: Cow<'_, [QnnGraph]>, target: &HtpOptions, api: &mut dyn QnnApi) -> Result<Vec<u8>, BuildError> {
    target.check()?;
    check_graphs(&graphs)?;

    let mut session = Session::default();
    let built = session.build(&mut graphs, target, api);
    let closed = session.close(api);
    let binary = built?;
    closed.map_err(|source| BuildError::Api { step: "releasing QNN handles".into(), source })?;
    Ok(binary)
}

/// Drops `graph`'s handles on its STATIC data (tensors and tensor params), once the backend has
/// copied it.
fn release_static_data(graph: &mut QnnGraph) {
    for t in graph.tensors_and_params_mut() {
        t.data = None;
    }
}

/// Handles created so far, released in reverse order by [`Session::close`].
#[derive(Default)]
struct Session {
    log: Option<LogHandle>,
    backend: Option<BackendHandle>,
    device: Option<DeviceHandle>,
    context: Option<ContextHandle>,
}

fn api_step(step: impl Into<String>) -> impl FnOnce(ApiError) -> BuildError {
    let step = step.into();
    move |source| BuildError::Api { step, source }
}

impl Session {
    fn build(
        &mut self,
        graphs: &mut Cow<'_, [QnnGraph]>,
        target: &HtpOptions,
        api: &mut dyn QnnApi,
    ) -> Result<Vec<u8>, BuildError> {
        if let Some(level) = target.log_level {
            self.log = Some(api.log_create(level).map_err(api_step("creating the QNN log"))?);
        }
        let backend = api.backend_create(self.log).map_err(api_step("creating the QNN backend"))?;
        self.backend = Some(backend);
        let device_configs = target.device.device_configs();
        let device = api.device_create(self.log, &device_configs).map_err(api_step("creating the HTP device"))?;
        self.device = Some(device);
        let context = api
            .context_create(backend, device, &target.context_configs())
            .map_err(api_step("creating the QNN context"))?;
        self.context = Some(context);

        let graph_configs = target.graph.graph_configs();
        for index in 0..graphs.len() {
            let graph = &graphs[index];
            let handle = api
                .graph_create(context, &graph.name, &graph_configs)
                .map_err(api_step(format!("creating graph `{}`", graph.name)))?;
            let mut builder = GraphBuilder { api: &mut *api, backend, handle, graph, ids: HashMap::new() };
            builder.build()?;
            if let Cow::Owned(owned) = graphs {
                release_static_data(&mut owned[index]);
            }
            let name = &graphs[index].name;
            api.graph_finalize(handle).map_err(api_step(format!("finalizing graph `{name}`")))?;
        }

        let size = api.context_get_binary_size(context).map_err(api_step("querying the context binary size"))?;
        let len = usize::try_from(size).map_err(|_| BuildError::BinaryTooLarge { size })?;
        let mut binary = vec![0u8; len];
        let written = api.context_get_binary(context, &mut binary).map_err(api_step("serializing the context"))?;
        if written > size {
            return Err(BuildError::BinaryOverrun { size, written });
        }
        binary.truncate(written as usize);
        Ok(binary)
    }

    /// Frees every handle in reverse creation order; returns the first failure.
    fn close(&mut self, api: &mut dyn QnnApi) -> Result<(), ApiError> {
        let mut first = Ok(());
        let mut keep = |r: Result<(), ApiError>| {
            if first.is_ok() {
                first = r;
            }
        };
        if let Some(c) = self.context.take() {
            keep(api.context_free(c));
        }
        if let Some(d) = self.device.take() {
            keep(api.device_free(d));
        }
        if let Some(b) = self.backend.take() {
            keep(api.backend_free(b));
        }
        if let Some(l) = self.log.take() {
            keep(api.log_free(l));
        }
        first
    }
}

/// Creates one graph's tensors and nodes.
struct GraphBuilder<'g, 'a> {
    api: &'a mut dyn QnnApi,
    backend: BackendHandle,
    handle: GraphHandle,
    graph: &'g QnnGraph,
    /// Tensors of this graph created so far, by name.
    ids: HashMap<&'g str, TensorId>,
}

impl<'g> GraphBuilder<'g, '_> {
    fn build(&mut self) -> Result<(), BuildError> {
        let tensors: HashMap<&str, &QnnTensor> = self.graph.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        for name in self.graph.inputs.iter().chain(&self.graph.outputs) {
            self.ensure(tensors[name.as_str()])?;
        }
        for node in &self.graph.nodes {
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for name in &node.inputs {
                let tensor = tensors[name.as_str()];
                inputs.push(BoundTensor { id: self.ensure(tensor)?, tensor });
            }
            let mut outputs = Vec::with_capacity(node.outputs.len());
            for name in &node.outputs {
                let tensor = tensors[name.as_str()];
                outputs.push(BoundTensor { id: self.ensure(tensor)?, tensor });
            }
            let mut params = Vec::with_capacity(node.params.len());
            for (name, p) in &node.params {
                let value = match p {
                    Param::Scalar(s) => BoundParamValue::Scalar(*s),
                    Param::Tensor(tensor) => BoundParamValue::Tensor(BoundTensor { id: self.create(tensor)?, tensor }),
                };
                params.push(BoundParam { name, value });
            }
            let op = OpConfig {
                name: &node.name,
                package: &node.package,
                op_type: node.op_type.as_str(),
                params,
                inputs,
                outputs,
            };
            self.add_node(node, &op)?;
        }
        Ok(())
    }

    fn add_node(&mut self, node: &QnnNode, op: &OpConfig<'_>) -> Result<(), BuildError> {
        self.api.backend_validate_op_config(self.backend, op).map_err(|source| BuildError::NodeRejected {
            graph: self.graph.name.clone(),
            node: node.name.clone(),
            op_type: node.op_type,
            source,
        })?;
        self.api
            .graph_add_node(self.handle, op)
            .map_err(api_step(format!("adding node `{}` ({}) to graph `{}`", node.name, node.op_type, self.graph.name)))
    }

    /// The id of `tensor` in this graph, creating it on first use.
    fn ensure(&mut self, tensor: &'g QnnTensor) -> Result<TensorId, BuildError> {
        if let Some(&id) = self.ids.get(tensor.name.as_str()) {
            return Ok(id);
        }
        let id = self.create(tensor)?;
        self.ids.insert(&tensor.name, id);
        Ok(id)
    }

    fn create(&mut self, tensor: &QnnTensor) -> Result<TensorId, BuildError> {
        self.api
            .tensor_create_graph_tensor(self.handle, tensor)
            .map_err(api_step(format!("creating tensor `{}` in graph `{}`", tensor.name, self.graph.name)))
    }
}

/// What is inconsistent in a graph.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GraphProblem {
    #[error("no graphs to build")]
    NoGraphs,
    #[error("graph {0}")]
    Name(NameError),
    #[error("graph name is used twice")]
    NameTwice,
    #[error("STATIC tensor `{tensor}` differs from the one of the same name in graph `{first}`; shared weights must be identical")]
    SharedWeightDiffers { tensor: String, first: String },
    #[error("tensor `{0}` is declared twice")]
    TensorTwice(String),
    #[error("node {0}")]
    NodeName(NameError),
    #[error("node `{node}` ({op_type}): {problem}")]
    Node { node: String, op_type: OpType, problem: NodeProblem },
    #[error("graph output `{0}` is not produced by any node")]
    OutputNotProduced(String),
    #[error("graph {what} `{name}` is not a tensor of the graph")]
    IoUnknown { what: &'static str, name: String },
    #[error("graph {what} `{name}` is {found}, expected {expected}")]
    IoType { what: &'static str, name: String, found: TensorType, expected: TensorType },
    #[error("graph {what} `{name}` is listed twice")]
    IoTwice { what: &'static str, name: String },
    #[error("{kind} tensor `{name}` is missing from the graph {what}s list")]
    IoMissing { what: &'static str, kind: TensorType, name: String },
}

/// What is inconsistent in one node of a graph.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NodeProblem {
    #[error("package {0}")]
    PackageName(NameError),
    #[error("node name is used twice")]
    NameTwice,
    #[error("input `{0}` is not a tensor of the graph")]
    InputUnknown(String),
    #[error("input `{0}` is used before a node produces it (nodes must be in dependency order)")]
    InputBeforeProducer(String),
    #[error("output `{0}` is not a tensor of the graph")]
    OutputUnknown(String),
    #[error("output `{name}` is a {tensor_type} tensor")]
    OutputType { name: String, tensor_type: TensorType },
    #[error("output `{0}` is already produced by an earlier node")]
    OutputTwice(String),
    #[error("param {0}")]
    ParamName(NameError),
    #[error("param `{0}` is given twice")]
    ParamTwice(String),
    #[error("tensor param `{param}` must be STATIC, is {tensor_type}")]
    ParamNotStatic { param: String, tensor_type: TensorType },
    #[error("tensor param `{param}` reuses the tensor name `{tensor}`")]
    ParamReusesName { param: String, tensor: String },
}

fn invalid(graph: &QnnGraph, problem: GraphProblem) -> BuildError {
    BuildError::InvalidGraph { graph: graph.name.clone(), problem: Box::new(problem) }
}

/// Checks everything that can be checked before talking to QNN: names, tensors,
/// I/O lists, dependency order and that shared STATIC tensors agree across graphs.
/// [`build_context_binary`] runs this first.
pub fn check_graphs(graphs: &[QnnGraph]) -> Result<(), BuildError> {
    if graphs.is_empty() {
        return Err(BuildError::InvalidGraph { graph: String::new(), problem: Box::new(GraphProblem::NoGraphs) });
    }
    let mut names = HashSet::new();
    let mut statics: HashMap<&str, (&str, &QnnTensor)> = HashMap::new();
    for graph in graphs {
        check_c_name(&graph.name).map_err(|p| invalid(graph, GraphProblem::Name(p)))?;
        if !names.insert(graph.name.as_str()) {
            return Err(invalid(graph, GraphProblem::NameTwice));
        }
        check_graph(graph)?;
        for t in graph.tensors.iter().filter(|t| t.tensor_type == TensorType::Static) {
            match statics.get(t.name.as_str()) {
                Some((first, shared)) if *shared != t => {
                    let problem =
                        GraphProblem::SharedWeightDiffers { tensor: t.name.clone(), first: first.to_string() };
                    return Err(invalid(graph, problem));
                }
                Some(_) => {}
                None => {
                    statics.insert(&t.name, (&graph.name, t));
                }
            }
        }
    }
    Ok(())
}

fn check_graph(graph: &QnnGraph) -> Result<(), BuildError> {
    let mut tensors: HashMap<&str, &QnnTensor> = HashMap::new();
    for t in &graph.tensors {
        t.check().map_err(|source| BuildError::InvalidTensor { graph: graph.name.clone(), source })?;
        if tensors.insert(&t.name, t).is_some() {
            return Err(invalid(graph, GraphProblem::TensorTwice(t.name.clone())));
        }
    }
    check_io(graph, &tensors, &graph.inputs, TensorType::AppWrite, "input")?;
    check_io(graph, &tensors, &graph.outputs, TensorType::AppRead, "output")?;

    // Produced-before-consumed, single producer, unique node and param-tensor names.
    let mut produced: HashSet<&str> = HashSet::new();
    let mut node_names = HashSet::new();
    let mut param_tensors = HashSet::new();
    for node in &graph.nodes {
        let at = |problem: NodeProblem| {
            invalid(graph, GraphProblem::Node { node: node.name.clone(), op_type: node.op_type, problem })
        };
        check_c_name(&node.name).map_err(|p| invalid(graph, GraphProblem::NodeName(p)))?;
        check_c_name(&node.package).map_err(|p| at(NodeProblem::PackageName(p)))?;
        if !node_names.insert(node.name.as_str()) {
            return Err(at(NodeProblem::NameTwice));
        }
        for name in &node.inputs {
            let t = tensors.get(name.as_str()).ok_or_else(|| at(NodeProblem::InputUnknown(name.clone())))?;
            let needs_producer = matches!(t.tensor_type, TensorType::Native | TensorType::AppRead);
            if needs_producer && !produced.contains(name.as_str()) {
                return Err(at(NodeProblem::InputBeforeProducer(name.clone())));
            }
        }
        for name in &node.outputs {
            let t = tensors.get(name.as_str()).ok_or_else(|| at(NodeProblem::OutputUnknown(name.clone())))?;
            if matches!(t.tensor_type, TensorType::AppWrite | TensorType::Static | TensorType::Null) {
                return Err(at(NodeProblem::OutputType { name: name.clone(), tensor_type: t.tensor_type }));
            }
            if !produced.insert(name.as_str()) {
                return Err(at(NodeProblem::OutputTwice(name.clone())));
            }
        }
        let mut param_names = HashSet::new();
        for (name, p) in &node.params {
            check_c_name(name).map_err(|e| at(NodeProblem::ParamName(e)))?;
            if !param_names.insert(name.as_str()) {
                return Err(at(NodeProblem::ParamTwice(name.clone())));
            }
            if let Param::Tensor(t) = p {
                t.check().map_err(|source| BuildError::InvalidTensor { graph: graph.name.clone(), source })?;
                if t.tensor_type != TensorType::Static {
                    return Err(at(NodeProblem::ParamNotStatic { param: name.clone(), tensor_type: t.tensor_type }));
                }
                if tensors.contains_key(t.name.as_str()) || !param_tensors.insert(t.name.as_str()) {
                    return Err(at(NodeProblem::ParamReusesName { param: name.clone(), tensor: t.name.clone() }));
                }
            }
        }
    }
    if let Some(missing) = graph.outputs.iter().find(|o| !produced.contains(o.as_str())) {
        return Err(invalid(graph, GraphProblem::OutputNotProduced(missing.clone())));
    }
    Ok(())
}

fn check_io(
    graph: &QnnGraph,
    tensors: &HashMap<&str, &QnnTensor>,
    list: &[String],
    kind: TensorType,
    what: &'static str,
) -> Result<(), BuildError> {
    let mut seen = HashSet::new();
    for name in list {
        let t = tensors
            .get(name.as_str())
            .ok_or_else(|| invalid(graph, GraphProblem::IoUnknown { what, name: name.clone() }))?;
        if t.tensor_type != kind {
            let problem = GraphProblem::IoType { what, name: name.clone(), found: t.tensor_type, expected: kind };
            return Err(invalid(graph, problem));
        }
        if !seen.insert(name.as_str()) {
            return Err(invalid(graph, GraphProblem::IoTwice { what, name: name.clone() }));
        }
    }
    if let Some(t) = graph.tensors.iter().find(|t| t.tensor_type == kind && !seen.contains(t.name.as_str())) {
        return Err(invalid(graph, GraphProblem::IoMissing { what, kind, name: t.name.clone() }));
    }
    Ok(())
}
