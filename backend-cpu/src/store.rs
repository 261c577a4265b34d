//! [`CheckpointStore`]: a [`WeightStore`] over a safetensors checkpoint, for HF float checkpoints and
//! for pymllm's quantized exports alike.
//!
//! Layers ask for parameters in the layout the model file uses; the store converts:
//! - HF linear weights `[out, in]` → the 1×1 conv's HWIO `[1, 1, in, out]`;
//! - a tied `lm_head.weight` (absent from HF checkpoints) → `model.embed_tokens.weight`;
//! - pymllm LPBQ weights (int8 nibbles `[1, 1, in, out]` + `scale1` + `scale2`) → int4 codes packed
//!   two per byte for the W4A16 kernels, whose values are the deployed `signext4(q) * scale1 * scale2`
//!   ([`QuantizedWeights::Packed`], the default), or those values decoded to f32 ([`QuantizedWeights::F32`]);
//! - per-channel int8 linear weights (int8 codes `[1, 1, in, out]` + `scale` `[out]`, no `scale1`;
//!   the linears a mixed-precision recipe raises) → their values `q * scale`, packed as f32;
//! - pymllm uint16 norm / embedding weights and RoPE tables → `(q - zero_point) * scale`.
//!
//! Float (f32 / bf16 / f16) linear, conv and embedding weights stored as HF rows `[out, in]` /
//! `[vocab, hidden]` become [`PackedWeight`]s: packed once for the linear kernels, bf16 kept as bf16
//! (exact, half the memory traffic), f16 widened to f32 (exact). A tied LM head and the embedding
//! share one packed matrix.

use crate::kernels::{Int4Packer, PackedMatrix};
use crate::packed_weight::{PackedWeight, WeightView};
use crate::u16_table::U16Table;
use checkpoint::{CheckpointError, SafetensorsCheckpoint, StDtype};
use compiler::quant::int8_channel::Int8Channel;
use compiler::quant::lpbq::{LpbqExport, LpbqShape, SCALE1_STEPS};
use half::bf16;
use mllm_dsl::ir::SpecParams;
use mllm_dsl::module::{ParamRequest, ParamRole, WeightStore};
use mllm_dsl::{BackendRef, Error, Result, Tensor};
use models::hf::HfConfig;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// How a [`CheckpointStore`] holds the quantized weights of a quantized checkpoint. Both give the
/// same weight values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantizedWeights {
    /// LPBQ linears as 4-bit codes packed two per byte with their block scales (multiplied by the
    /// W4A16 kernels); uint16 embedding tables as their codes ([`U16Table`]).
    #[default]
    Packed,
    /// Both decoded to f32 at load (8× the bytes of the int4 codes, 2× those of the uint16 codes).
    F32,
}

pub struct CheckpointStore {
    ckpt: SafetensorsCheckpoint,
    quantized: QuantizedWeights,
    backend: BackendRef,
    tie_word_embeddings: bool,
    /// Packed matrices by checkpoint key, so two parameters reading one tensor share it.
    packed: Mutex<HashMap<String, Arc<PackedMatrix>>>,
    /// Bytes of LPBQ weights decoded to f32 ([`QuantizedWeights::F32`]).
    decoded_bytes: AtomicUsize,
}

impl CheckpointStore {
    pub fn open(dir: impl AsRef<Path>, backend: BackendRef, tie_word_embeddings: bool) -> Result<Self> {
        let ckpt = SafetensorsCheckpoint::open(dir).map_err(|e| Error::msg(e.to_string()))?;
        Ok(CheckpointStore {
            ckpt,
            quantized: QuantizedWeights::default(),
            backend,
            tie_word_embeddings,
            packed: Mutex::new(HashMap::new()),
            decoded_bytes: AtomicUsize::new(0),
        })
    }

    /// The store holding quantized weights as `quantized` says.
    pub fn with_quantized(mut self, quantized: QuantizedWeights) -> Self {
        self.quantized = quantized;
        self
    }

