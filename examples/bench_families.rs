//! Graph-family bench: for Qwen3-1.7B's shapes, the modelled time to first token and decode rate
//! of per-step graph selection over a family (chunks 128, 32, 1 at contexts 1024 and 4096)
//! against mllm's fixed pair (chunk 32 + decode at context 1024), prompts of 16 to 2048 tokens and
//! 128 new tokens, on each target of the cost model (SM8650 / v75, SM8750 / v79); then, with
//! `--cpu-model DIR`, the same two ways measured on the CPU backend with that checkpoint (every
//! prompt length that fits `--cpu-max-prompt`), generated ids compared.
//!
//! ```text
//! cargo run --release -p mllm-examples --example bench_families
//! cargo run --release -p mllm-examples --example bench_families -- --cpu-model "$(scripts/fetch-smollm2)"
//! ```
//! The cost model and its sources: docs/graph-families.md.

use anyhow::{ensure, Context, Result};
use backend_qnn::cost::{Calibration, DecoderShapes, HtpPerf};
use clap::Parser;
use mllm_examples as _; // the allocator every main runs with (lib.rs)
use runtime::{GenerationConfig, Generator, GraphChoice, GraphMenu, Sampling};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
struct Args {
    /// Prompt lengths.
    #[arg(long, value_delimiter = ',', default_value = "16,32,64,100,128,256,512,1024,2048")]
    prompts: Vec<usize>,
    /// New tokens per run.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Also measure on the CPU backend with this HF checkpoint directory.
    #[arg(long)]
    cpu_model: Option<PathBuf>,
    /// Longest prompt measured on the CPU.
    #[arg(long, default_value_t = 256)]
    cpu_max_prompt: usize,
    /// CPU threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
}

/// mllm's pair at context 1024 and the family, as menus of modelled costs on `target`.
fn menus(shapes: &DecoderShapes, target: &HtpPerf) -> Result<(GraphMenu, GraphMenu)> {
    let menu = |chunks: &[usize], contexts: &[usize]| {
        let choices = contexts
            .iter()
            .flat_map(|&ctx| chunks.iter().map(move |&chunk| (chunk, ctx)))
            .map(|(chunk, context_len)| GraphChoice {
                chunk,
                context_len,
                cost_s: target.call(&shapes.call(chunk, context_len)).total_s(),
            })
            .collect();
        GraphMenu::new(choices)
    };
    Ok((menu(&[32, 1], &[1024])?, menu(&[128, 32, 1], &[1024, 4096])?))
}

/// The fixed pair's modelled prefill: the runtime's rule (chunks of 32, the tail through the decode
/// graph where a chunk no longer fits), which [`GraphMenu::plan_prompt`] reproduces with only
/// chunks 32 and 1 to choose from.
fn modelled(menu: &GraphMenu, prompt: usize, new: usize) -> Option<(f64, f64)> {
    menu.modelled_seconds(prompt, new)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let shapes = DecoderShapes::qwen3_1_7b();
    let c = Calibration::mllm_qwen3_1_7b_sm8650();
    println!(
        "cost model vs mllm's Qwen3-1.7B on SM8650 (chunk 32, context 1024, prompt 640): prefill {:.0} modelled / {:.0} \
         measured tok/s ({:.2}x), decode {:.1} / {:.1} tok/s ({:.2}x)",
        c.prefill_tok_s.0, c.prefill_tok_s.1, c.prefill_tok_s.2, c.decode_tok_s.0, c.decode_tok_s.1, c.decode_tok_s.2
    );
    for target in HtpPerf::table() {
        let (pair, family) = menus(&shapes, &target)?;
        println!(
            "\n{} (HTP v{}), Qwen3-1.7B shapes, {} new tokens: fixed = mllm's s32/s1 at context 1024; selection = \
             s128/s32/s1 at 1024 and 4096",
            target.soc, target.htp_arch, args.new_tokens
        );
        println!(
            "  {:>6}  {:>12} {:>12} {:>7}  {:>12} {:>12}  selection's prompt calls",
            "prompt", "TTFT fixed", "TTFT select", "ratio", "decode fixed", "decode sel."
        );
        for &prompt in &args.prompts {
            let fixed = modelled(&pair, prompt, args.new_tokens);
            let select = modelled(&family, prompt, args.new_tokens)
                .with_context(|| format!("prompt {prompt} does not fit the family"))?;
            let plan = family.plan_prompt(0, prompt, 1024)?;
            let mut calls: Vec<(usize, usize, usize)> = Vec::new();
            for p in &plan {
                match calls.last_mut() {
                    Some((chunk, ctx, n)) if *chunk == p.chunk && *ctx == p.context_len => *n += 1,
                    _ => calls.push((p.chunk, p.context_len, 1)),
                }
            }
            let calls: Vec<String> = calls.iter().map(|(c, ctx, n)| format!("{n}x s{c}@{ctx}")).collect();
            let decode_rate = |d: f64| if args.new_tokens > 1 { (args.new_tokens - 1) as f64 / d } else { 0.0 };
            let (ttft_fixed, ratio, dec_fixed) = match fixed {
                Some((p, d)) => {
                    (format!("{:.1} ms", p * 1e3), format!("{:.2}x", p / select.0), format!("{:.1}", decode_rate(d)))
                }
                None => ("no fit".into(), "-".into(), "no fit".into()),
            };
            println!(
                "  {prompt:>6}  {ttft_fixed:>12} {:>9.1} ms {ratio:>7}  {dec_fixed:>12} {:>12.1}  {}",
                select.0 * 1e3,
                decode_rate(select.1),
                calls.join(" + ")
            );
        }
    }
    if let Some(dir) = &args.cpu_model {
        backend_cpu::kernels::set_num_threads(args.threads)?;
        measure_cpu(dir, &args)?;
    }
    Ok(())
}

