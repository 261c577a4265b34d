//! [`QnnChunkModel`]: a context binary's graphs as the generation runtime's [`ChunkModel`].
//!
//! mllm's NPU runtime (mllm/backends/qnn/aot_rt) loads one context holding a prefill graph
//! (`model.0.s32`) and a decode graph (`model.0.s1`), and per chunk writes the graph inputs
//! (ids, positions, the u16 SMART_MASK, past K/V as u8 codes), executes, and reads the logits and
//! the new K/V codes. This is that loop over [`QnnExecApi`], so it drives the SDK's HTP backend and
//! the CPU [`EmulatedHtp`](crate::sdk::EmulatedHtp) alike; the runtime's [`KvCache`] keeps the
//! codes (`Kv = u8`) in the static layout the graphs read directly.
//!
//! The graph I/O contract (what LLM2QnnLowering produces, checked when the model is opened):
//! inputs `input_ids [1, ar]` and `position_ids [ar]` (INT_32), `attention_mask [1, 1, ar, ctx]`
//! (UFIXED_POINT_16), `past_key_<l> [1, Hkv, D, ctx-ar]` then `past_value_<l> [1, Hkv, ctx-ar, D]`
//! (UFIXED_POINT_8, offset -128); outputs `logits [.., ar, vocab]` (UFIXED_POINT_16 or FLOAT_32),
//! `present_key_<l> [1, Hkv, D, ar]`, `present_value_<l> [1, Hkv, ar, D]` with the encoding of the
//! layer's past input (codes go into the cache unchanged, so the encodings must agree).
//!
//! [`KvCache`]: runtime::KvCache

use runtime::{
    AttentionMask, ChunkInputs, ChunkModel, ChunkOutputs, KvPrefix, ModelError, ModelLayout, MASK_SCALE,
    MASK_ZERO_POINT,
};
use thiserror::Error;

use crate::dtype::DataType;
use crate::encoding::ScaleOffset;
use crate::graph::QnnGraph;
use crate::interp::InterpError;
use crate::io::{GraphIo, IoTensor};
use crate::sdk::emulated::EmulatedHtp;
use crate::sdk::exec::{io_element_bytes, read_codes, read_f32, write_codes, QnnExecApi};
use crate::sdk::{ApiError, ContextHandle, GraphHandle};

/// Why a context binary cannot be run as a chunk model.
#[derive(Debug, Error)]
pub enum QnnModelError {
    #[error("graph `{graph}`: `{tensor}` {detail}")]
    Io { graph: String, tensor: String, detail: String },
    #[error("graph `{graph}`: {detail}")]
    Contract { graph: String, detail: String },
    /// The binary's metadata has no scale/offset for fixed-point I/O; the lowered graphs the
    /// binary was built from can supply them.
    #[error(
        "graph `{graph}`: `{tensor}` is {dtype} but the binary's metadata gives no scale/offset; \
         open it with the lowered graphs it was built from"
    )]
    MissingEncoding { graph: String, tensor: String, dtype: DataType },
    #[error("graphs `{first}` and `{second}` disagree: {detail}")]
    Mismatch { first: String, second: String, detail: String },
    #[error("no graphs were given")]
    NoGraphs,
    /// A shard of a sharded model set is missing, extra or does not fit the others.
    #[error("shard {shard}: {detail}")]
    Shard { shard: String, detail: String },
    #[error("opening the context binary: {0}")]
    Api(#[from] ApiError),
    #[error("preparing the CPU emulation: {0}")]
    Emulator(#[from] InterpError),
}

/// One retrieved graph with its client buffers.
struct Graph {
    io: GraphIo,
    handle: GraphHandle,
    ar: usize,
    /// The mask width: a family holds graphs of several context lengths.
    context_len: usize,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
}

/// A context binary's chunk graphs (e.g. chunk 32 for prefill and 1 for decode) run through
/// [`QnnExecApi`] as a [`ChunkModel`] with a u8 KV cache.
pub struct QnnChunkModel<A: QnnExecApi> {
    api: A,
    context: Option<ContextHandle>,
    layout: ModelLayout,
    graphs: Vec<Graph>,
}

impl<A: QnnExecApi> std::fmt::Debug for QnnChunkModel<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let graphs: Vec<(&str, usize)> = self.graphs.iter().map(|g| (g.io.name.as_str(), g.ar)).collect();
        f.debug_struct("QnnChunkModel").field("layout", &self.layout).field("graphs", &graphs).finish()
    }
}

