//! Quality the way users measure it: perplexity on a text, and how far a quantized model's next-token
//! distributions are from the float model's (mean KL(float‖quant), top-1 agreement).
//!
//! Quick start:
//! ```no_run
//! # use backend_cpu::quant::TextEval;
//! # use mllm_dsl::{BackendRef, CausalLm};
//! # fn demo(
//! #     (float_model, float_backend): (Box<dyn CausalLm>, BackendRef),
//! #     (quant_model, quant_backend): (Box<dyn CausalLm>, BackendRef),
//! #     ids: &[i64],
//! # ) -> Result<(), backend_cpu::quant::QuantizationError> {
//! let eval = TextEval::new(float_model.as_ref(), &float_backend, None, ids, 256, &|_, _| {})?;
//! let row = eval.score("W4A16KV8 fake-quant", quant_model.as_ref(), &quant_backend, None, &|_, _| {})?;
//! println!("float ppl {:.2}, quant ppl {:.2}, KL {:.4}", eval.float_perplexity(), row.perplexity, row.mean_kl);
//! # Ok(())
//! # }
//! ```
//!
//! The token sequence is cut into windows of at most `window` tokens; each window is one prefill
//! with no past ([`prefill_logits`]), or after an attention-sink prefix each model brings (the
//! same tokens, its own K/V), so every model sees exactly the same contexts. Row `t` of a
//! window's logits predicts token `t + 1` of that window: a window of `n` tokens scores `n - 1`
//! predictions. Softmaxes are computed in f64 from the f32 logits.

use mllm_dsl::{BackendRef, CausalLm};

use super::error::QuantizationError;
use super::prefill::prefill_logits;
use super::sink::SinkPrefix;

/// Per-position log-probabilities of one logits row (log-softmax, f64).
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    let log_z = max + sum.ln();
    row.iter().map(|&x| x as f64 - log_z).collect()
}

/// Index of the first largest value.
fn argmax(row: &[f32]) -> usize {
    super::accuracy::argmax(row)
}

/// How one model does on the evaluation text, against the float model on the same windows.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct QualityRow {
    /// What was scored (e.g. "float", "W4A16KV8 fake-quant", "RTN int4 weight-only").
    pub name: String,
    /// `exp(mean negative log-likelihood)` of the text's next tokens.
    pub perplexity: f64,
    /// Mean over predicted positions of KL(float ‖ this model), in nats; 0 for the float model.
    pub mean_kl: f64,
    /// Fraction of predicted positions whose argmax equals the float model's.
    pub top1_agreement: f64,
    /// Predicted positions scored.
    pub predictions: usize,
}

/// Per-position statistics of one window, against the float model's log-probabilities.
fn window_stats(
    reference: &[Vec<f64>],
    reference_top1: &[usize],
    test_logits: &[f32],
    ids: &[i64],
    vocab: usize,
) -> (f64, f64, usize) {
    let (mut nll, mut kl, mut agree) = (0f64, 0f64, 0usize);
    for (t, row) in test_logits.chunks_exact(vocab).take(ids.len() - 1).enumerate() {
        let lq = log_softmax(row);
        nll -= lq[ids[t + 1] as usize];
        kl += reference[t].iter().zip(&lq).map(|(&lp, &lq)| lp.exp() * (lp - lq)).sum::<f64>();
        agree += usize::from(argmax(row) == reference_top1[t]);
    }
    (nll, kl, agree)
}

/// One window's float reference: log-probabilities and argmax of every predicting row.
struct WindowRef {
    ids: Vec<i64>,
    log_probs: Vec<Vec<f64>>,
    top1: Vec<usize>,
}

/// The evaluation text and the float model's predictions on it, to score other models against.
pub struct TextEval {
    windows: Vec<WindowRef>,
    vocab: usize,
    float: QualityRow,
    /// The float run's attention-sink prefix tokens: every scored model must start from the same.
    prefix_ids: Option<Vec<i64>>,
}

