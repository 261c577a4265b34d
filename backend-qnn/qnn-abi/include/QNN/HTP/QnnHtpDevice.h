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
#ifndef CLEANROOM_QNN_HTP_DEVICE_H
#define CLEANROOM_QNN_HTP_DEVICE_H

#include "QnnDevice.h"

typedef enum {
  QNN_HTP_DEVICE_ARCH_NONE = 0,
  QNN_HTP_DEVICE_ARCH_V68 = 68,
  QNN_HTP_DEVICE_ARCH_V69 = 69,
  QNN_HTP_DEVICE_ARCH_V73 = 73,
  QNN_HTP_DEVICE_ARCH_V75 = 75,
  QNN_HTP_DEVICE_ARCH_V79 = 79,
  QNN_HTP_DEVICE_ARCH_V81 = 81,
  QNN_HTP_DEVICE_ARCH_V85 = 85,
  QNN_HTP_DEVICE_ARCH_UNKNOWN = 0x7fffffff
} QnnHtpDevice_Arch_t;

typedef struct {
  uint32_t deviceId;
  QnnHtpDevice_Arch_t arch;
} QnnHtpDevice_Minimum_Arch_t;

typedef struct {
  uint32_t deviceId;
  bool useSignedProcessDomain;
} QnnHtpDevice_UseSignedProcessDomain_t;

typedef enum {
  QNN_HTP_DEVICE_CONFIG_OPTION_SOC = 0,
  QNN_HTP_DEVICE_CONFIG_OPTION_ARCH = 1,
  QNN_HTP_DEVICE_CONFIG_OPTION_SIGNEDPD = 2,
  QNN_HTP_DEVICE_CONFIG_OPTION_SECUREPD = 3,
  QNN_HTP_DEVICE_CONFIG_OPTION_UNKNOWN = 0x7fffffff
} QnnHtpDevice_ConfigOption_t;

/* ABI (checked against libQnnHtp.so of QAIRT 2.51, see tests/sdk_abi.rs): the value union
 * also holds a pointer-sized member, so it is 8-aligned: the value sits at offset 8, not 4,
 * and the struct is 16 bytes. With the value at offset 4 the backend reads socModel 0. */
typedef struct {
  QnnHtpDevice_ConfigOption_t option;
  union {
    uint32_t socModel;
    QnnHtpDevice_Minimum_Arch_t arch;
    QnnHtpDevice_UseSignedProcessDomain_t useSignedProcessDomain;
    void* pointerSizedValue;
  };
} QnnHtpDevice_CustomConfig_t;

typedef enum {
  QNN_HTP_DEVICE_TYPE_ON_CHIP = 0,
  QNN_HTP_DEVICE_TYPE_UNKNOWN = 0x7fffffff
} QnnHtpDevice_DeviceType_t;

typedef struct {
  size_t vtcmSize; /* MB */
  uint32_t socModel;
  bool signedPdSupport;
  bool dlbcSupport;
  QnnHtpDevice_Arch_t arch;
} QnnHtpDevice_OnChipDeviceInfoExtension_t;

/* What QnnDevice_HardwareDeviceInfoV1_t.deviceInfoExtension points to for HTP. */
typedef struct _QnnDevice_DeviceInfoExtension_t {
  QnnHtpDevice_DeviceType_t devType;
  union {
    QnnHtpDevice_OnChipDeviceInfoExtension_t onChipDevice;
  };
} QnnHtpDevice_DeviceInfoExtension_t;

#endif
