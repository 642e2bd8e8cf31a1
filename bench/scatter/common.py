"""Helpers the bench/scatter harnesses share (imported from beside them:
python3 puts a script's own directory first on sys.path)."""
import json
import os


def write_atomic(path, text):
    """Writes text to path whole or not at all: a temporary file beside it,
    renamed over it (an interrupted run leaves the last results intact)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp_out = path + ".tmp"
    with open(tmp_out, "w") as f:
        f.write(text)
    os.replace(tmp_out, path)


def write_results(out, text, json_path=None, data=None):
    """A benchmark's end: its markdown to out, its raw figures as JSON to
    json_path when one was asked for, both written whole; the markdown on
    stdout."""
    write_atomic(out, text)
    if json_path:
        write_atomic(json_path, json.dumps(data, indent=1))
    print(text, end="")
