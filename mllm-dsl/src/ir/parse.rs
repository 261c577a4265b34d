//! The parser: printed IR back into a [`Program`]. `parse(&print(p))` equals `p.canonicalize()`.
//!
//! Value names (`%name`) and spec names (`$name`) are opaque labels: any name defined once reads
//! back, including the numbers older printers wrote (`%12`, `s3`). A name starting with a dot is
//! relative to the enclosing `graph.SubGraphOp @S` (`%.up_proj` is `%S.up_proj`).

use super::{
    Attr, Attrs, CallGraph, LinalgOp, Node, Program, QuantSpec, QuantSpecKind, Region, SpecId, SpecParams, SubGraph,
    ValueDef, ValueId,
};
use crate::dtype::{DType, Device, TensorType, UnknownName};
use crate::error::{Error, Result};
use crate::op::OpKind;
use crate::qdq::{QdqAttr, QdqKind};
use std::collections::HashMap;

/// Parses printed IR.
pub fn parse(text: &str) -> Result<Program> {
    let tokens = lex(text)?;
    let mut p = Parser {
        toks: tokens,
        pos: 0,
        prog: Program::default(),
        ids: HashMap::new(),
        scope: String::new(),
        defined: Vec::new(),
        first_mention: Vec::new(),
        spec_ids: HashMap::new(),
        spec_defined: Vec::new(),
        spec_first_mention: Vec::new(),
    };
    p.expect_sym("main")?;
    let main = p.region()?;
    p.prog.main = main;
    if p.peek() == Some(&Tok::Ident("quant.specs".into())) {
        p.pos += 1;
        p.spec_table()?;
    }
    if p.pos < p.toks.len() {
        return Err(p.err("unexpected text after the closing brace of @main (expected only a quant.specs table)"));
    }
    let undefined_spec = p
        .spec_ids
        .iter()
        .filter(|(_, id)| !p.spec_defined[id.index()])
        .min_by_key(|(_, id)| p.spec_first_mention[id.index()]);
    if let Some((n, id)) = undefined_spec {
        let (line, column) = p.spec_first_mention[id.index()];
        return Err(Error::Parse {
            line,
            column,
            message: format!("spec {n} is used but not in the quant.specs table"),
        });
    }
    // Report the undefined value mentioned first (not whichever the hash map yields first).
    let undefined =
        p.ids.iter().filter(|(_, id)| !p.defined[id.index()]).min_by_key(|(_, id)| p.first_mention[id.index()]);
    if let Some((n, id)) = undefined {
        let (line, column) = p.first_mention[id.index()];
        return Err(Error::Parse { line, column, message: format!("value %{n} is used but never defined") });
    }
    // Ids were handed out in order of first mention; canonical ids follow definition order.
    Ok(p.prog.canonicalize())
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Sym(String),
    /// `%name`, as written (possibly relative).
    Val(String),
    /// `$name`, a spec, as written (possibly relative).
    SpecRef(String),
    Ident(String),
    Num(String),
    Str(String),
    Punct(char),
    Arrow,
    Comment(String),
}

struct Spanned {
    tok: Tok,
    line: usize,
    col: usize,
}

