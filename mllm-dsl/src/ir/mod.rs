//! The IR: a program of nested regions in mllm's structure.
//!
//! `@main` holds the `@init` subgraph (parameter registrations), one `graph.SubGraphOp` per module
//! call (flat, in creation order), and the top-level module's own ops, ending in `cf.ReturnOp`.
//! Module calls appear as `graph.CallGraphOp` in the caller's region. Values are SSA: each is defined
//! once (a region input, an op output, a register or a constant) and referenced by id.
//!
//! Values are stored in one arena ([`Program::values`]); ids are indices into it and carry no meaning
//! beyond that — the printer names values after the op or parameter that defines them (see
//! [`print()`]), and [`Program::canonicalize`] orders the arena in print order.
//!
//! Quantization specs (what the passes attach, see [`quant`]) live in a second arena,
//! [`Program::specs`]; values name theirs with the attribute `spec:$<name>`, and values naming the same
//! spec share it, as mllm shares spec objects by pointer.

mod parse;
mod print;
pub mod quant;

pub use parse::parse;
pub use print::{numbering, value_names};
pub use print::{print, MAX_LINE};
pub use quant::{QuantSpec, QuantSpecKind, SpecId, SpecParams, SpecSyntaxError};

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

/// A handle to one of `@main`'s subgraphs (the trace creates them flat in `@main`'s body). Only
/// the program hands them out ([`Program::graph_ids`], [`Program::graph_id`]), so a handle addresses
/// a subgraph and [`Program::graph`] needs no re-matching; like an arena handle, it is stale once a
/// pass rebuilds `@main`'s body, and using it then is a bug that panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphId(u32);

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

/// The type and metadata of one SSA value. Each fact has its own typed field; the printer shows
/// them as one attribute list sorted by key (`[constant:-20.0, qdq:const("..."), spec:$model.norm]`), the
/// keys being [`ValueDef::ATTR_KEYS`].
#[derive(Clone, Debug, PartialEq)]
pub struct ValueDef {
    pub ty: TensorType,
    /// Parameter symbol (`model.layers.0.mlp.up_proj.weight`) for registered parameters.
    pub symbol: Option<String>,
    /// The QDQ point the model file put on this value (`qdq`).
    pub qdq: Option<QdqAttr>,
    /// The value of a scalar constant (`constant`).
    pub constant: Option<f32>,
    /// The quantization spec this value shares with others, once the quant recipe ran (`spec`).
    pub spec: Option<SpecId>,
    /// The QNN tensor name given by tensor renaming (`name`).
    pub name: Option<String>,
    /// A constant's quantized code, once PTQ solved its spec (`quantized`).
    pub quantized: Option<i64>,
    /// An input of a compiled graph (`qnn_graph_inputs`), marked by the tensor-I/O pass.
    pub graph_input: bool,
    /// An output of a compiled graph (`qnn_graph_outputs`).
    pub graph_output: bool,
}

impl ValueDef {
    /// The printed attribute keys of the typed fields, in print (sorted) order.
    pub const ATTR_KEYS: [&'static str; 7] =
        ["constant", "name", "qdq", "qnn_graph_inputs", "qnn_graph_outputs", "quantized", "spec"];

    pub fn new(ty: TensorType) -> Self {
        ValueDef {
            ty,
            symbol: None,
            qdq: None,
            constant: None,
            spec: None,
            name: None,
            quantized: None,
            graph_input: false,
            graph_output: false,
        }
    }

    /// The metadata as the printed attribute list (`spec` as stored; the printer renumbers it).
    pub fn attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        if let Some(c) = self.constant {
            a.insert("constant".into(), Attr::Float(c));
        }
        if let Some(n) = &self.name {
            a.insert("name".into(), Attr::Str(n.clone()));
        }
        if let Some(q) = &self.qdq {
            a.insert("qdq".into(), Attr::Qdq(q.clone()));
        }
        if self.graph_input {
            a.insert("qnn_graph_inputs".into(), Attr::Bool(true));
        }
        if self.graph_output {
            a.insert("qnn_graph_outputs".into(), Attr::Bool(true));
        }
        if let Some(code) = self.quantized {
            a.insert("quantized".into(), Attr::Int(code));
        }
        if let Some(s) = self.spec {
            a.insert("spec".into(), Attr::Spec(s));
        }
        a
    }

    /// Sets the metadata from a parsed attribute list; an unknown key or a value of the wrong
    /// kind is an error naming the key and what it expects.
    pub(crate) fn set_attrs(&mut self, attrs: Attrs) -> Result<(), ValueAttrError> {
        for (key, value) in attrs {
            match (key.as_str(), value) {
                ("constant", Attr::Float(c)) => self.constant = Some(c),
                ("name", Attr::Str(n)) => self.name = Some(n),
                ("qdq", Attr::Qdq(q)) => self.qdq = Some(q),
                ("qnn_graph_inputs", Attr::Bool(b)) => self.graph_input = b,
                ("qnn_graph_outputs", Attr::Bool(b)) => self.graph_output = b,
                ("quantized", Attr::Int(code)) => self.quantized = Some(code),
                ("spec", Attr::Spec(s)) => self.spec = Some(s),
                (k, v) if Self::ATTR_KEYS.contains(&k) => {
                    return Err(ValueAttrError::WrongKind { key: k.to_string(), found: v })
                }
                (k, _) => return Err(ValueAttrError::Unknown { key: k.to_string(), known: &Self::ATTR_KEYS }),
            }
        }
        Ok(())
    }
}

/// A parsed value attribute that is not one of [`ValueDef`]'s keys, or holds the wrong kind of value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ValueAttrError {
    #[error("value attribute '{key}' has the wrong kind of value ({found})")]
    WrongKind { key: String, found: Attr },
    #[error("unknown value attribute '{key}' (expected one of {})", known.join(", "))]
    Unknown { key: String, known: &'static [&'static str] },
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
        self.value(v).spec.map(|s| self.spec(s))
    }

    /// Points a value at a spec (sharing it with every other value that points there).
    pub fn set_value_spec(&mut self, v: ValueId, spec: SpecId) {
        self.value_mut(v).spec = Some(spec);
    }

    /// Every subgraph's handle, in print order.
    pub fn graph_ids(&self) -> impl Iterator<Item = GraphId> + '_ {
        self.main.body.iter().enumerate().filter_map(|(i, n)| match n {
            Node::SubGraph(_) => Some(GraphId(i as u32)),
            _ => None,
        })
    }

    /// The handle of the subgraph with this symbol.
    pub fn graph_id(&self, symbol: &str) -> Option<GraphId> {
        self.graph_ids().find(|&g| self.graph(g).symbol == symbol)
    }

    pub fn graph(&self, id: GraphId) -> &SubGraph {
        match self.main.body.get(id.0 as usize) {
            Some(Node::SubGraph(g)) => g,
            _ => panic!("stale {id:?}: @main's body changed after the handle was taken"),
        }
    }

    pub fn graph_mut(&mut self, id: GraphId) -> &mut SubGraph {
        match self.main.body.get_mut(id.0 as usize) {
            Some(Node::SubGraph(g)) => g,
            _ => panic!("stale {id:?}: @main's body changed after the handle was taken"),
        }
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
            if let Some(s) = &mut def.spec {
                *s = spec_map[s.index()].expect("spec numbering covers every referenced spec");
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
