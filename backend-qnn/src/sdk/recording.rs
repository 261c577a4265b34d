//! [`RecordingApi`]: a [`QnnApi`] that records every call instead of reaching a backend.
//!
//! It behaves like a strict backend for the rules the driver must respect (live handles,
//! unique graph and tensor names, tensors created before use, only STATIC tensors shared
//! between graphs, nothing added after finalize, every graph finalized before serializing),
//! returns sequential fake handles and ids, and serializes the context as the deterministic
//! fake binary of [`render::fake_context_binary`]. Failures can be injected per call to test
//! error paths. The C mock provider implements the same rules and log format.

use std::collections::{HashMap, HashSet};

use super::api::{
    ApiError, BackendHandle, BoundTensor, ContextHandle, DeviceHandle, GraphHandle, LogHandle, OpConfig, QnnApi,
    TensorId,
};
use super::config::{ContextConfig, DeviceConfig, GraphConfig, LogLevel};
use super::render::{self, FakeGraph};
use crate::dtype::TensorType;
use crate::graph::QnnTensor;
use crate::io::{GraphIo, IoTensor};

/// `QNN_COMMON_ERROR_INVALID_ARGUMENT`.
pub const ERROR_INVALID_ARGUMENT: u64 = 1004;
/// `QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED`.
pub const ERROR_OPERATION_NOT_PERMITTED: u64 = 1005;

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCall {
    /// The C function name, e.g. `graphAddNode`.
    pub function: &'static str,
    /// The whole rendered line, `function(arguments) -> result`.
    pub line: String,
}

/// Makes `function` fail with `code` when its subject (graph, tensor or node name, or the
/// handle's display name for calls without a name) equals `subject`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InjectedFailure {
    function: &'static str,
    subject: String,
    code: u64,
}

#[derive(Debug)]
struct TensorRecord {
    graph: GraphHandle,
    name: String,
    is_static: bool,
}

#[derive(Debug, Default)]
struct ContextState {
    live: bool,
    graphs: Vec<GraphHandle>,
    tensors: HashMap<TensorId, TensorRecord>,
    next_tensor_id: u32,
}

#[derive(Debug)]
struct GraphState {
    context: ContextHandle,
    finalized: bool,
    tensor_names: HashSet<String>,
    fake: FakeGraph,
}

/// Records QNN calls; see the module docs.
#[derive(Debug, Default)]
pub struct RecordingApi {
    calls: Vec<RecordedCall>,
    failures: Vec<InjectedFailure>,
    logs: Vec<bool>,
    backends: Vec<bool>,
    devices: Vec<bool>,
    contexts: Vec<ContextState>,
    graphs: Vec<GraphState>,
}

type Outcome<T> = Result<T, ApiError>;

impl RecordingApi {
    pub fn new() -> RecordingApi {
        RecordingApi::default()
    }

    /// Makes the next calls of `function` (C name, e.g. `backendValidateOpConfig`) whose
    /// subject is `subject` fail with QNN error `code`. Subjects: graph name for
    /// `graphCreate`/`graphFinalize`, tensor name for `tensorCreateGraphTensor`, node name for
    /// `backendValidateOpConfig`/`graphAddNode`, the handle (e.g. `context1`) otherwise.
    pub fn fail(&mut self, function: &'static str, subject: &str, code: u64) {
        self.failures.push(InjectedFailure { function, subject: subject.to_string(), code });
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> &[RecordedCall] {
        &self.calls
    }

    /// The call log, one line per call.
    pub fn log(&self) -> String {
        let mut text = String::new();
        for call in &self.calls {
            text.push_str(&call.line);
            text.push('\n');
        }
        text
    }

    /// The function names in call order.
    pub fn functions(&self) -> Vec<&'static str> {
        self.calls.iter().map(|c| c.function).collect()
    }

    /// Records a call that an injected failure makes fail before it has any effect.
    fn injected(&mut self, function: &'static str, subject: &str, args: &str) -> Option<ApiError> {
        let code = self.failures.iter().find(|f| f.function == function && f.subject == subject)?.code;
        self.calls.push(RecordedCall { function, line: format!("{function}({args}) -> error {code}") });
        Some(ApiError::Qnn { function, code })
    }

