/*
 * TEST-ONLY mock QNN provider for backend-qnn's FFI tests. Not Qualcomm code.
 *
 * Built by tests/sdk_ffi.rs as lib/x86_64-linux-clang/libQnnHtp.so (and libQnnSystem.so)
 * against the headers bindgen used ($QNN_SDK_ROOT/include/QNN: the clean-room set in CI).
 * It exports QnnInterface_getProviders / QnnSystemInterface_getProviders with tables whose
 * entries:
 *   - decode the C structs they receive and append one line per call to a log, in exactly
 *     the format of backend_qnn::sdk::RecordingApi (src/sdk/render.rs), so the test can
 *     compare the two logs line by line;
 *   - enforce the same backend rules as RecordingApi (live handles, unique names, tensors
 *     created before use and with matching metadata, only STATIC tensors shared between
 *     graphs, nothing after finalize, all graphs finalized before serializing), with the
 *     same error codes;
 *   - serialize the context as the same deterministic fake binary, which the system
 *     provider parses back into QnnSystemContext_BinaryInfo_t.
 * Control entry points for the test: mock_qnn_reset, mock_qnn_fail, mock_qnn_log.
 *
 * Compile-time switches: MOCK_DECOY_PROVIDERS lists two unusable providers (wrong major
 * version, wrong backend id) before the real one; MOCK_ONLY_DECOYS lists only those.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "HTP/QnnHtpContext.h"
#include "HTP/QnnHtpDevice.h"
#include "HTP/QnnHtpGraph.h"
#include "QnnInterface.h"
#include "System/QnnSystemInterface.h"

#define EXPORT __attribute__((visibility("default")))

enum { ERR_INVALID_ARGUMENT = 1004, ERR_NOT_PERMITTED = 1005, HTP_BACKEND_ID = 6 };
enum { KIND_LOG = 1, KIND_BACKEND, KIND_DEVICE, KIND_CONTEXT, KIND_GRAPH, KIND_SYSTEM };

/* ---------------------------------------------------------------- text buffer -------- */

typedef struct {
  char* data;
  size_t len, cap;
} Text;

static void text_vappend(Text* t, const char* fmt, va_list ap) {
  va_list copy;
  va_copy(copy, ap);
  int need = vsnprintf(NULL, 0, fmt, copy);
  va_end(copy);
  if (need < 0) abort();
  if (t->len + (size_t)need + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 256;
    while (cap < t->len + (size_t)need + 1) cap *= 2;
    t->data = realloc(t->data, cap);
    if (!t->data) abort();
    t->cap = cap;
  }
  vsnprintf(t->data + t->len, (size_t)need + 1, fmt, ap);
  t->len += (size_t)need;
}

static void text_append(Text* t, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  text_vappend(t, fmt, ap);
  va_end(ap);
}

static void text_clear(Text* t) {
  free(t->data);
  t->data = NULL;
  t->len = t->cap = 0;
}

/* ---------------------------------------------------------------- state -------------- */

typedef struct {
  unsigned id, graph; /* graph: 1-based graph index */
  char* name;
  unsigned type, dtype, rank;
  uint32_t* dims;
  int has_scale_offset; /* a SCALE_OFFSET encoding, the only one graph I/O carries */
  float scale;
  int32_t offset;
} MockTensor;

typedef struct {
  int live;
  unsigned next_tensor_id;
  MockTensor* tensors;
  size_t num_tensors;
} MockContext;

typedef struct {
  unsigned context; /* 1-based */
  char* name;
  int finalized;
  unsigned nodes;
} MockGraph;

typedef struct {
  char* function;
  char* subject;
  uint64_t code;
} MockFailure;

static Text g_log;
static int* g_live[KIND_CONTEXT]; /* live flags for log, backend, device */
static size_t g_count[KIND_CONTEXT];
static MockContext* g_contexts;
static size_t g_num_contexts;
static MockGraph* g_graphs;
static size_t g_num_graphs;
static MockFailure* g_failures;
static size_t g_num_failures;

static void* grow(void* array, size_t count, size_t size) {
  void* p = realloc(array, (count + 1) * size);
  if (!p) abort();
  return p;
}

static char* dup(const char* s) {
  size_t n = strlen(s ? s : "") + 1;
  char* d = malloc(n);
  if (!d) abort();
  memcpy(d, s ? s : "", n);
  return d;
}

/* Handles are small tagged integers: kind in bits 16.., 1-based index below. */
static void* make_handle(int kind, size_t index) { return (void*)(uintptr_t)(((uintptr_t)kind << 16) | index); }

static size_t handle_index(const void* h, int kind) {
  uintptr_t v = (uintptr_t)h;
  return (v >> 16) == (uintptr_t)kind ? (size_t)(v & 0xFFFF) : 0;
}

static const char* kind_name(int kind) {
  switch (kind) {
    case KIND_LOG: return "log";
    case KIND_BACKEND: return "backend";
    case KIND_DEVICE: return "device";
    case KIND_CONTEXT: return "context";
    default: return "graph";
  }
}

/* "log1", "null" or "invalid" */
static void append_handle(Text* t, const void* h, int kind) {
  if (!h) {
    text_append(t, "null");
    return;
  }
  size_t i = handle_index(h, kind);
  if (i) text_append(t, "%s%zu", kind_name(kind), i);
  else text_append(t, "invalid");
}

static int simple_live(int kind, const void* h) {
  size_t i = handle_index(h, kind);
  return i >= 1 && i <= g_count[kind - 1] && g_live[kind - 1][i - 1];
}

static MockContext* live_context(const void* h) {
  size_t i = handle_index(h, KIND_CONTEXT);
  if (i < 1 || i > g_num_contexts || !g_contexts[i - 1].live) return NULL;
  return &g_contexts[i - 1];
}

static MockGraph* live_graph(const void* h) {
  size_t i = handle_index(h, KIND_GRAPH);
  if (i < 1 || i > g_num_graphs) return NULL;
  MockGraph* g = &g_graphs[i - 1];
  return g_contexts[g->context - 1].live ? g : NULL;
}

EXPORT void mock_qnn_reset(void) {
  text_clear(&g_log);
  for (int k = 0; k < KIND_CONTEXT; ++k) {
    free(g_live[k]);
    g_live[k] = NULL;
    g_count[k] = 0;
  }
  for (size_t c = 0; c < g_num_contexts; ++c) {
    for (size_t t = 0; t < g_contexts[c].num_tensors; ++t) {
      free(g_contexts[c].tensors[t].name);
      free(g_contexts[c].tensors[t].dims);
    }
    free(g_contexts[c].tensors);
  }
  free(g_contexts);
  g_contexts = NULL;
  g_num_contexts = 0;
  for (size_t g = 0; g < g_num_graphs; ++g) free(g_graphs[g].name);
  free(g_graphs);
  g_graphs = NULL;
  g_num_graphs = 0;
  for (size_t f = 0; f < g_num_failures; ++f) {
    free(g_failures[f].function);
    free(g_failures[f].subject);
  }
  free(g_failures);
  g_failures = NULL;
  g_num_failures = 0;
}

EXPORT void mock_qnn_fail(const char* function, const char* subject, uint64_t code) {
  g_failures = grow(g_failures, g_num_failures, sizeof *g_failures);
  g_failures[g_num_failures++] = (MockFailure){dup(function), dup(subject), code};
}

/* Copies up to cap bytes of the log and returns its full length. */
EXPORT size_t mock_qnn_log(char* buffer, size_t cap) {
  if (buffer && cap) memcpy(buffer, g_log.data, g_log.len < cap ? g_log.len : cap);
  return g_log.len;
}

/* ---------------------------------------------------------------- rendering ---------- */

