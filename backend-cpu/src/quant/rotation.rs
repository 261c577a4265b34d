//! Rotations folded into a float checkpoint before calibration (QuaRot / SpinQuant's R1 and R2):
//! the float model computes the same logits, but its residual stream and V/O heads are spread by
//! orthogonal matrices, so no channel holds a massive outlier for the int4 weights and the u16
//! activations to absorb.
//!
//! ```no_run
//! use backend_cpu::quant::rotation::rotate_checkpoint;
//! let hf = models::hf::HfConfig::from_dir("fixtures/qwen3-dev-f32")?;
//! let summary = rotate_checkpoint("fixtures/qwen3-dev-f32".as_ref(), &hf, "/tmp/rotated".as_ref())?;
//! println!("{}", summary.describe());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! With residual rows `x` rotated to `x·Q` (`Q` orthogonal, `hidden × hidden`):
//! 1. every RMSNorm's weight `g` is folded into the linears that read its output (q/k/v by
//!    `input_layernorm`, gate/up by `post_attention_layernorm`, lm_head by `model.norm`):
//!    `W ← W·diag(g)`, then `g ← 1`, so the norm commutes with `Q` (`rms(x·Q) = rms(x)`);
//! 2. R1: the embedding `E ← E·Q`, linears reading the residual `W ← W·Q` (input side), linears
//!    writing it (o_proj, down_proj) `W ← Qᵀ·W` and their biases `b ← Qᵀ·b`;
//! 3. R2: per head, V's rows `W_v[h] ← Hᵀ·W_v[h]` (and bias) and O's input columns
//!    `W_o[:, h] ← W_o[:, h]·H` (`H` orthogonal, `head_dim × head_dim`), cancelling through the
//!    attention's weighted sum of V.
//!
//! The result is an ordinary HF float checkpoint (f32), written through `mllm_dsl::files`: only
//! weights change, so calibration, the QNN lowering and pymllm's checkpoint format see nothing
//! new. A tied lm_head stops being tied (the final norm is folded into it but not into the
//! embedding): `lm_head.weight` is written and `config.json` says `tie_word_embeddings: false`.
//! The orthogonal matrices are randomized Hadamard matrices where one can be built
//! ([`super::hadamard`]), from a fixed seed.

use std::collections::BTreeMap;
use std::path::Path;

use checkpoint::{write_safetensors_atomic, CheckpointError, SafetensorsCheckpoint, StDtype, TensorBytes};
use mllm_dsl::files::{read_text_bounded, write_atomic_bytes, write_json_atomic, CONFIG_SIZE_LIMIT};
use models::hf::HfConfig;

use super::error::QuantizationError;
use super::hadamard::{orthogonal, Orthogonal, OrthogonalKind};
use crate::kernels::linear_kn;

/// Which rotation is folded into the weights before calibration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rotation {
    /// The checkpoint as it is.
    #[default]
    None,
    /// R1 on the residual stream and R2 per V/O head, randomized Hadamard matrices.
    Hadamard,
}

impl Rotation {
    pub fn name(self) -> &'static str {
        match self {
            Rotation::None => "none",
            Rotation::Hadamard => "hadamard",
        }
    }
}

/// A rotation name other than none or hadamard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown rotation `{name}`; expected none or hadamard")]
pub struct UnknownRotation {
    pub name: String,
}

impl std::str::FromStr for Rotation {
    type Err = UnknownRotation;
    fn from_str(s: &str) -> Result<Self, UnknownRotation> {
        match s {
            "none" => Ok(Rotation::None),
            "hadamard" => Ok(Rotation::Hadamard),
            other => Err(UnknownRotation { name: other.to_string() }),
        }
    }
}

/// Seeds of the random signs (R1 and R2 get different ones).
const RESIDUAL_SEED: u64 = 0x5EED_0001;
const HEAD_SEED: u64 = 0x5EED_0002;