impl TextEval {
    /// Runs the float model over `ids` in windows of at most `window` tokens (each after `prefix`,
    /// when given) and keeps its predictions. `progress(done, total)` is called after each window.
    pub fn new(
        float_model: &dyn CausalLm,
        float_backend: &BackendRef,
        prefix: Option<&SinkPrefix>,
        ids: &[i64],
        window: usize,
        progress: &dyn Fn(usize, usize),
    ) -> Result<TextEval, QuantizationError> {
        let vocab = float_model.shape().vocab_size;
        if window < 2 {
            return Err(QuantizationError::CalibrationData(format!(
                "evaluation window of {window} tokens: at least 2 are needed to score one prediction"
            )));
        }
        if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id < 0 || id as usize >= vocab) {
            return Err(QuantizationError::CalibrationData(format!(
                "evaluation token {i} is id {id}, outside the model's vocabulary 0..{vocab}"
            )));
        }
        let chunks: Vec<&[i64]> = ids.chunks(window).filter(|w| w.len() >= 2).collect();
        if chunks.is_empty() {
            return Err(QuantizationError::CalibrationData(format!(
                "the evaluation text has {} tokens; at least 2 are needed",
                ids.len()
            )));
        }
        let mut windows = Vec::with_capacity(chunks.len());
        let (mut nll, mut predictions) = (0f64, 0usize);
        for (i, w) in chunks.iter().enumerate() {
            let logits = prefill_logits(float_model, float_backend, prefix, w)?;
            let rows: Vec<&[f32]> = logits.chunks_exact(vocab).take(w.len() - 1).collect();
            let log_probs: Vec<Vec<f64>> = rows.iter().map(|r| log_softmax(r)).collect();
            let top1 = rows.iter().map(|r| argmax(r)).collect();
            nll -= log_probs.iter().enumerate().map(|(t, lp)| lp[w[t + 1] as usize]).sum::<f64>();
            predictions += w.len() - 1;
            windows.push(WindowRef { ids: w.to_vec(), log_probs, top1 });
            progress(i + 1, chunks.len());
        }
        let float = QualityRow {
            name: "float".into(),
            perplexity: (nll / predictions as f64).exp(),
            mean_kl: 0.0,
            top1_agreement: 1.0,
            predictions,
        };
        Ok(TextEval { windows, vocab, float, prefix_ids: prefix.map(|p| p.ids.clone()) })
    }

    /// The float model's row (perplexity; KL 0, agreement 1 by definition).
    pub fn float(&self) -> &QualityRow {
        &self.float
    }

    pub fn float_perplexity(&self) -> f64 {
        self.float.perplexity
    }

    /// Windows the text was cut into.
    pub fn windows(&self) -> usize {
        self.windows.len()
    }

    /// Runs `model` over the same windows (after `prefix`, its own K/V of the float run's prefix
    /// tokens) and scores it against the float model.
    pub fn score(
        &self,
        name: impl Into<String>,
        model: &dyn CausalLm,
        backend: &BackendRef,
        prefix: Option<&SinkPrefix>,
        progress: &dyn Fn(usize, usize),
    ) -> Result<QualityRow, QuantizationError> {
        let name = name.into();
        if prefix.map(|p| &p.ids) != self.prefix_ids.as_ref() {
            return Err(QuantizationError::Report(format!(
                "`{name}` starts from the attention-sink prefix {:?}, the float model from {:?}: the contexts differ",
                prefix.map(|p| &p.ids),
                self.prefix_ids
            )));
        }
        if model.shape().vocab_size != self.vocab {
            return Err(QuantizationError::Report(format!(
                "`{name}` has a vocabulary of {}, the float model {}",
                model.shape().vocab_size,
                self.vocab
            )));
        }
        let (mut nll, mut kl, mut agree) = (0f64, 0f64, 0usize);
        for (i, w) in self.windows.iter().enumerate() {
            let logits = prefill_logits(model, backend, prefix, &w.ids)?;
            let (n, k, a) = window_stats(&w.log_probs, &w.top1, &logits, &w.ids, self.vocab);
            nll += n;
            kl += k;
            agree += a;
            progress(i + 1, self.windows.len());
        }
        let p = self.float.predictions as f64;
        Ok(QualityRow {
            name,
            perplexity: (nll / p).exp(),
            mean_kl: kl / p,
            top1_agreement: agree as f64 / p,
            predictions: self.float.predictions,
        })
    }
}

