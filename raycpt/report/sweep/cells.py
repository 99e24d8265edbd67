"""The sweep summary's numbers (pure): per-task tables of each cell's value and its delta against ``full``
with a 95% interval, the realised gains of each split, and what the runs table and the verdict read off them.

Tests and intervals (:mod:`raycpt.stats`): one seed - exact McNemar with the score interval over
questions (per-question records of each trial's ``eval_result.json``, matched by question id), a t over
documents (or blocks) for the held-out loss: checkpoint comparisons; with run-to-run noise measured (some row
has two runs: ``sweep.seeds``) - the strategy test of :mod:`raycpt.report.sweep.seeds`. The ``sign`` set here is the interval's alone; the verdict (:mod:`raycpt.report.sweep.verdict`)
replaces it by the adjusted decision.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Optional

from raycpt.report.sweep.model import as_summary
from raycpt.report.sweep.outcomes import load_outcomes
from raycpt.splits import equal_count_split
import numpy as np

from raycpt.report.sweep.seeds import has_run_noise, heldout_units, question_units, run_noise
from raycpt.report.sweep.statistics import METHOD_RUNS
from raycpt.stats import (DEFAULT_RESAMPLES, Interval, paired_accuracy_delta, paired_mean_t, ratio_delta_t,
                          seed_interval, stratified_mcnemar_p, stratified_paired_delta, welch_run_test)
from raycpt.tasks import is_continuous

CATEGORY_ORDER = ["stem", "social_science", "humanities", "other", "average", "overall"]
MODES = ("generate", "logit", "cloze")  # display order; any other mode in the records follows, sorted


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


def _matched(a: dict, b: dict, task: str, cat: str, mode: str):
    """(ids, a's 0/1, b's 0/1, categories) on the questions both trials answered, or None without outcomes."""
    oa = (a.get("outcomes") or {}).get(task, {}).get(mode)
    ob = (b.get("outcomes") or {}).get(task, {}).get(mode)
    if not oa or not ob:
        return None
    ids = [q for q in oa if q in ob and (cat in ("average", "overall") or oa[q][0] == cat)]
    if not ids:
        return None
    return ids, [oa[q][1] for q in ids], [ob[q][1] for q in ids], [oa[q][0] for q in ids]


def question_delta(a: dict, b: dict, task: str, cat: str, mode: str, resamples: int = DEFAULT_RESAMPLES,
                   seed: int = 0) -> Optional[Interval]:
    """Accuracy of trial ``a`` minus trial ``b`` (points) on the questions both answered (matched by id):
    within category ``cat``, over all (``overall``), or the mean of the category deltas (``average``).

    A continuous score (``cloze.prob``, :data:`raycpt.tasks.CONTINUOUS`): the paired t over questions
    (:func:`raycpt.stats.paired_mean_t`). 0/1 outcomes on the same questions: the exact McNemar p-value and the continuity-corrected score
    interval (:func:`raycpt.stats.paired_accuracy_delta`, coverage shown by ``bench_calibration.py``). The
    Average column with categories of equal size *is* the all-questions accuracy and gets the same; with
    unequal categories it gets the stratified bootstrap (each category resampled within itself) and a
    stratified McNemar z-test (normal approximation): exploratory. None without outcomes."""
    m = _matched(a, b, task, cat, mode)
    if m is None:
        return None
    _, x, y, cats = m
    if is_continuous(mode):  # a continuous score per question: the paired t (stratified for unequal categories)
        unequal = cat == "average" and len(set(Counter(cats).values())) > 1
        return paired_mean_t(x, y, cats if unequal else None)
    if cat == "average" and len(set(Counter(cats).values())) > 1:
        iv = stratified_paired_delta(x, y, cats, resamples, seed, scale=100.0)
        return replace(iv, p=stratified_mcnemar_p(x, y, cats))
    return paired_accuracy_delta(x, y, scale=100.0)


def heldout_delta(a: dict, b: dict, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, probe: str = "heldout"
                  ) -> Optional[Interval]:
    """Held-out loss of ``a`` minus ``b``, token-weighted over the held-out blocks, with a t-interval over
    documents (``heldout_docs``: the document of each block, when the result carries them; over blocks
    otherwise): :func:`raycpt.stats.ratio_delta_t`, coverage shown by ``bench_calibration.py``. ``probe="general"``:
    the same for the general probe's blocks (``general_blocks``, ``general_docs``)."""
    la, lb = a.get(f"{probe}_blocks"), b.get(f"{probe}_blocks")
    if not la or not lb or len(la) != len(lb):
        return None
    docs = a.get(f"{probe}_docs")
    docs = docs if docs is not None and len(docs) == len(la) else None
    return ratio_delta_t(la, lb, clusters=docs, weights=a.get(f"{probe}_weights"))


