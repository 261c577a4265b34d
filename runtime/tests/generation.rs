//! End-to-end checks of the generation runtime against a one-shot reference.
//!
//! `ToyTransformer` is a small multi-layer, multi-head attention model (token + sinusoidal position
//! embedding, per layer Q/K/V/O projections with a residual, an output projection). Its
//! `ChunkModel` implementation sees the sequence ONLY through the runtime's chunk inputs: the ids,
//! the positions, the mask and the past K/V read from the runtime's cache with its `[Hkv, D, ctx-ar]`
//! / `[Hkv, ctx-ar, D]` strides. Attention is exact (masked columns are skipped, not down-weighted),
//! and visible columns are visited past-first then chunk-in-order, i.e. by position.
//!
//! `reference_logits` computes the same function directly from the full token list, each position
//! attending positions `0..=p`, with the same arithmetic in the same order. Any error in the
//! runtime's cache placement, re-striding, mask, padding or positions changes the logits, so the
//! tests compare bit for bit.

use std::ops::ControlFlow;

use runtime::{
    argmax, ChunkInputs, ChunkModel, ChunkOutputs, GenerationConfig, Generator, ModelError, ModelLayout,
    RandomSampling, RuntimeError, Sampling, StopReason, MASK_ATTEND,
};

/// How the mock reads the mask: the CPU's dequantized f32 or the QNN u16 input.
#[derive(Clone, Copy, Debug)]
enum MaskRead {
    F32,
    U16,
}

/// Stores f32 K/V as some cache element type.
trait KvCodec: Copy + Default {
    fn encode(v: f32) -> Self;
    fn decode(self) -> f32;
}

impl KvCodec for f32 {
    fn encode(v: f32) -> Self {
        v
    }
    fn decode(self) -> f32 {
        self
    }
}

/// f32 bit patterns in a u32 cache: exercises a non-f32 element type without losing exactness.
impl KvCodec for u32 {
    fn encode(v: f32) -> Self {
        v.to_bits()
    }
    fn decode(self) -> f32 {
        f32::from_bits(self)
    }
}

/// splitmix64-derived weights in [-0.5, 0.5).
fn weights(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = s;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

struct Weights {
    layout: ModelLayout,
    tok_emb: Vec<f32>, // [vocab, hidden]
    wq: Vec<Vec<f32>>, // per layer [hidden, hidden]
    wk: Vec<Vec<f32>>,
    wv: Vec<Vec<f32>>,
    wo: Vec<Vec<f32>>,
    w_out: Vec<f32>, // [vocab, hidden]
}

impl Weights {
    fn new(layout: ModelLayout, seed: u64) -> Self {
        let hid = layout.num_kv_heads * layout.head_dim;
        let per_layer = |k: u64| {
            (0..layout.num_layers).map(|l| weights(seed * 1000 + k * 100 + l as u64, hid * hid)).collect::<Vec<_>>()
        };
        Self {
            layout,
            tok_emb: weights(seed * 1000 + 1, layout.vocab_size * hid),
            wq: per_layer(2),
            wk: per_layer(3),
            wv: per_layer(4),
            wo: per_layer(5),
            w_out: weights(seed * 1000 + 6, layout.vocab_size * hid),
        }
    }

    fn hidden(&self) -> usize {
        self.layout.num_kv_heads * self.layout.head_dim
    }

    fn embed(&self, id: i32, pos: i32) -> Vec<f32> {
        let hid = self.hidden();
        (0..hid)
            .map(|j| {
                let freq = 1.0 / 10f32.powf(j as f32 / hid as f32);
                self.tok_emb[id as usize * hid + j] + 0.5 * (pos as f32 * freq).sin()
            })
            .collect()
    }

    fn matvec(w: &[f32], x: &[f32]) -> Vec<f32> {
        w.chunks_exact(x.len()).map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum()).collect()
    }

    /// (q, k, v), each `[hidden]` = heads of `D`.
    fn qkv(&self, layer: usize, h: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        (Self::matvec(&self.wq[layer], h), Self::matvec(&self.wk[layer], h), Self::matvec(&self.wv[layer], h))
    }

    /// Softmax attention of one head over visible (k, v) pairs, in the given order.
    fn attend(&self, q: &[f32], visible: &[(Vec<f32>, Vec<f32>)]) -> Vec<f32> {
        let d = q.len();
        let scale = 1.0 / (d as f32).sqrt();
        let scores: Vec<f32> =
            visible.iter().map(|(k, _)| k.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale).collect();
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        let mut out = vec![0.0; d];
        for (e, (_, v)) in exps.iter().zip(visible) {
            for (o, x) in out.iter_mut().zip(v) {
                *o += e * x;
            }
        }
        out.iter().map(|o| o / total).collect()
    }

    /// Residual update after attention: `h + W_o · concat(heads)`.
    fn residual(&self, layer: usize, h: &[f32], heads: &[f32]) -> Vec<f32> {
        let o = Self::matvec(&self.wo[layer], heads);
        h.iter().zip(o).map(|(a, b)| a + b).collect()
    }

    fn logits(&self, h: &[f32]) -> Vec<f32> {
        Self::matvec(&self.w_out, h)
    }
}