/// Scores logits already computed: `reference` and `test` are `S x vocab` for one window `ids`.
/// Returns `(reference row, test row)` with names "reference" / "test".
pub fn score_logits(
    reference: &[f32],
    test: &[f32],
    ids: &[i64],
    vocab: usize,
) -> Result<(QualityRow, QualityRow), QuantizationError> {
    let s = ids.len();
    if s < 2 || vocab == 0 || reference.len() != s * vocab || test.len() != s * vocab {
        return Err(QuantizationError::Report(format!(
            "cannot score {} reference and {} test logits for {s} tokens of vocabulary {vocab} (need >= 2 tokens, S x vocab each)",
            reference.len(),
            test.len()
        )));
    }
    if let Some(id) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
        return Err(QuantizationError::Report(format!("token id {id} is outside the vocabulary 0..{vocab}")));
    }
    let rows: Vec<&[f32]> = reference.chunks_exact(vocab).take(s - 1).collect();
    let log_probs: Vec<Vec<f64>> = rows.iter().map(|r| log_softmax(r)).collect();
    let top1: Vec<usize> = rows.iter().map(|r| argmax(r)).collect();
    let p = (s - 1) as f64;
    let ref_nll: f64 = -log_probs.iter().enumerate().map(|(t, lp)| lp[ids[t + 1] as usize]).sum::<f64>();
    let (nll, kl, agree) = window_stats(&log_probs, &top1, test, ids, vocab);
    Ok((
        QualityRow {
            name: "reference".into(),
            perplexity: (ref_nll / p).exp(),
            mean_kl: 0.0,
            top1_agreement: 1.0,
            predictions: s - 1,
        },
        QualityRow {
            name: "test".into(),
            perplexity: (nll / p).exp(),
            mean_kl: kl / p,
            top1_agreement: agree as f64 / p,
            predictions: s - 1,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perplexity_kl_and_agreement_by_hand() {
        // vocab 2, ids [0, 1, 0]: rows 0 and 1 predict ids 1 and 0.
        // reference rows: logits (0, ln 3) -> p = (1/4, 3/4); (0, 0) -> (1/2, 1/2).
        let l3 = 3f32.ln();
        let reference = [0.0, l3, 0.0, 0.0, 9.0, 9.0];
        // test rows: (ln 3, 0) -> (3/4, 1/4); (0, 0) -> (1/2, 1/2).
        let test = [l3, 0.0, 0.0, 0.0, 1.0, 2.0];
        let (r, t) = score_logits(&reference, &test, &[0, 1, 0], 2).unwrap();
        // reference NLL: -ln(3/4) - ln(1/2); ppl = exp(mean).
        let ref_ppl = ((-(0.75f64).ln() - (0.5f64).ln()) / 2.0).exp();
        assert!((r.perplexity - ref_ppl).abs() < 1e-6, "{}", r.perplexity);
        let test_ppl = ((-(0.25f64).ln() - (0.5f64).ln()) / 2.0).exp();
        assert!((t.perplexity - test_ppl).abs() < 1e-6, "{}", t.perplexity);
        // KL row 0: 1/4 ln(1/3) + 3/4 ln 3 = 1/2 ln 3; row 1: 0.
        assert!((t.mean_kl - 0.25 * 3f64.ln()).abs() < 1e-6, "{}", t.mean_kl);
        // Row 0's argmax differs (1 vs 0); row 1 ties -> first index on both.
        assert_eq!(t.top1_agreement, 0.5);
        assert_eq!(t.predictions, 2);
        assert!(score_logits(&reference, &test[..4], &[0, 1, 0], 2).is_err());
        assert!(score_logits(&reference, &test, &[0, 2, 0], 2).is_err());
        assert!(score_logits(&reference[..2], &test[..2], &[0], 2).is_err());
    }

    #[test]
    fn log_softmax_is_stable_for_large_logits() {
        let lp = log_softmax(&[1000.0, 1000.0]);
        assert!((lp[0] - 0.5f64.ln()).abs() < 1e-12 && (lp[1] - 0.5f64.ln()).abs() < 1e-12);
    }
}