    /// Records `function(args) -> result`.
    fn finish<T>(&mut self, function: &'static str, args: String, outcome: Outcome<(T, String)>) -> Outcome<T> {
        let result = match &outcome {
            Ok((_, shown)) => shown.clone(),
            Err(ApiError::Qnn { code, .. }) => format!("error {code}"),
            Err(other) => format!("refused: {other}"),
        };
        self.calls.push(RecordedCall { function, line: format!("{function}({args}) -> {result}") });
        outcome.map(|(value, _)| value)
    }

    fn qnn_error(function: &'static str, code: u64) -> ApiError {
        ApiError::Qnn { function, code }
    }

    fn live(slots: &[bool], index: u32) -> bool {
        index >= 1 && slots.get(index as usize - 1).copied().unwrap_or(false)
    }

    fn context_state(&self, context: ContextHandle) -> Option<&ContextState> {
        let state = self.contexts.get((context.0 as usize).checked_sub(1)?)?;
        state.live.then_some(state)
    }

    fn graph_state(&self, graph: GraphHandle) -> Option<&GraphState> {
        let state = self.graphs.get((graph.0 as usize).checked_sub(1)?)?;
        self.context_state(state.context).map(|_| state)
    }

    /// Checks that every tensor of an op config exists and may be used in `graph`.
    fn check_op_tensors(&self, graph: GraphHandle, op: &OpConfig<'_>) -> Result<(), ()> {
        let state = self.graph_state(graph).ok_or(())?;
        let ctx = self.context_state(state.context).ok_or(())?;
        let params = op.params.iter().filter_map(|p| match p.value {
            super::api::BoundParamValue::Tensor(t) => Some(t),
            super::api::BoundParamValue::Scalar(_) => None,
        });
        let all: Vec<BoundTensor<'_>> = op.inputs.iter().chain(&op.outputs).copied().chain(params).collect();
        for t in all {
            let record = ctx.tensors.get(&t.id).ok_or(())?;
            let usable = record.graph == graph || record.is_static;
            if !usable || record.name != t.tensor.name {
                return Err(());
            }
        }
        Ok(())
    }
}

impl QnnApi for RecordingApi {
    fn log_create(&mut self, level: LogLevel) -> Outcome<LogHandle> {
        let args = format!("level={}", level.name());
        if let Some(e) = self.injected("logCreate", "", &args) {
            return Err(e);
        }
        self.logs.push(true);
        let handle = LogHandle(self.logs.len() as u32);
        self.finish("logCreate", args, Ok((handle, handle.to_string())))
    }

    fn backend_create(&mut self, log: Option<LogHandle>) -> Outcome<BackendHandle> {
        let args = format!("log={}, config=[]", show_opt(log));
        if let Some(e) = self.injected("backendCreate", "", &args) {
            return Err(e);
        }
        let outcome = match log {
            Some(l) if !Self::live(&self.logs, l.0) => Err(Self::qnn_error("backendCreate", ERROR_INVALID_ARGUMENT)),
            _ => {
                self.backends.push(true);
                let handle = BackendHandle(self.backends.len() as u32);
                Ok((handle, handle.to_string()))
            }
        };
        self.finish("backendCreate", args, outcome)
    }

    fn device_create(&mut self, log: Option<LogHandle>, config: &[DeviceConfig]) -> Outcome<DeviceHandle> {
        let args = format!("log={}, config={}", show_opt(log), render::device_configs(config));
        if let Some(e) = self.injected("deviceCreate", "", &args) {
            return Err(e);
        }
        let outcome = match log {
            Some(l) if !Self::live(&self.logs, l.0) => Err(Self::qnn_error("deviceCreate", ERROR_INVALID_ARGUMENT)),
            _ => {
                self.devices.push(true);
                let handle = DeviceHandle(self.devices.len() as u32);
                Ok((handle, handle.to_string()))
            }
        };
        self.finish("deviceCreate", args, outcome)
    }

