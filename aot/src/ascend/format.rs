//! The AscendV1 format itself: quant types and their tags, how one linear's float weight becomes
//! the tensors of its type, int4 packing, the `deq_scale` storage rule and `model_quant_type`.
//!
//! Every rule here follows msModelSlim's AscendV1 saver (PyPI `msmodelslim` 26.1.0,
//! `msmodelslim/core/quant_service/modelslim_v1/save/ascendv1.py`, `utils/pack.py`,
//! `utils/deqscale.py`) and its integer quantization (`msmodelslim/ir/api/impl/int_quantization.py`):
//!
//! | type | tensors of `<linear>.` (dtype, shape) |
//! |---|---|
//! | FLOAT | `weight` (model dtype), `bias` |
//! | W8A16 | `weight` (i8 `[O, I]`), `weight_scale`, `weight_offset` (f32 `[O, 1]`), `bias` (FLOAT, f32) |
//! | W8A8 | `weight` (i8 `[O, I]`), `quant_bias` (i32 `[O]`), `input_scale`, `input_offset` (f32 `[1]`), `deq_scale` (`[O]`: f32 for a bf16 model, else the f32 bits as i64), `bias` (FLOAT, f32) |
//! | W8A8_DYNAMIC | `weight` (i8 `[O, I]`), `weight_scale`, `weight_offset` (zeros) (f32 `[O, 1]`), `bias` (FLOAT, f32) |
//! | W4A8_DYNAMIC | `weight` (i8 `[O/2, I]`, two int4 per byte along O), `weight_scale`, `weight_offset` (zeros) (f32 `[O, 1]`), `scale_bias` (f32 `[O, 1]` column-parallel, `[O, 16]` row-parallel), `bias` (FLOAT, f32) |
//! | W4A8_DYNAMIC per group (`group_size` G > 0) | the same, plus `weight_scale_second` and `weight_offset_second` (zeros) (f32 `[O, I/G]`) |
//!
//! Integer parameters, as msModelSlim computes them (f32, `round` = round half to even):
//! - symmetric per output channel, `b` bits: `scale = max(max(|min(w,0)|, max(w,0)) / (2^(b-1) - 1), eps)`,
//!   `q = clamp(round(w / scale), -2^(b-1), 2^(b-1) - 1)`;
//! - asymmetric int8 per tensor: `scale = max(max(x,0)/255 - min(x,0)/255, eps)`,
//!   `offset = round(-min(x,0) / scale) - 128`, `q = clamp(round(x / scale + offset), -128, 127)`;
//!   (`eps` = f32 machine epsilon).
//! - W8A8: `deq_scale = input_scale * weight_scale`, `correction = sum_k q[o,k] * input_offset`,
//!   `quant_bias = round(bias / deq_scale - correction)`; the device computes
//!   `y = (q_x · q_w + quant_bias) * deq_scale`.
//! - W4A8_DYNAMIC's `scale_bias` is `8 * sum_k w_deq[o, k]` for column-parallel linears and the
//!   same sum over each sixteenth of the input for row-parallel ones (msModelSlim's
//!   `process_scale` with its fixed `tp_num` 16; `msmodelslim/format/common/pack.py`).
//! - W4A8_DYNAMIC per group (msModelSlim's staged layout, written by its
//!   `pytorch/llm_ptq/llm_ptq_tools/save/complex_quantifier.py`; the layout vLLM Ascend's dense
//!   W4A8_DYNAMIC scheme allocates, `vllm_ascend/quantization/methods/w4a8.py`
//!   `AscendW4A8DynamicLinearMethod` up to release v0.26.0rc): `w_deq[o, k] = q[o, k] *
//!   (weight_scale[o] * weight_scale_second[o, k / G])`, vLLM Ascend's `antiquant_scale`
//!   (`process_scale_second`; the offsets are ignored there, symmetric, so they must be 0), and
//!   `scale_bias` is the sums above of that `w_deq`. The description's `group_size` is G.

use checkpoint::StDtype;

