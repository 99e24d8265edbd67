"""The sweep's verdict: the family of comparisons the marks rest on, decided with the sweep's multiplicity
control (:mod:`raycpt.report.sweep.family`) and written into the cells; the best row on the primary metric; S(b)
against the realised gain."""

from __future__ import annotations

from typing import Optional, Sequence

from raycpt.report.sweep.seeds import RUN_MODEL, heldout_units, question_units, run_noise
from raycpt.report.sweep.statistics import CHECKPOINT, STRATEGY, claim_of
from raycpt.report.sweep.cells import (GENERAL, cell_value, mean_of, compare, group_trials, heldout_delta,
                                       question_delta)
from raycpt.report.sweep import family
from raycpt.report.sweep.family import HELDOUT
from raycpt.report.sweep.base import BASE
from raycpt.stats import DEFAULT_RESAMPLES, spearman_test

def _family(tables: dict, gains: dict, tasks: Sequence[str], primary: Optional[dict], baseline: str,
            base_rows: Sequence[dict] = ()) -> list[dict]:
    """The comparisons a mark or a reading can rest on (:mod:`raycpt.report.sweep.family`), each with the cells it
    decides: every row against ``baseline`` on the Average column of every task that ran (domain and general
    first) and mode, the held-out loss, and train_shallow against train_deep at each split (the gains
    table), and every row against the untrained model on the gain and forgetting metrics (``base_rows``:
    :func:`raycpt.report.sweep.base.against_base`). The base row's own comparisons against ``baseline`` are left
    out (full against base says the same). A comparison found twice (the gains table repeats shallow - full) is
    one member."""
    fam: dict[tuple, dict] = {}

    def add(key, task, mode, d, cell=None, flat=None):
        if d.get("delta") is None:
            return
        e = fam.setdefault(key, {"a": key[0], "b": key[1], "task": task, "mode": mode, "delta": d["delta"],
                                 "p": d.get("p"), "claim": claim_of(d.get("method")), "cells": [], "flat": [],
                                 "family": family.FAMILY_BASE if key[1] == BASE else family.FAMILY_FULL})
        e["primary"] = key[1] == baseline and family.is_primary(e, primary)
        if cell is not None:
            e["cells"].append(cell)
        if flat is not None:
            e["flat"].append(flat)

    for task in list(dict.fromkeys([t for t in tasks if t in tables] + list(tables))):
        for r in tables[task]:
            if r["name"] == baseline or r["strategy"] == BASE:
                continue
            for mode, cell in r["cells"].get("average", {}).items():
                add((r["name"], baseline, task, mode), task, mode, cell, cell=cell)
            for loss, key in ((HELDOUT, "heldout_delta"), (GENERAL, "general_delta")):
                if r.get(key):
                    add((r["name"], baseline, loss, None), loss, None, r[key], cell=r[key])
    for r in base_rows:
        for cell in r["cells"]:
            add((r["name"], BASE, cell["task"], cell["mode"]), cell["task"], cell["mode"], cell, cell=cell)
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
    return {"delta": g.get(key), "p": g.get(f"{key}_p"), "method": g.get(f"{key}_method")}


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


def apply_verdict(tables: dict, gains: dict, tasks: Sequence[str], report: dict, baseline: str = "full",
                  base_rows: Sequence[dict] = ()) -> dict:
    """Decide the family (adjusted p-values, marks) and write the decisions into the cells they rest on.
    Returns ``{"comparisons", "primary", "claim", "run_model", "adjust", "alpha", "family_size", "base_size"}``;
    ``claim`` (each comparison's too): ``strategy`` when the tests hold run-to-run noise
    (:mod:`raycpt.report.sweep.seeds`; ``run_model`` says which model of it), ``checkpoint`` when they do not.
    ``family_size`` / ``base_size``: the tested comparisons against full / against base (two families)."""
    primary = family.parse_primary(report.get("primary"))
    _clear_marks(tables, gains)
    for r in base_rows:  # the interval-only signs of the comparisons against base, as in the tables
        for x in r["cells"]:
            x["raw_sign"], x["sign"] = x.get("sign"), None
    untuned = set(report.get("untuned") or ())  # issue 47: a row whose rate is at its grid's edge claims nothing
    fam = [e for e in _family(tables, gains, tasks, primary, baseline, base_rows)
           if e["a"] not in untuned and e["b"] not in untuned]
    decided = family.decide(fam, report.get("adjust", "holm"), report.get("alpha", family.ALPHA))
    for d in decided:
        for cell in d["cells"]:
            cell.update(sign=d["sign"], p_adj=d["p_adj"], role=d["role"], claim=d["claim"], family=d["family"])
        for g, key in d["flat"]:
            g.update({f"{key}_sign": d["sign"], f"{key}_p_adj": d["p_adj"], f"{key}_role": d["role"],
                      f"{key}_claim": d["claim"]})
    comps = [{k: v for k, v in d.items() if k not in ("cells", "flat")} for d in decided]
    claims = {c["claim"] for c in comps if c["p"] is not None}
    return {"comparisons": comps, "primary": report.get("primary"), "primary_found": any(c["primary"] for c in comps),
            "claim": STRATEGY if STRATEGY in claims else (CHECKPOINT if claims else None),
            "run_model": RUN_MODEL if STRATEGY in claims else None,
            "adjust": report.get("adjust", "holm"), "alpha": report.get("alpha", family.ALPHA),
            "family_size": sum(c["p"] is not None and c["family"] == family.FAMILY_FULL for c in comps),
            "base_size": sum(c["p"] is not None and c["family"] == family.FAMILY_BASE for c in comps)}


