//! What the SDK layer checks on a [`QnnTensor`] before it reaches the QNN API: names, dims, the
//! static-data contract and quantization-encoding array lengths, so that QNN never reads past a
//! buffer, plus scale values.

use thiserror::Error;

use crate::dtype::{DataType, TensorType};
use crate::encoding::{BlockScales, Encoding};
use crate::graph::{QnnTensor, StaticData};

impl QnnTensor {
    /// Checks everything the C side would otherwise read out of bounds or reject late:
    /// names, dims, the static-data contract, encoding array lengths ([`Self::check_layout`])
    /// and that every scale is finite and > 0.
    pub fn check(&self) -> Result<(), TensorError> {
        self.check_layout()?;
        let scales = match &self.encoding {
            Encoding::Undefined => return Ok(()),
            Encoding::ScaleOffset(so) => std::slice::from_ref(so),
            Encoding::AxisScaleOffset { scale_offsets, .. } => &scale_offsets[..],
            Encoding::BlockwiseExpansion(bw) => &bw.scale_offsets[..],
        };
        match scales.iter().find(|so| !(so.scale.is_finite() && so.scale > 0.0)) {
            Some(so) => Err(self.error(TensorProblem::BadScale { scale: so.scale })),
            None => Ok(()),
        }
    }

    /// What the FFI needs before building the C structs, so that QNN never reads past a buffer:
    /// names, dims, the static-data contract and encoding array lengths. Values inside the
    /// encodings (scales) are the backend's to judge.
    pub fn check_layout(&self) -> Result<(), TensorError> {
        check_c_name(&self.name).map_err(|e| self.error(TensorProblem::Name(e)))?;
        if self.dims.contains(&0) {
            return Err(self.error(TensorProblem::ZeroExtent { dims: self.dims.clone() }));
        }
        match (&self.tensor_type, &self.data) {
            (TensorType::Static, None) => return Err(self.error(TensorProblem::StaticWithoutData)),
            (TensorType::Static, Some(data)) => self.check_data_len(data).map_err(|p| self.error(p))?,
            (&tensor_type, Some(_)) => return Err(self.error(TensorProblem::DataOnNonStatic { tensor_type })),
            (_, None) => {}
        }
        self.check_encoding().map_err(|p| self.error(p))
    }

    fn error(&self, problem: TensorProblem) -> TensorError {
        TensorError { tensor: self.name.clone(), problem }
    }

    fn check_data_len(&self, data: &StaticData) -> Result<(), TensorProblem> {
        let numel = self.numel();
        let got = data.len() as u64;
        let bits = u64::from(self.dtype.bit_width());
        let dtype = self.dtype;
        if bits == 0 {
            return Err(TensorProblem::NoDataLayout { dtype });
        }
        // The header calls 4-bit types "tightly packed"; mllm stores one nibble per byte.
        // Both layouts occur in practice, so accept either until the SDK settles it.
        let expected = if bits == 4 { vec![numel.div_ceil(2), numel] } else { vec![numel * bits / 8] };
        if !expected.contains(&got) {
            return Err(TensorProblem::DataLength { dtype, dims: self.dims.clone(), got, expected });
        }
        if got > u64::from(u32::MAX) {
            return Err(TensorProblem::DataTooLarge { bytes: got });
        }
        Ok(())
    }

