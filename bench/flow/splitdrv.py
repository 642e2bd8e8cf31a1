#!/usr/bin/env python3
"""bunkai flow case study (seed 003, Table 2): a Xen split-driver analogue.

A front end (netfront in domain U) and a back end (netback in domain 0, in a
network namespace of its own) share a ring of netif_tx_request slots
(tests/programs/flow/splitdrv.c). Both start with libbunkai-host and
libbunkai-flow preloaded; `bunkai flow weave` puts the aspect of
tests/programs/flow/aspects/splitdrv.xml into each running process; then the
front sends N packets. `bunkai flow report` merges the two processes'
buffers into one timeline per packet, from alloc_skb through the ring (the
flow ID in 12 bits of the request's flags, Fig. 4) and skb_clone to
kfree_skb: the shape of the paper's Table 2.

    python3 bench/flow/splitdrv.py [--packets N] [--out FILE] [--json FILE]

Needs root (a network namespace). Removes its namespace and files, also when
interrupted. Writes bench/results/flow-splitdrv.md by default.
"""
import argparse, json, os, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNKAI = os.path.join(ROOT, "build/bin/bunkai")
LIB = os.path.join(ROOT, "build/lib/bunkai")
PROGS = os.path.join(ROOT, "tests/programs/flow")
ASPECT = os.path.join(PROGS, "aspects/splitdrv.xml")

# The paper's Table 2 (µs from the first record; domain, file, line, function).
PAPER = [(0, "domU", "net/core/skbuff.c", 177, "alloc_skb"),
         (97, "dom0", "drivers/xen/netback/netback.c", 1286, "net_tx_action"),
         (237, "dom0", "net/core/skbuff.c", 425, "skb_clone"),
         (256, "dom0", "net/core/dev.c", 1525, "dev_queue_xmit"),
         (305, "dom0", "net/core/skbuff.c", 294, "kfree_skb")]


def log(msg):
    print(f"flow-splitdrv: {msg}", file=sys.stderr, flush=True)


