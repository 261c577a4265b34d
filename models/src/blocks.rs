//! Building blocks the decoder model files share, in mllm's QNN-AOT form: the SwiGLU MLP and the
//! steps of mllm's static-shape attention (split heads, RoPE, KV cache cast, masked attention).
//!
//! mllm's Qwen3, Qwen2 and Llama files differ only in how q/k/v come out of the projections; from
//! there on their attention is the same code with the same QDQ names. The attention steps here are
//! plain functions called from inside an attention module's `forward`, so their `qdq!` names
//! resolve against that module (`model.layers.3.self_attn.qk_matmul_output_qdq`), as mllm's inline
//! code does. The data flow is the NPU's static one:
//! - linears are 1×1 convs on NHWC `[1, 1, S, in]`, hence the `view`s around each projection;
//! - the KV cache is an input: past K `[1, Hkv, D, ctx-S]`, past V `[1, Hkv, ctx-S, D]`; a layer
//!   returns only the new K `[1, Hkv, D, S]` and V `[1, Hkv, S, D]`;
//! - the mask `[1, 1, S, ctx]` is 0.0 where a position may attend (mllm's uint16 65535 dequantized),
//!   and the softmax is masked with `where(mask == 0, scores, rowmin(scores) - 20)`;
//! - RoPE is written out: `x*cos + rotate_half(x)*sin` with rows `[1, S, D]` gathered by position.

use crate::config::TransformerConfig;
use crate::decoder::AttentionInputs;
use crate::hf::HiddenAct;
use mllm_dsl::fused::{fused, Fused, Point};
use mllm_dsl::prelude::*;
use mllm_dsl::QdqKind;
// The mask's compile-time parameters, also those of the `0.0` it is compared with (mllm's
// `addCausalMaskParams`): uint16 with zero point 65535, so 65535 (attend) dequantizes to 0.0.
use mllm_dsl::causal_lm::{MASK_SCALE, MASK_ZERO_POINT};

/// The gated MLP `down(act(gate(x)) * up(x))`: SwiGLU in mllm's Qwen3, Qwen2 and Llama (and
/// Mistral), GELU-tanh in Gemma (`TransformerConfig::hidden_act`).
#[module]
pub struct Mlp {
    gate_proj: Conv2d,
    up_proj: Conv2d,
    down_proj: Conv2d,
    hidden: usize,
    inter: usize,
    #[module(skip)]
    act: HiddenAct,
}

impl Mlp {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Mlp {
            gate_proj: Conv2d::new(h, i),
            up_proj: Conv2d::new(h, i),
            down_proj: Conv2d::new(i, h),
            hidden: h,
            inter: i,
            act: cfg.hidden_act,
        }
    }
}

#[module]
impl Mlp {
    /// `[1, S, H] -> [1, S, H]`
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (h, i) = (self.hidden as i64, self.inter as i64);
        // 1. NHWC for the 1x1 convs: [1, S, H] -> [1, 1, S, H]
        let x = qdq!(x, "up_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        // 2. up / gate: [1, 1, S, H] -> [1, S, I]
        let up = qdq!(self.up_proj.forward(&x)?, "up_proj_output_qdq")?.view(&[1, -1, i])?;
        let gate = qdq!(self.gate_proj.forward(&x)?, "gate_proj_output_qdq")?.view(&[1, -1, i])?;
        // 3. act(gate) * up: SiLU or GELU-tanh, each as gate * sigmoid(..)
        let o = gated_product(&gate, &up, self.act)?;
        // 4. down: [1, S, I] -> [1, 1, S, I] -> [1, S, H]
        self.down_proj.forward(&o.view(&[1, 1, -1, i])?)?.view(&[1, -1, h])
    }
}

/// The gated MLP with one fused `gate_up_proj` (Phi-3): `[gate | up] = gate_up(x)`, then as [`Mlp`].
#[module]
pub struct FusedMlp {
    gate_up_proj: Conv2d,
    down_proj: Conv2d,
    hidden: usize,
    inter: usize,
    #[module(skip)]
    act: HiddenAct,
}

impl FusedMlp {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        FusedMlp {
            gate_up_proj: Conv2d::new(h, 2 * i),
            down_proj: Conv2d::new(i, h),
            hidden: h,
            inter: i,
            act: cfg.hidden_act,
        }
    }
}

#[module]
impl FusedMlp {
    /// `[1, S, H] -> [1, S, H]`
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (h, i) = (self.hidden as i64, self.inter);
        // 1. NHWC for the 1x1 conv, gate_up: [1, 1, S, H] -> [1, 1, S, 2I]
        let x = qdq!(x, "gate_up_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let gate_up = qdq!(self.gate_up_proj.forward(&x)?, "gate_up_proj_output_qdq")?;
        // 2. the two halves: gate = [.., :I], up = [.., I:], each [1, S, I]
        let gate = gate_up.slice(-1, 0, i)?.view(&[1, -1, i as i64])?;
        let up = gate_up.slice(-1, i, 2 * i)?.view(&[1, -1, i as i64])?;
        // 3. act(gate) * up, then down: [1, S, I] -> [1, 1, S, I] -> [1, S, H]
        let o = gated_product(&gate, &up, self.act)?;
        self.down_proj.forward(&o.view(&[1, 1, -1, i as i64])?)?.view(&[1, -1, h])
    }
}

