//! [`SdkApi`]: [`QnnApi`] through a loaded QNN backend library.

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::ptr;

use libloading::os::unix::Library;

use super::bindings as b;
use super::exec::ExecIo;
use super::library::{self, LibraryPaths, LoadError, ProviderInfo};
use super::log;
use super::marshal::{self, Arena};
use super::system::{BinaryInfo, SystemApi};
use crate::graph::QnnTensor;
use crate::sdk::api::{
    ApiError, BackendHandle, BoundParamValue, ContextHandle, DeviceHandle, GraphHandle, LogHandle, MarshalError,
    OpConfig, QnnApi, TensorId,
};
use crate::sdk::config::{ContextConfig, DeviceConfig, GraphConfig, LogLevel};

pub(super) struct ContextSlot {
    pub(super) raw: b::Qnn_ContextHandle_t,
    /// Tensors, op configs and configs QNN may read until the context is freed.
    pub(super) arena: Arena,
    /// For a context loaded from a binary: the binary's graphs and their I/O.
    pub(super) info: Option<BinaryInfo>,
}

struct DeviceSlot {
    raw: b::Qnn_DeviceHandle_t,
    /// The device configs; never read, kept until the device is freed.
    _configs: Arena,
}

pub(super) struct GraphSlot {
    pub(super) raw: b::Qnn_GraphHandle_t,
    /// Index into `contexts`; the graph dies with its context.
    pub(super) context: usize,
    /// For a retrieved graph: its I/O tensors, bound by `graphExecute`.
    pub(super) io: Option<ExecIo>,
}

/// The QNN C API of a loaded backend library (normally `libQnnHtp.so`).
///
/// Handles given out are indices into this object's own tables, so they cannot outlive the
/// library or be mixed up with another `SdkApi`. Every C handle still open when the value is
/// dropped is freed (contexts, devices, backends, logs, in that order) before the library is
/// unloaded.
pub struct SdkApi {
    // Field order is drop order: C handles are freed in `Drop`, then the arenas they may
    // point into are dropped, and the library (owner of the function table) goes last.
    pub(super) contexts: Vec<Option<ContextSlot>>,
    pub(super) graphs: Vec<GraphSlot>,
    devices: Vec<Option<DeviceSlot>>,
    backends: Vec<Option<b::Qnn_BackendHandle_t>>,
    logs: Vec<Option<b::Qnn_LogHandle_t>>,
    /// The backend and device the execute side loads binaries into (created on first use).
    pub(super) run_target: Option<(BackendHandle, DeviceHandle)>,
    /// Reads the I/O metadata of binaries for the execute side.
    pub(super) system: Option<SystemApi>,
    pub(super) table: b::CoreTable,
    provider: ProviderInfo,
    path: PathBuf,
    /// Owner of the code behind `table`; never read, only kept loaded.
    _library: Library,
}

pub(super) fn entry<F>(function: &'static str, f: Option<F>) -> Result<F, ApiError> {
    f.ok_or(ApiError::Unsupported { function })
}

pub(super) fn check(function: &'static str, code: b::Qnn_ErrorHandle_t) -> Result<(), ApiError> {
    // QNN_GET_ERROR_CODE: only the low 16 bits carry the code.
    if code & 0xFFFF == 0 {
        Ok(())
    } else {
        Err(ApiError::Qnn { function, code })
    }
}

/// Runs one C call and checks its result; a failure carries the lines the backend logged
/// during the call ([`super::log`]).
pub(super) fn call(function: &'static str, f: impl FnOnce() -> b::Qnn_ErrorHandle_t) -> Result<(), ApiError> {
    let mark = log::mark();
    check(function, f()).map_err(|e| e.with_log(log::lines_since(mark)))
}

pub(super) fn stale(function: &'static str, handle: impl std::fmt::Display) -> ApiError {
    ApiError::StaleHandle { function, handle: handle.to_string() }
}