impl<A: QnnExecApi> QnnChunkModel<A> {
    /// Loads `binary` through `api` and retrieves the graphs described by `graphs` (one per chunk
    /// length), after checking their I/O against the contract in the module docs.
    pub fn open(mut api: A, binary: &[u8], graphs: Vec<GraphIo>) -> Result<QnnChunkModel<A>, QnnModelError> {
        let (layout, shapes) = check_contract(&graphs)?;
        let context = api.context_create_from_binary(binary)?;
        let mut retrieved = Vec::with_capacity(graphs.len());
        for (io, (ar, context_len)) in graphs.into_iter().zip(shapes) {
            let handle = match api.graph_retrieve(context, &io.name) {
                Ok(h) => h,
                Err(e) => {
                    let _ = api.context_free(context);
                    return Err(e.into());
                }
            };
            let buffer = |t: &IoTensor| vec![0u8; t.numel() * io_element_bytes(t.dtype).unwrap_or(0)];
            let inputs = io.inputs.iter().map(buffer).collect();
            let outputs = io.outputs.iter().map(buffer).collect();
            retrieved.push(Graph { io, handle, ar, context_len, inputs, outputs });
        }
        Ok(QnnChunkModel { api, context: Some(context), layout, graphs: retrieved })
    }

    /// Sets the window of the model's sliding-window layers (from its config): the runtime then
    /// fills the mask's second plane with it. The graphs' mask must have two planes exactly when
    /// there is a window.
    pub fn with_sliding_window(mut self, window: Option<usize>) -> Result<Self, QnnModelError> {
        let g = &self.graphs[0].io;
        let planes = g.inputs[2].dims.get(1).copied().unwrap_or(1) as usize;
        if planes != 1 + usize::from(window.is_some()) {
            return Err(QnnModelError::Contract {
                graph: g.name.clone(),
                detail: format!(
                    "the mask has {planes} plane(s) but the model's sliding window is {window:?} (1 plane without \
                     a window, 2 with one)"
                ),
            });
        }
        self.layout.sliding_window = window;
        Ok(self)
    }

    /// The chunk lengths this context has graphs for at its smallest context length.
    pub fn chunk_lens(&self) -> Vec<usize> {
        self.graphs.iter().filter(|g| g.context_len == self.layout.context_len).map(|g| g.ar).collect()
    }

    /// Every graph as (name, chunk, context length), in binding order.
    pub fn graph_shapes(&self) -> Vec<(String, usize, usize)> {
        self.graphs.iter().map(|g| (g.io.name.clone(), g.ar, g.context_len)).collect()
    }

    /// Real K/V of `len` prefix positions per layer (K `[Hkv, D, len]`, V `[Hkv, len, D]`) as the
    /// u8 codes of the graphs' past K/V inputs: an attention-sink prefix for the runtime's cache.
    pub fn kv_prefix(&self, len: usize, keys: &[Vec<f32>], values: &[Vec<f32>]) -> Result<KvPrefix<u8>, QnnModelError> {
        let layers = self.layout.num_layers;
        let io = &self.graphs[0].io;
        kv_prefix_codes(&self.layout, len, keys, values, |kind, l| {
            let at = if kind == "key" { 3 + l } else { 3 + layers + l };
            (io.name.as_str(), io.inputs.get(at))
        })
    }

    /// The execute API (e.g. to inspect an emulator).
    pub fn api(&self) -> &A {
        &self.api
    }

