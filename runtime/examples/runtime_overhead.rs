//! Prints the cost of the runtime's own work at Qwen3-1.7B QNN shapes (28 layers, 8 KV heads,
//! head_dim 128, context 1024, u8 KV cache, vocab 151936): KV re-striding 32 -> 1, per-step cache
//! update and mask update, and token selection. These costs come on top of every model run.
//!
//! `cargo run --release -p mllm-dsl --example runtime_overhead`

use std::time::Instant;

use runtime::{AttentionMask, KvCache, ModelLayout, RandomSampling, RuntimeError, Sampler, Sampling};

fn main() -> Result<(), RuntimeError> {
    let layout = ModelLayout {
        num_layers: 28,
        num_kv_heads: 8,
        head_dim: 128,
        vocab_size: 151_936,
        context_len: 1024,
        sliding_window: None,
    };
    let ctx = layout.context_len;

    // Fill 500 positions through the chunk-32 layout, then time the switch to the decode layout.
    let mut cache = KvCache::<u8>::new(layout, 32)?;
    let present = vec![7u8; layout.kv_elems(32)];
    for chunk in 0..16 {
        for layer in 0..layout.num_layers {
            cache.update(layer, &present, &present, 32, chunk * 32, 32.min(500 - chunk * 32))?;
        }
    }
    let t = Instant::now();
    cache.rearrange(1)?;
    println!("rearrange 32 -> 1 (u8, 28 layers, 500 positions): {:.2} ms", ms(t));

    let present = vec![9u8; layout.kv_elems(1)];
    let t = Instant::now();
    let steps = 200;
    for step in 0..steps {
        for layer in 0..layout.num_layers {
            cache.update(layer, &present, &present, 1, 500 + step, 1)?;
        }
    }
    println!("cache update, one decode step (28 layers): {:.1} us", ms(t) * 1000.0 / steps as f64);

    let mut mask = AttentionMask::new(ctx)?;
    let t = Instant::now();
    mask.init(32, 0)?;
    println!("mask init [32, 1024]: {:.1} us", ms(t) * 1000.0);

    let logits: Vec<f32> =
        (0..layout.vocab_size).map(|i| ((i as u64).wrapping_mul(2_654_435_761) % 10_007) as f32 / 1000.0).collect();
    let configs = [
        ("greedy", Sampling::Greedy),
        ("temperature 0.7", random(0.7, 0, 1.0)),
        ("top-k 50", random(0.7, 50, 1.0)),
        ("top-p 0.9", random(0.7, 0, 0.9)),
    ];
    for (name, sampling) in configs {
        let mut sampler = Sampler::new(&sampling)?;
        let n = 20;
        let t = Instant::now();
        for _ in 0..n {
            sampler.sample(&logits)?;
        }
        println!("sample over 151936 logits, {name}: {:.2} ms", ms(t) / n as f64);
    }
    Ok(())
}

fn random(temperature: f32, top_k: usize, top_p: f32) -> Sampling {
    Sampling::Random(RandomSampling { temperature, top_k, top_p, seed: 1 })
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}
