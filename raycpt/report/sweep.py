"""Sweep summary: the paper's Table-1 layout with deltas against ``full``, S(b) next to the realised
gain of each split, a bar chart per strategy and split, and the loss curves overlaid.

``summary_table`` and ``split_gains`` are pure (unit-tested by recomputing from trial metrics);
``write_summary`` writes CSV / Markdown / JSON / PNG files and logs them to the parent MLflow run.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Optional

CATEGORY_ORDER = ["stem", "social_science", "humanities", "other", "average", "overall"]
CATEGORY_LABEL = {"stem": "STEM", "social_science": "Social Science", "humanities": "Humanities", "other": "Other",
                  "average": "Average", "overall": "All questions"}
MODES = ("generate", "logit")


def parse_cells(scores: dict[str, float]) -> dict[str, dict[str, dict[str, float]]]:
    """``{"task/category/mode": x}`` -> ``{task: {category: {mode: x}}}``."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for key, value in scores.items():
        parts = key.split("/")
        if len(parts) != 3:
            continue
        task, cat, mode = parts
        out.setdefault(task, {}).setdefault(cat, {})[mode] = float(value)
    return out


def _categories(cells: dict[str, dict[str, float]]) -> list[str]:
    known = [c for c in CATEGORY_ORDER if c in cells]
    return known + sorted(c for c in cells if c not in CATEGORY_ORDER)


def summary_table(trials: list[dict], baseline: str = "full") -> dict[str, list[dict]]:
    """Per task: one row per trial with each cell's value, its delta against ``baseline`` and a best mark.

    Row = ``{"name", "strategy", "split", "cells": {category: {mode: {"value", "delta", "best"}}}}``.
    ``delta`` is None for the baseline row itself or when there is no baseline; ``best`` marks the
    highest value of each (category, mode) column across trials (ties all marked).
    """
    parsed = {t["name"]: parse_cells(t["scores"]) for t in trials}
    tasks = sorted({task for cells in parsed.values() for task in cells})
    tables: dict[str, list[dict]] = {}
    for task in tasks:
        base = parsed.get(baseline, {}).get(task)
        cats: list[str] = []
        for t in trials:
            for c in _categories(parsed[t["name"]].get(task, {})):
                if c not in cats:
                    cats.append(c)
        best: dict[tuple[str, str], float] = {}
        for t in trials:
            for c in cats:
                for m, v in parsed[t["name"]].get(task, {}).get(c, {}).items():
                    best[(c, m)] = max(best.get((c, m), -math.inf), v)
        rows = []
        for t in trials:
            cells = parsed[t["name"]].get(task, {})
            row_cells: dict[str, dict[str, dict[str, Any]]] = {}
            for c in cats:
                for m in MODES:
                    if m not in cells.get(c, {}):
                        continue
                    v = cells[c][m]
                    d = None
                    if base is not None and t["name"] != baseline and m in base.get(c, {}):
                        d = v - base[c][m]
                    row_cells.setdefault(c, {})[m] = {"value": v, "delta": d, "best": v >= best[(c, m)] - 1e-12}
            rows.append({"name": t["name"], "strategy": t.get("strategy"), "split": t.get("split"), "cells": row_cells,
                         "final_loss": t.get("final_loss"), "heldout_loss": t.get("heldout_loss")})
        tables[task] = rows
    return tables


def _avg(trial: dict, task: str, mode: str) -> Optional[float]:
    return parse_cells(trial["scores"]).get(task, {}).get("average", {}).get(mode)


