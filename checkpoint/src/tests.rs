use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use safetensors::tensor::TensorView;

use super::*;

/// A fresh directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn new(label: &str) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("backend-cpu-checkpoint-{}-{n}-{label}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An owned tensor for building test files.
struct Tensor {
    name: &'static str,
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

fn tensor(name: &'static str, dtype: StDtype, shape: &[usize], bytes: Vec<u8>) -> Tensor {
    Tensor { name, dtype, shape: shape.to_vec(), bytes }
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn u16_bytes(values: &[u16]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Writes a file with the safetensors crate itself (independent of our writer).
fn write_with_crate(path: &Path, tensors: &[Tensor], metadata: &[(&str, &str)]) {
    let views: Vec<(&str, TensorView<'_>)> =
        tensors.iter().map(|t| (t.name, TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap())).collect();
    let meta: Option<HashMap<String, String>> =
        (!metadata.is_empty()).then(|| metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    std::fs::write(path, safetensors::serialize(views, meta).unwrap()).unwrap();
}

/// Deterministic, non-trivial f32 values (a small LCG), including negatives and fractions.
fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
        })
        .collect()
}

// bf16 / f16 bit patterns encoded by hand, with the f32 value each one denotes.
const BF16_CASES: &[(u16, f32)] = &[
    (0x3F80, 1.0),
    (0xC000, -2.0),
    (0x3E00, 0.125),
    (0x4049, 3.140_625), // pi truncated to 8 significant bits
    (0x8000, -0.0),
    (0x7F80, f32::INFINITY),
    (0xFF80, f32::NEG_INFINITY),
    (0x0001, 9.183_5e-41),    // smallest subnormal, 2^-133 (f32 bits 0x0001_0000)
    (0x7F7F, 3.389_531_4e38), // largest finite
];

const F16_CASES: &[(u16, f32)] = &[
    (0x3C00, 1.0),
    (0xC000, -2.0),
    (0x3555, 0.333_251_95),
    (0x7BFF, 65504.0),        // largest finite
    (0x0001, 5.960_464_5e-8), // smallest subnormal, 2^-24
    (0x0400, 6.103_515_6e-5), // smallest normal, 2^-14
    (0x8000, -0.0),
    (0x7C00, f32::INFINITY),
];

fn assert_bitwise_eq(actual: &[f32], expected: &[f32]) {
    assert_eq!(actual.len(), expected.len());
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert_eq!(a.to_bits(), e.to_bits(), "element {i}: {a} vs {e}");
    }
}

#[test]
fn reads_f32_bf16_f16_against_source_values() {
    let dir = TempDir::new("floats");
    let f32_values = pseudo_random(48, 7);
    let bf16_bits: Vec<u16> = BF16_CASES.iter().map(|c| c.0).collect();
    let f16_bits: Vec<u16> = F16_CASES.iter().map(|c| c.0).collect();
    write_with_crate(
        &dir.path().join(SINGLE_FILE),
        &[
            tensor("w.f32", StDtype::F32, &[6, 8], f32_bytes(&f32_values)),
            tensor("w.bf16", StDtype::BF16, &[9], u16_bytes(&bf16_bits)),
            tensor("w.f16", StDtype::F16, &[2, 4], u16_bytes(&f16_bits)),
            tensor("w.f64", StDtype::F64, &[2], [0.5f64, -1e10].iter().flat_map(|v| v.to_le_bytes()).collect()),
        ],
        &[],
    );
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.keys(), vec!["w.bf16", "w.f16", "w.f32", "w.f64"]);
    assert_eq!(ckpt.info("w.f32").unwrap(), (StDtype::F32, &[6usize, 8][..]));
    assert_eq!(ckpt.info("w.f16").unwrap(), (StDtype::F16, &[2usize, 4][..]));

    assert_bitwise_eq(&ckpt.read_f32("w.f32").unwrap(), &f32_values);
    let bf16_expected: Vec<f32> = BF16_CASES.iter().map(|c| c.1).collect();
    assert_bitwise_eq(&ckpt.read_f32("w.bf16").unwrap(), &bf16_expected);
    let f16_expected: Vec<f32> = F16_CASES.iter().map(|c| c.1).collect();
    assert_bitwise_eq(&ckpt.read_f32("w.f16").unwrap(), &f16_expected);
    assert_eq!(ckpt.read_f32("w.f64").unwrap(), vec![0.5, -1e10]);
    // Reading twice works (pages released after the first read are faulted back in).
    assert_bitwise_eq(&ckpt.read_f32("w.f32").unwrap(), &f32_values);
}

