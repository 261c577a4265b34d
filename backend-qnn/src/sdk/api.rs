//! The compile-side QNN C API as a Rust trait.
//!
//! Each method is one C entry point of the interface table (named in its doc), taking the
//! graph model's tensors and borrowed op configs instead of C structs. [`crate::sdk::RecordingApi`] implements it by logging,
//! `SdkApi` by calling a real (or mock) backend library. The driver in
//! [`crate::sdk::build_context_binary`] is written once against this trait.
//!
//! Handles are opaque tokens issued by the implementation; they are only meaningful to the
//! object that issued them (for the FFI: indices into its own table, so a handle can never
//! outlive the loaded library).

use std::fmt;

use thiserror::Error;

use super::check::TensorError;
use super::config::{ContextConfig, DeviceConfig, GraphConfig, LogLevel};
use super::exec::IoBindingError;
use crate::graph::{QnnTensor, Scalar};

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u32);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

handle!(
    /// `Qnn_LogHandle_t`.
    LogHandle,
    "log"
);
handle!(
    /// `Qnn_BackendHandle_t`.
    BackendHandle,
    "backend"
);
handle!(
    /// `Qnn_DeviceHandle_t`.
    DeviceHandle,
    "device"
);
handle!(
    /// `Qnn_ContextHandle_t`.
    ContextHandle,
    "context"
);
handle!(
    /// `Qnn_GraphHandle_t` (freed with its context).
    GraphHandle,
    "graph"
);

/// The `id` QNN writes into a tensor at `tensorCreateGraphTensor`; later op configs refer to
/// the tensor by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub u32);

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "id={}", self.0)
    }
}

/// A tensor that has been created, as it appears inside an op config.
#[derive(Debug, Clone, Copy)]
pub struct BoundTensor<'a> {
    pub id: TensorId,
    pub tensor: &'a QnnTensor,
}

/// The value of an op parameter inside an op config.
#[derive(Debug, Clone, Copy)]
pub enum BoundParamValue<'a> {
    Scalar(Scalar),
    Tensor(BoundTensor<'a>),
}

/// `Qnn_Param_t`.
#[derive(Debug, Clone, Copy)]
pub struct BoundParam<'a> {
    pub name: &'a str,
    pub value: BoundParamValue<'a>,
}

/// `Qnn_OpConfig_t` (version 1): every tensor already created.
#[derive(Debug, Clone)]
pub struct OpConfig<'a> {
    pub name: &'a str,
    pub package: &'a str,
    pub op_type: &'a str,
    pub params: Vec<BoundParam<'a>>,
    pub inputs: Vec<BoundTensor<'a>>,
    pub outputs: Vec<BoundTensor<'a>>,
}

/// Why a tensor or op config could not be turned into the C structs of a call.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MarshalError {
    #[error("{what} {value:?} contains a NUL byte")]
    Nul { what: &'static str, value: String },
    #[error("tensor `{tensor}` data has {bytes} bytes; QNN client buffers hold at most 4 GiB")]
    DataTooLarge { tensor: String, bytes: usize },
}

/// Why a context binary's metadata (read with `libQnnSystem.so`) cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum MetadataError {
    #[error("the system library returned no metadata")]
    Missing,
    #[error("{what} version {version} is not supported")]
    UnsupportedVersion { what: &'static str, version: u32 },
    #[error("graph I/O tensor `{tensor}` has quantization encoding {encoding}, not scale/offset")]
    NotScaleOffset { tensor: String, encoding: u32 },
    #[error("graph I/O tensor `{tensor}` has data type {raw:#06x}, which this crate does not model")]
    UnknownDataType { tensor: String, raw: u32 },
}