static const char* dtype_name(unsigned code) {
  switch (code) {
    case QNN_DATATYPE_INT_8: return "INT_8";
    case QNN_DATATYPE_INT_16: return "INT_16";
    case QNN_DATATYPE_INT_32: return "INT_32";
    case QNN_DATATYPE_INT_64: return "INT_64";
    case QNN_DATATYPE_UINT_8: return "UINT_8";
    case QNN_DATATYPE_UINT_16: return "UINT_16";
    case QNN_DATATYPE_UINT_32: return "UINT_32";
    case QNN_DATATYPE_UINT_64: return "UINT_64";
    case QNN_DATATYPE_FLOAT_16: return "FLOAT_16";
    case QNN_DATATYPE_FLOAT_32: return "FLOAT_32";
    case QNN_DATATYPE_FLOAT_64: return "FLOAT_64";
    case QNN_DATATYPE_SFIXED_POINT_4: return "SFIXED_POINT_4";
    case QNN_DATATYPE_SFIXED_POINT_8: return "SFIXED_POINT_8";
    case QNN_DATATYPE_SFIXED_POINT_16: return "SFIXED_POINT_16";
    case QNN_DATATYPE_SFIXED_POINT_32: return "SFIXED_POINT_32";
    case QNN_DATATYPE_UFIXED_POINT_4: return "UFIXED_POINT_4";
    case QNN_DATATYPE_UFIXED_POINT_8: return "UFIXED_POINT_8";
    case QNN_DATATYPE_UFIXED_POINT_16: return "UFIXED_POINT_16";
    case QNN_DATATYPE_UFIXED_POINT_32: return "UFIXED_POINT_32";
    case QNN_DATATYPE_BOOL_8: return "BOOL_8";
    default: return "UNKNOWN_DTYPE";
  }
}

static unsigned dtype_from_name(const char* name) {
  static const unsigned codes[] = {
      QNN_DATATYPE_INT_8,           QNN_DATATYPE_INT_16,          QNN_DATATYPE_INT_32,
      QNN_DATATYPE_INT_64,          QNN_DATATYPE_UINT_8,          QNN_DATATYPE_UINT_16,
      QNN_DATATYPE_UINT_32,         QNN_DATATYPE_UINT_64,         QNN_DATATYPE_FLOAT_16,
      QNN_DATATYPE_FLOAT_32,        QNN_DATATYPE_FLOAT_64,        QNN_DATATYPE_SFIXED_POINT_4,
      QNN_DATATYPE_SFIXED_POINT_8,  QNN_DATATYPE_SFIXED_POINT_16, QNN_DATATYPE_SFIXED_POINT_32,
      QNN_DATATYPE_UFIXED_POINT_4,  QNN_DATATYPE_UFIXED_POINT_8,  QNN_DATATYPE_UFIXED_POINT_16,
      QNN_DATATYPE_UFIXED_POINT_32, QNN_DATATYPE_BOOL_8};
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; ++i)
    if (strcmp(dtype_name(codes[i]), name) == 0) return codes[i];
  return QNN_DATATYPE_UNDEFINED;
}

static const char* tensor_type_name(unsigned type) {
  switch (type) {
    case QNN_TENSOR_TYPE_APP_WRITE: return "APP_WRITE";
    case QNN_TENSOR_TYPE_APP_READ: return "APP_READ";
    case QNN_TENSOR_TYPE_APP_READWRITE: return "APP_READWRITE";
    case QNN_TENSOR_TYPE_NATIVE: return "NATIVE";
    case QNN_TENSOR_TYPE_STATIC: return "STATIC";
    case QNN_TENSOR_TYPE_NULL: return "NULL";
    default: return "UNKNOWN_TENSOR_TYPE";
  }
}

static uint64_t fnv1a64(const void* bytes, size_t len) {
  const unsigned char* p = bytes;
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < len; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}

/* "n=N, [(s, o), ..., ...], fnv=..." for a Qnn_ScaleOffset_t array. */
static void append_scale_offsets(Text* t, const Qnn_ScaleOffset_t* so, size_t n) {
  text_append(t, "n=%zu, [", n);
  for (size_t i = 0; i < n && i < 4; ++i)
    text_append(t, "%s(%.8e, %d)", i ? ", " : "", (double)so[i].scale, (int)so[i].offset);
  if (n > 4) text_append(t, ", ...");
  text_append(t, "], fnv=%016llx", (unsigned long long)fnv1a64(so, n * sizeof *so));
}

/* The fields every tensor version shares, as a V1 view. */
typedef struct {
  uint32_t id;
  const char* name;
  unsigned type, dtype;
  const Qnn_QuantizeParams_t* quant;
  uint32_t rank;
  const uint32_t* dims;
  const void* data;
  uint32_t data_size;
} TensorView;

static int view_tensor(const Qnn_Tensor_t* t, TensorView* v) {
  if (t->version == QNN_TENSOR_VERSION_2) {
    const Qnn_TensorV2_t* x = &t->v2;
    *v = (TensorView){x->id, x->name, x->type, x->dataType, &x->quantizeParams, x->rank,
                      x->dimensions, x->clientBuf.data, x->clientBuf.dataSize};
    return x->memType == QNN_TENSORMEMTYPE_RAW && x->dataFormat == QNN_TENSOR_DATA_FORMAT_DENSE &&
           x->isDynamicDimensions == NULL;
  }
  if (t->version == QNN_TENSOR_VERSION_1) {
    const Qnn_TensorV1_t* x = &t->v1;
    *v = (TensorView){x->id, x->name, x->type, x->dataType, &x->quantizeParams, x->rank,
                      x->dimensions, x->clientBuf.data, x->clientBuf.dataSize};
    return x->memType == QNN_TENSORMEMTYPE_RAW;
  }
  return 0;
}

static void append_quant(Text* t, const TensorView* v) {
  const Qnn_QuantizeParams_t* q = v->quant;
  if (q->encodingDefinition != QNN_DEFINITION_DEFINED) {
    text_append(t, "none");
    return;
  }
  switch (q->quantizationEncoding) {
    case QNN_QUANTIZATION_ENCODING_SCALE_OFFSET:
      text_append(t, "scaleOffset(%.8e, %d)", (double)q->scaleOffsetEncoding.scale,
                  (int)q->scaleOffsetEncoding.offset);
      return;
    case QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET: {
      const Qnn_AxisScaleOffset_t* a = &q->axisScaleOffsetEncoding;
      text_append(t, "axisScaleOffset(axis=%d, ", (int)a->axis);
      append_scale_offsets(t, a->scaleOffset, a->numScaleOffsets);
      text_append(t, ")");
      return;
    }
    case QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION: {
      const Qnn_BlockwiseExpansion_t* b = q->blockwiseExpansion;
      /* QNN takes the channel count from the tensor's dims, not from the struct. */
      size_t channels = (b->axis >= 0 && (uint32_t)b->axis < v->rank) ? v->dims[b->axis] : 0;
      size_t blocks = channels * b->numBlocksPerAxis;
      text_append(t, "blockwiseExpansion(axis=%d, ", (int)b->axis);
      append_scale_offsets(t, b->scaleOffsets, channels);
      text_append(t, ", blocksPerAxis=%u, scaleBitwidth=%u, storage=%s, blockScales(n=%zu, [",
                  (unsigned)b->numBlocksPerAxis, (unsigned)b->blockScaleBitwidth,
                  b->blockScaleStorageType == QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8
                      ? "8" : "16",
                  blocks);
      for (size_t i = 0; i < blocks && i < 4; ++i)
        text_append(t, "%s%u", i ? ", " : "", (unsigned)b->blocksScale8[i]);
      if (blocks > 4) text_append(t, ", ...");
      text_append(t, "], fnv=%016llx))", (unsigned long long)fnv1a64(b->blocksScale8, blocks));
      return;
    }
    default:
      text_append(t, "unsupported(%u)", (unsigned)q->quantizationEncoding);
  }
}

static void append_tensor(Text* t, const TensorView* v) {
  text_append(t, "{name=\"%s\", type=%s, dtype=%s, dims=[", v->name, tensor_type_name(v->type),
              dtype_name(v->dtype));
  for (uint32_t i = 0; i < v->rank; ++i) text_append(t, "%s%u", i ? "," : "", (unsigned)v->dims[i]);
  text_append(t, "], quant=");
  append_quant(t, v);
  if (v->data && v->data_size)
    text_append(t, ", data=%uB fnv=%016llx}", (unsigned)v->data_size,
                (unsigned long long)fnv1a64(v->data, v->data_size));
  else
    text_append(t, ", data=none}");
}

