"""Reports of the hybrid commands: every build's LayerTracer profiles over its segment map (a plot), and a
build's segment table and parameter counts (the terminal).

One panel per build: normalised TP (Task Particle) and LS (Layer-wise Sensitivity) against the
layer index, with each segment shaded by its kind and frozen segments hatched - so the paper's
question (where do the pretrained layers sit, and where does the task evidence consolidate?) can be
read off one figure. PNG via matplotlib's Agg backend, written aside and renamed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rich.table import Table

from raycpt.report.figures import save_figure

PALETTE = ["tab:blue", "tab:orange", "tab:purple", "tab:brown", "tab:olive", "tab:cyan"]


def segments_of(layer_kinds: Sequence[str], trainable: Sequence[int]) -> list[tuple[int, int, str, bool]]:
    """Runs of equal (kind, trainable) over the layers: ``[(start, end, kind, trainable), ...]``."""
    train = set(trainable)
    out: list[tuple[int, int, str, bool]] = []
    for i, k in enumerate(layer_kinds):
        t = i in train
        if out and out[-1][2] == k and out[-1][3] == t and out[-1][1] == i:
            out[-1] = (out[-1][0], i + 1, k, t)
        else:
            out.append((i, i + 1, k, t))
    return out


def plot_profiles(results: Sequence[dict], path: Path) -> Path:
    """``results``: dicts with ``name``, ``layer_kinds``, ``trainable_layers`` and
    ``trace: {tp_norm, ls_norm}`` (what :func:`raycpt.jobs.hybrid.run_hybrid` collects)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    kinds = list(dict.fromkeys(k for r in results for k in r["layer_kinds"]))
    colors = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(kinds)}
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.8 * max(1, len(results))), squeeze=False)
    for ax, r in zip(axes[:, 0], results):
        n = len(r["layer_kinds"])
        for a, b, kind, train in segments_of(r["layer_kinds"], r["trainable_layers"]):
            ax.axvspan(a - 0.5, b - 0.5, color=colors[kind], alpha=0.12, hatch=None if train else "//",
                       ec="gray", lw=0)
            ax.text((a + b - 1) / 2, 1.08, f"{kind} {'train' if train else 'frozen'}", ha="center", fontsize=7)
        tp = np.asarray(r["trace"]["tp_norm"], dtype=float)
        ls = np.asarray(r["trace"]["ls_norm"], dtype=float)
        x = np.arange(len(tp))
        ax.plot(x, tp, "-o", color="tab:green", ms=3, label="TP^ (mean Ratio, normalised)")
        ax.plot(x, ls, "-s", color="tab:red", ms=3, label="LS^ (mean dJS, normalised)")
        ax.set_xlim(-0.5, n - 0.5)
        ax.set_ylim(-0.05, 1.18)
        ax.set_xticks(range(n))
        ax.tick_params(axis="x", labelsize=7)
        ax.set_ylabel(f"{r.get('name', r.get('build', ''))}\nmin-max normalised", fontsize=8)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    axes[-1, 0].set_xlabel("decoder layer index i (0-based; shaded: segment kind; hatched: frozen)")
    fig.suptitle("hybrid builds: LayerTracer profiles over the segment map (one panel per build)", fontsize=10)
    return save_figure(fig, path, format="png", dpi=120, bbox_inches="tight")


def segment_table(b):
    """rich Table: segment, kind, layers, source, trainable, params."""
    t = Table(title=f"{b.display} ({b.build})  ->  {b.folder}")
    for col in ("segment", "kind", "layers", "source", "trainable", "params"):
        t.add_column(col, justify="right" if col == "params" else "left")
    for r in b.rows:
        tr = "-" if r["trainable"] is None else ("yes" if r["trainable"] else "frozen")
        t.add_row(str(r["segment"]), str(r["kind"]), str(r["layers"]), str(r["source"]), tr, f"{r['params']:,}")
    return t


def counts_line(b) -> str:
    """One line of a built hybrid's parameter counts (a :class:`raycpt.jobs.hybrid.BuiltHybrid`)."""
    c = b.counts
    share = 100.0 * c["trainable_layers"] / c["total"] if c["total"] else 0.0
    return (f"{b.build}: {c['total']:,} parameters; trainable segments {c['trainable_layers']:,} ({share:.1f}%), "
            f"frozen segments {c['frozen_layers']:,}, embeddings/norm/head {c['other']:,}; "
            f"trainable layers {b.trainable_layers}")
