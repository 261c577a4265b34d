//! The HTP compile target: the AOT config's `target_machine` object and the QNN options it
//! implies.
//!
//! Input (mllm's `qnn_aot_cfg_*.json`, mllm-anchor §5.6):
//! `{"htp_arch": "V75", "htp_chipset": "SM8650", "htp_try_best_performance": "HtpBurst",
//!   "htp_security_pd_session": "HtpSignedPd", "htp_vtcm_capability_in_mb": 8}`.
//!
//! Output, as plain data the FFI layer turns into C structs (qnn-api.md §3):
//! - device configs for `deviceCreate`: custom `SOC` (socModel), custom `SIGNEDPD` when the
//!   signed PD is requested, and `PLATFORM_INFO` (one on-chip device, one core, VTCM size, SoC,
//!   signed-PD support, DLBC support, arch) — what both executorch and mllm send;
//! - graph configs for `graphCreate`: fold-relu-into-conv off, FP16 precision, finalize
//!   optimization level 3, VTCM size. mllm hardcodes VTCM 8 MB; we take the JSON value;
//! - context configs for `contextCreate`: weight sharing when several graphs share weights
//!   (prefill + decode), which needs V73+;
//! - the equivalent HTP backend-extension JSON for `qnn-context-binary-generator`.
//!
//! The performance mode is carried but only matters at run time (mllm-anchor §5.6).
//! Unknown names and an arch that does not match the chipset are errors naming the field.

use crate::json::Json;

/// `QnnHtpDevice_Arch_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum HtpArch {
    V68 = 68,
    V69 = 69,
    V73 = 73,
    V75 = 75,
    V79 = 79,
    V81 = 81,
    V85 = 85,
}

impl HtpArch {
    const ALL: [HtpArch; 7] =
        [HtpArch::V68, HtpArch::V69, HtpArch::V73, HtpArch::V75, HtpArch::V79, HtpArch::V81, HtpArch::V85];

    /// The `QnnHtpDevice_Arch_t` value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// `"V75"` as written in the AOT config.
    pub fn name(self) -> String {
        format!("V{}", self.raw())
    }

    /// `"v75"` as written in HTP backend-extension JSON (`dsp_arch`).
    pub fn dsp_arch(self) -> String {
        format!("v{}", self.raw())
    }

    fn parse(s: &str) -> Option<HtpArch> {
        HtpArch::ALL.into_iter().find(|a| a.name() == s)
    }
}

impl std::fmt::Display for HtpArch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "V{}", self.raw())
    }
}

/// A Snapdragon SoC with its QNN `socModel` id, HTP arch and VTCM size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chipset {
    pub name: &'static str,
    pub soc_model: u32,
    pub arch: HtpArch,
    /// VTCM in MB when a public table records it.
    pub vtcm_mb: Option<u32>,
}

/// Known SoCs: executorch `serialization/qc_schema.py` (qnn-api.md §3) and mllm's chipset enum
/// (SM8845 = 97, v81; its VTCM size is not recorded publicly, so the JSON value is trusted).
pub const CHIPSETS: [Chipset; 11] = [
    chip("SM8350", 30, HtpArch::V68, Some(4)),
    chip("SM8450", 36, HtpArch::V69, Some(8)),
    chip("SA8295", 39, HtpArch::V68, Some(8)),
    chip("SM8475", 42, HtpArch::V69, Some(8)),
    chip("SM8550", 43, HtpArch::V73, Some(8)),
    chip("SM8650", 57, HtpArch::V75, Some(8)),
    chip("SM8750", 69, HtpArch::V79, Some(8)),
    chip("SM8850", 87, HtpArch::V81, Some(8)),
    chip("QCM6490", 93, HtpArch::V68, Some(2)),
    // mllm spells this SoC QCS6490; same socModel.
    chip("QCS6490", 93, HtpArch::V68, Some(2)),
    chip("SM8845", 97, HtpArch::V81, None),
];

const fn chip(name: &'static str, soc_model: u32, arch: HtpArch, vtcm_mb: Option<u32>) -> Chipset {
    Chipset { name, soc_model, arch, vtcm_mb }
}

/// Runtime power profile (`htp_try_best_performance`), numbered as executorch's
/// `QnnExecuTorchHtpPerformanceMode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PerformanceMode {
    Default = 0,
    SustainedHighPerformance = 1,
    Burst = 2,
    HighPerformance = 3,
    PowerSaver = 4,
    LowPowerSaver = 5,
    HighPowerSaver = 6,
    LowBalanced = 7,
    Balanced = 8,
}