fn lex(text: &str) -> Result<Vec<Spanned>> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line, mut col) = (0, 1, 1);
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    while i < chars.len() {
        let c = chars[i];
        let (l0, c0) = (line, col);
        let start = i;
        let push = |out: &mut Vec<Spanned>, tok| out.push(Spanned { tok, line: l0, col: c0 });
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            i += 1;
            col += 1;
            continue;
        }
        if c == '/' && chars.get(i + 1) == Some(&'/') {
            let end = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |p| i + p);
            let body: String = chars[i + 2..end].iter().collect();
            push(&mut out, Tok::Comment(body.strip_prefix(' ').unwrap_or(&body).to_string()));
            col += end - i;
            i = end;
            continue;
        }
        if c == '-' && chars.get(i + 1) == Some(&'>') {
            push(&mut out, Tok::Arrow);
            i += 2;
            col += 2;
            continue;
        }
        let is_name = |c: char| is_ident(c) || matches!(c, '-' | '#' | '~');
        if c == '@' || c == '%' || (c == '$' && chars.get(i + 1).is_some_and(|&c| is_ident(c))) {
            i += 1;
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '-' || (c != '@' && is_name(chars[i]))) {
                i += 1;
            }
            let body: String = chars[start + 1..i].iter().collect();
            if c == '@' {
                push(&mut out, Tok::Sym(body));
            } else if body.is_empty() {
                return Err(Error::Parse { line: l0, column: c0, message: "a '%' without a value name".into() });
            } else if c == '%' {
                push(&mut out, Tok::Val(body));
            } else {
                push(&mut out, Tok::SpecRef(body));
            }
        } else if c == '"' {
            let mut s = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(Error::Parse { line: l0, column: c0, message: "unterminated string".into() }),
                    Some('"') => break,
                    Some('\\') => {
                        i += 1;
                        match chars.get(i) {
                            Some('n') => s.push('\n'),
                            Some('t') => s.push('\t'),
                            Some('r') => s.push('\r'),
                            Some('0') => s.push('\0'),
                            Some(&c @ ('"' | '\\' | '\'')) => s.push(c),
                            Some('u') => {
                                let close = chars[i..].iter().position(|&c| c == '}').map(|p| i + p);
                                let hex: String = close.map(|e| chars[i + 2..e].iter().collect()).unwrap_or_default();
                                let ch =
                                    u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).ok_or_else(|| {
                                        Error::Parse { line: l0, column: c0, message: "bad unicode escape".into() }
                                    })?;
                                s.push(ch);
                                i = close.unwrap();
                            }
                            _ => {
                                return Err(Error::Parse {
                                    line: l0,
                                    column: c0,
                                    message: "bad escape in string".into(),
                                })
                            }
                        }
                    }
                    Some(&c) => s.push(c),
                }
                i += 1;
            }
            i += 1;
            push(&mut out, Tok::Str(s));
        } else if c.is_ascii_digit() || (c == '-' && chars.get(i + 1).is_some_and(|c| c.is_ascii_alphanumeric())) {
            i += 1;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric()
                    || chars[i] == '.'
                    || ((chars[i] == '-' || chars[i] == '+') && matches!(chars[i - 1], 'e' | 'E')))
            {
                i += 1;
            }
            push(&mut out, Tok::Num(chars[start..i].iter().collect()));
        } else if is_ident(c) {
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            push(&mut out, Tok::Ident(chars[start..i].iter().collect()));
        } else if "(){}[]<>,:=".contains(c) {
            push(&mut out, Tok::Punct(c));
            i += 1;
        } else {
            return Err(Error::Parse { line: l0, column: c0, message: format!("unexpected character '{c}'") });
        }
        col += i - start;
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Spanned>,
    pos: usize,
    prog: Program,
    /// Full value name → value id.
    ids: HashMap<String, ValueId>,
    /// The symbol of the enclosing subgraph (`""` outside any), against which relative names resolve.
    scope: String,
    defined: Vec<bool>,
    /// `(line, column)` where each value was first mentioned, to locate undefined values.
    first_mention: Vec<(usize, usize)>,
    /// Spec as written in full (`$name`, or `s<n>` of older printers) → spec id, whether its table
    /// entry was seen, and where it was first used.
    spec_ids: HashMap<String, SpecId>,
    spec_defined: Vec<bool>,
    spec_first_mention: Vec<(usize, usize)>,
}

impl Parser {
    fn err(&self, message: impl Into<String>) -> Error {
        let (line, column) = self.toks.get(self.pos).or(self.toks.last()).map_or((0, 0), |t| (t.line, t.col));
        Error::Parse { line, column, message: message.into() }
    }

    /// An error at the token just consumed (a bad dtype or device name, not the token after it).
    fn err_prev(&self, message: impl Into<String>) -> Error {
        let (line, column) = self.toks.get(self.pos.saturating_sub(1)).map_or((0, 0), |t| (t.line, t.col));
        Error::Parse { line, column, message: message.into() }
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn next(&mut self) -> Result<Tok> {
        let t = self.toks.get(self.pos).map(|t| t.tok.clone()).ok_or_else(|| self.err("unexpected end of input"))?;
        self.pos += 1;
        Ok(t)
    }

    fn expect(&mut self, c: char) -> Result<()> {
        match self.next()? {
            Tok::Punct(p) if p == c => Ok(()),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected '{c}', found {other:?}")))
            }
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_arrow(&mut self) -> Result<()> {
        match self.next()? {
            Tok::Arrow => Ok(()),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected '->', found {other:?}")))
            }
        }
    }

    fn expect_sym(&mut self, want: &str) -> Result<()> {
        match self.next()? {
            Tok::Sym(s) if s == want => Ok(()),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected '@{want}', found {other:?}")))
            }
        }
    }

