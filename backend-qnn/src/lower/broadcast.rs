//! Explicit broadcasts the lowering inserts where Qualcomm's backend mishandles implicit ones
//! ([`super::SelectBroadcast::Explicit`]).

use crate::dtype::DataType;
use crate::encoding::{Encoding, ScaleOffset};
use crate::graph::{QnnTensor, StaticData};
use crate::opdef::OpType;
use crate::shape;

use super::{qnn_safe, GraphLowering, LowerError};

/// Why an operand cannot be broadcast explicitly (reported as the op's [`LowerError::Op`]).
#[derive(Debug, thiserror::Error)]
pub(super) enum BroadcastError {
    #[error("operand `{0}` is not a tensor of the graph")]
    Unknown(String),
    #[error("operand `{tensor}` {dims:?} does not broadcast to the output {out:?}")]
    NotTo { tensor: String, dims: Vec<u32>, out: Vec<u32> },
    #[error("operand `{tensor}` of type {dtype} ({encoding}) cannot be broadcast explicitly")]
    Unsupported { tensor: String, dtype: DataType, encoding: String },
}

impl GraphLowering<'_, '_, '_> {
    /// `tensor` (operand `index` of op `op`) broadcast to `dims` as `tensor + zeros`, where the
    /// zeros have size 1 except along the axes the broadcast stretches and the sum keeps the
    /// operand's type and encoding, so every code is copied unchanged. A tensor already of shape
    /// `dims` is returned as it is. `op_err` turns a [`BroadcastError`] into the op's error.
    pub(super) fn broadcast_to(
        &mut self,
        op: &str,
        index: usize,
        tensor: &str,
        dims: &[u32],
        op_err: impl Fn(BroadcastError) -> LowerError,
    ) -> Result<String, LowerError> {
        let t = self.builder.get(tensor).ok_or_else(|| op_err(BroadcastError::Unknown(tensor.to_string())))?;
        if t.dims == dims {
            return Ok(tensor.to_string());
        }
        // The operand must broadcast to exactly `dims` under the validator's rule (shape::broadcast).
        if shape::broadcast(&[&t.dims, dims]).ok().as_deref() != Some(dims) {
            let (dims, out) = (t.dims.clone(), dims.to_vec());
            return Err(op_err(BroadcastError::NotTo { tensor: tensor.to_string(), dims, out }));
        }
        // NumPy alignment (the operand's dims are the output's trailing ones): the zeros span the
        // axes the operand stretches and are 1 where it already has the output's size.
        let lead = dims.len() - t.rank();
        let zero_dims: Vec<u32> = dims
            .iter()
            .enumerate()
            .map(|(axis, &d)| if axis >= lead && t.dims[axis - lead] == d { 1 } else { d })
            .collect();
        let numel = zero_dims.iter().map(|&d| d as usize).product::<usize>();
        // Zeros of the operand's type: code 0 with offset 0 is an exact 0 in its scale.
        let zero_encoding = |so: &ScaleOffset| Encoding::ScaleOffset(ScaleOffset { scale: so.scale, offset: 0 });
        let (encoding, data) = match (&t.encoding, t.dtype) {
            (Encoding::ScaleOffset(so), DataType::UFixedPoint16) => {
                (zero_encoding(so), StaticData::from_u16(&vec![0; numel]))
            }
            (Encoding::ScaleOffset(so), DataType::UFixedPoint8) => {
                (zero_encoding(so), StaticData::new(vec![0u8; numel]))
            }
            (Encoding::Undefined, DataType::Float32) => (Encoding::Undefined, StaticData::from_f32(&vec![0.0; numel])),
            (e, dtype) => {
                let (tensor, encoding) = (tensor.to_string(), format!("{e:?}"));
                return Err(op_err(BroadcastError::Unsupported { tensor, dtype, encoding }));
            }
        };
        let (dtype, out_encoding) = (t.dtype, t.encoding.clone());
        let shape = zero_dims.iter().map(u32::to_string).collect::<Vec<_>>().join("x");
        let zeros =
            QnnTensor::new_static(format!("{}_zeros_{index}_{shape}", qnn_safe(op)), dtype, &zero_dims, encoding, data);
        let zeros = self.lowering.share_static(self.graph, zeros)?;
        let zeros_name = zeros.name.clone();
        self.add_static(zeros)?;
        let out = format!("{}_broadcast_{index}", qnn_safe(op));
        self.builder
            .node(format!("{op}.broadcast_{index}"), OpType::ElementWiseAdd)
            .input(tensor)
            .input(&zeros_name)
            .output(out.clone(), dtype, dims, out_encoding)
            .finish();
        Ok(out)
    }
}
