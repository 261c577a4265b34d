//! A graph family: the prefill and decode graphs one context binary holds, over chunk sizes and
//! context lengths, and their names.
//!
//! A member is a [`GraphSpec`] `{chunk, context_len}`; the family is every chunk size at every
//! context length (`--chunk 128 --chunk 32 --chunk 1 --context-len 1024 --context-len 4096`: six
//! graphs). All members are lowered by one lowering and share every weight by name, so a context
//! binary (and the SDK-free artifacts) store each weight once whatever the family's size.
//!
//! Names ([`GraphNaming`]):
//! - `mllm` (the default): members at the smallest context length keep mllm's names,
//!   `model.<shard>.s<chunk>` (the default family, chunks 32 and 1 at 1024, is exactly mllm's
//!   `model.0.s32` and `model.0.s1`); members at a larger context length add `_cl<context>`:
//!   `model.0.s128_cl4096`.
//! - `genie`: every member is `ar<chunk>_cl<context>` (Qualcomm Genie's `ar<N>_cl<C>`), with
//!   `_<shard+1>_of_<shards>` appended when the model is split into several shards.
//!
//! The shard index is the split slot of mllm's name (`model.<i>`); [`GraphFamily::name`] takes it
//! so that a sharded build names `shards x members` graphs with one scheme.

use std::collections::BTreeSet;

use backend_qnn::cost::{DecoderShapes, GraphCost, HtpPerf};
use compiler::passes::shard_graph_name;
use runtime::{GraphChoice, GraphMenu};

/// One member of a family: a graph for `chunk` new tokens per call attending over `context_len`
/// positions (the K/V cache holds `context_len - chunk`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GraphSpec {
    pub chunk: usize,
    pub context_len: usize,
}

/// How the members of a family are named (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GraphNaming {
    #[default]
    Mllm,
    Genie,
}

/// A `--graph-names` value other than mllm or genie.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown graph naming `{0}`; expected mllm or genie")]
pub struct UnknownNaming(pub String);

impl std::str::FromStr for GraphNaming {
    type Err = UnknownNaming;
    fn from_str(s: &str) -> Result<Self, UnknownNaming> {
        match s {
            "mllm" => Ok(GraphNaming::Mllm),
            "genie" => Ok(GraphNaming::Genie),
            other => Err(UnknownNaming(other.to_string())),
        }
    }
}

/// Why a family was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FamilyError {
    #[error("no chunk size: GraphFamily::chunks needs at least one")]
    NoChunk,
    #[error("no context length: GraphFamily::contexts needs at least one")]
    NoContext,
    #[error("GraphFamily::chunks 0: a chunk must be at least 1")]
    ZeroChunk,
    #[error("GraphFamily::chunks {0} is given twice")]
    DuplicateChunk(usize),
    #[error("GraphFamily::contexts {0} is given twice")]
    DuplicateContext(usize),
    #[error(
        "GraphFamily::chunks {chunk} must be smaller than the context length {context_len} (GraphFamily::contexts): \
         the rest of the context is the K/V cache"
    )]
    ChunkNotBelowContext { chunk: usize, context_len: usize },
    #[error(
        "graphs `{first}` and `{second}` of the family cannot share weights: static tensor `{tensor}` differs \
         ({detail}); every member of one context binary reads the same weights"
    )]
    WeightsNotShared { first: String, second: String, tensor: String, detail: String },
    #[error("{source_name} holds graphs {found:?}; the runtime expects {expected:?} ({detail})")]
    GraphSetMismatch { source_name: String, found: Vec<String>, expected: Vec<String>, detail: String },
}

/// Chunk sizes x context lengths, with their names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GraphFamily {
    /// Chunk sizes in the order given.
    chunks: Vec<usize>,
    /// Context lengths, ascending.
    contexts: Vec<usize>,
    naming: GraphNaming,
}

impl GraphFamily {
    /// Every chunk size at every context length; each chunk must be below each context.
    pub fn new(chunks: &[usize], contexts: &[usize], naming: GraphNaming) -> Result<GraphFamily, FamilyError> {
        if chunks.is_empty() {
            return Err(FamilyError::NoChunk);
        }
        if contexts.is_empty() {
            return Err(FamilyError::NoContext);
        }
        for (i, &c) in chunks.iter().enumerate() {
            if c == 0 {
                return Err(FamilyError::ZeroChunk);
            }
            if chunks[..i].contains(&c) {
                return Err(FamilyError::DuplicateChunk(c));
            }
        }
        for (i, &ctx) in contexts.iter().enumerate() {
            if contexts[..i].contains(&ctx) {
                return Err(FamilyError::DuplicateContext(ctx));
            }
        }
        let mut sorted = contexts.to_vec();
        sorted.sort_unstable();
        let (largest_chunk, smallest_context) = (chunks.iter().max().copied(), sorted[0]);
        if let Some(chunk) = largest_chunk.filter(|&c| c >= smallest_context) {
            return Err(FamilyError::ChunkNotBelowContext { chunk, context_len: smallest_context });
        }
        Ok(GraphFamily { chunks: chunks.to_vec(), contexts: sorted, naming })
    }

