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
#ifndef CLEANROOM_QNN_DEVICE_H
#define CLEANROOM_QNN_DEVICE_H

#include "QnnTypes.h"

/* Backend-specific extensions are defined by the backend's headers (HTP/QnnHtpDevice.h). */
typedef struct _QnnDevice_CoreInfoExtension_t* QnnDevice_CoreInfoExtension_t;
typedef struct _QnnDevice_DeviceInfoExtension_t* QnnDevice_DeviceInfoExtension_t;

typedef struct {
  uint32_t coreId;
  uint32_t coreType;
  QnnDevice_CoreInfoExtension_t coreInfoExtension;
} QnnDevice_CoreInfoV1_t;

typedef enum {
  QNN_DEVICE_CORE_INFO_VERSION_1 = 1,
  QNN_DEVICE_CORE_INFO_VERSION_UNDEFINED = 0x7FFFFFFF
} QnnDevice_CoreInfoVersion_t;

typedef struct {
  QnnDevice_CoreInfoVersion_t version;
  union {
    QnnDevice_CoreInfoV1_t v1;
  };
} QnnDevice_CoreInfo_t;

typedef struct {
  uint32_t deviceId;
  uint32_t deviceType;
  uint32_t numCores;
  QnnDevice_CoreInfo_t* cores;
  QnnDevice_DeviceInfoExtension_t deviceInfoExtension;
} QnnDevice_HardwareDeviceInfoV1_t;

typedef enum {
  QNN_DEVICE_HARDWARE_DEVICE_INFO_VERSION_1 = 1,
  QNN_DEVICE_HARDWARE_DEVICE_INFO_VERSION_UNDEFINED = 0x7FFFFFFF
} QnnDevice_HardwareDeviceInfoVersion_t;

typedef struct {
  QnnDevice_HardwareDeviceInfoVersion_t version;
  union {
    QnnDevice_HardwareDeviceInfoV1_t v1;
  };
} QnnDevice_HardwareDeviceInfo_t;

typedef struct {
  uint32_t numHwDevices;
  QnnDevice_HardwareDeviceInfo_t* hwDevices;
} QnnDevice_PlatformInfoV1_t;

typedef enum {
  QNN_DEVICE_PLATFORM_INFO_VERSION_1 = 1,
  QNN_DEVICE_PLATFORM_INFO_VERSION_UNDEFINED = 0x7FFFFFFF
} QnnDevice_PlatformInfoVersion_t;

typedef struct {
  QnnDevice_PlatformInfoVersion_t version;
  union {
    QnnDevice_PlatformInfoV1_t v1;
  };
} QnnDevice_PlatformInfo_t;

typedef void* QnnDevice_CustomConfig_t;

typedef enum {
  QNN_DEVICE_CONFIG_OPTION_CUSTOM = 0,
  QNN_DEVICE_CONFIG_OPTION_PLATFORM_INFO = 1,
  QNN_DEVICE_CONFIG_OPTION_UNDEFINED = 0x7FFFFFFF
} QnnDevice_ConfigOption_t;

typedef struct {
  QnnDevice_ConfigOption_t option;
  union {
    QnnDevice_CustomConfig_t customConfig;
    QnnDevice_PlatformInfo_t* hardwareInfo;
  };
} QnnDevice_Config_t;

#endif
