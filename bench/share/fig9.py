#!/usr/bin/env python3
"""Figure 9 of seed 002, drawn with matplotlib: read(2) of 1-32 KiB, plain
(A) and forwarded to the home host (C), median µs per size.

run.py calls draw() with the numbers it measured. Run alone, this redraws
bench/results/share-fig9.svg from the table in bench/results/share.md,
without running the benchmark:

  python3 bench/share/fig9.py [share.md [out.svg]]
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

PAPER_PAGE_US = 400  # §6.2: one page transfer, about 0.4 ms
DEBIAN_PYTHON = "/usr/bin/python3"


def draw(fig, per_page_us, path):
    """fig: {"A": {KiB: µs}, "C": {KiB: µs}}; writes an SVG to path (via a
    temporary file and a rename). matplotlib is Debian's
    (python3-matplotlib, scripts/install-deps.sh): under another python3
    (a pyenv one first on PATH) that cannot import it, Debian's
    /usr/bin/python3 draws it."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        if sys.executable == DEBIAN_PYTHON or not os.path.exists(DEBIAN_PYTHON):
            raise SystemExit("fig9: matplotlib is missing (install python3-matplotlib: scripts/install-deps.sh)")
        data = {"fig": {m: {str(k): v for k, v in fig[m].items()} for m in fig}, "per_page_us": per_page_us, "path": str(path)}
        subprocess.run([DEBIAN_PYTHON, __file__, "--json"], input=json.dumps(data), text=True, check=True)
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    plt.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "bunkai-share-fig9", "font.size": 10})
    sizes = sorted(fig["C"])
    f, ax = plt.subplots(figsize=(6.4, 4.0))
    for mode, colour, label in (
        ("C", "#c0392b", f"forwarded (C): +{per_page_us:.0f} µs per extra 4 KiB page (paper: ~{PAPER_PAGE_US} µs)"),
        ("A", "#2c3e50", "plain (A): the read on the home host"),
    ):
        ax.plot(sizes, [fig[mode][k] for k in sizes], marker="o", markersize=4, color=colour, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("read size [KiB]")
    ax.set_ylabel("median time per call [µs] (log scale)")
    ax.set_title("Figure 9: read(2) forwarded to the home host, then the buffer read", fontsize=11)
    ax.grid(True, which="major", color="#dddddd", linewidth=0.8)
    ax.legend(loc="center right", fontsize=8.5, frameon=False)
    f.tight_layout()
    path = Path(path)
    tmp = path.with_suffix(".svg.tmp")
    f.savefig(tmp, format="svg", metadata={"Date": None, "Creator": None})
    plt.close(f)
    tmp.replace(path)


def from_markdown(md):
    """The Figure 9 table and the per-page slope, as share.md states them."""
    text = Path(md).read_text()
    sec = text.split("## Figure 9", 1)[1]
    rows = [l for l in sec.splitlines() if l.startswith("|")]
    sizes = [int(c) for c in rows[0].strip("|").split("|")[1:]]
    fig = {}
    for r in rows[2:4]:
        cells = [c.strip() for c in r.strip("|").split("|")]
        mode = "A" if "(A)" in cells[0] else "C"
        fig[mode] = dict(zip(sizes, (float(c) for c in cells[1:])))
    m = re.search(r"Each 4 KiB beyond the first page adds (\d+(?:\.\d+)?) µs", sec)
    if not m or set(fig) != {"A", "C"}:
        raise SystemExit(f"{md}: no Figure 9 table or per-page slope found")
    return fig, float(m.group(1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--json"]:  # from draw() under another python3
        d = json.load(sys.stdin)
        draw({m: {int(k): v for k, v in d["fig"][m].items()} for m in d["fig"]}, d["per_page_us"], d["path"])
        sys.exit(0)
    results = Path(__file__).resolve().parents[1] / "results"
    md = Path(sys.argv[1]) if len(sys.argv) > 1 else results / "share.md"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else md.with_name("share-fig9.svg")
    fig, slope = from_markdown(md)
    draw(fig, slope, out)
    print(f"fig9: {out} from {md}")
