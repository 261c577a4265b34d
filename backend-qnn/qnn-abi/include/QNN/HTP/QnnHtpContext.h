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
#ifndef CLEANROOM_QNN_HTP_CONTEXT_H
#define CLEANROOM_QNN_HTP_CONTEXT_H

#include "QnnContext.h"

typedef enum {
  QNN_HTP_CONTEXT_CONFIG_OPTION_WEIGHT_SHARING_ENABLED = 1,
  QNN_HTP_CONTEXT_CONFIG_OPTION_UNKNOWN = 0x7fffffff
} QnnHtpContext_ConfigOption_t;

/* ABI: the value union holds 16-byte members (a context handle with a u64 budget), so it
 * is 8-aligned and 16 bytes: the value sits at offset 8 and the struct is 24 bytes. */
typedef struct {
  Qnn_ContextHandle_t firstContext;
  uint64_t spillFillBytes;
} QnnHtpContext_ContextGroup_t;

typedef struct {
  QnnHtpContext_ConfigOption_t option;
  union {
    bool weightSharingEnabled;
    QnnHtpContext_ContextGroup_t contextGroup;
    uint64_t u64Value;
  };
} QnnHtpContext_CustomConfig_t;

#endif
