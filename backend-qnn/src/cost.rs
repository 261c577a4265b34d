//! What one call of a lowered graph costs on the phone: a roofline model over the graph's own
//! tensors, and the target table it is evaluated on.
//!
//! [`GraphCost::of`] counts, for one call of a [`QnnGraph`]:
//! - multiply-accumulates of every matrix product ([`node_macs`]), split into products against
//!   static weights and products between activations (attention scores and their weighted sum over
//!   the whole context window: `chunk x heads x head_dim x context` each), and by operand width
//!   (a 16-bit operand runs at HMX's 16-bit rate);
//! - bytes read from DRAM: every static tensor once (weights, LPBQ scales; of a table read through
//!   a Gather, such as the embedding and the RoPE tables, only the rows gathered), the past
//!   K/V inputs (`past_key_*`, `past_value_*`: the whole `context - chunk` window, masked or not,
//!   since the graph is static), the other inputs; bytes written: the new K/V (`present_*`) and the
//!   other outputs (logits).
//!
//! [`HtpPerf::call`] turns that into seconds: `overhead + max(compute, memory)`, compute being
//! `2 x MACs / (peak ops x compute efficiency)` and memory `bytes / (DRAM bandwidth x bandwidth
//! efficiency)`. The peaks come from public specifications ([`HtpPerf::sm8650`],
//! [`HtpPerf::sm8750`], each figure with its source); the two efficiencies are not fitted to the
//! figure the model is judged against: [`Efficiencies::from_measurement`] derives them from one
//! public measurement on SM8750 (Qualcomm AI Hub's Llama-3.2-1B W4A16) through this same model, and
//! [`Calibration::mllm_qwen3_1_7b_sm8650`] then compares the result with mllm's Qwen3-1.7B figures
//! on SM8650, which played no part in choosing them.
//!
//! [`DecoderShapes`] gives the same counts from a decoder's dimensions without lowering a
//! checkpoint (for model sizes not at hand); a test holds it equal to [`GraphCost::of`] on lowered
//! graphs.

use crate::artifacts::summary::node_macs;
use crate::dtype::TensorType;
use crate::encoding::Encoding;
use crate::graph::{Param, QnnGraph};
use crate::opdef::OpType;

/// What one call of a graph does: arithmetic and DRAM traffic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GraphCost {
    /// New tokens per call (`input_ids` elements).
    pub chunk: usize,
    /// The attention window (`attention_mask`'s last dimension); 0 when the graph has no mask.
    pub context_len: usize,
    /// Multiply-accumulates against static weights (projections, MLP, lm_head).
    pub weight_macs: u64,
    /// Multiply-accumulates between activations (attention over the context window).
    pub attention_macs: u64,
    /// Of all multiply-accumulates, those with a 16-bit (or wider) operand.
    pub wide_macs: u64,
    /// Static data read per call (weights and their scales at the device's widths, constants,
    /// the gathered rows of tables).
    pub weight_bytes: u64,
    /// Past K/V read per call (every layer, the whole past window).
    pub kv_read_bytes: u64,
    /// New K/V written per call.
    pub kv_written_bytes: u64,
    /// Other inputs read and outputs written (ids, positions, mask, logits).
    pub io_bytes: u64,
}

