//! [`SystemApi`]: reading a context binary's metadata through `libQnnSystem.so`.
//!
//! This is how a runtime learns which graphs a binary holds and how their inputs and outputs
//! are ordered, identified, typed and quantized (`systemContextGetMetaData`): the execute path
//! binds its tensors from it, and the build checks what it produced.

// C enum fields are `c_uint` or `c_int` depending on the header's values; the explicit
// `as u32` casts keep this code valid for both.
#![allow(clippy::unnecessary_cast)]

use std::ffi::CStr;
use std::path::Path;
use std::ptr;

use libloading::os::unix::Library;

use super::bindings as b;
use super::library::{self, LoadError, ProviderInfo};
use crate::dtype::DataType;
use crate::encoding::{definition, encoding_value, ScaleOffset};
use crate::io::{GraphIo, IoTensor};
use crate::sdk::api::{ApiError, MetadataError};

/// What `systemContextGetMetaData` reports about a context binary.
#[derive(Debug, Clone, PartialEq)]
pub struct BinaryInfo {
    /// Each graph with its I/O in binding order, ids included.
    pub graphs: Vec<GraphIo>,
}

/// The QNN system library (normally `libQnnSystem.so`).
pub struct SystemApi {
    table: b::SystemTable,
    provider: ProviderInfo,
    /// Owner of the code behind `table`; never read, only kept loaded.
    _library: Library,
}

fn entry<F>(function: &'static str, f: Option<F>) -> Result<F, ApiError> {
    f.ok_or(ApiError::Unsupported { function })
}

fn check(function: &'static str, code: b::Qnn_ErrorHandle_t) -> Result<(), ApiError> {
    if code & 0xFFFF == 0 {
        Ok(())
    } else {
        Err(ApiError::Qnn { function, code })
    }
}

fn unsupported_version(what: &'static str, version: u32) -> ApiError {
    ApiError::Metadata { source: MetadataError::UnsupportedVersion { what, version } }
}

