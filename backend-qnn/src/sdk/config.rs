//! HTP target options and the backend config lists they turn into.
//!
//! Options are what a user chooses (SoC, VTCM, precision, ...). [`HtpOptions`] expands them
//! into the exact config entries passed to `deviceCreate`, `contextCreate` and `graphCreate`,
//! in the order mllm's QNN AOT environment sends them (mllm's QnnTargetMachineParser.cpp and QnnAOTEnv). Both the recording
//! API and the FFI consume these lists, so a call log shows precisely what the SDK receives.

use thiserror::Error;

pub use crate::target::HtpArch;

/// Which HTP the context binary is prepared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtpDeviceOptions {
    /// `QnnHtpDevice_CustomConfig_t.socModel` (e.g. 57 for SM8650).
    pub soc_model: u32,
    pub arch: HtpArch,
    /// VTCM size of the target in MB.
    pub vtcm_mb: u32,
    /// Request a signed process domain (older QNN rejects config option 2; off by default).
    pub signed_pd: bool,
}

impl HtpDeviceOptions {
    /// Snapdragon 8 Gen 3: socModel 57, V75, 8 MB VTCM, unsigned PD.
    pub fn sm8650() -> HtpDeviceOptions {
        HtpDeviceOptions::for_chipset("SM8650").expect("SM8650 is in the chipset table")
    }

    /// Options for a chipset name such as `SM8650` (case-insensitive), unsigned PD; `None` for
    /// chipsets missing from [`crate::target::HtpChipset`] or whose VTCM size is not recorded.
    pub fn for_chipset(name: &str) -> Option<HtpDeviceOptions> {
        crate::target::HtpChipset::ALL.iter().map(|c| c.soc()).find(|c| c.name.eq_ignore_ascii_case(name)).and_then(
            |c| Some(HtpDeviceOptions { soc_model: c.soc_model, arch: c.arch, vtcm_mb: c.vtcm_mb?, signed_pd: false }),
        )
    }

    /// `deviceCreate` configs: custom SOC, custom SIGNEDPD when requested, then PLATFORM_INFO
    /// describing one on-chip HTP with one core (how QNN learns the target when preparing
    /// offline on x86).
    pub fn device_configs(&self) -> Vec<DeviceConfig> {
        let mut configs = vec![DeviceConfig::HtpSoc(self.soc_model)];
        if self.signed_pd {
            configs.push(DeviceConfig::HtpSignedPd(true));
        }
        configs.push(DeviceConfig::PlatformInfo(HtpPlatformInfo {
            vtcm_mb: self.vtcm_mb,
            soc_model: self.soc_model,
            signed_pd_support: self.signed_pd,
            dlbc_support: true,
            arch: self.arch,
        }));
        configs
    }
}

/// The on-chip device extension of `QnnDevice_PlatformInfo_t`
/// (`QnnHtpDevice_OnChipDeviceInfoExtension_t`) for one device with one core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HtpPlatformInfo {
    pub vtcm_mb: u32,
    pub soc_model: u32,
    pub signed_pd_support: bool,
    pub dlbc_support: bool,
    pub arch: HtpArch,
}

/// One `QnnDevice_Config_t` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceConfig {
    /// CUSTOM → `QnnHtpDevice_CustomConfig_t{option = SOC (0), socModel}`.
    HtpSoc(u32),
    /// CUSTOM → `{option = SIGNEDPD (2), useSignedProcessDomain{deviceId 0, value}}`.
    HtpSignedPd(bool),
    /// PLATFORM_INFO (1) → one hardware device, one core, on-chip HTP extension.
    PlatformInfo(HtpPlatformInfo),
}

/// `Qnn_Precision_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Precision {
    Float32 = 0,
    Float16 = 1,
}

impl Precision {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "FLOAT32",
            Precision::Float16 => "FLOAT16",
        }
    }
}

/// `QnnHtpGraph_OptimizationType_t` values this crate sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum HtpOptimization {
    /// The "O" level of graph preparation (3 when preparing on the host).
    FinalizeOptimizationFlag = 3,
    EnableDlbc = 4,
}

