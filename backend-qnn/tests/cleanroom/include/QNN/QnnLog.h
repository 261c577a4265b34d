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
