//! The GGUF reader against a file written by llama.cpp's own Python writer and the values its
//! reference dequantization gives (fixtures/gguf-tiny, made by make_gguf_tiny.py), and against
//! corrupted copies of it.

use std::path::{Path, PathBuf};

use super::*;
use crate::tests::TempDir;
use crate::SafetensorsCheckpoint;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/gguf-tiny").join(name)
}

fn tiny_bytes() -> Vec<u8> {
    std::fs::read(fixture("tiny.gguf")).unwrap()
}

/// Opens `bytes` written to a temporary file.
fn open_bytes(bytes: &[u8], label: &str) -> (TempDir, Result<GgufFile, GgufError>) {
    let dir = TempDir::new(label);
    let path = dir.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    let result = GgufFile::open(&path);
    (dir, result)
}

/// Byte offset of the first occurrence of `needle` in `bytes`.
fn find(bytes: &[u8], needle: &[u8]) -> usize {
    bytes.windows(needle.len()).position(|w| w == needle).expect("needle in fixture")
}

/// Offset of the u64 length that precedes the string `s` in the header.
fn string_len_at(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    find(bytes, &needle)
}

#[test]
fn dequantizes_every_type_bit_exact_with_ggml_reference() {
    let gguf = GgufFile::open(fixture("tiny.gguf")).unwrap();
    let expected = SafetensorsCheckpoint::open_file(fixture("expected.safetensors")).unwrap();
    assert_eq!(gguf.version(), 3);
    assert_eq!(gguf.alignment(), 32);
    let mut types = Vec::new();
    for name in ["f32", "f16", "bf16", "q4_0", "q4_1", "q8_0"] {
        let info = gguf.tensor_info(name).unwrap();
        assert_eq!(info.shape(), vec![3, 64], "{name}");
        assert_eq!(info.start % 32, 0, "{name} aligned");
        types.push(info.ggml_type);
        let ours = gguf.read_f32(name).unwrap();
        let reference = expected.read_f32(name).unwrap();
        assert_eq!(ours.len(), reference.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: ours {a}, gguf-py {b}");
        }
    }
    use GgmlType::*;
    assert_eq!(types, [F32, F16, BF16, Q4_0, Q4_1, Q8_0]);
}

#[test]
fn dequantizes_gemma_k_quant_types_bit_exact_with_ggml_reference() {
    // Random blocks (make_gguf_kquants.py): every bit of the packed values, scales and mins varies.
    let gguf = GgufFile::open(fixture("kquants.gguf")).unwrap();
    let expected = SafetensorsCheckpoint::open_file(fixture("kquants-expected.safetensors")).unwrap();
    let mut types = Vec::new();
    for name in ["q5_0", "q4_k", "q6_k"] {
        let info = gguf.tensor_info(name).unwrap();
        assert_eq!(info.shape(), vec![3, 256], "{name}");
        types.push(info.ggml_type);
        let ours = gguf.read_f32(name).unwrap();
        let reference = expected.read_f32(name).unwrap();
        assert_eq!(ours.len(), reference.len(), "{name}");
        for (i, (a, b)) in ours.iter().zip(&reference).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{name}[{i}]: ours {a}, gguf-py {b}");
        }
    }
    use GgmlType::*;
    assert_eq!(types, [Q5_0, Q4_K, Q6_K]);
}

#[test]
fn reads_every_metadata_value_type() {
    let gguf = GgufFile::open(fixture("tiny.gguf")).unwrap();
    let m = gguf.metadata();
    use GgufValue::*;
    assert_eq!(m["general.architecture"], String("llama".into()));
    assert_eq!(m["test.u8"], U8(200));
    assert_eq!(m["test.i8"], I8(-100));
    assert_eq!(m["test.u16"], U16(60000));
    assert_eq!(m["test.i16"], I16(-30000));
    assert_eq!(m["test.u32"], U32(4_000_000_000));
    assert_eq!(m["test.i32"], I32(-2_000_000_000));
    assert_eq!(m["test.u64"], U64((1 << 63) + 5));
    assert_eq!(m["test.i64"], I64(-(1 << 62)));
    assert_eq!(m["test.f32"], F32(0.1));
    assert_eq!(m["test.f64"], F64(0.1));
    assert_eq!(m["test.bool"], Bool(true));
    assert_eq!(gguf.get_str("test.string").unwrap(), "héllo {{ messages }}");
    assert_eq!(gguf.get_str_array("test.strings").unwrap(), ["a", "", "Ġb c"]);
    assert_eq!(gguf.get_int_array("test.i32s").unwrap(), [1, -2, 3]);
    assert_eq!(m["test.nested"], Array(vec![Array(vec![I32(1), I32(2)]), Array(vec![I32(3)])]));
    assert_eq!(m.len(), 16);
    // Typed getters name the key and what was expected.
    let err = gguf.get_u64("test.string").unwrap_err().to_string();
    assert!(err.contains("'test.string'") && err.contains("unsigned integer") && err.contains("string"), "{err}");
    let err = gguf.get_str("no.such.key").unwrap_err().to_string();
    assert!(err.contains("'no.such.key' is missing"), "{err}");
    let err = gguf.read_f32("nope").unwrap_err().to_string();
    assert!(err.contains("tiny.gguf: tensor 'nope' not found"), "{err}");
}

