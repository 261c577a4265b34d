//! Qwen3 in mllm's QNN-AOT form (`examples/qwen3_qnn_aot/modeling_qwen_qnn_aot.hpp`).
//!
//! One file serves float (HF checkpoints on the CPU), fake-quant (pymllm checkpoints, QDQ applied)
//! and the NPU (traced, then compiled). Its data flow is the NPU's static one:
//! - linears are 1×1 convs on NHWC `[1, 1, S, in]`, hence the `view`s around each projection;
//! - the KV cache is an input: past K `[1, Hkv, D, ctx-S]`, past V `[1, Hkv, ctx-S, D]`; the layer
//!   returns only the new K `[1, Hkv, D, S]` and V `[1, Hkv, S, D]`;
//! - the mask `[1, 1, S, ctx]` is 0.0 where a position may attend (mllm's uint16 65535 dequantized),
//!   and the softmax is masked with `where(mask == 0, scores, rowmin(scores) - 20)`;
//! - RoPE is written out: tables `[1, L, D]` gathered by position, `x*cos + rotate_half(x)*sin`.
//!
//! Every `qdq!` carries mllm's exact name, so the keys match pymllm's checkpoints.

use crate::config::TransformerConfig;
use crate::rope::sin_cos_tables;
use mllm_dsl::prelude::*;

/// mllm's compile-time parameters of the mask and of the `0.0` it is compared with
/// (`addCausalMaskParams`): uint16 with zero point 65535, so 65535 (attend) dequantizes to 0.0.
pub const MASK_SCALE: f32 = 0.001 / 65535.0;
pub const MASK_ZERO_POINT: i32 = 65535;

#[module]
pub struct Qwen3Mlp {
    gate_proj: Conv2d,
    up_proj: Conv2d,
    down_proj: Conv2d,
    hidden: usize,
    inter: usize,
}

impl Qwen3Mlp {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        Qwen3Mlp {
            gate_proj: Conv2d::new(h, i),
            up_proj: Conv2d::new(h, i),
            down_proj: Conv2d::new(i, h),
            hidden: h,
            inter: i,
        }
    }
}

#[module]
impl Qwen3Mlp {
    /// `[1, S, H] -> [1, S, H]`
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (h, i) = (self.hidden as i64, self.inter as i64);
        // 1. NHWC for the 1x1 convs: [1, S, H] -> [1, 1, S, H]
        let x = qdq!(x, "up_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        // 2. up / gate: [1, 1, S, H] -> [1, S, I]
        let up = qdq!(self.up_proj.forward(&x)?, "up_proj_output_qdq")?.view(&[1, -1, i])?;
        let gate = qdq!(self.gate_proj.forward(&x)?, "gate_proj_output_qdq")?.view(&[1, -1, i])?;
        // 3. SiLU as gate * sigmoid(gate), so the sigmoid gets its fixed 1/65536 QDQ
        let sig = qdq!(fixed gate.sigmoid()?, "sigmoid_output_qdq", scale = 1.0 / 65536.0, zp = 0)?;
        let act = qdq!(gate.mul(&sig)?, "act_output_qdq")?;
        // 4. down: [1, S, I] -> [1, 1, S, I] -> [1, S, H]
        let o = qdq!(act.mul(&up)?, "down_proj_input_qdq")?.view(&[1, 1, -1, i])?;
        self.down_proj.forward(&o)?.view(&[1, -1, h])
    }
}

#[module]
pub struct Qwen3Attention {
    q_proj: Conv2d,
    k_proj: Conv2d,
    v_proj: Conv2d,
    o_proj: Conv2d,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Qwen3Attention {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Qwen3Attention {
            q_proj: Conv2d::new(h, nh * d),
            k_proj: Conv2d::new(h, nkv * d),
            v_proj: Conv2d::new(h, nkv * d),
            o_proj: Conv2d::new(nh * d, h),
            q_norm: RmsNorm::new(d, cfg.rms_norm_eps),
            k_norm: RmsNorm::new(d, cfg.rms_norm_eps),
            hidden: h,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
        }
    }
}

/// RoPE as mllm writes it out: `x*cos + rotate_half(x)*sin` with `rotate_half(x) = cat(-x2, x1)`.
/// `names` are the four QDQ points: neg_half, mul_0, mul_1, add_0.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, names: [&str; 4]) -> Result<Tensor> {
    let d = x.dim(-1)?;
    let (x1, x2) = (x.slice(-1, 0, d / 2)?, x.slice(-1, d / 2, d)?);
    let rotated = Tensor::cat(&[&qdq!(x2.neg()?, names[0])?, &x1], -1)?;
    let a = qdq!(x.mul(cos)?, names[1])?;
    let b = qdq!(rotated.mul(sin)?, names[2])?;
    qdq!(a.add(&b)?, names[3])
}

