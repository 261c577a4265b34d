//! What `quant::points` reads off a traced program: QDQ points, concatenation groups (rotate_half
//! style `cat(-x2, x1)`) and the points on decoder layer outputs.

use compiler::quant::points::{concat_groups, layer_output_points, qdq_points, PointsError, SliceOf};
use mllm_dsl::ir::ValueDef;
use mllm_dsl::prelude::*;
use mllm_dsl::{Program, QdqAttr, QdqKind, TensorType};

/// A decoder-like layer: norm, rotate_half concatenation, residual.
#[module]
struct Block {
    norm: RmsNorm,
    idx: usize,
}

#[module]
impl Block {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = if self.idx == 0 { x.clone() } else { qdq!(x, "input_qdq")? };
        let q = qdq!(self.norm.forward(&x)?, "norm_output_qdq")?;
        let d = q.dim(-1)?;
        let (x1, x2) = (q.slice(-1, 0, d / 2)?, q.slice(-1, d / 2, d)?);
        let rotated = Tensor::cat(&[&qdq!(x2.neg()?, "neg_half_qdq")?, &x1], -1)?;
        let scaled = qdq!(rotated.mul(&qdq!(const 0.5, "half_qdq")?)?, "mul_qdq")?;
        x.add(&scaled)
    }
}

#[module]
struct Net {
    layers: ModuleList<Block>,
}

#[module]
impl Net {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.forward(&x)?;
        }
        // The same cached-K pattern as Qwen3: one point on both inputs of a concatenation.
        let k = qdq!(kv x.to(DType::U8Sym)?, "k_qdq")?;
        let cached = Tensor::cat(&[&k, &k.transpose(1, 2)?.transpose(1, 2)?], 1)?;
        qdq!(cached.to(DType::F32)?, "final_qdq")
    }
}

fn traced() -> Program {
    let mut net =
        Net { layers: (0..2).map(|idx| Block { norm: RmsNorm::new(8, 1e-6), idx }).collect::<ModuleList<_>>() };
    net.declare(ParamFormat::Float).unwrap();
    trace(&[TraceInput::new("x", [1, 4, 8], DType::F32)], |t| net.forward(&t[0])).unwrap()
}

#[test]
fn lists_every_point_once_in_creation_order() {
    let keys: Vec<String> = qdq_points(&traced()).unwrap().into_iter().map(|p| p.key).collect();
    let expected = [
        "layers.0.norm_output_qdq",
        "layers.0.neg_half_qdq",
        "layers.0.half_qdq",
        "layers.0.mul_qdq",
        "layers.1.input_qdq",
        "layers.1.norm_output_qdq",
        "layers.1.neg_half_qdq",
        "layers.1.half_qdq",
        "layers.1.mul_qdq",
        "k_qdq",
        "final_qdq",
    ];
    let mut sorted_expected = expected.to_vec();
    sorted_expected.sort();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(sorted, sorted_expected, "{keys:?}");
    // Creation order: layer 0 before layer 1 before the top module.
    let pos = |k: &str| keys.iter().position(|x| x == k).unwrap();
    assert!(pos("layers.0.mul_qdq") < pos("layers.1.norm_output_qdq"));
    assert!(pos("layers.1.mul_qdq") < pos("final_qdq"));
}

#[test]
fn same_key_with_two_kinds_is_an_error() {
    let mut p = Program::default();
    for kind in [QdqKind::Activation, QdqKind::KvCache] {
        let mut def = ValueDef::new(TensorType::new(vec![1], DType::F32));
        def.qdq = Some(QdqAttr { kind, key: "a.b".into() });
        p.add_value(def);
    }
    assert!(matches!(qdq_points(&p), Err(PointsError::ConflictingKinds { key, .. }) if key == "a.b"));
}

#[test]
fn rotate_half_concatenations_link_the_slice_source_and_the_negated_half() {
    let groups = concat_groups(&traced());
    assert_eq!(groups.len(), 2, "one per layer; the K concatenation has a single point: {groups:?}");
    for (l, g) in groups.iter().enumerate() {
        assert_eq!(g.keys(), vec![format!("layers.{l}.neg_half_qdq"), format!("layers.{l}.norm_output_qdq")]);
        assert_eq!(g.members[0].slice, None);
        assert_eq!(g.members[1].slice, Some(SliceOf { dim: 2, start: 0, end: 4 }));
        assert!(g.op.starts_with(&format!("layers.{l}.")), "{}", g.op);
    }
}

#[test]
fn layer_outputs_carry_the_next_points() {
    let outs = layer_output_points(&traced());
    let keys: Vec<(String, Option<String>)> = outs.into_iter().map(|(s, p)| (s, p.map(|p| p.key))).collect();
    assert_eq!(
        keys,
        vec![("layers.0".to_string(), Some("layers.1.input_qdq".to_string())), ("layers.1".to_string(), None),]
    );
}

/// Llama's and Qwen2's rotate_half: the halves are sliced from the projection output after its
/// head split (view + transpose), not from the QDQ value itself.
#[module]
struct MovedRotate {
    norm: RmsNorm,
    heads: usize,
}

#[module]
impl MovedRotate {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let q = qdq!(self.norm.forward(x)?, "proj_output_qdq")?;
        let q = q.view(&[1, 4, self.heads as i64, -1])?.transpose(1, 2)?;
        let d = q.dim(-1)?;
        let (x1, x2) = (q.slice(-1, 0, d / 2)?, q.slice(-1, d / 2, d)?);
        Tensor::cat(&[&qdq!(x2.neg()?, "neg_half_qdq")?, &x1], -1)
    }
}

#[test]
fn a_slice_of_a_moved_point_joins_the_group_over_the_whole_tensor() {
    let mut m = MovedRotate { norm: RmsNorm::new(8, 1e-6), heads: 2 };
    m.declare(ParamFormat::Float).unwrap();
    let p = trace(&[TraceInput::new("x", [1, 4, 8], DType::F32)], |t| m.forward(&t[0])).unwrap();
    let groups = concat_groups(&p);
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].keys(), vec!["neg_half_qdq", "proj_output_qdq"]);
    // The half does not map back to a slice of [1, 4, 8]: the member observes the whole tensor.
    assert!(groups[0].members.iter().all(|m| m.slice.is_none()), "{groups:?}");
}