pub(super) fn marshal_error(function: &'static str) -> impl FnOnce(MarshalError) -> ApiError {
    move |source| ApiError::marshal(function, source)
}

/// `name` as a C string for `function`.
pub(super) fn c_string(function: &'static str, what: &'static str, name: &str) -> Result<CString, ApiError> {
    CString::new(name).map_err(|_| ApiError::marshal(function, MarshalError::Nul { what, value: name.into() }))
}

fn live<T: Copy>(slots: &[Option<T>], index: u32) -> Option<T> {
    slots.get((index as usize).checked_sub(1)?).copied().flatten()
}

/// Every tensor of an op config must be well formed before its struct is built.
fn check_op(function: &'static str, op: &OpConfig<'_>) -> Result<(), ApiError> {
    let params = op.params.iter().filter_map(|p| match &p.value {
        BoundParamValue::Tensor(t) => Some(t),
        BoundParamValue::Scalar(_) => None,
    });
    for t in op.inputs.iter().chain(&op.outputs).chain(params) {
        t.tensor.check_layout().map_err(|source| ApiError::tensor(function, Some(op.name), source))?;
    }
    Ok(())
}

impl SdkApi {
    /// Opens `paths.backend` (the system library is opened separately by
    /// [`super::SystemApi`]).
    pub fn load(paths: &LibraryPaths) -> Result<SdkApi, LoadError> {
        SdkApi::load_backend(&paths.backend)
    }

    /// Opens a backend library and selects its provider: core API major equal to the
    /// bindings', minor at least the bindings', HTP backend id.
    pub fn load_backend(path: &Path) -> Result<SdkApi, LoadError> {
        let library = library::open(path)?;
        let (table, provider) = library::core_provider(&library, path)?;
        Ok(SdkApi {
            contexts: Vec::new(),
            graphs: Vec::new(),
            devices: Vec::new(),
            backends: Vec::new(),
            logs: Vec::new(),
            run_target: None,
            system: None,
            table,
            provider,
            path: path.to_path_buf(),
            _library: library,
        })
    }

    /// Opens the backend and the system library of `paths`, as the execute side
    /// ([`QnnExecApi`](crate::sdk::QnnExecApi)) needs both: the system library reads each
    /// binary's graph I/O (ids, names, types, dims, encodings) to bind `graphExecute`'s tensors.
    pub fn load_for_execution(paths: &LibraryPaths) -> Result<SdkApi, LoadError> {
        Ok(SdkApi::load(paths)?.with_system(SystemApi::load(&paths.system)?))
    }

    /// Uses `system` to read the metadata of the binaries this API loads.
    pub fn with_system(mut self, system: SystemApi) -> SdkApi {
        self.system = Some(system);
        self
    }

    /// The system library, if one was given.
    pub fn system(&self) -> Option<&SystemApi> {
        self.system.as_ref()
    }

    /// The provider in use.
    pub fn provider(&self) -> &ProviderInfo {
        &self.provider
    }

    /// The library file in use.
    pub fn library_path(&self) -> &Path {
        &self.path
    }

    fn log(&self, log: Option<LogHandle>, function: &'static str) -> Result<b::Qnn_LogHandle_t, ApiError> {
        match log {
            None => Ok(ptr::null_mut()),
            Some(h) => live(&self.logs, h.0).ok_or_else(|| stale(function, h)),
        }
    }

    pub(super) fn backend(&self, h: BackendHandle, function: &'static str) -> Result<b::Qnn_BackendHandle_t, ApiError> {
        live(&self.backends, h.0).ok_or_else(|| stale(function, h))
    }

    pub(super) fn context_index(&self, h: ContextHandle, function: &'static str) -> Result<usize, ApiError> {
        let index = (h.0 as usize).checked_sub(1).ok_or_else(|| stale(function, h))?;
        match self.contexts.get(index) {
            Some(Some(_)) => Ok(index),
            _ => Err(stale(function, h)),
        }
    }

