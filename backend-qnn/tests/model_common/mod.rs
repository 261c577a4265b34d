//! A quantized checkpoint of a tiny model taken through the `aot` library's pipeline (any
//! `model_type`): calibrated and quantized by [`aot::quantize`] or pymllm's export as it is,
//! traced by [`aot::trace_graph`], lowered by [`aot::lower_for_context`]; plus what the tests
//! check it with: fixed graph inputs and the QNN reference interpreter and backend-cpu's
//! fake-quant interpreter on them.

#![allow(dead_code)]

use std::path::PathBuf;

use aot::QuantizeOptions;
use backend_cpu::quant::CalibrationMode;
use backend_cpu::{CheckpointStore, CpuBackend, InterpMode, Interpreter};
use backend_qnn::interp::{Interpreter as QnnInterpreter, TensorValue};
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use checkpoint::SafetensorsCheckpoint;
use compiler::aot_config::AotConfig;
use compiler::passes::{Pipeline, QuantParamProvider};
use mllm_dsl::prelude::*;
use mllm_dsl::{Program, Storage, TensorType};
use models::hf::HfConfig;
use models::io::{kv_qdq, KvCache};
use models::TransformerConfig;
use runtime::{MASK_SCALE, MASK_ZERO_POINT};

pub const CHUNK: usize = 4;
pub const CONTEXT: usize = 16;
/// Valid past tokens in the cache (the other past columns are masked).
pub const N_PAST: usize = 7;
/// RoPE table rows of the export (`mllm_qualcomm_max_length`).
pub const MAX_POSITIONS: usize = 1024;

/// `fixtures/<name>` of the workspace.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

/// A quantized checkpoint of a tiny model and its config.
pub struct AotModel {
    pub dir: PathBuf,
    pub hf: HfConfig,
    pub cfg: TransformerConfig,
    pub ckpt: SafetensorsCheckpoint,
    /// The directory a calibrated checkpoint was written to, removed on drop.
    _owned: Option<TempDir>,
}

impl AotModel {
    /// A quantized checkpoint directory as it is (pymllm's export).
    pub fn open(dir: PathBuf) -> AotModel {
        let hf = HfConfig::from_dir(&dir).unwrap_or_else(|e| panic!("{e}"));
        let cfg = TransformerConfig::from_hf(&hf, MAX_POSITIONS);
        let ckpt = SafetensorsCheckpoint::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        AotModel { dir, hf, cfg, ckpt, _owned: None }
    }

    /// The float fixture `fixtures/<name>`, calibrated on [`calibration_ids`] (mllm-compatible
    /// mode) and quantized (W4A16 LPBQ, KV8) into a temporary directory by [`aot::quantize`].
    pub fn calibrated(name: &str) -> AotModel {
        // The checkpoint goes inside the temporary directory, so its staging lock
        // (`.checkpoint.lock`, kept beside an output) goes with it on drop.
        let owned = TempDir::new(&format!("calibrated-{name}"));
        let out = owned.0.join("checkpoint");
        let hf = HfConfig::from_dir(fixture(name)).unwrap_or_else(|e| panic!("{e}"));
        aot::quantize(&QuantizeOptions {
            mode: CalibrationMode::MllmCompatible,
            max_positions: MAX_POSITIONS,
            ..QuantizeOptions::new(fixture(name), calibration_ids(hf.vocab_size), &out)
        })
        .unwrap_or_else(|e| panic!("calibrating {name}: {e:#}"));
        let mut model = AotModel::open(out);
        model._owned = Some(owned);
        model
    }

    /// The built-in W4A16 KV8 AOT config for this model's layer count.
    pub fn aot_config(&self) -> AotConfig {
        aot::load_aot_config(None, &self.hf).unwrap_or_else(|e| panic!("{e:#}")).0
    }

    /// The model traced with symbolic W4A16 parameters at `chunk` tokens, context [`CONTEXT`].
    pub fn traced(&self, chunk: usize) -> Program {
        self.traced_at(chunk, CONTEXT)
    }

