//! Where a compile's artifacts run: this project's runtime (`generate --qnn-context`), mllm's
//! on-device runtime (`mllm/backends/qnn/aot_rt/`: `QnnAOTRuntime`, `PromptProcessor`,
//! `TokenGenerator`, `KVCacheManager`), or neither, and why ([`where_it_runs`]); the refusal of
//! `qwen3_aot --target-runtime mllm` ([`refuse_for_mllm`]); and mllm's graph I/O contract checked
//! on a context binary as Qualcomm's `libQnnSystem.so` reads it back ([`check_mllm_contract`]).
//!
//! mllm's contract, with the lines of its public source it comes from, is written out in
//! docs/deploy.md (UbiquitousLearning/mllm at b9c30702). In short: the runtime opens graphs
//! `model.0.s<ar_len>` (prefill) and `model.0.s1` (decode) of one context file and binds its
//! buffers to each graph's inputs and outputs **by position**: `input_ids` INT_32 `[1, ar]`,
//! `position_ids` INT_32 `[ar]`, `attention_mask` UFIXED_POINT_16 `[1, 1, ar, ctx]` (code 65535
//! attends, 0 masks), then `past_key_<l>` `[1, H, D, ctx-ar]` for every layer, then
//! `past_value_<l>` `[1, H, ctx-ar, D]`, u8 codes; outputs `logits` UFIXED_POINT_16 (`ar x vocab`
//! codes, greedy argmax on the codes), then `present_key_<l>` `[1, H, D, ar]` and
//! `present_value_<l>` `[1, H, ar, D]`: the new positions only, copied code for code into the cache.

use std::fmt::Write as _;

use backend_qnn::{DataType, GraphIo, IoTensor, ScaleOffset};

/// A runtime that can run a context binary on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Runtime {
    /// This project's runtime: `generate --qnn-context` (x86 emulation, or the phone: docs/deploy.md).
    MllmDsl,
    /// mllm's `QnnAOTRuntime` (`mllm/backends/qnn/aot_rt/`, its `examples/*_qnn_aot/aot_run.cpp`).
    Mllm,
}

impl Runtime {
    /// The name `report.json` uses.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::MllmDsl => "mllm-dsl",
            Runtime::Mllm => "mllm",
        }
    }
}

/// What `qwen3_aot --target-runtime` promises the result will run on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TargetRuntime {
    /// No promise: every option is allowed and the report says which runtime runs what.
    #[default]
    Any,
    /// mllm's runtime: options that would leave it unable to run the result are refused before
    /// any work ([`refuse_for_mllm`]).
    Mllm,
}

/// A `--target-runtime` value other than `any` or `mllm`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown target runtime `{name}`; expected any or mllm")]
pub struct UnknownTargetRuntime {
    pub name: String,
}

impl std::str::FromStr for TargetRuntime {
    type Err = UnknownTargetRuntime;
    fn from_str(s: &str) -> Result<Self, UnknownTargetRuntime> {
        match s {
            "any" => Ok(TargetRuntime::Any),
            "mllm" => Ok(TargetRuntime::Mllm),
            other => Err(UnknownTargetRuntime { name: other.to_string() }),
        }
    }
}

/// One graph of a context binary as far as a runtime cares before reading the binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphShape {
    pub name: String,
    /// Tokens per call (`ar`).
    pub chunk: usize,
    /// The mask width: K/V cache positions plus the chunk.
    pub context_len: usize,
}

/// The properties of a compile that decide which runtime can run it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactTraits {
    /// Positions of an attention-sink prefix whose K/V the runtime must preload (0: none).
    pub sink_prefix: usize,
    /// Context binaries the graphs are split across (1: one `qnn/context.bin`).
    pub shards: usize,
    /// Every graph, in build order.
    pub graphs: Vec<GraphShape>,
    /// The model's end-of-sequence ids (its config's `eos_token_id`).
    pub eos_ids: Vec<u32>,
    /// Whether the context binaries were built (Qualcomm's libraries were there).
    pub context_binary: bool,
}

/// mllm's decode graph (`TokenGenerator.cpp:13`).
pub const MLLM_DECODE_GRAPH: &str = "model.0.s1";

/// The end-of-sequence ids mllm's runtime stops at, whatever the model (`QnnAOTRuntime.cpp:48-50`).
pub const MLLM_EOS_IDS: [u32; 2] = [151643, 151645];

/// The context length mllm's shipped `aot_run` mains set (`examples/qwen3_qnn_aot/aot_run.cpp:35`).
pub const MLLM_AOT_RUN_CONTEXT: usize = 1024;