/// Logits of every position of `tokens`, computed directly from the whole sequence.
fn reference_logits(w: &Weights, tokens: &[u32]) -> Vec<Vec<f32>> {
    let (heads, d) = (w.layout.num_kv_heads, w.layout.head_dim);
    let mut hs: Vec<Vec<f32>> = tokens.iter().enumerate().map(|(p, &t)| w.embed(t as i32, p as i32)).collect();
    for layer in 0..w.layout.num_layers {
        let qkv: Vec<_> = hs.iter().map(|h| w.qkv(layer, h)).collect();
        hs = (0..tokens.len())
            .map(|p| {
                let mut out = Vec::new();
                for hd in 0..heads {
                    let r = hd * d..(hd + 1) * d;
                    let visible: Vec<_> =
                        (0..=p).map(|j| (qkv[j].1[r.clone()].to_vec(), qkv[j].2[r.clone()].to_vec())).collect();
                    out.extend(w.attend(&qkv[p].0[r.clone()], &visible));
                }
                w.residual(layer, &hs[p], &out)
            })
            .collect();
    }
    hs.iter().map(|h| w.logits(h)).collect()
}

/// Greedy continuation by the reference: stops after `max_new` ids, at an id in `eos`, or when
/// prompt + generated reaches the context length.
fn reference_greedy(w: &Weights, prompt: &[u32], max_new: usize, eos: &[u32]) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < max_new && seq.len() < w.layout.context_len {
        let logits = reference_logits(w, &seq);
        let next = argmax(logits.last().unwrap()).unwrap() as u32;
        out.push(next);
        seq.push(next);
        if eos.contains(&next) {
            break;
        }
    }
    out
}

/// The toy model behind the runtime's chunk interface.
struct ToyTransformer<T> {
    w: Weights,
    /// `None`: any chunk length; `Some(list)`: only those (like a QNN context with graphs 32 and 1).
    chunk_lens: Option<Vec<usize>>,
    mask_read: MaskRead,
    /// (ar, valid tokens) of every run.
    calls: Vec<(usize, usize)>,
    /// Fail on this call index, to test error propagation.
    fail_at: Option<usize>,
    _kv: std::marker::PhantomData<T>,
}

impl<T: KvCodec> ToyTransformer<T> {
    fn new(w: Weights, chunk_lens: Option<Vec<usize>>, mask_read: MaskRead) -> Self {
        Self { w, chunk_lens, mask_read, calls: Vec::new(), fail_at: None, _kv: std::marker::PhantomData }
    }
}

impl<T: KvCodec> ChunkModel for ToyTransformer<T> {
    type Kv = T;

    fn layout(&self) -> ModelLayout {
        self.w.layout
    }

    fn supports_chunk_len(&self, ar: usize) -> bool {
        match &self.chunk_lens {
            None => true,
            Some(lens) => lens.contains(&ar),
        }
    }

