"""What ``raycpt sweep`` prints when it ends, short enough to read: the verdict in a few lines, then one table -
per row the primary comparison against ``full`` and gain and forgetting against the untrained model, each with its
95% interval (as ``±`` the half-width: the intervals here are t-intervals, symmetric). The per-category tables, the
S(b) gains, the whole legend and the runs go to ``summary/summary.md`` and ``raycpt runs show RUN_DIR``
(:mod:`raycpt.report.sweep.views.rich`). Also the Markdown form of the gain-and-forgetting table for summary.md."""

from __future__ import annotations

from dataclasses import replace
from typing import Optional

from raycpt.report.sweep.model import Cell, as_summary
from raycpt.report.sweep.views.advice import advice_lines
from raycpt.report.sweep.views.columns import TERMINAL, Place, columns
from raycpt.report.sweep.views.format import fmt_pm
from raycpt.report.sweep.views.markdown import oriented_mark, split_words
from raycpt.report.sweep.seeds import FLOOR_HINT, SEEDS_HINT, strategy_claims_allowed
from raycpt.report.sweep.statistics import CHECKPOINT
from raycpt.report.sweep.family import HELDOUT

MAX_AXES = 3  # gain / forgetting columns in the terminal table (the rest: summary.md)


def compact_verdict(summary) -> list[str]:
    """The verdict in a few short lines: the horizon (issue 47) first, then what to do
    (:func:`raycpt.report.sweep.views.advice.advice_lines`: the row the verdict supports in layer numbers, whether
    that is a strategy claim or the point estimates' leader, the next command, the trace's split if untrained), the
    primary comparison's tally, the trade-off's Pareto front, S(b) (only with two or more splits). ``summary``: a
    :class:`~raycpt.report.sweep.model.Summary` or its JSON form."""
    summary = as_summary(summary)
    v = summary.verdict
    lines = [summary.horizon] if summary.horizon else []  # issue 47: may this ranking be acted on?
    allowed = strategy_claims_allowed(summary)  # issue 50: no ▲ / ▼ and no best without run noise measured
    advice = advice_lines(summary)  # issue 48: what to do, how sure, the next command
    lines += advice
    if v.get("claim") == CHECKPOINT and not advice:
        lines.append(f"One run per row: each Δ compares two checkpoints, shown with its interval and no marks or best "
                     f"(run-to-run noise not measured: {SEEDS_HINT} or {FLOOR_HINT} for strategy claims).")
    prim = [c for c in v.get("comparisons", []) if c.get("primary")]
    if prim and allowed:
        worse = sum(c["sign"] == (1 if c["task"] == HELDOUT else -1) for c in prim)
        better = sum(c["sign"] == (-1 if c["task"] == HELDOUT else 1) for c in prim)
        lines.append(f"Primary {v.get('primary')} vs full ({v.get('adjust')}, {v.get('family_size')} comparisons, "
                     f"error <= {v.get('alpha', 0.05):g}): {better} ▲ better, {worse} ▼ worse, "
                     f"{len(prim) - better - worse} no clear change.")
    elif prim and not advice:
        lines.append(f"Primary {v.get('primary')} vs full: each row's Δ below with its checkpoint interval.")
    elif not prim:
        lines.append(f"Primary comparison: {v.get('primary') or 'none declared'} - not evaluated in this sweep.")
    base = summary.base
    if base.get("axes"):
        lines.append(f"Gain vs forgetting against base (summary/tradeoff.png): Pareto front of the point estimates "
                     f"{', '.join(base['pareto']) or '-'}.")
    elif base.get("rows") is not None and not base.get("rows"):
        lines.append("No base row (sweep.include_base=false): gain and forgetting are not measured.")
    lines += split_words(summary)[:1]
    return lines