/// Builds a safetensors file by hand whose data section starts at an odd offset, so 2- and
/// 4-byte elements are misaligned in the mapping.
fn misaligned_file(path: &Path, tensors: &[(&str, &str, &[usize], &[u8])]) {
    let mut header = String::from("{");
    let mut offset = 0;
    let mut data = Vec::new();
    for (i, (name, dtype, shape, bytes)) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":{shape:?},\"data_offsets\":[{offset},{}]}}",
            offset + bytes.len()
        ));
        offset += bytes.len();
        data.extend_from_slice(bytes);
    }
    header.push('}');
    if header.len() % 2 == 0 {
        header.push(' '); // 8 + odd length: data starts at an odd address
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(path, file).unwrap();
}

#[test]
fn reads_misaligned_data() {
    let dir = TempDir::new("misaligned");
    let path = dir.path().join("odd.safetensors");
    let f32_values = pseudo_random(5, 3);
    let bf16_bits: Vec<u16> = BF16_CASES.iter().map(|c| c.0).collect();
    let f16_bits: Vec<u16> = F16_CASES.iter().map(|c| c.0).collect();
    let i32_values = [-7i32, 0, 1 << 30];
    let i32_bytes: Vec<u8> = i32_values.iter().flat_map(|v| v.to_le_bytes()).collect();
    // Every multi-byte tensor starts at an odd offset (all byte lengths before it are even);
    // the 1-byte tensor goes last so it does not shift the others back into alignment.
    misaligned_file(
        &path,
        &[
            ("b.bf16", "BF16", &[9], &u16_bytes(&bf16_bits)),
            ("c.f16", "F16", &[8], &u16_bytes(&f16_bits)),
            ("d.f32", "F32", &[5], &f32_bytes(&f32_values)),
            ("e.i32", "I32", &[3], &i32_bytes),
            ("a.u8", "U8", &[1], &[9]),
        ],
    );
    let header_len = u64::from_le_bytes(std::fs::read(&path).unwrap()[..8].try_into().unwrap());
    assert_eq!((8 + header_len) % 2, 1, "data section must start at an odd offset");
    let ckpt = SafetensorsCheckpoint::open_file(&path).unwrap();
    let bf16_expected: Vec<f32> = BF16_CASES.iter().map(|c| c.1).collect();
    let f16_expected: Vec<f32> = F16_CASES.iter().map(|c| c.1).collect();
    assert_bitwise_eq(&ckpt.read_f32("b.bf16").unwrap(), &bf16_expected);
    assert_bitwise_eq(&ckpt.read_f32("c.f16").unwrap(), &f16_expected);
    assert_bitwise_eq(&ckpt.read_f32("d.f32").unwrap(), &f32_values);
    assert_eq!(ckpt.read_i32("e.i32").unwrap(), i32_values);
    assert_eq!(ckpt.read_u8("a.u8").unwrap(), [9]);
}

/// The in-place and byte-wise conversion paths agree, on aligned and misaligned slices.
#[test]
fn conversion_paths_agree() {
    let values = pseudo_random(64, 21);
    let cases: [(StDtype, Vec<u8>); 4] = [
        (StDtype::F32, f32_bytes(&values)),
        (StDtype::BF16, u16_bytes(&values.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect::<Vec<_>>())),
        (StDtype::F16, u16_bytes(&values.iter().map(|&v| half::f16::from_f32(v).to_bits()).collect::<Vec<_>>())),
        (StDtype::I32, (-32..32i32).flat_map(|v| (v * 1000).to_le_bytes()).collect()),
    ];
    for (dtype, bytes) in cases {
        // Same bytes at an 8-aligned and at an odd address.
        let mut aligned_buf = vec![0u64; bytes.len() / 8 + 1];
        let aligned: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut aligned_buf)[..bytes.len()];
        aligned.copy_from_slice(&bytes);
        let mut shifted_buf = vec![0u64; bytes.len() / 8 + 2];
        let shifted: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut shifted_buf)[1..=bytes.len()];
        shifted.copy_from_slice(&bytes);

        let mut fast = vec![0f32; 64];
        let mut slow = vec![0f32; 64];
        super::convert::to_f32(dtype, aligned, &mut fast);
        super::convert::to_f32(dtype, shifted, &mut slow);
        assert_bitwise_eq(&slow, &fast);
        let element = dtype.bitsize() / 8;
        let expected: Vec<f32> = bytes
            .chunks_exact(element)
            .map(|b| match dtype {
                StDtype::F32 => f32::from_le_bytes(b.try_into().unwrap()),
                StDtype::BF16 => f32::from_bits(u32::from(u16::from_le_bytes(b.try_into().unwrap())) << 16),
                StDtype::F16 => half::f16::from_bits(u16::from_le_bytes(b.try_into().unwrap())).to_f32(),
                _ => i32::from_le_bytes(b.try_into().unwrap()) as f32,
            })
            .collect();
        assert_bitwise_eq(&fast, &expected);
    }
    let ints: Vec<u8> = (0..40u8).collect();
    let mut buf = vec![0u64; 6];
    let shifted: &mut [u8] = &mut bytemuck::cast_slice_mut(&mut buf)[3..43];
    shifted.copy_from_slice(&ints);
    let (mut a, mut b) = (vec![0i64; 5], vec![0i64; 5]);
    super::convert::copy_le(&ints, &mut a);
    super::convert::copy_le(shifted, &mut b);
    assert_eq!(a, b);
    assert_eq!(a[0], i64::from_le_bytes([0, 1, 2, 3, 4, 5, 6, 7]));
}

