//! [`QnnExecApi`] through a loaded QNN backend library: `contextCreateFromBinary`,
//! `graphRetrieve`, `graphExecute` and `contextFree` (on x86, `libQnnHtp.so` runs the graphs
//! in its HTP emulation).
//!
//! `graphExecute` takes one `Qnn_Tensor_t` per graph input and output, each repeating the id,
//! name, data type, dims and encoding the binary records and pointing its client buffer at the
//! caller's data. Those tensors come from the binary's metadata, read with the system library
//! when the context is created ([`SdkApi::load_for_execution`]); a retrieved graph keeps
//! ready-made tensor structs, and each execute only checks the caller's buffer sizes and
//! points the structs at them.

use std::ptr;

use super::bindings as b;
use super::marshal::{self, Arena};
use super::sdk_api::{c_string, call, entry, stale, ContextSlot, GraphSlot, SdkApi};
use crate::io::{GraphIo, IoTensor};
use crate::sdk::api::{ApiError, ContextHandle, GraphHandle, QnnApi};
use crate::sdk::exec::{io_element_bytes, IoBindingError, QnnExecApi};

/// The bound I/O of a retrieved graph.
pub(crate) struct ExecIo {
    info: GraphIo,
    /// Bytes of each input's / output's client buffer.
    input_bytes: Vec<usize>,
    output_bytes: Vec<usize>,
    inputs: Vec<b::Qnn_Tensor_t>,
    outputs: Vec<b::Qnn_Tensor_t>,
    /// Names, dims and encodings the tensor structs point to.
    _arena: Arena,
}

/// The id and client-buffer bytes of `t`, or why it cannot be bound.
fn binding(graph: &str, t: &IoTensor) -> Result<(u32, usize), IoBindingError> {
    let (graph, tensor) = (graph.to_string(), t.name.clone());
    let Some(id) = t.id else { return Err(IoBindingError::NoTensorId { graph, tensor }) };
    let Some(element) = io_element_bytes(t.dtype) else {
        return Err(IoBindingError::NoBufferLayout { graph, tensor, dtype: t.dtype });
    };
    Ok((id, t.numel() * element))
}

/// Why a retrieved graph's I/O could not be bound.
enum BindError {
    Io(IoBindingError),
    Marshal(crate::sdk::api::MarshalError),
}

impl ExecIo {
    fn new(info: GraphIo) -> Result<ExecIo, BindError> {
        let mut arena = Arena::default();
        let mut bind = |list: &[IoTensor], output: bool| -> Result<(Vec<usize>, Vec<b::Qnn_Tensor_t>), BindError> {
            let mut sizes = Vec::with_capacity(list.len());
            let mut tensors = Vec::with_capacity(list.len());
            for t in list {
                let (id, bytes) = binding(&info.name, t).map_err(BindError::Io)?;
                sizes.push(bytes);
                tensors.push(marshal::io_tensor(&mut arena, t, id, output).map_err(BindError::Marshal)?);
            }
            Ok((sizes, tensors))
        };
        let (input_bytes, inputs) = bind(&info.inputs, false)?;
        let (output_bytes, outputs) = bind(&info.outputs, true)?;
        Ok(ExecIo { info, input_bytes, output_bytes, inputs, outputs, _arena: arena })
    }

    /// Every buffer must have exactly its tensor's size: QNN reads and writes that many bytes.
    fn check_buffers(&self, inputs: &[&[u8]], outputs: &[&mut [u8]]) -> Result<(), IoBindingError> {
        let g = &self.info;
        if inputs.len() != g.inputs.len() || outputs.len() != g.outputs.len() {
            return Err(IoBindingError::BufferCount {
                graph: g.name.clone(),
                inputs: g.inputs.len(),
                outputs: g.outputs.len(),
                given_inputs: inputs.len(),
                given_outputs: outputs.len(),
            });
        }
        let given = inputs.iter().map(|b| b.len()).chain(outputs.iter().map(|b| b.len()));
        let wanted = self.input_bytes.iter().chain(&self.output_bytes);
        for ((t, given), &expected) in g.inputs.iter().chain(&g.outputs).zip(given).zip(wanted) {
            let (graph, tensor) = (g.name.clone(), t.name.clone());
            if given != expected {
                return Err(IoBindingError::BufferSize { graph, tensor, given, expected });
            }
            if u32::try_from(expected).is_err() {
                return Err(IoBindingError::BufferTooLarge { graph, tensor });
            }
        }
        Ok(())
    }
}

impl SdkApi {
    /// The graphs and I/O of a context binary, read with the system library.
    pub fn binary_info(&self, binary: &[u8]) -> Result<super::BinaryInfo, ApiError> {
        let system = (self.system.as_ref())
            .ok_or_else(|| ApiError::io_binding("systemContextGetMetaData", IoBindingError::NoSystemLibrary))?;
        system.binary_info(binary)
    }

