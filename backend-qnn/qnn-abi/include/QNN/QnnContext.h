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
#ifndef CLEANROOM_QNN_CONTEXT_H
#define CLEANROOM_QNN_CONTEXT_H

#include "QnnTypes.h"

typedef uint64_t Qnn_ContextBinarySize_t;

typedef void* QnnContext_CustomConfig_t;

typedef enum {
  QNN_CONTEXT_CONFIG_OPTION_CUSTOM = 0,
  QNN_CONTEXT_CONFIG_UNDEFINED = 0x7FFFFFFF
} QnnContext_ConfigOption_t;

typedef struct {
  QnnContext_ConfigOption_t option;
  union {
    QnnContext_CustomConfig_t customConfig;
    uint64_t memoryLimitHint;
  };
} QnnContext_Config_t;

#endif
