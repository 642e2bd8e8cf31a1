#!/usr/bin/env python3
"""bunkai flow on the paper's own server: Table 3 on Apache (seed 003 §5.2).

The paper measured Apache under ApacheBench (300 requests, 10 at a time)
with the aspect woven and found flow-filtered logging as fast as unfiltered.
Here: Debian's apache2 built twice (scripts/fetch-apache.sh: clang-14, and
`bunkai flow cc`), run as `httpd -X` (one process, the event MPM's threads)
on CPU 0, loopback only, serving one 4 KiB page; ab on CPU 1, 10 at a time.

    python3 bench/flow/apache.py [--requests N] [--rounds R] [--out FILE]

1. One request followed: the first followed request's places (the first
   record at each function), and the first flows as a picture.
2. Table 3: nothing woven (twice: the second is the noise floor); flow-filtered logging (aspects/apache.xml: one
   request in ten followed, every access to a followed request_rec
   recorded); the filter with no request followed (apache-errors.xml); the
   filtered aspect with --no-guard; unfiltered logging (apache-all.xml);
   every request followed (apache-every.xml: what a record costs).
   Interleaved rounds, medians, and each round's ratio to (difference
   from) that round's first nothing-woven run; throughput, server CPU per
   request (schedstat), records, memory.

Writes bench/results/flow-apache.md (and flow-apache.svg beside it). Removes
its files and ends its servers, also when interrupted.
"""
import argparse, json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time

from common import (ASPECTS, BUNKAI, LIB, PRELOAD, ROOT, cpu_ns, kill_all, paired_diff, paired_ratio, paper_target, sh,
                    verdict, wait_port, write_result)

AP = os.path.join(ROOT, "build/third_party/apache2")


def log(msg):
    print(f"flow-apache: {msg}", file=sys.stderr, flush=True)


class Lab:
    """A directory in /dev/shm (document root, configuration, logs,
    buffers; httpd drops to nobody, so it is world-writable) and the
    servers started, removed and ended at the end and when interrupted."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="bk-flow-ap-", dir="/dev/shm")
        os.chmod(self.tmp, 0o777)
        self.procs = []
        self.port = 23000 + os.getpid() % 5000
        for s in (signal.SIGINT, signal.SIGTERM):
            signal.signal(s, lambda *_: (self.close(), sys.exit(130)))
        docs = os.path.join(self.tmp, "htdocs")
        os.makedirs(docs)
        with open(os.path.join(docs, "index.html"), "w") as f:
            f.write("<html><body>\n" + "bunkai flow on Apache. " * 170 + "\n</body></html>\n")
        os.makedirs(os.path.join(self.tmp, "logs"))
        os.chmod(os.path.join(self.tmp, "logs"), 0o777)
        self.runs = 0

    def close(self):
        kill_all(self.procs)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def url(self):
        return f"http://127.0.0.1:{self.port}/index.html"

    def server(self, variant, weavable, bufs=None, buf_size=None):
        """httpd-VARIANT -X on a fresh port; returns the process."""
        self.port += 1
        self.runs += 1
        conf = os.path.join(self.tmp, f"httpd.{self.runs}.conf")
        with open(conf, "w") as f:
            f.write(f"""ServerRoot {self.tmp}
Listen 127.0.0.1:{self.port}
ServerName localhost
User nobody
Group nogroup
PidFile {self.tmp}/logs/httpd.{self.runs}.pid
ErrorLog {self.tmp}/logs/error_log
LogLevel warn
DocumentRoot {self.tmp}/htdocs
<Directory {self.tmp}/htdocs>
  Require all granted
