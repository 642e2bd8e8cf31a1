//! Pointcut expressions (the grammar at the top of mod.rs) and path
//! patterns.

use super::*;

// ---------------------------------------------------------------------------
// Pointcut expressions

pub(super) struct Lexer<'a> {
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

pub(super) fn parse_expr(text: &str, start: Pos) -> Result<Expr, Diag> {
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

pub(super) fn or_expr(lx: &mut Lexer) -> Result<Expr, Diag> {
    let mut e = and_expr(lx)?;
    while lx.eat_word("OR") {
        e = Expr::Or(Box::new(e), Box::new(and_expr(lx)?));
    }
    Ok(e)
}

pub(super) fn and_expr(lx: &mut Lexer) -> Result<Expr, Diag> {
    let mut e = unary(lx)?;
    while lx.eat_word("AND") {
        e = Expr::And(Box::new(e), Box::new(unary(lx)?));
    }
    Ok(e)
}

pub(super) fn unary(lx: &mut Lexer) -> Result<Expr, Diag> {
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

pub(super) const PRIMS: &str = "access, target, local_var, within_function, within_file, xflow";

pub(super) fn prim(lx: &mut Lexer) -> Result<Expr, Diag> {
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
