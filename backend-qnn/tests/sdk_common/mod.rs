//! A small two-graph model (prefill `model.0.s32`, decode `model.0.s1`) shaped like one Qwen3
//! block fragment: RmsNorm then an LPBQ 1x1 Conv2d, sharing their weights between graphs.

#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use backend_qnn::encoding::{BlockScales, BlockwiseExpansion};
use backend_qnn::graph::QNN_OP_PACKAGE;
use backend_qnn::{
    DataType, Encoding, Int4Storage, OpType, Param, QnnGraph, QnnNode, QnnTensor, Scalar, ScaleOffset, StaticData,
    TensorType,
};

pub const HIDDEN: u32 = 64;
pub const OUT: u32 = 32;
pub const BLOCK: u32 = 16;

fn act(name: &str, tensor_type: TensorType, seq: u32, width: u32, scale: f32) -> QnnTensor {
    QnnTensor {
        name: name.into(),
        tensor_type,
        dtype: DataType::UFixedPoint16,
        dims: vec![1, 1, seq, width],
        encoding: Encoding::ScaleOffset(ScaleOffset { scale, offset: -32768 }),
        data: None,
    }
}

fn u32_param(node: &str, param: &str, dims: &[u32], values: &[u32]) -> (String, Param) {
    let name = format!("{node}.{param}");
    let data = StaticData::from_u32(values);
    (param.into(), Param::Tensor(QnnTensor::new_static(name, DataType::UInt32, dims, Encoding::Undefined, data)))
}

/// The norm weight, the fake zero bias and the LPBQ projection weight.
pub fn shared_weights() -> Vec<QnnTensor> {
    let gamma: Vec<u8> = (0..HIDDEN).flat_map(|i| (40_000u16 + 7 * i as u16).to_le_bytes()).collect();
    let channels = OUT as usize;
    let blocks = (HIDDEN / BLOCK) as usize;
    let weight: Vec<u8> = (0..(HIDDEN * OUT) as i32).map(|i| ((i * 5 % 15) - 7) as i8 as u8).collect();
    vec![
        QnnTensor {
            name: "model.norm.weight".into(),
            tensor_type: TensorType::Static,
            dtype: DataType::UFixedPoint16,
            dims: vec![HIDDEN],
            encoding: Encoding::ScaleOffset(ScaleOffset { scale: 1.0 / 65535.0, offset: 0 }),
            data: Some(StaticData::new(gamma)),
        },
        QnnTensor {
            name: "model.norm_runtime_bias".into(),
            tensor_type: TensorType::Static,
            dtype: DataType::UFixedPoint16,
            dims: vec![HIDDEN],
            encoding: Encoding::ScaleOffset(ScaleOffset { scale: 0.002, offset: 0 }),
            data: Some(StaticData::new(vec![0u8; 2 * HIDDEN as usize])),
        },
        QnnTensor {
            name: "model.proj.weight".into(),
            tensor_type: TensorType::Static,
            dtype: DataType::SFixedPoint8,
            dims: vec![1, 1, HIDDEN, OUT],
            encoding: Encoding::BlockwiseExpansion(BlockwiseExpansion {
                axis: 3,
                scale_offsets: (0..channels)
                    .map(|c| ScaleOffset { scale: 0.001 * (c + 1) as f32, offset: 0 })
                    .collect(),
                num_blocks_per_axis: HIDDEN / BLOCK,
                block_scale_bitwidth: 4,
                block_scales: BlockScales::U8((0..channels * blocks).map(|i| (i % 16 + 1) as u8).collect()),
            }),
            data: Some(StaticData::new(weight)),
        },
    ]
}

/// `model.0.s{seq}`: x -> RmsNorm -> h -> Conv2d(LPBQ) -> y.
pub fn toy_graph(seq: u32, weights: &[QnnTensor]) -> QnnGraph {
    let mut tensors = vec![
        act("x", TensorType::AppWrite, seq, HIDDEN, 0.001),
        act("h", TensorType::Native, seq, HIDDEN, 0.002),
        act("y", TensorType::AppRead, seq, OUT, 0.004),
    ];
    tensors.extend(weights.iter().cloned());
    let norm = QnnNode {
        name: "model.norm".into(),
        package: QNN_OP_PACKAGE.into(),
        op_type: OpType::RmsNorm,
        params: vec![
            ("epsilon".into(), Param::Scalar(Scalar::Float32(1e-6))),
            u32_param("model.norm", "axes", &[1], &[3]),
        ],
        inputs: vec!["x".into(), "model.norm.weight".into(), "model.norm_runtime_bias".into()],
        outputs: vec!["h".into()],
    };
    let proj = QnnNode {
        name: "model.proj".into(),
        package: QNN_OP_PACKAGE.into(),
        op_type: OpType::Conv2d,
        params: vec![
            u32_param("model.proj", "stride", &[2], &[1, 1]),
            u32_param("model.proj", "pad_amount", &[2, 2], &[0, 0, 0, 0]),
            u32_param("model.proj", "dilation", &[2], &[1, 1]),
            ("group".into(), Param::Scalar(Scalar::UInt32(1))),
        ],
        inputs: vec!["h".into(), "model.proj.weight".into()],
        outputs: vec!["y".into()],
    };
    QnnGraph {
        name: format!("model.0.s{seq}"),
        tensors,
        inputs: vec!["x".into()],
        outputs: vec!["y".into()],
        nodes: vec![norm, proj],
        int4_storage: Int4Storage::default(),
    }
}

/// Prefill then decode, sharing one set of weights.
pub fn toy_model() -> Vec<QnnGraph> {
    let weights = shared_weights();
    vec![toy_graph(32, &weights), toy_graph(1, &weights)]
}

/// Static bytes that count themselves in `live` and are overwritten (0xA5) when dropped, so a
/// backend reading them after the driver released them computes with poison (or faults).
pub struct PoisonOnDrop {
    bytes: Vec<u8>,
    live: &'static AtomicUsize,
}

impl AsRef<[u8]> for PoisonOnDrop {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Drop for PoisonOnDrop {
    fn drop(&mut self) {
        self.bytes.fill(0xA5);
        std::hint::black_box(&self.bytes);
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `graphs` with each distinct static buffer copied once into a [`PoisonOnDrop`] counted in
/// `live` (buffers shared between graphs stay shared), the copies held by nothing else.
pub fn poisoned_copies(graphs: &[QnnGraph], live: &'static AtomicUsize) -> Vec<QnnGraph> {
    let mut copies: Vec<(StaticData, StaticData)> = Vec::new();
    let mut graphs = graphs.to_vec();
    for t in graphs.iter_mut().flat_map(QnnGraph::tensors_and_params_mut) {
        let Some(data) = &t.data else { continue };
        let copy = match copies.iter().find(|(original, _)| original.shares_buffer_with(data)) {
            Some((_, copy)) => copy.clone(),
            None => {
                live.fetch_add(1, Ordering::SeqCst);
                let copy = StaticData::new(PoisonOnDrop { bytes: data.bytes().to_vec(), live });
                copies.push((data.clone(), copy.clone()));
                copy
            }
        };
        t.data = Some(copy);
    }
    graphs
}
