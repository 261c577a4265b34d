//! Building the C structs of the QNN API from the graph model.
//!
//! QNN reads names, dims and quantization arrays through raw pointers, possibly until the
//! context is serialized. Every buffer a struct built here points into is therefore owned by an
//! [`Arena`] that the caller keeps alive for as long as QNN may look (for tensors and nodes:
//! until the context is freed). Static data is the exception: the backend copies it when the
//! tensor is created, so it is only borrowed for the call. Structs are zero-initialised and filled
//! field by field so that members added by newer headers stay zero ("not set").

use std::any::Any;
use std::ffi::CString;
use std::mem::MaybeUninit;
use std::os::raw::{c_char, c_void};
use std::ptr;

use super::bindings as b;
use crate::dtype::TensorType;
use crate::encoding::{BlockScales, Encoding, ScaleOffset};
use crate::graph::{QnnTensor, Scalar};
use crate::sdk::api::{BoundParamValue, BoundTensor, MarshalError, OpConfig};
use crate::sdk::config::{ContextConfig, DeviceConfig, GraphConfig};

// Enumerator values (`QnnTypes.h`, the HTP headers); `as _` adapts them to each enum's C type.
const TENSOR_VERSION_2: u32 = 2;
const OPCONFIG_VERSION_1: u32 = 1;
const DATA_FORMAT_DENSE: u32 = 0;
const MEM_TYPE_RAW: u32 = 0;
const SPARSE_LAYOUT_UNDEFINED: u32 = 0x7FFF_FFFF;
const PARAM_SCALAR: u32 = 0;
const PARAM_TENSOR: u32 = 1;
const CONFIG_CUSTOM: u32 = 0;
const DEVICE_CONFIG_PLATFORM_INFO: u32 = 1;
const HTP_DEVICE_SOC: u32 = 0;
const HTP_DEVICE_SIGNEDPD: u32 = 2;
const HTP_DEVICE_TYPE_ON_CHIP: u32 = 0;
const HTP_GRAPH_OPTIMIZATION: u32 = 1;
const HTP_GRAPH_PRECISION: u32 = 2;
const HTP_GRAPH_VTCM_SIZE_IN_MB: u32 = 3;
const HTP_GRAPH_FOLD_RELU_OFF: u32 = 4;
const HTP_CONTEXT_WEIGHT_SHARING: u32 = 1;
const INFO_VERSION_1: u32 = 1;

/// Zero-initialised C struct. All bindgen structs used here are plain data for which
/// all-zero bytes are valid (integers, raw pointers, `Option<fn>`), and zero means "unset".
fn zeroed<T: Copy>() -> T {
    // SAFETY: see above; only called with bindgen-generated plain-data types.
    unsafe { MaybeUninit::zeroed().assume_init() }
}

/// Owner of everything QNN may still read through pointers handed to it.
#[derive(Default)]
pub(crate) struct Arena(Vec<Box<dyn Any>>);

impl Arena {
    /// Moves `value` to the heap and returns a pointer that stays valid while the arena lives.
    pub(crate) fn hold<T: 'static>(&mut self, value: T) -> *mut T {
        let mut boxed = Box::new(value);
        let ptr: *mut T = &mut *boxed;
        self.0.push(boxed);
        ptr
    }

    /// Keeps a vector and returns its data pointer (null when empty).
    fn slice<T: 'static>(&mut self, mut items: Vec<T>) -> *mut T {
        if items.is_empty() {
            return ptr::null_mut();
        }
        let ptr = items.as_mut_ptr();
        self.0.push(Box::new(items));
        ptr
    }

    fn c_str(&mut self, what: &'static str, s: &str) -> Result<*const c_char, MarshalError> {
        let c = CString::new(s).map_err(|_| MarshalError::Nul { what, value: s.to_string() })?;
        let ptr = c.as_ptr();
        self.0.push(Box::new(c));
        Ok(ptr)
    }
}

fn scale_offset(so: &ScaleOffset) -> b::Qnn_ScaleOffset_t {
    let mut c: b::Qnn_ScaleOffset_t = zeroed();
    c.scale = so.scale;
    c.offset = so.offset;
    c
}

fn scale_offsets(arena: &mut Arena, list: &[ScaleOffset]) -> *mut b::Qnn_ScaleOffset_t {
    arena.slice(list.iter().map(scale_offset).collect())
}