    /// The execute API, mutably (e.g. to collect what a recording wrapper saw).
    pub fn api_mut(&mut self) -> &mut A {
        &mut self.api
    }
}

impl QnnChunkModel<EmulatedHtp> {
    /// `binary` run on the CPU by [`EmulatedHtp`], the stand-in for the SDK's HTP emulation:
    /// `graphs` are the lowered graphs the binary was built from (one per chunk length), and
    /// the binary must list exactly them.
    pub fn emulated(graphs: Vec<QnnGraph>, binary: &[u8]) -> Result<Self, QnnModelError> {
        let io = graphs.iter().map(GraphIo::from_graph).collect::<Result<Vec<_>, _>>()?;
        QnnChunkModel::open(EmulatedHtp::new(graphs)?, binary, io)
    }
}

impl QnnChunkModel<crate::sdk::SdkApi> {
    /// `binary` run by a QNN backend library through the FFI (on x86, `libQnnHtp.so`'s HTP
    /// emulation). `api` must have a system library ([`crate::sdk::SdkApi::load_for_execution`]):
    /// every graph the binary holds is opened, with the I/O its metadata records. When the
    /// metadata carries no scale/offset for fixed-point I/O, give the `lowered` graphs the binary
    /// was built from; their I/O must then agree with the metadata in names, types and shapes.
    pub fn from_binary(
        api: crate::sdk::SdkApi,
        binary: &[u8],
        lowered: Option<&[QnnGraph]>,
    ) -> Result<Self, QnnModelError> {
        let info = api.binary_info(binary)?;
        let mut graphs = Vec::with_capacity(info.graphs.len());
        for g in info.graphs {
            let io = match lowered {
                None => {
                    g.check_encodings()?;
                    g
                }
                Some(lowered) => {
                    let graph = lowered.iter().find(|l| l.name == g.name).ok_or_else(|| QnnModelError::Contract {
                        graph: g.name.clone(),
                        detail: "is in the binary but not among the lowered graphs".into(),
                    })?;
                    let io = GraphIo::from_graph(graph)?;
                    check_against_metadata(&io, &g)?;
                    io
                }
            };
            graphs.push(io);
        }
        QnnChunkModel::open(api, binary, graphs)
    }
}

/// Lowered-graph I/O against the binary's metadata: same tensors, types and shapes in the same
/// order, and the same scale/offset wherever the metadata records one.
fn check_against_metadata(io: &GraphIo, info: &GraphIo) -> Result<(), QnnModelError> {
    let mismatch = |detail: String| QnnModelError::Mismatch {
        first: format!("{} (lowered)", io.name),
        second: format!("{} (binary metadata)", info.name),
        detail,
    };
    for (kind, ours, theirs) in [("inputs", &io.inputs, &info.inputs), ("outputs", &io.outputs, &info.outputs)] {
        if ours.len() != theirs.len() {
            return Err(mismatch(format!("{} {kind} against {}", ours.len(), theirs.len())));
        }
        for (a, b) in ours.iter().zip(theirs) {
            let quant_ok = b.quant.is_none() || b.quant == a.quant;
            if a.name != b.name || a.dtype != b.dtype || a.dims != b.dims || !quant_ok {
                return Err(mismatch(format!(
                    "`{}` {} {:?} {:?} against `{}` {} {:?} {:?}",
                    a.name, a.dtype, a.dims, a.quant, b.name, b.dtype, b.dims, b.quant
                )));
            }
        }
    }
    Ok(())
}

impl<A: QnnExecApi> Drop for QnnChunkModel<A> {
    fn drop(&mut self) {
        if let Some(c) = self.context.take() {
            // Nothing useful can be done about a failure while dropping.
            let _ = self.api.context_free(c);
        }
    }
}