static void append_scalar(Text* t, const Qnn_Scalar_t* s) {
  text_append(t, "%s ", dtype_name(s->dataType));
  switch (s->dataType) {
    case QNN_DATATYPE_BOOL_8: text_append(t, "%u", (unsigned)s->bool8Value); break;
    case QNN_DATATYPE_UINT_8: text_append(t, "%u", (unsigned)s->uint8Value); break;
    case QNN_DATATYPE_INT_8: text_append(t, "%d", (int)s->int8Value); break;
    case QNN_DATATYPE_UINT_16: text_append(t, "%u", (unsigned)s->uint16Value); break;
    case QNN_DATATYPE_INT_16: text_append(t, "%d", (int)s->int16Value); break;
    case QNN_DATATYPE_UINT_32: text_append(t, "%u", (unsigned)s->uint32Value); break;
    case QNN_DATATYPE_INT_32: text_append(t, "%d", (int)s->int32Value); break;
    case QNN_DATATYPE_UINT_64: text_append(t, "%llu", (unsigned long long)s->uint64Value); break;
    case QNN_DATATYPE_INT_64: text_append(t, "%lld", (long long)s->int64Value); break;
    case QNN_DATATYPE_FLOAT_32: text_append(t, "%.8e", (double)s->floatValue); break;
    case QNN_DATATYPE_FLOAT_64: text_append(t, "%.17e", s->doubleValue); break;
    default: text_append(t, "?");
  }
}

static void append_bound(Text* t, const Qnn_Tensor_t* tensor) {
  TensorView v;
  view_tensor(tensor, &v);
  text_append(t, "id=%u \"%s\"", (unsigned)v.id, v.name);
}

static void append_op(Text* t, const Qnn_OpConfig_t* op) {
  const Qnn_OpConfigV1_t* o = &op->v1;
  text_append(t, "{name=\"%s\", package=\"%s\", type=\"%s\", params=[", o->name, o->packageName,
              o->typeName);
  for (uint32_t i = 0; i < o->numOfParams; ++i) {
    const Qnn_Param_t* p = &o->params[i];
    text_append(t, "%s%s=", i ? ", " : "", p->name);
    if (p->paramType == QNN_PARAMTYPE_SCALAR) {
      append_scalar(t, &p->scalarParam);
    } else {
      text_append(t, "tensor(");
      append_bound(t, &p->tensorParam);
      text_append(t, ")");
    }
  }
  text_append(t, "], inputs=[");
  for (uint32_t i = 0; i < o->numOfInputs; ++i) {
    if (i) text_append(t, ", ");
    append_bound(t, &o->inputTensors[i]);
  }
  text_append(t, "], outputs=[");
  for (uint32_t i = 0; i < o->numOfOutputs; ++i) {
    if (i) text_append(t, ", ");
    append_bound(t, &o->outputTensors[i]);
  }
  text_append(t, "]}");
}

static void append_device_configs(Text* t, const QnnDevice_Config_t** configs) {
  text_append(t, "[");
  for (size_t i = 0; configs && configs[i]; ++i) {
    const QnnDevice_Config_t* c = configs[i];
    if (i) text_append(t, ", ");
    if (c->option == QNN_DEVICE_CONFIG_OPTION_CUSTOM) {
      const QnnHtpDevice_CustomConfig_t* h = c->customConfig;
      if (h->option == QNN_HTP_DEVICE_CONFIG_OPTION_SOC)
        text_append(t, "htp.soc(%u)", (unsigned)h->socModel);
      else if (h->option == QNN_HTP_DEVICE_CONFIG_OPTION_SIGNEDPD)
        text_append(t, "htp.signedPd(%u)", (unsigned)h->useSignedProcessDomain.useSignedProcessDomain);
      else
        text_append(t, "htp.unknown(%u)", (unsigned)h->option);
    } else if (c->option == QNN_DEVICE_CONFIG_OPTION_PLATFORM_INFO) {
      const QnnDevice_PlatformInfo_t* p = c->hardwareInfo;
      const QnnDevice_HardwareDeviceInfo_t* hw = &p->v1.hwDevices[0];
      const QnnHtpDevice_DeviceInfoExtension_t* ext =
          (const QnnHtpDevice_DeviceInfoExtension_t*)hw->v1.deviceInfoExtension;
      const QnnHtpDevice_OnChipDeviceInfoExtension_t* on = &ext->onChipDevice;
      text_append(t,
                  "platformInfo(devices=%u, cores=%u, onChip(vtcmMB=%zu, soc=%u, signedPd=%u, "
                  "dlbc=%u, arch=V%u))",
                  (unsigned)p->v1.numHwDevices, (unsigned)hw->v1.numCores, (size_t)on->vtcmSize,
                  (unsigned)on->socModel, (unsigned)on->signedPdSupport, (unsigned)on->dlbcSupport,
                  (unsigned)on->arch);
    } else {
      text_append(t, "unknown(%u)", (unsigned)c->option);
    }
  }
  text_append(t, "]");
}

static void append_context_configs(Text* t, const QnnContext_Config_t** configs) {
  text_append(t, "[");
  for (size_t i = 0; configs && configs[i]; ++i) {
    const QnnHtpContext_CustomConfig_t* h = configs[i]->customConfig;
    if (i) text_append(t, ", ");
    if (configs[i]->option == QNN_CONTEXT_CONFIG_OPTION_CUSTOM &&
        h->option == QNN_HTP_CONTEXT_CONFIG_OPTION_WEIGHT_SHARING_ENABLED)
      text_append(t, "htp.weightSharingEnabled(%u)", (unsigned)h->weightSharingEnabled);
    else
      text_append(t, "unknown(%u)", (unsigned)configs[i]->option);
  }
  text_append(t, "]");
}

static void append_graph_configs(Text* t, const QnnGraph_Config_t** configs) {
  text_append(t, "[");
  for (size_t i = 0; configs && configs[i]; ++i) {
    const QnnHtpGraph_CustomConfig_t* h = configs[i]->customConfig;
    if (i) text_append(t, ", ");
    if (configs[i]->option != QNN_GRAPH_CONFIG_OPTION_CUSTOM) {
      text_append(t, "unknown(%u)", (unsigned)configs[i]->option);
      continue;
    }
    switch (h->option) {
      case QNN_HTP_GRAPH_CONFIG_OPTION_OPTIMIZATION: {
        unsigned type = h->optimizationOption.type;
        const char* name = type == QNN_HTP_GRAPH_OPTIMIZATION_TYPE_FINALIZE_OPTIMIZATION_FLAG
                               ? "FINALIZE_OPTIMIZATION_FLAG"
                               : type == QNN_HTP_GRAPH_OPTIMIZATION_TYPE_ENABLE_DLBC ? "ENABLE_DLBC"
                                                                                     : "UNKNOWN";
        text_append(t, "htp.optimization(%s, %.8e)", name, (double)h->optimizationOption.floatValue);
        break;
      }
      case QNN_HTP_GRAPH_CONFIG_OPTION_PRECISION:
        text_append(t, "htp.precision(%s)",
                    h->precision == QNN_PRECISION_FLOAT16 ? "FLOAT16" : "FLOAT32");
        break;
      case 3: /* VTCM_SIZE_IN_MB; older SDKs spell the enumerator QNN_HTP_GRAPH_CONFIG_OPTION_VTCM_SIZE */
        text_append(t, "htp.vtcmSizeInMB(%u)", (unsigned)h->vtcmSizeInMB);
        break;
      case QNN_HTP_GRAPH_CONFIG_OPTION_FOLD_RELU_ACTIVATION_INTO_CONV_OFF:
        text_append(t, "htp.foldReluActivationIntoConvOff(%u)",
                    (unsigned)h->foldReluActivationIntoConvOff);
        break;
      default:
        text_append(t, "htp.unknown(%u)", (unsigned)h->option);
    }
  }
  text_append(t, "]");
}

/* ---------------------------------------------------------------- call plumbing ------ */

/* A call line is built in `g_line` and committed to the log with its result. */
static Text g_line;

/* Why the current call was refused, appended to its error (execute-side calls only). */
static char g_reason[512];