fn quantize_params(arena: &mut Arena, encoding: &Encoding) -> b::Qnn_QuantizeParams_t {
    let mut q: b::Qnn_QuantizeParams_t = zeroed();
    q.encodingDefinition = encoding.definition() as _;
    q.quantizationEncoding = encoding.raw() as _;
    match encoding {
        Encoding::Undefined => {}
        Encoding::ScaleOffset(so) => q.__bindgen_anon_1.scaleOffsetEncoding = scale_offset(so),
        Encoding::AxisScaleOffset { axis, scale_offsets: list } => {
            let mut a: b::Qnn_AxisScaleOffset_t = zeroed();
            a.axis = *axis as i32;
            a.numScaleOffsets = list.len() as u32;
            a.scaleOffset = scale_offsets(arena, list);
            q.__bindgen_anon_1.axisScaleOffsetEncoding = a;
        }
        Encoding::BlockwiseExpansion(bw) => {
            let mut e: b::Qnn_BlockwiseExpansion_t = zeroed();
            e.axis = bw.axis as i32;
            e.scaleOffsets = scale_offsets(arena, &bw.scale_offsets);
            e.numBlocksPerAxis = bw.num_blocks_per_axis;
            e.blockScaleBitwidth = bw.block_scale_bitwidth;
            e.blockScaleStorageType = bw.block_scales.storage_type() as _;
            match &bw.block_scales {
                BlockScales::U8(s) => e.__bindgen_anon_1.blocksScale8 = arena.slice(s.to_vec()),
                BlockScales::U16(s) => e.__bindgen_anon_1.blocksScale16 = arena.slice(s.to_vec()),
            }
            q.__bindgen_anon_1.blockwiseExpansion = arena.hold(e);
        }
    }
    q
}

/// A `Qnn_Tensor_t` (version 2) for `tensor` with the given id (0 before creation).
/// `tensor` must have passed [`QnnTensor::check_layout`]: QNN derives array lengths from `dims`.
pub(crate) fn tensor(arena: &mut Arena, tensor: &QnnTensor, id: u32) -> Result<b::Qnn_Tensor_t, MarshalError> {
    let mut v2: b::Qnn_TensorV2_t = zeroed();
    v2.id = id;
    v2.name = arena.c_str("tensor name", &tensor.name)?;
    v2.type_ = tensor.tensor_type.raw() as _;
    v2.dataFormat = DATA_FORMAT_DENSE as _;
    v2.dataType = tensor.dtype.raw() as _;
    v2.quantizeParams = quantize_params(arena, &tensor.encoding);
    v2.rank = tensor.dims.len() as u32;
    v2.dimensions = arena.slice(tensor.dims.clone());
    v2.memType = MEM_TYPE_RAW as _;
    let mut buffer: b::Qnn_ClientBuffer_t = zeroed();
    if let Some(data) = &tensor.data {
        let bytes = data.bytes();
        // QNN only reads static client buffers, and only during the call: tensor creation
        // copies the data (QnnTensor.h), so the bytes stay the caller's and the arena keeps
        // no handle on them (the driver may free them before finalize).
        buffer.data = bytes.as_ptr() as *mut c_void;
        buffer.dataSize = u32::try_from(bytes.len())
            .map_err(|_| MarshalError::DataTooLarge { tensor: tensor.name.clone(), bytes: bytes.len() })?;
    }
    v2.__bindgen_anon_1.clientBuf = buffer;
    v2.isDynamicDimensions = ptr::null_mut();
    v2.sparseParams.type_ = SPARSE_LAYOUT_UNDEFINED as _;
    v2.isProduced = 0;
    let mut t: b::Qnn_Tensor_t = zeroed();
    t.version = TENSOR_VERSION_2 as _;
    t.__bindgen_anon_1.v2 = v2;
    Ok(t)
}

fn scalar(s: Scalar) -> b::Qnn_Scalar_t {
    let mut c: b::Qnn_Scalar_t = zeroed();
    c.dataType = s.dtype().raw() as _;
    let u = &mut c.__bindgen_anon_1;
    match s {
        Scalar::Bool8(v) => u.bool8Value = u8::from(v),
        Scalar::UInt8(v) => u.uint8Value = v,
        Scalar::Int8(v) => u.int8Value = v,
        Scalar::UInt16(v) => u.uint16Value = v,
        Scalar::Int16(v) => u.int16Value = v,
        Scalar::UInt32(v) => u.uint32Value = v,
        Scalar::Int32(v) => u.int32Value = v,
        Scalar::UInt64(v) => u.uint64Value = v,
        Scalar::Int64(v) => u.int64Value = v,
        Scalar::Float32(v) => u.floatValue = v,
        Scalar::Float64(v) => u.doubleValue = v,
    }
    c
}

