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
#ifndef CLEANROOM_QNN_SYSTEM_INTERFACE_H
#define CLEANROOM_QNN_SYSTEM_INTERFACE_H

#include "QnnLog.h"
#include "QnnSystemContext.h"

#define QNN_SYSTEM_API_VERSION_MAJOR 1
#define QNN_SYSTEM_API_VERSION_MINOR 5
#define QNN_SYSTEM_API_VERSION_PATCH 0

#define QNN_SYSTEM_INTERFACE_PASTE4(a, b, c, d) a##b##_##c##d
#define QNN_SYSTEM_INTERFACE_VER_TYPE_EVAL(major, minor) \
  QNN_SYSTEM_INTERFACE_PASTE4(QnnSystemInterface_ImplementationV, major, minor, _t)
#define QNN_SYSTEM_INTERFACE_VER_NAME_EVAL(major, minor) \
  QNN_SYSTEM_INTERFACE_PASTE4(v, major, minor, )
#define QNN_SYSTEM_INTERFACE_VER_TYPE \
  QNN_SYSTEM_INTERFACE_VER_TYPE_EVAL(QNN_SYSTEM_API_VERSION_MAJOR, QNN_SYSTEM_API_VERSION_MINOR)
#define QNN_SYSTEM_INTERFACE_VER_NAME \
  QNN_SYSTEM_INTERFACE_VER_NAME_EVAL(QNN_SYSTEM_API_VERSION_MAJOR, QNN_SYSTEM_API_VERSION_MINOR)

typedef Qnn_ErrorHandle_t (*QnnSystemInterface_UnusedFn_t)(void);

typedef Qnn_ErrorHandle_t (*QnnSystemContext_CreateFn_t)(QnnSystemContext_Handle_t* sysCtxHandle);
/* The metadata stays valid until the system context is freed. */
typedef Qnn_ErrorHandle_t (*QnnSystemContext_GetMetaDataFn_t)(
    QnnSystemContext_Handle_t sysCtxHandle, const void* binaryBuffer, uint64_t binaryBufferSize,
    const QnnSystemContext_BinaryInfo_t** binaryInfo);
typedef Qnn_ErrorHandle_t (*QnnSystemContext_FreeFn_t)(QnnSystemContext_Handle_t sysCtxHandle);

typedef struct {
  QnnSystemContext_CreateFn_t systemContextCreate;            /* 0 */
  QnnSystemInterface_UnusedFn_t systemContextGetBinaryInfo;   /* 1 (deprecated) */
  QnnSystemContext_GetMetaDataFn_t systemContextGetMetaData;  /* 2 */
  QnnSystemContext_FreeFn_t systemContextFree;                /* 3 */
  QnnSystemInterface_UnusedFn_t systemTensorGetMemoryFootprint;
  QnnSystemInterface_UnusedFn_t systemLogCreate;
  QnnSystemInterface_UnusedFn_t systemLogSetLogLevel;
  QnnSystemInterface_UnusedFn_t systemLogFree;
} QNN_SYSTEM_INTERFACE_VER_TYPE;

typedef struct {
  uint32_t backendId;
  const char* providerName;
  Qnn_Version_t systemApiVersion;
  union {
    QNN_SYSTEM_INTERFACE_VER_TYPE QNN_SYSTEM_INTERFACE_VER_NAME;
  };
} QnnSystemInterface_t;

Qnn_ErrorHandle_t QnnSystemInterface_getProviders(const QnnSystemInterface_t*** providerList,
                                                  uint32_t* numProviders);

#endif
