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