static void reject(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_reason, sizeof g_reason, fmt, ap);
  va_end(ap);
}


static void begin(const char* function) {
  g_reason[0] = 0;
  text_clear(&g_line);
  text_append(&g_line, "%s(", function);
}

static Qnn_ErrorHandle_t finish(Qnn_ErrorHandle_t code, const char* fmt, ...) {
  text_append(&g_line, ") -> ");
  if (code) {
    text_append(&g_line, "error %llu", (unsigned long long)code);
    if (g_reason[0]) text_append(&g_line, " (%s)", g_reason);
  } else {
    va_list ap;
    va_start(ap, fmt);
    text_vappend(&g_line, fmt, ap);
    va_end(ap);
  }
  text_append(&g_log, "%s\n", g_line.data);
  return code;
}

static uint64_t injected(const char* function, const char* subject) {
  for (size_t i = 0; i < g_num_failures; ++i)
    if (strcmp(g_failures[i].function, function) == 0 && strcmp(g_failures[i].subject, subject) == 0)
      return g_failures[i].code;
  return 0;
}

static void* new_simple_handle(int kind) {
  int k = kind - 1;
  g_live[k] = grow(g_live[k], g_count[k], sizeof(int));
  g_live[k][g_count[k]++] = 1;
  return make_handle(kind, g_count[k]);
}

static char g_subject[64];

static const char* handle_subject(const void* h, int kind) {
  Text t = {0};
  append_handle(&t, h, kind);
  snprintf(g_subject, sizeof g_subject, "%s", t.data);
  text_clear(&t);
  return g_subject;
}

/* ---------------------------------------------------------------- core API ----------- */

static const char* level_name(QnnLog_Level_t level) {
  switch (level) {
    case QNN_LOG_LEVEL_ERROR: return "ERROR";
    case QNN_LOG_LEVEL_WARN: return "WARN";
    case QNN_LOG_LEVEL_INFO: return "INFO";
    case QNN_LOG_LEVEL_VERBOSE: return "VERBOSE";
    case QNN_LOG_LEVEL_DEBUG: return "DEBUG";
    default: return "UNKNOWN";
  }
}

static Qnn_ErrorHandle_t mock_log_create(QnnLog_Callback_t callback, QnnLog_Level_t level,
                                         Qnn_LogHandle_t* logger) {
  (void)callback;
  begin("logCreate");
  text_append(&g_line, "level=%s", level_name(level));
  uint64_t code = injected("logCreate", "");
  if (code) return finish(code, "");
  *logger = new_simple_handle(KIND_LOG);
  return finish(0, "log%zu", handle_index(*logger, KIND_LOG));
}

static Qnn_ErrorHandle_t mock_backend_create(Qnn_LogHandle_t logger,
                                             const QnnBackend_Config_t** config,
                                             Qnn_BackendHandle_t* backend) {
  begin("backendCreate");
  text_append(&g_line, "log=");
  append_handle(&g_line, logger, KIND_LOG);
  text_append(&g_line, ", config=[]");
  uint64_t code = injected("backendCreate", "");
  if (!code && ((logger && !simple_live(KIND_LOG, logger)) || (config && config[0])))
    code = ERR_INVALID_ARGUMENT;
  if (code) return finish(code, "");
  *backend = new_simple_handle(KIND_BACKEND);
  return finish(0, "backend%zu", handle_index(*backend, KIND_BACKEND));
}

static Qnn_ErrorHandle_t mock_device_create(Qnn_LogHandle_t logger, const QnnDevice_Config_t** config,
                                            Qnn_DeviceHandle_t* device) {
  begin("deviceCreate");
  text_append(&g_line, "log=");
  append_handle(&g_line, logger, KIND_LOG);
  text_append(&g_line, ", config=");
  append_device_configs(&g_line, config);
  uint64_t code = injected("deviceCreate", "");
  if (!code && logger && !simple_live(KIND_LOG, logger)) code = ERR_INVALID_ARGUMENT;
  if (code) return finish(code, "");
  *device = new_simple_handle(KIND_DEVICE);
  return finish(0, "device%zu", handle_index(*device, KIND_DEVICE));
}

static Qnn_ErrorHandle_t mock_context_create(Qnn_BackendHandle_t backend, Qnn_DeviceHandle_t device,
                                             const QnnContext_Config_t** config,
                                             Qnn_ContextHandle_t* context) {
  begin("contextCreate");
  text_append(&g_line, "backend=");
  append_handle(&g_line, backend, KIND_BACKEND);
  text_append(&g_line, ", device=");
  append_handle(&g_line, device, KIND_DEVICE);
  text_append(&g_line, ", config=");
  append_context_configs(&g_line, config);
  uint64_t code = injected("contextCreate", "");
  if (!code && !(simple_live(KIND_BACKEND, backend) && simple_live(KIND_DEVICE, device)))
    code = ERR_INVALID_ARGUMENT;
  if (code) return finish(code, "");
  g_contexts = grow(g_contexts, g_num_contexts, sizeof *g_contexts);
  g_contexts[g_num_contexts++] = (MockContext){1, 1, NULL, 0};
  *context = make_handle(KIND_CONTEXT, g_num_contexts);
  return finish(0, "context%zu", g_num_contexts);
}

static Qnn_ErrorHandle_t mock_graph_create(Qnn_ContextHandle_t context, const char* name,
                                           const QnnGraph_Config_t** config,
                                           Qnn_GraphHandle_t* graph) {
  begin("graphCreate");
  text_append(&g_line, "context=");
  append_handle(&g_line, context, KIND_CONTEXT);
  text_append(&g_line, ", name=\"%s\", config=", name);
  append_graph_configs(&g_line, config);
  uint64_t code = injected("graphCreate", name);
  size_t ctx = handle_index(context, KIND_CONTEXT);
  if (!code && !live_context(context)) code = ERR_INVALID_ARGUMENT;
  for (size_t g = 0; !code && g < g_num_graphs; ++g)
    if (g_graphs[g].context == ctx && strcmp(g_graphs[g].name, name) == 0) code = ERR_INVALID_ARGUMENT;
  if (code) return finish(code, "");
  g_graphs = grow(g_graphs, g_num_graphs, sizeof *g_graphs);
  g_graphs[g_num_graphs++] = (MockGraph){(unsigned)ctx, dup(name), 0, 0};
  *graph = make_handle(KIND_GRAPH, g_num_graphs);
  return finish(0, "graph%zu", g_num_graphs);
}

static Qnn_ErrorHandle_t mock_tensor_create_graph_tensor(Qnn_GraphHandle_t graph, Qnn_Tensor_t* tensor) {
  TensorView v;
  int well_formed = view_tensor(tensor, &v);
  begin("tensorCreateGraphTensor");
  text_append(&g_line, "graph=");
  append_handle(&g_line, graph, KIND_GRAPH);
  text_append(&g_line, ", tensor=");
  append_tensor(&g_line, &v);
  uint64_t code = injected("tensorCreateGraphTensor", v.name);
  MockGraph* g = live_graph(graph);
  size_t gi = handle_index(graph, KIND_GRAPH);
  if (!code && (!g || !well_formed)) code = ERR_INVALID_ARGUMENT;
  if (!code && g->finalized) code = ERR_NOT_PERMITTED;
  MockContext* ctx = g ? &g_contexts[g->context - 1] : NULL;
  for (size_t i = 0; !code && i < ctx->num_tensors; ++i)
    if (ctx->tensors[i].graph == gi && strcmp(ctx->tensors[i].name, v.name) == 0)
      code = ERR_INVALID_ARGUMENT;
  if (code) return finish(code, "");
  MockTensor m = {ctx->next_tensor_id++, (unsigned)gi, dup(v.name), v.type, v.dtype, v.rank, NULL, 0, 0, 0};
  if (v.quant->encodingDefinition == QNN_DEFINITION_DEFINED &&
      v.quant->quantizationEncoding == QNN_QUANTIZATION_ENCODING_SCALE_OFFSET) {
    m.has_scale_offset = 1;
    m.scale = v.quant->scaleOffsetEncoding.scale;
    m.offset = v.quant->scaleOffsetEncoding.offset;
  }
  m.dims = malloc((v.rank ? v.rank : 1) * sizeof *m.dims);
  if (!m.dims) abort();
  memcpy(m.dims, v.dims, v.rank * sizeof *m.dims);
  ctx->tensors = grow(ctx->tensors, ctx->num_tensors, sizeof *ctx->tensors);
  ctx->tensors[ctx->num_tensors++] = m;
  if (tensor->version == QNN_TENSOR_VERSION_2) tensor->v2.id = m.id;
  else tensor->v1.id = m.id;
  return finish(0, "id=%u", m.id);
}