impl GraphCost {
    /// The cost of one call of `graph`.
    pub fn of(graph: &QnnGraph) -> GraphCost {
        let index = graph.tensor_index();
        let tensor = |name: &str| index.get(name).map(|&i| &graph.tensors[i]);
        let bytes = |name: &str| tensor(name).map_or(0, |t| t.numel() * u64::from(t.dtype.bit_width()) / 8);
        // A table read through a Gather (the embedding, the RoPE tables) costs the rows gathered,
        // not the whole table; every other static tensor is read whole.
        let mut gathered: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        for node in graph.nodes.iter().filter(|n| n.op_type == OpType::Gather) {
            let (Some(table), Some(out)) = (node.inputs.first(), node.outputs.first()) else { continue };
            if tensor(table).is_some_and(|t| t.tensor_type == TensorType::Static) {
                *gathered.entry(table.as_str()).or_default() += bytes(out);
            }
        }
        let static_read: u64 = graph
            .tensors
            .iter()
            .filter(|t| t.data.is_some())
            .map(|t| gathered.get(t.name.as_str()).copied().unwrap_or_else(|| stored_bytes(t)))
            .sum();
        let param_bytes: u64 = graph
            .nodes
            .iter()
            .flat_map(|n| n.params.iter())
            .filter_map(|(_, p)| match p {
                Param::Tensor(t) if t.data.is_some() => Some(stored_bytes(t)),
                _ => None,
            })
            .sum();
        let mut cost = GraphCost {
            chunk: graph.inputs.first().and_then(|n| tensor(n)).map_or(0, |t| t.numel() as usize),
            context_len: tensor("attention_mask").and_then(|t| t.dims.last()).map_or(0, |&d| d as usize),
            weight_bytes: static_read + param_bytes,
            ..GraphCost::default()
        };
        for name in &graph.inputs {
            if name.starts_with("past_key") || name.starts_with("past_value") {
                cost.kv_read_bytes += bytes(name);
            } else {
                cost.io_bytes += bytes(name);
            }
        }
        for name in &graph.outputs {
            if name.starts_with("present_key") || name.starts_with("present_value") {
                cost.kv_written_bytes += bytes(name);
            } else {
                cost.io_bytes += bytes(name);
            }
        }
        for node in &graph.nodes {
            let macs = node_macs(node, graph, &index);
            if macs == 0 {
                continue;
            }
            let operands: Vec<_> = node.inputs.iter().take(2).filter_map(|n| tensor(n)).collect();
            let static_weight = operands.get(1).is_some_and(|t| t.tensor_type == TensorType::Static)
                || matches!(node.param("weights"), Some(Param::Tensor(_)));
            if static_weight {
                cost.weight_macs += macs;
            } else {
                cost.attention_macs += macs;
            }
            if operands.iter().any(|t| t.dtype.bit_width() > 8) {
                cost.wide_macs += macs;
            }
        }
        cost
    }

    /// All multiply-accumulates of one call.
    pub fn macs(&self) -> u64 {
        self.weight_macs + self.attention_macs
    }

    /// All bytes moved to or from DRAM in one call.
    pub fn dram_bytes(&self) -> u64 {
        self.weight_bytes + self.kv_read_bytes + self.kv_written_bytes + self.io_bytes
    }
}

/// Bytes a static tensor occupies on the device: its elements at the data type's width (4-bit
/// codes packed two to a byte, whatever container the artifact stores them in) plus its
/// quantization scales (LPBQ: one block multiplier of `block_scale_bitwidth` bits per block and
/// one f32 scale per output channel).
fn stored_bytes(t: &crate::graph::QnnTensor) -> u64 {
    let codes = (t.numel() * u64::from(t.dtype.bit_width())).div_ceil(8);
    let scales = match &t.encoding {
        Encoding::BlockwiseExpansion(b) => {
            (b.block_scales.len() as u64 * u64::from(b.block_scale_bitwidth)).div_ceil(8)
                + 4 * b.scale_offsets.len() as u64
        }
        Encoding::AxisScaleOffset { scale_offsets, .. } => 4 * scale_offsets.len() as u64,
        _ => 0,
    };
    codes + scales
}

/// A decoder's dimensions and storage widths: [`GraphCost`]s without lowering a checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct DecoderShapes {
    pub layers: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub vocab: u64,
    /// Bits per stored weight of the decoder's linears with their per-block scales (LPBQ int4:
    /// 4 plus one 4-bit scale per 16 weights).
    pub weight_bits: f64,
    /// Bits per stored weight of the lm_head, likewise.
    pub lm_head_bits: f64,
    /// Bytes per output channel of every linear and the lm_head (LPBQ: one f32 scale).
    pub channel_scale_bytes: u64,
    /// Bits per K/V cache element.
    pub kv_bits: u64,
    /// Bits per activation element (16 for A16).
    pub act_bits: u64,
}

