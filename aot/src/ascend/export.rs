//! [`export_ascend`]: an HF float checkpoint calibrated on the CPU and written as an AscendV1
//! directory, from the traced model file's linears and QDQ points.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use backend_cpu::quant::{
    prefill_logits, rotate_checkpoint, InputStatsHook, LinearExport, LinearQuantizer, Rotation, WeightMethod,
};
use backend_cpu::CpuBackend;
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
use mllm_dsl::files::{read_text_bounded, write_atomic_bytes, write_json_atomic, StagingDir, CONFIG_SIZE_LIMIT};
use mllm_dsl::ParamFormat;
use models::hf::{CheckpointDtype, HfConfig};

use super::error::AscendError;
use super::format::{
    check_group_size, linear_tensors, model_quant_type, quantize_groups_symmetric, symmetric_int8_scale, Activation,
    FloatDtype, FloatLinear, GroupedInt4, QuantType, StoredTensor, C8, VERSION,
};
use super::graph::{kv_points, pattern_matches, traced_linears, KvPoint, TracedLinear};
use super::hooks::AscendObserver;
use super::{DESCRIPTION_FILE, WEIGHTS_FILE, WEIGHTS_INDEX_FILE, WEIGHTS_PREFIX};
use crate::error::{ensure, AotError, Context, Result};
use crate::load::open_model;
use crate::progress::Progress;
use crate::trace::trace_model;

/// What [`export_ascend`] writes.
#[derive(Clone)]
pub struct AscendOptions {
    /// HF float checkpoint directory.
    pub model: PathBuf,
    /// Calibration token sequences (W8A8's input ranges, C8's KV ranges).
    pub calibration: Vec<Vec<i64>>,
    /// The quant type of every linear not kept FLOAT.
    pub quant_type: QuantType,
    /// Linears kept FLOAT, by [`pattern_matches`] pattern; each must match at least one linear.
    pub float_patterns: Vec<String>,
    /// Int8 KV cache (C8), per channel, symmetric.
    pub kv_c8: bool,
    /// Bytes per weight shard (msModelSlim's `part_file_size` GB × 2^30); `None` writes one
    /// `quant_model_weights.safetensors` and no index.
    pub part_bytes: Option<u64>,
    /// A rotation folded into the float weights before anything is observed.
    pub rotation: Rotation,
    /// W4A8_DYNAMIC only: int4 weights per group of this many inputs (the description's
    /// `group_size`); 0 keeps msModelSlim's per-channel weights.
    pub group_size: usize,
    /// How per-group int4 weights are chosen: `Rtn` rounds to nearest with each group's max-abs
    /// step (msModelSlim's MinMax per group); `Mse` / `Gptq` (and the SeqMSE variants) search the
    /// two-level scales on the grid `weight_scale_second` in 1..=16 and round with the calibration
    /// inputs' statistics (backend-cpu's LPBQ search and GPTQ, the QNN path's).
    pub weight_method: WeightMethod,
    /// Output directory, replaced whole on success.
    pub out: PathBuf,
    /// RoPE rows of the model built for calibration.
    pub max_positions: usize,
    pub progress: Arc<dyn Progress>,
}

/// What [`export_ascend`] did.
#[derive(Clone, Debug)]
pub struct AscendOutcome {
    pub model_quant_type: String,
    /// (linear, type) in program order.
    pub linears: Vec<(String, QuantType)>,
    pub tensors: usize,
    pub shards: usize,
    pub bytes: u64,
    pub kv_points: usize,
    /// The largest calibrated |range| of a static input: (linear, min, max).
    pub widest_static_input: Option<(String, f32, f32)>,
    pub seconds: f64,
}

impl From<AscendError> for AotError {
    fn from(e: AscendError) -> Self {
        AotError::Ascend(Box::new(e))
    }
}

/// The float dtype of `hf`'s checkpoint (`torch_dtype`), f32 when it says none.
pub fn float_dtype(hf: &HfConfig) -> FloatDtype {
    match hf.dtype {
        Some(CheckpointDtype::BF16) => FloatDtype::Bf16,
        Some(CheckpointDtype::F16) => FloatDtype::F16,
        _ => FloatDtype::F32,
    }
}

