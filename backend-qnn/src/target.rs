//! The HTP compile target: the AOT config's `target_machine` object and the QNN options it
//! implies.
//!
//! Input (mllm's `qnn_aot_cfg_*.json`, mllm's QnnTargetMachineParser.cpp and QnnAOTEnv):
//! `{"htp_arch": "V75", "htp_chipset": "SM8650", "htp_try_best_performance": "HtpBurst",
//!   "htp_security_pd_session": "HtpSignedPd", "htp_vtcm_capability_in_mb": 8}`.
//!
//! Output: the [`crate::sdk::HtpOptions`] the driver turns into QNN configs (the one model of
//! device, graph and context configs: `sdk::config`): this device (SoC, arch, VTCM, signed PD),
//! mllm's graph settings with the JSON's VTCM size (mllm hardcodes 8 MB), weight sharing when
//! several graphs share weights (prefill + decode), which needs V73+; and the equivalent HTP
//! backend-extension JSON for `qnn-context-binary-generator`.
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

    /// Weight sharing (several graphs over one set of weights) needs V73+ (QnnHtpContext.h).
    fn check_weight_sharing(&self, weight_sharing: bool) -> Result<(), TargetError> {
        if weight_sharing && self.arch < HtpArch::V73 {
            return Err(TargetError::WeightSharingUnsupported { arch: self.arch });
        }
        Ok(())
    }

    /// The options [`crate::sdk::build_context_binary`] takes: this device (SoC, arch, VTCM,
    /// signed PD), mllm's graph settings with the JSON's VTCM size, weight sharing when asked
    /// for (V73+), QNN warnings logged.
    pub fn htp_options(&self, weight_sharing: bool) -> Result<crate::sdk::HtpOptions, TargetError> {
        self.check_weight_sharing(weight_sharing)?;
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
        self.check_weight_sharing(weight_sharing)?;
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
        let o = target(|m| m.htp_vtcm_capability_in_mb = 4).htp_options(true).unwrap();
        assert!(o.graph.graph_configs().contains(&crate::sdk::GraphConfig::HtpVtcmSizeInMb(4)));
        let Some(crate::sdk::DeviceConfig::PlatformInfo(info)) = o.device.device_configs().last().copied() else {
            panic!("no platform info")
        };
        assert_eq!(info.vtcm_mb, 4);
    }

    #[test]
    fn an_unsigned_pd_sends_no_signed_pd_config() {
        let o = target(|m| m.htp_security_pd_session = HtpPdSession::Unsigned).htp_options(true).unwrap();
        assert_eq!(o.device.device_configs().len(), 2);
        assert!(!o.device.device_configs().iter().any(|c| matches!(c, crate::sdk::DeviceConfig::HtpSignedPd(_))));
    }

    #[test]
    fn weight_sharing_needs_v73() {
        let old = target(|m| {
            m.htp_arch = HtpArch::V69;
            m.htp_chipset = HtpChipset::Sm8450;
            m.htp_try_best_performance = HtpPerformance::Default;
        });
        assert!(matches!(old.htp_options(true), Err(TargetError::WeightSharingUnsupported { .. })));
        assert!(matches!(
            old.backend_extension_json(&["model.0.s32", "model.0.s1"]),
            Err(TargetError::WeightSharingUnsupported { .. })
        ));
        assert!(old.htp_options(false).unwrap().context_configs().is_empty());
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
