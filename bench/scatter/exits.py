#!/usr/bin/env python3
"""bunkai scatter run under repetition: a short program started over HTTP again and
again, each run with an empty cache, so that it exits while the preload
thread is still bringing groups. Every run must end with the program's own
status and output; one that does not is a failure, listed, never averaged
away. The native program runs the same number of times in the same run, as
the baseline (its status, its output, its time).

The program: Debian's SQLite shell (build/third_party/sqlite, from `apt-get
source sqlite3`), scattered, profiled with `select 1;`, grouped at 8 KiB
(about 390 groups: the preloader is busy for the whole run), served by
`bunkai scatter serve` on loopback. Each run: `echo 'select 1;' | bunkai scatter run URL
--cache EMPTY -- :memory:`.

    exits.py [--runs 500] [--out bench/results/scatter-exits.md]
"""
import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import write_atomic

ROOT = Path(__file__).resolve().parents[2]
BUNKAI = Path(os.environ.get("BUNKAI", ROOT / "build/bin/bunkai"))
SQ = ROOT / "build/third_party/sqlite"


def log(msg):
    print(f"bench-scatter-exits: {msg}", file=sys.stderr, flush=True)


def sh(*argv, **kw):
    p = subprocess.run([str(a) for a in argv], capture_output=True, timeout=kw.pop("timeout", 1800), **kw)
    if p.returncode != 0:
        raise SystemExit(f"bench-scatter-exits: {' '.join(map(str, argv))} failed: {p.stderr.decode(errors='replace')[-2000:]}")
    return p


def commit():
    p = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return p.stdout.strip() or "?"


def one(argv, stdin):
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, timeout=120)
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        code, out, err = "timeout", e.stdout or b"", b"no end within 120 s"
    return code, out, err, time.monotonic() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--out", default=str(ROOT / "bench/results/scatter-exits.md"))
    args = ap.parse_args()
    at_commit = commit()
    if not (SQ / "sqlite3.c").exists():
        raise SystemExit("bench-scatter-exits: no SQLite sources (run scripts/fetch-sqlite.sh build/third_party/sqlite)")
    work = Path(tempfile.mkdtemp(prefix="bunkai-exits-"))
    srv = None
    t_start = time.monotonic()
    try:
        out = work / "out"
        flags = (SQ / "flags.txt").read_text().split()
        log("scattering the SQLite shell")
        sh(BUNKAI, "scatter", "-o", out, "--name", "sqlite3", SQ / "shell.c", SQ / "sqlite3.c", "--", *flags, f"-I{SQ}")
        sh(BUNKAI, "scatter", "profile", out, "--", ":memory:", input=b"select 1;\n")
        sh(BUNKAI, "scatter", "group", out, "--threshold", "8KiB")
        ngroups = len(list((out / "lib/sqlite3").glob("g*.so")))
        srv = subprocess.Popen([str(BUNKAI), "scatter", "serve", str(out), "--listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        url = None
        deadline = time.monotonic() + 30
        while url is None and time.monotonic() < deadline:
            line = srv.stdout.readline()
            if not line:
                break
            m = re.search(r"http://\S+", line)
            url = m.group(0) if m else None
        if not url:
            raise SystemExit("bench-scatter-exits: bunkai scatter serve printed no URL")
        native = str(out / "original/sqlite3")
        runs, nat = [], []
        for k in range(args.runs):
            cache = work / "cache"
            shutil.rmtree(cache, ignore_errors=True)
            code, o, e, t = one([str(BUNKAI), "scatter", "run", url, "--cache", str(cache), "--", ":memory:"], b"select 1;\n")
            ok = code == 0 and o == b"1\n"
            runs.append({"run": k + 1, "exit": code, "ok": ok, "wall_s": round(t, 4),
                         "stderr": "" if ok else e.decode(errors="replace")[-500:]})
            code, o, e, t = one([native, ":memory:"], b"select 1;\n")
            nat.append({"run": k + 1, "exit": code, "ok": code == 0 and o == b"1\n", "wall_s": round(t, 4)})
            if k % 50 == 49:
                log(f"{k + 1} runs, {sum(not r['ok'] for r in runs)} failed")
    finally:
        if srv:
            srv.kill()
            srv.wait()
        shutil.rmtree(work, ignore_errors=True)
    took = time.monotonic() - t_start
    bad = [r for r in runs if not r["ok"]]
    nbad = [r for r in nat if not r["ok"]]
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    med = lambda rs: statistics.median(r["wall_s"] for r in rs) * 1000
    verdict = "PASS" if not bad else "MISS"
    lines = [
        "# bunkai scatter run: a short program over HTTP, every exit checked",
        "",
        f"Generated by `python3 bench/scatter/exits.py --runs {args.runs}` on {time.strftime('%Y-%m-%d')} in "
        f"{took / 60:.0f} minutes, at commit {at_commit}; machine: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}.",
        "",
        f"Debian's SQLite shell scattered, grouped at 8 KiB ({ngroups} groups), served by `bunkai scatter serve` on loopback; "
        "each run `echo 'select 1;' | bunkai scatter run URL --cache EMPTY -- :memory:` (preload and compression on), so the "
        "program exits while the preload thread is still bringing groups. The native shell runs as often, in the same "
        "run, interleaved.",
        "",
        "| | runs | wrong exit or output | median wall [ms] |",
        "|---|---:|---:|---:|",
        f"| `bunkai scatter run` | {len(runs)} | {len(bad)} | {med(runs):.1f} |",
        f"| native (baseline) | {len(nat)} | {len(nbad)} | {med(nat):.1f} |",
        "",
        f"Target: 0 crashes in 500 runs: **{verdict}**" + ("" if len(runs) >= 500 else f" (only {len(runs)} runs)"),
        "",
    ]
    if bad:
        lines += ["## Failed runs", "", "| run | exit | stderr |", "|---:|---|---|"]
        lines += [f"| {r['run']} | {r['exit']} | {r['stderr'].strip().replace('|', '/')[:200]} |" for r in bad]
        lines.append("")
    write_atomic(args.out, "\n".join(lines))
    write_atomic(str(Path(args.out).with_suffix(".json")),
                 json.dumps({"runs": runs, "native": nat, "groups": ngroups}, indent=1) + "\n")
    log(f"{len(runs)} runs, {len(bad)} failed; native {len(nbad)} failed -> {args.out}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
