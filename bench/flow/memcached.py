#!/usr/bin/env python3
"""bunkai flow on a real server: Debian's memcached (seed 003, issue 7).

memcached 1.6.18 from Debian's source package, built twice by
scripts/fetch-memcached.sh (clang-14, and `bunkai flow cc`), loaded by
memcaslap (Debian's libmemcached-tools: 90% get, 10% set) on loopback.

    python3 bench/flow/memcached.py [--rounds N] [--table3-rounds N] [--ops N] [--out FILE]

Three parts, written to bench/results/flow-memcached.md:
1. What the unpatched sleds cost: throughput of the plain build against the
   flow build (and the flow build with the runtimes preloaded, ready to be
   woven), interleaved rounds, medians, and a second plain server as the
   noise floor; and user-space instructions per request (callgrind), which
   do not depend on what else the machine is doing.
2. One request followed: `bunkai flow weave` puts
   tests/programs/flow/aspects/memcached.xml into the running server, a
   client sends set, get (hit), get (miss) and delete one at a time, and
   `bunkai flow report` gives each request's timeline from its read buffer to
   its reply.
3. Table 3 on memcached: nothing woven (twice: the second is the noise
   floor), flow-filtered logging (only sets are followed:
   memcached-sets.xml), the filter with no request followed, the filtered
   aspect without guards (and with the full-state trampoline), and
   unfiltered logging (memcached-all.xml) under memcaslap: throughput and
   server CPU (each round against its own nothing-woven run), records and
   their memory.

The server runs on CPU 0 with one worker thread, memcaslap on CPU 1. Only
loopback is used; every server started is stopped, also when interrupted.
"""
import argparse, json, os, re, signal, socket, statistics, subprocess, sys, tempfile, time

from common import (ASPECTS, BUNKAI, LIB, PRELOAD, ROOT, cpu_ns, kill_all, paired_diff, paired_ratio, paper_target, sh,
                    verdict, wait_port, write_result)

MC = os.path.join(ROOT, "build/third_party/memcached")


def log(msg):
    print(f"flow-memcached: {msg}", file=sys.stderr, flush=True)


class Lab:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="bk-flow-mc-", dir="/dev/shm")
        self.procs = []
        self.next_port = 22000 + os.getpid() % 5000
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: (self.close(), sys.exit(130)))

    def close(self):
        kill_all(self.procs)
        subprocess.run(["rm", "-rf", self.tmp])

    def server(self, variant, weavable=False, bufs=None, wrap=(), extra=(), buf_size=None):
        """Starts memcached-VARIANT on a fresh port; returns (proc, port)."""
        port = self.next_port
        self.next_port += 1
        env = dict(os.environ)
        if weavable:
            bufs = bufs or self.tmp
            env.update(BUNKAI_HOST="1", LD_PRELOAD=PRELOAD, BUNKAI_FLOW_DIR=bufs,
                       BUNKAI_FLOW_IDS=os.path.join(bufs, "ids"))
            if buf_size:
                env["BUNKAI_FLOW_BUF"] = buf_size
        argv = ["taskset", "-c", "0", *wrap, os.path.join(MC, f"memcached-{variant}"), "-U", "0", "-l", "127.0.0.1",
                "-p", str(port), "-t", "1", "-m", "64", "-u", "root", *extra]
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        wait_port(port, p, "flow-memcached: the server")
        return p, port

    @staticmethod
    def stop(p):
        p.send_signal(signal.SIGINT)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def memcaslap(port, ops, conc):
    """Runs memcaslap on CPU 1; returns (TPS, its output). memcaslap
    splits the operations evenly over the connections."""
    ops -= ops % conc
    out = sh("taskset", "-c", "1", "memcaslap", "-s", f"127.0.0.1:{port}", "-T", "1", "-c", str(conc), "-x", str(ops))
    m = re.search(r"Ops: (\d+) TPS: (\d+)", out)
    if not m or int(m.group(1)) != ops:
        raise SystemExit(f"flow-memcached: memcaslap did not finish its {ops} operations:\n{out}")
    return int(m.group(2)), out


