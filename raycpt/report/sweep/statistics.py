"""The verdict's statistics, one registered entry each (:data:`raycpt.registry.STATISTICS`, lm-eval's pattern).

A statistic is the name an interval carries (``Interval.method``, a cell's ``method``), the function of
:mod:`raycpt.stats` that computes it, what its 95% interval covers (the legend's ``[name] 95% interval covers ...``
line) and the claim it supports: a *strategy* (run-to-run noise inside the test) or two *checkpoints* (the sampling
of questions or documents only). Adding a statistic to the verdict is one :func:`statistic` call here beside the
function that computes it; the legend (:func:`raycpt.report.sweep.family.legend`) and the claim a reading may make
(:func:`claim_of`) read this registry and nothing else.

Pure: names and words; the functions are the pure ones of :mod:`raycpt.stats`.
"""

from __future__ import annotations

from typing import Callable, Optional

from raycpt import stats
from raycpt.registry import STATISTICS

STRATEGY, CHECKPOINT = "strategy", "checkpoint"
UNREGISTERED = "the noise its method names"
"""What the legend says of a method no entry names (a summary.json written by another version)."""


def statistic(name: str, compute: Callable, claim: str, covers: str) -> str:
    """Register the statistic ``name`` (computed by ``compute``; ``claim``: :data:`STRATEGY` or :data:`CHECKPOINT`;
    ``covers``: the legend's words for what its interval covers) and return its name. A name registered twice, or a
    claim that is neither, is refused."""
    if claim not in (STRATEGY, CHECKPOINT):
        raise ValueError(f"statistic {name!r}: claim {claim!r} is neither {STRATEGY!r} nor {CHECKPOINT!r}")
    STATISTICS.register(name, compute, help=covers, claim=claim)
    return name


_WELCH = ("run-to-run noise (a strategy claim: each plan's own run variance, Welch-Satterthwaite df; not assumed "
          "equal across plans)")

METHOD_HELDOUT = statistic(
    "runs per plan + documents", stats.welch_run_test, STRATEGY,
    f"{_WELCH} and document sampling of the held-out set (blocks averaged over a row's runs, documents as clusters)")
METHOD_QUESTIONS = statistic(
    "runs per plan + questions", stats.welch_run_test, STRATEGY,
    f"{_WELCH} and question sampling (each question's share right over a row's runs)")
METHOD_RUNS = statistic(
    "runs per plan", stats.welch_run_test, STRATEGY,
    "run-to-run noise, each plan's own run variance (a strategy claim) on a fixed question set")
RUN_METHODS = (METHOD_HELDOUT, METHOD_QUESTIONS, METHOD_RUNS)

statistic("exact McNemar + score interval", stats.paired_accuracy_delta, CHECKPOINT,
          "question sampling only (one run per row: two checkpoints on the same questions, not two strategies)")
statistic("t over seeds", stats.seed_interval, CHECKPOINT,
          "seed noise on a fixed question set (no per-question records)")
statistic("t over documents", stats.ratio_delta_t, CHECKPOINT,
          "document sampling of the held-out set only (the blocks of a document taken as one unit; one run per row: "
          "two checkpoints, not two strategies)")
statistic("t over blocks", stats.ratio_delta_t, CHECKPOINT,
          "block sampling of the held-out set (no document ids: blocks taken as independent)")
statistic("paired t over questions", stats.paired_mean_t, CHECKPOINT,
          "question sampling only, for a continuous score per question (one run per row: two checkpoints on the "
          "same questions, not two strategies)")
statistic("stratified paired bootstrap", stats.stratified_paired_delta, CHECKPOINT,
          "question sampling within categories (exploratory; coverage not shown)")
statistic("paired bootstrap", stats.paired_delta, CHECKPOINT,
          "question sampling (percentile bootstrap; exploratory)")


def claim_of(method: Optional[str]) -> Optional[str]:
    """What a comparison's test speaks about: a strategy (run-to-run noise inside), a checkpoint (a method no entry
    names included), or None (no test)."""
    if method is None:
        return None
    return STATISTICS.info(method, "claim", CHECKPOINT) if method in STATISTICS else CHECKPOINT


def covers(method: str) -> str:
    """The legend's words for what ``method``'s 95% interval covers (:data:`UNREGISTERED` for a name no entry
    names)."""
    return STATISTICS.entry(method).help if method in STATISTICS else UNREGISTERED