/// What [`rotate_checkpoint`] folded in.
#[derive(Clone, Debug, PartialEq)]
pub struct RotationSummary {
    pub hidden: usize,
    pub head_dim: usize,
    /// R1's construction.
    pub residual: OrthogonalKind,
    /// R2's construction.
    pub head: OrthogonalKind,
    /// The lm_head was tied to the embedding and is now its own tensor.
    pub untied: bool,
}

impl RotationSummary {
    pub fn describe(&self) -> String {
        format!(
            "R1 (residual, {}): {}; R2 (per V/O head, {}): {}{}",
            self.hidden,
            self.residual.describe(),
            self.head_dim,
            self.head.describe(),
            if self.untied { "; lm_head untied from the embedding" } else { "" }
        )
    }
}

/// The float checkpoint of `src` (config `hf`) with [`Rotation::Hadamard`] folded in, written into `out`
/// (created if needed) as `model.safetensors` (f32) and `config.json`, plus the generation
/// config and tokenizer files next to the source, so `out` is a complete HF directory.
pub fn rotate_checkpoint(src: &Path, hf: &HfConfig, out: &Path) -> Result<RotationSummary, QuantizationError> {
    let problem = |key: &str, problem: String| QuantizationError::Param { key: key.to_string(), problem };
    hf.model_kind().map_err(|e| problem(&hf.source.display().to_string(), e.to_string()))?;
    let ckpt = SafetensorsCheckpoint::open(src)?;
    if super::is_quantized_checkpoint(&ckpt) {
        return Err(problem(
            &src.display().to_string(),
            "holds a quantized checkpoint; rotations are folded into the float one".into(),
        ));
    }
    let mut tensors = Tensors::read(&ckpt, hf)?;
    let untied = !tensors.0.contains_key(LM_HEAD);
    if untied {
        let embedding = tensors.get(EMBED)?.clone();
        tensors.0.insert(LM_HEAD.to_string(), embedding);
    }
    let r1 = orthogonal(hf.hidden_size, RESIDUAL_SEED);
    let r2 = orthogonal(hf.head_dim, HEAD_SEED);
    fold_norms(&mut tensors, hf)?;
    rotate_residual(&mut tensors, hf, &r1)?;
    rotate_heads(&mut tensors, hf, &r2)?;
    std::fs::create_dir_all(out).map_err(|e| QuantizationError::io(out, e))?;
    write_checkpoint(&tensors, out)?;
    write_config(&hf.source, out)?;
    for name in ["generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"] {
        let from = src.join(name);
        if from.is_file() {
            let bytes = std::fs::read(&from).map_err(|e| QuantizationError::io(&from, e))?;
            write_atomic_bytes(&out.join(name), &bytes).map_err(CheckpointError::from)?;
        }
    }
    Ok(RotationSummary { hidden: r1.n, head_dim: r2.n, residual: r1.kind, head: r2.kind, untied })
}

use models::keys::{
    layer_key, split_layer_key, EMBED_TOKENS as EMBED, FINAL_NORM, LAYER_NORM_READERS as NORM_READERS,
    LAYER_OFF_RESIDUAL as UNROTATED, LAYER_O_PROJ, LAYER_RESIDUAL_WRITERS as RESIDUAL_WRITERS, LAYER_V_PROJ, LM_HEAD,
};
// The rotations leave `UNROTATED` as they are: Qwen3's per-head q/k norms act after the projections,
// in head space, which R1 does not touch and R2 leaves to V/O.

/// Every tensor of the checkpoint as `(shape, f32 values)`, by key.
struct Tensors(BTreeMap<String, (Vec<usize>, Vec<f32>)>);