    /// The raw graph handle and the index of its (live) context.
    pub(super) fn graph(
        &self,
        h: GraphHandle,
        function: &'static str,
    ) -> Result<(b::Qnn_GraphHandle_t, usize), ApiError> {
        let slot = (h.0 as usize).checked_sub(1).and_then(|i| self.graphs.get(i)).ok_or_else(|| stale(function, h))?;
        match self.contexts.get(slot.context) {
            Some(Some(_)) => Ok((slot.raw, slot.context)),
            _ => Err(stale(function, h)),
        }
    }

    pub(super) fn device_raw(&self, h: DeviceHandle) -> Option<b::Qnn_DeviceHandle_t> {
        match (h.0 as usize).checked_sub(1).and_then(|i| self.devices.get(i)) {
            Some(Some(slot)) => Some(slot.raw),
            _ => None,
        }
    }

    pub(super) fn context_slot(&mut self, index: usize) -> &mut ContextSlot {
        self.contexts[index].as_mut().expect("index was checked to be live")
    }
}

impl QnnApi for SdkApi {
    fn log_create(&mut self, level: LogLevel) -> Result<LogHandle, ApiError> {
        const F: &str = "logCreate";
        let create = entry(F, self.table.logCreate)?;
        let mut raw: b::Qnn_LogHandle_t = ptr::null_mut();
        // Our callback keeps the lines, so errors can quote the backend's own words.
        // SAFETY: valid out-pointer; the level is a documented enumerator; the callback has
        // the C signature QNN calls (see `log`).
        call(F, || unsafe { create(log::callback(), level.code() as _, &mut raw) })?;
        self.logs.push(Some(raw));
        Ok(LogHandle(self.logs.len() as u32))
    }

    fn backend_create(&mut self, log: Option<LogHandle>) -> Result<BackendHandle, ApiError> {
        const F: &str = "backendCreate";
        let create = entry(F, self.table.backendCreate)?;
        let log = self.log(log, F)?;
        let mut raw: b::Qnn_BackendHandle_t = ptr::null_mut();
        // SAFETY: live log handle (or NULL), no configs, valid out-pointer.
        call(F, || unsafe { create(log, ptr::null_mut(), &mut raw) })?;
        self.backends.push(Some(raw));
        Ok(BackendHandle(self.backends.len() as u32))
    }

    fn device_create(&mut self, log: Option<LogHandle>, config: &[DeviceConfig]) -> Result<DeviceHandle, ApiError> {
        const F: &str = "deviceCreate";
        let create = entry(F, self.table.deviceCreate)?;
        let log = self.log(log, F)?;
        let mut arena = Arena::default();
        let configs = marshal::device_configs(&mut arena, config);
        let mut raw: b::Qnn_DeviceHandle_t = ptr::null_mut();
        // SAFETY: the NULL-terminated config list and everything it points to live in
        // `arena`, which is kept until the device is freed.
        call(F, || unsafe { create(log, configs, &mut raw) })?;
        self.devices.push(Some(DeviceSlot { raw, _configs: arena }));
        Ok(DeviceHandle(self.devices.len() as u32))
    }

    fn context_create(
        &mut self,
        backend: BackendHandle,
        device: DeviceHandle,
        config: &[ContextConfig],
    ) -> Result<ContextHandle, ApiError> {
        const F: &str = "contextCreate";
        let create = entry(F, self.table.contextCreate)?;
        let raw_backend = self.backend(backend, F)?;
        let raw_device = match (device.0 as usize).checked_sub(1).and_then(|i| self.devices.get(i)) {
            Some(Some(slot)) => slot.raw,
            _ => return Err(stale(F, device)),
        };
        let mut arena = Arena::default();
        let configs = marshal::context_configs(&mut arena, config);
        let mut raw: b::Qnn_ContextHandle_t = ptr::null_mut();
        // SAFETY: live handles; configs owned by `arena`, kept with the context.
        call(F, || unsafe { create(raw_backend, raw_device, configs, &mut raw) })?;
        self.contexts.push(Some(ContextSlot { raw, arena, info: None }));
        Ok(ContextHandle(self.contexts.len() as u32))
    }

