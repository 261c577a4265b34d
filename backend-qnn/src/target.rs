//! The HTP compile target: the AOT config's `target_machine` object and the QNN options it
//! implies.
//!
//! Input (mllm's `qnn_aot_cfg_*.json`, mllm's QnnTargetMachineParser.cpp and QnnAOTEnv):
//! `{"htp_arch": "V75", "htp_chipset": "SM8650", "htp_try_best_performance": "HtpBurst",
//!   "htp_security_pd_session": "HtpSignedPd", "htp_vtcm_capability_in_mb": 8}`.
//!
//! Output, as plain data the FFI layer turns into C structs (QnnHtpDevice.h, QnnHtpGraph.h, QnnHtpContext.h):
//! - device configs for `deviceCreate`: custom `SOC` (socModel), custom `SIGNEDPD` when the
//!   signed PD is requested, and `PLATFORM_INFO` (one on-chip device, one core, VTCM size, SoC,
//!   signed-PD support, DLBC support, arch) — what both executorch and mllm send;
//! - graph configs for `graphCreate`: fold-relu-into-conv off, FP16 precision, finalize
//!   optimization level 3, VTCM size. mllm hardcodes VTCM 8 MB; we take the JSON value;
//! - context configs for `contextCreate`: weight sharing when several graphs share weights
//!   (prefill + decode), which needs V73+;
//! - the equivalent HTP backend-extension JSON for `qnn-context-binary-generator`.
//!
//! The performance mode is carried but only matters at run time (mllm's QnnTargetMachineParser.cpp and QnnAOTEnv).
//! Parsing and checking the object (unknown names, an arch that does not match the chipset, a
//! VTCM size over the chipset's) is [`compiler::aot_config`]'s, which also owns the SoC table.

pub use compiler::aot_config::{Chipset, HtpArch, HtpChipset};
use compiler::aot_config::{HtpPdSession, HtpPerformance, TargetMachine};

use crate::json::Json;

/// The `perf_profile` name QNN tools' backend-extension JSON uses for a performance mode.
pub fn perf_profile(mode: HtpPerformance) -> &'static str {
    match mode {
        HtpPerformance::Default => "default",
        HtpPerformance::SustainedHighPerformance => "sustained_high_performance",
        HtpPerformance::Burst => "burst",
        HtpPerformance::HighPerformance => "high_performance",
        HtpPerformance::PowerSaver => "power_saver",
        HtpPerformance::LowPowerSaver => "low_power_saver",
        HtpPerformance::HighPowerSaver => "high_power_saver",
        HtpPerformance::LowBalanced => "low_balanced",
        HtpPerformance::Balanced => "balanced",
    }
}

/// The AOT config's `target_machine` (parsed and checked by
/// [`compiler::aot_config::AotConfig`]) with its SoC's facts looked up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HtpTarget {
    pub chipset: Chipset,
    pub arch: HtpArch,
    pub performance: HtpPerformance,
    pub pd_session: HtpPdSession,
    pub vtcm_mb: u32,
}

/// Why a target cannot take a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("weight sharing needs HTP V73 or newer, target is {arch}")]
    WeightSharingUnsupported { arch: HtpArch },
}

impl HtpTarget {
    /// The target of a parsed `target_machine` (whose arch, chipset and VTCM size the parser
    /// checked against each other).
    pub fn new(machine: &TargetMachine) -> HtpTarget {
        HtpTarget {
            chipset: machine.htp_chipset.soc(),
            arch: machine.htp_arch,
            performance: machine.htp_try_best_performance,
            pd_session: machine.htp_security_pd_session,
            vtcm_mb: machine.htp_vtcm_capability_in_mb,
        }
    }

