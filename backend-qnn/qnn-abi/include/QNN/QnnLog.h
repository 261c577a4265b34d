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
#ifndef CLEANROOM_QNN_LOG_H
#define CLEANROOM_QNN_LOG_H

#include <stdarg.h>

#include "QnnCommon.h"

typedef enum {
  QNN_LOG_LEVEL_ERROR = 1,
  QNN_LOG_LEVEL_WARN = 2,
  QNN_LOG_LEVEL_INFO = 3,
  QNN_LOG_LEVEL_VERBOSE = 4,
  QNN_LOG_LEVEL_DEBUG = 5,
  QNN_LOG_LEVEL_MAX = 0x7fffffff
} QnnLog_Level_t;

typedef void (*QnnLog_Callback_t)(const char* fmt, QnnLog_Level_t level, uint64_t timestamp,
                                  va_list args);

#endif