/// The type of each linear: FLOAT where a pattern matches, else `quant_type`. Every pattern must
/// select something.
pub fn assign_types(
    linears: &[TracedLinear],
    quant_type: QuantType,
    patterns: &[String],
) -> Result<Vec<QuantType>, AscendError> {
    for p in patterns {
        if !linears.iter().any(|l| pattern_matches(p, &l.name)) {
            return Err(AscendError::PatternMatchesNothing {
                argument: "AscendOptions::float_patterns".into(),
                pattern: p.clone(),
                linears: linears.len(),
                example: linears.first().map_or(String::new(), |l| l.name.clone()),
            });
        }
    }
    Ok(linears
        .iter()
        .map(|l| if patterns.iter().any(|p| pattern_matches(p, &l.name)) { QuantType::Float } else { quant_type })
        .collect())
}

/// Calibrates and writes the AscendV1 directory `opts.out` (module docs of [`super`]). Nothing is
/// written to `opts.out` unless every step succeeds.
pub fn export_ascend(opts: &AscendOptions) -> Result<AscendOutcome> {
    mllm_dsl::files::ensure_not_input(&opts.out, &[&opts.model])?;
    let hf = HfConfig::from_dir(&opts.model)?;
    let staging = StagingDir::new(&opts.out)?;
    let outcome = export_into(&hf, opts, staging.path())?;
    staging.commit()?;
    Ok(outcome)
}

const ROTATED_DIR: &str = "rotated-float";

