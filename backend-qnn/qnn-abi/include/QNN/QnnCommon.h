/*
 * CLEAN-ROOM ABI DECLARATION. This is NOT a Qualcomm file and contains no Qualcomm code.
 *
 * Written for mllm-dsl's backend-qnn from facts Qualcomm documents publicly in its QNN API
 * reference (function names, enumerator values, struct members and their order) and
 * checked against Qualcomm's QAIRT 2.51 x86_64 libraries (layout test
 * `layouts_match_qualcomms_libraries`). It declares just what backend-qnn's FFI layer and its
 * mock provider use. The committed Rust bindings (backend-qnn/qnn-abi/bindings.rs) are
 * generated from these files; after editing one, regenerate them with
 *     QNN_ABI_REGENERATE=1 cargo test -p backend-qnn --test abi_bindings
 */
#ifndef CLEANROOM_QNN_COMMON_H
#define CLEANROOM_QNN_COMMON_H

#include <stdint.h>

/* Core API version of this test header set; the interface table below has the layout
 * Qualcomm's QNN API reference lists for recent SDKs (QnnInterface.h). */
#define QNN_API_VERSION_MAJOR 2
#define QNN_API_VERSION_MINOR 25
#define QNN_API_VERSION_PATCH 0

#define QNN_SUCCESS 0
/* The error code lives in the low 16 bits; higher bits are reserved for the backend. */
#define QNN_GET_ERROR_CODE(errorHandle) ((errorHandle) & 0xFFFF)

typedef uint64_t Qnn_ErrorHandle_t;

typedef void* Qnn_Handle_t;
typedef Qnn_Handle_t Qnn_BackendHandle_t;
typedef Qnn_Handle_t Qnn_ContextHandle_t;
typedef Qnn_Handle_t Qnn_DeviceHandle_t;
typedef Qnn_Handle_t Qnn_GraphHandle_t;
typedef Qnn_Handle_t Qnn_LogHandle_t;
typedef Qnn_Handle_t Qnn_MemHandle_t;
typedef Qnn_Handle_t Qnn_ProfileHandle_t;
typedef Qnn_Handle_t Qnn_SignalHandle_t;

typedef enum {
  QNN_COMMON_ERROR_NOT_SUPPORTED = 1000,
  QNN_COMMON_ERROR_MEM_ALLOC = 1002,
  QNN_COMMON_ERROR_SYSTEM = 1003,
  QNN_COMMON_ERROR_INVALID_ARGUMENT = 1004,
  QNN_COMMON_ERROR_OPERATION_NOT_PERMITTED = 1005,
  QNN_COMMON_ERROR_GENERAL = 1100,
  QNN_COMMON_ERROR_UNDEFINED = 0x7FFFFFFF
} QnnCommon_Error_t;

#endif
