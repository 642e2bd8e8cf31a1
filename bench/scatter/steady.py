#!/usr/bin/env python3
"""Where a scattered program's steady-state cost goes (issue 23): the same
workload on OUT/original and on the scattered program grouped at 64 KiB,
side by side in one run.

    steady.py [--work DIR] [--reps N] [--threshold 64KiB] [--regroup]
              [--workloads SQLite3-query,demo2] [--no-callgrind] [--json FILE]

For each workload it prints
  - instructions executed (valgrind --tool=callgrind, totals), for the
    original and the scattered program, split by what executed them:
      stub      the launcher's stubs (jmpq *slot(%rip), in a row 8 bytes apart;
                before ABI 5: movl $id,%r11d; jmpq *slot(%rip))
      plt       PLT entries, in any object (the original has them too, for libc;
                valgrind attributes them to no object, "???")
      got-load  loads of an address from a GOT (PIC code reaching a global or
                a function pointer; the original, not PIC, has almost none)
      ld.so     the dynamic loader (dlopen, relocation, symbol lookup)
      other     everything else (the program's own code, libc, the manager)
  - wall time: the median of interleaved runs (original, scattered, ...).

Programs are scattered (and profiled, grouped) in WORK the way
bench/scatter/tables.py does it, and reused when they are there: SQLite's
shell (SQLite3-query: 1,000 autocommit inserts and searches on a database
file on disk; SQLite3-memory: the same statements 20 times over on an
in-memory database, so that the run is the program's and not the disk's)
and demo2 (the paper's busy loop; 300 outer iterations under
callgrind, 100,000 for wall time). Needs valgrind and objdump."""
import argparse
import bisect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from common import write_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNKAI = os.path.join(ROOT, "build/bin/bunkai")
PROGS = os.path.join(ROOT, "tests/programs")
SQLITE = os.path.join(ROOT, "build/third_party/sqlite")
CATS = ("stub", "plt", "got-load", "ld.so", "other")
ABI = int(next(l.split()[2] for l in open(os.path.join(ROOT, "scatter/include/bunkai_scatter.h"))
               if l.startswith("#define BUNKAI_SCATTER_VERSION")))


def log(msg):
    print(f"steady: {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw):
    r = subprocess.run(cmd, **kw)
    if r.returncode != 0:
        sys.exit(f"steady: command failed ({r.returncode}): {' '.join(map(str, cmd))}")
    return r


def parse_size(s):
    m = re.fullmatch(r"(\d+)\s*(KiB|K|MiB|M|B)?", s)
    if not m:
        sys.exit(f"steady: bad size {s} (use e.g. 64KiB)")
    return int(m.group(1)) * {None: 1, "B": 1, "K": 1024, "KiB": 1024, "M": 1 << 20, "MiB": 1 << 20}[m.group(2)]


# --- disassembly: what kind of instruction is at each address ------------
class Disasm:
    """An object's instructions by address, and its sections, from objdump
    (the launcher and the groups are stripped; objdump needs no symbols)."""

    def __init__(self, path):
        self.kind = {}
        self.got = []
        h = subprocess.run(["objdump", "-h", "-w", path], capture_output=True, text=True).stdout
        for line in h.splitlines():
            f = line.split()
            if len(f) >= 4 and f[1] in (".got", ".got.plt"):
                a, n = int(f[3], 16), int(f[2], 16)
                self.got.append((a, a + n))
        d = subprocess.run(["objdump", "-d", "-w", "--no-show-raw-insn", path],
                           capture_output=True, text=True).stdout
        section = ""
        prev = None  # (addr, text) of the previous instruction
        jumps = []  # `jmp *X(%rip)` outside the PLT
        for line in d.splitlines():
            if line.startswith("Disassembly of section "):
                section = line[len("Disassembly of section "):].rstrip(":")
                prev = None
                continue
            m = re.match(r"\s*([0-9a-f]+):\s+(.*)", line)
            if not m:
                continue
            addr, text = int(m.group(1), 16), m.group(2)
            if not section.startswith(".plt") and re.match(r"jmp\s+\*0x[0-9a-f]+\(%rip\)", text):
                jumps.append(addr)
            if section.startswith(".plt"):
                k = "plt"
            elif re.match(r"mov\s+\$0x[0-9a-f]+,%r11d$", text):
                k = "stub"
            elif prev and prev[1] == "stub" and text.startswith("jmp") and "*" in text and "(%rip)" in text:
                k = "stub"
            elif self._got_load(text):
                k = "got-load"
            else:
                k = "other"
            self.kind[addr] = k
            prev = (addr, k)
        # The launcher's stubs (PLT-like, stubs.rs): `jmpq *slot(%rip)`, 8
        # bytes apart, in a row; a lone indirect jump is the program's own.
        js = set(jumps)
        for a in jumps:
            if a - 8 in js or a + 8 in js:
                self.kind[a] = "stub"

    def _got_load(self, text):
        m = re.match(r"mov\s+0x[0-9a-f]+\(%rip\),%r\w+\s+# ([0-9a-f]+)", text)
        if not m:
            return False
        t = int(m.group(1), 16)
        return any(a <= t < b for a, b in self.got)


_disasm = {}


def disasm(path):
    if path not in _disasm:
        _disasm[path] = Disasm(path)
    return _disasm[path]


def callgrind(cmd, stdin=None, setup=None, cwd=None):
    """Instructions executed by cmd, by category and by object."""
    if setup:
        setup()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "cg.out")
        f = open(stdin) if stdin else subprocess.DEVNULL
        r = subprocess.run(["valgrind", "--tool=callgrind", "--dump-instr=yes", "--skip-plt=no",
                            "--compress-strings=no", "--compress-pos=no",
                            f"--callgrind-out-file={out}", *cmd],
                           stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd)
        if r.returncode not in (0, 1):
            sys.exit(f"steady: valgrind {' '.join(cmd)} exited with {r.returncode}:\n{r.stderr[-2000:]}")
        return parse_callgrind(out)


