//! CPU speed bench: Qwen3-0.6B's shapes (vocab 151936, hidden 1024, 28 layers, 16 heads, 8 KV heads,
//! head_dim 128, intermediate 3072, tied embeddings) with random bf16 weights, run through the real
//! path (`load_float` → `CpuChunkModel` → `Generator` running `models::qwen3::Qwen3ForCausalLM`).
//!
//! ```text
//! cargo run --release --example bench_cpu [-- --threads 1,2 --runs 3]
//! ```
//!
//! The synthetic checkpoint (config.json + model.safetensors, ~1.2 GB) is written by this bench with
//! the project's safetensors writer into `target/bench-qwen3-0.6b/` and reused when present. Each
//! thread count then runs in a fresh child process (this executable re-run with
//! `MLLM_BENCH_CPU_CHILD` set), so load time and peak RSS (`VmHWM`) belong to one configuration.
//! A child loads the model, then generates `--new` tokens after a `--prompt`-token random prompt
//! (greedy, no EOS), `--runs` times. Prefill tok/s is prompt tokens / prefill time (chunks of
//! `--chunk`); decode tok/s is decode steps / decode time (the first new token comes from the
//! prefill logits, so `new - 1` steps), both as the runtime's `GenerationTimings` report them.
//! With `MLLM_CPU_PROFILE=1` each child also prints its time per op kind.

use anyhow::{bail, Context, Result};
use aot::load_float;
use checkpoint::{write_safetensors_atomic, StDtype};
use clap::Parser;
use half::bf16;
use mllm_dsl::memory::{peak_rss_bytes, rss_bytes};
use mllm_dsl::runtime::{GenerationConfig, Generator, Sampling};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Set in a child process to the thread count it measures.
const CHILD_ENV: &str = "MLLM_BENCH_CPU_CHILD";

/// Qwen3-0.6B's shapes.
const VOCAB: usize = 151936;
const HIDDEN: usize = 1024;
const LAYERS: usize = 28;
const HEADS: usize = 16;
const KV_HEADS: usize = 8;
const HEAD_DIM: usize = 128;
const INTERMEDIATE: usize = 3072;

