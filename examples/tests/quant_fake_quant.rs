//! Fake-quant on the CPU against mllm's own quantized checkpoint (fixtures/pymllm-qwen3-dev-f32,
//! see its README.txt): loaded unchanged through `generate`'s loader, the prompt logits must reach
//! SQNR >= 50 dB against the oracle's `deployedsim_logits` (the same decoding of the exported
//! weights, with pymllm's fake-quant activations) with the same argmax at every position, for
//! prefill chunks of 8 (the whole prompt, as the oracle ran it), 32 (zero-padded) and 1.

use aot::{load_model, RunMode};
use backend_cpu::quant::accuracy::Comparison;
use checkpoint::SafetensorsCheckpoint;
use runtime::{GenerationConfig, Generator, Sampling};
use std::path::{Path, PathBuf};

const CONTEXT: usize = 64;
const VOCAB: usize = 128;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

struct Reference {
    input_ids: Vec<u32>,
    deployed: Vec<f32>,
    float: Vec<f32>,
}

fn reference() -> Reference {
    let r = SafetensorsCheckpoint::open_file(fixture("pymllm-qwen3-dev-f32").join("reference.safetensors")).unwrap();
    Reference {
        input_ids: r.read_i64("input_ids").unwrap().into_iter().map(|v| v as u32).collect(),
        deployed: r.read_f32("deployedsim_logits").unwrap(),
        float: r.read_f32("float_logits").unwrap(),
    }
}

fn prompt_logits(mode: RunMode, chunk: usize, ids: &[u32]) -> (Vec<f32>, bool) {
    let loaded = load_model(&fixture("pymllm-qwen3-dev-f32"), CONTEXT, mode).unwrap();
    assert!(loaded.unused.is_empty(), "unused checkpoint tensors: {:?}", loaded.unused);
    let fake_quant = loaded.fake_quant;
    let cfg = GenerationConfig {
        max_new_tokens: 1,
        prefill_chunk: chunk,
        sampling: Sampling::Greedy,
        eos_ids: vec![],
        collect_prompt_logits: true,
    };
    let out = Generator::new(loaded.model).unwrap().generate(ids, &cfg).unwrap();
    (out.prompt_logits.unwrap(), fake_quant)
}

#[test]
fn pymllm_checkpoint_matches_the_deployed_simulation() {
    let r = reference();
    for chunk in [8, 32, 1] {
        let (logits, fake_quant) = prompt_logits(RunMode::Auto, chunk, &r.input_ids);
        assert!(fake_quant, "a pymllm checkpoint is detected as quantized");
        let c = Comparison::new("logits", &r.deployed, &logits, VOCAB).unwrap();
        let vs_float = Comparison::new("logits", &r.float, &logits, VOCAB).unwrap();
        eprintln!(
            "chunk {chunk}: SQNR vs deployedsim {:.2} dB (max |err| {:.3e}, top-1 {:.3}); vs float {:.2} dB",
            c.sqnr_db, c.max_abs_error, c.top1_agreement, vs_float.sqnr_db
        );
        assert!(c.sqnr_db >= 50.0, "chunk {chunk}: SQNR {} dB < 50 dB", c.sqnr_db);
        assert_eq!(c.top1_agreement, 1.0, "chunk {chunk}: argmax differs at some position");
        // The oracle's own deployedsim-vs-float figure is 14.38 dB: the quantization error is
        // reproduced, not avoided.
        assert!((vs_float.sqnr_db - 14.38).abs() < 0.5, "chunk {chunk}: vs float {} dB", vs_float.sqnr_db);
    }
}

#[test]
fn float_override_runs_the_decoded_weights_without_qdq() {
    let r = reference();
    let (logits, fake_quant) = prompt_logits(RunMode::Float, 8, &r.input_ids);
    assert!(!fake_quant);
    let c = Comparison::new("logits", &r.deployed, &logits, VOCAB).unwrap();
    eprintln!("--float: SQNR vs deployedsim {:.2} dB", c.sqnr_db);
    // Same weights, activations unquantized: close to the deployed simulation, but clearly not it.
    assert!(c.sqnr_db > 15.0 && c.sqnr_db < 50.0, "{} dB", c.sqnr_db);
}
