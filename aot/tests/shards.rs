//! Sharded context binaries: the plan of a Qwen3-8B-shaped model from a weight-free trace, and
//! the shards of a compiled graph chained on backend-qnn's reference interpreter against the
//! whole graph.

use std::collections::HashMap;
use std::path::PathBuf;

use aot::shard::{
    default_max_memory, plan_auto, plan_shards, shard_program, AutoLimits, ModelBytes, ShardCount, ShardError,
    ShardPlan, BUILD_MEMORY_FACTOR, DEFAULT_MAX_CONTEXT_BYTES, HIDDEN_STATES, HIDDEN_STATES_OUT,
};
use aot::synthetic::{QWEN3_1_7B, QWEN3_8B};
use backend_qnn::interp::{Interpreter, TensorValue};
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use checkpoint::SafetensorsCheckpoint;
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

/// The static bytes of a W4A16 Qwen3 as the HTP binary stores them, from the config alone: u16
/// embedding and norms, int4 linears in 8-bit containers, u16 RoPE tables.
fn expected_bytes(shape: &aot::synthetic::Qwen3Shape, positions: u64) -> (u64, u64, u64, u64) {
    let (v, h, i, d) = (shape.vocab as u64, shape.hidden as u64, shape.intermediate as u64, shape.head_dim as u64);
    let (q, kv) = (shape.heads as u64 * d, shape.kv_heads as u64 * d);
    let layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * 2 * h + 2 * 2 * d;
    (2 * v * h, layer, v * h + 2 * h, 2 * 2 * positions * d)
}

#[test]
fn trace_only_plan_of_qwen3_8b_fits_two_gib_binaries_and_twice_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), QWEN3_8B.config(QWEN3_8B.layers).to_string()).unwrap();
    let hf = HfConfig::from_dir(dir.path()).unwrap();
    let t = std::time::Instant::now();
    let program = aot::trace_graph(&hf, 1024, 1, 1024, ParamFormat::QnnW4A16).unwrap();
    let bytes = ModelBytes::from_program(&program).unwrap();
    let (embedding, layer, head, shared) = expected_bytes(&QWEN3_8B, 1024);
    assert_eq!(bytes.embedding, embedding);
    assert_eq!(bytes.layers, vec![layer; 36]);
    assert_eq!(bytes.head, head);
    assert_eq!(bytes.shared, shared);
    let total = bytes.total();
    assert!((8.7e9..8.9e9).contains(&(total as f64)), "{total}");
    let limits = AutoLimits {
        max_context_bytes: DEFAULT_MAX_CONTEXT_BYTES,
        max_memory: default_max_memory(u64::MAX, &bytes),
        factor: BUILD_MEMORY_FACTOR,
    };
    let auto = plan_auto(&bytes, &limits, 2).unwrap();
    println!(
        "Qwen3-8B (36 layers, hidden 4096, intermediate 12288): {:.1} MB static, planned in {:.2} s",
        total as f64 / 1e6,
        t.elapsed().as_secs_f64()
    );
    for r in &auto.reasons {
        println!("  {r}");
    }
    print!("{}", auto.plan.table());
    let plan = &auto.plan;
    // Contiguous, every layer once, head last; the embedding is gathered on the CPU.
    assert_eq!(plan.shards[0].layers.start, 0);
    assert_eq!(plan.shards.last().unwrap().layers.end, 36);
    for w in plan.shards.windows(2) {
        assert_eq!(w[0].layers.end, w[1].layers.start);
    }
    assert!(plan.shards.iter().all(|s| !s.embedding) && plan.shards.last().unwrap().head);
    assert_eq!(
        plan.shards.iter().map(|s| s.static_bytes).sum::<u64>(),
        total - embedding + (plan.count() as u64 - 1) * shared
    );
    for s in &plan.shards {
        assert!(s.static_bytes <= DEFAULT_MAX_CONTEXT_BYTES, "{s:?}");
        assert!(s.static_bytes as f64 * BUILD_MEMORY_FACTOR <= 2.0 * total as f64, "{s:?}");
    }
    // The smallest such count: one shard fewer breaks a limit.
    let fewer = ShardPlan::balanced(&bytes, plan.count() - 1).unwrap().largest().static_bytes;
    assert!(fewer > DEFAULT_MAX_CONTEXT_BYTES || fewer as f64 * BUILD_MEMORY_FACTOR > limits.max_memory as f64);
    assert_eq!(plan.count(), 4);
    // A fixed count names what it breaks.
    let e = plan_shards(&bytes, ShardCount::Fixed(1), &limits, 2, None).unwrap_err();
    assert!(matches!(e, ShardError::ShardTooLarge { shard: 1, count: 1, .. }), "{e}");
    assert!(e.to_string().contains("AutoLimits::max_context_bytes 2147483648"), "{e}");
    let e = plan_shards(&bytes, ShardCount::Fixed(37), &limits, 2, None).unwrap_err();
    assert_eq!(e, ShardError::MoreShardsThanLayers { shards: 37, layers: 36 });
    let tight = AutoLimits { max_context_bytes: layer / 2, ..limits };
    let e = plan_auto(&bytes, &tight, 2).unwrap_err();
    assert!(e.to_string().contains("no cut of the layers fits"), "{e}");
    assert_eq!(
        "0".parse::<ShardCount>().unwrap_err().to_string(),
        "0 shards: a model needs at least one shard (a count >= 1, or auto)"
    );
}