# ------------------------------------------------------------------------------------------ trials and seeds
def group_trials(trials: list[dict]) -> dict[str, dict]:
    """``{cell name: {"name", "strategy", "split", "b", "runs": {seed: trial}}}`` in first-seen order; a
    cell is a trial's ``group`` (its name without ``-s<seed>``), its seed ``seed`` (None for old results)."""
    out: dict[str, dict] = {}
    for t in trials:
        g = t.get("group") or t["name"]
        cell = out.setdefault(g, {"name": g, "strategy": t.get("strategy"), "split": t.get("split"), "b": t.get("b"),
                                  "runs": {}})
        cell["runs"][t.get("seed")] = t
    return out


def delta_cell(iv: Optional[Interval], point: Optional[float]) -> dict:
    """A comparison's cell: delta, interval, ``sign`` (the interval alone: +1 / -1 when it excludes 0; the
    summary replaces it by the adjusted decision, :mod:`raycpt.report.sweep.family`), ``p`` (two-sided, of no
    difference), method and units."""
    if point is None:
        return {"delta": None, "lo": None, "hi": None, "sign": None, "method": None, "n": 0, "p": None}
    if iv is None or math.isnan(iv.lo):
        return {"delta": point, "lo": None, "hi": None, "sign": None, "method": None, "n": 0, "p": None}
    return {"delta": point, "lo": iv.lo, "hi": iv.hi, "sign": iv.sign(), "method": iv.method, "n": iv.n, "p": iv.p}


def compare(runs_a: dict, runs_b: dict, value: Callable[[dict], Optional[float]],
            interval: Callable[[dict, dict], Optional[Interval]],
            units: Optional[Callable[[list, list], Optional[tuple]]] = None, noise: Optional[dict] = None) -> dict:
    """``value(a) - value(b)`` for two rows' runs.

    With two or more runs of both rows (``noise``: :func:`raycpt.report.sweep.seeds.run_noise`, df > 0): a strategy
    claim, :func:`run_test` (each row's own run variance). Otherwise one run each, that difference with
    ``interval(a, b)`` (a checkpoint comparison: document or question sampling), paired by seed. Returns
    ``{"delta", "lo", "hi", "sign", "method", "n", "p"}`` (:func:`delta_cell`)."""
    va = [(sd, value(t)) for sd, t in runs_a.items()]
    vb = [(sd, value(t)) for sd, t in runs_b.items()]
    va, vb = [(sd, v) for sd, v in va if v is not None], [(sd, v) for sd, v in vb if v is not None]
    if not va or not vb:
        return delta_cell(None, None)
    if has_run_noise(noise) and len(va) > 1 and len(vb) > 1:
        return run_test([v for _, v in va], [v for _, v in vb],
                        units([runs_a[sd] for sd, _ in va], [runs_b[sd] for sd, _ in vb]) if units else None)
    shared = [sd for sd, _ in va if sd in runs_b and value(runs_b[sd]) is not None]
    if len(shared) != 1:
        return delta_cell(None, None) if not shared else delta_cell(None, float(np.mean(
            [value(runs_a[sd]) - value(runs_b[sd]) for sd in shared])))
    sd = shared[0]
    return delta_cell(interval(runs_a[sd], runs_b[sd]), value(runs_a[sd]) - value(runs_b[sd]))


def run_test(va: list[float], vb: Optional[list[float]], units: Optional[tuple]) -> dict:
    """Mean of a's runs minus mean of b's (``vb`` None: b is one fixed run, the untrained model, value 0 here:
    pass ``va`` already minus it) by :func:`raycpt.stats.welch_run_test`: each row's own run variance plus the
    shared units' sampling error ``units`` = (variance, df, method) (None: run noise alone)."""
    var, df, method = units or (0.0, math.inf, METHOD_RUNS)
    point = float(np.mean(va) - (np.mean(vb) if vb is not None else 0.0))
    vbar = (float(np.var(vb, ddof=1)), len(vb)) if vb is not None else (0.0, math.inf)
    iv = welch_run_test(point, float(np.var(va, ddof=1)), len(va), vbar[0], vbar[1], var, df, method=method)
    return delta_cell(iv, point)


