#!/usr/bin/env python3
"""bunkai share: correctness under repetition. Every run is checked; one
wrong output or crashed run is a failure, never averaged away. Across three
hosts (network namespaces, --place rr):

  - lbzip2 -n 3 and pigz -p 3, compressing a 20 MB file and decompressing
    it, RUNS times each, every output compared byte for byte with the native
    run's;
  - the litmus tests (tests/programs/share/litmus.c): SB, MP, LB, IRIW and
    2+2W over both layouts, three kinds of access and every pair of hosts,
    at least 100,000 iterations per test, no forbidden outcome;
  - the random memory stress (stress.c) over many seeds, the dlopen program
    (dlopen.c), regions first touched by two threads of a host at once
    (firsttouch.c) and Python threads after `import hashlib`, each compared
    with its native run.

Writes bench/results/share-stress.md and share-stress.json (every run: what,
exit status, same or not, wall time).

  bench/share/stress.py [--runs N] [--litmus N] [--quick]
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from harness import BUNKAI, ROOT, log, share, sh  # noqa: E402

PROGRAMS = ROOT / "tests/programs/share"


def build(work):
    out = {}
    for n in ["litmus", "stress", "dlopen", "firsttouch"]:
        exe = work / n
        sh("clang-14", "-O2", "-pthread", "-o", str(exe), str(PROGRAMS / f"{n}.c"), "-ldl")
        out[n] = str(exe)
    return out


def corpus(path, size=20 << 20):
    """Text-like data, the same every time (tests/e2e/share.rs's corpus)."""
    x = 0x9E3779B97F4A7C15
    parts, n = [], 0
    mask = (1 << 64) - 1
    while n < size:
        x ^= (x << 13) & mask
        x ^= x >> 7
        x ^= (x << 17) & mask
        w = f"word{x % 600} ".encode()
        parts.append(w)
        n += len(w)
        if x % 13 == 0:
            parts.append(b"\n")
            n += 1
    Path(path).write_bytes(b"".join(parts)[:size])


def native(argv, timeout=600):
    p = subprocess.run(harness.HOSTS.cmd(0, argv), capture_output=True, timeout=timeout)
    if p.returncode != 0:
        raise harness.Failed(f"{' '.join(map(str, argv))} natively: exit {p.returncode}: {p.stderr[-500:]!r}")
    return p.stdout


class Record:
    def __init__(self):
        self.runs = []

    def one(self, what, argv, expect, timeout=600):
        """A shared run of argv, checked against expect (bytes, or a function
        of the output returning an error or None)."""
        t0 = time.monotonic()
        try:
            p = subprocess.run(harness.HOSTS.cmd(0, share("rr", 2, argv)), capture_output=True, timeout=timeout)
            code, out, err = p.returncode, p.stdout, p.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            code, out, err = "timeout", e.stdout or b"", f"no end within {timeout} s"
        wall = time.monotonic() - t0
        summary = next((json.loads(l) for l in reversed(err.splitlines()) if l.startswith("{")), {})
        problem = None
        if code != 0:
            lines = [l for l in err.splitlines() if not l.startswith("{")]
            problem = f"exit {code}: {' | '.join(lines[-3:])}"
        elif callable(expect):
            problem = expect(out)
        elif out != expect:
            problem = f"output differs from the native run ({len(out)} against {len(expect)} bytes)"
        hosts = summary.get("hosts", [])
        self.runs.append({
            "what": what, "ok": problem is None, "problem": problem, "exit": code, "wall_s": round(wall, 3),
            "threads_on_nodes": sum(h.get("threads", 0) for h in hosts[1:]),
            "pages_moved": sum(h.get("pages_in", 0) for h in hosts),
            "retries": summary.get("retries", 0),
        })
        if problem:
            log(f"FAILED {what}: {problem}")
        return out

    def group(self, prefix):
        rs = [r for r in self.runs if r["what"].startswith(prefix)]
        return rs, sum(1 for r in rs if not r["ok"])


def litmus_check(iters):
    def check(out):
        lines = out.decode().splitlines()
        last = lines[-1].split() if lines else []
        if len(last) != 4 or last[0] != "forbidden":
            return f"no verdict: {out[-200:]!r}"
        if last[1] != "0" or last[3] != str(iters):
            return f"forbidden {last[1]} of {last[3]}"
        total = sum(int(l.rsplit(" ", 1)[1]) for l in lines if l.startswith("outcome "))
        return None if total == iters else f"outcomes add up to {total}, not {iters}"
    return check


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200, help="runs of each real program (default 200)")
    ap.add_argument("--litmus", type=int, default=20000, help="iterations per litmus configuration (default 20000: "
                    "6 configurations a test, 120,000 iterations)")
    ap.add_argument("--quick", action="store_true", help="10 runs, 2,000 iterations")
    ap.add_argument("--out", default=str(ROOT / "bench/results/share-stress.md"))
    args = ap.parse_args()
    if args.quick:
        args.runs, args.litmus = 10, 2000
    if os.geteuid() != 0:
        sys.exit("bench/share/stress.py: must run as root (network namespaces, userfaultfd)")
    if not BUNKAI.exists():
        sys.exit("bench/share/stress.py: build/bin/bunkai is missing (run make)")
    work = Path(f"/dev/shm/bk-shs-{os.getpid()}")
    work.mkdir(parents=True)
    args.commit = harness.commit()  # the tree the build under test came from, taken now
    args.bunkai = str(BUNKAI)
    rec = Record()
    t_start = time.monotonic()
    try:
        harness.start(work)
        exe = build(work)
        inp = work / "in.txt"
        corpus(inp)
        for prog, flag in [("lbzip2", "-n"), ("pigz", "-p")]:
            comp = native([prog, flag, "3", "-c", str(inp)])
            packed = work / f"in.{prog}"
            packed.write_bytes(comp)
            for k in range(args.runs):
                rec.one(f"{prog} {flag} 3 -c", [prog, flag, "3", "-c", str(inp)], comp)
                if k % 20 == 19:
                    log(f"{prog} compress: {k + 1} runs")
            plain = inp.read_bytes()
            for k in range(args.runs):
                rec.one(f"{prog} {flag} 3 -d -c", [prog, flag, "3", "-d", "-c", str(packed)], plain)
                if k % 20 == 19:
                    log(f"{prog} decompress: {k + 1} runs")
        n = 0
        for test in ["sb", "mp", "lb", "iriw", "2+2w"]:
            for layout in ["same", "split"]:
                for kind in ["plain", "atomic", "lock"]:
                    iters = args.litmus // 2 if test == "iriw" else args.litmus
                    reps = 2 if test == "iriw" else 1
                    for _ in range(reps):
                        rec.one(f"litmus {test} {layout} {kind}", [exe["litmus"], test, layout, kind, str(iters), str(n % 3)],
                                litmus_check(iters))
                        n += 1
            log(f"litmus {test}: done")
        for seed in range(1, max(args.runs // 4, 10) + 1):
            argv = [exe["stress"], "6", "100", str(seed * 7919)]
            rec.one("stress 6 100", argv, native(argv))
        dl = native([exe["dlopen"], "4"])
        for _ in range(max(args.runs // 4, 10)):
            rec.one("dlopen 4", [exe["dlopen"], "4"], dl)
        ft = [exe["firsttouch"], "6", "200"]
        ftn = native(ft)
        for _ in range(max(args.runs // 10, 10)):
            rec.one("firsttouch 6 200", ft, ftn)
        pyargv = ["/usr/bin/python3", str(PROGRAMS / "hash_threads.py"), "4"]
        py = native(pyargv)
        for _ in range(max(args.runs // 10, 5)):
            rec.one("python hashlib threads", pyargv, py)
    finally:
        if harness.HOSTS:
            harness.HOSTS.close()
        subprocess.run(["rm", "-rf", str(work)])
    took = time.monotonic() - t_start
    write(Path(args.out), rec, args, took)
    bad = sum(1 for r in rec.runs if not r["ok"])
    log(f"{len(rec.runs)} runs, {bad} failed, {took / 60:.1f} min")
    sys.exit(1 if bad else 0)


def write(path, rec, args, took):
    path.with_suffix(".json").write_text(json.dumps({"runs": rec.runs, "args": vars(args)}, indent=1) + "\n")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    out = [
        "# bunkai share: correctness under repetition",
        "",
        f"Generated by `bash bench/share/stress.sh` on {time.strftime('%Y-%m-%d')} in {took / 60:.0f} minutes, "
        f"at commit {args.commit} (build: {args.bunkai}); machine: {os.cpu_count()} CPUs ({cpu}), Linux {platform.release()}.",
        "",
        "Three hosts as network namespaces (home and two nodes, veth), `--place rr`; every run checked against the "
        "native run, byte for byte. A failed run is listed below, never averaged away. Every run is in "
        "share-stress.json.",
        "",
        "| what | runs | failed | wall median [s] | pages moved (median) | threads on nodes (median) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    whats = []
    for r in rec.runs:
        key = r["what"].split(" ")[0] if r["what"].startswith("litmus") else r["what"]
        if key not in whats:
            whats.append(key)
    import statistics
    for w in whats:
        rs, bad = rec.group(w)
        med = lambda k: statistics.median(r[k] for r in rs)
        out.append(f"| {w} | {len(rs)} | {bad} | {med('wall_s'):.2f} | {med('pages_moved'):,.0f} | {med('threads_on_nodes'):.0f} |")
    out += ["", "## Litmus tests", "",
            "Forbidden = what x86-TSO forbids (the program's own model natively): SB 0/0 with a fence, MP 1/0, LB 1/1, "
            "IRIW 1,0/1,0, 2+2W x=1 y=1. Each test over layouts (x and y on one page, on two), accesses (plain, seq_cst "
            "atomics, futex mutexes) and pairs of hosts.", "",
            "| test | configurations | iterations | forbidden outcomes | target |", "|---|---:|---:|---:|---|"]
    for t in ["sb", "mp", "lb", "iriw", "2+2w"]:
        rs, bad = rec.group(f"litmus {t} ")
        iters = sum((args.litmus // 2 if t == "iriw" else args.litmus) for _ in rs)
        verdict = "PASS" if bad == 0 and iters >= 100000 else ("MISS (fewer than 100,000 iterations)" if bad == 0 else "FAIL")
        out.append(f"| {t} | {len(rs)} | {iters:,} | {'0' if bad == 0 else f'{bad} runs had some'} | 0 in ≥ 100,000: **{verdict}** |")
    out += ["", "## Targets", ""]
    for prog in ["lbzip2 -n 3 -c", "lbzip2 -n 3 -d -c", "pigz -p 3 -c", "pigz -p 3 -d -c"]:
        rs, bad = rec.group(prog)
        ok = bad == 0 and len(rs) >= 200
        out.append(f"- {prog}: {len(rs)} runs, {bad} wrong or crashed (target: 0 in 200): "
                   f"**{'PASS' if ok else ('MISS (fewer than 200 runs)' if bad == 0 else 'FAIL')}**")
    fails = [r for r in rec.runs if not r["ok"]]
    out += ["", "## Failed runs", ""]
    out += [f"- {r['what']}: {r['problem']}" for r in fails] or ["None."]
    path.write_text("\n".join(out) + "\n")


if __name__ == "__main__":
    main()
