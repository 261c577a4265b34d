//! The tiny quantized Qwen3 of `fixtures/pymllm-qwen3-dev-f32` (pymllm's export) through the
//! shared AOT glue ([`model_common`], the `aot` library underneath): the pipeline, its lowering, fixed inputs and the CPU
//! fake-quant reference run, as free functions for the lowering and SDK tests.

#![allow(dead_code, unused_imports)]

#[path = "../model_common/mod.rs"]
pub mod model_common;

use std::sync::OnceLock;

use backend_qnn::interp::TensorValue;
use backend_qnn::QnnGraph;
use checkpoint::SafetensorsCheckpoint;
use compiler::aot_config::AotConfig;
use mllm_dsl::{Program, Tensor};
use models::TransformerConfig;
use runtime::{ChunkInputs, ChunkModel, ChunkOutputs, ModelError, ModelLayout};
use std::path::PathBuf;

pub use model_common::{sqnr_db, AotModel, Inputs, TempDir, CHUNK, CONTEXT, MAX_POSITIONS, N_PAST};

/// The pymllm Qwen3 checkpoint, opened once per test binary.
pub fn model() -> &'static AotModel {
    static MODEL: OnceLock<AotModel> = OnceLock::new();
    MODEL.get_or_init(|| AotModel::open(fixture()))
}

pub fn fixture() -> PathBuf {
    model_common::fixture("pymllm-qwen3-dev-f32")
}

pub fn model_config() -> TransformerConfig {
    model().cfg.clone()
}

pub fn aot_config() -> AotConfig {
    model().aot_config()
}

pub fn checkpoint() -> SafetensorsCheckpoint {
    SafetensorsCheckpoint::open(fixture()).unwrap()
}

pub fn traced(chunk: usize) -> Program {
    model().traced(chunk)
}

/// The program after the first `n` passes of the QNN AOT pipeline.
pub fn compiled_through(n: usize, chunk: usize) -> Program {
    model().compiled_through(n, chunk)
}

/// The program after the whole pipeline (TensorRenaming).
pub fn compiled(chunk: usize) -> Program {
    model().compiled(chunk)
}

/// `model.0.s4` and `model.0.s1`, lowered by one `QnnLowering` (as for one context).
pub fn lowered_pair() -> (QnnGraph, QnnGraph) {
    model().lowered_pair()
}

impl Inputs {
    /// The fixed inputs of [`model_common::Inputs`] for this model.
    pub fn new(chunk: usize) -> Inputs {
        model().inputs(chunk)
    }
}

/// backend-cpu's interpreter in fake-quant mode on the post-pass IR: `[logits, K.., V..]`.
pub fn run_cpu_fake_quant(program: &Program, chunk: usize) -> Vec<Tensor> {
    model().run_cpu_fake_quant(program, chunk)
}

/// The QNN reference interpreter's outputs `[logits, present K.., present V..]`.
pub fn run_qnn(g: &QnnGraph, chunk: usize) -> Vec<TensorValue> {
    model().run_qnn(g, chunk)
}

/// Which logit rows of each chunk a [`Capture`] keeps.
#[derive(Clone, Copy)]
pub enum CaptureRows {
    /// The rows the runtime reads ([`ChunkInputs::logit_rows`]).
    Read,
    /// Every real (non-padding) position of the chunk.
    Valid,
}

/// A chunk model that keeps a copy of the logit rows (see [`CaptureRows`]) of every chunk it ran.
pub struct Capture<M> {
    pub inner: M,
    pub rows: CaptureRows,
    pub logits: Vec<Vec<f32>>,
}

impl<M> Capture<M> {
    pub fn new(inner: M, rows: CaptureRows) -> Self {
        Capture { inner, rows, logits: vec![] }
    }
}

impl<M: ChunkModel> ChunkModel for Capture<M> {
    type Kv = M::Kv;
    fn layout(&self) -> ModelLayout {
        self.inner.layout()
    }
    fn supports_chunk_len(&self, ar: usize) -> bool {
        self.inner.supports_chunk_len(ar)
    }
    fn run_chunk(&mut self, i: &ChunkInputs<'_, M::Kv>, o: &mut ChunkOutputs<M::Kv>) -> Result<(), ModelError> {
        self.inner.run_chunk(i, o)?;
        let vocab = self.layout().vocab_size;
        let rows = match self.rows {
            CaptureRows::Read => i.logit_rows(),
            CaptureRows::Valid => 0..i.n_valid(),
        };
        for row in rows {
            self.logits.push(o.logits()[row * vocab..(row + 1) * vocab].to_vec());
        }
        Ok(())
    }
}