fn tensors(arena: &mut Arena, list: &[BoundTensor<'_>]) -> Result<(u32, *mut b::Qnn_Tensor_t), MarshalError> {
    let built = list.iter().map(|t| tensor(arena, t.tensor, t.id.0)).collect::<Result<Vec<_>, _>>()?;
    Ok((built.len() as u32, arena.slice(built)))
}

/// A `Qnn_OpConfig_t` (version 1), passed by value to validate/add-node.
pub(crate) fn op_config(arena: &mut Arena, op: &OpConfig<'_>) -> Result<b::Qnn_OpConfig_t, MarshalError> {
    let mut params = Vec::with_capacity(op.params.len());
    for p in &op.params {
        let mut c: b::Qnn_Param_t = zeroed();
        c.name = arena.c_str("param name", p.name)?;
        match &p.value {
            BoundParamValue::Scalar(s) => {
                c.paramType = PARAM_SCALAR as _;
                c.__bindgen_anon_1.scalarParam = scalar(*s);
            }
            BoundParamValue::Tensor(t) => {
                c.paramType = PARAM_TENSOR as _;
                c.__bindgen_anon_1.tensorParam = tensor(arena, t.tensor, t.id.0)?;
            }
        }
        params.push(c);
    }
    let mut v1: b::Qnn_OpConfigV1_t = zeroed();
    v1.name = arena.c_str("node name", op.name)?;
    v1.packageName = arena.c_str("op package", op.package)?;
    v1.typeName = arena.c_str("op type", op.op_type)?;
    v1.numOfParams = params.len() as u32;
    v1.params = arena.slice(params);
    (v1.numOfInputs, v1.inputTensors) = tensors(arena, &op.inputs)?;
    (v1.numOfOutputs, v1.outputTensors) = tensors(arena, &op.outputs)?;
    let mut c: b::Qnn_OpConfig_t = zeroed();
    c.version = OPCONFIG_VERSION_1 as _;
    c.__bindgen_anon_1.v1 = v1;
    Ok(c)
}

/// NULL-terminated array of config pointers, as every `*Create` takes.
fn null_terminated<T: 'static>(arena: &mut Arena, configs: Vec<T>) -> *mut *const T {
    let mut ptrs: Vec<*const T> = configs.into_iter().map(|c| arena.hold(c) as *const T).collect();
    ptrs.push(ptr::null());
    arena.slice(ptrs)
}

fn platform_info(arena: &mut Arena, p: &crate::sdk::config::HtpPlatformInfo) -> *mut b::QnnDevice_PlatformInfo_t {
    let mut on_chip: b::QnnHtpDevice_OnChipDeviceInfoExtension_t = zeroed();
    on_chip.vtcmSize = p.vtcm_mb as _;
    on_chip.socModel = p.soc_model;
    on_chip.signedPdSupport = p.signed_pd_support;
    on_chip.dlbcSupport = p.dlbc_support;
    on_chip.arch = p.arch.raw() as _;
    let mut extension: b::QnnHtpDevice_DeviceInfoExtension_t = zeroed();
    extension.devType = HTP_DEVICE_TYPE_ON_CHIP as _;
    extension.__bindgen_anon_1.onChipDevice = on_chip;

    let mut core_v1: b::QnnDevice_CoreInfoV1_t = zeroed();
    core_v1.coreId = 0;
    core_v1.coreType = 0;
    let mut core: b::QnnDevice_CoreInfo_t = zeroed();
    core.version = INFO_VERSION_1 as _;
    core.__bindgen_anon_1.v1 = core_v1;

    let mut device_v1: b::QnnDevice_HardwareDeviceInfoV1_t = zeroed();
    device_v1.deviceId = 0;
    device_v1.deviceType = 0;
    device_v1.numCores = 1;
    device_v1.cores = arena.hold(core);
    device_v1.deviceInfoExtension = arena.hold(extension).cast();
    let mut device: b::QnnDevice_HardwareDeviceInfo_t = zeroed();
    device.version = INFO_VERSION_1 as _;
    device.__bindgen_anon_1.v1 = device_v1;

    let mut info_v1: b::QnnDevice_PlatformInfoV1_t = zeroed();
    info_v1.numHwDevices = 1;
    info_v1.hwDevices = arena.hold(device);
    let mut info: b::QnnDevice_PlatformInfo_t = zeroed();
    info.version = INFO_VERSION_1 as _;
    info.__bindgen_anon_1.v1 = info_v1;
    arena.hold(info)
}

