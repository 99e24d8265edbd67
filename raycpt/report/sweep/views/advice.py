"""What a sweep's verdict tells a person to do (issue 48): the row the verdict supports in layer numbers ("train
layers 0–9, freeze 10–29 (train_shallow r = 0.33)"), what it is worth against ``full`` with its interval, how sure
that is (a strategy claim when run-to-run noise was measured; otherwise the point estimates' leader over single
checkpoints, "not a decision", with the command that would decide), the next command, and the trace's recommended
split when the sweep did not train it. Also the Markdown description of the sweep's MLflow run and the one-line
description of each trial's run.

Pure: a summary (:func:`raycpt.report.sweep.summary.build_summary`, with ``num_layers`` and ``recommended_split`` as
:func:`~raycpt.report.sweep.summary.write_summary` adds them) in, text out."""

from __future__ import annotations

from typing import Optional
from urllib.parse import quote

from raycpt.report.sweep import family
from raycpt.report.sweep.model import Cell, Row, Summary, as_summary
from raycpt.report.sweep.base import BASE
from raycpt.report.sweep.seeds import FLOOR_HINT, strategy_claims_allowed
from raycpt.report.sweep.views.format import fmt_p
from raycpt.runs.records import RUN_ID_MARK
from raycpt.splits import split_index

SHALLOW, DEEP, FULL = "train_shallow", "train_deep", "full"
NOTE = "mlflow.note.content"
"""The run tag MLflow shows as a run's description (Markdown)."""
MAX_NOTE = 4900  # the description tag's length (records project tags cut to 5000 characters)


def _span(a: int, b: int) -> str:
    """Layers a..b inclusive in words: ``layer 4`` or ``layers 0–9``."""
    return f"layer {a}" if a == b else f"layers {a}–{b}"


def layer_words(strategy: str, split: Optional[float], num_layers: Optional[int], name: str = "") -> str:
    """A row's plan in layer numbers: train_shallow at r trains [0, b), train_deep [b, N)
    (:func:`raycpt.splits.split_index` gives b); ``full`` every layer; any other plan by its name."""
    label = f"{strategy} r = {split:g}" if split is not None else (name or strategy)
    if strategy == FULL:
        return f"train all {num_layers} layers (full)" if num_layers else "train every layer (full)"
    if strategy in (SHALLOW, DEEP) and split is not None and num_layers:
        b = split_index(split, num_layers)
        first, rest = (_span(0, b - 1), _span(b, num_layers - 1))
        second = rest.removeprefix("layers ") if first.startswith("layers ") else rest  # "layers 0–9, freeze 10–29"
        return (f"train {first}, freeze {second}" if strategy == SHALLOW else f"freeze {first}, train {second}") + \
            f" ({label})"
    return f"train the {label} plan" if split is not None else f"train the {name or strategy} plan"


def train_command(strategy: str, split: Optional[float]) -> str:
    """``raycpt train`` of one row's plan (the sweep's config, its plan set on the command line)."""
    return f"raycpt train CONFIG plan.name={strategy}" + (f" plan.split={split:g}" if split is not None else "")


def _pm(cell: Optional[Cell], digits: int = 3) -> Optional[str]:
    if cell is None or cell.delta is None:
        return None
    txt = f"{cell.delta:+.{digits}f}"
    if cell.lo is not None and cell.hi is not None:
        txt += "±" + f"{(cell.hi - cell.lo) / 2:.{digits}f}".lstrip("0")
    return txt


def _primary(summary: Summary) -> dict:
    """The metric the leader is picked on: the declared primary when it ran, else the held-out loss."""
    v = summary.verdict
    p = family.parse_primary(v.get("primary")) if v.get("primary_found") else None
    return p or {"task": family.HELDOUT, "mode": None}


def _rows(summary: Summary) -> list[Row]:
    """The trained rows that may lead: not base, not untuned (issue 47: a rate at its grid's edge claims nothing)."""
    untuned = set(summary.verdict.get("untuned") or ())
    return [r for r in summary.first_rows() if r.strategy != BASE and r.name not in untuned]


