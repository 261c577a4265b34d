//! `--sink-prefix`: which tokens form the attention-sink prefix ([`SinkPrefix`]), and the prefix
//! rounded onto a quantized checkpoint's K/V grid.

use std::path::Path;

use crate::error::{bail, ensure, Context, Result};
use backend_cpu::quant::{QdqParams, SinkPrefix};
use backend_cpu::CpuBackend;
use compiler::quant::QuantParams;
use models::hf::HfConfig;
use models::io::{kv_qdq, KvCache};

use crate::load::open_model;

/// The token ids of a recipe's sink prefix ([`crate::Recipe::sink_prefix`], which errors name),
/// `None` for no values: each a token of the model's vocabulary as the tokenizer spells it
/// (`<|endoftext|>`) or `id:N`, checked against `vocab_size`.
pub fn sink_prefix_ids(specs: &[String], model_dir: &Path, vocab_size: usize) -> Result<Option<Vec<i64>>> {
    if specs.is_empty() {
        return Ok(None);
    }
    let mut tokenizer = None;
    let mut ids = Vec::with_capacity(specs.len());
    for spec in specs {
        let id = match spec.strip_prefix("id:") {
            Some(n) => {
                n.parse::<i64>().with_context(|| format!("Recipe::sink_prefix {spec}: `{n}` is not a token id"))?
            }
            None => {
                if tokenizer.is_none() {
                    tokenizer = Some(
                        crate::sequences::load_tokenizer(model_dir)
                            .with_context(|| format!("Recipe::sink_prefix {spec} names a token by its text"))?,
                    );
                }
                let tok = tokenizer.as_ref().expect("loaded above");
                match tok.token_to_id(spec) {
                    Some(id) => i64::from(id),
                    None => bail!(
                        "Recipe::sink_prefix {spec}: no such token in {}/tokenizer.json (give one token as the tokenizer \
                         spells it, e.g. <|endoftext|>, or id:N)",
                        model_dir.display()
                    ),
                }
            }
        };
        ensure!(
            (0..vocab_size as i64).contains(&id),
            "Recipe::sink_prefix {spec}: token id {id} is outside the vocabulary 0..{vocab_size}"
        );
        ids.push(id);
    }
    Ok(Some(ids))
}

/// `prefix` fake-quantized by each layer's K/V cache QDQ parameters in `params`, and how many
/// values were clamped to the grid's range.
pub(crate) fn on_kv_grid(prefix: &SinkPrefix, params: &QdqParams) -> Result<(SinkPrefix, usize)> {
    let layer_params = |which: KvCache| -> Result<Vec<QuantParams>> {
        (0..prefix.num_layers())
            .map(|l| {
                let key = kv_qdq(l, which).key;
                Ok(*params.get(&key).with_context(|| format!("the calibration has no parameters for `{key}`"))?)
            })
            .collect()
    };
    Ok(prefix.on_kv_grid(&layer_params(KvCache::Key)?, &layer_params(KvCache::Value)?)?)
}

/// The K/V `ids` leave in the float checkpoint `dir` (config `hf`, RoPE rows `max_positions`):
/// the prefix a float run starts from.
pub(crate) fn float_prefix(dir: &Path, hf: &HfConfig, max_positions: usize, ids: &[i64]) -> Result<SinkPrefix> {
    let backend = CpuBackend::float();
    let (model, _store) = open_model(dir, hf, max_positions, &backend)?;
    SinkPrefix::compute(model.as_ref(), &backend, ids).context("computing the attention-sink prefix")
}