use super::error::AscendError;

/// msModelSlim's `QUANT_TYPE_PRIORITY`, lowest first: `model_quant_type` is the highest of these
/// present; a type outside the list (W4A8_DYNAMIC) never sets it.
pub const QUANT_TYPE_PRIORITY: [&str; 13] = [
    "FLOAT",
    "W16A16S",
    "W8A16",
    "W8A8_DYNAMIC",
    "W8A8_MIX",
    "W8A8",
    "WFP8AFP8_DYNAMIC",
    "W8A8_MXFP8",
    "W4A8_MXFP",
    "W4A4_DYNAMIC",
    "W4A4_MXFP4",
    "W4A4_MXFP4_DUALSCALE",
    "W4A4_MXFP4_SVD",
];

/// `model_quant_type` before any listed type was seen (msModelSlim's initial value).
pub const UNKNOWN_MODEL_QUANT_TYPE: &str = "Unknown";

/// The tag of C8 KV-cache parameters and of `kv_cache_type` / `kv_quant_type`.
pub const C8: &str = "C8";

/// `version` of the description.
pub const VERSION: &str = "1.0.0";

/// msModelSlim's fixed tensor-parallel split of a row-parallel W4A8_DYNAMIC `scale_bias`.
pub const SCALE_BIAS_SPLITS: usize = 16;

/// A linear's AscendV1 quant type (the ones this exporter writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuantType {
    Float,
    W8A16,
    W8A8,
    W8A8Dynamic,
    W4A8Dynamic,
}

impl QuantType {
    pub const ALL: [QuantType; 5] =
        [QuantType::Float, QuantType::W8A16, QuantType::W8A8, QuantType::W8A8Dynamic, QuantType::W4A8Dynamic];

    /// The description tag.
    pub fn tag(self) -> &'static str {
        match self {
            QuantType::Float => "FLOAT",
            QuantType::W8A16 => "W8A16",
            QuantType::W8A8 => "W8A8",
            QuantType::W8A8Dynamic => "W8A8_DYNAMIC",
            QuantType::W4A8Dynamic => "W4A8_DYNAMIC",
        }
    }

    /// How the device quantizes this linear's input.
    pub fn activation(self) -> Activation {
        match self {
            QuantType::Float | QuantType::W8A16 => Activation::Float,
            QuantType::W8A8 => Activation::StaticPerTensor,
            QuantType::W8A8Dynamic | QuantType::W4A8Dynamic => Activation::DynamicPerToken,
        }
    }

    /// Parses a tag, naming `argument` in the error.
    pub fn parse(name: &str, argument: &str) -> Result<QuantType, AscendError> {
        QuantType::ALL.into_iter().find(|t| t.tag() == name).ok_or_else(|| AscendError::UnknownQuantType {
            name: name.to_string(),
            argument: argument.to_string(),
            expected: QuantType::ALL.iter().map(|t| t.tag()).collect::<Vec<_>>().join(", "),
        })
    }
}

impl std::str::FromStr for QuantType {
    type Err = AscendError;
    fn from_str(s: &str) -> Result<Self, AscendError> {
        QuantType::parse(s, "AscendOptions::quant_type")
    }
}

/// How a linear's input is quantized on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    Float,
    /// int8, asymmetric, one `input_scale` / `input_offset` calibrated for the tensor.
    StaticPerTensor,
    /// int8, symmetric, one scale per token computed at run time.
    DynamicPerToken,
}

/// `model_quant_type` of a model whose linears carry `tags` (msModelSlim's `update_quant_type`).
pub fn model_quant_type<'a>(tags: impl IntoIterator<Item = &'a str>) -> String {
    let rank = |t: &str| QUANT_TYPE_PRIORITY.iter().position(|p| *p == t);
    let mut best: Option<usize> = None;
    for t in tags {
        if let Some(r) = rank(t) {
            best = Some(best.map_or(r, |b| b.max(r)));
        }
    }
    best.map_or(UNKNOWN_MODEL_QUANT_TYPE.to_string(), |b| QUANT_TYPE_PRIORITY[b].to_string())
}