def _value(summary: Summary, row: Row, primary: dict) -> Optional[float]:
    """A row's primary value, oriented so that larger is better."""
    if primary["task"] == family.HELDOUT:
        return None if row.heldout_loss is None else -row.heldout_loss
    for r in summary.tables.get(primary["task"], ()):
        if r.name == row.name:
            return (r.cell("average", primary["mode"]) or Cell()).value
    return None


def _cell(summary: Summary, row: Row, primary: dict) -> Optional[Cell]:
    """The row's primary Δ against full."""
    if primary["task"] == family.HELDOUT:
        return row.heldout_delta
    for r in summary.tables.get(primary["task"], ()):
        if r.name == row.name:
            return r.cell("average", primary["mode"])
    return None


def worth(summary, row: Row, primary: dict) -> str:
    """What the row is worth: its primary Δ and its general-loss Δ against full with their 95% intervals; full's
    own against base (row − base: a negative loss Δ is better)."""
    summary = as_summary(summary)
    if row.strategy == FULL:
        base = {r["name"]: r for r in summary.base.get("rows", [])}.get(row.name)
        cells = {c["task"]: Cell.delta_of(c) for c in (base or {}).get("cells", []) if c.get("mode") is None}
        parts = [f"{w} {_pm(cells.get(t))}" for t, w in ((family.HELDOUT, "held-out"), ("general_loss", "general"))
                 if _pm(cells.get(t))]
        return f"loss Δ vs base: {', '.join(parts)} nats" if parts else ""
    unit = "nats" if primary["task"] == family.HELDOUT else "points"
    what = "held-out loss" if primary["task"] == family.HELDOUT else f"{primary['task']}/{primary['mode']}"
    parts = [f"{what} {_pm(_cell(summary, row, primary), 3 if unit == 'nats' else 2)} {unit}"] \
        if _pm(_cell(summary, row, primary)) else []
    if primary["task"] == family.HELDOUT and _pm(row.general_delta):
        parts.append(f"general loss {_pm(row.general_delta)} nats")
    return f"Δ vs full: {', '.join(parts)}" if parts else ""


def _runs(summary: Summary) -> int:
    """The most runs of any trained row."""
    return max([r.runs for r in _rows(summary)] or [1])


def _seeds_command(summary: Summary) -> str:
    """The sweep with twice as many runs per row (three when it had one)."""
    n = _runs(summary)
    return f"raycpt sweep CONFIG sweep.seeds=[{','.join(str(i) for i in range(3 if n < 2 else 2 * n))}]"


def recommendation(summary) -> Optional[dict]:
    """``{"row", "words", "worth", "claim", "lines"}``: the row the verdict supports and the lines that say it; None
    when no trained row has a value on the primary metric. ``summary``: a :class:`~raycpt.report.sweep.model.Summary`
    or its JSON form."""
    summary = as_summary(summary)
    v = summary.verdict
    primary = _primary(summary)
    rows = [r for r in _rows(summary) if _value(summary, r, primary) is not None]
    if not rows:
        return None
    metric = v.get("primary") if v.get("primary_found") else family.HELDOUT
    best = v.get("best") if strategy_claims_allowed(summary) else None
    decided = best is not None and best.get("best") is not None
    by_name = {r.name: r for r in rows}
    row = by_name.get(best["best"]) if decided else None
    decided = row is not None
    row = row or max(rows, key=lambda r: _value(summary, r, primary))
    words = layer_words(row.strategy, row.split, summary.num_layers, row.name)
    value = worth(summary, row, primary)
    tail = f"; {value}" if value else ""
    if decided:
        lines = [f"Recommended on {metric}: {words}{tail}. A strategy claim: it beats every row (largest p = "
                 f"{fmt_p(best['p'])} of {best['pairs']} pairs, {row.runs} runs per row).",
                 f"Next: train it at scale: {train_command(row.strategy, row.split)} (a larger "
                 "train.max_steps)."]
    elif strategy_claims_allowed(summary):
        why = (f"no row beats every other (top vs {best['runner_up']}: p = {fmt_p(best['p'])})"
               if best else "no row beats every other")
        lines = [f"Leader on {metric} (point estimate, not a decision): {words}{tail}; {why}.",
                 f"To decide: more runs per row, {_seeds_command(summary)}."]
    else:
        lines = [f"Leader on {metric} (point estimate, not a decision): {words}{tail}.",
                 f"One run per row compares checkpoints, not strategies; to decide: {_seeds_command(summary)} (or "
                 f"{FLOOR_HINT})." if _runs(summary) < 2 else
                 f"Run-to-run noise not measured for every row; to decide: {_seeds_command(summary)}."]
    return {"row": row.name, "words": words, "worth": value, "claim": "strategy" if decided else "point estimate",
            "lines": lines}