def _shown(cell: dict) -> Optional[Cell]:
    """A gain / forgetting cell against base as the terminal shows it (row − base oriented: ``shown``), None without
    a Δ."""
    if not cell or cell.get("delta") is None:
        return None
    return Cell(delta=cell.get("shown", cell["delta"]), lo=cell.get("shown_lo", cell.get("lo")),
                hi=cell.get("shown_hi", cell.get("hi")), sign=cell.get("sign"))


def _axis_columns(base: dict) -> list[int]:
    """The terminal's gain / forgetting columns: the trade-off's two axes, then the next metrics, at most
    :data:`MAX_AXES`, gain first."""
    metrics = base.get("metrics") or []
    first = list(base.get("axes") or [])
    rest = [i for i in range(len(metrics)) if i not in first]
    order = sorted(first + rest[:max(0, MAX_AXES - len(first))], key=lambda i: (metrics[i]["axis"] != "gain", i))
    return order[:MAX_AXES]


def _header(m: dict) -> str:
    """A short column head (the table's caption says which task and mode): ``gain loss``, ``gain P(gold)``,
    ``forget loss``, ``forget P(gold)``."""
    return f"{'gain' if m['axis'] == 'gain' else 'forget'} {'loss' if m['mode'] is None else 'P(gold)'}"


def _caption(metrics: list[dict], cols: list[int]) -> str:
    """What each gain / forgetting column reads, in words."""
    words = []
    for i in cols:
        m = metrics[i]
        if m["mode"] is None:
            what = {"heldout_loss": "held-out domain loss", "general_loss": "general-text loss"}.get(m["task"], m["task"])
            how = "base − row" if m["axis"] == "gain" else "row − base"
            words.append(f"{_header(m)}: {what}, {how} (nats)")
        else:
            how = "row − base" if m["axis"] == "gain" else "base − row"
            words.append(f"{_header(m)}: {m['label']}, {how} (points)")
    return "; ".join(words)


def compact_table(summary):
    """One line per row: the primary comparison against full (the held-out loss: its Δ; a task/mode: points), then
    gain and forgetting against base (± half of the 95% interval; ▲ / ▼ only after multiplicity control: ▲ better,
    ▼ worse than base). The base row's Δ against full is left unmarked (not in the family: full against base says it)."""
    from rich import box
    from rich.table import Table

    summary = as_summary(summary)
    base = summary.base
    cols = _axis_columns(base)
    metrics = base.get("metrics") or []
    by_row = {r["name"]: r for r in base.get("rows", [])}
    marks = strategy_claims_allowed(summary)  # checkpoint comparisons: Δ and interval, no ▲ / ▼ (issue 50)
    table = Table(title="held-out loss Δ vs full; gain / forgetting vs base (± 95%" + ("; ▲▼ better/worse)" if marks
                                                                                     else ")"),
                  box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, 1), title_justify="left",
                  caption=_caption(metrics, cols) or None, caption_justify="left")
    own = columns(TERMINAL)  # the main table's: the row and its held-out Δ vs full
    for k, col in enumerate([c.header(TERMINAL) for c in own] + [_header(metrics[i]) for i in cols]):
        table.add_column(col, justify="left" if k == 0 else "right", no_wrap=True)
    first = summary.first_rows()

    def pm(cell: Optional[Cell], digits: int, **kw) -> str:
        return fmt_pm(cell if marks or cell is None else cell.unmarked(), digits, **kw)
    for r in first:
        shown = r if marks or r.heldout_delta is None else replace(r, heldout_delta=r.heldout_delta.unmarked())
        cells = [c.text(TERMINAL, Place("", shown)) for c in own]
        if r.strategy == "base":  # its Δ against full is full's gain read backwards: unmarked
            cells += ["0 (ref)"] * len(cols)
        else:
            row = by_row.get(r.name) or {"cells": [{}] * len(metrics)}
            for i in cols:
                c = row["cells"][i] if i < len(row["cells"]) else {}
                cells.append(pm(_shown(oriented_mark(c, metrics[i])), 3 if metrics[i]["mode"] is None else 2))
        table.add_row(*cells)
    return table