    /// Members, context by context (ascending), chunks in the order given.
    pub fn members(&self) -> Vec<GraphSpec> {
        self.contexts
            .iter()
            .flat_map(|&context_len| self.chunks.iter().map(move |&chunk| GraphSpec { chunk, context_len }))
            .collect()
    }

    /// Context lengths, ascending.
    pub fn contexts(&self) -> &[usize] {
        &self.contexts
    }

    /// Chunk sizes in the order given.
    pub fn chunks(&self) -> &[usize] {
        &self.chunks
    }

    pub fn naming(&self) -> GraphNaming {
        self.naming
    }

    /// The name of `spec` in shard `shard` of `shards` (1 for an unsplit model).
    pub fn name(&self, spec: GraphSpec, shard: usize, shards: usize) -> String {
        match self.naming {
            GraphNaming::Mllm if spec.context_len == self.contexts[0] => shard_graph_name(shard, spec.chunk),
            GraphNaming::Mllm => format!("{}_cl{}", shard_graph_name(shard, spec.chunk), spec.context_len),
            GraphNaming::Genie if shards > 1 => {
                format!("ar{}_cl{}_{}_of_{shards}", spec.chunk, spec.context_len, shard + 1)
            }
            GraphNaming::Genie => format!("ar{}_cl{}", spec.chunk, spec.context_len),
        }
    }

    /// The member named `name` (in any shard), if it is one.
    pub fn spec_named(&self, name: &str, shards: usize) -> Option<GraphSpec> {
        self.members().into_iter().find(|&spec| (0..shards.max(1)).any(|i| self.name(spec, i, shards) == name))
    }

    /// Checks that `found` (the graphs a context binary holds, by name) is exactly this family
    /// (one shard): no member missing, no graph the family does not name.
    pub fn check_graph_set(&self, source_name: &str, found: &[String]) -> Result<(), FamilyError> {
        let expected: BTreeSet<String> = self.members().into_iter().map(|s| self.name(s, 0, 1)).collect();
        let got: BTreeSet<String> = found.iter().cloned().collect();
        if expected == got {
            return Ok(());
        }
        let missing: Vec<&String> = expected.difference(&got).collect();
        let extra: Vec<&String> = got.difference(&expected).collect();
        Err(FamilyError::GraphSetMismatch {
            source_name: source_name.to_string(),
            found: got.iter().cloned().collect(),
            expected: expected.iter().cloned().collect(),
            detail: format!("missing {missing:?}, not in the family {extra:?}"),
        })
    }
}

/// Checks that every static tensor appearing in several of `graphs` under one name has the same
/// bytes, type and encoding there (the graphs can live in one weight-sharing context), and
/// returns the bytes of static data the family holds once (each name counted once) and the
/// bytes it would hold with every graph keeping its own copy.
pub fn check_weights_shared(graphs: &[backend_qnn::QnnGraph]) -> Result<(u64, u64), FamilyError> {
    use std::collections::HashMap;
    let mut seen: HashMap<&str, (&str, &backend_qnn::QnnTensor)> = HashMap::new();
    let (mut once, mut per_graph) = (0u64, 0u64);
    for g in graphs {
        for t in g.tensors.iter().filter(|t| t.data.is_some()) {
            let bytes = t.data.as_ref().map_or(0, |d| d.len() as u64);
            per_graph += bytes;
            match seen.get(t.name.as_str()) {
                None => {
                    seen.insert(&t.name, (&g.name, t));
                    once += bytes;
                }
                Some((first, known)) => {
                    let detail = if known.dtype != t.dtype || known.dims != t.dims {
                        format!("{} {:?} against {} {:?}", known.dtype, known.dims, t.dtype, t.dims)
                    } else if known.encoding != t.encoding {
                        "its quantization encodings differ".to_string()
                    } else if known.data != t.data {
                        "its bytes differ".to_string()
                    } else {
                        continue;
                    };
                    return Err(FamilyError::WeightsNotShared {
                        first: first.to_string(),
                        second: g.name.clone(),
                        tensor: t.name.clone(),
                        detail,
                    });
                }
            }
        }
    }
    Ok((once, per_graph))
}

