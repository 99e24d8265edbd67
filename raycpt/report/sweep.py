"""Sweep summary: the paper's Table-1 layout with deltas against ``full``, each with a 95% interval, the
domain benchmark next to the general one, S(b) (with its interval) next to the realised gain of each
split, a bar chart per task, and the loss curves overlaid.

Tests and intervals (:mod:`raycpt.stats`): one seed - exact McNemar with the score interval over
questions (per-question records of each trial's ``eval_result.json``, matched by question id), a t over
documents (or blocks) for the held-out loss; several seeds (``sweep.seeds``) - the seeds x questions
interval. A cell is marked better / worse only by the verdict (:mod:`raycpt.report.verdict`): the
comparison's p-value after the sweep's multiplicity control, never its interval alone.

``summary_table``, ``split_gains``, ``domain_general`` and ``build_summary`` are pure (unit-tested on
fabricated per-question records); ``write_summary`` writes CSV / Markdown / JSON / PNG files (the sweep
job logs them to its MLflow run: :func:`raycpt.jobs.sweep.log_summary`; no report module talks to MLflow).
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from collections import Counter
from dataclasses import replace

from raycpt.stats import (DEFAULT_RESAMPLES, Interval, paired_accuracy_delta, ratio_delta_t, seed_interval,
                          seed_question_interval, stratified_mcnemar_p, stratified_paired_delta)
from raycpt.report import verdict
from raycpt.report.verdict import HELDOUT
from raycpt.stats import spearman_test
from raycpt.tasks import CATEGORY_KEYS

DEFAULT_REPORT = {"primary": None, "adjust": "holm", "alpha": 0.05}  # build_summary without a config: no primary

CATEGORY_ORDER = ["stem", "social_science", "humanities", "other", "average", "overall"]
CATEGORY_LABEL = {"stem": "STEM", "social_science": "Social Science", "humanities": "Humanities", "other": "Other",
                  "average": "Average", "overall": "All questions"}
MODES = ("generate", "logit", "cloze")  # display order; any other mode in the records follows, sorted
MODE_LETTER = {"generate": "G", "logit": "L", "cloze": "C"}


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


# ------------------------------------------------------------------------------------------ per-question data
def question_outcomes(questions: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, tuple[str, bool]]]]:
    """Per-question records (``EvalResult.questions``) -> ``{task: {mode: {question id: (category key, correct)}}}``.

    A mode is any key of a record whose value is a mapping with ``correct`` (``logit``, ``generate``,
    ``cloze``, ...); the category is mapped to its score key (``STEM`` -> ``stem``)."""
    out: dict[str, dict[str, dict[str, tuple[str, bool]]]] = {}
    for task, qs in questions.items():
        for q in qs:
            cat = CATEGORY_KEYS.get(q.get("category"), str(q.get("category")))
            for mode, rec in q.items():
                if isinstance(rec, dict) and "correct" in rec:
                    out.setdefault(task, {}).setdefault(mode, {})[str(q["id"])] = (cat, bool(rec["correct"]))
    return out


HELDOUT_DOCS_FILE = "heldout_docs.json"  # next to the sweep's heldout_blocks.json: the document of each block


def _heldout_docs_near(path: Path, blocks: Optional[list]) -> Optional[list]:
    """The held-out blocks' documents from ``heldout_docs.json`` in a folder above the trial's eval file
    (the sweep's run folder), when it has one entry per block."""
    if not blocks:
        return None
    for folder in list(path.parents)[:5]:
        f = folder / HELDOUT_DOCS_FILE
        if f.is_file():
            docs = json.loads(f.read_text(encoding="utf-8"))
            return docs if isinstance(docs, list) and len(docs) == len(blocks) else None
    return None


def load_outcomes(trial: dict) -> dict:
    """The trial result with ``outcomes`` (:func:`question_outcomes`) and the per-block held-out losses
    (``heldout_blocks``, ``heldout_weights``) read from its ``eval_file``; unchanged when it has none."""
    path = trial.get("eval_file")
    if not path or not Path(path).is_file():
        return trial
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    blocks = data.get("heldout_block_losses")
    out = {**trial, "outcomes": question_outcomes(data.get("questions") or {}),
           "heldout_blocks": blocks, "heldout_weights": data.get("heldout_block_weights")}
    docs = trial.get("heldout_docs") or _heldout_docs_near(Path(path), blocks)
    return {**out, "heldout_docs": docs} if docs else out


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

    0/1 outcomes on the same questions: the exact McNemar p-value and the continuity-corrected score
    interval (:func:`raycpt.stats.paired_accuracy_delta`, coverage shown by ``bench_calibration.py``). The
    Average column with categories of equal size *is* the all-questions accuracy and gets the same; with
    unequal categories it gets the stratified bootstrap (each category resampled within itself) and a
    stratified McNemar z-test (normal approximation): exploratory. None without outcomes."""
    m = _matched(a, b, task, cat, mode)
    if m is None:
        return None
    _, x, y, cats = m
    if cat == "average" and len(set(Counter(cats).values())) > 1:
        iv = stratified_paired_delta(x, y, cats, resamples, seed, scale=100.0)
        return replace(iv, p=stratified_mcnemar_p(x, y, cats))
    return paired_accuracy_delta(x, y, scale=100.0)


def question_diffs(a: dict, b: dict, task: str, cat: str, mode: str) -> Optional[dict]:
    """Per-question differences (a - b, points) keyed by question id, for the seeds x questions interval."""
    m = _matched(a, b, task, cat, mode)
    if m is None:
        return None
    ids, x, y, _ = m
    return {q: 100.0 * (int(u) - int(v)) for q, u, v in zip(ids, x, y)}


def heldout_delta(a: dict, b: dict, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Optional[Interval]:
    """Held-out loss of ``a`` minus ``b``, token-weighted over the held-out blocks, with a t-interval over
    documents (``heldout_docs``: the document of each block, when the result carries them; over blocks
    otherwise): :func:`raycpt.stats.ratio_delta_t`, coverage shown by ``bench_calibration.py``."""
    la, lb = a.get("heldout_blocks"), b.get("heldout_blocks")
    if not la or not lb or len(la) != len(lb):
        return None
    docs = a.get("heldout_docs")
    docs = docs if docs is not None and len(docs) == len(la) else None
    return ratio_delta_t(la, lb, clusters=docs, weights=a.get("heldout_weights"))


def heldout_diffs(a: dict, b: dict) -> Optional[dict]:
    la, lb = a.get("heldout_blocks"), b.get("heldout_blocks")
    if not la or not lb or len(la) != len(lb):
        return None
    return {i: float(x) - float(y) for i, (x, y) in enumerate(zip(la, lb))}


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


def _delta(iv: Optional[Interval], point: Optional[float]) -> dict:
    """A comparison's cell: delta, interval, ``sign`` (the interval alone: +1 / -1 when it excludes 0; the
    summary replaces it by the adjusted decision, :mod:`raycpt.report.verdict`), ``p`` (two-sided, of no
    difference), method and units."""
    if point is None:
        return {"delta": None, "lo": None, "hi": None, "sign": None, "method": None, "n": 0, "p": None}
    if iv is None or math.isnan(iv.lo):
        return {"delta": point, "lo": None, "hi": None, "sign": None, "method": None, "n": 0, "p": None}
    return {"delta": point, "lo": iv.lo, "hi": iv.hi, "sign": iv.sign(), "method": iv.method, "n": iv.n, "p": iv.p}


def compare(runs_a: dict, runs_b: dict, value: Callable[[dict], Optional[float]],
            interval: Callable[[dict, dict], Optional[Interval]],
            units: Optional[Callable[[dict, dict], Optional[dict]]] = None) -> dict:
    """``value(a) - value(b)`` for two cells' runs, paired by seed.

    One shared seed: that difference with ``interval(a, b)`` (question or block sampling). Several: the
    mean of the per-seed differences; with ``units(a, b)`` (per-unit differences keyed by unit id, the
    same units in every seed) the seeds x questions interval (:func:`raycpt.stats.seed_question_interval`,
    seed and question noise), else a t-interval over seeds (seed noise only). Returns ``{"delta", "lo",
    "hi", "sign", "method", "n", "p"}`` (:func:`_delta`)."""
    pairs = []
    for sd in runs_a:
        if sd in runs_b:
            va, vb = value(runs_a[sd]), value(runs_b[sd])
            if va is not None and vb is not None:
                pairs.append((sd, va - vb))
    if not pairs:
        return _delta(None, None)
    if len(pairs) == 1:
        sd, d = pairs[0]
        return _delta(interval(runs_a[sd], runs_b[sd]), d)
    per_unit = [units(runs_a[sd], runs_b[sd]) for sd, _ in pairs] if units else None
    if per_unit and all(per_unit) and all(set(u) == set(per_unit[0]) for u in per_unit):
        keys = sorted(per_unit[0], key=str)
        iv = seed_question_interval([d for _, d in pairs], [[u[k] for k in keys] for u in per_unit])
    else:
        iv = seed_interval([d for _, d in pairs])
    return _delta(iv, iv.point)


def _cell_value(task: str, cat: str, mode: str) -> Callable[[dict], Optional[float]]:
    return lambda t: parse_cells(t["scores"]).get(task, {}).get(cat, {}).get(mode)


def _mean_of(runs: dict, value: Callable[[dict], Optional[float]]) -> dict:
    iv = seed_interval([v for v in (value(t) for t in runs.values()) if v is not None])
    if iv.n == 0:
        return {"value": None}
    return {"value": iv.point, "value_lo": None if math.isnan(iv.lo) else iv.lo,
            "value_hi": None if math.isnan(iv.hi) else iv.hi, "seeds": iv.n}


def _modes(names) -> list[str]:
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
    return cats, _modes(modes)


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
        rows = [_summary_row(g, base, task, cats, modes, resamples, seed) for g in groups.values()]
        for c in cats:
            for m in modes:
                vals = [r["cells"][c][m]["value"] for r in rows if m in r["cells"].get(c, {})]
                for r in rows:
                    if m in r["cells"].get(c, {}):
                        r["cells"][c][m]["best"] = r["cells"][c][m]["value"] >= max(vals) - 1e-12
        tables[task] = rows
    return tables


def _summary_row(g: dict, base: Optional[dict], task: str, cats: list[str], modes: list[str], resamples: int,
                 seed: int) -> dict:
    is_base = base is None or g is base
    row_cells: dict[str, dict[str, dict[str, Any]]] = {}
    for c in cats:
        for m in modes:
            value = _cell_value(task, c, m)
            cell = _mean_of(g["runs"], value)
            if cell["value"] is None:
                continue
            d = _delta(None, None) if is_base else compare(
                g["runs"], base["runs"], value,
                lambda a, b, c=c, m=m: question_delta(a, b, task, c, m, resamples, seed),
                lambda a, b, c=c, m=m: question_diffs(a, b, task, c, m))
            row_cells.setdefault(c, {})[m] = {**cell, **d}
    held = (lambda t: t.get("heldout_loss"))
    return {"name": g["name"], "strategy": g["strategy"], "split": g["split"], "seeds": list(g["runs"]),
            "cells": row_cells, "final_loss": _mean_of(g["runs"], lambda t: t.get("final_loss"))["value"],
            "heldout_loss": _mean_of(g["runs"], held)["value"],
            "heldout_delta": None if is_base else compare(g["runs"], base["runs"], held,
                                                          lambda a, b: heldout_delta(a, b, resamples, seed),
                                                          heldout_diffs)}


def _avg(trial: dict, task: str, mode: str) -> Optional[float]:
    return parse_cells(trial["scores"]).get(task, {}).get("average", {}).get(mode)


def split_gains(trials: list[dict], split_scores: dict[str, float], task: str, baseline: str = "full",
                split_intervals: Optional[dict[str, list]] = None, resamples: int = DEFAULT_RESAMPLES,
                seed: int = 0) -> list[dict]:
    """For each split: S(b) from the trace (with its bootstrap-over-prompts interval ``S_b_lo`` /
    ``S_b_hi``) next to the realised gains (average score, every mode) with their intervals.

    ``shallow_vs_full_<mode>`` = train_shallow - full, ``shallow_vs_deep_<mode>`` = train_shallow -
    train_deep (each with ``_lo``, ``_hi``, ``_sign``: :func:`compare`); a positive S(b) predicts positive
    ``shallow_vs_deep``. With held-out losses, ``*_heldout`` are the loss differences (negative = shallow lower)."""
    groups = group_trials(trials)
    full = groups.get(baseline)
    modes = _modes(set(_task_cells(groups, task)[1]) | {"generate", "logit"})
    rows = []
    for r in sorted({g["split"] for g in groups.values() if g.get("split") is not None}):
        sh = next((g for g in groups.values() if g["strategy"] == "train_shallow" and g["split"] == r), None)
        dp = next((g for g in groups.values() if g["strategy"] == "train_deep" and g["split"] == r), None)
        key = f"{float(r):g}"
        ci = (split_intervals or {}).get(key) or [None, None]
        row: dict[str, Any] = {"split": r, "b": (sh or dp or {}).get("b"), "S_b": split_scores.get(key),
                               "S_b_lo": ci[0], "S_b_hi": ci[1], "modes": modes,
                               "shallow_name": (sh or {}).get("name"), "deep_name": (dp or {}).get("name")}
        for label, other in (("shallow_vs_full", full), ("shallow_vs_deep", dp)):
            for m in modes:
                row.update(_gain(sh, other, f"{label}_{m}", lambda t, m=m: _avg(t, task, m),
                                 lambda a, b, m=m: question_delta(a, b, task, "average", m, resamples, seed),
                                 lambda a, b, m=m: question_diffs(a, b, task, "average", m)))
            row.update(_gain(sh, other, f"{label}_heldout", lambda t: t.get("heldout_loss"),
                             lambda a, b: heldout_delta(a, b, resamples, seed), heldout_diffs))
        rows.append(row)
    return rows


def _gain(sh: Optional[dict], other: Optional[dict], key: str, value, interval, units) -> dict:
    """One realised gain of a split as flat keys: ``key`` (delta), ``_lo``, ``_hi``, ``_sign``, ``_p``,
    ``_method`` and ``_seeds`` (the per-seed deltas, for S(b) against the gain)."""
    d = compare(sh["runs"], other["runs"], value, interval, units) if sh and other else _delta(None, None)
    per_seed = []
    if sh and other:
        for sd in sh["runs"]:
            if sd in other["runs"]:
                va, vb = value(sh["runs"][sd]), value(other["runs"][sd])
                if va is not None and vb is not None:
                    per_seed.append(va - vb)
    return {key: d["delta"], f"{key}_lo": d["lo"], f"{key}_hi": d["hi"], f"{key}_sign": d["sign"],
            f"{key}_p": d["p"], f"{key}_method": d["method"], f"{key}_seeds": per_seed}


# ------------------------------------------------------------------------------------------ domain vs general
def domain_general(tables: dict[str, list[dict]], domain: Sequence[str], general: Sequence[str],
                   baseline: str = "full") -> list[dict]:
    """Per strategy and split (every cell but the baseline): the domain tasks' gain and the general
    tasks' change against ``baseline`` (the Average column, every mode, with intervals) and the held-out
    loss delta, plus a one-phrase reading. Tasks of a role that did not run are left out; [] when no
    task of either role ran."""
    d_tasks = [t for t in domain if t in tables]
    g_tasks = [t for t in general if t in tables]
    if not d_tasks and not g_tasks:
        return []
    first = tables[(d_tasks or g_tasks)[0]]
    out = []
    for row in first:
        if row["name"] == baseline:
            continue
        entry = {"name": row["name"], "strategy": row["strategy"], "split": row["split"],
                 "heldout": row.get("heldout_delta"), "domain": [], "general": []}
        for role, tasks in (("domain", d_tasks), ("general", g_tasks)):
            for task in tasks:
                r = next((x for x in tables[task] if x["name"] == row["name"]), None)
                for mode, cell in ((r or {}).get("cells", {}).get("average", {})).items():
                    entry[role].append({"task": task, "mode": mode, **{k: cell.get(k) for k in (
                        "delta", "lo", "hi", "sign", "method", "n", "p", "p_adj", "role")}})
        entry["reading"] = reading(entry, bool(d_tasks), bool(g_tasks))
        out.append(entry)
    return out


def _direction(items: list[dict]) -> Optional[int]:
    signs = {i["sign"] for i in items if i.get("sign") is not None}
    if not signs:
        return None
    return 2 if {1, -1} <= signs else (1 if 1 in signs else (-1 if -1 in signs else 0))


def reading(entry: dict, has_domain: bool = True, has_general: bool = True) -> str:
    """One phrase per role, from the (adjusted) signs only: a delta without a mark is no change. When the
    sweep has a primary comparison, it comes first and the rest are labelled exploratory."""
    words = {"domain": {1: "domain gain", -1: "domain loss", 2: "domain mixed", 0: "no clear domain change",
                        None: "domain: no interval"},
             "general": {1: "general improves", -1: "general forgets", 2: "general mixed",
                         0: "no clear general change", None: "general: no interval"}}
    items = [i for role in ("domain", "general") for i in entry[role]] + [entry.get("heldout") or {}]
    prim = next((i for i in items if i.get("role") == "primary"), None)
    tag = " (exploratory)" if prim is not None else ""
    parts = []
    if prim is not None:
        what = prim.get("task", "held-out loss") if prim.get("mode") is None else f"{prim['task']} {prim['mode']}"
        word = {1: "higher", -1: "lower", 0: "no clear change", None: "no test"}[prim.get("sign")]
        parts.append(f"primary {what}: {word}")
    for role, on in (("domain", has_domain), ("general", has_general)):
        if on:
            sec = [i for i in entry[role] if i.get("role") != "primary"]
            parts.append(words[role][_direction(sec)] + tag if sec else
                         (f"{role}: not evaluated" if not entry[role] else ""))
    h = entry.get("heldout") or {}
    if h.get("sign") is not None and h.get("role") != "primary":
        parts.append({1: "held-out loss higher", -1: "held-out loss lower", 0: "held-out loss unchanged"}[h["sign"]]
                     + tag)
    return "; ".join(p for p in parts if p)


def _fmt(v: Optional[float], sign: bool = False) -> str:
    """Scores are percentages already (as the eval bridge reports them)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:+.2f}" if sign else f"{v:.2f}"