#[module]
impl Qwen3Attention {
    /// `x [1, S, H]`, `sin/cos [1, S, D]`, `mask [1, 1, S, ctx]`, past K/V →
    /// `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    pub fn forward(
        &self,
        x: &Tensor,
        sin: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        past_key: &Tensor,
        past_value: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let (h, d) = (self.hidden as i64, self.head_dim as i64);
        let (nh, nkv) = (self.heads as i64, self.kv_heads as i64);
        // 1. projections on NHWC [1, 1, S, H], then heads: [1, S, n, D] -> [1, n, S, D]
        let x = qdq!(x, "q_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let q = self.q_proj.forward(&x)?.view(&[1, -1, nh, d])?.transpose(1, 2)?;
        let k = self.k_proj.forward(&x)?.view(&[1, -1, nkv, d])?.transpose(1, 2)?;
        let v = self.v_proj.forward(&x)?.view(&[1, -1, nkv, d])?.transpose(1, 2)?;
        // 2. per-head RMSNorm of q and k over D
        let q = qdq!(self.q_norm.forward(&qdq!(q, "q_norm_input_qdq")?)?, "q_norm_output_qdq")?;
        let k = qdq!(self.k_norm.forward(&qdq!(k, "k_norm_input_qdq")?)?, "k_norm_output_qdq")?;
        // 3. RoPE with cos/sin [1, 1, S, D]
        let (cos, sin) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
        let q_names =
            ["q_rope_neg_half_qdq", "q_rope_mul_0_output_qdq", "q_rope_mul_1_output_qdq", "q_rope_add_0_output_qdq"];
        let k_names =
            ["k_rope_neg_half_qdq", "k_rope_mul_0_output_qdq", "k_rope_mul_1_output_qdq", "k_rope_add_0_output_qdq"];
        let q = rope(&q, &cos, &sin, q_names)?;
        let k = rope(&k, &cos, &sin, k_names)?;
        // 4. new K/V into the uint8 cache layout: K [1, Hkv, D, S], V [1, Hkv, S, D]
        let k = qdq!(kv k.to(DType::F32)?.to(DType::U8Sym)?, "k_cast_to_int8_qdq")?.transpose(2, 3)?;
        let v = qdq!(v, "v_cast_to_int16_qdq")?;
        let v = qdq!(kv v.to(DType::F32)?.to(DType::U8Sym)?, "v_cast_to_int8_qdq")?;
        // 5. past ++ new, repeated for GQA (repeat-interleave: query head j reads KV head j / groups)
        let groups = self.heads / self.kv_heads;
        let kh = Tensor::cat(&[past_key, &k], -1)?.repeat_interleave(groups, 1)?; // [1, H, D, T]
        let vh = Tensor::cat(&[past_value, &v], 2)?.repeat_interleave(groups, 1)?; // [1, H, T, D]
                                                                                   // 6. scores [1, H, S, T], scaled by 1/sqrt(D)
        let attn = qdq!(q.matmul(&kh)?, "qk_matmul_output_qdq")?;
        let scale = qdq!(const 1.0 / (self.head_dim as f32).sqrt(), "scaling_qdq")?;
        let attn = qdq!(attn.mul(&scale)?, "mul_0_output_qdq")?;
        // 7. masked softmax: masked scores become rowmin - 20
        let attn_min = qdq!(attn.reduce_min(-1, true)?, "reduce_min_output_qdq")?;
        let attn_vv = qdq!(attn_min.add(&qdq!(const -20.0, "neg_20_qdq")?)?, "minus_0_output_qdq")?;
        let zero = qdq!(global const 0.0, "constant_zero", scale = MASK_SCALE, zp = MASK_ZERO_POINT)?;
        let attn = qdq!(mask.eq(&zero)?.where_cond(&attn, &attn_vv)?, "where_attn_qdq")?;
        let attn = qdq!(attn.softmax(-1)?, "softmax_output_qdq")?;
        // 8. [1, H, S, D] -> [1, S, H, D] -> NHWC [1, 1, S, H*D] -> o_proj -> [1, S, hidden]
        let y = qdq!(attn.matmul(&vh)?, "attn_value_matmul_output_qdq")?;
        let y = y.transpose(1, 2)?.view(&[1, 1, -1, nh * d])?;
        let y = self.o_proj.forward(&y)?.view(&[1, -1, h])?;
        Ok((y, k, v))
    }
}

#[module]
pub struct Qwen3DecoderLayer {
    self_attn: Qwen3Attention,
    mlp: Qwen3Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    layer_idx: usize,
}

impl Qwen3DecoderLayer {
    pub fn new(cfg: &TransformerConfig, layer_idx: usize) -> Self {
        Qwen3DecoderLayer {
            self_attn: Qwen3Attention::new(cfg),
            mlp: Qwen3Mlp::new(cfg),
            input_layernorm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps),
            post_attention_layernorm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps),
            layer_idx,
        }
    }
}