    /// The model traced at `chunk` tokens over `context` positions.
    pub fn traced_at(&self, chunk: usize, context: usize) -> Program {
        aot::trace_graph(&self.hf, MAX_POSITIONS, chunk, context, ParamFormat::QnnW4A16)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// The program after the first `n` passes of the QNN AOT pipeline.
    pub fn compiled_through(&self, n: usize, chunk: usize) -> Program {
        let cfg = self.aot_config();
        let mut p = self.traced(chunk);
        for pass in Pipeline::qnn_aot(&cfg, &self.ckpt).passes().take(n) {
            pass.run(&mut p).unwrap_or_else(|e| panic!("{}: {e}", self.dir.display()));
        }
        p
    }

    /// The program after the whole pipeline (TensorRenaming).
    pub fn compiled(&self, chunk: usize) -> Program {
        self.compiled_through(usize::MAX, chunk)
    }

    /// The graphs `model.0.s<chunk>` for each of `chunks` over `context` positions, through the
    /// whole pipeline and lowered with `options` by one [`QnnLowering`] (as for one context).
    pub fn lowered_at(&self, chunks: &[usize], context: usize, options: LowerOptions) -> Vec<QnnGraph> {
        let cfg = self.aot_config();
        let mut lowering = QnnLowering::new(&self.ckpt, options);
        let mut graphs = Vec::new();
        for &chunk in chunks {
            let mut p = self.traced_at(chunk, context);
            Pipeline::qnn_aot(&cfg, &self.ckpt).run(&mut p).unwrap_or_else(|e| panic!("{}: {e}", self.dir.display()));
            graphs.extend(lowering.lower_program(&p).unwrap_or_else(|e| panic!("{e}")));
        }
        graphs
    }

    /// `model.0.s<CHUNK>` and `model.0.s1`, lowered by one `QnnLowering` (as for one context).
    pub fn lowered_pair(&self) -> (QnnGraph, QnnGraph) {
        let mut graphs = aot::lower_for_context(&self.dir, CHUNK, CONTEXT).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(graphs.len(), 2);
        let s1 = graphs.pop().unwrap();
        (graphs.pop().unwrap(), s1)
    }

    pub fn inputs(&self, chunk: usize) -> Inputs {
        Inputs::for_config(&self.cfg, chunk)
    }

    /// backend-cpu's interpreter in fake-quant mode on the post-pass IR: `[logits, K.., V..]`.
    pub fn run_cpu_fake_quant(&self, program: &Program, chunk: usize) -> Vec<Tensor> {
        let cfg = &self.cfg;
        let backend = CpuBackend::float();
        let store = CheckpointStore::open(&self.dir, backend.clone(), cfg.tie_word_embeddings).unwrap();
        let x = self.inputs(chunk);
        let (kvh, d, past) = (cfg.num_key_value_heads, cfg.head_dim, CONTEXT - chunk);
        let t = |data: Vec<f32>, shape: Vec<usize>, dtype: DType| {
            Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data.into()), backend.clone()).unwrap()
        };
        let ints = |v: &[i32], shape: Vec<usize>| {
            Tensor::from_i64(v.iter().map(|&i| i64::from(i)).collect::<Vec<_>>(), shape, DType::I32, backend.clone())
                .unwrap()
        };
        let mut inputs = vec![
            ints(&x.ids, vec![1, chunk]),
            ints(&x.positions, vec![chunk]),
            t(x.mask_real(), vec![1, 1, chunk, CONTEXT], DType::F32),
        ];
        let l = cfg.num_hidden_layers;
        for (i, codes) in x.kv_codes.iter().enumerate() {
            let (which, layer) = if i < l { (KvCache::Key, i) } else { (KvCache::Value, i - l) };
            let scale = QuantParamProvider::scalar_f32(&self.ckpt, &kv_qdq(layer, which).scale_key()).unwrap();
            let data = codes.iter().map(|&c| (i32::from(c) - 128) as f32 * scale).collect();
            let shape = if which == KvCache::Key { vec![1, kvh, d, past] } else { vec![1, kvh, past, d] };
            inputs.push(t(data, shape, DType::U8Sym));
        }
        Interpreter::new(program, &store, InterpMode::FakeQuant(&self.ckpt))
            .run(&inputs)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The QNN reference interpreter on `g` with the same inputs: `[logits, present K.., present V..]`.
    pub fn run_qnn(&self, g: &QnnGraph, chunk: usize) -> Vec<TensorValue> {
        let interp = QnnInterpreter::new(g).unwrap();
        interp.run(&self.qnn_inputs(g, chunk)).unwrap_or_else(|e| panic!("{}: {e}", g.name))
    }