/// Why one API call failed.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum ApiError {
    /// The backend returned a non-zero `Qnn_ErrorHandle_t`.
    #[error("{function} returned error {code}{}", describe_code(*.code))]
    Qnn { function: &'static str, code: u64 },
    /// The provider's interface table has no entry for this function.
    #[error("{function} is not provided by this backend (NULL entry in its interface table)")]
    Unsupported { function: &'static str },
    /// The call was refused before reaching the backend.
    #[error("{function}: {reason}")]
    InvalidArgument { function: &'static str, reason: String },
    /// The backend failed and said why (the CPU-emulated backend reports its errors this way).
    #[error("{function} failed: {reason}")]
    Backend { function: &'static str, reason: String },
    /// A tensor of the call is malformed (checked before any C struct is built).
    #[error("{function}: {}{source}", node.as_ref().map(|n| format!("node `{n}`: ")).unwrap_or_default())]
    Tensor { function: &'static str, node: Option<String>, source: Box<TensorError> },
    /// A tensor or op config cannot be expressed in the C structs.
    #[error("{function}: {source}")]
    Marshal { function: &'static str, source: Box<MarshalError> },
    /// A handle that this API did not issue or that was already freed.
    #[error("{function}: {handle} is not a live handle of this SdkApi")]
    StaleHandle { function: &'static str, handle: String },
    /// A graph's I/O cannot be bound for `graphExecute`.
    #[error("{function}: {source}")]
    IoBinding { function: &'static str, source: Box<IoBindingError> },
    /// A context binary's metadata cannot be used.
    #[error("systemContextGetMetaData: {source}")]
    Metadata { source: MetadataError },
    /// A failed call with the lines the backend logged during it (its own words for the error).
    #[error("{source}; the backend logged: {}", log.join(" | "))]
    Logged { source: Box<ApiError>, log: Vec<String> },
}

impl ApiError {
    /// The QNN C function that failed.
    pub fn function(&self) -> &'static str {
        match self {
            ApiError::Qnn { function, .. }
            | ApiError::Unsupported { function }
            | ApiError::InvalidArgument { function, .. }
            | ApiError::Backend { function, .. }
            | ApiError::Tensor { function, .. }
            | ApiError::Marshal { function, .. }
            | ApiError::StaleHandle { function, .. }
            | ApiError::IoBinding { function, .. } => function,
            ApiError::Metadata { .. } => "systemContextGetMetaData",
            ApiError::Logged { source, .. } => source.function(),
        }
    }

    /// A tensor or op config that cannot be expressed in C structs, refused by `function`.
    pub fn marshal(function: &'static str, source: MarshalError) -> ApiError {
        ApiError::Marshal { function, source: Box::new(source) }
    }

    /// A graph's I/O that cannot be bound, refused by `function`.
    pub fn io_binding(function: &'static str, source: IoBindingError) -> ApiError {
        ApiError::IoBinding { function, source: Box::new(source) }
    }

    /// A malformed tensor (of `node`, when it belongs to an op config), refused by `function`.
    pub fn tensor(function: &'static str, node: Option<&str>, source: TensorError) -> ApiError {
        ApiError::Tensor { function, node: node.map(str::to_string), source: Box::new(source) }
    }

    /// The backend's log lines for this failure (empty when it logged none or has no log).
    pub fn backend_log(&self) -> &[String] {
        match self {
            ApiError::Logged { log, .. } => log,
            _ => &[],
        }
    }

    /// `self` with `log` attached, when there is any.
    pub fn with_log(self, log: Vec<String>) -> ApiError {
        if log.is_empty() {
            self
        } else {
            ApiError::Logged { source: Box::new(self), log }
        }
    }

    /// The 16-bit QNN error code (`QNN_GET_ERROR_CODE`), if the backend returned one.
    pub fn qnn_code(&self) -> Option<u16> {
        match self {
            ApiError::Qnn { code, .. } => Some((code & 0xFFFF) as u16),
            ApiError::Logged { source, .. } => source.qnn_code(),
            _ => None,
        }
    }
}

/// Names of the error codes documented in `QnnCommon.h` and the per-API headers.
fn describe_code(handle: u64) -> String {
    let code = handle & 0xFFFF;
    let name = match code {
        1000 => "QNN_COMMON_ERROR_NOT_SUPPORTED",
        1002 => "QNN_COMMON_ERROR_MEM_ALLOC",
        1003 => "QNN_COMMON_ERROR_SYSTEM",
        1004 => "QNN_COMMON_ERROR_INVALID_ARGUMENT",
        1005 => "QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED",
        1006 => "QNN_COMMON_ERROR_PLATFORM_NOT_SUPPORTED",
        1007 => "QNN_COMMON_ERROR_SYSTEM_COMMUNICATION",
        1008 => "QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES",
        1009 => "QNN_COMMON_ERROR_LOADING_BINARIES",
        1010 => "QNN_COMMON_ERROR_RESOURCE_UNAVAILABLE",
        1100 => "QNN_COMMON_ERROR_GENERAL",
        7006 => "QNN_TENSOR_ERROR_NAME_HASH_COLLISION",
        _ => {
            let area = match code {
                2000..=2999 => "property",
                3000..=3999 => "op package",
                4000..=4999 => "backend",
                5000..=5999 => "context",
                6000..=6999 => "graph",
                7000..=7999 => "tensor",
                8000..=8999 => "memory",
                11000..=11999 => "log",
                14000..=14999 => "device",
                _ => return String::new(),
            };
            return format!(" ({area} error)");
        }
    };
    format!(" ({name})")
}

/// The compile-side QNN API (mllm's QnnAOTEnv): everything needed to turn graphs
/// into a serialized context binary.
///
/// Implementations must not retain references to arguments beyond the call; the FFI copies
/// what QNN needs into storage owned by the context.
pub trait QnnApi {
    /// `logCreate(callback, maxLogLevel, &log)`.
    fn log_create(&mut self, level: LogLevel) -> Result<LogHandle, ApiError>;

    /// `backendCreate(log, config = NULL, &backend)`.
    fn backend_create(&mut self, log: Option<LogHandle>) -> Result<BackendHandle, ApiError>;

    /// `deviceCreate(log, config, &device)`.
    fn device_create(&mut self, log: Option<LogHandle>, config: &[DeviceConfig]) -> Result<DeviceHandle, ApiError>;

    /// `contextCreate(backend, device, config, &context)`.
    fn context_create(
        &mut self,
        backend: BackendHandle,
        device: DeviceHandle,
        config: &[ContextConfig],
    ) -> Result<ContextHandle, ApiError>;

    /// `graphCreate(context, name, config, &graph)`.
    fn graph_create(
        &mut self,
        context: ContextHandle,
        name: &str,
        config: &[GraphConfig],
    ) -> Result<GraphHandle, ApiError>;

    /// `tensorCreateGraphTensor(graph, &tensor)`; returns the id the backend assigned.
    fn tensor_create_graph_tensor(&mut self, graph: GraphHandle, tensor: &QnnTensor) -> Result<TensorId, ApiError>;

    /// `backendValidateOpConfig(backend, opConfig)`.
    fn backend_validate_op_config(&mut self, backend: BackendHandle, op: &OpConfig<'_>) -> Result<(), ApiError>;

    /// `graphAddNode(graph, opConfig)`.
    fn graph_add_node(&mut self, graph: GraphHandle, op: &OpConfig<'_>) -> Result<(), ApiError>;

    /// `graphFinalize(graph, profile = NULL, signal = NULL)`.
    fn graph_finalize(&mut self, graph: GraphHandle) -> Result<(), ApiError>;

    /// `contextGetBinarySize(context, &size)`.
    fn context_get_binary_size(&mut self, context: ContextHandle) -> Result<u64, ApiError>;

    /// `contextGetBinary(context, buffer, size, &written)`; returns `written`.
    fn context_get_binary(&mut self, context: ContextHandle, buffer: &mut [u8]) -> Result<u64, ApiError>;

    /// `contextFree(context, profile = NULL)`; also invalidates the context's graphs.
    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError>;

    /// `deviceFree(device)`.
    fn device_free(&mut self, device: DeviceHandle) -> Result<(), ApiError>;

    /// `backendFree(backend)`.
    fn backend_free(&mut self, backend: BackendHandle) -> Result<(), ApiError>;

    /// `logFree(log)`.
    fn log_free(&mut self, log: LogHandle) -> Result<(), ApiError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_messages_name_function_and_code() {
        // Bits above the low 16 are reserved for the backend's internal tracking.
        let handle = 0xABCD_0000_0000_0000 | 1004;
        let e = ApiError::Qnn { function: "graphFinalize", code: handle };
        assert_eq!(e.qnn_code(), Some(1004));
        assert_eq!(e.to_string(), format!("graphFinalize returned error {handle} (QNN_COMMON_ERROR_INVALID_ARGUMENT)"));
        let e = ApiError::Qnn { function: "graphAddNode", code: 6003 };
        assert_eq!(e.to_string(), "graphAddNode returned error 6003 (graph error)");
        let e = ApiError::Qnn { function: "graphAddNode", code: 65000 };
        assert_eq!(e.to_string(), "graphAddNode returned error 65000");
        assert_eq!(e.function(), "graphAddNode");
        let logged = e.clone().with_log(vec!["ERROR: node refused".into(), "ERROR: 7004".into()]);
        assert_eq!(logged.qnn_code(), Some(65000));
        assert_eq!(logged.function(), "graphAddNode");
        assert_eq!(
            logged.to_string(),
            "graphAddNode returned error 65000; the backend logged: ERROR: node refused | ERROR: 7004"
        );
        assert_eq!(e.clone().with_log(vec![]), e);
    }
}