    /// Device configs for `deviceCreate`, in the order executorch and mllm pass them.
    pub fn device_configs(&self) -> Vec<DeviceConfig> {
        let mut configs = vec![DeviceConfig::Soc { soc_model: self.chipset.soc_model }];
        if self.pd_session == HtpPdSession::Signed {
            configs.push(DeviceConfig::SignedPd { device_id: 0 });
        }
        configs.push(DeviceConfig::PlatformInfo(PlatformInfo {
            device_id: 0,
            device_type: 0,
            num_cores: 1,
            core_id: 0,
            core_type: 0,
            on_chip_device_type: HTP_DEVICE_TYPE_ON_CHIP,
            vtcm_size_mb: self.vtcm_mb,
            soc_model: self.chipset.soc_model,
            signed_pd_support: self.pd_session == HtpPdSession::Signed,
            dlbc_support: true,
            arch: self.arch,
        }));
        configs
    }

    /// Graph configs for `graphCreate` (mllm's set, VTCM from the JSON).
    pub fn graph_configs(&self) -> Vec<GraphConfig> {
        vec![
            GraphConfig::FoldReluActivationIntoConvOff(true),
            GraphConfig::Precision(Precision::Float16),
            GraphConfig::Optimization { kind: OptimizationType::FinalizeOptimizationFlag, value: 3.0 },
            GraphConfig::VtcmSizeMb(self.vtcm_mb),
        ]
    }

    /// Context configs for `contextCreate`. Weight sharing (several graphs over one set of
    /// weights) needs V73+ (QnnHtpGraph.h; QnnOpDef.h).
    pub fn context_configs(&self, weight_sharing: bool) -> Result<Vec<ContextConfig>, TargetError> {
        if !weight_sharing {
            return Ok(Vec::new());
        }
        if self.arch < HtpArch::V73 {
            return Err(TargetError::WeightSharingUnsupported { arch: self.arch });
        }
        Ok(vec![ContextConfig::WeightSharingEnabled(true)])
    }

    /// The options [`crate::sdk::build_context_binary`] takes: this device (SoC, arch, VTCM,
    /// signed PD), mllm's graph settings with the JSON's VTCM size, weight sharing when asked
    /// for (V73+), QNN warnings logged.
    pub fn htp_options(&self, weight_sharing: bool) -> Result<crate::sdk::HtpOptions, TargetError> {
        self.context_configs(weight_sharing)?;
        Ok(crate::sdk::HtpOptions {
            device: crate::sdk::HtpDeviceOptions {
                soc_model: self.chipset.soc_model,
                arch: self.arch,
                vtcm_mb: self.vtcm_mb,
                signed_pd: self.pd_session == HtpPdSession::Signed,
            },
            graph: crate::sdk::GraphOptions { vtcm_mb: Some(self.vtcm_mb), ..crate::sdk::GraphOptions::mllm_default() },
            weight_sharing,
            log_level: Some(crate::sdk::LogLevel::Warn),
        })
    }

    /// The HTP backend-extension config for `qnn-context-binary-generator --config_file`
    /// (the file its `backend_extensions.config_file_path` points at), in the key layout public
    /// scripts agree on (the HTP backend-extension JSON of qnn-context-binary-generator).
    pub fn backend_extension_json(&self, graph_names: &[&str]) -> Result<String, TargetError> {
        let weight_sharing = graph_names.len() > 1;
        self.context_configs(weight_sharing)?;
        let doc = Json::obj([
            (
                "graphs",
                Json::Arr(vec![Json::obj([
                    ("graph_names", Json::Arr(graph_names.iter().map(|n| Json::str(*n)).collect())),
                    ("vtcm_mb", Json::Int(self.vtcm_mb.into())),
                    ("O", Json::F32(3.0)),
                    ("fp16_relaxed_precision", Json::Int(1)),
                ])]),
            ),
            (
                "devices",
                Json::Arr(vec![Json::obj([
                    ("soc_model", Json::Int(self.chipset.soc_model.into())),
                    ("dsp_arch", Json::str(format!("v{}", self.arch.raw()))),
                    (
                        "pd_session",
                        Json::str(match self.pd_session {
                            HtpPdSession::Signed => "signed",
                            HtpPdSession::Unsigned => "unsigned",
                        }),
                    ),
                    (
                        "cores",
                        Json::Arr(vec![Json::obj([
                            ("core_id", Json::Int(0)),
                            ("perf_profile", Json::str(perf_profile(self.performance))),
                        ])]),
                    ),
                ])]),
            ),
            ("context", Json::obj([("weight_sharing_enabled", Json::Bool(weight_sharing))])),
        ]);
        Ok(doc.to_pretty(4))
    }
}