/// The chunk of a graph name mllm's runtime can open: `model.0.s<ar>` (`PromptProcessor.cpp:18`).
pub fn mllm_graph_chunk(name: &str) -> Option<usize> {
    match compiler::passes::parse_graph_name(name)? {
        (0, ar) if ar >= 1 => Some(ar),
        _ => None,
    }
}

/// Why mllm's runtime cannot run an artifact.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MllmBlocker {
    #[error(
        "an attention-sink prefix of {len} positions must be preloaded into the K/V cache, and mllm's runtime \
         starts from zeroed caches (KVCacheManager.cpp:35-53) at position 0 (QnnAOTRuntime.cpp:65)"
    )]
    SinkPrefix { len: usize },
    #[error(
        "the graphs are split across {count} context binaries, and mllm's runtime loads one context file \
         (Register.cpp:17-25) and opens graphs named model.0.s<ar> only (PromptProcessor.cpp:18, TokenGenerator.cpp:13)"
    )]
    Shards { count: usize },
    #[error("no graph `{MLLM_DECODE_GRAPH}`: mllm's TokenGenerator decodes with it (TokenGenerator.cpp:13)")]
    NoDecodeGraph,
    #[error(
        "graphs `{first}` (context {first_ctx}) and `{second}` (context {second_ctx}) differ in context length, and \
         mllm's runtime runs one context length for both of its graphs (QnnAOTConfig.hpp:16, KVCacheManager.cpp:17)"
    )]
    ContextLengths { first: String, first_ctx: usize, second: String, second_ctx: usize },
    #[error(
        "no context binary was built (Qualcomm's libraries were not found, or the run was asked not to build one)"
    )]
    NoContextBinary,
    #[error(
        "mllm's runtime does not run on x86: its QNN allocator opens libcdsprpc.so (QNNAllocator.cpp:16-18) and \
         registers every buffer as ION shared memory (QNNAllocator.cpp:91-109), which exist on the device only"
    )]
    X86Emulation,
    #[error("the binary breaks mllm's graph I/O contract: {}", .0.join("; "))]
    Contract(Vec<String>),
}

/// Whether one runtime runs one artifact, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct RuntimeVerdict {
    pub runtime: Runtime,
    pub runs: bool,
    /// Why not (empty when it runs).
    pub blockers: Vec<String>,
    /// What a user of that runtime must know (how to run it, what it ignores).
    pub notes: Vec<String>,
}

/// Where one artifact runs.
#[derive(Clone, Debug, PartialEq)]
pub struct ArtifactRuntimes {
    /// The file, relative to the output directory.
    pub artifact: String,
    pub verdicts: Vec<RuntimeVerdict>,
}

impl ArtifactRuntimes {
    /// `"mllm-dsl, mllm"`, or `"neither"`.
    pub fn runners(&self) -> String {
        let names: Vec<&str> = self.verdicts.iter().filter(|v| v.runs).map(|v| v.runtime.name()).collect();
        if names.is_empty() {
            "neither".into()
        } else {
            names.join(", ")
        }
    }
}

/// What stops mllm's runtime running the device binary of a compile with `traits`, before the
/// binary itself is read ([`check_mllm_contract`] then checks what was built).
pub fn mllm_blockers(traits: &ArtifactTraits) -> Vec<MllmBlocker> {
    let mut blockers = Vec::new();
    if traits.sink_prefix > 0 {
        blockers.push(MllmBlocker::SinkPrefix { len: traits.sink_prefix });
    }
    if traits.shards > 1 {
        blockers.push(MllmBlocker::Shards { count: traits.shards });
    }
    if !traits.graphs.iter().any(|g| g.name == MLLM_DECODE_GRAPH) {
        blockers.push(MllmBlocker::NoDecodeGraph);
    }
    let reachable: Vec<&GraphShape> = traits.graphs.iter().filter(|g| mllm_graph_chunk(&g.name).is_some()).collect();
    if let Some(first) = reachable.first() {
        if let Some(other) = reachable.iter().find(|g| g.context_len != first.context_len) {
            blockers.push(MllmBlocker::ContextLengths {
                first: first.name.clone(),
                first_ctx: first.context_len,
                second: other.name.clone(),
                second_ctx: other.context_len,
            });
        }
    }
    blockers
}