/// Wall times on the CPU backend: the fixed pair (chunk 32 at context 1024) and selection over
/// the same family shape scaled to the checkpoint (costs from its own shapes on SM8650).
fn measure_cpu(dir: &std::path::Path, args: &Args) -> Result<()> {
    let hf = models::hf::HfConfig::from_dir(dir)?;
    let target = HtpPerf::by_name("sm8650").context("SM8650 is in the table")?;
    let family = aot::GraphFamily::new(&[128, 32, 1], &[1024, 4096], aot::GraphNaming::Mllm)?;
    let menu = aot::family::graph_menu(&hf, &family, None, &target)?;
    println!("\nmeasured on the CPU backend ({}), {} new tokens, greedy; wall seconds", dir.display(), args.new_tokens);
    println!(
        "  {:>6}  {:>10} {:>10} {:>7}  {:>10} {:>10}  same ids",
        "prompt", "TTFT fixed", "TTFT sel.", "ratio", "dec fixed", "dec sel."
    );
    for &prompt_len in args.prompts.iter().filter(|&&p| p <= args.cpu_max_prompt && p + args.new_tokens <= 1024) {
        let prompt: Vec<u32> = (0..prompt_len).map(|i| (i as u32 * 7919 + 13) % hf.vocab_size as u32).collect();
        let config = GenerationConfig {
            max_new_tokens: args.new_tokens,
            prefill_chunk: 32,
            sampling: Sampling::Greedy,
            eos_ids: Vec::new(),
            collect_prompt_logits: false,
        };
        let loaded = aot::load_model(dir, 4096, aot::RunMode::Auto)?;
        let mut generator = Generator::new(loaded.model)?;
        let t = Instant::now();
        let fixed = generator.generate(&prompt, &config)?;
        let fixed_s = t.elapsed().as_secs_f64();
        generator.set_menu(menu.clone())?;
        let t = Instant::now();
        let select = generator.generate(&prompt, &config)?;
        let select_s = t.elapsed().as_secs_f64();
        ensure!(fixed_s > 0.0 && select_s > 0.0, "no time measured");
        let (f, s) = (&fixed.timings, &select.timings);
        println!(
            "  {prompt_len:>6}  {:>10.3} {:>10.3} {:>6.2}x  {:>10.3} {:>10.3}  {}",
            f.prefill.as_secs_f64(),
            s.prefill.as_secs_f64(),
            f.prefill.as_secs_f64() / s.prefill.as_secs_f64(),
            f.decode.as_secs_f64(),
            s.decode.as_secs_f64(),
            fixed.ids == select.ids
        );
    }
    Ok(())
}
