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
#ifndef CLEANROOM_QNN_TYPES_H
#define CLEANROOM_QNN_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "QnnCommon.h"

/* High byte = class, low byte = bit width in decimal digits. */
typedef enum {
  QNN_DATATYPE_INT_8 = 0x0008,
  QNN_DATATYPE_INT_16 = 0x0016,
  QNN_DATATYPE_INT_32 = 0x0032,
  QNN_DATATYPE_INT_64 = 0x0064,
  QNN_DATATYPE_UINT_8 = 0x0108,
  QNN_DATATYPE_UINT_16 = 0x0116,
  QNN_DATATYPE_UINT_32 = 0x0132,
  QNN_DATATYPE_UINT_64 = 0x0164,
  QNN_DATATYPE_FLOAT_16 = 0x0216,
  QNN_DATATYPE_FLOAT_32 = 0x0232,
  QNN_DATATYPE_FLOAT_64 = 0x0264,
  QNN_DATATYPE_SFIXED_POINT_4 = 0x0304,
  QNN_DATATYPE_SFIXED_POINT_8 = 0x0308,
  QNN_DATATYPE_SFIXED_POINT_16 = 0x0316,
  QNN_DATATYPE_SFIXED_POINT_32 = 0x0332,
  QNN_DATATYPE_UFIXED_POINT_4 = 0x0404,
  QNN_DATATYPE_UFIXED_POINT_8 = 0x0408,
  QNN_DATATYPE_UFIXED_POINT_16 = 0x0416,
  QNN_DATATYPE_UFIXED_POINT_32 = 0x0432,
  QNN_DATATYPE_BOOL_8 = 0x0508,
  QNN_DATATYPE_STRING = 0x0608,
  QNN_DATATYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_DataType_t;

typedef enum {
  QNN_PRECISION_FLOAT32 = 0,
  QNN_PRECISION_FLOAT16 = 1,
  QNN_PRECISION_UNDEFINED = 0x7FFFFFFF
} Qnn_Precision_t;

typedef enum {
  QNN_TENSOR_TYPE_APP_WRITE = 0,
  QNN_TENSOR_TYPE_APP_READ = 1,
  QNN_TENSOR_TYPE_APP_READWRITE = 2,
  QNN_TENSOR_TYPE_NATIVE = 3,
  QNN_TENSOR_TYPE_STATIC = 4,
  QNN_TENSOR_TYPE_NULL = 5,
  QNN_TENSOR_TYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_TensorType_t;

typedef enum {
  QNN_PARAMTYPE_SCALAR = 0,
  QNN_PARAMTYPE_TENSOR = 1,
  QNN_PARAMTYPE_UNDEFINED = 0xFFFFFFFF
} Qnn_ParamType_t;

typedef enum {
  QNN_DEFINITION_IMPL_GENERATED = 0,
  QNN_DEFINITION_DEFINED = 1,
  QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF
} Qnn_Definition_t;

typedef struct {
  uint32_t major;
  uint32_t minor;
  uint32_t patch;
} Qnn_Version_t;

typedef struct {
  Qnn_Version_t coreApiVersion;
  Qnn_Version_t backendApiVersion;
} Qnn_ApiVersion_t;

typedef struct {
  Qnn_DataType_t dataType;
  union {
    float floatValue;
    double doubleValue;
    uint64_t uint64Value;
    int64_t int64Value;
    uint32_t uint32Value;
    int32_t int32Value;
    uint16_t uint16Value;
    int16_t int16Value;
    uint8_t uint8Value;
    int8_t int8Value;
    uint8_t bool8Value;
    const char* stringValue;
  };
} Qnn_Scalar_t;

/* float = (quantized + offset) * scale */
typedef enum {
  QNN_QUANTIZATION_ENCODING_SCALE_OFFSET = 0,
  QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET = 1,
  QNN_QUANTIZATION_ENCODING_BW_SCALE_OFFSET = 2,
  QNN_QUANTIZATION_ENCODING_BW_AXIS_SCALE_OFFSET = 3,
  QNN_QUANTIZATION_ENCODING_BLOCK = 4,
  QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION = 5,
  QNN_QUANTIZATION_ENCODING_VECTOR = 6,
  QNN_QUANTIZATION_ENCODING_UNDEFINED = 0x7FFFFFFF
} Qnn_QuantizationEncoding_t;

typedef struct {
  float scale;
  int32_t offset;
} Qnn_ScaleOffset_t;

typedef struct {
  int32_t axis;
  uint32_t numScaleOffsets;
  Qnn_ScaleOffset_t* scaleOffset;
} Qnn_AxisScaleOffset_t;

typedef struct {
  uint32_t bitwidth;
  float scale;
  int32_t offset;
} Qnn_BwScaleOffset_t;

typedef struct {
  uint32_t bitwidth;
  int32_t axis;
  uint32_t numElements;
  float* scales;
  int32_t* offsets;
} Qnn_BwAxisScaleOffset_t;

typedef struct {
  uint32_t* blockSize;
  Qnn_ScaleOffset_t* scaleOffset;
} Qnn_BlockEncoding_t;

typedef enum {
  QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_8 = 0,
  QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_16 = 1,
  QNN_BLOCKWISE_EXPANSION_BITWIDTH_SCALE_STORAGE_UNDEFINED = 0x7FFFFFFF
} Qnn_BlockwiseExpansionBlockScaleStorageType_t;

/* scaleOffsets has dims[axis] entries; block scales are indexed
 * [axisIter * numBlocksPerAxis + blockIter]. */
typedef struct {
  int32_t axis;
  Qnn_ScaleOffset_t* scaleOffsets;
  uint32_t numBlocksPerAxis;
  uint32_t blockScaleBitwidth;
  Qnn_BlockwiseExpansionBlockScaleStorageType_t blockScaleStorageType;
  union {
    uint8_t* blocksScale8;
    uint16_t* blocksScale16;
  };
} Qnn_BlockwiseExpansion_t;

typedef struct {
  Qnn_Definition_t encodingDefinition;
  Qnn_QuantizationEncoding_t quantizationEncoding;
  union {
    Qnn_ScaleOffset_t scaleOffsetEncoding;
    Qnn_AxisScaleOffset_t axisScaleOffsetEncoding;
    Qnn_BwScaleOffset_t bwScaleOffsetEncoding;
    Qnn_BwAxisScaleOffset_t bwAxisScaleOffsetEncoding;
    Qnn_BlockEncoding_t blockEncoding;
    Qnn_BlockwiseExpansion_t* blockwiseExpansion;
  };
} Qnn_QuantizeParams_t;

typedef uint32_t Qnn_TensorDataFormat_t;
#define QNN_TENSOR_DATA_FORMAT_DENSE 0
#define QNN_TENSOR_DATA_FORMAT_FLAT_BUFFER QNN_TENSOR_DATA_FORMAT_DENSE

typedef enum {
  QNN_TENSORMEMTYPE_RAW = 0,
  QNN_TENSORMEMTYPE_MEMHANDLE = 1,
  QNN_TENSORMEMTYPE_RETRIEVE_RAW = 2,
  QNN_TENSORMEMTYPE_UNDEFINED = 0x7FFFFFFF
} Qnn_TensorMemType_t;

typedef struct {
  void* data;
  uint32_t dataSize;
} Qnn_ClientBuffer_t;

/* Only referenced through a pointer by this header set. */
typedef struct Qnn_TensorRetrieveRaw Qnn_TensorRetrieveRaw_t;

typedef enum {
  QNN_SPARSE_LAYOUT_HYBRID_COO = 0,
  QNN_SPARSE_LAYOUT_UNDEFINED = 0x7FFFFFFF
} Qnn_SparseLayoutType_t;

typedef struct {
  uint32_t numSpecifiedElements;
  uint32_t numSparseDimensions;
} Qnn_SparseLayoutHybridCoo_t;

typedef struct {
  Qnn_SparseLayoutType_t type;
  union {
    Qnn_SparseLayoutHybridCoo_t hybridCoo;
  };
} Qnn_SparseParams_t;

typedef struct {
  uint32_t id;
  const char* name;
  Qnn_TensorType_t type;
  Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType;
  Qnn_QuantizeParams_t quantizeParams;
  uint32_t rank;
  uint32_t* dimensions;
  Qnn_TensorMemType_t memType;
  union {
    Qnn_ClientBuffer_t clientBuf;
    Qnn_MemHandle_t memHandle;
  };
} Qnn_TensorV1_t;

typedef struct {
  uint32_t id;
  const char* name;
  Qnn_TensorType_t type;
  Qnn_TensorDataFormat_t dataFormat;
  Qnn_DataType_t dataType;
  Qnn_QuantizeParams_t quantizeParams;
  uint32_t rank;
  uint32_t* dimensions;
  Qnn_TensorMemType_t memType;
  union {
    Qnn_ClientBuffer_t clientBuf;
    Qnn_MemHandle_t memHandle;
    Qnn_TensorRetrieveRaw_t* retrieveRaw;
  };
  uint8_t* isDynamicDimensions;
  Qnn_SparseParams_t sparseParams;
  uint8_t isProduced;
} Qnn_TensorV2_t;

typedef enum {
  QNN_TENSOR_VERSION_1 = 1,
  QNN_TENSOR_VERSION_2 = 2,
  QNN_TENSOR_VERSION_UNDEFINED = 0x7FFFFFFF
} Qnn_TensorVersion_t;

typedef struct {
  Qnn_TensorVersion_t version;
  union {
    Qnn_TensorV1_t v1;
    Qnn_TensorV2_t v2;
  };
} Qnn_Tensor_t;

typedef struct {
  Qnn_ParamType_t paramType;
  const char* name;
  union {
    Qnn_Scalar_t scalarParam;
    Qnn_Tensor_t tensorParam;
  };
} Qnn_Param_t;

typedef struct {
  const char* name;
  const char* packageName;
  const char* typeName;
  uint32_t numOfParams;
  Qnn_Param_t* params;
  uint32_t numOfInputs;
  Qnn_Tensor_t* inputTensors;
  uint32_t numOfOutputs;
  Qnn_Tensor_t* outputTensors;
} Qnn_OpConfigV1_t;

typedef enum {
  QNN_OPCONFIG_VERSION_1 = 1,
  QNN_OPCONFIG_VERSION_UNDEFINED = 0x7FFFFFFF
} Qnn_OpConfigVersion_t;

typedef struct {
  Qnn_OpConfigVersion_t version;
  union {
    Qnn_OpConfigV1_t v1;
  };
} Qnn_OpConfig_t;

#endif
