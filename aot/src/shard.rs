//! Sharded context binaries: the decoder layers cut into `N` contiguous ranges, each built into
//! its own context binary ([`ShardPlan`]), and the compiled graph of the whole model cut into the
//! graph of one shard ([`shard_program`]).
//!
//! What each shard holds:
//! - every shard: its layers `a..b` (with their past/present K/V), and its own copy of the
//!   graph-input-only preamble (the two RoPE table gathers by `position_ids`: 2 × max positions ×
//!   head_dim u16, 0.5 MB at 1024 positions);
//! - the last shard also the final norm and the lm_head (`logits` out).
//!
//! The token embedding gather runs on the CPU, outside every shard: shard 0 takes the gathered
//! rows as `hidden_states` (u16 codes with the table's encoding; the runtime reads them from
//! `qnn/embedding.safetensors`, [`crate::cpu_embedding`]). A context build holds ~7× its static
//! bytes in Qualcomm's backend, and for a 151,936-token vocabulary at hidden 2048 the u16 table
//! alone is 622 MB: in a shard it would set a floor of ~4.5 GB on one build, more than twice
//! Qwen3-1.7B's weights. Qualcomm's Genie runtime reads token embeddings from a lookup table on
//! the CPU the same way (its dialog config's `embedding` / `lut-path`). A single shard keeps
//! mllm's graph, which takes `input_ids` and gathers in the graph.
//!
//! Between shard `k` and `k + 1` the hidden state crosses as the graph output / input
//! `hidden_states` `[1, S, H]`: the same IR value on both sides (layer `b - 1`'s residual sum,
//! quantized with layer `b`'s `input_layernorm_input_qdq`), so both graphs carry one encoding.
//! Graph names are `model.<i>.s<chunk>` (mllm's split slot holds the shard index; a single shard
//! keeps `model.0.s<chunk>`), the device binary of shard `i` of `n` is
//! `context_<i+1>_of_<n>.bin` ([`ShardSpec::binary_name`]; `context.bin` for one shard).
//!
//! The layers are balanced by static bytes: the plan minimises the largest shard's static
//! bytes (exactly, by dynamic programming over the cut points), counting the final norm +
//! lm_head in the last shard (and the embedding when there is one shard). `--shards auto` ([`plan_auto`]) picks the smallest
//! `N` whose largest shard fits the binary limit and whose build fits the memory budget.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::ops::Range;

use mllm_dsl::ir::{Node, Program, Region, SubGraph, ValueId};
use mllm_dsl::DType;
use models::keys;

/// Where a parameter or an op of the model belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// `model.embed_tokens`: the single shard's graph, or the CPU when there are several.
    Embedding,
    /// `model.layers.<l>`.
    Layer(usize),
    /// `model.norm` and `lm_head`: the last shard.
    Head,
    /// Anything else (the RoPE tables and their gathers): every shard that uses it, copied.
    Shared,
}

/// The part of the model an op name or a parameter symbol belongs to.
pub fn part_of(name: &str) -> Part {
    if let Some((l, _)) = keys::split_layer_key(name) {
        return Part::Layer(l);
    }
    let under = |prefix: &str| name == prefix || name.starts_with(&format!("{prefix}."));
    if under(keys::EMBED_TOKENS_MODULE) {
        Part::Embedding
    } else if under(keys::FINAL_NORM_MODULE) || under(keys::LM_HEAD_MODULE) {
        Part::Head
    } else {
        Part::Shared
    }
}

/// Why shards could not be planned or cut.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShardError {
    #[error("0 shards: a model needs at least one shard")]
    Zero,
    #[error(
        "{shards} shards are more than the model's {layers} decoder layers (every shard holds at least one layer)"
    )]
    MoreShardsThanLayers { shards: usize, layers: usize },
    #[error(
        "shard {shard} of {count} (layers {first}..={last}{extra}) holds {bytes} static bytes, more than \
         AutoLimits::max_context_bytes {limit}; no cut of the layers fits (one layer is {layer_bytes} bytes)"
    )]
    ShardTooLarge {
        shard: usize,
        count: usize,
        first: usize,
        last: usize,
        extra: String,
        bytes: u64,
        limit: u64,
        layer_bytes: u64,
    },
    #[error(
        "the largest shard's build needs ~{need} bytes ({factor}x its {bytes} static bytes in Qualcomm's backend) \
         even at {shards} shards (one per layer), more than AutoLimits::max_memory {budget}"
    )]
    MemoryTooSmall { need: u64, factor: f64, bytes: u64, shards: usize, budget: u64 },
    #[error("the model has no decoder layer parameters (`model.layers.<l>.*`)")]
    NoLayers,
    #[error("the decoder layers' parameters are numbered {found:?}, expected 0..{count}")]
    LayerGap { found: Vec<usize>, count: usize },
    #[error("cutting graph `{graph}` into shard {shard}: {detail}")]
    Cut { graph: String, shard: usize, detail: String },
}

