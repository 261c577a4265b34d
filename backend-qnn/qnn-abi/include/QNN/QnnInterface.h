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
#ifndef CLEANROOM_QNN_INTERFACE_H
#define CLEANROOM_QNN_INTERFACE_H

#include "QnnBackend.h"
#include "QnnCommon.h"
#include "QnnContext.h"
#include "QnnDevice.h"
#include "QnnGraph.h"
#include "QnnLog.h"
#include "QnnTypes.h"

/* Table type and union member are named after the API version, e.g. member v2_25. */
#define QNN_INTERFACE_PASTE4(a, b, c, d) a##b##_##c##d
#define QNN_INTERFACE_VER_TYPE_EVAL(major, minor) \
  QNN_INTERFACE_PASTE4(QnnInterface_ImplementationV, major, minor, _t)
#define QNN_INTERFACE_VER_NAME_EVAL(major, minor) QNN_INTERFACE_PASTE4(v, major, minor, )
#define QNN_INTERFACE_VER_TYPE \
  QNN_INTERFACE_VER_TYPE_EVAL(QNN_API_VERSION_MAJOR, QNN_API_VERSION_MINOR)
#define QNN_INTERFACE_VER_NAME \
  QNN_INTERFACE_VER_NAME_EVAL(QNN_API_VERSION_MAJOR, QNN_API_VERSION_MINOR)

/* Entries backend-qnn never calls; only their position in the table matters here. */
typedef Qnn_ErrorHandle_t (*QnnInterface_UnusedFn_t)(void);

typedef Qnn_ErrorHandle_t (*QnnLog_CreateFn_t)(QnnLog_Callback_t callback,
                                               QnnLog_Level_t maxLogLevel,
                                               Qnn_LogHandle_t* logger);
typedef Qnn_ErrorHandle_t (*QnnLog_FreeFn_t)(Qnn_LogHandle_t logger);

typedef Qnn_ErrorHandle_t (*QnnBackend_CreateFn_t)(Qnn_LogHandle_t logger,
                                                   const QnnBackend_Config_t** config,
                                                   Qnn_BackendHandle_t* backend);
typedef Qnn_ErrorHandle_t (*QnnBackend_ValidateOpConfigFn_t)(Qnn_BackendHandle_t backend,
                                                             Qnn_OpConfig_t opConfig);
typedef Qnn_ErrorHandle_t (*QnnBackend_FreeFn_t)(Qnn_BackendHandle_t backend);

typedef Qnn_ErrorHandle_t (*QnnDevice_CreateFn_t)(Qnn_LogHandle_t logger,
                                                  const QnnDevice_Config_t** config,
                                                  Qnn_DeviceHandle_t* device);
typedef Qnn_ErrorHandle_t (*QnnDevice_FreeFn_t)(Qnn_DeviceHandle_t device);

typedef Qnn_ErrorHandle_t (*QnnContext_CreateFn_t)(Qnn_BackendHandle_t backend,
                                                   Qnn_DeviceHandle_t device,
                                                   const QnnContext_Config_t** config,
                                                   Qnn_ContextHandle_t* context);
typedef Qnn_ErrorHandle_t (*QnnContext_GetBinarySizeFn_t)(Qnn_ContextHandle_t context,
                                                          Qnn_ContextBinarySize_t* size);
typedef Qnn_ErrorHandle_t (*QnnContext_GetBinaryFn_t)(Qnn_ContextHandle_t context,
                                                      void* binaryBuffer,
                                                      Qnn_ContextBinarySize_t binaryBufferSize,
                                                      Qnn_ContextBinarySize_t* writtenBufferSize);
typedef Qnn_ErrorHandle_t (*QnnContext_FreeFn_t)(Qnn_ContextHandle_t context,
                                                 Qnn_ProfileHandle_t profile);
/* Deserializes a context from a binary made by contextGetBinary; its graphs come back
 * finalized and are looked up by name with graphRetrieve. */
typedef Qnn_ErrorHandle_t (*QnnContext_CreateFromBinaryFn_t)(Qnn_BackendHandle_t backend,
                                                             Qnn_DeviceHandle_t device,
                                                             const QnnContext_Config_t** config,
                                                             const void* binaryBuffer,
                                                             Qnn_ContextBinarySize_t binaryBufferSize,
                                                             Qnn_ContextHandle_t* context,
                                                             Qnn_ProfileHandle_t profile);

typedef Qnn_ErrorHandle_t (*QnnGraph_CreateFn_t)(Qnn_ContextHandle_t contextHandle,
                                                 const char* graphName,
                                                 const QnnGraph_Config_t** config,
                                                 Qnn_GraphHandle_t* graphHandle);
typedef Qnn_ErrorHandle_t (*QnnGraph_AddNodeFn_t)(Qnn_GraphHandle_t graphHandle,
                                                  Qnn_OpConfig_t opConfig);
typedef Qnn_ErrorHandle_t (*QnnGraph_FinalizeFn_t)(Qnn_GraphHandle_t graphHandle,
                                                   Qnn_ProfileHandle_t profileHandle,
                                                   Qnn_SignalHandle_t signalHandle);
typedef Qnn_ErrorHandle_t (*QnnGraph_RetrieveFn_t)(Qnn_ContextHandle_t contextHandle,
                                                   const char* graphName,
                                                   Qnn_GraphHandle_t* graphHandle);
/* Synchronous execution of a finalized graph: one tensor per graph input / output, each with
 * the id, name and metadata the binary records and a client buffer (memType RAW) holding the
 * data; outputs are written into their client buffers. */
