//! [`QdqParams`]: the scale and zero point of every QDQ point of a model, by checkpoint key.
//!
//! Where each point's parameters come from depends on its kind:
//!
//! | kind | source | range |
//! |---|---|---|
//! | activation, constant, RoPE | `<key>.fake_quant.scale` (f32 `[1]`) / `.zero_point` (i32 `[1]`) | u16 0..=65535 |
//! | KV cache | the same keys; the zero point must be 128 | u8 0..=255 |
//! | fixed (sigmoid output) | the model file; a stored copy must agree | u16 0..=65535 |
//! | global (mask, `constant_zero`) | the model file (compile-time constants, never stored) | u16 0..=65535 |

use std::collections::BTreeMap;

use compiler::quant::spec::KV_ZERO_POINT;
use compiler::quant::QuantParams;
use mllm_dsl::{QdqAttr, QdqKind};

use super::error::QuantizationError;
use checkpoint::{SafetensorsCheckpoint, StDtype};

/// Parameters of each QDQ point, with the point itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QdqParams {
    by_key: BTreeMap<String, (QdqAttr, QuantParams)>,
    /// Checkpoint keys the parameters were read from.
    source_keys: Vec<String>,
}

impl QdqParams {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reads and validates the parameters of `points` from `ckpt`. Global points need nothing from
    /// the checkpoint; fixed points are checked against a stored copy when there is one.
    pub fn from_checkpoint(ckpt: &SafetensorsCheckpoint, points: &[QdqAttr]) -> Result<Self, QuantizationError> {
        let mut out = QdqParams::new();
        for point in points {
            let params = match &point.kind {
                QdqKind::Global { .. } => fixed(point)?,
                QdqKind::Fixed { .. } => {
                    let expected = fixed(point)?;
                    if ckpt.contains(&point.scale_key()) || ckpt.contains(&point.zero_point_key()) {
                        let (scale, zp) = read_pair(ckpt, point, &mut out.source_keys)?;
                        if scale.to_bits() != expected.scale.to_bits() || zp != expected.zero_point {
                            return Err(QuantizationError::FixedMismatch {
                                point: point.key.clone(),
                                key: point.scale_key(),
                                expected: format!("scale {:e}, zero point {}", expected.scale, expected.zero_point),
                                found: format!("scale {scale:e}, zero point {zp}"),
                            });
                        }
                    }
                    expected
                }
                QdqKind::KvCache => {
                    let (scale, zp) = read_pair(ckpt, point, &mut out.source_keys)?;
                    if zp != KV_ZERO_POINT {
                        return Err(QuantizationError::KvZeroPoint {
                            point: point.key.clone(),
                            key: point.zero_point_key(),
                            found: zp,
                        });
                    }
                    QuantParams::kv_u8(scale).map_err(|e| QuantizationError::quant(point.scale_key(), e))?
                }
                QdqKind::Activation | QdqKind::Constant | QdqKind::Rope => {
                    let (scale, zp) = read_pair(ckpt, point, &mut out.source_keys)?;
                    QuantParams::u16_affine(scale, zp).map_err(|e| QuantizationError::quant(point.scale_key(), e))?
                }
            };
            out.insert(point.clone(), params);
        }
        Ok(out)
    }

    /// Sets the parameters of `point`, replacing earlier ones.
    pub fn insert(&mut self, point: QdqAttr, params: QuantParams) {
        self.by_key.insert(point.key.clone(), (point, params));
    }

    pub fn get(&self, key: &str) -> Option<&QuantParams> {
        self.by_key.get(key).map(|(_, p)| p)
    }

    pub fn point(&self, key: &str) -> Option<&QdqAttr> {
        self.by_key.get(key).map(|(q, _)| q)
    }

    /// Points and parameters, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&QdqAttr, &QuantParams)> {
        self.by_key.values().map(|(q, p)| (q, p))
    }

    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Checkpoint keys [`from_checkpoint`](Self::from_checkpoint) read.
    pub fn source_keys(&self) -> &[String] {
        &self.source_keys
    }

    /// The checkpoint tensors pymllm stores for these points: `<key>.fake_quant.scale` f32 `[1]`
    /// and `.zero_point` i32 `[1]` for every point except globals (compile-time constants).
    pub fn checkpoint_tensors(&self) -> Vec<(String, StDtype, Vec<usize>, Vec<u8>)> {
        let mut out = Vec::new();
        for (point, p) in self.iter() {
            if matches!(point.kind, QdqKind::Global { .. }) {
                continue;
            }
            out.push((point.scale_key(), StDtype::F32, vec![1], p.scale.to_le_bytes().to_vec()));
            out.push((point.zero_point_key(), StDtype::I32, vec![1], p.zero_point.to_le_bytes().to_vec()));
        }
        out
    }
}

/// The parameters a fixed or global point declares.
fn fixed(point: &QdqAttr) -> Result<QuantParams, QuantizationError> {
    let (scale, zp) = point.fixed_params().expect("fixed and global points carry their parameters");
    QuantParams::u16_affine(scale, zp).map_err(|e| QuantizationError::quant(point.key.clone(), e))
}

/// `(scale, zero_point)` stored for `point`, each exactly one value.
fn read_pair(
    ckpt: &SafetensorsCheckpoint,
    point: &QdqAttr,
    used: &mut Vec<String>,
) -> Result<(f32, i32), QuantizationError> {
    let (scale_key, zp_key) = (point.scale_key(), point.zero_point_key());
    let scale = ckpt.read_float_param(&scale_key)?;
    let zp = match ckpt.info(&zp_key)?.0 {
        StDtype::I64 => {
            ckpt.read_i64(&zp_key)?.into_iter().map(|v| v.clamp(i32::MIN as i64, i32::MAX as i64) as i32).collect()
        }
        _ => ckpt.read_i32(&zp_key)?,
    };
    let (&[scale], &[zp]) = (scale.as_slice(), zp.as_slice()) else {
        return Err(QuantizationError::BadParam {
            key: scale_key,
            problem: format!(
                "expected one scale and one zero point, found {} and {} values (`{zp_key}`)",
                scale.len(),
                zp.len()
            ),
        });
    };
    used.push(scale_key);
    used.push(zp_key);
    Ok((scale, zp))
}
