//! Shared by the IR snapshot tests of this crate.

use mllm_dsl::ir::{parse, MAX_LINE};
use mllm_dsl::Program;
use models::TransformerConfig;

/// The most lines a whole-model snapshot may have, so that it stays reviewable.
#[allow(dead_code)] // qwen3_passes snapshots the differences between programs instead
pub const MAX_MODEL_LINES: usize = 600;

/// `cfg` cut to its first layer. Every layer prints the same apart from its index (values are named
/// per scope), so the whole-model snapshots trace one; the scope snapshots and the 2-layer lowering
/// tests cover the rest.
#[allow(dead_code)] // qwen3_passes traces the fixture's 2 layers
pub fn one_layer(mut cfg: TransformerConfig) -> TransformerConfig {
    cfg.num_hidden_layers = 1;
    cfg.sliding_layers.truncate(1);
    cfg
}

/// Snapshots a whole model's printed IR (see [`snapshot`]) after asserting it has at most
/// [`MAX_MODEL_LINES`] lines.
#[allow(dead_code)] // qwen3_passes snapshots the differences between programs instead
pub fn snapshot_model(name: &str, program: &Program) {
    let lines = program.to_string().lines().count();
    assert!(lines <= MAX_MODEL_LINES, "{name}: {lines} lines, more than {MAX_MODEL_LINES} to review");
    snapshot(name, program);
}

/// `program`'s printed IR, after checking that the text is deterministic, readable and lossless:
/// every line within [`MAX_LINE`] and the text parses back to the same program and prints
/// identically.
pub fn checked_text(name: &str, program: &Program) -> String {
    let text = program.to_string();
    for (i, line) in text.lines().enumerate() {
        assert!(line.len() <= MAX_LINE, "{name}: line {} has {} chars: {line}", i + 1, line.len());
    }
    let reparsed = parse(&text).unwrap_or_else(|e| panic!("{name} does not parse back: {e}"));
    assert_eq!(reparsed, program.canonicalize(), "{name}: parse(print(p)) != p");
    assert_eq!(reparsed.to_string(), text);
    text
}

/// Snapshots `text` as `snapshots/<name>.snap`.
pub fn snapshot_text(name: &str, text: &str) {
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, text);
    });
}

/// Snapshots `program`'s printed IR as `snapshots/<name>.snap` (checked by [`checked_text`]).
#[allow(dead_code)] // qwen3_passes snapshots the differences between programs instead
pub fn snapshot(name: &str, program: &Program) {
    snapshot_text(name, &checked_text(name, program));
}

/// The lines of `new` that differ from `old`, as a unified diff without context (`@@ -a,n +b,m @@`
/// hunks of `-` and `+` lines, 1-based line numbers), from a longest common subsequence of lines.
#[allow(dead_code)] // only qwen3_passes diffs programs
pub fn line_diff(old: &str, new: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    // lcs[i][j]: the longest common subsequence of a[i..] and b[j..].
    let mut lcs = vec![vec![0u32; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, String::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            i += 1;
            j += 1;
            continue;
        }
        // One hunk: everything up to the next common line.
        let (i0, j0) = (i, j);
        while (i < a.len() || j < b.len()) && !(i < a.len() && j < b.len() && a[i] == b[j]) {
            if j == b.len() || (i < a.len() && lcs[i + 1][j] >= lcs[i][j + 1]) {
                i += 1;
            } else {
                j += 1;
            }
        }
        out.push_str(&format!("@@ -{},{} +{},{} @@\n", i0 + 1, i - i0, j0 + 1, j - j0));
        a[i0..i].iter().for_each(|l| out.push_str(&format!("-{l}\n")));
        b[j0..j].iter().for_each(|l| out.push_str(&format!("+{l}\n")));
    }
    out
}

/// The attention inputs of a scope traced alone, from the trace inputs
/// `[x, sin, cos, mask, past_key, past_value]`.
#[allow(dead_code)] // qwen3_passes shares this module but traces whole models only
pub fn layer_inputs(t: &[mllm_dsl::Tensor]) -> models::decoder::AttentionInputs<'_> {
    models::decoder::AttentionInputs { sin: &t[1], cos: &t[2], mask: &t[3], past_key: &t[4], past_value: &t[5] }
}