#[test]
fn large_tensor_spans_several_chunks() {
    // 5 MiB of bf16 source bytes: more than one conversion chunk, with a partial last chunk.
    let dir = TempDir::new("large");
    let n = (5 << 20) / 2 + 3;
    // Every bf16 pattern with a finite, non-NaN value, cycling; value known by construction.
    let bits: Vec<u16> = (0..n).map(|i| (i % 0x7F80) as u16).collect();
    write_with_crate(&dir.path().join(SINGLE_FILE), &[tensor("big", StDtype::BF16, &[n], u16_bytes(&bits))], &[]);
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    let values = ckpt.read_f32("big").unwrap();
    assert_eq!(values.len(), n);
    for (i, (&v, &b)) in values.iter().zip(&bits).enumerate() {
        // bf16 is the top half of an f32.
        assert_eq!(v.to_bits(), u32::from(b) << 16, "element {i}");
    }
}

#[test]
fn integer_tensors_and_dtype_mismatch() {
    let dir = TempDir::new("ints");
    let i8_values: Vec<i8> = (-64..64).map(|v| v as i8 * 2).collect();
    let u16_values: Vec<u16> = vec![0, 1, 32768, 65535];
    let i64_values: Vec<i64> = vec![i64::MIN, -1, 0, 151_645];
    write_with_crate(
        &dir.path().join(SINGLE_FILE),
        &[
            tensor("q.weight", StDtype::I8, &[2, 64], i8_values.iter().map(|&v| v as u8).collect()),
            tensor("q.scale1", StDtype::U8, &[3], vec![0, 17, 255]),
            tensor("norm.weight", StDtype::U16, &[4], u16_bytes(&u16_values)),
            tensor("zp", StDtype::I32, &[1], (-32768i32).to_le_bytes().to_vec()),
            tensor("ids", StDtype::I64, &[2, 2], i64_values.iter().flat_map(|v| v.to_le_bytes()).collect()),
            tensor("mask", StDtype::BOOL, &[3], vec![1, 0, 1]),
        ],
        &[],
    );
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.read_i8("q.weight").unwrap(), i8_values);
    assert_eq!(ckpt.read_u8("q.scale1").unwrap(), [0, 17, 255]);
    assert_eq!(ckpt.read_u16("norm.weight").unwrap(), u16_values);
    assert_eq!(ckpt.read_i32("zp").unwrap(), [-32768]);
    assert_eq!(ckpt.read_i64("ids").unwrap(), i64_values);

    // The same tensors widened to f32.
    let expected: Vec<f32> = i8_values.iter().map(|&v| f32::from(v)).collect();
    assert_eq!(ckpt.read_f32("q.weight").unwrap(), expected);
    assert_eq!(ckpt.read_f32("q.scale1").unwrap(), [0.0, 17.0, 255.0]);
    assert_eq!(ckpt.read_f32("norm.weight").unwrap(), [0.0, 1.0, 32768.0, 65535.0]);
    assert_eq!(ckpt.read_f32("zp").unwrap(), [-32768.0]);
    assert_eq!(ckpt.read_f32("ids").unwrap(), [i64::MIN as f32, -1.0, 0.0, 151_645.0]);
    assert_eq!(ckpt.read_f32("mask").unwrap(), [1.0, 0.0, 1.0]);

    let err = ckpt.read_i8("q.scale1").unwrap_err();
    assert!(matches!(&err, CheckpointError::DtypeMismatch { expected, found: StDtype::U8, .. } if expected == "I8"));
    let msg = err.to_string();
    assert!(msg.contains("'q.scale1'") && msg.contains("expected dtype I8, found U8"), "{msg}");
    assert!(msg.contains(SINGLE_FILE), "{msg}");
    let msg = ckpt.read_i32("ids").unwrap_err().to_string();
    assert!(msg.contains("expected dtype I32, found I64"), "{msg}");
}