def sled_cost(lab, rounds, ops, conc):
    modes = [("plain (clang-14)", "plain", False), ("plain again (noise floor)", "plain", False),
             ("flow cc, sleds unpatched", "flow", False),
             ("flow cc, runtimes preloaded, nothing woven", "flow", True)]
    servers = {m: lab.server(v, w) for m, v, w in modes}
    for m, _, _ in modes:  # warm up: the slabs and the item set
        memcaslap(servers[m][1], ops // 4, conc)
    tps = {m: [] for m, _, _ in modes}
    cpu = {m: [] for m, _, _ in modes}  # server CPU ns per operation
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]  # rotate who goes first
        for m, _, _ in order:
            p, port = servers[m]
            c0 = cpu_ns(p.pid)
            tps[m].append(memcaslap(port, ops, conc)[0])
            cpu[m].append((cpu_ns(p.pid) - c0) / (ops - ops % conc))
        log(f"sled cost: round {r + 1}/{rounds}: " + ", ".join(f"{tps[m][-1]:,} ({cpu[m][-1]:.0f} ns)" for m, _, _ in modes))
    for p, _ in servers.values():
        lab.stop(p)
    return modes, tps, cpu


def instructions(lab, variant, ops_pair, conc):
    """User-space instructions per request, from two callgrind runs that
    differ only in how many requests they serve."""
    counts = []
    for ops in ops_pair:
        out = os.path.join(lab.tmp, f"cg.{variant}.{ops}")
        # Valgrind keeps a few descriptors for itself and refuses a server
        # raising its hard limit: give memcached exactly what it will see.
        wrap = ("prlimit", "--nofile=1024:1024", "valgrind", "--tool=callgrind", f"--callgrind-out-file={out}")
        p, port = lab.server(variant, wrap=wrap, extra=("-c", "1012"))
        memcaslap(port, ops, conc)
        lab.stop(p)
        m = re.search(r"^summary: (\d+)", open(out).read(), re.M)
        if not m:
            raise SystemExit(f"flow-memcached: no callgrind summary in {out}")
        counts.append(int(m.group(1)))
    return (counts[1] - counts[0]) / (ops_pair[1] - ops_pair[0])


def one_request_each(lab):
    """Weaves memcached.xml into a running flow server, sends four requests
    one at a time, and returns the weave line, the replies and the report."""
    bufs = os.path.join(lab.tmp, "follow")
    os.mkdir(bufs)
    p, port = lab.server("flow", weavable=True, bufs=bufs)
    t = time.monotonic()
    woven = sh(BUNKAI, "flow", "weave", "--pid", str(p.pid), os.path.join(ASPECTS, "memcached.xml")).strip()
    weave_s = time.monotonic() - t
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    replies = []
    for req, end in ((b"set greeting 0 0 5\r\nhello\r\n", b"\r\n"), (b"get greeting\r\n", b"END\r\n"),
                     (b"get nothing\r\n", b"END\r\n"), (b"delete greeting\r\n", b"\r\n")):
        s.sendall(req)
        d = b""
        while not d.endswith(end):
            chunk = s.recv(4096)
            if not chunk:
                raise SystemExit("flow-memcached: the woven server closed the connection")
            d += chunk
        replies.append((req.decode().split("\r\n")[0], d.decode().replace("\r\n", " ").strip()))
    s.close()
    sh(BUNKAI, "flow", "unweave", "--pid", str(p.pid))
    lab.stop(p)
    rep = json.loads(sh(BUNKAI, "flow", "report", "--all", "--json", env=dict(os.environ, BUNKAI_FLOW_DIR=bufs)))
    return woven, weave_s, replies, rep


BASE, BASE2, FILT, NOTHING, NOGUARD, FULL, UNF = (
    "nothing woven", "nothing woven again (noise floor)", "flow-filtered (sets followed)",
    "flow-filtered, no request followed", "flow-filtered, no guards", "flow-filtered, no guards, full-state trampoline",
    "unfiltered (every access)")
TABLE3_MODES = [(BASE, None, ()), (BASE2, None, ()), (FILT, "memcached-sets.xml", ()), (NOTHING, "memcached-binary.xml", ()),
                (NOGUARD, "memcached-sets.xml", ("--no-guard",)),
                (FULL, "memcached-sets.xml", ("--no-guard", "--full-state")), (UNF, "memcached-all.xml", ())]