static Qnn_ErrorHandle_t mock_backend_validate_op_config(Qnn_BackendHandle_t backend, Qnn_OpConfig_t op) {
  begin("backendValidateOpConfig");
  text_append(&g_line, "backend=");
  append_handle(&g_line, backend, KIND_BACKEND);
  text_append(&g_line, ", op=");
  append_op(&g_line, &op);
  uint64_t code = injected("backendValidateOpConfig", op.v1.name);
  if (!code && (!simple_live(KIND_BACKEND, backend) || op.version != QNN_OPCONFIG_VERSION_1))
    code = ERR_INVALID_ARGUMENT;
  return finish(code, "ok");
}

/* A tensor in an op config must have been created in this graph (or be a shared STATIC
 * tensor of the context) and repeat the metadata it was created with. */
static int usable(const MockContext* ctx, size_t graph, const Qnn_Tensor_t* tensor) {
  TensorView v;
  if (!view_tensor(tensor, &v)) return 0;
  for (size_t i = 0; i < ctx->num_tensors; ++i) {
    const MockTensor* m = &ctx->tensors[i];
    if (m->id != v.id) continue;
    int shared_ok = m->graph == graph || m->type == QNN_TENSOR_TYPE_STATIC;
    return shared_ok && strcmp(m->name, v.name) == 0 && m->type == v.type && m->dtype == v.dtype &&
           m->rank == v.rank && memcmp(m->dims, v.dims, v.rank * sizeof *v.dims) == 0;
  }
  return 0;
}

static Qnn_ErrorHandle_t mock_graph_add_node(Qnn_GraphHandle_t graph, Qnn_OpConfig_t op) {
  begin("graphAddNode");
  text_append(&g_line, "graph=");
  append_handle(&g_line, graph, KIND_GRAPH);
  text_append(&g_line, ", op=");
  append_op(&g_line, &op);
  uint64_t code = injected("graphAddNode", op.v1.name);
  MockGraph* g = live_graph(graph);
  if (!code && !g) code = ERR_INVALID_ARGUMENT;
  if (!code && g->finalized) code = ERR_NOT_PERMITTED;
  if (!code) {
    const MockContext* ctx = &g_contexts[g->context - 1];
    size_t gi = handle_index(graph, KIND_GRAPH);
    const Qnn_OpConfigV1_t* o = &op.v1;
    for (uint32_t i = 0; !code && i < o->numOfInputs; ++i)
      if (!usable(ctx, gi, &o->inputTensors[i])) code = ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; !code && i < o->numOfOutputs; ++i)
      if (!usable(ctx, gi, &o->outputTensors[i])) code = ERR_INVALID_ARGUMENT;
    for (uint32_t i = 0; !code && i < o->numOfParams; ++i)
      if (o->params[i].paramType == QNN_PARAMTYPE_TENSOR && !usable(ctx, gi, &o->params[i].tensorParam))
        code = ERR_INVALID_ARGUMENT;
  }
  if (!code) g->nodes++;
  return finish(code, "ok");
}

static Qnn_ErrorHandle_t mock_graph_finalize(Qnn_GraphHandle_t graph, Qnn_ProfileHandle_t profile,
                                             Qnn_SignalHandle_t signal) {
  begin("graphFinalize");
  text_append(&g_line, "graph=");
  append_handle(&g_line, graph, KIND_GRAPH);
  MockGraph* g = live_graph(graph);
  uint64_t code = injected("graphFinalize", g ? g->name : "");
  if (!code && (!g || profile || signal)) code = ERR_INVALID_ARGUMENT;
  if (!code && g->finalized) code = ERR_NOT_PERMITTED;
  if (!code) g->finalized = 1;
  return finish(code, "ok");
}


/* One line of the fake binary after the magic: a graph header or one of its I/O tensors. */
typedef struct {
  int is_graph, is_output;
  char name[256];
  unsigned nodes, id, dtype, rank;
  uint32_t dims[8];
  int has_scale_offset;
  float scale;
  int32_t offset;
} FakeLine;

static int parse_fake_line(const char* line, FakeLine* f) {
  memset(f, 0, sizeof *f);
  if (sscanf(line, "graph %255s nodes=%u", f->name, &f->nodes) == 2) {
    f->is_graph = 1;
    return 1;
  }
  char kind[4], dtype[64], dims[256];
  int n = sscanf(line, "%3s %u %255s %63s %255s %f %d", kind, &f->id, f->name, dtype, dims, &f->scale,
                 &f->offset);
  if ((n != 5 && n != 7) || (strcmp(kind, "in") != 0 && strcmp(kind, "out") != 0)) return 0;
  f->is_output = kind[0] == 'o';
  f->has_scale_offset = n == 7;
  f->dtype = dtype_from_name(dtype);
  if (f->dtype == QNN_DATATYPE_UNDEFINED) return 0;
  for (const char* p = dims; *p && f->rank < 8; ++f->rank) {
    char* end;
    f->dims[f->rank] = (uint32_t)strtoul(p, &end, 10);
    if (end == p) return 0;
    p = *end == 'x' ? end + 1 : end;
  }
  return 1;
}

/* Bytes per element of a data type: the low byte holds the bit width in decimal digits. */
static size_t element_bytes(unsigned dtype) {
  switch (dtype & 0xFF) {
    case 0x08: return 1;
    case 0x16: return 2;
    case 0x32: return 4;
    case 0x64: return 8;
    default: return 0;
  }
}

/* The fake binary of src/sdk/render.rs: graphs with their APP_WRITE / APP_READ tensors. */
#define FAKE_MAGIC "QNN-FAKE-CONTEXT-BINARY 2\n"
static uint64_t fake_binary(const void* context, Text* out) {
  MockContext* ctx = live_context(context);
  if (!ctx) return ERR_INVALID_ARGUMENT;
  size_t ci = handle_index(context, KIND_CONTEXT);
  for (size_t g = 0; g < g_num_graphs; ++g)
    if (g_graphs[g].context == ci && !g_graphs[g].finalized) return ERR_NOT_PERMITTED;
  text_append(out, "%s", FAKE_MAGIC);
  for (size_t g = 0; g < g_num_graphs; ++g) {
    if (g_graphs[g].context != ci) continue;
    text_append(out, "graph %s nodes=%u\n", g_graphs[g].name, g_graphs[g].nodes);
    const unsigned kinds[2] = {QNN_TENSOR_TYPE_APP_WRITE, QNN_TENSOR_TYPE_APP_READ};
    for (int k = 0; k < 2; ++k) {
      for (size_t i = 0; i < ctx->num_tensors; ++i) {
        const MockTensor* m = &ctx->tensors[i];
        if (m->graph != g + 1 || m->type != kinds[k]) continue;
        text_append(out, "%s %u %s %s ", k ? "out" : "in", m->id, m->name, dtype_name(m->dtype));
        for (unsigned d = 0; d < m->rank; ++d) text_append(out, "%s%u", d ? "x" : "", (unsigned)m->dims[d]);
        if (m->has_scale_offset) text_append(out, " %.8e %d", (double)m->scale, (int)m->offset);
        text_append(out, "\n");
      }
    }
  }
  return 0;
}

static Qnn_ErrorHandle_t mock_context_get_binary_size(Qnn_ContextHandle_t context,
                                                      Qnn_ContextBinarySize_t* size) {
  begin("contextGetBinarySize");
  text_append(&g_line, "context=");
  append_handle(&g_line, context, KIND_CONTEXT);
  uint64_t code = injected("contextGetBinarySize", handle_subject(context, KIND_CONTEXT));
  Text bin = {0};
  if (!code) code = fake_binary(context, &bin);
  if (!code) *size = bin.len;
  text_clear(&bin);
  return finish(code, "size=%llu", (unsigned long long)*size);
}

