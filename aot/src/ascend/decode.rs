//! Reading an AscendV1 directory back with the format's formulas: every linear's weight decoded
//! (`(q - weight_offset) * weight_scale`; per-group W4A8_DYNAMIC's `q * (weight_scale *
//! weight_scale_second)` as vLLM Ascend dequantizes it; W8A8's from `deq_scale / input_scale`, its
//! bias from `quant_bias`), checked against its description tag, dtype and shape, and the activation
//! quantization of each linear's input ([`PointQuant`]) for a fake-quant run.
//!
//! W8A8 decodes exactly: with `x' = (q_x - input_offset) * input_scale`,
//! `(q_x · q_w + quant_bias) * deq_scale = x' · (q_w * deq_scale / input_scale) + (quant_bias +
//! sum_k q_w * input_offset) * deq_scale`, so the float run with the decoded weight and bias and
//! the fake-quantized input computes what the device does (up to f32 rounding).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use checkpoint::{SafetensorsCheckpoint, StDtype};
use mllm_dsl::files::{read_text_bounded, CONFIG_SIZE_LIMIT};
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

use super::error::AscendError;
use super::format::{unpack_int4_rows, Activation, GroupedInt4, QuantType, C8, SCALE_BIAS_SPLITS};
use super::graph::{kv_points, traced_linears};
use super::hooks::PointQuant;
use super::{DESCRIPTION_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE};
use crate::error::{AotError, Result};
use crate::trace::trace_model;

/// An AscendV1 directory opened for reading: the description and every tensor's file.
pub struct AscendDir {
    pub dir: PathBuf,
    pub description: serde_json::Map<String, serde_json::Value>,
    files: Vec<SafetensorsCheckpoint>,
    file_of: HashMap<String, usize>,
}

fn bad(dir: &Path, key: &str, problem: impl Into<String>) -> AotError {
    AscendError::Format { path: dir.display().to_string(), key: key.to_string(), problem: problem.into() }.into()
}

impl AscendDir {
    /// Opens `dir`: `quant_model_description.json` and the weights (one file, or the shards the
    /// index lists). Every tensor must have a description tag.
    pub fn open(dir: &Path) -> Result<AscendDir> {
        let desc_path = dir.join(DESCRIPTION_FILE);
        let text = read_text_bounded(&desc_path, CONFIG_SIZE_LIMIT * 16)?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| bad(dir, DESCRIPTION_FILE, format!("not valid JSON: {e}")))?;
        let description = value.as_object().cloned().ok_or_else(|| bad(dir, DESCRIPTION_FILE, "not an object"))?;
        let mut files = Vec::new();
        let single = dir.join(WEIGHTS_FILE);
        if single.is_file() {
            files.push(SafetensorsCheckpoint::open_file(&single)?);
        } else {
            let index_path = dir.join(WEIGHTS_INDEX_FILE);
            let text = read_text_bounded(&index_path, CONFIG_SIZE_LIMIT * 16)?;
            let index: serde_json::Value = serde_json::from_str(&text)
                .map_err(|e| bad(dir, WEIGHTS_INDEX_FILE, format!("not valid JSON: {e}")))?;
            let map = index
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| bad(dir, WEIGHTS_INDEX_FILE, "no `weight_map` object"))?;
            let mut names: Vec<&str> = map.values().filter_map(|v| v.as_str()).collect();
            names.sort_unstable();
            names.dedup();
            for name in names {
                if name.contains('/') || name.contains("..") {
                    return Err(bad(dir, WEIGHTS_INDEX_FILE, format!("shard `{name}` is not a file of the directory")));
                }
                files.push(SafetensorsCheckpoint::open_file(dir.join(name))?);
            }
        }
        let mut file_of = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for k in f.keys() {
                if !description.contains_key(k) {
                    return Err(bad(dir, k, "a tensor of the weights without a description tag"));
                }
                file_of.insert(k.to_string(), i);
            }
        }
        Ok(AscendDir { dir: dir.to_path_buf(), description, files, file_of })
    }

    pub fn keys(&self) -> Vec<&str> {
        let mut k: Vec<&str> = self.file_of.keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    pub fn tag(&self, key: &str) -> Option<&str> {
        self.description.get(key).and_then(|v| v.as_str())
    }

    fn file(&self, key: &str) -> Result<&SafetensorsCheckpoint> {
        let i = self.file_of.get(key).ok_or_else(|| bad(&self.dir, key, "missing from the weights"))?;
        Ok(&self.files[*i])
    }

    /// (dtype, shape) of `key`.
    pub fn info(&self, key: &str) -> Result<(StDtype, Vec<usize>)> {
        let (d, s) = self.file(key)?.info(key)?;
        Ok((d, s.to_vec()))
    }

    /// Checks `key`'s tag, dtype and shape.
    fn expect(&self, key: &str, tag: &str, dtypes: &[StDtype], shape: &[usize]) -> Result<StDtype> {
        let found = self.tag(key).unwrap_or("none");
        if found != tag {
            return Err(bad(&self.dir, key, format!("tagged {found}, expected {tag}")));
        }
        let (d, s) = self.info(key)?;
        if !dtypes.contains(&d) || s != shape {
            return Err(bad(&self.dir, key, format!("{d} {s:?}, expected {dtypes:?} {shape:?}")));
        }
        Ok(d)
    }

    fn f32s(&self, key: &str) -> Result<Vec<f32>> {
        Ok(self.file(key)?.read_float_param(key)?)
    }

    fn i8s(&self, key: &str) -> Result<Vec<i8>> {
        Ok(self.file(key)?.read_i8(key)?)
    }
}

