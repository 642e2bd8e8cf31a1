#!/usr/bin/env python3
"""bunkai trace: recording speed, trace size and report throughput.

For each workload (real Debian programs on generated inputs), measured in
one run on this machine:
  native   the program alone
  lackey   valgrind --tool=lackey --trace-mem=yes --log-file=FILE (the
           baseline the issue names: every instruction and access, as text)
  bunkai   bunkai trace record (every instruction and access, binary)
and `bunkai trace report` over the recorded trace.
Targets: recording no slower than lackey (aim: <= 20x native), <= 4 bytes
per instruction on disk with memory references, report >= 20M records/s.
Writes bench/results/trace.md.

    bench/trace/speed.py [--quick] [--out FILE] [--work DIR]
"""
import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNKAI = os.path.join(ROOT, "build", "bin", "bunkai")


def log(msg):
    print(f"bench-trace: {msg}", file=sys.stderr, flush=True)


def make_inputs(work, quick):
    """Deterministic inputs: text built from the system's licence texts,
    repeated to size, and an SQL script."""
    base = b""
    lic = "/usr/share/common-licenses"
    for n in sorted(os.listdir(lic)):
        p = os.path.join(lic, n)
        if os.path.isfile(p):
            base += open(p, "rb").read()
    size = (64 if quick else 256) * 1024
    text = (base * (size // len(base) + 1))[:size]
    tpath = os.path.join(work, "input.txt")
    open(tpath, "wb").write(text)
    rows = 500 if quick else 2000
    sql = ["create table t(id integer primary key, name text, v real);", "begin;"]
    sql += [f"insert into t(name, v) values('name{i:05d}', {i * 0.5});" for i in range(rows)]
    sql += ["commit;", "create index tv on t(v);",
            "select count(*), sum(v) from t where name like 'name1%';",
            "select name from t order by v desc limit 3;"]
    spath = os.path.join(work, "script.sql")
    open(spath, "w").write("\n".join(sql) + "\n")
    return tpath, spath


def children_cpu():
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return u.ru_utime + u.ru_stime


def timed(cmd, stdout=subprocess.DEVNULL, reps=1, prep=None, cpu=False):
    """Median wall time (and, with cpu=True, median CPU time: user + system
    of the command and everything it started, which other work on a shared
    machine does not inflate the way it inflates wall time)."""
    ts, cs = [], []
    for _ in range(reps):
        if prep:
            prep()
        c = children_cpu()
        t = time.perf_counter()
        r = subprocess.run(cmd, stdout=stdout, stderr=subprocess.PIPE)
        ts.append(time.perf_counter() - t)
        cs.append(children_cpu() - c)
        if r.returncode != 0:
            raise SystemExit(f"bench-trace: {' '.join(cmd)} failed: {r.stderr.decode()[-300:]}")
    if cpu:
        return statistics.median(ts), statistics.median(cs), r
    return statistics.median(ts), r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller inputs")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "trace.md"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench", "trace-speed"))
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    text, sql = make_inputs(args.work, args.quick)
    db = os.path.join(args.work, "t.db")
    def fresh_db():
        if os.path.exists(db):
            os.unlink(db)
    workloads = [
        ("gzip -6", ["gzip", "-6", "-c", text], None),
        ("xz -1", ["xz", "-1", "-c", text], None),
        ("sqlite3", ["sqlite3", db, f".read {sql}"], fresh_db),
    ]
    # Valgrind's fixed start-up (a trivial program under each tool).
    t_start, c_start, _ = timed([BUNKAI, "trace", "record", "-o", os.path.join(args.work, "true.bkt"), "--", "/bin/true"], reps=3, cpu=True)
    # Valgrind alone: the same run without instrumentation, superblocks cut
    # at every jump as the recorder cuts them.
    NONE = ["valgrind", "--tool=none", "-q", "--vex-guest-chase=no"]
    t_nstart, c_nstart, _ = timed(NONE + ["/bin/true"], reps=3, cpu=True)
    rows = []
    for name, cmd, prep in workloads:
        native, c_native, _ = timed(cmd, reps=3, prep=prep, cpu=True)
        t_none, c_none, _ = timed(NONE + cmd, reps=3, prep=prep, cpu=True)
        trace = os.path.join(args.work, "t.bkt")
        t_ours, c_ours, r = timed([BUNKAI, "trace", "record", "-o", trace, "--json", "--", *cmd], reps=3, prep=prep, cpu=True)
        rec = json.loads([l for l in r.stderr.decode().split("\n") if l.startswith("{")][-1])
        lk = os.path.join(args.work, "lackey.txt")
        t_lk, _ = timed(["valgrind", "--tool=lackey", "--trace-mem=yes", f"--log-file={lk}", *cmd], prep=prep)
        lk_bytes = os.path.getsize(lk)
        os.unlink(lk)
        t_rep, r = timed([BUNKAI, "trace", "report", trace, "--json"], stdout=subprocess.PIPE)
        rep = json.loads(r.stdout)
        records = rep.get("records", rec["instructions"] + rec["memory_references"])
        rows.append({
            "name": name, "native": native, "ours": t_ours, "lackey": t_lk,
            "instructions": rec["instructions"], "memrefs": rec["memory_references"],
            "bytes": rec["bytes"], "lackey_bytes": lk_bytes, "report": t_rep,
            "report_inner": rep.get("seconds"), "records": records, "startup": t_start,
            "c_native": c_native, "t_none": t_none, "c_none": c_none, "c_ours": c_ours,
        })
        log(f"{name}: native {native:.3f} s, bunkai {t_ours:.2f} s, lackey {t_lk:.2f} s, "
            f"{rec['bytes'] / rec['instructions']:.3f} B/instr, report {records / t_rep / 1e6:.1f} M rec/s")
        os.unlink(trace)

    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    out = ["# `bunkai trace`: recording speed, trace size, report throughput", ""]
    out.append(f"Measured by `bench/trace/speed.py{' --quick' if args.quick else ''}` on {cpu} ({os.cpu_count()} cores), "
               f"all columns in the same run; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end "
               "(wall times grow with it, CPU times much less). Baseline: `valgrind --tool=lackey --trace-mem=yes "
               "--log-file=F`, which records the same instructions and accesses as text.")
    out.append("")
    out.append("| workload | instructions | memory refs | native | lackey | bunkai | bunkai / lackey | bunkai / native | same, less start-up | target ≤ lackey |")
    out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        ok = "PASS" if r["ours"] <= r["lackey"] else "MISS"
        net = max(r["ours"] - r["startup"], 1e-9) / r["native"]
        out.append(f"| {r['name']} | {r['instructions']:,} | {r['memrefs']:,} | {r['native']:.3f} s | {r['lackey']:.2f} s | "
                   f"{r['ours']:.2f} s | {r['ours'] / r['lackey']:.3f}x | {r['ours'] / r['native']:.0f}x | {net:.0f}x | {ok} |")
    out.append("")
    out.append(f"Start-up: `bunkai trace record -- /bin/true` takes {rows[0]['startup']:.2f} s (Valgrind loading the tool and "
               "the program's debug information); the \"less start-up\" column subtracts it. The aim of ≤ 20x native holds "
               "for the instrumented code when that column is ≤ 20.")
    out.append("")
    out.append("Where the time goes: Valgrind alone (`valgrind --tool=none --vex-guest-chase=no`, no instrumentation, "
               "superblocks cut at every jump as the recorder cuts them) runs the same command in the same run. CPU is user + "
               "system time of all the processes of one run (Valgrind and the recorder), the median of 3 like the wall times "
               "here; unlike wall time, other work on the machine does not inflate it.")
    out.append("")
    out.append("| workload | native: wall, CPU | Valgrind alone: wall, CPU | bunkai: wall, CPU | bunkai CPU beyond Valgrind's own | Valgrind alone / native, less start-up | bunkai / native, less start-up |")
    out.append("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        none_net = max(r["t_none"] - t_nstart, 1e-9) / r["native"]
        net = max(r["ours"] - r["startup"], 1e-9) / r["native"]
        out.append(f"| {r['name']} | {r['native']:.3f} s, {r['c_native']:.2f} s | {r['t_none']:.2f} s, {r['c_none']:.2f} s | "
                   f"{r['ours']:.2f} s, {r['c_ours']:.2f} s | {r['c_ours'] - r['c_none']:+.2f} s | {none_net:.0f}x | {net:.0f}x |")
    out.append("")
    out.append(f"Start-up (`/bin/true`): Valgrind alone {t_nstart:.2f} s wall, {c_nstart:.2f} s CPU; bunkai {t_start:.2f} s wall, "
               f"{c_start:.2f} s CPU.")
    out.append("")
    out.append("| workload | bunkai bytes | bytes / instruction | lackey bytes | target ≤ 4 B/instr |")
    out.append("|---|---:|---:|---:|---|")
    for r in rows:
        per = r["bytes"] / r["instructions"]
        out.append(f"| {r['name']} | {r['bytes']:,} | {per:.3f} | {r['lackey_bytes']:,} | {'PASS' if per <= 4 else 'MISS'} |")
    out.append("")
    out.append("| workload | records (instructions + refs) | `report` wall time | records/s | target ≥ 20M/s |")
    out.append("|---|---:|---:|---:|---|")
    for r in rows:
        rate = r["records"] / r["report"]
        out.append(f"| {r['name']} | {r['records']:,} | {r['report']:.3f} s | {rate / 1e6:.1f} M | {'PASS' if rate >= 20e6 else 'MISS'} |")
    out.append("")
    out.append("Native, Valgrind-alone and bunkai times are medians of 3 runs; lackey's and `report`'s are single runs. The recorder compresses on "
               "a second core while Valgrind runs; `report` wall time includes process start and reading the file.")
    md = "\n".join(out) + "\n"
    tmp = args.out + ".tmp"
    open(tmp, "w").write(md)
    os.replace(tmp, args.out)
    print(md)


if __name__ == "__main__":
    main()
