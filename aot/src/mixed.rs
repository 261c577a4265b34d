//! Mixed 4/8-bit linear weights chosen by measurement under a byte budget (`--weight-budget`).
//!
//! Every linear is LPBQ int4 by default. With a budget `b` (a fraction over the all-int4 bytes of
//! the linears, e.g. `0.10`), each linear's sensitivity is measured on the calibration text: the
//! mean KL(float ‖ model) of the float model with that linear alone at its deployed int4 weights
//! (activations float, the recipe's rotation and sink prefix in place). Its loss at 8 bits is
//! neither measured nor subtracted (per-channel int8 has 127 levels a side where LPBQ has 7 per
//! block). Then linears are raised to per-channel int8 greedily, the
//! largest sensitivity per extra byte first, while the extra bytes fit `b` times the all-int4
//! bytes; a linear that does not fit is skipped and smaller ones are still tried.
//!
//! Bytes are the device's: LPBQ `In*Out/2` code bytes + `In*Out/block` block scales (8-bit
//! storage) + `4*Out` channel scales; int8 `In*Out` + `4*Out`.

use std::collections::BTreeSet;

use crate::recipe::RecipeError;

/// A `--weight-budget`: the extra bytes allowed for 8-bit linears, as a fraction of the
/// linears' all-int4 bytes (`0.10`: +10 %).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WeightBudget(f64);

impl WeightBudget {
    /// The largest budget taken: every linear at 8 bits costs less than +100 % over int4.
    pub const MAX: f64 = 1.0;

    pub fn new(fraction: f64) -> Result<Self, RecipeError> {
        if !fraction.is_finite() || !(0.0..=Self::MAX).contains(&fraction) {
            return Err(RecipeError::WeightBudget {
                value: fraction.to_string(),
                reason: format!("expected a fraction in 0..={} over the all-int4 bytes (0.10 for +10 %)", Self::MAX),
            });
        }
        Ok(WeightBudget(fraction))
    }

    pub fn fraction(self) -> f64 {
        self.0
    }
}

impl std::fmt::Display for WeightBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "+{:.1} %", self.0 * 100.0)
    }
}

impl std::str::FromStr for WeightBudget {
    type Err = RecipeError;

    fn from_str(s: &str) -> Result<Self, RecipeError> {
        let fraction: f64 = s.trim().parse().map_err(|_| RecipeError::WeightBudget {
            value: s.to_string(),
            reason: "not a number; expected a fraction over the all-int4 bytes (0.10 for +10 %)".into(),
        })?;
        WeightBudget::new(fraction).map_err(|e| match e {
            RecipeError::WeightBudget { reason, .. } => RecipeError::WeightBudget { value: s.to_string(), reason },
            other => other,
        })
    }
}

/// One linear the choice may raise: its shape, LPBQ block and measured sensitivity.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearCandidate {
    /// Op path, e.g. `model.layers.3.mlp.down_proj`.
    pub op: String,
    pub out_features: usize,
    pub in_features: usize,
    pub block_size: usize,
    /// Mean KL(float ‖ model) with this linear alone at int4 (module docs).
    pub sensitivity: f64,
}

impl LinearCandidate {
    /// Device bytes at LPBQ int4.
    pub fn int4_bytes(&self) -> usize {
        let n = self.out_features * self.in_features;
        n / 2 + n / self.block_size.max(1) + 4 * self.out_features
    }

    /// Device bytes at per-channel int8.
    pub fn int8_bytes(&self) -> usize {
        compiler::quant::int8_channel::Int8Channel::device_bytes(self.out_features, self.in_features)
    }

    /// What raising it to 8 bits costs.
    pub fn extra_bytes(&self) -> usize {
        self.int8_bytes().saturating_sub(self.int4_bytes())
    }
}