#[module]
impl Qwen3DecoderLayer {
    /// `x [1, S, H]` → `(x [1, S, H], new K, new V)`
    pub fn forward(
        &self,
        x: &Tensor,
        sin: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        past_key: &Tensor,
        past_value: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        // 1. attention with residual (layer 0's input is the embedding, already quantized)
        let x = if self.layer_idx == 0 { x.clone() } else { qdq!(x, "input_layernorm_input_qdq")? };
        let h = self.input_layernorm.forward(&x)?;
        let (a, k, v) = self.self_attn.forward(&h, sin, cos, mask, past_key, past_value)?;
        let x = qdq!(x.add(&qdq!(a, "add_0_lhs_input_qdq")?)?, "add_0_output_qdq")?;
        // 2. MLP with residual
        let m = self.mlp.forward(&self.post_attention_layernorm.forward(&x)?)?;
        let x = x.add(&qdq!(m, "add_1_lhs_input_qdq")?)?;
        Ok((x, k, v))
    }
}

#[module]
pub struct Qwen3Model {
    embed_tokens: Embedding,
    layers: ModuleList<Qwen3DecoderLayer>,
    norm: RmsNorm,
    #[module(rename = "mllm_max_sin_embedding")]
    rope_sin: Param,
    #[module(rename = "mllm_max_cos_embedding")]
    rope_cos: Param,
    hidden: usize,
}

impl Qwen3Model {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let table = [1, cfg.max_positions, cfg.head_dim];
        let (inv, len) = (cfg.rope_inv_freq.clone(), cfg.max_positions);
        let inv2 = inv.clone();
        Qwen3Model {
            embed_tokens: Embedding::new(cfg.vocab_size, cfg.hidden_size),
            layers: (0..cfg.num_hidden_layers).map(|i| Qwen3DecoderLayer::new(cfg, i)).collect(),
            norm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps),
            rope_sin: Param::new(table, ParamRole::RopeTable).or_compute(move || sin_cos_tables(&inv, len).0),
            rope_cos: Param::new(table, ParamRole::RopeTable).or_compute(move || sin_cos_tables(&inv2, len).1),
            hidden: cfg.hidden_size,
        }
    }
}

#[module]
impl Qwen3Model {
    /// `ids [1, S]`, `positions [S]`, `mask [1, 1, S, ctx]`, past K/V per layer →
    /// `(hidden NHWC [1, 1, S, H], new K per layer, new V per layer)`.
    pub fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        if past_keys.len() != self.layers.len() || past_values.len() != self.layers.len() {
            return Err(Error::msg(format!(
                "Qwen3Model has {} layers but got {} past keys and {} past values",
                self.layers.len(),
                past_keys.len(),
                past_values.len()
            )));
        }
        // 1. token embedding: [1, S] -> [1, S, H]
        let mut x = self.embed_tokens.forward(ids)?;
        // 2. RoPE rows for these positions: [1, L, D] -> [1, S, D]
        let sin = qdq!(rope self.rope_sin.tensor()?, "sin_embedding_input_qdq")?.gather(1, positions)?;
        let cos = qdq!(rope self.rope_cos.tensor()?, "cos_embedding_input_qdq")?.gather(1, positions)?;
        // 3. decoder layers, collecting the new K/V
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, layer) in self.layers.iter().enumerate() {
            let (h, k, v) = layer.forward(&x, &sin, &cos, mask, &past_keys[i], &past_values[i])?;
            x = h;
            keys.push(k);
            values.push(v);
        }
        // 4. final norm, NHWC for the lm_head: [1, S, H] -> [1, 1, S, H]
        let x = self.norm.forward(&qdq!(x, "norm_input_qdq")?)?.view(&[1, 1, -1, self.hidden as i64])?;
        Ok((x, keys, values))
    }
}

#[module]
pub struct Qwen3ForCausalLM {
    model: Qwen3Model,
    lm_head: Conv2d,
    #[module(skip)]
    cfg: TransformerConfig,
}

/// `(logits, new K per layer, new V per layer)`
type Outputs = (Tensor, Vec<Tensor>, Vec<Tensor>);

impl Qwen3ForCausalLM {
    pub fn new(cfg: &TransformerConfig) -> Self {
        Qwen3ForCausalLM {
            model: Qwen3Model::new(cfg),
            lm_head: Conv2d::new(cfg.hidden_size, cfg.vocab_size),
            cfg: cfg.clone(),
        }
    }
}

impl mllm_dsl::CausalLm for Qwen3ForCausalLM {
    fn forward(&self, ids: &Tensor, pos: &Tensor, mask: &Tensor, k: &[Tensor], v: &[Tensor]) -> Result<Outputs> {
        Qwen3ForCausalLM::forward(self, ids, pos, mask, k, v)
    }

    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()> {
        self.bind("", src)
    }

    fn shape(&self) -> mllm_dsl::DecoderShape {
        self.cfg.decoder_shape()
    }
}

#[module]
impl Qwen3ForCausalLM {
    /// → `(logits [1, 1, S, vocab], new K per layer [1, Hkv, D, S], new V per layer [1, Hkv, S, D])`
    pub fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let (x, keys, values) = self.model.forward(ids, positions, mask, past_keys, past_values)?;
        let logits = self.lm_head.forward(&qdq!(x, "lm_head_input_qdq")?)?;
        Ok((qdq!(logits, "lm_head_output_qdq")?, keys, values))
    }
}
