"""Helpers the bench/flow harnesses share (imported from beside them:
python3 puts a script's own directory first on sys.path)."""
import os
import statistics
import subprocess


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
