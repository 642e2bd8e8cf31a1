"""Helpers the bench/flow harnesses share (imported from beside them:
python3 puts a script's own directory first on sys.path)."""
import os
import socket
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUNKAI = os.path.join(ROOT, "build/bin/bunkai")
LIB = os.path.join(ROOT, "build/lib/bunkai")
ASPECTS = os.path.join(ROOT, "tests/programs/flow/aspects")
# what a woven server is started with: the host library and flow's runtime
PRELOAD = f"{LIB}/libbunkai-host.so {LIB}/libbunkai-flow.so"


def wait_port(port, proc, who, deadline=20.0):
    """Polls 127.0.0.1:port until proc (a server started as who) accepts
    a connection; SystemExit with one line if proc ends first or nothing
    listens by the deadline (seconds)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            err = proc.stderr.read()[-500:] if proc.stderr else ""
            raise SystemExit(f"{who} exited ({proc.returncode}) before it listened on {port}{': ' + err if err else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit(f"{who}: nothing listens on 127.0.0.1:{port} after {deadline:.0f} s")


def sh(*argv, **kw):
    """Runs a command; its stdout, or CalledProcessError."""
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kw).stdout


def write_result(path, lines):
    """Writes the lines as one markdown file, through a temporary file and a
    rename (never half-written); returns the text."""
    text = "\n".join(lines) + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)
    return text


def cpu_ns(pid):
    """CPU time the process's threads have run, in ns (schedstat)."""
    t = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            t += int(open(f"/proc/{pid}/task/{tid}/schedstat").read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return t


def kill_all(procs):
    """Ends the processes a harness started that still run."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def paired_ratio(xs, bases):
    """The median of each round's ratio to that round's baseline: the
    machine's drift between rounds cancels."""
    return statistics.median(x / b for x, b in zip(xs, bases))


def paired_diff(xs, bases):
    """The median of each round's difference from that round's baseline."""
    return statistics.median(x - b for x, b in zip(xs, bases))


def verdict(loss, noise, target):
    """PASS, MISS, or not resolved, with the noise floor (baseline against
    baseline: one sample of the measurement's error, which may come out
    small by chance) as the error: MISS when even loss - noise exceeds the
    target; PASS only with twice the floor of margin, loss + 2 * noise
    within the target."""
    if loss - noise > target:
        return "MISS"
    if loss + 2 * noise <= target:
        return "PASS"
    return f"not resolved: this run's noise floor is {100 * noise:.1f}%"


def paper_target(filtered, unfiltered, noise, lead="Target"):
    """Table 3's throughput target as the paper measured it (seed 003 §5.2:
    Apache served 382 requests/s with flow management and without it, both
    logging): the loss of flow-filtered against unfiltered logging, each
    round's ratio paired. lead begins the line."""
    loss = 1 - paired_ratio(filtered, unfiltered)
    return (f"- {lead}, as the paper measured it (§5.2: the same 382 requests/s with flow management and without, "
            f"both logging): throughput loss of flow-filtered against unfiltered logging <= 2%: {100 * loss:+.1f}% "
            f"(noise floor {100 * noise:.1f}%): **{verdict(loss, noise, 0.02)}**")