/// The dtype the model's float tensors are stored in (`torch_dtype` of its config).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatDtype {
    F32,
    F16,
    Bf16,
}

impl FloatDtype {
    pub fn st(self) -> StDtype {
        match self {
            FloatDtype::F32 => StDtype::F32,
            FloatDtype::F16 => StDtype::F16,
            FloatDtype::Bf16 => StDtype::BF16,
        }
    }

    /// `values` in this dtype, little-endian.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            FloatDtype::F32 => f32_bytes(values),
            FloatDtype::F16 => values.iter().flat_map(|&v| half::f16::from_f32(v).to_le_bytes()).collect(),
            FloatDtype::Bf16 => values.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect(),
        }
    }
}

/// Whether a linear's partial sums are split over its input (row-parallel: o/down projections)
/// or its output (column-parallel), by msModelSlim's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parallelism {
    Column,
    Row,
}

impl Parallelism {
    /// msModelSlim's `process_scale` name rule (a substring of the whole module path, column-parallel
    /// names first); `None` for a name it does not know.
    pub fn of(linear: &str) -> Option<Parallelism> {
        if ["up_proj", "gate_proj", "q_proj", "k_proj", "v_proj"].iter().any(|n| linear.contains(n)) {
            Some(Parallelism::Column)
        } else if ["down_proj", "o_proj"].iter().any(|n| linear.contains(n)) {
            Some(Parallelism::Row)
        } else {
            None
        }
    }
}

/// One tensor of the export: key, tag, dtype, shape, little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTensor {
    pub key: String,
    pub tag: String,
    pub dtype: StDtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

impl StoredTensor {
    pub fn new(key: String, tag: &str, dtype: StDtype, shape: Vec<usize>, bytes: Vec<u8>) -> Self {
        StoredTensor { key, tag: tag.to_string(), dtype, shape, bytes }
    }

    fn f32(key: String, tag: &str, shape: Vec<usize>, values: &[f32]) -> Self {
        StoredTensor::new(key, tag, StDtype::F32, shape, f32_bytes(values))
    }
}

pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn i8_bytes(values: &[i8]) -> Vec<u8> {
    values.iter().map(|&v| v as u8).collect()
}

/// f32 machine epsilon, msModelSlim's lower bound of a scale.
const EPS: f32 = f32::EPSILON;

/// Symmetric per-row quantization of `w` (`rows x cols`, row-major) to `bits`: `(q, scale)`.
pub fn quantize_rows_symmetric(w: &[f32], cols: usize, bits: u32) -> (Vec<i8>, Vec<f32>) {
    let qmax = ((1i32 << (bits - 1)) - 1) as f32;
    let qmin = -(1i32 << (bits - 1)) as f32;
    let mut q = Vec::with_capacity(w.len());
    let mut scales = Vec::with_capacity(w.len() / cols.max(1));
    for row in w.chunks_exact(cols) {
        let lo = row.iter().fold(0f32, |m, &v| m.min(v));
        let hi = row.iter().fold(0f32, |m, &v| m.max(v));
        let scale = ((-lo).max(hi) / qmax).max(EPS);
        scales.push(scale);
        q.extend(row.iter().map(|&v| (v / scale).round_ties_even().clamp(qmin, qmax) as i8));
    }
    (q, scales)
}

/// msModelSlim's asymmetric int8 per-tensor parameters of an observed range: `(scale, offset)`.
pub fn asymmetric_int8(min: f32, max: f32) -> (f32, f32) {
    let (lo, hi) = (min.min(0.0), max.max(0.0));
    let scale = (hi / 255.0 - lo / 255.0).max(EPS);
    let offset = (-lo / scale).round_ties_even() - 128.0;
    (scale, offset)
}

/// Symmetric int8 per-channel parameters of an observed absolute maximum (C8's KV cache).
pub fn symmetric_int8_scale(abs_max: f32) -> f32 {
    (abs_max / 127.0).max(EPS)
}

