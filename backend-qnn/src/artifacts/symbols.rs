//! C identifiers for graph names.
//!
//! `model.cpp` names one function per tensor / node and refers to static buffers through
//! `BINVARSTART(sym)`, which expands to the linker symbol `_binary_obj_binary_<sym>_raw_start`
//! of the object the lib generator makes from `<sym>.raw` in `model.bin` (Qualcomm's qnn-model-lib-generator docs). So a
//! symbol must be a C identifier fragment, unique, and short enough for a tar member name.

use std::collections::HashSet;

/// Longest symbol; leaves room for `.raw` within the 100-byte ustar name field.
pub const MAX_SYMBOL_LEN: usize = 90;

/// Hands out unique, deterministic identifiers in request order.
#[derive(Debug, Default)]
pub struct SymbolTable {
    used: HashSet<String>,
}

impl SymbolTable {
    /// A fresh identifier derived from `name`: characters outside `[A-Za-z0-9_]` become `_`,
    /// long names are shortened with a hash of the full name, and repeats get `_1`, `_2`, ...
    pub fn assign(&mut self, name: &str) -> String {
        let mut base: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' }).collect();
        if base.is_empty() {
            base.push('_');
        }
        if base.len() > MAX_SYMBOL_LEN - 8 {
            base.truncate(MAX_SYMBOL_LEN - 8 - 17);
            base.push_str(&format!("_{:016x}", fnv1a(name.as_bytes())));
        }
        let mut candidate = base.clone();
        let mut n = 0;
        while !self.used.insert(candidate.clone()) {
            n += 1;
            candidate = format!("{base}_{n}");
        }
        candidate
    }
}

/// FNV-1a 64-bit, a stable hash for shortening names and fingerprinting snapshot bytes.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitizes_and_deduplicates() {
        let mut t = SymbolTable::default();
        assert_eq!(t.assign("model.layers.0.q_proj.weight"), "model_layers_0_q_proj_weight");
        assert_eq!(t.assign("model_layers_0_q_proj_weight"), "model_layers_0_q_proj_weight_1");
        assert_eq!(t.assign("model/layers/0/q_proj/weight"), "model_layers_0_q_proj_weight_2");
        assert_eq!(t.assign("123"), "123");
        assert_eq!(t.assign(""), "_");
        let long = "x".repeat(300);
        let s = t.assign(&long);
        assert!(s.len() <= MAX_SYMBOL_LEN, "{}", s.len());
        assert_ne!(s, t.assign(&"x".repeat(301)));
    }

    #[test]
    fn fnv_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x85944171f73967e8);
    }
}
