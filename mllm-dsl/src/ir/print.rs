//! The printer: mllm's textual IR grammar (mllm/compile/ir printers), made deterministic.
//!
//! - Values are renumbered `%0, %1, ...` in the order their definitions are printed; no uuids.
//! - A value prints with its type and attributes where it is defined (region inputs, op outputs,
//!   registers, constants, call results) and as a bare `%n` where it is used, which keeps lines short.
//! - Attributes are sorted; floats print in Rust's shortest round-trip form.
//! - A line that would exceed [`MAX_LINE`] characters puts one list item per line.
//! - Unlike mllm, `@main` lists the trace inputs as its region inputs, so the text is closed SSA
//!   and parses back ([`super::parse`]).
//! - Quantization specs are numbered `s0, s1, ...` in order of first reference and printed as a
//!   table after `@main` (`quant.specs { s0 = ... }`), only when the program has any.

use super::{Attr, Attrs, Node, Program, Region, SpecId, ValueId};
use crate::dtype::fmt_shape;
use std::collections::HashMap;
use std::fmt::Write;

/// No printed line is longer than this (mllm's exceed 1,000 characters).
pub const MAX_LINE: usize = 200;

const INDENT: &str = "    ";

/// Value ids in the order the printer numbers them (`%0`, `%1`, …), for messages that name a
/// value as the printed IR does.
pub fn numbering(p: &Program) -> Vec<ValueId> {
    let mut n = Numbering::default();
    n.region_header(&p.main);
    n.region_body(&p.main);
    // Values referenced but never defined in a typed position (malformed programs) still get numbers.
    n.order.extend(n.late.drain(..).collect::<Vec<_>>().into_iter().filter(|v| !n.seen.contains_key(v)));
    n.order
}

/// Spec ids in the order the printer numbers them: first reference by a value in `value_order`.
pub(crate) fn spec_numbering(p: &Program, value_order: &[ValueId]) -> Vec<SpecId> {
    let mut seen = vec![false; p.specs.len()];
    let mut order = Vec::new();
    for v in value_order {
        if let Some(s) = p.value(*v).spec {
            if !std::mem::replace(&mut seen[s.index()], true) {
                order.push(s);
            }
        }
    }
    order
}

#[derive(Default)]
struct Numbering {
    seen: HashMap<ValueId, usize>,
    order: Vec<ValueId>,
    late: Vec<ValueId>,
}

impl Numbering {
    fn def(&mut self, v: ValueId) {
        if !self.seen.contains_key(&v) {
            self.seen.insert(v, self.order.len());
            self.order.push(v);
        }
    }
    fn uses(&mut self, vs: &[ValueId]) {
        self.late.extend(vs.iter().filter(|v| !self.seen.contains_key(v)));
    }
    fn region_header(&mut self, r: &Region) {
        r.inputs.iter().for_each(|&v| self.def(v));
        self.uses(&r.outputs);
    }
    fn region_body(&mut self, r: &Region) {
        for node in &r.body {
            match node {
                Node::SubGraph(g) => {
                    self.region_header(&g.region);
                    self.region_body(&g.region);
                }
                Node::Call(c) => {
                    self.uses(&c.inputs);
                    c.outputs.iter().for_each(|&v| self.def(v));
                }
                Node::Linalg(op) => {
                    self.uses(&op.inputs);
                    op.outputs.iter().for_each(|&v| self.def(v));
                }
                Node::Register { value, .. } | Node::Constant { value, .. } => self.def(*value),
                Node::Return(vs) => self.uses(vs),
                Node::Comment(_) => {}
            }
        }
    }
}

/// Prints a program in mllm's grammar.
pub fn print(p: &Program) -> String {
    let order = numbering(p);
    let num: HashMap<ValueId, usize> = order.iter().enumerate().map(|(i, v)| (*v, i)).collect();
    let spec_order = spec_numbering(p, &order);
    let spec_num: HashMap<SpecId, usize> = spec_order.iter().enumerate().map(|(i, s)| (*s, i)).collect();
    let pr = Printer { p, num, spec_num };
    let mut out = String::new();
    pr.region("@main ", &p.main, 0, &mut out);
    if !spec_order.is_empty() {
        out.push_str("quant.specs {\n");
        for (i, s) in spec_order.iter().enumerate() {
            writeln!(out, "{INDENT}s{i} = {}", p.spec(*s)).unwrap();
        }
        out.push_str("}\n");
    }
    out
}

struct Printer<'a> {
    p: &'a Program,
    num: HashMap<ValueId, usize>,
    spec_num: HashMap<SpecId, usize>,
}

