//! The advice module `bunkai flow weave` will load (seed 003 §4.1, Figs.
//! 5-8): C generated from an aspect for one program, from the join points
//! each pointcut selects (select.rs) and where each variable is at them
//! (the join-point table). One handler serves every woven sled; at each, the
//! xflow definitions' code runs first, then the advice, as §4.1 says. The
//! module's init weaves the sleds through the runtime (bkf_weave,
//! bunkai_flow.h §4), and its exit unweaves them.
//!
//! `weave.rs` compiles the module and loads it; `bunkai flow emit` prints it.

use crate::aspect::{Aspect, How, Prim};
use crate::select::{uses, Program};
use crate::joinpoints::{Base, JoinPoint, Kind, Location};
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::fmt::Write;

pub struct Generated {
    /// The module's C source.
    pub source: String,
    /// The woven sleds' addresses as mapped (link-time address + bias), in
    /// the order of the handler's cases.
    pub sleds: Vec<u64>,
    /// The advice reads a variable the compiler kept in an %xmm register,
    /// so the trampoline must save the vector state.
    pub needs_xsave: bool,
    /// Sleds woven behind a guard (bunkai_flow.h §4): every piece of code
    /// at them is filtered on a flow, so the guard may skip the handler
    /// when no guard register can hold a key of its table.
    pub guarded: usize,
    /// Of those, the sleds whose guard reads a header member (xout); they
    /// need the member's offset from the program's headers, and are
    /// unguarded if the module builds only without (a bitfield).
    pub field_guarded: usize,
}

/// What one piece of code at a join point needs from a guard (None: it may
/// act on any pass).
#[derive(Clone, PartialEq)]
enum Test {
    /// It does nothing unless the register's value is a key of the
    /// xflow's table.
    Key(String, u8),
    /// An xout: it does nothing unless the register points to a header
    /// whose member (struct, member, first bit, bits) holds a flow ID.
    Field(String, String, u32, u32, u8),
}
type Guard = Option<Test>;

/// The x86 number of a 64-bit general register holding a pointer (what a
/// guard can test), as bkf_guard.reg has it.
fn guard_reg(loc: &Location) -> Option<u8> {
    const N: [&str; 16] = ["rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi", "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15"];
    match loc {
        Location::Reg(r) => N.iter().position(|n| n == r).filter(|&k| k != 4).map(|k| k as u8),
        _ => None,
    }
}

/// The saved register behind a name the compiler printed, with the C type
/// of that width.
fn reg(name: &str) -> Option<(&'static str, &'static str)> {
    const R: [(&str, [&str; 4]); 15] = [
        ("rax", ["rax", "eax", "ax", "al"]),
        ("rbx", ["rbx", "ebx", "bx", "bl"]),
        ("rcx", ["rcx", "ecx", "cx", "cl"]),
        ("rdx", ["rdx", "edx", "dx", "dl"]),
        ("rsi", ["rsi", "esi", "si", "sil"]),
        ("rdi", ["rdi", "edi", "di", "dil"]),
        ("rbp", ["rbp", "ebp", "bp", "bpl"]),
        ("r8", ["r8", "r8d", "r8w", "r8b"]),
        ("r9", ["r9", "r9d", "r9w", "r9b"]),
        ("r10", ["r10", "r10d", "r10w", "r10b"]),
        ("r11", ["r11", "r11d", "r11w", "r11b"]),
        ("r12", ["r12", "r12d", "r12w", "r12b"]),
        ("r13", ["r13", "r13d", "r13w", "r13b"]),
        ("r14", ["r14", "r14d", "r14w", "r14b"]),
        ("r15", ["r15", "r15d", "r15w", "r15b"]),
    ];
    const T: [&str; 4] = ["uint64_t", "uint32_t", "uint16_t", "uint8_t"];
    for (field, names) in R {
        if let Some(k) = names.iter().position(|n| *n == name) {
            return Some((field, T[k]));
        }
    }
    None
}