/// The linears raised to 8 bits and what they cost.
#[derive(Clone, Debug, PartialEq)]
pub struct MixedChoice {
    pub budget: WeightBudget,
    /// The candidates, most sensitive per extra byte first (the order they were considered in).
    pub ranked: Vec<LinearCandidate>,
    /// The raised linears, in the order chosen.
    pub eight_bit: Vec<String>,
    /// All linears at int4.
    pub int4_bytes: usize,
    /// `budget` times `int4_bytes`.
    pub budget_bytes: usize,
    /// Spent on the raised linears (at most `budget_bytes`).
    pub extra_bytes: usize,
    /// Summed sensitivity of the raised linears and of all linears.
    pub raised_sensitivity: f64,
    pub total_sensitivity: f64,
}

/// Greedy choice (module docs). Candidates with no measured loss (sensitivity <= 0) are never
/// raised. Ties in sensitivity per byte are broken by op path, so the choice is deterministic.
pub fn choose_eight_bit(candidates: &[LinearCandidate], budget: WeightBudget) -> MixedChoice {
    let int4_bytes: usize = candidates.iter().map(LinearCandidate::int4_bytes).sum();
    let budget_bytes = (budget.fraction() * int4_bytes as f64).floor() as usize;
    let per_byte = |c: &LinearCandidate| c.sensitivity / c.extra_bytes().max(1) as f64;
    let mut ranked = candidates.to_vec();
    ranked.sort_by(|a, b| per_byte(b).total_cmp(&per_byte(a)).then_with(|| a.op.cmp(&b.op)));
    let (mut eight_bit, mut extra_bytes, mut raised_sensitivity) = (Vec::new(), 0usize, 0.0);
    for c in ranked.iter().filter(|c| c.sensitivity > 0.0) {
        if extra_bytes + c.extra_bytes() <= budget_bytes {
            extra_bytes += c.extra_bytes();
            raised_sensitivity += c.sensitivity;
            eight_bit.push(c.op.clone());
        }
    }
    let total_sensitivity = candidates.iter().map(|c| c.sensitivity).sum();
    MixedChoice {
        budget,
        ranked,
        eight_bit,
        int4_bytes,
        budget_bytes,
        extra_bytes,
        raised_sensitivity,
        total_sensitivity,
    }
}

impl MixedChoice {
    pub fn eight_bit_set(&self) -> BTreeSet<String> {
        self.eight_bit.iter().cloned().collect()
    }

    /// The printed choice: a summary line, then the raised linears with their sensitivity and cost.
    pub fn table(&self) -> String {
        let mb = |b: usize| b as f64 / 1e6;
        let mut s = format!(
            "weight budget {}: {} of {} linears at 8 bits, +{:.2} MB of {:.2} MB allowed over {:.2} MB all-int4 \
             (+{:.2} %); they carry {:.1} % of the summed single-linear KL\n",
            self.budget,
            self.eight_bit.len(),
            self.ranked.len(),
            mb(self.extra_bytes),
            mb(self.budget_bytes),
            mb(self.int4_bytes),
            100.0 * self.extra_bytes as f64 / self.int4_bytes.max(1) as f64,
            100.0 * self.raised_sensitivity / self.total_sensitivity.max(f64::MIN_POSITIVE),
        );
        let width = self.ranked.iter().map(|c| c.op.len()).max().unwrap_or(2).max(2);
        s.push_str(&format!("{:<width$}  {:>10}  {:>10}  {:>5}\n", "op", "KL int4", "extra KB", "bits"));
        let raised = self.eight_bit_set();
        for c in &self.ranked {
            let bits = if raised.contains(&c.op) { 8 } else { 4 };
            if bits == 8 {
                s.push_str(&format!(
                    "{:<width$}  {:>10.6}  {:>10.1}  {:>5}\n",
                    c.op,
                    c.sensitivity,
                    c.extra_bytes() as f64 / 1e3,
                    bits
                ));
            }
        }
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        let raised = self.eight_bit_set();
        serde_json::json!({
            "budget_fraction": self.budget.fraction(),
            "int4_bytes": self.int4_bytes,
            "budget_bytes": self.budget_bytes,
            "extra_bytes": self.extra_bytes,
            "eight_bit": self.eight_bit,
            "linears": self.ranked.iter().map(|c| serde_json::json!({
                "op": c.op, "out_features": c.out_features, "in_features": c.in_features,
                "block_size": c.block_size, "sensitivity_kl": c.sensitivity,
                "extra_bytes": c.extra_bytes(), "bits": if raised.contains(&c.op) { 8 } else { 4 },
            })).collect::<Vec<_>>(),
        })
    }
}