    /// The fixed inputs of `g` as QNN values, in the graph's input order.
    pub fn qnn_inputs(&self, g: &QnnGraph, chunk: usize) -> Vec<TensorValue> {
        let x = self.inputs(chunk);
        let meta = |n: &str| g.tensor(n).unwrap_or_else(|| panic!("{}: no tensor `{n}`", g.name));
        let codes = |n: &str, v: Vec<i64>| TensorValue::from_codes(meta(n), v).unwrap();
        let mut values = vec![
            codes("input_ids", x.ids.iter().map(|&i| i64::from(i)).collect()),
            codes("position_ids", x.positions.iter().map(|&i| i64::from(i)).collect()),
            codes("attention_mask", x.mask_codes.iter().map(|&c| i64::from(c)).collect()),
        ];
        for (i, kv) in x.kv_codes.iter().enumerate() {
            values.push(codes(&g.inputs[3 + i], kv.iter().map(|&c| i64::from(c)).collect()));
        }
        values
    }

    /// SQNR (dB) of the lowered graph's logits (QNN reference interpreter) against the CPU
    /// fake-quant run of the same IR; also checks the new K/V codes are within one step.
    pub fn logits_sqnr(&self, g: &QnnGraph, chunk: usize) -> f64 {
        let qnn = self.run_qnn(g, chunk);
        let cpu = self.run_cpu_fake_quant(&self.compiled(chunk), chunk);
        let db = sqnr_db(&qnn[0].to_real().unwrap(), cpu[0].as_f32().unwrap());
        for (i, (q, c)) in qnn[1..].iter().zip(&cpu[1..]).enumerate() {
            let backend_qnn::Encoding::ScaleOffset(so) = q.encoding else { panic!("KV output {i} encoding") };
            let worst = q
                .to_real()
                .unwrap()
                .iter()
                .zip(c.as_f32().unwrap())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, |m: f32, d| if m.is_nan() || d.is_nan() { f32::NAN } else { m.max(d) });
            assert!(worst <= so.scale * 1.001, "{}: KV output {i} is {worst} off (step {})", g.name, so.scale);
        }
        db
    }
}

/// Deterministic calibration sequences: 4 × 24 token ids from a seeded xorshift, in `0..vocab`.
pub fn calibration_ids(vocab: usize) -> Vec<Vec<i64>> {
    let mut seed = 0x9e37_79b9u32;
    (0..4)
        .map(|_| {
            (0..24)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    i64::from(seed % vocab as u32)
                })
                .collect()
        })
        .collect()
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
    pub fn for_config(cfg: &TransformerConfig, chunk: usize) -> Inputs {
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

/// `10 log10(sum(ref^2) / sum((x - ref)^2))`.
pub fn sqnr_db(x: &[f32], reference: &[f32]) -> f64 {
    assert_eq!(x.len(), reference.len());
    let signal: f64 = reference.iter().map(|&r| f64::from(r).powi(2)).sum();
    let noise: f64 = x.iter().zip(reference).map(|(&a, &r)| (f64::from(a) - f64::from(r)).powi(2)).sum();
    10.0 * (signal / noise).log10()
}

/// Op type → count over a graph's nodes.
pub fn op_census(g: &QnnGraph) -> Vec<(String, usize)> {
    let mut by_type = std::collections::BTreeMap::<String, usize>::new();
    for n in &g.nodes {
        *by_type.entry(n.op_type.as_str().to_string()).or_default() += 1;
    }
    by_type.into_iter().collect()
}

/// A directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        // Unique per process and call: tests of one binary run in parallel.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("backend-qnn-{tag}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
