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