/// Static bytes of a model by part, as Qualcomm's HTP backend stores them (int4 weights in 8-bit
/// containers, u16 norms and embedding, f32 scales).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelBytes {
    pub embedding: u64,
    /// One entry per decoder layer.
    pub layers: Vec<u64>,
    pub head: u64,
    /// Copied into every shard.
    pub shared: u64,
}

/// Bytes one element of a parameter of `dtype` takes in a context binary.
fn stored_bytes(dtype: DType) -> u64 {
    match dtype {
        DType::F32 | DType::I32 => 4,
        DType::I64 => 8,
        DType::F16 | DType::BF16 | DType::U16 | DType::U16Asym => 2,
        // int4 codes travel in 8-bit containers (QAIRT 2.51 refuses 4-bit tensors).
        DType::I8 | DType::U8 | DType::U8Sym | DType::I4Lpbq | DType::Bool => 1,
    }
}

impl ModelBytes {
    /// The registered parameters of a traced or compiled program, by part (each symbol once).
    /// Works on symbolic traces: only shapes and dtypes are read, never a weight.
    pub fn from_program(program: &Program) -> Result<ModelBytes, ShardError> {
        let mut seen = HashSet::new();
        let mut layers: BTreeMap<usize, u64> = BTreeMap::new();
        let mut bytes = ModelBytes::default();
        let mut visit = |v: ValueId| {
            let def = program.value(v);
            let Some(symbol) = &def.symbol else { return };
            if !seen.insert(symbol.clone()) {
                return;
            }
            let b = def.ty.numel() as u64 * stored_bytes(def.ty.dtype);
            match part_of(symbol) {
                Part::Embedding => bytes.embedding += b,
                Part::Layer(l) => *layers.entry(l).or_default() += b,
                Part::Head => bytes.head += b,
                Part::Shared => bytes.shared += b,
            }
        };
        fn walk(r: &Region, visit: &mut dyn FnMut(ValueId)) {
            for n in &r.body {
                match n {
                    Node::Register { value, .. } => visit(*value),
                    Node::SubGraph(g) => walk(&g.region, visit),
                    _ => {}
                }
            }
        }
        walk(&program.main, &mut visit);
        if layers.is_empty() {
            return Err(ShardError::NoLayers);
        }
        let found: Vec<usize> = layers.keys().copied().collect();
        if found.iter().enumerate().any(|(i, &l)| i != l) {
            return Err(ShardError::LayerGap { count: found.len(), found });
        }
        bytes.layers = layers.into_values().collect();
        Ok(bytes)
    }

    pub fn total(&self) -> u64 {
        self.embedding + self.layers.iter().sum::<u64>() + self.head + self.shared
    }

    /// Static bytes of a shard holding `layers`, the embedding when it holds the gather and the
    /// head when it is the last.
    fn shard_bytes(&self, layers: Range<usize>, embedding: bool, last: bool) -> u64 {
        let mut b = self.shared + self.layers[layers].iter().sum::<u64>();
        if embedding {
            b += self.embedding;
        }
        if last {
            b += self.head;
        }
        b
    }
}

/// One shard: its layers and what else it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardSpec {
    /// 0-based; graph names carry it (`model.<index>.s<chunk>`).
    pub index: usize,
    pub count: usize,
    pub layers: Range<usize>,
    /// The token embedding gather: only a single shard holds it ([`embedding_in_graph`]).
    pub embedding: bool,
    /// The final norm and lm_head (the last shard).
    pub head: bool,
    /// Its static bytes as planned ([`ModelBytes`]).
    pub static_bytes: u64,
}

impl ShardSpec {
    /// `model.<index>.s<chunk>`.
    pub fn graph_name(&self, chunk: usize) -> String {
        compiler::passes::shard_graph_name(self.index, chunk)
    }

    /// The weight-shared device binary: `context_<index+1>_of_<count>.bin`, or `context.bin`
    /// for a single shard.
    pub fn binary_name(&self) -> String {
        if self.count == 1 {
            "context.bin".into()
        } else {
            format!("context_{}_of_{}.bin", self.index + 1, self.count)
        }
    }