    fn check_encoding(&self) -> Result<(), TensorProblem> {
        let (fixed, dtype) = (self.dtype.is_fixed_point(), self.dtype);
        let count = |what: &'static str, axis: u32, got: usize, expected: u64| {
            if got as u64 == expected {
                Ok(())
            } else {
                Err(TensorProblem::EncodingLength { what, axis, got: got as u64, expected })
            }
        };
        match &self.encoding {
            Encoding::Undefined if fixed => Err(TensorProblem::MissingEncoding { dtype }),
            Encoding::Undefined => Ok(()),
            _ if !fixed => Err(TensorProblem::UnexpectedEncoding { dtype }),
            Encoding::ScaleOffset(_) => Ok(()),
            Encoding::AxisScaleOffset { axis, scale_offsets } => {
                count("axisScaleOffset entries", *axis, scale_offsets.len(), self.axis_extent(*axis)?)
            }
            Encoding::BlockwiseExpansion(bw) => {
                let channels = self.axis_extent(bw.axis)?;
                count("blockwiseExpansion per-channel scales", bw.axis, bw.scale_offsets.len(), channels)?;
                if bw.num_blocks_per_axis == 0 {
                    return Err(TensorProblem::ZeroBlocks);
                }
                if let BlockScales::U16(_) = bw.block_scales {
                    return Err(TensorProblem::SixteenBitBlockScales);
                }
                if !(1..=8).contains(&bw.block_scale_bitwidth) {
                    return Err(TensorProblem::BlockScaleBitwidth { bits: bw.block_scale_bitwidth });
                }
                let (got, blocks) = (bw.block_scales.len() as u64, bw.num_blocks_per_axis);
                if got != channels * u64::from(blocks) {
                    return Err(TensorProblem::BlockScaleCount { got, axis: bw.axis, channels, blocks });
                }
                Ok(())
            }
        }
    }

    fn axis_extent(&self, axis: u32) -> Result<u64, TensorProblem> {
        let rank = self.dims.len();
        self.dims.get(axis as usize).map(|&d| u64::from(d)).ok_or(TensorProblem::AxisOutOfRange { axis, rank })
    }
}

/// Why a name cannot travel to C as a NUL-terminated string.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum NameError {
    #[error("name is empty")]
    Empty,
    #[error("name {name:?} contains a NUL byte")]
    Nul { name: String },
}

/// Names travel to C as NUL-terminated strings.
pub(crate) fn check_c_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        Err(NameError::Empty)
    } else if name.contains('\0') {
        Err(NameError::Nul { name: name.to_string() })
    } else {
        Ok(())
    }
}

