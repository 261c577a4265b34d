//! A small JSON value with deterministic output: object keys are written in sorted order (as
//! nlohmann::json's default `std::map` does in the QNN JSON dumpers, Qualcomm's qnn-model-lib-generator docs), floats in
//! their shortest round-trip form. Independent of serde_json feature flags such as
//! `preserve_order`, so artifact bytes cannot change when another crate enables one.

use std::fmt::Write;

/// A JSON value.
#[derive(Clone, Debug, PartialEq)]
pub enum Json {
    Bool(bool),
    Int(i64),
    /// Written with the shortest representation that reads back as the same f32.
    F32(f32),
    F64(f64),
    Str(String),
    Arr(Vec<Json>),
    /// Keys are sorted on output; duplicates keep the last value.
    Obj(Vec<(String, Json)>),
}

impl Json {
    /// An object from `(key, value)` pairs.
    pub fn obj<K: Into<String>>(pairs: impl IntoIterator<Item = (K, Json)>) -> Json {
        Json::Obj(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    pub fn str(s: impl Into<String>) -> Json {
        Json::Str(s.into())
    }

    /// Pretty-printed with `indent` spaces per level and a trailing newline.
    pub fn to_pretty(&self, indent: usize) -> String {
        let mut out = String::new();
        self.write(&mut out, indent, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, indent: usize, level: usize) {
        let pad = |out: &mut String, level: usize| out.extend(std::iter::repeat_n(' ', indent * level));
        match self {
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Json::F32(v) => write_float(out, f64::from(*v), format!("{v}")),
            Json::F64(v) => write_float(out, *v, format!("{v}")),
            Json::Str(s) => write_string(out, s),
            Json::Arr(items) if items.is_empty() => out.push_str("[]"),
            Json::Arr(items) => {
                // Arrays of scalars stay on one line: dims, data rows and scale lists are long.
                if items.iter().all(|i| !matches!(i, Json::Arr(_) | Json::Obj(_))) {
                    out.push('[');
                    for (i, item) in items.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        item.write(out, indent, level + 1);
                    }
                    out.push(']');
                    return;
                }
                out.push_str("[\n");
                for (i, item) in items.iter().enumerate() {
                    pad(out, level + 1);
                    item.write(out, indent, level + 1);
                    out.push_str(if i + 1 < items.len() { ",\n" } else { "\n" });
                }
                pad(out, level);
                out.push(']');
            }
            Json::Obj(pairs) if pairs.is_empty() => out.push_str("{}"),
            Json::Obj(pairs) => {
                let mut sorted: Vec<&(String, Json)> = pairs.iter().collect();
                // Stable sort, then keep the last of equal keys.
                sorted.sort_by(|a, b| a.0.cmp(&b.0));
                let mut unique: Vec<&(String, Json)> = Vec::with_capacity(sorted.len());
                for p in sorted {
                    match unique.last_mut() {
                        Some(last) if last.0 == p.0 => *last = p,
                        _ => unique.push(p),
                    }
                }
                out.push_str("{\n");
                for (i, (k, v)) in unique.iter().map(|p| (&p.0, &p.1)).enumerate() {
                    pad(out, level + 1);
                    write_string(out, k);
                    out.push_str(": ");
                    v.write(out, indent, level + 1);
                    out.push_str(if i + 1 < unique.len() { ",\n" } else { "\n" });
                }
                pad(out, level);
                out.push('}');
            }
        }
    }
}

fn write_float(out: &mut String, value: f64, shortest: String) {
    if !value.is_finite() {
        // JSON has no infinities or NaN.
        out.push_str("null");
    } else if shortest.contains(['.', 'e', 'E']) {
        out.push_str(&shortest);
    } else {
        out.push_str(&shortest);
        out.push_str(".0");
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorted_keys_floats_and_escapes() {
        let v = Json::obj([
            ("b", Json::F32(0.1)),
            ("a", Json::Arr(vec![Json::Int(1), Json::F32(2.0), Json::F32(f32::NAN)])),
            ("c\"q", Json::str("x\ny")),
            ("d", Json::obj([("z", Json::Int(-3)), ("y", Json::Bool(true))])),
        ]);
        let text = v.to_pretty(2);
        assert_eq!(
            text,
            "{\n  \"a\": [1, 2.0, null],\n  \"b\": 0.1,\n  \"c\\\"q\": \"x\\ny\",\n  \"d\": {\n    \"y\": true,\n    \"z\": -3\n  }\n}\n"
        );
        // The output is valid JSON with the same content.
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["b"].as_f64().unwrap() as f32, 0.1f32);
        assert_eq!(parsed["c\"q"], "x\ny");
    }

    #[test]
    fn f32_shortest_round_trip() {
        for v in [1.5259022e-5f32, 3.0517578e-5, 0.003921569, 1e-10, 12345.678] {
            let text = Json::F32(v).to_pretty(0);
            assert_eq!(text.trim().parse::<f32>().unwrap(), v);
        }
    }
}