    /// The unshared binary Qualcomm's x86 emulation loads: `context_<i>_of_<n>.x86.bin`.
    pub fn x86_binary_name(&self) -> String {
        self.binary_name().replace(".bin", ".x86.bin")
    }

    fn describe_extra(&self) -> String {
        let mut s = String::new();
        if self.embedding {
            s += " + embedding";
        }
        if self.head {
            s += " + final norm and lm_head";
        }
        s
    }
}

/// Whether shard `index` of `count` gathers the token embedding in its graph: only a single
/// shard does (mllm's graph); a set of shards gathers on the CPU (see the module docs).
pub fn embedding_in_graph(index: usize, count: usize) -> bool {
    index == 0 && count == 1
}

/// The decoder layers cut into contiguous shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardPlan {
    pub shards: Vec<ShardSpec>,
}

impl ShardPlan {
    /// The whole model in one shard.
    pub fn single(bytes: &ModelBytes) -> ShardPlan {
        ShardPlan::balanced(bytes, 1).expect("one shard always fits a model with layers")
    }

    /// `n` shards of contiguous layers minimising the largest shard's static bytes.
    pub fn balanced(bytes: &ModelBytes, n: usize) -> Result<ShardPlan, ShardError> {
        let layers = bytes.layers.len();
        if n == 0 {
            return Err(ShardError::Zero);
        }
        if layers == 0 {
            return Err(ShardError::NoLayers);
        }
        if n > layers {
            return Err(ShardError::MoreShardsThanLayers { shards: n, layers });
        }
        // best[k][j]: the smallest possible largest shard when the first k shards hold layers 0..j,
        // ties broken by the smaller sum of squared shard sizes (the more even split);
        // cut[k][j]: where shard k-1 starts in that solution.
        let cost =
            |k: usize, range: Range<usize>| bytes.shard_bytes(range.clone(), embedding_in_graph(k, n), k + 1 == n);
        const NONE: (u64, u128) = (u64::MAX, u128::MAX);
        let mut best = vec![vec![NONE; layers + 1]; n + 1];
        let mut cut = vec![vec![0usize; layers + 1]; n + 1];
        best[0][0] = (0, 0);
        for k in 1..=n {
            for j in k..=layers {
                // The last shard must end at `layers`; earlier ones leave a layer for each later one.
                if k == n && j != layers || j > layers - (n - k) {
                    continue;
                }
                for i in (k - 1)..j {
                    let (largest, squares) = best[k - 1][i];
                    if largest == u64::MAX {
                        continue;
                    }
                    let here = cost(k - 1, i..j);
                    let candidate = (largest.max(here), squares.saturating_add(u128::from(here) * u128::from(here)));
                    if candidate < best[k][j] {
                        best[k][j] = candidate;
                        cut[k][j] = i;
                    }
                }
            }
        }
        let mut ends = vec![layers];
        for k in (1..=n).rev() {
            let end = *ends.last().expect("non-empty");
            ends.push(cut[k][end]);
        }
        ends.reverse();
        let shards = (0..n)
            .map(|k| {
                let range = ends[k]..ends[k + 1];
                ShardSpec {
                    index: k,
                    count: n,
                    static_bytes: cost(k, range.clone()),
                    layers: range,
                    embedding: embedding_in_graph(k, n),
                    head: k + 1 == n,
                }
            })
            .collect();
        Ok(ShardPlan { shards })
    }

    pub fn count(&self) -> usize {
        self.shards.len()
    }

    pub fn largest(&self) -> &ShardSpec {
        self.shards.iter().max_by_key(|s| (s.static_bytes, std::cmp::Reverse(s.index))).expect("a plan has shards")
    }

    /// The shard holding layer `layer`.
    pub fn shard_of_layer(&self, layer: usize) -> Option<&ShardSpec> {
        self.shards.iter().find(|s| s.layers.contains(&layer))
    }

    /// One line per shard: index, layers, what else it holds, static bytes.
    pub fn table(&self) -> String {
        let mut out = String::new();
        for s in &self.shards {
            let _ = writeln!(
                out,
                "shard {}/{}: layers {:>2}..={:<2}{:<30} {:>9.1} MB static  -> {}",
                s.index + 1,
                s.count,
                s.layers.start,
                s.layers.end - 1,
                s.describe_extra(),
                s.static_bytes as f64 / 1e6,
                s.binary_name()
            );
        }
        out
    }

