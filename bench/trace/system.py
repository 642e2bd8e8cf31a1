#!/usr/bin/env python3
"""bench/trace/system.py: TURU's Apache case study in full-system mode
(issue 22, seed 001 §3-4): `bunkai trace record --system` records the HTML
and the CGI request in the guest of trace/guest (Debian's Linux 6.1 and
Apache under QEMU's TCG), each from Apache's accept to its close, the
first request to a fresh server and a warm one (--warmup 2), and writes
bench/results/trace-apache-system.md: the paper's Tables 1-6 beside ours,
kernel column included, the interrupts, exceptions and address-space
switches, the §4 estimate on them, and the recording's own figures (boot
with and without the plugin, record throughput, bytes per instruction).

Usage: python3 bench/trace/system.py   (about 12 minutes: ten boots)
Every process has a deadline; nothing leaves 127.0.0.1.
"""
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUNKAI = os.environ.get("BUNKAI", os.path.join(ROOT, "build", "bin", "bunkai"))
GUEST = os.path.join(ROOT, "build", "guest")
OUT = os.path.join(ROOT, "build", "bench", "trace-system")
RESULT = os.path.join(ROOT, "bench", "results", "trace-apache-system.md")

spec = importlib.util.spec_from_file_location("apache_bench", os.path.join(ROOT, "bench", "trace", "apache.py"))
apache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(apache)
PAPER, REQUEST, free_port = apache.PAPER, apache.REQUEST, apache.free_port


def log(msg):
    print(f"bench-trace-system: {msg}", file=sys.stderr, flush=True)


