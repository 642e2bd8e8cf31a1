//! Join-point selection, shared by check and weave: every pointcut of an
//! aspect with what it needs and where it runs (before or after an
//! access), and whether a pointcut selects a join point of a program.

use crate::aspect::{self, Aspect, Expr, How, Pointcut, Pos, Prim};
use crate::joinpoints::{JoinPoint, Kind};
use std::path::PathBuf;

/// A program and the join points it carries.
pub struct Program {
    pub path: PathBuf,
    pub host: Option<String>,
    pub jps: Vec<JoinPoint>,
}

/// What a pointcut selects: (program index, join point index).
pub type Selection = Vec<(usize, usize)>;

/// One pointcut of the aspect, where it is, and what it is for.
pub struct Use<'a> {
    pub what: String,
    pub pointcut: &'a Pointcut,
    /// Program variables that must be visible at each selected join point,
    /// with where the aspect names them.
    pub needs: Vec<(String, Pos)>,
    /// Which sleds it runs at: before the join point (`<before>`, and every
    /// xflow part), after it (`<after>`: the sleds `-bunkai-flow-after`
    /// places after each access), or both.
    pub before: bool,
    pub after: bool,
}

impl Use<'_> {
    /// Does this pointcut select the join point, at a sled of the right
    /// side (before or after the access)?
    pub fn selects(&self, jp: &JoinPoint, host: &Option<String>) -> bool {
        (if jp.after { self.after } else { self.before }) && selects(&self.pointcut.expr, jp, host)
    }
}

/// Every pointcut of the aspect, in file order.
pub fn uses(a: &Aspect) -> Vec<Use<'_>> {
    let mut out = Vec::new();
    let locals = |pc: &Pointcut| -> Vec<(String, Pos)> {
        pc.expr
            .prims()
            .into_iter()
            .filter_map(|(p, pos)| match p {
                Prim::LocalVar { var, .. } => Some((var.clone(), pos)),
                _ => None,
            })
            .collect()
    };
    for (k, ad) in a.advices.iter().enumerate() {
        out.push(Use {
            what: format!("advice {}", k + 1),
            pointcut: &ad.pointcut,
            needs: locals(&ad.pointcut),
            before: ad.before.is_some(),
            after: ad.after.is_some(),
        });
    }
    for x in &a.xflows {
        for (k, s) in x.starts.iter().enumerate() {
            let mut needs = locals(&s.pointcut);
            needs.extend(s.select.iter().cloned());
            out.push(Use { what: format!("xflow {} start {}", x.name, k + 1), pointcut: &s.pointcut, needs, before: true, after: false });
        }
        for (k, t) in x.transits.iter().enumerate() {
            let mut needs = locals(&t.pointcut);
            match &t.how {
                How::Local { from, to, .. } | How::Xin { from, to, .. } | How::Xout { from, to, .. } => {
                    needs.push((from.clone(), t.how_pos));
                    needs.push((to.clone(), t.how_pos));
                }
                How::Action(_) => {}
            }
            out.push(Use { what: format!("xflow {} transit {}", x.name, k + 1), pointcut: &t.pointcut, needs, before: true, after: false });
        }
        for (k, q) in x.quits.iter().enumerate() {
            let mut needs = locals(&q.pointcut);
            needs.extend(q.select.iter().cloned());
            out.push(Use { what: format!("xflow {} quit {}", x.name, k + 1), pointcut: &q.pointcut, needs, before: true, after: false });
        }
    }
    out
}

fn host_ok(want: &Option<String>, have: &Option<String>) -> bool {
    match want {
        None => true,
        Some(w) => have.as_deref() == Some(w.as_str()),
    }
}