#[test]
fn unconvertible_dtype_is_an_error() {
    let dir = TempDir::new("fp8");
    write_with_crate(&dir.path().join(SINGLE_FILE), &[tensor("w", StDtype::F8_E4M3, &[4], vec![0x38; 4])], &[]);
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    let err = ckpt.read_f32("w").unwrap_err();
    assert!(matches!(err, CheckpointError::UnsupportedDtype { dtype: StDtype::F8_E4M3, .. }));
    assert!(err.to_string().contains("cannot be converted to f32"), "{err}");
    assert_eq!(ckpt.unused_keys(), vec!["w"], "a failed read must not mark the key used");
}

fn write_sharded(dir: &Path) -> (Vec<f32>, Vec<f32>) {
    let a = pseudo_random(32, 1);
    let b = pseudo_random(16, 2);
    write_with_crate(
        &dir.join("model-00001-of-00002.safetensors"),
        &[
            tensor("model.embed_tokens.weight", StDtype::F32, &[4, 8], f32_bytes(&a)),
            tensor("model.norm.weight", StDtype::F32, &[2], f32_bytes(&[1.0, 2.0])),
        ],
        &[("format", "pt")],
    );
    write_with_crate(
        &dir.join("model-00002-of-00002.safetensors"),
        &[tensor("lm_head.weight", StDtype::F32, &[2, 8], f32_bytes(&b))],
        &[("format", "pt")],
    );
    let index = r#"{
      "metadata": {"total_size": 200},
      "weight_map": {
        "lm_head.weight": "model-00002-of-00002.safetensors",
        "model.embed_tokens.weight": "model-00001-of-00002.safetensors",
        "model.norm.weight": "model-00001-of-00002.safetensors"
      }
    }"#;
    std::fs::write(dir.join(SHARD_INDEX), index).unwrap();
    (a, b)
}

#[test]
fn sharded_checkpoint() {
    let dir = TempDir::new("sharded");
    let (a, b) = write_sharded(dir.path());
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.files().count(), 2);
    assert_eq!(ckpt.keys(), vec!["lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"]);
    assert_eq!(ckpt.read_f32("model.embed_tokens.weight").unwrap(), a);
    assert_eq!(ckpt.read_f32("lm_head.weight").unwrap(), b);
    assert_eq!(ckpt.info("lm_head.weight").unwrap().1, &[2, 8]);
    assert_eq!(ckpt.metadata().get("format").map(String::as_str), Some("pt"));
    assert_eq!(ckpt.unused_keys(), vec!["model.norm.weight"]);
}

#[test]
fn sharded_index_errors() {
    let dir = TempDir::new("sharded-bad");
    write_sharded(dir.path());
    let index = dir.path().join(SHARD_INDEX);

    // The index points a key at the wrong shard.
    let text = std::fs::read_to_string(&index).unwrap();
    std::fs::write(
        &index,
        text.replace(
            "\"lm_head.weight\": \"model-00002-of-00002.safetensors\"",
            "\"lm_head.weight\": \"model-00001-of-00002.safetensors\"",
        ),
    )
    .unwrap();
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(&err, CheckpointError::ShardMissingTensor { key, .. } if key == "lm_head.weight"), "{err}");
    assert!(err.to_string().contains("model-00001-of-00002.safetensors"), "{err}");

    // A listed shard file is missing.
    std::fs::write(&index, text.replace("model-00002-of-00002", "model-00003-of-00003")).unwrap();
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
    assert!(err.to_string().contains("model-00003-of-00003.safetensors"), "{err}");

    // Shard names may not leave the directory.
    std::fs::write(&index, text.replace("model-00002-of-00002", "../elsewhere")).unwrap();
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::BadIndex { .. }), "{err}");

    std::fs::write(&index, r#"{"metadata": {}}"#).unwrap();
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(err.to_string().contains("missing field `weight_map`"), "{err}");
    assert!(err.to_string().contains(SHARD_INDEX), "{err}");

    // The same tensor stored in two shards.
    std::fs::write(&index, &text).unwrap();
    write_with_crate(
        &dir.path().join("model-00002-of-00002.safetensors"),
        &[
            tensor("lm_head.weight", StDtype::F32, &[1], f32_bytes(&[0.0])),
            tensor("model.norm.weight", StDtype::F32, &[1], f32_bytes(&[0.0])),
        ],
        &[],
    );
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(&err, CheckpointError::DuplicateTensor { key, .. } if key == "model.norm.weight"), "{err}");
}