def fixed_delta(runs: dict, fixed: dict, value, interval, units, noise: Optional[dict]) -> dict:
    """A row's runs minus one fixed run (the untrained model: no run noise of its own): with two or more runs of
    the row, :func:`run_test` with the reference fixed; with one, that run against it on the same units."""
    vb = value(fixed)
    va = [(sd, value(t)) for sd, t in runs.items() if value(t) is not None]
    if vb is None or not va:
        return delta_cell(None, None)
    point = sum(v for _, v in va) / len(va) - vb
    if has_run_noise(noise) and len(va) > 1:
        return run_test([v - vb for _, v in va], None, units([runs[sd] for sd, _ in va], [fixed]) if units else None)
    if len(va) != 1:
        return delta_cell(None, point)
    return delta_cell(interval(runs[va[0][0]], fixed), point)


def negated(d: dict) -> dict:
    """b - a from a - b: the delta and its interval mirrored."""
    if d.get("delta") is None:
        return d
    lo, hi = d.get("lo"), d.get("hi")
    return {**d, "delta": -d["delta"], "lo": None if hi is None else -hi, "hi": None if lo is None else -lo,
            "sign": None if d.get("sign") is None else -d["sign"]}


def cell_value(task: str, cat: str, mode: str) -> Callable[[dict], Optional[float]]:
    return lambda t: parse_cells(t["scores"]).get(task, {}).get(cat, {}).get(mode)


def mean_of(runs: dict, value: Callable[[dict], Optional[float]]) -> dict:
    iv = seed_interval([v for v in (value(t) for t in runs.values()) if v is not None])
    if iv.n == 0:
        return {"value": None}
    return {"value": iv.point, "value_lo": None if math.isnan(iv.lo) else iv.lo,
            "value_hi": None if math.isnan(iv.hi) else iv.hi, "seeds": iv.n}


def ordered_modes(names) -> list[str]:
    names = set(names)
    return [m for m in MODES if m in names] + sorted(names - set(MODES))


def _task_cells(groups: dict, task: str) -> tuple[list[str], list[str]]:
    cats: list[str] = []
    modes: set[str] = set()
    for g in groups.values():
        for t in g["runs"].values():
            cells = parse_cells(t["scores"]).get(task, {})
            cats += [c for c in _categories(cells) if c not in cats]
            modes |= {m for c in cells.values() for m in c}
    return cats, ordered_modes(modes)


def summary_table(trials: list[dict], baseline: str = "full", resamples: int = DEFAULT_RESAMPLES,
                  seed: int = 0) -> dict[str, list[dict]]:
    """Per task: one row per cell (a trial, or the mean of its seeds) with each (category, mode) value,
    its delta against ``baseline`` with a 95% interval, and a best mark.

    Row = ``{"name", "strategy", "split", "seeds", "cells": {category: {mode: cell}}, "final_loss",
    "heldout_loss", "heldout_delta"}``; a cell is ``{"value", "value_lo", "value_hi", "seeds", "delta",
    "lo", "hi", "sign", "method", "n", "best"}`` (values: the mean over seeds, with a t-interval when there
    are several; deltas: :func:`compare`). ``delta`` is None for the baseline row itself or without a
    baseline; ``best`` marks the highest value of each (category, mode) column (ties all marked)."""
    groups = group_trials(trials)
    base = groups.get(baseline)
    tasks = sorted({task for t in trials for task in parse_cells(t["scores"])})
    tables: dict[str, list[dict]] = {}
    for task in tasks:
        cats, modes = _task_cells(groups, task)
        noise = {(c, m): run_noise(groups, cell_value(task, c, m)) for c in cats for m in modes}
        noise[HELD] = run_noise(groups, heldout_loss_of)
        noise[GENERAL] = run_noise(groups, general_loss_of)
        rows = [_summary_row(g, base, task, cats, modes, resamples, seed, noise) for g in groups.values()]
        for c in cats:
            for m in modes:
                vals = [r["cells"][c][m]["value"] for r in rows if m in r["cells"].get(c, {})]
                for r in rows:
                    if m in r["cells"].get(c, {}):
                        r["cells"][c][m]["best"] = r["cells"][c][m]["value"] >= max(vals) - 1e-12
        tables[task] = rows
    return tables


HELD = "heldout_loss"
GENERAL = "general_loss"
"""The general probe's loss (:mod:`raycpt.evaluate.general`), compared like the held-out loss."""


def heldout_loss_of(t: dict) -> Optional[float]:
    return t.get("heldout_loss")


def general_loss_of(t: dict) -> Optional[float]:
    return t.get("general_loss")