    /// Every binary holds at most `limit` static bytes (a binary is no larger than the static
    /// bytes it holds plus graph metadata; measured 0.69× for the weight-shared Qwen3-1.7B).
    pub fn check_binary_limit(&self, limit: u64, bytes: &ModelBytes) -> Result<(), ShardError> {
        match self.shards.iter().find(|s| s.static_bytes > limit) {
            None => Ok(()),
            Some(s) => Err(ShardError::ShardTooLarge {
                shard: s.index + 1,
                count: s.count,
                first: s.layers.start,
                last: s.layers.end - 1,
                extra: s.describe_extra(),
                bytes: s.static_bytes,
                limit,
                layer_bytes: bytes.layers.iter().copied().max().unwrap_or(0),
            }),
        }
    }
}

/// Qualcomm's HTP backend (QAIRT 2.51) holds up to ~6.8× a context's static bytes while it
/// serializes a prefill + decode pair (docs/qnn-compile-bench.md); with our own graphs
/// and output buffer a build process peaks near 7×.
pub const BUILD_MEMORY_FACTOR: f64 = 7.0;

/// The limits `--shards auto` plans against.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AutoLimits {
    /// `--max-context-bytes`: static bytes one binary may hold (default 2 GiB, Genie's cap).
    pub max_context_bytes: u64,
    /// `--max-memory`: what all shard builds at once may hold.
    pub max_memory: u64,
    /// Peak of one build per static byte of its shard.
    pub factor: f64,
}

/// Default `--max-context-bytes`: 2 GiB, the per-binary limit of Qualcomm's Genie runtime.
pub const DEFAULT_MAX_CONTEXT_BYTES: u64 = 2 << 30;

/// The default memory budget: the available RAM, and at most twice the model's static bytes
/// (so a compile holds at most 2× the weights it compiles, parent and children together) but at
/// least [`MEMORY_FLOOR`] (a small model builds in one piece) and at least what the build of the
/// smallest possible shard needs (one layer, or the last layer with the norm + lm_head).
pub fn default_max_memory(available: u64, bytes: &ModelBytes) -> u64 {
    let layer = bytes.shared + bytes.layers.iter().copied().max().unwrap_or(0);
    let last = bytes.shared + bytes.head + bytes.layers.last().copied().unwrap_or(0);
    let smallest_possible = build_memory(layer.max(last), BUILD_MEMORY_FACTOR);
    available.min((2 * bytes.total()).max(MEMORY_FLOOR).max(smallest_possible))
}

/// 4 GiB: below it the default memory budget does not shrink with the model.
pub const MEMORY_FLOOR: u64 = 4 << 30;

/// What `--shards auto` chose and why.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoPlan {
    pub plan: ShardPlan,
    /// Builds at once.
    pub jobs: usize,
    /// One line per rejected and the chosen count.
    pub reasons: Vec<String>,
}

/// The build memory of a shard of `bytes` static bytes.
pub fn build_memory(bytes: u64, factor: f64) -> u64 {
    (bytes as f64 * factor).ceil() as u64
}

/// The smallest shard count whose largest shard fits both limits, and how many builds fit the
/// memory budget at once (at most `max_jobs`).
pub fn plan_auto(bytes: &ModelBytes, limits: &AutoLimits, max_jobs: usize) -> Result<AutoPlan, ShardError> {
    let mut reasons = Vec::new();
    let mb = |b: u64| b as f64 / 1e6;
    let layers = bytes.layers.len();
    for n in 1..=layers {
        let plan = ShardPlan::balanced(bytes, n)?;
        let largest = plan.largest().static_bytes;
        let need = build_memory(largest, limits.factor);
        if largest > limits.max_context_bytes {
            reasons.push(format!(
                "{n} shard(s): largest {:.0} MB static > the per-binary limit {:.0} MB",
                mb(largest),
                mb(limits.max_context_bytes)
            ));
            continue;
        }
        if need > limits.max_memory {
            reasons.push(format!(
                "{n} shard(s): a build of the largest ({:.0} MB static) needs ~{:.0} MB ({}×) > memory budget {:.0} MB",
                mb(largest),
                mb(need),
                limits.factor,
                mb(limits.max_memory)
            ));
            continue;
        }
        let jobs = ((limits.max_memory / need.max(1)) as usize).clamp(1, max_jobs.max(1)).min(n);
        reasons.push(format!(
            "{n} shard(s): largest {:.0} MB static <= {:.0} MB, its build ~{:.0} MB; {jobs} build(s) at once fit the \
             memory budget {:.0} MB",
            mb(largest),
            mb(limits.max_context_bytes),
            mb(need),
            mb(limits.max_memory)
        ));
        return Ok(AutoPlan { plan, jobs, reasons });
    }
    let plan = ShardPlan::balanced(bytes, layers)?;
    plan.check_binary_limit(limits.max_context_bytes, bytes)?;
    let largest = plan.largest().static_bytes;
    Err(ShardError::MemoryTooSmall {
        need: build_memory(largest, limits.factor),
        factor: limits.factor,
        bytes: largest,
        shards: layers,
        budget: limits.max_memory,
    })
}