def parse_callgrind(path):
    by_obj = {}  # object path -> {addr: Ir}
    total = None
    obj = None
    skip = False
    npos = 1  # position columns before the costs ("positions: instr line")
    with open(path) as f:
        for line in f:
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
                continue
            if line.startswith("ob="):
                obj = line[3:].strip()
                continue
            if line.startswith(("cob=", "cfi=", "cfn=", "fl=", "fi=", "fe=", "fn=")):
                continue
            if line.startswith("calls="):
                skip = True  # the next cost line is the call's inclusive cost
                continue
            if line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
                continue
            if line[:2] == "0x":
                if skip:
                    skip = False
                    continue
                f_ = line.split()
                if len(f_) > npos:
                    a = int(f_[0], 16)
                    d = by_obj.setdefault(obj, {})
                    d[a] = d.get(a, 0) + int(f_[npos])
    cats = dict.fromkeys(CATS, 0)
    objs = {}
    for o, costs in by_obj.items():
        n = sum(costs.values())
        objs[o] = n
        if "ld-linux" in os.path.basename(o):
            cats["ld.so"] += n
            continue
        if o == "???":
            # Valgrind maps PLT entries (.plt, .plt.sec, .plt.got) to no
            # object: they run as code outside every object's text.
            cats["plt"] += n
            continue
        if not os.path.exists(o):
            cats["other"] += n
            continue
        dis = disasm(o)
        for a, c in costs.items():
            cats[dis.kind.get(a, "other")] += c
    s = sum(objs.values())
    if total is not None and total != s:
        log(f"note: {path}: totals {total}, instructions counted {s}")
    return {"total": s, "cats": cats, "objs": objs}


def by_object(objs, exe):
    """Instructions by the object that ran them: the program (original or
    launcher), the scattered program's libraries, libc, the loader, PLT
    entries (valgrind's "???") and the rest."""
    out = {"program": 0, "libraries": 0, "libc": 0, "ld.so": 0, "plt": 0, "rest": 0}
    libdir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(exe))), "lib")
    for o, n in objs.items():
        b = os.path.basename(o)
        if o == "???":
            k = "plt"
        elif os.path.abspath(o) == os.path.abspath(exe):
            k = "program"
        elif os.path.abspath(o).startswith(libdir + os.sep):
            k = "libraries"
        elif b.startswith("libc.so"):
            k = "libc"
        elif "ld-linux" in b:
            k = "ld.so"
        else:
            k = "rest"
        out[k] += n
    return out


def timed(cmd, stdin=None, setup=None):
    """Wall time and CPU time (user + system) of one run, in ms."""
    if setup:
        setup()
    f = open(stdin) if stdin else subprocess.DEVNULL
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    dt = time.perf_counter() - t
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode not in (0, 1):
        sys.exit(f"steady: {cmd[0]} exited with {p.returncode}")
    return dt * 1000.0, (ru.ru_utime + ru.ru_stime) * 1000.0