/// `QNN_HTP_DEVICE_TYPE_ON_CHIP`.
pub const HTP_DEVICE_TYPE_ON_CHIP: u32 = 0;

/// `QnnDevice_Config_t` option values.
pub mod device_option {
    pub const CUSTOM: u32 = 0;
    pub const PLATFORM_INFO: u32 = 1;
}

/// `QnnHtpDevice_ConfigOption_t` values.
pub mod htp_device_option {
    pub const SOC: u32 = 0;
    pub const ARCH: u32 = 1;
    pub const SIGNEDPD: u32 = 2;
    pub const SECUREPD: u32 = 3;
}

/// `QnnHtpGraph_ConfigOption_t` values (subset).
pub mod htp_graph_option {
    pub const OPTIMIZATION: u32 = 1;
    pub const PRECISION: u32 = 2;
    pub const VTCM_SIZE_IN_MB: u32 = 3;
    pub const FOLD_RELU_ACTIVATION_INTO_CONV_OFF: u32 = 4;
    pub const SHORT_DEPTH_CONV_ON_HMX_OFF: u32 = 5;
}

/// `QnnHtpContext_ConfigOption_t` values (subset).
pub mod htp_context_option {
    pub const WEIGHT_SHARING_ENABLED: u32 = 1;
}

/// One device config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceConfig {
    /// `QNN_DEVICE_CONFIG_OPTION_CUSTOM` -> `QNN_HTP_DEVICE_CONFIG_OPTION_SOC`.
    Soc { soc_model: u32 },
    /// `QNN_DEVICE_CONFIG_OPTION_CUSTOM` -> `QNN_HTP_DEVICE_CONFIG_OPTION_SIGNEDPD`
    /// (`useSignedProcessDomain = true`).
    SignedPd { device_id: u32 },
    /// `QNN_DEVICE_CONFIG_OPTION_PLATFORM_INFO`.
    PlatformInfo(PlatformInfo),
}

impl DeviceConfig {
    /// `QnnDevice_Config_t.option`.
    pub fn option(&self) -> u32 {
        match self {
            DeviceConfig::Soc { .. } | DeviceConfig::SignedPd { .. } => device_option::CUSTOM,
            DeviceConfig::PlatformInfo(_) => device_option::PLATFORM_INFO,
        }
    }

    /// `QnnHtpDevice_CustomConfig_t.option` for custom configs.
    pub fn htp_option(&self) -> Option<u32> {
        match self {
            DeviceConfig::Soc { .. } => Some(htp_device_option::SOC),
            DeviceConfig::SignedPd { .. } => Some(htp_device_option::SIGNEDPD),
            DeviceConfig::PlatformInfo(_) => None,
        }
    }
}

/// The offline platform description (`QnnDevice_PlatformInfo_t` -> one hardware device -> one
/// core, with a `QnnHtpDevice_DeviceInfoExtension_t` on-chip extension).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlatformInfo {
    pub device_id: u32,
    pub device_type: u32,
    pub num_cores: u32,
    pub core_id: u32,
    pub core_type: u32,
    pub on_chip_device_type: u32,
    pub vtcm_size_mb: u32,
    pub soc_model: u32,
    pub signed_pd_support: bool,
    pub dlbc_support: bool,
    pub arch: HtpArch,
}

/// `Qnn_Precision_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    Float32 = 0,
    Float16 = 1,
}

/// `QnnHtpGraph_OptimizationType_t` (subset).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizationType {
    ScheduleThreshold = 1,
    FinalizeRetries = 2,
    /// The "O" level.
    FinalizeOptimizationFlag = 3,
}

