//! `bunkai flow points FILE [--json]`: the join points of a program, as a
//! table (one line each) or as one JSON document for other tools.

use crate::joinpoints::{self, JoinPoint, Kind, Location};
use anyhow::Result;
use serde_json::{json, Value};
use std::path::Path;
use std::process::ExitCode;

fn location_json(l: &Location) -> Value {
    match l {
        Location::Reg(r) => json!({"kind": "reg", "reg": r}),
        Location::Mem { base, offset } => json!({
            "kind": "mem",
            "base": if *base == joinpoints::Base::Rsp { "rsp" } else { "rbp" },
            "offset": offset,
        }),
        Location::Imm(v) => json!({"kind": "imm", "value": v}),
    }
}

pub fn to_json(jp: &JoinPoint) -> Value {
    let ops: Vec<Value> = jp
        .operands
        .iter()
        .map(|(n, l)| {
            let mut v = location_json(l);
            v["name"] = json!(n);
            v["location"] = json!(l.to_string());
            v
        })
        .collect();
    json!({
        "index": jp.index,
        "sled_addr": jp.sled_addr,
        "kind": if jp.kind == Kind::Entry { "entry" } else { "access" },
        "struct": jp.struct_name,
        "member": jp.member,
        "function": jp.function,
        "file": jp.file,
        "line": jp.line,
        "access": jp.access.as_str(),
        "after": jp.after,
        "operands": ops,
    })
}

/// One line per join point, columns aligned.
pub fn table(jps: &[JoinPoint]) -> String {
    let rows: Vec<[String; 6]> = jps
        .iter()
        .map(|jp| {
            let what = match (&jp.struct_name, &jp.member) {
                (Some(s), Some(m)) => format!("{s}.{m}"),
                _ => "-".to_string(),
            };
            let ops: Vec<String> = jp
                .operands
                .iter()
                .map(|(n, l)| format!("{n}={l}"))
                .collect();
            [
                format!("{:#x}", jp.sled_addr),
                if jp.after { format!("{} after", jp.access.as_str()) } else { jp.access.as_str().to_string() },
                what,
                jp.function.clone(),
                format!("{}:{}", jp.file, jp.line),
                ops.join(" "),
            ]
        })
        .collect();
    let head = [
        "sled",
        "access",
        "join point",
        "function",
        "file:line",
        "operands",
    ];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |i: &str, r: &[&str]| {
        let mut s = format!("{i:>4}");
        for (k, c) in r.iter().enumerate() {
            if k + 1 == r.len() {
                s += &format!("  {c}");
            } else {
                s += &format!("  {c:<width$}", width = w[k]);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line("#", &head);
    for (jp, r) in jps.iter().zip(&rows) {
        let cols: Vec<&str> = r.iter().map(String::as_str).collect();
        out += &line(&jp.index.to_string(), &cols);
    }
    out
}

/// Which join points to print (None: any).
#[derive(Default)]
pub struct Filter {
    pub function: Option<String>,
    pub strukt: Option<String>,
}

impl Filter {
    fn keeps(&self, jp: &JoinPoint) -> bool {
        self.function.as_ref().is_none_or(|f| &jp.function == f)
            && self.strukt.as_ref().is_none_or(|s| jp.struct_name.as_ref() == Some(s))
    }
}

/// Prints the join points of `file` that `filter` keeps: a table, or with
/// `json` one JSON document.
pub fn run(file: &Path, json: bool, filter: &Filter) -> Result<ExitCode> {
    let all = joinpoints::read(file)?;
    let total = all.len();
    let jps: Vec<JoinPoint> = all.into_iter().filter(|jp| filter.keeps(jp)).collect();
    if jps.is_empty() && total > 0 && (filter.function.is_some() || filter.strukt.is_some()) {
        let what: Vec<String> = [
            filter.function.as_ref().map(|f| format!("in function {f}")),
            filter.strukt.as_ref().map(|s| format!("on struct {s}")),
        ]
        .into_iter()
        .flatten()
        .collect();
        anyhow::bail!(
            "none of the {total} join points of {} is {} (`bunkai flow points {}` lists them all)",
            file.display(),
            what.join(" and "),
            file.display()
        );
    }
    let text = if json {
        let doc = json!({
            "file": file.display().to_string(),
            "version": joinpoints::VERSION,
            "count": jps.len(),
            "joinpoints": jps.iter().map(to_json).collect::<Vec<_>>(),
        });
        serde_json::to_string_pretty(&doc)? + "\n"
    } else {
        table(&jps)
    };
    crate::stdout(&text)?;
    Ok(ExitCode::SUCCESS)
}
