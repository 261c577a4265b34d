//! Weight quantization bench: a synthetic checkpoint shaped like Qwen3-1.7B (bf16, as the HF
//! release ships, tied embeddings, 28 layers) quantized to pymllm's W4A16 format — every linear
//! to LPBQ (block 16), norms and embedding to uint16 — and written, on 2 threads.
//!
//! ```text
//! cargo run --release --example bench_quantize [-- --dir DIR] [--threads 2] [--keep]
//! ```
//! The checkpoint is generated once by project code into `DIR` (default
//! `$CARGO_TARGET_DIR/bench-quantize`, else `target/bench-quantize`). Prints MB/s of input
//! weights (bf16 bytes read) for quantization alone and including the write, and the peak RSS
//! (`VmHWM` of `/proc/self/status`, reset after generation) against the checkpoint size. Targets:
//! >= 200 MB/s, peak RSS <= 1.5x the checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use aot::trace_model;
use backend_cpu::quant::{plan_export, quantize_weights, write_quantized_checkpoint, QdqParams};
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
use clap::Parser;
use mllm_dsl::config::aot::AotConfig;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::ParamFormat;

#[derive(Parser, Debug)]
struct Args {
    /// Where the synthetic checkpoint and the quantized output go.
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Keep the quantized output (it is deleted by default; the synthetic input is always kept).
    #[arg(long)]
    keep: bool,
}

/// Qwen3-1.7B's architecture (mllm's `config_1.7B.json`).
fn config_json() -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000,
        "tie_word_embeddings": true,
        "attention_bias": false,
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "linear_block_size": 16
    })
}

/// `(name, shape)` of every tensor of the HF checkpoint.
fn tensor_list() -> Vec<(String, Vec<usize>)> {
    let (h, i, v, d, nh, nkv) = (2048, 6144, 151936, 128, 16, 8);
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h]), ("model.norm.weight".into(), vec![h])];
    for l in 0..28 {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        t.extend([
            (p("input_layernorm.weight"), vec![h]),
            (p("post_attention_layernorm.weight"), vec![h]),
            (p("self_attn.q_proj.weight"), vec![nh * d, h]),
            (p("self_attn.k_proj.weight"), vec![nkv * d, h]),
            (p("self_attn.v_proj.weight"), vec![nkv * d, h]),
            (p("self_attn.o_proj.weight"), vec![h, nh * d]),
            (p("self_attn.q_norm.weight"), vec![d]),
            (p("self_attn.k_norm.weight"), vec![d]),
            (p("mlp.gate_proj.weight"), vec![i, h]),
            (p("mlp.up_proj.weight"), vec![i, h]),
            (p("mlp.down_proj.weight"), vec![h, i]),
        ]);
    }
    t
}

/// Deterministic bf16 weights: small values with rare outliers, norms near 1.
fn synthetic_bf16(n: usize, seed: u64, norm: bool) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * 2);
    for k in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let v = if norm { 1.0 + u * 0.2 } else { u * 0.05 * if k % 1009 == 0 { 8.0 } else { 1.0 } };
        out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    out
}

/// Writes the synthetic checkpoint as one shard per layer (plus one for the rest), so generating
/// it never holds more than a shard in memory.
fn generate(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let tensors = tensor_list();
    let mut shards: BTreeMap<String, Vec<(String, Vec<usize>)>> = BTreeMap::new();
    for (name, shape) in tensors {
        let shard = match name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()) {
            Some(l) => format!("model-layer-{:02}.safetensors", l.parse::<usize>()?),
            None => "model-rest.safetensors".to_string(),
        };
        shards.entry(shard).or_default().push((name, shape));
    }
    let mut weight_map = serde_json::Map::new();
    for (s, (file, list)) in shards.iter().enumerate() {
        let data: Vec<Vec<u8>> = list
            .iter()
            .enumerate()
            .map(|(k, (name, shape))| {
                synthetic_bf16(shape.iter().product(), (s * 1000 + k) as u64 + 1, name.contains("norm"))
            })
            .collect();
        let views: Vec<(&str, StDtype, &[usize], &[u8])> = list
            .iter()
            .zip(&data)
            .map(|((n, sh), d)| (n.as_str(), StDtype::BF16, sh.as_slice(), d.as_slice()))
            .collect();
        write_safetensors_atomic(dir.join(file), &views, &BTreeMap::new())?;
        for (name, _) in list {
            weight_map.insert(name.clone(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index)?)?;
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config_json())?)?;
    Ok(())
}

