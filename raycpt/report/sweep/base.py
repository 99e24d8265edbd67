"""Gain and forgetting against the untrained model (the sweep's ``base`` row), and the trade-off's Pareto front.

Per row (every row but base) and per metric: the row minus base with its 95% interval and p-value, by the same
rule as every comparison against ``full`` (:func:`raycpt.report.sweep.cells.compare`: one run per row - document
or question sampling, a checkpoint comparison; several runs - run-to-run noise pooled over the sweep, with the
base taken as fixed: it is not trained, so it has no run-to-run noise). The metrics:

* **gain** (the domain axis): the held-out domain loss (lower is better: gain = base - row) and, per domain task,
  the gold-probability score of each multiple-choice mode (``<mode>.prob``: gain = row - base, points);
* **forgetting** (the general axis): the general probe's loss (:mod:`raycpt.evaluate.general`: forgetting = row -
  base) and, per general task, ``<mode>.prob`` (forgetting = base - row).

Each cell keeps the raw ``delta`` (row - base, what the verdict's family decides: :mod:`raycpt.report.sweep.verdict`)
and its ``shown`` form, oriented so that a positive gain is good and a positive forgetting is bad. The first gain
metric and the first forgetting metric are the trade-off plot's axes; :func:`pareto_front` marks the rows no other
row (base included, at 0, 0) beats on both.

Pure: trial dicts in, numbers out.
"""

from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

from raycpt.report.sweep.seeds import heldout_units, question_units, run_noise
from raycpt.report.sweep.cells import (cell_value, general_loss_of, heldout_loss_of, general_units, group_trials,
                                       fixed_delta, heldout_delta, question_delta)
from raycpt.stats import DEFAULT_RESAMPLES
from raycpt.tasks import continuous_mode

BASE = "base"
MC_MODES = ("cloze", "logit")  # the modes with a gold probability, cloze first (the one a small model can use)


def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """The names of the points no other point dominates, for gain ``x`` (higher is better) against forgetting
    ``y`` (lower is better): q dominates p when q.x >= p.x and q.y <= p.y with one of them strict. Identical points
    do not dominate each other. One pass over the points sorted by x (descending), then y: O(n log n)."""
    pts = [(n, float(x), float(y)) for n, x, y in points if not (math.isnan(float(x)) or math.isnan(float(y)))]
    pts.sort(key=lambda p: (-p[1], p[2]))
    front, best_y, i = [], math.inf, 0
    while i < len(pts):
        j = i
        while j < len(pts) and pts[j][1] == pts[i][1]:
            j += 1
        group_min = pts[i][2]  # the group of equal x, sorted by y: its first has the lowest y
        if group_min < best_y:  # no point with a larger x is as low
            front += [p[0] for p in pts[i:j] if p[2] == group_min]
        best_y = min(best_y, group_min)
        i = j
    return front


def _metric(axis: str, task: str, mode: Optional[str], label: str, higher: bool, value: Callable, interval: Callable,
            units: Callable) -> dict:
    return {"axis": axis, "task": task, "mode": mode, "label": label, "higher_is_better": higher,
            "value": value, "interval": interval, "units": units}


def axis_metrics(trials: list[dict], domain: Sequence[str], general: Sequence[str],
                 resamples: int = DEFAULT_RESAMPLES) -> list[dict]:
    """The metrics read against base, gain first: the held-out loss and the general probe's loss when the trials
    have them, then ``<mode>.prob`` of each domain / general task that ran (cloze, then logit)."""
    out = []
    if any(t.get("heldout_loss") is not None for t in trials):
        out.append(_metric("gain", "heldout_loss", None, "held-out loss", False, heldout_loss_of,
                           lambda a, b: heldout_delta(a, b, resamples), heldout_units))
    out += _prob_metrics("gain", trials, domain, resamples)
    if any(t.get("general_loss") is not None for t in trials):
        out.append(_metric("forget", "general_loss", None, "general loss", False, general_loss_of,
                           lambda a, b: heldout_delta(a, b, resamples, probe="general"), general_units))
    return out + _prob_metrics("forget", trials, general, resamples)