#[test]
fn qwen3_1_7b_static_bytes_match_the_measured_context() {
    // docs/qnn-compile-bench.md measured 2344 MB of distinct STATIC tensors for the 28-layer shape.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), QWEN3_1_7B.config(28).to_string()).unwrap();
    let hf = HfConfig::from_dir(dir.path()).unwrap();
    let program = aot::trace_graph(&hf, 1024, 1, 1024, ParamFormat::QnnW4A16).unwrap();
    let total = ModelBytes::from_program(&program).unwrap().total() as f64 / 1e6;
    assert!((total - 2344.0).abs() < 5.0, "{total} MB");
}

/// Deterministic input codes for a graph input (ids in the vocabulary, the cache's last
/// positions, a causal mask, K/V codes spread over u8).
fn input_codes(graph: &QnnGraph, name: &str, chunk: usize, context: usize, vocab: i64) -> Vec<i64> {
    let t = graph.tensor(name).unwrap();
    let n: usize = t.dims.iter().map(|&d| d as usize).product();
    let past = context - chunk;
    match name {
        "input_ids" => (0..n as i64).map(|i| (i * 37 + 5) % vocab).collect(),
        "position_ids" => (0..n as i64).map(|i| (past as i64 - 3) + i).collect(),
        "attention_mask" => (0..n)
            .map(|k| {
                let (row, col) = (k / context, k % context);
                // Past positions 3..past visible, and the chunk causally.
                let visible = (col >= 3 && col < past) || (col >= past && col - past <= row);
                if visible {
                    65535
                } else {
                    0
                }
            })
            .collect(),
        _ => (0..n as i64).map(|i| (i * 29 + name.len() as i64 * 7) % 256).collect(),
    }
}

fn run(graph: &QnnGraph, inputs: &HashMap<String, TensorValue>) -> HashMap<String, TensorValue> {
    let values: Vec<TensorValue> = graph.inputs.iter().map(|n| inputs[n].clone()).collect();
    let out = Interpreter::new(graph).unwrap().run(&values).unwrap();
    graph.outputs.iter().cloned().zip(out).collect()
}

