//! Fuzz target over the safetensors reader (issue #14): a mutated file must open with an error
//! or open and then read every tensor (as its dtype, as f32, as a float parameter) with values
//! or errors, never a panic or an unbounded allocation. Duration: `MLLM_FUZZ_SECONDS` (see
//! `mllm_dsl::fuzz`).

use std::collections::BTreeMap;

use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};

fn seed(dir: &std::path::Path, name: &str, tensors: &[(&str, StDtype, &[usize], Vec<u8>)]) -> Vec<u8> {
    let path = dir.join(name);
    let views: Vec<_> = tensors.iter().map(|(n, d, s, b)| (*n, *d, *s, b.as_slice())).collect();
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(&path, &views, &metadata).unwrap();
    std::fs::read(&path).unwrap()
}

#[test]
fn fuzz_safetensors_header() {
    let dir = tempfile::tempdir().unwrap();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let seeds = vec![
        seed(
            dir.path(),
            "a",
            &[
                ("model.embed_tokens.weight", StDtype::F32, &[2, 3], f32s(&[1.0, -2.0, 0.5, 3.0, 0.0, 1e-3])),
                ("model.norm.weight", StDtype::BF16, &[2], vec![0x80, 0x3f, 0x00, 0xc0]),
                ("model.layers.0.mlp.up_proj.weight", StDtype::I8, &[1, 1, 2, 2], vec![1, 0xff, 7, 8]),
                ("model.layers.0.mlp.up_proj.scale2", StDtype::F32, &[2], f32s(&[0.5, 0.25])),
                ("zp", StDtype::I64, &[1], 7i64.to_le_bytes().to_vec()),
            ],
        ),
        seed(dir.path(), "b", &[("w", StDtype::F16, &[4], vec![0, 0x3c, 0, 0xbc, 0, 0x7c, 0xff, 0x7f])]),
        seed(dir.path(), "c", &[("mask", StDtype::BOOL, &[3], vec![1, 0, 1]), ("s", StDtype::U16, &[1], vec![1, 2])]),
    ];
    let file = dir.path().join("fuzz.safetensors");
    let runs = mllm_dsl::fuzz::run("safetensors_header", &seeds, |bytes| {
        std::fs::write(&file, bytes).unwrap();
        let Ok(ckpt) = SafetensorsCheckpoint::open_file(&file) else { return };
        for key in ckpt.keys() {
            let (_, shape) = ckpt.info(key).unwrap();
            let _ = shape.iter().product::<usize>();
            let _ = ckpt.read_bytes(key);
            let _ = ckpt.read_f32(key);
            if let Ok(values) = ckpt.read_float_param(key) {
                assert!(values.iter().all(|v| v.is_finite()), "{key}: read_float_param let a non-finite value through");
            }
            let _ = ckpt.read_i8(key);
        }
    });
    assert!(runs >= 3);
}