def table3(lab, rounds, ops, conc, modes=TABLE3_MODES):
    res = {m: {"tps": [], "cpu": [], "bytes": [], "records": [], "flows": [], "dropped": []} for m, _, _ in modes}
    for r in range(rounds):
        for m, asp, opts in modes[r % len(modes):] + modes[:r % len(modes)]:  # interleaved, rotating
            bufs = tempfile.mkdtemp(dir=lab.tmp)
            # a buffer big enough for every record of the unfiltered run
            # (sparse: only what is written takes memory)
            p, port = lab.server("flow", weavable=True, bufs=bufs, buf_size="8G")
            if asp:
                sh(BUNKAI, "flow", "weave", *opts, "--pid", str(p.pid), os.path.join(ASPECTS, asp))
            c0 = cpu_ns(p.pid)
            tps, _ = memcaslap(port, ops, conc)
            res[m]["cpu"].append((cpu_ns(p.pid) - c0) / (ops - ops % conc))
            lab.stop(p)
            res[m]["tps"].append(tps)
            if asp and any(f.endswith(".buf") for f in os.listdir(bufs)):
                benv = dict(os.environ, BUNKAI_FLOW_DIR=bufs)
                dump = json.loads(sh(BUNKAI, "flow", "dump", "--json", "--summary", env=benv))
                res[m]["bytes"].append(sum(min(b["used"], b["capacity"]) for b in dump["buffers"]))
                res[m]["records"].append(sum(b["record_count"] for b in dump["buffers"]))
                res[m]["dropped"].append(sum(b["dropped"] for b in dump["buffers"]))
                if "<xflow" in open(os.path.join(ASPECTS, asp)).read() and dump["buffers"]:
                    rep = json.loads(sh(BUNKAI, "flow", "report", "--all", "--json", env=benv))
                    res[m]["flows"].append(len(rep["flows"]))
            else:
                res[m]["bytes"].append(0)
                res[m]["records"].append(0)
                res[m]["dropped"].append(0)
            subprocess.run(["rm", "-rf", bufs])
        log(f"Table 3: round {r + 1}/{rounds}: " + ", ".join(f"{res[m]['tps'][-1]:,}" for m, _, _ in modes))
    return modes, res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=30,
                    help="interleaved rounds of the sled-cost runs (default 30: with 15, two runs gave -1.5%% and +2.6%%)")
    ap.add_argument("--table3-rounds", type=int, default=9, help="interleaved rounds of Table 3 (default 9)")
    ap.add_argument("--ops", type=int, default=300000, help="memcaslap operations per run (default 300,000)")
    ap.add_argument("--concurrency", type=int, default=32, help="memcaslap connections (default 32)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/flow-memcached.md"))
    a = ap.parse_args()
    for f in ("memcached-plain", "memcached-flow"):
        if not os.access(os.path.join(MC, f), os.X_OK):
            sys.exit(f"flow-memcached: {MC}/{f} is missing (run make fetch-memcached)")
    lab = Lab()
    try:
        modes, tps, cpu = sled_cost(lab, a.rounds, a.ops, a.concurrency)
        ipr = {v: instructions(lab, v, (20000, 60000), 4) for v in ("plain", "flow")}
        log(f"instructions per request: plain {ipr['plain']:.0f}, flow {ipr['flow']:.0f}")
        woven, weave_s, replies, rep = one_request_each(lab)
        t3modes, t3 = table3(lab, a.table3_rounds, a.ops, a.concurrency)
    finally:
        lab.close()

    version = open(os.path.join(MC, "DEBIAN_VERSION")).read().strip()
    med = {m: statistics.median(v) for m, v in tps.items()}
    base = med[modes[0][0]]
    # each round's ratio to that round's plain run, then the median: the
    # machine's drift between rounds cancels
    paired = {m: paired_ratio(tps[m], tps[modes[0][0]]) for m, _, _ in modes}
    cpu_med = {m: statistics.median(v) for m, v in cpu.items()}
    L = ["# bunkai flow on a real server: Debian's memcached (seed 003, issue 7)\n",
         f"Generated by `python3 bench/flow/memcached.py` on {time.strftime('%Y-%m-%d')}. memcached {version} from "
         "Debian's source package (`scripts/fetch-memcached.sh`: Debian's configure without SASL and TLS, "
         "`-O2 -g -gdwarf-4`), built with clang-14 and with `bunkai flow cc`. Load: memcaslap (Debian's "
         f"libmemcached-tools; 90% get, 10% set), {a.concurrency} connections, {a.ops:,} operations a run. The server "
         "runs on CPU 0 with one worker thread, memcaslap on CPU 1, loopback only.\n",
         "## 1. What unpatched sleds cost\n",
         f"The servers ran side by side; each round loads each once, in rotating order; {a.rounds} rounds. "
         "\"Against plain\" is the median of each round's ratio to that round's plain run; server CPU is the "
         "server's own CPU time per operation (schedstat), median.\n",
         "| build | throughput [ops/s] | against plain | server CPU [ns/op] | runs [ops/s] |", "|---|---:|---:|---:|---|"]
    for m, _, _ in modes:
        L.append(f"| {m} | {med[m]:,.0f} | {100 * (paired[m] - 1):+.2f}% | {cpu_med[m]:,.0f} | "
                 f"{', '.join(f'{x:,}' for x in tps[m])} |")
    cost = 1 - paired[modes[2][0]]
    # two samples of the noise, each two builds that run the same code on a
    # request's path: plain twice, and the flow build with and without the
    # runtimes preloaded (loaded, they wait; nothing is woven); the larger
    # one counts
    noise_plain = abs(1 - paired[modes[1][0]])
    noise_flow = abs(1 - paired_ratio(tps[modes[3][0]], tps[modes[2][0]]))
    noise = max(noise_plain, noise_flow)
    L.append("")
    L.append(f"User-space instructions per request (callgrind, 60,000 minus 20,000 requests): plain "
             f"{ipr['plain']:,.0f}, flow cc {ipr['flow']:,.0f} ({100 * (ipr['flow'] / ipr['plain'] - 1):+.1f}%). "
             "Each sled the request passes is one `nop` (callgrind counts it as an instruction; the core retires it "
             "without executing anything); the rest is what the sleds' operands cost the register allocator. Most of "
             "a request's time is the kernel's (epoll, read, sendmsg), which these counts do not include.\n")
    cpu_cost = cpu_med[modes[2][0]] / cpu_med[modes[0][0]] - 1
    L.append(f"- Target: unpatched sleds cost <= 1% of the server's throughput: {100 * cost:+.2f}% "
             f"(noise floor of this run: {100 * noise:.2f}%, the larger of plain against plain, {100 * noise_plain:.2f}%, "
             f"and the flow build with the runtimes preloaded against it without, {100 * noise_flow:.2f}%, the same code on a "
             f"request's path; server CPU per operation: {100 * cpu_cost:+.2f}%): **{verdict(cost, noise, 0.01)}**\n")

    L.append("## 2. One request followed from its read buffer to its reply\n")
    L.append(f"`{woven.replace('bunkai flow: ', '')}` (`bunkai flow weave` took {weave_s * 1e3:.0f} ms, clang "
             "included). The aspect is `tests/programs/flow/aspects/memcached.xml`: a flow starts where "
             "`try_read_command_ascii` finds the command in the connection's read buffer (`conn.rcurr`), is copied "
             "to each reply object (`mc_resp`) as its buffer is written or as `_transmit_pre` gathers it for "
             "`sendmsg`, leaves the connection once `transmit` has sent, and ends at `resp_finish`. The client sent "
             "four requests, one at a time:\n")
    L.append("| request | reply | flow | records | first place | last place | µs |")
    L.append("|---|---|---|---:|---|---|---:|")
    flows = rep["flows"]
    for (req, reply), f in zip(replies, flows):
        s0, s1 = f["steps"][0], f["steps"][-1]
        L.append(f"| `{req}` | `{reply}` | {f['flow']} | {len(f['steps'])} | {s0['function']} | {s1['function']} | "
                 f"{s1['elapsed_us']:.1f} |")
    L.append(f"\n{len(flows)} flows for {len(replies)} requests.\n")
    get = flows[1] if len(flows) > 1 else None
    if get:
        L.append("The `get` (hit), first record at each place:\n")
        L.append("| elapsed [µs] | file:line | function |")
        L.append("|---:|---|---|")
        seen = set()
        for s in get["steps"]:
            k = (s["function"], s["line"])
            if k not in seen:
                seen.add(k)
                L.append(f"| {s['elapsed_us']:.1f} | {os.path.basename(s['file'])}:{s['line']} | {s['function']} |")
        L.append("")

    L.append("## 3. Table 3 on memcached: logging memory and throughput with and without the filter\n")
    n3 = len(t3[t3modes[0][0]]["tps"])
    L.append(f"Each run a fresh server (flow cc, runtimes preloaded), woven before the load; {n3} rounds, interleaved in rotating order, "
             "medians; \"against nothing woven\" and the CPU difference are the medians of each round's ratio to, and "
             "difference from, that round's first nothing-woven run (the machine's drift between rounds cancels), and "
             "the second nothing-woven run is the noise floor. Filtered: `memcached-sets.xml` follows only sets (about one request in ten) and records only "
             "their accesses; unfiltered: `memcached-all.xml`, the same advice on the same members of every "
             "connection and reply. Woven as `bunkai flow weave` does by default: vector-free (the advice builds "
             "with `-mgeneral-regs-only` and calls only the runtime, so the trampoline skips XSAVE/XRSTOR) and "
             "with guards (a sled whose code is all filtered on a flow tests the key's register against the flow "
             "table's filter in the guard it calls, which returns before anything is saved when the key cannot be followed). "
             "*No request followed* is `memcached-binary.xml`, the filtered aspect with its start moved where "
             "memcaslap's text protocol never goes: what the filter costs when nothing is followed. The *no "
             "guards* rows weave the filtered aspect with `--no-guard` (every pass runs the trampoline, the "
             "handler and get_flowid), and with `--full-state` too, as every weave was before this work. Server "
             "CPU is the server's own CPU time per operation (schedstat).\n")
    L.append("| | throughput [ops/s] | against nothing woven | server CPU [ns/op] | CPU against nothing woven [ns/op] | records | dropped | memory [KiB] | flows |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    m3 = {m: {k: (statistics.median(v) if v else None) for k, v in d.items()} for m, d in t3.items()}
    # paired with each round's first nothing-woven run
    tr = {m: paired_ratio(t3[m]["tps"], t3[BASE]["tps"]) for m in t3}
    cd = {m: paired_diff(t3[m]["cpu"], t3[BASE]["cpu"]) for m in t3}
    for m, _, _ in t3modes:
        d = m3[m]
        fl = "-" if d["flows"] is None else f"{d['flows']:,.0f}"
        L.append(f"| {m} | {d['tps']:,.0f} | {100 * (tr[m] - 1):+.1f}% | {d['cpu']:,.0f} | {cd[m]:+,.0f} | {d['records']:,.0f} | "
                 f"{d['dropped']:,.0f} | {d['bytes'] / 1024:,.1f} | {fl} |")
    filt, unf = m3[FILT], m3[UNF]
    c3 = m3[BASE]["cpu"]
    ratio = filt["bytes"] / unf["bytes"] if unf["bytes"] else float("nan")
    loss, noise3 = 1 - tr[FILT], abs(1 - tr[BASE2])
    L.append("")
    L.append(f"- Target: flow-filtered logging memory <= 10% of unfiltered: {100 * ratio:.1f}%: "
             f"**{'PASS' if ratio <= 0.10 else 'MISS'}** (paper: about 40%)")
    ops3 = a.ops - a.ops % a.concurrency
    hits = unf["records"] / ops3  # the unfiltered advice records every pass through a woven sled
    flows3 = filt["flows"] or float("nan")
    L.append(f"- Where the time goes (server CPU per operation against nothing woven, {c3:,.0f} ns): the unfiltered run "
             f"records every pass through a woven sled, {hits:.1f} per operation. With no request followed, the guards "
             f"turn every pass away: {cd[NOTHING]:+,.0f} ns per operation ({cd[NOTHING] / hits:+.1f} ns "
             f"per pass). Without guards each pass costs the trampoline, the handler and get_flowid: "
             f"{cd[NOGUARD]:+,.0f} ns per operation ({cd[NOGUARD] / hits:+.1f} ns per pass). Following the "
             f"sets costs {cd[FILT]:+,.0f} ns per operation, that is {(cd[FILT] - cd[NOTHING]) * ops3 / flows3 / 1000:.1f} µs "
             f"per followed request beyond the filter ({filt['records'] / flows3:.0f} records each, and every pass "
             f"through its objects' sleds running the advice). The noise floor of these differences: {cd[BASE2]:+,.0f} ns "
             "per operation.")
    L.append(paper_target(t3[FILT]["tps"], t3[UNF]["tps"], noise3))
    L.append(f"- The same target against nothing woven (stricter: what following costs the server): {100 * loss:.1f}% (noise floor, nothing woven "
             f"against nothing woven: {100 * noise3:.1f}%): **{verdict(loss, noise3, 0.02)}** (no guards: {100 * (1 - tr[NOGUARD]):.1f}%; no guards "
             f"and the full-state trampoline: {100 * (1 - tr[FULL]):.1f}%; with no request followed: "
             f"{100 * (1 - tr[NOTHING]):.1f}%)")
    print(write_result(a.out, L))
    ok = len(flows) == len(replies) and all(f["steps"][-1]["function"] == "resp_finish" for f in flows)
    if not ok:
        log("not every request became one flow ending at resp_finish")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