/// `hf`'s decoder as the cost model sees it, stored as this project compiles it (W4A16 LPBQ
/// block 16 weights and lm_head, 8-bit K/V, 16-bit activations).
pub fn decoder_shapes(hf: &models::hf::HfConfig) -> DecoderShapes {
    let w = |x: usize| x as u64;
    DecoderShapes {
        layers: w(hf.num_hidden_layers),
        hidden: w(hf.hidden_size),
        intermediate: w(hf.intermediate_size),
        heads: w(hf.num_attention_heads),
        kv_heads: w(hf.num_key_value_heads),
        head_dim: w(hf.head_dim),
        vocab: w(hf.vocab_size),
        ..DecoderShapes::qwen3_1_7b()
    }
}

/// Every member of `family` with its modelled seconds per call on `target`: from the lowered
/// `graphs` when given (named as the family names them), else from `hf`'s shapes.
pub fn graph_menu(
    hf: &models::hf::HfConfig,
    family: &GraphFamily,
    graphs: Option<&[backend_qnn::QnnGraph]>,
    target: &HtpPerf,
) -> crate::Result<GraphMenu> {
    let shapes = decoder_shapes(hf);
    let mut choices = Vec::new();
    for spec in family.members() {
        let name = family.name(spec, 0, 1);
        let cost = match graphs.and_then(|gs| gs.iter().find(|g| g.name == name)) {
            Some(g) => GraphCost::of(g),
            None => shapes.call(spec.chunk, spec.context_len),
        };
        choices.push(GraphChoice {
            chunk: spec.chunk,
            context_len: spec.context_len,
            cost_s: target.call(&cost).total_s(),
        });
    }
    Ok(GraphMenu::new(choices)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_family_keeps_mllms_names() {
        let f = GraphFamily::new(&[32, 1], &[1024], GraphNaming::Mllm).unwrap();
        let names: Vec<String> = f.members().into_iter().map(|s| f.name(s, 0, 1)).collect();
        assert_eq!(names, ["model.0.s32", "model.0.s1"]);
    }

    #[test]
    fn larger_contexts_carry_their_length_in_the_name() {
        let f = GraphFamily::new(&[128, 32, 1], &[4096, 1024], GraphNaming::Mllm).unwrap();
        let names: Vec<String> = f.members().into_iter().map(|s| f.name(s, 0, 1)).collect();
        assert_eq!(
            names,
            [
                "model.0.s128",
                "model.0.s32",
                "model.0.s1",
                "model.0.s128_cl4096",
                "model.0.s32_cl4096",
                "model.0.s1_cl4096"
            ]
        );
        assert_eq!(f.name(GraphSpec { chunk: 32, context_len: 1024 }, 2, 3), "model.2.s32");
        assert_eq!(f.spec_named("model.0.s1_cl4096", 1), Some(GraphSpec { chunk: 1, context_len: 4096 }));
        let genie = GraphFamily::new(&[128, 1], &[4096], GraphNaming::Genie).unwrap();
        assert_eq!(genie.name(GraphSpec { chunk: 128, context_len: 4096 }, 0, 1), "ar128_cl4096");
        assert_eq!(genie.name(GraphSpec { chunk: 1, context_len: 4096 }, 1, 3), "ar1_cl4096_2_of_3");
    }

    #[test]
    fn bad_families_are_refused_by_name() {
        let e = GraphFamily::new(&[32, 32], &[1024], GraphNaming::Mllm).unwrap_err();
        assert_eq!(e, FamilyError::DuplicateChunk(32));
        let e = GraphFamily::new(&[512, 1], &[4096, 512], GraphNaming::Mllm).unwrap_err();
        assert_eq!(e, FamilyError::ChunkNotBelowContext { chunk: 512, context_len: 512 });
        assert!(e.to_string().contains("GraphFamily::chunks 512 must be smaller than the context length 512"), "{e}");
        assert_eq!(
            GraphFamily::new(&[1], &[64, 64], GraphNaming::Mllm).unwrap_err(),
            FamilyError::DuplicateContext(64)
        );
        assert_eq!(GraphFamily::new(&[], &[64], GraphNaming::Mllm).unwrap_err(), FamilyError::NoChunk);
        assert_eq!(GraphFamily::new(&[0], &[64], GraphNaming::Mllm).unwrap_err(), FamilyError::ZeroChunk);
    }

    #[test]
    fn a_binary_with_another_graph_set_is_refused() {
        let f = GraphFamily::new(&[32, 1], &[1024, 4096], GraphNaming::Mllm).unwrap();
        let found = vec!["model.0.s32".to_string(), "model.0.s1".to_string()];
        let e = f.check_graph_set("ctx.bin", &found).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("ctx.bin") && text.contains("model.0.s1_cl4096"), "{text}");
        let all: Vec<String> = f.members().into_iter().map(|s| f.name(s, 0, 1)).collect();
        f.check_graph_set("ctx.bin", &all).unwrap();
    }
}