static Qnn_ErrorHandle_t mock_context_get_binary(Qnn_ContextHandle_t context, void* buffer,
                                                 Qnn_ContextBinarySize_t size,
                                                 Qnn_ContextBinarySize_t* written) {
  begin("contextGetBinary");
  text_append(&g_line, "context=");
  append_handle(&g_line, context, KIND_CONTEXT);
  text_append(&g_line, ", bufferSize=%llu", (unsigned long long)size);
  uint64_t code = injected("contextGetBinary", handle_subject(context, KIND_CONTEXT));
  Text bin = {0};
  if (!code) code = fake_binary(context, &bin);
  if (!code && bin.len > size) code = ERR_INVALID_ARGUMENT;
  if (!code) {
    memcpy(buffer, bin.data, bin.len);
    *written = bin.len;
  }
  text_clear(&bin);
  return finish(code, "written=%llu", (unsigned long long)*written);
}

static Qnn_ErrorHandle_t mock_context_free(Qnn_ContextHandle_t context, Qnn_ProfileHandle_t profile) {
  begin("contextFree");
  text_append(&g_line, "context=");
  append_handle(&g_line, context, KIND_CONTEXT);
  uint64_t code = injected("contextFree", handle_subject(context, KIND_CONTEXT));
  MockContext* ctx = live_context(context);
  if (!code && (!ctx || profile)) code = ERR_INVALID_ARGUMENT;
  if (!code) ctx->live = 0;
  return finish(code, "ok");
}

static Qnn_ErrorHandle_t free_simple(const char* function, int kind, void* handle) {
  begin(function);
  text_append(&g_line, "%s=", kind_name(kind));
  append_handle(&g_line, handle, kind);
  uint64_t code = injected(function, handle_subject(handle, kind));
  if (!code && !simple_live(kind, handle)) code = ERR_INVALID_ARGUMENT;
  if (!code) g_live[kind - 1][handle_index(handle, kind) - 1] = 0;
  return finish(code, "ok");
}

static Qnn_ErrorHandle_t mock_device_free(Qnn_DeviceHandle_t d) { return free_simple("deviceFree", KIND_DEVICE, d); }
static Qnn_ErrorHandle_t mock_backend_free(Qnn_BackendHandle_t b) { return free_simple("backendFree", KIND_BACKEND, b); }
static Qnn_ErrorHandle_t mock_log_free(Qnn_LogHandle_t l) { return free_simple("logFree", KIND_LOG, l); }


/* ---------------------------------------------------------------- execute side ------- */

/* Rebuilds a context from a fake binary: its graphs come back finalized with their I/O. */
static Qnn_ErrorHandle_t mock_context_create_from_binary(Qnn_BackendHandle_t backend, Qnn_DeviceHandle_t device,
                                                         const QnnContext_Config_t** config, const void* binary,
                                                         Qnn_ContextBinarySize_t size, Qnn_ContextHandle_t* context,
                                                         Qnn_ProfileHandle_t profile) {
  begin("contextCreateFromBinary");
  text_append(&g_line, "backend=");
  append_handle(&g_line, backend, KIND_BACKEND);
  text_append(&g_line, ", device=");
  append_handle(&g_line, device, KIND_DEVICE);
  text_append(&g_line, ", config=");
  append_context_configs(&g_line, config);
  text_append(&g_line, ", binary=%lluB fnv=%016llx", (unsigned long long)size,
              (unsigned long long)(binary ? fnv1a64(binary, size) : 0));
  uint64_t code = injected("contextCreateFromBinary", "");
  if (!code && (!simple_live(KIND_BACKEND, backend) || (device && !simple_live(KIND_DEVICE, device)) || profile ||
                !context || !binary)) {
    code = ERR_INVALID_ARGUMENT;
    reject("bad handle or argument");
  }
  size_t magic = strlen(FAKE_MAGIC);
  if (!code && (size < magic || memcmp(binary, FAKE_MAGIC, magic) != 0)) {
    code = ERR_INVALID_ARGUMENT;
    reject("not a context binary of this backend");
  }
  if (code) return finish(code, "");
  char* text = malloc(size + 1);
  if (!text) abort();
  memcpy(text, binary, size);
  text[size] = 0;
  g_contexts = grow(g_contexts, g_num_contexts, sizeof *g_contexts);
  g_contexts[g_num_contexts++] = (MockContext){1, 1, NULL, 0};
  size_t ci = g_num_contexts;
  MockContext* ctx = &g_contexts[ci - 1];
  size_t graph = 0;
  for (char* line = strtok(text + magic, "\n"); !code && line; line = strtok(NULL, "\n")) {
    FakeLine f;
    if (!parse_fake_line(line, &f) || (!f.is_graph && !graph)) {
      code = ERR_INVALID_ARGUMENT;
      reject("malformed binary line \"%.200s\"", line);
    } else if (f.is_graph) {
      g_graphs = grow(g_graphs, g_num_graphs, sizeof *g_graphs);
      g_graphs[g_num_graphs++] = (MockGraph){(unsigned)ci, dup(f.name), 1, f.nodes};
      graph = g_num_graphs;
    } else {
      MockTensor m = {f.id, (unsigned)graph, dup(f.name),
                      f.is_output ? QNN_TENSOR_TYPE_APP_READ : QNN_TENSOR_TYPE_APP_WRITE, f.dtype, f.rank, NULL,
                      f.has_scale_offset, f.scale, f.offset};
      m.dims = malloc(8 * sizeof *m.dims);
      if (!m.dims) abort();
      memcpy(m.dims, f.dims, sizeof f.dims);
      ctx->tensors = grow(ctx->tensors, ctx->num_tensors, sizeof *ctx->tensors);
      ctx->tensors[ctx->num_tensors++] = m;
    }
  }
  free(text);
  if (code) {
    ctx->live = 0;
    return finish(code, "");
  }
  *context = make_handle(KIND_CONTEXT, ci);
  return finish(0, "context%zu", ci);
}

static Qnn_ErrorHandle_t mock_graph_retrieve(Qnn_ContextHandle_t context, const char* name,
                                             Qnn_GraphHandle_t* graph) {
  begin("graphRetrieve");
  text_append(&g_line, "context=");
  append_handle(&g_line, context, KIND_CONTEXT);
  text_append(&g_line, ", name=\"%s\"", name ? name : "");
  uint64_t code = injected("graphRetrieve", name ? name : "");
  if (!code && (!live_context(context) || !name || !graph)) {
    code = ERR_INVALID_ARGUMENT;
    reject("bad handle or argument");
  }
  size_t ci = handle_index(context, KIND_CONTEXT), found = 0;
  for (size_t g = 0; !code && !found && g < g_num_graphs; ++g)
    if (g_graphs[g].context == ci && strcmp(g_graphs[g].name, name) == 0) found = g + 1;
  if (!code && !found) {
    code = ERR_INVALID_ARGUMENT;
    reject("no graph named \"%s\" in this context", name);
  }
  if (code) return finish(code, "");
  *graph = make_handle(KIND_GRAPH, found);
  return finish(0, "graph%zu", found);
}

/* The graph's APP_WRITE (or APP_READ) tensors in creation order = binding order. */
static size_t graph_io(const MockContext* ctx, size_t graph, unsigned type, const MockTensor** out, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; i < ctx->num_tensors; ++i)
    if (ctx->tensors[i].graph == graph && ctx->tensors[i].type == type) {
      if (n < cap) out[n] = &ctx->tensors[i];
      n++;
    }
  return n;
}

