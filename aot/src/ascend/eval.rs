//! Quality of AscendV1 exports on the CPU: each directory decoded with the format's formulas
//! ([`decode_dir`]) and run with its activation quantization ([`AscendFakeQuant`]) against the
//! float model on the same windows of a text: perplexity, top-1 agreement, mean KL and the SQNR
//! of the logits.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend_cpu::quant::{prefill_logits, score_logits, Sqnr};
use backend_cpu::CpuBackend;
use checkpoint::{write_safetensors_atomic, StDtype};
use mllm_dsl::files::{read_text_bounded, write_json_atomic, CONFIG_SIZE_LIMIT};
use models::hf::HfConfig;

use super::decode::decode_dir;
use super::format::f32_bytes;
use super::hooks::AscendFakeQuant;
use crate::error::{ensure, Context, Result};
use crate::load::open_model;
use crate::progress::Progress;

/// One scored model.
#[derive(Clone, Debug, PartialEq)]
pub struct AscendQualityRow {
    pub name: String,
    pub perplexity: f64,
    pub top1_agreement: f64,
    pub mean_kl: f64,
    /// `10 log10(sum f^2 / sum (f - q)^2)` over every logit of every window
    /// ([`Sqnr::Identical`] for the float row itself; a non-finite figure is refused).
    pub logits_sqnr: Sqnr,
    pub predictions: usize,
}

/// Scores.
#[derive(Clone, Debug)]
pub struct AscendQuality {
    pub rows: Vec<AscendQualityRow>,
    pub windows: usize,
}

impl AscendQuality {
    pub fn table(&self) -> String {
        let float = self.rows.first().map_or(f64::NAN, |r| r.perplexity);
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(5);
        let mut s = format!(
            "{:<width$}  {:>10}  {:>8}  {:>7}  {:>9}  {:>10}\n",
            "model", "perplexity", "x float", "top-1", "KL nats", "SQNR dB"
        );
        for r in &self.rows {
            s.push_str(&format!(
                "{:<width$}  {:>10.3}  {:>8.4}  {:>6.1}%  {:>9.5}  {:>10}\n",
                r.name,
                r.perplexity,
                r.perplexity / float,
                r.top1_agreement * 100.0,
                r.mean_kl,
                r.logits_sqnr
            ));
        }
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "windows": self.windows,
            "rows": self.rows.iter().map(|r| serde_json::json!({
                "name": r.name, "perplexity": r.perplexity, "top1_agreement": r.top1_agreement,
                "mean_kl": r.mean_kl, "logits_sqnr_db": r.logits_sqnr.to_json(), "predictions": r.predictions,
            })).collect::<Vec<_>>(),
        })
    }
}