/// A decoded linear: float weight `[out, in]`, bias, and how its input is quantized.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedLinear {
    pub quant_type: QuantType,
    pub weight: Vec<f32>,
    pub bias: Option<Vec<f32>>,
    /// W8A8: (input_scale, input_offset).
    pub input: Option<(f32, f32)>,
}

/// Decodes linear `name` (`out x in`, as the model file has it) with the formulas of its tag.
pub fn decode_linear(d: &AscendDir, name: &str, out: usize, inp: usize) -> Result<DecodedLinear> {
    let key = |s: &str| format!("{name}.{s}");
    let wkey = key("weight");
    let tag = d.tag(&wkey).ok_or_else(|| bad(&d.dir, &wkey, "no description tag"))?;
    let qt = QuantType::parse(tag, &format!("the tag of `{wkey}`"))?;
    let bias = |d: &AscendDir| -> Result<Option<Vec<f32>>> {
        let b = key("bias");
        if d.file_of.contains_key(&b) {
            d.expect(
                &b,
                if qt == QuantType::Float { tag } else { "FLOAT" },
                &[StDtype::F32, StDtype::F16, StDtype::BF16],
                &[out],
            )?;
            Ok(Some(d.f32s(&b)?))
        } else {
            Ok(None)
        }
    };
    let per_channel = |d: &AscendDir, q: &[i8]| -> Result<Vec<f32>> {
        d.expect(&key("weight_scale"), tag, &[StDtype::F32], &[out, 1])?;
        d.expect(&key("weight_offset"), tag, &[StDtype::F32], &[out, 1])?;
        let (s, o) = (d.f32s(&key("weight_scale"))?, d.f32s(&key("weight_offset"))?);
        Ok(q.iter().enumerate().map(|(i, &v)| (v as f32 - o[i / inp]) * s[i / inp]).collect())
    };
    let decoded = match qt {
        QuantType::Float => {
            d.expect(&wkey, tag, &[StDtype::F32, StDtype::F16, StDtype::BF16], &[out, inp])?;
            DecodedLinear { quant_type: qt, weight: d.f32s(&wkey)?, bias: bias(d)?, input: None }
        }
        QuantType::W8A16 | QuantType::W8A8Dynamic => {
            d.expect(&wkey, tag, &[StDtype::I8], &[out, inp])?;
            let q = d.i8s(&wkey)?;
            DecodedLinear { quant_type: qt, weight: per_channel(d, &q)?, bias: bias(d)?, input: None }
        }
        QuantType::W4A8Dynamic => {
            d.expect(&wkey, tag, &[StDtype::I8], &[out / 2, inp])?;
            let q = unpack_int4_rows(&d.i8s(&wkey)?, out, inp);
            let weight = if d.file_of.contains_key(&key("weight_scale_second")) {
                per_group(d, name, &q, out, inp)?
            } else if group_size(d)? > 0 {
                // vLLM Ascend's scheme allocates the per-group scales whenever group_size > 0.
                return Err(bad(
                    &d.dir,
                    &key("weight_scale_second"),
                    format!("missing: the description's group_size is {}", group_size(d)?),
                ));
            } else {
                per_channel(d, &q)?
            };
            // scale_bias is the kernel's helper: check it is what the weight implies.
            let sb = key("scale_bias");
            let (_, shape) = d.info(&sb)?;
            let splits = if shape == [out, SCALE_BIAS_SPLITS] { SCALE_BIAS_SPLITS } else { 1 };
            d.expect(&sb, tag, &[StDtype::F32], &[out, splits])?;
            let stored = d.f32s(&sb)?;
            let part = inp / splits;
            for r in 0..out {
                for s in 0..splits {
                    let terms = &weight[r * inp + s * part..r * inp + (s + 1) * part];
                    let want = 8.0 * terms.iter().map(|&w| f64::from(w)).sum::<f64>();
                    // The terms cancel: the exporter's rounding is relative to their magnitude,
                    // not to the (possibly near-zero) sum.
                    let magnitude = 8.0 * terms.iter().map(|&w| f64::from(w).abs()).sum::<f64>();
                    let got = f64::from(stored[r * splits + s]);
                    if (want - got).abs() > 1e-5 * magnitude.max(1e-9) {
                        return Err(bad(&d.dir, &sb, format!("row {r} part {s} is {got}, the weight implies {want}")));
                    }
                }
            }
            DecodedLinear { quant_type: qt, weight, bias: bias(d)?, input: None }
        }
        QuantType::W8A8 => {
            d.expect(&wkey, tag, &[StDtype::I8], &[out, inp])?;
            d.expect(&key("input_scale"), tag, &[StDtype::F32], &[1])?;
            d.expect(&key("input_offset"), tag, &[StDtype::F32], &[1])?;
            d.expect(&key("quant_bias"), tag, &[StDtype::I32], &[out])?;
            let deq_dtype = d.expect(&key("deq_scale"), tag, &[StDtype::F32, StDtype::I64], &[out])?;
            let q = d.i8s(&wkey)?;
            let (s_x, o_x) = (d.f32s(&key("input_scale"))?[0], d.f32s(&key("input_offset"))?[0]);
            let qb = d.file(&key("quant_bias"))?.read_i32(&key("quant_bias"))?;
            let deq: Vec<f32> = match deq_dtype {
                StDtype::I64 => d
                    .file(&key("deq_scale"))?
                    .read_i64(&key("deq_scale"))?
                    .iter()
                    .map(|&v| f32::from_bits(v as i32 as u32))
                    .collect(),
                _ => d.f32s(&key("deq_scale"))?,
            };
            let weight: Vec<f32> = q.iter().enumerate().map(|(i, &v)| v as f32 * deq[i / inp] / s_x).collect();
            let b: Vec<f32> = (0..out)
                .map(|r| {
                    let sum: f32 = q[r * inp..(r + 1) * inp].iter().map(|&v| v as f32).sum();
                    (qb[r] as f32 + sum * o_x) * deq[r]
                })
                .collect();
            // The stored float bias (tagged FLOAT) is informative; quant_bias carries it.
            let _ = bias(d)?;
            DecodedLinear { quant_type: qt, weight, bias: Some(b), input: Some((s_x, o_x)) }
        }
    };
    Ok(decoded)
}