/// What a user of mllm's runtime must know about an artifact it can run.
fn mllm_notes(traits: &ArtifactTraits) -> Vec<String> {
    let mut notes = Vec::new();
    let prefill: Vec<usize> =
        traits.graphs.iter().filter_map(|g| mllm_graph_chunk(&g.name)).filter(|&ar| ar > 1).collect();
    let ctx = traits.graphs.iter().find(|g| g.name == MLLM_DECODE_GRAPH).map_or(0, |g| g.context_len);
    // `--ar_len` is a flag of mllm's own `aot_run` mains, which its users pass.
    let ar = match prefill.as_slice() {
        [] => "--ar_len 1 (no prefill graph but model.0.s1)".to_string(),
        [one] => format!("--ar_len {one}"),
        many => format!(
            "--ar_len one of {} (one prefill graph per run)",
            many.iter().map(|a| a.to_string()).collect::<Vec<_>>().join(", ")
        ),
    };
    notes.push(format!("run with {ar}; its default is 128 (aot_run.cpp:17)"));
    if ctx != MLLM_AOT_RUN_CONTEXT {
        notes.push(format!(
            "context {ctx}: mllm's aot_run mains set config.context_len = {MLLM_AOT_RUN_CONTEXT} (aot_run.cpp:35); set it to {ctx}"
        ));
    }
    let unreachable: Vec<&str> =
        traits.graphs.iter().filter(|g| mllm_graph_chunk(&g.name).is_none()).map(|g| g.name.as_str()).collect();
    if !unreachable.is_empty() {
        notes.push(format!("graphs it never opens (names other than model.0.s<ar>): {}", unreachable.join(", ")));
    }
    if !traits.eos_ids.is_empty() && !traits.eos_ids.iter().any(|id| MLLM_EOS_IDS.contains(id)) {
        notes.push(format!(
            "it stops only at ids {MLLM_EOS_IDS:?} (QnnAOTRuntime.cpp:48-50), not at this model's EOS {:?}: \
             generation runs to its length limit",
            traits.eos_ids
        ));
    }
    notes
}

/// Where each runnable artifact of a compile runs: `qnn/context.bin` (the device binary) and
/// `qnn/context.x86.bin` (the x86 emulation's), or, without a context binary, the graphs' files.
/// `contract` is what [`check_mllm_contract`] found in the device binary (None: not read).
pub fn where_it_runs(traits: &ArtifactTraits, contract: Option<&[String]>) -> Vec<ArtifactRuntimes> {
    let mut mllm_blocks: Vec<String> = mllm_blockers(traits).iter().map(ToString::to_string).collect();
    if let Some(violations) = contract.filter(|v| !v.is_empty()) {
        mllm_blocks.push(MllmBlocker::Contract(violations.to_vec()).to_string());
    }
    let prefix_note = (traits.sink_prefix > 0).then(|| {
        format!(
            "preloads the {}-position attention-sink prefix saved beside the quantized checkpoint (run it with that \
             checkpoint as its model)",
            traits.sink_prefix
        )
    });
    let verdict = |runtime, blockers: Vec<String>, notes: Vec<String>| RuntimeVerdict {
        runtime,
        runs: blockers.is_empty(),
        blockers,
        notes: if notes.is_empty() { Vec::new() } else { notes },
    };
    if !traits.context_binary {
        let none = vec![MllmBlocker::NoContextBinary.to_string()];
        return vec![ArtifactRuntimes {
            artifact: "qnn/<graph>.cpp, qnn/weights.bin".into(),
            verdicts: vec![
                verdict(Runtime::MllmDsl, none.clone(), Vec::new()),
                verdict(Runtime::Mllm, none, Vec::new()),
            ],
        }];
    }
    // A shard set is opened as its directory (or its first file); one binary by its path.
    let (device, x86, device_arg, x86_arg) = match traits.shards {
        1 => ("qnn/context.bin".to_string(), "qnn/context.x86.bin".to_string(), "context.bin", "qnn/context.x86.bin"),
        n => (
            format!("qnn/context_<i>_of_{n}.bin"),
            format!("qnn/context_<i>_of_{n}.x86.bin"),
            "the directory of the shards",
            "qnn/",
        ),
    };
    let mut ours_device_notes = vec![format!(
        "on the phone: `generate` built for aarch64-linux-android, given {device_arg} as its context binary \
         (docs/deploy.md)"
    )];
    let mut ours_x86_notes =
        vec![format!("on x86: `generate` given {x86_arg} as its context binary, on Qualcomm's HTP emulation")];
    if traits.shards > 1 {
        let table = format!(
            "with qnn/{} beside the shards: the token embedding, gathered on the CPU",
            crate::cpu_embedding::EMBEDDING_FILE
        );
        ours_device_notes.push(table.clone());
        ours_x86_notes.push(table);
    }
    ours_device_notes.extend(prefix_note.clone());
    ours_x86_notes.extend(prefix_note);
    let mllm_device_notes = if mllm_blocks.is_empty() { mllm_notes(traits) } else { Vec::new() };
    let mut mllm_x86 = vec![MllmBlocker::X86Emulation.to_string()];
    mllm_x86.extend(mllm_blocks.iter().cloned());
    vec![
        ArtifactRuntimes {
            artifact: device,
            verdicts: vec![
                verdict(Runtime::MllmDsl, Vec::new(), ours_device_notes),
                verdict(Runtime::Mllm, mllm_blocks, mllm_device_notes),
            ],
        },
        ArtifactRuntimes {
            artifact: x86,
            verdicts: vec![
                verdict(Runtime::MllmDsl, Vec::new(), ours_x86_notes),
                verdict(Runtime::Mllm, mllm_x86, Vec::new()),
            ],
        },
    ]
}