    fn context_create(
        &mut self,
        backend: BackendHandle,
        device: DeviceHandle,
        config: &[ContextConfig],
    ) -> Outcome<ContextHandle> {
        let args = format!("backend={backend}, device={device}, config={}", render::context_configs(config));
        if let Some(e) = self.injected("contextCreate", "", &args) {
            return Err(e);
        }
        let outcome = if Self::live(&self.backends, backend.0) && Self::live(&self.devices, device.0) {
            self.contexts.push(ContextState { live: true, next_tensor_id: 1, ..ContextState::default() });
            let handle = ContextHandle(self.contexts.len() as u32);
            Ok((handle, handle.to_string()))
        } else {
            Err(Self::qnn_error("contextCreate", ERROR_INVALID_ARGUMENT))
        };
        self.finish("contextCreate", args, outcome)
    }

    fn graph_create(&mut self, context: ContextHandle, name: &str, config: &[GraphConfig]) -> Outcome<GraphHandle> {
        let args = format!("context={context}, name=\"{name}\", config={}", render::graph_configs(config));
        if let Some(e) = self.injected("graphCreate", name, &args) {
            return Err(e);
        }
        let duplicate = self
            .context_state(context)
            .map(|ctx| ctx.graphs.iter().any(|g| self.graphs[g.0 as usize - 1].fake.io.name == name));
        let outcome = match duplicate {
            Some(false) => {
                self.graphs.push(GraphState {
                    context,
                    finalized: false,
                    tensor_names: HashSet::new(),
                    fake: FakeGraph {
                        io: GraphIo { name: name.to_string(), inputs: vec![], outputs: vec![] },
                        nodes: 0,
                    },
                });
                let handle = GraphHandle(self.graphs.len() as u32);
                self.contexts[context.0 as usize - 1].graphs.push(handle);
                Ok((handle, handle.to_string()))
            }
            _ => Err(Self::qnn_error("graphCreate", ERROR_INVALID_ARGUMENT)),
        };
        self.finish("graphCreate", args, outcome)
    }

    fn tensor_create_graph_tensor(&mut self, graph: GraphHandle, tensor: &QnnTensor) -> Outcome<TensorId> {
        let args = format!("graph={graph}, tensor={}", render::tensor(tensor));
        if let Some(e) = self.injected("tensorCreateGraphTensor", &tensor.name, &args) {
            return Err(e);
        }
        let outcome = match self.graph_state(graph) {
            None => Err(Self::qnn_error("tensorCreateGraphTensor", ERROR_INVALID_ARGUMENT)),
            Some(g) if g.finalized => Err(Self::qnn_error("tensorCreateGraphTensor", ERROR_OPERATION_NOT_PERMITTED)),
            Some(g) if g.tensor_names.contains(&tensor.name) => {
                Err(Self::qnn_error("tensorCreateGraphTensor", ERROR_INVALID_ARGUMENT))
            }
            Some(g) => {
                let context = g.context;
                let ctx = &mut self.contexts[context.0 as usize - 1];
                let id = TensorId(ctx.next_tensor_id);
                ctx.next_tensor_id += 1;
                ctx.tensors.insert(
                    id,
                    TensorRecord {
                        graph,
                        name: tensor.name.clone(),
                        is_static: tensor.tensor_type == TensorType::Static,
                    },
                );
                let g = &mut self.graphs[graph.0 as usize - 1];
                g.tensor_names.insert(tensor.name.clone());
                let entry = IoTensor::of(tensor, Some(id.0));
                match tensor.tensor_type {
                    TensorType::AppWrite => g.fake.io.inputs.push(entry),
                    TensorType::AppRead => g.fake.io.outputs.push(entry),
                    _ => {}
                }
                Ok((id, id.to_string()))
            }
        };
        self.finish("tensorCreateGraphTensor", args, outcome)
    }

    fn backend_validate_op_config(&mut self, backend: BackendHandle, op: &OpConfig<'_>) -> Outcome<()> {
        let args = format!("backend={backend}, op={}", render::op(op));
        if let Some(e) = self.injected("backendValidateOpConfig", op.name, &args) {
            return Err(e);
        }
        let outcome = if Self::live(&self.backends, backend.0) {
            Ok(((), "ok".to_string()))
        } else {
            Err(Self::qnn_error("backendValidateOpConfig", ERROR_INVALID_ARGUMENT))
        };
        self.finish("backendValidateOpConfig", args, outcome)
    }