def primary_best(trials: list[dict], tables: dict, report: dict, baseline: str = "full",
                 resamples: int = DEFAULT_RESAMPLES) -> Optional[dict]:
    """The best row on the primary metric (:func:`raycpt.report.sweep.family.best_row`: it must beat every other
    row, Bonferroni over all pairs), marked ``best`` on its cell; None without a primary that ran."""
    primary = family.parse_primary(report.get("primary"))
    if primary is None:
        return None
    untuned = set(report.get("untuned") or ())  # issue 47: untuned rows take no part in best
    groups = {n: g for n, g in group_trials(trials).items() if g["strategy"] != BASE and n not in untuned}
    if primary["task"] == HELDOUT:
        value = (lambda t: t.get("heldout_loss"))
        values = {n: mean_of(g["runs"], value)["value"] for n, g in groups.items()}
        noise = run_noise(groups, value)

        def pair(a, b):
            return compare(groups[a]["runs"], groups[b]["runs"], value,
                           lambda x, y: heldout_delta(x, y, resamples), heldout_units, noise)
        higher = False
    else:
        task, mode = primary["task"], primary["mode"]
        if task not in tables:
            return None
        value = cell_value(task, "average", mode)
        values = {n: mean_of(g["runs"], value)["value"] for n, g in groups.items()}
        noise = run_noise(groups, value)

        def pair(a, b):
            return compare(groups[a]["runs"], groups[b]["runs"], value,
                           lambda x, y: question_delta(x, y, task, "average", mode, resamples),
                           lambda ra, rb: question_units(ra, rb, task, "average", mode), noise)
        higher = True
    if sum(v is not None for v in values.values()) < 2:
        return None
    methods = []

    def pair_p(a, b):
        d = pair(a, b)
        methods.append(d["method"])
        return d["p"]
    best = family.best_row(values, pair_p, report.get("alpha", family.ALPHA), higher)
    best["metric"] = report.get("primary")
    best["claim"] = STRATEGY if methods and all(claim_of(m) == STRATEGY for m in methods) else CHECKPOINT
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


def sb_against_gain(gains: list[dict], mode: Optional[str], alpha: float = family.ALPHA) -> dict:
    """S(b) against the realised gain of train_shallow at r over train_deep at 1 - r (equal trainable layer
    counts; ``mode``; the held-out loss, sign flipped, when None): Spearman's rho over the splits, one point per
    split (its gain: the mean over runs, so a split's seeds are not counted as independent points), with an
    exact permutation p-value, or "too few splits to test" when even a perfect agreement could not reach
    ``alpha`` (fewer than 5 splits). Splits without an equal-count deep row are left out and counted."""
    key = "shallow_vs_deep_heldout" if mode is None else f"shallow_vs_deep_{mode}"
    xs, ys, missing = [], [], 0
    for g in gains:
        if g.get("S_b") is None:
            continue
        if g.get(key) is None:
            missing += g.get("deep_missing") is not None
            continue
        xs.append(g["S_b"])
        ys.append(-g[key] if mode is None else g[key])
    res = spearman_test(xs, ys, alpha) if len(xs) >= 3 else {"n": len(xs), "rho": None, "p": None,
                                                            "testable": False, "method": "exact permutation"}
    res.update(splits=len(xs), points=len(xs), gain=key, missing_partner=missing)
    tail = f"; {missing} split(s) without an equal-count train_deep row left out" if missing else ""
    res["words"] = (f"Spearman rho = {res['rho']:+.2f} over {len(xs)} splits (shallow at r against deep at 1 - r), "
                    f"{res['method']} p = {res['p']:.3g}{tail}" if res["testable"] else
                    f"too few splits to test ({len(xs)} split{'s' * (len(xs) != 1)} with an equal-count pair: no "
                    f"ordering of {len(xs)} points reaches p < {alpha:g}){tail}")
    return res
