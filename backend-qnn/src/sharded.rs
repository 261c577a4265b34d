//! [`ShardedChunkModel`]: a model split into several context binaries (shards of contiguous
//! decoder layers) as one [`ChunkModel`] for the generation runtime.
//!
//! Every shard is a context with one graph per chunk length, named `model.<i>.s<ar>` (`i` the
//! shard's index). Per chunk the shards run in order: shard 0 takes `input_ids`, or the token
//! embedding's rows gathered on the CPU ([`TokenEmbedding`]) as `hidden_states`; each later one
//! the `hidden_states_out` output of the one before (the same bytes: both sides carry one encoding,
//! checked when opening), every shard the positions, the mask and the past K/V of its own layers
//! from the runtime's cache; the last shard's `logits` are the chunk's logits. Graph I/O is
//! bound by name:
//! inputs `input_ids` (shard 0) or `hidden_states`, `position_ids`, `attention_mask`,
//! `past_key_<l>`, `past_value_<l>`; outputs `logits` (last shard) or `hidden_states_out`,
//! `present_key_<l>`, `present_value_<l>` with `l` the model's layer index.
//!
//! Opening refuses a set with a missing, extra or mismatched shard, naming it
//! ([`QnnModelError::Shard`]).

use std::collections::BTreeMap;
use std::ops::Range;

use runtime::{ChunkInputs, ChunkModel, ChunkOutputs, ModelError, ModelLayout};

use crate::chunk_model::QnnModelError;
use crate::dtype::DataType;
use crate::encoding::ScaleOffset;
use crate::io::{GraphIo, IoTensor};
use crate::sdk::exec::{io_element_bytes, read_codes, read_f32, write_codes, QnnExecApi};
use crate::sdk::{ContextHandle, GraphHandle};

/// The graph input the hidden state enters a shard as (every shard but the first).
pub const HIDDEN_STATES: &str = "hidden_states";
/// The graph output the hidden state leaves a shard as (every shard but the last); a middle shard
/// has both, and one graph cannot hold two tensors of one name.
pub const HIDDEN_STATES_OUT: &str = "hidden_states_out";

/// The token embedding of a set whose first shard takes `hidden_states`: a u16 lookup table
/// gathered on the CPU.
pub trait TokenEmbedding {
    /// Where the table came from (for messages).
    fn origin(&self) -> &str;
    /// Rows (the vocabulary) and row length (the hidden size).
    fn dims(&self) -> (usize, usize);
    /// The encoding of its u16 codes.
    fn encoding(&self) -> ScaleOffset;
    /// The u16 codes (little-endian) of rows `ids`, one after another, into `out`
    /// (`ids.len() * hidden * 2` bytes); an id outside the table is an error.
    fn gather(&self, ids: &[i32], out: &mut [u8]) -> Result<(), String>;
}

/// What a graph input or output is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Ids,
    Positions,
    Mask,
    Hidden,
    Logits,
    PastKey(usize),
    PastValue(usize),
    PresentKey(usize),
    PresentValue(usize),
}

fn role_of(name: &str) -> Option<Role> {
    let layer = |prefix: &str| name.strip_prefix(prefix).and_then(|l| l.parse::<usize>().ok());
    Some(match name {
        "input_ids" => Role::Ids,
        "position_ids" => Role::Positions,
        "attention_mask" => Role::Mask,
        HIDDEN_STATES | HIDDEN_STATES_OUT => Role::Hidden,
        "logits" => Role::Logits,
        _ => {
            if let Some(l) = layer("past_key_") {
                Role::PastKey(l)
            } else if let Some(l) = layer("past_value_") {
                Role::PastValue(l)
            } else if let Some(l) = layer("present_key_") {
                Role::PresentKey(l)
            } else if let Some(l) = layer("present_value_") {
                Role::PresentValue(l)
            } else {
                return None;
            }
        }
    })
}

/// One shard's binary with the I/O of its graphs (from the binary's metadata or the lowered
/// graphs it was built from), and where it came from (for messages).
pub struct ShardBinary {
    /// The file (or other origin) named in errors.
    pub origin: String,
    pub binary: Vec<u8>,
    pub graphs: Vec<GraphIo>,
}

struct Graph {
    io: GraphIo,
    handle: GraphHandle,
    ar: usize,
    roles_in: Vec<Role>,
    roles_out: Vec<Role>,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
}

