//! The aspect language of XenLASY (seed 003, §3, Figs. 2-4): the XML file
//! with `<advice>` blocks (a pointcut and `<before>`/`<after>` C code) and
//! named `<xflow>` definitions (`<start>`, `<transit>`, `<quit>`), parsed
//! into a tree whose every node knows its line and column in the file.
//!
//! The file is the paper's notation, made well-formed where the paper's
//! figures were loose:
//! - several top-level elements are fine (they are read as if inside one
//!   `<aspect>` root; an explicit `<aspect>` root works too);
//! - C code in `<before>`, `<after>` and `<action>` may contain `<`, `&&` and
//!   `<<` as written (it is read as character data), or be a CDATA section;
//! - a `<field>` may follow its `<xin_move>`/`<xin_copy>` (as in Fig. 4) or
//!   sit inside it.
//!
//! Pointcut expressions (the text inside `<pointcut>`):
//! ```text
//! expr    := and ("OR" and)*
//! and     := unary ("AND" unary)*
//! unary   := "NOT" unary | "(" expr ")" | prim
//! prim    := access(STRUCT.MEMBER | STRUCT.%) | target(VAR)
//!          | local_var(PROGRAM_VAR, ADVICE_VAR) | within_function(F[@HOST])
//!          | within_file(PATH[@HOST]) | xflow(NAME, VAR[, ID_VAR])
//! ```
//! In a path, `...` stands for any number of directories (Fig. 4's
//! `drivers/.../netfront.c`).

use std::fmt;

/// A position in the aspect file (1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// A problem in an aspect file: where, what, and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diag {
    pub pos: Pos,
    pub msg: String,
}

impl fmt::Display for Diag {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}: {}", self.pos, self.msg)
    }
}

