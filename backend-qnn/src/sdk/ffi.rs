//! The real QNN C API behind [`QnnApi`](crate::sdk::QnnApi).
//!
//! - `bindings`: bindgen output for the project's clean-room declarations
//!   (`qnn-abi/include/QNN`), committed as `qnn-abi/bindings.rs` with accessors for the
//!   versioned interface tables (`tests/abi_bindings.rs` checks it is up to date).
//! - [`library`]: locating and opening `libQnnHtp.so` / `libQnnSystem.so` with `libloading`
//!   and selecting a provider whose core API major version equals the bindings' and whose
//!   minor version is at least the bindings'.
//! - `marshal`: tensors and op configs → C structs, with every pointed-to buffer owned by an arena.
//! - [`SdkApi`]: the `QnnApi` implementation (building binaries) and, opened with
//!   [`SdkApi::load_for_execution`], the `QnnExecApi` one (`exec`: loading binaries and executing
//!   their graphs on client buffers); [`SystemApi`]: context-binary metadata (graph I/O with ids
//!   and scale/offset encodings).

#[cfg(not(unix))]
compile_error!("backend-qnn loads QNN libraries with dlopen and supports Unix hosts only");

mod bindings;
mod exec;
pub mod library;
mod log;
mod marshal;
mod sdk_api;
mod system;

pub use library::{
    LibraryPaths, LoadError, ProviderInfo, FETCHED_SDK_SUBDIR, FETCH_HINT, HOST_LIB_DIR, HTP_BACKEND_ID,
};
pub use sdk_api::SdkApi;
pub use system::{BinaryInfo, SystemApi};

/// The target triple this crate was built for (used by tests to compile C fixtures).
pub const BUILD_TARGET: &str = env!("BACKEND_QNN_TARGET");

/// (major, minor) core API version of the headers the bindings were generated from.
pub const BINDINGS_CORE_API_VERSION: (u32, u32) = bindings::CORE_API_VERSION;

/// (major, minor) system API version of those headers.
pub const BINDINGS_SYSTEM_API_VERSION: (u32, u32) = bindings::SYSTEM_API_VERSION;

#[cfg(test)]
// Enumerators are `c_uint` or `c_int` depending on the header; compare them as `u32`.
#[allow(clippy::unnecessary_cast)]
mod tests {
    use super::bindings as b;
    use crate::dtype::{DataType, TensorType};
    use crate::encoding::Encoding;
    use crate::sdk::config::HtpArch;

    /// Our numeric codes against the enumerators of the clean-room declarations.
    #[test]
    fn codes_match_the_headers() {
        let dtypes: [(DataType, u32); 20] = [
            (DataType::Int8, b::QNN_DATATYPE_INT_8 as u32),
            (DataType::Int16, b::QNN_DATATYPE_INT_16 as u32),
            (DataType::Int32, b::QNN_DATATYPE_INT_32 as u32),
            (DataType::Int64, b::QNN_DATATYPE_INT_64 as u32),
            (DataType::UInt8, b::QNN_DATATYPE_UINT_8 as u32),
            (DataType::UInt16, b::QNN_DATATYPE_UINT_16 as u32),
            (DataType::UInt32, b::QNN_DATATYPE_UINT_32 as u32),
            (DataType::UInt64, b::QNN_DATATYPE_UINT_64 as u32),
            (DataType::Float16, b::QNN_DATATYPE_FLOAT_16 as u32),
            (DataType::Float32, b::QNN_DATATYPE_FLOAT_32 as u32),
            (DataType::Float64, b::QNN_DATATYPE_FLOAT_64 as u32),
            (DataType::SFixedPoint4, b::QNN_DATATYPE_SFIXED_POINT_4 as u32),
            (DataType::SFixedPoint8, b::QNN_DATATYPE_SFIXED_POINT_8 as u32),
            (DataType::SFixedPoint16, b::QNN_DATATYPE_SFIXED_POINT_16 as u32),
            (DataType::SFixedPoint32, b::QNN_DATATYPE_SFIXED_POINT_32 as u32),
            (DataType::UFixedPoint4, b::QNN_DATATYPE_UFIXED_POINT_4 as u32),
            (DataType::UFixedPoint8, b::QNN_DATATYPE_UFIXED_POINT_8 as u32),
            (DataType::UFixedPoint16, b::QNN_DATATYPE_UFIXED_POINT_16 as u32),
            (DataType::UFixedPoint32, b::QNN_DATATYPE_UFIXED_POINT_32 as u32),
            (DataType::Bool8, b::QNN_DATATYPE_BOOL_8 as u32),
        ];
        for (ours, theirs) in dtypes {
            assert_eq!(ours.raw(), theirs, "{ours}");
        }
        assert_eq!(TensorType::AppWrite.raw(), b::QNN_TENSOR_TYPE_APP_WRITE as u32);
        assert_eq!(TensorType::AppRead.raw(), b::QNN_TENSOR_TYPE_APP_READ as u32);
        assert_eq!(TensorType::Native.raw(), b::QNN_TENSOR_TYPE_NATIVE as u32);
        assert_eq!(TensorType::Static.raw(), b::QNN_TENSOR_TYPE_STATIC as u32);
        assert_eq!(TensorType::Null.raw(), b::QNN_TENSOR_TYPE_NULL as u32);
        assert_eq!(Encoding::Undefined.raw(), b::QNN_QUANTIZATION_ENCODING_UNDEFINED as u32);
        assert_eq!(HtpArch::V75.raw(), b::QNN_HTP_DEVICE_ARCH_V75 as u32);
        assert_eq!(HtpArch::V79.raw(), b::QNN_HTP_DEVICE_ARCH_V79 as u32);
        assert_eq!(1, b::QNN_HTP_CONTEXT_CONFIG_OPTION_WEIGHT_SHARING_ENABLED as u32);
        assert_eq!(3, b::QNN_HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG as u32);
        assert_eq!(4, b::QNN_HTP_GRAPH_CONFIG_OPTION_FOLD_RELU_ACTIVATION_INTO_CONV_OFF as u32);
        assert_eq!(5, b::QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION as u32);
        use crate::encoding::{definition, encoding_value};
        assert_eq!(definition::DEFINED, b::QNN_DEFINITION_DEFINED as u32);
        assert_eq!(definition::UNDEFINED, b::QNN_DEFINITION_UNDEFINED as u32);
        assert_eq!(encoding_value::SCALE_OFFSET, b::QNN_QUANTIZATION_ENCODING_SCALE_OFFSET as u32);
        use crate::encoding::block_scale_storage::{STORAGE_16, STORAGE_8};
        assert_eq!(STORAGE_8, b::QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8 as u32);
        assert_eq!(STORAGE_16, b::QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_16 as u32);
    }