/// `act(gate)` in the caller's scope, every step with its QDQ point. SiLU is `gate * sigmoid(gate)`;
/// GELU-tanh `0.5 g (1 + tanh(c (g + 0.044715 g^3)))` with `c = sqrt(2/pi)` is written as
/// `g * sigmoid(2c (g + 0.044715 g^3))` (since `(1 + tanh z) / 2 = sigmoid(2z)`), so both need only
/// the sigmoid and its fixed 1/65536 QDQ.
pub fn gate_activation(gate: &Tensor, act: HiddenAct) -> Result<Tensor> {
    let z = match act {
        HiddenAct::Silu => gate.clone(),
        HiddenAct::GeluTanh => {
            let two_c = 2.0 * (2.0 / std::f32::consts::PI).sqrt();
            let cube = qdq!(qdq!(gate.mul(gate)?, "gelu_square_output_qdq")?.mul(gate)?, "gelu_cube_output_qdq")?;
            let inner = gate.add(&qdq!(cube.mul(&qdq!(const 0.044715, "gelu_coeff_qdq")?)?, "gelu_cubic_term_qdq")?)?;
            qdq!(qdq!(inner, "gelu_inner_output_qdq")?.mul(&qdq!(const two_c, "gelu_scale_qdq")?)?, "gelu_z_qdq")?
        }
    };
    let sig = qdq!(fixed z.sigmoid()?, "sigmoid_output_qdq", scale = SIGMOID_SCALE, zp = 0)?;
    qdq!(gate.mul(&sig)?, "act_output_qdq")
}

/// The sigmoid output's fixed QDQ scale (zero point 0): mllm's `FixedActivationQDQ` for values in
/// `[0, 1]` on the uint16 grid.
pub(crate) const SIGMOID_SCALE: f32 = 1.0 / 65536.0;

/// `act(gate) * up` with its QDQ point, the gated MLP's input to `down_proj` (`gate`, `up` `[1, S,
/// I]`). SiLU's chain (sigmoid, two products, three points) is one fused step for a backend that
/// fuses it.
pub fn gated_product(gate: &Tensor, up: &Tensor, act: HiddenAct) -> Result<Tensor> {
    let written_out = || qdq!(gate_activation(gate, act)?.mul(up)?, "down_proj_input_qdq");
    match act {
        HiddenAct::Silu => {
            let sigmoid =
                Point { name: "sigmoid_output_qdq", kind: QdqKind::Fixed { scale: SIGMOID_SCALE, zero_point: 0 } };
            let points = [sigmoid, "act_output_qdq".into(), "down_proj_input_qdq".into()];
            fused(Fused::SiluGate, &[gate, up], &points, written_out)
        }
        HiddenAct::GeluTanh => written_out(),
    }
}

/// The residual connection `x + q(y)` with `y`'s point `branch`, then the sum's point `sum` if
/// the model has one (`x`, `y` `[1, S, H]`): one fused step for a backend that fuses it.
pub fn residual(x: &Tensor, y: &Tensor, branch: &str, sum: Option<&str>) -> Result<Tensor> {
    let both;
    let names: &[&str] = match sum {
        Some(sum) => {
            both = [branch, sum];
            &both
        }
        None => std::slice::from_ref(&branch),
    };
    fused(Fused::ResidualAdd, &[x, y], names, || {
        let added = x.add(&qdq!(y, branch)?)?;
        match sum {
            Some(sum) => qdq!(added, sum),
            None => Ok(added),
        }
    })
}

/// A projection's output `[1, 1, S, n * D]` → heads `[1, n, S, D]`.
pub fn split_heads(x: &Tensor, heads: usize, head_dim: usize) -> Result<Tensor> {
    x.view(&[1, -1, heads as i64, head_dim as i64])?.transpose(1, 2)
}

/// RoPE of q `[1, H, S, D]` and k `[1, Hkv, S, D]` with this chunk's rows `sin`, `cos` `[1, S, D]`.
pub fn rope_qk(q: &Tensor, k: &Tensor, inputs: &AttentionInputs<'_>) -> Result<(Tensor, Tensor)> {
    let (cos, sin) = (inputs.cos.unsqueeze(1)?, inputs.sin.unsqueeze(1)?);
    let q_names =
        ["q_rope_neg_half_qdq", "q_rope_mul_0_output_qdq", "q_rope_mul_1_output_qdq", "q_rope_add_0_output_qdq"];
    let k_names =
        ["k_rope_neg_half_qdq", "k_rope_mul_0_output_qdq", "k_rope_mul_1_output_qdq", "k_rope_add_0_output_qdq"];
    Ok((rotate(q, &cos, &sin, q_names)?, rotate(k, &cos, &sin, k_names)?))
}

