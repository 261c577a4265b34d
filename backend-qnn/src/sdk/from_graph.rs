//! Lowered [`QnnGraph`]s as the SDK layer's [`GraphDesc`]s.
//!
//! Both models share their data types, encodings, scalars and [`StaticData`](crate::graph::StaticData)
//! (cloned, never copied: graphs sharing a weight buffer still share it); this module maps
//! tensors, params, nodes and graphs field by field.

use thiserror::Error;

use super::desc::{GraphDesc, OpDesc, ParamDesc, ParamValue, TensorDesc};
use crate::encoding::{BlockScales, BlockwiseExpansion, Encoding};
use crate::graph::{Param, QnnGraph, QnnTensor};

/// A lowered graph uses something the SDK descriptors cannot carry.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("graph `{graph}`: tensor `{tensor}`: {detail}")]
pub struct ConvertError {
    pub graph: String,
    pub tensor: String,
    pub detail: String,
}

/// Converts `graphs` (in order) into SDK graph descriptions.
pub fn graph_descs(graphs: &[QnnGraph]) -> Result<Vec<GraphDesc>, ConvertError> {
    graphs.iter().map(graph_desc).collect()
}

fn graph_desc(g: &QnnGraph) -> Result<GraphDesc, ConvertError> {
    let tensors = g.tensors.iter().map(|t| tensor(g, t)).collect::<Result<Vec<_>, _>>()?;
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let mut params = Vec::with_capacity(n.params.len());
        for (name, p) in &n.params {
            let value = match p {
                Param::Scalar(s) => ParamValue::Scalar(*s),
                Param::Tensor(t) => ParamValue::Tensor(tensor(g, t)?),
            };
            params.push(ParamDesc { name: name.clone(), value });
        }
        nodes.push(OpDesc {
            name: n.name.clone(),
            package: n.package.clone(),
            op_type: n.op_type.as_str().to_string(),
            params,
            inputs: n.inputs.clone(),
            outputs: n.outputs.clone(),
        });
    }
    Ok(GraphDesc { name: g.name.clone(), tensors, inputs: g.inputs.clone(), outputs: g.outputs.clone(), nodes })
}

fn tensor(g: &QnnGraph, t: &QnnTensor) -> Result<TensorDesc, ConvertError> {
    if let Encoding::BlockwiseExpansion(BlockwiseExpansion { block_scales: BlockScales::U16(_), .. }) = &t.encoding {
        return Err(ConvertError {
            graph: g.name.clone(),
            tensor: t.name.clone(),
            detail: "16-bit block scales (blocksScale16) are not supported by the SDK descriptors".into(),
        });
    }
    Ok(TensorDesc {
        name: t.name.clone(),
        tensor_type: t.tensor_type,
        dtype: t.dtype,
        dims: t.dims.clone(),
        encoding: t.encoding.clone(),
        data: t.data.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, TensorType};
    use crate::encoding::ScaleOffset;
    use crate::graph::{GraphBuilder, Scalar, StaticData};
    use crate::opdef::OpType;

    fn graph(name: &str, weight: &StaticData, block_scales: BlockScales) -> QnnGraph {
        let mut b = GraphBuilder::new(name);
        let x = b.input("x", DataType::UFixedPoint16, &[1, 1, 2, 4], Encoding::from_zero_point(0.01, 3));
        let enc = Encoding::BlockwiseExpansion(BlockwiseExpansion {
            axis: 3,
            scale_offsets: vec![ScaleOffset { scale: 0.5, offset: 0 }; 2].into(),
            num_blocks_per_axis: 2,
            block_scale_bitwidth: 4,
            block_scales,
        });
        let w = b.static_tensor("w", DataType::SFixedPoint4, &[1, 1, 4, 2], enc, weight.clone());
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
    fn fields_map_one_to_one_and_buffers_are_shared() {
        let weight = StaticData::new(vec![1u8; 8]);
        let scales = BlockScales::U8(vec![1, 2, 3, 4].into());
        let descs = graph_descs(&[graph("a", &weight, scales.clone()), graph("b", &weight, scales)]).unwrap();
        let (a, b) = (&descs[0], &descs[1]);
        assert_eq!((a.inputs.clone(), a.outputs.clone()), (vec!["x".to_string()], vec!["y".to_string()]));
        let w = a.tensors.iter().find(|t| t.name == "w").unwrap();
        assert_eq!(
            (w.tensor_type, w.dtype, w.dims.clone()),
            (TensorType::Static, DataType::SFixedPoint4, vec![1, 1, 4, 2])
        );
        let Encoding::BlockwiseExpansion(bw) = &w.encoding else { panic!() };
        assert_eq!(
            (bw.axis, bw.num_blocks_per_axis, bw.block_scales.clone()),
            (3, 2, BlockScales::U8(vec![1, 2, 3, 4].into()))
        );
        let wb = b.tensors.iter().find(|t| t.name == "w").unwrap();
        assert!(
            w.data.as_ref().unwrap().shares_buffer_with(wb.data.as_ref().unwrap()),
            "one SDK handle per weight buffer"
        );
        let conv = &a.nodes[0];
        assert_eq!((conv.op_type.as_str(), conv.package.as_str()), ("Conv2d", "qti.aisw"));
        assert_eq!(conv.params[2], ParamDesc { name: "group".into(), value: ParamValue::Scalar(Scalar::UInt32(1)) });
        let ParamValue::Tensor(stride) = &conv.params[0].value else { panic!() };
        assert_eq!(
            (stride.name.as_str(), stride.data.as_ref().unwrap().bytes()),
            ("conv.stride", &[1, 0, 0, 0, 1, 0, 0, 0][..])
        );
        crate::sdk::check_graphs(&descs).unwrap();
    }

    #[test]
    fn sixteen_bit_block_scales_are_refused_by_name() {
        let g = graph("a", &StaticData::new(vec![1u8; 8]), BlockScales::U16(vec![1, 2, 3, 4].into()));
        let err = graph_descs(&[g]).unwrap_err();
        assert_eq!((err.graph.as_str(), err.tensor.as_str()), ("a", "w"));
        assert!(err.to_string().contains("blocksScale16"), "{err}");
    }
}