/// The file beside a mixed checkpoint's weights that records the choice ([`MixedChoice::to_json`]).
pub const WEIGHT_BITS_FILE: &str = "weight_bits.json";

/// Tokens of the calibration text the sensitivities are measured on (its first ones).
pub const SENSITIVITY_TOKENS: usize = 512;
/// Tokens per window of that measurement.
pub const SENSITIVITY_WINDOW: usize = 256;

/// What [`measure_sensitivities`] runs.
pub(crate) struct SensitivityRun<'a> {
    pub hf: &'a models::hf::HfConfig,
    /// The float checkpoint calibration quantizes (rotated, with a rotation).
    pub model_dir: &'a std::path::Path,
    pub aot: &'a compiler::aot_config::AotConfig,
    pub max_positions: usize,
    pub prefix: Option<&'a backend_cpu::quant::SinkPrefix>,
    /// Calibration tokens.
    pub ids: &'a [i64],
    pub progress: &'a dyn crate::progress::Progress,
}

/// Each LPBQ linear of `plan` scored alone at its int4 weights from `linears` (module docs). The
/// int4 exports are cached in `linears`, so the export after the choice rounds nothing twice.
pub(crate) fn measure_sensitivities(
    run: &SensitivityRun<'_>,
    plan: &backend_cpu::quant::ExportPlan,
    linears: &backend_cpu::quant::LinearQuantizer,
) -> crate::Result<Vec<LinearCandidate>> {
    use crate::error::Context;
    use backend_cpu::quant::{CalibrationMode, CalibrationWeights, ParamPlan, TextEval};
    use backend_cpu::{CheckpointStore, CpuBackend};
    use mllm_dsl::module::ParamSource;

    let targets: Vec<(&str, usize, usize, usize)> = plan
        .params
        .iter()
        .filter_map(|p| match p {
            ParamPlan::Lpbq { op, out_features, in_features, block_size, .. } => {
                Some((op.as_str(), *out_features, *in_features, *block_size))
            }
            _ => None,
        })
        .collect();
    let backend = CpuBackend::float();
    let store = CheckpointStore::for_config(run.model_dir, backend.clone(), run.hf)?;
    let windows = run.ids.chunks(SENSITIVITY_WINDOW).filter(|w| w.len() >= 2).count();
    let pb = run.progress.start("sensitivity", (1 + targets.len()) * windows);
    let tick = |_: usize, _: usize| pb.inc(1);
    pb.set_message("float");
    let float = crate::load::build_model(run.hf, run.max_positions, &ParamSource::Store(&store), run.model_dir)?;
    let eval = TextEval::new(float.as_ref(), &backend, run.prefix, run.ids, SENSITIVITY_WINDOW, &tick)
        .context("the float run of the sensitivity measurement")?;
    drop(float);
    let mut out = Vec::with_capacity(targets.len());
    for (op, out_features, in_features, block_size) in targets {
        pb.set_message(op);
        let weights =
            CalibrationWeights::new(&store, run.aot, CalibrationMode::Deployed).with_linears(linears).only(op);
        let model = crate::load::build_model(run.hf, run.max_positions, &ParamSource::Store(&weights), run.model_dir)
            .with_context(|| format!("the float model with `{op}` at int4"))?;
        let row = eval
            .score(op, model.as_ref(), &backend, run.prefix, &tick)
            .with_context(|| format!("the float model with `{op}` at int4"))?;
        out.push(LinearCandidate {
            op: op.to_string(),
            out_features,
            in_features,
            block_size,
            sensitivity: row.mean_kl,
        });
    }
    pb.finish();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn linear(op: &str, out: usize, inp: usize, sensitivity: f64) -> LinearCandidate {
        LinearCandidate { op: op.into(), out_features: out, in_features: inp, block_size: 16, sensitivity }
    }

    #[test]
    fn bytes_are_the_devices() {
        // 64 x 32 at block 16: 1024 code bytes + 128 block scales + 256 channel-scale bytes.
        let c = linear("a", 64, 32, 1.0);
        assert_eq!(c.int4_bytes(), 1024 + 128 + 256);
        assert_eq!(c.int8_bytes(), 2048 + 256);
        assert_eq!(c.extra_bytes(), 2048 - 1024 - 128);
    }

    #[test]
    fn the_most_sensitive_per_byte_go_first_within_the_budget() {
        // Extra bytes: big (256 x 32) 9216 - 5632 = 3584, each small (64 x 32) 896.
        let cands = [
            linear("big", 256, 32, 0.08),    // 0.08 / 3584 = 2.2e-5 per byte
            linear("small_a", 64, 32, 0.03), // 0.03 / 896 = 3.3e-5
            linear("small_b", 64, 32, 0.01), // 0.01 / 896 = 1.1e-5
            linear("flat", 64, 32, 0.0),     // no loss: never raised
        ];
        assert_eq!(cands[0].extra_bytes(), 3584);
        let all4: usize = cands.iter().map(LinearCandidate::int4_bytes).sum();
        assert_eq!(all4, 5632 + 3 * 1408);
        let budget = |bytes: f64| WeightBudget::new(bytes / all4 as f64).unwrap();
        // Room for small_a only (the budget's bytes are floored).
        let c = choose_eight_bit(&cands, budget(896.5));
        assert_eq!((c.eight_bit.as_slice(), c.extra_bytes, c.budget_bytes), (&["small_a".to_string()][..], 896, 896));
        // One byte less: nothing fits.
        let c = choose_eight_bit(&cands, budget(895.5));
        assert!(c.eight_bit.is_empty() && c.extra_bytes == 0);
        // 2000 bytes: big (next per byte) does not fit after small_a and is skipped; small_b fits.
        let c = choose_eight_bit(&cands, budget(2000.5));
        assert_eq!(c.eight_bit, ["small_a", "small_b"]);
        assert_eq!(c.ranked.iter().map(|c| c.op.as_str()).collect::<Vec<_>>(), ["small_a", "big", "small_b", "flat"]);
        // Everything: all but the one with no loss.
        let c = choose_eight_bit(&cands, WeightBudget::new(1.0).unwrap());
        assert_eq!(c.eight_bit, ["small_a", "big", "small_b"]);
        assert_eq!(c.extra_bytes, 3584 + 896 + 896);
        assert!((c.raised_sensitivity - 0.12).abs() < 1e-12 && (c.total_sensitivity - 0.12).abs() < 1e-12);
        // A zero budget raises nothing.
        assert!(choose_eight_bit(&cands, WeightBudget::new(0.0).unwrap()).eight_bit.is_empty());
        let table = c.table();
        assert!(table.contains("3 of 4 linears at 8 bits") && table.contains("small_a"), "{table}");
        assert_eq!(c.to_json()["eight_bit"], serde_json::json!(["small_a", "big", "small_b"]));
    }

    #[test]
    fn a_bad_budget_is_refused_by_name() {
        assert_eq!("0.10".parse::<WeightBudget>().unwrap().fraction(), 0.10);
        for bad in ["-0.1", "1.5", "NaN", "inf", "10%", "ten", ""] {
            let e = bad.parse::<WeightBudget>().unwrap_err().to_string();
            assert!(e.contains("weight budget") && e.contains(&format!("`{bad}`")), "{bad}: {e}");
        }
    }
}
