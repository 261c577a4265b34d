//! One whole sequence through a model file as a single prefill chunk, with no past (how pymllm
//! calibrates, HF `generate`'s first forward, and how the oracle's reference logits were made) or
//! after an attention-sink prefix ([`SinkPrefix`]).

use std::ops::Range;

use mllm_dsl::{BackendRef, CausalLm, DType, Storage, Tensor, TensorType};
use runtime::{dequantize_mask_value, MASK_ATTEND, MASK_MASKED};

use super::error::QuantizationError;
use super::sink::SinkPrefix;

/// Runs `ids` through `model` with positions `P..P + S` after the `P` tokens of `prefix` (none:
/// `P = 0`, empty past K/V), a causal mask over the sequence that attends every prefix column
/// (`[1, 1, S, P + S]`, the dequantized u16 mask: 0.0 attends). Returns the logits, `S x vocab`
/// row-major.
pub fn prefill_logits(
    model: &dyn CausalLm,
    backend: &BackendRef,
    prefix: Option<&SinkPrefix>,
    ids: &[i64],
) -> Result<Vec<f32>, QuantizationError> {
    let (logits, _) = prefill(model, backend, prefix, ids, 0..ids.len())?;
    let data = logits.as_f32().ok_or_else(|| QuantizationError::Report("model logits hold no f32 data".into()))?;
    let (s, vocab) = (ids.len(), model.shape().vocab_size);
    if data.len() != s * vocab {
        return Err(QuantizationError::Report(format!(
            "model returned {} logits for {s} positions of vocabulary {vocab}",
            data.len()
        )));
    }
    Ok(data.to_vec())
}

/// The present K/V of every layer after a prefill (the sequence's, not the prefix's): K
/// `[1, Hkv, D, S]`, V `[1, Hkv, S, D]` each.
pub type PresentKv = (Vec<Tensor>, Vec<Tensor>);

/// [`prefill_logits`]' run with the logits of chunk rows `logit_rows` only (a model file may skip
/// the others), returning the logits tensor and the present K/V the run produced.
pub fn prefill(
    model: &dyn CausalLm,
    backend: &BackendRef,
    prefix: Option<&SinkPrefix>,
    ids: &[i64],
    logit_rows: Range<usize>,
) -> Result<(Tensor, PresentKv), QuantizationError> {
    let s = ids.len();
    if s == 0 {
        return Err(QuantizationError::CalibrationData("an empty sequence cannot be run".into()));
    }
    let shape = model.shape();
    let p = prefix.map_or(0, SinkPrefix::len);
    let (attend, masked) = (dequantize_mask_value(MASK_ATTEND), dequantize_mask_value(MASK_MASKED));
    let cols = p + s;
    // Row r (position p + r) attends every prefix column and the sequence up to itself; in the
    // sliding window's plane (models with sliding-window layers) only columns less than the window
    // before it.
    let windows = [None].into_iter().chain(shape.sliding_window.map(Some));
    let mask: Vec<f32> = windows
        .flat_map(|w| {
            (0..s * cols).map(move |k| {
                let (q, c) = (p + k / cols, k % cols);
                if c <= q && w.is_none_or(|w| q - c < w) {
                    attend
                } else {
                    masked
                }
            })
        })
        .collect();
    let f32_tensor = |data: Vec<f32>, dims: Vec<usize>, dtype: DType| {
        Tensor::from_storage(TensorType::new(dims, dtype), Storage::F32(data.into()), backend.clone())
    };
    let ids_t = Tensor::from_i64(ids.to_vec(), vec![1, s], DType::I32, backend.clone())?;
    let pos = Tensor::from_i64((p as i64..(p + s) as i64).collect::<Vec<_>>(), vec![s], DType::I32, backend.clone())?;
    let mask = f32_tensor(mask, vec![1, shape.mask_planes(), s, cols], DType::F32)?;
    let (keys, values) = match prefix {
        Some(prefix) => {
            prefix.check_fits(model)?;
            prefix.past_tensors(backend)?
        }
        None => {
            let (kvh, d) = (shape.num_kv_heads, shape.head_dim);
            let empty = |dims: Vec<usize>| f32_tensor(vec![], dims, DType::U8Sym);
            let keys = (0..shape.num_layers).map(|_| empty(vec![1, kvh, d, 0])).collect::<Result<Vec<_>, _>>()?;
            let values = (0..shape.num_layers).map(|_| empty(vec![1, kvh, 0, d])).collect::<Result<Vec<_>, _>>()?;
            (keys, values)
        }
    };
    // On the kernel pool: the QDQ hooks' rayon loops then use `--threads` threads, not rayon's
    // global pool, and the kernels split their work from a pool thread.
    let (logits, keys, values) =
        crate::kernels::run_in_pool(|| model.forward_rows(&ids_t, &pos, &mask, &keys, &values, logit_rows))?;
    Ok((logits, (keys, values)))
}
