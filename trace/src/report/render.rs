//! The report as text: tables, wrapped notes, numbers with separators.

use super::*;

// ---------------------------------------------------------------------------
// Text

/// Thousands separators: 1234567 -> "1,234,567".
pub(super) use bunkai_common::fmt::commas;

pub(super) fn fcommas(v: f64) -> String {
    if v.is_finite() && v >= 0.0 {
        commas(v.round() as u64)
    } else {
        format!("{v}")
    }
}

/// A note wrapped at 100 columns, indented.
pub(super) fn wrap(head: &str, text: &str) -> String {
    let mut out = String::new();
    let mut line = format!("  {head}");
    let indent = " ".repeat(line.len());
    for word in text.split_whitespace() {
        if line.len() + word.len() + 1 > 100 && line.trim().len() > head.trim().len() {
            out += line.trim_end();
            out.push('\n');
            line = indent.clone();
        }
        if !line.ends_with(' ') {
            line.push(' ');
        }
        line += word;
    }
    out += line.trim_end();
    out.push('\n');
    out
}

/// A percentage with two decimals below 1%.
pub(super) fn pc(v: f64) -> String {
    if v.abs() < 1.0 {
        format!("{v:.2}%")
    } else {
        format!("{v:.1}%")
    }
}

/// Columns aligned: the first left, the others right.
pub fn table(head: &[&str], rows: &[Vec<String>]) -> String {
    let n = head.len();
    let mut w: Vec<usize> = head.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(n) {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from("  ");
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(head.to_vec());
    for r in rows {
        out += &line(r.iter().map(|s| s.as_str()).collect());
    }
    out
}

pub(super) fn opt(v: Option<u64>) -> String {
    v.map(commas).unwrap_or_else(|| "n/a".into())
}

pub(super) fn stats(s: &Option<RefStats>, pages: Option<u64>) -> [String; 3] {
    match (s, pages) {
        (Some(s), _) => [commas(s.min), commas(s.max), fcommas(s.mean)],
        (None, None) => ["n/a".into(), "n/a".into(), "n/a".into()],
        (None, Some(_)) => ["-".into(), "-".into(), "-".into()],
    }
}

impl Report {
    /// The tables as the paper lays them out.
    pub fn text(&self) -> String {
        let mut o = String::new();
        o += &format!("bunkai trace report: {}\n", self.trace);
        o += &format!("  {} stream(s):\n", self.streams.len());
        for s in &self.streams {
            let status = match (s.ended, s.exit_status, &s.signal) {
                ("exit", Some(x), _) => format!("exited {x}"),
                ("signal", _, Some(sig)) => format!("killed by {sig}"),
                ("exec", _, _) => "exec'd".into(),
                ("cut", _, Some(sig)) => format!("cut (killed by {sig})"),
                ("cut", _, None) => "cut".into(),
                _ => "no BYE".into(),
            };
            o += &format!(
                "    stream {:<3} pid {:<7} {:<24} {:>14} instr {:>14} refs {:>6} syscalls  {}\n",
                s.stream,
                s.pid,
                basename(&s.executable),
                commas(s.instructions),
                commas(s.memory_references),
                s.syscalls,
                status
            );
        }
        let kernel = self.components.iter().find(|c| c.kind == Kind::Kernel);
        let user: Vec<&ComponentRow> = self.components.iter().filter(|c| c.kind != Kind::Kernel).collect();
        let with_libs = || {
            let mut v: Vec<&ComponentRow> = user.clone();
            let at = v.iter().position(|c| c.kind == Kind::Library).unwrap_or(v.len());
            v.insert(at, &self.shared_libraries_total);
            v
        };

        o += "\nTable 1: dynamic instructions per component (the paper's Tables 1 and 4)\n";
        let mut rows: Vec<Vec<String>> = with_libs()
            .iter()
            .map(|c| vec![label(c), opt(c.instructions), format!("{:.1}%", c.percent.unwrap_or(0.0))])
            .collect();
        if let (Some(k), true) = (kernel, self.system) {
            rows.push(vec![
                "kernel".into(),
                opt(k.instructions),
                format!("{:.1}%", k.percent.unwrap_or(0.0)),
                format!("{} syscalls", commas(k.syscalls.unwrap_or(0))),
            ]);
        } else if let Some(k) = kernel {
            rows.push(vec![
                "kernel".into(),
                "n/a".into(),
                "n/a".into(),
                format!(
                    "{} syscalls, {:.3} ms in syscalls",
                    commas(k.syscalls.unwrap_or(0)),
                    k.syscall_seconds.unwrap_or(0.0) * 1e3
                ),
            ]);
        }
        let total = if self.system { "total (kernel and user mode)" } else { "total (user mode)" };
        rows.push(vec![total.into(), commas(self.total_instructions), "100.0%".into()]);
        o += &table(&["component", "instructions", "percent", ""], &rows);
        o += &wrap("note: ", kernel.and_then(|k| k.note.as_deref()).unwrap_or(KERNEL_NOTE));

        o += "\nTable 2: pages used per component, 4 KiB pages (the paper's Tables 2 and 5)\n";
        let mut rows: Vec<Vec<String>> =
            with_libs().iter().map(|c| vec![label(c), opt(c.code_pages), opt(c.data_pages)]).collect();
        match kernel {
            Some(k) if self.system => rows.push(vec!["kernel".into(), opt(k.code_pages), opt(k.data_pages)]),
            _ => rows.push(vec!["kernel".into(), "n/a".into(), "n/a".into()]),
        }
        o += &table(&["component", "instruction pages", "data pages"], &rows);

        o += "\nTable 3: references per page, min / max / mean (the paper's Tables 3 and 6)\n";
        let mut rows: Vec<Vec<String>> = with_libs()
            .iter()
            .map(|c| {
                let mut r = vec![label(c)];
                r.extend(stats(&c.code_refs, c.code_pages));
                r.extend(stats(&c.data_refs, c.data_pages));
                r
            })
            .collect();
        match kernel {
            Some(k) if self.system => {
                let mut r = vec!["kernel".to_string()];
                r.extend(stats(&k.code_refs, k.code_pages));
                r.extend(stats(&k.data_refs, k.data_pages));
                rows.push(r);
            }
            _ => rows.push(["kernel", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a"].iter().map(|s| s.to_string()).collect()),
        }
        o += &table(&["component", "instr min", "instr max", "instr mean", "data min", "data max", "data mean"], &rows);
        if self.system {
            o += "
Interrupts and exceptions by entry stub (system mode)
";
            let rows: Vec<Vec<String>> =
                self.traps.iter().map(|t| vec![t.stub.clone(), t.kind.clone(), commas(t.count)]).collect();
            o += &table(&["entry stub", "kind", "count"], &rows);
            o += &format!("  address-space switches (CR3 loads): {}\n", commas(self.address_space_switches));
            o += &format!(
                "  kernel instructions by task: {} in the server's task, {} in other tasks (idle loop, kernel threads, other processes)\n",
                commas(self.kernel_server_task),
                commas(self.kernel_other_tasks)
            );
        }

        let e = &self.estimate;
        o += &format!("\n§4 estimate: TLB misses and switches of a TURU-style tracer on {}\n", e.cpu.name);
        o += &format!("  cycles: {} ({})\n", fcommas(e.cycles), e.cycles_source);
        o += &format!(
            "  TLB: ({} instruction + {} data pages) x {}-{} cycles = {}-{} cycles = {}-{} of all cycles\n",
            commas(e.code_pages),
            commas(e.data_pages),
            e.cpu.tlb_miss_cycles_min,
            e.cpu.tlb_miss_cycles_max,
            fcommas(e.tlb_cycles_min),
            fcommas(e.tlb_cycles_max),
            pc(e.tlb_percent_min),
            pc(e.tlb_percent_max)
        );
        o += &format!(
            "  switches: ({} syscalls + {} address-space switches) x {} cycles = {} cycles = {} of all cycles\n",
            commas(e.syscalls),
            commas(e.address_space_switches),
            e.cpu.switch_cycles,
            fcommas(e.switch_cycles),
            pc(e.switch_percent)
        );
        o += &wrap("  address-space switches: ", &self.address_space_switches_note);
        o += &format!("  together: {}-{} of all cycles\n", pc(e.overhead_percent_min), pc(e.overhead_percent_max));
        match (e.requests_per_second_after_min, e.requests_per_second_after_max) {
            (Some(lo), Some(hi)) => {
                o += &format!(
                    "  requests/s (if the trace is one request): {:.1} -> {lo:.1}-{hi:.1} without that overhead\n",
                    e.requests_per_second_before
                )
            }
            _ => {
                o += &format!(
                    "  requests/s (if the trace is one request): {:.1}; the estimated overhead exceeds the cycles \
                     (give the measured --cycles or --seconds)\n",
                    e.requests_per_second_before
                )
            }
        }
        o += &format!(
            "\n  {} records (instructions + memory references) in {:.3} s ({:.1} M records/s)\n",
            commas(self.records),
            self.seconds,
            self.records_per_second / 1e6
        );
        for w in &self.warnings {
            o += &format!("  warning: {w}\n");
        }
        o
    }
}

pub(super) fn label(c: &ComponentRow) -> String {
    match c.kind {
        Kind::Program => format!("{} (program)", c.name),
        Kind::Library if c.name != LIBS_TOTAL => format!("  {}", c.name),
        _ => c.name.clone(),
    }
}