/// Copies a NUL-terminated C string.
///
/// # Safety
/// `s` is NULL or points to a NUL-terminated string.
unsafe fn string(s: *const std::os::raw::c_char) -> String {
    if s.is_null() {
        String::new()
    } else {
        // SAFETY: per the function contract.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// # Safety
/// `list` points to `count` tensors owned by the system context.
unsafe fn tensors(list: *const b::Qnn_Tensor_t, count: u32) -> Result<Vec<IoTensor>, ApiError> {
    if list.is_null() || count == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: per the function contract.
    let list = unsafe { std::slice::from_raw_parts(list, count as usize) };
    list.iter()
        .map(|t| {
            // SAFETY: the version field selects the active member.
            let (id, name, dtype, quant, rank, dims) = unsafe {
                match t.version as u32 {
                    1 => {
                        let v = &t.__bindgen_anon_1.v1;
                        (v.id, v.name, v.dataType, v.quantizeParams, v.rank, v.dimensions)
                    }
                    2 => {
                        let v = &t.__bindgen_anon_1.v2;
                        (v.id, v.name, v.dataType, v.quantizeParams, v.rank, v.dimensions)
                    }
                    other => return Err(unsupported_version("tensor", other)),
                }
            };
            let dims = if dims.is_null() {
                Vec::new()
            } else {
                // SAFETY: `rank` dimensions, owned by the system context.
                unsafe { std::slice::from_raw_parts(dims, rank as usize) }.to_vec()
            };
            // SAFETY: tensor names are NUL-terminated.
            let name = unsafe { string(name) };
            let quant = match (quant.encodingDefinition as u32, quant.quantizationEncoding as u32) {
                (definition::DEFINED, encoding_value::SCALE_OFFSET) => {
                    // SAFETY: the encoding selects the active union member.
                    let so = unsafe { quant.__bindgen_anon_1.scaleOffsetEncoding };
                    Some(ScaleOffset { scale: so.scale, offset: so.offset })
                }
                (definition::DEFINED, other) => {
                    return Err(ApiError::Metadata {
                        source: MetadataError::NotScaleOffset { tensor: name, encoding: other },
                    })
                }
                _ => None,
            };
            let dtype = DataType::from_raw(dtype as u32).ok_or_else(|| ApiError::Metadata {
                source: MetadataError::UnknownDataType { tensor: name.clone(), raw: dtype as u32 },
            })?;
            Ok(IoTensor { id: Some(id), name, dtype, dims, quant })
        })
        .collect()
}

impl SystemApi {
    /// Opens the system library and selects a provider with our system API major version
    /// and at least our minor version.
    pub fn load(path: &Path) -> Result<SystemApi, LoadError> {
        let library = library::open(path)?;
        let (table, provider) = library::system_provider(&library, path)?;
        Ok(SystemApi { table, provider, _library: library })
    }

    /// The provider in use.
    pub fn provider(&self) -> &ProviderInfo {
        &self.provider
    }

    /// Graph names and I/O of a serialized context.
    pub fn binary_info(&self, binary: &[u8]) -> Result<BinaryInfo, ApiError> {
        let create = entry("systemContextCreate", self.table.systemContextCreate)?;
        let metadata = entry("systemContextGetMetaData", self.table.systemContextGetMetaData)?;
        let free = entry("systemContextFree", self.table.systemContextFree)?;
        let mut handle: b::QnnSystemContext_Handle_t = ptr::null_mut();
        // SAFETY: valid out-pointer.
        check("systemContextCreate", unsafe { create(&mut handle) })?;
        let mut info: *const b::QnnSystemContext_BinaryInfo_t = ptr::null();
        // SAFETY: live handle; `binary` outlives the call; metadata stays valid until free.
        let read = check("systemContextGetMetaData", unsafe {
            metadata(handle, binary.as_ptr().cast(), binary.len() as u64, &mut info)
        })
        .and_then(|()| {
            if info.is_null() {
                return Err(ApiError::Metadata { source: MetadataError::Missing });
            }
            // SAFETY: non-null metadata owned by `handle`, not yet freed.
            unsafe { copy_info(&*info) }
        });
        // SAFETY: live handle; everything needed was copied out above.
        let freed = check("systemContextFree", unsafe { free(handle) });
        let info = read?;
        freed?;
        Ok(info)
    }
}

/// # Safety
/// `info` and everything it points to is valid.
unsafe fn copy_info(info: &b::QnnSystemContext_BinaryInfo_t) -> Result<BinaryInfo, ApiError> {
    // SAFETY: the version field selects the active member.
    let (count, graphs) = unsafe {
        match info.version as u32 {
            1 => {
                (info.__bindgen_anon_1.contextBinaryInfoV1.numGraphs, info.__bindgen_anon_1.contextBinaryInfoV1.graphs)
            }
            2 => {
                (info.__bindgen_anon_1.contextBinaryInfoV2.numGraphs, info.__bindgen_anon_1.contextBinaryInfoV2.graphs)
            }
            3 => {
                (info.__bindgen_anon_1.contextBinaryInfoV3.numGraphs, info.__bindgen_anon_1.contextBinaryInfoV3.graphs)
            }
            other => return Err(unsupported_version("binary info", other)),
        }
    };
    if graphs.is_null() || count == 0 {
        return Ok(BinaryInfo { graphs: Vec::new() });
    }
    // SAFETY: `count` graph infos owned by the system context.
    let graphs = unsafe { std::slice::from_raw_parts(graphs, count as usize) };
    let graphs = graphs
        .iter()
        .map(|g| {
            // SAFETY: the version field selects the active member; V1–V3 share these fields.
            let (name, n_in, inputs, n_out, outputs) = unsafe {
                let u = &g.__bindgen_anon_1;
                match g.version as u32 {
                    1 => (
                        u.graphInfoV1.graphName,
                        u.graphInfoV1.numGraphInputs,
                        u.graphInfoV1.graphInputs,
                        u.graphInfoV1.numGraphOutputs,
                        u.graphInfoV1.graphOutputs,
                    ),
                    2 => (
                        u.graphInfoV2.graphName,
                        u.graphInfoV2.numGraphInputs,
                        u.graphInfoV2.graphInputs,
                        u.graphInfoV2.numGraphOutputs,
                        u.graphInfoV2.graphOutputs,
                    ),
                    3 => (
                        u.graphInfoV3.graphName,
                        u.graphInfoV3.numGraphInputs,
                        u.graphInfoV3.graphInputs,
                        u.graphInfoV3.numGraphOutputs,
                        u.graphInfoV3.graphOutputs,
                    ),
                    other => return Err(unsupported_version("graph info", other)),
                }
            };
            Ok(GraphIo {
                // SAFETY: pointers from the metadata, valid until the context is freed.
                name: unsafe { string(name) },
                inputs: unsafe { tensors(inputs, n_in)? },
                outputs: unsafe { tensors(outputs, n_out)? },
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(BinaryInfo { graphs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unmodelled_data_type_is_refused_by_name_and_value() {
        // SAFETY: an all-zero tensor struct is valid plain data (null pointers, zero counts).
        let mut t: b::Qnn_Tensor_t = unsafe { std::mem::zeroed() };
        t.version = 2 as _;
        let name = c"x";
        // SAFETY: version 2 makes `v2` the active member.
        let v2 = unsafe { &mut t.__bindgen_anon_1.v2 };
        v2.name = name.as_ptr();
        v2.dataType = 0x0208 as _;
        // SAFETY: one tensor whose name outlives the call.
        let err = unsafe { tensors(&t, 1) }.unwrap_err();
        let source = MetadataError::UnknownDataType { tensor: "x".into(), raw: 0x0208 };
        assert_eq!(err, ApiError::Metadata { source });
        assert!(err.to_string().contains("`x` has data type 0x0208"), "{err}");
    }
}