impl HtpOptimization {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            HtpOptimization::FinalizeOptimizationFlag => "FINALIZE_OPTIMIZATION_FLAG",
            HtpOptimization::EnableDlbc => "ENABLE_DLBC",
        }
    }
}

/// Per-graph HTP options (`graphCreate` configs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GraphOptions {
    /// Send `FOLD_RELU_ACTIVATION_INTO_CONV_OFF = true` (mllm does).
    pub fold_relu_into_conv_off: bool,
    /// `PRECISION`; mllm sends FLOAT16 even for quantized graphs, executorch only for fp16.
    pub precision: Option<Precision>,
    /// `OPTIMIZATION{FINALIZE_OPTIMIZATION_FLAG, level}`.
    pub optimization_level: Option<u32>,
    /// `VTCM_SIZE_IN_MB`.
    pub vtcm_mb: Option<u32>,
    /// `OPTIMIZATION{ENABLE_DLBC, 0|1}` when set.
    pub dlbc: Option<bool>,
}

impl GraphOptions {
    /// mllm's Qwen3 AOT graph settings: fold-relu off, FLOAT16 precision, O=3, VTCM 8 MB.
    pub fn mllm_default() -> GraphOptions {
        GraphOptions {
            fold_relu_into_conv_off: true,
            precision: Some(Precision::Float16),
            optimization_level: Some(3),
            vtcm_mb: Some(8),
            dlbc: None,
        }
    }

    /// `graphCreate` configs in the order mllm sends them.
    pub fn graph_configs(&self) -> Vec<GraphConfig> {
        let mut configs = Vec::new();
        if self.fold_relu_into_conv_off {
            configs.push(GraphConfig::HtpFoldReluActivationIntoConvOff(true));
        }
        if let Some(precision) = self.precision {
            configs.push(GraphConfig::HtpPrecision(precision));
        }
        if let Some(level) = self.optimization_level {
            configs.push(GraphConfig::HtpOptimization {
                kind: HtpOptimization::FinalizeOptimizationFlag,
                value: level as f32,
            });
        }
        if let Some(mb) = self.vtcm_mb {
            configs.push(GraphConfig::HtpVtcmSizeInMb(mb));
        }
        if let Some(dlbc) = self.dlbc {
            configs.push(GraphConfig::HtpOptimization {
                kind: HtpOptimization::EnableDlbc,
                value: if dlbc { 1.0 } else { 0.0 },
            });
        }
        configs
    }
}

/// One `QnnGraph_Config_t{option = CUSTOM}` entry wrapping a `QnnHtpGraph_CustomConfig_t`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GraphConfig {
    /// Option OPTIMIZATION (1).
    HtpOptimization { kind: HtpOptimization, value: f32 },
    /// Option PRECISION (2).
    HtpPrecision(Precision),
    /// Option VTCM_SIZE_IN_MB (3).
    HtpVtcmSizeInMb(u32),
    /// Option FOLD_RELU_ACTIVATION_INTO_CONV_OFF (4).
    HtpFoldReluActivationIntoConvOff(bool),
}

/// One `QnnContext_Config_t{option = CUSTOM}` entry wrapping a `QnnHtpContext_CustomConfig_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContextConfig {
    /// Option WEIGHT_SHARING_ENABLED (1): graphs of the context share STATIC tensors.
    HtpWeightSharingEnabled(bool),
}

/// `QnnLog_Level_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u32)]
pub enum LogLevel {
    Error = 1,
    Warn = 2,
    Info = 3,
    Verbose = 4,
    Debug = 5,
}

impl LogLevel {
    pub fn code(self) -> u32 {
        self as u32
    }

    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "ERROR",
            LogLevel::Warn => "WARN",
            LogLevel::Info => "INFO",
            LogLevel::Verbose => "VERBOSE",
            LogLevel::Debug => "DEBUG",
        }
    }
}

