#!/usr/bin/env python3
"""Table 3 alone: the launcher's size against the original's (issue 23's
"launcher <= 10% of the original", SQLite and Vim), and what the launcher's
bytes are, beside an earlier build's launcher scattered in the same run.

    launcher.py [--work DIR] [--out bench/results/scatter-launcher.md]
                [--programs sqlite3,libsqlite3,vim] [--before BUNKAI] [--reuse]

Programs: SQLite's shell and library as one program (shell.c + the
amalgamation) and libsqlite3.so alone (--lib), Debian's flags (`make
fetch-sqlite`), scattered as bench/scatter/tables.py does; Vim (whole-program
bitcode, when scripts/fetch-vim.sh has built it). Sizes are of the stripped
files, as `bunkai scatter stats` gives them (Table 3). With --before BUNKAI
(an earlier build copied with its lib/bunkai beside it), the same scatters by
it too (--before-programs: only those). --reuse keeps outputs already in the
work directory (to render again); without it every program is scattered
anew."""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from common import write_results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNKAI = os.path.join(ROOT, "build/bin/bunkai")
SQLITE = os.path.join(ROOT, "build/third_party/sqlite")
VIM = os.path.join(ROOT, "build/third_party/vim")
TARGET = 10.0  # percent of the original, issue 23
LABEL = {"vim": "Vim", "sqlite3": "SQLite3 (shell)", "libsqlite3": "SQLite3 (libsqlite3.so)"}
# Sections by what they are for.
KINDS = [
    ("dynamic symbols", (".dynsym", ".dynstr", ".gnu.hash", ".hash", ".gnu.version",
                         ".gnu.version_r", ".gnu.version_d")),
    ("relocations", (".rela.dyn", ".rela.plt", ".relr.dyn")),
    (".text", (".text",)),
    (".rodata", (".rodata",)),
    (".data.rel.ro", (".data.rel.ro",)),
    (".data", (".data",)),
    ("unwind tables", (".eh_frame", ".eh_frame_hdr")),
]


def log(msg):
    print(f"launcher: {msg}", file=sys.stderr, flush=True)


def programs(names):
    out = []
    for n in names:
        if n in ("sqlite3", "libsqlite3"):
            if not os.path.exists(os.path.join(SQLITE, "sqlite3.c")):
                sys.exit("launcher: no SQLite sources (run `make fetch-sqlite`)")
            flags = open(os.path.join(SQLITE, "flags.txt")).read().split() + [f"-I{SQLITE}"]
            if n == "sqlite3":
                out.append((n, [os.path.join(SQLITE, "shell.c"), os.path.join(SQLITE, "sqlite3.c")],
                            flags, ["--name", "sqlite3"]))
            else:
                out.append((n, [os.path.join(SQLITE, "sqlite3.c")], flags, ["--lib", "--name", "sqlite3"]))
        elif n == "vim":
            bc = os.path.join(VIM, "vim.bc")
            if not os.path.exists(bc):
                log(f"Vim skipped: {bc} is not there (bash scripts/fetch-vim.sh builds it)")
                continue
            out.append((n, [bc], ["-O2"] + open(os.path.join(VIM, "linkflags.txt")).read().split(),
                        ["--name", "vim"]))
        else:
            sys.exit(f"launcher: unknown program {n} (sqlite3, libsqlite3, vim)")
    return out


def sections(path):
    """{name: (type, size)} from readelf -S -W."""
    r = subprocess.run(["readelf", "-S", "-W", path], capture_output=True, text=True, check=True)
    out = {}
    for line in r.stdout.splitlines():
        line = line.strip()
        if not line.startswith("["):
            continue
        f = line[line.index("]") + 1:].split()
        if len(f) < 6 or f[0] == "Name":
            continue
        out[f[0]] = (f[1], int(f[4], 16))
    return out


def breakdown(path, nfuncs):
    """The launcher's file bytes by what they are for. Stubs (8 bytes each,
    8-aligned) and lazy entries (5 bytes each) are part of .text."""
    secs = sections(path)
    total = os.path.getsize(path)
    rows, seen = [], set()
    for kind, names in KINDS:
        n = sum(secs[s][1] for s in names if s in secs)
        seen.update(names)
        if kind == ".text" and n:
            stubs = min(n, 13 * nfuncs)
            rows.append(("stubs and lazy entries (13 B a function)", stubs))
            n -= stubs
            kind = ".text, the rest (runtime, code kept in the launcher)"
        rows.append((kind, n))
    other = sum(sz for s, (t, sz) in secs.items() if s and s not in seen and t != "NOBITS"
                and not s.startswith(".comment"))
    rows.append(("other sections (.dynamic, .got, .plt, notes, ...)", other))
    rows.append(("ELF headers, .comment, alignment padding", total - sum(n for _, n in rows)))
    return rows, total


def scatter(bunkai, out, inputs, flags, extra, reuse):
    if reuse and os.path.exists(os.path.join(out, "manifest.json")):
        return
    t = time.time()
    r = subprocess.run([bunkai, "scatter", "-o", out, *extra, *inputs, "--", *flags],
                       stdout=subprocess.DEVNULL)
    if r.returncode != 0:
        sys.exit(f"launcher: scatter of {out} failed ({r.returncode})")
    log(f"{os.path.basename(out)}: scattered in {time.time() - t:.0f} s")