</Directory>
TypesConfig /dev/null
AddType text/html .html
DirectoryIndex index.html
KeepAlive Off
""")
        env = dict(os.environ)
        if weavable:
            env.update(BUNKAI_HOST="1", LD_PRELOAD=PRELOAD, BUNKAI_FLOW_DIR=bufs, BUNKAI_FLOW_IDS=os.path.join(bufs, "ids"))
            if buf_size:
                env["BUNKAI_FLOW_BUF"] = buf_size
        p = subprocess.Popen(["taskset", "-c", "0", os.path.join(AP, f"httpd-{variant}"), "-X", "-f", conf], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)
        wait_port(self.port, p, f"flow-apache: httpd-{variant}")
        return p

    @staticmethod
    def stop(p):
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def ab(url, n):
    """ApacheBench on CPU 1, 10 at a time; returns requests per second."""
    out = sh("taskset", "-c", "1", "ab", "-q", "-n", str(n), "-c", "10", url)
    done = re.search(r"Complete requests:\s+(\d+)", out)
    failed = re.search(r"Failed requests:\s+(\d+)", out)
    rps = re.search(r"Requests per second:\s+([\d.]+)", out)
    if not (done and failed and rps) or int(done.group(1)) != n or int(failed.group(1)) != 0:
        raise SystemExit(f"flow-apache: ab did not get {n} good answers:\n{out}")
    return float(rps.group(1))


def one_request(lab, svg):
    """Weaves apache.xml, sends requests one at a time until one is
    followed; returns the weave line and the report."""
    bufs = os.path.join(lab.tmp, "one")
    os.mkdir(bufs)
    os.chmod(bufs, 0o777)
    p = lab.server("flow", True, bufs)
    woven = sh(BUNKAI, "flow", "weave", "--pid", str(p.pid), os.path.join(ASPECTS, "apache.xml")).strip()
    for _ in range(60):
        subprocess.run(["curl", "-s", "-o", "/dev/null", lab.url()], check=True)
    sh(BUNKAI, "flow", "unweave", "--pid", str(p.pid))
    lab.stop(p)
    rep = json.loads(sh(BUNKAI, "flow", "report", "--all", "--json", "--svg", svg, env=dict(os.environ, BUNKAI_FLOW_DIR=bufs)))
    return woven, rep


MODES = [("nothing woven", None, ()), ("nothing woven again (noise floor)", None, ()),
         ("flow-filtered (one request in ten followed)", "apache.xml", ()),
         ("flow-filtered, no request followed", "apache-errors.xml", ()),
         ("flow-filtered, no guards", "apache.xml", ("--no-guard",)),
         ("unfiltered (every request_rec access)", "apache-all.xml", ()),
         ("every request followed", "apache-every.xml", ())]


def table3(lab, rounds, n):
    res = {m: {"rps": [], "cpu": [], "records": [], "bytes": [], "dropped": [], "flows": []} for m, _, _ in MODES}
    for r in range(rounds):
        for m, asp, opts in MODES[r % len(MODES):] + MODES[:r % len(MODES)]:  # interleaved, rotating
            bufs = os.path.join(lab.tmp, f"b{lab.runs + 1}")
            os.mkdir(bufs)
            os.chmod(bufs, 0o777)
            p = lab.server("flow", True, bufs, "4G")
            if asp:
                sh(BUNKAI, "flow", "weave", *opts, "--pid", str(p.pid), os.path.join(ASPECTS, asp))
            c0 = cpu_ns(p.pid)
            rps = ab(lab.url(), n)
            res[m]["cpu"].append((cpu_ns(p.pid) - c0) / n)
            lab.stop(p)
            res[m]["rps"].append(rps)
            recs = byts = drops = 0
            if any(f.endswith(".buf") for f in os.listdir(bufs)):
                benv = dict(os.environ, BUNKAI_FLOW_DIR=bufs)
                d = json.loads(sh(BUNKAI, "flow", "dump", "--json", "--summary", env=benv))
                recs = sum(b["record_count"] for b in d["buffers"])
                byts = sum(min(b["used"], b["capacity"]) for b in d["buffers"])
                drops = sum(b["dropped"] for b in d["buffers"])
                # (every request followed: its report would be 20,000 flows of 422 steps; not needed)
                if "<xflow" in open(os.path.join(ASPECTS, asp)).read() and recs and asp != "apache-every.xml":
                    res[m]["flows"].append(len(json.loads(sh(BUNKAI, "flow", "report", "--all", "--json", env=benv))["flows"]))
            res[m]["records"].append(recs)
            res[m]["bytes"].append(byts)
            res[m]["dropped"].append(drops)
            shutil.rmtree(bufs, ignore_errors=True)
        log(f"Table 3: round {r + 1}/{rounds}: " + ", ".join(f"{res[m]['rps'][-1]:,.0f}" for m, _, _ in MODES))
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=20000, help="ab requests per run (default 20,000)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of Table 3 (default 5)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/flow-apache.md"))
    a = ap.parse_args()
    for f in ("httpd-plain", "httpd-flow"):
        if not os.access(os.path.join(AP, f), os.X_OK):
            sys.exit(f"flow-apache: {AP}/{f} is missing (run make fetch-apache)")
    if not shutil.which("ab"):
        sys.exit("flow-apache: ab is missing (apache2-utils; run scripts/install-deps.sh)")
    svg = os.path.splitext(a.out)[0] + ".svg"
    lab = Lab()
    try:
        woven, rep = one_request(lab, svg)
        res = table3(lab, a.rounds, a.requests)
    finally:
        lab.close()
    version = open(os.path.join(AP, "VERSION")).read().strip()
    deb = open(os.path.join(AP, "DEBIAN_VERSION")).read().strip()
    L = ["# bunkai flow on the paper's own server: Table 3 on Apache (seed 003 §5.2, issue 7)\n",
         f"Generated by `python3 bench/flow/apache.py` on {time.strftime('%Y-%m-%d')}. Apache {version} from Debian's "
         f"source package ({deb}; `scripts/fetch-apache.sh`: the event MPM and the \"few\" modules linked in, "
         "`-O2 -g -gdwarf-4`), built with `bunkai flow cc`, run as `httpd -X` (one process) on CPU 0, serving one "
         f"4 KiB page on loopback; ApacheBench (`ab -c 10`, as the paper's 10 at a time) on CPU 1, {a.requests:,} "
         "requests a run, a connection each. Paper: Xen 3.0.4, ApacheBench 300 requests 10 at a time, the aspect "
         "woven into the domains' kernels; 382 requests/s with and without the flow filter.\n",
         "## 1. One request followed\n",
         f"`{woven.replace('bunkai flow: ', '')}`. The aspect is `tests/programs/flow/aspects/apache.xml`: a flow "
         "starts for one request in ten where `ap_read_request` has its `request_rec`, and ends where the "
         "request's end-of-request bucket is cleaned up (`eor_bucket_cleanup`, after the response is sent); every "
         "access to a followed `request_rec` is recorded. 60 requests were sent one at a time; "
         f"{len(rep['flows'])} were followed. The first flows as a picture: "
         f"[{os.path.basename(svg)}]({os.path.basename(svg)}).\n"]
    if rep["flows"]:
        f = rep["flows"][0]
        L.append(f"The first followed request: {len(f['steps'])} steps in {f['steps'][-1]['elapsed_us']:.1f} µs; "
                 "the first record in each function:\n")
        L.append("| elapsed [µs] | file:line | function |")
        L.append("|---:|---|---|")
        seen = set()
        for s in f["steps"]:
            if s["function"] not in seen:
                seen.add(s["function"])
                L.append(f"| {s['elapsed_us']:.1f} | {os.path.basename(s['file'])}:{s['line']} | {s['function']} |")
        L.append("")
    med = {m: {k: (statistics.median(v) if v else None) for k, v in d.items()} for m, d in res.items()}
    L.append("## 2. Table 3 on Apache: logging memory and throughput with and without the filter\n")
    L.append(f"Each run a fresh server (flow cc, runtimes preloaded), woven before the load; {a.rounds} rounds, interleaved in rotating order, "
             "medians; \"against nothing woven\" and the CPU difference are the medians of each round's "
             "ratio to, and difference from, that round's first nothing-woven run (the machine's drift between rounds "
             "cancels), and the second nothing-woven run is the noise floor. The filtered aspect follows one request in ten; *no request followed* is "
             "`apache-errors.xml`, whose flow starts only where an error response is built (ab's requests all "
             "succeed): what the filter costs by itself; *no guards* weaves the filtered aspect with `--no-guard`; "
             "unfiltered is `apache-all.xml`, the same advice on every `request_rec` access; *every request "
             "followed* is `apache-every.xml`, the filtered aspect following every request (what a followed "
             "request and a record cost, without dividing a small difference by ten). Server CPU is the "
             "server's own CPU time per request (schedstat).\n")
    L.append("| | requests/s | against nothing woven | server CPU [µs/request] | CPU against nothing woven [µs/request] | records | dropped | memory [KiB] | flows |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    b0 = MODES[0][0]
    tr = {m: paired_ratio(res[m]["rps"], res[b0]["rps"]) for m in res}
    cd = {m: paired_diff(res[m]["cpu"], res[b0]["cpu"]) for m in res}
    for m, _, _ in MODES:
        d = med[m]
        fl = "-" if d["flows"] is None else f"{d['flows']:,.0f}"
        L.append(f"| {m} | {d['rps']:,.0f} | {100 * (tr[m] - 1):+.1f}% | {d['cpu'] / 1000:.1f} | {cd[m] / 1000:+.1f} | "
                 f"{d['records']:,.0f} | {d['dropped']:,.0f} | {d['bytes'] / 1024:,.1f} | {fl} |")
    floor, filt_m, nothing_m, nog_m, unf_m, every_m = (m for m, _, _ in MODES[1:7])
    filt, unf = med[filt_m], med[unf_m]
    ratio = filt["bytes"] / unf["bytes"] if unf["bytes"] else float("nan")
    loss, noise = 1 - tr[filt_m], abs(1 - tr[floor])
    flows = filt["flows"] or float("nan")
    per_req = unf["records"] / a.requests
    L.append("")
    L.append(f"- Memory: flow-filtered logging took {100 * ratio:.1f}% of unfiltered logging's "
             f"({'within' if ratio <= 0.10 else 'over'} the issue's 10%; paper: about 40%).")
    L.append(f"- Where the time goes: a request passes {per_req:.0f} woven sleds (the unfiltered run's records per "
             f"request). With no request followed, the guards cost {cd[nothing_m] / 1000:+.1f} µs a "
             f"request ({cd[nothing_m] / per_req:+.1f} ns a pass); without guards, every pass runs "
             f"the trampoline, the handler and get_flowid: {cd[nog_m] / 1000:+.1f} µs a request. "
             f"Following one request in ten costs {cd[filt_m] / 1000:+.1f} µs a request in all, "
             f"{(cd[filt_m] - cd[nothing_m]) * a.requests / flows / 1000:.0f} µs per followed request beyond the filter "
             f"({filt['records'] / flows:.0f} records each). With every request followed: "
             f"{cd[every_m] / 1000:+.1f} µs a request, {cd[every_m] / ((med[every_m]['records'] / a.requests) or float('nan')):.0f} ns "
             f"a record ({med[every_m]['records'] / a.requests:.0f} records a request). The noise floor of these differences: "
             f"{cd[floor] / 1000:+.1f} µs a request.")
    L.append(paper_target(res[filt_m]["rps"], res[unf_m]["rps"], noise))
    L.append(f"- The same target against nothing woven (stricter: what following costs the server): {100 * loss:.1f}% (noise floor, nothing woven "
             f"against nothing woven: {100 * noise:.1f}%): **{verdict(loss, noise, 0.02)}** (no guards: {100 * (1 - tr[nog_m]):.1f}%; "
             f"no request followed: {100 * (1 - tr[nothing_m]):.1f}%; unfiltered: {100 * (1 - tr[unf_m]):.1f}%)")
    L.append(f"- The paper's comparison, filtered against unfiltered logging, both woven: filtered is "
             f"{filt['rps'] / unf['rps']:.1f} times as fast (paper: the same, 382 requests/s).")
    print(write_result(a.out, L))
    return 0


if __name__ == "__main__":
    sys.exit(main())