/// `qwen3_aot --target-runtime mllm` refusing an option, before any work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("AotOptions::target_runtime mllm refuses {option}: {blocker}")]
pub struct TargetRuntimeRefusal {
    /// The option (and value) that would leave mllm's runtime unable to run the result.
    pub option: String,
    pub blocker: MllmBlocker,
}

/// The options of a run, as far as mllm's runtime is concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedRun {
    /// `--sink-prefix` tokens given, or the prefix a `--quantized` checkpoint ships (positions).
    pub sink_prefix: usize,
    /// Whether the prefix comes from the quantized checkpoint rather than `--sink-prefix`.
    pub prefix_from_checkpoint: bool,
    pub shards: usize,
    pub graphs: Vec<GraphShape>,
    /// `--context-binary off`.
    pub context_binary_off: bool,
}

/// Every option of `plan` that would leave mllm's runtime unable to run the result, as the first
/// refusal (each names the option).
pub fn refuse_for_mllm(plan: &PlannedRun) -> Result<(), TargetRuntimeRefusal> {
    if plan.context_binary_off {
        return Err(TargetRuntimeRefusal {
            option: "AotOptions::context_binary off".into(),
            blocker: MllmBlocker::NoContextBinary,
        });
    }
    let traits = ArtifactTraits {
        sink_prefix: plan.sink_prefix,
        shards: plan.shards,
        graphs: plan.graphs.clone(),
        eos_ids: Vec::new(),
        context_binary: true,
    };
    let chunks = || plan.graphs.iter().map(|g| format!("AotOptions::chunks {}", g.chunk)).collect::<Vec<_>>().join(" ");
    match mllm_blockers(&traits).into_iter().next() {
        None => Ok(()),
        Some(blocker) => {
            let option = match &blocker {
                MllmBlocker::SinkPrefix { .. } if plan.prefix_from_checkpoint => {
                    "ModelSource::Quantized (its checkpoint ships an attention-sink prefix)".to_string()
                }
                MllmBlocker::SinkPrefix { .. } => "AotOptions::sink_prefix".into(),
                MllmBlocker::Shards { count } => format!("{count} shards"),
                MllmBlocker::NoDecodeGraph => format!("{} without AotOptions::chunks 1", chunks()),
                MllmBlocker::ContextLengths { .. } => "a graph family of several context lengths".into(),
                _ => "these options".into(),
            };
            Err(TargetRuntimeRefusal { option, blocker })
        }
    }
}

/// The model sizes mllm's `aot_run` takes from the model's `config.json` (`aot_run.cpp:31-34`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MllmModelShape {
    pub num_layers: usize,
    /// K/V heads per layer (the cache's `H`).
    pub kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub context_len: usize,
}

/// The zero point of mllm's K/V codes (`kUInt8PerTensorSym` with zero point 128: QNN offset -128).
pub const MLLM_KV_OFFSET: i32 = -128;