def split_gains(trials: list[dict], split_scores: dict[str, float], task: str, baseline: str = "full") -> list[dict]:
    """For each split: S(b) from the trace next to the realised gains (average score, both modes).

    ``shallow_vs_full`` = train_shallow - full, ``shallow_vs_deep`` = train_shallow - train_deep; a positive
    S(b) predicts positive ``shallow_vs_deep``. With held-out losses, ``*_heldout`` are the loss
    differences (negative = shallow lower).
    """
    by_name = {t["name"]: t for t in trials}
    full = by_name.get(baseline)
    splits = sorted({t["split"] for t in trials if t.get("split") is not None})
    rows = []
    for r in splits:
        sh = next((t for t in trials if t.get("strategy") == "train_shallow" and t.get("split") == r), None)
        dp = next((t for t in trials if t.get("strategy") == "train_deep" and t.get("split") == r), None)
        row: dict[str, Any] = {"split": r, "b": (sh or dp or {}).get("b"), "S_b": split_scores.get(f"{float(r):g}")}
        for m in MODES:
            s_v = _avg(sh, task, m) if sh else None
            d_v = _avg(dp, task, m) if dp else None
            f_v = _avg(full, task, m) if full else None
            row[f"shallow_vs_full_{m}"] = (s_v - f_v) if s_v is not None and f_v is not None else None
            row[f"shallow_vs_deep_{m}"] = (s_v - d_v) if s_v is not None and d_v is not None else None
        # held-out loss differences (negative = the shallow plan reached a lower loss)
        s_h, d_h, f_h = ((t or {}).get("heldout_loss") for t in (sh, dp, full))
        row["shallow_vs_full_heldout"] = (s_h - f_h) if s_h is not None and f_h is not None else None
        row["shallow_vs_deep_heldout"] = (s_h - d_h) if s_h is not None and d_h is not None else None
        rows.append(row)
    return rows


def _fmt(v: Optional[float], sign: bool = False) -> str:
    """Scores are percentages already (as the eval bridge reports them)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:+.2f}" if sign else f"{v:.2f}"


def _fmt_s(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


def table_markdown(task: str, rows: list[dict]) -> str:
    """Markdown: cells ``G / L (ΔG / ΔL)`` in percent, best marked with ``*``."""
    cats: list[str] = []
    for r in rows:
        for c in r["cells"]:
            if c not in cats:
                cats.append(c)
    losses = _loss_columns(rows)
    head = ("| model | " + " | ".join(CATEGORY_LABEL.get(c, c) for c in cats) + " |"
            + "".join(f" {label} |" for _, label in losses))
    lines = [f"**{task}** — Generate / Logit accuracy (%), Δ against full in brackets, * = best", "", head,
             "|" + "---|" * (len(cats) + 1 + len(losses))]
    for r in rows:
        cells = []
        for c in cats:
            cc = r["cells"].get(c, {})
            g, lo = cc.get("generate"), cc.get("logit")
            txt = " / ".join(_fmt(x["value"]) + ("*" if x["best"] else "") for x in (g, lo) if x is not None)
            deltas = [x["delta"] for x in (g, lo) if x is not None and x["delta"] is not None]
            if deltas:
                txt += " (" + " / ".join(_fmt(d, sign=True) for d in deltas) + ")"
            cells.append(txt or "-")
        cells += [_fmt_s(r.get(key)) for key, _ in losses]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _loss_columns(rows: list[dict], short: bool = False) -> list[tuple[str, str]]:
    """The loss columns present: the last training step's loss and the held-out loss."""
    cols = [("final_loss", "loss" if short else "final loss"), ("heldout_loss", "held-out" if short else "held-out loss")]
    return [(k, label) for k, label in cols if any(r.get(k) is not None for r in rows)]


SHORT_LABEL = {"stem": "STEM", "social_science": "Soc.Sci.", "humanities": "Human.", "other": "Other",
               "average": "Average", "overall": "All"}