/// The description's `group_size` (0 when absent).
fn group_size(d: &AscendDir) -> Result<usize> {
    match d.description.get("group_size") {
        None => Ok(0),
        Some(v) => v
            .as_u64()
            .map(|g| g as usize)
            .ok_or_else(|| bad(&d.dir, "group_size", format!("{v} is no non-negative integer"))),
    }
}

/// A per-group W4A8_DYNAMIC weight as vLLM Ascend's dense scheme dequantizes it
/// (`vllm_ascend/quantization/methods/w4a8.py`, `AscendW4A8DynamicLinearMethod.process_scale_second`
/// and `apply`, release v0.26.0rc): `antiquant_scale[o, g] = weight_scale[o] *
/// weight_scale_second[o, g]` with `g = k / group_size` (the description's), `w = q *
/// antiquant_scale`. That scheme ignores both offsets (symmetric), so they must be 0.
fn per_group(d: &AscendDir, name: &str, q: &[i8], out: usize, inp: usize) -> Result<Vec<f32>> {
    let key = |s: &str| format!("{name}.{s}");
    let tag = QuantType::W4A8Dynamic.tag();
    let g = group_size(d)?;
    if g == 0 || !inp.is_multiple_of(g) {
        return Err(bad(
            &d.dir,
            &key("weight_scale_second"),
            format!("a per-group weight, but the description's group_size {g} does not divide the {inp} inputs"),
        ));
    }
    let groups = inp / g;
    d.expect(&key("weight_scale"), tag, &[StDtype::F32], &[out, 1])?;
    d.expect(&key("weight_offset"), tag, &[StDtype::F32], &[out, 1])?;
    d.expect(&key("weight_scale_second"), tag, &[StDtype::F32, StDtype::F16, StDtype::BF16], &[out, groups])?;
    let off2 = d.expect(
        &key("weight_offset_second"),
        tag,
        &[StDtype::I64, StDtype::F32, StDtype::F16, StDtype::BF16],
        &[out, groups],
    )?;
    if d.f32s(&key("weight_offset"))?.iter().any(|&v| v != 0.0) {
        return Err(bad(&d.dir, &key("weight_offset"), "per-group W4A8_DYNAMIC is symmetric: offsets must be 0"));
    }
    let nonzero = match off2 {
        StDtype::I64 => {
            d.file(&key("weight_offset_second"))?.read_i64(&key("weight_offset_second"))?.iter().any(|&v| v != 0)
        }
        _ => d.f32s(&key("weight_offset_second"))?.iter().any(|&v| v != 0.0),
    };
    if nonzero {
        return Err(bad(
            &d.dir,
            &key("weight_offset_second"),
            "per-group W4A8_DYNAMIC is symmetric: offsets must be 0",
        ));
    }
    let grouped = GroupedInt4 {
        group_size: g,
        codes: q.to_vec(),
        weight_scale: d.f32s(&key("weight_scale"))?,
        weight_scale_second: d.f32s(&key("weight_scale_second"))?,
    };
    Ok(grouped.dequantize(inp))
}

