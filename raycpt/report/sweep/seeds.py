"""Run-to-run noise in the sweep's verdict (issue 36): the training run is the unit of evidence.

With two or more runs of both rows compared (``sweep.seeds``, or ``sweep.floor_seeds``), a comparison is a
claim about two *strategies*: :func:`raycpt.stats.welch_run_test`, the difference of the rows' means over their
runs against each row's *own* run-to-run variance (Welch-Satterthwaite df of the run parts alone; issue 50: run
noise is not assumed equal across plans - LoRA, LISA and full differ) plus the sampling noise of the units every
run shares (documents of the held-out set, clustered; questions). With one run of either row there is no estimate
of its run-to-run noise: the comparison is of two checkpoints (:data:`CHECKPOINT`) and the verdict says so.

Pure: trial dicts in (their ``heldout_blocks`` / ``heldout_docs`` / ``outcomes``), numbers out.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import numpy as np

from raycpt.report.sweep.model import as_summary
from raycpt.report.sweep.statistics import CHECKPOINT, METHOD_HELDOUT, METHOD_QUESTIONS, STRATEGY
from raycpt.stats import mean_sampling_variance, pooled_run_variance, ratio_delta_se
from raycpt.tasks import is_continuous

RUN_MODEL = "per plan (Welch-Satterthwaite)"
"""The run-noise model of every strategy test, as the verdict states it."""
SEEDS_HINT = "sweep.seeds=[0,1,2]"
FLOOR_HINT = "sweep.floor_seeds=[1,2]"


def run_noise(groups: dict, value: Callable[[dict], Optional[float]]) -> dict:
    """``{"var", "df", "runs"}``: the run-to-run variance of ``value`` pooled over every row of the sweep
    (:func:`raycpt.stats.pooled_run_variance`: shown, and df 0 says no row has two runs; the tests use each
    row's own variance, :func:`raycpt.stats.welch_run_test`)."""
    vals = [[value(t) for t in g["runs"].values()] for g in groups.values()]
    vals = [[v for v in row if v is not None] for row in vals]
    var, df = pooled_run_variance(vals)
    return {"var": var, "df": df, "runs": sum(len(v) for v in vals)}


def heldout_units(runs_a: list[dict], runs_b: list[dict], probe: str = "heldout") -> Optional[tuple[float, float, str]]:
    """(variance, df, method) of the document-sampling error of mean(a) - mean(b): each block's loss averaged over a
    row's runs, then the ratio estimator's variance over documents (clusters: ``heldout_docs``; blocks when the
    results lack them). None unless every run has the same held-out blocks."""
    la = [t.get(f"{probe}_blocks") for t in runs_a]
    lb = [t.get(f"{probe}_blocks") for t in runs_b]
    if not la or not lb or not all(la + lb) or len({len(x) for x in la + lb}) != 1:
        return None
    first = runs_a[0]
    docs = first.get(f"{probe}_docs")
    docs = docs if docs is not None and len(docs) == len(la[0]) else None
    _, se, k = ratio_delta_se(np.mean(la, axis=0), np.mean(lb, axis=0), clusters=docs,
                              weights=first.get(f"{probe}_weights"))
    return (0.0, math.inf, METHOD_HELDOUT) if math.isnan(se) else (se * se, k - 1, METHOD_HELDOUT)


def _per_question(runs: list[dict], task: str, cat: str, mode: str) -> Optional[dict]:
    """{question id: (category, share of the runs that got it right, or the mean of a continuous score over the
    runs)} over the questions every run answered."""
    outs = [(t.get("outcomes") or {}).get(task, {}).get(mode) for t in runs]
    if not outs or not all(outs):
        return None
    ids = [q for q in outs[0] if all(q in o for o in outs) and (cat in ("average", "overall") or outs[0][q][0] == cat)]
    return {q: (outs[0][q][0], float(np.mean([float(o[q][1]) for o in outs]))) for q in ids}


def question_units(runs_a: list[dict], runs_b: list[dict], task: str, cat: str, mode: str
                   ) -> Optional[tuple[float, float, str]]:
    """(variance, df, method) of the question-sampling error of mean(a) - mean(b) in points: per question the share of
    a's runs right minus b's; the Average column as the mean of the category means (stratified). It also holds
    per-question run noise once more (counted in the run variance too): conservative."""
    qa, qb = _per_question(runs_a, task, cat, mode), _per_question(runs_b, task, cat, mode)
    if not qa or not qb:
        return None
    ids = [q for q in qa if q in qb]
    if len(ids) < 2:
        return None
    scale = 1.0 if is_continuous(mode) else 100.0  # shares right -> points; continuous scores as they are
    d = [scale * (qa[q][1] - qb[q][1]) for q in ids]
    var, df = mean_sampling_variance(d, [qa[q][0] for q in ids] if cat == "average" else None)
    return var, df, METHOD_QUESTIONS


def has_run_noise(noise: Optional[dict]) -> bool:
    return bool(noise) and noise.get("df", 0) > 0 and not math.isnan(noise.get("var", math.nan))


def strategy_claims_allowed(summary) -> bool:
    """Whether the summary's marks and best may be shown as findings: only when the verdict's comparisons hold
    run-to-run noise (a strategy claim). A one-seed sweep without a noise estimate compares checkpoints; its
    views then show each delta with its interval and no ▲ / ▼ and no best (issue 50). ``summary``: a
    :class:`~raycpt.report.sweep.model.Summary` or its JSON form."""
    return as_summary(summary).verdict.get("claim") == STRATEGY


def checkpoint_line(summary) -> Optional[str]:
    """The verdict's one line when the sweep made no strategy claim: what its marks compare, and the command
    that makes them strategy claims. None when run-to-run noise was measured."""
    v = as_summary(summary).verdict
    if v.get("claim") != CHECKPOINT:
        return None
    return ("One run per row: every ▲ / ▼ and best mark below compares these checkpoints (document and question "
            "sampling only), not the strategies - run-to-run noise is not measured. For a claim about the "
            f"strategies run several seeds: raycpt sweep CONFIG {SEEDS_HINT}, or the noise floor {FLOOR_HINT} "
            "(full at both seeds, every other row at the first: each plan its own run variance; docs/analysis.md).")
