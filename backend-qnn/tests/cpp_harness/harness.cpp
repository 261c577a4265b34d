// Test-only implementation of the QnnModel stand-in: prints one line per tensor and node so
// the Rust test can compare what model.cpp hands to QnnModel with the graph it came from.
#include "QnnModel.hpp"

using namespace qnn_wrapper_api;

extern "C" ModelError_t QnnModel_composeGraphs(Qnn_BackendHandle_t, QNN_INTERFACE_VER_TYPE, Qnn_ContextHandle_t,
                                               const GraphConfigInfo_t**, const uint32_t, GraphInfoPtr_t**,
                                               uint32_t*, bool, QnnLog_Callback_t, QnnLog_Level_t);

static uint64_t fnv1a(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) { h ^= ((const uint8_t*)p)[i]; h *= 0x100000001b3ull; }
  return h;
}

static uint32_t bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static void print_tensor(const char* tag, const Qnn_Tensor_t& t) {
  const Qnn_TensorV2_t& v = t.v2;
  printf("%s %s type=%u dtype=%u dims=", tag, v.name, (unsigned)v.type, (unsigned)v.dataType);
  for (uint32_t i = 0; i < v.rank; ++i) printf(i ? ",%u" : "%u", v.dimensions[i]);
  const Qnn_QuantizeParams_t& q = v.quantizeParams;
  printf(" def=%u enc=%u", (unsigned)q.encodingDefinition, (unsigned)q.quantizationEncoding);
  if (q.quantizationEncoding == QNN_QUANTIZATION_ENCODING_SCALE_OFFSET)
    printf(" so=%08x/%d", bits(q.scaleOffsetEncoding.scale), q.scaleOffsetEncoding.offset);
  if (q.quantizationEncoding == QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET) {
    const Qnn_AxisScaleOffset_t& a = q.axisScaleOffsetEncoding;
    printf(" axis=%d n=%u so_fnv=%016llx", a.axis, a.numScaleOffsets,
           (unsigned long long)fnv1a(a.scaleOffset, a.numScaleOffsets * sizeof(Qnn_ScaleOffset_t)));
  }
  if (q.quantizationEncoding == QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION) {
    const Qnn_BlockwiseExpansion_t& b = *q.blockwiseExpansion;
    uint32_t channels = v.dimensions[b.axis];
    size_t width = b.blockScaleStorageType == QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8 ? 1 : 2;
    printf(" bw_axis=%d nb=%u bits=%u storage=%u so_fnv=%016llx scales_fnv=%016llx", b.axis, b.numBlocksPerAxis,
           b.blockScaleBitwidth, (unsigned)b.blockScaleStorageType,
           (unsigned long long)fnv1a(b.scaleOffsets, channels * sizeof(Qnn_ScaleOffset_t)),
           (unsigned long long)fnv1a(b.blocksScale8, channels * b.numBlocksPerAxis * width));
  }
  if (v.clientBuf.data) printf(" size=%u data_fnv=%016llx", v.clientBuf.dataSize,
                               (unsigned long long)fnv1a(v.clientBuf.data, v.clientBuf.dataSize));
  printf("\n");
}

namespace qnn_wrapper_api {
ModelError_t QnnModel::initialize(Qnn_BackendHandle_t, QNN_INTERFACE_VER_TYPE, Qnn_ContextHandle_t, const char* name,
                                  bool, uint8_t validate, const QnnGraph_Config_t**) {
  printf("G %s validate=%u\n", name, validate);
  return MODEL_NO_ERROR;
}
ModelError_t QnnModel::addTensor(const char* name, Qnn_Tensor_t tensor) {
  if (strcmp(name, tensor.v2.name) != 0 || tensor.version != QNN_TENSOR_VERSION_2) return 1;
  print_tensor("T", tensor);
  return MODEL_NO_ERROR;
}
ModelError_t QnnModel::addNode(Qnn_OpConfigVersion_t, const char* name, const char* package, const char* type,
                               Qnn_Param_t* params, uint32_t numParams, const char** inputs, uint32_t numInputs,
                               Qnn_Tensor_t* outputs, uint32_t numOutputs) {
  printf("N %s %s %s in=", name, package, type);
  for (uint32_t i = 0; i < numInputs; ++i) printf(i ? ",%s" : "%s", inputs[i]);
  printf("\n");
  for (uint32_t i = 0; i < numParams; ++i) {
    const Qnn_Param_t& p = params[i];
    if (p.paramType == QNN_PARAMTYPE_SCALAR) {
      uint64_t raw = 0;
      memcpy(&raw, &p.scalarParam.uint64Value, sizeof raw);
      size_t width = (p.scalarParam.dataType & 0xFF) == 0x08 ? 1 : (p.scalarParam.dataType & 0xFF) == 0x16 ? 2
                   : (p.scalarParam.dataType & 0xFF) == 0x32 ? 4 : 8;
      uint64_t value = 0;
      memcpy(&value, &p.scalarParam.uint64Value, width);
      printf("S %s dtype=%u value=%llx\n", p.name, (unsigned)p.scalarParam.dataType, (unsigned long long)value);
    } else {
      printf("P %s ", p.name);
      print_tensor("", p.tensorParam);
    }
  }
  for (uint32_t i = 0; i < numOutputs; ++i) print_tensor("O", outputs[i]);
  return MODEL_NO_ERROR;
}
ModelError_t getQnnGraphConfigFromInfo(const char*, const GraphConfigInfo_t**, uint32_t, const QnnGraph_Config_t**& c) {
  c = nullptr;
  return MODEL_NO_ERROR;
}
ModelError_t getGraphInfoFromModels(QnnModel*, uint32_t n, GraphInfoPtr_t**) { printf("E %u\n", n); return MODEL_NO_ERROR; }
ModelError_t freeGraphsInfo(GraphInfoPtr_t**, uint32_t) { return MODEL_NO_ERROR; }
}  // namespace qnn_wrapper_api

int main() {
  uint32_t n = 0;
  return QnnModel_composeGraphs(nullptr, nullptr, nullptr, nullptr, 0, nullptr, &n, false, nullptr, 0) == 0 && n == 1 ? 0 : 1;
}