def outputs_match(a_cmd, b_cmd, stdin=None, setup=None):
    res = []
    for cmd in (a_cmd, b_cmd):
        if setup:
            setup()
        f = open(stdin) if stdin else subprocess.DEVNULL
        r = subprocess.run(cmd, stdin=f, capture_output=True)
        res.append((r.returncode, r.stdout, r.stderr))
    return res[0] == res[1]


def ensure_grouped(out, inputs, flags, extra, profile_runs, threshold, regroup):
    mf = os.path.join(out, "manifest.json")
    if not os.path.exists(mf) or json.load(open(mf)).get("abi") != ABI:
        t = time.time()
        sh([BUNKAI, "scatter", "-o", out, *extra, *inputs, "--", *flags])
        log(f"scattered {os.path.basename(out)} in {time.time() - t:.0f} s")
        regroup = True
    m = json.load(open(os.path.join(out, "manifest.json")))
    g = m.get("groups")
    if not regroup and g and g.get("threshold_bytes") == threshold and \
            os.path.exists(os.path.join(out, m["libdir"], "groups.map")):
        return
    if os.path.exists(os.path.join(out, "profile")):
        os.unlink(os.path.join(out, "profile"))
    for i, (cmd, stdin, via, setup) in enumerate(profile_runs):
        if setup:
            setup()
        f = open(stdin) if stdin else subprocess.DEVNULL
        sh([BUNKAI, "scatter", "profile", out, *(["--append"] if i else []), *(["--via"] if via else []),
            "--", *cmd], stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t = time.time()
    sh([BUNKAI, "scatter", "group", out, "--threshold", str(threshold)],
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log(f"grouped {os.path.basename(out)} at {threshold} B in {time.time() - t:.0f} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.path.join(ROOT, "build/bench/scatter"))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threshold", default="64KiB")
    ap.add_argument("--regroup", action="store_true", help="profile and group again")
    ap.add_argument("--workloads", default="SQLite3-query,SQLite3-memory,demo2")
    ap.add_argument("--no-callgrind", action="store_true")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--out", help="write the table here too (markdown), e.g. bench/results/scatter-calls.md")
    a = ap.parse_args()
    th = parse_size(a.threshold)
    w = lambda *p: os.path.join(a.work, *p)
    os.makedirs(a.work, exist_ok=True)
    want = a.workloads.split(",")
    db = w(f"steady-{os.getpid()}.db")

    def rm_db():
        for s in ("", "-journal", "-wal"):
            if os.path.exists(db + s):
                os.unlink(db + s)

    init_sh = os.path.join(PROGS, "sqlite/workload-init.sh")
    query = os.path.join(PROGS, "sqlite/workload-query.sql")
    loads = []  # (label, orig argv, scat argv, stdin, setup, callgrind argv suffix)
    if "SQLite3-query" in want:
        flags = open(os.path.join(SQLITE, "flags.txt")).read().split() + [f"-I{SQLITE}"]
        ensure_grouped(w("sqlite3"), [os.path.join(SQLITE, "shell.c"), os.path.join(SQLITE, "sqlite3.c")],
                       flags, ["--name", "sqlite3"],
                       [(["bash", init_sh, w("sqlite3", "bin", "sqlite3"), db], None, True, rm_db),
                        ([db], query, False, rm_db)], th, a.regroup)
        loads.append(("SQLite3-query", [w("sqlite3", "original", "sqlite3"), db],
                      [w("sqlite3", "bin", "sqlite3"), db], query, rm_db, None))
    if "SQLite3-memory" in want:
        # SQLite3-query's statements 20 times over on an in-memory database:
        # the same code without the disk's syncs, and long enough that
        # start-up is a small part of it (SQLite3-query's own time is mostly
        # the disk's, and varies with whatever else uses it).
        mem_sql = w("steady-memory.sql")
        body = open(query).read()
        with open(mem_sql, "w") as f:
            for _ in range(20):
                f.write(body + "\nDROP TABLE records;\n")
        if "SQLite3-query" not in want:
            flags = open(os.path.join(SQLITE, "flags.txt")).read().split() + [f"-I{SQLITE}"]
            ensure_grouped(w("sqlite3"), [os.path.join(SQLITE, "shell.c"), os.path.join(SQLITE, "sqlite3.c")],
                           flags, ["--name", "sqlite3"],
                           [(["bash", init_sh, w("sqlite3", "bin", "sqlite3"), db], None, True, rm_db),
                            ([db], query, False, rm_db)], th, a.regroup)
        loads.append(("SQLite3-memory (SQLite3-query x20 on :memory:)",
                      [w("sqlite3", "original", "sqlite3"), ":memory:"],
                      [w("sqlite3", "bin", "sqlite3"), ":memory:"], mem_sql, None, None))
    if "demo2" in want:
        ensure_grouped(w("demo2"), [os.path.join(PROGS, "demo/demo2.c")], ["-O0"], [],
                       [(["1000"], None, False, None)], th, a.regroup)
        loads.append(("demo2", [w("demo2", "original", "demo2"), "100000"],
                      [w("demo2", "bin", "demo2"), "100000"], None, None, "300"))

    res = {}
    for label, o, s, stdin, setup, cg_arg in loads:
        if not outputs_match(o, s, stdin, setup):
            sys.exit(f"steady: {label}: the scattered program's output differs from the original's")
        r = {"exe_orig": o[0], "exe_scat": s[0]}
        if not a.no_callgrind:
            cg = lambda cmd: cmd[:1] + [cg_arg] if cg_arg else cmd
            log(f"{label}: callgrind, original")
            r["ir_orig"] = callgrind(cg(o), stdin, setup)
            log(f"{label}: callgrind, scattered")
            r["ir_scat"] = callgrind(cg(s), stdin, setup)
        log(f"{label}: {a.reps} interleaved timed runs each")
        to, ts = [], []
        for _ in range(a.reps):
            to.append(timed(o, stdin, setup))
            ts.append(timed(s, stdin, setup))
        r["ms_orig"], r["ms_scat"] = statistics.median(t[0] for t in to), statistics.median(t[0] for t in ts)
        r["cpu_orig"], r["cpu_scat"] = statistics.median(t[1] for t in to), statistics.median(t[1] for t in ts)
        r["ms_orig_all"], r["ms_scat_all"] = to, ts
        res[label] = r
    rm_db()

    L = [f"steady state, grouped at {th // 1024} KiB; {time.strftime('%Y-%m-%d %H:%M')}, "
         f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"]
    for label, r in res.items():
        L.append(f"\n{label}")
        if "ir_orig" in r:
            io, is_ = r["ir_orig"], r["ir_scat"]
            L.append(f"  {'instructions':<14}{'original':>16}{'scattered':>16}{'added':>16}")
            for c in CATS:
                L.append(f"  {c:<14}{io['cats'][c]:>16,}{is_['cats'][c]:>16,}{is_['cats'][c] - io['cats'][c]:>+16,}")
            L.append(f"  {'total':<14}{io['total']:>16,}{is_['total']:>16,}{is_['total'] - io['total']:>+16,}"
                     f"  ({100 * is_['total'] / io['total'] - 100:+.2f}%)")
            bo, bs = by_object(io["objs"], r["exe_orig"]), by_object(is_["objs"], r["exe_scat"])
            L.append(f"  {'by object':<14}")
            for k in bo:
                L.append(f"  {k:<14}{bo[k]:>16,}{bs[k]:>16,}{bs[k] - bo[k]:>+16,}")
        L.append(f"  wall time, median of {a.reps} interleaved: original {r['ms_orig']:,.1f} ms, "
                 f"scattered {r['ms_scat']:,.1f} ms ({100 * r['ms_scat'] / r['ms_orig'] - 100:+.1f}%)")
        L.append(f"  CPU time (user+sys), median of the same runs: original {r['cpu_orig']:,.1f} ms, "
                 f"scattered {r['cpu_scat']:,.1f} ms ({100 * r['cpu_scat'] / r['cpu_orig'] - 100:+.1f}%)")
    text = "\n".join(L)
    print(text)
    if a.out:
        md = ["# bunkai scatter: steady-state cost, original vs grouped\n",
              f"Generated by `python3 bench/scatter/steady.py{' ' if len(sys.argv) > 1 else ''}"
              f"{' '.join(sys.argv[1:])}` (see its docstring). Instructions: valgrind's "
              "callgrind, by the code that ran them; wall time: median of interleaved runs. "
              "Both programs in the same run.\n", "```text", text, "```", ""]
        write_atomic(a.out, "\n".join(md))
    if a.json:
        write_atomic(a.json, json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