    /// The backend and device binaries are loaded into, created on first use.
    fn run_target(&mut self) -> Result<(b::Qnn_BackendHandle_t, b::Qnn_DeviceHandle_t), ApiError> {
        let (backend, device) = match self.run_target {
            Some(t) => t,
            None => {
                let backend = self.backend_create(None)?;
                let device = self.device_create(None, &[])?;
                self.run_target = Some((backend, device));
                (backend, device)
            }
        };
        let raw_device = self.device_raw(device).ok_or_else(|| stale("contextCreateFromBinary", device))?;
        Ok((self.backend(backend, "contextCreateFromBinary")?, raw_device))
    }
}

impl QnnExecApi for SdkApi {
    fn context_create_from_binary(&mut self, binary: &[u8]) -> Result<ContextHandle, ApiError> {
        const F: &str = "contextCreateFromBinary";
        let create = entry(F, self.table.contextCreateFromBinary)?;
        // The metadata first: without it no graph of the context could be executed.
        let info = self.binary_info(binary)?;
        let (backend, device) = self.run_target()?;
        let mut raw: b::Qnn_ContextHandle_t = ptr::null_mut();
        // SAFETY: live backend and device; no configs; QNN reads `binary.len()` bytes of
        // `binary` during the call; valid out-pointer; no profile.
        call(F, || unsafe {
            create(
                backend,
                device,
                ptr::null_mut(),
                binary.as_ptr().cast(),
                binary.len() as u64,
                &mut raw,
                ptr::null_mut(),
            )
        })?;
        self.contexts.push(Some(ContextSlot { raw, arena: Arena::default(), info: Some(info) }));
        Ok(ContextHandle(self.contexts.len() as u32))
    }

    fn graph_retrieve(&mut self, context: ContextHandle, name: &str) -> Result<GraphHandle, ApiError> {
        const F: &str = "graphRetrieve";
        let retrieve = entry(F, self.table.graphRetrieve)?;
        let index = self.context_index(context, F)?;
        let slot = self.context_slot(index);
        let info = slot
            .info
            .as_ref()
            .ok_or_else(|| ApiError::io_binding(F, IoBindingError::NotFromBinary { context }))?
            .graphs
            .iter()
            .find(|g| g.name == name)
            .cloned();
        let c_name = c_string(F, "graph name", name)?;
        let mut raw: b::Qnn_GraphHandle_t = ptr::null_mut();
        // SAFETY: live context; NUL-terminated name; valid out-pointer.
        call(F, || unsafe { retrieve(slot.raw, c_name.as_ptr(), &mut raw) })?;
        // The backend found the graph; its I/O must be in the binary's metadata to be bound.
        let not_listed = IoBindingError::NotInMetadata { context, graph: name.to_string() };
        let info = info.ok_or_else(|| ApiError::io_binding(F, not_listed))?;
        let io = ExecIo::new(info).map_err(|e| match e {
            BindError::Io(source) => ApiError::io_binding(F, source),
            BindError::Marshal(source) => ApiError::marshal(F, source),
        })?;
        self.graphs.push(GraphSlot { raw, context: index, io: Some(io) });
        Ok(GraphHandle(self.graphs.len() as u32))
    }

    fn graph_execute(
        &mut self,
        graph: GraphHandle,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), ApiError> {
        const F: &str = "graphExecute";
        let execute = entry(F, self.table.graphExecute)?;
        let (raw, _) = self.graph(graph, F)?;
        let io = self.graphs[graph.0 as usize - 1]
            .io
            .as_ref()
            .ok_or_else(|| ApiError::io_binding(F, IoBindingError::NotRetrieved { graph }))?;
        io.check_buffers(inputs, outputs).map_err(|source| ApiError::io_binding(F, source))?;
        let mut c_inputs = io.inputs.clone();
        for (t, data) in c_inputs.iter_mut().zip(inputs) {
            // QNN only reads input buffers.
            marshal::set_client_buffer(t, data.as_ptr() as *mut _, data.len() as u32);
        }
        let mut c_outputs = io.outputs.clone();
        for (t, data) in c_outputs.iter_mut().zip(outputs.iter_mut()) {
            marshal::set_client_buffer(t, data.as_mut_ptr().cast(), data.len() as u32);
        }
        // SAFETY: live graph; the tensor structs point into `io` (names, dims) and into the
        // caller's buffers, whose sizes were checked, all alive for the call; no profile, no
        // signal (synchronous execution).
        call(F, || unsafe {
            execute(
                raw,
                c_inputs.as_ptr(),
                c_inputs.len() as u32,
                c_outputs.as_mut_ptr(),
                c_outputs.len() as u32,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        })
    }

    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError> {
        QnnApi::context_free(self, context)
    }
}