/// Scores float `model` and each AscendV1 directory of `exports` (name, dir) on `ids` in windows
/// of at most `window` tokens (each a prefill with no past). The decoded checkpoints are written
/// to a scratch directory under `scratch` and removed.
pub fn ascend_quality(
    model: &Path,
    exports: &[(String, PathBuf)],
    ids: &[i64],
    window: usize,
    scratch: &Path,
    progress: Arc<dyn Progress>,
) -> Result<AscendQuality> {
    ensure!(window >= 2, "evaluation window of {window} tokens: at least 2 are needed");
    let hf = HfConfig::from_dir(model)?;
    let windows: Vec<&[i64]> = ids.chunks(window).filter(|w| w.len() >= 2).collect();
    ensure!(!windows.is_empty(), "the evaluation text has {} tokens; at least 2 are needed", ids.len());
    let positions = window.min(ids.len()).max(2);
    let vocab = hf.vocab_size;
    let pb = progress.start("ascend quality", windows.len() * (1 + exports.len()));

    // 1. Float logits of every window.
    let backend = CpuBackend::float();
    let (float, _store) = open_model(model, &hf, positions, &backend)?;
    let mut reference = Vec::with_capacity(windows.len());
    for w in &windows {
        reference.push(prefill_logits(float.as_ref(), &backend, None, w)?);
        pb.inc(1);
    }
    drop(float);
    let score = |name: &str, logits: &[Vec<f32>]| -> Result<AscendQualityRow> {
        let (mut nll, mut kl, mut agree, mut n) = (0f64, 0f64, 0f64, 0usize);
        let (mut signal, mut noise) = (0f64, 0f64);
        for ((w, r), t) in windows.iter().zip(&reference).zip(logits) {
            let (_, tr) = score_logits(r, t, w, vocab)?;
            let p = tr.predictions as f64;
            nll += tr.perplexity.ln() * p;
            kl += tr.mean_kl * p;
            agree += tr.top1_agreement * p;
            n += tr.predictions;
            for (&a, &b) in r.iter().zip(t) {
                signal += f64::from(a) * f64::from(a);
                noise += f64::from(a - b) * f64::from(a - b);
            }
        }
        let p = n as f64;
        let sqnr = if !(signal.is_finite() && noise.is_finite()) {
            Sqnr::NonFinite
        } else if noise == 0.0 {
            Sqnr::Identical
        } else {
            Sqnr::of(10.0 * (signal / noise).log10())
        };
        ensure!(
            (nll / p).is_finite() && sqnr != Sqnr::NonFinite,
            "`{name}`: perplexity {} and logits SQNR {sqnr} over {n} predictions: a non-finite figure",
            (nll / p).exp()
        );
        Ok(AscendQualityRow {
            name: name.to_string(),
            perplexity: (nll / p).exp(),
            top1_agreement: agree / p,
            mean_kl: kl / p,
            logits_sqnr: sqnr,
            predictions: n,
        })
    };
    let mut rows = vec![score("float", &reference)?];

    // 2. Each export, decoded and fake-quantized.
    for (name, dir) in exports {
        pb.set_message(name);
        let ehf = HfConfig::from_dir(dir)?;
        let decoded = decode_dir(dir, &ehf, positions).with_context(|| format!("decoding {}", dir.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix(".ascend-decoded-")
            .tempdir_in(scratch)
            .with_context(|| format!("creating a scratch directory in {}", scratch.display()))?;
        write_decoded(dir, tmp.path(), &decoded.tensors)?;
        let dhf = HfConfig::from_dir(tmp.path())?;
        let backend = CpuBackend::with_qdq(Arc::new(AscendFakeQuant::new(decoded.points)));
        let (m, _store) = open_model(tmp.path(), &dhf, positions, &backend)?;
        let mut logits = Vec::with_capacity(windows.len());
        for w in &windows {
            logits.push(prefill_logits(m.as_ref(), &backend, None, w).with_context(|| format!("running {name}"))?);
            pb.inc(1);
        }
        rows.push(score(name, &logits)?);
    }
    pb.finish();
    Ok(AscendQuality { rows, windows: windows.len() })
}

/// The decoded tensors as an HF float checkpoint (`model.safetensors`, f32) with the export's
/// config (lm_head written out, so not tied).
fn write_decoded(export: &Path, out: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<()> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| f32_bytes(v)).collect();
    let refs: Vec<checkpoint::TensorBytes<'_>> = tensors
        .iter()
        .zip(&bytes)
        .map(|((k, s, _), b)| (k.as_str(), StDtype::F32, s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors_atomic(out.join("model.safetensors"), &refs, &BTreeMap::new())?;
    let cpath = export.join("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&read_text_bounded(&cpath, CONFIG_SIZE_LIMIT)?)
        .with_context(|| format!("parsing {}", cpath.display()))?;
    if let Some(o) = config.as_object_mut() {
        if tensors.iter().any(|(k, _, _)| k == models::keys::LM_HEAD) {
            o.insert("tie_word_embeddings".into(), false.into());
        }
        o.insert("torch_dtype".into(), "float32".into());
        o.remove("dtype");
    }
    write_json_atomic(&out.join("config.json"), &config)?;
    Ok(())
}
