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
#ifndef CLEANROOM_QNN_BACKEND_H
#define CLEANROOM_QNN_BACKEND_H

#include "QnnTypes.h"

/* backend-qnn passes no backend configs (a NULL list), so the entry stays opaque here. */
typedef struct QnnBackend_Config QnnBackend_Config_t;

#endif