/// Everything [`crate::sdk::build_context_binary`] needs besides the graphs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HtpOptions {
    pub device: HtpDeviceOptions,
    pub graph: GraphOptions,
    /// Share STATIC tensors between the graphs of the context (prefill + decode). Needs V73+.
    pub weight_sharing: bool,
    /// Create a QNN log at this level (QNN's default logger prints it); `None` = no log handle.
    pub log_level: Option<LogLevel>,
}

impl HtpOptions {
    /// SM8650 with mllm's graph settings and weight sharing, warnings logged.
    pub fn sm8650() -> HtpOptions {
        HtpOptions {
            device: HtpDeviceOptions::sm8650(),
            graph: GraphOptions::mllm_default(),
            weight_sharing: true,
            log_level: Some(LogLevel::Warn),
        }
    }

    /// `contextCreate` configs.
    pub fn context_configs(&self) -> Vec<ContextConfig> {
        if self.weight_sharing {
            vec![ContextConfig::HtpWeightSharingEnabled(true)]
        } else {
            Vec::new()
        }
    }

    /// Rejects combinations the HTP backend would refuse late (during finalize).
    pub fn check(&self) -> Result<(), OptionsError> {
        if self.device.vtcm_mb == 0 {
            return Err(OptionsError("device vtcm_mb is 0".into()));
        }
        if let Some(mb) = self.graph.vtcm_mb {
            if mb > self.device.vtcm_mb {
                return Err(OptionsError(format!(
                    "graph vtcm_mb {mb} exceeds the device's {} MB",
                    self.device.vtcm_mb
                )));
            }
        }
        if self.weight_sharing && self.device.arch < HtpArch::V73 {
            return Err(OptionsError(format!("weight sharing needs HTP V73 or newer, target is {}", self.device.arch)));
        }
        if self.graph.optimization_level.is_some_and(|o| o > 3) {
            return Err(OptionsError("graph optimization_level must be at most 3".into()));
        }
        Ok(())
    }
}

/// Inconsistent [`HtpOptions`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid HTP options: {0}")]
pub struct OptionsError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sm8650_device_configs_match_mllm() {
        let configs = HtpDeviceOptions::sm8650().device_configs();
        assert_eq!(
            configs,
            vec![
                DeviceConfig::HtpSoc(57),
                DeviceConfig::PlatformInfo(HtpPlatformInfo {
                    vtcm_mb: 8,
                    soc_model: 57,
                    signed_pd_support: false,
                    dlbc_support: true,
                    arch: HtpArch::V75,
                }),
            ]
        );
        let signed = HtpDeviceOptions { signed_pd: true, ..HtpDeviceOptions::sm8650() };
        assert_eq!(signed.device_configs()[1], DeviceConfig::HtpSignedPd(true));
    }

    #[test]
    fn chipset_lookup() {
        let d = HtpDeviceOptions::for_chipset("sm8750").unwrap();
        assert_eq!((d.soc_model, d.arch, d.vtcm_mb), (69, HtpArch::V79, 8));
        assert_eq!(HtpDeviceOptions::for_chipset("SM0000"), None);
    }

    #[test]
    fn graph_configs_in_mllm_order() {
        let configs = GraphOptions::mllm_default().graph_configs();
        assert_eq!(
            configs,
            vec![
                GraphConfig::HtpFoldReluActivationIntoConvOff(true),
                GraphConfig::HtpPrecision(Precision::Float16),
                GraphConfig::HtpOptimization { kind: HtpOptimization::FinalizeOptimizationFlag, value: 3.0 },
                GraphConfig::HtpVtcmSizeInMb(8),
            ]
        );
    }

    #[test]
    fn options_check_rejects_impossible_targets() {
        HtpOptions::sm8650().check().unwrap();
        let mut old = HtpOptions::sm8650();
        old.device = HtpDeviceOptions::for_chipset("SM8450").unwrap();
        assert!(old.check().unwrap_err().0.contains("weight sharing needs HTP V73 or newer, target is V69"));
        old.weight_sharing = false;
        old.check().unwrap();
        let mut big = HtpOptions::sm8650();
        big.graph.vtcm_mb = Some(16);
        assert!(big.check().unwrap_err().0.contains("exceeds the device's 8 MB"));
    }
}
