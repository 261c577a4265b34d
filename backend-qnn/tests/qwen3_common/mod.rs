//! The tiny quantized Qwen3 of `fixtures/pymllm-qwen3-dev-f32` through the AOT pipeline, its
//! lowering, fixed inputs, and the CPU fake-quant reference run (shared by the lowering and
//! SDK tests).

#![allow(dead_code)]

use backend_cpu::checkpoint::SafetensorsCheckpoint;
use backend_cpu::{CheckpointStore, CpuBackend, InterpMode, Interpreter};
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use mllm_dsl::config::aot::AotConfig;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::passes::{Pipeline, QuantParamProvider};
use mllm_dsl::prelude::*;
use mllm_dsl::{Program, Storage, TensorType};
use models::io::trace_inputs;
use models::qwen3::{Qwen3ForCausalLM, MASK_SCALE, MASK_ZERO_POINT};
use models::TransformerConfig;
use std::path::PathBuf;

pub const CHUNK: usize = 4;
pub const CONTEXT: usize = 16;
/// Valid past tokens in the cache (the other past columns are masked).
pub const N_PAST: usize = 7;
/// RoPE table rows of the export (`mllm_qualcomm_max_length`).
pub const MAX_POSITIONS: usize = 1024;

pub fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/pymllm-qwen3-dev-f32")
}

pub fn model_config() -> TransformerConfig {
    TransformerConfig::from_hf(&HfConfig::from_dir(fixture()).unwrap(), MAX_POSITIONS)
}

pub fn aot_config() -> AotConfig {
    let mut c = AotConfig::w4a16_kv8();
    c.quant_recipe.layers = model_config().num_hidden_layers as u32;
    c
}

pub fn checkpoint() -> SafetensorsCheckpoint {
    SafetensorsCheckpoint::open(fixture()).unwrap()
}

pub fn traced(chunk: usize) -> Program {
    let cfg = model_config();
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16).unwrap();
    let inputs = trace_inputs(&cfg, chunk, CONTEXT, ParamFormat::QnnW4A16);
    let l = cfg.num_hidden_layers;
    trace(&inputs, |t| model.forward(&t[0], &t[1], &t[2], &t[3..3 + l], &t[3 + l..])).unwrap()
}

/// The program after the first `n` passes of the QNN AOT pipeline.
pub fn compiled_through(n: usize, chunk: usize) -> Program {
    let (cfg, ckpt) = (aot_config(), checkpoint());
    let mut p = traced(chunk);
    for pass in Pipeline::qnn_aot(&cfg, &ckpt).passes().take(n) {
        pass.run(&mut p).unwrap_or_else(|e| panic!("{e}"));
    }
    p
}

/// The program after the whole pipeline (TensorRenaming).
pub fn compiled(chunk: usize) -> Program {
    compiled_through(usize::MAX, chunk)
}

