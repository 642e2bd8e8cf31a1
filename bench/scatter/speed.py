#!/usr/bin/env python3
"""How long `bunkai scatter` takes (issue 23), beside a plain build of the
same sources measured in the same run, so that the ratio means something on
a loaded machine.

    speed.py [--work DIR] [--out bench/results/scatter-speed.md] [--reps N]
             [--programs sqlite3,vim] [--before BUNKAI] [--json FILE]

Programs: SQLite's shell and library (shell.c + the amalgamation, Debian's
flags, `make fetch-sqlite`), scattered as tests/e2e/scatter.rs and
bench/scatter/tables.py do; Vim (whole-program bitcode, when
scripts/fetch-vim.sh has built it). For each, in this order, REPS times:
  - the baseline: `clang-14 FLAGS -o P INPUTS`, one process that compiles
    and links (what a user runs to build the program; scatter builds its
    `original/` the same way);
  - `bunkai scatter --json -o OUT INPUTS -- FLAGS` with this tree's
    build/bin/bunkai: the wall time, and its phases (the `phases` list of
    --json, the same figures `-v` prints);
  - with --before BUNKAI, the same scatter by another bunkai (an earlier
    build copied with its lib/bunkai beside it), for a before/after in the
    same run.
Each figure is the median of REPS; the load average is printed with it."""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

from common import write_results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNKAI = os.path.join(ROOT, "build/bin/bunkai")
SQLITE = os.path.join(ROOT, "build/third_party/sqlite")
VIM = os.path.join(ROOT, "build/third_party/vim")
# Issue 23's targets: seconds for one scatter on this project's 2-core machines.
TARGETS = {"sqlite3": 30.0, "vim": 90.0}
LABEL = {"sqlite3": "SQLite (shell + library)", "vim": "Vim"}


def log(msg):
    print(f"speed: {msg}", file=sys.stderr, flush=True)


def programs(names):
    """(key, inputs, flags, scatter's extra arguments) of each program that is here."""
    out = []
    for n in names:
        if n == "sqlite3":
            if not os.path.exists(os.path.join(SQLITE, "sqlite3.c")):
                sys.exit("speed: no SQLite sources (run `make fetch-sqlite`)")
            flags = open(os.path.join(SQLITE, "flags.txt")).read().split() + [f"-I{SQLITE}"]
            out.append(("sqlite3", [os.path.join(SQLITE, "shell.c"), os.path.join(SQLITE, "sqlite3.c")],
                        flags, ["--name", "sqlite3"]))
        elif n == "vim":
            bc = os.path.join(VIM, "vim.bc")
            if not os.path.exists(bc):
                log(f"Vim skipped: {bc} is not there (bash scripts/fetch-vim.sh builds it)")
                continue
            flags = ["-O2"] + open(os.path.join(VIM, "linkflags.txt")).read().split()
            out.append(("vim", [bc], flags, ["--name", "vim"]))
        else:
            sys.exit(f"speed: unknown program {n} (sqlite3, vim)")
    return out