def general_units(runs_a: list[dict], runs_b: list[dict]):
    """:func:`raycpt.report.sweep.seeds.heldout_units` of the general probe's blocks."""
    return heldout_units(runs_a, runs_b, probe="general")


def _summary_row(g: dict, base: Optional[dict], task: str, cats: list[str], modes: list[str], resamples: int,
                 seed: int, noise: dict) -> dict:
    is_base = base is None or g is base
    row_cells: dict[str, dict[str, dict[str, Any]]] = {}
    for c in cats:
        for m in modes:
            value = cell_value(task, c, m)
            cell = mean_of(g["runs"], value)
            if cell["value"] is None:
                continue
            d = delta_cell(None, None) if is_base else compare(
                g["runs"], base["runs"], value,
                lambda a, b, c=c, m=m: question_delta(a, b, task, c, m, resamples, seed),
                lambda ra, rb, c=c, m=m: question_units(ra, rb, task, c, m), noise[(c, m)])
            row_cells.setdefault(c, {})[m] = {**cell, **d}
    held = heldout_loss_of
    return {"name": g["name"], "strategy": g["strategy"], "split": g["split"], "seeds": list(g["runs"]),
            "cells": row_cells, "final_loss": mean_of(g["runs"], lambda t: t.get("final_loss"))["value"],
            "heldout_loss": mean_of(g["runs"], held)["value"],
            "heldout_delta": None if is_base else (
                negated(fixed_delta(base["runs"], next(iter(g["runs"].values())), held,
                                    lambda a, b: heldout_delta(a, b, resamples, seed), heldout_units, noise[HELD]))
                if g["strategy"] == "base" else  # base - full with base fixed: the against-base interval, mirrored
                compare(g["runs"], base["runs"], held, lambda a, b: heldout_delta(a, b, resamples, seed),
                        heldout_units, noise[HELD])),
            "general_loss": mean_of(g["runs"], general_loss_of)["value"],
            "general_delta": None if is_base else compare(
                g["runs"], base["runs"], general_loss_of, lambda a, b: heldout_delta(a, b, resamples, seed, "general"),
                general_units, noise[GENERAL])}


def _avg(trial: dict, task: str, mode: str) -> Optional[float]:
    return parse_cells(trial["scores"]).get(task, {}).get("average", {}).get(mode)


def _deep_partner(sh: Optional[dict], groups: dict, num_layers: Optional[int]) -> Optional[dict]:
    """The train_deep row training as many decoder layers as train_shallow row ``sh`` (deep at 1 - r):
    :func:`raycpt.splits.equal_count_split` with the model's depth; without it, the deep row with the same
    trainable-parameter count (equal layer counts of one architecture); without counts, the deep row at
    r' = 1 - r."""
    deep = [g for g in groups.values() if g["strategy"] == "train_deep" and g.get("split") is not None]
    if sh is None or not deep:
        return None
    if num_layers:
        r2 = equal_count_split(sh["split"], [g["split"] for g in deep], num_layers)
        return next((g for g in deep if g["split"] == r2), None) if r2 is not None else None
    count = budget_count(next(iter(sh["runs"].values())))
    if count:
        return next((g for g in deep if budget_count(next(iter(g["runs"].values()))) == count), None)
    return next((g for g in deep if abs(float(g["split"]) - (1 - float(sh["split"]))) < 1e-9), None)