def sh(*argv, **kw):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--packets", type=int, default=2000)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/flow-splitdrv.md"))
    ap.add_argument("--json", help="also write the report's flows as JSON here")
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("flow-splitdrv: needs root (a network namespace)")
    ns = f"bk-flow-{os.getpid()}"
    tmp = tempfile.mkdtemp(prefix="bk-flow-split-", dir="/dev/shm")
    procs = []

    def cleanup(*_):
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        subprocess.run(["ip", "netns", "delete", ns], capture_output=True)
        subprocess.run(["rm", "-rf", tmp])

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: (cleanup(), sys.exit(130)))
    try:
        exe = os.path.join(tmp, "splitdrv")
        sh(BUNKAI, "flow", "cc", "-O2", f"-I{PROGS}", os.path.join(PROGS, "splitdrv.c"), "-o", exe)
        sh("ip", "netns", "add", ns)
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        bufs = os.path.join(tmp, "bufs")
        os.mkdir(bufs)
        ring = os.path.join(tmp, "ring")
        env = dict(os.environ, BUNKAI_HOST="1", BUNKAI_FLOW_DIR=bufs, BUNKAI_FLOW_IDS=os.path.join(bufs, "ids"),
                   LD_PRELOAD=f"{LIB}/libbunkai-host.so {LIB}/libbunkai-flow.so")
        n = str(a.packets)
        front = subprocess.Popen([exe, "front", ring, n], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(front)
        assert front.stdout.readline() == "ready\n"
        back = subprocess.Popen(["ip", "netns", "exec", ns, exe, "back", ring, n], env=env, stdout=subprocess.PIPE, text=True)
        procs.append(back)
        assert back.stdout.readline() == "ready\n"
        back_pid = int(sh("pgrep", "-f", f"^{exe} back").split()[0])
        cflags = f"-include {PROGS}/splitdrv.h"
        woven = []
        for pid, side in ((front.pid, "front end (domain U)"), (back_pid, "back end (domain 0, own network namespace)")):
            t = time.monotonic()
            out = sh(BUNKAI, "flow", "weave", "--pid", str(pid), ASPECT, "--cflags", cflags).strip()
            woven.append((side, out, time.monotonic() - t))
            log(out)
        t0 = time.monotonic()
        front.stdin.write("go\n")
        front.stdin.flush()
        fo, _ = front.communicate(timeout=300)
        bo, _ = back.communicate(timeout=300)
        wall = time.monotonic() - t0
        if front.returncode or back.returncode:
            raise SystemExit(f"flow-splitdrv: front exited {front.returncode}, back {back.returncode}")
        rep = json.loads(sh(BUNKAI, "flow", "report", "--json", "--id-bits", "12", env=dict(os.environ, BUNKAI_FLOW_DIR=bufs)))
        dump = json.loads(sh(BUNKAI, "flow", "dump", "--json", env=dict(os.environ, BUNKAI_FLOW_DIR=bufs)))
    finally:
        cleanup()

    flows = rep["flows"]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f)
    front_pid = str(front.pid)

    def first_at(steps, fn):
        return next((s["elapsed_us"] for s in steps if s["function"] == fn), None)

    # flows that cross: a front and a back step
    crossing = [f for f in flows if {str(s["pid"]) for s in f["steps"]} >= {front_pid} and len({s["pid"] for s in f["steps"]}) == 2]
    stages = ["alloc_skb", "make_txreq", "net_tx_action", "skb_clone", "dev_queue_xmit", "kfree_skb"]
    med = {}
    for fn in stages:
        v = [first_at(f["steps"], fn) for f in crossing]
        v = [x for x in v if x is not None]
        med[fn] = (statistics.median(v), len(v)) if v else (None, 0)
    sample = next((f for f in crossing if any(s["function"] == "skb_clone" for s in f["steps"])), crossing[0] if crossing else None)

    L = ["# bunkai flow: the split-driver case study (seed 003, Table 2)\n",
         f"Generated by `python3 bench/flow/splitdrv.py --packets {a.packets}` on {time.strftime('%Y-%m-%d')}. "
         "Paper: Xen 3.0.4, netfront in domain U and netback in domain 0, one packet of `ping` traced with XenLASY.\n",
         "The front end and the back end of `tests/programs/flow/splitdrv.c` share a ring of `netif_tx_request` slots "
         "(a tmpfs file both map, for Xen's granted pages); the back end runs in a network namespace of its own and "
         "sends every packet (and a clone of every fourth) to a real UDP socket. Both were started with "
         "libbunkai-host and libbunkai-flow preloaded and woven at run time (`bunkai flow weave --pid`) with "
         "`tests/programs/flow/aspects/splitdrv.xml`: the xflow definition of the paper's Figs. 3-4 (start at "
         "`alloc_skb`, the ID into bits 4-15 of the request's `flags` on the front and out of them on the back, "
         "`skb_clone` copies it, `kfree_skb` ends it) and Fig. 2's advice (every access to a flow's `sk_buff`: "
         "`STORE_DATA3($pc$, tsc, id)`). `bunkai flow report --id-bits 12` merged the two processes' buffers.\n",
         "## Weaving\n"]
    for side, out, dt in woven:
        L.append(f"- {side}: {out.replace('bunkai flow: ', '')} (`bunkai flow weave` took {dt * 1e3:.0f} ms, clang included)")
    L.append(f"\n{a.packets:,} packets in {wall:.2f} s while woven. Front: `{fo.strip()}`. Back: `{bo.strip()}`.")
    recs = sum(len(b["records"]) for b in dump["buffers"])
    drops = sum(b["dropped"] for b in dump["buffers"])
    L.append(f"Records: {recs:,} in {len(dump['buffers'])} buffers, {drops} dropped; flows: {len(flows):,}, of which "
             f"{len(crossing):,} cross from the front end to the back end.\n")
    L.append("## One packet's flow, beside the paper's Table 2\n")
    if sample:
        L.append("| elapsed [µs] | process | file:line | function |")
        L.append("|---:|---|---|---|")
        seen = set()
        for s in sample["steps"]:
            key = (s["function"], s["line"])
            if key in seen:
                continue
            seen.add(key)
            side = "front (domU)" if str(s["pid"]) == front_pid else "back (dom0)"
            L.append(f"| {s['elapsed_us']:.1f} | {side} | {os.path.basename(s['file'])}:{s['line']} | {s['function']} |")
        L.append(f"\n(flow {sample['flow']}; {len(sample['steps'])} records, the first at each place shown)\n")
    L.append("Paper (Table 2):\n")
    L.append("| elapsed [µs] | domain | file:line | function |")
    L.append("|---:|---|---|---|")
    for t, d, f, line, fn in PAPER:
        L.append(f"| {t} | {d} | {f}:{line} | {fn} |")
    L.append("\n## Every crossing flow: median time of the first record at each stage [µs]\n")
    L.append("| stage | median [µs] | flows |")
    L.append("|---|---:|---:|")
    for fn in stages:
        m, k = med[fn]
        L.append(f"| {fn} | {'-' if m is None else f'{m:.1f}'} | {k:,} |")
    L.append("\nThe ring crossing (make_txreq to net_tx_action) includes the time the back end's poll loop takes to "
             "come round, which dominates here as domain switching did in the paper.")
    text = "\n".join(L) + "\n"
    tmp_out = a.out + ".tmp"
    with open(tmp_out, "w") as f:
        f.write(text)
    os.replace(tmp_out, a.out)
    print(text)
    ok = len(crossing) == a.packets
    if not ok:
        log(f"only {len(crossing)} of {a.packets} flows crossed the ring")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