/// An AscendV1 directory decoded for a fake-quant CPU run.
pub struct Decoded {
    /// Float tensors of an HF checkpoint: every FLOAT tensor and each linear's decoded weight/bias.
    pub tensors: Vec<(String, Vec<usize>, Vec<f32>)>,
    /// How each QDQ point is quantized, by key.
    pub points: HashMap<String, PointQuant>,
    /// (linear, type) in program order.
    pub linears: Vec<(String, QuantType)>,
}

/// Decodes `dir` for the model file of `hf` (the config of `dir`).
pub fn decode_dir(dir: &Path, hf: &HfConfig, max_positions: usize) -> Result<Decoded> {
    let d = AscendDir::open(dir)?;
    let program = trace_model(hf, max_positions, ParamFormat::Float)?;
    let linears = traced_linears(&program);
    let mut tensors = Vec::new();
    let mut points: HashMap<String, PointQuant> = HashMap::new();
    let mut point_types: HashMap<String, (QuantType, String)> = HashMap::new();
    let mut covered: std::collections::HashSet<String> = Default::default();
    let mut types = Vec::new();
    for l in &linears {
        let dl = decode_linear(&d, &l.name, l.out_features, l.in_features)?;
        for suffix in [
            "weight",
            "bias",
            "weight_scale",
            "weight_offset",
            "scale_bias",
            "weight_scale_second",
            "weight_offset_second",
            "quant_bias",
            "input_scale",
            "input_offset",
            "deq_scale",
        ] {
            covered.insert(format!("{}.{suffix}", l.name));
        }
        let act = dl.quant_type.activation();
        if act != Activation::Float {
            let input = l.input.as_ref().ok_or_else(|| {
                bad(dir, &format!("{}.weight", l.name), "its input comes from no QDQ point; the run cannot quantize it")
            })?;
            let pq = match (act, dl.input) {
                (Activation::StaticPerTensor, Some((scale, offset))) => PointQuant::Static { scale, offset },
                _ => PointQuant::PerToken { moves: input.moves.clone(), in_features: input.in_features },
            };
            let key = input.point.key.clone();
            if let Some((other_t, other)) = point_types.get(&key) {
                if points.get(&key) != Some(&pq) {
                    return Err(AscendError::SharedInput {
                        point: key,
                        detail: format!("`{other}` {} and `{}` {}", other_t.tag(), l.name, dl.quant_type.tag()),
                    }
                    .into());
                }
            }
            point_types.insert(key.clone(), (dl.quant_type, l.name.clone()));
            points.insert(key, pq);
        } else if let Some(input) = &l.input {
            if let Some((other_t, other)) = point_types.get(&input.point.key) {
                return Err(AscendError::SharedInput {
                    point: input.point.key.clone(),
                    detail: format!("`{other}` {} and `{}` FLOAT", other_t.tag(), l.name),
                }
                .into());
            }
        }
        tensors.push((format!("{}.weight", l.name), vec![l.out_features, l.in_features], dl.weight));
        if let Some(b) = dl.bias {
            tensors.push((format!("{}.bias", l.name), vec![l.out_features], b));
        }
        types.push((l.name.clone(), dl.quant_type));
    }
    // C8 KV scales.
    for kv in kv_points(&program) {
        let skey = format!("{}.kv_cache_scale", kv.linear);
        if d.file_of.contains_key(&skey) {
            let (_, shape) = d.info(&skey)?;
            d.expect(&skey, C8, &[StDtype::F32, StDtype::F16, StDtype::BF16], &shape)?;
            let okey = format!("{}.kv_cache_offset", kv.linear);
            d.expect(&okey, C8, &[StDtype::F32, StDtype::F16, StDtype::BF16], &shape)?;
            if d.f32s(&okey)?.iter().any(|&o| o != 0.0) {
                return Err(bad(dir, &okey, "C8 offsets must be 0 (symmetric int8)"));
            }
            points.insert(kv.point.key.clone(), PointQuant::KvPerChannel { scales: d.f32s(&skey)? });
            covered.insert(skey);
            covered.insert(okey);
        }
    }
    for key in d.keys() {
        if covered.contains(key) {
            continue;
        }
        let tag = d.tag(key).unwrap_or("none");
        if tag != "FLOAT" {
            return Err(bad(dir, key, format!("tagged {tag} but belongs to no linear of the model file")));
        }
        let (_, shape) = d.info(key)?;
        tensors.push((key.to_string(), shape, d.f32s(key)?));
    }
    Ok(Decoded { tensors, points, linears: types })
}
