//! LPBQCanonicalize: every LPBQ weight in the canonical form QNN's blockwise-expansion encoding
//! reads (mllm's QNNTensorWrapper::setBlockwiseQuantization).
//!
//! mllm's `LPBQCanonicalizePass` is unfinished and not in its pipeline; this one finishes the job
//! the lowering needs: for each Conv2D with an LPBQ weight spec
//! - the weight is HWIO `[1, 1, In, Out]` with the channel axis 3 (Out) and int4 storage
//!   (`Int4LPBQ`);
//! - the block size (from the AOT config) tiles `In`, giving `blocks = In / block_size` per channel;
//! - the stored level-0 scales hold `Out * blocks` values and the level-1 scales `Out` values;
//! - `blocks` and `channels` are recorded in the solved spec, so lowering needs no shape logic.

use super::graph::{callee, describe_value, linalg, module_of, op_name, subgraph_slots, top_call, walk_from, walk_ops};
use super::params::QuantParamProvider;
use super::pipeline::block_size_for;
use super::{Pass, PassError};
use crate::aot_config::AotConfig;
use mllm_dsl::dtype::DType;
use mllm_dsl::ir::{Program, QuantSpecKind, SpecParams};
use mllm_dsl::op::OpKind;

pub struct LpbqCanonicalize<'a> {
    config: &'a AotConfig,
    params: &'a dyn QuantParamProvider,
}

impl<'a> LpbqCanonicalize<'a> {
    pub fn new(config: &'a AotConfig, params: &'a dyn QuantParamProvider) -> Self {
        LpbqCanonicalize { config, params }
    }
}

const PASS: &str = "LPBQCanonicalize";

impl Pass for LpbqCanonicalize<'_> {
    fn name(&self) -> &'static str {
        PASS
    }

    fn stage(&self) -> &'static str {
        "lpbq_canonicalize"
    }

    fn run(&self, p: &mut Program) -> Result<(), PassError> {
        let (_, call) = top_call(p, PASS)?;
        let start = callee(&subgraph_slots(p), call, PASS)?;
        let walk = walk_from(p, start, PASS)?;
        for r in walk_ops(p, &walk) {
            let op = linalg(p, r);
            if op.kind != OpKind::Conv2d || op.inputs.len() < 2 {
                continue;
            }
            let w = op.inputs[1];
            let Some(sid) = p.value(w).spec else { continue };
            let QuantSpecKind::Lpbq { block_size, ch_axis, .. } = p.spec(sid).kind else { continue };
            let name = op_name(op);
            let err = |p: &Program, message: String| PassError::Op {
                pass: PASS,
                op: name.clone(),
                module: module_of(p, r.graph),
                value: describe_value(p, w),
                message,
            };
            let shape = p.value(w).ty.shape.clone();
            let [1, 1, in_features, out_features] = shape[..] else {
                return Err(err(p, format!("an LPBQ weight must be HWIO [1, 1, In, Out], found {shape:?}")));
            };
            if ch_axis != 3 {
                return Err(err(p, format!("an HWIO LPBQ weight has its channels on axis 3, the spec says {ch_axis}")));
            }
            let configured = block_size_for(self.config, op.name.as_deref().unwrap_or(""), in_features)?;
            if configured != block_size {
                return Err(err(
                    p,
                    format!("the spec's block size {block_size} disagrees with the config's {configured}"),
                ));
            }
            let blocks = in_features / block_size;
            let from = match &p.spec(sid).params {
                Some(SpecParams::Lpbq { from, .. }) => from.clone(),
                _ => return Err(err(p, "the LPBQ spec is not solved (run PTQ first)".into())),
            };
            for (key, want) in [
                (SpecParams::lpbq_scale1_key(&from), out_features * blocks),
                (SpecParams::lpbq_scale2_key(&from), out_features),
            ] {
                let stored = self.params.tensor(&key).map_err(|e| err(p, e.to_string()))?;
                let found = stored.as_ref().map(|t| t.numel());
                if found != Some(want) {
                    let found = found.map_or("missing".to_string(), |n| format!("{n} values"));
                    return Err(err(
                        p,
                        format!(
                            "`{key}` must hold {want} values ({out_features} channels x {blocks} blocks of {block_size}), \
                             found {found}"
                        ),
                    ));
                }
            }
            p.spec_mut(sid).params =
                Some(SpecParams::Lpbq { from, blocks: Some(blocks), channels: Some(out_features) });
            p.value_mut(w).ty.dtype = DType::I4Lpbq;
        }
        Ok(())
    }
}