impl Tensors {
    /// Reads every tensor, refusing keys a rotation would have to know about but does not.
    fn read(ckpt: &SafetensorsCheckpoint, hf: &HfConfig) -> Result<Self, QuantizationError> {
        let known = |key: &str| -> bool {
            if [EMBED, LM_HEAD, FINAL_NORM].contains(&key) || key.ends_with("rotary_emb.inv_freq") {
                return true;
            }
            let Some((layer, name)) = split_layer_key(key) else { return false };
            let in_range = layer < hf.num_hidden_layers;
            let linears = NORM_READERS.iter().flat_map(|(_, l)| l.iter()).chain(RESIDUAL_WRITERS.iter());
            in_range
                && (NORM_READERS.iter().any(|(norm, _)| name == format!("{norm}.weight"))
                    || UNROTATED.contains(&name)
                    || linears.into_iter().any(|l| name == format!("{l}.weight") || name == format!("{l}.bias")))
        };
        let mut map = BTreeMap::new();
        for key in ckpt.keys() {
            if !known(key) {
                return Err(QuantizationError::Param {
                    key: key.to_string(),
                    problem: format!(
                        "{}: a tensor the rotation does not know how to rotate (it knows the embedding, the \
                         norms, q/k/v/o, gate/up/down and lm_head of the llama/qwen2/qwen3 decoder)",
                        ckpt.root().display()
                    ),
                });
            }
            let (_, shape) = ckpt.info(key)?;
            map.insert(key.to_string(), (shape.to_vec(), ckpt.read_float_param(key)?));
        }
        Ok(Tensors(map))
    }

    fn get(&self, key: &str) -> Result<&(Vec<usize>, Vec<f32>), QuantizationError> {
        self.0.get(key).ok_or_else(|| QuantizationError::Param {
            key: key.to_string(),
            problem: "missing from the checkpoint, but the rotation must rotate it".into(),
        })
    }

    /// The tensor at `key` as a `rows × cols` matrix (`[rows, cols]`, or `[rows]` when `cols` is 1).
    fn matrix(&mut self, key: &str, rows: usize, cols: usize) -> Result<&mut Vec<f32>, QuantizationError> {
        self.get(key)?;
        let (shape, values) = self.0.get_mut(key).expect("checked above");
        let expected: &[usize] = if cols == 1 { &[rows] } else { &[rows, cols] };
        if shape != expected {
            return Err(QuantizationError::Param {
                key: key.to_string(),
                problem: format!("shape {shape:?}, expected {expected:?} from config.json"),
            });
        }
        Ok(values)
    }
}

/// `W[.., j] *= g[j]` for every reader of each norm, then `g = 1`.
fn fold_norms(t: &mut Tensors, hf: &HfConfig) -> Result<(), QuantizationError> {
    let h = hf.hidden_size;
    let mut folds: Vec<(String, Vec<String>)> = vec![(FINAL_NORM.into(), vec![LM_HEAD.into()])];
    for i in 0..hf.num_hidden_layers {
        for (norm, readers) in NORM_READERS {
            let readers = readers.iter().map(|r| layer_key(i, &format!("{r}.weight"))).collect();
            folds.push((layer_key(i, &format!("{norm}.weight")), readers));
        }
    }
    for (norm, readers) in folds {
        let g = std::mem::replace(t.matrix(&norm, h, 1)?, vec![1.0; h]);
        for reader in readers {
            let rows = t.get(&reader)?.1.len() / h;
            for row in t.matrix(&reader, rows, h)?.chunks_exact_mut(h) {
                row.iter_mut().zip(&g).for_each(|(w, g)| *w *= g);
            }
        }
    }
    Ok(())
}

/// R1: `E·Q`, readers `W·Q`, writers `Qᵀ·W` and `Qᵀ·b`.
fn rotate_residual(t: &mut Tensors, hf: &HfConfig, q: &Orthogonal) -> Result<(), QuantizationError> {
    let h = hf.hidden_size;
    let qt = transposed(q, h)?;
    let mut readers = vec![EMBED.to_string(), LM_HEAD.to_string()];
    let mut writers = Vec::new();
    for i in 0..hf.num_hidden_layers {
        readers.extend(NORM_READERS.iter().flat_map(|(_, l)| l.iter()).map(|l| layer_key(i, l)));
        writers.extend(RESIDUAL_WRITERS.iter().map(|l| layer_key(i, l)));
    }
    for key in readers {
        let key = if key.ends_with(".weight") { key } else { format!("{key}.weight") };
        let rows = t.get(&key)?.1.len() / h;
        let w = t.matrix(&key, rows, h)?;
        *w = product(&key, w, rows, h, &q.data, h)?;
    }
    for op in writers {
        let key = format!("{op}.weight");
        let cols = t.get(&key)?.1.len() / h;
        let w = t.matrix(&key, h, cols)?;
        *w = product(&key, &qt, h, h, w, cols)?;
        let bias = format!("{op}.bias");
        if t.0.contains_key(&bias) {
            // Qᵀ·b as the row bᵀ·Q.
            let b = t.matrix(&bias, h, 1)?;
            *b = product(&bias, b, 1, h, &q.data, h)?;
        }
    }
    Ok(())
}