/// One HTP graph custom config (each wrapped in `QnnGraph_Config_t{option = CUSTOM}`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GraphConfig {
    FoldReluActivationIntoConvOff(bool),
    Precision(Precision),
    Optimization { kind: OptimizationType, value: f32 },
    VtcmSizeMb(u32),
}

impl GraphConfig {
    /// `QnnHtpGraph_CustomConfig_t.option`.
    pub fn htp_option(&self) -> u32 {
        match self {
            GraphConfig::FoldReluActivationIntoConvOff(_) => htp_graph_option::FOLD_RELU_ACTIVATION_INTO_CONV_OFF,
            GraphConfig::Precision(_) => htp_graph_option::PRECISION,
            GraphConfig::Optimization { .. } => htp_graph_option::OPTIMIZATION,
            GraphConfig::VtcmSizeMb(_) => htp_graph_option::VTCM_SIZE_IN_MB,
        }
    }
}

/// One HTP context custom config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContextConfig {
    WeightSharingEnabled(bool),
}

impl ContextConfig {
    /// `QnnHtpContext_CustomConfig_t.option`.
    pub fn htp_option(&self) -> u32 {
        match self {
            ContextConfig::WeightSharingEnabled(_) => htp_context_option::WEIGHT_SHARING_ENABLED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compiler::aot_config::AotConfig;

    /// mllm's Qwen3-1.7B target: SM8650, V75, burst, signed PD, 8 MB.
    fn sm8650() -> TargetMachine {
        AotConfig::w4a16_kv8().target_machine
    }

    fn target(edit: impl FnOnce(&mut TargetMachine)) -> HtpTarget {
        let mut machine = sm8650();
        edit(&mut machine);
        HtpTarget::new(&machine)
    }

    #[test]
    fn htp_options_for_the_driver_follow_the_config() {
        let t = HtpTarget::new(&sm8650());
        let o = t.htp_options(true).unwrap();
        o.check().unwrap();
        let device = crate::sdk::HtpDeviceOptions { soc_model: 57, arch: HtpArch::V75, vtcm_mb: 8, signed_pd: true };
        assert_eq!(o.device, device);
        assert_eq!(o.graph, crate::sdk::GraphOptions::mllm_default());
        assert!(o.weight_sharing);
        assert_eq!(o.context_configs(), vec![crate::sdk::ContextConfig::HtpWeightSharingEnabled(true)]);
        // The same device configs as this module's own list, in the SDK layer's terms.
        assert_eq!(
            o.device.device_configs(),
            vec![
                crate::sdk::DeviceConfig::HtpSoc(57),
                crate::sdk::DeviceConfig::HtpSignedPd(true),
                crate::sdk::DeviceConfig::PlatformInfo(crate::sdk::HtpPlatformInfo {
                    vtcm_mb: 8,
                    soc_model: 57,
                    signed_pd_support: true,
                    dlbc_support: true,
                    arch: HtpArch::V75,
                }),
            ]
        );
        assert_eq!(t.device_configs().len(), 3);
        // A smaller VTCM from the config reaches the graph configs.
        let o = target(|m| {
            m.htp_vtcm_capability_in_mb = 4;
            m.htp_security_pd_session = HtpPdSession::Unsigned;
        })
        .htp_options(false)
        .unwrap();
        assert_eq!(
            (o.device.vtcm_mb, o.graph.vtcm_mb, o.device.signed_pd, o.weight_sharing),
            (4, Some(4), false, false)
        );
        // Weight sharing needs V73+.
        let old = target(|m| {
            m.htp_arch = HtpArch::V69;
            m.htp_chipset = HtpChipset::Sm8450;
        });
        assert_eq!(old.htp_options(true).unwrap_err(), TargetError::WeightSharingUnsupported { arch: HtpArch::V69 });
        assert_eq!(
            old.htp_options(true).unwrap_err().to_string(),
            "weight sharing needs HTP V73 or newer, target is V69"
        );
        assert!(old.htp_options(false).is_ok());
    }

    #[test]
    fn the_chipset_table_gives_soc_model_and_arch() {
        let t = HtpTarget::new(&sm8650());
        assert_eq!(t.chipset.soc_model, 57);
        assert_eq!(t.arch, HtpArch::V75);
        assert_eq!(t.arch.raw(), 75);
        assert_eq!(t.vtcm_mb, 8);
        assert_eq!(t.performance, HtpPerformance::Burst);
        assert_eq!(t.pd_session, HtpPdSession::Signed);
        let t = target(|m| {
            m.htp_arch = HtpArch::V79;
            m.htp_chipset = HtpChipset::Sm8750;
        });
        assert_eq!((t.chipset.soc_model, t.arch), (69, HtpArch::V79));
    }

    #[test]
    fn vtcm_comes_from_the_config() {
        let t = target(|m| m.htp_vtcm_capability_in_mb = 4);
        assert!(t.graph_configs().contains(&GraphConfig::VtcmSizeMb(4)));
        let Some(DeviceConfig::PlatformInfo(info)) = t.device_configs().last().copied() else {
            panic!("no platform info")
        };
        assert_eq!(info.vtcm_size_mb, 4);
    }

    #[test]
    fn device_configs_for_sm8650() {
        let t = HtpTarget::new(&sm8650());
        let configs = t.device_configs();
        assert_eq!(configs.len(), 3);
        assert_eq!(configs[0], DeviceConfig::Soc { soc_model: 57 });
        assert_eq!(configs[0].option(), 0);
        assert_eq!(configs[0].htp_option(), Some(0));
        assert_eq!(configs[1].htp_option(), Some(2));
        let DeviceConfig::PlatformInfo(info) = configs[2] else { panic!("expected platform info") };
        assert_eq!(configs[2].option(), 1);
        assert_eq!(
            (info.soc_model, info.arch.raw(), info.vtcm_size_mb, info.signed_pd_support, info.dlbc_support),
            (57, 75, 8, true, true)
        );
        let unsigned = target(|m| m.htp_security_pd_session = HtpPdSession::Unsigned);
        assert_eq!(unsigned.device_configs().len(), 2);
    }

    #[test]
    fn graph_and_context_configs() {
        let t = HtpTarget::new(&sm8650());
        let g = t.graph_configs();
        assert_eq!(g.iter().map(|c| c.htp_option()).collect::<Vec<_>>(), vec![4, 2, 1, 3]);
        assert!(g.contains(&GraphConfig::Precision(Precision::Float16)));
        assert!(g.contains(&GraphConfig::Optimization { kind: OptimizationType::FinalizeOptimizationFlag, value: 3.0 }));
        assert_eq!(t.context_configs(true).unwrap(), vec![ContextConfig::WeightSharingEnabled(true)]);
        assert_eq!(ContextConfig::WeightSharingEnabled(true).htp_option(), 1);
        assert!(t.context_configs(false).unwrap().is_empty());
        let old = target(|m| {
            m.htp_arch = HtpArch::V69;
            m.htp_chipset = HtpChipset::Sm8450;
            m.htp_try_best_performance = HtpPerformance::Default;
        });
        assert!(matches!(old.context_configs(true), Err(TargetError::WeightSharingUnsupported { .. })));
    }

    #[test]
    fn backend_extension_json() {
        let t = HtpTarget::new(&sm8650());
        let text = t.backend_extension_json(&["model.0.s32", "model.0.s1"]).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["devices"][0]["soc_model"], 57);
        assert_eq!(v["devices"][0]["dsp_arch"], "v75");
        assert_eq!(v["devices"][0]["pd_session"], "signed");
        assert_eq!(v["devices"][0]["cores"][0]["perf_profile"], "burst");
        assert_eq!(v["graphs"][0]["vtcm_mb"], 8);
        assert_eq!(v["graphs"][0]["O"], 3.0);
        assert_eq!(v["graphs"][0]["graph_names"][1], "model.0.s1");
        assert_eq!(v["context"]["weight_sharing_enabled"], true);
    }
}