def measure(bunkai, out):
    st = json.loads(subprocess.run([bunkai, "scatter", "stats", out, "--json"], capture_output=True,
                                   text=True, check=True).stdout)
    m = json.load(open(os.path.join(out, "manifest.json")))
    rows, total = breakdown(os.path.join(out, m["launcher"]), len(m["functions"]))
    assert total == st["launcher_bytes"], (total, st["launcher_bytes"])
    return {"launcher": st["launcher_bytes"], "original": st["original_bytes"],
            "functions": len(m["functions"]), "exports": m["exports"], "rows": rows}


def commit():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def kib(n):
    return f"{n / 1024:,.0f}"


def pct(a, b):
    return f"{100.0 * a / b:.1f}%"


def render(a, res):
    L = ["# bunkai scatter: launcher size (Table 3, issue 23)\n",
         f"Generated by `python3 bench/scatter/launcher.py{' --before BUNKAI' if a.before else ''}"
         f"{' --before-programs ' + a.before_programs if a.before_programs else ''}` on "
         f"{time.strftime('%Y-%m-%d')} at commit {commit()}, {os.cpu_count()} CPUs. Sizes are of the "
         "stripped files (`bunkai scatter stats`, as Table 3 of bench/results/scatter.md). "
         + (f"The earlier build is a copy of build/ made before this change (`{a.before_version}`), "
            "scattering the same inputs with the same flags in the same run. " if a.before else "")
         + "Issue 23's target: the launcher at most 10% of the original, SQLite and Vim.\n",
         "| program | functions | launcher [KiB] | original [KiB] | ratio |"
         + (" earlier build's launcher [KiB] | ratio |" if a.before else ""),
         "|---|---:|---:|---:|---:|" + ("---:|---:|" if a.before else "")]
    for k, r in res:
        o = r["ours"]
        row = (f"| {LABEL[k]} | {o['functions']:,} | {kib(o['launcher'])} | {kib(o['original'])} | "
               f"{pct(o['launcher'], o['original'])} |")
        if a.before:
            b = r.get("before")
            row += (f" {kib(b['launcher'])} | {pct(b['launcher'], b['original'])} |" if b
                    else " not scattered by it in this run | |")
        L.append(row)
    for k, r in res:
        b = r.get("before")
        L += ["", f"## {LABEL[k]}: the launcher's bytes\n",
              "File bytes by section, grouped by what they are for (`readelf -S`); .bss takes no file "
              f"bytes. The launcher exports {r['ours']['exports']:,} symbols to the libraries"
              + (f" (the earlier build's {b['exports']:,})" if b else "") + ".\n",
              "| part | bytes | share |" + (" earlier build [bytes] |" if b else ""),
              "|---|---:|---:|" + ("---:|" if b else "")]
        before = dict(b["rows"]) if b else {}
        brows = b["rows"] if b else []
        names = [n for n, _ in r["ours"]["rows"]] + [n for n, _ in brows if n not in dict(r["ours"]["rows"])]
        ours = dict(r["ours"]["rows"])
        for n in names:
            row = f"| {n} | {ours.get(n, 0):,} | {pct(ours.get(n, 0), r['ours']['launcher'])} |"
            if b:
                row += f" {before.get(n, 0):,} |"
            L.append(row)
        row = f"| all | {r['ours']['launcher']:,} | 100.0% |"
        if b:
            row += f" {b['launcher']:,} |"
        L.append(row)
    L += ["", "## Targets\n"]
    for k, r in res:
        o, b = r["ours"], r.get("before")
        ratio = 100.0 * o["launcher"] / o["original"]
        was = f"; the earlier build's {pct(b['launcher'], b['original'])}" if b else ""
        L.append(f"- {LABEL[k]}: launcher ≤ 10% of the original: {ratio:.1f}% "
                 f"({kib(o['launcher'])} of {kib(o['original'])} KiB{was}): "
                 f"**{'PASS' if ratio <= TARGET else 'MISS'}**")
    for k in ("sqlite3", "libsqlite3", "vim"):
        if k not in dict(res):
            L.append(f"- {LABEL[k]}: not measured in this run")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(ROOT, "build/bench/scatter-launcher"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/scatter-launcher.md"))
    ap.add_argument("--programs", default="sqlite3,libsqlite3,vim")
    ap.add_argument("--before", help="an earlier bunkai (with its lib/bunkai beside it), scattered too")
    ap.add_argument("--before-programs", help="scatter only these with --before (default: all)")
    ap.add_argument("--reuse", action="store_true", help="keep outputs already in the work directory")
    ap.add_argument("--json", help="also write the raw figures here")
    a = ap.parse_args()
    a.before_version = ""
    if a.before:
        a.before_version = subprocess.run([a.before, "--version"], capture_output=True,
                                          text=True).stdout.strip()
    os.makedirs(a.work, exist_ok=True)
    res = []
    for key, inputs, flags, extra in programs(a.programs.split(",")):
        r = {}
        for who, bunkai in (("ours", BUNKAI), ("before", a.before)):
            if not bunkai or (who == "before" and a.before_programs
                              and key not in a.before_programs.split(",")):
                continue
            out = os.path.join(a.work, key if who == "ours" else f"{key}-before")
            scatter(bunkai, out, inputs, flags, extra, a.reuse)
            r[who] = measure(bunkai, out)
        res.append((key, r))
    text = render(a, res)
    write_results(a.out, text, a.json, res)


if __name__ == "__main__":
    main()