/* Whether `t` is the recorded I/O tensor `m` with a client buffer of exactly its size. */
static int bound_like(const Qnn_Tensor_t* t, const MockTensor* m, const char* what, uint32_t index) {
  TensorView v;
  if (!view_tensor(t, &v)) {
    reject("%s %u: not a RAW, dense, static-shape tensor of version 1 or 2", what, index);
    return 0;
  }
  if (v.id != m->id || !v.name || strcmp(v.name, m->name) != 0) {
    reject("%s %u: id=%u \"%s\", the graph binds id=%u \"%s\"", what, index, (unsigned)v.id, v.name ? v.name : "",
           m->id, m->name);
    return 0;
  }
  if (v.type != m->type || v.dtype != m->dtype || v.rank != m->rank ||
      memcmp(v.dims, m->dims, m->rank * sizeof *m->dims) != 0) {
    reject("%s \"%s\": type, dtype or dims differ from the binary's", what, m->name);
    return 0;
  }
  const Qnn_QuantizeParams_t* q = v.quant;
  int defined = q->encodingDefinition == QNN_DEFINITION_DEFINED;
  int same = m->has_scale_offset
                 ? defined && q->quantizationEncoding == QNN_QUANTIZATION_ENCODING_SCALE_OFFSET &&
                       q->scaleOffsetEncoding.scale == m->scale && q->scaleOffsetEncoding.offset == m->offset
                 : !defined;
  if (!same) {
    reject("%s \"%s\": quantization differs from the binary's", what, m->name);
    return 0;
  }
  size_t bytes = element_bytes(m->dtype);
  for (unsigned d = 0; d < m->rank; ++d) bytes *= m->dims[d];
  if (!v.data || v.data_size != bytes) {
    reject("%s \"%s\": client buffer of %u bytes, expected %zu", what, m->name, (unsigned)v.data_size, bytes);
    return 0;
  }
  return 1;
}

/* Fills output k's byte i with (sum of every input byte + 7 * k + i) mod 256, a function of
 * all input bytes that the tests recompute. Each call is logged with its tensors and the FNV-1a
 * digests of the input buffers. */
static Qnn_ErrorHandle_t mock_graph_execute(Qnn_GraphHandle_t graph, const Qnn_Tensor_t* inputs, uint32_t num_inputs,
                                            Qnn_Tensor_t* outputs, uint32_t num_outputs,
                                            Qnn_ProfileHandle_t profile, Qnn_SignalHandle_t signal) {
  begin("graphExecute");
  text_append(&g_line, "graph=");
  append_handle(&g_line, graph, KIND_GRAPH);
  text_append(&g_line, ", inputs=[");
  for (uint32_t i = 0; inputs && i < num_inputs; ++i) {
    TensorView v;
    view_tensor(&inputs[i], &v);
    text_append(&g_line, "%sid=%u \"%s\" %uB fnv=%016llx", i ? ", " : "", (unsigned)v.id, v.name ? v.name : "",
                (unsigned)v.data_size, (unsigned long long)(v.data ? fnv1a64(v.data, v.data_size) : 0));
  }
  text_append(&g_line, "], outputs=[");
  for (uint32_t i = 0; outputs && i < num_outputs; ++i) {
    TensorView v;
    view_tensor(&outputs[i], &v);
    text_append(&g_line, "%sid=%u \"%s\" %uB", i ? ", " : "", (unsigned)v.id, v.name ? v.name : "",
                (unsigned)v.data_size);
  }
  text_append(&g_line, "]");
  MockGraph* g = live_graph(graph);
  uint64_t code = injected("graphExecute", g ? g->name : "");
  if (!code && (!g || profile || signal || (num_inputs && !inputs) || (num_outputs && !outputs))) {
    code = ERR_INVALID_ARGUMENT;
    reject("bad handle or argument");
  }
  if (!code && !g->finalized) {
    code = ERR_NOT_PERMITTED;
    reject("graph \"%s\" is not finalized", g->name);
  }
  enum { MAX_IO = 256 };
  const MockTensor* ins[MAX_IO];
  const MockTensor* outs[MAX_IO];
  if (!code) {
    const MockContext* ctx = &g_contexts[g->context - 1];
    size_t gi = handle_index(graph, KIND_GRAPH);
    size_t n_in = graph_io(ctx, gi, QNN_TENSOR_TYPE_APP_WRITE, ins, MAX_IO);
    size_t n_out = graph_io(ctx, gi, QNN_TENSOR_TYPE_APP_READ, outs, MAX_IO);
    if (n_in != num_inputs || n_out != num_outputs || n_in > MAX_IO || n_out > MAX_IO) {
      code = ERR_INVALID_ARGUMENT;
      reject("graph \"%s\" binds %zu inputs and %zu outputs, got %u and %u", g->name, n_in, n_out,
             (unsigned)num_inputs, (unsigned)num_outputs);
    }
  }
  for (uint32_t i = 0; !code && i < num_inputs; ++i)
    if (!bound_like(&inputs[i], ins[i], "input", i)) code = ERR_INVALID_ARGUMENT;
  for (uint32_t i = 0; !code && i < num_outputs; ++i)
    if (!bound_like(&outputs[i], outs[i], "output", i)) code = ERR_INVALID_ARGUMENT;
  if (code) return finish(code, "");
  uint64_t sum = 0;
  for (uint32_t i = 0; i < num_inputs; ++i) {
    TensorView v;
    view_tensor(&inputs[i], &v);
    for (uint32_t b = 0; b < v.data_size; ++b) sum += ((const unsigned char*)v.data)[b];
  }
  for (uint32_t k = 0; k < num_outputs; ++k) {
    TensorView v;
    view_tensor(&outputs[k], &v);
    /* The output's client buffer: writable memory the caller owns. */
    unsigned char* out = outputs[k].version == QNN_TENSOR_VERSION_2 ? outputs[k].v2.clientBuf.data
                                                                  : outputs[k].v1.clientBuf.data;
    for (uint32_t b = 0; b < v.data_size; ++b) out[b] = (unsigned char)((sum + 7u * k + b) & 0xFF);
  }
  return finish(0, "ok");
}

/* ---------------------------------------------------------------- providers ---------- */

#ifndef MOCK_CORE_MAJOR
#define MOCK_CORE_MAJOR QNN_API_VERSION_MAJOR
#endif
#ifndef MOCK_CORE_MINOR
#define MOCK_CORE_MINOR QNN_API_VERSION_MINOR
#endif

static QnnInterface_t g_providers[3];
static const QnnInterface_t* g_provider_list[3];

EXPORT Qnn_ErrorHandle_t QnnInterface_getProviders(const QnnInterface_t*** list, uint32_t* count) {
  if (!list || !count) return ERR_INVALID_ARGUMENT;
  QNN_INTERFACE_VER_TYPE table;
  memset(&table, 0, sizeof table);
  table.logCreate = mock_log_create;
  table.logFree = mock_log_free;
  table.backendCreate = mock_backend_create;
  table.backendValidateOpConfig = mock_backend_validate_op_config;
  table.backendFree = mock_backend_free;
  table.deviceCreate = mock_device_create;
  table.deviceFree = mock_device_free;
  table.contextCreate = mock_context_create;
  table.contextGetBinarySize = mock_context_get_binary_size;
  table.contextGetBinary = mock_context_get_binary;
  table.contextFree = mock_context_free;
  table.graphCreate = mock_graph_create;
  table.graphAddNode = mock_graph_add_node;
  table.graphFinalize = mock_graph_finalize;
  table.tensorCreateGraphTensor = mock_tensor_create_graph_tensor;
  table.contextCreateFromBinary = mock_context_create_from_binary;
  table.graphRetrieve = mock_graph_retrieve;
  table.graphExecute = mock_graph_execute;

  uint32_t n = 0;
#if defined(MOCK_DECOY_PROVIDERS) || defined(MOCK_ONLY_DECOYS)
  /* A newer major version, then the right version for another backend (CPU = 3). */
  memset(&g_providers[n], 0, sizeof g_providers[n]);
  g_providers[n].backendId = HTP_BACKEND_ID;
  g_providers[n].providerName = "mock-newer-major";
  g_providers[n].apiVersion.coreApiVersion = (Qnn_Version_t){MOCK_CORE_MAJOR + 1, 0, 0};
  n++;
  memset(&g_providers[n], 0, sizeof g_providers[n]);
  g_providers[n].backendId = 3;
  g_providers[n].providerName = "mock-cpu";
  g_providers[n].apiVersion.coreApiVersion = (Qnn_Version_t){MOCK_CORE_MAJOR, MOCK_CORE_MINOR, 0};
  g_providers[n].QNN_INTERFACE_VER_NAME = table;
  n++;
#endif
#ifndef MOCK_ONLY_DECOYS
  memset(&g_providers[n], 0, sizeof g_providers[n]);
  g_providers[n].backendId = HTP_BACKEND_ID;
  g_providers[n].providerName = "mock-htp";
  g_providers[n].apiVersion.coreApiVersion = (Qnn_Version_t){MOCK_CORE_MAJOR, MOCK_CORE_MINOR, 0};
  g_providers[n].apiVersion.backendApiVersion = (Qnn_Version_t){5, 0, 0};
  g_providers[n].QNN_INTERFACE_VER_NAME = table;
  n++;
#endif
  for (uint32_t i = 0; i < n; ++i) g_provider_list[i] = &g_providers[i];
  *list = g_provider_list;
  *count = n;
  return QNN_SUCCESS;
}

