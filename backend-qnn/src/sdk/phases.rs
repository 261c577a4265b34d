//! Which phase of [`build_context_binary`](super::build_context_binary) the backend is in, told
//! to an observer as the calls go by, so a bench can time and measure each phase (adding nodes,
//! finalizing, serializing) without the driver knowing about measurements.

use super::api::{
    ApiError, BackendHandle, ContextHandle, DeviceHandle, GraphHandle, LogHandle, OpConfig, QnnApi, TensorId,
};
use super::config::{ContextConfig, DeviceConfig, GraphConfig, LogLevel};
use crate::graph::QnnTensor;

/// A phase of the compile-side call sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuildPhase {
    /// `logCreate`, `backendCreate`, `deviceCreate`, `contextCreate`.
    Setup,
    /// `graphCreate`, `tensorCreateGraphTensor`, `backendValidateOpConfig`, `graphAddNode`.
    AddNodes,
    /// `graphFinalize`: the backend prepares the graph for the HTP.
    Finalize,
    /// `contextGetBinarySize`, `contextGetBinary`.
    Serialize,
    /// `contextFree`, `deviceFree`, `backendFree`, `logFree`.
    Release,
}

impl BuildPhase {
    /// A short name for tables.
    pub fn name(self) -> &'static str {
        match self {
            BuildPhase::Setup => "backend setup",
            BuildPhase::AddNodes => "backend add nodes",
            BuildPhase::Finalize => "backend finalize",
            BuildPhase::Serialize => "backend serialize",
            BuildPhase::Release => "backend release",
        }
    }
}

/// A [`QnnApi`] that forwards every call to `inner` and calls `on_phase` before the first call
/// of each new phase (again when the sequence returns to an earlier phase, e.g. the next graph).
pub struct PhaseObserver<'a> {
    inner: &'a mut dyn QnnApi,
    on_phase: &'a mut dyn FnMut(BuildPhase),
    current: Option<BuildPhase>,
}

impl<'a> PhaseObserver<'a> {
    pub fn new(inner: &'a mut dyn QnnApi, on_phase: &'a mut dyn FnMut(BuildPhase)) -> PhaseObserver<'a> {
        PhaseObserver { inner, on_phase, current: None }
    }

    fn enter(&mut self, phase: BuildPhase) -> &mut dyn QnnApi {
        if self.current != Some(phase) {
            self.current = Some(phase);
            (self.on_phase)(phase);
        }
        &mut *self.inner
    }
}

impl QnnApi for PhaseObserver<'_> {
    fn log_create(&mut self, level: LogLevel) -> Result<LogHandle, ApiError> {
        self.enter(BuildPhase::Setup).log_create(level)
    }
    fn backend_create(&mut self, log: Option<LogHandle>) -> Result<BackendHandle, ApiError> {
        self.enter(BuildPhase::Setup).backend_create(log)
    }
    fn device_create(&mut self, log: Option<LogHandle>, config: &[DeviceConfig]) -> Result<DeviceHandle, ApiError> {
        self.enter(BuildPhase::Setup).device_create(log, config)
    }
    fn context_create(
        &mut self,
        backend: BackendHandle,
        device: DeviceHandle,
        config: &[ContextConfig],
    ) -> Result<ContextHandle, ApiError> {
        self.enter(BuildPhase::Setup).context_create(backend, device, config)
    }
    fn graph_create(
        &mut self,
        context: ContextHandle,
        name: &str,
        config: &[GraphConfig],
    ) -> Result<GraphHandle, ApiError> {
        self.enter(BuildPhase::AddNodes).graph_create(context, name, config)
    }
    fn tensor_create_graph_tensor(&mut self, graph: GraphHandle, tensor: &QnnTensor) -> Result<TensorId, ApiError> {
        self.enter(BuildPhase::AddNodes).tensor_create_graph_tensor(graph, tensor)
    }
    fn backend_validate_op_config(&mut self, backend: BackendHandle, op: &OpConfig<'_>) -> Result<(), ApiError> {
        self.enter(BuildPhase::AddNodes).backend_validate_op_config(backend, op)
    }
    fn graph_add_node(&mut self, graph: GraphHandle, op: &OpConfig<'_>) -> Result<(), ApiError> {
        self.enter(BuildPhase::AddNodes).graph_add_node(graph, op)
    }
    fn graph_finalize(&mut self, graph: GraphHandle) -> Result<(), ApiError> {
        self.enter(BuildPhase::Finalize).graph_finalize(graph)
    }
    fn context_get_binary_size(&mut self, context: ContextHandle) -> Result<u64, ApiError> {
        self.enter(BuildPhase::Serialize).context_get_binary_size(context)
    }
    fn context_get_binary(&mut self, context: ContextHandle, buffer: &mut [u8]) -> Result<u64, ApiError> {
        self.enter(BuildPhase::Serialize).context_get_binary(context, buffer)
    }
    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError> {
        self.enter(BuildPhase::Release).context_free(context)
    }
    fn device_free(&mut self, device: DeviceHandle) -> Result<(), ApiError> {
        self.enter(BuildPhase::Release).device_free(device)
    }
    fn backend_free(&mut self, backend: BackendHandle) -> Result<(), ApiError> {
        self.enter(BuildPhase::Release).backend_free(backend)
    }
    fn log_free(&mut self, log: LogHandle) -> Result<(), ApiError> {
        self.enter(BuildPhase::Release).log_free(log)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use crate::encoding::Encoding;
    use crate::graph::GraphBuilder;
    use crate::opdef::OpType;
    use crate::sdk::{build_context_binary, HtpOptions, RecordingApi};

    #[test]
    fn phases_are_reported_in_call_order() {
        let graph = |name: &str| {
            let mut b = GraphBuilder::new(name);
            let x = b.input("x", DataType::Float32, &[1, 4], Encoding::Undefined);
            let neg = b.node("neg", OpType::ElementWiseNeg).input(&x);
            neg.graph_output("y", DataType::Float32, &[1, 4], Encoding::Undefined).finish();
            b.finish().unwrap()
        };
        let mut recording = RecordingApi::new();
        let mut seen = Vec::new();
        let mut on_phase = |p: BuildPhase| seen.push(p);
        let mut api = PhaseObserver::new(&mut recording, &mut on_phase);
        build_context_binary(&[graph("a"), graph("b")], &HtpOptions::sm8650(), &mut api).unwrap();
        use BuildPhase::*;
        assert_eq!(seen, [Setup, AddNodes, Finalize, AddNodes, Finalize, Serialize, Release]);
    }
}
