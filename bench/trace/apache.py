#!/usr/bin/env python3
"""The TURU case study (seed 001, §3-4) on Debian's Apache httpd.

Apache runs in single-process mode (-X), listening on loopback only, under
`bunkai trace record --start-syscall accept --stop-at-close`: the window
opens when accept() returns and closes at the close() of that connection,
as the paper's trace ran "from waiting for the TCP connection to its
disconnection". Two requests, as in the paper: the HTML page of Fig. 2 and
the CGI program of Fig. 3. The same requests are timed on a native Apache
(no Valgrind) for the cycle counts of §4. Writes bench/results/trace-apache.md
with the paper's Tables 1-6 beside ours, and the memory-access pictures.

    bench/trace/apache.py [--out FILE] [--work DIR] [--requests N]
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNKAI = os.path.join(ROOT, "build", "bin", "bunkai")
APACHE = "/usr/sbin/apache2"
MODULES = "/usr/lib/apache2/modules"

# Fig. 2 and Fig. 3 of the paper, verbatim: the same files the
# full-system guest serves (trace/guest).
HTML = open(os.path.join(ROOT, "trace", "guest", "index.html")).read()
CGI_C = open(os.path.join(ROOT, "trace", "guest", "hello.c")).read()

# The paper's figures (Pentium 100 MHz, Linux 2.0.34, apache 1.3.12).
PAPER = {
    "html": {
        "instructions": {"httpd": 90655, "libs": 117204, "kernel": 95720},
        "pct": {"httpd": 29.9, "libs": 38.6, "kernel": 31.5},
        "pages": {"httpd": (48, 150), "libs": (37, 268), "kernel": (45, 466)},
        "refs": {
            "httpd": ((13, 15825, 1888), (1, 5575, 106)),
            "libs": ((14, 35305, 3167), (1, 33389, 352)),
            "kernel": ((31, 16952, 2127), (1, 5175, 60)),
        },
        "cycles": 817599, "ms": 8.18, "syscalls": 48, "switches": 0,
        "tlb_pct": "1.1-1.6", "total_pct": "2.4-2.9", "rps": (122, 126),
    },
    "cgi": {
        "instructions": {"httpd": 68023, "cgi": 15885, "libs": 991342, "kernel": 620139},
        "pct": {"httpd": 4.0, "cgi": 0.9, "libs": 58.5, "kernel": 36.6},
        "pages": {"httpd": (47, 330), "cgi": (16, 1629), "libs": (65, 2911), "kernel": (71, 2478)},
        "refs": {
            "httpd": ((10, 13142, 1447), (1, 4450, 71)),
            "cgi": ((20, 7615, 1134), (1, 6801, 24)),
            "libs": ((2, 795477, 15251), (1, 250317, 145)),
            "kernel": ((5, 99877, 8734), (1, 17128, 63)),
        },
        "cycles": 2810292, "ms": 28.1, "syscalls": 127, "switches": 10,
        "tlb_pct": "2.4-3.4", "total_pct": "3.5-4.6", "rps": (35, 37),
    },
}
REQUEST = {"html": "/index.html", "cgi": "/cgi-bin/hello.cgi"}
EXPECT = {"html": "<CENTER>AA</CENTER>", "cgi": "Hello World."}


def log(msg):
    print(f"bench-trace: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """True once something listens on 127.0.0.1:port (read from
    /proc/net/tcp, so that the check itself is not a connection that the
    traced accept() would see)."""
    want = f"0100007F:{port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            p = line.split()
            if p[1] == want and p[3] == "0A":
                return True
    return False


def wait_listening(port, proc, deadline_s):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if listening(port):
            return
        if proc.poll() is not None:
            raise SystemExit(f"bench-trace: apache exited early (status {proc.returncode}); see its error log")
        time.sleep(0.05)
    raise SystemExit(f"bench-trace: apache did not listen on port {port} within {deadline_s} s")


def get(port, path):
    """One HTTP/1.0 request on a fresh connection; returns the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n".encode())
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    head, _, body = data.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit(f"bench-trace: GET {path} answered {head[:40]!r}")
    return body.decode(errors="replace")