#[test]
fn missing_directory_and_empty_directory() {
    let dir = TempDir::new("empty");
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::NotFound { .. }), "{err}");
    assert!(err.to_string().contains("model.safetensors.index.json"), "{err}");
    let err = SafetensorsCheckpoint::open(dir.path().join("nope")).unwrap_err();
    assert!(matches!(err, CheckpointError::Io { .. }), "{err}");
}

#[test]
fn missing_key_suggests_near_matches() {
    let dir = TempDir::new("near");
    let names = [
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "model.embed_tokens.weight",
    ];
    let tensors: Vec<Tensor> = names.iter().map(|&n| tensor(n, StDtype::F32, &[1], f32_bytes(&[0.0]))).collect();
    write_with_crate(&dir.path().join(SINGLE_FILE), &tensors, &[]);
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();

    let err = ckpt
        .read_f32("model.layers.0.self_attn.q_proj.weigth")
        .unwrap_err()
        .requested_by("model.layers.0.self_attn.q_proj");
    let CheckpointError::MissingTensor { key, requested_by, near, checkpoint } = &err else {
        panic!("expected MissingTensor, got {err}");
    };
    assert_eq!(key, "model.layers.0.self_attn.q_proj.weigth");
    assert_eq!(requested_by, "model.layers.0.self_attn.q_proj");
    assert_eq!(checkpoint, dir.path());
    // Distances 2, 3, 3 (ties by name); the mlp and embedding keys are further away.
    assert_eq!(
        near,
        &[
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.weight",
            "model.layers.1.self_attn.q_proj.weight",
        ]
    );
    let msg = err.to_string();
    assert!(msg.contains("(requested by model.layers.0.self_attn.q_proj)"), "{msg}");
    assert!(msg.contains("similar keys: model.layers.0.self_attn.q_proj.weight"), "{msg}");

    let err = ckpt.info("lm_head.weight").unwrap_err();
    assert!(matches!(&err, CheckpointError::MissingTensor { near, .. } if near.is_empty()), "{err}");
    assert!(err.to_string().ends_with("no similar keys"), "{err}");
    assert!(ckpt.mark_used("nothing").is_err());
}

#[test]
fn truncated_file_is_reported() {
    let dir = TempDir::new("truncated");
    let path = dir.path().join(SINGLE_FILE);
    write_with_crate(&path, &[tensor("w", StDtype::F32, &[64], f32_bytes(&pseudo_random(64, 5)))], &[]);
    let full = std::fs::read(&path).unwrap();
    std::fs::write(&path, &full[..full.len() - 10]).unwrap();
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(path.to_str().unwrap()), "{msg}");
    assert!(msg.contains("truncated") && msg.contains("need 256 data bytes, the file has 246"), "{msg}");

    // Cut inside the header.
    std::fs::write(&path, &full[..20]).unwrap();
    let msg = SafetensorsCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("runs past the end of the 20-byte file"), "{msg}");

    std::fs::write(&path, &full[..3]).unwrap();
    let msg = SafetensorsCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("shorter than the 8-byte header length prefix"), "{msg}");

    std::fs::write(&path, []).unwrap();
    assert!(matches!(SafetensorsCheckpoint::open(dir.path()).unwrap_err(), CheckpointError::Corrupt { .. }));

    // Trailing garbage is reported too.
    let mut padded = full.clone();
    padded.extend_from_slice(&[0; 4]);
    std::fs::write(&path, padded).unwrap();
    let msg = SafetensorsCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("4 bytes after the last tensor"), "{msg}");
}