    fn run_chunk(&mut self, inputs: &ChunkInputs<'_, T>, outputs: &mut ChunkOutputs<T>) -> Result<(), ModelError> {
        let ar = inputs.ar();
        if self.fail_at == Some(self.calls.len()) {
            return Err(format!("injected failure at call {}", self.calls.len()).into());
        }
        self.calls.push((ar, inputs.n_valid()));
        let l = self.w.layout;
        let (ctx, heads, d) = (l.context_len, l.num_kv_heads, l.head_dim);
        let past = ctx - ar;
        if !self.supports_chunk_len(ar) || outputs.ar() != ar || inputs.positions().len() != ar {
            return Err(format!("chunk of {ar} sent to a model without that graph").into());
        }
        let mask = inputs.mask();
        if mask.ar() != ar || mask.context_len() != ctx {
            return Err("mask shape".into());
        }
        let mask_f32 = mask.to_f32();
        let attends = |row: usize, col: usize| match self.mask_read {
            MaskRead::F32 => mask_f32[row * ctx + col] == 0.0,
            MaskRead::U16 => mask.as_u16()[row * ctx + col] == MASK_ATTEND,
        };
        for &p in inputs.positions() {
            if p < 0 || p as usize >= ctx {
                return Err(format!("position {p} outside the context {ctx}").into());
            }
        }

        let mut hs: Vec<Vec<f32>> =
            inputs.ids().iter().zip(inputs.positions()).map(|(&id, &p)| self.w.embed(id, p)).collect();
        for layer in 0..l.num_layers {
            let (pk, pv) = (inputs.past_key(layer), inputs.past_value(layer));
            if pk.len() != heads * d * past || pv.len() != heads * d * past {
                return Err(format!("past K/V of layer {layer} not [{heads}, {d}, {past}]").into());
            }
            let qkv: Vec<_> = hs.iter().map(|h| self.w.qkv(layer, h)).collect();
            // Present K [H, D, ar] and V [H, ar, D].
            let (out_k, out_v) = outputs.present_kv_mut(layer);
            for (i, (_, k, v)) in qkv.iter().enumerate() {
                for hd in 0..heads {
                    for j in 0..d {
                        out_k[(hd * d + j) * ar + i] = T::encode(k[hd * d + j]);
                        out_v[(hd * ar + i) * d + j] = T::encode(v[hd * d + j]);
                    }
                }
            }
            hs = (0..ar)
                .map(|i| {
                    let mut out = Vec::new();
                    for hd in 0..heads {
                        let mut visible = Vec::new();
                        for c in 0..ctx {
                            if !attends(i, c) {
                                continue;
                            }
                            let (k, v): (Vec<f32>, Vec<f32>) = if c < past {
                                (0..d)
                                    .map(|j| {
                                        (pk[(hd * d + j) * past + c].decode(), pv[(hd * past + c) * d + j].decode())
                                    })
                                    .unzip()
                            } else {
                                let (_, k, v) = &qkv[c - past];
                                (k[hd * d..(hd + 1) * d].to_vec(), v[hd * d..(hd + 1) * d].to_vec())
                            };
                            visible.push((k, v));
                        }
                        out.extend(self.w.attend(&qkv[i].0[hd * d..(hd + 1) * d], &visible));
                    }
                    self.w.residual(layer, &hs[i], &out)
                })
                .collect();
        }
        let vocab = l.vocab_size;
        for (i, h) in hs.iter().enumerate() {
            outputs.logits_mut()[i * vocab..(i + 1) * vocab].copy_from_slice(&self.w.logits(h));
        }
        Ok(())
    }
}

fn layout(ctx: usize) -> ModelLayout {
    ModelLayout { num_layers: 2, num_kv_heads: 2, head_dim: 4, vocab_size: 40, context_len: ctx, sliding_window: None }
}

fn prompt(len: usize, seed: u64) -> Vec<u32> {
    weights(seed, len).iter().map(|x| ((x + 0.5) * 40.0) as u32 % 40).collect()
}

fn greedy(max_new_tokens: usize, prefill_chunk: usize) -> GenerationConfig {
    GenerationConfig {
        max_new_tokens,
        prefill_chunk,
        sampling: Sampling::Greedy,
        eos_ids: Vec::new(),
        collect_prompt_logits: true,
    }
}

fn flatten(rows: &[Vec<f32>]) -> Vec<f32> {
    rows.iter().flatten().copied().collect()
}

#[test]
fn prompt_logits_and_greedy_continuation_match_reference_for_any_chunk_size() {
    let ctx = 64;
    let reference_w = Weights::new(layout(ctx), 11);
    let mut gen =
        Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(ctx), 11), None, MaskRead::F32)).unwrap();
    for len in [1, 5, 13, 32, 33, 40] {
        let p = prompt(len, len as u64);
        let want_logits = flatten(&reference_logits(&reference_w, &p));
        let want_ids = reference_greedy(&reference_w, &p, 12, &[]);
        for chunk in [1, 5, 32] {
            let out = gen.generate(&p, &greedy(12, chunk)).unwrap();
            let got = out.prompt_logits.as_ref().unwrap();
            assert!(got == &want_logits, "prompt logits differ: len {len}, chunk {chunk}");
            assert_eq!(out.ids, want_ids, "greedy ids: len {len}, chunk {chunk}");
            assert_eq!(out.stop_reason, StopReason::MaxNewTokens);
            let t = out.timings;
            assert_eq!((t.prefill_tokens, t.generated_tokens, t.decode_steps), (len, 12, 11));
        }
    }
    // The greedy continuation is not trivially constant.
    let ids = reference_greedy(&reference_w, &prompt(13, 13), 12, &[]);
    assert!(ids.iter().any(|&t| t != ids[0]), "{ids:?}");
}

