"""bunkai share benchmarks' harness: hosts as network namespaces (home
joined by a veth pair to each node), `bunkai share node` on each node with
a cluster key made for the run, and helpers to run programs at home. Used
by run.py (the paper's evaluation) and stress.py (correctness, hundreds of
runs). Everything it makes is removed on close(), also on Ctrl-C or
SIGTERM, and stale namespaces of dead runs are removed first.
"""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# $BUNKAI: another build (a copy taken before a long run, so that the tree
# can be rebuilt meanwhile); its helpers are found beside it, as always.
BUNKAI = Path(os.environ.get("BUNKAI") or ROOT / "build/bin/bunkai")
PREFIX = "bk-shb"
NODES = 2
PORT = 7070

def log(msg):
    print(f"bench-share: {msg}", file=sys.stderr, flush=True)


def commit():
    """The tree the build under test came from (git describe), for a
    results file's first line."""
    p = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return p.stdout.strip() or "?"


class Failed(Exception):
    pass


def sh(*argv, check=True, **kw):
    p = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise Failed(f"{' '.join(argv)}: {p.stderr.strip()[-1500:]}")
    return p.stdout


def clean_stale():
    for line in sh("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if not name.startswith(PREFIX + "-"):
            continue
        try:
            pid = int(name.split("-")[2])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and not Path(f"/proc/{pid}").exists():
            for p in sh("ip", "netns", "pids", name, check=False).split():
                try:
                    os.kill(int(p), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "delete", name, check=False)


class Hosts:
    """home + NODES nodes, a veth pair from home to each."""

    def __init__(self):
        self.ns = [f"{PREFIX}-{os.getpid()}-{k}" for k in range(NODES + 1)]
        self.procs = []
        self.up = False

    def ip(self, k, side):  # side 1 = home's end, 2 = node's end
        return f"10.231.{k}.{side}"

    def start(self):
        for n in self.ns:
            sh("ip", "netns", "add", n)
        self.up = True
        for n in self.ns:
            sh("ip", "-n", n, "link", "set", "lo", "up")
        for k in range(1, NODES + 1):
            a, b = f"bkshh{os.getpid() % 100000}{k}", f"bkshn{os.getpid() % 100000}{k}"
            sh("ip", "link", "add", a, "netns", self.ns[0], "type", "veth", "peer", "name", b, "netns", self.ns[k])
            sh("ip", "-n", self.ns[0], "addr", "add", f"{self.ip(k, 1)}/24", "dev", a)
            sh("ip", "-n", self.ns[k], "addr", "add", f"{self.ip(k, 2)}/24", "dev", b)
            sh("ip", "-n", self.ns[0], "link", "set", a, "up")
            sh("ip", "-n", self.ns[k], "link", "set", b, "up")

    def cmd(self, k, argv):
        return ["nsenter", f"--net=/var/run/netns/{self.ns[k]}", "--", *map(str, argv)]

    def spawn(self, k, argv, **kw):
        p = subprocess.Popen(self.cmd(k, argv), start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def wait_port(self, k, port, deadline=15.0):
        end = time.monotonic() + deadline
        probe = f"exec 3<>/dev/tcp/{self.ip(k, 2)}/{port}"
        while time.monotonic() < end:
            if subprocess.run(self.cmd(0, ["bash", "-c", probe]), capture_output=True).returncode == 0:
                return
            time.sleep(0.05)
        raise Failed(f"nothing listens on {self.ip(k, 2)}:{port} after {deadline} s")

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
        if self.up:
            for n in self.ns:
                sh("ip", "netns", "delete", n, check=False)
            self.up = False


HOSTS = None


def on_signal(signum, _frame):
    if HOSTS:
        HOSTS.close()
    sys.exit(128 + signum)


def run_home(argv, stdout=None, timeout=900):
    t0 = time.monotonic()
    p = subprocess.run(HOSTS.cmd(0, argv), stdout=stdout or subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    dt = time.monotonic() - t0
    if p.returncode != 0:
        raise Failed(f"{' '.join(map(str, argv))}: exit {p.returncode}: {p.stderr.decode(errors='replace').strip()[-1500:]}")
    return p, dt


def share(place, nodes, argv):
    addrs = ",".join(f"{HOSTS.ip(k, 2)}:{PORT}" for k in range(1, nodes + 1))
    return [BUNKAI, "share", "run", "--nodes", addrs, "--place", place, "--json", "--", *argv]


def json_lines(out):
    return [json.loads(l) for l in out.decode().splitlines() if l.startswith("{")]




def make_key(work):
    """A cluster key for this run only: nodes and runs inherit it."""
    key = Path(work) / "share.key"
    sh(str(BUNKAI), "share", "key", "--key", str(key), "--force")
    os.environ["BUNKAI_SHARE_KEY"] = str(key)
    return key


def start(work):
    """The hosts and a node on each; returns the Hosts."""
    global HOSTS
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    clean_stale()
    make_key(work)
    HOSTS = Hosts()
    HOSTS.start()
    for k in range(1, NODES + 1):
        HOSTS.spawn(k, [BUNKAI, "share", "node", "--listen", f"{HOSTS.ip(k, 2)}:{PORT}"],
                    stdout=subprocess.DEVNULL, stderr=open(Path(work) / f"node{k}.log", "w"))
    for k in range(1, NODES + 1):
        HOSTS.wait_port(k, PORT)
    return HOSTS