/// A C expression of type `void *` pointing at where the variable is (so
/// the advice may read or change it), or an error naming the place.
fn address_of(loc: &Location, what: &str, jp: &JoinPoint) -> Result<String> {
    Ok(match loc {
        Location::Reg(r) if r.starts_with("xmm") => {
            let n: u32 = r[3..].parse().unwrap_or(99);
            if n > 15 {
                bail!("{what} at {}:{} is in %{r}, which the trampoline does not save", jp.file, jp.line);
            }
            format!("(void *)((char *)xs__ + {})", 160 + 16 * n)
        }
        Location::Reg(r) => match reg(r) {
            Some((field, _)) => format!("(void *)&f__->{field}"),
            None => bail!("{what} at {}:{} is in %{r}, which advice cannot reach", jp.file, jp.line),
        },
        Location::Mem { base: Base::Rsp, offset } => format!("(void *)((uint64_t)&f__->ret + 8 + ({offset}))"),
        Location::Mem { base: Base::Rbp, offset } => format!("(void *)(f__->rbp + ({offset}))"),
        Location::Imm(_) => bail!("{what} at {}:{} is a constant, it has no address (use target() or read it)", jp.file, jp.line),
    })
}

/// A C expression of type `void *`: the variable's value, a pointer.
fn pointer_value(loc: &Location, what: &str, jp: &JoinPoint) -> Result<String> {
    Ok(match loc {
        Location::Imm(v) => format!("(void *)(uintptr_t){v}ll"),
        Location::Reg(r) if reg(r).is_some_and(|(_, t)| t != "uint64_t") => {
            bail!("{what} at {}:{} is in %{r}, too narrow for a pointer", jp.file, jp.line)
        }
        _ => format!("(*(void **){})", address_of(loc, what, jp)?),
    })
}

fn operand<'a>(jp: &'a JoinPoint, name: &str, what: &str) -> Result<&'a Location> {
    match jp.operand(name) {
        Some(l) => Ok(l),
        None => bail!("{what}: {name} is not visible at {}:{} in {} (run `bunkai flow check`)", jp.file, jp.line, jp.function),
    }
}

pub(crate) fn c_ident(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
}

/// The accessed struct a pointcut names (the header type of xin/xout).
fn struct_of(prims: &[(&Prim, crate::aspect::Pos)]) -> Option<String> {
    prims.iter().find_map(|(p, _)| match p {
        Prim::Access { strukt, .. } => Some(strukt.clone()),
        _ => None,
    })
}