#[test]
fn chunk_plan_pads_last_chunk_and_uses_decode_graph_near_the_end() {
    let ctx = 64;
    let mut gen =
        Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(ctx), 3), None, MaskRead::F32)).unwrap();
    // 13 tokens in chunks of 5: 5, 5, then 3 padded to 5; then 2 decode runs for 3 ids.
    gen.generate(&prompt(13, 1), &greedy(3, 5)).unwrap();
    assert_eq!(gen.model().calls, [(5, 5), (5, 5), (5, 3), (1, 1), (1, 1)]);
    // 40 tokens in chunks of 32 at ctx 64: the first chunk ends at 32 = ctx - 32; the remaining 8
    // would end past the 32 past columns of the chunk-32 graph, so they run one by one.
    gen.model_mut().calls.clear();
    let out = gen.generate(&prompt(40, 2), &greedy(1, 32)).unwrap();
    let mut want = vec![(32, 32)];
    want.extend([(1, 1); 8]);
    assert_eq!(gen.model().calls, want);
    assert_eq!(out.timings.prefill_chunks, 9);
    assert_eq!(out.timings.decode_steps, 0);
}

#[test]
fn qnn_like_model_with_only_32_and_1_graphs_and_u16_mask() {
    let ctx = 128;
    let w = Weights::new(layout(ctx), 5);
    let model = ToyTransformer::<u32>::new(Weights::new(layout(ctx), 5), Some(vec![32, 1]), MaskRead::U16);
    let mut gen = Generator::new(model).unwrap();
    let p = prompt(70, 9);
    let out = gen.generate(&p, &greedy(20, 32)).unwrap();
    assert!(out.prompt_logits.unwrap() == flatten(&reference_logits(&w, &p)));
    assert_eq!(out.ids, reference_greedy(&w, &p, 20, &[]));
    let mut want = vec![(32, 32), (32, 32), (32, 6)];
    want.extend([(1, 1); 19]);
    assert_eq!(gen.model().calls, want);

    let err = gen.generate(&p, &greedy(20, 5)).unwrap_err();
    assert!(matches!(err, RuntimeError::UnsupportedChunkLen { ar: 5, .. }), "{err}");
    let only_prefill = ToyTransformer::<u32>::new(Weights::new(layout(ctx), 5), Some(vec![32]), MaskRead::U16);
    let err = Generator::new(only_prefill).unwrap().generate(&p, &greedy(20, 32)).unwrap_err();
    assert!(matches!(err, RuntimeError::UnsupportedChunkLen { ar: 1, .. }), "{err}");
}

#[test]
fn generation_stops_when_the_context_is_full() {
    let ctx = 64;
    let w = Weights::new(layout(ctx), 7);
    let mut gen =
        Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(ctx), 7), None, MaskRead::F32)).unwrap();
    for (len, chunk) in [(60, 32), (60, 5), (63, 1), (64, 32), (64, 1)] {
        let p = prompt(len, 40 + len as u64);
        let out = gen.generate(&p, &greedy(100, chunk)).unwrap();
        assert_eq!(out.stop_reason, StopReason::ContextFull, "len {len}");
        assert_eq!(len + out.ids.len(), ctx, "len {len}");
        assert_eq!(out.ids, reference_greedy(&w, &p, 100, &[]), "len {len}");
        assert!(out.prompt_logits.unwrap() == flatten(&reference_logits(&w, &p)), "len {len} chunk {chunk}");
    }
    // A full-length prompt in chunks of 32 at ctx 64 runs the second half as one chunk-32 run
    // ending exactly at the context, whose K/V is not stored (nothing can follow it).
    gen.model_mut().calls.clear();
    gen.generate(&prompt(64, 104), &greedy(100, 32)).unwrap();
    assert_eq!(gen.model().calls, [(32, 32), (32, 32)]);
}

