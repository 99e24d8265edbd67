"""``raycpt select`` artifacts: the scores per layer as a bar plot (top-k highlighted) and a CSV.

Written aside and renamed into place (:mod:`raycpt.report.trace`'s helpers); matplotlib's Agg backend."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from raycpt.report.figures import save_figure
from raycpt.report.trace import FIGURE, pyplot, write_text


def scores_csv(path: Path, scores: np.ndarray, top: Sequence[int]) -> Path:
    """``layer,score,rank,top_k`` per layer (rank 1 = best; NaN scores rank last)."""
    s = np.asarray(scores, dtype=np.float64)
    order = sorted(range(len(s)), key=lambda i: (0, -s[i], i) if np.isfinite(s[i]) else (1, 0.0, i))
    rank = {i: r + 1 for r, i in enumerate(order)}
    top = set(top)
    lines = ["layer,score,rank,top_k"] + [f"{i},{'' if not np.isfinite(v) else repr(float(v))},{rank[i]},"
                                          f"{int(i in top)}" for i, v in enumerate(s)]
    return write_text(Path(path), "\n".join(lines) + "\n")


def scores_plot(path: Path, scores: np.ndarray, top: Sequence[int], title: str) -> Path:
    """Bars of the score per decoder layer (layer 0 left); the top-k layers in a second colour."""
    plt = pyplot()
    s = np.asarray(scores, dtype=np.float64)
    fig, ax = plt.subplots(figsize=(max(5.0, 0.25 * len(s) + 2), 3.2))
    colors = ["tab:orange" if i in set(top) else "tab:blue" for i in range(len(s))]
    ax.bar(np.arange(len(s)), np.where(np.isfinite(s), s, 0.0), color=colors)
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="tab:orange", label=f"top {len(set(top))}: trained"),
                       Patch(color="tab:blue", label="other layers")], fontsize=7, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    ax.set_xlabel("decoder layer index (0-based)")
    ax.set_ylabel("selector score\n(higher = train first)")
    ax.set_title(title, fontsize=9)
    ax.set_xticks(np.arange(0, len(s), max(1, len(s) // 15)))
    return save_figure(fig, Path(path), **FIGURE)