fn expect_err(bytes: &[u8], label: &str, parts: &[&str]) {
    let (_dir, result) = open_bytes(bytes, label);
    let err = match result {
        Ok(_) => panic!("{label}: corrupt file opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("model.gguf"), "{label}: no file name in: {err}");
    for part in parts {
        assert!(err.contains(part), "{label}: '{part}' not in: {err}");
    }
}

#[test]
fn corrupt_headers_are_typed_errors() {
    let good = tiny_bytes();
    let mut bytes = good.clone();
    bytes[0] = b'X';
    expect_err(&bytes, "magic", &["magic", "not a GGUF file"]);

    let mut bytes = good.clone();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    expect_err(&bytes, "version", &["version 1 is not supported"]);

    // Counts larger than the file can hold fail before any allocation.
    let mut bytes = good.clone();
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    expect_err(&bytes, "kv count", &["metadata_kv_count", "cannot fit"]);
    let mut bytes = good.clone();
    bytes[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_err(&bytes, "tensor count", &["tensor_count", "cannot fit"]);
    let mut bytes = good.clone();
    let at = string_len_at(&bytes, "test.strings") + 8 + "test.strings".len() + 4 + 4;
    bytes[at..at + 8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    expect_err(&bytes, "array len", &["array length of metadata 'test.strings'", "cannot fit"]);

    let mut bytes = good.clone();
    let at = string_len_at(&bytes, "test.string") + 8 + "test.string".len() + 4;
    bytes[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    expect_err(&bytes, "string len", &["value of metadata 'test.string'", "truncated"]);

    let mut bytes = good.clone();
    let at = string_len_at(&bytes, "test.bool") + 8 + "test.bool".len();
    bytes[at..at + 4].copy_from_slice(&77u32.to_le_bytes());
    expect_err(&bytes, "value type", &["type of metadata 'test.bool'", "unknown value type 77"]);
    let mut bytes = good.clone();
    bytes[at + 4] = 2;
    expect_err(&bytes, "bool", &["'test.bool'", "bool byte is 2"]);

    // Cut inside the tensor table, and inside the metadata.
    for cut in [find(&good, b"q4_1") + 2, find(&good, b"test.f64")] {
        expect_err(&good[..cut], "cut header", &["truncated"]);
    }
}

#[test]
fn corrupt_tensor_entries_name_the_tensor() {
    let good = tiny_bytes();
    // Tensor entry: name, n_dims u32, dims u64 × n, type u32, offset u64.
    let entry = |bytes: &[u8], name: &str| string_len_at(bytes, name) + 8 + name.len();

    let mut bytes = good.clone();
    let at = entry(&bytes, "q4_1");
    bytes[at..at + 4].copy_from_slice(&9u32.to_le_bytes());
    expect_err(&bytes, "n_dims", &["tensor 'q4_1' n_dims", "9 is not in 1..=4"]);

    let mut bytes = good.clone();
    let at = entry(&bytes, "q4_1") + 4 + 16;
    bytes[at..at + 4].copy_from_slice(&10u32.to_le_bytes());
    expect_err(&bytes, "type", &["tensor 'q4_1'", "Q2_K (id 10)", "cannot be dequantized"]);

    let mut bytes = good.clone();
    let at = entry(&bytes, "q8_0") + 4;
    bytes[at..at + 8].copy_from_slice(&48u64.to_le_bytes());
    expect_err(&bytes, "block", &["tensor 'q8_0'", "not a multiple of Q8_0's block of 32"]);

    let mut bytes = good.clone();
    let at = entry(&bytes, "q8_0") + 4 + 8;
    bytes[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    expect_err(&bytes, "overflow", &["tensor 'q8_0'", "overflow"]);

    let mut bytes = good.clone();
    let at = entry(&bytes, "q8_0") + 4 + 16 + 4;
    let offset = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
    bytes[at..at + 8].copy_from_slice(&(offset + 1).to_le_bytes());
    expect_err(&bytes, "alignment", &["tensor 'q8_0'", "not a multiple of the alignment 32"]);
    bytes[at..at + 8].copy_from_slice(&(offset + 64).to_le_bytes());
    expect_err(&bytes, "past end", &["tensor 'q8_0'", "run past the end", "truncated"]);

    let mut bytes = good.clone();
    let q4_0 = entry(&bytes, "q4_0") + 4 + 16 + 4;
    let q4_1 = entry(&bytes, "q4_1") + 4 + 16 + 4;
    let offset = bytes[q4_0..q4_0 + 8].to_vec();
    bytes[q4_1..q4_1 + 8].copy_from_slice(&offset);
    expect_err(&bytes, "overlap", &["overlaps tensor"]);

    // The data section cut short: the last tensor (204 bytes at 2624) runs past the end.
    expect_err(&good[..2624 + 203], "short data", &["tensor 'q8_0'", "run past the end"]);
}

#[test]
fn unpermute_restores_hf_rotary_halves() {
    // One head of dim 4 with 1-element rows: llama.cpp stores HF rows [0, 2, 1, 3].
    let gguf_rows = [0.0, 2.0, 1.0, 3.0, 10.0, 12.0, 11.0, 13.0];
    assert_eq!(super::to_hf::unpermute_rows(&gguf_rows, 2, 1), [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0]);
    assert_eq!(hf_tensor_name("blk.12.attn_k.weight").as_deref(), Some("model.layers.12.self_attn.k_proj.weight"));
    assert_eq!(hf_tensor_name("token_embd.weight").as_deref(), Some("model.embed_tokens.weight"));
    assert_eq!(hf_tensor_name("rope_freqs.weight"), None);
}

#[test]
fn non_llama_files_are_refused_by_the_converter() {
    let gguf = GgufFile::open(fixture("tiny.gguf")).unwrap();
    let dir = TempDir::new("gguf-convert");
    let out = dir.path().join("hf");
    let err = convert_to_hf_dir(&gguf, &out).unwrap_err().to_string();
    // The fixture says llama but has no hyper-parameters.
    assert!(err.contains("'llama.embedding_length' is missing"), "{err}");
    assert!(!out.exists(), "a failed conversion leaves no directory");
    let staged: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("staging"))
        .collect();
    assert!(staged.is_empty(), "a failed conversion leaves no staging directory: {staged:?}");
    std::fs::create_dir(&out).unwrap();
    let err = convert_to_hf_dir(&gguf, &out).unwrap_err().to_string();
    assert!(err.contains("already exists"), "{err}");
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn llama_gguf_converts_back_to_the_hf_checkpoint_it_was_made_from() {
    // llama-tiny.gguf is fixtures/llama-dev-f32 written as llama.cpp writes llama models (q/k rows
    // permuted) with tokenizer-tiny's vocabulary (make_llama_tiny.py).
    let gguf = GgufFile::open(fixture("llama-tiny.gguf")).unwrap();
    let dir = TempDir::new("gguf-llama-tiny");
    let out = dir.path().join("hf");
    convert_to_hf_dir(&gguf, &out).unwrap();
    let hf_dir = fixture("../llama-dev-f32");

    let ours = SafetensorsCheckpoint::open(&out).unwrap();
    let theirs = SafetensorsCheckpoint::open(&hf_dir).unwrap();
    let (mut a, mut b) = (ours.keys(), theirs.keys());
    a.sort_unstable();
    b.sort_unstable();
    assert_eq!(a, b);
    for key in b {
        assert_eq!(ours.info(key).unwrap().1, theirs.info(key).unwrap().1, "{key} shape");
        let (x, y) = (ours.read_f32(key).unwrap(), theirs.read_f32(key).unwrap());
        assert!(x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()), "{key} differs from HF");
    }

    use models::hf::HfConfig;
    let (c, h) = (HfConfig::from_dir(&out).unwrap(), HfConfig::from_dir(&hf_dir).unwrap());
    assert_eq!(
        (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (h.vocab_size, h.hidden_size, h.intermediate_size, h.num_hidden_layers)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (h.num_attention_heads, h.num_key_value_heads, h.head_dim)
    );
    assert_eq!(
        (c.rope_theta, c.tie_word_embeddings, c.eos_token_ids.clone()),
        (h.rope_theta, h.tie_word_embeddings, h.eos_token_ids.clone())
    );
    assert_eq!(c.rms_norm_eps as f32, h.rms_norm_eps as f32);
    assert_eq!(c.max_position_embeddings, h.max_position_embeddings);

    let tok = read_json(&out.join("tokenizer.json"));
    let tiny = read_json(&fixture("../tokenizer-tiny/tokenizer.json"));
    assert_eq!(tok["model"]["vocab"], tiny["model"]["vocab"]);
    let pairs = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|m| match m {
                serde_json::Value::Array(p) => format!("{} {}", p[0].as_str().unwrap(), p[1].as_str().unwrap()),
                s => s.as_str().unwrap().to_string(),
            })
            .collect()
    };
    assert_eq!(pairs(&tok["model"]["merges"]), pairs(&tiny["model"]["merges"]));
    assert_eq!(tok["pre_tokenizer"], tiny["pre_tokenizer"]);
    assert_eq!(tok["added_tokens"], tiny["added_tokens"]);

    let config = read_json(&out.join("tokenizer_config.json"));
    assert_eq!(config["eos_token"], "<|im_end|>");
    assert_eq!(config["bos_token"], "<|im_start|>");
    let chat = crate::ChatTemplate::from_dir(&out).unwrap();
    let text = chat.render(&[crate::ChatMessage::new("user", "hi")], true).unwrap();
    assert_eq!(text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    assert_eq!(read_json(&out.join("generation_config.json"))["eos_token_id"], 2);
}