#[test]
fn any_eos_id_stops_and_is_kept() {
    let ctx = 64;
    let w = Weights::new(layout(ctx), 21);
    let mut gen =
        Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(ctx), 21), None, MaskRead::F32)).unwrap();
    let p = prompt(9, 77);
    let free = reference_greedy(&w, &p, 20, &[]);
    // The first id that differs from all earlier ones, at step >= 2.
    let k = (2..free.len()).find(|&k| !free[..k].contains(&free[k])).expect("a fresh id in 20 steps");
    let mut config = greedy(20, 4);
    config.eos_ids = vec![1000, free[k]];
    let out = gen.generate(&p, &config).unwrap();
    assert_eq!(out.stop_reason, StopReason::Eos(free[k]));
    assert_eq!(out.ids, free[..=k]);
    assert_eq!(out.timings.decode_steps, k);
}

#[test]
fn max_new_tokens_zero_only_runs_the_prompt() {
    let w = Weights::new(layout(32), 2);
    let mut gen = Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(32), 2), None, MaskRead::F32)).unwrap();
    let p = prompt(10, 3);
    let out = gen.generate(&p, &greedy(0, 4)).unwrap();
    assert_eq!((out.ids.len(), out.stop_reason), (0, StopReason::MaxNewTokens));
    assert!(out.prompt_logits.unwrap() == flatten(&reference_logits(&w, &p)));
    let mut config = greedy(0, 4);
    config.collect_prompt_logits = false;
    assert_eq!(gen.generate(&p, &config).unwrap().prompt_logits, None);
}

#[test]
fn bad_prompts_are_errors() {
    let mut gen = Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(16), 2), None, MaskRead::F32)).unwrap();
    assert!(matches!(gen.generate(&[], &greedy(4, 4)), Err(RuntimeError::EmptyPrompt)));
    let err = gen.generate(&prompt(17, 1), &greedy(4, 4)).unwrap_err();
    assert!(matches!(err, RuntimeError::PromptTooLong { prompt_len: 17, context_len: 16 }), "{err}");
    let err = gen.generate(&[1, 2, 40], &greedy(4, 4)).unwrap_err();
    assert!(matches!(err, RuntimeError::TokenOutOfVocab { id: 40, position: 2, .. }), "{err}");
    let err = gen.generate(&[1, 2], &greedy(4, 0)).unwrap_err();
    assert!(matches!(err, RuntimeError::InvalidChunkLen { ar: 0, .. }), "{err}");
}

#[test]
fn model_errors_carry_chunk_and_position() {
    let mut model = ToyTransformer::<f32>::new(Weights::new(layout(32), 2), None, MaskRead::F32);
    model.fail_at = Some(3);
    let mut gen = Generator::new(model).unwrap();
    let err = gen.generate(&prompt(10, 3), &greedy(5, 4)).unwrap_err();
    // Calls 0..3 are the prefill chunks at 0, 4, 8; call 3 is the first decode step at 10.
    assert!(matches!(err, RuntimeError::ModelRun { ar: 1, n_past: 10, .. }), "{err}");
    assert!(err.to_string().contains("injected failure"), "{err}");
}

#[test]
fn sampling_is_reproducible_and_top_k_one_is_greedy() {
    let ctx = 64;
    let mut gen =
        Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(ctx), 13), None, MaskRead::F32)).unwrap();
    let p = prompt(7, 5);
    let sampled = |gen: &mut Generator<_>, seed, top_k| {
        let config = GenerationConfig {
            sampling: Sampling::Random(RandomSampling { temperature: 3.0, top_k, top_p: 1.0, seed }),
            ..greedy(30, 4)
        };
        gen.generate(&p, &config).unwrap().ids
    };
    let a = sampled(&mut gen, 1, 0);
    assert_eq!(a, sampled(&mut gen, 1, 0));
    assert_ne!(a, sampled(&mut gen, 2, 0));
    let greedy_ids = gen.generate(&p, &greedy(30, 4)).unwrap().ids;
    assert_ne!(a, greedy_ids);
    assert_eq!(sampled(&mut gen, 1, 1), greedy_ids);
}

#[test]
fn streaming_callback_sees_each_id_and_can_cancel() {
    let mut gen =
        Generator::new(ToyTransformer::<f32>::new(Weights::new(layout(64), 17), None, MaskRead::F32)).unwrap();
    let p = prompt(6, 8);
    let full = gen.generate(&p, &greedy(10, 32)).unwrap().ids;
    let mut seen = Vec::new();
    let out = gen
        .generate_streaming(&p, &greedy(10, 32), |id| {
            seen.push(id);
            if seen.len() == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Cancelled);
    assert_eq!(out.ids, full[..4]);
    assert_eq!(seen, full[..4]);
}