/// Two int4 values per byte along the output dimension: `q` `[out, in]` → `[out / 2, in]`, byte
/// `(i, k)` = `q[2i+1, k] << 4 | (q[2i, k] & 0xF)` (msModelSlim's `w4a8_pack_int4`).
pub fn pack_int4_rows(q: &[i8], out: usize, inp: usize) -> Vec<i8> {
    let mut packed = Vec::with_capacity(out / 2 * inp);
    for i in 0..out / 2 {
        for k in 0..inp {
            let lo = q[2 * i * inp + k] as u8 & 0x0F;
            let hi = (q[(2 * i + 1) * inp + k] as u8) << 4;
            packed.push((hi | lo) as i8);
        }
    }
    packed
}

/// The inverse of [`pack_int4_rows`]: `[out / 2, in]` bytes → `[out, in]` int4 values.
pub fn unpack_int4_rows(packed: &[i8], out: usize, inp: usize) -> Vec<i8> {
    let mut q = vec![0i8; out * inp];
    for i in 0..out / 2 {
        for k in 0..inp {
            let b = packed[i * inp + k];
            q[2 * i * inp + k] = (b << 4) >> 4; // sign-extend the low nibble
            q[(2 * i + 1) * inp + k] = b >> 4;
        }
    }
    q
}

/// `deq_scale` as stored: f32 for a bf16 model, else each f32's bit pattern as an int64
/// (msModelSlim's `deqscale2int64_by_dtype`).
pub fn deq_scale_tensor(key: String, tag: &str, deq: &[f32], dtype: FloatDtype) -> StoredTensor {
    if dtype == FloatDtype::Bf16 {
        return StoredTensor::f32(key, tag, vec![deq.len()], deq);
    }
    let bytes = deq.iter().flat_map(|v| i64::from(v.to_bits() as i32).to_le_bytes()).collect();
    StoredTensor::new(key, tag, StDtype::I64, vec![deq.len()], bytes)
}

/// One linear's float parameters.
#[derive(Clone, Copy, Debug)]
pub struct FloatLinear<'a> {
    pub name: &'a str,
    pub out_features: usize,
    pub in_features: usize,
    /// `[out, in]` row-major.
    pub weight: &'a [f32],
    pub bias: Option<&'a [f32]>,
}

/// A W4A8_DYNAMIC linear's int4 weight quantized per group of `group_size` inputs, as the
/// export's weight method chose it (codes and both scale levels): `w_deq[o, k] = codes[o, k] *
/// (weight_scale[o] * weight_scale_second[o, k / group_size])`.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupedInt4 {
    pub group_size: usize,
    /// `[O, I]` codes in -8..=7.
    pub codes: Vec<i8>,
    /// `[O]` per-channel scales.
    pub weight_scale: Vec<f32>,
    /// `[O, I / group_size]` per-group scales.
    pub weight_scale_second: Vec<f32>,
}

impl GroupedInt4 {
    /// The dequantized weight `[O, I]` (vLLM Ascend's `antiquant_scale` times the code).
    pub fn dequantize(&self, inp: usize) -> Vec<f32> {
        let groups = inp / self.group_size.max(1);
        self.codes
            .iter()
            .enumerate()
            .map(|(n, &q)| {
                let (o, k) = (n / inp, n % inp);
                q as f32 * (self.weight_scale[o] * self.weight_scale_second[o * groups + k / self.group_size])
            })
            .collect()
    }
}

/// Checks that `group_size` tiles linear `name`'s input (`out x inp`), naming all three otherwise.
pub fn check_group_size(name: &str, out: usize, inp: usize, group_size: usize) -> Result<(), AscendError> {
    if group_size == 0 || !inp.is_multiple_of(group_size) {
        return Err(AscendError::CannotPack {
            linear: name.to_string(),
            quant_type: QuantType::W4A8Dynamic.tag().to_string(),
            out_features: out,
            in_features: inp,
            problem: format!("a group size of {group_size} does not divide its {inp} inputs"),
        });
    }
    Ok(())
}