#[test]
fn corrupt_header_is_reported() {
    let dir = TempDir::new("corrupt");
    let path = dir.path().join(SINGLE_FILE);
    write_with_crate(&path, &[tensor("w", StDtype::F32, &[2], f32_bytes(&[1.0, 2.0]))], &[]);
    let full = std::fs::read(&path).unwrap();

    let mut garbled = full.clone();
    garbled[8] = b'[';
    std::fs::write(&path, &garbled).unwrap();
    let err = SafetensorsCheckpoint::open(dir.path()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CheckpointError::Corrupt { .. }), "{msg}");
    assert!(msg.contains(path.to_str().unwrap()) && msg.contains("not valid safetensors JSON"), "{msg}");

    let mut not_utf8 = full.clone();
    not_utf8[9] = 0xFF;
    std::fs::write(&path, &not_utf8).unwrap();
    let msg = SafetensorsCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("not UTF-8"), "{msg}");

    let mut huge = full.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&path, &huge).unwrap();
    let msg = SafetensorsCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("exceeds the 100 MB safetensors limit"), "{msg}");

    // A header whose offsets disagree with the shape.
    let header = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    let mut bad = (header.len() as u64).to_le_bytes().to_vec();
    bad.extend_from_slice(header.as_bytes());
    bad.extend_from_slice(&[0; 8]);
    std::fs::write(&path, &bad).unwrap();
    let msg = SafetensorsCheckpoint::open(dir.path()).unwrap_err().to_string();
    assert!(msg.contains("does not match its shape and dtype"), "{msg}");
}

#[test]
fn usage_tracking() {
    let dir = TempDir::new("usage");
    write_with_crate(
        &dir.path().join(SINGLE_FILE),
        &[
            tensor("a", StDtype::F32, &[1], f32_bytes(&[1.0])),
            tensor("b", StDtype::I32, &[1], 5i32.to_le_bytes().to_vec()),
            tensor("c", StDtype::F32, &[1], f32_bytes(&[3.0])),
            tensor("d", StDtype::U8, &[1], vec![4]),
        ],
        &[],
    );
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.unused_keys(), vec!["a", "b", "c", "d"]);
    ckpt.read_f32("c").unwrap();
    ckpt.info("a").unwrap(); // looking is not using
    assert!(ckpt.read_f32("b").is_ok());
    assert!(ckpt.read_i8("d").is_err()); // failed reads do not count
    assert_eq!(ckpt.unused_keys(), vec!["a", "d"]);
    ckpt.mark_used("a").unwrap();
    assert_eq!(ckpt.unused_keys(), vec!["d"]);
}

