//! `bunkai flow check ASPECT.xml [--program EXE[@HOST]]...`: everything that
//! can be known about an aspect before it is woven. Each problem is one
//! line naming the aspect file's line and column.
//!
//! Without programs: the file's structure and pointcut syntax (aspect.rs),
//! xflow names used in advice that no <xflow> defines, names defined twice,
//! xin_*/xout_* names that do not pair, fields that do not fit in 64 bits,
//! and variables an advice uses that its pointcut does not bind.
//!
//! With programs (their join-point tables, as `bunkai flow points` reads
//! them): which join points each pointcut selects, that every pointcut
//! selects at least one, that hosts named with @ are among the programs',
//! and that every program variable the aspect names (local_var, select,
//! move/copy/xin/xout from and to) is visible at every join point selected;
//! and the advice's C compiles in the module weave would build, each error
//! at the aspect's own line and column.

use crate::aspect::{self, Aspect, Diag, How, Pos, Prim};
use crate::joinpoints::{self, JoinPoint};
pub use crate::select::{selects, uses, Program, Selection, Use};
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// What to check against what: `bunkai flow check`'s options
/// (cmd/check.rs).
pub struct CheckOptions {
    /// The aspect (XML, the paper's notation)
    pub aspect: PathBuf,
    /// A program built with `bunkai flow cc` that the aspect will be woven
    /// into, optionally on a named host (for @HOST in within_file and
    /// within_function); repeat for several
    pub programs: Vec<String>,
    /// One JSON document: the pointcuts and the join points each selects
    pub json: bool,
    /// Extra flags for compiling the advice, as weave's --cflags
    pub cflags: Option<String>,
}

