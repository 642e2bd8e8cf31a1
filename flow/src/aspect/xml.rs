//! The aspect file as XML (roxmltree), into the model of mod.rs, every
//! node with its line and column.

use super::*;

// ---------------------------------------------------------------------------
// The XML layer

/// Makes the paper's notation well-formed XML with the same lines: code
/// elements' contents become CDATA (unless they are already), and a file
/// without an `<aspect>` root gets one. Positions are kept line for line;
/// only columns after an inserted marker on its line shift.
pub(super) fn prepare(src: &str) -> String {
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
pub(super) const WRAP: &str = "<aspect bunkai-wrap=\"\">";

pub(super) fn root_is_aspect(body: &str) -> bool {
    let doc = match roxmltree::Document::parse(body) {
        Ok(d) => d,
        Err(_) => return false,
    };
    doc.root_element().has_tag_name("aspect")
}

/// A position in the file as written (our root, if we added one, moves
/// nothing but the rest of its own line).
pub(super) fn pos_of(doc: &roxmltree::Document, at: usize) -> Pos {
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

pub(super) fn node_pos(doc: &roxmltree::Document, n: roxmltree::Node) -> Pos {
    pos_of(doc, n.range().start)
}

/// The element's text (CDATA included) and where it starts.
pub(super) fn text_of(doc: &roxmltree::Document, n: roxmltree::Node) -> (String, Pos) {
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
pub(super) fn code_of(doc: &roxmltree::Document, n: roxmltree::Node) -> Code {
    let (text, _) = text_of(doc, n);
    let mut pos = node_pos(doc, n);
    pos.col += n.tag_name().name().len() as u32 + 2;
    Code { pos, text }
}

pub(super) fn attr(doc: &roxmltree::Document, n: roxmltree::Node, name: &str) -> Result<String, Diag> {
    match n.attribute(name) {
        Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
        _ => Err(diag(
            node_pos(doc, n),
            format!("<{}> needs a {name}=\"...\" attribute", n.tag_name().name()),
        )),
    }
}

pub(super) fn elements<'a, 'i>(n: roxmltree::Node<'a, 'i>) -> impl Iterator<Item = roxmltree::Node<'a, 'i>> {
    n.children().filter(|c| c.is_element())
}

/// Character data where only elements may be.
pub(super) fn stray_text(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<(), Diag> {
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
    if let Some(d) = unclosed_code(src) {
        return Err(d);
    }
    let prepared = prepare(src);
    let doc = roxmltree::Document::parse(&prepared).map_err(|e| {
        if let roxmltree::Error::UnexpectedCloseTag(expected, actual, at) = &e {
            // an element left open: name it where it was opened, not where
            // the parser noticed (the end of the file, under our root)
            if let Some(open) = last_open(src, expected, at.row) {
                let where_ = if actual == "aspect" && prepared.contains(WRAP) {
                    "is never closed".to_string()
                } else {
                    format!("is not closed before </{actual}> (line {})", at.row)
                };
                return diag(open, format!("<{expected}> {where_} (add </{expected}>)"));
            }
        }
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

/// A code element (<before>, <after>, <action>) opened and never closed:
/// its code would run to the end of the file.
fn unclosed_code(src: &str) -> Option<Diag> {
    let mut rest = 0;
    loop {
        let (i, tag) = ["before", "after", "action"]
            .iter()
            .filter_map(|t| src[rest..].find(&format!("<{t}>")).map(|i| (rest + i, *t)))
            .min()?;
        let body = i + tag.len() + 2;
        match src[body..].find(&format!("</{tag}>")) {
            Some(j) => rest = body + j + tag.len() + 3,
            None => return Some(diag(pos_in(src, i), format!("<{tag}> is never closed (add </{tag}> after its code)"))),
        }
    }
}

/// Line and column (1-based) of byte offset at in src.
fn pos_in(src: &str, at: usize) -> Pos {
    let before = &src[..at];
    let line = before.matches('\n').count() as u32 + 1;
    let col = (at - before.rfind('\n').map_or(0, |k| k + 1)) as u32 + 1;
    Pos { line, col }
}

/// Where the last `<name>` (or `<name ...>`) that opens before line `upto`
/// and is not closed after it was opened: the element left open.
fn last_open(src: &str, name: &str, upto: u32) -> Option<Pos> {
    let open = format!("<{name}");
    let close = format!("</{name}>");
    let mut depth_at: Vec<usize> = Vec::new();
    let mut k = 0;
    while k < src.len() {
        let o = src[k..].find(&open).map(|i| k + i);
        let c = src[k..].find(&close).map(|i| k + i);
        match (o, c) {
            (Some(o), c) if c.map_or(true, |c| o < c) => {
                let after = src[o + open.len()..].chars().next();
                if matches!(after, Some('>') | Some(' ') | Some('\t') | Some('\n') | Some('/')) {
                    let end = src[o..].find('>').map_or(src.len(), |e| o + e);
                    if !src[o..end].ends_with('/') {
                        depth_at.push(o);
                    }
                }
                k = o + open.len();
            }
            (_, Some(c)) => {
                depth_at.pop();
                k = c + close.len();
            }
            _ => break,
        }
    }
    depth_at.into_iter().rev().map(|o| pos_in(src, o)).find(|p| p.line <= upto.max(1) || upto == 0)
}

pub(super) fn xml_error_text(e: &roxmltree::Error) -> String {
    // roxmltree appends " at LINE:COL"; the position is ours to print
    let s = e.to_string();
    match s.rfind(" at ") {
        Some(k) if s[k + 4..].chars().all(|c| c.is_ascii_digit() || c == ':') => s[..k].to_string(),
        _ => s,
    }
}

pub(super) fn one<'a, 'i>(
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

pub(super) fn pointcut_of(doc: &roxmltree::Document, parent: roxmltree::Node) -> Result<Pointcut, Diag> {
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

pub(super) fn only(doc: &roxmltree::Document, n: roxmltree::Node, allowed: &[&str]) -> Result<(), Diag> {
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

pub(super) fn parse_advice(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Advice, Diag> {
    only(doc, n, &["pointcut", "before", "after"])?;
    let pointcut = pointcut_of(doc, n)?;
    let before = one(doc, n, "before")?.map(|b| code_of(doc, b));
    let after = one(doc, n, "after")?.map(|b| code_of(doc, b));
    if before.is_none() && after.is_none() {
        return Err(diag(node_pos(doc, n), "<advice> has no <before> and no <after> (nothing to run)"));
    }
    Ok(Advice { pos: node_pos(doc, n), pointcut, before, after })
}

pub(super) fn parse_point(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Point, Diag> {
    only(doc, n, &["pointcut", "select", "action"])?;
    let pointcut = pointcut_of(doc, n)?;
    let select = match one(doc, n, "select")? {
        Some(s) => Some((attr(doc, s, "local_var")?, node_pos(doc, s))),
        None => None,
    };
    let action = one(doc, n, "action")?.map(|b| code_of(doc, b));
    Ok(Point { pos: node_pos(doc, n), pointcut, select, action })
}

pub(super) fn parse_field(doc: &roxmltree::Document, f: roxmltree::Node) -> Result<Field, Diag> {
    let num = |name: &str| -> Result<u32, Diag> {
        let v = attr(doc, f, name)?;
        v.parse::<u32>().map_err(|_| {
            diag(node_pos(doc, f), format!("<field {name}=\"{v}\">: not a whole number of bits"))
        })
    };
    Ok(Field { pos: node_pos(doc, f), name: attr(doc, f, "name")?, offset: num("offset")?, size: num("size")? })
}

pub(super) fn parse_transit(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Transit, Diag> {
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

pub(super) fn parse_xflow(doc: &roxmltree::Document, n: roxmltree::Node) -> Result<Xflow, Diag> {
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
