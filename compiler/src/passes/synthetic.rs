//! [`SyntheticParams`]: made-up but consistent quantization parameters for a traced program, for
//! benches and tests that have no calibrated checkpoint (e.g. the full Qwen3-1.7B config).
//!
//! Every parameter the program's QDQ points and weights will ask for exists, derived from a hash
//! of its key, and obeys the constraints a real calibration guarantees: KV points have zero point
//! 128, and the QDQ points governing the inputs of one concat share their parameters (pymllm's
//! `ConcatObserver`). Weights are described (dtype and shape) but hold no data, so
//! [`int_range`](QuantParamProvider::int_range) is `None` and nothing weight-sized is ever
//! allocated.

use super::params::{ParamError, QuantParamProvider, StoredTensor};
use crate::quant::spec::KV_ZERO_POINT;
use mllm_dsl::dtype::DType;
use mllm_dsl::ir::{LinalgOp, Node, Program, Region, SpecParams, ValueId};
use mllm_dsl::op::OpKind;
use mllm_dsl::qdq::{QdqAttr, QdqKind};
use std::collections::{BTreeMap, BTreeSet, HashMap};

#[derive(Clone, Debug, Default)]
pub struct SyntheticParams {
    tensors: HashMap<String, StoredTensor>,
    f32s: HashMap<String, f32>,
    i32s: HashMap<String, i32>,
}

impl SyntheticParams {
    /// Parameters for every QDQ point and weight of `program`, with LPBQ blocks of `block_size`.
    pub fn for_program(program: &Program, block_size: usize) -> Self {
        let mut s = SyntheticParams::default();
        for def in &program.values {
            let Some(sym) = &def.symbol else { continue };
            let shape = def.ty.shape.clone();
            match (def.ty.dtype, sym.strip_suffix(".weight")) {
                (DType::I4Lpbq, Some(prefix)) if shape.len() == 4 => {
                    let (cin, cout) = (shape[2], shape[3]);
                    s.describe(&SpecParams::weight_key(prefix), DType::I8, shape);
                    let blocks = cin / block_size.max(1);
                    s.describe(&SpecParams::lpbq_scale1_key(prefix), DType::U8, vec![cout * blocks]);
                    s.describe(&SpecParams::lpbq_scale2_key(prefix), DType::F32, vec![cout]);
                }
                (DType::U16Asym | DType::U16, prefix) => {
                    s.describe(sym, DType::U16, shape);
                    if let Some(prefix) = prefix {
                        let (scale, zp) = params_of(prefix);
                        s.scalar(&SpecParams::scale_key(prefix), &SpecParams::zero_point_key(prefix), scale, zp);
                    }
                }
                (dtype, _) => s.describe(sym, dtype, shape),
            }
        }
        // QDQ points; the ones feeding one concat are tied to one set of parameters.
        let points = qdq_points(program);
        let groups = concat_groups(program);
        let mut root: HashMap<&str, &str> = HashMap::new();
        for group in &groups {
            let first = group.iter().next().expect("groups are non-empty");
            for key in group {
                root.insert(key, first);
            }
        }
        for (key, kind) in &points {
            let (scale, zp) = params_of(root.get(key.as_str()).copied().unwrap_or(key));
            let zp = if *kind == QdqKind::KvCache { KV_ZERO_POINT } else { zp };
            let point = QdqAttr { kind: kind.clone(), key: key.clone() };
            s.scalar(&point.scale_key(), &point.zero_point_key(), scale, zp);
        }
        s
    }

    fn describe(&mut self, key: &str, dtype: DType, shape: Vec<usize>) {
        self.tensors.insert(key.to_string(), StoredTensor { dtype, shape });
    }

    fn scalar(&mut self, scale_key: &str, zp_key: &str, scale: f32, zp: i32) {
        self.describe(scale_key, DType::F32, vec![1]);
        self.describe(zp_key, DType::I32, vec![1]);
        self.f32s.insert(scale_key.to_string(), scale);
        self.i32s.insert(zp_key.to_string(), zp);
    }
}