def boot_without_plugin():
    """Seconds from QEMU's start to GUEST-READY, as `record --system`
    boots the guest (same flags) but with no plugin."""
    port = free_port()
    cmd = ["qemu-system-x86_64", "-accel", "tcg", "-icount", "shift=0,sleep=off", "-smp", "1", "-m", "512",
           "-nographic", "-no-reboot", "-kernel", f"{GUEST}/vmlinuz", "-initrd", f"{GUEST}/initrd.gz",
           "-append", "console=ttyS0 quiet panic=-1 nokaslr", "-netdev",
           f"user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:80", "-device", "e1000,netdev=n0"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = t0 + 300
        for line in p.stdout:
            if "GUEST-READY" in line:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                break
        raise SystemExit("bench-trace-system: the guest did not boot within 300 s without the plugin")
    finally:
        p.kill()
        p.wait(timeout=30)


def record_system(case, warmup, *how):
    """`bunkai trace record --system` of one request (after `warmup`
    unrecorded ones), with `how` (-o FILE, or --count-only): its JSON
    summary."""
    cmd = [BUNKAI, "trace", "record", "--system", "--guest", GUEST, "--get", REQUEST[case], "--json", *how]
    if warmup:
        cmd += ["--warmup", str(warmup)]
    log(" ".join(cmd))
    r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"bench-trace-system: {' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stderr.strip().splitlines()[-1])


def record(case, warmup):
    out = os.path.join(OUT, f"{case}-{'warm' if warmup else 'cold'}.bkt")
    summary = record_system(case, warmup, "-o", out)
    rep = subprocess.run([BUNKAI, "trace", "report", "--json", out], capture_output=True, text=True, timeout=300)
    if rep.returncode != 0:
        raise SystemExit(f"bench-trace-system: report {out} failed:\n{rep.stderr}")
    return summary, json.loads(rep.stdout)


def count_only(case, warmup):
    """QEMU's own speed through the same window: the plugin loaded,
    following the window and counting its instructions, recording nothing
    (`record --system --count-only`)."""
    return record_system(case, warmup, "--count-only")


def comp(rep, kind=None, name=None):
    for c in rep["components"]:
        if (kind and c["kind"] == kind) or (name and c["name"] == name):
            return c
    return None


def fmt(n):
    return f"{n:,}"


def refs(c):
    if not c or not c.get("code_refs"):
        return ("n/a", "n/a")
    f = lambda r: f"{r['min']:,} / {r['max']:,} / {round(r['mean']):,}"
    return (f(c["code_refs"]), f(c["data_refs"]))


def case_md(case, cold, warm):
    p = PAPER[case]
    s, rep = cold
    ws, wrep = warm
    total = rep["total_instructions"]
    prog = comp(rep, kind="program")
    kern = comp(rep, kind="kernel")
    libs = rep["shared_libraries_total"]
    other = comp(rep, name="[user]")
    wtotal = wrep["total_instructions"]
    wprog, wkern, wlibs = comp(wrep, kind="program"), comp(wrep, kind="kernel"), wrep["shared_libraries_total"]
    pct = lambda c, t: f"{fmt(c['instructions'])} ({100 * c['instructions'] / t:.1f}%)" if c else "0"
    ptotal = sum(p["instructions"].values())
    pp = lambda k: f"{fmt(p['instructions'][k])} ({p['pct'][k]}%)"
    o = []
    title = "Serving the HTML file of Fig. 2" if case == "html" else "The CGI program of Fig. 3"
    o.append(f"## {title}\n")
    o.append(f"First request (cold): {fmt(total)} instructions, {fmt(rep['memory_references'])} memory references, "
             f"{fmt(s['bytes'])} bytes on disk ({s['bytes_per_instruction']:.2f} B/instruction); window "
             f"{s['window_seconds'] * 1e3:.0f} ms of host time ({s['million_instructions_per_second']:.1f} M "
             f"instructions/s recorded); boot {s['boot_seconds']:.1f} s with the plugin loaded, not recording. "
             f"Warm (`--warmup 2`): {fmt(wtotal)} instructions, {ws['bytes_per_instruction']:.2f} B/instruction, "
             f"{ws['million_instructions_per_second']:.1f} M instructions/s.\n")
    o.append("### Table 1: dynamic instructions per component\n")
    o.append("| component | paper | ours, first request | ours, warm |")
    o.append("|---|---:|---:|---:|")
    o.append(f"| httpd (apache2) | {pp('httpd')} | {pct(prog, total)} | {pct(wprog, wtotal)} |")
    if case == "cgi":
        wother = comp(wrep, name="[user]")
        o.append(f"| CGI program (ours: all its user code, \"[user]\") | {pp('cgi')} | {pct(other, total)} | {pct(wother, wtotal)} |")
    o.append(f"| shared libraries (ours: Apache's{'; those of the CGI process are in its row' if case == 'cgi' else ''}) | {pp('libs')} | "
             f"{pct({'instructions': libs['instructions'] - (other['instructions'] if other else 0)}, total)} | "
             f"{pct({'instructions': wlibs['instructions'] - ((comp(wrep, name='[user]') or {'instructions': 0})['instructions'])}, wtotal)} |")
    o.append(f"| kernel | {pp('kernel')} | {pct(kern, total)} | {pct(wkern, wtotal)} |")
    o.append(f"| total | {fmt(ptotal)} | {fmt(total)} | {fmt(wtotal)} |")
    o.append("")
    o.append(f"Kernel, ours (first request): {fmt(rep['kernel_server_task'])} instructions in Apache's task (its "
             f"syscalls and faults, interrupts that struck it), {fmt(rep['kernel_other_tasks'])} in other tasks "
             f"(idle loop, kernel threads{', the CGI process' if case == 'cgi' else ''}). "
             f"Syscalls: {rep['syscalls']} (paper: {p['syscalls']}). Address-space switches (CR3 loads): "
             f"{rep['address_space_switches']} (paper: {p['switches']}). Interrupts and exceptions: "
             + (", ".join(f"{t['stub']} {t['count']}" for t in rep["traps"]) or "none") + ".\n")
    o.append("### Table 2: pages used (4 KiB)\n")
    o.append("| component | instructions: paper | ours | data: paper | ours |")
    o.append("|---|---:|---:|---:|---:|")
    o.append(f"| httpd (apache2) | {p['pages']['httpd'][0]} | {prog['code_pages']} | {p['pages']['httpd'][1]} | {prog['data_pages']} |")
    if case == "cgi" and other:
        o.append(f"| CGI program (ours: [user]) | {p['pages']['cgi'][0]} | {other['code_pages']} | {p['pages']['cgi'][1]} | {other['data_pages']} |")
    o.append(f"| shared libraries{' (ours: with [user])' if case == 'cgi' else ''} | {p['pages']['libs'][0]} | {libs['code_pages']} | {p['pages']['libs'][1]} | {libs['data_pages']} |")
    o.append(f"| kernel | {p['pages']['kernel'][0]} | {kern['code_pages']} | {p['pages']['kernel'][1]} | {kern['data_pages']} |")
    o.append("")
    o.append("### Table 3: references per page (min / max / mean)\n")
    o.append("| component | | paper | ours |")
    o.append("|---|---|---:|---:|")
    rows = [("httpd (apache2)", "httpd", prog), ("shared libraries", "libs", libs), ("kernel", "kernel", kern)]
    if case == "cgi":
        rows.insert(1, ("CGI program (ours: [user])", "cgi", other))
    for label, key, c in rows:
        (pc, pd) = p["refs"][key]
        oc, od = refs(c)
        o.append(f"| {label} | instructions | {pc[0]:,} / {pc[1]:,} / {pc[2]:,} | {oc} |")
        o.append(f"|  | data | {pd[0]:,} / {pd[1]:,} / {pd[2]:,} | {od} |")
    o.append("")
    e = rep["estimate"]
    o.append("### §4: the overhead estimate (Pentium preset, kernel included)\n")
    o.append("| | paper | ours, first request |")
    o.append("|---|---:|---:|")
    o.append(f"| cycles per request | {fmt(p['cycles'])} | {fmt(round(e['cycles']))} ({e['cycles_source']}) |")
    o.append(f"| TLB entries (pages touched, kernel included) | {sum(p['pages'][k][0] + p['pages'][k][1] for k in p['pages'])} | {fmt(e['pages'])} |")
    o.append(f"| TLB share | {p['tlb_pct']}% | {e['tlb_percent_min']:.1f}-{e['tlb_percent_max']:.1f}% |")
    o.append(f"| syscalls + address-space switches | {p['syscalls']} + {p['switches']} | {e['syscalls']} + {e['address_space_switches']} |")
    o.append(f"| TLB and switches together | {p['total_pct']}% | {e['overhead_percent_min']:.1f}-{e['overhead_percent_max']:.1f}% |")
    o.append("")
    return "\n".join(o)


def valgrind_user(case):
    """User-mode instructions of the same request in the Valgrind mode, from
    bench/results/trace-apache.md's Table 1 (ours): httpd, the CGI program
    and the shared libraries. None when the file has no such table."""
    path = os.path.join(ROOT, "bench", "results", "trace-apache.md")
    try:
        text = open(path).read()
    except OSError:
        return None
    head = "## Serving the HTML file" if case == "html" else "## Serving the CGI program"
    if head not in text:
        return None
    sec = text.split(head, 1)[1].split("\n## ", 1)[0]
    total = 0
    for line in sec.split("### Table 2", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0] in ("httpd (apache2)", "CGI (hello.cgi)", "shared libraries"):
            total += int(cells[2].split()[0].replace(",", ""))
    return total or None


def main():
    if not os.path.exists(os.path.join(GUEST, "System.map")):
        log("building the guest (make guest)")
        subprocess.run(["make", "-C", ROOT, "guest"], check=True, timeout=900)
    os.makedirs(OUT, exist_ok=True)
    t0 = time.monotonic()
    # Boots without the plugin before and after the recordings: on a
    # shared machine one sample says little.
    plain = [boot_without_plugin()]
    log(f"boot without the plugin: {plain[0]:.1f} s")
    runs, counted = {}, {}
    for case in ("html", "cgi"):
        runs[case] = (record(case, 0), record(case, 2))
        counted[case] = (count_only(case, 0), count_only(case, 2))
    plain.append(boot_without_plugin())
    log(f"boot without the plugin, again: {plain[1]:.1f} s")
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
    o = ["# `bunkai trace --system`: TURU's Apache case study with the kernel (seed 001, §3-4)\n"]
    o.append(f"Measured by `bench/trace/system.py` on {cpu} ({os.cpu_count()} cores, shared with other work; "
             f"load average {os.getloadavg()[0]:.1f} at the end), {time.strftime('%Y-%m-%d')}. The guest of "
             "trace/guest (Debian's Linux 6.1, Apache 2.4 `-X` with the paper's page and CGI program) under "
             "`qemu-system-x86_64 -accel tcg -icount shift=0,sleep=off -smp 1` with bunkai's plugin; each "
             "request recorded from Apache's accept to its close of the connection, everything the CPU ran "
             "in between. Paper: Pentium 100 MHz, Linux 2.0.34, Apache 1.3.12, traced inside the kernel.\n")
    html_cold = runs["html"][0][0]
    o.append("## Recording\n")
    o.append("| | HTML | CGI |")
    o.append("|---|---:|---:|")
    c = [runs[k][0][0] for k in ("html", "cgi")]
    w = [runs[k][1][0] for k in ("html", "cgi")]
    o.append(f"| boot to Apache without the plugin (same flags; before and after the recordings) | {plain[0]:.1f} s, {plain[1]:.1f} s | |")
    o.append(f"| boot with the plugin loaded, not recording | {c[0]['boot_seconds']:.1f} s | {c[1]['boot_seconds']:.1f} s |")
    o.append(f"| one recording, boot included | {c[0]['seconds']:.1f} s | {c[1]['seconds']:.1f} s |")
    o.append(f"| instructions (first request) | {fmt(c[0]['instructions'])} | {fmt(c[1]['instructions'])} |")
    o.append(f"| record throughput inside the window (first request) | {c[0]['million_instructions_per_second']:.1f} M/s | {c[1]['million_instructions_per_second']:.1f} M/s |")
    o.append(f"| record throughput inside the window (warm) | {w[0]['million_instructions_per_second']:.1f} M/s | {w[1]['million_instructions_per_second']:.1f} M/s |")
    q = [counted[k] for k in ("html", "cgi")]
    o.append(f"| baseline: QEMU through the same window, the plugin counting only, nothing recorded (first request / warm) | "
             f"{q[0][0]['million_instructions_per_second']:.1f} / {q[0][1]['million_instructions_per_second']:.1f} M/s | "
             f"{q[1][0]['million_instructions_per_second']:.1f} / {q[1][1]['million_instructions_per_second']:.1f} M/s |")
    o.append(f"| bytes per instruction, memory references included (first / warm) | {c[0]['bytes_per_instruction']:.2f} / {w[0]['bytes_per_instruction']:.2f} | {c[1]['bytes_per_instruction']:.2f} / {w[1]['bytes_per_instruction']:.2f} |")
    o.append("")
    verdict = lambda ok: "PASS" if ok else "MISS"
    o.append("## Targets (issue 22)\n")
    o.append(f"- one HTML request recorded in under 2 minutes, boot included: {html_cold['seconds']:.0f} s: "
             f"**{verdict(html_cold['seconds'] < 120)}**")
    for name, r, base in (("HTML", c[0], q[0][0]["million_instructions_per_second"]),
                          ("CGI", c[1], q[1][0]["million_instructions_per_second"])):
        mips = r['million_instructions_per_second']
        o.append(f"- at least 20 M instructions/s while recording, {name} (first request): {mips:.1f} M/s "
                 f"(QEMU counting only, same window: {base:.1f} M/s): **{verdict(mips >= 20)}**")
    for name, r in (("HTML", c[0]), ("CGI", c[1])):
        bpi = r['bytes_per_instruction']
        o.append(f"- at most 1 byte per instruction, memory references included, {name} (first request): "
                 f"{bpi:.2f}: **{verdict(bpi <= 1)}**")
    o.append("")
    o.append("The window is short, and after the plugin arms every block is translated anew with its callbacks "
             "inside it. The baseline row says how much of the first request's time is QEMU's own: with the "
             "plugin only following the window and counting (an inline add per instruction, a call per block, "
             "no memory callbacks, nothing written), the first request runs at about the speed it is recorded "
             "at, so the 20 M/s cannot be reached by the plugin alone there (translating the blocks, QEMU's "
             "device and network emulation and the client's packets fill the window); warm, QEMU alone runs "
             "several times faster than the recording, and that gap is the plugin's callbacks. In a short trace the definitions of its segments, written once per trace (packed since "
             "format version 4), weigh about as much as the executions.\n")
    o.append("How Linux 6.1 on x86-64 differs from Linux 2.0 on a Pentium: the kernel's share is far higher "
             "(each syscall and fault now passes Spectre/Meltdown entry and exit code, security-module hooks "
             "and memory-cgroup accounting; page faults walk four levels), while Apache's own path for a "
             "static page is shorter than Apache 1.3's. The first request also pays the dynamic linker's lazy "
             "binding (ld.so) and, in the kernel, faults on Apache's untouched pages; the warm column drops "
             "them. The CGI request's kernel work is mostly fork and exec of the CGI process and that "
             "process's page faults. Ours has no segment-register reloads (the paper's 234 cycles per switch "
             "is TURU's own cost on a Pentium); the estimate keeps the paper's model for comparison.\n")
    o.append("## User mode: the system mode against the Valgrind mode\n")
    o.append("The same request's user-mode instructions (Apache, its libraries, the CGI process), first "
             "request after start-up in both; the Valgrind mode's from bench/results/trace-apache.md "
             "(Apache run on the host under Valgrind with bench/trace/apache.py's configuration).\n")
    o.append("| request | Valgrind mode | system mode | difference |")
    o.append("|---|---:|---:|---:|")
    for case in ("html", "cgi"):
        rep = runs[case][0][1]
        user = rep["total_instructions"] - (comp(rep, kind="kernel") or {"instructions": 0})["instructions"]
        vg = valgrind_user(case)
        diff = f"{100 * (user - vg) / vg:+.1f}%" if vg else "n/a"
        o.append(f"| {case.upper()} | {fmt(vg) if vg else 'n/a'} | {fmt(user)} | {diff} |")
    o.append("")
    o.append("Not the same run: the same Apache binary, modules and configuration (paths aside), but another "
             "kernel and file system (the host's against the guest's initramfs), and under Valgrind the "
             "dynamic linker and libc see Valgrind's environment (its preload library, no vDSO: the guest's "
             "Apache calls into the vDSO). The differences are not analysed function by function yet.\n")
    for case in ("html", "cgi"):
        o.append(case_md(case, runs[case][0], runs[case][1]))
    o.append(f"Total time of this benchmark: {time.monotonic() - t0:.0f} s.\n")
    with open(RESULT, "w") as f:
        f.write("\n".join(o))
    log(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