def _fmt_s(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


MARK = {1: " ▲", -1: " ▼"}
LEGEND = ("Δ against full with its 95% interval in brackets (what each interval covers: the legend of the "
          "verdict below); ▲ / ▼ = better / worse than full, marked only when the comparison's p-value survives "
          "the multiplicity control over the sweep (for losses lower is better), never from an interval alone; "
          "* = best on the primary metric, only when it beats every other row")


def _mark(sign: Optional[int], lower_is_better: bool = False) -> str:
    if not sign:
        return ""
    return MARK[-sign if lower_is_better else sign]


def fmt_delta(d: Optional[dict], digits: int = 2, lower_is_better: bool = False, short: bool = False) -> str:
    """``+5.00 [+1.25, +8.75] ▲``: a delta, its interval (when it has one) and the better/worse mark."""
    if not d or d.get("delta") is None:
        return "-"
    txt = f"{d['delta']:+.{digits}f}"
    if d.get("lo") is not None:
        lo, hi = (f"{d['lo']:+.{digits - 1 if short else digits}f}", f"{d['hi']:+.{digits - 1 if short else digits}f}")
        txt += f" [{lo},{hi}]" if short else f" [{lo}, {hi}]"
    return txt + _mark(d.get("sign"), lower_is_better)


def _fmt_value(x: dict) -> str:
    """A cell value (mean over seeds ``±`` the half-width of its 95% t-interval when there are several)."""
    txt = _fmt(x["value"]) + ("*" if x.get("best") else "")
    if x.get("value_lo") is not None:
        txt += f" ±{(x['value_hi'] - x['value_lo']) / 2:.2f}"
    return txt


def _row_categories(rows: list[dict]) -> list[str]:
    cats: list[str] = []
    for r in rows:
        cats += [c for c in r["cells"] if c not in cats]
    return cats


def table_modes(rows: list[dict]) -> list[str]:
    """The modes a task's rows hold, in display order (generate, logit, cloze, then any other)."""
    return _modes({m for r in rows for c in r["cells"].values() for m in c})


def table_markdown(task: str, rows: list[dict]) -> str:
    """Markdown: cells ``G / L (ΔG [lo, hi] / ΔL [lo, hi])`` in percent, best marked with ``*``; mean ±
    95% half-width over seeds when a cell has several; the loss columns and the held-out Δ at the end."""
    cats, modes = _row_categories(rows), table_modes(rows)
    losses = _loss_columns(rows)
    held = any(r.get("heldout_delta") and r["heldout_delta"].get("delta") is not None for r in rows)
    head = ("| model | seeds | " + " | ".join(CATEGORY_LABEL.get(c, c) for c in cats) + " |"
            + "".join(f" {label} |" for _, label in losses) + (" Δ held-out |" if held else ""))
    letters = " / ".join(MODE_LETTER.get(m, m) for m in modes)
    lines = [f"**{task}** — {letters} accuracy (%), Δ against full [95% interval] in brackets, * = best", "", head,
             "|" + "---|" * (len(cats) + 2 + len(losses) + held)]
    for r in rows:
        cells = []
        for c in cats:
            xs = [r["cells"].get(c, {}).get(m) for m in modes]
            xs = [x for x in xs if x is not None]
            txt = " / ".join(_fmt_value(x) for x in xs)
            deltas = [x for x in xs if x.get("delta") is not None]
            if deltas:
                txt += " (" + " / ".join(fmt_delta(x) for x in deltas) + ")"
            cells.append(txt or "-")
        cells += [_fmt_s(r.get(key)) for key, _ in losses]
        if held:
            cells.append(fmt_delta(r.get("heldout_delta"), 3, lower_is_better=True))
        lines.append(f"| {r['name']} | {len(r.get('seeds') or [None])} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _loss_columns(rows: list[dict], short: bool = False) -> list[tuple[str, str]]:
    """The loss columns present: the last training step's loss and the held-out loss."""
    cols = [("final_loss", "loss" if short else "final loss"), ("heldout_loss", "held-out" if short else "held-out loss")]
    return [(k, label) for k, label in cols if any(r.get(k) is not None for r in rows)]


SHORT_LABEL = {"stem": "STEM", "social_science": "Soc.Sci.", "humanities": "Human.", "other": "Other",
               "average": "Average", "overall": "All"}


def _colour(sign: Optional[int], lower_is_better: bool = False) -> str:
    if not sign:
        return "dim"
    return "green" if (sign < 0 if lower_is_better else sign > 0) else "red"


def rich_table(task: str, rows: list[dict], mode: str):
    """Table 1 for one mode, narrow enough for an 80-column terminal: per cell the accuracy (%, best
    marked ``*`` and bold) over its delta against ``full``, green ▲ / red ▼ only when its 95% interval
    excludes 0 (dim otherwise). The intervals themselves are in the Markdown summary and the gains and
    domain/general tables. The CLI prints one table per mode."""
    from rich import box
    from rich.table import Table

    cats = [c for c in _row_categories(rows) if c != "overall" and any(mode in r["cells"].get(c, {}) for r in rows)]
    table = Table(title=f"{task}, {mode} mode: accuracy (%), Δ vs full below (▲▼: after multiplicity control)",
                  box=box.SIMPLE_HEAD, pad_edge=False)
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
            if x["delta"] is not None:
                col = _colour(x.get("sign"))
                txt += f"\n[{col}]{_fmt(x['delta'], sign=True)}{_mark(x.get('sign')) or '  '}[/{col}]"
            cells.append(txt)
        table.add_row(r["name"], *cells)
    return table


def rich_trials_table(trials: list[dict], baseline: str = "full"):
    """One row per run: trainable parameters (LISA: per step, marked †), the last step's training loss, the
    held-out loss and its delta against the baseline run of the same seed (lower is better; green / red only
    when the paired bootstrap over held-out blocks excludes 0), median training tokens/s, the largest
    per-step peak memory (MB; :mod:`raycpt.train.peakmem`), wall seconds."""
    from rich import box
    from rich.table import Table

    trials = [t if "heldout_blocks" in t else load_outcomes(t) for t in trials]  # per-block losses for the marks
    bases = {t.get("seed"): t for t in trials if (t.get("group") or t["name"]) == baseline}
    table = Table(title="runs: losses (nats/token), held-out Δ vs full", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 0, 0, 1), caption_justify="left")  # one space between columns: 8 fit 80
    for col, just in (("run", "left"), ("trainable", "right"), ("train", "right"), ("held-out", "right"),
                      ("Δ", "right"), ("tok/s", "right"), ("peak MB", "right"), ("s", "right")):
        table.add_column(col, justify=just, no_wrap=True)
    table.caption = "\n".join(trials_table_notes(trials)) or None
    for t in trials:
        h, base = t.get("heldout_loss"), bases.get(t.get("seed"))
        d = None if h is None or base is None or base is t or base.get("heldout_loss") is None \
            else h - base["heldout_loss"]
        iv = heldout_delta(t, base) if d is not None else None
        colour = "dim" if d is None else _colour(iv.sign() if iv else None, lower_is_better=True)
        table.add_row(t["name"], _trainable_cell(t), _fmt_s(t.get("final_loss")), _fmt_s(h),
                      "-" if d is None else f"[{colour}]{d:+.3f}[/{colour}]",
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


def budget_count(t: dict) -> Optional[int]:
    """The trainable count a run is compared at: LISA's per step (``trainable_per_step``), else ``trainable_params``."""
    return t.get("trainable_per_step") or t.get("trainable_params") or None


def _trainable_cell(t: dict) -> str:
    n = budget_count(t)
    return "-" if not n else f"{n / 1e6:.1f}M" + ("†" if t.get("trainable_per_step") else "")


def _two_lines(g: dict, key: str, digits: int = 2, lower_is_better: bool = False) -> str:
    """A gains cell: the delta (coloured, marked) over its interval."""
    v = g.get(key)
    if v is None:
        return "-"
    sign = g.get(f"{key}_sign")
    col = _colour(sign, lower_is_better)
    txt = f"[{col}]{v:+.{digits}f}{_mark(sign, lower_is_better)}[/{col}]"
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
        s_txt = _fmt_s(g["S_b"])
        if g.get("S_b_lo") is not None:
            s_txt += f"\n[{g['S_b_lo']:.2f},{g['S_b_hi']:.2f}]"
        first = True
        for label in ("full", "deep"):
            key = f"shallow_vs_{label}"
            for j, m in enumerate(modes):
                cells = [f"{g['split']:g}" if first else "", str(g["b"] if g["b"] is not None else "-") if first else "",
                         s_txt if first else "", label if j == 0 else "", MODE_LETTER.get(m, m), _two_lines(g, f"{key}_{m}")]
                if held:
                    cells.append(_two_lines(g, f"{key}_heldout", 3, lower_is_better=True) if j == 0 else "")
                table.add_row(*cells)
                first = False
    return table


def _fmt_loss_delta(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:+.3f}"


def domain_general_markdown(entries: list[dict]) -> str:
    """The domain-versus-general table: per strategy and split, the domain gain and the general change
    against full (Average column, each mode, 95% intervals), the held-out loss delta, and the reading."""
    if not entries:
        return ""
    cols = [("domain", i["task"], i["mode"]) for i in entries[0]["domain"]] + \
           [("general", i["task"], i["mode"]) for i in entries[0]["general"]]
    lines = ["**Domain versus general** — Average accuracy Δ against full (points) [95% interval]", "",
             "| trial | " + " | ".join(f"{role}: {task} {MODE_LETTER.get(m, m)}" for role, task, m in cols)
             + " | Δ held-out loss | reading |", "|" + "---|" * (len(cols) + 3)]
    for e in entries:
        by = {(role, i["task"], i["mode"]): i for role in ("domain", "general") for i in e[role]}
        cells = [fmt_delta(by.get(c)) for c in cols]
        lines.append(f"| {e['name']} | " + " | ".join(cells) + f" | {fmt_delta(e.get('heldout'), 3, True)} | "
                     f"{e['reading']} |")
    return "\n".join(lines)


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
        modes = _modes({i["mode"] for role in ("domain", "general") for i in e[role]})
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


def delta_records(tables: dict[str, list[dict]]) -> list[dict]:
    """Every cell of every task as one flat record (the MLflow parent table and ``deltas.csv``)."""
    out = []
    for task, rows in tables.items():
        for r in rows:
            for c, modes in r["cells"].items():
                for m, x in modes.items():
                    out.append({"task": task, "model": r["name"], "strategy": r["strategy"], "split": r["split"],
                                "seeds": len(r.get("seeds") or [None]), "category": c, "mode": m,
                                "accuracy": x["value"], "accuracy_lo": x.get("value_lo"),
                                "accuracy_hi": x.get("value_hi"), "delta_vs_full": x.get("delta"),
                                "delta_lo": x.get("lo"), "delta_hi": x.get("hi"), "verdict":
                                    {1: "better", -1: "worse", 0: "no clear change"}.get(x.get("sign"), ""),
                                "interval": x.get("method") or "", "best": x.get("best"), "p": x.get("p"),
                                "p_adjusted": x.get("p_adj"), "role": x.get("role") or "exploratory"})
    return out


def _csv(records: list[dict]) -> str:
    buf = io.StringIO()
    if records:
        w = csv.DictWriter(buf, fieldnames=list(records[0]))
        w.writeheader()
        w.writerows(records)
    return buf.getvalue()


def plot_bars(path: Path, task: str, rows: list[dict]) -> Path:
    """Average accuracy per cell and mode (error bars: the 95% interval over seeds when there are several)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = [r["name"] for r in rows]
    modes = table_modes(rows)
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(names)), 4))
    x = np.arange(len(names))
    width = 0.8 / max(1, len(modes))
    for k, m in enumerate(modes):
        cells = [r["cells"].get("average", {}).get(m) or {} for r in rows]
        vals = [c.get("value") or 0.0 for c in cells]
        err = [((c["value"] - c["value_lo"]) if c.get("value_lo") is not None else 0.0) for c in cells]
        ax.bar(x + (k - (len(modes) - 1) / 2) * width, vals, width=width, label=m, yerr=err if any(err) else None)
    full = next((r for r in rows if r["name"] == "full"), None)
    if full is not None:
        for m, ls in zip(modes, ("--", ":", "-.")):
            v = (full["cells"].get("average", {}).get(m) or {}).get("value")
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def gains_markdown(task: str, gains: list[dict]) -> str:
    """S(b) (with its interval over prompts) next to the realised gains of each split, with intervals."""
    modes = [m for m in (gains[0].get("modes") or []) if any(g.get(f"shallow_vs_full_{m}") is not None
                                                              or g.get(f"shallow_vs_deep_{m}") is not None
                                                              for g in gains)] if gains else []
    letters = " / ".join(MODE_LETTER.get(m, m) for m in modes)
    lines = [f"**{task}** — S(b) from the trace [95% interval over prompts, trace.sb_aggregate] next to the realised gain "
             f"of train_shallow (average, percentage points, {letters}) [95% interval]", "",
             f"| split | b | S(b) [95%] | shallow−full {letters} | shallow−deep {letters} | held-out loss shallow−full "
             "| held-out loss shallow−deep |", "|---|---|---|---|---|---|---|"]

    def pick(g, key):
        return {"delta": g.get(key), "lo": g.get(f"{key}_lo"), "hi": g.get(f"{key}_hi"), "sign": g.get(f"{key}_sign")}

    for g in gains:
        s_b = _fmt_s(g["S_b"]) + (f" [{g['S_b_lo']:.3f}, {g['S_b_hi']:.3f}]" if g.get("S_b_lo") is not None else "")
        sf = " / ".join(fmt_delta(pick(g, f"shallow_vs_full_{m}")) for m in modes)
        sd = " / ".join(fmt_delta(pick(g, f"shallow_vs_deep_{m}")) for m in modes)
        lines.append(f"| {g['split']:g} | {'-' if g['b'] is None else g['b']} | {s_b} | {sf} | {sd} | "
                     f"{fmt_delta(pick(g, 'shallow_vs_full_heldout'), 3, True)} | "
                     f"{fmt_delta(pick(g, 'shallow_vs_deep_heldout'), 3, True)} |")
    return "\n".join(lines)


def _family(tables: dict, gains: dict, tasks: Sequence[str], primary: Optional[dict], baseline: str) -> list[dict]:
    """The comparisons a mark or a reading can rest on (:mod:`raycpt.report.verdict`), each with the cells it
    decides: every row against ``baseline`` on the Average column of every task that ran (domain and general
    first) and mode, the held-out loss, and train_shallow against train_deep at each split (the gains
    table). A comparison found twice (the gains table repeats shallow - full) is one member."""
    fam: dict[tuple, dict] = {}

    def add(key, task, mode, d, cell=None, flat=None):
        if d.get("delta") is None:
            return
        e = fam.setdefault(key, {"a": key[0], "b": key[1], "task": task, "mode": mode, "delta": d["delta"],
                                 "p": d.get("p"), "cells": [], "flat": []})
        e["primary"] = key[1] == baseline and verdict.is_primary(e, primary)
        if cell is not None:
            e["cells"].append(cell)
        if flat is not None:
            e["flat"].append(flat)

    for task in list(dict.fromkeys([t for t in tasks if t in tables] + list(tables))):
        for r in tables[task]:
            if r["name"] == baseline:
                continue
            for mode, cell in r["cells"].get("average", {}).items():
                add((r["name"], baseline, task, mode), task, mode, cell, cell=cell)
            if r.get("heldout_delta"):
                add((r["name"], baseline, HELDOUT, None), HELDOUT, None, r["heldout_delta"], cell=r["heldout_delta"])
    for task in list(dict.fromkeys([t for t in tasks if t in gains] + list(gains))):
        for g in gains[task]:
            for label, other in (("shallow_vs_full", baseline), ("shallow_vs_deep", g.get("deep_name"))):
                for m in g.get("modes") or []:
                    add((g.get("shallow_name"), other, task, m), task, m, _flat(g, f"{label}_{m}"),
                        flat=(g, f"{label}_{m}"))
                add((g.get("shallow_name"), other, HELDOUT, None), HELDOUT, None, _flat(g, f"{label}_heldout"),
                    flat=(g, f"{label}_heldout"))
    return list(fam.values())


def _flat(g: dict, key: str) -> dict:
    return {"delta": g.get(key), "p": g.get(f"{key}_p")}


def _clear_marks(tables: dict, gains: dict) -> None:
    """Every interval-only sign becomes ``raw_sign``; only the verdict sets ``sign`` again."""
    for rows in tables.values():
        for r in rows:
            cells = [x for modes in r["cells"].values() for x in modes.values()] + [r.get("heldout_delta") or {}]
            for x in cells:
                if "sign" in x:
                    x["raw_sign"], x["sign"] = x["sign"], None
                x["best"] = False if "value" in x else x.get("best")
    for rows in gains.values():
        for g in rows:
            for k in [k for k in g if k.endswith("_sign")]:
                g[k] = None


def apply_verdict(tables: dict, gains: dict, tasks: Sequence[str], report: dict, baseline: str = "full") -> dict:
    """Decide the family (adjusted p-values, marks) and write the decisions into the cells they rest on.
    Returns ``{"comparisons", "primary", "adjust", "alpha", "family_size"}``."""
    primary = verdict.parse_primary(report.get("primary"))
    _clear_marks(tables, gains)
    fam = _family(tables, gains, tasks, primary, baseline)
    decided = verdict.decide(fam, report.get("adjust", "holm"), report.get("alpha", verdict.ALPHA))
    for d in decided:
        for cell in d["cells"]:
            cell.update(sign=d["sign"], p_adj=d["p_adj"], role=d["role"])
        for g, key in d["flat"]:
            g.update({f"{key}_sign": d["sign"], f"{key}_p_adj": d["p_adj"], f"{key}_role": d["role"]})
    comps = [{k: v for k, v in d.items() if k not in ("cells", "flat")} for d in decided]
    return {"comparisons": comps, "primary": report.get("primary"), "primary_found": any(c["primary"] for c in comps),
            "adjust": report.get("adjust", "holm"), "alpha": report.get("alpha", verdict.ALPHA),
            "family_size": sum(c["p"] is not None for c in comps)}


def primary_best(trials: list[dict], tables: dict, report: dict, baseline: str = "full",
                 resamples: int = DEFAULT_RESAMPLES) -> Optional[dict]:
    """The best row on the primary metric (:func:`raycpt.report.verdict.best_row`: it must beat every other
    row, Bonferroni over all pairs), marked ``best`` on its cell; None without a primary that ran."""
    primary = verdict.parse_primary(report.get("primary"))
    if primary is None:
        return None
    groups = group_trials(trials)
    if primary["task"] == HELDOUT:
        values = {n: _mean_of(g["runs"], lambda t: t.get("heldout_loss"))["value"] for n, g in groups.items()}

        def pair_p(a, b):
            return compare(groups[a]["runs"], groups[b]["runs"], lambda t: t.get("heldout_loss"),
                           lambda x, y: heldout_delta(x, y, resamples), heldout_diffs)["p"]
        higher = False
    else:
        task, mode = primary["task"], primary["mode"]
        if task not in tables:
            return None
        value = _cell_value(task, "average", mode)
        values = {n: _mean_of(g["runs"], value)["value"] for n, g in groups.items()}

        def pair_p(a, b):
            return compare(groups[a]["runs"], groups[b]["runs"], value,
                           lambda x, y: question_delta(x, y, task, "average", mode, resamples),
                           lambda x, y: question_diffs(x, y, task, "average", mode))["p"]
        higher = True
    if sum(v is not None for v in values.values()) < 2:
        return None
    best = verdict.best_row(values, pair_p, report.get("alpha", verdict.ALPHA), higher)
    best["metric"] = report.get("primary")
    if best["best"] is not None:
        for rows in tables.values():
            for r in rows:
                if r["name"] == best["best"]:
                    if primary["task"] == HELDOUT:
                        r["heldout_best"] = True
                    elif (r["cells"].get("average", {}).get(primary["mode"]) is not None
                          and rows is tables[primary["task"]]):
                        r["cells"]["average"][primary["mode"]]["best"] = True
    return best


def sb_against_gain(gains: list[dict], mode: Optional[str], alpha: float = verdict.ALPHA) -> dict:
    """S(b) against the realised gain of train_shallow over train_deep (``mode``; the held-out loss, sign
    flipped, when None): Spearman's rho over (split, seed) points with an exact permutation p-value, or
    "too few splits to test" when even a perfect agreement could not reach ``alpha``."""
    key = "shallow_vs_deep_heldout" if mode is None else f"shallow_vs_deep_{mode}"
    xs, ys = [], []
    for g in gains:
        if g.get("S_b") is None:
            continue
        for d in g.get(f"{key}_seeds") or []:
            xs.append(g["S_b"])
            ys.append(-d if mode is None else d)
    splits = len({x for x in xs})
    res = spearman_test(xs, ys, alpha) if len(xs) >= 3 else {"n": len(xs), "rho": None, "p": None,
                                                            "testable": False, "method": "exact permutation"}
    res.update(splits=splits, points=len(xs), gain=key)
    res["words"] = (f"Spearman rho = {res['rho']:+.2f} over {len(xs)} (split, seed) points, {res['method']} "
                    f"p = {res['p']:.3g}" if res["testable"] else
                    f"too few splits to test ({splits} split{'s' * (splits != 1)} x {len(xs) // max(splits, 1)} "
                    f"seed(s): no ordering of {len(xs)} points reaches p < {alpha:g})")
    return res


def report_options(cfg) -> dict:
    """What build_summary needs from an experiment config: ``report.*`` and how the plans treat the
    embeddings, final norm and head (stated in the legend)."""
    p = cfg.plan
    parts = [name for name, on in (("embeddings", p.train_embeddings), ("final norm", p.train_final_norm),
                                   ("head", p.train_head)) if on]
    treat = ("train " + ", ".join(parts)) if parts else "frozen"
    footing = (f"equal footing (sweep.equal_footing): every row, full included, trains only its decoder layers; "
               f"embeddings, final norm and head {treat} in every row") if cfg.sweep.equal_footing else (
        "NOT equal footing: full also trains the embeddings, final norm and head, the other rows "
        f"{'train ' + ', '.join(parts) if parts else 'freeze them'}; a delta against full mixes the layer choice "
        "with training those (sweep.equal_footing=true compares layers alone)")
    return {"primary": cfg.report.primary, "adjust": cfg.report.adjust, "alpha": cfg.report.alpha, "footing": footing}


def build_summary(trials: list[dict], trace: Optional[dict], domain: Sequence[str] = ("wordnet_mc",),
                  general: Sequence[str] = ("mmlu",), resamples: int = DEFAULT_RESAMPLES,
                  report: Optional[dict] = None) -> dict:
    """The summary's numbers (pure): per-task tables, split gains, the verdict (adjusted marks, primary,
    best), domain versus general, S(b) against the gain, flat records. ``trials`` carry their per-question
    ``outcomes`` and held-out block losses (:func:`load_outcomes`) for tests and intervals; without them the
    deltas are shown without either. ``report``: ``{"primary", "adjust", "alpha"}`` (``ReportConfig``)."""
    report = {**DEFAULT_REPORT, **(report or {})}
    tables = summary_table(trials, resamples=resamples)
    split_scores = (trace or {}).get("split_scores", {})
    split_ci = (trace or {}).get("split_intervals", {})
    gains = {task: split_gains(trials, split_scores, task, split_intervals=split_ci, resamples=resamples)
             for task in tables}
    tasks = list(domain) + [t for t in general if t not in domain]
    decision = apply_verdict(tables, gains, tasks, report)
    decision["best"] = primary_best(trials, tables, report, resamples=resamples)
    primary = verdict.parse_primary(report.get("primary"))
    mode = "logit" if primary is None else primary["mode"]  # None: the held-out loss
    sb = {task: sb_against_gain(g, mode, decision["alpha"]) for task, g in gains.items()
          if any(x.get("S_b") is not None for x in g)}
    methods = sorted({x.get("method") for rows in tables.values() for r in rows
                      for x in [c for ms in r["cells"].values() for c in ms.values()] + [r.get("heldout_delta") or {}]
                      if x.get("method")})
    decision["legend"] = verdict.legend(methods, report.get("primary") if decision["primary_found"] else
                                        (f"{report.get('primary')} (not evaluated in this sweep)"
                                         if report.get("primary") else None),
                                        decision["adjust"], decision["alpha"], decision["family_size"])
    if report.get("footing"):
        decision["legend"].append("Plans: " + report["footing"] + ".")
    return {"tables": tables, "split_gains": gains, "domain_general": domain_general(tables, domain, general),
            "records": delta_records(tables), "roles": {"domain": list(domain), "general": list(general)},
            "verdict": decision, "sb_vs_gain": sb, "split_like_best": (trace or {}).get("split_like_best") or {}}


def verdict_markdown(summary: dict) -> list[str]:
    """The verdict block: the primary comparison per row (adjusted), the best or "no clear best", how the
    marks are controlled and what every interval covers, and whether S(b) could be put to a test."""
    v = summary.get("verdict") or {}
    md = ["**Verdict**", ""]
    prim = [c for c in v.get("comparisons", []) if c.get("primary")]
    if prim:
        md.append(f"Primary comparison ({v.get('primary')}) against full, adjusted:")
        for c in prim:
            word = {1: "▲ better", -1: "▼ worse", 0: "no clear change", None: "no test"}[c["sign"]]
            if c["task"] == HELDOUT and c["sign"]:
                word = "▲ lower loss (better)" if c["sign"] < 0 else "▼ higher loss (worse)"
            pa = "-" if c.get("p_adj") is None else f"{c['p_adj']:.3g}"
            md.append(f"- {c['a']}: Δ {c['delta']:+.3f}, p = {_fmt_p(c.get('p'))}, adjusted p = {pa}: {word}")
    else:
        md.append(f"Primary comparison: {v.get('primary') or 'none declared'} - not evaluated in this sweep; "
                  "every comparison is in one Holm family.")
    b = v.get("best")
    if b:
        md.append(f"Best on {b['metric']}: **{b['best']}** (beats every other row, Bonferroni over {b['pairs']} "
                  f"pairs, largest p = {_fmt_p(b['p'])})" if b["best"] else
                  f"Best on {b['metric']}: no clear best - the top row {b['top']} does not beat the runner-up "
                  f"{b['runner_up']} (or another row) at {v.get('alpha', 0.05):g} / {b['pairs']} pairs "
                  f"(largest pairwise p = {_fmt_p(b['p'])})")
    md += _split_words(summary)
    for task, s in (summary.get("sb_vs_gain") or {}).items():
        md.append(f"S(b) against the realised gain ({task}, {s['gain']}): {s['words']}.")
    md.append("")
    md += [f"- {line}" for line in v.get("legend", [])]
    return md


NO_GENERAL = ("No general task ran, so forgetting is not measured here: the default sweep leaves MMLU out because "
              "its 16 questions (2 per subject) gave a [0, 0] interval in every trial, a third of the evaluation "
              "spent on numbers that cannot move; configs/paper-check.yaml runs MMLU (114 questions) as the general "
              "probe, or add it with eval.tasks=[wordnet_mc,mmlu].")


def not_general(summary: dict) -> bool:
    """True when the sweep declared general tasks but none of them ran."""
    general = summary.get("roles", {}).get("general", [])
    return bool(general) and not any(t in summary.get("tables", {}) for t in general)


def rich_verdict(summary: dict) -> list[str]:
    """The verdict block for the terminal (the same lines as summary.md's, Markdown marks dropped)."""
    lines = [line.replace("**", "") for line in verdict_markdown(summary) if line]
    return lines + ([NO_GENERAL] if not_general(summary) else [])


def _split_words(summary: dict) -> list[str]:
    """The split S(b) favours among the sweep's splits, and the ones the trace cannot tell from it."""
    like = summary.get("split_like_best") or {}
    gains = next(iter((summary.get("split_gains") or {}).values()), [])
    scored = [(g["split"], g["S_b"]) for g in gains if g.get("S_b") is not None]
    if not scored:
        return []
    top = max(scored, key=lambda x: x[1])[0]
    same = [r for r, _ in scored if like.get(f"{float(r):g}")]
    if not like:
        return [f"Largest S(b) among the sweep's splits: r = {top:g} (argmax of point estimates; the trace gave no "
                "set of splits indistinguishable from it)."]
    tail = "the data single it out" if same == [top] else \
        "not distinguishable from it: r = " + ", ".join(f"{r:g}" for r in same)
    return [f"Largest S(b) among the sweep's splits: r = {top:g}; {tail} (one-sided 95% bound over prompts)."]


def _fmt_p(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3g}"


def summary_markdown(summary: dict) -> str:
    """summary.md: the verdict and how to read it, domain versus general, then per task the table and the
    S(b) gains."""
    md = [LEGEND[0].upper() + LEGEND[1:] + ".", ""]
    if summary.get("verdict"):
        md += verdict_markdown(summary) + [""]
    if summary["domain_general"]:
        md += [domain_general_markdown(summary["domain_general"]), ""]
    missing = {role: [t for t in summary.get("roles", {}).get(role, []) if t not in summary["tables"]]
               for role in ("domain", "general")}
    if any(missing.values()):
        md += ["Not evaluated in this sweep: " + "; ".join(f"eval.{role} {', '.join(ts)}"
                                                          for role, ts in missing.items() if ts) + ".", ""]
    if not_general(summary):
        md += [NO_GENERAL, ""]
    for task, rows in summary["tables"].items():
        md += [table_markdown(task, rows), ""]
        if summary["split_gains"].get(task):
            md += [gains_markdown(task, summary["split_gains"][task]), ""]
    return "\n".join(md)


DROP = ("losses", "outcomes", "heldout_blocks", "heldout_weights", "heldout_docs")


def write_summary(run_dir: Path, trials: list[dict], trace: Optional[dict], num_layers: int,
                  domain: Sequence[str] = ("wordnet_mc",), general: Sequence[str] = ("mmlu",), report=None) -> dict:
    """Write the summary files into ``run_dir/summary``; ``summary["files"]`` lists them (the sweep job
    logs them to its run: :func:`raycpt.jobs.sweep.log_summary`)."""
    from raycpt.io import atomic_write_json, atomic_write_text

    out = Path(run_dir) / "summary"
    out.mkdir(parents=True, exist_ok=True)
    full = [load_outcomes(t) for t in trials]
    summary = build_summary(full, trace, domain, general, report=report)
    files = [atomic_write_text(out / "deltas.csv", _csv(summary["records"]))]
    for task, rows in summary["tables"].items():
        files.append(atomic_write_text(out / f"table_{task}.csv", _csv(delta_records({task: rows}))))
        files.append(plot_bars(out / f"scores_{task}.png", task, rows))
    files.append(plot_losses(out / "loss_curves.png", trials))
    if any(t.get("heldout_loss") is not None for t in trials):
        files.append(plot_heldout(out / "heldout_loss.png", trials))
    files.append(atomic_write_text(out / "summary.md", summary_markdown(summary)))
    summary.update(num_layers=num_layers, recommended_split=(trace or {}).get("recommended_split"),
                   trials=[{k: v for k, v in t.items() if k not in DROP} for t in trials])
    files.append(atomic_write_json(out / "summary.json", summary))
    summary["files"] = [str(f) for f in files]
    return summary