/// Checks the I/O of every graph and derives the model layout (at the smallest context length)
/// and each graph's chunk and context lengths: a family's graphs may differ in context length
/// only, and no two may share both.
fn check_contract(graphs: &[GraphIo]) -> Result<(ModelLayout, Vec<(usize, usize)>), QnnModelError> {
    let first = graphs.first().ok_or(QnnModelError::NoGraphs)?;
    let mut layout = layout_of(first)?;
    let mut shapes = Vec::with_capacity(graphs.len());
    for g in graphs {
        let other = layout_of(g)?;
        if (ModelLayout { context_len: layout.context_len, ..other }) != layout {
            return Err(QnnModelError::Mismatch {
                first: first.name.clone(),
                second: g.name.clone(),
                detail: format!("layouts {layout:?} and {other:?} (only the context length may differ)"),
            });
        }
        let ar = g.inputs[0].numel();
        if shapes.contains(&(ar, other.context_len)) {
            return Err(QnnModelError::Contract {
                graph: g.name.clone(),
                detail: format!("a second graph for chunk {ar} at context {}", other.context_len),
            });
        }
        check_graph(g, &other, ar)?;
        shapes.push((ar, other.context_len));
        layout.context_len = layout.context_len.min(other.context_len);
    }
    Ok((layout, shapes))
}

fn layout_of(g: &GraphIo) -> Result<ModelLayout, QnnModelError> {
    let bad = |detail: String| QnnModelError::Contract { graph: g.name.clone(), detail };
    let n_kv = g.inputs.len().checked_sub(3).filter(|n| n.is_multiple_of(2) && *n > 0);
    let n_kv =
        n_kv.ok_or_else(|| bad(format!("{} inputs; expected ids, positions, mask and K/V pairs", g.inputs.len())))?;
    let key = &g.inputs[3];
    let mask = &g.inputs[2];
    let logits = g.outputs.first().ok_or_else(|| bad("no outputs".into()))?;
    if key.dims.len() != 4 || mask.dims.len() != 4 {
        return Err(bad(format!("`{}` {:?} / `{}` {:?} are not 4-d", key.name, key.dims, mask.name, mask.dims)));
    }
    Ok(ModelLayout {
        num_layers: n_kv / 2,
        num_kv_heads: key.dims[1] as usize,
        head_dim: key.dims[2] as usize,
        vocab_size: logits.dims.last().copied().unwrap_or(0) as usize,
        context_len: mask.dims[3] as usize,
        // Set by `with_sliding_window`: the window is the model's, not in the graphs.
        sliding_window: None,
    })
}