#[derive(Parser, Debug, Clone)]
#[command(about = "Prefill/decode speed, load time and peak RSS of Qwen3-0.6B shapes on the CPU")]
struct Args {
    /// Checkpoint directory (written when it holds no model.safetensors yet).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Thread counts to measure, each in its own process.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    prompt: usize,
    /// New tokens to generate.
    #[arg(long, default_value_t = 128)]
    new: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 32)]
    chunk: usize,
    /// Context length (KV cache capacity; the CPU model only computes on the valid past).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Generations per process (after loading once); every run is printed.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Rewrite the checkpoint even if present.
    #[arg(long)]
    regenerate: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    if let Ok(threads) = std::env::var(CHILD_ENV) {
        let threads: usize = threads.parse().with_context(|| format!("{CHILD_ENV}={threads} is not a number"))?;
        return child(&args, &dir, threads);
    }
    if args.regenerate || !dir.join("model.safetensors").is_file() {
        let start = Instant::now();
        write_checkpoint(&dir)?;
        println!("wrote {} in {:.1} s", dir.display(), start.elapsed().as_secs_f64());
    }
    println!(
        "Qwen3-0.6B shapes, random bf16 weights; prompt {} (chunk {}), {} new tokens, context {}",
        args.prompt, args.chunk, args.new, args.context
    );
    let exe = std::env::current_exe().context("locating this executable")?;
    for &threads in &args.threads {
        let out = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(CHILD_ENV, threads.to_string())
            .output()
            .with_context(|| format!("running {}", exe.display()))?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            bail!("the {threads}-thread run failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}

/// `<workspace>/target/bench-qwen3-0.6b`.
fn default_dir() -> PathBuf {
    let examples = Path::new(env!("CARGO_MANIFEST_DIR"));
    examples.parent().unwrap_or(examples).join("target/bench-qwen3-0.6b")
}

/// One configuration, measured in this process.
fn child(args: &Args, dir: &Path, threads: usize) -> Result<()> {
    backend_cpu::kernels::set_num_threads(threads)?;
    let start = Instant::now();
    let loaded = load_float(dir, args.context)?;
    let load_s = start.elapsed().as_secs_f64();
    let rss_loaded = rss_bytes()?;
    let config = GenerationConfig {
        max_new_tokens: args.new,
        prefill_chunk: args.chunk,
        sampling: Sampling::Greedy,
        eos_ids: Vec::new(),
        collect_prompt_logits: false,
    };
    let mut rng = SplitMix64(7);
    let prompt: Vec<u32> = (0..args.prompt).map(|_| (rng.next() % VOCAB as u64) as u32).collect();
    let mut generator = Generator::new(loaded.model)?;
    for run in 1..=args.runs {
        let out = generator.generate(&prompt, &config)?;
        let t = &out.timings;
        println!(
            "threads={threads} run={run} prefill_tok_s={:.2} decode_tok_s={:.2} load_s={load_s:.2} \
             rss_after_load_mb={:.0} peak_rss_mb={:.0}",
            t.prefill_tokens_per_sec(),
            t.decode_tokens_per_sec(),
            rss_loaded as f64 / (1 << 20) as f64,
            peak_rss_bytes()? as f64 / (1 << 20) as f64,
        );
    }
    if backend_cpu::executor::profile::enabled() {
        print!("{}", backend_cpu::executor::profile::report());
    }
    Ok(())
}

/// Writes config.json and a random bf16 model.safetensors with Qwen3-0.6B's shapes.
fn write_checkpoint(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut rng = SplitMix64(0x5eed);
    // Linear weights uniform in ±0.03 (std ≈ 0.017, like trained Qwen3 projections); norms near 1.
    let mut add = |name: String, shape: Vec<usize>, centre: f32, spread: f32| {
        let n: usize = shape.iter().product();
        let bytes =
            (0..n).flat_map(|_| bf16::from_f32(centre + spread * rng.uniform_pm1()).to_bits().to_le_bytes()).collect();
        tensors.push((name, shape, bytes));
    };
    add("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN], 0.0, 0.03);
    add("model.norm.weight".into(), vec![HIDDEN], 1.0, 0.1);
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
        add(format!("{p}.self_attn.q_proj.weight"), vec![q, HIDDEN], 0.0, 0.03);
        add(format!("{p}.self_attn.k_proj.weight"), vec![kv, HIDDEN], 0.0, 0.03);
        add(format!("{p}.self_attn.v_proj.weight"), vec![kv, HIDDEN], 0.0, 0.03);
        add(format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN, q], 0.0, 0.03);
        add(format!("{p}.self_attn.q_norm.weight"), vec![HEAD_DIM], 1.0, 0.1);
        add(format!("{p}.self_attn.k_norm.weight"), vec![HEAD_DIM], 1.0, 0.1);
        add(format!("{p}.mlp.gate_proj.weight"), vec![INTERMEDIATE, HIDDEN], 0.0, 0.03);
        add(format!("{p}.mlp.up_proj.weight"), vec![INTERMEDIATE, HIDDEN], 0.0, 0.03);
        add(format!("{p}.mlp.down_proj.weight"), vec![HIDDEN, INTERMEDIATE], 0.0, 0.03);
        add(format!("{p}.input_layernorm.weight"), vec![HIDDEN], 1.0, 0.1);
        add(format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN], 1.0, 0.1);
    }
    let views: Vec<_> =
        tensors.iter().map(|(n, s, b)| (n.as_str(), StDtype::BF16, s.as_slice(), b.as_slice())).collect();
    write_safetensors_atomic(dir.join("model.safetensors"), &views, &BTreeMap::new())?;
    let config = serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 40960,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000,
        "tie_word_embeddings": true,
        "torch_dtype": "bfloat16",
        "attention_bias": false,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
    });
    mllm_dsl::files::write_atomic_bytes(&dir.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    Ok(())
}

/// SplitMix64: a small, fast, deterministic generator (weights and prompt only need to be fixed
/// and spread out, not cryptographic).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1).
    fn uniform_pm1(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}