#[test]
fn chained_shards_compute_the_whole_graph_exactly_on_the_reference_interpreter() {
    let dir = fixture("pymllm-qwen3-dev-f32");
    let hf = HfConfig::from_dir(&dir).unwrap();
    let ckpt = SafetensorsCheckpoint::open(&dir).unwrap();
    let (aot_cfg, _) = aot::load_aot_config(None, &hf).unwrap();
    let dir_out = tempfile::tempdir().unwrap();
    let context = 16;
    for chunk in [4, 1] {
        let family = aot::GraphFamily::new(&[chunk], &[context], aot::GraphNaming::Mllm).unwrap();
        let opts = aot::CompileOptions {
            family: &family,
            max_positions: 1024,
            dump_ir: None,
            progress: &aot::progress::Silent,
        };
        let compiled = aot::compile(&hf, &ckpt, &aot_cfg, &opts).unwrap();
        let whole_program = &compiled.graphs[0].program;
        let whole = &compiled.graphs[0].graph;
        let bytes = ModelBytes::from_program(whole_program).unwrap();
        assert_eq!(bytes.layers.len(), 2);
        let plan = ShardPlan::balanced(&bytes, 2).unwrap();
        assert_eq!(plan.shards.iter().map(|s| s.layers.clone()).collect::<Vec<_>>(), vec![0..1, 1..2]);
        let mut lowering = QnnLowering::new(&ckpt, LowerOptions::default());
        let shards: Vec<QnnGraph> = (0..2)
            .map(|i| {
                let p = shard_program(whole_program, &plan, i).unwrap();
                let mut g = lowering.lower_program(&p).unwrap();
                assert_eq!(g.len(), 1);
                g.remove(0)
            })
            .collect();
        assert_eq!(shards[0].name, format!("model.0.s{chunk}"));
        assert_eq!(shards[1].name, format!("model.1.s{chunk}"));
        // Each shard's I/O: its layers' K/V, the hidden state across.
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            shards[0].inputs,
            s(&["position_ids", "attention_mask", "past_key_0", "past_value_0", HIDDEN_STATES])
        );
        assert_eq!(shards[0].outputs, s(&["present_key_0", "present_value_0", HIDDEN_STATES_OUT]));
        assert_eq!(
            shards[1].inputs,
            s(&["position_ids", "attention_mask", "past_key_1", "past_value_1", HIDDEN_STATES])
        );
        assert_eq!(shards[1].outputs, s(&["logits", "present_key_1", "present_value_1"]));
        // One encoding on both sides of the boundary.
        let (out, inp) = (shards[0].tensor(HIDDEN_STATES_OUT).unwrap(), shards[1].tensor(HIDDEN_STATES).unwrap());
        assert_eq!((out.dtype, &out.dims, &out.encoding), (inp.dtype, &inp.dims, &inp.encoding));
        // Every weight in exactly the shard that uses it.
        let statics = |g: &QnnGraph| -> Vec<String> {
            g.tensors.iter().filter(|t| t.data.is_some()).map(|t| t.name.clone()).collect()
        };
        let (s0, s1) = (statics(&shards[0]), statics(&shards[1]));
        // The embedding is in neither: the CPU gathers it from qnn/embedding.safetensors.
        assert!(!s0.iter().chain(&s1).any(|n| n.contains("embed_tokens")));
        assert!(s1.iter().any(|n| n.contains("lm_head")) && !s0.iter().any(|n| n.contains("lm_head")));
        assert!(!s0.iter().any(|n| n.contains("layers_1_")) && !s1.iter().any(|n| n.contains("layers_0_")));

        // The chain against the whole graph, code for code.
        let mut inputs: HashMap<String, TensorValue> = HashMap::new();
        for name in &whole.inputs {
            let codes = input_codes(whole, name, chunk, context, hf.vocab_size as i64);
            inputs.insert(name.clone(), TensorValue::from_codes(whole.tensor(name).unwrap(), codes).unwrap());
        }
        let expected = run(whole, &inputs);
        let table_path = dir_out.path().join(format!("embedding_s{chunk}.safetensors"));
        aot::cpu_embedding::write_table(&ckpt, &table_path).unwrap();
        let table = aot::cpu_embedding::EmbeddingTable::open(&table_path).unwrap();
        let mut first_inputs = inputs.clone();
        first_inputs.insert(HIDDEN_STATES.into(), table.hidden_value(&shards[0], &inputs["input_ids"]).unwrap());
        let first = run(&shards[0], &first_inputs);
        let mut second_inputs = inputs.clone();
        second_inputs.insert(HIDDEN_STATES.into(), first[HIDDEN_STATES_OUT].clone());
        let second = run(&shards[1], &second_inputs);
        for (name, value) in &expected {
            let got = first.get(name).or_else(|| second.get(name)).unwrap_or_else(|| panic!("no shard outputs {name}"));
            assert_eq!(got.codes(), value.codes(), "chunk {chunk}: output `{name}`");
        }
        let logits = expected["logits"].to_real().unwrap();
        assert!(logits.iter().all(|x| x.is_finite()) && logits.iter().any(|&x| x != logits[0]));
    }
}