/// `--shards`: a count, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShardCount {
    Auto,
    Fixed(usize),
}

/// A `--shards` value that is neither a positive count nor `auto`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ShardCountError {
    #[error("0 shards: a model needs at least one shard (a count >= 1, or auto)")]
    Zero,
    #[error("shard count `{0}`: expected a count >= 1 or auto")]
    Unknown(String),
}

impl std::str::FromStr for ShardCount {
    type Err = ShardCountError;
    fn from_str(s: &str) -> Result<Self, ShardCountError> {
        match s {
            "auto" => Ok(ShardCount::Auto),
            _ => match s.parse::<usize>() {
                Ok(0) => Err(ShardCountError::Zero),
                Ok(n) => Ok(ShardCount::Fixed(n)),
                Err(_) => Err(ShardCountError::Unknown(s.to_string())),
            },
        }
    }
}

/// The plan for `count` shards: [`plan_auto`], or `n` balanced shards checked against the binary
/// limit (the memory budget then only sets how many build at once). `jobs` overrides the number
/// of builds at once.
pub fn plan_shards(
    bytes: &ModelBytes,
    count: ShardCount,
    limits: &AutoLimits,
    max_jobs: usize,
    jobs: Option<usize>,
) -> Result<AutoPlan, ShardError> {
    let mut auto = match count {
        ShardCount::Auto => plan_auto(bytes, limits, max_jobs)?,
        ShardCount::Fixed(n) => {
            let plan = ShardPlan::balanced(bytes, n)?;
            plan.check_binary_limit(limits.max_context_bytes, bytes)?;
            let need = build_memory(plan.largest().static_bytes, limits.factor);
            let fit = (limits.max_memory / need.max(1)) as usize;
            let jobs = fit.clamp(1, max_jobs.max(1)).min(n);
            let reasons = vec![format!(
                "{n} shard(s), the count asked for: largest {:.0} MB static, its build ~{:.0} MB; {jobs} build(s) at once {} the memory \
                 budget {:.0} MB",
                plan.largest().static_bytes as f64 / 1e6,
                need as f64 / 1e6,
                if fit >= 1 { "fit" } else { "(one exceeds)" },
                limits.max_memory as f64 / 1e6
            )];
            AutoPlan { plan, jobs, reasons }
        }
    };
    if let Some(j) = jobs {
        auto.jobs = j.max(1);
        auto.reasons.push(if j == auto.jobs {
            format!("{j} build(s) at once, as asked for")
        } else {
            format!("{} build(s) at once ({j} asked for)", auto.jobs)
        });
    }
    Ok(auto)
}

pub use backend_qnn::{HIDDEN_STATES, HIDDEN_STATES_OUT};