impl DecoderShapes {
    /// Qwen3-1.7B (its HF `config.json`: 28 layers, hidden 2048, MLP 6144, 16 query / 8 K/V heads
    /// of 128, vocabulary 151936), W4A16 with 8-bit K/V as mllm compiles it: LPBQ block 16 (4-bit
    /// codes, one 4-bit scale per 16 weights, one f32 scale per output channel) for the linears and
    /// the lm_head.
    pub fn qwen3_1_7b() -> DecoderShapes {
        DecoderShapes {
            layers: 28,
            hidden: 2048,
            intermediate: 6144,
            heads: 16,
            kv_heads: 8,
            head_dim: 128,
            vocab: 151_936,
            weight_bits: 4.25,
            lm_head_bits: 4.25,
            channel_scale_bytes: 4,
            kv_bits: 8,
            act_bits: 16,
        }
    }

    /// Llama-3.2-1B (its HF `config.json`: 16 layers, hidden 2048, MLP 8192, 32 query / 8 K/V
    /// heads of 64, vocabulary 128256) stored as Qualcomm AI Hub's W4A16 export is taken to be
    /// here: 4-bit weights with the same scale overhead as ours, 8-bit K/V.
    pub fn llama3_2_1b() -> DecoderShapes {
        DecoderShapes {
            layers: 16,
            hidden: 2048,
            intermediate: 8192,
            heads: 32,
            kv_heads: 8,
            head_dim: 64,
            vocab: 128_256,
            weight_bits: 4.25,
            lm_head_bits: 4.25,
            channel_scale_bytes: 4,
            kv_bits: 8,
            act_bits: 16,
        }
    }

    /// Weights of one decoder layer's linears (q, k, v, o, gate, up, down).
    fn layer_weights(&self) -> u64 {
        let (h, q, kv) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        h * q + 2 * h * kv + q * h + 3 * h * self.intermediate
    }

    /// Output channels of one decoder layer's linears (q, k, v, o, gate, up, down).
    fn layer_channels(&self) -> u64 {
        let (h, q, kv) = (self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim);
        q + 2 * kv + h + 2 * self.intermediate + h
    }

    /// One call of the graph for `chunk` new tokens at context `context_len`.
    pub fn call(&self, chunk: usize, context_len: usize) -> GraphCost {
        let (s, c) = (chunk as u64, context_len as u64);
        let linear = self.layers * self.layer_weights();
        let lm_head = self.hidden * self.vocab;
        let weight_macs = s * (linear + lm_head);
        // Scores Q·K^T and their weighted sum of V, every query head over the whole window.
        let attention_macs = self.layers * 2 * s * self.heads * self.head_dim * c;
        let bytes = |elems: u64, bits: f64| (elems as f64 * bits / 8.0).round() as u64;
        let kv_elems = |cols: u64| self.layers * 2 * self.kv_heads * self.head_dim * cols;
        GraphCost {
            chunk,
            context_len,
            weight_macs,
            attention_macs,
            wide_macs: if self.act_bits > 8 { weight_macs + attention_macs } else { 0 },
            // The linears and the lm_head with their per-channel scales; the u16 embedding and RoPE
            // (sin, cos) rows gathered for the chunk; the u16 RMSNorm weights and their runtime
            // biases (two norms per layer, Qwen3's q/k norms, the final one).
            weight_bytes: bytes(linear, self.weight_bits)
                + bytes(lm_head, self.lm_head_bits)
                + (self.layers * self.layer_channels() + self.vocab) * self.channel_scale_bytes
                + s * (self.hidden + 2 * self.head_dim) * 2
                + 2 * (self.layers * (2 * self.hidden + 2 * self.head_dim) + self.hidden) * 2,
            kv_read_bytes: kv_elems(c - s) * self.kv_bits / 8,
            kv_written_bytes: kv_elems(s) * self.kv_bits / 8,
            // ids and positions (i32), the u16 mask, u16 logits.
            io_bytes: s * 8 + s * c * 2 + s * self.vocab * self.act_bits / 8,
        }
    }
}

