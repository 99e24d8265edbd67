"""The sweep summary's figures: average score per row and mode, the training-loss curves overlaid, the held-out
loss against trainable parameters, gain against forgetting (matplotlib Agg, PNG through
:func:`raycpt.report.figures.save_figure`). Each ``draw_*`` returns the Figure (what the tests read back); each
``plot_*`` draws and saves it. Units on every axis: percent, nats per token, millions of parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from raycpt.report.figures import save_figure
from raycpt.report.sweep.model import Cell, Row, as_rows
from raycpt.report.sweep.views.format import table_modes
from raycpt.report.sweep.cells import budget_count
from raycpt.tasks import is_continuous

COLOURS = {"base": "grey", "full": "black", "train_shallow": "tab:blue", "train_deep": "tab:orange"}
OTHER = "tab:green"  # any other strategy
NATS = "nats per token"
INTERVAL = "95% interval"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def mode_words(mode: str) -> str:
    """A score key as a legend entry with its unit: ``cloze: accuracy (%)``, ``cloze.prob: P(gold answer) (%)``."""
    return f"{mode}: mean probability of the gold answer (%)" if is_continuous(mode) else f"{mode}: accuracy (%)"


def draw_bars(task: str, rows: Sequence[Row]):
    """Average over categories per row (x) and mode (bars), the mean over a row's seeds; whiskers: the 95%
    t-interval over seeds where a row has several; full's value per mode a grey line."""
    import numpy as np

    plt = _plt()
    rows = as_rows(rows)
    names = [r.name for r in rows]
    modes = table_modes(rows)
    fig, ax = plt.subplots(figsize=(max(9.0, 1.1 * len(names) + 4), 4.6))
    x = np.arange(len(names))
    width = 0.8 / max(1, len(modes))
    whiskers = False
    for k, m in enumerate(modes):
        cells = [r.cell("average", m) or Cell() for r in rows]
        vals = [c.value or 0.0 for c in cells]
        err = [((c.value - c.value_lo) if c.value_lo is not None else 0.0) for c in cells]
        whiskers = whiskers or any(err)
        ax.bar(x + (k - (len(modes) - 1) / 2) * width, vals, width=width, label=mode_words(m),
               yerr=err if any(err) else None, error_kw={"ecolor": "black", "capsize": 3})
    full = next((r for r in rows if r.name == "full"), None)
    if full is not None:
        for m, ls in zip(modes, ("--", ":", "-.")):
            v = (full.cell("average", m) or Cell()).value
            if v is not None:
                ax.axhline(v, color="grey", ls=ls, lw=1, label=f"full, {m}")
    if whiskers:
        ax.errorbar([], [], yerr=[], color="black", capsize=3, ls="none", label=f"whiskers: {INTERVAL} over seeds")
    seeds = sorted({len(r.seeds or ()) for r in rows} - {0})
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_xlabel("row (bars: mean over its seeds" + (f", {'/'.join(map(str, seeds))} seeds)" if seeds else ")"))
    ax.set_ylabel("average over categories (%)")
    ax.set_title(f"{task}: average score per row and mode")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig


def plot_bars(path: Path, task: str, rows: Sequence[Row]) -> Path:
    return save_figure(draw_bars(task, rows), path, dpi=120, bbox_inches="tight")


def draw_losses(trials: list[dict]):
    """Training loss per optimizer step, one line per run (trial and seed)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    n = 0
    for t in trials:
        if t.get("losses"):
            ax.plot(range(1, len(t["losses"]) + 1), t["losses"], label=t["name"], lw=1.4)
            n += 1
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(f"training loss ({NATS})")
    ax.set_title("Training loss per run (one line per trial and seed)")
    ax.grid(alpha=0.3)
    if n:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), ncol=1 if n <= 16 else 2)
    fig.tight_layout()
    return fig


def plot_losses(path: Path, trials: list[dict]) -> Path:
    return save_figure(draw_losses(trials), path, dpi=120, bbox_inches="tight")


def _runs_by_row(trials: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for t in trials:
        if t.get("heldout_loss") is not None and budget_count(t):
            out.setdefault(t.get("group") or t["name"], []).append(t)
    return out


def draw_heldout(trials: list[dict]):
    """Held-out loss against trainable parameters, one marker per run coloured by strategy, each row named once
    (beside the mean of its runs): plans with the same number of trainable parameters line up vertically (e.g.
    train_shallow at r vs train_deep at 1-r), so the lower one is the better allocation of the same budget."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    seen: set[str] = set()
    for row, runs in _runs_by_row(trials).items():
        strat = runs[0].get("strategy") or row
        xs, ys = [budget_count(t) / 1e6 for t in runs], [t["heldout_loss"] for t in runs]
        ax.scatter(xs, ys, color=COLOURS.get(strat, OTHER), s=36, zorder=3,
                   label=None if strat in seen else f"{strat} (one point per run)")
        seen.add(strat)
        split = runs[0].get("split")
        ax.annotate(f"r={split:g}" if split is not None else row, (sum(xs) / len(xs), sum(ys) / len(ys)),
                    fontsize=8, xytext=(6, 0), textcoords="offset points", va="center")
    ax.set_xlabel("trainable parameters (millions; LISA: per step)")
    ax.set_ylabel(f"held-out loss ({NATS})")
    ax.set_title("Held-out loss against trainable parameters (lower is better)")
    ax.grid(alpha=0.3)
    if seen:
        ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_heldout(path: Path, trials: list[dict]) -> Path:
    return save_figure(draw_heldout(trials), path, dpi=120)