/// Checks that need no program. Every problem, in file order.
pub fn check_aspect(a: &Aspect) -> Vec<Diag> {
    let mut d = Vec::new();
    // xflow names: defined once each
    let mut defined: BTreeMap<&str, Pos> = BTreeMap::new();
    for x in &a.xflows {
        if let Some(first) = defined.get(x.name.as_str()) {
            d.push(Diag { pos: x.pos, msg: format!("xflow {} is defined twice (first at line {})", x.name, first.line) });
        } else {
            defined.insert(&x.name, x.pos);
        }
    }
    let known = || defined.keys().copied().collect::<Vec<_>>().join(", ");
    for u in uses(a) {
        let prims = u.pointcut.expr.prims();
        // advice variables the pointcut binds
        let bound: Vec<&str> = prims
            .iter()
            .filter_map(|(p, _)| match p {
                Prim::Target(v) => Some(v.as_str()),
                Prim::LocalVar { name, .. } => Some(name.as_str()),
                _ => None,
            })
            .collect();
        for (p, pos) in &prims {
            if let Prim::Xflow { name, var, id } = p {
                if !defined.contains_key(name.as_str()) {
                    let fix = if defined.is_empty() {
                        format!("define it: <xflow name=\"{name}\">")
                    } else {
                        format!("defined here: {}", known())
                    };
                    d.push(Diag { pos: *pos, msg: format!("unknown xflow {name} ({fix})") });
                }
                if !bound.contains(&var.as_str()) {
                    d.push(Diag {
                        pos: *pos,
                        msg: format!("xflow({name}, {var}): {var} is not bound in this pointcut (add target({var}) or local_var(VARIABLE, {var}))"),
                    });
                }
                if let Some(id) = id {
                    if bound.contains(&id.as_str()) {
                        d.push(Diag { pos: *pos, msg: format!("xflow({name}, {var}, {id}): {id} is already bound by the pointcut (name the ID differently)") });
                    }
                }
            }
        }
        if !prims.iter().any(|(p, _)| matches!(p, Prim::Access { .. } | Prim::WithinFunction { .. } | Prim::WithinFile { .. })) {
            d.push(Diag {
                pos: u.pointcut.pos,
                msg: format!("{}: the pointcut names no place (add access(...), within_function(...) or within_file(...))", u.what),
            });
        }
        let targets: Vec<&Pos> = prims.iter().filter(|(p, _)| matches!(p, Prim::Target(_))).map(|(_, pos)| pos).collect();
        if !targets.is_empty() && !prims.iter().any(|(p, _)| matches!(p, Prim::Access { .. })) {
            d.push(Diag { pos: *targets[0], msg: "target() needs an access(...) in the same pointcut (the struct instance it names)".into() });
        }
    }
    // starts and quits without <select> are keyed by the accessed instance
    for x in &a.xflows {
        for (what, pts) in [("start", &x.starts), ("quit", &x.quits)] {
            for p in pts.iter() {
                let has_access = p.pointcut.expr.prims().iter().any(|(q, _)| matches!(q, Prim::Access { .. }));
                if p.select.is_none() && p.action.is_none() && !has_access {
                    d.push(Diag {
                        pos: p.pos,
                        msg: format!("xflow {} {what}: no struct instance to key the flow by (add access(STRUCT.MEMBER) to the pointcut or <select local_var=\"VARIABLE\"/>)", x.name),
                    });
                }
            }
        }
    }
    // xin/xout pairs, fields
    let mut xins: BTreeMap<&str, Pos> = BTreeMap::new();
    let mut xouts: BTreeMap<&str, Pos> = BTreeMap::new();
    for x in &a.xflows {
        for t in &x.transits {
            match &t.how {
                How::Xin { name, field, .. } => {
                    if let Some(first) = xins.get(name.as_str()) {
                        d.push(Diag { pos: t.how_pos, msg: format!("xin {name} is defined twice (first at line {}; each xin names one way to pack the ID)", first.line) });
                    } else {
                        xins.insert(name, t.how_pos);
                    }
                    if field.size == 0 {
                        d.push(Diag { pos: field.pos, msg: format!("field {}: size 0 carries no ID (give 1 to 64 bits)", field.name) });
                    } else if field.offset as u64 + field.size as u64 > 64 {
                        d.push(Diag {
                            pos: field.pos,
                            msg: format!(
                                "field {}: bits {}..{} overflow a 64-bit member (offset + size must be at most 64)",
                                field.name,
                                field.offset,
                                field.offset as u64 + field.size as u64 - 1
                            ),
                        });
                    }
                }
                How::Xout { name, .. } => {
                    xouts.entry(name).or_insert(t.how_pos);
                }
                _ => {}
            }
        }
    }
    for (name, pos) in &xouts {
        if !xins.contains_key(name) {
            let have = if xins.is_empty() { "there is none".to_string() } else { format!("there are: {}", xins.keys().copied().collect::<Vec<_>>().join(", ")) };
            d.push(Diag { pos: *pos, msg: format!("xout {name} has no xin of that name to read the ID from (add <xin_move name=\"{name}\" ...>; {have})") });
        }
    }
    for (name, pos) in &xins {
        if !xouts.contains_key(name) {
            d.push(Diag { pos: *pos, msg: format!("xin {name} is never read (add <xout_move name=\"{name}\" ...> where the data arrives)") });
        }
    }
    d.sort_by_key(|x| (x.pos.line, x.pos.col));
    d
}

