//! Fuzz target over the IR text parser: a parser must answer every input with a value or an
//! error, never a panic; what parses must print without one too.
//! `MLLM_FUZZ_SECONDS=600 cargo test -p mllm-dsl --test fuzz -- --test-threads 1` runs the target
//! ten minutes (default: 2 s). Crash inputs become regression tests below. The HF config and AOT
//! config parsers have theirs in `models/tests/fuzz_hf_config.rs` and `compiler/tests/fuzz_aot_config.rs`.

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn ir_target(bytes: &[u8]) {
    if let Ok(program) = mllm_dsl::ir::parse(&String::from_utf8_lossy(bytes)) {
        let _ = program.to_string();
    }
}

#[test]
fn fuzz_ir_text() {
    let mut seeds: Vec<Vec<u8>> = ["qwen3__mlp__trace.snap", "qwen3__attention__trace.snap"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(repo().join("snapshots").join(f)).unwrap();
            // The IR after insta's `---` header.
            text.splitn(3, "---\n").nth(2).unwrap().as_bytes().to_vec()
        })
        .collect();
    // Every kind of value name and a spec table.
    seeds.push(std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ir/named.mir")).unwrap());
    for seed in &seeds {
        mllm_dsl::ir::parse(std::str::from_utf8(seed).unwrap()).expect("seeds are valid IR");
    }
    mllm_dsl::fuzz::run("ir_text", &seeds, ir_target);
}