    fn graph_create(
        &mut self,
        context: ContextHandle,
        name: &str,
        config: &[GraphConfig],
    ) -> Result<GraphHandle, ApiError> {
        const F: &str = "graphCreate";
        let create = entry(F, self.table.graphCreate)?;
        let index = self.context_index(context, F)?;
        let slot = self.context_slot(index);
        let c_name = c_string(F, "graph name", name)?;
        let configs = marshal::graph_configs(&mut slot.arena, config);
        let mut raw: b::Qnn_GraphHandle_t = ptr::null_mut();
        // SAFETY: live context; name and configs outlive the call (configs with the context).
        call(F, || unsafe { create(slot.raw, c_name.as_ptr(), configs, &mut raw) })?;
        slot.arena.hold(c_name);
        self.graphs.push(GraphSlot { raw, context: index, io: None });
        Ok(GraphHandle(self.graphs.len() as u32))
    }

    fn tensor_create_graph_tensor(&mut self, graph: GraphHandle, tensor: &QnnTensor) -> Result<TensorId, ApiError> {
        const F: &str = "tensorCreateGraphTensor";
        let create = entry(F, self.table.tensorCreateGraphTensor)?;
        tensor.check_layout().map_err(|source| ApiError::tensor(F, None, source))?;
        let (raw_graph, index) = self.graph(graph, F)?;
        let arena = &mut self.context_slot(index).arena;
        let c = marshal::tensor(arena, tensor, 0).map_err(marshal_error(F))?;
        let c = arena.hold(c);
        // SAFETY: live graph; the tensor struct and all its buffers live in the context's
        // arena; QNN writes the assigned id into the struct.
        call(F, || unsafe { create(raw_graph, c) })?;
        // SAFETY: `c` is the version-2 tensor built above.
        Ok(TensorId(unsafe { (*c).__bindgen_anon_1.v2.id }))
    }

    fn backend_validate_op_config(&mut self, backend: BackendHandle, op: &OpConfig<'_>) -> Result<(), ApiError> {
        const F: &str = "backendValidateOpConfig";
        let validate = entry(F, self.table.backendValidateOpConfig)?;
        let raw = self.backend(backend, F)?;
        check_op(F, op)?;
        // Validation does not keep the op: its storage only has to outlive the call.
        let mut arena = Arena::default();
        let c = marshal::op_config(&mut arena, op).map_err(marshal_error(F))?;
        // SAFETY: live backend; the op config is passed by value, its pointers into `arena`.
        call(F, || unsafe { validate(raw, c) })
    }

    fn graph_add_node(&mut self, graph: GraphHandle, op: &OpConfig<'_>) -> Result<(), ApiError> {
        const F: &str = "graphAddNode";
        let add = entry(F, self.table.graphAddNode)?;
        check_op(F, op)?;
        let (raw_graph, index) = self.graph(graph, F)?;
        let arena = &mut self.context_slot(index).arena;
        let c = marshal::op_config(arena, op).map_err(marshal_error(F))?;
        // SAFETY: live graph; the op config's pointers live in the context's arena.
        call(F, || unsafe { add(raw_graph, c) })
    }

    fn graph_finalize(&mut self, graph: GraphHandle) -> Result<(), ApiError> {
        const F: &str = "graphFinalize";
        let finalize = entry(F, self.table.graphFinalize)?;
        let (raw, _) = self.graph(graph, F)?;
        // SAFETY: live graph; no profile, no signal.
        call(F, || unsafe { finalize(raw, ptr::null_mut(), ptr::null_mut()) })
    }