pub(crate) fn device_configs(arena: &mut Arena, configs: &[DeviceConfig]) -> *mut *const b::QnnDevice_Config_t {
    let mut built = Vec::with_capacity(configs.len());
    for config in configs {
        let mut c: b::QnnDevice_Config_t = zeroed();
        let mut htp: b::QnnHtpDevice_CustomConfig_t = zeroed();
        match config {
            DeviceConfig::HtpSoc(soc) => {
                htp.option = HTP_DEVICE_SOC as _;
                htp.__bindgen_anon_1.socModel = *soc;
            }
            DeviceConfig::HtpSignedPd(on) => {
                let mut pd: b::QnnHtpDevice_UseSignedProcessDomain_t = zeroed();
                pd.deviceId = 0;
                pd.useSignedProcessDomain = *on;
                htp.option = HTP_DEVICE_SIGNEDPD as _;
                htp.__bindgen_anon_1.useSignedProcessDomain = pd;
            }
            DeviceConfig::PlatformInfo(p) => {
                c.option = DEVICE_CONFIG_PLATFORM_INFO as _;
                c.__bindgen_anon_1.hardwareInfo = platform_info(arena, p);
                built.push(c);
                continue;
            }
        }
        c.option = CONFIG_CUSTOM as _;
        c.__bindgen_anon_1.customConfig = arena.hold(htp).cast();
        built.push(c);
    }
    null_terminated(arena, built)
}

pub(crate) fn context_configs(arena: &mut Arena, configs: &[ContextConfig]) -> *mut *const b::QnnContext_Config_t {
    let built = configs
        .iter()
        .map(|config| {
            let mut htp: b::QnnHtpContext_CustomConfig_t = zeroed();
            match config {
                ContextConfig::HtpWeightSharingEnabled(on) => {
                    htp.option = HTP_CONTEXT_WEIGHT_SHARING as _;
                    htp.__bindgen_anon_1.weightSharingEnabled = *on;
                }
            }
            let mut c: b::QnnContext_Config_t = zeroed();
            c.option = CONFIG_CUSTOM as _;
            c.__bindgen_anon_1.customConfig = arena.hold(htp).cast();
            c
        })
        .collect();
    null_terminated(arena, built)
}

pub(crate) fn graph_configs(arena: &mut Arena, configs: &[GraphConfig]) -> *mut *const b::QnnGraph_Config_t {
    let built = configs
        .iter()
        .map(|config| {
            let mut htp: b::QnnHtpGraph_CustomConfig_t = zeroed();
            let u = &mut htp.__bindgen_anon_1;
            match config {
                GraphConfig::HtpOptimization { kind, value } => {
                    let mut o: b::QnnHtpGraph_OptimizationOption_t = zeroed();
                    o.type_ = kind.code() as _;
                    o.floatValue = *value;
                    htp.option = HTP_GRAPH_OPTIMIZATION as _;
                    u.optimizationOption = o;
                }
                GraphConfig::HtpPrecision(p) => {
                    htp.option = HTP_GRAPH_PRECISION as _;
                    u.precision = p.code() as _;
                }
                GraphConfig::HtpVtcmSizeInMb(mb) => {
                    htp.option = HTP_GRAPH_VTCM_SIZE_IN_MB as _;
                    u.vtcmSizeInMB = *mb;
                }
                GraphConfig::HtpFoldReluActivationIntoConvOff(on) => {
                    htp.option = HTP_GRAPH_FOLD_RELU_OFF as _;
                    u.foldReluActivationIntoConvOff = *on;
                }
            }
            let mut c: b::QnnGraph_Config_t = zeroed();
            c.option = CONFIG_CUSTOM as _;
            c.__bindgen_anon_1.customConfig = arena.hold(htp).cast();
            c
        })
        .collect();
    null_terminated(arena, built)
}

/// A `Qnn_Tensor_t` (version 2) binding one graph input (`APP_WRITE`) or output (`APP_READ`)
/// for `graphExecute`, with the id, name, data type, dims and encoding the binary's metadata
/// records and an empty client buffer, which the caller points at its data before each call.
pub(crate) fn io_tensor(
    arena: &mut Arena,
    info: &crate::io::IoTensor,
    id: u32,
    output: bool,
) -> Result<b::Qnn_Tensor_t, MarshalError> {
    let io = QnnTensor {
        name: info.name.clone(),
        tensor_type: if output { TensorType::AppRead } else { TensorType::AppWrite },
        dtype: info.dtype,
        dims: info.dims.clone(),
        encoding: info.quant.map_or(Encoding::Undefined, Encoding::ScaleOffset),
        data: None,
    };
    tensor(arena, &io, id)
}

/// Points the client buffer of a tensor built by [`io_tensor`] at `data`.
pub(crate) fn set_client_buffer(t: &mut b::Qnn_Tensor_t, data: *mut c_void, size: u32) {
    // SAFETY: tensors built here are version 2, so `v2` is the active member.
    let v2 = unsafe { &mut t.__bindgen_anon_1.v2 };
    let mut buffer: b::Qnn_ClientBuffer_t = zeroed();
    buffer.data = data;
    buffer.dataSize = size;
    v2.__bindgen_anon_1.clientBuf = buffer;
}
