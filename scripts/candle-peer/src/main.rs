//! `candle-peer DIR PROMPT NEW`: prefill and decode speed of candle-transformers' Qwen3
//! (`ModelForCausalLM`, f32 compute on the CPU) on the safetensors checkpoint in `DIR`, a random
//! `PROMPT`-token prompt run in one forward, then `NEW - 1` greedy decode steps, all of it once
//! untimed first (a warm-up, as `bench_cpu` gives its own children and llama-bench runs). Prints
//! one line, `prefill_tok_s=.. decode_tok_s=..`, which `bench_cpu --candle` reads. Threads: candle's CPU
//! kernels run on rayon's global pool, sized by `RAYON_NUM_THREADS`.

use anyhow::{bail, ensure, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use candle_nn::VarBuilder;
use candle_transformers::models::qwen3::{Config, ModelForCausalLM};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Instant;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [dir, prompt, new] = args.as_slice() else {
        bail!("usage: candle-peer DIR PROMPT NEW (a Qwen3 safetensors checkpoint, prompt tokens, new tokens)");
    };
    let dir = PathBuf::from(dir);
    let prompt: usize = prompt.parse().with_context(|| format!("PROMPT {prompt:?}: expected a token count"))?;
    let new: usize = new.parse().with_context(|| format!("NEW {new:?}: expected a token count"))?;
    ensure!(prompt >= 1 && new >= 2, "PROMPT must be at least 1 and NEW at least 2 (one decode step)");

    let cfg = config(&dir)?;
    let files = weight_files(&dir)?;
    let dev = Device::Cpu;
    // SAFETY: the checkpoint files are not modified while mapped (the bench wrote them earlier).
    let vb = unsafe { VarBuilder::from_mmaped_safetensors(&files, DType::F32, &dev)? };
    let vocab = cfg.vocab_size as u32;
    let mut model =
        ModelForCausalLM::new(&cfg, vb).with_context(|| format!("building Qwen3 from {}", dir.display()))?;

    // A fixed pseudo-random prompt: speed does not depend on the ids.
    let ids: Vec<u32> = (0..prompt as u32).map(|i| (i.wrapping_mul(7919) + 13) % vocab).collect();
    generate(&mut model, &dev, &ids, new)?;
    model.clear_kv_cache();
    let (prefill, decode) = generate(&mut model, &dev, &ids, new)?;
    println!("prefill_tok_s={:.2} decode_tok_s={:.2}", prompt as f64 / prefill, (new - 1) as f64 / decode);
    Ok(())
}

/// The prompt `ids` in one forward, then `new - 1` greedy decode steps: their times in seconds.
fn generate(model: &mut ModelForCausalLM, dev: &Device, ids: &[u32], new: usize) -> Result<(f64, f64)> {
    let argmax = |logits: &Tensor| -> Result<u32> { Ok(logits.flatten_all()?.argmax(D::Minus1)?.to_scalar::<u32>()?) };
    let t = Instant::now();
    let logits = model.forward(&Tensor::new(ids, dev)?.unsqueeze(0)?, 0)?;
    let mut next = argmax(&logits)?;
    let prefill = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..new - 1 {
        let logits = model.forward(&Tensor::new(&[next], dev)?.unsqueeze(0)?, ids.len() + i)?;
        next = argmax(&logits)?;
    }
    Ok((prefill, t.elapsed().as_secs_f64()))
}

/// `config.json` with the sliding-window fields candle's `Config` requires and HF's Qwen3 configs
/// may leave out (no sliding window).
fn config(dir: &Path) -> Result<Config> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut cfg: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let obj = cfg.as_object_mut().with_context(|| format!("{}: expected a JSON object", path.display()))?;
    let layers = obj.get("num_hidden_layers").cloned().unwrap_or(Value::Null);
    obj.entry("sliding_window").or_insert(Value::Null);
    obj.entry("max_window_layers").or_insert(layers);
    obj.entry("use_sliding_window").or_insert(Value::Bool(false));
    serde_json::from_value(cfg).with_context(|| format!("{}: not a Qwen3 config candle reads", path.display()))
}

/// The safetensors files: those of `model.safetensors.index.json`, else `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Ok(vec![dir.join("model.safetensors")]);
    }
    let text = std::fs::read_to_string(&index).with_context(|| format!("reading {}", index.display()))?;
    let json: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", index.display()))?;
    let map = json["weight_map"].as_object().with_context(|| format!("{}: no weight_map object", index.display()))?;
    let mut files = Vec::new();
    for (tensor, file) in map {
        let file =
            file.as_str().with_context(|| format!("{}: weight_map.{tensor} is not a file name", index.display()))?;
        files.push(dir.join(file));
    }
    files.sort();
    files.dedup();
    Ok(files)
}