/// Round-to-nearest per-group int4 (msModelSlim's MinMax per group): each group's step is
/// `max|w_g| / 7`, stored as `weight_scale[o] = max_g step` and `weight_scale_second = step /
/// weight_scale[o]`; codes `clamp(round(w / step), -8, 7)` with the step the decoder computes.
pub fn quantize_groups_symmetric(w: &[f32], out: usize, inp: usize, group_size: usize) -> GroupedInt4 {
    let groups = inp / group_size;
    let mut codes = Vec::with_capacity(w.len());
    let mut weight_scale = Vec::with_capacity(out);
    let mut second = Vec::with_capacity(out * groups);
    for row in w.chunks_exact(inp) {
        let steps: Vec<f32> = row
            .chunks_exact(group_size)
            .map(|g| (g.iter().fold(0f32, |m, &v| m.max(v.abs())) / 7.0).max(EPS))
            .collect();
        let s1 = steps.iter().fold(EPS, |m, &v| m.max(v));
        weight_scale.push(s1);
        for (g, &step) in row.chunks_exact(group_size).zip(&steps) {
            let s2 = step / s1;
            second.push(s2);
            let deployed = s1 * s2;
            codes.extend(g.iter().map(|&v| (v / deployed).round_ties_even().clamp(-8.0, 7.0) as i8));
        }
    }
    GroupedInt4 { group_size, codes, weight_scale, weight_scale_second: second }
}

/// `scale_bias` of a W4A8_DYNAMIC linear named `name` with dequantized weight `w_deq` `[O, I]`:
/// `[O, splits]` sums (module docs). The f32 terms are summed in f64, so the stored value is the
/// exact sum rounded once.
fn scale_bias(w_deq: &[f32], out: usize, inp: usize, splits: usize) -> Vec<f32> {
    let part = inp / splits;
    let mut sb = Vec::with_capacity(out * splits);
    for r in 0..out {
        for s in 0..splits {
            let sum: f64 = w_deq[r * inp + s * part..r * inp + (s + 1) * part].iter().map(|&v| f64::from(v)).sum();
            sb.push((8.0 * sum) as f32);
        }
    }
    sb
}

