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
//!
//! Files: this one holds the model (the tree the parsers build); xml.rs
//! reads the file, pointcut.rs the expressions and path patterns.

use std::fmt;

mod pointcut;
mod xml;
pub use pointcut::*;
pub use xml::*;

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

pub(super) fn diag(pos: Pos, msg: impl Into<String>) -> Diag {
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
        self.collect(true)
    }

    /// The primitives that select by holding: those not under a NOT.
    pub fn positive_prims(&self) -> Vec<(&Prim, Pos)> {
        self.collect(false)
    }

    fn collect(&self, under_not: bool) -> Vec<(&Prim, Pos)> {
        let mut out = Vec::new();
        fn walk<'a>(e: &'a Expr, under_not: bool, out: &mut Vec<(&'a Prim, Pos)>) {
            match e {
                Expr::And(a, b) | Expr::Or(a, b) => {
                    walk(a, under_not, out);
                    walk(b, under_not, out);
                }
                Expr::Not(a) if under_not => walk(a, under_not, out),
                Expr::Not(_) => {}
                Expr::Prim(p, pos) => out.push((p, *pos)),
            }
        }
        walk(self, under_not, &mut out);
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
        assert!(err("<advice><pointcut>access(p.x)</pointcut><before>;</before>").contains("1:1: <advice> is never closed (add </advice>)"));
        assert!(err("<advice><pointcut>access(p.x)</pointcut>\n  <before>;").contains("2:3: <before> is never closed"));
        assert!(err("<advice><pointcut>access(p.x)</pointcut><before>;</before></advice></advice>").contains("not well-formed XML"));
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