/// Checks one graph `model.0.s<ar>` of a context binary, as `libQnnSystem.so` reports it, against
/// mllm's runtime contract for `shape`: every input and output in binding order, its data type,
/// dimensions (or element count where mllm's buffer only fixes that) and encoding. Returns each
/// violation as a sentence naming the tensor.
pub fn check_mllm_graph(graph: &GraphIo, shape: &MllmModelShape) -> Vec<String> {
    let mut bad = Vec::new();
    let Some(ar) = mllm_graph_chunk(&graph.name) else {
        return vec![format!("graph `{}` is not named model.0.s<ar> (PromptProcessor.cpp:18)", graph.name)];
    };
    let (l, h, d, ctx) = (shape.num_layers, shape.kv_heads as u32, shape.head_dim as u32, shape.context_len);
    if ar >= ctx {
        bad.push(format!("graph `{}`: chunk {ar} leaves no cache in context {ctx}", graph.name));
        return bad;
    }
    let (a, past) = (ar as u32, (ctx - ar) as u32);
    let g = &graph.name;
    if graph.inputs.len() != 3 + 2 * l {
        bad.push(format!(
            "graph `{g}` has {} inputs; mllm binds 3 + 2 x {l} by position (PromptProcessor.cpp:24-62)",
            graph.inputs.len()
        ));
    }
    if graph.outputs.len() != 1 + 2 * l {
        bad.push(format!(
            "graph `{g}` has {} outputs; mllm binds 1 + 2 x {l} by position (PromptProcessor.cpp:64-88)",
            graph.outputs.len()
        ));
    }
    let mut expect =
        |list: &[IoTensor], kind: &str, i: usize, name: &str, dtype: DataType, dims: &[u32], line: &str| {
            let Some(t) = list.get(i) else { return };
            let mut wrong = Vec::new();
            if t.name != name {
                wrong.push(format!("named `{}` (mllm names its buffer `{name}`)", t.name));
            }
            if t.dtype != dtype {
                wrong.push(format!("{} instead of {dtype}", t.dtype));
            }
            if t.dims != dims {
                wrong.push(format!("dims {:?} instead of {dims:?}", t.dims));
            }
            if !wrong.is_empty() {
                bad.push(format!("graph `{g}` {kind} {i} ({line}): {}", wrong.join(", ")));
            }
        };
    expect(&graph.inputs, "input", 0, "input_ids", DataType::Int32, &[1, a], "PromptProcessor.cpp:28");
    expect(&graph.inputs, "input", 1, "position_ids", DataType::Int32, &[a], "PromptProcessor.cpp:33");
    expect(
        &graph.inputs,
        "input",
        2,
        "attention_mask",
        DataType::UFixedPoint16,
        &[1, 1, a, ctx as u32],
        "PromptProcessor.cpp:38",
    );
    for i in 0..l {
        let k = format!("past_key_{i}");
        expect(&graph.inputs, "input", 3 + i, &k, DataType::UFixedPoint8, &[1, h, d, past], "PromptProcessor.cpp:47");
        let v = format!("past_value_{i}");
        expect(
            &graph.inputs,
            "input",
            3 + l + i,
            &v,
            DataType::UFixedPoint8,
            &[1, h, past, d],
            "PromptProcessor.cpp:56",
        );
        let k = format!("present_key_{i}");
        expect(&graph.outputs, "output", 1 + i, &k, DataType::UFixedPoint8, &[1, h, d, a], "PromptProcessor.cpp:75");
        let v = format!("present_value_{i}");
        expect(
            &graph.outputs,
            "output",
            1 + l + i,
            &v,
            DataType::UFixedPoint8,
            &[1, h, a, d],
            "PromptProcessor.cpp:83",
        );
    }
    // The mask: mllm writes code 65535 where a position is attended and 0 where it is not
    // (KVCacheManager.cpp:75-76); its compiler's graph keeps the scores where the mask equals the
    // constant 0 (modeling_qwen_qnn_aot.hpp:299), so 65535 must decode to exactly 0 and 0 to a
    // value below it.
    if let Some(mask) = graph.inputs.get(2) {
        match mask.quant {
            Some(so) if so.dequantize(65535) == 0.0 && so.dequantize(0) < 0.0 => {}
            other => bad.push(format!(
                "graph `{g}` input 2 `{}`: encoding {other:?} does not decode code 65535 to 0 and 0 below it \
                 (mllm writes 65535 to attend, 0 to mask: KVCacheManager.cpp:75-76)",
                mask.name
            )),
        }
    }
    // Logits: mllm reads ar x vocab u16 codes (PromptProcessor.cpp:68) and takes the argmax of the
    // codes (QnnAOTModule.cpp:17-21), which is the argmax of the values only for a positive scale.
    if let Some(logits) = graph.outputs.first() {
        let numel: u64 = logits.dims.iter().map(|&x| u64::from(x)).product();
        let positive = logits.quant.is_some_and(|so| so.scale > 0.0);
        if logits.name != "logits"
            || logits.dtype != DataType::UFixedPoint16
            || numel != (ar * shape.vocab_size) as u64
            || logits.dims.last() != Some(&(shape.vocab_size as u32))
            || !positive
        {
            bad.push(format!(
                "graph `{g}` output 0 `{}`: {} {:?} {:?}; mllm reads `logits` as {ar} x {} UFIXED_POINT_16 codes with a \
                 positive scale (PromptProcessor.cpp:68, QnnAOTModule.cpp:17-21)",
                logits.name,
                logits.dtype,
                logits.dims,
                logits.quant,
                shape.vocab_size
            ));
        }
    }
    // K/V codes: u8 with zero point 128, and each output in its input's encoding, since
    // KVCacheManager copies the output codes into the input buffer unchanged
    // (KVCacheManager.cpp:255-321).
    for i in 0..2 * l {
        let (Some(past), Some(present)) = (graph.inputs.get(3 + i), graph.outputs.get(1 + i)) else { continue };
        let ok =
            past.quant.is_some_and(|so| so.offset == MLLM_KV_OFFSET && so.scale > 0.0) && present.quant == past.quant;
        if !ok {
            bad.push(format!(
                "graph `{g}`: `{}` {:?} / `{}` {:?}: mllm copies the output codes into the input buffer unchanged \
                 (KVCacheManager.cpp:255-321), so both need the same u8 encoding with offset {MLLM_KV_OFFSET}",
                past.name, past.quant, present.name, present.quant
            ));
        }
    }
    bad
}

