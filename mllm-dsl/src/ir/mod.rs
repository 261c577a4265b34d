//! The IR: a program of nested regions in mllm's structure.
//!
//! `@main` holds the `@init` subgraph (parameter registrations), one `graph.SubGraphOp` per module
//! call (flat, in creation order), and the top-level module's own ops, ending in `cf.ReturnOp`.
//! Module calls appear as `graph.CallGraphOp` in the caller's region. Values are SSA: each is defined
//! once (a region input, an op output, a register or a constant) and referenced by id.
//!
//! Values are stored in one arena ([`Program::values`]); ids are indices into it and carry no meaning
//! beyond that — the printer renumbers them in print order.

mod parse;
mod print;

pub use parse::parse;
pub use print::{print, MAX_LINE};

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
        Program { values, main: remap_region(&self.main, &m) }
    }
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&print(self))
    }
}