/// `model.0.s4` and `model.0.s1`, lowered by one [`QnnLowering`] (as for one context).
pub fn lowered_pair() -> (QnnGraph, QnnGraph) {
    let ckpt = checkpoint();
    let mut lowering = QnnLowering::new(&ckpt, LowerOptions::default());
    let mut s4 = lowering.lower_program(&compiled(CHUNK)).unwrap_or_else(|e| panic!("{e}"));
    let mut s1 = lowering.lower_program(&compiled(1)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((s4.len(), s1.len()), (1, 1));
    (s4.remove(0), s1.remove(0))
}

/// Fixed graph inputs: ids, positions N_PAST.., a causal mask over N_PAST valid past columns
/// (u16 codes: 65535 attend, 0 masked), past K/V codes near the middle of the u8 range.
pub struct Inputs {
    pub chunk: usize,
    pub ids: Vec<i32>,
    pub positions: Vec<i32>,
    pub mask_codes: Vec<u16>,
    /// `past_key_0.., past_value_0..` codes, K `[1, Hkv, D, past]`, V `[1, Hkv, past, D]`.
    pub kv_codes: Vec<Vec<u8>>,
}

impl Inputs {
    pub fn new(chunk: usize) -> Inputs {
        let cfg = model_config();
        let past = CONTEXT - chunk;
        let ids = [5, 17, 99, 3, 64, 8, 120, 31][..chunk].to_vec();
        let positions = (N_PAST..N_PAST + chunk).map(|p| p as i32).collect();
        let mut mask_codes = Vec::with_capacity(chunk * CONTEXT);
        for row in 0..chunk {
            for col in 0..CONTEXT {
                let attend = col < N_PAST || (col >= past && col - past <= row);
                mask_codes.push(if attend { 65535 } else { 0 });
            }
        }
        let mut seed = 0x2545_f491u32;
        let n = cfg.num_key_value_heads * cfg.head_dim * past;
        let kv_codes = (0..2 * cfg.num_hidden_layers)
            .map(|_| {
                (0..n)
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 17;
                        seed ^= seed << 5;
                        (96 + seed % 64) as u8
                    })
                    .collect()
            })
            .collect();
        Inputs { chunk, ids, positions, mask_codes, kv_codes }
    }

    /// The mask as real values (what its u16 codes mean).
    pub fn mask_real(&self) -> Vec<f32> {
        self.mask_codes.iter().map(|&c| (i32::from(c) - MASK_ZERO_POINT) as f32 * MASK_SCALE).collect()
    }
}

/// backend-cpu's interpreter in fake-quant mode on the post-pass IR: `[logits, K.., V..]`.
pub fn run_cpu_fake_quant(program: &Program, chunk: usize) -> Vec<Tensor> {
    let cfg = model_config();
    let ckpt = checkpoint();
    let backend = CpuBackend::float();
    let store = CheckpointStore::open(fixture(), backend.clone(), cfg.tie_word_embeddings).unwrap();
    let x = Inputs::new(chunk);
    let (kvh, d, past) = (cfg.num_key_value_heads, cfg.head_dim, CONTEXT - chunk);
    let t = |data: Vec<f32>, shape: Vec<usize>, dtype: DType| {
        Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data.into()), backend.clone()).unwrap()
    };
    let mut inputs = vec![
        Tensor::from_i64(
            x.ids.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(),
            vec![1, chunk],
            DType::I32,
            backend.clone(),
        )
        .unwrap(),
        Tensor::from_i64(
            x.positions.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(),
            vec![chunk],
            DType::I32,
            backend.clone(),
        )
        .unwrap(),
        t(x.mask_real(), vec![1, 1, chunk, CONTEXT], DType::F32),
    ];
    let l = cfg.num_hidden_layers;
    for (i, codes) in x.kv_codes.iter().enumerate() {
        let (which, layer) = if i < l { ("k", i) } else { ("v", i - l) };
        let key = format!("model.layers.{layer}.self_attn.{which}_cast_to_int8_qdq.fake_quant.scale");
        let scale = QuantParamProvider::scalar_f32(&ckpt, &key).unwrap();
        let data = codes.iter().map(|&c| (i32::from(c) - 128) as f32 * scale).collect();
        let shape = if which == "k" { vec![1, kvh, d, past] } else { vec![1, kvh, past, d] };
        inputs.push(t(data, shape, DType::U8Sym));
    }
    Interpreter::new(program, &store, InterpMode::FakeQuant(&ckpt)).run(&inputs).unwrap_or_else(|e| panic!("{e}"))
}

/// `10 log10(sum(ref^2) / sum((x - ref)^2))`.
pub fn sqnr_db(x: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(x.len(), reference.len());
    let signal: f64 = reference.iter().map(|&r| f64::from(r).powi(2)).sum();
    let noise: f64 = x.iter().zip(reference).map(|(&a, &r)| (f64::from(a) - f64::from(r)).powi(2)).sum();
    10.0 * (signal / noise).log10()
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("backend-qnn-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
