"""Helpers the bench/flow harnesses share (imported from beside them:
python3 puts a script's own directory first on sys.path)."""
import os
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
