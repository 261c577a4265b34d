// Test-only stand-in for the SDK's QnnModel.hpp: a minimal mirror of the QNN types the
// generated model.cpp uses (field order as `QnnTypes.h` documents it), and a QnnModel
// that prints every tensor and node it receives. Written for backend-qnn's tests; it is not
// derived from Qualcomm's headers and only models what the generated code touches.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>

typedef uint32_t Qnn_DataType_t;
enum : uint32_t {
  QNN_DATATYPE_INT_8 = 0x0008, QNN_DATATYPE_INT_16 = 0x0016, QNN_DATATYPE_INT_32 = 0x0032,
  QNN_DATATYPE_INT_64 = 0x0064, QNN_DATATYPE_UINT_8 = 0x0108, QNN_DATATYPE_UINT_16 = 0x0116,
  QNN_DATATYPE_UINT_32 = 0x0132, QNN_DATATYPE_UINT_64 = 0x0164, QNN_DATATYPE_FLOAT_16 = 0x0216,
  QNN_DATATYPE_FLOAT_32 = 0x0232, QNN_DATATYPE_FLOAT_64 = 0x0264,
  QNN_DATATYPE_SFIXED_POINT_4 = 0x0304, QNN_DATATYPE_SFIXED_POINT_8 = 0x0308,
  QNN_DATATYPE_SFIXED_POINT_16 = 0x0316, QNN_DATATYPE_SFIXED_POINT_32 = 0x0332,
  QNN_DATATYPE_UFIXED_POINT_4 = 0x0404, QNN_DATATYPE_UFIXED_POINT_8 = 0x0408,
  QNN_DATATYPE_UFIXED_POINT_16 = 0x0416, QNN_DATATYPE_UFIXED_POINT_32 = 0x0432,
  QNN_DATATYPE_BOOL_8 = 0x0508,
};
typedef enum { QNN_TENSOR_TYPE_APP_WRITE = 0, QNN_TENSOR_TYPE_APP_READ = 1, QNN_TENSOR_TYPE_APP_READWRITE = 2,
               QNN_TENSOR_TYPE_NATIVE = 3, QNN_TENSOR_TYPE_STATIC = 4, QNN_TENSOR_TYPE_NULL = 5 } Qnn_TensorType_t;
typedef enum { QNN_TENSOR_DATA_FORMAT_DENSE = 0 } Qnn_TensorDataFormat_t;
typedef enum { QNN_DEFINITION_IMPL_GENERATED = 0, QNN_DEFINITION_DEFINED = 1, QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF } Qnn_Definition_t;
typedef enum { QNN_QUANTIZATION_ENCODING_SCALE_OFFSET = 0, QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET = 1,
               QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION = 5, QNN_QUANTIZATION_ENCODING_UNDEFINED = 0x7FFFFFFF } Qnn_QuantizationEncoding_t;
typedef enum { QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8 = 0, QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_16 = 1 } Qnn_BlockwiseExpansionBlockScaleStorageType_t;
typedef enum { QNN_TENSORMEMTYPE_RAW = 0 } Qnn_TensorMemType_t;
typedef enum { QNN_TENSOR_VERSION_1 = 1, QNN_TENSOR_VERSION_2 = 2 } Qnn_TensorVersion_t;
typedef enum { QNN_SPARSE_LAYOUT_UNDEFINED = 0x7FFFFFFF } Qnn_SparseLayoutType_t;
typedef enum { QNN_PARAMTYPE_SCALAR = 0, QNN_PARAMTYPE_TENSOR = 1 } Qnn_ParamType_t;
typedef enum { QNN_OPCONFIG_VERSION_1 = 1 } Qnn_OpConfigVersion_t;

