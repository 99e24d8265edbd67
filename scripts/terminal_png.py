"""Render a captured terminal output (a text file, e.g. what ``raycpt sweep`` printed) as a PNG, for the README.

    COLUMNS=100 raycpt sweep configs/default.yaml ... > sweep.txt
    python scripts/terminal_png.py sweep.txt docs/img/sweep_summary.png [--from 'domain vs general'] [--lines 60]

Monospace text on a dark background (matplotlib and DejaVu Sans Mono, which has the box-drawing characters rich
uses); ``--from`` starts at the first line containing that text, ``--lines`` keeps that many lines."""

from __future__ import annotations

import argparse
import re
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("text")
    ap.add_argument("png")
    ap.add_argument("--from", dest="start", default=None)
    ap.add_argument("--lines", type=int, default=80)
    a = ap.parse_args()
    lines = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", open(a.text, encoding="utf-8").read()).splitlines()
    if a.start:
        lines = lines[next(i for i, ln in enumerate(lines) if a.start in ln):]
    lines = lines[:a.lines]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    width = max(len(ln) for ln in lines)
    fig = plt.figure(figsize=(0.075 * width + 0.4, 0.16 * len(lines) + 0.4), dpi=110)
    fig.patch.set_facecolor("#1e1e1e")
    fig.text(0.01, 0.99, "\n".join(lines), family="DejaVu Sans Mono", fontsize=9, color="#e8e8e8", va="top",
             linespacing=1.25)
    fig.savefig(a.png, facecolor=fig.get_facecolor())
    print(f"{a.png}: {len(lines)} lines x {width} columns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