    fn sym(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Sym(s) => Ok(s),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected a @symbol, found {other:?}")))
            }
        }
    }

    fn ident(&mut self) -> Result<String> {
        match self.next()? {
            Tok::Ident(s) => Ok(s),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected an identifier, found {other:?}")))
            }
        }
    }

    fn int(&mut self) -> Result<i64> {
        match self.next()? {
            Tok::Num(n) => n.parse().map_err(|_| {
                self.pos -= 1;
                self.err(format!("expected an integer, found '{n}'"))
            }),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected an integer, found {other:?}")))
            }
        }
    }

    fn float(&mut self) -> Result<f32> {
        match self.next()? {
            Tok::Num(n) | Tok::Ident(n) => n.parse().map_err(|_| {
                self.pos -= 1;
                self.err(format!("expected a float, found '{n}'"))
            }),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected a float, found {other:?}")))
            }
        }
    }

    fn id_for(&mut self, written: &str) -> ValueId {
        let n = super::print::resolved(written, &self.scope);
        if let Some(&id) = self.ids.get(&n) {
            return id;
        }
        let id = self.prog.add_value(ValueDef::new(TensorType::new(vec![], DType::F32)));
        self.defined.push(false);
        // Called right after the `%n` token was consumed.
        self.first_mention.push(self.toks.get(self.pos.saturating_sub(1)).map_or((0, 0), |t| (t.line, t.col)));
        self.ids.insert(n, id);
        id
    }

    /// The spec a printed name stands for, created on first mention (defined by the table).
    fn spec_for(&mut self, n: String, at: (usize, usize)) -> SpecId {
        if let Some(&id) = self.spec_ids.get(&n) {
            return id;
        }
        let id = self.prog.add_spec(QuantSpec::new(QuantSpecKind::Raw { dtype: DType::F32 }));
        self.spec_defined.push(false);
        self.spec_first_mention.push(at);
        self.spec_ids.insert(n, id);
        id
    }

    /// `{ s<n> = Kind(fields) [params]? ... }` after `quant.specs`.
    fn spec_table(&mut self) -> Result<()> {
        self.expect('{')?;
        while !self.eat('}') {
            let at = self.toks.get(self.pos).map_or((0, 0), |t| (t.line, t.col));
            let n = match self.next()? {
                Tok::Ident(s) if spec_number(&s).is_some() => s,
                Tok::SpecRef(s) => format!("${}", super::print::resolved(&s, "")),
                Tok::Ident(s) => return Err(self.err_prev(format!("expected $name or s<n>, found '{s}'"))),
                other => return Err(self.err_prev(format!("expected a spec name $name, found {other:?}"))),
            };
            self.expect('=')?;
            let kind_name = self.ident()?;
            self.expect('(')?;
            let mut args = Vec::new();
            while !self.eat(')') {
                match self.next()? {
                    Tok::Num(t) | Tok::Ident(t) => args.push(t),
                    other => return Err(self.err_prev(format!("expected a spec field, found {other:?}"))),
                }
                if !self.eat(',') {
                    self.expect(')')?;
                    break;
                }
            }
            let kind = QuantSpecKind::from_parts(&kind_name, &args).map_err(|e| self.err_prev(e.to_string()))?;
            let params = if self.peek() == Some(&Tok::Punct('[')) {
                let attrs = self.attrs()?;
                Some(SpecParams::from_attrs(attrs).map_err(|e| self.err_prev(e.to_string()))?)
            } else {
                None
            };
            let id = self.spec_for(n.clone(), at);
            if std::mem::replace(&mut self.spec_defined[id.index()], true) {
                return Err(Error::Parse { line: at.0, column: at.1, message: format!("spec {n} defined twice") });
            }
            *self.prog.spec_mut(id) = QuantSpec { kind, params };
        }
        Ok(())
    }

    fn bare(&mut self) -> Result<ValueId> {
        match self.next()? {
            Tok::Val(n) => Ok(self.id_for(&n)),
            other => {
                self.pos -= 1;
                Err(self.err(format!("expected a %value, found {other:?}")))
            }
        }
    }

    /// `%n:tensor<[dims], DType, Device>[@sym][attrs]`
    fn typed(&mut self) -> Result<ValueId> {
        let start = self.pos;
        let id = self.bare()?;
        self.expect(':')?;
        if self.ident()? != "tensor" {
            self.pos -= 1;
            return Err(self.err("expected 'tensor'"));
        }
        self.expect('<')?;
        self.expect('[')?;
        let mut shape = Vec::new();
        while !self.eat(']') {
            shape.push(self.int()? as usize);
            self.eat(',');
        }
        self.expect(',')?;
        let dtype: DType = self.ident()?.parse().map_err(|e: UnknownName| self.err_prev(e.to_string()))?;
        self.expect(',')?;
        let device: Device = self.ident()?.parse().map_err(|e: UnknownName| self.err_prev(e.to_string()))?;
        self.expect('>')?;
        let mut def = ValueDef::new(TensorType { shape, dtype, device });
        if self.peek() == Some(&Tok::Punct('['))
            && matches!(self.toks.get(self.pos + 1).map(|t| &t.tok), Some(Tok::Sym(_)))
        {
            self.pos += 1;
            def.symbol = Some(self.sym()?);
            self.expect(']')?;
        }
        if self.peek() == Some(&Tok::Punct('[')) {
            let attrs = self.attrs()?;
            def.set_attrs(attrs).map_err(|e| self.err_prev(e.to_string()))?;
        }
        if self.defined[id.index()] {
            if self.prog.value(id) != &def {
                self.pos = start;
                return Err(self.err("value redeclared with a different type or attributes"));
            }
        } else {
            *self.prog.value_mut(id) = def;
            self.defined[id.index()] = true;
        }
        Ok(id)
    }

    fn list(&mut self, typed: bool) -> Result<Vec<ValueId>> {
        self.expect('(')?;
        let mut v = Vec::new();
        while !self.eat(')') {
            v.push(if typed { self.typed()? } else { self.bare()? });
            if !self.eat(',') {
                self.expect(')')?;
                break;
            }
        }
        Ok(v)
    }

    fn attrs(&mut self) -> Result<Attrs> {
        self.expect('[')?;
        let mut m = Attrs::new();
        while !self.eat(']') {
            let k = self.ident()?;
            self.expect(':')?;
            let v = self.attr_value()?;
            m.insert(k, v);
            if !self.eat(',') {
                self.expect(']')?;
                break;
            }
        }
        Ok(m)
    }

    fn attr_value(&mut self) -> Result<Attr> {
        match self.next()? {
            Tok::Str(s) => Ok(Attr::Str(s)),
            Tok::Num(n) if is_float_text(&n) => {
                n.parse().map(Attr::Float).map_err(|_| self.err(format!("bad float '{n}'")))
            }
            Tok::Num(n) => n.parse().map(Attr::Int).map_err(|_| self.err(format!("bad integer '{n}'"))),
            Tok::Punct('[') => {
                let mut texts = Vec::new();
                while !self.eat(']') {
                    match self.next()? {
                        Tok::Num(n) | Tok::Ident(n) => texts.push(n),
                        other => return Err(self.err(format!("expected a number in list, found {other:?}"))),
                    }
                    self.eat(',');
                }
                if texts.iter().any(|t| is_float_text(t)) {
                    let v: std::result::Result<Vec<f32>, _> = texts.iter().map(|t| t.parse()).collect();
                    v.map(Attr::Floats).map_err(|_| self.err("bad float in list"))
                } else {
                    let v: std::result::Result<Vec<i64>, _> = texts.iter().map(|t| t.parse()).collect();
                    v.map(Attr::Ints).map_err(|_| self.err("bad integer in list"))
                }
            }
            Tok::Ident(s) => match s.as_str() {
                "true" => Ok(Attr::Bool(true)),
                "false" => Ok(Attr::Bool(false)),
                "inf" | "NaN" => Ok(Attr::Float(s.parse().unwrap())),
                spec if spec_number(spec).is_some() => {
                    let at = self.toks.get(self.pos - 1).map_or((0, 0), |t| (t.line, t.col));
                    Ok(Attr::Spec(self.spec_for(spec.to_string(), at)))
                }
                "act" | "kv" | "fixed" | "const" | "rope" | "global" if self.peek() == Some(&Tok::Punct('(')) => {
                    self.expect('(')?;
                    let key = match self.next()? {
                        Tok::Str(k) => k,
                        other => return Err(self.err(format!("expected a quoted qdq key, found {other:?}"))),
                    };
                    let mut params = || -> Result<(f32, i32)> {
                        self.expect(',')?;
                        let s = self.float()?;
                        self.expect(',')?;
                        Ok((s, self.int()? as i32))
                    };
                    let kind = match s.as_str() {
                        "act" => QdqKind::Activation,
                        "kv" => QdqKind::KvCache,
                        "const" => QdqKind::Constant,
                        "rope" => QdqKind::Rope,
                        "fixed" => {
                            let (scale, zero_point) = params()?;
                            QdqKind::Fixed { scale, zero_point }
                        }
                        _ => {
                            let (scale, zero_point) = params()?;
                            QdqKind::Global { scale, zero_point }
                        }
                    };
                    self.expect(')')?;
                    Ok(Attr::Qdq(QdqAttr { kind, key }))
                }
                other => match other.parse::<DType>() {
                    Ok(d) => Ok(Attr::DType(d)),
                    Err(_) => Err(self.err(format!("unknown attribute value '{other}'"))),
                },
            },
            Tok::SpecRef(s) => {
                let at = self.toks.get(self.pos - 1).map_or((0, 0), |t| (t.line, t.col));
                let name = format!("${}", super::print::resolved(&s, &self.scope));
                Ok(Attr::Spec(self.spec_for(name, at)))
            }
            other => Err(self.err(format!("expected an attribute value, found {other:?}"))),
        }
    }

    fn region(&mut self) -> Result<Region> {
        let inputs = self.list(true)?;
        self.expect_arrow()?;
        let outputs = self.list(false)?;
        self.expect('{')?;
        let mut body = Vec::new();
        while !self.eat('}') {
            body.push(self.node()?);
        }
        Ok(Region { inputs, outputs, body })
    }

    fn node(&mut self) -> Result<Node> {
        let head = match self.next()? {
            Tok::Comment(c) => return Ok(Node::Comment(c)),
            Tok::Ident(h) => h,
            other => {
                self.pos -= 1;
                return Err(self.err(format!("expected an op, found {other:?}")));
            }
        };
        let parts: Vec<&str> = head.split('.').collect();
        match parts.as_slice() {
            ["graph", "SubGraphOp"] => {
                let symbol = self.sym()?;
                let device = match self.ident()?.as_str() {
                    "notype" => None,
                    d => Some(d.parse().map_err(|e: UnknownName| self.err_prev(e.to_string()))?),
                };
                let attrs = if self.peek() == Some(&Tok::Punct('[')) { self.attrs()? } else { Attrs::new() };
                self.expect('{')?;
                let outer = std::mem::replace(&mut self.scope, symbol.clone());
                let region = self.region()?;
                self.scope = outer;
                self.expect('}')?;
                Ok(Node::SubGraph(SubGraph { symbol, device, attrs, region }))
            }
            ["graph", "CallGraphOp"] => {
                let symbol = self.sym()?;
                let inputs = self.list(false)?;
                self.expect_arrow()?;
                let outputs = self.list(true)?;
                Ok(Node::Call(CallGraph { symbol, inputs, outputs }))
            }
            ["cf", "ReturnOp"] => {
                let vals = self.list(false)?;
                self.expect_arrow()?;
                self.list(false)?;
                Ok(Node::Return(vals))
            }
            ["tensor", dev, kind @ ("register" | "constant")] => {
                let device: Device = dev.parse().map_err(|e: UnknownName| self.err_prev(e.to_string()))?;
                let kind = kind.to_string();
                self.list(false)?;
                self.expect_arrow()?;
                let outs = self.list(true)?;
                let [value] = outs[..] else {
                    return Err(self.err(format!("tensor.{kind} defines exactly one value")));
                };
                Ok(if kind == "register" { Node::Register { device, value } } else { Node::Constant { device, value } })
            }
            ["linalg", dev, op] if op.ends_with("Op") => {
                let device: Device = dev.parse().map_err(|e: UnknownName| self.err_prev(e.to_string()))?;
                let type_name = op.trim_end_matches("Op").to_string();
                let mut name = None;
                if self.eat('<') {
                    if self.ident()? != "name" {
                        return Err(self.err("expected name=\"...\""));
                    }
                    self.expect('=')?;
                    match self.next()? {
                        Tok::Str(s) => name = Some(s),
                        other => return Err(self.err(format!("expected a quoted op name, found {other:?}"))),
                    }
                    self.expect('>')?;
                }
                let mut attrs = if self.peek() == Some(&Tok::Punct('[')) { self.attrs()? } else { Attrs::new() };
                let kind = OpKind::from_parts(&type_name, &mut attrs).map_err(|e| self.err(e.to_string()))?;
                let inputs = self.list(false)?;
                self.expect_arrow()?;
                let outputs = self.list(true)?;
                Ok(Node::Linalg(LinalgOp { device, kind, name, attrs, inputs, outputs }))
            }
            _ => {
                self.pos -= 1;
                Err(self.err(format!("unknown op '{head}'")))
            }
        }
    }
}

/// `s12` → 12.
fn spec_number(t: &str) -> Option<u32> {
    t.strip_prefix('s').filter(|d| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()))?.parse().ok()
}

fn is_float_text(t: &str) -> bool {
    t.contains(['.', 'e', 'E']) || t.contains("inf") || t.contains("NaN")
}