/// A scale in `[1e-4, 1.1e-3)` and a u16 zero point in `[20000, 45000)`, from the key's FNV-1a hash.
fn params_of(key: &str) -> (f32, i32) {
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let scale = 1e-4 * (1.0 + (h % 1000) as f32 / 100.0);
    let zp = 20_000 + ((h >> 20) % 25_000) as i32;
    (scale, zp)
}

/// Every QDQ point with checkpoint parameters (not the fixed kinds), by key.
fn qdq_points(p: &Program) -> BTreeMap<String, QdqKind> {
    p.values
        .iter()
        .filter_map(|d| d.qdq.as_ref())
        .filter(|q| q.fixed_params().is_none())
        .map(|q| (q.key.clone(), q.kind.clone()))
        .collect()
}

/// The QDQ keys governing the inputs of each concat: the nearest annotation found by walking
/// back through ops that only move data.
fn concat_groups(p: &Program) -> Vec<BTreeSet<String>> {
    let mut producer: HashMap<ValueId, &LinalgOp> = HashMap::new();
    let mut concats = Vec::new();
    fn collect<'a>(r: &'a Region, producer: &mut HashMap<ValueId, &'a LinalgOp>, concats: &mut Vec<&'a LinalgOp>) {
        for n in &r.body {
            match n {
                Node::Linalg(op) => {
                    for &o in &op.outputs {
                        producer.insert(o, op);
                    }
                    if matches!(op.kind, OpKind::Concat { .. }) {
                        concats.push(op);
                    }
                }
                Node::SubGraph(g) => collect(&g.region, producer, concats),
                _ => {}
            }
        }
    }
    collect(&p.main, &mut producer, &mut concats);
    let governing = |mut v: ValueId| -> Option<String> {
        for _ in 0..p.values.len() {
            if let Some(q) = p.value(v).qdq.as_ref() {
                return Some(q.key.clone());
            }
            let op = producer.get(&v)?;
            let moves_data = matches!(
                op.kind,
                OpKind::View { .. }
                    | OpKind::Unsqueeze { .. }
                    | OpKind::Permute { .. }
                    | OpKind::Transpose { .. }
                    | OpKind::Repeat { .. }
                    | OpKind::Slice { .. }
                    | OpKind::Gather { .. }
                    | OpKind::Concat { .. }
            );
            if !moves_data {
                return None;
            }
            v = op.inputs[0];
        }
        None
    };
    // Merge groups that share a key (a key can feed several concats).
    let mut groups: Vec<BTreeSet<String>> = Vec::new();
    for op in concats {
        let mut keys: BTreeSet<String> = op.inputs.iter().filter_map(|&v| governing(v)).collect();
        if keys.len() < 2 {
            continue;
        }
        groups.retain(|g| {
            if g.is_disjoint(&keys) {
                true
            } else {
                keys.extend(g.iter().cloned());
                false
            }
        });
        groups.push(keys);
    }
    groups
}

impl QuantParamProvider for SyntheticParams {
    fn name(&self) -> String {
        "synthetic parameters".into()
    }

    fn tensor(&self, key: &str) -> Result<Option<StoredTensor>, ParamError> {
        Ok(self.tensors.get(key).cloned())
    }

    fn read_f32(&self, key: &str) -> Result<Vec<f32>, ParamError> {
        self.f32s.get(key).map(|v| vec![*v]).ok_or_else(|| self.error(key, "no such scale".into()))
    }

    fn read_i32(&self, key: &str) -> Result<Vec<i32>, ParamError> {
        self.i32s.get(key).map(|v| vec![*v]).ok_or_else(|| self.error(key, "no such zero point".into()))
    }

    fn int_range(&self, _key: &str) -> Result<Option<(i64, i64)>, ParamError> {
        Ok(None)
    }
}