    /// [`CheckpointStore::open`] for the checkpoint `config` describes, after checking the two
    /// agree ([`checkpoint::check_config`]: layer count, embedding and attention widths), so a
    /// mismatched config fails before a model is built from it.
    pub fn for_config(dir: impl AsRef<Path>, backend: BackendRef, config: &HfConfig) -> Result<Self> {
        let store = Self::open(dir, backend, config.tie_word_embeddings)?;
        checkpoint::check_config(&store.ckpt, config).map_err(|e| Error::msg(e.to_string()))?;
        Ok(store)
    }

    pub fn checkpoint(&self) -> &SafetensorsCheckpoint {
        &self.ckpt
    }

    /// Bytes of the weight matrices loaded so far for linear kernels: packed matrices (bf16, f32,
    /// int4 with its scales; a tied embedding counted once, as the LM head) and LPBQ weights
    /// decoded to f32. A decode step reads each of them once.
    pub fn matrix_bytes(&self) -> usize {
        let packed = self.packed.lock().unwrap_or_else(PoisonError::into_inner);
        packed.values().map(|m| m.bytes()).sum::<usize>() + self.decoded_bytes.load(Ordering::Relaxed)
    }

    /// Checkpoint tensors no layer asked for (worth a warning: a wrong model file or config).
    /// Bookkeeping entries of pymllm exports (observer state) are not listed.
    pub fn unused_keys(&self) -> Vec<String> {
        self.ckpt.unused_keys().into_iter().filter(|k| !is_bookkeeping(k)).map(str::to_string).collect()
    }

    fn err(&self, req: &ParamRequest<'_>, e: CheckpointError) -> Error {
        Error::Weight {
            key: req.key.to_string(),
            module_path: req.module_path.to_string(),
            message: e.requested_by(req.module_path).to_string(),
        }
    }

    fn mismatch(&self, req: &ParamRequest<'_>, key: &str, found: &[usize], expected: String) -> Error {
        Error::Weight {
            key: req.key.to_string(),
            module_path: req.module_path.to_string(),
            message: format!("checkpoint tensor `{key}` has shape {found:?}; expected {expected}"),
        }
    }

    fn f32(&self, req: &ParamRequest<'_>, key: &str) -> Result<Vec<f32>> {
        self.ckpt.read_float_param(key).map_err(|e| self.err(req, e))
    }

    /// `(scale, zero_point)` of a per-tensor uint16 tensor stored by pymllm.
    fn scale_zp(&self, req: &ParamRequest<'_>, prefix: &str) -> Result<(f32, i32)> {
        let scale = self.f32(req, &SpecParams::scale_key(prefix))?;
        let zp = self.ckpt.read_i32(&SpecParams::zero_point_key(prefix)).map_err(|e| self.err(req, e))?;
        match (scale.as_slice(), zp.as_slice()) {
            ([s], [z]) if *s > 0.0 && s.is_finite() => Ok((*s, *z)),
            _ => Err(Error::Weight {
                key: req.key.to_string(),
                module_path: req.module_path.to_string(),
                message: format!(
                    "`{prefix}.scale` / `.zero_point` must be one positive finite scale and one zero point, found \
                     {scale:?} / {zp:?}"
                ),
            }),
        }
    }