    fn graph_add_node(&mut self, graph: GraphHandle, op: &OpConfig<'_>) -> Outcome<()> {
        let args = format!("graph={graph}, op={}", render::op(op));
        if let Some(e) = self.injected("graphAddNode", op.name, &args) {
            return Err(e);
        }
        let outcome = match self.graph_state(graph) {
            None => Err(Self::qnn_error("graphAddNode", ERROR_INVALID_ARGUMENT)),
            Some(g) if g.finalized => Err(Self::qnn_error("graphAddNode", ERROR_OPERATION_NOT_PERMITTED)),
            Some(_) => match self.check_op_tensors(graph, op) {
                Ok(()) => {
                    self.graphs[graph.0 as usize - 1].fake.nodes += 1;
                    Ok(((), "ok".to_string()))
                }
                Err(()) => Err(Self::qnn_error("graphAddNode", ERROR_INVALID_ARGUMENT)),
            },
        };
        self.finish("graphAddNode", args, outcome)
    }

    fn graph_finalize(&mut self, graph: GraphHandle) -> Outcome<()> {
        let args = format!("graph={graph}");
        let subject = self.graph_state(graph).map(|g| g.fake.io.name.clone()).unwrap_or_default();
        if let Some(e) = self.injected("graphFinalize", &subject, &args) {
            return Err(e);
        }
        let outcome = match self.graph_state(graph) {
            None => Err(Self::qnn_error("graphFinalize", ERROR_INVALID_ARGUMENT)),
            Some(g) if g.finalized => Err(Self::qnn_error("graphFinalize", ERROR_OPERATION_NOT_PERMITTED)),
            Some(_) => Ok(((), "ok".to_string())),
        };
        let result = self.finish("graphFinalize", args, outcome);
        if result.is_ok() {
            self.graphs[graph.0 as usize - 1].finalized = true;
        }
        result
    }

    fn context_get_binary_size(&mut self, context: ContextHandle) -> Outcome<u64> {
        let args = format!("context={context}");
        if let Some(e) = self.injected("contextGetBinarySize", &context.to_string(), &args) {
            return Err(e);
        }
        let outcome = match self.fake_binary(context) {
            Ok(bytes) => Ok((bytes.len() as u64, format!("size={}", bytes.len()))),
            Err(code) => Err(Self::qnn_error("contextGetBinarySize", code)),
        };
        self.finish("contextGetBinarySize", args, outcome)
    }

    fn context_get_binary(&mut self, context: ContextHandle, buffer: &mut [u8]) -> Outcome<u64> {
        let args = format!("context={context}, bufferSize={}", buffer.len());
        if let Some(e) = self.injected("contextGetBinary", &context.to_string(), &args) {
            return Err(e);
        }
        let outcome = match self.fake_binary(context) {
            Ok(bytes) if bytes.len() <= buffer.len() => {
                buffer[..bytes.len()].copy_from_slice(&bytes);
                Ok((bytes.len() as u64, format!("written={}", bytes.len())))
            }
            Ok(_) => Err(Self::qnn_error("contextGetBinary", ERROR_INVALID_ARGUMENT)),
            Err(code) => Err(Self::qnn_error("contextGetBinary", code)),
        };
        self.finish("contextGetBinary", args, outcome)
    }

    fn context_free(&mut self, context: ContextHandle) -> Outcome<()> {
        let args = format!("context={context}");
        if let Some(e) = self.injected("contextFree", &context.to_string(), &args) {
            return Err(e);
        }
        let outcome = match self.context_state(context) {
            Some(_) => Ok(((), "ok".to_string())),
            None => Err(Self::qnn_error("contextFree", ERROR_INVALID_ARGUMENT)),
        };
        let result = self.finish("contextFree", args, outcome);
        if result.is_ok() {
            self.contexts[context.0 as usize - 1].live = false;
        }
        result
    }

    fn device_free(&mut self, device: DeviceHandle) -> Outcome<()> {
        free_slot(self, "deviceFree", device.0, |api| &mut api.devices, format!("device={device}"))
    }

    fn backend_free(&mut self, backend: BackendHandle) -> Outcome<()> {
        free_slot(self, "backendFree", backend.0, |api| &mut api.backends, format!("backend={backend}"))
    }

    fn log_free(&mut self, log: LogHandle) -> Outcome<()> {
        free_slot(self, "logFree", log.0, |api| &mut api.logs, format!("log={log}"))
    }
}