/// Does the pointcut select this join point? (local_var, target and xflow
/// select nothing by themselves: they bind, and xflow filters at run time.)
pub fn selects(e: &Expr, jp: &JoinPoint, host: &Option<String>) -> bool {
    match e {
        Expr::And(a, b) => selects(a, jp, host) && selects(b, jp, host),
        Expr::Or(a, b) => selects(a, jp, host) || selects(b, jp, host),
        Expr::Not(a) => !selects(a, jp, host),
        Expr::Prim(p, _) => match p {
            Prim::Access { strukt, member } => {
                jp.kind == Kind::Access
                    && jp.struct_name.as_deref() == Some(strukt.as_str())
                    && match member {
                        None => true,
                        Some(m) => jp.member.as_deref().is_some_and(|jm| jm.split('|').any(|x| x == m)),
                    }
            }
            Prim::Target(_) => jp.kind == Kind::Access,
            Prim::LocalVar { .. } | Prim::Xflow { .. } => true,
            Prim::WithinFunction { func, host: h } => host_ok(h, host) && jp.function == *func,
            Prim::WithinFile { path, host: h } => host_ok(h, host) && aspect::path_matches(path, &jp.file),
        },
    }
}

/// Why a pointcut that selects nothing does: the first term that selects no
/// join point by itself (a struct never accessed, a member it does not
/// have, a function or file without join points), with the nearest names
/// the programs do have; or, when every term selects something, that they
/// select nothing together. Terms inside NOT are left out (they select by
/// excluding).
pub fn why_none(e: &Expr, progs: &[Program]) -> (Pos, String) {
    let jps = || progs.iter().flat_map(|p| p.jps.iter().map(move |jp| (jp, &p.host)));
    for (p, pos) in &e.positive_prims() {
        let alone = Expr::Prim((*p).clone(), *pos);
        if jps().any(|(jp, h)| selects(&alone, jp, h)) {
            continue;
        }
        let msg = match p {
            Prim::Access { strukt, member } => {
                let structs: Vec<&str> = names(jps().filter_map(|(jp, _)| jp.struct_name.as_deref()));
                if !structs.contains(&strukt.as_str()) {
                    format!("no access to struct {strukt} is a join point{}", nearest(strukt, &structs, "structs"))
                } else {
                    let m = member.as_deref().unwrap_or("");
                    let members: Vec<&str> = names(
                        jps()
                            .filter(|(jp, _)| jp.struct_name.as_deref() == Some(strukt.as_str()))
                            .filter_map(|(jp, _)| jp.member.as_deref())
                            .flat_map(|m| m.split('|')),
                    );
                    format!("no access to member {m} of struct {strukt} is a join point{}", nearest(m, &members, "members accessed"))
                }
            }
            Prim::WithinFunction { func, .. } => {
                let fs: Vec<&str> = names(jps().map(|(jp, _)| jp.function.as_str()));
                format!("no join point is in a function {func}{}", nearest(func, &fs, "functions with join points"))
            }
            Prim::WithinFile { path, .. } => {
                let files: Vec<&str> = names(jps().map(|(jp, _)| jp.file.as_str()));
                format!("no join point is in a file matching {path}{}", nearest(path, &files, "files"))
            }
            // target, local_var and xflow bind; they select every access
            _ => continue,
        };
        return (*pos, msg);
    }
    (Pos { line: 0, col: 0 }, "each of its terms selects join points, but no join point satisfies them together".into())
}

/// The distinct names, sorted.
fn names<'a>(it: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let mut v: Vec<&str> = it.collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// " (did you mean X?)" when a known name is close, else the first few
/// known names.
fn nearest(want: &str, known: &[&str], what: &str) -> String {
    let best = known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(want, k), *k))
        .min()
        .filter(|(d, k)| *d <= 2.max(want.len().min(k.len()) / 3));
    match best {
        Some((_, k)) => format!(" (did you mean {k}?)"),
        None if known.is_empty() => String::new(),
        None => {
            let shown: Vec<&str> = known.iter().take(8).copied().collect();
            format!(" ({what}: {}{})", shown.join(", "), if known.len() > 8 { ", ..." } else { "" })
        }
    }
}