TRADEOFF_PNG = "tradeoff.png"


def interval_words(method: Optional[str]) -> str:
    """What an interval is taken over, from a cell's ``method``: ``runs per plan + documents`` -> ``over seeds and
    documents``, ``t over documents`` -> ``over documents``; another method in parentheses."""
    if not method:
        return ""
    m = method.replace("runs per plan", "seeds").replace(" + ", " and ")
    for p in ("paired t over ", "t over "):
        if m.startswith(p):
            m = m[len(p):]
    return f"over {m}" if m != method or "runs per plan" in method else f"({method})"


def _whisker_label(cells: list[dict]) -> str:
    gain = {interval_words(g.get("method")) for g, _ in cells if g.get("shown_lo") is not None}
    forget = {interval_words(f.get("method")) for _, f in cells if f.get("shown_lo") is not None}
    if gain == forget and len(gain) == 1:
        return f"whiskers: {INTERVAL} {gain.pop()}"
    over = [", ".join(sorted(s)) or "-" for s in (gain, forget)]
    return f"whiskers: {INTERVAL} (gain {over[0]}; forgetting {over[1]})"


def draw_tradeoff(base: dict):
    """Domain gain (x) against forgetting (y), both against the untrained model, one point per row with its 95%
    interval bars (:func:`raycpt.report.sweep.base.against_base`), the base at the origin, the Pareto front (no row
    gains more while forgetting less) marked and joined. Better is right and down."""
    from matplotlib.lines import Line2D

    plt = _plt()
    gi, fi = base["axes"]
    gm, fm = base["metrics"][gi], base["metrics"][fi]
    front = set(base["pareto"])
    fig, ax = plt.subplots(figsize=(8, 5.2))
    pts, cells, strategies = [("base", 0.0, 0.0)], [], []
    for r in base["rows"]:
        g, f = r["cells"][gi], r["cells"][fi]
        if g["shown"] is None or f["shown"] is None:
            continue
        x, y = g["shown"], f["shown"]
        xerr = [[x - g["shown_lo"]], [g["shown_hi"] - x]] if g.get("shown_lo") is not None else None
        yerr = [[y - f["shown_lo"]], [f["shown_hi"] - y]] if f.get("shown_lo") is not None else None
        on = r["name"] in front
        ax.errorbar([x], [y], xerr=xerr, yerr=yerr, fmt="*" if on else "o", ms=12 if on else 6, capsize=3,
                    color=COLOURS.get(r["strategy"], OTHER), zorder=3)
        ax.annotate(r["name"], (x, y), fontsize=8, xytext=(5, 4), textcoords="offset points")
        pts.append((r["name"], x, y))
        cells.append((g, f))
        strategies += [] if r["strategy"] in strategies else [r["strategy"]]
    ax.scatter([0], [0], marker="*" if "base" in front else "s", s=120 if "base" in front else 40, color="grey",
               zorder=3)
    ax.annotate("base", (0, 0), fontsize=8, xytext=(5, -10), textcoords="offset points")
    handles = [Line2D([], [], color=COLOURS.get(s, OTHER), marker="o", ls="none", label=s) for s in strategies]
    handles.append(Line2D([], [], color="grey", marker="s", ls="none", label="base (the untrained model, origin)"))
    line = sorted((p for p in pts if p[0] in front), key=lambda p: p[1])
    if line:
        handles.append(Line2D([], [], color="grey", marker="*", ms=10, ls="none", label="on the Pareto front"))
    if len(line) > 1:
        handles.append(ax.plot([p[1] for p in line], [p[2] for p in line], color="tab:red", lw=1, ls="--", zorder=2,
                               label="Pareto front of the point estimates")[0])
    if any(g.get("shown_lo") is not None or f.get("shown_lo") is not None for g, f in cells):
        handles.append(Line2D([], [], color="black", marker="|", ms=10, ls="-", lw=1, label=_whisker_label(cells)))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.axhline(0, color="grey", lw=0.8)
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_xlabel(f"domain gain vs base: {axis_words(gm)}")
    ax.set_ylabel(f"forgetting vs base: {axis_words(fm)}")
    ax.set_title("Each row against the untrained base: gain against forgetting\n(better = right and down)", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_tradeoff(path: Path, base: dict) -> Path:
    return save_figure(draw_tradeoff(base), path, dpi=120, bbox_inches="tight")


def axis_words(m: dict) -> str:
    """An axis of the trade-off with its unit: a loss in nats per token, a gold probability in percentage points."""
    if m["mode"] is None:
        return f"{m['label']} {'base − row' if m['axis'] == 'gain' else 'row − base'} ({NATS})"
    return f"{m['label']} {'row − base' if m['axis'] == 'gain' else 'base − row'} (percentage points)"