/// The compiled program of the whole model (one flat graph `model.0.s<chunk>`, after mllm's
/// pass pipeline) cut to shard `shard` of `plan`: a program whose one flat graph
/// `model.<i>.s<chunk>` holds the shard's ops, with the hidden state as graph input (every shard
/// but the first, named [`HIDDEN_STATES`]) and output (every shard but the last, named
/// [`HIDDEN_STATES_OUT`]); K/V inputs and
/// outputs of the shard's layers only; `@init` keeps the shard's parameters only.
pub fn shard_program(program: &Program, plan: &ShardPlan, shard: usize) -> Result<Program, ShardError> {
    let spec = plan.shards.get(shard).ok_or_else(|| ShardError::Cut {
        graph: "?".into(),
        shard,
        detail: format!("the plan has {} shards", plan.count()),
    })?;
    let flat: Vec<&SubGraph> = program
        .subgraphs()
        .filter(|g| g.symbol.starts_with("model.") && g.attrs.get("use_qnn") == Some(&mllm_dsl::ir::Attr::Bool(true)))
        .collect();
    let [graph] = flat[..] else {
        return Err(ShardError::Cut {
            graph: "?".into(),
            shard,
            detail: format!("expected one flat QNN graph `model.0.s<S>`, found {}", flat.len()),
        });
    };
    let err = |detail: String| ShardError::Cut { graph: graph.symbol.clone(), shard, detail };
    let chunk: usize = graph
        .symbol
        .rsplit_once(".s")
        .and_then(|(_, s)| s.parse().ok())
        .ok_or_else(|| err("its name has no chunk size `.s<S>`".into()))?;
    // The CPU's ops (the embedding gather of a set of shards) are in no shard.
    const ON_CPU: usize = usize::MAX;
    let owner = |part: Part| -> Option<usize> {
        match part {
            Part::Embedding if embedding_in_graph(0, plan.count()) => Some(0),
            Part::Embedding => Some(ON_CPU),
            Part::Head => Some(plan.count() - 1),
            Part::Layer(l) => plan.shard_of_layer(l).map(|s| s.index),
            Part::Shared => None,
        }
    };
    let body = &graph.region.body;
    // Which op produces each value, and which shard owns each op (None: shared preamble).
    let mut producer: HashMap<ValueId, usize> = HashMap::new();
    let mut owners: Vec<Option<usize>> = Vec::with_capacity(body.len());
    for (i, n) in body.iter().enumerate() {
        let owned = match n {
            Node::Linalg(op) => {
                for &o in &op.outputs {
                    producer.insert(o, i);
                }
                let name = op.name.as_deref().unwrap_or("");
                match part_of(name) {
                    Part::Layer(l) if plan.shard_of_layer(l).is_none() => {
                        return Err(err(format!("op `{name}` belongs to layer {l}, which no shard holds")))
                    }
                    part => owner(part),
                }
            }
            _ => None,
        };
        owners.push(owned);
    }
    // The shard's ops, plus the shared ops they need (transitively), in the graph's order.
    let mut keep = vec![false; body.len()];
    let mut stack: Vec<usize> = (0..body.len()).filter(|&i| owners[i] == Some(shard)).collect();
    while let Some(i) = stack.pop() {
        if std::mem::replace(&mut keep[i], true) {
            continue;
        }
        let Node::Linalg(op) = &body[i] else { continue };
        for v in &op.inputs {
            if let Some(&p) = producer.get(v) {
                if owners[p].is_none() && !keep[p] {
                    stack.push(p);
                }
            }
        }
    }
    // Shared ops that read another shard's values cannot be copied.
    for (i, n) in body.iter().enumerate() {
        if keep[i] && owners[i].is_none() {
            if let Node::Linalg(op) = n {
                for v in &op.inputs {
                    if let Some(&p) = producer.get(v) {
                        if owners[p].is_some_and(|o| o != shard) {
                            return Err(err(format!(
                                "shared op `{}` reads a value of shard {}",
                                op.name.as_deref().unwrap_or("?"),
                                owners[p].unwrap_or(0)
                            )));
                        }
                    }
                }
            }
        }
    }
    let produced_here: HashSet<ValueId> = body
        .iter()
        .enumerate()
        .filter(|(i, _)| keep[*i])
        .flat_map(|(_, n)| match n {
            Node::Linalg(op) => op.outputs.clone(),
            _ => Vec::new(),
        })
        .collect();
    let params: HashSet<ValueId> = init_params(program);
    // Inputs: the original graph inputs the shard reads, then values of earlier shards.
    let mut reads: Vec<ValueId> = Vec::new();
    for (i, n) in body.iter().enumerate() {
        if let (true, Node::Linalg(op)) = (keep[i], n) {
            for &v in &op.inputs {
                if !produced_here.contains(&v) && !params.contains(&v) && !reads.contains(&v) {
                    reads.push(v);
                }
            }
        }
    }
    let mut inputs: Vec<ValueId> = graph.region.inputs.iter().copied().filter(|v| reads.contains(v)).collect();
    let crossing_in: Vec<ValueId> = reads
        .iter()
        .copied()
        .filter(|v| !graph.region.inputs.contains(v) && program.value(*v).constant.is_none())
        .collect();
    if crossing_in.len() > 1 {
        return Err(err(format!(
            "{} values of earlier shards are read (expected the hidden state alone): {}",
            crossing_in.len(),
            describe(program, &crossing_in)
        )));
    }
    // Outputs: the original outputs produced here, then values later shards read.
    let mut outputs: Vec<ValueId> =
        graph.region.outputs.iter().copied().filter(|v| produced_here.contains(v)).collect();
    let mut crossing_out: Vec<ValueId> = Vec::new();
    for (i, n) in body.iter().enumerate() {
        if keep[i] || owners[i].is_none() {
            continue;
        }
        if let Node::Linalg(op) = n {
            for &v in &op.inputs {
                // A shared op's value (RoPE tables, say) is recomputed by every shard that reads it.
                let shared = producer.get(&v).is_some_and(|&p| owners[p].is_none());
                if produced_here.contains(&v) && !shared && !crossing_out.contains(&v) && !outputs.contains(&v) {
                    crossing_out.push(v);
                }
            }
        }
    }
    if crossing_out.len() > 1 {
        return Err(err(format!(
            "{} values are read by later shards (expected the hidden state alone): {}",
            crossing_out.len(),
            describe(program, &crossing_out)
        )));
    }
    let mut out = program.clone();
    for &v in &crossing_in {
        let def = out.value_mut(v);
        def.name = Some(HIDDEN_STATES.into());
        def.graph_input = true;
    }
    for &v in &crossing_out {
        let def = out.value_mut(v);
        def.name = Some(HIDDEN_STATES_OUT.into());
        def.graph_output = true;
    }
    inputs.extend(&crossing_in);
    outputs.extend(&crossing_out);
    let name = spec.graph_name(chunk);
    let kept_reads: HashSet<ValueId> = body
        .iter()
        .enumerate()
        .filter(|(i, _)| keep[*i])
        .flat_map(|(_, n)| match n {
            Node::Linalg(op) => op.inputs.clone(),
            _ => Vec::new(),
        })
        .collect();
    let mut new_body: Vec<Node> = Vec::new();
    let mut used_params: HashSet<ValueId> = HashSet::new();
    for (i, n) in body.iter().enumerate() {
        match n {
            Node::Linalg(op) if keep[i] => {
                let mut op = op.clone();
                op.attrs.insert("qnn_graph_name".into(), mllm_dsl::ir::Attr::Str(name.clone()));
                op.attrs.insert("qnn_context_name".into(), mllm_dsl::ir::Attr::Str(format!("context.{}", spec.index)));
                used_params.extend(op.inputs.iter().copied().filter(|v| params.contains(v)));
                new_body.push(Node::Linalg(op));
            }
            Node::Linalg(_) | Node::Return(_) => {}
            Node::Constant { value, .. } | Node::Register { value, .. } => {
                if kept_reads.contains(value) {
                    new_body.push(n.clone());
                }
            }
            other => new_body.push(other.clone()),
        }
    }
    new_body.push(Node::Return(outputs.clone()));
    let flat_graph = SubGraph {
        symbol: name.clone(),
        device: graph.device,
        attrs: graph.attrs.clone(),
        region: Region { inputs: inputs.clone(), outputs: outputs.clone(), body: new_body },
    };
    let old_symbol = graph.symbol.clone();
    let main_body = std::mem::take(&mut out.main.body);
    for n in main_body {
        match n {
            Node::SubGraph(g) if g.symbol == old_symbol => out.main.body.push(Node::SubGraph(flat_graph.clone())),
            Node::SubGraph(mut g) if g.symbol == "init" => {
                g.region.body.retain(|n| match n {
                    Node::Register { value, .. } => used_params.contains(value),
                    _ => true,
                });
                out.main.body.push(Node::SubGraph(g));
            }
            Node::SubGraph(mut g) if g.symbol == "model" => {
                g.region = Region {
                    inputs: inputs.clone(),
                    outputs: outputs.clone(),
                    body: vec![
                        Node::Call(mllm_dsl::ir::CallGraph {
                            symbol: name.clone(),
                            inputs: inputs.clone(),
                            outputs: outputs.clone(),
                        }),
                        Node::Return(outputs.clone()),
                    ],
                };
                out.main.body.push(Node::SubGraph(g));
            }
            other => out.main.body.push(other),
        }
    }
    out.main.inputs = inputs.clone();
    out.main.outputs = outputs.clone();
    for n in &mut out.main.body {
        if let Node::Return(values) = n {
            *values = outputs.clone();
        }
    }
    Ok(out)
}