/// Where a call's time goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallTime {
    /// Arithmetic at the achieved HMX rate.
    pub compute_s: f64,
    /// DRAM traffic at the achieved bandwidth.
    pub memory_s: f64,
    /// Fixed cost of one graph execution.
    pub overhead_s: f64,
}

impl CallTime {
    /// `overhead + max(compute, memory)`: the two overlap, the overhead does not.
    pub fn total_s(&self) -> f64 {
        self.overhead_s + self.compute_s.max(self.memory_s)
    }

    /// Which of the two bounds the call.
    pub fn bound(&self) -> &'static str {
        if self.compute_s >= self.memory_s {
            "compute"
        } else {
            "memory"
        }
    }
}

/// The fraction of the peaks a real LLM run reaches, derived from one measurement.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Efficiencies {
    /// Achieved / peak DRAM bandwidth.
    pub bandwidth: f64,
    /// Achieved / peak HMX rate.
    pub compute: f64,
}

impl Efficiencies {
    /// From a model measured on `peaks`' SoC: its decode rate (one `decode` call per token) and
    /// its time to first token for a prompt that is one `prefill` call. The decode call is taken
    /// as memory-bound and the prefill call as compute-bound, each checked against the other
    /// bound: a measurement that contradicts that assumption yields `None`.
    pub fn from_measurement(
        peaks: &HtpPerf,
        decode: &GraphCost,
        decode_tok_s: f64,
        prefill: &GraphCost,
        first_token_s: f64,
    ) -> Option<Efficiencies> {
        let decode_s = 1.0 / decode_tok_s - peaks.call_overhead_s;
        let prefill_s = first_token_s - peaks.call_overhead_s;
        if !(decode_s > 0.0 && prefill_s > 0.0) {
            return None;
        }
        let bandwidth = decode.dram_bytes() as f64 / (peaks.dram_bytes_per_s * decode_s);
        let compute = peaks.ops_seconds(prefill) / prefill_s;
        let e = Efficiencies { bandwidth, compute };
        let fine = |x: f64| x.is_finite() && x > 0.0 && x <= 1.0;
        // The other bound of each call must not be the longer one.
        let decode_compute = peaks.ops_seconds(decode) / compute;
        let prefill_memory = prefill.dram_bytes() as f64 / (peaks.dram_bytes_per_s * bandwidth);
        (fine(bandwidth) && fine(compute) && decode_compute <= decode_s && prefill_memory <= prefill_s).then_some(e)
    }
}

/// One target SoC's figures: peaks from public specifications, efficiencies from a measurement.
#[derive(Clone, Debug, PartialEq)]
pub struct HtpPerf {
    /// `SM8650` (HTP v75), `SM8750` (HTP v79).
    pub soc: &'static str,
    pub htp_arch: u32,
    /// Peak DRAM bandwidth, bytes per second.
    pub dram_bytes_per_s: f64,
    /// Peak 8-bit operations per second (2 per multiply-accumulate).
    pub int8_ops_per_s: f64,
    /// Peak operations per second with a 16-bit operand.
    pub int16_ops_per_s: f64,
    /// Fixed cost of one graph execution (CPU -> HTP call and return), seconds.
    pub call_overhead_s: f64,
    pub efficiency: Efficiencies,
    /// Where every figure comes from.
    pub sources: &'static [&'static str],
}

/// Peak-only efficiencies (before [`Efficiencies::from_measurement`]).
const PEAK: Efficiencies = Efficiencies { bandwidth: 1.0, compute: 1.0 };

