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