/// The whole contract on a context binary's graphs: the decode graph `model.0.s1` and every
/// prefill graph `model.0.s<ar>` each checked ([`check_mllm_graph`]), and the K/V encodings equal
/// across graphs, since prefill and decode share one cache buffer per layer
/// (PromptProcessor.cpp:49, TokenGenerator.cpp:44).
pub fn check_mllm_contract(graphs: &[GraphIo], shape: &MllmModelShape) -> Vec<String> {
    let mut bad = Vec::new();
    let reachable: Vec<&GraphIo> = graphs.iter().filter(|g| mllm_graph_chunk(&g.name).is_some()).collect();
    let Some(decode) = reachable.iter().find(|g| g.name == MLLM_DECODE_GRAPH) else {
        return vec![MllmBlocker::NoDecodeGraph.to_string()];
    };
    for g in &reachable {
        bad.extend(check_mllm_graph(g, shape));
    }
    for g in reachable.iter().filter(|g| g.name != MLLM_DECODE_GRAPH) {
        let kv_encoding = |g: &GraphIo, i: usize| g.inputs.get(3 + i).and_then(|t| t.quant);
        for i in 0..2 * shape.num_layers {
            let (a, b) = (kv_encoding(g, i), kv_encoding(decode, i));
            if a != b {
                let name = g.inputs.get(3 + i).map_or("?", |t| t.name.as_str());
                bad.push(format!(
                    "`{name}` is {a:?} in `{}` but {b:?} in `{MLLM_DECODE_GRAPH}`: the two graphs share one cache buffer \
                     (PromptProcessor.cpp:49, TokenGenerator.cpp:44)",
                    g.name
                ));
            }
        }
    }
    bad
}

/// The mask encoding mllm's compiler gives `causal_mask` (scale 0.001/65535, zero point 65535:
/// `examples/qwen3_qnn_aot/compile_common.hpp:13-14`), which this project's graphs use too.
pub fn mllm_mask_encoding() -> ScaleOffset {
    ScaleOffset::from_zero_point(runtime::MASK_SCALE, runtime::MASK_ZERO_POINT)
}

/// The "where it runs" table of the printed summary.
pub fn summary_lines(deploy: &[ArtifactRuntimes]) -> String {
    let mut s = String::new();
    for a in deploy {
        let _ = writeln!(s, "  {}: {}", a.artifact, a.runners());
        for v in &a.verdicts {
            let head = if v.runs { "runs" } else { "cannot run it" };
            let _ = writeln!(s, "    {} {head}", v.runtime.name());
            for b in &v.blockers {
                let _ = writeln!(s, "      - {b}");
            }
            for n in &v.notes {
                let _ = writeln!(s, "      · {n}");
            }
        }
    }
    s
}