/// Calls to the HTP cost at least a few hundred microseconds of cache maintenance and signalling
/// (Hexagon SDK documentation, "System optimizations: IPC performance considerations").
const CALL_OVERHEAD_S: f64 = 300e-6;

/// HMX multiplies a 16-bit operand in two 8-bit passes: half the 8-bit rate. Qualcomm publishes no
/// 16-bit figure; this factor is the model's assumption.
const INT16_RATE: f64 = 0.5;

impl HtpPerf {
    /// Snapdragon 8 Gen 3 (SM8650, HTP v75), peaks only.
    pub fn sm8650_peaks() -> HtpPerf {
        let int8 = 45e12;
        HtpPerf {
            soc: "SM8650",
            htp_arch: 75,
            // LPDDR5X at up to 4800 MHz (9600 MT/s) on a 64-bit bus: 76.8 GB/s.
            dram_bytes_per_s: 9600e6 * 8.0,
            int8_ops_per_s: int8,
            int16_ops_per_s: int8 * INT16_RATE,
            call_overhead_s: CALL_OVERHEAD_S,
            efficiency: PEAK,
            sources: &[
                "LPDDR5X up to 4800 MHz: Qualcomm's launch specifications as reported at \
                 https://droidholic.com/snapdragon-8-gen-3-launched/ (76.8 GB/s: \
                 https://runlocalai.co/hardware/snapdragon-8-gen-3)",
                "Hexagon NPU 45 TOPS INT8: https://runlocalai.co/hardware/snapdragon-8-gen-3",
                "16-bit operand at half the 8-bit rate: this model's assumption (no published figure)",
                "call overhead, a few hundred microseconds per HTP invocation: Hexagon SDK documentation, \
                 System optimizations (mirror: http://libfast.cn/HSDK/software/system_performance/system_optimizations.html)",
            ],
        }
    }

    /// Snapdragon 8 Elite (SM8750, HTP v79), peaks only.
    pub fn sm8750_peaks() -> HtpPerf {
        // Qualcomm: the Hexagon NPU is 45% faster than the previous generation's.
        let int8 = 45e12 * 1.45;
        HtpPerf {
            soc: "SM8750",
            htp_arch: 79,
            // LPDDR5X at 5300 MHz (10600 MT/s) on a 64-bit bus: 84.8 GB/s.
            dram_bytes_per_s: 10600e6 * 8.0,
            int8_ops_per_s: int8,
            int16_ops_per_s: int8 * INT16_RATE,
            call_overhead_s: CALL_OVERHEAD_S,
            efficiency: PEAK,
            sources: &[
                "LPDDR5X 5300 MHz, 84.8 GB/s: https://geektopia.es/es/technology/2024/10/22/noticias/\
                 qualcomm-anuncia-el-snapdragon-8-elite-para-moviles-de-gama-alta.html",
                "NPU 45% faster than Snapdragon 8 Gen 3's 45 TOPS INT8: \
                 https://hi-tech.ua/en/qualcomm-snapdragon-8-elite-or-8-gen-4-is-the-new-top-processor-for-smartphones/",
                "16-bit operand at half the 8-bit rate: this model's assumption (no published figure)",
                "call overhead, a few hundred microseconds per HTP invocation: Hexagon SDK documentation, \
                 System optimizations (mirror: http://libfast.cn/HSDK/software/system_performance/system_optimizations.html)",
            ],
        }
    }

    /// Every target of the table, with the efficiencies of [`Calibration::reference_efficiencies`].
    pub fn table() -> Vec<HtpPerf> {
        let e = Calibration::reference_efficiencies();
        [HtpPerf::sm8650_peaks(), HtpPerf::sm8750_peaks()].into_iter().map(|t| HtpPerf { efficiency: e, ..t }).collect()
    }