impl Printer<'_> {
    fn bare(&self, v: ValueId) -> String {
        format!("%{}", self.num[&v])
    }

    fn typed(&self, v: ValueId) -> String {
        let def = self.p.value(v);
        let mut s =
            format!("%{}:tensor<{}, {}, {}>", self.num[&v], fmt_shape(&def.ty.shape), def.ty.dtype, def.ty.device);
        if let Some(sym) = &def.symbol {
            write!(s, "[@{sym}]").unwrap();
        }
        let mut attrs = def.attrs();
        if !attrs.is_empty() {
            if let Some(Attr::Spec(id)) = attrs.get_mut("spec") {
                *id = SpecId(self.spec_num[id] as u32);
            }
            s.push_str(&attrs_text(&attrs));
        }
        s
    }

    fn bares(&self, vs: &[ValueId]) -> Vec<String> {
        vs.iter().map(|&v| self.bare(v)).collect()
    }

    fn typeds(&self, vs: &[ValueId]) -> Vec<String> {
        vs.iter().map(|&v| self.typed(v)).collect()
    }

    /// `head(ins) -> (outs)tail`, wrapped one item per line when too long.
    fn signature(&self, indent: usize, head: &str, ins: &[String], outs: &[String], tail: &str, out: &mut String) {
        let pad = INDENT.repeat(indent);
        let one = format!("{pad}{head}({}) -> ({}){tail}", ins.join(", "), outs.join(", "));
        if one.len() <= MAX_LINE {
            out.push_str(&one);
            out.push('\n');
            return;
        }
        let inner = INDENT.repeat(indent + 1);
        let list = |items: &[String]| -> String {
            if items.is_empty() {
                return String::new();
            }
            let body: Vec<String> = items.iter().map(|i| format!("{inner}{i}")).collect();
            format!("\n{}\n{pad}", body.join(",\n"))
        };
        writeln!(out, "{pad}{head}({}) -> ({}){tail}", list(ins), list(outs)).unwrap();
    }

    fn region(&self, head: &str, r: &Region, indent: usize, out: &mut String) {
        self.signature(indent, head, &self.typeds(&r.inputs), &self.bares(&r.outputs), " {", out);
        for node in &r.body {
            self.node(node, indent + 1, out);
        }
        writeln!(out, "{}}}", INDENT.repeat(indent)).unwrap();
    }

    fn node(&self, node: &Node, indent: usize, out: &mut String) {
        let pad = INDENT.repeat(indent);
        match node {
            Node::SubGraph(g) => {
                let device = g.device.map(|d| d.name()).unwrap_or("notype");
                let attrs = if g.attrs.is_empty() { String::new() } else { format!(" {}", attrs_text(&g.attrs)) };
                writeln!(out, "{pad}graph.SubGraphOp @{} {device}{attrs} {{", g.symbol).unwrap();
                self.region("", &g.region, indent + 1, out);
                writeln!(out, "{pad}}}").unwrap();
            }
            Node::Call(c) => {
                let head = format!("graph.CallGraphOp @{} ", c.symbol);
                self.signature(indent, &head, &self.bares(&c.inputs), &self.typeds(&c.outputs), "", out);
            }
            Node::Linalg(op) => {
                let mut head = format!("linalg.{}.{}Op ", op.device, op.kind.type_name());
                if let Some(name) = &op.name {
                    write!(head, "<name={name:?}> ").unwrap();
                }
                let mut attrs = op.kind.option_attrs();
                attrs.extend(op.attrs.iter().map(|(k, v)| (k.clone(), v.clone())));
                if !attrs.is_empty() {
                    write!(head, "{} ", attrs_text(&attrs)).unwrap();
                }
                self.signature(indent, &head, &self.bares(&op.inputs), &self.typeds(&op.outputs), "", out);
            }
            Node::Register { device, value } => {
                let head = format!("tensor.{device}.register ");
                self.signature(indent, &head, &[], &[self.typed(*value)], "", out);
            }
            Node::Constant { device, value } => {
                let head = format!("tensor.{device}.constant ");
                self.signature(indent, &head, &[], &[self.typed(*value)], "", out);
            }
            Node::Return(vs) => self.signature(indent, "cf.ReturnOp ", &self.bares(vs), &[], "", out),
            Node::Comment(c) => writeln!(out, "{pad}// {c}").unwrap(),
        }
    }
}

/// `[key:value, key:value]`, sorted by key.
pub(crate) fn attrs_text(attrs: &Attrs) -> String {
    let items: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("[{}]", items.join(", "))
}