def timed(cmd, capture=False):
    """Wall seconds, CPU seconds (user + system of the command and its
    children: what the machine's load does not change) and stdout."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.PIPE if capture else subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL if capture else None, text=True)
    dt = time.perf_counter() - t
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"speed: command failed ({r.returncode}): {' '.join(cmd)}")
    return dt, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), (r.stdout if capture else "")


def commit():
    r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + (" (with uncommitted changes)" if dirty else "")


def measure(a, key, inputs, flags, extra):
    w = os.path.join(a.work, key)
    os.makedirs(w, exist_ok=True)
    base, ours, before, phases, nfun = [], [], [], [], 0
    cpu = {"baseline": [], "scatter": [], "before": []}
    for rep in range(a.reps):
        dt, c, _ = timed(["clang-14", *flags, "-Wno-unused-command-line-argument",
                          "-o", os.path.join(w, "plain"), *inputs])
        base.append(dt)
        cpu["baseline"].append(c)
        log(f"{key} {rep + 1}/{a.reps}: clang-14 build {dt:.1f} s, CPU {c:.1f} s")
        out = os.path.join(w, "out")
        dt, c, js = timed([BUNKAI, "scatter", "--json", "-o", out, *extra, *inputs, "--", *flags], capture=True)
        j = json.loads(js)
        ours.append(dt)
        cpu["scatter"].append(c)
        phases.append(j.get("phases", []))
        nfun = j["functions"]
        log(f"{key} {rep + 1}/{a.reps}: bunkai scatter {dt:.1f} s, CPU {c:.1f} s ({nfun} functions)")
        if a.before:
            dt, c, _ = timed([a.before, "scatter", "--json", "-o", os.path.join(w, "out-before"), *extra,
                              *inputs, "--", *flags], capture=True)
            before.append(dt)
            cpu["before"].append(c)
            log(f"{key} {rep + 1}/{a.reps}: earlier bunkai scatter {dt:.1f} s, CPU {c:.1f} s")
    # Phases: the median of each over the repetitions, in the order they ran.
    names = [p["name"] for p in phases[0]]
    med = [(n, statistics.median(next((p["seconds"] for p in ps if p["name"] == n), 0.0) for ps in phases))
           for n in names]
    return {"program": key, "functions": nfun, "baseline_s": statistics.median(base),
            "scatter_s": statistics.median(ours), "before_s": statistics.median(before) if before else None,
            "cpu": {k: statistics.median(v) if v else None for k, v in cpu.items()},
            "runs": {"baseline": base, "scatter": ours, "before": before, "cpu": cpu}, "phases": med,
            "flags": flags, "inputs": inputs}


def render(a, res, load0, load1):
    L = ["# bunkai scatter: how long a scatter takes (issue 23)\n",
         f"Generated by `python3 bench/scatter/speed.py{' --before BUNKAI' if a.before else ''}"
         f"{f' --reps {a.reps}' if a.reps != 1 else ''}` on {time.strftime('%Y-%m-%d')} at commit {commit()}; "
         f"machine: {os.cpu_count()} CPUs, shared with other jobs; load average {load0:.1f} at the start, "
         f"{load1:.1f} at the end. Each figure is the median of {a.reps} run(s), the commands "
         "taking turns. The baseline is one `clang-14 FLAGS -o P INPUTS` (compile and link, what "
         "scatter's `original/` was built with), of the same sources with the same flags."
         + (f" The earlier build: a copy of build/ made before this change, `{a.before_version}`."
            if a.before else "") + "\n",
         "Wall time is what a user waits; CPU time (user and system, of the command and every "
         "process it started) is the work done, which the other jobs on the machine do not change.\n",
         "| program | functions | | clang-14 build [s] | bunkai scatter [s] | ratio |"
         + (" earlier build's scatter [s] | ratio |" if a.before else ""),
         "|---|---:|---|---:|---:|---:|" + ("---:|---:|" if a.before else "")]
    for r in res:
        for what, b, o, e in (("wall", r["baseline_s"], r["scatter_s"], r["before_s"]),
                              ("CPU", r["cpu"]["baseline"], r["cpu"]["scatter"], r["cpu"]["before"])):
            row = (f"| {LABEL[r['program']]} | {r['functions']:,} | {what} | {b:.1f} | {o:.1f} "
                   f"| {o / b:.2f}x |")
            if a.before:
                row += f" {e:.1f} | {e / b:.2f}x |"
            L.append(row)
    for r in res:
        if not r["phases"]:
            continue
        L += ["", f"## {LABEL[r['program']]}: where the time goes\n",
              "The phases of `bunkai scatter`, as its `--json` gives them (`-v` prints the same), in "
              "the order they ended, wall time. A phase named \"beside\" another ran at the same time "
              "as that one; the two \"workers' sum\" lines split the libraries' phase into code "
              "generation and linking, summed over the workers (so up to that many times its wall "
              "time).\n",
              "| phase | seconds |", "|---|---:|"]
        for n, sec in r["phases"]:
            L.append(f"| {n} | {sec:.2f} |")
    L += ["", "## Targets\n"]
    for r in res:
        t = TARGETS[r["program"]]
        ok = r["scatter_s"] <= t
        L.append(f"- {LABEL[r['program']]}, {r['functions']:,} functions, scattered in "
                 f"{r['scatter_s']:.1f} s (target ≤ {t:.0f} s; the clang-14 build "
                 f"{r['baseline_s']:.1f} s in the same run): **{'PASS' if ok else 'MISS'}**")
    for k in TARGETS:
        if k not in [r["program"] for r in res]:
            L.append(f"- {LABEL[k]} (target ≤ {TARGETS[k]:.0f} s): not measured in this run "
                     "(its sources were not built here)")
    return "\n".join(L) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default=os.path.join(ROOT, "build/bench/scatter-speed"))
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/scatter-speed.md"))
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--programs", default="sqlite3,vim")
    ap.add_argument("--before", help="another bunkai binary (with its lib/bunkai beside it) to time too")
    ap.add_argument("--json", help="also write the raw figures here")
    a = ap.parse_args()
    if not shutil.which("clang-14"):
        sys.exit("speed: clang-14 not found (run scripts/install-deps.sh)")
    a.before_version = ""
    if a.before:
        a.before_version = subprocess.run([a.before, "--version"], capture_output=True, text=True).stdout.strip()
    load0 = os.getloadavg()[0]
    res = [measure(a, *p) for p in programs(a.programs.split(","))]
    text = render(a, res, load0, os.getloadavg()[0])
    write_results(a.out, text, a.json, res)


if __name__ == "__main__":
    main()