    /// The checkpoint key that holds `req`'s data (a tied LM head reads the embedding).
    fn source_key<'a>(&self, req: &ParamRequest<'a>) -> &'a str {
        models::keys::data_key(req.key, self.tie_word_embeddings, |k| self.ckpt.contains(k))
    }

    /// `req` as a packed weight when it is a float matrix stored as HF rows `[N, K]` that a conv
    /// (`[1, 1, K, N]`), linear (`[N, K]`) or embedding (`[N, K]`) layer asks for; `None` otherwise.
    fn load_packed(&self, req: &ParamRequest<'_>) -> Result<Option<PackedWeight>> {
        let key = self.source_key(req);
        let (dtype, shape) = self.ckpt.info(key).map_err(|e| self.err(req, e))?;
        if dtype == StDtype::I8 && req.role == ParamRole::Conv2dWeight && self.quantized == QuantizedWeights::Packed {
            if shape != req.shape {
                let shape = shape.to_vec();
                return Err(self.mismatch(req, key, &shape, format!("{:?} (LPBQ HWIO)", req.shape)));
            }
            let (cin, cout) = (req.shape[2], req.shape[3]);
            let matrix = match self.int8_channel(req, key, cin, cout)? {
                Some(q) => {
                    let packed = PackedMatrix::from_rows_f32(cout, cin, &q.decode())
                        .map_err(|e| self.weight_error(req, format!("packing the int8 weight `{key}`: {e}")))?;
                    Arc::new(packed)
                }
                None => Arc::new(self.pack_lpbq(req, key, cin, cout)?),
            };
            let mut cache = self.packed.lock().unwrap_or_else(PoisonError::into_inner);
            cache.insert(key.to_string(), matrix.clone());
            return Ok(Some(PackedWeight { matrix, view: WeightView::KN }));
        }
        if !matches!(dtype, StDtype::F32 | StDtype::BF16 | StDtype::F16) {
            return Ok(None);
        }
        let (n, k, view) = match (req.role, req.shape) {
            (ParamRole::Conv2dWeight, &[1, 1, cin, cout]) => (cout, cin, WeightView::KN),
            (ParamRole::LinearWeight | ParamRole::EmbeddingWeight, &[n, k]) => (n, k, WeightView::NK),
            _ => return Ok(None),
        };
        if shape != [n, k] {
            return Ok(None);
        }
        let mut cache = self.packed.lock().unwrap_or_else(PoisonError::into_inner);
        let matrix = match cache.get(key) {
            Some(m) => m.clone(),
            None => {
                let bad = |e: crate::kernels::KernelError| Error::Weight {
                    key: req.key.to_string(),
                    module_path: req.module_path.to_string(),
                    message: format!("packing checkpoint tensor `{key}`: {e}"),
                };
                let packed = if dtype == StDtype::BF16 {
                    let v = self.ckpt.read_typed::<bf16>(key).map_err(|e| self.err(req, e))?;
                    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                        let path = self.ckpt.root().to_path_buf();
                        let e = CheckpointError::NonFinite { key: key.into(), path, index: i, value: v[i].to_f32() };
                        return Err(self.err(req, e));
                    }
                    PackedMatrix::from_rows_bf16(n, k, bytemuck::cast_slice(&v)).map_err(bad)?
                } else {
                    PackedMatrix::from_rows_f32(n, k, &self.f32(req, key)?).map_err(bad)?
                };
                let m = Arc::new(packed);
                cache.insert(key.to_string(), m.clone());
                m
            }
        };
        Ok(Some(PackedWeight { matrix, view }))
    }

    /// A uint16 embedding table `[N, K]` kept as its codes ([`QuantizedWeights::Packed`]); `None`
    /// for anything else.
    fn load_u16_table(&self, req: &ParamRequest<'_>) -> Result<Option<U16Table>> {
        let key = self.source_key(req);
        let (dtype, shape) = self.ckpt.info(key).map_err(|e| self.err(req, e))?;
        let (ParamRole::EmbeddingWeight, StDtype::U16, QuantizedWeights::Packed, &[n, k]) =
            (req.role, dtype, self.quantized, req.shape)
        else {
            return Ok(None);
        };
        if shape != [n, k] {
            let shape = shape.to_vec();
            return Err(self.mismatch(req, key, &shape, format!("{:?}", req.shape)));
        }
        let (scale, zp) = self.scale_zp(req, key.trim_end_matches(".weight"))?;
        // Served from the checkpoint's memory map: only the rows a lookup gathers become resident.
        let (_, codes) = self.ckpt.mapped_bytes(key).map_err(|e| self.err(req, e))?;
        U16Table::from_le_bytes(codes, n, k, scale, zp).map(Some).map_err(|e| self.weight_error(req, e.to_string()))
    }

    fn load_data(&self, req: &ParamRequest<'_>) -> Result<Vec<f32>> {
        let key = self.source_key(req);
        let (dtype, shape) = self.ckpt.info(key).map_err(|e| self.err(req, e))?;
        let shape = shape.to_vec();
        let numel: usize = req.shape.iter().product();
        match (req.role, dtype) {
            (ParamRole::Conv2dWeight, StDtype::I8) => {
                let (cin, cout) = (req.shape[2], req.shape[3]);
                if shape != req.shape {
                    return Err(self.mismatch(req, key, &shape, format!("{:?} (LPBQ HWIO)", req.shape)));
                }
                if let Some(q) = self.int8_channel(req, key, cin, cout)? {
                    let w = q.decode_hwio();
                    self.decoded_bytes.fetch_add(w.len() * 4, Ordering::Relaxed);
                    return Ok(w);
                }
                self.decode_lpbq(req, key, cin, cout)
            }
            (ParamRole::Conv2dWeight, _) => {
                // HF [out, in] → HWIO [1, 1, in, out].
                let (cin, cout) = (req.shape[2], req.shape[3]);
                if shape != [cout, cin] && shape != req.shape {
                    return Err(self.mismatch(
                        req,
                        key,
                        &shape,
                        format!("[{cout}, {cin}] (HF) or {:?} (HWIO)", req.shape),
                    ));
                }
                let w = self.f32(req, key)?;
                if shape == req.shape {
                    Ok(w)
                } else {
                    out_in_to_hwio(req, &w, cin, cout)
                }
            }
            (_, StDtype::U16) => {
                if shape.iter().product::<usize>() != numel {
                    return Err(self.mismatch(req, key, &shape, format!("{:?}", req.shape)));
                }
                let prefix = match req.role {
                    // Tables are pre-quantized with the model's sin/cos QDQ parameters.
                    ParamRole::RopeTable => match models::keys::rope_table_qdq(key) {
                        Some(point) => format!("{point}.fake_quant"),
                        None => {
                            return Err(Error::Weight {
                                key: req.key.to_string(),
                                module_path: req.module_path.to_string(),
                                message: format!("`{key}` is not a RoPE table the model files declare"),
                            })
                        }
                    },
                    _ => key.trim_end_matches(".weight").to_string(),
                };
                let (scale, zp) = self.scale_zp(req, &prefix)?;
                let q = self.ckpt.read_u16(key).map_err(|e| self.err(req, e))?;
                Ok(q.iter().map(|&q| (q as i32 - zp) as f32 * scale).collect())
            }
            _ => {
                if shape != req.shape {
                    return Err(self.mismatch(req, key, &shape, format!("{:?}", req.shape)));
                }
                self.f32(req, key)
            }
        }
    }

    /// A per-channel int8 linear weight (HWIO codes `key`, scales `<op>.scale` f32 `[Out]`, no
    /// `<op>.scale1`), checked; `None` when `key` is an LPBQ weight.
    fn int8_channel(&self, req: &ParamRequest<'_>, key: &str, cin: usize, cout: usize) -> Result<Option<Int8Channel>> {
        let prefix = key.trim_end_matches(".weight");
        let scales_key = SpecParams::scale_key(prefix);
        if self.ckpt.contains(&SpecParams::lpbq_scale1_key(prefix)) || !self.ckpt.contains(&scales_key) {
            return Ok(None);
        }
        let scales = self.f32(req, &scales_key)?;
        let codes = self.ckpt.read_i8(key).map_err(|e| self.err(req, e))?;
        Int8Channel::from_parts(cout, cin, codes, scales)
            .map(Some)
            .map_err(|e| self.weight_error(req, format!("int8 weight `{key}` with scales `{scales_key}`: {e}")))
    }

    /// An LPBQ weight's `scale1` (checked to be whole blocks per channel), `scale2` and shape.
    fn lpbq_scales(
        &self,
        req: &ParamRequest<'_>,
        key: &str,
        cin: usize,
        cout: usize,
    ) -> Result<(Vec<u8>, Vec<f32>, LpbqShape)> {
        let prefix = key.trim_end_matches(".weight");
        let s1 = self.ckpt.read_u8(&SpecParams::lpbq_scale1_key(prefix)).map_err(|e| self.err(req, e))?;
        let s2 = self.f32(req, &SpecParams::lpbq_scale2_key(prefix))?;
        let bad = |m: String| self.weight_error(req, m);
        // scale1 holds one value per block of every output channel: that fixes the block size.
        let blocks = s1.len().checked_div(cout).unwrap_or(0);
        if blocks == 0 || !s1.len().is_multiple_of(cout) || !cin.is_multiple_of(blocks) {
            return Err(bad(format!(
                "LPBQ scale1 has {} values, which is no whole number of blocks per channel for [in {cin}, out {cout}]",
                s1.len()
            )));
        }
        let shape = LpbqShape::new(cout, cin, cin / blocks).map_err(|e| bad(e.to_string()))?;
        Ok((s1, s2, shape))
    }

    fn weight_error(&self, req: &ParamRequest<'_>, message: String) -> Error {
        Error::Weight { key: req.key.to_string(), module_path: req.module_path.to_string(), message }
    }

    /// Deployed LPBQ values (`signext4(q) * scale1 * scale2`, decoded by `compiler::quant::lpbq`) in HWIO.
    fn decode_lpbq(&self, req: &ParamRequest<'_>, key: &str, cin: usize, cout: usize) -> Result<Vec<f32>> {
        let (scale1, scale2, shape) = self.lpbq_scales(req, key, cin, cout)?;
        let q = self.ckpt.read_i8(key).map_err(|e| self.err(req, e))?;
        let w = LpbqExport { shape, weight_hwio: q, scale1, scale2 }
            .decode_hwio()
            .map_err(|e| self.weight_error(req, e.to_string()))?;
        self.decoded_bytes.fetch_add(w.len() * 4, Ordering::Relaxed);
        Ok(w)
    }

    /// An LPBQ weight as int4 panels, its codes streamed from the checkpoint (no f32 or int8 copy
    /// of the whole tensor). The scales are checked as the f32 decoder checks them.
    fn pack_lpbq(&self, req: &ParamRequest<'_>, key: &str, cin: usize, cout: usize) -> Result<PackedMatrix> {
        let (scale1, scale2, shape) = self.lpbq_scales(req, key, cin, cout)?;
        let bad = |m: String| self.weight_error(req, format!("LPBQ weight `{key}`: {m}"));
        if let Some(i) = scale1.iter().position(|&v| v > SCALE1_STEPS) {
            return Err(bad(format!("scale1[{i}] is {}, above {SCALE1_STEPS}", scale1[i])));
        }
        if let Some(i) = scale2.iter().position(|&v| !(v.is_finite() && v > 0.0)) {
            return Err(bad(format!("scale2[{i}] is {}, not a positive finite scale", scale2[i])));
        }
        let mut packer = Int4Packer::new(cin, cout, shape.block_size()).map_err(|e| bad(e.to_string()))?;
        let mut failed = None;
        self.ckpt
            .visit_bytes(key, |chunk| {
                if failed.is_none() {
                    failed = packer.push(chunk).err();
                }
            })
            .map_err(|e| self.err(req, e))?;
        if let Some(e) = failed {
            return Err(bad(e.to_string()));
        }
        packer.finish(&scale1, &scale2).map_err(|e| bad(e.to_string()))
    }
}