/// The layout of mllm's quantized export (see the pymllm oracle's README), rebuilt in miniature:
/// int8 conv-style weights, u8 block scales, f32 per-channel scales, u16 norms and RoPE tables,
/// i32 zero points, 0-d f32 observer values, u8 flags, and save_model's shared-tensor aliases.
#[test]
fn mllm_quantized_layout() {
    let dir = TempDir::new("pymllm");
    let weight: Vec<i8> = (0..32 * 16).map(|i| ((i % 15) as i8) - 7).collect();
    let scale1: Vec<u8> = (0..32).map(|i| (i * 7 % 256) as u8).collect();
    let scale2 = pseudo_random(16, 11);
    let norm: Vec<u16> = (0..32).map(|i| 40_000 + i * 3).collect();
    let cos: Vec<u16> = (0..1024 * 8).map(|i| (i * 13 % 65_536) as u16).collect();
    write_with_crate(
        &dir.path().join(SINGLE_FILE),
        &[
            tensor(
                "model.layers.0.self_attn.k_proj.weight",
                StDtype::I8,
                &[1, 1, 32, 16],
                weight.iter().map(|&v| v as u8).collect(),
            ),
            tensor("model.layers.0.self_attn.k_proj.scale1", StDtype::U8, &[32], scale1.clone()),
            tensor("model.layers.0.self_attn.k_proj.scale2", StDtype::F32, &[16], f32_bytes(&scale2)),
            tensor("model.layers.0.input_layernorm.weight", StDtype::U16, &[32], u16_bytes(&norm)),
            tensor("model.mllm_max_cos_embedding", StDtype::U16, &[1, 1024, 8], u16_bytes(&cos)),
            tensor("model.embed_tokens.zero_point", StDtype::I32, &[1], 32768i32.to_le_bytes().to_vec()),
            tensor(
                "model.layers.0.self_attn.k_norm_output_qdq.fake_quant.activation_post_process.min_val",
                StDtype::F32,
                &[],
                f32_bytes(&[-3.5]),
            ),
            tensor("lm_head_input_qdq.fake_quant.fake_quant_enabled", StDtype::U8, &[1], vec![1]),
        ],
        &[
            (
                "model.layers.0.self_attn.k_rope_concat_observer.min_val",
                "model.layers.0.self_attn.k_norm_output_qdq.fake_quant.activation_post_process.min_val",
            ),
            ("format", "pt"),
        ],
    );
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    assert_eq!(ckpt.keys().len(), 8);
    assert_eq!(ckpt.read_i8("model.layers.0.self_attn.k_proj.weight").unwrap(), weight);
    assert_eq!(ckpt.info("model.layers.0.self_attn.k_proj.weight").unwrap(), (StDtype::I8, &[1usize, 1, 32, 16][..]));
    assert_eq!(ckpt.read_u8("model.layers.0.self_attn.k_proj.scale1").unwrap(), scale1);
    assert_eq!(ckpt.read_f32("model.layers.0.self_attn.k_proj.scale2").unwrap(), scale2);
    assert_eq!(ckpt.read_u16("model.layers.0.input_layernorm.weight").unwrap(), norm);
    assert_eq!(ckpt.read_u16("model.mllm_max_cos_embedding").unwrap(), cos);
    assert_eq!(ckpt.read_i32("model.embed_tokens.zero_point").unwrap(), [32768]);

    // A 0-d tensor reached through its save_model alias: one element, empty shape.
    let alias = "model.layers.0.self_attn.k_rope_concat_observer.min_val";
    assert!(ckpt.contains(alias));
    assert_eq!(ckpt.info(alias).unwrap(), (StDtype::F32, &[][..]));
    assert_eq!(ckpt.read_f32(alias).unwrap(), [-3.5]);
    assert!(!ckpt.keys().contains(&alias), "aliases are not stored tensors");
    // Reading through the alias consumed the stored tensor; "format" is plain metadata.
    assert_eq!(ckpt.unused_keys(), vec!["lm_head_input_qdq.fake_quant.fake_quant_enabled"]);
    assert!(!ckpt.contains("format"));
    assert_eq!(ckpt.metadata().get("format").map(String::as_str), Some("pt"));
}

#[test]
fn checkpoint_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SafetensorsCheckpoint>();
    assert_send_sync::<CheckpointError>();
}

#[test]
fn atomic_writer_round_trip() {
    let dir = TempDir::new("writer");
    let path = dir.path().join("out.safetensors");
    let f32_values = pseudo_random(12, 9);
    let f32_raw = f32_bytes(&f32_values);
    let bf16_raw = u16_bytes(&[0x3F80, 0xC000]);
    let i8_raw = vec![0xFF, 0x01, 0x80];
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(
        &path,
        &[
            ("w", StDtype::F32, &[3, 4], &f32_raw),
            ("b", StDtype::BF16, &[2], &bf16_raw),
            ("q", StDtype::I8, &[3], &i8_raw),
        ],
        &metadata,
    )
    .unwrap();
    assert!(!dir.path().join("out.safetensors.tmp").exists());

    // Read back with the safetensors crate itself...
    let bytes = std::fs::read(&path).unwrap();
    let parsed = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(parsed.tensor("w").unwrap().data(), &f32_raw[..]);
    assert_eq!(parsed.tensor("q").unwrap().shape(), &[3]);
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    assert_eq!(header.metadata().as_ref().unwrap()["format"], "pt");
    // ...and with our reader.
    let ckpt = SafetensorsCheckpoint::open_file(&path).unwrap();
    assert_eq!(ckpt.read_f32("w").unwrap(), f32_values);
    assert_eq!(ckpt.read_f32("b").unwrap(), [1.0, -2.0]);
    assert_eq!(ckpt.read_i8("q").unwrap(), [-1, 1, -128]);
    drop(ckpt);

    // Byte-identical to what the safetensors crate itself produces for the same tensors.
    let views = [
        ("w", TensorView::new(StDtype::F32, vec![3, 4], &f32_raw).unwrap()),
        ("b", TensorView::new(StDtype::BF16, vec![2], &bf16_raw).unwrap()),
        ("q", TensorView::new(StDtype::I8, vec![3], &i8_raw).unwrap()),
    ];
    let reference =
        safetensors::serialize(views, Some(HashMap::from([("format".to_string(), "pt".to_string())]))).unwrap();
    assert_eq!(bytes, reference);

    // A normal file, not a private temp file (mode follows the umask, which never removes
    // the owner's read/write bits nor grants anything beyond 0666).
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let probe = dir.path().join("probe");
        std::fs::write(&probe, b"").unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), mode(&probe));
        std::fs::remove_file(&probe).unwrap();
    }

    // Overwriting replaces the file; no metadata means no __metadata__ entry.
    write_safetensors_atomic(&path, &[("only", StDtype::U8, &[2], &[1, 2])], &BTreeMap::new()).unwrap();
    let ckpt = SafetensorsCheckpoint::open_file(&path).unwrap();
    assert_eq!(ckpt.keys(), vec!["only"]);
    assert!(ckpt.metadata().is_empty());
}