/// Values registered as parameters (`@init`'s registers).
fn init_params(program: &Program) -> HashSet<ValueId> {
    let mut out = HashSet::new();
    fn walk(r: &Region, out: &mut HashSet<ValueId>) {
        for n in &r.body {
            match n {
                Node::Register { value, .. } => {
                    out.insert(*value);
                }
                Node::SubGraph(g) => walk(&g.region, out),
                _ => {}
            }
        }
    }
    walk(&program.main, &mut out);
    out
}

fn describe(program: &Program, values: &[ValueId]) -> String {
    values
        .iter()
        .map(|v| program.value(*v).name.clone().unwrap_or_else(|| format!("%{}", v.0)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(layers: &[u64], embedding: u64, head: u64) -> ModelBytes {
        ModelBytes { embedding, layers: layers.to_vec(), head, shared: 1 }
    }

    #[test]
    fn parts_follow_mllm_names() {
        assert_eq!(part_of("model.layers.12.self_attn.q_proj"), Part::Layer(12));
        assert_eq!(part_of("model.layers.3.input_layernorm.weight"), Part::Layer(3));
        assert_eq!(part_of("model.embed_tokens"), Part::Embedding);
        assert_eq!(part_of("model.embed_tokens.weight"), Part::Embedding);
        assert_eq!(part_of("model.norm"), Part::Head);
        assert_eq!(part_of("lm_head.weight"), Part::Head);
        assert_eq!(part_of("model.Gather.0"), Part::Shared);
        assert_eq!(part_of("model.mllm_max_sin_embedding"), Part::Shared);
        assert_eq!(part_of("model.normal"), Part::Shared);
    }

    #[test]
    fn balanced_plans_minimise_the_largest_shard() {
        // 7 equal layers, a heavy lm_head: the last shard gets fewer layers; the embedding (25)
        // is gathered on the CPU, in no shard.
        let b = bytes(&[10; 7], 25, 25);
        let plan = ShardPlan::balanced(&b, 3).unwrap();
        let ranges: Vec<_> = plan.shards.iter().map(|s| s.layers.clone()).collect();
        assert_eq!(ranges, vec![0..3, 3..6, 6..7]);
        // shard 0: 1 + 30 = 31; shard 1: 1 + 30 = 31; shard 2: 1 + 10 + 25 = 36.
        assert_eq!(plan.shards.iter().map(|s| s.static_bytes).collect::<Vec<_>>(), vec![31, 31, 36]);
        assert!(plan.shards.iter().all(|s| !s.embedding));
        assert!(!plan.table().contains("embedding"), "{}", plan.table());
        assert_eq!(plan.shards[0].binary_name(), "context_1_of_3.bin");
        assert_eq!(plan.shards[2].x86_binary_name(), "context_3_of_3.x86.bin");
        assert_eq!(plan.shards[1].graph_name(32), "model.1.s32");
        let one = ShardPlan::balanced(&b, 1).unwrap();
        assert!(one.shards[0].embedding, "a single shard is mllm's graph, gather included");
        assert_eq!(one.shards[0].binary_name(), "context.bin");
        assert_eq!(one.shards[0].static_bytes, b.total());
        assert_eq!(ShardPlan::balanced(&b, 0), Err(ShardError::Zero));
        assert_eq!(ShardPlan::balanced(&b, 8), Err(ShardError::MoreShardsThanLayers { shards: 8, layers: 7 }));
    }

    #[test]
    fn auto_picks_the_smallest_count_within_both_limits() {
        let b = bytes(&[100; 8], 100, 50);
        // Binary limit 400: 2 shards (at best 1 + 400 and 1 + 400 + 50 = 451) do not fit, 3 do.
        let limits = AutoLimits { max_context_bytes: 400, max_memory: u64::MAX, factor: 7.0 };
        let auto = plan_auto(&b, &limits, 4).unwrap();
        assert_eq!(auto.plan.count(), 3, "{:?}", auto.reasons);
        assert_eq!(auto.jobs, 3);
        // Memory 2100 for one build at 7x: largest <= 300.
        let limits = AutoLimits { max_context_bytes: u64::MAX, max_memory: 2100, factor: 7.0 };
        let auto = plan_auto(&b, &limits, 4).unwrap();
        assert!(auto.plan.largest().static_bytes <= 300);
        assert_eq!(auto.jobs, 1);
        assert!(auto.reasons.len() == auto.plan.count());
        // No layer fits: a named error.
        let limits = AutoLimits { max_context_bytes: 100, max_memory: u64::MAX, factor: 7.0 };
        let e = plan_auto(&b, &limits, 1).unwrap_err();
        assert!(matches!(e, ShardError::ShardTooLarge { shard: 1, .. }), "{e}");
        assert!(e.to_string().contains("AutoLimits::max_context_bytes 100"), "{e}");
        let limits = AutoLimits { max_context_bytes: u64::MAX, max_memory: 10, factor: 7.0 };
        assert!(matches!(plan_auto(&b, &limits, 1), Err(ShardError::MemoryTooSmall { .. })));
    }
}
