/*
 * TEST-ONLY CLEAN-ROOM HEADER. This is NOT a Qualcomm file and contains no Qualcomm code.
 *
 * Written for mllm-dsl's backend-qnn CI from the documented facts collected in
 * shared/research/qnn-api.md (function names, enumerator values, struct members and their
 * order); member names that document does not spell out were checked for compatibility only.
 * It declares just what backend-qnn's FFI layer and its mock provider use, so that the
 * bindgen + libloading path can be exercised without the QAIRT SDK:
 *     QNN_SDK_ROOT=$PWD/backend-qnn/tests/cleanroom cargo test -p backend-qnn --features qnn-sdk
 * Never build against a real QNN backend with it; install the QAIRT SDK and point
 * QNN_SDK_ROOT at it instead.
 */
#ifndef CLEANROOM_QNN_GRAPH_H
#define CLEANROOM_QNN_GRAPH_H

#include "QnnTypes.h"

typedef void* QnnGraph_CustomConfig_t;

typedef enum {
  QNN_GRAPH_CONFIG_OPTION_CUSTOM = 0,
  QNN_GRAPH_CONFIG_OPTION_PRIORITY = 3,
  QNN_GRAPH_CONFIG_OPTION_PROFILE_HANDLE = 4,
  QNN_GRAPH_CONFIG_OPTION_UNDEFINED = 0x7FFFFFFF
} QnnGraph_ConfigOption_t;

typedef struct {
  QnnGraph_ConfigOption_t option;
  union {
    QnnGraph_CustomConfig_t customConfig;
    Qnn_ProfileHandle_t profileHandle;
  };
} QnnGraph_Config_t;

#endif
