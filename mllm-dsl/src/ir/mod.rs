//! The IR: a program of nested regions in mllm's structure.
//!
//! `@main` holds the `@init` subgraph (parameter registrations), one `graph.SubGraphOp` per module
//! call (flat, in creation order), and the top-level module's own ops, ending in `cf.ReturnOp`.
//! Module calls appear as `graph.CallGraphOp` in the caller's region. Values are SSA: each is defined
//! once (a region input, an op output, a register or a constant) and referenced by id.
//!
//! Values are stored in one arena ([`Program::values`]); ids are indices into it and carry no meaning
//! beyond that — the printer renumbers them in print order.
//!
//! Quantization specs (what the passes attach, see [`quant`]) live in a second arena,
//! [`Program::specs`]; values name theirs with the attribute `spec:s<n>`, and values naming the same
//! spec share it, as mllm shares spec objects by pointer.

mod parse;
mod print;
pub mod quant;

pub use parse::parse;
pub(crate) use print::numbering;
pub use print::{print, MAX_LINE};
pub use quant::{QuantSpec, QuantSpecKind, SpecId, SpecParams};

use crate::dtype::{DType, Device, TensorType};
use crate::op::OpKind;
use crate::qdq::QdqAttr;
use std::collections::BTreeMap;
use std::fmt;

/// Index of a value in [`Program::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

impl ValueId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// An attribute value. Maps of attributes are `BTreeMap`s, so they print sorted.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Bool(bool),
    Int(i64),
    Float(f32),
    Str(String),
    Ints(Vec<i64>),
    Floats(Vec<f32>),
    DType(DType),
    Qdq(QdqAttr),
    /// A quantization spec of [`Program::specs`], printed `s<n>` (value attribute `spec`).
    Spec(SpecId),
}

pub type Attrs = BTreeMap<String, Attr>;

impl fmt::Display for Attr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Attr::Bool(b) => write!(f, "{b}"),
            Attr::Int(i) => write!(f, "{i}"),
            // `{:?}` is Rust's shortest round-trip form: stable and exact.
            Attr::Float(x) => write!(f, "{x:?}"),
            Attr::Str(s) => write!(f, "{s:?}"),
            Attr::Ints(v) => write!(f, "[{}]", v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", ")),
            Attr::Floats(v) => write!(f, "[{}]", v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ")),
            Attr::DType(d) => write!(f, "{d}"),
            Attr::Qdq(q) => write!(f, "{q}"),
            Attr::Spec(s) => write!(f, "{s}"),
        }
    }
}

/// The type and metadata of one SSA value.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueDef {
    pub ty: TensorType,
    /// Parameter symbol (`model.layers.0.mlp.up_proj.weight`) for registered parameters.
    pub symbol: Option<String>,
    /// Value attributes: `qdq` annotation, `constant` value, I/O marks added by passes.
    pub attrs: Attrs,
}

impl ValueDef {
    pub fn new(ty: TensorType) -> Self {
        ValueDef { ty, symbol: None, attrs: Attrs::new() }
    }

    pub fn qdq(&self) -> Option<&QdqAttr> {
        match self.attrs.get("qdq") {
            Some(Attr::Qdq(q)) => Some(q),
            _ => None,
        }
    }

    /// The value of a scalar constant.
    pub fn constant(&self) -> Option<f32> {
        match self.attrs.get("constant") {
            Some(Attr::Float(v)) => Some(*v),
            _ => None,
        }
    }

    /// The quantization spec this value refers to (attribute `spec`).
    pub fn spec(&self) -> Option<SpecId> {
        match self.attrs.get("spec") {
            Some(Attr::Spec(s)) => Some(*s),
            _ => None,
        }
    }
}

/// An ordered list of nodes with inputs and outputs.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Region {
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub body: Vec<Node>,
}

/// `graph.SubGraphOp @symbol <device> [attrs] { region }`.
#[derive(Clone, Debug, PartialEq)]
pub struct SubGraph {
    pub symbol: String,
    /// `None` prints as `notype` (no module behind it, e.g. `@init`).
    pub device: Option<Device>,
    pub attrs: Attrs,
    pub region: Region,
}

/// `graph.CallGraphOp @symbol (inputs) -> (outputs)`.
#[derive(Clone, Debug, PartialEq)]
pub struct CallGraph {
    pub symbol: String,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// `linalg.<Device>.<Type>Op <name="..."> [attrs] (inputs) -> (outputs)`.
#[derive(Clone, Debug, PartialEq)]
pub struct LinalgOp {
    pub device: Device,
    pub kind: OpKind,
    pub name: Option<String>,
    pub attrs: Attrs,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    SubGraph(SubGraph),
    Call(CallGraph),
    Linalg(LinalgOp),
    /// `tensor.<Device>.register () -> (%v[@symbol])`: a parameter.
    Register {
        device: Device,
        value: ValueId,
    },
    /// `tensor.<Device>.constant () -> (%v[constant:x])`: a scalar constant.
    Constant {
        device: Device,
        value: ValueId,
    },
    /// `cf.ReturnOp (values) -> ()`.
    Return(Vec<ValueId>),
    /// `// text`
    Comment(String),
}

/// A whole traced program.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Program {
    pub values: Vec<ValueDef>,
    pub main: Region,
    /// Quantization specs, shared by the values whose `spec` attribute names them. Empty until the
    /// quant-recipe pass runs; the printer omits an empty table.
    pub specs: Vec<QuantSpec>,
}