#[test]
fn atomic_writer_rejects_bad_input_and_keeps_old_file() {
    let dir = TempDir::new("writer-bad");
    let path = dir.path().join("out.safetensors");
    write_safetensors_atomic(&path, &[("keep", StDtype::U8, &[1], &[7])], &BTreeMap::new()).unwrap();

    let err =
        write_safetensors_atomic(&path, &[("w", StDtype::F32, &[2, 2], &[0u8; 12])], &BTreeMap::new()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("'w'") && msg.contains("needs 16 bytes, 12 given"), "{msg}");
    assert!(msg.contains("out.safetensors"), "{msg}");

    let err = write_safetensors_atomic(
        &path,
        &[("w", StDtype::U8, &[1], &[0]), ("w", StDtype::U8, &[1], &[1])],
        &BTreeMap::new(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("given twice"), "{err}");

    // Writing into a directory that does not exist fails without leaving anything behind.
    let missing = dir.path().join("no-such-dir").join("x.safetensors");
    assert!(write_safetensors_atomic(&missing, &[("w", StDtype::U8, &[1], &[0])], &BTreeMap::new()).is_err());

    let ckpt = SafetensorsCheckpoint::open_file(&path).unwrap();
    assert_eq!(ckpt.read_u8("keep").unwrap(), [7]);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("out.safetensors")]);
}

#[test]
fn float_params_refuse_integer_dtypes_and_non_finite_values() {
    let dir = TempDir::new("float-params");
    let f64_huge = 1e300f64.to_le_bytes().to_vec();
    write_with_crate(
        &dir.path().join(SINGLE_FILE),
        &[
            tensor("i64.weight", StDtype::I64, &[1], 7i64.to_le_bytes().to_vec()),
            tensor("i32.weight", StDtype::I32, &[1], 7i32.to_le_bytes().to_vec()),
            tensor("i16.weight", StDtype::I16, &[1], 7i16.to_le_bytes().to_vec()),
            tensor("u8.weight", StDtype::U8, &[1], vec![7]),
            tensor("bool.weight", StDtype::BOOL, &[1], vec![1]),
            tensor(
                "inf.scale",
                StDtype::F32,
                &[2],
                [1.0f32, f32::INFINITY].iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            tensor("nan.bf16", StDtype::BF16, &[1], u16_bytes(&[0x7FC0])),
            tensor("huge.f64", StDtype::F64, &[1], f64_huge),
            tensor("ok.f16", StDtype::F16, &[1], u16_bytes(&[0x3C00])),
        ],
        &[],
    );
    let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
    for (key, dtype) in [
        ("i64.weight", StDtype::I64),
        ("i32.weight", StDtype::I32),
        ("i16.weight", StDtype::I16),
        ("u8.weight", StDtype::U8),
        ("bool.weight", StDtype::BOOL),
    ] {
        let err = ckpt.read_float_param(key).unwrap_err();
        assert!(matches!(&err, CheckpointError::DtypeMismatch { found, .. } if *found == dtype), "{err}");
        let msg = err.to_string();
        assert!(msg.contains(key) && msg.contains("a float dtype") && msg.contains(SINGLE_FILE), "{msg}");
    }
    for (key, index) in [("inf.scale", 1), ("nan.bf16", 0), ("huge.f64", 0)] {
        let err = ckpt.read_float_param(key).unwrap_err();
        assert!(matches!(&err, CheckpointError::NonFinite { index: i, .. } if *i == index), "{key}: {err}");
        assert!(err.to_string().contains(key) && err.to_string().contains("must be finite"), "{err}");
    }
    assert_eq!(ckpt.read_float_param("ok.f16").unwrap(), [1.0]);
}