/// `report.json`'s `"deploy"`.
pub fn to_json(deploy: &[ArtifactRuntimes]) -> serde_json::Value {
    serde_json::Value::Array(
        deploy
            .iter()
            .map(|a| {
                let runtimes: serde_json::Map<String, serde_json::Value> = a
                    .verdicts
                    .iter()
                    .map(|v| {
                        (
                            v.runtime.name().to_string(),
                            serde_json::json!({ "runs": v.runs, "blockers": v.blockers, "notes": v.notes }),
                        )
                    })
                    .collect();
                serde_json::json!({ "artifact": a.artifact, "runs_on": a.runners(), "runtimes": runtimes })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mllm_graph_names_are_the_pass_pipelines() {
        assert_eq!(MLLM_DECODE_GRAPH, compiler::passes::graph_name(1));
        assert_eq!(mllm_graph_chunk(&compiler::passes::graph_name(128)), Some(128));
        for other in ["model.1.s32", "model.0.s0", "model.0.s+3", "model.0.s32_cl4096", "ar32_cl1024"] {
            assert_eq!(mllm_graph_chunk(other), None, "{other}");
        }
    }

    fn graphs(chunks: &[usize], ctx: usize) -> Vec<GraphShape> {
        chunks.iter().map(|&c| GraphShape { name: format!("model.0.s{c}"), chunk: c, context_len: ctx }).collect()
    }

    fn traits(chunks: &[usize]) -> ArtifactTraits {
        ArtifactTraits {
            sink_prefix: 0,
            shards: 1,
            graphs: graphs(chunks, 1024),
            eos_ids: vec![2],
            context_binary: true,
        }
    }

    fn runners(t: &ArtifactTraits) -> Vec<String> {
        where_it_runs(t, Some(&[])).iter().map(|a| format!("{}: {}", a.artifact, a.runners())).collect()
    }

    #[test]
    fn the_default_pair_runs_on_both_runtimes_on_the_device_and_only_ours_on_x86() {
        assert_eq!(runners(&traits(&[32, 1])), ["qnn/context.bin: mllm-dsl, mllm", "qnn/context.x86.bin: mllm-dsl"]);
        let deploy = where_it_runs(&traits(&[32, 1]), Some(&[]));
        let mllm = &deploy[0].verdicts[1];
        assert!(mllm.notes.iter().any(|n| n.contains("--ar_len 32")), "{mllm:?}");
        assert!(mllm.notes.iter().any(|n| n.contains("not at this model's EOS [2]")), "{mllm:?}");
    }

    #[test]
    fn each_property_that_mllm_cannot_run_is_named() {
        let mut t = traits(&[32, 1]);
        t.sink_prefix = 4;
        assert_eq!(mllm_blockers(&t), [MllmBlocker::SinkPrefix { len: 4 }]);
        assert_eq!(runners(&t), ["qnn/context.bin: mllm-dsl", "qnn/context.x86.bin: mllm-dsl"]);
        let mut t = traits(&[32, 1]);
        t.shards = 2;
        assert_eq!(mllm_blockers(&t), [MllmBlocker::Shards { count: 2 }]);
        assert_eq!(runners(&t), ["qnn/context_<i>_of_2.bin: mllm-dsl", "qnn/context_<i>_of_2.x86.bin: mllm-dsl"]);
        let notes = &where_it_runs(&t, None)[0].verdicts[0].notes;
        assert!(notes.iter().any(|n| n.contains("qnn/embedding.safetensors")), "{notes:?}");
        assert_eq!(mllm_blockers(&traits(&[32])), [MllmBlocker::NoDecodeGraph]);
        let mut t = traits(&[32, 1]);
        t.graphs[0].context_len = 2048;
        assert!(matches!(mllm_blockers(&t)[..], [MllmBlocker::ContextLengths { .. }]));
        // A custom-named graph is one mllm never opens: a note, not a blocker.
        let mut t = traits(&[32, 1]);
        t.graphs.push(GraphShape { name: "prefill_long".into(), chunk: 128, context_len: 1024 });
        assert!(mllm_blockers(&t).is_empty());
        let notes = &where_it_runs(&t, Some(&[]))[0].verdicts[1].notes;
        assert!(notes.iter().any(|n| n.contains("prefill_long")), "{notes:?}");
        // A contract violation found in the binary blocks it too.
        let deploy = where_it_runs(&traits(&[32, 1]), Some(&["logits is FLOAT_32".to_string()]));
        assert!(!deploy[0].verdicts[1].runs);
        let mut t = traits(&[32, 1]);
        t.context_binary = false;
        assert_eq!(runners(&t), ["qnn/<graph>.cpp, qnn/weights.bin: neither"]);
    }

    #[test]
    fn target_runtime_mllm_refuses_by_option_name() {
        let plan = |prefix: usize, chunks: &[usize], off: bool| PlannedRun {
            sink_prefix: prefix,
            prefix_from_checkpoint: false,
            shards: 1,
            graphs: graphs(chunks, 1024),
            context_binary_off: off,
        };
        assert!(refuse_for_mllm(&plan(0, &[32, 1], false)).is_ok());
        assert!(refuse_for_mllm(&plan(0, &[1], false)).is_ok());
        let e = refuse_for_mllm(&plan(3, &[32, 1], false)).unwrap_err();
        assert!(e.to_string().starts_with("AotOptions::target_runtime mllm refuses AotOptions::sink_prefix: "), "{e}");
        let e = refuse_for_mllm(&plan(0, &[32, 8], false)).unwrap_err();
        assert!(
            e.to_string().contains("AotOptions::chunks 32 AotOptions::chunks 8 without AotOptions::chunks 1"),
            "{e}"
        );
        let e = refuse_for_mllm(&plan(0, &[32, 1], true)).unwrap_err();
        assert!(e.to_string().contains("AotOptions::context_binary off"), "{e}");
        let mut p = plan(2, &[32, 1], false);
        p.prefix_from_checkpoint = true;
        assert!(refuse_for_mllm(&p).unwrap_err().to_string().contains("ModelSource::Quantized"));
        let mut p = plan(0, &[32, 1], false);
        p.shards = 3;
        assert!(refuse_for_mllm(&p).unwrap_err().to_string().contains("3 shards"));
    }

    fn tensor(name: &str, dtype: DataType, dims: &[u32], quant: Option<ScaleOffset>) -> IoTensor {
        IoTensor { id: None, name: name.into(), dtype, dims: dims.to_vec(), quant }
    }

    /// The graph mllm's runtime expects, for 2 layers, H 1, D 4, context 8, vocab 5.
    fn contract_graph(ar: u32) -> GraphIo {
        let (ctx, past) = (8u32, 8 - ar);
        let kv = Some(ScaleOffset { scale: 0.05, offset: -128 });
        let mut inputs = vec![
            tensor("input_ids", DataType::Int32, &[1, ar], None),
            tensor("position_ids", DataType::Int32, &[ar], None),
            tensor("attention_mask", DataType::UFixedPoint16, &[1, 1, ar, ctx], Some(mllm_mask_encoding())),
        ];
        let mut outputs = vec![tensor(
            "logits",
            DataType::UFixedPoint16,
            &[1, 1, ar, 5],
            Some(ScaleOffset { scale: 0.01, offset: -30000 }),
        )];
        for (kind, k) in [("key", true), ("value", false)] {
            for l in 0..2 {
                let (p, n) = if k { ([1, 1, 4, past], [1, 1, 4, ar]) } else { ([1, 1, past, 4], [1, 1, ar, 4]) };
                inputs.push(tensor(&format!("past_{kind}_{l}"), DataType::UFixedPoint8, &p, kv));
                outputs.push(tensor(&format!("present_{kind}_{l}"), DataType::UFixedPoint8, &n, kv));
            }
        }
        GraphIo { name: format!("model.0.s{ar}"), inputs, outputs }
    }

    const SHAPE: MllmModelShape =
        MllmModelShape { num_layers: 2, kv_heads: 1, head_dim: 4, vocab_size: 5, context_len: 8 };

    #[test]
    fn the_contract_check_passes_the_contract_and_names_each_deviation() {
        let pair = [contract_graph(4), contract_graph(1)];
        assert_eq!(check_mllm_contract(&pair, &SHAPE), Vec::<String>::new());
        let one = |f: &dyn Fn(&mut GraphIo)| {
            let mut g = [contract_graph(4), contract_graph(1)];
            f(&mut g[0]);
            check_mllm_contract(&g, &SHAPE)
        };
        // present_key holding the whole cache instead of the new positions.
        let v = one(&|g| g.outputs[1].dims = vec![1, 1, 4, 8]);
        assert!(v.len() == 1 && v[0].contains("output 1") && v[0].contains("[1, 1, 4, 4]"), "{v:?}");
        // float logits.
        let v = one(&|g| g.outputs[0].dtype = DataType::Float32);
        assert!(v.len() == 1 && v[0].contains("`logits`"), "{v:?}");
        // V before K: binding by position puts the wrong buffers in.
        let v = one(&|g| g.inputs.swap(3, 5));
        assert!(v.len() >= 2 && v.iter().any(|s| s.contains("input 3")), "{v:?}");
        // A mask that decodes 65535 to something other than 0.
        let v = one(&|g| g.inputs[2].quant = Some(ScaleOffset { scale: 1.0 / 65535.0, offset: 0 }));
        assert!(v.len() == 1 && v[0].contains("attention_mask"), "{v:?}");
        // K/V codes in another encoding than the input's.
        let v = one(&|g| g.outputs[2].quant = Some(ScaleOffset { scale: 0.07, offset: -128 }));
        assert!(v.len() == 1 && v[0].contains("present_key_1"), "{v:?}");
        // Prefill and decode disagreeing on a cache encoding.
        let v = one(&|g| {
            g.inputs[4].quant = Some(ScaleOffset { scale: 0.07, offset: -128 });
            g.outputs[2].quant = g.inputs[4].quant;
        });
        assert!(v.len() == 1 && v[0].contains("share one cache buffer"), "{v:?}");
        // No decode graph.
        let v = check_mllm_contract(&[contract_graph(4)], &SHAPE);
        assert_eq!(v, [MllmBlocker::NoDecodeGraph.to_string()]);
    }
}