    /// The target of [`HtpPerf::table`] named `name` (`sm8650`, `v75`, `sm8750`, `v79`; any case).
    pub fn by_name(name: &str) -> Option<HtpPerf> {
        let n = name.to_ascii_lowercase();
        HtpPerf::table().into_iter().find(|t| t.soc.to_ascii_lowercase() == n || format!("v{}", t.htp_arch) == n)
    }

    /// The arithmetic of `cost` at the peak rates, seconds.
    fn ops_seconds(&self, cost: &GraphCost) -> f64 {
        let narrow = cost.macs() - cost.wide_macs.min(cost.macs());
        2.0 * (cost.wide_macs as f64 / self.int16_ops_per_s + narrow as f64 / self.int8_ops_per_s)
    }

    /// The modelled time of one call of `cost`.
    pub fn call(&self, cost: &GraphCost) -> CallTime {
        CallTime {
            compute_s: self.ops_seconds(cost) / self.efficiency.compute,
            memory_s: cost.dram_bytes() as f64 / (self.dram_bytes_per_s * self.efficiency.bandwidth),
            overhead_s: self.call_overhead_s,
        }
    }

    /// New tokens per second of back-to-back calls of `cost` (chunk / time per call).
    pub fn tokens_per_s(&self, cost: &GraphCost) -> f64 {
        cost.chunk as f64 / self.call(cost).total_s()
    }
}

/// The model's figures set against public measurements.
#[derive(Clone, Debug, PartialEq)]
pub struct Calibration {
    /// Modelled, measured, modelled / measured.
    pub prefill_tok_s: (f64, f64, f64),
    pub decode_tok_s: (f64, f64, f64),
}

/// Qualcomm AI Hub, `qai_hub_models/models/llama_v3_2_1b_instruct/perf.yaml` (quic/ai-hub-models):
/// Llama-3.2-1B-Instruct W4A16 with Genie on the Snapdragon 8 Elite QRD, context 4096: 53.6399
/// tokens per second, time to first token 37.0651 ms at the shortest prompt (one 128-token call).
const AI_HUB_LLAMA_1B_SM8750: (f64, f64) = (53.6399, 37.0651e-3);

/// mllm's Qwen3-1.7B W4A16 (KV 8-bit) on SM8650, chunk 32, context 1024, prompt 640 and 128 new
/// tokens: prefill 758 and decode 25.8 tokens per second (UbiquitousLearning/mllm's QNN AOT
/// write-up).
pub const MLLM_QWEN3_1_7B_SM8650: (f64, f64) = (758.0, 25.8);

impl Calibration {
    /// The efficiencies every target uses: from AI Hub's Llama-3.2-1B on SM8750 (decode as one
    /// 1-token call, the shortest prompt as one 128-token call, both at context 4096). The same
    /// fractions are applied to SM8650: one runtime, one generation apart.
    pub fn reference_efficiencies() -> Efficiencies {
        let (decode_tok_s, first_token_s) = AI_HUB_LLAMA_1B_SM8750;
        let llama = DecoderShapes::llama3_2_1b();
        Efficiencies::from_measurement(
            &HtpPerf::sm8750_peaks(),
            &llama.call(1, 4096),
            decode_tok_s,
            &llama.call(128, 4096),
            first_token_s,
        )
        .expect("AI Hub's Llama-3.2-1B figures fit the model (a unit test holds this)")
    }

    /// The model's Qwen3-1.7B on SM8650 at mllm's shapes (chunk 32 and 1, context 1024, prompt
    /// 640) against mllm's measurement ([`MLLM_QWEN3_1_7B_SM8650`]).
    pub fn mllm_qwen3_1_7b_sm8650() -> Calibration {
        let target = HtpPerf::table().into_iter().find(|t| t.soc == "SM8650").expect("SM8650 is in the table");
        let qwen = DecoderShapes::qwen3_1_7b();
        let prompt = 640.0;
        let prefill_s = (prompt / 32.0) * target.call(&qwen.call(32, 1024)).total_s();
        let decode_s = target.call(&qwen.call(1, 1024)).total_s();
        let (prefill, decode) = (prompt / prefill_s, 1.0 / decode_s);
        let (mp, md) = MLLM_QWEN3_1_7B_SM8650;
        Calibration { prefill_tok_s: (prefill, mp, prefill / mp), decode_tok_s: (decode, md, decode / md) }
    }
}