/// R2: each KV head's V rows `Hᵀ·W_v[h]` (and bias), each attention head's O columns `W_o[:, h]·H`.
fn rotate_heads(t: &mut Tensors, hf: &HfConfig, r: &Orthogonal) -> Result<(), QuantizationError> {
    let (h, d) = (hf.hidden_size, hf.head_dim);
    let rt = transposed(r, d)?;
    for i in 0..hf.num_hidden_layers {
        let v = layer_key(i, &format!("{LAYER_V_PROJ}.weight"));
        let w = t.matrix(&v, hf.num_key_value_heads * d, h)?;
        for head in w.chunks_exact_mut(d * h) {
            let rotated = product(&v, &rt, d, d, head, h)?;
            head.copy_from_slice(&rotated);
        }
        let v_bias = layer_key(i, &format!("{LAYER_V_PROJ}.bias"));
        if t.0.contains_key(&v_bias) {
            let b = t.matrix(&v_bias, hf.num_key_value_heads * d, 1)?;
            // Hᵀ·b per head, as the rows bᵀ·H.
            *b = product(&v_bias, b, hf.num_key_value_heads, d, &r.data, d)?;
        }
        let o = layer_key(i, &format!("{LAYER_O_PROJ}.weight"));
        let w = t.matrix(&o, h, hf.num_attention_heads * d)?;
        // Each row of W_o is the heads' column blocks side by side: rows of d values.
        *w = product(&o, w, h * hf.num_attention_heads, d, &r.data, d)?;
    }
    Ok(())
}

/// `a[m, k] · b[k, n]`.
fn product(key: &str, a: &[f32], m: usize, k: usize, b: &[f32], n: usize) -> Result<Vec<f32>, QuantizationError> {
    linear_kn(a, m, k, b, n, None)
        .map_err(|e| QuantizationError::Param { key: key.to_string(), problem: format!("rotating: {e}") })
}

/// `Qᵀ` of the square `n x n` rotation `q`.
fn transposed(q: &Orthogonal, n: usize) -> Result<Vec<f32>, QuantizationError> {
    crate::kernels::transpose_2d(&q.data, n, n)
        .map_err(|e| QuantizationError::Report(format!("transposing the {n} x {n} rotation: {e}")))
}

fn write_checkpoint(t: &Tensors, out: &Path) -> Result<(), QuantizationError> {
    let all: Vec<TensorBytes<'_>> =
        t.0.iter()
            .map(|(k, (shape, v))| (k.as_str(), StDtype::F32, shape.as_slice(), bytemuck::cast_slice(v)))
            .collect();
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(out.join("model.safetensors"), &all, &metadata)?;
    Ok(())
}

/// The source `config.json` with `tie_word_embeddings: false` and the f32 dtype the file now has.
fn write_config(source: &Path, out: &Path) -> Result<(), QuantizationError> {
    let text = read_text_bounded(source, CONFIG_SIZE_LIMIT).map_err(CheckpointError::from)?;
    let bad = |problem: String| QuantizationError::Param { key: source.display().to_string(), problem };
    let mut config: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let obj = config.as_object_mut().ok_or_else(|| bad("expected a JSON object".into()))?;
    obj.insert("tie_word_embeddings".into(), serde_json::json!(false));
    for dtype in ["torch_dtype", "dtype"] {
        if obj.contains_key(dtype) {
            obj.insert(dtype.into(), serde_json::json!("float32"));
        }
    }
    write_json_atomic(&out.join("config.json"), &config).map_err(CheckpointError::from)?;
    Ok(())
}