/// Generates the advice module for `prog`, mapped at `bias`.
pub fn generate(a: &Aspect, prog: &Program, bias: u64, module: &str) -> Result<Generated> {
    let us = uses(a);
    // At a join point: the xflow definitions' starts and transits, then the
    // advice (§4.1: xflow code first, so advice sees the flow), then the
    // quits, so that a flow's last place is still recorded (Table 2 ends
    // with kfree_skb). uses() lists the advice first.
    let n_adv = a.advices.len();
    let is_quit = |ui: usize| ui >= n_adv && matches!(xflow_part(a, ui - n_adv).1, Part::Quit(_));
    let order: Vec<usize> = (n_adv..us.len())
        .filter(|&u| !is_quit(u))
        .chain(0..n_adv)
        .chain((n_adv..us.len()).filter(|&u| is_quit(u)))
        .collect();
    let mut blocks: BTreeMap<usize, Vec<(String, Guard)>> = BTreeMap::new(); // join point index -> code
    let xin_fields: BTreeMap<&str, &crate::aspect::Field> = a
        .xflows
        .iter()
        .flat_map(|x| x.transits.iter())
        .filter_map(|t| match &t.how {
            How::Xin { name, field, .. } => Some((name.as_str(), field)),
            _ => None,
        })
        .collect();
    for &ui in &order {
        let u = &us[ui];
        let prims = u.pointcut.expr.prims();
        let sel: Vec<&JoinPoint> = prog.jps.iter().filter(|jp| u.selects(jp, &prog.host)).collect();
        for jp in sel {
            let mut c = String::new();
            let _ = writeln!(c, "    /* {} (line {}) at {}:{} {} */", u.what, u.pointcut.pos.line, jp.file, jp.line, jp.function);
            c += "    {\n";
            // bindings of the pointcut
            for (p, _) in &prims {
                match p {
                    Prim::Target(v) => {
                        if jp.kind != Kind::Access {
                            bail!("{}: target({v}) at a function entry ({})", u.what, jp.function);
                        }
                        let loc = operand(jp, "$base", &u.what)?;
                        let _ = writeln!(c, "      void *{v} = {};", pointer_value(loc, v, jp)?);
                    }
                    Prim::LocalVar { var, name } if jp.lacks(var) => {
                        let why = if var == "$value" { "only after a load" } else { "only at a return" };
                        let _ = writeln!(c, "      void *{name} = 0; /* {var}: {why} */");
                    }
                    Prim::LocalVar { var, name } => match operand(jp, var, &u.what)? {
                        // a constant (`return 0;`): the advice reads a copy
                        Location::Imm(v) => {
                            let _ = writeln!(c, "      uint64_t {name}__imm = (uint64_t){v}ll; void *{name} = &{name}__imm;");
                        }
                        loc => {
                            let _ = writeln!(c, "      void *{name} = {};", address_of(loc, var, jp)?);
                        }
                    },
                    _ => {}
                }
            }
            let key = |sel: &Option<(String, crate::aspect::Pos)>| -> Result<String> {
                match sel {
                    Some((v, _)) => pointer_value(operand(jp, v, &u.what)?, v, jp),
                    None => pointer_value(operand(jp, "$base", &u.what)?, "the accessed instance", jp),
                }
            };
            let value = |v: &str| -> Result<String> { pointer_value(operand(jp, v, &u.what)?, v, jp) };
            // the register a guard would test for the flow's key in `var`
            // ($base when None), if it is in one
            let key_reg = |var: Option<&str>| operand(jp, var.unwrap_or("$base"), &u.what).ok().and_then(guard_reg);
            let mut guard: Guard = None;
            if ui < n_adv {
                let ad = &a.advices[ui];
                // the sleds after an access run <after>, the others <before>
                let body = if jp.after { &ad.after } else { &ad.before };
                let mut close = 0;
                for (p, _) in &prims {
                    if let Prim::Xflow { name, var, id } = p {
                        // the code runs only when every xflow() holds: a
                        // guard on the first is enough, if its variable is
                        // target()'s (the value of $base)
                        if close == 0 && prims.iter().any(|(q, _)| matches!(q, Prim::Target(t) if t == var)) {
                            guard = key_reg(None).map(|r| Test::Key(name.clone(), r));
                        }
                        let idv = id.clone().unwrap_or_else(|| format!("bkf_id_{}__", c_ident(var)));
                        let _ = writeln!(c, "      bkf_id {idv} = get_flowid(T_{name}, {var});");
                        let _ = writeln!(c, "      if ({idv} != 0) {{");
                        close += 1;
                    }
                }
                if close > 0 && !top_level_and(&u.pointcut.expr) {
                    bail!("advice {} (line {}): xflow() under OR or NOT is not supported (write it as AND ... AND xflow(...))", ui + 1, ad.pos.line);
                }
                match body {
                    Some(b) => c += &code_c(b),
                    None => c += "      { }\n",
                }
                c += &"      }\n".repeat(close);
            } else {
                // which xflow and which part
                let (x, part) = xflow_part(a, ui - n_adv);
                let t = format!("T_{}", x.name);
                match part {
                    Part::Start(p) => match &p.action {
                        Some(act) => c += &code_c(act),
                        // a start selected at several accesses begins one flow, not one per access
                        None => { let _ = writeln!(c, "      void *key__ = {};\n      if (key__ && !get_flowid({t}, key__)) register_flowid({t}, key__, get_new_flowid());", key(&p.select)?); }
                    },
                    Part::Quit(p) => match &p.action {
                        Some(act) => c += &code_c(act),
                        None => {
                            let _ = writeln!(c, "      void *key__ = {};\n      if (key__) remove_flowid({t}, key__);", key(&p.select)?);
                            // removing a key that is not there does nothing
                            guard = key_reg(p.select.as_ref().map(|(v, _)| v.as_str())).map(|r| Test::Key(x.name.clone(), r));
                        }
                    },
                    Part::Transit(tr) => match &tr.how {
                        How::Action(act) => c += &code_c(act),
                        How::Local { from, to, keep } => {
                            guard = key_reg(Some(from)).map(|r| Test::Key(x.name.clone(), r));
                            let _ = writeln!(c, "      void *from__ = {}, *to__ = {};", value(from)?, value(to)?);
                            let _ = writeln!(c, "      bkf_id id__ = get_flowid({t}, from__);");
                            let _ = writeln!(c, "      if (id__ && to__) {{\n        register_flowid({t}, to__, id__);");
                            if !keep {
                                let _ = writeln!(c, "        remove_flowid({t}, from__);");
                            }
                            c += "      }\n";
                        }
                        How::Xin { from, to, keep, field, .. } => {
                            let Some(s) = struct_of(&prims) else {
                                bail!("{}: the header's type comes from access(STRUCT.member) in the pointcut (add one)", u.what);
                            };
                            let mask = mask(field.size);
                            guard = key_reg(Some(from)).map(|r| Test::Key(x.name.clone(), r));
                            let _ = writeln!(c, "      void *from__ = {}; struct {s} *hdr__ = {};", value(from)?, value(to)?);
                            let _ = writeln!(c, "      bkf_id id__ = get_flowid({t}, from__);");
                            let _ = writeln!(c, "      if (id__ && hdr__) {{");
                            let _ = writeln!(
                                c,
                                "        hdr__->{f} = (hdr__->{f} & ~({mask} << {o})) | ((id__ & {mask}) << {o});",
                                f = field.name,
                                o = field.offset
                            );
                            if !keep {
                                let _ = writeln!(c, "        remove_flowid({t}, from__);");
                            }
                            c += "      }\n";
                        }
                        How::Xout { name, from, to, keep } => {
                            let Some(field) = xin_fields.get(name.as_str()) else {
                                bail!("{}: xout {name} has no xin of that name (run `bunkai flow check`)", u.what);
                            };
                            let Some(s) = struct_of(&prims) else {
                                bail!("{}: the header's type comes from access(STRUCT.member) in the pointcut (add one)", u.what);
                            };
                            let mask = mask(field.size);
                            // nothing happens unless the header holds an ID
                            guard = key_reg(Some(from)).map(|r| Test::Field(s.clone(), field.name.clone(), field.offset, field.size, r));
                            let _ = writeln!(c, "      struct {s} *hdr__ = {}; void *to__ = {};", value(from)?, value(to)?);
                            let _ = writeln!(c, "      if (hdr__ && to__) {{");
                            let _ = writeln!(c, "        bkf_id id__ = ((uint64_t)hdr__->{f} >> {o}) & {mask};", f = field.name, o = field.offset);
                            let _ = writeln!(c, "        if (id__) register_flowid({t}, to__, id__);");
                            if !keep {
                                let _ = writeln!(c, "        hdr__->{f} &= ~({mask} << {o});", f = field.name, o = field.offset);
                            }
                            c += "      }\n";
                        }
                    },
                }
            }
            c += "    }\n";
            blocks.entry(jp.index).or_default().push((c, guard));
        }
    }
    if blocks.is_empty() {
        bail!("the aspect selects no join point in {} (see `bunkai flow check --program`)", prog.path.display());
    }
    let mut src = String::new();
    let _ = writeln!(
        src,
        "/* Generated by bunkai flow weave for {}: do not edit. */\n#include <stddef.h>\n#include <stdint.h>\n#define BKF_ADVICE_TSC__ 1\n#include \"bunkai_flow.h\"\n#include \"bunkai_mod.h\"\n",
        prog.path.display()
    );
    for x in &a.xflows {
        let _ = writeln!(src, "static struct bkf_table *T_{};", x.name);
    }
    let mut sleds = Vec::new();
    // case bodies, each once with all its labels: the code at thousands of
    // sleds is mostly the same few bodies (one per register holding the
    // key; Apache: 3,126 sleds, 17 bodies), which also compiles 20 times
    // faster
    let mut bodies: Vec<(String, String)> = Vec::new(); // (labels, body)
    let mut body_of: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut jpidx = Vec::new();
    let mut body_at = Vec::new(); // per sled: its body
    let mut gspec = Vec::new(); // per sled: "{n, {kinds}, {regs}, {indices}}"
    let mut guarded = 0;
    let mut field_guarded = 0;
    let mut fields: Vec<(String, String, u32, u32)> = Vec::new(); // FIELD__
    let xf_index = |name: &str| a.xflows.iter().position(|x| x.name == name).unwrap_or(0);
    for (k, (ji, codes)) in blocks.iter().enumerate() {
        let jp = &prog.jps[*ji];
        sleds.push(jp.sled_addr + bias);
        jpidx.push(*ji);
        let mut labels = format!("  case {k}: /* join point {ji} */\n");
        let mut body = String::new();
        for (c, _) in codes {
            // the first line names the code's origin and place: a comment
            // at the label; the rest is the code
            let (origin, code) = c.split_once('\n').unwrap_or((c.as_str(), ""));
            labels += origin;
            labels += "\n";
            body += code;
        }
        // advice with a `static` (a per-place counter, say) or __LINE__
        // keeps a body of its own at each sled, as written
        let shareable = !["static", "__LINE__", "__COUNTER__"].iter().any(|w| body.contains(w));
        match body_of.get(&body).filter(|_| shareable) {
            Some(&i) => {
                bodies[i].0 += &labels;
                body_at.push(i);
            }
            None => {
                if shareable {
                    body_of.insert(body.clone(), bodies.len());
                }
                body_at.push(bodies.len());
                bodies.push((labels, body));
            }
        }
        // a guard when every piece of code here is filtered on a flow:
        // (kind, register, index into XF__ or FIELD__) per test
        let mut tests: Vec<(u8, u8, usize)> = Vec::new();
        let all = codes.iter().all(|(_, g)| {
            let t = match g {
                Some(Test::Key(x, r)) => (0, *r, xf_index(x)),
                Some(Test::Field(st, m, o, n, r)) => {
                    let f = (st.clone(), m.clone(), *o, *n);
                    let i = fields.iter().position(|e| *e == f).unwrap_or_else(|| {
                        fields.push(f);
                        fields.len() - 1
                    });
                    (1, *r, i)
                }
                None => return false,
            };
            if !tests.contains(&t) {
                tests.push(t);
            }
            true
        });
        if all && tests.len() <= 4 {
            guarded += 1;
            if tests.iter().any(|t| t.0 == 1) {
                field_guarded += 1;
            }
            let col = |f: &dyn Fn(&(u8, u8, usize)) -> String| tests.iter().map(f).collect::<Vec<_>>().join(", ");
            gspec.push(format!("{{{}, {{{}}}, {{{}}}, {{{}}}}}", tests.len(), col(&|t| t.0.to_string()), col(&|t| t.1.to_string()), col(&|t| t.2.to_string())));
        } else {
            gspec.push("{0, {0}, {0}, {0}}".to_string());
        }
    }
    // What the runtime hands the handler for each sled (the weave's jp[],
    // copied into the return map's entry that a followed pass reads
    // anyway): packed, the sled's join point above the number of its body,
    // so that the handler reads no table of its own per sled (JP__ and a
    // jump table of a case per sled were two more cache lines a followed
    // pass in Apache, whose own work evicts them between records); when
    // they do not fit in 32 bits, the sled's case number, JP__ and a case
    // per sled as before.
    let body_bits = (usize::BITS - bodies.len().saturating_sub(1).leading_zeros()).max(1);
    let packed = jpidx.iter().all(|&j| (j as u64) < 1u64 << (32 - body_bits));
    let mut cases = String::new();
    for (b, (labels, body)) in bodies.iter().enumerate() {
        if packed {
            // the sleds' join points stay named in comments
            let _ = writeln!(cases, "  case {b}:");
            for l in labels.lines() {
                // "  case K: /* join point J */" -> "  /* sled K: join point J */"
                match l.strip_prefix("  case ").and_then(|r| r.split_once(": /* ")) {
                    Some((k, rest)) => {
                        let _ = writeln!(cases, "  /* sled {k}: {rest}");
                    }
                    None => {
                        let _ = writeln!(cases, "{l}");
                    }
                }
            }
        } else {
            cases += labels;
        }
        cases += body;
        cases += "    break;\n";
    }
    let list = |v: &[String]| v.join(",\n  ");
    let _ = writeln!(src, "static const uint64_t SLEDS__[{}] = {{\n  {}\n}};", sleds.len(), list(&sleds.iter().map(|s| format!("{s:#x}ull")).collect::<Vec<_>>()));
    let (jp_expr, case_expr) = if packed {
        let v: Vec<String> = jpidx.iter().zip(&body_at).map(|(&j, &b)| ((j as u64) << body_bits | b as u64).to_string()).collect();
        let _ = writeln!(src, "/* per sled: its join point << {body_bits} | its case body */\nstatic const uint32_t CASE__[{}] = {{{}}};\n", sleds.len(), v.join(", "));
        (format!("k__ >> {body_bits}"), format!("k__ & {:#x}u", (1u64 << body_bits) - 1))
    } else {
        let _ = writeln!(src, "static const uint32_t JP__[{}] = {{{}}};", jpidx.len(), jpidx.iter().map(|j| j.to_string()).collect::<Vec<_>>().join(", "));
        let _ = writeln!(src, "static uint32_t CASE__[{}];\n", sleds.len());
        ("JP__[k__]".to_string(), "k__".to_string())
    };
    // Guards: per sled, the tests: the registers, and the xflows whose
    // tables they are tested against or the header members they read
    // (weave --no-guard defines BKF_NO_GUARD__; a module whose header
    // member is a bitfield, which has no offsetof, BKF_NO_FIELD_GUARD__).
    let guards_arg = if guarded > 0 {
        let tables: Vec<String> = a.xflows.iter().map(|x| format!("&T_{}", x.name)).collect();
        let _ = writeln!(
            src,
            "static const struct {{ uint8_t n, kind[BKF_GUARD_MAX], reg[BKF_GUARD_MAX], ix[BKF_GUARD_MAX]; }} GSPEC__[{}] = {{\n  {}\n}};",
            sleds.len(),
            list(&gspec)
        );
        let _ = writeln!(src, "static struct bkf_table **const XF__[] = {{{}}};", tables.join(", "));
        if !fields.is_empty() {
            let f: Vec<String> = fields
                .iter()
                .map(|(st, m, o, n)| format!("{{offsetof(struct {st}, {m}), sizeof(((struct {st} *)0)->{m}), {} << {o}}}", mask(*n)))
                .collect();
            let _ = writeln!(
                src,
                "#ifndef BKF_NO_FIELD_GUARD__\nstatic const struct {{ uint32_t off, width; uint64_t mask; }} FIELD__[] = {{\n  {}\n}};\n#endif",
                list(&f)
            );
        }
        let _ = writeln!(src, "static struct bkf_guard GUARDS__[{}];\n", sleds.len());
        "BKF_GUARDS__"
    } else {
        "(const struct bkf_guard *)0"
    };
    let _ = writeln!(
        src,
        "static void handler__(struct bkf_frame *f__, void *xs__, uint32_t k__, void *arg__) {{\n  \
           uint64_t bkf_pc__ = f__->ret - 7, bkf_tsc__ = 0;\n  uint32_t bkf_jp__ = {jp_expr};\n  (void)xs__, (void)arg__, (void)bkf_pc__, (void)bkf_jp__, (void)bkf_tsc__;\n  \
           switch ({case_expr}) {{\n{cases}  }}\n}}\n"
    );
    // weave sets BKF_WEAVE_FLAGS__ to BKF_WEAVE_NO_VECTOR when the module
    // builds vector-free (vector_free_object)
    let _ = writeln!(src, "#ifndef BKF_WEAVE_FLAGS__\n#define BKF_WEAVE_FLAGS__ 0u\n#endif");
    if guarded > 0 {
        let _ = writeln!(src, "#ifdef BKF_NO_GUARD__\n#define BKF_GUARDS__ ((const struct bkf_guard *)0)\n#else\n#define BKF_GUARDS__ GUARDS__\n#endif");
    }
    let _ = writeln!(src, "static int init__(void) {{");
    // weave --buffer-size: before any record of this weave
    let _ = writeln!(src, "#ifdef BKF_BUF_SIZE__\n  bkf_buffer_size(BKF_BUF_SIZE__);\n#endif");
    for x in &a.xflows {
        let _ = writeln!(src, "  T_{0} = bkf_table(\"{0}\");", x.name);
    }
    if guarded > 0 {
        let field = if fields.is_empty() {
            "GUARDS__[k].n = 0; break;".to_string()
        } else {
            "\n#ifdef BKF_NO_FIELD_GUARD__\n        GUARDS__[k].n = 0; break;\n#else\n        \
             GUARDS__[k].off[i] = FIELD__[GSPEC__[k].ix[i]].off;\n        GUARDS__[k].width[i] = (uint8_t)FIELD__[GSPEC__[k].ix[i]].width;\n        \
             GUARDS__[k].mask[i] = FIELD__[GSPEC__[k].ix[i]].mask;\n#endif\n     "
                .to_string()
        };
        let _ = writeln!(
            src,
            "  for (uint32_t k = 0; k < {}; k++) {{\n    GUARDS__[k].n = GSPEC__[k].n;\n    for (uint32_t i = 0; i < GSPEC__[k].n; i++) {{\n      \
             GUARDS__[k].kind[i] = GSPEC__[k].kind[i];\n      GUARDS__[k].reg[i] = GSPEC__[k].reg[i];\n      \
             if (GSPEC__[k].kind[i] == BKF_GUARD_KEY) GUARDS__[k].table[i] = *XF__[GSPEC__[k].ix[i]];\n      else {{ {field} }}\n    }}\n  }}",
            sleds.len()
        );
    }
    let _ = writeln!(
        src,
        "{fill}  return bkf_weave_guarded({n}, SLEDS__, CASE__, handler__, 0, BKF_WEAVE_FLAGS__, {guards_arg}) ? -1 : 0;\n}}\n\
         static void exit__(void) {{ bkf_unweave({n}, SLEDS__); }}\n\n\
         BUNKAI_MODULE(\"{module}\", \"1\");\nBUNKAI_MODULE_INIT(init__);\nBUNKAI_MODULE_EXIT(exit__);",
        n = sleds.len(),
        fill = if packed { String::new() } else { format!("  for (uint32_t k = 0; k < {}; k++) CASE__[k] = k;\n", sleds.len()) }
    );
    // xs__ appears twice in every module (parameter, cast to void); more
    // uses read an %xmm register from the XSAVE area
    let needs_xsave = src.matches("xs__").count() > 2;
    // the generated lines after each piece of the aspect's C are numbered
    // as the generated file's again
    let mut source = String::with_capacity(src.len() + 64);
    for (i, line) in src.lines().enumerate() {
        if line.trim() == RESET_LINE {
            let _ = writeln!(source, "#line {} {GENERATED_NAME}", i + 2);
        } else {
            source += line;
            source.push('\n');
        }
    }
    Ok(Generated { source, sleds, needs_xsave, guarded, field_guarded })
}