typedef struct { float scale; int32_t offset; } Qnn_ScaleOffset_t;
typedef struct { int32_t axis; uint32_t numScaleOffsets; Qnn_ScaleOffset_t* scaleOffset; } Qnn_AxisScaleOffset_t;
typedef struct {
  int32_t axis; Qnn_ScaleOffset_t* scaleOffsets; uint32_t numBlocksPerAxis; uint32_t blockScaleBitwidth;
  Qnn_BlockwiseExpansionBlockScaleStorageType_t blockScaleStorageType;
  union { uint8_t* blocksScale8; uint16_t* blocksScale16; };
} Qnn_BlockwiseExpansion_t;
typedef struct {
  Qnn_Definition_t encodingDefinition; Qnn_QuantizationEncoding_t quantizationEncoding;
  union { Qnn_ScaleOffset_t scaleOffsetEncoding; Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
          Qnn_BlockwiseExpansion_t* blockwiseExpansion; };
} Qnn_QuantizeParams_t;
typedef struct { void* data; uint32_t dataSize; } Qnn_ClientBuffer_t;
typedef struct { uint32_t numSpecifiedElements; uint32_t numSparseDimensions; } Qnn_SparseLayoutHybridCoo_t;
typedef struct { Qnn_SparseLayoutType_t type; union { Qnn_SparseLayoutHybridCoo_t hybridCoo; }; } Qnn_SparseParams_t;
typedef struct {
  uint32_t id; const char* name; Qnn_TensorType_t type; Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType; Qnn_QuantizeParams_t quantizeParams; uint32_t rank; uint32_t* dimensions;
  Qnn_TensorMemType_t memType; union { Qnn_ClientBuffer_t clientBuf; void* memHandle; };
  uint8_t* isDynamicDimensions; Qnn_SparseParams_t sparseParams; uint8_t isProduced;
} Qnn_TensorV2_t;
typedef struct { Qnn_TensorVersion_t version; union { Qnn_TensorV2_t v2; }; } Qnn_Tensor_t;
typedef struct {
  Qnn_DataType_t dataType;
  union { float floatValue; double doubleValue; uint64_t uint64Value; int64_t int64Value; uint32_t uint32Value;
          int32_t int32Value; uint16_t uint16Value; int16_t int16Value; uint8_t uint8Value; int8_t int8Value;
          uint8_t bool8Value; const char* stringValue; };
} Qnn_Scalar_t;
typedef struct { Qnn_ParamType_t paramType; const char* name; union { Qnn_Scalar_t scalarParam; Qnn_Tensor_t tensorParam; }; } Qnn_Param_t;

typedef void* Qnn_BackendHandle_t;
typedef void* Qnn_ContextHandle_t;
typedef void* QNN_INTERFACE_VER_TYPE;
typedef void* QnnLog_Callback_t;
typedef int QnnLog_Level_t;
typedef struct QnnGraph_Config QnnGraph_Config_t;
typedef struct { const char* graphName; } GraphConfigInfo_t;
typedef struct { const char* graphName; } GraphInfo_t;
typedef GraphInfo_t* GraphInfoPtr_t;

#define QNN_API __attribute__((visibility("default")))

#define BINVARSTART(NAME) ({ extern const uint8_t _binary_obj_binary_##NAME##_raw_start[]; (void*)_binary_obj_binary_##NAME##_raw_start; })
#define BINVAREND(NAME) ({ extern const uint8_t _binary_obj_binary_##NAME##_raw_end[]; (void*)_binary_obj_binary_##NAME##_raw_end; })
#define BINLEN(NAME) (uint32_t)((char*)BINVAREND(NAME) - (char*)BINVARSTART(NAME))

namespace qnn_wrapper_api {
typedef int ModelError_t;
enum { MODEL_NO_ERROR = 0 };
#define VALIDATE(value, err) do { err = (value); if (err != MODEL_NO_ERROR) return err; } while (0)

class QnnModel {
 public:
  ModelError_t initialize(Qnn_BackendHandle_t, QNN_INTERFACE_VER_TYPE, Qnn_ContextHandle_t, const char* name, bool,
                          uint8_t, const QnnGraph_Config_t**);
  ModelError_t addTensor(const char* name, Qnn_Tensor_t tensor);
  ModelError_t addNode(Qnn_OpConfigVersion_t, const char* name, const char* package, const char* type,
                       Qnn_Param_t* params, uint32_t numParams, const char** inputs, uint32_t numInputs,
                       Qnn_Tensor_t* outputs, uint32_t numOutputs);
};
ModelError_t getQnnGraphConfigFromInfo(const char*, const GraphConfigInfo_t**, uint32_t, const QnnGraph_Config_t**&);
ModelError_t getGraphInfoFromModels(QnnModel*, uint32_t, GraphInfoPtr_t**);
ModelError_t freeGraphsInfo(GraphInfoPtr_t**, uint32_t);
}  // namespace qnn_wrapper_api