/// `x*cos + rotate_half(x)*sin` with `rotate_half(x) = cat(-x2, x1)`.
/// `names` are the four QDQ points: neg_half, mul_0, mul_1, add_0. An eager backend may run the
/// step in one pass ([`fused`]); a trace records the ops below.
fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor, names: [&str; 4]) -> Result<Tensor> {
    fused(Fused::RotateHalfRope, &[x, cos, sin], &names, || {
        let d = x.dim(-1)?;
        let (x1, x2) = (x.slice(-1, 0, d / 2)?, x.slice(-1, d / 2, d)?);
        let rotated = Tensor::cat(&[&qdq!(x2.neg()?, names[0])?, &x1], -1)?;
        let a = qdq!(x.mul(cos)?, names[1])?;
        let b = qdq!(rotated.mul(sin)?, names[2])?;
        qdq!(a.add(&b)?, names[3])
    })
}

/// The new K `[1, Hkv, S, D]` and V into the uint8 cache layout: K `[1, Hkv, D, S]`, V `[1, Hkv, S, D]`.
/// V is first quantized at its own int16 point (`v_cast_to_int16_qdq`, the V projection's output).
pub fn cache_kv(k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    cache_kv_of_int16(k, &qdq!(v, "v_cast_to_int16_qdq")?)
}

/// [`cache_kv`] for a V that is already int16: a slice of a fused projection's quantized output
/// (Phi-3's `qkv_proj`), whose encoding a slice keeps, so V has no int16 point of its own.
pub fn cache_kv_of_int16(k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let k = qdq!(kv k.to(DType::F32)?.to(DType::U8Sym)?, "k_cast_to_int8_qdq")?.transpose(2, 3)?;
    let v = qdq!(kv v.to(DType::F32)?.to(DType::U8Sym)?, "v_cast_to_int8_qdq")?;
    Ok((k, v))
}

/// Attention of q `[1, H, S, D]` over past ++ new K/V (as [`cache_kv`] lays them out), masked by
/// `mask [1, 1, S, ctx]`, → `[1, 1, S, H * D]`, NHWC for o_proj. Scores are scaled by `1/sqrt(D)`.
pub fn attend(q: &Tensor, k: &Tensor, v: &Tensor, inputs: &AttentionInputs<'_>) -> Result<Tensor> {
    attend_scaled(q, k, v, inputs, 1.0 / (q.dim(-1)? as f32).sqrt())
}

/// [`attend`] with the scores scaled by `scale` (Gemma 3: `query_pre_attn_scalar^-0.5`).
pub fn attend_scaled(q: &Tensor, k: &Tensor, v: &Tensor, inputs: &AttentionInputs<'_>, scale: f32) -> Result<Tensor> {
    let AttentionInputs { mask, past_key, past_value, .. } = *inputs;
    let (heads, head_dim) = (q.dim(1)?, q.dim(-1)?);
    let scale = qdq!(const scale, "scaling_qdq")?;
    let neg_20 = qdq!(const -20.0, "neg_20_qdq")?;
    let zero = qdq!(global const 0.0, "constant_zero", scale = MASK_SCALE, zp = MASK_ZERO_POINT)?;
    // Steps 1-3 are one pass per KV head on backends that fuse them.
    let softmax_names =
        ["mul_0_output_qdq", "reduce_min_output_qdq", "minus_0_output_qdq", "where_attn_qdq", "softmax_output_qdq"];
    let [m0, m1, m2, m3, m4] = softmax_names;
    let names = ["qk_matmul_output_qdq", m0, m1, m2, m3, m4, "attn_value_matmul_output_qdq"];
    let inputs = [q, k, v, past_key, past_value, mask, &scale, &neg_20, &zero];
    let y = fused(Fused::Attention, &inputs, &names, || {
        // 1. past ++ new, repeated for GQA (repeat-interleave: query head j reads KV head j / groups)
        let groups = heads / k.dim(1)?;
        let kh = Tensor::cat(&[past_key, k], -1)?.repeat_interleave(groups, 1)?; // [1, H, D, T]
        let vh = Tensor::cat(&[past_value, v], 2)?.repeat_interleave(groups, 1)?; // [1, H, T, D]
                                                                                  // 2. scores [1, H, S, T], then the scaled, masked softmax: masked scores become rowmin - 20
        let attn = qdq!(q.matmul(&kh)?, names[0])?;
        let attn = fused(Fused::MaskedSoftmax, &[&attn, mask, &scale, &neg_20, &zero], &softmax_names, || {
            let attn = qdq!(attn.mul(&scale)?, m0)?;
            let attn_min = qdq!(attn.reduce_min(-1, true)?, m1)?;
            let attn_vv = qdq!(attn_min.add(&neg_20)?, m2)?;
            let attn = qdq!(mask.eq(&zero)?.where_cond(&attn, &attn_vv)?, m3)?;
            qdq!(attn.softmax(-1)?, m4)
        })?;
        // 3. the weighted values [1, H, S, D]
        qdq!(attn.matmul(&vh)?, names[6])
    })?;
    // 4. [1, H, S, D] -> [1, S, H, D] -> NHWC [1, 1, S, H*D]
    y.transpose(1, 2)?.view(&[1, 1, -1, (heads * head_dim) as i64])
}
