//! Graph families at run time: `generate` with several `--chunk` / `--context` values picks every
//! step's graph by its modelled cost, moves a sequence to the larger context only when it must,
//! and generates the fixed pair's tokens (mllm's chunk + decode graphs at one context) on the CPU
//! fake-quant model and on a family context binary run by backend-qnn's reference interpreter;
//! bad families, prompts and binaries are refused by name.

use aot::{lower_family, GraphFamily, GraphNaming};
use clap::Parser;

/// The example's own source: these tests run its `run_generate` on parsed arguments.
#[allow(dead_code)]
#[path = "../generate.rs"]
mod generate;

use generate::{run_generate, GenerateArgs};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn run(args: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut argv = vec!["generate"];
    argv.extend_from_slice(args);
    run_generate(&GenerateArgs::try_parse_from(argv)?)
}

fn ids_line(lines: &[String]) -> Vec<u32> {
    lines[0].strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect()
}

fn graph_lines(lines: &[String]) -> Vec<&str> {
    lines.iter().filter_map(|l| l.strip_prefix("graph: ")).collect()
}

/// 14 prompt ids: with 10 new tokens the sequence (24 positions) outgrows context 16.
const PROMPT: &str = "5,17,99,3,64,8,21,77,42,9,100,11,60,33";

/// The family of the tests: chunks 8, 4 and 1 at contexts 16 and 32.
const FAMILY: [&str; 10] = ["--chunk", "8", "--chunk", "4", "--chunk", "1", "--context", "16", "--context", "32"];

#[test]
fn selection_generates_the_fixed_pairs_tokens_on_the_cpu_and_moves_context_only_when_it_must() {
    let model = fixtures().join("pymllm-qwen3-dev-f32");
    let m = model.to_str().unwrap();
    let common = ["--model", m, "--prompt-ids", PROMPT, "--max-new-tokens", "10"];
    let fixed: Vec<&str> = common.iter().copied().chain(["--chunk", "4", "--context", "32"]).collect();
    let fixed = run(&fixed).unwrap();
    let selecting: Vec<&str> = common.iter().copied().chain(FAMILY).chain(["--verbose"]).collect();
    let selecting = run(&selecting).unwrap();
    assert_eq!(ids_line(&selecting), ids_line(&fixed));
    assert_eq!(ids_line(&fixed).len(), 14 + 10);

    let steps = graph_lines(&selecting);
    // The prompt on the small context: one chunk-8 call, one chunk-4 call, then the decode graph
    // for the two positions the chunk-4 graph cannot store (placement rule: n_past + n <= 16 - ar).
    assert_eq!(
        &steps[..4],
        [
            "prompt positions 0..8: chunk 8 at context 16",
            "prompt positions 8..12: chunk 4 at context 16",
            "prompt positions 12..13: chunk 1 at context 16",
            "prompt positions 13..14: chunk 1 at context 16",
        ],
        "{steps:#?}"
    );
    // Decoding stays on context 16 while its rows hold the next token (position 14), then moves.
    assert_eq!(steps[4], "decode positions 14..15: chunk 1 at context 16", "{steps:#?}");
    assert_eq!(steps[5], "move: context 16 -> 32 with 15 positions stored", "{steps:#?}");
    assert!(steps[6..].iter().all(|s| s.ends_with("chunk 1 at context 32")), "{steps:#?}");
    assert_eq!(steps.iter().filter(|s| s.starts_with("move")).count(), 1);

    // A short conversation never leaves the small context.
    let short: Vec<&str> = ["--model", m, "--prompt-ids", "5,17,99", "--max-new-tokens", "4", "--verbose"]
        .into_iter()
        .chain(FAMILY)
        .collect();
    let short = run(&short).unwrap();
    assert!(graph_lines(&short).iter().all(|s| s.ends_with("context 16")), "{short:#?}");
    let fixed_short =
        run(&["--model", m, "--prompt-ids", "5,17,99", "--max-new-tokens", "4", "--chunk", "4", "--context", "16"])
            .unwrap();
    assert_eq!(ids_line(&short), ids_line(&fixed_short));
}

#[test]
fn selection_on_a_family_context_binary_generates_the_fixed_pairs_tokens() {
    use backend_qnn::context::write_context_binary;
    use backend_qnn::sdk::RecordingApi;
    use backend_qnn::target::HtpTarget;
    let model = fixtures().join("pymllm-qwen3-dev-f32");
    let family = GraphFamily::new(&[8, 4, 1], &[16, 32], GraphNaming::Mllm).unwrap();
    let graphs = lower_family(&model, &family).unwrap();
    let names: Vec<&str> = graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(
        names,
        ["model.0.s8", "model.0.s4", "model.0.s1", "model.0.s8_cl32", "model.0.s4_cl32", "model.0.s1_cl32"]
    );
    // Every member reads the same weight buffers: the family holds each weight once.
    let (once, per_graph) = aot::family::check_weights_shared(&graphs).unwrap();
    assert!(once * 5 < per_graph, "{once} bytes once, {per_graph} over the graphs");
    let target = HtpTarget::new(&compiler::aot_config::AotConfig::w4a16_kv8().target_machine);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("graph-family");
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("family.bin");
    write_context_binary(&graphs, &target, &mut RecordingApi::new(), &binary).unwrap();

    let m = model.to_str().unwrap();
    let bin = binary.to_str().unwrap();
    let common = ["--model", m, "--prompt-ids", PROMPT, "--max-new-tokens", "10"];
    let fixed: Vec<&str> = common.iter().copied().chain(["--chunk", "4", "--context", "32"]).collect();
    let fixed = run(&fixed).unwrap();
    let emulated: Vec<&str> =
        common.iter().copied().chain(FAMILY).chain(["--verbose", "--qnn-emulate", "--qnn-context", bin]).collect();
    let emulated = run(&emulated).unwrap();
    assert_eq!(ids_line(&emulated), ids_line(&fixed));
    assert!(graph_lines(&emulated).iter().any(|s| s.starts_with("move: context 16 -> 32")), "{emulated:#?}");

    // The binary holds the family; a run expecting another graph set is refused, naming both.
    let other: Vec<&str> = common
        .iter()
        .copied()
        .chain([
            "--chunk",
            "8",
            "--chunk",
            "2",
            "--context",
            "16",
            "--context",
            "32",
            "--qnn-emulate",
            "--qnn-context",
            bin,
        ])
        .collect();
    let err = format!("{:#}", run(&other).unwrap_err());
    assert!(err.contains("family.bin") && err.contains("model.0.s2"), "{err}");
}