impl PerformanceMode {
    const ALL: [(PerformanceMode, &'static str, &'static str); 9] = [
        (PerformanceMode::Default, "HtpDefault", "default"),
        (PerformanceMode::SustainedHighPerformance, "HtpSustainedHighPerformance", "sustained_high_performance"),
        (PerformanceMode::Burst, "HtpBurst", "burst"),
        (PerformanceMode::HighPerformance, "HtpHighPerformance", "high_performance"),
        (PerformanceMode::PowerSaver, "HtpPowerSaver", "power_saver"),
        (PerformanceMode::LowPowerSaver, "HtpLowPowerSaver", "low_power_saver"),
        (PerformanceMode::HighPowerSaver, "HtpHighPowerSaver", "high_power_saver"),
        (PerformanceMode::LowBalanced, "HtpLowBalanced", "low_balanced"),
        (PerformanceMode::Balanced, "HtpBalanced", "balanced"),
    ];

    /// The `perf_profile` name used by QNN tools' backend-extension JSON.
    pub fn perf_profile(self) -> &'static str {
        PerformanceMode::ALL.iter().find(|(m, _, _)| *m == self).map_or("default", |(_, _, p)| p)
    }
}

/// Signed or unsigned process domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PdSession {
    Unsigned,
    Signed,
}

/// A parsed and checked `target_machine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HtpTarget {
    pub chipset: Chipset,
    pub arch: HtpArch,
    pub performance: PerformanceMode,
    pub pd_session: PdSession,
    pub vtcm_mb: u32,
}