def _prob_metrics(axis: str, trials: list[dict], tasks: Sequence[str], resamples: int) -> list[dict]:
    out = []
    for task in tasks:
        for m in MC_MODES:
            mode = continuous_mode(m, "prob")
            if any(f"{task}/average/{mode}" in (t.get("scores") or {}) for t in trials):
                out.append(_metric(axis, task, mode, f"{task} {m} P(gold)", True, cell_value(task, "average", mode),
                                   lambda a, b, task=task, mode=mode: question_delta(a, b, task, "average", mode,
                                                                                     resamples),
                                   lambda ra, rb, task=task, mode=mode: question_units(ra, rb, task, "average", mode)))
    return out


def vs_base(runs: dict, base_runs: dict, metric: dict, noise: dict) -> dict:
    """A row's runs minus the base (one fixed run: it has no run noise): :func:`raycpt.report.sweep.cells.fixed_delta`
    - with two or more runs of the row its own run variance and the shared units' error; with one, that run against
    the base on the same documents or questions."""
    return fixed_delta(runs, next(iter(base_runs.values())), metric["value"], metric["interval"], metric["units"],
                       noise)


def _shown(d: dict, metric: dict) -> dict:
    """The cell oriented for reading: gain > 0 = better than base, forgetting > 0 = worse than base."""
    good_up = metric["higher_is_better"]
    sign = 1.0 if (metric["axis"] == "gain") == good_up else -1.0
    if d.get("delta") is None:
        return {"shown": None, "shown_lo": None, "shown_hi": None}
    lo, hi = d.get("lo"), d.get("hi")
    ends = None if lo is None else sorted((sign * lo, sign * hi))
    return {"shown": sign * d["delta"], "shown_lo": ends[0] if ends else None, "shown_hi": ends[1] if ends else None}


def against_base(trials: list[dict], domain: Sequence[str] = (), general: Sequence[str] = (),
                 resamples: int = DEFAULT_RESAMPLES) -> dict:
    """``{"metrics": [{"axis", "task", "mode", "label", "higher_is_better"}], "rows": [{"name", "strategy",
    "split", "cells": [metric + delta cell + shown]}], "pareto": [names], "axes": (gain label, forgetting label)}``;
    empty metrics and rows when the sweep has no base row."""
    groups = group_trials(trials)
    base = groups.get(BASE)
    if base is None:
        return {"metrics": [], "rows": [], "pareto": [], "axes": None}
    metrics = axis_metrics(trials, domain, general, resamples)
    noise = [run_noise(groups, m["value"]) for m in metrics]
    public = [{k: m[k] for k in ("axis", "task", "mode", "label", "higher_is_better")} for m in metrics]
    rows = []
    for g in groups.values():
        if g is base:
            continue
        cells = []
        for m, pub, nz in zip(metrics, public, noise):
            d = vs_base(g["runs"], base["runs"], m, nz)
            cells.append({**pub, **d, **_shown(d, m)})
        rows.append({"name": g["name"], "strategy": g["strategy"], "split": g["split"], "cells": cells})
    return {"metrics": public, "rows": rows, **trade_off(rows, public)}


def trade_off(rows: list[dict], metrics: list[dict]) -> dict:
    """The trade-off's axes (the first gain and the first forgetting metric) and its Pareto front over the rows
    and base (at 0, 0); no front without both axes."""
    gi = next((i for i, m in enumerate(metrics) if m["axis"] == "gain"), None)
    fi = next((i for i, m in enumerate(metrics) if m["axis"] == "forget"), None)
    if gi is None or fi is None:
        return {"pareto": [], "axes": None}
    pts = [(BASE, 0.0, 0.0)] + [(r["name"], r["cells"][gi]["shown"], r["cells"][fi]["shown"]) for r in rows
                                if r["cells"][gi]["shown"] is not None and r["cells"][fi]["shown"] is not None]
    return {"pareto": pareto_front(pts), "axes": (gi, fi)}