impl RecordingApi {
    /// The serialized context, or the error code a backend would return.
    fn fake_binary(&self, context: ContextHandle) -> Result<Vec<u8>, u64> {
        let ctx = self.context_state(context).ok_or(ERROR_INVALID_ARGUMENT)?;
        let graphs: Vec<&GraphState> = ctx.graphs.iter().map(|g| &self.graphs[g.0 as usize - 1]).collect();
        if graphs.iter().any(|g| !g.finalized) {
            return Err(ERROR_OPERATION_NOT_PERMITTED);
        }
        let fakes: Vec<FakeGraph> = graphs.iter().map(|g| g.fake.clone()).collect();
        Ok(render::fake_context_binary(&fakes))
    }
}

fn free_slot(
    api: &mut RecordingApi,
    function: &'static str,
    index: u32,
    slots: fn(&mut RecordingApi) -> &mut Vec<bool>,
    args: String,
) -> Outcome<()> {
    let subject = args.split_once('=').map(|(_, h)| h.to_string()).unwrap_or_default();
    if let Some(e) = api.injected(function, &subject, &args) {
        return Err(e);
    }
    let outcome = if RecordingApi::live(slots(api), index) {
        Ok(((), "ok".to_string()))
    } else {
        Err(RecordingApi::qnn_error(function, ERROR_INVALID_ARGUMENT))
    };
    let result = api.finish(function, args, outcome);
    if result.is_ok() {
        slots(api)[index as usize - 1] = false;
    }
    result
}

fn show_opt(handle: Option<LogHandle>) -> String {
    handle.map_or_else(|| "null".to_string(), |h| h.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::encoding::Encoding;

    fn native(name: &str) -> QnnTensor {
        QnnTensor {
            name: name.into(),
            tensor_type: TensorType::Native,
            dtype: DataType::Float32,
            dims: vec![2],
            encoding: Encoding::Undefined,
            data: None,
        }
    }

    #[test]
    fn enforces_backend_rules() {
        let mut api = RecordingApi::new();
        let be = api.backend_create(None).unwrap();
        let dev = api.device_create(None, &[]).unwrap();
        let ctx = api.context_create(be, dev, &[]).unwrap();
        let g = api.graph_create(ctx, "g", &[]).unwrap();
        assert!(api.graph_create(ctx, "g", &[]).is_err(), "duplicate graph name");
        let a = native("a");
        api.tensor_create_graph_tensor(g, &a).unwrap();
        let dup = api.tensor_create_graph_tensor(g, &a).unwrap_err();
        assert_eq!(dup.qnn_code(), Some(1004));

        // A tensor never created cannot appear in a node.
        let ghost = native("ghost");
        let op = OpConfig {
            name: "n",
            package: "qti.aisw",
            op_type: "Relu",
            params: vec![],
            inputs: vec![BoundTensor { id: TensorId(1), tensor: &a }],
            outputs: vec![BoundTensor { id: TensorId(9), tensor: &ghost }],
        };
        assert!(api.graph_add_node(g, &op).is_err());

        // Serializing before finalize is refused; after finalize adding is refused.
        let early = api.context_get_binary_size(ctx).unwrap_err();
        assert_eq!(early.qnn_code(), Some(1005));
        api.graph_finalize(g).unwrap();
        let late = api.tensor_create_graph_tensor(g, &native("b")).unwrap_err();
        assert_eq!(late.qnn_code(), Some(1005));
        let size = api.context_get_binary_size(ctx).unwrap();
        let mut small = vec![0; size as usize - 1];
        assert!(api.context_get_binary(ctx, &mut small).is_err());

        api.context_free(ctx).unwrap();
        assert!(api.graph_finalize(g).is_err(), "graphs die with their context");
        assert!(api.context_free(ctx).is_err(), "double free");
        assert_eq!(api.calls().len(), api.functions().len());
        assert!(api.log().lines().all(|l| l.contains(") -> ")));
    }

    #[test]
    fn injected_failure_is_recorded_with_its_code() {
        let mut api = RecordingApi::new();
        api.fail("backendCreate", "", 4000);
        let err = api.backend_create(None).unwrap_err();
        assert_eq!(err, ApiError::Qnn { function: "backendCreate", code: 4000 });
        assert_eq!(api.log(), "backendCreate(log=null, config=[]) -> error 4000\n");
    }
}