def trace_split_line(summary) -> Optional[str]:
    """The trace's recommended split when the sweep trained no train_shallow row at it, with the command that
    does; None when it did (or there was no trace)."""
    summary = as_summary(summary)
    r = summary.recommended_split
    if r is None:
        return None
    trained = {float(x.split) for x in summary.first_rows() if x.strategy == SHALLOW and x.split is not None}
    if any(abs(float(r) - s) < 1e-9 for s in trained):
        return None
    words = layer_words(SHALLOW, float(r), summary.num_layers)
    return f"The trace's recommended split r = {float(r):g} ({words.split(' (')[0]}) was not trained in this " \
           f"sweep: raycpt sweep CONFIG --splits {float(r):g}"


def advice_lines(summary) -> list[str]:
    """The recommendation, how sure it is and the next command, then the untrained trace split (if any)."""
    summary = as_summary(summary)
    rec = recommendation(summary)
    lines = rec["lines"] if rec else []
    trace = trace_split_line(summary)
    return lines + ([trace] if trace else [])


def artifact_image(path: str, alt: str) -> str:
    """Markdown for a picture among the run's own artifacts, as MLflow's run page shows it: the page renders the
    description as Markdown and keeps ``<img src>`` with a relative URL, which the browser resolves against the
    server (static prefix included) to its ``get-artifact`` endpoint. The run id is filled in when the tag reaches
    MLflow (:data:`raycpt.runs.records.RUN_ID_MARK`)."""
    return f"![{alt}](get-artifact?path={quote(path, safe='')}&run_uuid={RUN_ID_MARK})"


def run_description(summary, verdict_lines: list[str], command: str = "raycpt sweep CONFIG",
                    figure: Optional[str] = None) -> str:
    """The sweep's MLflow description (``mlflow.note.content``, Markdown): the question, the recommendation, the
    trade-off picture (``figure``: its artifact path, when the sweep drew it), the verdict's lines, where the rest
    is."""
    rec = recommendation(summary)
    out = ["### Which decoder layers to train?", "",
           "A `raycpt sweep`: `full`, `train_shallow` and `train_deep` at each split trained and evaluated against "
           "`full` and the untrained `base`.", ""]
    if rec:
        out += [f"**{'Recommended' if rec['claim'] == 'strategy' else 'Leader (point estimate, not a decision)'}:** "
                f"{rec['words']}" + (f" — {rec['worth']}" if rec["worth"] else ""), ""]
    if figure:
        out += [artifact_image(figure, f"Gain vs forgetting against base ({figure})"), ""]
    out += ["**Verdict**", ""] + [f"- {ln}" for ln in verdict_lines] + ["",
            f"Rerun: `{command}`. Tables: `summary/summary.md`; trade-off: `summary/tradeoff.png`; per-cell "
            "deltas: `summary/deltas.json`."]
    text = "\n".join(out)
    return text if len(text) <= MAX_NOTE else text[:MAX_NOTE - 1] + "…"


def trial_description(strategy: str, split: Optional[float], num_layers: Optional[int], lr, seed) -> str:
    """A trial run's one-line description: its plan, the layers it trains, its learning rate and seed."""
    if strategy == BASE:
        return "The untrained model (base row): evaluated only, nothing trained."
    words = layer_words(strategy, split, num_layers, strategy)
    return f"Sweep trial: {words}; lr {lr:g}; seed {seed}." if isinstance(lr, (int, float)) else \
        f"Sweep trial: {words}; lr {lr}; seed {seed}."
