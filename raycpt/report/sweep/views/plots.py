"""The sweep summary's figures: average accuracy per cell and mode, the loss curves overlaid, the held-out loss
against trainable parameters (matplotlib Agg, PNG through :func:`raycpt.report.figures.save_figure`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from raycpt.report.figures import save_figure
from raycpt.report.sweep.model import Cell, Row
from raycpt.report.sweep.views.format import table_modes
from raycpt.report.sweep.cells import budget_count

def plot_bars(path: Path, task: str, rows: Sequence[Row]) -> Path:
    """Average accuracy per cell and mode (error bars: the 95% interval over seeds when there are several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r.name for r in rows]
    modes = table_modes(rows)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    x = np.arange(len(names))
    width = 0.8 / max(1, len(modes))
    for k, m in enumerate(modes):
        cells = [r.cell("average", m) or Cell() for r in rows]
        vals = [c.value or 0.0 for c in cells]
        err = [((c.value - c.value_lo) if c.value_lo is not None else 0.0) for c in cells]
        ax.bar(x + (k - (len(modes) - 1) / 2) * width, vals, width=width, label=m, yerr=err if any(err) else None)
    full = next((r for r in rows if r.name == "full"), None)
    if full is not None:
        for m, ls in zip(modes, ("--", ":", "-.")):
            v = (full.cell("average", m) or Cell()).value
            if v is not None:
                ax.axhline(v, color="grey", ls=ls, lw=1)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("average accuracy (%)")
    ax.set_title(f"{task}: average score per strategy and split (grey: full)")
    ax.legend()
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def plot_losses(path: Path, trials: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for t in trials:
        if t.get("losses"):
            ax.plot(range(1, len(t["losses"]) + 1), t["losses"], label=t["name"], lw=1.4)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("training loss")
    ax.set_title("Loss curves")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def plot_heldout(path: Path, trials: list[dict]) -> Path:
    """Held-out loss against trainable parameters, one marker per trial coloured by strategy: plans with
    the same number of trainable parameters line up vertically (e.g. train_shallow at r vs train_deep
    at 1-r), so the lower one is the better allocation of the same budget."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours = {"full": "black", "train_shallow": "tab:blue", "train_deep": "tab:orange"}
    seen: set[str] = set()
    for t in trials:
        if t.get("heldout_loss") is None or not budget_count(t):
            continue
        strat = t.get("strategy") or t["name"]
        x, y = budget_count(t) / 1e6, t["heldout_loss"]
        ax.scatter([x], [y], color=colours.get(strat, "tab:green"), s=40, zorder=3,
                   label=None if strat in seen else strat)
        seen.add(strat)
        ax.annotate(f"r={t['split']:g}" if t.get("split") is not None else t["name"], (x, y), fontsize=8,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("trainable parameters (M)")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.set_title("Held-out loss per trial (lower is better)")
    ax.grid(alpha=0.3)
    if seen:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


TRADEOFF_PNG = "tradeoff.png"


def plot_tradeoff(path: Path, base: dict) -> Path:
    """Domain gain (x) against forgetting (y), both against the untrained model, one point per row with its 95%
    interval bars (:func:`raycpt.report.sweep.base.against_base`), the base at the origin, the Pareto front (no row
    gains more while forgetting less) marked and joined. Better is right and down."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gi, fi = base["axes"]
    gm, fm = base["metrics"][gi], base["metrics"][fi]
    front = set(base["pareto"])
    fig, ax = plt.subplots(figsize=(7.5, 5))
    colours = {"full": "black", "train_shallow": "tab:blue", "train_deep": "tab:orange"}
    pts = [("base", 0.0, 0.0)]
    for r in base["rows"]:
        g, f = r["cells"][gi], r["cells"][fi]
        if g["shown"] is None or f["shown"] is None:
            continue
        x, y = g["shown"], f["shown"]
        xerr = [[x - g["shown_lo"]], [g["shown_hi"] - x]] if g.get("shown_lo") is not None else None
        yerr = [[y - f["shown_lo"]], [f["shown_hi"] - y]] if f.get("shown_lo") is not None else None
        on = r["name"] in front
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="*" if on else "o", ms=12 if on else 6, capsize=3,
                    color=colours.get(r["strategy"], "tab:green"), zorder=3)
        ax.annotate(r["name"], (x, y), fontsize=8, xytext=(5, 4), textcoords="offset points")
        pts.append((r["name"], x, y))
    ax.scatter([0], [0], marker="*" if "base" in front else "s", s=120 if "base" in front else 40, color="grey",
               zorder=3)
    ax.annotate("base", (0, 0), fontsize=8, xytext=(5, -10), textcoords="offset points")
    line = sorted((p for p in pts if p[0] in front), key=lambda p: p[1])
    if len(line) > 1:
        ax.plot([p[1] for p in line], [p[2] for p in line], color="tab:red", lw=1, ls="--", zorder=2,
                label="Pareto front of the point estimates (★)")
        ax.legend(fontsize=8, loc="best")
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"domain gain vs base: {_axis_words(gm)}")
    ax.set_ylabel(f"forgetting vs base: {_axis_words(fm)}")
    ax.set_title("Gain against forgetting (95% intervals; better = right and down)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, path, dpi=120)


def _axis_words(m: dict) -> str:
    if m["mode"] is None:
        return f"{m['label']} {'base − row' if m['axis'] == 'gain' else 'row − base'} (nats/token)"
    return f"{m['label']} {'row − base' if m['axis'] == 'gain' else 'base − row'} (points)"