fn diag(pos: Pos, msg: impl Into<String>) -> Diag {
    Diag { pos, msg: msg.into() }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prim {
    /// access(S.M); member None for `%` (any member).
    Access { strukt: String, member: Option<String> },
    Target(String),
    /// local_var(program variable, advice variable)
    LocalVar { var: String, name: String },
    WithinFunction { func: String, host: Option<String> },
    WithinFile { path: String, host: Option<String> },
    Xflow { name: String, var: String, id: Option<String> },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Prim(Prim, Pos),
}

impl Expr {
    /// Every primitive, with its position, in source order.
    pub fn prims(&self) -> Vec<(&Prim, Pos)> {
        let mut out = Vec::new();
        fn walk<'a>(e: &'a Expr, out: &mut Vec<(&'a Prim, Pos)>) {
            match e {
                Expr::And(a, b) | Expr::Or(a, b) => {
                    walk(a, out);
                    walk(b, out);
                }
                Expr::Not(a) => walk(a, out),
                Expr::Prim(p, pos) => out.push((p, *pos)),
            }
        }
        walk(self, &mut out);
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointcut {
    pub pos: Pos,
    pub expr: Expr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Code {
    pub pos: Pos,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    pub pos: Pos,
    pub pointcut: Pointcut,
    pub before: Option<Code>,
    pub after: Option<Code>,
}

/// A `<start>` or `<quit>`: where a flow begins or ends, keyed by the
/// accessed struct instance or by `<select local_var=...>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub pos: Pos,
    pub pointcut: Pointcut,
    pub select: Option<(String, Pos)>,
    pub action: Option<Code>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub pos: Pos,
    pub name: String,
    /// First bit of the member the ID goes into, and how many bits.
    pub offset: u32,
    pub size: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    /// move (keep = false) or copy (keep = true) within one process
    Local { from: String, to: String, keep: bool },
    /// xin_move / xin_copy: the ID of `from` packed into `to`'s field
    Xin { name: String, from: String, to: String, keep: bool, field: Field },
    /// xout_move / xout_copy: the ID in `from` (a header) registered for `to`
    Xout { name: String, from: String, to: String, keep: bool },
    Action(Code),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transit {
    pub pos: Pos,
    pub pointcut: Pointcut,
    pub how: How,
    /// Where the move/copy/xin/xout element is.
    pub how_pos: Pos,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Xflow {
    pub pos: Pos,
    pub name: String,
    pub starts: Vec<Point>,
    pub transits: Vec<Transit>,
    pub quits: Vec<Point>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Aspect {
    pub advices: Vec<Advice>,
    pub xflows: Vec<Xflow>,
}

// ---------------------------------------------------------------------------
// The XML layer

/// Makes the paper's notation well-formed XML with the same lines: code
/// elements' contents become CDATA (unless they are already), and a file
/// without an `<aspect>` root gets one. Positions are kept line for line;
/// only columns after an inserted marker on its line shift.
fn prepare(src: &str) -> String {
    let mut out = String::with_capacity(src.len() + 256);
    let mut rest = src;
    'outer: loop {
        // the next opening code element
        let mut best: Option<(usize, &str)> = None;
        for tag in ["before", "after", "action"] {
            let open = format!("<{tag}>");
            if let Some(i) = rest.find(&open) {
                if best.map_or(true, |(b, _)| i < b) {
                    best = Some((i, tag));
                }
            }
        }
        let Some((i, tag)) = best else {
            out.push_str(rest);
            break 'outer;
        };
        let open = format!("<{tag}>");
        let close = format!("</{tag}>");
        let body_start = i + open.len();
        out.push_str(&rest[..body_start]);
        let Some(j) = rest[body_start..].find(&close) else {
            // unclosed: let the XML parser say so
            out.push_str(&rest[body_start..]);
            break 'outer;
        };
        let body = &rest[body_start..body_start + j];
        if body.contains("<![CDATA[") || body.contains("]]>") {
            out.push_str(body);
        } else {
            out.push_str("<![CDATA[");
            out.push_str(body);
            out.push_str("]]>");
        }
        out.push_str(&close);
        rest = &rest[body_start + j + close.len()..];
    }
    // one root
    let trimmed = out.trim_start();
    let decl_end = if trimmed.starts_with("<?xml") { out.find("?>").map(|k| k + 2) } else { None };
    let (head, body) = match decl_end {
        Some(k) => out.split_at(k),
        None => out.split_at(0),
    };
    if root_is_aspect(body) {
        return out;
    }
    format!("{head}{WRAP}{body}</aspect>")
}

/// The root given to a file without one (the attribute marks it ours).
const WRAP: &str = "<aspect bunkai-wrap=\"\">";

fn root_is_aspect(body: &str) -> bool {
    let doc = match roxmltree::Document::parse(body) {
        Ok(d) => d,
        Err(_) => return false,
    };
    doc.root_element().has_tag_name("aspect")
}

/// A position in the file as written (our root, if we added one, moves
/// nothing but the rest of its own line).
fn pos_of(doc: &roxmltree::Document, at: usize) -> Pos {
    let p = doc.text_pos_at(at);
    let mut pos = Pos { line: p.row, col: p.col };
    let root = doc.root_element();
    if root.attribute("bunkai-wrap").is_some() {
        let r = doc.text_pos_at(root.range().start);
        let n = WRAP.len() as u32;
        if pos.line == r.row && pos.col >= r.col + n {
            pos.col -= n;
        }
    }
    pos
}

fn node_pos(doc: &roxmltree::Document, n: roxmltree::Node) -> Pos {
    pos_of(doc, n.range().start)
}

/// The element's text (CDATA included) and where it starts.
fn text_of(doc: &roxmltree::Document, n: roxmltree::Node) -> (String, Pos) {
    let mut s = String::new();
    let mut pos = None;
    for c in n.children().filter(|c| c.is_text()) {
        if pos.is_none() {
            pos = Some(pos_of(doc, c.range().start));
        }
        s.push_str(c.text().unwrap_or(""));
    }
    (s, pos.unwrap_or_else(|| node_pos(doc, n)))
}

/// A code element's text; its position is right after the start tag (the
/// first character of the code as written, before any CDATA marker).
fn code_of(doc: &roxmltree::Document, n: roxmltree::Node) -> Code {
    let (text, _) = text_of(doc, n);
    let mut pos = node_pos(doc, n);
    pos.col += n.tag_name().name().len() as u32 + 2;
    Code { pos, text }
}

fn attr(doc: &roxmltree::Document, n: roxmltree::Node, name: &str) -> Result<String, Diag> {
    match n.attribute(name) {
        Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
        _ => Err(diag(
            node_pos(doc, n),
            format!("<{}> needs a {name}=\"...\" attribute", n.tag_name().name()),
        )),
    }
}

fn elements<'a, 'i>(n: roxmltree::Node<'a, 'i>) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    n.children().filter(|c| c.is_element())
}

/// Character data where only elements may be.
fn stray_text(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<(), Diag> {
    for c in n.children().filter(|c| c.is_text()) {
        let t = c.text().unwrap_or("");
        if let Some(k) = t.find(|ch: char| !ch.is_whitespace()) {
            let pos = pos_of(doc, c.range().start + k);
            let word: String = t[k..].chars().take(20).collect();
            return Err(diag(
                pos,
                format!("text \"{}\" inside <{}> (only elements go here)", word.trim(), n.tag_name().name()),
            ));
        }
    }
    Ok(())
}

/// Parses an aspect file. The first problem found is the error.
pub fn parse(src: &str) -> Result<Aspect, Diag> {
    let prepared = prepare(src);
    let doc = roxmltree::Document::parse(&prepared).map_err(|e| {
        let p = e.pos();
        diag(Pos { line: p.row, col: p.col }, format!("not well-formed XML: {}", xml_error_text(&e)))
    })?;
    let root = doc.root_element();
    let mut a = Aspect::default();
    stray_text(&doc, root)?;
    for n in elements(root) {
        match n.tag_name().name() {
            "advice" | "aspect" => a.advices.push(parse_advice(&doc, n)?),
            "xflow" => a.xflows.push(parse_xflow(&doc, n)?),
            other => {
                return Err(diag(
                    node_pos(&doc, n),
                    format!("unknown element <{other}> (expected <advice> or <xflow>)"),
                ))
            }
        }
    }
    if a.advices.is_empty() && a.xflows.is_empty() {
        return Err(diag(Pos { line: 1, col: 1 }, "no <advice> and no <xflow> in the file"));
    }
    Ok(a)
}

fn xml_error_text(e: &roxmltree::Error) -> String {
    // roxmltree appends " at LINE:COL"; the position is ours to print
    let s = e.to_string();
    match s.rfind(" at ") {
        Some(k) if s[k + 4..].chars().all(|c| c.is_ascii_digit() || c == ':') => s[..k].to_string(),
        _ => s,
    }
}

fn one<'a, 'i>(
    doc: &roxmltree::Document,
    parent: roxmltree::Node<'a, 'i>,
    tag: &str,
) -> Result<Option<roxmltree::Node<'a, 'i>>, Diag> {
    let mut found = None;
    for c in elements(parent).filter(|c| c.has_tag_name(tag)) {
        if found.is_some() {
            return Err(diag(
                node_pos(doc, c),
                format!("a second <{tag}> in <{}> (one is allowed)", parent.tag_name().name()),
            ));
        }
        found = Some(c);
    }
    Ok(found)
}

fn pointcut_of(doc: &roxmltree::Document, parent: roxmltree::Node) -> Result<Pointcut, Diag> {
    let Some(pc) = one(doc, parent, "pointcut")? else {
        return Err(diag(
            node_pos(doc, parent),
            format!("<{}> has no <pointcut>", parent.tag_name().name()),
        ));
    };
    if let Some(c) = elements(pc).next() {
        return Err(diag(node_pos(doc, c), "an element inside <pointcut> (it holds an expression)"));
    }
    let (text, pos) = text_of(doc, pc);
    let expr = parse_expr(&text, pos)?;
    Ok(Pointcut { pos, expr })
}

fn only(doc: &roxmltree::Document, n: roxmltree::Node, allowed: &[&str]) -> Result<(), Diag> {
    stray_text(doc, n)?;
    for c in elements(n) {
        if !allowed.contains(&c.tag_name().name()) {
            return Err(diag(
                node_pos(doc, c),
                format!(
                    "unknown element <{}> in <{}> (allowed: {})",
                    c.tag_name().name(),
                    n.tag_name().name(),
                    allowed.iter().map(|t| format!("<{t}>")).collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    Ok(())
}

fn parse_advice(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Advice, Diag> {
    only(doc, n, &["pointcut", "before", "after"])?;
    let pointcut = pointcut_of(doc, n)?;
    let before = one(doc, n, "before")?.map(|b| code_of(doc, b));
    let after = one(doc, n, "after")?.map(|b| code_of(doc, b));
    if before.is_none() && after.is_none() {
        return Err(diag(node_pos(doc, n), "<advice> has no <before> and no <after> (nothing to run)"));
    }
    Ok(Advice { pos: node_pos(doc, n), pointcut, before, after })
}

fn parse_point(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Point, Diag> {
    only(doc, n, &["pointcut", "select", "action"])?;
    let pointcut = pointcut_of(doc, n)?;
    let select = match one(doc, n, "select")? {
        Some(s) => Some((attr(doc, s, "local_var")?, node_pos(doc, s))),
        None => None,
    };
    let action = one(doc, n, "action")?.map(|b| code_of(doc, b));
    Ok(Point { pos: node_pos(doc, n), pointcut, select, action })
}

fn parse_field(doc: &roxmltree::Document, f: roxmltree::Node) -> Result<Field, Diag> {
    let num = |name: &str| -> Result<u32, Diag> {
        let v = attr(doc, f, name)?;
        v.parse::<u32>().map_err(|_| {
            diag(node_pos(doc, f), format!("<field {name}=\"{v}\">: not a whole number of bits"))
        })
    };
    Ok(Field { pos: node_pos(doc, f), name: attr(doc, f, "name")?, offset: num("offset")?, size: num("size")? })
}

fn parse_transit(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Transit, Diag> {
    const HOWS: [&str; 7] = ["move", "copy", "xin_move", "xin_copy", "xout_move", "xout_copy", "action"];
    only(doc, n, &["pointcut", "move", "copy", "xin_move", "xin_copy", "xout_move", "xout_copy", "action", "field"])?;
    let pointcut = pointcut_of(doc, n)?;
    let hows: Vec<_> = elements(n).filter(|c| HOWS.contains(&c.tag_name().name())).collect();
    let h = match hows.as_slice() {
        [h] => *h,
        [] => {
            return Err(diag(
                node_pos(doc, n),
                "<transit> says nothing about the ID (add <move>, <copy>, <xin_move>, <xin_copy>, <xout_move>, <xout_copy> or <action>)",
            ))
        }
        [_, second, ..] => {
            return Err(diag(node_pos(doc, *second), "a second way to pass the ID in one <transit> (write another <transit>)"))
        }
    };
    let tag = h.tag_name().name();
    let how_pos = node_pos(doc, h);
    // a field inside the xin element, or beside it
    let fields: Vec<_> = elements(h).filter(|c| c.has_tag_name("field")).chain(elements(n).filter(|c| c.has_tag_name("field"))).collect();
    let how = match tag {
        "action" => How::Action(code_of(doc, h)),
        "move" | "copy" => {
            only(doc, h, &[])?;
            How::Local { from: attr(doc, h, "from")?, to: attr(doc, h, "to")?, keep: tag == "copy" }
        }
        "xin_move" | "xin_copy" => {
            only(doc, h, &["field"])?;
            let field = match fields.as_slice() {
                [f] => parse_field(doc, *f)?,
                [] => {
                    return Err(diag(
                        how_pos,
                        format!("<{tag}> needs a <field name=\"MEMBER\" offset=\"BIT\" size=\"BITS\"/> saying where the ID goes"),
                    ))
                }
                [_, second, ..] => return Err(diag(node_pos(doc, *second), "a second <field> (one header field carries the ID)")),
            };
            How::Xin { name: attr(doc, h, "name")?, from: attr(doc, h, "from")?, to: attr(doc, h, "to")?, keep: tag == "xin_copy", field }
        }
        _ => {
            only(doc, h, &[])?;
            if let Some(f) = fields.first() {
                return Err(diag(
                    node_pos(doc, *f),
                    format!("<field> goes with <xin_move>/<xin_copy>; <{tag}> reads the one its xin names"),
                ));
            }
            How::Xout { name: attr(doc, h, "name")?, from: attr(doc, h, "from")?, to: attr(doc, h, "to")?, keep: tag == "xout_copy" }
        }
    };
    if !matches!(how, How::Xin { .. } | How::Xout { .. }) {
        if let Some(f) = fields.first() {
            return Err(diag(node_pos(doc, *f), "<field> goes with <xin_move>/<xin_copy> only"));
        }
    }
    Ok(Transit { pos: node_pos(doc, n), pointcut, how, how_pos })
}

fn parse_xflow(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Xflow, Diag> {
    only(doc, n, &["start", "transit", "quit"])?;
    let name = attr(doc, n, "name")?;
    if !is_ident(&name) {
        return Err(diag(node_pos(doc, n), format!("xflow name \"{name}\" is not a C identifier (letters, digits, _)")));
    }
    let mut x = Xflow { pos: node_pos(doc, n), name, starts: vec![], transits: vec![], quits: vec![] };
    for c in elements(n) {
        match c.tag_name().name() {
            "start" => x.starts.push(parse_point(doc, c)?),
            "quit" => x.quits.push(parse_point(doc, c)?),
            _ => x.transits.push(parse_transit(doc, c)?),
        }
    }
    if x.starts.is_empty() {
        return Err(diag(x.pos, format!("xflow {} has no <start> (no flow would ever begin)", x.name)));
    }
    Ok(x)
}

pub fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    matches!(c.next(), Some(ch) if ch.is_ascii_alphabetic() || ch == '_') && c.all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
}

// ---------------------------------------------------------------------------
// Pointcut expressions

struct Lexer<'a> {
    s: &'a str,
    at: usize,
    start: Pos,
}

impl<'a> Lexer<'a> {
    fn pos_at(&self, at: usize) -> Pos {
        let before = &self.s[..at];
        match before.rfind('\n') {
            Some(k) => Pos {
                line: self.start.line + before.matches('\n').count() as u32,
                col: (before[k + 1..].chars().count() + 1) as u32,
            },
            None => Pos { line: self.start.line, col: self.start.col + before.chars().count() as u32 },
        }
    }
    fn skip_ws(&mut self) {
        while let Some(c) = self.s[self.at..].chars().next() {
            if !c.is_whitespace() {
                break;
            }
            self.at += c.len_utf8();
        }
    }
    fn peek_word(&mut self) -> &'a str {
        self.skip_ws();
        let rest = &self.s[self.at..];
        let n = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        &rest[..n]
    }
    fn eat_word(&mut self, w: &str) -> bool {
        if self.peek_word() == w {
            self.at += w.len();
            true
        } else {
            false
        }
    }
    fn eat_char(&mut self, ch: char) -> bool {
        self.skip_ws();
        if self.s[self.at..].starts_with(ch) {
            self.at += 1;
            true
        } else {
            false
        }
    }
    fn here(&mut self) -> Pos {
        self.skip_ws();
        self.pos_at(self.at)
    }
}

fn parse_expr(text: &str, start: Pos) -> Result<Expr, Diag> {
    let mut lx = Lexer { s: text, at: 0, start };
    if lx.peek_word().is_empty() && lx.s[lx.at..].trim().is_empty() {
        return Err(diag(start, "empty <pointcut> (write e.g. access(pkt.len) AND within_function(f))"));
    }
    let e = or_expr(&mut lx)?;
    lx.skip_ws();
    if lx.at < text.len() {
        let p = lx.pos_at(lx.at);
        let word: String = text[lx.at..].chars().take_while(|c| !c.is_whitespace()).collect();
        return Err(diag(p, format!("unexpected \"{word}\" in the pointcut (join terms with AND, OR, NOT)")));
    }
    Ok(e)
}

fn or_expr(lx: &mut Lexer) -> Result<Expr, Diag> {
    let mut e = and_expr(lx)?;
    while lx.eat_word("OR") {
        e = Expr::Or(Box::new(e), Box::new(and_expr(lx)?));
    }
    Ok(e)
}

fn and_expr(lx: &mut Lexer) -> Result<Expr, Diag> {
    let mut e = unary(lx)?;
    while lx.eat_word("AND") {
        e = Expr::And(Box::new(e), Box::new(unary(lx)?));
    }
    Ok(e)
}

fn unary(lx: &mut Lexer) -> Result<Expr, Diag> {
    if lx.eat_word("NOT") {
        return Ok(Expr::Not(Box::new(unary(lx)?)));
    }
    if lx.eat_char('(') {
        let e = or_expr(lx)?;
        if !lx.eat_char(')') {
            let p = lx.here();
            return Err(diag(p, "missing ')'"));
        }
        return Ok(e);
    }
    prim(lx)
}

const PRIMS: &str = "access, target, local_var, within_function, within_file, xflow";

fn prim(lx: &mut Lexer) -> Result<Expr, Diag> {
    let pos = lx.here();
    let name = lx.peek_word();
    if name.is_empty() {
        let found: String = lx.s[lx.at..].chars().take(10).collect();
        return Err(diag(
            pos,
            if found.is_empty() { "the pointcut ends where a term was expected".to_string() } else { format!("expected a term ({PRIMS}), found \"{}\"", found.trim()) },
        ));
    }
    lx.at += name.len();
    if !lx.eat_char('(') {
        return Err(diag(pos, format!("\"{name}\" is not followed by '(' (terms: {PRIMS})")));
    }
    let open = lx.at;
    let close = match lx.s[open..].find(')') {
        Some(k) => open + k,
        None => return Err(diag(pos, format!("{name}( is not closed with ')'"))),
    };
    let inner = &lx.s[open..close];
    lx.at = close + 1;
    let args: Vec<String> = inner.split(',').map(|a| a.trim().to_string()).collect();
    let n = if inner.trim().is_empty() { 0 } else { args.len() };
    let want = |lo: usize, hi: usize, form: &str| -> Result<(), Diag> {
        if n < lo || n > hi {
            Err(diag(pos, format!("{name} takes {form}, got {n} argument{}", if n == 1 { "" } else { "s" })))
        } else {
            Ok(())
        }
    };
    let ident = |s: &str, what: &str| -> Result<String, Diag> {
        if is_ident(s) {
            Ok(s.to_string())
        } else {
            Err(diag(pos, format!("{name}: {what} \"{s}\" is not a C identifier")))
        }
    };
    let split_host = |s: &str| -> (String, Option<String>) {
        match s.rsplit_once('@') {
            Some((a, h)) if !h.is_empty() => (a.to_string(), Some(h.to_string())),
            _ => (s.to_string(), None),
        }
    };
    let p = match name {
        "access" => {
            want(1, 1, "STRUCT.MEMBER or STRUCT.%")?;
            let Some((s, m)) = args[0].split_once('.') else {
                return Err(diag(pos, format!("access({}): write STRUCT.MEMBER or STRUCT.% (e.g. access(pkt.len))", args[0])));
            };
            let strukt = ident(s.trim(), "struct")?;
            let m = m.trim();
            let member = if m == "%" { None } else { Some(ident(m, "member")?) };
            Prim::Access { strukt, member }
        }
        "target" => {
            want(1, 1, "one variable")?;
            Prim::Target(ident(&args[0], "variable")?)
        }
        "local_var" => {
            want(2, 2, "(PROGRAM_VARIABLE, ADVICE_NAME)")?;
            // $value: what the load read, at the sleds after loads; $retval:
            // what the function returns, at its exit sleds (both <after>)
            let var = if args[0] == "$value" || args[0] == "$retval" { args[0].clone() } else { ident(&args[0], "variable")? };
            Prim::LocalVar { var, name: ident(&args[1], "name")? }
        }
        "within_function" => {
            want(1, 1, "FUNCTION or FUNCTION@HOST")?;
            let (f, host) = split_host(&args[0]);
            Prim::WithinFunction { func: ident(&f, "function")?, host }
        }
        "within_file" => {
            want(1, 1, "PATH or PATH@HOST")?;
            let (path, host) = split_host(&args[0]);
            if path.is_empty() {
                return Err(diag(pos, "within_file(): no path"));
            }
            Prim::WithinFile { path, host }
        }
        "xflow" => {
            want(2, 3, "(XFLOW_NAME, VARIABLE[, ID_VARIABLE])")?;
            Prim::Xflow {
                name: ident(&args[0], "xflow name")?,
                var: ident(&args[1], "variable")?,
                id: if n == 3 { Some(ident(&args[2], "ID variable")?) } else { None },
            }
        }
        "AND" | "OR" | "NOT" => return Err(diag(pos, format!("{name} where a term was expected"))),
        other => return Err(diag(pos, format!("unknown pointcut \"{other}\" (known: {PRIMS})"))),
    };
    Ok(Expr::Prim(p, pos))
}

/// Does a join point's file match a within_file path? A path matches itself
/// or any path ending in /PATH; `...` stands for any directories.
pub fn path_matches(pattern: &str, file: &str) -> bool {
    let pat: Vec<&str> = pattern.split('/').filter(|s| !s.is_empty()).collect();
    let f: Vec<&str> = file.split('/').filter(|s| !s.is_empty()).collect();
    // suffix match with "..." as any run of segments
    fn m(p: &[&str], f: &[&str]) -> bool {
        match p.split_last() {
            None => true,
            Some((last, rest)) if *last == "..." => (0..=f.len()).any(|k| m(rest, &f[..k])),
            Some((last, rest)) => match f.split_last() {
                Some((fl, frest)) if fl == last => {
                    if rest.is_empty() {
                        true
                    } else {
                        m(rest, frest)
                    }
                }
                _ => false,
            },
        }
    }
    !pat.is_empty() && m(&pat, &f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's Figs. 2-4 in one file, with C that is not valid XML.
    pub const PAPER: &str = r#"<advice>
  <pointcut>
    access(sk_buff.%) AND target(skb) AND
    xflow(netflow, skb, id)
  </pointcut>
  <before>
    long long tsc;
    DO_RDTSC(tsc);
    if (tsc && id << 1) STORE_DATA3($pc$, tsc, id);
  </before>
</advice>
<xflow name="netflow">
  <start>
    <pointcut>access(sk_buff.data) AND within_function(alloc_skb_from_cache)</pointcut>
  </start>
  <transit>
    <pointcut>access(sk_buff.head) AND within_function(skb_clone)</pointcut>
    <move from="skb" to="n" />
  </transit>
  <transit>
    <pointcut>
      access(netif_tx_request.flags) AND within_file(drivers/.../netfront.c@linuxU)
    </pointcut>
    <xin_move name="netin" from="skb" to="tx" />
    <field name="flags" offset="4" size="12" />
  </transit>
  <transit>
    <pointcut>access(netif_tx_request.flags) AND within_file(drivers/.../netback.c@linux0)</pointcut>
    <xout_move name="netin" from="tx" to="skb" />
  </transit>
  <quit>
    <pointcut>access(sk_buff.%) AND within_function(_kfree_skb)</pointcut>
  </quit>
</xflow>
"#;

    #[test]
    fn the_papers_figures_parse() {
        let a = parse(PAPER).unwrap();
        assert_eq!(a.advices.len(), 1);
        let ad = &a.advices[0];
        assert_eq!(ad.pointcut.pos, Pos { line: 2, col: 13 });
        let prims: Vec<_> = ad.pointcut.expr.prims().into_iter().map(|(p, pos)| (p.clone(), pos)).collect();
        assert_eq!(prims[0], (Prim::Access { strukt: "sk_buff".into(), member: None }, Pos { line: 3, col: 5 }));
        assert_eq!(prims[1].0, Prim::Target("skb".into()));
        assert_eq!(prims[2], (Prim::Xflow { name: "netflow".into(), var: "skb".into(), id: Some("id".into()) }, Pos { line: 4, col: 5 }));
        let before = ad.before.as_ref().unwrap();
        assert!(before.text.contains("tsc && id << 1"), "{:?}", before.text);
        assert_eq!(before.pos, Pos { line: 6, col: 11 });
        let x = &a.xflows[0];
        assert_eq!((x.name.as_str(), x.starts.len(), x.transits.len(), x.quits.len()), ("netflow", 1, 3, 1));
        assert_eq!(x.transits[0].how, How::Local { from: "skb".into(), to: "n".into(), keep: false });
        match &x.transits[1].how {
            How::Xin { name, from, to, keep, field } => {
                assert_eq!((name.as_str(), from.as_str(), to.as_str(), *keep), ("netin", "skb", "tx", false));
                assert_eq!((field.name.as_str(), field.offset, field.size, field.pos.line), ("flags", 4, 12, 25));
            }
            h => panic!("{h:?}"),
        }
        let p = x.transits[1].pointcut.expr.prims();
        assert_eq!(*p[1].0, Prim::WithinFile { path: "drivers/.../netfront.c".into(), host: Some("linuxU".into()) });
        assert_eq!(x.transits[2].how, How::Xout { name: "netin".into(), from: "tx".into(), to: "skb".into(), keep: false });
    }

    #[test]
    fn an_explicit_root_and_cdata_work_too() {
        let src = "<?xml version=\"1.0\"?>\n<aspect>\n<advice><pointcut>within_function(f)</pointcut>\n<after><![CDATA[ if (a < b) x(); ]]></after></advice>\n</aspect>\n";
        let a = parse(src).unwrap();
        assert_eq!(a.advices[0].after.as_ref().unwrap().text, " if (a < b) x(); ");
    }

    fn err(src: &str) -> String {
        parse(src).unwrap_err().to_string()
    }

    #[test]
    fn precedence_and_parentheses() {
        let a = parse("<advice><pointcut>NOT within_function(a) AND (access(s.x) OR access(s.y))</pointcut><before>;</before></advice>").unwrap();
        match &a.advices[0].pointcut.expr {
            Expr::And(l, r) => {
                assert!(matches!(**l, Expr::Not(_)));
                assert!(matches!(**r, Expr::Or(_, _)));
            }
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn bad_aspects_name_the_place() {
        assert_eq!(err("hello"), "1:1: text \"hello\" inside <aspect> (only elements go here)");
        assert_eq!(
            err("<advice>\n<pointcut>\n  acess(pkt.len)\n</pointcut><before>;</before></advice>"),
            "3:3: unknown pointcut \"acess\" (known: access, target, local_var, within_function, within_file, xflow)"
        );
        assert!(err("<advice><pointcut>access(pkt)</pointcut><before>;</before></advice>").contains("STRUCT.MEMBER"));
        assert!(err("<advice><pointcut>access(p.x) target(p)</pointcut><before>;</before></advice>").starts_with("1:31: unexpected \"target(p)\""));
        assert!(err("<advice><pointcut>(access(p.x)</pointcut><before>;</before></advice>").contains("missing ')'"));
        assert!(err("<advice><pointcut>access(p.x) AND</pointcut><before>;</before></advice>").contains("ends where a term"));
        assert!(err("<advice><pointcut>local_var(a)</pointcut><before>;</before></advice>").contains("local_var takes (PROGRAM_VARIABLE, ADVICE_NAME), got 1 argument"));
        assert!(err("<advice><pointcut>access(p.x)</pointcut></advice>").contains("no <before> and no <after>"));
        assert!(err("<advice><before>;</before></advice>").contains("<advice> has no <pointcut>"));
        assert!(err("<xflow name=\"f\"><quit><pointcut>access(p.x)</pointcut></quit></xflow>").contains("xflow f has no <start>"));
        assert!(err("<xflow><start><pointcut>access(p.x)</pointcut></start></xflow>").contains("name=\"...\""));
        assert!(err("<xflow name=\"f\"><start><pointcut>access(p.x)</pointcut></start><transit><pointcut>access(p.x)</pointcut></transit></xflow>").contains("says nothing about the ID"));
        assert!(err("<xflow name=\"f\"><start><pointcut>access(p.x)</pointcut></start><transit><pointcut>access(p.x)</pointcut><xin_move name=\"a\" from=\"b\" to=\"c\"/></transit></xflow>").contains("needs a <field"));
        assert!(err("<xflow name=\"f\"><start><pointcut>access(p.x)</pointcut></start><transit><pointcut>access(p.x)</pointcut><xin_copy name=\"a\" from=\"b\" to=\"c\"/><field name=\"h\" offset=\"x\" size=\"3\"/></transit></xflow>").contains("not a whole number"));
        assert!(err("<bogus/>").contains("unknown element <bogus>"));
        assert!(err("<advice><pointcut>access(p.x)</pointcut><before>;</before>").contains("not well-formed XML"));
        assert!(err("").contains("no <advice> and no <xflow>") || err("").contains("well-formed"));
    }

    #[test]
    fn paths_match_by_suffix_with_ellipses() {
        assert!(path_matches("netfront.c", "/src/drivers/net/netfront.c"));
        assert!(path_matches("drivers/.../netfront.c", "/src/drivers/net/xen/netfront.c"));
        assert!(path_matches("drivers/.../netfront.c", "drivers/netfront.c"));
        assert!(!path_matches("drivers/.../netfront.c", "/src/net/netfront.c"));
        assert!(!path_matches("front.c", "/src/netfront.c"));
        assert!(!path_matches("", "/a.c"));
    }

    /// Mutated aspects never panic the parser.
    #[test]
    fn fuzzed_aspects_fail_cleanly() {
        let base = PAPER.as_bytes();
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..3000 {
            let mut b = base.to_vec();
            for _ in 0..(seed % 5 + 1) {
                if b.is_empty() {
                    break;
                }
                crate::xorshift(&mut seed);
                let at = (seed % b.len() as u64) as usize;
                match seed % 3 {
                    0 => b[at] = b"<>()&,.@%/ \"\n=ANDx"[(seed >> 8) as usize % 18],
                    1 => {
                        b.remove(at);
                    }
                    _ => b.truncate(at),
                }
            }
            if let Ok(s) = String::from_utf8(b) {
                let _ = parse(&s);
            }
        }
    }
}