struct Shard {
    origin: String,
    context: ContextHandle,
    layers: Range<usize>,
    graphs: Vec<Graph>,
}

/// Shards of a model chained as one [`ChunkModel`] (u8 KV cache), through one [`QnnExecApi`].
pub struct ShardedChunkModel<A: QnnExecApi> {
    api: A,
    layout: ModelLayout,
    shards: Vec<Shard>,
    embedding: Option<Box<dyn TokenEmbedding>>,
}

impl<A: QnnExecApi> std::fmt::Debug for ShardedChunkModel<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shards: Vec<(&str, &Range<usize>)> = self.shards.iter().map(|s| (s.origin.as_str(), &s.layers)).collect();
        f.debug_struct("ShardedChunkModel").field("layout", &self.layout).field("shards", &shards).finish()
    }
}

fn shard_err(shard: &str, detail: impl Into<String>) -> QnnModelError {
    QnnModelError::Shard { shard: shard.to_string(), detail: detail.into() }
}

impl<A: QnnExecApi> ShardedChunkModel<A> {
    /// Checks the set (shard `i` of the list holds graphs `model.<i>.s<ar>`, the same chunk
    /// lengths in every shard, contiguous layers from 0, the hidden state's type and encoding
    /// equal on both sides of each boundary, K/V and mask I/O as [`crate::QnnChunkModel`]
    /// expects; `embedding` given exactly when shard 0 takes `hidden_states`, with its row
    /// length and encoding), then loads every binary through `api`.
    pub fn open(
        mut api: A,
        shards: Vec<ShardBinary>,
        embedding: Option<Box<dyn TokenEmbedding>>,
    ) -> Result<ShardedChunkModel<A>, QnnModelError> {
        let count = shards.len();
        if count == 0 {
            return Err(QnnModelError::NoGraphs);
        }
        // Check everything before loading anything.
        let mut plans = Vec::with_capacity(count);
        let mut next_layer = 0;
        let mut chunk_set: Option<Vec<usize>> = None;
        let mut layout: Option<ModelLayout> = None;
        // The previous shard's hidden_states output, by chunk length.
        let mut hidden_out: BTreeMap<usize, (String, IoTensor)> = BTreeMap::new();
        for (index, s) in shards.iter().enumerate() {
            let first = index == 0;
            let last = index + 1 == count;
            let err = |d: String| shard_err(&s.origin, d);
            if s.graphs.is_empty() {
                return Err(err("holds no graphs".into()));
            }
            let mut graph_layers: Option<Range<usize>> = None;
            let mut ars = Vec::new();
            let mut hidden_here: BTreeMap<usize, IoTensor> = BTreeMap::new();
            for g in &s.graphs {
                let Some((i, ar)) = compiler::passes::parse_graph_name(&g.name) else {
                    return Err(err(format!("graph `{}` is not named model.<shard>.s<chunk>", g.name)));
                };
                if i != index {
                    return Err(err(format!(
                        "graph `{}` belongs to shard {} of the set, but this file is shard {} of {count}",
                        g.name,
                        i + 1,
                        index + 1
                    )));
                }
                let roles_in: Vec<Role> = g
                    .inputs
                    .iter()
                    .map(|t| {
                        role_of(&t.name).ok_or_else(|| err(format!("graph `{}`: unknown input `{}`", g.name, t.name)))
                    })
                    .collect::<Result<_, _>>()?;
                let roles_out: Vec<Role> = g
                    .outputs
                    .iter()
                    .map(|t| {
                        role_of(&t.name).ok_or_else(|| err(format!("graph `{}`: unknown output `{}`", g.name, t.name)))
                    })
                    .collect::<Result<_, _>>()?;
                let has = |roles: &[Role], r: Role| roles.contains(&r);
                // Shard 0 takes ids, or the CPU's embedding rows; every later one hidden states.
                let takes_rows = first && embedding.is_some();
                if (first && !takes_rows) != has(&roles_in, Role::Ids)
                    || (!first || takes_rows) != has(&roles_in, Role::Hidden)
                {
                    return Err(err(format!(
                        "graph `{}` {}; as shard {} of {count} it must take {}",
                        g.name,
                        if has(&roles_in, Role::Ids) { "takes input_ids" } else { "takes hidden_states" },
                        index + 1,
                        match (first, &embedding) {
                            (true, None) =>
                                "input_ids (or hidden_states with the CPU embedding table, which is missing)"
                                    .to_string(),
                            (true, Some(e)) => format!("hidden_states gathered from {}", e.origin()),
                            (false, _) => "hidden_states".to_string(),
                        }
                    )));
                }
                if last != has(&roles_out, Role::Logits) || last == has(&roles_out, Role::Hidden) {
                    return Err(err(format!(
                        "graph `{}` {}; as shard {} of {count} it must output {}",
                        g.name,
                        if has(&roles_out, Role::Logits) {
                            "outputs logits (it is a last shard)"
                        } else {
                            "outputs hidden_states_out"
                        },
                        index + 1,
                        if last { "logits (is a shard missing after it?)" } else { "hidden_states_out" }
                    )));
                }
                let keys: Vec<usize> =
                    roles_in.iter().filter_map(|r| if let Role::PastKey(l) = r { Some(*l) } else { None }).collect();
                let (Some(&lo), Some(&hi)) = (keys.iter().min(), keys.iter().max()) else {
                    return Err(err(format!("graph `{}` has no past_key_<l> inputs", g.name)));
                };
                let range = lo..hi + 1;
                if keys.len() != range.len() {
                    return Err(err(format!("graph `{}`: its layers {keys:?} are not contiguous", g.name)));
                }
                for l in range.clone() {
                    for r in [Role::PastValue(l)] {
                        if !has(&roles_in, r) {
                            return Err(err(format!("graph `{}` lacks past_value_{l}", g.name)));
                        }
                    }
                    for r in [Role::PresentKey(l), Role::PresentValue(l)] {
                        if !has(&roles_out, r) {
                            return Err(err(format!("graph `{}` lacks {r:?} of layer {l}", g.name)));
                        }
                    }
                }
                match &graph_layers {
                    None => graph_layers = Some(range),
                    Some(r) if *r != range => {
                        return Err(err(format!("graphs hold layers {r:?} and {range:?}")));
                    }
                    _ => {}
                }
                if ars.contains(&ar) {
                    return Err(err(format!("a second graph for chunk {ar}")));
                }
                ars.push(ar);
                let pos = g.inputs.iter().position(|t| t.name == "position_ids");
                if pos.map(|p| g.inputs[p].numel()) != Some(ar) {
                    return Err(err(format!("graph `{}`: position_ids does not hold {ar} positions", g.name)));
                }
                // The hidden state: equal type, shape and encoding on both sides.
                if let Some(t) = g.outputs.iter().find(|t| t.name == HIDDEN_STATES_OUT) {
                    hidden_here.insert(ar, t.clone());
                }
                if let (Some(t), true, Some(e)) = (g.inputs.iter().find(|t| t.name == HIDDEN_STATES), first, &embedding)
                {
                    let (_, hidden) = e.dims();
                    if t.dtype != DataType::UFixedPoint16
                        || t.dims.last().map(|&d| d as usize) != Some(hidden)
                        || t.numel() != ar * hidden
                        || t.quant != Some(e.encoding())
                    {
                        return Err(err(format!(
                            "graph `{}` takes hidden_states {} {:?} {:?}, but the embedding table {} holds u16 rows of                              {hidden} with {:?}: a table of another build?",
                            g.name,
                            t.dtype,
                            t.dims,
                            t.quant,
                            e.origin(),
                            e.encoding()
                        )));
                    }
                } else if let Some(t) = g.inputs.iter().find(|t| t.name == HIDDEN_STATES) {
                    let Some((prev_origin, prev)) = hidden_out.get(&ar) else {
                        return Err(err(format!(
                            "graph `{}` takes hidden_states but no shard before it outputs them",
                            g.name
                        )));
                    };
                    if t.dtype != prev.dtype || t.dims != prev.dims || t.quant != prev.quant {
                        return Err(err(format!(
                            "its hidden_states input is {} {:?} {:?}, but {prev_origin} outputs {} {:?} {:?}: shards of \
                             different builds?",
                            t.dtype, t.dims, t.quant, prev.dtype, prev.dims, prev.quant
                        )));
                    }
                }
                let mask = g.inputs.iter().find(|t| t.name == "attention_mask");
                let key = g.inputs.iter().find(|t| t.name == format!("past_key_{lo}"));
                let (Some(mask), Some(key)) = (mask, key) else {
                    return Err(err(format!("graph `{}` lacks attention_mask", g.name)));
                };
                let here = ModelLayout {
                    num_layers: 0,
                    num_kv_heads: key.dims.get(1).copied().unwrap_or(0) as usize,
                    head_dim: key.dims.get(2).copied().unwrap_or(0) as usize,
                    vocab_size: 0,
                    sliding_window: None,
                    context_len: mask.dims.get(3).copied().unwrap_or(0) as usize,
                };
                let mut l = layout.unwrap_or(here);
                if (l.num_kv_heads, l.head_dim, l.context_len) != (here.num_kv_heads, here.head_dim, here.context_len) {
                    return Err(err(format!("graph `{}` has layout {here:?}, earlier shards {l:?}", g.name)));
                }
                if let Some(p) = g.outputs.iter().find(|t| t.name == "logits") {
                    l.vocab_size = p.dims.last().copied().unwrap_or(0) as usize;
                }
                layout = Some(l);
                // K/V codes go into the cache unchanged.
                for l in graph_layers.clone().unwrap_or(0..0) {
                    for (past, present) in [
                        (format!("past_key_{l}"), format!("present_key_{l}")),
                        (format!("past_value_{l}"), format!("present_value_{l}")),
                    ] {
                        let p = g.inputs.iter().find(|t| t.name == past);
                        let q = g.outputs.iter().find(|t| t.name == present);
                        match (p, q) {
                            (Some(p), Some(q))
                                if p.dtype == DataType::UFixedPoint8
                                    && p.quant.is_some_and(|so| so.offset == -128)
                                    && q.quant == p.quant => {}
                            _ => {
                                return Err(err(format!(
                                    "graph `{}`: {present} must carry the u8-symmetric encoding of {past}",
                                    g.name
                                )))
                            }
                        }
                    }
                }
            }
            let layers = graph_layers.expect("checked: graphs exist");
            if layers.start != next_layer {
                return Err(err(format!(
                    "holds layers {}..={}, but the shards before it end at layer {} (a shard missing or from another \
                     split?)",
                    layers.start,
                    layers.end - 1,
                    next_layer as i64 - 1
                )));
            }
            next_layer = layers.end;
            ars.sort_unstable();
            match &chunk_set {
                None => chunk_set = Some(ars.clone()),
                Some(c) if *c != ars => {
                    return Err(err(format!("has graphs for chunks {ars:?}, the first shard for {c:?}")));
                }
                _ => {}
            }
            hidden_out = hidden_here.into_iter().map(|(ar, t)| (ar, (s.origin.clone(), t))).collect();
            plans.push(layers);
        }
        let mut layout = layout.expect("checked: shards exist");
        layout.num_layers = next_layer;
        if let Some(e) = &embedding {
            let (vocab, _) = e.dims();
            if vocab != layout.vocab_size {
                return Err(shard_err(
                    e.origin(),
                    format!("holds {vocab} token rows, but the last shard's logits cover {}", layout.vocab_size),
                ));
            }
        }
        // Load.
        let mut loaded: Vec<Shard> = Vec::with_capacity(count);
        let result = (|| {
            for (s, layers) in shards.into_iter().zip(plans) {
                let context =
                    api.context_create_from_binary(&s.binary).map_err(|e| shard_err(&s.origin, e.to_string()))?;
                loaded.push(Shard { origin: s.origin.clone(), context, layers, graphs: Vec::new() });
                let shard = loaded.last_mut().expect("pushed");
                for io in s.graphs {
                    let handle =
                        api.graph_retrieve(context, &io.name).map_err(|e| shard_err(&s.origin, e.to_string()))?;
                    let buffer = |t: &IoTensor| vec![0u8; t.numel() * io_element_bytes(t.dtype).unwrap_or(0)];
                    let ar = compiler::passes::parse_graph_name(&io.name).map_or(0, |(_, ar)| ar);
                    shard.graphs.push(Graph {
                        roles_in: io.inputs.iter().filter_map(|t| role_of(&t.name)).collect(),
                        roles_out: io.outputs.iter().filter_map(|t| role_of(&t.name)).collect(),
                        inputs: io.inputs.iter().map(buffer).collect(),
                        outputs: io.outputs.iter().map(buffer).collect(),
                        io,
                        handle,
                        ar,
                    });
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            for s in &loaded {
                let _ = api.context_free(s.context);
            }
            return Err(e);
        }
        Ok(ShardedChunkModel { api, layout, shards: loaded, embedding })
    }

    /// Sets the window of the model's sliding-window layers (from its config), as
    /// [`crate::QnnChunkModel::with_sliding_window`]: every shard's mask must have two planes
    /// exactly when there is a window.
    pub fn with_sliding_window(mut self, window: Option<usize>) -> Result<Self, QnnModelError> {
        for shard in &self.shards {
            for g in &shard.graphs {
                let mask = g.io.inputs.iter().find(|t| t.name == "attention_mask");
                let planes = mask.and_then(|m| m.dims.get(1)).copied().unwrap_or(1) as usize;
                if planes != 1 + usize::from(window.is_some()) {
                    return Err(shard_err(
                        &shard.origin,
                        format!(
                            "graph `{}`: the mask has {planes} plane(s) but the model's sliding window is {window:?} \
                             (1 plane without a window, 2 with one)",
                            g.io.name
                        ),
                    ));
                }
            }
        }
        self.layout.sliding_window = window;
        Ok(self)
    }

    /// Real K/V of `len` prefix positions per layer (K `[Hkv, D, len]`, V `[Hkv, len, D]`) as the
    /// u8 codes of the past K/V inputs of the shard holding each layer: an attention-sink prefix.
    pub fn kv_prefix(
        &self,
        len: usize,
        keys: &[Vec<f32>],
        values: &[Vec<f32>],
    ) -> Result<runtime::KvPrefix<u8>, QnnModelError> {
        crate::chunk_model::kv_prefix_codes(&self.layout, len, keys, values, |kind, l| {
            let shard = self.shards.iter().find(|s| s.layers.contains(&l)).unwrap_or(&self.shards[0]);
            let io = &shard.graphs[0].io;
            (io.name.as_str(), io.inputs.iter().find(|t| t.name == format!("past_{kind}_{l}")))
        })
    }

    /// The chunk lengths every shard has graphs for.
    pub fn chunk_lens(&self) -> Vec<usize> {
        self.shards[0].graphs.iter().map(|g| g.ar).collect()
    }

    /// Each shard's origin and layers.
    pub fn shards(&self) -> Vec<(String, Range<usize>)> {
        self.shards.iter().map(|s| (s.origin.clone(), s.layers.clone())).collect()
    }

    pub fn api(&self) -> &A {
        &self.api
    }
}

impl<A: QnnExecApi> Drop for ShardedChunkModel<A> {
    fn drop(&mut self) {
        for s in &self.shards {
            let _ = self.api.context_free(s.context);
        }
    }
}

impl<A: QnnExecApi> ChunkModel for ShardedChunkModel<A> {
    type Kv = u8;

    fn layout(&self) -> ModelLayout {
        self.layout
    }

    fn supports_chunk_len(&self, ar: usize) -> bool {
        self.shards[0].graphs.iter().any(|g| g.ar == ar)
    }

    fn run_chunk(&mut self, inputs: &ChunkInputs<'_, u8>, outputs: &mut ChunkOutputs<u8>) -> Result<(), ModelError> {
        let ar = inputs.ar();
        let mut hidden: Vec<u8> = Vec::new();
        if let Some(e) = &self.embedding {
            hidden = vec![0u8; ar * e.dims().1 * 2];
            e.gather(inputs.ids(), &mut hidden).map_err(|d| format!("{}: {d}", e.origin()))?;
        }
        let codes = |v: &[i32]| v.iter().map(|&x| i64::from(x)).collect::<Vec<_>>();
        let ids = codes(inputs.ids());
        let positions = codes(inputs.positions());
        for shard in &mut self.shards {
            let g = shard
                .graphs
                .iter_mut()
                .find(|g| g.ar == ar)
                .ok_or_else(|| format!("{} has no graph for chunks of {ar} tokens", shard.origin))?;
            for (k, role) in g.roles_in.iter().enumerate() {
                let io = &g.io.inputs[k];
                let buf = &mut g.inputs[k];
                let put = |buf: &mut [u8], codes: &[i64]| -> Result<(), ModelError> {
                    write_codes(io.dtype, codes, buf)
                        .ok_or_else(|| format!("`{}`: values do not fit {} {:?}", io.name, io.dtype, io.dims).into())
                };
                match *role {
                    Role::Ids => put(buf, &ids)?,
                    Role::Positions => put(buf, &positions)?,
                    Role::Mask => {
                        let so = io.quant.unwrap_or(ScaleOffset { scale: 1.0, offset: 0 });
                        put(buf, &crate::chunk_model::mask_codes(inputs.mask(), so))?
                    }
                    Role::Hidden => {
                        if hidden.len() != buf.len() {
                            return Err(format!(
                                "{}: hidden_states of {} bytes from the shard before, expected {}",
                                shard.origin,
                                hidden.len(),
                                buf.len()
                            )
                            .into());
                        }
                        buf.copy_from_slice(&hidden)
                    }
                    Role::PastKey(l) => buf.copy_from_slice(inputs.past_key(l)),
                    Role::PastValue(l) => buf.copy_from_slice(inputs.past_value(l)),
                    other => return Err(format!("{}: input role {other:?}", shard.origin).into()),
                }
            }
            {
                let ins: Vec<&[u8]> = g.inputs.iter().map(Vec::as_slice).collect();
                let mut outs: Vec<&mut [u8]> = g.outputs.iter_mut().map(Vec::as_mut_slice).collect();
                self.api.graph_execute(g.handle, &ins, &mut outs).map_err(|e| format!("{}: {e}", shard.origin))?;
            }
            for (k, role) in g.roles_out.iter().enumerate() {
                let buf = &g.outputs[k];
                match *role {
                    Role::Hidden => hidden = buf.clone(),
                    Role::PresentKey(l) => outputs.present_kv_mut(l).0.copy_from_slice(buf),
                    Role::PresentValue(l) => outputs.present_kv_mut(l).1.copy_from_slice(buf),
                    Role::Logits => {
                        let io = &g.io.outputs[k];
                        let logits: Vec<f32> = match io.quant {
                            Some(so) if io.dtype != DataType::Float32 => read_codes(io.dtype, buf)
                                .ok_or("logits buffer has a partial element")?
                                .iter()
                                .map(|&q| so.dequantize(q))
                                .collect(),
                            _ => read_f32(buf),
                        };
                        outputs.logits_mut().copy_from_slice(&logits);
                    }
                    other => return Err(format!("{}: output role {other:?}", shard.origin).into()),
                }
            }
        }
        Ok(())
    }
}

/// The shard files of a set, by index: `dir` (or the directory of `first`) holding
/// `context_<i>_of_<n>.bin` (with `x86`, `context_<i>_of_<n>.x86.bin`). Refuses a set with a
/// missing shard, a shard of another count, or an extra file, naming it.
pub fn shard_set_files(path: &std::path::Path, x86: bool) -> Result<Vec<std::path::PathBuf>, QnnModelError> {
    let dir =
        if path.is_dir() { path.to_path_buf() } else { path.parent().map(|p| p.to_path_buf()).unwrap_or_default() };
    let suffix = if x86 { ".x86.bin" } else { ".bin" };
    let mut found: BTreeMap<usize, (usize, std::path::PathBuf)> = BTreeMap::new();
    let mut counts: BTreeMap<usize, String> = BTreeMap::new();
    let entries = std::fs::read_dir(&dir).map_err(|e| shard_err(&dir.display().to_string(), e.to_string()))?;
    for entry in entries.flatten() {
        let p = entry.path();
        let Some(name) = p.file_name().and_then(|n| n.to_str()) else { continue };
        let Some(stem) = name.strip_prefix("context_").and_then(|r| r.strip_suffix(suffix)) else { continue };
        if !x86 && stem.ends_with(".x86") {
            continue;
        }
        let Some((i, n)) =
            stem.split_once("_of_").and_then(|(i, n)| Some((i.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
        else {
            continue;
        };
        counts.insert(n, p.display().to_string());
        found.insert(i, (n, p));
    }
    if counts.len() > 1 {
        let list: Vec<String> = counts.values().cloned().collect();
        return Err(shard_err(
            &dir.display().to_string(),
            format!("holds shards of different splits ({}): keep one set", list.join(", ")),
        ));
    }
    let Some((&n, _)) = counts.iter().next() else {
        return Err(shard_err(&dir.display().to_string(), format!("holds no context_<i>_of_<n>{suffix} files")));
    };
    let mut files = Vec::with_capacity(n);
    for i in 1..=n {
        match found.remove(&i) {
            Some((_, p)) => files.push(p),
            None => {
                return Err(shard_err(
                    &dir.join(format!("context_{i}_of_{n}{suffix}")).display().to_string(),
                    format!("is missing from the set of {n} shards"),
                ))
            }
        }
    }
    if let Some((i, (_, p))) = found.into_iter().next() {
        return Err(shard_err(&p.display().to_string(), format!("is shard {i} of a {n}-shard set: an extra file")));
    }
    Ok(files)
}