    /// LP64 sizes from QnnTypes.h (checked by the layout tests against Qualcomm's libraries).
    #[test]
    fn struct_sizes_match_the_documented_abi() {
        use std::mem::size_of;
        assert_eq!(size_of::<b::Qnn_Tensor_t>(), 144);
        assert_eq!(size_of::<b::Qnn_TensorV2_t>(), 136);
        assert_eq!(size_of::<b::Qnn_Param_t>(), 160);
        assert_eq!(size_of::<b::Qnn_OpConfig_t>(), 80);
        assert_eq!(size_of::<b::Qnn_BlockwiseExpansion_t>(), 40);
        assert_eq!(size_of::<b::Qnn_ScaleOffset_t>(), 8);
        assert_eq!(std::mem::offset_of!(b::QnnInterface_t, __bindgen_anon_1), 40);
        assert_eq!(std::mem::offset_of!(b::CoreTable, graphAddNode), 144);
        assert_eq!(std::mem::offset_of!(b::CoreTable, tensorCreateGraphTensor), 192);
    }

    /// Layouts established against Qualcomm's QAIRT 2.51 x86_64 libraries (see the ABI
    /// comments in `qnn-abi/include/QNN`; `tests/sdk_real.rs` exercises them on the
    /// real `libQnnHtp.so` / `libQnnSystem.so`).
    #[test]
    fn layouts_match_qualcomms_libraries() {
        use std::mem::{offset_of, size_of};
        // HTP custom configs: the value union is 8-aligned, so every value sits at offset 8.
        assert_eq!(offset_of!(b::QnnHtpDevice_CustomConfig_t, __bindgen_anon_1), 8);
        assert_eq!(size_of::<b::QnnHtpDevice_CustomConfig_t>(), 16);
        assert_eq!(offset_of!(b::QnnHtpContext_CustomConfig_t, __bindgen_anon_1), 8);
        assert_eq!(size_of::<b::QnnHtpContext_CustomConfig_t>(), 24);
        assert_eq!(offset_of!(b::QnnHtpGraph_CustomConfig_t, __bindgen_anon_1), 8);
        assert_eq!(size_of::<b::QnnHtpGraph_CustomConfig_t>(), 56);
        // Context-binary metadata as libQnnSystem.so writes it (measured byte by byte).
        assert_eq!(size_of::<b::QnnSystemContext_GraphInfo_t>(), 88);
        assert_eq!(offset_of!(b::QnnSystemContext_BinaryInfo_t, __bindgen_anon_1), 8);
        assert_eq!(offset_of!(b::QnnSystemContext_BinaryInfoV3_t, contextBlobSize), 64);
        assert_eq!(offset_of!(b::QnnSystemContext_BinaryInfoV3_t, numGraphs), 88);
        assert_eq!(offset_of!(b::QnnSystemContext_BinaryInfoV3_t, graphs), 96);
        assert_eq!(offset_of!(b::QnnSystemContext_GraphInfoV3_t, graphInputs), 16);
        assert_eq!(offset_of!(b::QnnSystemContext_GraphInfoV3_t, graphOutputs), 32);
        assert_eq!(offset_of!(b::QnnSystemContext_GraphInfoV3_t, graphBlobInfoSize), 56);
        // Qnn_TensorV2_t fields where the metadata's tensors have them.
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, name), 8);
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, dataType), 24);
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, quantizeParams), 32);
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, rank), 72);
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, dimensions), 80);
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, memType), 88);
        assert_eq!(offset_of!(b::Qnn_TensorV2_t, sparseParams), 120);
        // Enumerators the real backend accepted.
        assert_eq!(b::QNN_HTP_DEVICE_CONFIG_OPTION_SOC as u32, 0);
        assert_eq!(b::QNN_DEVICE_CONFIG_OPTION_CUSTOM as u32, 0);
        assert_eq!(b::QNN_DEVICE_CONFIG_OPTION_PLATFORM_INFO as u32, 1);
        assert_eq!(b::QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE_IN_MB as u32, 3);
        assert_eq!(b::QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3 as u32, 3);
    }
}
