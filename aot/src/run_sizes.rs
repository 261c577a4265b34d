//! Sizes a run asks for on the command line (`--context`, `--max-positions`, `--chunk`), checked
//! against each other, the model's config and the machine's memory before anything is allocated.

use models::hf::{limits, HfConfig};

/// Why a run's sizes were refused; every variant names the fields and values.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RunSizeError {
    #[error("{arg} is {value}; expected {expected}")]
    OutOfRange { arg: &'static str, value: usize, expected: String },
    #[error("{arg} {value} must be at most {other_arg} {other}: {why}")]
    Order { arg: &'static str, value: usize, other_arg: &'static str, other: usize, why: &'static str },
    #[error(
        "RunSizes::context {context} with RunSizes::max_positions {positions} and RunSizes::chunk {chunk} needs about {needed} bytes for the \
         KV cache, RoPE tables, mask and attention scores of {model}, more than the {available} bytes of memory \
         available"
    )]
    TooMuchMemory { context: usize, positions: usize, chunk: usize, model: String, needed: String, available: u64 },
}

/// The sizes of one run: RoPE table rows, the context (KV cache + mask width) and the chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSizes {
    /// `--max-positions`: RoPE table rows, the largest position id + 1.
    pub max_positions: usize,
    /// `--context` / `--context-len`.
    pub context: usize,
    /// `--chunk` (the largest, for several).
    pub chunk: usize,
}

impl RunSizes {
    /// Checks `1 <= chunk <= context <= max_positions <= limits::POSITIONS`, then that the
    /// run's largest buffers fit in `available_memory` bytes (see [`available_memory`]).
    pub fn check(&self, config: &HfConfig, available_memory: u64) -> Result<(), RunSizeError> {
        let RunSizes { max_positions, context, chunk } = *self;
        let range = |arg, value: usize| {
            if value == 0 || value > limits::POSITIONS {
                return Err(RunSizeError::OutOfRange { arg, value, expected: format!("1..={}", limits::POSITIONS) });
            }
            Ok(())
        };
        range("RunSizes::context", context)?;
        range("RunSizes::max_positions", max_positions)?;
        range("RunSizes::chunk", chunk)?;
        if chunk > context {
            return Err(RunSizeError::Order {
                arg: "RunSizes::chunk",
                value: chunk,
                other_arg: "RunSizes::context",
                other: context,
                why: "a chunk's rows must fit in the context",
            });
        }
        if context > max_positions {
            return Err(RunSizeError::Order {
                arg: "RunSizes::context",
                value: context,
                other_arg: "RunSizes::max_positions",
                other: max_positions,
                why: "every position of the context needs a RoPE table row",
            });
        }
        let needed = run_bytes(config, *self);
        if needed.is_none_or(|n| n > u128::from(available_memory)) {
            return Err(RunSizeError::TooMuchMemory {
                context,
                positions: max_positions,
                chunk,
                model: config.source.display().to_string(),
                needed: needed.map_or_else(|| "more than 2^128".to_string(), |n| n.to_string()),
                available: available_memory,
            });
        }
        Ok(())
    }
}

/// Bytes of the buffers that grow with the run's sizes (f32 everywhere, the CPU's worst case):
/// sin/cos tables, K and V caches of every layer, the mask and one layer's attention scores.
pub fn run_bytes(config: &HfConfig, sizes: RunSizes) -> Option<u128> {
    let (p, c, s) = (sizes.max_positions as u128, sizes.context as u128, sizes.chunk as u128);
    let (layers, kv, heads, d) = (
        config.num_hidden_layers as u128,
        config.num_key_value_heads as u128,
        config.num_attention_heads as u128,
        config.head_dim as u128,
    );
    let rope = 2 * p * d;
    let cache = 2 * layers * kv * d * c;
    let mask = s * c;
    let scores = heads * s * c;
    rope.checked_add(cache)?.checked_add(mask)?.checked_add(scores)?.checked_mul(4)
}

/// Memory the run may use: `MemAvailable` of `/proc/meminfo`, or 1 TiB where that is unknown.
pub fn available_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            kb.checked_mul(1024)
        })
        .unwrap_or(1 << 40)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> HfConfig {
        let text = r#"{"model_type": "qwen3", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 256}"#;
        HfConfig::parse(text, std::path::Path::new("tiny/config.json")).unwrap()
    }

    #[test]
    fn sizes_are_checked_against_each_other_and_limits() {
        let c = tiny();
        let ok = RunSizes { max_positions: 1024, context: 1024, chunk: 32 };
        ok.check(&c, 1 << 30).unwrap();
        let err = RunSizes { context: 2048, ..ok }.check(&c, 1 << 30).unwrap_err();
        assert!(
            err.to_string().contains("RunSizes::context 2048 must be at most RunSizes::max_positions 1024"),
            "{err}"
        );
        let err = RunSizes { chunk: 4096, ..ok }.check(&c, 1 << 30).unwrap_err();
        assert!(err.to_string().contains("RunSizes::chunk 4096"), "{err}");
        for huge in [1usize << 62, 1_000_000_000] {
            let err = RunSizes { max_positions: huge, context: huge, chunk: 32 }.check(&c, u64::MAX).unwrap_err();
            assert!(matches!(err, RunSizeError::OutOfRange { .. }), "{err}");
            assert!(err.to_string().contains(&huge.to_string()), "{err}");
        }
        let err = RunSizes { chunk: 0, ..ok }.check(&c, 1 << 30).unwrap_err();
        assert!(err.to_string().contains("RunSizes::chunk is 0"), "{err}");
    }

    #[test]
    fn memory_is_checked_before_allocating() {
        let c = tiny();
        let sizes = RunSizes { max_positions: 1 << 24, context: 1 << 24, chunk: 1 << 20 };
        // mask + scores alone: (1 + 4) * 2^20 * 2^24 * 4 bytes = 320 TiB.
        let err = sizes.check(&c, available_memory()).unwrap_err();
        assert!(matches!(err, RunSizeError::TooMuchMemory { .. }), "{err}");
        assert!(err.to_string().contains("tiny/config.json"), "{err}");
        assert_eq!(
            run_bytes(&c, RunSizes { max_positions: 10, context: 8, chunk: 2 }),
            Some(4 * (2 * 10 * 8 + 2 * 2 * 2 * 8 * 8 + 2 * 8 + 4 * 2 * 8))
        );
    }
}