def split_gains(trials: list[dict], split_scores: dict[str, float], task: str, baseline: str = "full",
                split_intervals: Optional[dict[str, list]] = None, resamples: int = DEFAULT_RESAMPLES,
                seed: int = 0, num_layers: Optional[int] = None) -> list[dict]:
    """For each split r: S(b) from the trace (with its bootstrap-over-prompts interval ``S_b_lo`` /
    ``S_b_hi``) next to the realised gains (average score, every mode) with their intervals.

    ``shallow_vs_full_<mode>`` = train_shallow at r - full; ``shallow_vs_deep_<mode>`` = train_shallow at r -
    train_deep at 1 - r, the deep row that trains the same number of layers (``deep_split``; position at equal
    counts: at the same r the two differ in count as well as position). ``deep_missing`` says so when the sweep
    has no such deep row. Each with ``_lo``, ``_hi``, ``_sign`` (:func:`compare`); a positive S(b) predicts a
    positive ``shallow_vs_deep``. With held-out losses, ``*_heldout`` (negative = shallow lower)."""
    groups = group_trials(trials)
    full = groups.get(baseline)
    modes = ordered_modes(set(_task_cells(groups, task)[1]) | {"generate", "logit"})
    noise = {m: run_noise(groups, lambda t, m=m: _avg(t, task, m)) for m in modes}
    noise[HELD] = run_noise(groups, heldout_loss_of)
    rows = []
    for r in sorted({g["split"] for g in groups.values() if g.get("split") is not None}):
        sh = next((g for g in groups.values() if g["strategy"] == "train_shallow" and g["split"] == r), None)
        dp = _deep_partner(sh, groups, num_layers)
        key = f"{float(r):g}"
        ci = (split_intervals or {}).get(key) or [None, None]
        row: dict[str, Any] = {"split": r, "b": (sh or {}).get("b"), "S_b": split_scores.get(key),
                               "S_b_lo": ci[0], "S_b_hi": ci[1], "modes": modes,
                               "shallow_name": (sh or {}).get("name"), "deep_name": (dp or {}).get("name"),
                               "deep_split": (dp or {}).get("split"), "deep_missing": None}
        if sh is not None and dp is None:
            row["deep_missing"] = (f"no train_deep row trains the {sh.get('b') or 'same number of'} layers "
                                   f"train_shallow at r = {float(r):g} trains (deep at r' = 1 - r = {1 - float(r):g} "
                                   "would): shallow vs deep not compared")
        for label, other in (("shallow_vs_full", full), ("shallow_vs_deep", dp)):
            for m in modes:
                row.update(_gain(sh, other, f"{label}_{m}", lambda t, m=m: _avg(t, task, m),
                                 lambda a, b, m=m: question_delta(a, b, task, "average", m, resamples, seed),
                                 lambda ra, rb, m=m: question_units(ra, rb, task, "average", m), noise[m]))
            row.update(_gain(sh, other, f"{label}_heldout", heldout_loss_of,
                             lambda a, b: heldout_delta(a, b, resamples, seed), heldout_units, noise[HELD]))
        rows.append(row)
    return rows


def _gain(sh: Optional[dict], other: Optional[dict], key: str, value, interval, units, noise) -> dict:
    """One realised gain of a split as flat keys: ``key`` (delta), ``_lo``, ``_hi``, ``_sign``, ``_p``,
    ``_method``."""
    d = compare(sh["runs"], other["runs"], value, interval, units, noise) if sh and other else delta_cell(None, None)
    return {key: d["delta"], f"{key}_lo": d["lo"], f"{key}_hi": d["hi"], f"{key}_sign": d["sign"],
            f"{key}_p": d["p"], f"{key}_method": d["method"]}


def budget_count(t: dict) -> Optional[int]:
    """The trainable count a run is compared at: LISA's per step (``trainable_per_step``), else ``trainable_params``."""
    return t.get("trainable_per_step") or t.get("trainable_params") or None


def trials_heldout_deltas(trials: list[dict], baseline: str = "full") -> list[tuple[Optional[float], Optional[int]]]:
    """Per run (in order): its held-out loss minus that of the baseline run of the same seed (None for the
    baseline itself or without either loss) and the sign of the paired interval over held-out blocks
    (:func:`heldout_delta`; None without one): the runs table's delta column."""
    trials = [t if "heldout_blocks" in t else load_outcomes(t) for t in trials]  # per-block losses for the marks
    bases = {t.get("seed"): t for t in trials if (t.get("group") or t["name"]) == baseline}
    out = []
    for t in trials:
        h, base = t.get("heldout_loss"), bases.get(t.get("seed"))
        d = None if h is None or base is None or base is t or base.get("heldout_loss") is None \
            else h - base["heldout_loss"]
        iv = heldout_delta(t, base) if d is not None else None
        out.append((d, iv.sign() if iv else None))
    return out


def largest_s_b(summary) -> Optional[tuple[Any, list, bool]]:
    """The split with the largest S(b) among the sweep's (argmax of the point estimates), the splits the trace
    cannot tell from it (``split_like_best``), and whether the trace gave that set at all; None when no split
    has an S(b). ``summary``: a :class:`~raycpt.report.sweep.model.Summary` or its JSON form."""
    summary = as_summary(summary)
    like = summary.split_like_best or {}
    gains = next(iter((summary.split_gains or {}).values()), [])
    scored = [(g["split"], g["S_b"]) for g in gains if g.get("S_b") is not None]
    if not scored:
        return None
    top = max(scored, key=lambda x: x[1])[0]
    same = [r for r, _ in scored if like.get(f"{float(r):g}")]
    return top, same, bool(like)
