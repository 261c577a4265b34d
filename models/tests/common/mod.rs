//! Shared by the IR snapshot tests of this crate.

use mllm_dsl::ir::{parse, MAX_LINE};
use mllm_dsl::Program;

/// Snapshots `program`'s printed IR as `snapshots/<name>.snap`, after checking that the text is
/// deterministic, readable and lossless: every line within [`MAX_LINE`] and the text parses back
/// to the same program and prints identically.
pub fn snapshot(name: &str, program: &Program) {
    let text = program.to_string();
    for (i, line) in text.lines().enumerate() {
        assert!(line.len() <= MAX_LINE, "{name}: line {} has {} chars", i + 1, line.len());
    }
    let reparsed = parse(&text).unwrap_or_else(|e| panic!("{name} does not parse back: {e}"));
    assert_eq!(reparsed, program.canonicalize(), "{name}: parse(print(p)) != p");
    assert_eq!(reparsed.to_string(), text);
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

/// The attention inputs of a scope traced alone, from the trace inputs
/// `[x, sin, cos, mask, past_key, past_value]`.
#[allow(dead_code)] // qwen3_passes shares this module but traces whole models only
pub fn layer_inputs(t: &[mllm_dsl::Tensor]) -> models::decoder::AttentionInputs<'_> {
    models::decoder::AttentionInputs { sin: &t[1], cos: &t[2], mask: &t[3], past_key: &t[4], past_value: &t[5] }
}