/// Why a `target_machine` object was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    #[error("target_machine must be a JSON object")]
    NotAnObject,
    #[error("target_machine.{field} is missing")]
    Missing { field: &'static str },
    #[error("target_machine.{field}: expected {expected}, found {found}")]
    Type { field: &'static str, expected: &'static str, found: String },
    #[error("target_machine.{field}: unknown value `{value}` (known: {known})")]
    Unknown { field: &'static str, value: String, known: String },
    #[error("target_machine.{field}: {detail}")]
    Invalid { field: &'static str, detail: String },
    #[error("target_machine has unknown field `{field}`")]
    UnknownField { field: String },
    #[error("weight sharing needs HTP V73 or newer, target is {arch}")]
    WeightSharingUnsupported { arch: String },
}

const FIELDS: [&str; 5] =
    ["htp_arch", "htp_chipset", "htp_try_best_performance", "htp_security_pd_session", "htp_vtcm_capability_in_mb"];

impl HtpTarget {
    /// Parse a `target_machine` object (the value of that key, not the whole AOT config).
    pub fn from_json(value: &serde_json::Value) -> Result<HtpTarget, TargetError> {
        let obj = value.as_object().ok_or(TargetError::NotAnObject)?;
        if let Some(extra) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(TargetError::UnknownField { field: extra.clone() });
        }
        let string = |field: &'static str| -> Result<&str, TargetError> {
            let v = obj.get(field).ok_or(TargetError::Missing { field })?;
            v.as_str().ok_or_else(|| TargetError::Type { field, expected: "a string", found: v.to_string() })
        };
        let arch_name = string("htp_arch")?;
        let arch = HtpArch::parse(arch_name).ok_or_else(|| TargetError::Unknown {
            field: "htp_arch",
            value: arch_name.into(),
            known: HtpArch::ALL.map(|a| a.name()).join(", "),
        })?;
        let chip_name = string("htp_chipset")?;
        let chipset = CHIPSETS.iter().copied().find(|c| c.name == chip_name).ok_or_else(|| TargetError::Unknown {
            field: "htp_chipset",
            value: chip_name.into(),
            known: CHIPSETS.map(|c| c.name).join(", "),
        })?;
        if chipset.arch != arch {
            return Err(TargetError::Invalid {
                field: "htp_arch",
                detail: format!(
                    "{} does not match htp_chipset {}, which is {}",
                    arch.name(),
                    chipset.name,
                    chipset.arch.name()
                ),
            });
        }
        let perf_name = string("htp_try_best_performance")?;
        let performance =
            PerformanceMode::ALL.iter().find(|(_, n, _)| *n == perf_name).map(|(m, _, _)| *m).ok_or_else(|| {
                TargetError::Unknown {
                    field: "htp_try_best_performance",
                    value: perf_name.into(),
                    known: PerformanceMode::ALL.map(|(_, n, _)| n).join(", "),
                }
            })?;
        let pd_session = match string("htp_security_pd_session")? {
            "HtpSignedPd" => PdSession::Signed,
            "HtpUnsignedPd" => PdSession::Unsigned,
            other => {
                return Err(TargetError::Unknown {
                    field: "htp_security_pd_session",
                    value: other.into(),
                    known: "HtpSignedPd, HtpUnsignedPd".into(),
                })
            }
        };
        let field = "htp_vtcm_capability_in_mb";
        let v = obj.get(field).ok_or(TargetError::Missing { field })?;
        let vtcm_mb = v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| TargetError::Type {
            field,
            expected: "a non-negative integer",
            found: v.to_string(),
        })?;
        if vtcm_mb == 0 {
            return Err(TargetError::Invalid { field, detail: "must be at least 1 MB".into() });
        }
        if let Some(max) = chipset.vtcm_mb.filter(|&max| vtcm_mb > max) {
            return Err(TargetError::Invalid {
                field,
                detail: format!("{vtcm_mb} MB exceeds the {max} MB VTCM of {}", chipset.name),
            });
        }
        Ok(HtpTarget { chipset, arch, performance, pd_session, vtcm_mb })
    }

    /// Device configs for `deviceCreate`, in the order executorch and mllm pass them.
    pub fn device_configs(&self) -> Vec<DeviceConfig> {
        let mut configs = vec![DeviceConfig::Soc { soc_model: self.chipset.soc_model }];
        if self.pd_session == PdSession::Signed {
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
            signed_pd_support: self.pd_session == PdSession::Signed,
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
    /// weights) needs V73+ (qnn-api.md §3, §4).
    pub fn context_configs(&self, weight_sharing: bool) -> Result<Vec<ContextConfig>, TargetError> {
        if !weight_sharing {
            return Ok(Vec::new());
        }
        if self.arch < HtpArch::V73 {
            return Err(TargetError::WeightSharingUnsupported { arch: self.arch.name() });
        }
        Ok(vec![ContextConfig::WeightSharingEnabled(true)])
    }

    /// The HTP backend-extension config for `qnn-context-binary-generator --config_file`
    /// (the file its `backend_extensions.config_file_path` points at), in the key layout public
    /// scripts agree on (qnn-api.md §3 "CLI equivalent").
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
                    ("dsp_arch", Json::str(self.arch.dsp_arch())),
                    (
                        "pd_session",
                        Json::str(match self.pd_session {
                            PdSession::Signed => "signed",
                            PdSession::Unsigned => "unsigned",
                        }),
                    ),
                    (
                        "cores",
                        Json::Arr(vec![Json::obj([
                            ("core_id", Json::Int(0)),
                            ("perf_profile", Json::str(self.performance.perf_profile())),
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

    fn reference(name: &str) -> serde_json::Value {
        let path = format!("/work/shared/reference/mllm/{name}");
        let fallback = match name {
            "qwen3-1.7b-qnn-aot-config.json" => SM8650_JSON,
            _ => SM8750_JSON,
        };
        let text = std::fs::read_to_string(path).unwrap_or_else(|_| fallback.to_string());
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        doc["target_machine"].clone()
    }

    // Copies of the `target_machine` blocks of mllm's reference configs, used when the shared
    // reference directory is not mounted.
    const SM8650_JSON: &str = r#"{"target_machine": {"htp_arch": "V75", "htp_chipset": "SM8650",
        "htp_try_best_performance": "HtpBurst", "htp_security_pd_session": "HtpSignedPd",
        "htp_vtcm_capability_in_mb": 8}}"#;
    const SM8750_JSON: &str = r#"{"target_machine": {"htp_arch": "V79", "htp_chipset": "SM8750",
        "htp_try_best_performance": "HtpBurst", "htp_security_pd_session": "HtpSignedPd",
        "htp_vtcm_capability_in_mb": 8}}"#;

    #[test]
    fn parses_mllm_reference_configs() {
        let t = HtpTarget::from_json(&reference("qwen3-1.7b-qnn-aot-config.json")).unwrap();
        assert_eq!(t.chipset.soc_model, 57);
        assert_eq!(t.arch, HtpArch::V75);
        assert_eq!(t.arch.raw(), 75);
        assert_eq!(t.vtcm_mb, 8);
        assert_eq!(t.performance, PerformanceMode::Burst);
        assert_eq!(t.pd_session, PdSession::Signed);
        let t = HtpTarget::from_json(&reference("qwen3-4b-qnn-aot-config.json")).unwrap();
        assert_eq!((t.chipset.soc_model, t.arch), (69, HtpArch::V79));
    }

    fn with(field: &str, value: serde_json::Value) -> Result<HtpTarget, TargetError> {
        let mut v = reference("qwen3-1.7b-qnn-aot-config.json");
        v[field] = value;
        HtpTarget::from_json(&v)
    }

    #[test]
    fn errors_name_the_field() {
        let e = with("htp_chipset", "SM9999".into()).unwrap_err();
        assert!(matches!(&e, TargetError::Unknown { field: "htp_chipset", .. }));
        assert!(e.to_string().starts_with("target_machine.htp_chipset: unknown value `SM9999`"));
        let e = with("htp_arch", "V73".into()).unwrap_err();
        assert_eq!(e.to_string(), "target_machine.htp_arch: V73 does not match htp_chipset SM8650, which is V75");
        assert!(matches!(with("htp_arch", "V99".into()).unwrap_err(), TargetError::Unknown { field: "htp_arch", .. }));
        assert!(matches!(
            with("htp_try_best_performance", "Turbo".into()).unwrap_err(),
            TargetError::Unknown { field: "htp_try_best_performance", .. }
        ));
        assert!(matches!(
            with("htp_security_pd_session", "HtpSecurePd".into()).unwrap_err(),
            TargetError::Unknown { field: "htp_security_pd_session", .. }
        ));
        assert!(matches!(
            with("htp_vtcm_capability_in_mb", "8".into()).unwrap_err(),
            TargetError::Type { field: "htp_vtcm_capability_in_mb", .. }
        ));
        assert!(matches!(
            with("htp_vtcm_capability_in_mb", 16.into()).unwrap_err(),
            TargetError::Invalid { field: "htp_vtcm_capability_in_mb", .. }
        ));
        assert!(matches!(
            with("htp_vtcm_capability_in_mb", 0.into()).unwrap_err(),
            TargetError::Invalid { field: "htp_vtcm_capability_in_mb", .. }
        ));
        assert!(matches!(with("htp_arch", 75.into()).unwrap_err(), TargetError::Type { field: "htp_arch", .. }));
        assert!(matches!(with("htp_chipsett", "SM8650".into()).unwrap_err(), TargetError::UnknownField { .. }));
        let mut v = reference("qwen3-1.7b-qnn-aot-config.json");
        v.as_object_mut().unwrap().remove("htp_arch");
        assert_eq!(HtpTarget::from_json(&v).unwrap_err(), TargetError::Missing { field: "htp_arch" });
        assert_eq!(HtpTarget::from_json(&serde_json::json!([1])).unwrap_err(), TargetError::NotAnObject);
    }

    #[test]
    fn vtcm_comes_from_the_json() {
        let t = with("htp_vtcm_capability_in_mb", 4.into()).unwrap();
        assert!(t.graph_configs().contains(&GraphConfig::VtcmSizeMb(4)));
        let Some(DeviceConfig::PlatformInfo(info)) = t.device_configs().last().copied() else {
            panic!("no platform info")
        };
        assert_eq!(info.vtcm_size_mb, 4);
    }

    #[test]
    fn device_configs_for_sm8650() {
        let t = HtpTarget::from_json(&reference("qwen3-1.7b-qnn-aot-config.json")).unwrap();
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
        let unsigned = with("htp_security_pd_session", "HtpUnsignedPd".into()).unwrap();
        assert_eq!(unsigned.device_configs().len(), 2);
    }

    #[test]
    fn graph_and_context_configs() {
        let t = HtpTarget::from_json(&reference("qwen3-1.7b-qnn-aot-config.json")).unwrap();
        let g = t.graph_configs();
        assert_eq!(g.iter().map(|c| c.htp_option()).collect::<Vec<_>>(), vec![4, 2, 1, 3]);
        assert!(g.contains(&GraphConfig::Precision(Precision::Float16)));
        assert!(g.contains(&GraphConfig::Optimization { kind: OptimizationType::FinalizeOptimizationFlag, value: 3.0 }));
        assert_eq!(t.context_configs(true).unwrap(), vec![ContextConfig::WeightSharingEnabled(true)]);
        assert_eq!(ContextConfig::WeightSharingEnabled(true).htp_option(), 1);
        assert!(t.context_configs(false).unwrap().is_empty());
        let old: serde_json::Value = serde_json::json!({"htp_arch": "V69", "htp_chipset": "SM8450",
            "htp_try_best_performance": "HtpDefault", "htp_security_pd_session": "HtpUnsignedPd",
            "htp_vtcm_capability_in_mb": 8});
        let old = HtpTarget::from_json(&old).unwrap();
        assert!(matches!(old.context_configs(true), Err(TargetError::WeightSharingUnsupported { .. })));
    }

    #[test]
    fn backend_extension_json() {
        let t = HtpTarget::from_json(&reference("qwen3-1.7b-qnn-aot-config.json")).unwrap();
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