/// Checks against programs; returns each pointcut's selection too.
pub fn check_programs(a: &Aspect, progs: &[Program]) -> (Vec<Diag>, Vec<Selection>) {
    let mut d = Vec::new();
    let hosts: Vec<&str> = progs.iter().filter_map(|p| p.host.as_deref()).collect();
    let mut sels = Vec::new();
    let us = uses(a);
    for u in &us {
        for (p, pos) in u.pointcut.expr.prims() {
            let h = match p {
                Prim::WithinFunction { host: Some(h), .. } | Prim::WithinFile { host: Some(h), .. } => h,
                _ => continue,
            };
            if !hosts.contains(&h.as_str()) {
                d.push(Diag { pos, msg: format!("no program is on host {h} (give --program EXE@{h})") });
            }
        }
        let mut sel: Selection = Vec::new();
        for (pi, prog) in progs.iter().enumerate() {
            for (ji, jp) in prog.jps.iter().enumerate() {
                if u.selects(jp, &prog.host) {
                    sel.push((pi, ji));
                }
            }
        }
        let names = || progs.iter().map(|p| p.path.display().to_string()).collect::<Vec<_>>().join(", ");
        let any_after = sel.iter().any(|&(pi, ji)| progs[pi].jps[ji].after);
        if u.after && !any_after && !progs.iter().any(|p| p.jps.iter().any(|jp| jp.after)) {
            d.push(Diag {
                pos: u.pointcut.pos,
                msg: format!(
                    "{}: <after> runs at sleds after the accesses and at functions' returns, and {} has none (build it with `bunkai flow cc -mllvm -bunkai-flow-after`)",
                    u.what,
                    names()
                ),
            });
        } else if sel.is_empty() {
            let (at, why) = crate::select::why_none(&u.pointcut.expr, &progs);
            d.push(Diag {
                pos: if at.line == 0 { u.pointcut.pos } else { at },
                msg: format!("{}: the pointcut selects no join point in {}: {why} (see `bunkai flow points`)", u.what, names()),
            });
        } else if u.after && !u.before && !any_after {
            d.push(Diag {
                pos: u.pointcut.pos,
                msg: format!("{}: the pointcut selects no join point in {} (see `bunkai flow points`)", u.what, names()),
            });
        }
        for (var, pos) in &u.needs {
            // where a sled lacks $value or $retval by its kind, code sees
            // null; where it should have one (an after sled of a store, a
            // return of a void function), it is missing
            let missing: Vec<&JoinPoint> = sel
                .iter()
                .map(|&(pi, ji)| &progs[pi].jps[ji])
                .filter(|jp| jp.operand(var).is_none() && !jp.lacks(var))
                .collect();
            if let Some(jp) = missing.first() {
                let more = if missing.len() > 1 { format!(" and {} more join points", missing.len() - 1) } else { String::new() };
                let seen: Vec<&str> = jp.operands.iter().map(|(n, _)| n.as_str()).filter(|n| !n.starts_with('$')).collect();
                d.push(Diag {
                    pos: *pos,
                    msg: format!(
                        "{}: variable {var} is not visible at {}:{} in {}{more} (visible there: {})",
                        u.what,
                        jp.file,
                        jp.line,
                        jp.function,
                        if seen.is_empty() { "none".to_string() } else { seen.join(", ") }
                    ),
                });
            }
        }
        sels.push(sel);
    }
    // an xin field must fit in the header member it names, as wide as the
    // join-point table says, at the join points its transit selected
    for x in &a.xflows {
        for t in &x.transits {
            let How::Xin { field, .. } = &t.how else { continue };
            let Some(ui) = us.iter().position(|u| std::ptr::eq(u.pointcut, &t.pointcut)) else { continue };
            let end = field.offset as u64 + field.size as u64;
            let narrow = sels[ui].iter().map(|&(pi, ji)| &progs[pi].jps[ji]).find(|jp| {
                jp.bits > 0 && jp.member.as_deref().is_some_and(|m| m.split('|').any(|x| x == field.name)) && end > jp.bits as u64
            });
            if let Some(jp) = narrow {
                d.push(Diag {
                    pos: field.pos,
                    msg: format!(
                        "field {}: bits {}..{} overflow {}.{}, which is {} bits wide ({}:{})",
                        field.name,
                        field.offset,
                        end - 1,
                        jp.struct_name.as_deref().unwrap_or("?"),
                        field.name,
                        jp.bits,
                        jp.file,
                        jp.line
                    ),
                });
            }
        }
    }
    d.sort_by_key(|x| (x.pos.line, x.pos.col));
    (d, sels)
}

pub fn parse_program(spec: &str) -> Result<Program> {
    // EXE@HOST, where the path itself may contain '@'
    let (path, host) = match spec.rsplit_once('@') {
        Some((p, h)) if !h.is_empty() && !h.contains('/') && std::path::Path::new(p).exists() => (p, Some(h.to_string())),
        _ => (spec, None),
    };
    let path = PathBuf::from(path);
    let jps = joinpoints::read(&path)?;
    Ok(Program { path, host, jps })
}