/// Placeholders for the two file names in `#line` directives, filled in by
/// Generated::named.
const ASPECT_NAME: &str = "\"__BKF_ASPECT__\"";
const GENERATED_NAME: &str = "\"__BKF_GENERATED__\"";
const RESET_LINE: &str = "#line __BKF_RESET__";

/// A piece of the aspect's own C (advice, or a start, quit or transit
/// action) as the module holds it: behind a `#line` directive naming the
/// aspect's line, and padded so that its first character is at the
/// aspect's column, so that the compiler's errors point into the aspect
/// file (`check` and `weave` show them as they come).
fn code_c(code: &crate::aspect::Code) -> String {
    let text = code.text.replace("$pc$", "bkf_pc__");
    let pad = " ".repeat((code.pos.col as usize).saturating_sub(3));
    // the closing brace on a line of its own: the code's last line may end
    // in a // comment or a backslash
    format!("#line {} {ASPECT_NAME}\n{pad}{{ {}\n}}\n{RESET_LINE}\n", code.pos.line, text.trim_end())
}

/// A C string literal of a path.
fn c_string(s: &str) -> String {
    let mut out = String::from("\"");
    for ch in s.chars() {
        match ch {
            '\\' | '"' => {
                out.push('\\');
                out.push(ch);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out += &format!("\\{:03o}", c as u32),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl Generated {
    /// The source with its `#line` directives naming the aspect file (as
    /// the user gave it) and the generated file.
    pub fn named(&self, aspect: &str, generated: &str) -> String {
        self.source.replace(ASPECT_NAME, &c_string(aspect)).replace(GENERATED_NAME, &c_string(generated))
    }
}

/// What a vector-free advice module may call: the flow runtime, which is
/// built with -mgeneral-regs-only (flow/runtime/CMakeLists.txt).
const VECTOR_FREE_CALLS: &[&str] = &[
    "bkf_table",
    "get_new_flowid",
    "register_flowid",
    "get_flowid",
    "remove_flowid",
    "bkf_table_size",
    "bkf_store",
    "bkf_store_tsc",
    "bkf_buffer_size",
    "bkf_weave",
    "bkf_weave_ex",
    "bkf_weave_guarded",
    "bkf_unweave",
];

/// None if the object (compiled with -mgeneral-regs-only) calls only the
/// flow runtime; else the first other symbol it needs (e.g. glibc's memcpy,
/// which may use AVX).
pub fn vector_free_object(obj: &[u8]) -> Result<Option<String>> {
    use object::{Object, ObjectSymbol};
    let f = object::File::parse(obj).map_err(|e| anyhow::anyhow!("the advice object is not ELF: {e}"))?;
    Ok(f.symbols()
        .filter(|s| s.is_undefined() && s.is_global())
        .filter_map(|s| s.name().ok().map(str::to_string))
        .find(|n| !n.is_empty() && !VECTOR_FREE_CALLS.contains(&n.as_str())))
}

fn mask(bits: u32) -> String {
    if bits >= 64 {
        "0xffffffffffffffffull".into()
    } else {
        format!("{:#x}ull", (1u64 << bits) - 1)
    }
}

/// Whether every xflow() of the expression sits in a chain of ANDs.
fn top_level_and(e: &crate::aspect::Expr) -> bool {
    use crate::aspect::Expr;
    fn has_xflow(e: &Expr) -> bool {
        e.prims().iter().any(|(p, _)| matches!(p, Prim::Xflow { .. }))
    }
    match e {
        Expr::And(a, b) => top_level_and(a) && top_level_and(b),
        Expr::Or(_, _) | Expr::Not(_) => !has_xflow(e),
        Expr::Prim(..) => true,
    }
}

enum Part<'a> {
    Start(&'a crate::aspect::Point),
    Transit(&'a crate::aspect::Transit),
    Quit(&'a crate::aspect::Point),
}

/// The k-th xflow part in uses() order (starts, transits, quits per xflow).
fn xflow_part(a: &Aspect, mut k: usize) -> (&crate::aspect::Xflow, Part<'_>) {
    for x in &a.xflows {
        if k < x.starts.len() {
            return (x, Part::Start(&x.starts[k]));
        }
        k -= x.starts.len();
        if k < x.transits.len() {
            return (x, Part::Transit(&x.transits[k]));
        }
        k -= x.transits.len();
        if k < x.quits.len() {
            return (x, Part::Quit(&x.quits[k]));
        }
        k -= x.quits.len();
    }
    unreachable!("uses() and the xflows disagree")
}