    fn context_get_binary_size(&mut self, context: ContextHandle) -> Result<u64, ApiError> {
        const F: &str = "contextGetBinarySize";
        let get = entry(F, self.table.contextGetBinarySize)?;
        let index = self.context_index(context, F)?;
        let mut size = 0;
        // SAFETY: live context, valid out-pointer.
        call(F, || unsafe { get(self.context_slot(index).raw, &mut size) })?;
        Ok(size)
    }

    fn context_get_binary(&mut self, context: ContextHandle, buffer: &mut [u8]) -> Result<u64, ApiError> {
        const F: &str = "contextGetBinary";
        let get = entry(F, self.table.contextGetBinary)?;
        let index = self.context_index(context, F)?;
        let mut written = 0;
        let raw = self.context_slot(index).raw;
        // SAFETY: live context; QNN writes at most `buffer.len()` bytes into `buffer`.
        call(F, || unsafe { get(raw, buffer.as_mut_ptr().cast(), buffer.len() as u64, &mut written) })?;
        Ok(written)
    }

    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError> {
        const F: &str = "contextFree";
        let free = entry(F, self.table.contextFree)?;
        let index = self.context_index(context, F)?;
        // SAFETY: live context, no profile.
        call(F, || unsafe { free(self.context_slot(index).raw, ptr::null_mut()) })?;
        // Only now may the buffers QNN read go away; the context's graphs die with it.
        self.contexts[index] = None;
        Ok(())
    }

    fn device_free(&mut self, device: DeviceHandle) -> Result<(), ApiError> {
        const F: &str = "deviceFree";
        let free = entry(F, self.table.deviceFree)?;
        let index = (device.0 as usize).checked_sub(1).ok_or_else(|| stale(F, device))?;
        let raw = match self.devices.get(index) {
            Some(Some(slot)) => slot.raw,
            _ => return Err(stale(F, device)),
        };
        // SAFETY: live device.
        call(F, || unsafe { free(raw) })?;
        self.devices[index] = None;
        Ok(())
    }

    fn backend_free(&mut self, backend: BackendHandle) -> Result<(), ApiError> {
        const F: &str = "backendFree";
        let free = entry(F, self.table.backendFree)?;
        let raw = self.backend(backend, F)?;
        // SAFETY: live backend.
        call(F, || unsafe { free(raw) })?;
        self.backends[backend.0 as usize - 1] = None;
        Ok(())
    }

    fn log_free(&mut self, log: LogHandle) -> Result<(), ApiError> {
        const F: &str = "logFree";
        let free = entry(F, self.table.logFree)?;
        let raw = live(&self.logs, log.0).ok_or_else(|| stale(F, log))?;
        // SAFETY: live log.
        call(F, || unsafe { free(raw) })?;
        self.logs[log.0 as usize - 1] = None;
        Ok(())
    }
}

impl Drop for SdkApi {
    /// Frees what the caller left open; errors cannot be reported from here.
    fn drop(&mut self) {
        for slot in self.contexts.iter_mut().rev() {
            if let (Some(s), Some(free)) = (slot.as_ref(), self.table.contextFree) {
                // SAFETY: live context.
                unsafe { free(s.raw, ptr::null_mut()) };
            }
            *slot = None;
        }
        for slot in self.devices.iter_mut().rev() {
            if let (Some(s), Some(free)) = (slot.as_ref(), self.table.deviceFree) {
                // SAFETY: live device.
                unsafe { free(s.raw) };
            }
            *slot = None;
        }
        for raw in self.backends.iter_mut().rev().filter_map(Option::take) {
            if let Some(free) = self.table.backendFree {
                // SAFETY: live backend.
                unsafe { free(raw) };
            }
        }
        for raw in self.logs.iter_mut().rev().filter_map(Option::take) {
            if let Some(free) = self.table.logFree {
                // SAFETY: live log.
                unsafe { free(raw) };
            }
        }
    }
}
