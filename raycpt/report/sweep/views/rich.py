"""The sweep summary in the terminal (rich tables, narrow enough for 80 columns): Table 1 per mode, the S(b)
gains, domain versus general, the runs, the verdict lines. The numbers come computed
(:mod:`raycpt.report.sweep.cells`); rich is imported when a table is drawn."""

from __future__ import annotations

from typing import Sequence

from raycpt.report.sweep.model import Row, as_summary
from raycpt.report.sweep.views.columns import RICH, Place, columns
from raycpt.report.sweep.views.format import MODE_LETTER, colour, fmt_s, mark_of, row_categories
from raycpt.report.sweep.views.markdown import NO_GENERAL, oriented_mark, not_general, verdict_markdown
from raycpt.report.sweep.cells import ordered_modes, budget_count, trials_heldout_deltas
from raycpt.tasks import is_continuous

SHORT_LABEL = {"stem": "STEM", "social_science": "Soc.Sci.", "humanities": "Human.", "other": "Other",
               "average": "Average", "overall": "All"}


def rich_table(task: str, rows: Sequence[Row], mode: str):
    """Table 1 for one mode, narrow enough for an 80-column terminal: per cell the accuracy (%, best
    marked ``*`` and bold) over its delta against ``full``, green ▲ / red ▼ only when its 95% interval
    excludes 0 (dim otherwise). The intervals themselves are in the Markdown summary and the gains and
    domain/general tables. The CLI prints one table per mode (the columns:
    :data:`raycpt.report.sweep.views.columns.COLUMNS`)."""
    from rich import box
    from rich.table import Table

    cats = [c for c in row_categories(rows) if c != "overall" and any(r.cell(c, mode) is not None for r in rows)]
    what = f"{mode} score" if is_continuous(mode) else f"{mode} mode: accuracy (%)"
    table = Table(title=f"{task}, {what}, Δ vs full below (▲▼: after multiplicity control)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    cols = columns(RICH)
    for col in cols:
        if col.per_category:
            for c in cats:
                table.add_column(SHORT_LABEL.get(c, c), justify="right", no_wrap=True)
        else:
            table.add_column(col.header(RICH), no_wrap=True)
    for r in rows:
        table.add_row(*[t for col in cols for t in ([col.text(RICH, Place(task, r, c, mode)) for c in cats]
                                                      if col.per_category else [col.text(RICH, Place(task, r))])])
    return table


def rich_trials_table(trials: list[dict], baseline: str = "full"):
    """One row per run: trainable parameters (LISA: per step, marked †), the last step's training loss, the
    held-out loss and its delta against the baseline run of the same seed (lower is better; green / red only
    when the paired bootstrap over held-out blocks excludes 0), median training tokens/s, the largest
    per-step peak memory (MB; :mod:`raycpt.train.worker.peakmem`), wall seconds."""
    from rich import box
    from rich.table import Table

    table = Table(title="runs: losses (nats/token), held-out Δ vs full", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 0, 0, 1), caption_justify="left")  # one space between columns: 8 fit 80
    for col, just in (("run", "left"), ("trainable", "right"), ("train", "right"), ("held-out", "right"),
                      ("Δ", "right"), ("tok/s", "right"), ("peak MB", "right"), ("s", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    table.caption = "\n".join(trials_table_notes(trials)) or None
    for t, (d, sign) in zip(trials, trials_heldout_deltas(trials, baseline)):
        h = t.get("heldout_loss")
        col = "dim" if d is None else colour(sign, lower_is_better=True)
        table.add_row(t["name"], _trainable_cell(t), fmt_s(t.get("final_loss")), fmt_s(h),
                      "-" if d is None else f"[{col}]{d:+.3f}[/{col}]",
                      "-" if not t.get("tokens_per_s") else f"{t['tokens_per_s']:,.0f}",
                      "-" if t.get("peak_memory_mb") is None else f"{t['peak_memory_mb']:,.0f}",
                      "-" if t.get("wall_s") is None else f"{t['wall_s']:.0f}")
    return table


def trials_table_notes(trials: list[dict]) -> list[str]:
    """The runs table's footnotes: LISA's per-step count, and peaks of trials that shared one process."""
    notes = []
    if any(t.get("trainable_per_step") for t in trials):
        notes.append("† LISA: the count one step trains (γ drawn layers, embeddings, head)")
    pids = [t.get("pid") for t in trials if t.get("peak_memory_mb") is not None and t.get("pid") is not None]
    if len(set(pids)) < len(pids):
        notes.append("peak MB: the training process's resident peak; trials here shared one process (Ray Train "
                     "local mode), so a later row includes memory earlier trials left resident: compare plans' "
                     "memory with benchmarks/bench_alternatives.py (one process per plan)")
    return notes


def _trainable_cell(t: dict) -> str:
    n = budget_count(t)
    return "-" if not n else f"{n / 1e6:.1f}M" + ("†" if t.get("trainable_per_step") else "")


def _two_lines(g: dict, key: str, digits: int = 2, lower_is_better: bool = False) -> str:
    """A gains cell: the delta (coloured, marked) over its interval."""
    v = g.get(key)
    if v is None:
        return "-"
    sign = g.get(f"{key}_sign")
    col = colour(sign, lower_is_better)
    txt = f"[{col}]{v:+.{digits}f}{mark_of(sign, lower_is_better)}[/{col}]"
    if g.get(f"{key}_lo") is not None:
        txt += f"\n[{g[f'{key}_lo']:+.{digits - 1}f},{g[f'{key}_hi']:+.{digits - 1}f}]"
    return txt


def rich_gains_table(task: str, gains: list[dict]):
    """S(b) from the trace (with its 95% interval over prompts) next to the realised gain of each split:
    train_shallow minus full and minus train_deep (average points per mode, held-out loss), each over its
    95% interval."""
    from rich import box
    from rich.table import Table

    held = any(g.get("shallow_vs_deep_heldout") is not None or g.get("shallow_vs_full_heldout") is not None
               for g in gains)
    modes = [m for m in (gains[0].get("modes") if gains else ["generate", "logit"])
             if any(g.get(f"shallow_vs_full_{m}") is not None or g.get(f"shallow_vs_deep_{m}") is not None
                    for g in gains)] or ["generate", "logit"]
    table = Table(title=f"{task}: S(b) vs realised gain of train_shallow (avg points"
                        + (", held-out loss" if held else "") + ")", box=box.SIMPLE_HEAD, pad_edge=False)
    # one row per (split, baseline, mode): three modes side by side do not fit 80 columns with intervals
    for col in ["split", "b", "S(b)", "vs", "mode", "Δ avg"] + (["Δ loss"] if held else []):
        table.add_column(col, justify="right", no_wrap=True)
    for g in gains:
        s_txt = fmt_s(g["S_b"])
        if g.get("S_b_lo") is not None:
            s_txt += f"\n[{g['S_b_lo']:.2f},{g['S_b_hi']:.2f}]"
        first = True
        for label in ("full", "deep"):
            key = f"shallow_vs_{label}"
            for j, m in enumerate(modes):
                cells = [f"{g['split']:g}" if first else "", str(g["b"] if g["b"] is not None else "-") if first else "",
                         s_txt if first else "", ("deep 1-r" if label == "deep" else label) if j == 0 else "",
                         MODE_LETTER.get(m, m), _two_lines(g, f"{key}_{m}")]
                if held:
                    cells.append(_two_lines(g, f"{key}_heldout", 3, lower_is_better=True) if j == 0 else "")
                table.add_row(*cells)
                first = False
    return table


def rich_domain_general(entries: list[dict]) -> list:
    """The domain-versus-general table for the terminal (one row per trial and mode, intervals under the
    deltas) followed by one reading line per trial."""
    from rich import box
    from rich.table import Table

    if not entries:
        return []
    d_tasks = list(dict.fromkeys(i["task"] for i in entries[0]["domain"]))
    g_tasks = list(dict.fromkeys(i["task"] for i in entries[0]["general"]))
    table = Table(title="domain vs general: Average Δ vs full (points), held-out loss Δ", box=box.SIMPLE_HEAD,
                  pad_edge=False)
    for col in ["trial", "mode"] + [f"domain {t}" for t in d_tasks] + [f"general {t}" for t in g_tasks] + ["Δ loss"]:
        table.add_column(col, justify="left" if col in ("trial", "mode") else "right", no_wrap=True)
    for e in entries:
        modes = ordered_modes({i["mode"] for role in ("domain", "general") for i in e[role]})
        for k, m in enumerate(modes):
            cells = [e["name"] if k == 0 else "", MODE_LETTER.get(m, m)]
            for role, tasks in (("domain", d_tasks), ("general", g_tasks)):
                for t in tasks:
                    item = next((i for i in e[role] if i["task"] == t and i["mode"] == m), None) or {}
                    cells.append(_two_lines({f"x{k2}": v for k2, v in
                                             (("", item.get("delta")), ("_lo", item.get("lo")),
                                              ("_hi", item.get("hi")), ("_sign", item.get("sign")))}, "x"))
            h = e.get("heldout") or {}
            cells.append(_two_lines({"x": h.get("delta"), "x_lo": h.get("lo"), "x_hi": h.get("hi"),
                                     "x_sign": h.get("sign")}, "x", 3, True) if k == 0 else "")
            table.add_row(*cells)
    return [table] + [f"{e['name']}: {e['reading']}" for e in entries]


def rich_verdict(summary) -> list[str]:
    """The verdict block for the terminal (the same lines as summary.md's, Markdown marks dropped)."""
    lines = [line.replace("**", "") for line in verdict_markdown(summary) if line]
    return lines + ([NO_GENERAL] if not_general(summary) else [])


def rich_base_table(summary) -> list:
    """Gain and forgetting against base for ``runs show``: one row per trial and metric column, the delta
    (oriented: gain > 0 better, forgetting > 0 worse) over its 95% interval, ▲ / ▼ = better / worse than base after
    multiplicity control; ★ = on the Pareto front."""
    from rich import box
    from rich.table import Table

    base = as_summary(summary).base
    metrics, rows = base.get("metrics") or [], base.get("rows") or []
    if not metrics or not rows:
        return []
    table = Table(title="gain / forgetting vs base (the untrained model)", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("trial", no_wrap=True)
    for m in metrics:
        table.add_column(f"{'gain' if m['axis'] == 'gain' else 'forget'} {m['label']}", justify="right")
    front = set(base.get("pareto") or [])
    for r in rows:
        cells = []
        for m, c in zip(metrics, r["cells"]):
            digits = 3 if m["mode"] is None else 2
            cells.append(_two_lines({"x": c.get("shown"), "x_lo": c.get("shown_lo"), "x_hi": c.get("shown_hi"),
                                     "x_sign": oriented_mark(c, m).get("sign")}, "x", digits))
        table.add_row(r["name"] + (" ★" if r["name"] in front else ""), *cells)
    return [table]