/// Names, types, shapes and encodings of one graph's I/O for chunk `ar`.
fn check_graph(g: &GraphIo, l: &ModelLayout, ar: usize) -> Result<(), QnnModelError> {
    let bad =
        |t: &IoTensor, detail: String| QnnModelError::Io { graph: g.name.clone(), tensor: t.name.clone(), detail };
    let (layers, kvh, d, ctx) = (l.num_layers, l.num_kv_heads as u32, l.head_dim as u32, l.context_len);
    if ar == 0 || ar >= ctx {
        return Err(QnnModelError::Contract { graph: g.name.clone(), detail: format!("chunk {ar} for context {ctx}") });
    }
    if g.outputs.len() != 1 + 2 * layers {
        return Err(QnnModelError::Contract {
            graph: g.name.clone(),
            detail: format!("{} outputs; expected logits and {layers} K/V pairs", g.outputs.len()),
        });
    }
    let (a, past) = (ar as u32, (ctx - ar) as u32);
    // One mask plane, or two (full, sliding window) for a model with sliding-window layers.
    let planes = if g.inputs[2].dims.get(1) == Some(&2) { 2 } else { 1 };
    let mut expected: Vec<(String, Vec<u32>, &[DataType])> = vec![
        ("input_ids".into(), vec![1, a], &[DataType::Int32]),
        ("position_ids".into(), vec![a], &[DataType::Int32]),
        ("attention_mask".into(), vec![1, planes, a, ctx as u32], &[DataType::UFixedPoint16]),
    ];
    let kv = |prefix: &str, k: bool, cols: u32| -> Vec<(String, Vec<u32>, &'static [DataType])> {
        (0..layers)
            .map(|i| {
                let dims = if k { vec![1, kvh, d, cols] } else { vec![1, kvh, cols, d] };
                (format!("{prefix}_{}_{i}", if k { "key" } else { "value" }), dims, &[DataType::UFixedPoint8][..])
            })
            .collect()
    };
    expected.extend(kv("past", true, past));
    expected.extend(kv("past", false, past));
    let mut outs: Vec<(String, Vec<u32>, &[DataType])> = Vec::new();
    outs.extend(kv("present", true, a));
    outs.extend(kv("present", false, a));
    for (t, (name, dims, dtypes)) in g.inputs.iter().zip(&expected).chain(g.outputs[1..].iter().zip(&outs)) {
        if &t.name != name || &t.dims != dims || !dtypes.contains(&t.dtype) {
            return Err(bad(t, format!("is {} {:?}; expected `{name}` {} {dims:?}", t.dtype, t.dims, dtypes[0])));
        }
    }
    let logits = &g.outputs[0];
    let rows: usize = logits.dims[..logits.dims.len() - 1].iter().map(|&x| x as usize).product();
    let quantized = logits.dtype == DataType::UFixedPoint16 && logits.quant.is_some();
    if logits.name != "logits" || rows != ar || !(quantized || logits.dtype == DataType::Float32) {
        return Err(bad(
            logits,
            format!(
                "is {} {:?}; expected `logits` UFIXED_POINT_16 or FLOAT_32 [.., {ar}, vocab]",
                logits.dtype, logits.dims
            ),
        ));
    }
    if g.inputs[2].quant.is_none() {
        return Err(bad(&g.inputs[2], "has no scale/offset encoding".into()));
    }
    // KV codes are stored as they come: symmetric u8 inputs, outputs in the same encoding.
    for i in 0..2 * layers {
        let (past_t, present_t) = (&g.inputs[3 + i], &g.outputs[1 + i]);
        match past_t.quant {
            Some(so) if so.offset == -128 && present_t.quant == Some(so) => {}
            _ => {
                return Err(bad(
                    present_t,
                    format!(
                        "has encoding {:?}; expected the u8-symmetric encoding of `{}` ({:?})",
                        present_t.quant, past_t.name, past_t.quant
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Real K/V of `len` prefix positions per layer as the u8 codes of the graphs' past K/V inputs;
/// `past(kind, layer)` names the graph and gives the input (`kind` is "key" or "value").
pub(crate) fn kv_prefix_codes<'g>(
    layout: &ModelLayout,
    len: usize,
    keys: &[Vec<f32>],
    values: &[Vec<f32>],
    past: impl Fn(&str, usize) -> (&'g str, Option<&'g IoTensor>),
) -> Result<KvPrefix<u8>, QnnModelError> {
    let layers = layout.num_layers;
    let graph0 = past("key", 0).0.to_string();
    if keys.len() != layers || values.len() != layers {
        return Err(QnnModelError::Contract {
            graph: graph0,
            detail: format!("the prefix has K/V of {} and {} layers, the graphs {layers}", keys.len(), values.len()),
        });
    }
    let codes = |kind: &str, l: usize, real: &[f32]| -> Result<Vec<u8>, QnnModelError> {
        let (graph, io) = past(kind, l);
        let contract = |detail: String| QnnModelError::Contract { graph: graph.to_string(), detail };
        let io = io.ok_or_else(|| contract(format!("no past {kind} input for layer {l}")))?;
        let so = io.quant.filter(|_| io.dtype == DataType::UFixedPoint8).ok_or_else(|| {
            contract(format!("past K/V input `{}` is {} without a scale/offset, not u8", io.name, io.dtype))
        })?;
        if real.len() != layout.kv_elems(len) {
            return Err(contract(format!(
                "a prefix of {len} positions has {} values for `{}`, expected {}",
                real.len(),
                io.name,
                layout.kv_elems(len)
            )));
        }
        Ok(real.iter().map(|&x| so.quantize(x, (0, 255)) as u8).collect())
    };
    Ok(KvPrefix {
        len,
        keys: keys.iter().enumerate().map(|(l, k)| codes("key", l, k)).collect::<Result<_, _>>()?,
        values: values.iter().enumerate().map(|(l, v)| codes("value", l, v)).collect::<Result<_, _>>()?,
    })
}

impl<A: QnnExecApi> ChunkModel for QnnChunkModel<A> {
    type Kv = u8;

    fn layout(&self) -> ModelLayout {
        self.layout
    }

    fn supports_chunk_len(&self, ar: usize) -> bool {
        self.supports_graph(ar, self.layout.context_len)
    }

    fn supports_graph(&self, ar: usize, context_len: usize) -> bool {
        self.graphs.iter().any(|g| g.ar == ar && g.context_len == context_len)
    }

    fn run_chunk(&mut self, inputs: &ChunkInputs<'_, u8>, outputs: &mut ChunkOutputs<u8>) -> Result<(), ModelError> {
        let (ar, ctx) = (inputs.ar(), inputs.mask().context_len());
        let layers = self.layout.num_layers;
        let g = self
            .graphs
            .iter_mut()
            .find(|g| g.ar == ar && g.context_len == ctx)
            .ok_or_else(|| format!("the context has no graph for chunks of {ar} tokens at context {ctx}"))?;
        let codes = |v: &[i32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        let put = |io: &IoTensor, buf: &mut [u8], codes: &[i64]| -> Result<(), ModelError> {
            write_codes(io.dtype, codes, buf)
                .ok_or_else(|| format!("`{}`: values do not fit {} {:?}", io.name, io.dtype, io.dims).into())
        };
        put(&g.io.inputs[0], &mut g.inputs[0], &codes(inputs.ids()))?;
        put(&g.io.inputs[1], &mut g.inputs[1], &codes(inputs.positions()))?;
        let mask_io = &g.io.inputs[2];
        let mask_codes = mask_codes(inputs.mask(), mask_io.quant.unwrap_or(ScaleOffset { scale: 1.0, offset: 0 }));
        put(mask_io, &mut g.inputs[2], &mask_codes)?;
        for l in 0..layers {
            g.inputs[3 + l].copy_from_slice(inputs.past_key(l));
            g.inputs[3 + layers + l].copy_from_slice(inputs.past_value(l));
        }
        {
            let ins: Vec<&[u8]> = g.inputs.iter().map(Vec::as_slice).collect();
            let mut outs: Vec<&mut [u8]> = g.outputs.iter_mut().map(Vec::as_mut_slice).collect();
            self.api.graph_execute(g.handle, &ins, &mut outs)?;
        }
        let logits_io = &g.io.outputs[0];
        let logits = match logits_io.quant {
            Some(so) if logits_io.dtype != DataType::Float32 => {
                let codes = read_codes(logits_io.dtype, &g.outputs[0]).ok_or("logits buffer has a partial element")?;
                codes.iter().map(|&q| so.dequantize(q)).collect()
            }
            _ => read_f32(&g.outputs[0]),
        };
        outputs.logits_mut().copy_from_slice(&logits);
        for l in 0..layers {
            let (k, v) = outputs.present_kv_mut(l);
            k.copy_from_slice(&g.outputs[1 + l]);
            v.copy_from_slice(&g.outputs[1 + layers + l]);
        }
        Ok(())
    }
}

/// The runtime's mask (u16 codes in mllm's mask encoding) in the graph input's encoding: the
/// codes themselves when the encodings agree (the lowering's case), requantized otherwise.
pub(crate) fn mask_codes(mask: &AttentionMask, graph: ScaleOffset) -> Vec<i64> {
    let ours = ScaleOffset::from_zero_point(MASK_SCALE, MASK_ZERO_POINT);
    if graph == ours {
        return mask.as_u16().iter().map(|&c| i64::from(c)).collect();
    }
    mask.as_u16().iter().map(|&c| graph.quantize(ours.dequantize(i64::from(c)), (0, 65535))).collect()
}