impl Program {
    pub fn value(&self, id: ValueId) -> &ValueDef {
        &self.values[id.index()]
    }

    pub fn value_mut(&mut self, id: ValueId) -> &mut ValueDef {
        &mut self.values[id.index()]
    }

    pub fn add_value(&mut self, def: ValueDef) -> ValueId {
        self.values.push(def);
        ValueId(self.values.len() as u32 - 1)
    }

    pub fn spec(&self, id: SpecId) -> &QuantSpec {
        &self.specs[id.index()]
    }

    pub fn spec_mut(&mut self, id: SpecId) -> &mut QuantSpec {
        &mut self.specs[id.index()]
    }

    pub fn add_spec(&mut self, spec: QuantSpec) -> SpecId {
        self.specs.push(spec);
        SpecId(self.specs.len() as u32 - 1)
    }

    /// The spec of a value, if it has one.
    pub fn value_spec(&self, v: ValueId) -> Option<&QuantSpec> {
        self.value(v).spec().map(|s| self.spec(s))
    }

    /// Points a value at a spec (sharing it with every other value that points there).
    pub fn set_value_spec(&mut self, v: ValueId, spec: SpecId) {
        self.value_mut(v).attrs.insert("spec".into(), Attr::Spec(spec));
    }

    /// The top-level subgraph with this symbol.
    pub fn subgraph(&self, symbol: &str) -> Option<&SubGraph> {
        self.main.body.iter().find_map(|n| match n {
            Node::SubGraph(g) if g.symbol == symbol => Some(g),
            _ => None,
        })
    }

    pub fn subgraph_mut(&mut self, symbol: &str) -> Option<&mut SubGraph> {
        self.main.body.iter_mut().find_map(|n| match n {
            Node::SubGraph(g) if g.symbol == symbol => Some(g),
            _ => None,
        })
    }

    /// All subgraphs in print order.
    pub fn subgraphs(&self) -> impl Iterator<Item = &SubGraph> {
        self.main.body.iter().filter_map(|n| match n {
            Node::SubGraph(g) => Some(g),
            _ => None,
        })
    }

    /// All linalg ops of the program, in print order.
    pub fn linalg_ops(&self) -> Vec<&LinalgOp> {
        fn walk<'a>(r: &'a Region, out: &mut Vec<&'a LinalgOp>) {
            for n in &r.body {
                match n {
                    Node::Linalg(op) => out.push(op),
                    Node::SubGraph(g) => walk(&g.region, out),
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.main, &mut out);
        out
    }

    /// Renumbers values in print order (the order the printer numbers them) and drops values no
    /// node refers to. Two programs that print the same are equal after canonicalization.
    pub fn canonicalize(&self) -> Program {
        let order = print::numbering(self);
        let mut map = vec![None; self.values.len()];
        let mut values = Vec::with_capacity(order.len());
        for (new, old) in order.iter().enumerate() {
            map[old.index()] = Some(ValueId(new as u32));
            values.push(self.values[old.index()].clone());
        }
        // Specs follow their first reference in value order; unreferenced ones are dropped.
        let spec_order = print::spec_numbering(self, &order);
        let mut spec_map = vec![None; self.specs.len()];
        for (new, old) in spec_order.iter().enumerate() {
            spec_map[old.index()] = Some(SpecId(new as u32));
        }
        for def in &mut values {
            for attr in def.attrs.values_mut() {
                if let Attr::Spec(s) = attr {
                    *s = spec_map[s.index()].expect("spec numbering covers every referenced spec");
                }
            }
        }
        let specs = spec_order.iter().map(|s| self.specs[s.index()].clone()).collect();
        let m = |v: &ValueId| map[v.index()].expect("numbering covers every referenced value");
        fn remap_region(r: &Region, m: &dyn Fn(&ValueId) -> ValueId) -> Region {
            let ids = |v: &Vec<ValueId>| v.iter().map(m).collect::<Vec<_>>();
            Region {
                inputs: ids(&r.inputs),
                outputs: ids(&r.outputs),
                body: r
                    .body
                    .iter()
                    .map(|n| match n {
                        Node::SubGraph(g) => {
                            Node::SubGraph(SubGraph { region: remap_region(&g.region, m), ..g.clone() })
                        }
                        Node::Call(c) => {
                            Node::Call(CallGraph { inputs: ids(&c.inputs), outputs: ids(&c.outputs), ..c.clone() })
                        }
                        Node::Linalg(op) => {
                            Node::Linalg(LinalgOp { inputs: ids(&op.inputs), outputs: ids(&op.outputs), ..op.clone() })
                        }
                        Node::Register { device, value } => Node::Register { device: *device, value: m(value) },
                        Node::Constant { device, value } => Node::Constant { device: *device, value: m(value) },
                        Node::Return(v) => Node::Return(ids(v)),
                        Node::Comment(c) => Node::Comment(c.clone()),
                    })
                    .collect(),
            }
        }
        Program { values, main: remap_region(&self.main, &m), specs }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print(self))
    }
}