/// Reads and parses an aspect file; an error names the file (and the
/// line and column of a parse error).
pub fn read_aspect(path: &std::path::Path) -> Result<Aspect> {
    let src = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let name = path.display().to_string();
    let src = match String::from_utf8(src) {
        Ok(s) => s,
        Err(_) => bail!("{name} is not text (UTF-8) (give the aspect's XML file)"),
    };
    match aspect::parse(&src) {
        Ok(x) => Ok(x),
        Err(e) => bail!("{name}:{e}"),
    }
}

pub fn run(a: &CheckOptions) -> Result<ExitCode> {
    let name = a.aspect.display().to_string();
    let aspect = read_aspect(&a.aspect)?;
    let progs = a.programs.iter().map(|s| parse_program(s)).collect::<Result<Vec<_>>>()?;
    let mut diags = check_aspect(&aspect);
    let mut sels = Vec::new();
    if !progs.is_empty() {
        let (d, s) = check_programs(&aspect, &progs);
        diags.extend(d);
        sels = s;
        diags.sort_by_key(|x| (x.pos.line, x.pos.col));
    }
    if !diags.is_empty() {
        let mut err = std::io::stderr().lock();
        for d in &diags[..diags.len() - 1] {
            let _ = writeln!(err, "bunkai flow: {name}:{d}");
        }
        bail!("{name}:{}", diags[diags.len() - 1]);
    }
    // the advice's C, compiled as weave would for each program: errors at
    // the aspect's lines; the generated code around it (xin and xout) needs
    // the header's struct, which only --cflags gives: without it, that part
    // is left unchecked, and said so
    let (mut in_aspect, mut generated) = (Vec::<String>::new(), Vec::<String>::new());
    for p in &progs {
        let e = crate::weave::c_errors(&aspect, &name, p, a.cflags.as_deref())?;
        in_aspect.extend(e.in_aspect.into_iter().filter(|x| !in_aspect.contains(x)).collect::<Vec<_>>());
        generated.extend(e.generated.into_iter().filter(|x| !generated.contains(x)).collect::<Vec<_>>());
    }
    let fix = "xin and xout need the header's struct: --cflags \"-include header.h\"";
    // only a struct the aspect's xin/xout code names, missing without the
    // header, is left to --cflags; anything else in the generated code fails
    let has_xio = aspect.xflows.iter().any(|x| x.transits.iter().any(|t| matches!(t.how, aspect::How::Xin { .. } | aspect::How::Xout { .. })));
    let header_only = has_xio && a.cflags.is_none() && generated.iter().all(|m| m.contains("incomplete") && m.contains("struct"));
    if !in_aspect.is_empty() || (!generated.is_empty() && !header_only) {
        // errors at the aspect's lines are each real; the generated code's
        // follow from the first (an unbalanced brace cascades): that one only
        let mut all: Vec<String> = in_aspect;
        let why = if has_xio { fix } else { "an unbalanced brace or parenthesis in the advice? `bunkai flow emit` shows the module" };
        if all.is_empty() {
            all.extend(generated.first().map(|m| format!("{name}: the module does not compile around the aspect's C: {m} ({why})")));
        }
        let (last, rest) = all.split_last().expect("not empty");
        let mut err = std::io::stderr().lock();
        for e in rest {
            let _ = writeln!(err, "bunkai flow: {e}");
        }
        bail!("{last}");
    }
    if let Some(first) = generated.first() {
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "bunkai flow: note: {name}: the module's xin/xout code was not compiled ({first}; {fix} checks it too)");
    }
    let us = uses(&aspect);
    let out = if a.json {
        let pcs: Vec<_> = us
            .iter()
            .enumerate()
            .map(|(k, u)| {
                let jps: Vec<_> = sels
                    .get(k)
                    .map(|s| {
                        s.iter()
                            .map(|&(pi, ji)| {
                                let jp = &progs[pi].jps[ji];
                                json!({"program": progs[pi].path.display().to_string(), "index": jp.index,
                                       "function": jp.function, "file": jp.file, "line": jp.line})
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                json!({"what": u.what, "line": u.pointcut.pos.line, "joinpoints": jps})
            })
            .collect();
        let doc = json!({
            "aspect": name, "ok": true, "advices": aspect.advices.len(),
            "xflows": aspect.xflows.iter().map(|x| x.name.clone()).collect::<Vec<_>>(),
            "pointcuts": pcs,
        });
        serde_json::to_string_pretty(&doc)? + "\n"
    } else {
        let mut s = format!(
            "{name}: ok: {} advice{}, {} xflow{}{}\n",
            aspect.advices.len(),
            if aspect.advices.len() == 1 { "" } else { "s" },
            aspect.xflows.len(),
            if aspect.xflows.len() == 1 { "" } else { "s" },
            if aspect.xflows.is_empty() { String::new() } else { format!(" ({})", aspect.xflows.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", ")) }
        );
        if !progs.is_empty() {
            for (u, sel) in us.iter().zip(&sels) {
                s += &format!("  line {:>4}  {:<28}  {} join point{}\n", u.pointcut.pos.line, u.what, sel.len(), if sel.len() == 1 { "" } else { "s" });
            }
        }
        s
    };
    crate::stdout(&out)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn diags(src: &str) -> Vec<String> {
        check_aspect(&aspect::parse(src).unwrap()).iter().map(|d| d.to_string()).collect()
    }

    const START: &str = "<start><pointcut>access(p.x) AND within_function(f)</pointcut></start>";

    #[test]
    fn a_good_aspect_has_nothing_to_say() {
        let src = format!(
            "<xflow name=\"f\">{START}<transit><pointcut>within_function(g)</pointcut><xin_copy name=\"h\" from=\"a\" to=\"b\"><field name=\"fl\" offset=\"0\" size=\"64\"/></xin_copy></transit>\
             <transit><pointcut>within_function(k)</pointcut><xout_move name=\"h\" from=\"b\" to=\"a\"/></transit></xflow>\
             <advice><pointcut>access(p.%) AND target(q) AND xflow(f, q, id)</pointcut><before>STORE_DATA1(id);</before></advice>"
        );
        assert_eq!(diags(&src), Vec::<String>::new());
    }

    #[test]
    fn names_pairs_fields_and_bindings() {
        let src = format!(
            "<xflow name=\"f\">{START}</xflow>\n<xflow name=\"f\">{START}</xflow>\n\
             <advice><pointcut>access(p.%) AND xflow(g, q)</pointcut><before>;</before></advice>\n\
             <xflow name=\"h\">{START}<transit><pointcut>within_function(g)</pointcut><xin_move name=\"a\" from=\"x\" to=\"y\"/><field name=\"fl\" offset=\"60\" size=\"8\"/></transit>\n\
             <transit><pointcut>within_function(g)</pointcut><xout_copy name=\"b\" from=\"x\" to=\"y\"/></transit></xflow>\n\
             <advice><pointcut>target(t)</pointcut><after>;</after></advice>"
        );
        let d = diags(&src);
        let want = [
            "2:1: xflow f is defined twice (first at line 1)",
            "3:35: unknown xflow g (defined here: f, h)",
            "3:35: xflow(g, q): q is not bound in this pointcut (add target(q) or local_var(VARIABLE, q))",
            "4:135: xin a is never read",
            "4:171: field fl: bits 60..67 overflow a 64-bit member",
            "5:49: xout b has no xin of that name",
            "6:19: advice 2: the pointcut names no place",
            "6:19: target() needs an access(...)",
        ];
        assert_eq!(d.len(), want.len(), "{d:#?}");
        for (got, w) in d.iter().zip(want) {
            assert!(got.starts_with(w), "{got} / {w}");
        }
    }
}