typedef Qnn_ErrorHandle_t (*QnnGraph_ExecuteFn_t)(Qnn_GraphHandle_t graphHandle,
                                                  const Qnn_Tensor_t* inputs,
                                                  uint32_t numInputs,
                                                  Qnn_Tensor_t* outputs,
                                                  uint32_t numOutputs,
                                                  Qnn_ProfileHandle_t profileHandle,
                                                  Qnn_SignalHandle_t signalHandle);

typedef Qnn_ErrorHandle_t (*QnnTensor_CreateGraphTensorFn_t)(Qnn_GraphHandle_t graph,
                                                             Qnn_Tensor_t* tensor);

/* Interface functions may be NULL when a backend does not provide them. */
typedef struct {
  QnnInterface_UnusedFn_t propertyHasCapability;            /*  0 */
  QnnBackend_CreateFn_t backendCreate;                      /*  1 */
  QnnInterface_UnusedFn_t backendSetConfig;                 /*  2 */
  QnnInterface_UnusedFn_t backendGetApiVersion;             /*  3 */
  QnnInterface_UnusedFn_t backendGetBuildId;                /*  4 */
  QnnInterface_UnusedFn_t backendRegisterOpPackage;         /*  5 */
  QnnInterface_UnusedFn_t backendGetSupportedOperations;    /*  6 */
  QnnBackend_ValidateOpConfigFn_t backendValidateOpConfig;  /*  7 */
  QnnBackend_FreeFn_t backendFree;                          /*  8 */
  QnnContext_CreateFn_t contextCreate;                      /*  9 */
  QnnInterface_UnusedFn_t contextSetConfig;                 /* 10 */
  QnnContext_GetBinarySizeFn_t contextGetBinarySize;        /* 11 */
  QnnContext_GetBinaryFn_t contextGetBinary;                /* 12 */
  QnnContext_CreateFromBinaryFn_t contextCreateFromBinary;  /* 13 */
  QnnContext_FreeFn_t contextFree;                          /* 14 */
  QnnGraph_CreateFn_t graphCreate;                          /* 15 */
  QnnInterface_UnusedFn_t graphCreateSubgraph;              /* 16 */
  QnnInterface_UnusedFn_t graphSetConfig;                   /* 17 */
  QnnGraph_AddNodeFn_t graphAddNode;                        /* 18 */
  QnnGraph_FinalizeFn_t graphFinalize;                      /* 19 */
  QnnGraph_RetrieveFn_t graphRetrieve;                      /* 20 */
  QnnGraph_ExecuteFn_t graphExecute;                        /* 21 */
  QnnInterface_UnusedFn_t graphExecuteAsync;                /* 22 */
  QnnInterface_UnusedFn_t tensorCreateContextTensor;        /* 23 */
  QnnTensor_CreateGraphTensorFn_t tensorCreateGraphTensor;  /* 24 */
  QnnLog_CreateFn_t logCreate;                              /* 25 */
  QnnInterface_UnusedFn_t logSetLogLevel;                   /* 26 */
  QnnLog_FreeFn_t logFree;                                  /* 27 */
  QnnInterface_UnusedFn_t profileCreate;                    /* 28 */
  QnnInterface_UnusedFn_t profileSetConfig;                 /* 29 */
  QnnInterface_UnusedFn_t profileGetEvents;                 /* 30 */
  QnnInterface_UnusedFn_t profileGetSubEvents;              /* 31 */
  QnnInterface_UnusedFn_t profileGetEventData;              /* 32 */
  QnnInterface_UnusedFn_t profileGetExtendedEventData;      /* 33 */
  QnnInterface_UnusedFn_t profileFree;                      /* 34 */
  QnnInterface_UnusedFn_t memRegister;                      /* 35 */
  QnnInterface_UnusedFn_t memDeRegister;                    /* 36 */
  QnnInterface_UnusedFn_t deviceGetPlatformInfo;            /* 37 */
  QnnInterface_UnusedFn_t deviceFreePlatformInfo;           /* 38 */
  QnnInterface_UnusedFn_t deviceGetInfrastructure;          /* 39 */
  QnnDevice_CreateFn_t deviceCreate;                        /* 40 */
  QnnInterface_UnusedFn_t deviceSetConfig;                  /* 41 */
  QnnInterface_UnusedFn_t deviceGetInfo;                    /* 42 */
  QnnDevice_FreeFn_t deviceFree;                            /* 43 */
  QnnInterface_UnusedFn_t signalCreate;                     /* 44 */
  QnnInterface_UnusedFn_t signalSetConfig;                  /* 45 */
  QnnInterface_UnusedFn_t signalTrigger;                    /* 46 */
  QnnInterface_UnusedFn_t signalFree;                       /* 47 */
  QnnInterface_UnusedFn_t errorGetMessage;                  /* 48 */
  QnnInterface_UnusedFn_t errorGetVerboseMessage;           /* 49 */
  QnnInterface_UnusedFn_t errorFreeVerboseMessage;          /* 50 */
} QNN_INTERFACE_VER_TYPE;

typedef struct {
  uint32_t backendId; /* HTP is 6 */
  const char* providerName;
  Qnn_ApiVersion_t apiVersion;
  union {
    QNN_INTERFACE_VER_TYPE QNN_INTERFACE_VER_NAME;
  };
} QnnInterface_t;

/* The one symbol a backend library exports. The list lives as long as the library. */
Qnn_ErrorHandle_t QnnInterface_getProviders(const QnnInterface_t*** providerList,
                                            uint32_t* numProviders);

#endif
