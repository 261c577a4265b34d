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
#ifndef CLEANROOM_QNN_SYSTEM_CONTEXT_H
#define CLEANROOM_QNN_SYSTEM_CONTEXT_H

#include "QnnContext.h"
#include "QnnDevice.h"
#include "QnnTypes.h"

typedef void* QnnSystemContext_Handle_t;

typedef enum {
  QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_1 = 1,
  QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_2 = 2,
  QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_3 = 3,
  QNN_SYSTEM_CONTEXT_GRAPH_INFO_UNDEFINED = 0x7FFFFFFF
} QnnSystemContext_GraphInfoVersion_t;

typedef struct {
  const char* graphName;
  uint32_t numGraphInputs;
  Qnn_Tensor_t* graphInputs;
  uint32_t numGraphOutputs;
  Qnn_Tensor_t* graphOutputs;
} QnnSystemContext_GraphInfoV1_t;

typedef struct {
  const char* graphName;
  uint32_t numGraphInputs;
  Qnn_Tensor_t* graphInputs;
  uint32_t numGraphOutputs;
  Qnn_Tensor_t* graphOutputs;
  uint32_t numUpdateableTensors;
  Qnn_Tensor_t* updateableTensors;
} QnnSystemContext_GraphInfoV2_t;

typedef struct {
  const char* graphName;
  uint32_t numGraphInputs;
  Qnn_Tensor_t* graphInputs;
  uint32_t numGraphOutputs;
  Qnn_Tensor_t* graphOutputs;
  uint32_t numUpdateableTensors;
  Qnn_Tensor_t* updateableTensors;
  uint32_t graphBlobInfoSize;
  void* graphBlobInfo;
  /* ABI: libQnnSystem.so of QAIRT 2.51 lays V3 graph infos out 88 bytes apart (80 with the
   * members above): 8 more bytes follow that this project does not read. */
  uint32_t unreadTail[2];
} QnnSystemContext_GraphInfoV3_t;

typedef struct {
  QnnSystemContext_GraphInfoVersion_t version;
  union {
    QnnSystemContext_GraphInfoV1_t graphInfoV1;
    QnnSystemContext_GraphInfoV2_t graphInfoV2;
    QnnSystemContext_GraphInfoV3_t graphInfoV3;
  };
} QnnSystemContext_GraphInfo_t;

typedef enum {
  QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1 = 1,
  QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_2 = 2,
  QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_3 = 3,
  QNN_SYSTEM_CONTEXT_BINARY_INFO_UNDEFINED = 0x7FFFFFFF
} QnnSystemContext_BinaryInfoVersion_t;

typedef struct {
  uint32_t backendId;
  const char* buildId;
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
  const char* socVersion;
  Qnn_Version_t hwInfoBlobVersion;
  Qnn_Version_t contextBlobVersion;
  uint32_t hwInfoBlobSize;
  void* hwInfoBlob;
  uint64_t contextBlobSize;
  uint32_t numContextTensors;
  Qnn_Tensor_t* contextTensors;
  uint32_t numGraphs;
  QnnSystemContext_GraphInfo_t* graphs;
} QnnSystemContext_BinaryInfoV1_t;

typedef struct {
  uint32_t backendId;
  const char* buildId;
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
  const char* socVersion;
  Qnn_Version_t hwInfoBlobVersion;
  Qnn_Version_t contextBlobVersion;
  uint32_t hwInfoBlobSize;
  void* hwInfoBlob;
  uint64_t contextBlobSize;
  uint32_t numContextTensors;
  Qnn_Tensor_t* contextTensors;
  uint32_t numGraphs;
  QnnSystemContext_GraphInfo_t* graphs;
  QnnDevice_PlatformInfo_t* platformInfo;
} QnnSystemContext_BinaryInfoV2_t;

typedef struct {
  uint32_t backendId;
  const char* buildId;
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
  const char* socVersion;
  Qnn_Version_t contextBlobVersion;
  uint64_t contextBlobSize;
  uint32_t numContextTensors;
  Qnn_Tensor_t* contextTensors;
  uint32_t numGraphs;
  QnnSystemContext_GraphInfo_t* graphs;
  QnnDevice_PlatformInfo_t* platformInfo;
} QnnSystemContext_BinaryInfoV3_t;

typedef struct {
  QnnSystemContext_BinaryInfoVersion_t version;
  union {
    QnnSystemContext_BinaryInfoV1_t contextBinaryInfoV1;
    QnnSystemContext_BinaryInfoV2_t contextBinaryInfoV2;
    QnnSystemContext_BinaryInfoV3_t contextBinaryInfoV3;
  };
} QnnSystemContext_BinaryInfo_t;

#endif