/* ---------------------------------------------------------------- system API --------- */

typedef struct {
  QnnSystemContext_BinaryInfo_t info;
  QnnSystemContext_GraphInfo_t* graphs;
  size_t num_graphs;
  void** owned; /* names, dims and the binary copy, freed with the handle */
  size_t num_owned;
} MockSystemContext;

static void* own(MockSystemContext* s, void* p) {
  if (!p) abort();
  s->owned = grow(s->owned, s->num_owned, sizeof *s->owned);
  s->owned[s->num_owned++] = p;
  return p;
}

static Qnn_ErrorHandle_t mock_system_context_create(QnnSystemContext_Handle_t* handle) {
  if (!handle) return ERR_INVALID_ARGUMENT;
  *handle = calloc(1, sizeof(MockSystemContext));
  return *handle ? QNN_SUCCESS : 1002;
}

/* Inputs are reported as version-1 tensors and outputs as version-2 ones, so readers of the
 * metadata are exercised with both layouts. */
static void add_io(MockSystemContext* s, uint32_t* count, Qnn_Tensor_t** list, const FakeLine* f) {
  *list = realloc(*list, (*count + 1) * sizeof **list);
  if (!*list) abort();
  Qnn_Tensor_t* t = &(*list)[(*count)++];
  memset(t, 0, sizeof *t);
  uint32_t* d = own(s, calloc(8, sizeof *d));
  memcpy(d, f->dims, sizeof f->dims);
  Qnn_QuantizeParams_t q;
  memset(&q, 0, sizeof q);
  q.encodingDefinition = f->has_scale_offset ? QNN_DEFINITION_DEFINED : QNN_DEFINITION_UNDEFINED;
  q.quantizationEncoding =
      f->has_scale_offset ? QNN_QUANTIZATION_ENCODING_SCALE_OFFSET : QNN_QUANTIZATION_ENCODING_UNDEFINED;
  q.scaleOffsetEncoding.scale = f->scale;
  q.scaleOffsetEncoding.offset = f->offset;
  unsigned type = f->is_output ? QNN_TENSOR_TYPE_APP_READ : QNN_TENSOR_TYPE_APP_WRITE;
  if (f->is_output) {
    t->version = QNN_TENSOR_VERSION_2;
    t->v2.id = f->id;
    t->v2.name = own(s, dup(f->name));
    t->v2.type = type;
    t->v2.dataType = f->dtype;
    t->v2.quantizeParams = q;
    t->v2.rank = f->rank;
    t->v2.dimensions = d;
    t->v2.sparseParams.type = QNN_SPARSE_LAYOUT_UNDEFINED;
  } else {
    t->version = QNN_TENSOR_VERSION_1;
    t->v1.id = f->id;
    t->v1.name = own(s, dup(f->name));
    t->v1.type = type;
    t->v1.dataType = f->dtype;
    t->v1.quantizeParams = q;
    t->v1.rank = f->rank;
    t->v1.dimensions = d;
  }
}

static Qnn_ErrorHandle_t mock_system_context_get_metadata(QnnSystemContext_Handle_t handle,
                                                          const void* buffer, uint64_t size,
                                                          const QnnSystemContext_BinaryInfo_t** info) {
  MockSystemContext* s = handle;
  const char* magic = FAKE_MAGIC;
  if (!s || !buffer || !info || size < strlen(magic) || memcmp(buffer, magic, strlen(magic)) != 0)
    return ERR_INVALID_ARGUMENT;
  char* text = own(s, malloc(size + 1));
  memcpy(text, buffer, size);
  text[size] = 0;
  for (char* line = strtok(text + strlen(magic), "\n"); line; line = strtok(NULL, "\n")) {
    FakeLine f;
    if (!parse_fake_line(line, &f) || (!f.is_graph && !s->num_graphs)) return ERR_INVALID_ARGUMENT;
    if (f.is_graph) {
      s->graphs = realloc(s->graphs, (s->num_graphs + 1) * sizeof *s->graphs);
      if (!s->graphs) abort();
      QnnSystemContext_GraphInfo_t* g = &s->graphs[s->num_graphs++];
      memset(g, 0, sizeof *g);
      g->version = QNN_SYSTEM_CONTEXT_GRAPH_INFO_VERSION_1;
      g->graphInfoV1.graphName = own(s, dup(f.name));
    } else if (f.is_output) {
      QnnSystemContext_GraphInfoV1_t* g = &s->graphs[s->num_graphs - 1].graphInfoV1;
      add_io(s, &g->numGraphOutputs, &g->graphOutputs, &f);
    } else {
      QnnSystemContext_GraphInfoV1_t* g = &s->graphs[s->num_graphs - 1].graphInfoV1;
      add_io(s, &g->numGraphInputs, &g->graphInputs, &f);
    }
  }
  memset(&s->info, 0, sizeof s->info);
  s->info.version = QNN_SYSTEM_CONTEXT_BINARY_INFO_VERSION_1;
  s->info.contextBinaryInfoV1.backendId = HTP_BACKEND_ID;
  s->info.contextBinaryInfoV1.contextBlobSize = size;
  s->info.contextBinaryInfoV1.numGraphs = (uint32_t)s->num_graphs;
  s->info.contextBinaryInfoV1.graphs = s->graphs;
  *info = &s->info;
  return QNN_SUCCESS;
}

static Qnn_ErrorHandle_t mock_system_context_free(QnnSystemContext_Handle_t handle) {
  MockSystemContext* s = handle;
  if (!s) return ERR_INVALID_ARGUMENT;
  for (size_t i = 0; i < s->num_owned; ++i) free(s->owned[i]);
  for (size_t g = 0; g < s->num_graphs; ++g) {
    free(s->graphs[g].graphInfoV1.graphInputs);
    free(s->graphs[g].graphInfoV1.graphOutputs);
  }
  free(s->owned);
  free(s->graphs);
  free(s);
  return QNN_SUCCESS;
}

static QnnSystemInterface_t g_system_provider;
static const QnnSystemInterface_t* g_system_list[1];

EXPORT Qnn_ErrorHandle_t QnnSystemInterface_getProviders(const QnnSystemInterface_t*** list,
                                                         uint32_t* count) {
  if (!list || !count) return ERR_INVALID_ARGUMENT;
  memset(&g_system_provider, 0, sizeof g_system_provider);
  g_system_provider.backendId = HTP_BACKEND_ID;
  g_system_provider.providerName = "mock-system";
  g_system_provider.systemApiVersion =
      (Qnn_Version_t){QNN_SYSTEM_API_VERSION_MAJOR, QNN_SYSTEM_API_VERSION_MINOR, 0};
  g_system_provider.QNN_SYSTEM_INTERFACE_VER_NAME.systemContextCreate = mock_system_context_create;
  g_system_provider.QNN_SYSTEM_INTERFACE_VER_NAME.systemContextGetMetaData =
      mock_system_context_get_metadata;
  g_system_provider.QNN_SYSTEM_INTERFACE_VER_NAME.systemContextFree = mock_system_context_free;
  g_system_list[0] = &g_system_provider;
  *list = g_system_list;
  *count = 1;
  return QNN_SUCCESS;
}