def rich_table(task: str, rows: list[dict], mode: str):
    """Table 1 for one mode, narrow enough for an 80-column terminal: per cell the accuracy (%, best
    marked ``*`` and bold) over its delta against ``full`` (green up, red down). Losses are in
    :func:`rich_trials_table`. The CLI prints one table per mode; Markdown/CSV hold both side by side."""
    from rich import box
    from rich.table import Table

    cats: list[str] = []
    for r in rows:
        for c in r["cells"]:
            if c not in cats and c != "overall" and mode in r["cells"][c]:
                cats.append(c)
    table = Table(title=f"{task}, {mode} mode: accuracy (%), Δ vs full below", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    table.add_column("trial", no_wrap=True)
    for c in cats:
        table.add_column(SHORT_LABEL.get(c, c), justify="right", no_wrap=True)
    for r in rows:
        cells = []
        for c in cats:
            x = r["cells"].get(c, {}).get(mode)
            if x is None:
                cells.append("-")
                continue
            txt = _fmt(x["value"]) + ("*" if x["best"] else " ")
            txt = f"[bold]{txt}[/bold]" if x["best"] else txt
            d = x["delta"]
            if d is not None:
                colour = "green" if d > 0 else ("red" if d < 0 else "dim")
                txt += f"\n[{colour}]{_fmt(d, sign=True)} [/{colour}]"
            cells.append(txt)
        table.add_row(r["name"], *cells)
    return table


def rich_trials_table(trials: list[dict], baseline: str = "full"):
    """One row per trial: trainable parameters, the last step's training loss, the held-out loss and
    its delta against ``baseline`` (lower is better), wall time."""
    from rich import box
    from rich.table import Table

    base = next((t.get("heldout_loss") for t in trials if t["name"] == baseline), None)
    table = Table(title="trials: losses (nats/token), held-out Δ vs full", box=box.SIMPLE_HEAD, pad_edge=False)
    for col, just in (("trial", "left"), ("trainable", "right"), ("train loss", "right"), ("held-out", "right"),
                      ("Δ held-out", "right"), ("seconds", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    for t in trials:
        h = t.get("heldout_loss")
        d = None if h is None or base is None or t["name"] == baseline else h - base
        colour = "dim" if d is None or d == 0 else ("green" if d < 0 else "red")
        table.add_row(t["name"], f"{t['trainable_params'] / 1e6:.1f}M" if t.get("trainable_params") else "-",
                      _fmt_s(t.get("final_loss")), _fmt_s(h),
                      "-" if d is None else f"[{colour}]{d:+.3f}[/{colour}]",
                      "-" if t.get("wall_s") is None else f"{t['wall_s']:.0f}")
    return table


def rich_gains_table(task: str, gains: list[dict]):
    """S(b) from the trace next to the realised gain of each split (average score, both modes)."""
    from rich.table import Table

    from rich import box

    held = any(g.get("shallow_vs_deep_heldout") is not None for g in gains)
    table = Table(title=f"{task}: S(b) vs realised gain (avg points G / L" + (", held-out loss" if held else "") + ")",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    cols = ["split", "b", "S(b)", "shallow−full", "shallow−deep"] + (["loss sh−full", "loss sh−deep"] if held else [])
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    for g in gains:
        cells = [f"{g['split']:g}", str(g["b"]), _fmt_s(g["S_b"]),
                 f"{_fmt(g['shallow_vs_full_generate'], sign=True)}/{_fmt(g['shallow_vs_full_logit'], sign=True)}",
                 f"{_fmt(g['shallow_vs_deep_generate'], sign=True)}/{_fmt(g['shallow_vs_deep_logit'], sign=True)}"]
        if held:
            cells += [_fmt_loss_delta(g.get("shallow_vs_full_heldout")), _fmt_loss_delta(g.get("shallow_vs_deep_heldout"))]
        table.add_row(*cells)
    return table


def _fmt_loss_delta(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.3f}"


def _csv(task: str, rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["task", "model", "strategy", "split", "category", "mode", "accuracy", "delta_vs_full", "best"])
    for r in rows:
        for c, modes in r["cells"].items():
            for m, x in modes.items():
                w.writerow([task, r["name"], r["strategy"], r["split"], c, m, x["value"], x["delta"], x["best"]])
    return buf.getvalue()


def plot_bars(path: Path, task: str, trials: list[dict]) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [t["name"] for t in trials]
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    x = np.arange(len(names))
    for k, m in enumerate(MODES):
        vals = [(_avg(t, task, m) or 0.0) for t in trials]
        ax.bar(x + (k - 0.5) * 0.38, vals, width=0.38, label=m)
    full = next((t for t in trials if t["name"] == "full"), None)
    if full is not None:
        for m, ls in zip(MODES, ("--", ":")):
            v = _avg(full, task, m)
            if v is not None:
                ax.axhline(v, color="grey", ls=ls, lw=1)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("average accuracy (%)")
    ax.set_title(f"{task}: average score per strategy and split (grey: full)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


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
        if t.get("heldout_loss") is None or not t.get("trainable_params"):
            continue
        strat = t.get("strategy") or t["name"]
        x, y = t["trainable_params"] / 1e6, t["heldout_loss"]
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_summary(run_dir: Path, trials: list[dict], trace: Optional[dict], num_layers: int,
                  parent_run_id: Optional[str] = None, tracking=None) -> dict:
    """Write the summary files into ``run_dir/summary`` and log them to the parent run."""
    from raycpt.io import atomic_write_json, atomic_write_text

    out = Path(run_dir) / "summary"
    out.mkdir(parents=True, exist_ok=True)
    tables = summary_table(trials)
    split_scores = (trace or {}).get("split_scores", {})
    md = []
    gains_all = {}
    files = []
    for task, rows in tables.items():
        md.append(table_markdown(task, rows))
        gains = split_gains(trials, split_scores, task)
        gains_all[task] = gains
        if gains:
            md.append("")
            md.append(f"**{task}** — S(b) from the trace next to the realised gain (average, percentage points)")
            md.append("")
            md.append("| split | b | S(b) | shallow−full G / L | shallow−deep G / L | held-out loss shallow−full "
                      "| held-out loss shallow−deep |")
            md.append("|---|---|---|---|---|---|---|")
            for g in gains:
                md.append(f"| {g['split']:g} | {g['b']} | {_fmt_s(g['S_b'])} | "
                          f"{_fmt(g['shallow_vs_full_generate'], sign=True)} / {_fmt(g['shallow_vs_full_logit'], sign=True)} | "
                          f"{_fmt(g['shallow_vs_deep_generate'], sign=True)} / {_fmt(g['shallow_vs_deep_logit'], sign=True)} | "
                          f"{_fmt_loss_delta(g.get('shallow_vs_full_heldout'))} | "
                          f"{_fmt_loss_delta(g.get('shallow_vs_deep_heldout'))} |")
        md.append("")
        files.append(atomic_write_text(out / f"table_{task}.csv", _csv(task, rows)))
        files.append(plot_bars(out / f"scores_{task}.png", task, trials))
    files.append(plot_losses(out / "loss_curves.png", trials))
    if any(t.get("heldout_loss") is not None for t in trials):
        files.append(plot_heldout(out / "heldout_loss.png", trials))
    files.append(atomic_write_text(out / "summary.md", "\n".join(md)))
    summary = {"tables": tables, "split_gains": gains_all, "num_layers": num_layers,
               "recommended_split": (trace or {}).get("recommended_split"),
               "trials": [{k: v for k, v in t.items() if k != "losses"} for t in trials]}
    files.append(atomic_write_json(out / "summary.json", summary))
    if parent_run_id and tracking is not None:
        import mlflow

        mlflow.set_tracking_uri(tracking.uri)
        client = mlflow.tracking.MlflowClient()
        for f in files:
            client.log_artifact(parent_run_id, str(f), artifact_path="summary")
        for a in (trace or {}).get("artifacts", []):
            if Path(a).is_file():
                client.log_artifact(parent_run_id, a, artifact_path="trace")
        for task, gains in gains_all.items():
            for g in gains:
                if g["S_b"] is not None:
                    client.log_metric(parent_run_id, f"S_b/{g['split']:g}", g["S_b"])
    return summary