#[test]
fn bad_families_and_prompts_are_refused_by_name() {
    let model = fixtures().join("pymllm-qwen3-dev-f32");
    let m = model.to_str().unwrap();
    // A prompt longer than the largest context.
    let long: Vec<String> = (0..40).map(|i| (i % 100 + 3).to_string()).collect();
    let long = long.join(",");
    let args: Vec<&str> =
        ["--model", m, "--prompt-ids", &long, "--max-new-tokens", "1"].into_iter().chain(FAMILY).collect();
    let err = format!("{:#}", run(&args).unwrap_err());
    assert!(err.contains("40 tokens") && err.contains("--context 32"), "{err}");
    // A chunk that does not fit the smallest context.
    let args =
        ["--model", m, "--prompt-ids", "5", "--chunk", "16", "--chunk", "4", "--context", "16", "--context", "32"];
    let err = format!("{:#}", run(&args).unwrap_err());
    assert!(err.contains("--chunk 16 must be smaller than the context length 16"), "{err}");
    // An unknown target of the cost model.
    let args = ["--model", m, "--prompt-ids", "5", "--chunk", "4", "--context", "16", "--select", "--target", "sm9999"];
    let err = format!("{:#}", run(&args).unwrap_err());
    assert!(err.contains("--target sm9999"), "{err}");
}

#[test]
fn graphs_that_cannot_share_weights_are_refused_by_name() {
    let model = fixtures().join("pymllm-qwen3-dev-f32");
    let family = GraphFamily::new(&[4, 1], &[16, 32], GraphNaming::Mllm).unwrap();
    let mut graphs = lower_family(&model, &family).unwrap();
    // The last graph's copy of one weight changed: the family could not live in one context.
    let last = graphs.last_mut().unwrap();
    let weight = last.tensors.iter_mut().find(|t| t.name.contains("q_proj") && t.data.is_some()).unwrap();
    let mut bytes = weight.data.as_ref().unwrap().bytes().to_vec();
    bytes[0] ^= 1;
    let name = weight.name.clone();
    weight.data = Some(backend_qnn::StaticData::new(bytes));
    let err = aot::family::check_weights_shared(&graphs).unwrap_err().to_string();
    assert!(err.contains(&name) && err.contains("model.0.s1_cl32") && err.contains("cannot share weights"), "{err}");
}

/// The cost model's two front ends agree: the counts of each lowered graph of a family (MACs, K/V
/// read and written, weight bytes) against the same counts from the checkpoint's config.json.
#[test]
fn the_cost_of_each_lowered_graph_matches_the_decoders_shapes() {
    use backend_qnn::cost::GraphCost;
    let model = fixtures().join("pymllm-qwen3-dev-f32");
    let family = GraphFamily::new(&[8, 4, 1], &[16, 32], GraphNaming::Mllm).unwrap();
    let hf = models::hf::HfConfig::from_dir(&model).unwrap();
    let shapes = aot::family::decoder_shapes(&hf);
    for g in lower_family(&model, &family).unwrap() {
        let lowered = GraphCost::of(&g);
        let analytic = shapes.call(lowered.chunk, lowered.context_len);
        let spec = family.spec_named(&g.name, 1).unwrap();
        assert_eq!((lowered.chunk, lowered.context_len), (spec.chunk, spec.context_len), "{}", g.name);
        assert_eq!(lowered.weight_macs, analytic.weight_macs, "{}", g.name);
        assert_eq!(lowered.attention_macs, analytic.attention_macs, "{}", g.name);
        assert_eq!(lowered.wide_macs, lowered.macs(), "{}: every product has a 16-bit operand (A16)", g.name);
        assert_eq!(lowered.kv_read_bytes, analytic.kv_read_bytes, "{}", g.name);
        assert_eq!(lowered.kv_written_bytes, analytic.kv_written_bytes, "{}", g.name);
        let ratio = lowered.weight_bytes as f64 / analytic.weight_bytes as f64;
        eprintln!(
            "{}: weight bytes {} lowered, {} from shapes ({ratio:.3})",
            g.name, lowered.weight_bytes, analytic.weight_bytes
        );
        assert!((0.9..=1.1).contains(&ratio), "{}: {lowered:?} vs {analytic:?}", g.name);
    }
}