def setup(work, port):
    for d in ("htdocs", "cgi-bin", "run"):
        os.makedirs(os.path.join(work, d), exist_ok=True)
    with open(os.path.join(work, "htdocs", "index.html"), "w") as f:
        f.write(HTML)
    src = os.path.join(work, "hello.c")
    with open(src, "w") as f:
        f.write(CGI_C)
    subprocess.run(["gcc", "-O2", "-o", os.path.join(work, "cgi-bin", "hello.cgi"), src], check=True)
    conf = os.path.join(work, "httpd.conf")
    mods = ["mpm_prefork", "authz_core", "mime", "dir", "alias", "cgi"]
    lines = [f"ServerRoot {work}", "ServerName localhost", f"Listen 127.0.0.1:{port}"]
    lines += [f"LoadModule {m}_module {MODULES}/mod_{m}.so" for m in mods]
    lines += [
        "User nobody", "Group nogroup",
        f"PidFile {work}/run/httpd.pid", f"DefaultRuntimeDir {work}/run",
        f"Mutex file:{work}/run default", f"ErrorLog {work}/run/error.log", "LogLevel warn",
        "TypesConfig /dev/null", "AddType text/html .html",
        f"DocumentRoot {work}/htdocs", f"ScriptAlias /cgi-bin/ {work}/cgi-bin/",
        "<Directory />", "  Require all granted", "</Directory>",
    ]
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    # Apache drops to nobody: its files must be readable by it.
    for dirpath, dirs, files in os.walk(work):
        os.chmod(dirpath, 0o755)
        for n in files:
            os.chmod(os.path.join(dirpath, n), 0o755)
    return conf


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def native_latency(conf, port, case, n):
    """Mean wall time of one request on a native Apache (-X), after warm-up."""
    p = subprocess.Popen([APACHE, "-X", "-f", conf], stdin=subprocess.DEVNULL)
    try:
        wait_listening(port, p, 30)
        for _ in range(5):
            get(port, REQUEST[case])
        times = []
        for _ in range(n):
            t = time.perf_counter()
            body = get(port, REQUEST[case])
            times.append(time.perf_counter() - t)
            assert EXPECT[case] in body
        return statistics.median(times)
    finally:
        stop(p)


