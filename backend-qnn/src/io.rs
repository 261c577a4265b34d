//! Graph inputs and outputs: [`IoTensor`] and [`GraphIo`], the one model of what a context
//! binary records about each graph (real metadata, the fake binary) and what the runtime binds.

use crate::chunk_model::QnnModelError;
use crate::dtype::DataType;
use crate::encoding::{Encoding, ScaleOffset};
use crate::graph::{QnnGraph, QnnTensor};

/// One graph input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct IoTensor {
    /// The id the backend assigned at `tensorCreateGraphTensor` (and `graphExecute` expects);
    /// `None` for a lowered graph no backend has seen.
    pub id: Option<u32>,
    pub name: String,
    pub dtype: DataType,
    pub dims: Vec<u32>,
    /// The scale/offset encoding; `None` for integer and float tensors.
    pub quant: Option<ScaleOffset>,
}

impl IoTensor {
    /// `tensor` as a backend records it: any encoding other than scale/offset is not recorded.
    pub fn of(tensor: &QnnTensor, id: Option<u32>) -> IoTensor {
        let quant = match &tensor.encoding {
            Encoding::ScaleOffset(so) => Some(*so),
            _ => None,
        };
        IoTensor { id, name: tensor.name.clone(), dtype: tensor.dtype, dims: tensor.dims.clone(), quant }
    }

    pub fn numel(&self) -> usize {
        self.dims.iter().map(|&d| d as usize).product()
    }
}

/// The I/O of one graph, in binding order.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphIo {
    pub name: String,
    pub inputs: Vec<IoTensor>,
    pub outputs: Vec<IoTensor>,
}

impl GraphIo {
    /// The I/O of a lowered graph (the graph a binary is built from); ids are not known yet.
    pub fn from_graph(graph: &QnnGraph) -> Result<GraphIo, QnnModelError> {
        let io = |names: &[String]| {
            names
                .iter()
                .map(|n| {
                    let bad =
                        |detail: String| QnnModelError::Io { graph: graph.name.clone(), tensor: n.clone(), detail };
                    let t = graph.tensor(n).ok_or_else(|| bad("is bound as graph I/O but not declared".into()))?;
                    match &t.encoding {
                        Encoding::Undefined | Encoding::ScaleOffset(_) => Ok(IoTensor::of(t, None)),
                        other => Err(bad(format!("graph I/O with a {} encoding is not supported", other.c_name()))),
                    }
                })
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(GraphIo { name: graph.name.clone(), inputs: io(&graph.inputs)?, outputs: io(&graph.outputs)? })
    }

    /// The same I/O with the backend's ids left out, to compare with a lowered graph's.
    pub fn without_ids(mut self) -> GraphIo {
        self.inputs.iter_mut().chain(&mut self.outputs).for_each(|t| t.id = None);
        self
    }

    /// Every fixed-point tensor must carry its scale/offset for the runtime to use it; a binary's
    /// metadata may lack them, and then the lowered graphs must supply the I/O
    /// ([`GraphIo::from_graph`]).
    pub fn check_encodings(&self) -> Result<(), QnnModelError> {
        match self.inputs.iter().chain(&self.outputs).find(|t| t.dtype.is_fixed_point() && t.quant.is_none()) {
            Some(t) => {
                Err(QnnModelError::MissingEncoding { graph: self.name.clone(), tensor: t.name.clone(), dtype: t.dtype })
            }
            None => Ok(()),
        }
    }
}