/// Per-graph figures as `report.json` and the summaries carry them.
pub fn cost_json(cost: &GraphCost, targets: &[HtpPerf]) -> serde_json::Value {
    let mut per_target = serde_json::Map::new();
    for t in targets {
        let call = t.call(cost);
        let rate = if cost.chunk == 1 { "decode_tok_s" } else { "prefill_tok_s" };
        let mut row = serde_json::json!({
            "ms_per_call": round3(call.total_s() * 1e3),
            "compute_ms": round3(call.compute_s * 1e3),
            "memory_ms": round3(call.memory_s * 1e3),
            "bound": call.bound(),
        });
        row[rate] = serde_json::json!(round3(t.tokens_per_s(cost)));
        per_target.insert(format!("{} (v{})", t.soc, t.htp_arch), row);
    }
    serde_json::json!({
        "chunk": cost.chunk,
        "context_len": cost.context_len,
        "macs": cost.macs(),
        "weight_macs": cost.weight_macs,
        "attention_macs": cost.attention_macs,
        "weight_bytes": cost.weight_bytes,
        "kv_read_bytes": cost.kv_read_bytes,
        "kv_written_bytes": cost.kv_written_bytes,
        "io_bytes": cost.io_bytes,
        "modelled": per_target,
    })
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_measurement_fits_the_model() {
        let e = Calibration::reference_efficiencies();
        assert!(e.bandwidth > 0.05 && e.bandwidth <= 1.0, "{e:?}");
        assert!(e.compute > 0.05 && e.compute <= 1.0, "{e:?}");
    }

    /// mllm's measurement played no part in the efficiencies; the model must still land within a
    /// factor of two of it either way (prefill and decode).
    #[test]
    fn the_model_is_within_a_factor_of_two_of_mllms_sm8650_figures() {
        let c = Calibration::mllm_qwen3_1_7b_sm8650();
        for (what, (_, _, ratio)) in [("prefill", c.prefill_tok_s), ("decode", c.decode_tok_s)] {
            assert!((0.5..=2.0).contains(&ratio), "{what}: {c:?}");
        }
    }

    #[test]
    fn qwen3_1_7b_counts_match_its_published_size() {
        // Qwen3-1.7B: 1.7B parameters with the tied embedding (2.03B counting it twice, as the
        // lm_head is a separate matrix here): non-embedding 1.4B (Qwen3 model card).
        let q = DecoderShapes::qwen3_1_7b();
        let non_embedding = q.layers * q.layer_weights();
        assert!((1.35e9..1.45e9).contains(&(non_embedding as f64)), "{non_embedding}");
        let c = q.call(1, 1024);
        // Every layer's past K and V: 28 x 2 x 8 x 128 x 1023 bytes.
        assert_eq!(c.kv_read_bytes, 28 * 2 * 8 * 128 * 1023);
        assert_eq!(c.kv_written_bytes, 28 * 2 * 8 * 128);
        // Attention over the whole window grows with the context; the weights do not.
        let long = q.call(1, 4096);
        assert_eq!(long.weight_macs, c.weight_macs);
        assert_eq!(long.attention_macs, c.attention_macs * 4);
    }

    #[test]
    fn one_128_call_beats_four_32_calls_for_a_100_token_prompt() {
        for t in HtpPerf::table() {
            let q = DecoderShapes::qwen3_1_7b();
            let big = t.call(&q.call(128, 1024)).total_s();
            let small = 4.0 * t.call(&q.call(32, 1024)).total_s();
            assert!(big < small, "{}: {big} vs {small}", t.soc);
        }
    }
}