/// The AscendV1 tensors of one linear of type `qt`. `input_range` is the calibrated (min, max) of
/// its input (W8A8 needs it); `dtype` is the model's float dtype.
/// `grouped`, for W4A8_DYNAMIC only, replaces its per-channel round-to-nearest weight by per-group
/// codes and scales ([`GroupedInt4`]).
pub fn linear_tensors(
    lin: &FloatLinear<'_>,
    qt: QuantType,
    input_range: Option<(f32, f32)>,
    grouped: Option<&GroupedInt4>,
    dtype: FloatDtype,
) -> Result<Vec<StoredTensor>, AscendError> {
    let (o, i, name) = (lin.out_features, lin.in_features, lin.name);
    let cannot = |problem: String| AscendError::CannotPack {
        linear: name.to_string(),
        quant_type: qt.tag().to_string(),
        out_features: o,
        in_features: i,
        problem,
    };
    if lin.weight.len() != o * i || o == 0 || i == 0 {
        return Err(cannot(format!("its weight holds {} values", lin.weight.len())));
    }
    if let Some(b) = lin.bias.filter(|b| b.len() != o) {
        return Err(cannot(format!("its bias holds {} values", b.len())));
    }
    if let Some(g) = grouped {
        if qt != QuantType::W4A8Dynamic {
            return Err(cannot("per-group int4 weights are W4A8_DYNAMIC's only".into()));
        }
        check_group_size(name, o, i, g.group_size)?;
        let groups = i / g.group_size;
        if g.codes.len() != o * i || g.weight_scale.len() != o || g.weight_scale_second.len() != o * groups {
            return Err(cannot(format!(
                "its per-group weight holds {} codes, {} weight_scale and {} weight_scale_second values",
                g.codes.len(),
                g.weight_scale.len(),
                g.weight_scale_second.len()
            )));
        }
        if let Some(q) = g.codes.iter().find(|q| !(-8..=7).contains(*q)) {
            return Err(cannot(format!("code {q} is no int4")));
        }
    }
    let key = |suffix: &str| format!("{name}.{suffix}");
    let tag = qt.tag();
    let mut out = Vec::new();
    let float_bias = |out: &mut Vec<StoredTensor>| {
        if let Some(b) = lin.bias {
            out.push(StoredTensor::f32(key("bias"), QuantType::Float.tag(), vec![o], b));
        }
    };
    match qt {
        QuantType::Float => {
            out.push(StoredTensor::new(key("weight"), tag, dtype.st(), vec![o, i], dtype.encode(lin.weight)));
            if let Some(b) = lin.bias {
                out.push(StoredTensor::new(key("bias"), tag, dtype.st(), vec![o], dtype.encode(b)));
            }
        }
        QuantType::W8A16 | QuantType::W8A8Dynamic => {
            let (q, scale) = quantize_rows_symmetric(lin.weight, i, 8);
            out.push(StoredTensor::new(key("weight"), tag, StDtype::I8, vec![o, i], i8_bytes(&q)));
            out.push(StoredTensor::f32(key("weight_scale"), tag, vec![o, 1], &scale));
            out.push(StoredTensor::f32(key("weight_offset"), tag, vec![o, 1], &vec![0.0; o]));
            float_bias(&mut out);
        }
        QuantType::W8A8 => {
            let (min, max) = input_range.ok_or_else(|| cannot("no calibrated input range".into()))?;
            if !min.is_finite() || !max.is_finite() {
                return Err(cannot(format!("its calibrated input range [{min}, {max}] is not finite")));
            }
            let (input_scale, input_offset) = asymmetric_int8(min, max);
            let (q, weight_scale) = quantize_rows_symmetric(lin.weight, i, 8);
            let deq: Vec<f32> = weight_scale.iter().map(|ws| input_scale * ws).collect();
            let quant_bias: Vec<i32> = (0..o)
                .map(|r| {
                    let sum: f32 = q[r * i..(r + 1) * i].iter().map(|&v| v as f32).sum();
                    let correction = sum * input_offset;
                    let bias = lin.bias.map_or(0.0, |b| b[r]);
                    (bias / deq[r] - correction).round_ties_even() as i32
                })
                .collect();
            out.push(StoredTensor::new(key("weight"), tag, StDtype::I8, vec![o, i], i8_bytes(&q)));
            out.push(StoredTensor::new(
                key("quant_bias"),
                tag,
                StDtype::I32,
                vec![o],
                quant_bias.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ));
            out.push(StoredTensor::f32(key("input_scale"), tag, vec![1], &[input_scale]));
            out.push(StoredTensor::f32(key("input_offset"), tag, vec![1], &[input_offset]));
            out.push(deq_scale_tensor(key("deq_scale"), tag, &deq, dtype));
            float_bias(&mut out);
        }
        QuantType::W4A8Dynamic => {
            if o % 2 != 0 {
                return Err(cannot(format!("{o} output channels cannot be packed two int4 per int8")));
            }
            let parallel =
                Parallelism::of(name).ok_or_else(|| AscendError::UnknownParallelism { linear: name.into() })?;
            if parallel == Parallelism::Row && i % SCALE_BIAS_SPLITS != 0 {
                return Err(cannot(format!(
                    "a row-parallel scale_bias splits the {i} inputs into {SCALE_BIAS_SPLITS} equal parts"
                )));
            }
            let splits = if parallel == Parallelism::Row { SCALE_BIAS_SPLITS } else { 1 };
            let (q, scale, w_deq) = match grouped {
                Some(g) => (g.codes.clone(), g.weight_scale.clone(), g.dequantize(i)),
                None => {
                    let (q, scale) = quantize_rows_symmetric(lin.weight, i, 4);
                    // The f32 products msModelSlim sums (its dequantized weight).
                    let w_deq = q.iter().enumerate().map(|(n, &v)| v as f32 * scale[n / i]).collect();
                    (q, scale, w_deq)
                }
            };
            out.push(StoredTensor::new(
                key("weight"),
                tag,
                StDtype::I8,
                vec![o / 2, i],
                i8_bytes(&pack_int4_rows(&q, o, i)),
            ));
            out.push(StoredTensor::f32(key("weight_scale"), tag, vec![o, 1], &scale));
            out.push(StoredTensor::f32(key("weight_offset"), tag, vec![o, 1], &vec![0.0; o]));
            if let Some(g) = grouped {
                let groups = i / g.group_size;
                out.push(StoredTensor::f32(key("weight_scale_second"), tag, vec![o, groups], &g.weight_scale_second));
                out.push(StoredTensor::f32(key("weight_offset_second"), tag, vec![o, groups], &vec![0.0; o * groups]));
            }
            out.push(StoredTensor::f32(key("scale_bias"), tag, vec![o, splits], &scale_bias(&w_deq, o, i, splits)));
            float_bias(&mut out);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int4_packing_round_trips_and_matches_the_documented_nibble_order() {
        let q: Vec<i8> = vec![-8, 7, 1, -1, 3, -2, 0, 5]; // [4, 2]
        let packed = pack_int4_rows(&q, 4, 2);
        // byte (0, 0): q[1,0]=1 << 4 | q[0,0]=-8 & 0xF = 0x18.
        assert_eq!(packed[0] as u8, 0x18);
        // byte (0, 1): q[1,1]=-1 -> 0xF0 | q[0,1]=7 -> 0xF7.
        assert_eq!(packed[1] as u8, 0xF7);
        assert_eq!(unpack_int4_rows(&packed, 4, 2), q);
    }

    #[test]
    fn model_quant_type_follows_the_priority_and_ignores_unlisted_types() {
        assert_eq!(model_quant_type(["FLOAT", "W8A8", "W8A8_DYNAMIC"]), "W8A8");
        assert_eq!(model_quant_type(["W8A16", "W8A8_DYNAMIC", "FLOAT"]), "W8A8_DYNAMIC");
        assert_eq!(model_quant_type(["W4A8_DYNAMIC", "FLOAT"]), "FLOAT");
        assert_eq!(model_quant_type(["W4A8_DYNAMIC"]), UNKNOWN_MODEL_QUANT_TYPE);
    }

    #[test]
    fn per_group_int4_rounds_each_group_on_its_own_step() {
        // One row, two groups of 4: a large group and a small one keep their own steps.
        let w = vec![7.0f32, -3.5, 1.2, 0.0, 0.875, -0.4375, 0.15, 0.0];
        let g = quantize_groups_symmetric(&w, 1, 8, 4);
        assert_eq!(g.weight_scale, vec![1.0]);
        assert_eq!(g.weight_scale_second, vec![1.0, 0.125]);
        assert_eq!(g.codes, vec![7, -4, 1, 0, 7, -4, 1, 0]); // -3.5 ties to even
        assert_eq!(g.dequantize(8), vec![7.0, -4.0, 1.0, 0.0, 0.875, -0.5, 0.125, 0.0]);
    }

    #[test]
    fn per_group_w4a8_writes_the_second_scales_and_sums_the_grouped_weight() {
        let (o, i, gs) = (4usize, 32usize, 16usize);
        let w: Vec<f32> =
            (0..o * i).map(|n| ((n * 37 % 23) as f32 - 11.0) / (1.0 + (n % i / gs) as f32 * 9.0)).collect();
        let g = quantize_groups_symmetric(&w, o, i, gs);
        let lin = FloatLinear {
            name: "m.layers.0.self_attn.o_proj",
            out_features: o,
            in_features: i,
            weight: &w,
            bias: None,
        };
        let t = linear_tensors(&lin, QuantType::W4A8Dynamic, None, Some(&g), FloatDtype::Bf16).unwrap();
        let find = |k: &str| t.iter().find(|x| x.key == format!("m.layers.0.self_attn.o_proj.{k}")).unwrap();
        assert_eq!((find("weight").dtype, find("weight").shape.clone()), (StDtype::I8, vec![o / 2, i]));
        assert_eq!((find("weight_scale").dtype, find("weight_scale").shape.clone()), (StDtype::F32, vec![o, 1]));
        assert_eq!(find("weight_scale_second").shape, vec![o, i / gs]);
        let off = find("weight_offset_second");
        assert_eq!((off.dtype, off.shape.clone()), (StDtype::F32, vec![o, i / gs]));
        assert!(off.bytes.iter().all(|&b| b == 0));
        // Row-parallel: 16 sums of 2 inputs each, of the per-group dequantized weight.
        let sb = find("scale_bias");
        assert_eq!(sb.shape, vec![o, SCALE_BIAS_SPLITS]);
        let deq = g.dequantize(i);
        let got = f32::from_le_bytes(sb.bytes[4..8].try_into().unwrap());
        assert_eq!(got, (8.0 * (f64::from(deq[2]) + f64::from(deq[3]))) as f32);
        let packed: Vec<i8> = find("weight").bytes.iter().map(|&b| b as i8).collect();
        assert_eq!(unpack_int4_rows(&packed, o, i), g.codes);
    }

    #[test]
    fn a_group_size_that_does_not_divide_the_input_names_the_linear_and_the_sizes() {
        let e = check_group_size("model.layers.3.mlp.down_proj", 576, 1536, 100).unwrap_err();
        let m = e.to_string();
        for part in ["model.layers.3.mlp.down_proj", "100", "1536", "576 x 1536"] {
            assert!(m.contains(part), "{m}");
        }
        assert!(check_group_size("x.up_proj", 8, 64, 0).is_err());
        let w = vec![0.5f32; 2 * 8];
        let g = quantize_groups_symmetric(&w, 2, 8, 4);
        let lin = FloatLinear { name: "m.q_proj", out_features: 2, in_features: 8, weight: &w, bias: None };
        let e = linear_tensors(&lin, QuantType::W8A8Dynamic, None, Some(&g), FloatDtype::F32).unwrap_err();
        assert!(matches!(e, AscendError::CannotPack { .. }), "{e}");
        let bad = GroupedInt4 { group_size: 3, ..g };
        let e = linear_tensors(&lin, QuantType::W4A8Dynamic, None, Some(&bad), FloatDtype::F32).unwrap_err();
        assert!(e.to_string().contains("group size of 3"), "{e}");
    }

    #[test]
    fn unknown_tags_and_unpackable_dims_are_named_errors() {
        let e = "W3A8".parse::<QuantType>().unwrap_err();
        assert!(e.to_string().contains("W3A8") && e.to_string().contains("AscendOptions::quant_type"), "{e}");
        let w = vec![0.5f32; 3 * 4];
        let lin =
            FloatLinear { name: "m.layers.0.mlp.up_proj", out_features: 3, in_features: 4, weight: &w, bias: None };
        let e = linear_tensors(&lin, QuantType::W4A8Dynamic, None, None, FloatDtype::F32).unwrap_err();
        assert!(matches!(e, AscendError::CannotPack { .. }), "{e}");
        let lin = FloatLinear { name: "m.lm_head", out_features: 2, in_features: 6, weight: &w, bias: None };
        let e = linear_tensors(&lin, QuantType::W4A8Dynamic, None, None, FloatDtype::F32).unwrap_err();
        assert!(matches!(e, AscendError::UnknownParallelism { .. }), "{e}");
        let lin = FloatLinear { name: "m.o_proj", out_features: 2, in_features: 6, weight: &w, bias: None };
        let e = linear_tensors(&lin, QuantType::W4A8Dynamic, None, None, FloatDtype::F32).unwrap_err();
        assert!(e.to_string().contains("16 equal parts"), "{e}");
    }
}