def record(conf, port, case, out):
    """Traces one request, from accept() to the close of its connection."""
    cmd = [BUNKAI, "trace", "record", "-o", out, "--json", "--start-syscall", "accept",
           "--stop-at-close", "--", APACHE, "-X", "-f", conf]
    # The recorder's stderr goes to a file: a pipe would block us if a
    # traced process outlived the recorder while holding it.
    errpath = out + ".log"
    with open(errpath, "w") as errf:
        p = subprocess.Popen(cmd, stderr=errf, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        wait_listening(port, p, 120)
        body = get(port, REQUEST[case])
        if EXPECT[case] not in body:
            raise SystemExit(f"bench-trace: {case}: unexpected answer under the tracer: {body[:80]!r}")
    finally:
        stop(p)  # the recorder passes SIGTERM to Apache and writes the trace
    err = open(errpath).read().split("\n")
    lines = [l for l in err if l.startswith("{")]
    if not lines:
        raise SystemExit(f"bench-trace: {case}: the recorder failed: {' | '.join(err[-8:])}")
    summary = json.loads(lines[-1])
    if not os.path.exists(out):
        raise SystemExit(f"bench-trace: {case}: no trace written")
    return summary


def report(trace, cpu, seconds):
    cmd = [BUNKAI, "trace", "report", trace, "--json", "--cpu", cpu]
    if seconds is not None:
        cmd += ["--seconds", f"{seconds:.9f}"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def table_rows(rep, case):
    """Our components in the paper's columns: httpd (apache2, over all its
    processes), the CGI program, the shared libraries (pages distinct over
    all libraries, as the paper counts them), the kernel (no instructions
    visible: None)."""
    by_name = {c["name"]: c for c in rep["components"]}
    picks = {"httpd": by_name.get("apache2"), "libs": rep["shared_libraries_total"], "kernel": None}
    if case == "cgi":
        picks["cgi"] = by_name.get("hello.cgi")
    rows = {}
    for k, c in picks.items():
        if c is None or c.get("instructions") is None:
            rows[k] = None if k == "kernel" else {"instructions": 0, "pct": 0.0, "code": 0, "data": 0,
                                                  "code_refs": (None,) * 3, "data_refs": (None,) * 3}
            continue
        def stat(key):
            s = c.get(key)
            return (s["min"], s["max"], s["mean"]) if s else (None, None, None)
        rows[k] = {"instructions": c["instructions"], "pct": c.get("percent") or 0.0,
                   "code": c["code_pages"] or 0, "data": c["data_pages"] or 0,
                   "code_refs": stat("code_refs"), "data_refs": stat("data_refs")}
    libs = [(c["name"], c["instructions"]) for c in rep["components"] if c["kind"] == "library"]
    rows["libs"]["libs"] = sorted(libs, key=lambda x: -(x[1] or 0))
    return rows


def markdown(results, args):
    title = {"html": "the HTML file of Fig. 2", "cgi": "the CGI program of Fig. 3"}
    num = {"html": (1, 2, 3), "cgi": (4, 5, 6)}
    out = ["# `bunkai trace`: TURU's Apache case study (seed 001, §3-4)", ""]
    out.append(f"Measured by `bench/trace/apache.py` on {results['cpu_model']}; {results['apache']} from Debian,")
    out.append("single process (`-X`), loopback only, traced from the return of accept() to the close() of")
    out.append("that connection (`--start-syscall accept --stop-at-close`). Paper: Pentium 100 MHz, Linux 2.0.34,")
    out.append("apache 1.3.12, traced inside the kernel. **The kernel column differs in kind**: Valgrind sees no")
    out.append("kernel instructions, so ours reports the syscalls made in the window and their time")
    out.append("(measured under Valgrind); see docs/trace.md for the gap and how a QEMU TCG plugin would close it.")
    out.append("")
    out.append("What the tables show:")
    out.append("")
    out.append("- The traced request is the first after start-up, as a window from the first accept() must be. ld.so is")
    out.append("  the largest library in it: lazy binding resolves each PLT entry on its first call (for the CGI, also")
    out.append("  the whole start-up of the exec'd program). TURU's §4 advice, fewer library functions and pages,")
    out.append("  applies to it directly: `LD_BIND_NOW` or prelinking would move that work out of the request.")
    out.append("- The CGI program itself runs 62 instructions: `main` and `puts` are in libc, start-up is in ld.so and libc.")
    out.append("- Address-space switches are the context switches of the traced processes, measured under Valgrind,")
    out.append("  which runs 20-30x slower and so switches far more than a native run. They inflate the switch share of")
    out.append("  the Pentium-preset estimate (the paper counted 10 CR3 loads for the CGI request).")
    out.append("")
    for case in ("html", "cgi"):
        r = results[case]
        rows = r["rows"]
        p = PAPER[case]
        cols = ["httpd", "cgi", "libs", "kernel"] if case == "cgi" else ["httpd", "libs", "kernel"]
        names = {"httpd": "httpd (apache2)", "cgi": "CGI (hello.cgi)", "libs": "shared libraries", "kernel": "kernel"}
        t1, t2, t3 = num[case]
        out.append(f"## Serving {title[case]}")
        out.append("")
        rep = r["report"]
        out.append(f"Recording: {rep['total_instructions']:,} instructions, {rep['memory_references']:,} memory "
                   f"references, {len(rep['streams'])} stream(s) (process images), {r['record']['bytes']:,} bytes on disk "
                   f"({r['record']['bytes'] / max(1, rep['total_instructions']):.2f} B/instruction). Native request: "
                   f"{r['native_ms']:.3f} ms (median of {args.requests}).")
        out.append("")
        out.append(f"### Table {t1}: dynamic instructions per component")
        out.append("")
        out.append("| component | paper | ours |")
        out.append("|---|---:|---:|")
        for k in cols:
            ours = "n/a (not visible to Valgrind)" if rows[k] is None else f"{rows[k]['instructions']:,} ({rows[k]['pct']:.1f}%)"
            out.append(f"| {names[k]} | {p['instructions'][k]:,} ({p['pct'][k]}%) | {ours} |")
        libs = rows["libs"]["libs"]
        out.append("")
        out.append("Shared libraries, ours: " + ", ".join(f"{name} {i:,}" for name, i in libs if i) + ".")
        k = r["report"]
        kern = next((c for c in k["components"] if c["kind"] == "kernel"), {})
        out.append(f"Kernel, ours: {k['syscalls']} syscalls, {kern.get('syscall_seconds', 0) * 1e3:.2f} ms inside them "
                   f"under Valgrind (paper: {p['syscalls']} syscalls).")
        out.append("")
        out.append(f"### Table {t2}: pages used (4 KiB)")
        out.append("")
        out.append("| component | instructions: paper | ours | data: paper | ours |")
        out.append("|---|---:|---:|---:|---:|")
        for k2 in cols:
            pc, pd = p["pages"][k2]
            if rows[k2] is None:
                out.append(f"| {names[k2]} | {pc} | n/a | {pd} | n/a |")
            else:
                out.append(f"| {names[k2]} | {pc} | {rows[k2]['code']:,} | {pd} | {rows[k2]['data']:,} |")
        out.append("")
        out.append(f"### Table {t3}: references per page (min / max / mean)")
        out.append("")
        out.append("| component | | paper | ours |")
        out.append("|---|---|---:|---:|")
        for k2 in cols:
            for i, kind in enumerate(("instructions", "data")):
                pv = p["refs"][k2][i]
                if rows[k2] is None:
                    ov = "n/a"
                else:
                    s = rows[k2]["code_refs" if i == 0 else "data_refs"]
                    ov = "n/a" if s[0] is None else f"{s[0]:,} / {s[1]:,} / {s[2]:,.0f}"
                out.append(f"| {names[k2] if i == 0 else ''} | {kind} | {pv[0]:,} / {pv[1]:,} / {pv[2]:,} | {ov} |")
        out.append("")
        out.append("### §4: the overhead estimate")
        out.append("")
        out.append("| | paper (Pentium 100 MHz) | ours, Pentium preset | ours, modern preset |")
        out.append("|---|---:|---:|---:|")
        ep, em = r["report"]["estimate"], r["report_modern"]["estimate"]
        def rps(e):
            after = e.get("requests_per_second_after_max")
            return f"{e['requests_per_second_before']:,.0f} → {'n/a' if after is None else f'{after:,.0f}'}"
        out.append(f"| cycles per request | {p['cycles']:,} ({p['ms']} ms) | {ep['cycles']:,.0f} | {em['cycles']:,.0f} ({r['native_ms']:.3f} ms measured) |")
        out.append(f"| TLB entries (pages touched, user mode for ours) | {sum(v[0] + v[1] for v in p['pages'].values()):,} | {ep['pages']:,} | {em['pages']:,} |")
        out.append(f"| TLB-miss share | {p['tlb_pct']}% | {ep['tlb_percent_min']:.1f}-{ep['tlb_percent_max']:.1f}% | {em['tlb_percent_min']:.2f}-{em['tlb_percent_max']:.2f}% |")
        out.append(f"| syscalls + address-space switches | {p['syscalls']} + {p['switches']} | {ep['syscalls']} + {ep['address_space_switches']} | {em['syscalls']} + {em['address_space_switches']} |")
        out.append(f"| TLB + switch share | {p['total_pct']}% | {ep['overhead_percent_min']:.1f}-{ep['overhead_percent_max']:.1f}% | {em['overhead_percent_min']:.2f}-{em['overhead_percent_max']:.2f}% |")
        out.append(f"| requests/s, before → after | {p['rps'][0]} → {p['rps'][1]} | {rps(ep)} | {rps(em)} |")
        out.append("")
        out.append(f"Pentium preset: {ep['cycles_source']}. Modern preset: {em['cycles_source']}. "
                   f"Address-space switches: {r['report']['address_space_switches_note']}")
        out.append("")
        out.append(f"![memory access distribution, {case}](trace-apache-{case}.png)")
        out.append("")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "trace-apache.md"))
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "bench", "trace-apache"))
    ap.add_argument("--requests", type=int, default=200, help="native requests timed per case")
    args = ap.parse_args()
    for need in (BUNKAI, APACHE):
        if not os.path.exists(need):
            raise SystemExit(f"bench-trace: {need} is missing (run scripts/install-deps.sh and make)")
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    port = free_port()
    conf = setup(args.work, port)
    ver = subprocess.run([APACHE, "-v"], capture_output=True, text=True).stdout.split("\n")[0].split(":")[-1].strip()
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown CPU")
    results = {"apache": ver, "cpu_model": cpu}
    outdir = os.path.dirname(os.path.abspath(args.out))
    for case in ("html", "cgi"):
        native = native_latency(conf, port, case, args.requests)
        log(f"{case}: native request {native * 1e3:.3f} ms")
        trace = os.path.join(args.work, f"{case}.bkt")
        rec = record(conf, port, case, trace)
        log(f"{case}: traced {rec.get('instructions', 0):,} instructions in {rec.get('streams', 0)} stream(s)")
        # Pentium preset: cycles from the paper's CPI; modern: the measured time.
        rep_p = report(trace, "pentium", None)
        rep_m = report(trace, "modern", native)
        subprocess.run([BUNKAI, "trace", "pages", trace, "-o", os.path.join(outdir, f"trace-apache-{case}.png")], check=True)
        results[case] = {"record": rec, "report": rep_p, "report_modern": rep_m, "native_ms": native * 1e3,
                         "rows": table_rows(rep_p, case)}
    md = markdown(results, args)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(md)
    os.replace(tmp, args.out)
    with open(os.path.join(args.work, "results.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(md)


if __name__ == "__main__":
    main()