fn export_into(hf: &HfConfig, opts: &AscendOptions, out: &Path) -> Result<AscendOutcome> {
    let start = Instant::now();
    // 0. The float weights the export starts from: the checkpoint, or its rotated copy (in a
    //    scratch directory next to the output, removed at the end).
    let scratch = tempfile::Builder::new()
        .prefix(".ascend-scratch-")
        .tempdir_in(out.parent().unwrap_or(Path::new(".")))
        .with_context(|| format!("creating a scratch directory next to {}", out.display()))?;
    let (src_dir, src_hf) = match opts.rotation {
        Rotation::None => (opts.model.clone(), hf.clone()),
        Rotation::Hadamard => {
            let rotated = scratch.path().join(ROTATED_DIR);
            rotate_checkpoint(&opts.model, hf, &rotated)
                .with_context(|| format!("rotating {} into {}", opts.model.display(), rotated.display()))?;
            let rhf = HfConfig::from_dir(&rotated)?;
            (rotated, rhf)
        }
    };

    // 1. The model file's linears and KV points, and the type of each linear.
    let program = trace_model(&src_hf, opts.max_positions, ParamFormat::Float)?;
    let linears = traced_linears(&program);
    ensure!(!linears.is_empty(), "the model file of {} traces no linear", opts.model.display());
    let types = assign_types(&linears, opts.quant_type, &opts.float_patterns)?;
    let kv = if opts.kv_c8 { kv_points(&program) } else { Vec::new() };
    ensure!(
        !opts.kv_c8 || !kv.is_empty(),
        "AscendOptions::kv_c8: the model file of {} has no KV-cache QDQ point",
        opts.model.display()
    );

    // 1b. Per-group W4A8_DYNAMIC: the group size must tile every such linear's input.
    let grouped = opts.group_size > 0;
    if grouped && opts.quant_type != QuantType::W4A8Dynamic {
        return Err(AscendError::Argument(format!(
            "AscendOptions::group_size {}: per-group weights are W4A8_DYNAMIC's; AscendOptions::quant_type is {}",
            opts.group_size,
            opts.quant_type.tag()
        ))
        .into());
    }
    if !grouped && opts.weight_method != WeightMethod::Rtn {
        return Err(AscendError::Argument(format!(
            "AscendOptions::weight_method {}: only per-group W4A8_DYNAMIC weights (AscendOptions::group_size G) are \
             chosen by a weight method; per-channel weights are msModelSlim's round-to-nearest",
            opts.weight_method.name()
        ))
        .into());
    }
    if grouped {
        for (l, t) in linears.iter().zip(&types) {
            if *t == QuantType::W4A8Dynamic {
                check_group_size(&l.name, l.out_features, l.in_features, opts.group_size)?;
            }
        }
    }

    // 2. Calibration: the float model observes the static inputs and the KV points.
    let mut static_points = Vec::new();
    for (l, t) in linears.iter().zip(&types) {
        if t.activation() == Activation::StaticPerTensor {
            let input = l.input.as_ref().ok_or_else(|| AscendError::CannotPack {
                linear: l.name.clone(),
                quant_type: t.tag().into(),
                out_features: l.out_features,
                in_features: l.in_features,
                problem: "its input comes from no QDQ point of the model file, so nothing can calibrate it".into(),
            })?;
            static_points.push(input.point.key.clone());
        }
    }
    let observed = if static_points.is_empty() && kv.is_empty() {
        Default::default()
    } else {
        ensure!(!opts.calibration.is_empty(), "no calibration sequences (W8A8 and C8 need calibrated ranges)");
        let hook = Arc::new(AscendObserver::new(static_points, kv.iter().map(|k| k.point.key.clone()).collect()));
        run_calibration(opts, &src_dir, &src_hf, hook.clone(), "calibrating")?;
        hook.finish().map_err(|e| AotError::invalid(format!("calibration: {e}")))?
    };

    // 2b. Per-group weights chosen with input statistics: the float model's inputs of the
    //     W4A8_DYNAMIC linears.
    let quantizer = if grouped && opts.weight_method != WeightMethod::Rtn {
        let stats = match opts.weight_method.input_stats() {
            None => None,
            Some(depth) => {
                let mut inputs = Vec::new();
                for (l, t) in linears.iter().zip(&types) {
                    if *t == QuantType::W4A8Dynamic {
                        inputs.push(l.input.clone().ok_or_else(|| AscendError::CannotPack {
                            linear: l.name.clone(),
                            quant_type: t.tag().into(),
                            out_features: l.out_features,
                            in_features: l.in_features,
                            problem: format!(
                                "its input comes from no QDQ point of the model file, so the `{}` weight method \
                                 has no statistics of it",
                                opts.weight_method.name()
                            ),
                        })?);
                    }
                }
                ensure!(
                    !opts.calibration.is_empty(),
                    "no calibration sequences (AscendOptions::weight_method needs them)"
                );
                let hook = Arc::new(InputStatsHook::new(&inputs, depth));
                run_calibration(opts, &src_dir, &src_hf, hook.clone(), "input statistics")?;
                Some(Arc::new(hook.finish()?))
            }
        };
        Some(LinearQuantizer::new(opts.weight_method, stats)?)
    } else {
        None
    };
    let grouped_weights = |l: &TracedLinear, weight: &[f32]| -> Result<GroupedInt4> {
        let (o, i, g) = (l.out_features, l.in_features, opts.group_size);
        let Some(q) = &quantizer else { return Ok(quantize_groups_symmetric(weight, o, i, g)) };
        let shape = compiler::quant::lpbq::LpbqShape::new(o, i, g)
            .map_err(|e| AotError::invalid(format!("linear `{}`: {e}", l.name)))?;
        let LinearExport::Lpbq(e) = q.export(&l.name, weight, shape)? else {
            return Err(AotError::invalid(format!("linear `{}`: the weight method made no int4 weight", l.name)));
        };
        // LPBQ's `[1, 1, In, Out]` low nibbles → `[O, I]` codes; scale1 (1..=16) per group,
        // scale2 per channel: w = q * scale1 * scale2.
        let mut codes = vec![0i8; o * i];
        for k in 0..i {
            for r in 0..o {
                codes[r * i + k] = compiler::quant::lpbq::sign_extend_nibble(e.weight_hwio[k * o + r]);
            }
        }
        Ok(GroupedInt4 {
            group_size: g,
            codes,
            weight_scale: e.scale2.clone(),
            weight_scale_second: e.scale1.iter().map(|&v| f32::from(v)).collect(),
        })
    };

    // 3. The tensors: every float tensor of the checkpoint, linears replaced by their type's.
    let dtype = float_dtype(hf);
    let ckpt = SafetensorsCheckpoint::open(&src_dir)?;
    let by_weight: HashMap<String, usize> =
        linears.iter().enumerate().map(|(i, l)| (format!("{}.weight", l.name), i)).collect();
    let biases: HashMap<String, usize> =
        linears.iter().enumerate().filter(|(_, l)| l.has_bias).map(|(i, l)| (format!("{}.bias", l.name), i)).collect();
    let mut tensors: Vec<StoredTensor> = Vec::new();
    let mut widest: Option<(String, f32, f32)> = None;
    let mut emit_linear = |i: usize, tensors: &mut Vec<StoredTensor>| -> Result<()> {
        let l = &linears[i];
        let wkey = format!("{}.weight", l.name);
        let weight = read_linear_weight(&ckpt, &wkey, hf, l)?;
        let bias = if l.has_bias { Some(ckpt.read_float_param(&format!("{}.bias", l.name))?) } else { None };
        let range = l.input.as_ref().and_then(|inp| observed.ranges.get(&inp.point.key).copied());
        if types[i].activation() == Activation::StaticPerTensor {
            let (lo, hi) = range.context(format!("the input of `{}` was never observed", l.name))?;
            if widest.as_ref().is_none_or(|w| hi - lo > w.2 - w.1) {
                widest = Some((l.name.clone(), lo, hi));
            }
        }
        let lin = FloatLinear {
            name: &l.name,
            out_features: l.out_features,
            in_features: l.in_features,
            weight: &weight,
            bias: bias.as_deref(),
        };
        let g = if grouped && types[i] == QuantType::W4A8Dynamic { Some(grouped_weights(l, &weight)?) } else { None };
        tensors.extend(linear_tensors(&lin, types[i], range, g.as_ref(), dtype)?);
        Ok(())
    };
    let mut keys: Vec<&str> = ckpt.keys();
    keys.sort_unstable();
    let mut done = vec![false; linears.len()];
    for key in keys {
        if let Some(&i) = by_weight.get(key) {
            emit_linear(i, &mut tensors)?;
            done[i] = true;
        } else if biases.contains_key(key) {
            continue;
        } else {
            let (st, shape) = ckpt.info(key)?;
            ensure!(
                matches!(st, StDtype::F32 | StDtype::F16 | StDtype::BF16),
                "{}: tensor `{key}` is {st}; an AscendV1 FLOAT tensor must be a float",
                src_dir.display()
            );
            let shape = shape.to_vec();
            let values = ckpt.read_float_param(key)?;
            tensors.push(StoredTensor::new(key.to_string(), "FLOAT", dtype.st(), shape, dtype.encode(&values)));
        }
    }
    // A tied lm_head has no tensor of its own in the checkpoint; the model file still has it.
    for (i, d) in done.iter().enumerate() {
        if !d {
            emit_linear(i, &mut tensors)?;
        }
    }
    // C8: per-channel symmetric int8 scales under the producing linear's name.
    for KvPoint { point, linear } in &kv {
        let amax =
            observed.kv_abs_max.get(&point.key).context(format!("KV point `{}` was never observed", point.key))?;
        let scales: Vec<f32> = amax.iter().map(|&a| symmetric_int8_scale(a)).collect();
        let n = scales.len();
        tensors.push(StoredTensor::new(
            format!("{linear}.kv_cache_scale"),
            C8,
            StDtype::F32,
            vec![n],
            super::format::f32_bytes(&scales),
        ));
        tensors.push(StoredTensor::new(
            format!("{linear}.kv_cache_offset"),
            C8,
            StDtype::F32,
            vec![n],
            super::format::f32_bytes(&vec![0.0; n]),
        ));
    }
    drop(ckpt);

    // 4. Files: weights (sharded or not), description, config without quantization_config, tokenizer.
    let (shards, bytes) = write_weights(out, &tensors, opts.part_bytes)?;
    let mqt = model_quant_type(types.iter().map(|t| t.tag()));
    let mut description = serde_json::Map::new();
    for t in &tensors {
        description.insert(t.key.clone(), t.tag.clone().into());
    }
    if opts.kv_c8 {
        description.insert("kv_cache_type".into(), C8.into());
        description.insert("kv_quant_type".into(), C8.into());
    }
    description.insert("version".into(), VERSION.into());
    description.insert("model_quant_type".into(), mqt.clone().into());
    description.insert("metadata".into(), serde_json::json!({}));
    description.insert("group_size".into(), opts.group_size.into());
    description.insert("optional".into(), serde_json::json!({}));
    write_json_atomic(&out.join(DESCRIPTION_FILE), &serde_json::Value::Object(description))?;
    copy_config_files(&opts.model, &src_dir, out)?;
    Ok(AscendOutcome {
        model_quant_type: mqt,
        linears: linears.iter().zip(&types).map(|(l, t)| (l.name.clone(), *t)).collect(),
        tensors: tensors.len(),
        shards,
        bytes,
        kv_points: kv.len(),
        widest_static_input: widest,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Runs the float model (`dir`, `hf`) over every calibration sequence with `hook` on its QDQ
/// points, showing `label` as progress. Every sequence's length is checked before the model is
/// opened, so a sequence too long for the RoPE tables fails before any work.
fn run_calibration(
    opts: &AscendOptions,
    dir: &Path,
    hf: &HfConfig,
    hook: Arc<dyn backend_cpu::QdqHook>,
    label: &str,
) -> Result<()> {
    for (i, seq) in opts.calibration.iter().enumerate() {
        ensure!(
            seq.len() <= opts.max_positions,
            "calibration sequence {i} has {} tokens; the RoPE tables cover {}",
            seq.len(),
            opts.max_positions
        );
    }
    let backend = CpuBackend::with_qdq(hook);
    let (model, _store) = open_model(dir, hf, opts.max_positions, &backend)?;
    let pb = opts.progress.start(label, opts.calibration.len());
    for (i, seq) in opts.calibration.iter().enumerate() {
        prefill_logits(model.as_ref(), &backend, None, seq).with_context(|| format!("calibration sequence {i}"))?;
        pb.inc(1);
    }
    pb.finish();
    Ok(())
}

/// A linear's `[out, in]` weight from the checkpoint (a tied lm_head reads the embedding).
fn read_linear_weight(ckpt: &SafetensorsCheckpoint, key: &str, hf: &HfConfig, l: &TracedLinear) -> Result<Vec<f32>> {
    let key = models::keys::data_key(key, hf.tie_word_embeddings, |k| ckpt.contains(k));
    let (_, shape) = ckpt.info(key)?;
    ensure!(
        shape == [l.out_features, l.in_features],
        "{}: `{key}` is {shape:?}; the model file's linear `{}` is [{}, {}]",
        ckpt.root().display(),
        l.name,
        l.out_features,
        l.in_features
    );
    Ok(ckpt.read_float_param(key)?)
}

/// Writes the weights as msModelSlim's saver does: one file and no index without a part size;
/// else shards `quant_model_weights-0000i-of-0000n.safetensors`, a new one started before a
/// tensor that would reach the part size, and `quant_model_weights.safetensors.index.json`.
/// Returns (shards, bytes).
fn write_weights(out: &Path, tensors: &[StoredTensor], part_bytes: Option<u64>) -> Result<(usize, u64)> {
    let total: u64 = tensors.iter().map(|t| t.bytes.len() as u64).sum();
    let as_bytes = |group: &[&StoredTensor]| -> Vec<(String, StDtype, Vec<usize>, Vec<u8>)> {
        group.iter().map(|t| (t.key.clone(), t.dtype, t.shape.clone(), t.bytes.clone())).collect()
    };
    let write = |path: &Path, group: &[&StoredTensor]| -> Result<()> {
        let owned = as_bytes(group);
        let refs: Vec<checkpoint::TensorBytes<'_>> =
            owned.iter().map(|(k, d, s, b)| (k.as_str(), *d, s.as_slice(), b.as_slice())).collect();
        write_safetensors_atomic(path, &refs, &BTreeMap::new())?;
        Ok(())
    };
    let Some(limit) = part_bytes else {
        write(&out.join(WEIGHTS_FILE), &tensors.iter().collect::<Vec<_>>())?;
        return Ok((1, total));
    };
    let mut groups: Vec<Vec<&StoredTensor>> = vec![Vec::new()];
    let mut size = 0u64;
    for t in tensors {
        let n = t.bytes.len() as u64;
        if size + n >= limit && !groups.last().is_some_and(Vec::is_empty) {
            groups.push(Vec::new());
            size = 0;
        }
        groups.last_mut().expect("one group").push(t);
        size += n;
    }
    let count = groups.len();
    let mut weight_map = serde_json::Map::new();
    for (i, group) in groups.iter().enumerate() {
        let name = format!("{WEIGHTS_PREFIX}-{:05}-of-{count:05}.safetensors", i + 1);
        write(&out.join(&name), group)?;
        for t in group {
            weight_map.insert(t.key.clone(), name.clone().into());
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    write_json_atomic(&out.join(WEIGHTS_INDEX_FILE), &index)?;
    Ok((count, total))
}

/// `config.json` (of the weights actually exported: a rotation unties lm_head) without
/// `quantization_config` (top level and `text_config`), and the other config and tokenizer files
/// of the model directory (msModelSlim copies its `.json`, `.py`, `.txt`, `.jinja` files but
/// weight indexes).
fn copy_config_files(model: &Path, weights_dir: &Path, out: &Path) -> Result<()> {
    let config_path = weights_dir.join("config.json");
    let text = read_text_bounded(&config_path, CONFIG_SIZE_LIMIT)?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", config_path.display()))?;
    if let Some(obj) = config.as_object_mut() {
        obj.remove("quantization_config");
        if let Some(tc) = obj.get_mut("text_config").and_then(|v| v.as_object_mut()) {
            tc.remove("quantization_config");
        }
    }
    write_json_atomic(&out.join("config.json"), &config)?;
    let entries = std::fs::read_dir(model).with_context(|| format!("listing {}", model.display()))?;
    for entry in entries {
        let path = entry.with_context(|| format!("listing {}", model.display()))?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        let wanted = [".json", ".py", ".txt", ".jinja"].iter().any(|s| name.ends_with(s));
        if !wanted || name.ends_with("index.json") || name == "config.json" || !path.is_file() {
            continue;
        }
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        write_atomic_bytes(&out.join(name), &bytes)?;
    }
    Ok(())
}