/// `[out, in]` (PyTorch) → `[in, out]` (the 1×1 conv's HWIO without its unit dims).
fn out_in_to_hwio(req: &ParamRequest<'_>, w: &[f32], cin: usize, cout: usize) -> Result<Vec<f32>> {
    crate::kernels::transpose_2d(w, cout, cin).map_err(|e| Error::Weight {
        key: req.key.to_string(),
        module_path: req.module_path.to_string(),
        message: format!("[out, in] -> HWIO: {e}"),
    })
}

impl WeightStore for CheckpointStore {
    fn load(&self, req: &ParamRequest<'_>) -> Result<Tensor> {
        if let Some(packed) = self.load_packed(req)? {
            return packed.into_tensor(req.shape.to_vec(), self.backend.clone());
        }
        if let Some(table) = self.load_u16_table(req)? {
            return table.into_tensor(req.shape.to_vec(), self.backend.clone());
        }
        let data = self.load_data(req)?;
        Tensor::from_f32(data, req.shape.to_vec(), self.backend.clone())
    }

    fn contains(&self, key: &str) -> bool {
        self.ckpt.contains(key)
    }

    fn backend(&self) -> BackendRef {
        self.backend.clone()
    }
}

/// pymllm exports carry observer state next to the parameters; nothing reads it.
fn is_bookkeeping(key: &str) -> bool {
    key.contains("activation_post_process")
        || key.ends_with("fake_quant_enabled")
        || key.ends_with("observer_enabled")
        || key.contains("_concat_observer")
        || key.ends_with(".eps")
}