fn status_kb(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() -> Result<()> {
    let args = Args::parse();
    let base = args.dir.clone().unwrap_or_else(|| {
        let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| "target".into());
        target.join("bench-quantize")
    });
    let input = base.join("qwen3-1.7b-synthetic-bf16");
    let output = base.join("qwen3-1.7b-synthetic-w4a16");
    if !input.join("config.json").is_file() {
        let start = Instant::now();
        println!("generating the synthetic checkpoint in {} ...", input.display());
        generate(&input)?;
        println!("generated in {:.1} s", start.elapsed().as_secs_f64());
    }
    // Generation (or nothing) so far; measure the quantization from here.
    let reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
    backend_cpu::kernels::set_num_threads(args.threads)?;

    let hf = HfConfig::from_dir(&input)?;
    let source = SafetensorsCheckpoint::open(&input)?;
    let checkpoint_bytes: u64 = source.files().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum();
    let program = trace_model(&hf, 1024, ParamFormat::QnnW4A16)?;
    let plan = plan_export(&program, &AotConfig::w4a16_kv8(), hf.linear_block_size)?;

    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    let weights = quantize_weights(&plan, &source, hf.tie_word_embeddings, &|_, _, _| {})
        .context("quantizing the synthetic checkpoint")?;
    let (quant_s, quant_cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
    write_quantized_checkpoint(&output, &hf.source, plan.block_size, &weights.tensors, &QdqParams::new())?;
    let (total_s, total_cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
    let out_bytes: usize = weights.tensors.iter().map(|t| t.data.bytes().len()).sum();
    let (read_thread_s, quant_thread_s) = (weights.read_seconds, weights.quantize_seconds);
    drop(weights);

    let mb = |b: u64| b as f64 / 1e6;
    let hwm = status_kb("VmHWM:").unwrap_or(0) * 1024;
    println!(
        "input: {:.1} MB of bf16 weights ({} tensors read), checkpoint {:.1} MB; output {:.1} MB; {} threads",
        mb(source_bytes(&source)),
        plan.params.len(),
        mb(checkpoint_bytes),
        mb(out_bytes as u64),
        args.threads
    );
    let input_mb = mb(source_bytes(&source));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("machine load average: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!(
        "quantize: {quant_s:.2} s wall = {:.0} MB/s of input weights; CPU {quant_cpu:.2} s (read+convert {:.2} s, \
         quantize {:.2} s thread time) = {:.0} MB/s with {} busy cores",
        input_mb / quant_s,
        read_thread_s,
        quant_thread_s,
        input_mb / (quant_cpu / args.threads as f64),
        args.threads
    );
    println!(
        "quantize + write: {total_s:.2} s wall = {:.0} MB/s of input weights; CPU {total_cpu:.2} s = {:.0} MB/s with {} \
         busy cores",
        input_mb / total_s,
        input_mb / (total_cpu / args.threads as f64),
        args.threads
    );
    println!(
        "peak RSS (VmHWM{}): {:.1} MB = {:.2}x the checkpoint",
        if reset { ", reset after generation" } else { ", NOT reset: includes generation" },
        mb(hwm),
        hwm as f64 / checkpoint_bytes as f64
    );
    if !args.keep {
        let _ = std::fs::remove_dir_all(&output);
    }
    Ok(())
}

/// User + system CPU time of this process (`/proc/self/stat` fields 14 and 15, in USER_HZ = 100).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Field 14 (utime) is index 11 after the state field (field 3 = index 0).
    (ticks(11) + ticks(12)) as f64 / 100.0
}

fn source_bytes(source: &SafetensorsCheckpoint) -> u64 {
    source
        .keys()
        .iter()
        .filter_map(|k| source.info(k).ok())
        .map(|(d, s)| (s.iter().product::<usize>() * d.bitsize() / 8) as u64)
        .sum()
}