/// What is wrong with a tensor.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum TensorProblem {
    #[error(transparent)]
    Name(#[from] NameError),
    #[error("dims {dims:?} contain a zero extent")]
    ZeroExtent { dims: Vec<u32> },
    #[error("STATIC tensor has no data")]
    StaticWithoutData,
    #[error("{tensor_type} tensor must not carry data")]
    DataOnNonStatic { tensor_type: TensorType },
    #[error("{dtype} cannot hold tensor data")]
    NoDataLayout { dtype: DataType },
    #[error("{dtype} data has {got} bytes, expected {} for dims {dims:?}", expected_bytes(expected))]
    DataLength { dtype: DataType, dims: Vec<u32>, got: u64, expected: Vec<u64> },
    #[error("data has {bytes} bytes; QNN client buffers hold at most 4 GiB")]
    DataTooLarge { bytes: u64 },
    #[error("{dtype} tensor needs a quantization encoding")]
    MissingEncoding { dtype: DataType },
    #[error("{dtype} tensor must not carry a quantization encoding")]
    UnexpectedEncoding { dtype: DataType },
    #[error("quantization axis {axis} is out of range for rank {rank}")]
    AxisOutOfRange { axis: u32, rank: usize },
    #[error("{got} {what}, expected {expected} for dims[{axis}]")]
    EncodingLength { what: &'static str, axis: u32, got: u64, expected: u64 },
    #[error("{got} blockwiseExpansion block scales, expected dims[{axis}] * numBlocksPerAxis = {}", channels * u64::from(*blocks))]
    BlockScaleCount { got: u64, axis: u32, channels: u64, blocks: u32 },
    #[error("blockwiseExpansion numBlocksPerAxis is 0")]
    ZeroBlocks,
    #[error("16-bit block scales (blocksScale16) are not supported by the SDK layer")]
    SixteenBitBlockScales,
    #[error("blockwiseExpansion blockScaleBitwidth {bits} does not fit 8-bit block-scale storage")]
    BlockScaleBitwidth { bits: u32 },
    #[error("scale {scale} must be finite and > 0")]
    BadScale { scale: f32 },
}

/// `3`, or `2 (packed) or 4 (one nibble per byte)` for 4-bit types.
fn expected_bytes(expected: &[u64]) -> String {
    match expected {
        [packed, nibbles] => format!("{packed} (packed) or {nibbles} (one nibble per byte)"),
        other => other.iter().map(u64::to_string).collect::<Vec<_>>().join(" or "),
    }
}

/// A tensor that failed [`QnnTensor::check`].
#[derive(Debug, Clone, PartialEq, Error)]
#[error("tensor `{tensor}`: {problem}")]
pub struct TensorError {
    pub tensor: String,
    pub problem: TensorProblem,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::encoding::{BlockwiseExpansion, ScaleOffset};
    use crate::graph::{GraphBuilder, QnnGraph, Scalar};
    use crate::opdef::OpType;
    use crate::sdk::{check_graphs, BuildError};

    fn tensor(dtype: DataType, dims: &[u32], encoding: Encoding, data: Option<Vec<u8>>) -> QnnTensor {
        QnnTensor {
            name: "t".into(),
            tensor_type: if data.is_some() { TensorType::Static } else { TensorType::Native },
            dtype,
            dims: dims.to_vec(),
            encoding,
            data: data.map(StaticData::new),
        }
    }

    #[test]
    fn data_types_are_the_graph_models() {
        // One `Qnn_DataType_t` model for the whole crate (its values are tested in `dtype.rs`).
        assert_eq!(DataType::UFixedPoint16.raw(), 0x0416);
        let t = tensor(DataType::String, &[4], Encoding::Undefined, Some(vec![0; 4]));
        assert!(t.check().unwrap_err().problem.to_string().contains("STRING cannot hold tensor data"));
    }

    #[test]
    fn tensor_type_and_encoding_codes() {
        assert_eq!(TensorType::AppWrite.raw(), 0);
        assert_eq!(TensorType::Static.raw(), 4);
        assert_eq!(Encoding::Undefined.raw(), 0x7FFF_FFFF);
        assert_eq!(Encoding::ScaleOffset(ScaleOffset { scale: 1.0, offset: 0 }).raw(), 0);
        let axis = Encoding::AxisScaleOffset { axis: 0, scale_offsets: vec![].into() };
        assert_eq!(axis.raw(), 1);
    }

    #[test]
    fn static_data_length_is_checked_per_dtype() {
        let so = Encoding::ScaleOffset(ScaleOffset { scale: 0.5, offset: -32768 });
        assert!(tensor(DataType::UFixedPoint16, &[2, 3], so.clone(), Some(vec![0; 12])).check().is_ok());
        let err = tensor(DataType::UFixedPoint16, &[2, 3], so, Some(vec![0; 6])).check().unwrap_err();
        assert!(err.problem.to_string().contains("expected 12"), "{err}");

        let so4 = Encoding::ScaleOffset(ScaleOffset { scale: 0.5, offset: 0 });
        for len in [3, 6] {
            tensor(DataType::SFixedPoint4, &[2, 3], so4.clone(), Some(vec![0; len])).check().unwrap();
        }
        let err = tensor(DataType::SFixedPoint4, &[2, 3], so4, Some(vec![0; 4])).check().unwrap_err();
        assert!(err.problem.to_string().contains("expected 3 (packed) or 6"), "{err}");
    }

    #[test]
    fn static_contract_and_encoding_presence() {
        let mut t = tensor(DataType::Float32, &[4], Encoding::Undefined, None);
        t.tensor_type = TensorType::Static;
        assert!(t.check().unwrap_err().problem.to_string().contains("no data"));

        let mut t = tensor(DataType::Float32, &[4], Encoding::Undefined, Some(vec![0; 16]));
        t.tensor_type = TensorType::AppWrite;
        assert!(t.check().unwrap_err().problem.to_string().contains("APP_WRITE tensor must not carry data"));

        let t = tensor(DataType::UFixedPoint8, &[4], Encoding::Undefined, None);
        assert!(t.check().unwrap_err().problem.to_string().contains("needs a quantization encoding"));

        let so = Encoding::ScaleOffset(ScaleOffset { scale: 1.0, offset: 0 });
        let t = tensor(DataType::Float16, &[4], so, None);
        assert!(t.check().unwrap_err().problem.to_string().contains("must not carry"));

        let t =
            tensor(DataType::UFixedPoint8, &[4], Encoding::ScaleOffset(ScaleOffset { scale: 0.0, offset: 0 }), None);
        assert!(t.check().unwrap_err().problem.to_string().contains("scale 0 must be finite and > 0"));
        // The value is the backend's to judge: the FFI only needs the layout.
        t.check_layout().unwrap();

        let mut t = tensor(DataType::Float32, &[4, 0], Encoding::Undefined, None);
        assert!(t.check().unwrap_err().problem.to_string().contains("zero extent"));
        t.dims = vec![4];
        t.name = "a\0b".into();
        assert!(t.check().unwrap_err().problem.to_string().contains("NUL"));
    }

    #[test]
    fn blockwise_expansion_lengths_follow_dims() {
        let per_channel = [ScaleOffset { scale: 0.01, offset: 0 }; 8];
        let bw = |scales: usize, blocks: usize| {
            Encoding::BlockwiseExpansion(BlockwiseExpansion {
                axis: 3,
                scale_offsets: per_channel[..scales].into(),
                num_blocks_per_axis: 2,
                block_scale_bitwidth: 4,
                block_scales: BlockScales::U8(vec![3; blocks].into()),
            })
        };
        // HWIO [1,1,In=32,Out=8], block 16 along In: 2 blocks per output channel.
        let ok = tensor(DataType::SFixedPoint8, &[1, 1, 32, 8], bw(8, 16), Some(vec![0; 256]));
        ok.check().unwrap();
        let err = tensor(DataType::SFixedPoint8, &[1, 1, 32, 8], bw(7, 16), Some(vec![0; 256])).check().unwrap_err();
        assert!(
            err.problem.to_string().contains("7 blockwiseExpansion per-channel scales, expected 8 for dims[3]"),
            "{err}"
        );
        let err = tensor(DataType::SFixedPoint8, &[1, 1, 32, 8], bw(8, 15), Some(vec![0; 256])).check().unwrap_err();
        assert!(
            err.problem
                .to_string()
                .contains("15 blockwiseExpansion block scales, expected dims[3] * numBlocksPerAxis = 16"),
            "{err}"
        );
        let err = tensor(DataType::SFixedPoint8, &[1, 32, 8], bw(8, 16), Some(vec![0; 256])).check().unwrap_err();
        assert!(err.problem.to_string().contains("axis 3 is out of range for rank 3"), "{err}");
        let Encoding::BlockwiseExpansion(mut wide) = bw(8, 16) else { unreachable!() };
        wide.block_scales = BlockScales::U16(vec![3; 16].into());
        let wide =
            tensor(DataType::SFixedPoint8, &[1, 1, 32, 8], Encoding::BlockwiseExpansion(wide), Some(vec![0; 256]));
        assert_eq!(wide.check_layout().unwrap_err().problem, TensorProblem::SixteenBitBlockScales);
    }

    /// A lowered LPBQ Conv2d graph named `name` whose weight `w` has `block_scales`.
    fn lowered_conv(name: &str, block_scales: BlockScales) -> QnnGraph {
        let mut b = GraphBuilder::new(name);
        let x = b.input("x", DataType::UFixedPoint16, &[1, 1, 2, 4], Encoding::from_zero_point(0.01, 3));
        let enc = Encoding::BlockwiseExpansion(BlockwiseExpansion {
            axis: 3,
            scale_offsets: vec![ScaleOffset { scale: 0.5, offset: 0 }; 2].into(),
            num_blocks_per_axis: 2,
            block_scale_bitwidth: 4,
            block_scales,
        });
        let w = b.static_tensor("w", DataType::SFixedPoint4, &[1, 1, 4, 2], enc, StaticData::new(vec![1u8; 8]));
        let y = b
            .node("conv", OpType::Conv2d)
            .input(&x)
            .input(&w)
            .tensor_param_u32("stride", &[2], &[1, 1])
            .tensor_param_u32("pad_amount", &[2, 2], &[0; 4])
            .scalar("group", Scalar::UInt32(1))
            .output("y", DataType::UFixedPoint16, &[1, 1, 2, 2], Encoding::from_zero_point(0.02, 5))
            .finish_one();
        b.mark_output(&y);
        b.finish().unwrap()
    }

    #[test]
    fn lowered_graphs_pass_the_sdk_checks() {
        check_graphs(&[lowered_conv("a", BlockScales::U8(vec![1, 2, 3, 4].into()))]).unwrap();
    }

    #[test]
    fn sixteen_bit_block_scales_are_refused_by_name() {
        let g = lowered_conv("a", BlockScales::U16(vec![1, 2, 3, 4].into()));
        let err = check_graphs(&[g]).unwrap_err();
        let BuildError::InvalidTensor { graph, source } = &err else { panic!("not a tensor error: {err}") };
        assert_eq!((graph.as_str(), source.tensor.as_str()), ("a", "w"));
        assert_eq!(source.problem, TensorProblem::SixteenBitBlockScales);
        assert!(err.to_string().contains("blocksScale16"), "{err}");
    }
}
