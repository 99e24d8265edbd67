"""Uncertainty of the numbers raycpt reports: percentile bootstrap intervals and a t-interval over seeds.

Pure numpy (scipy only for the t quantile), seeded with a ``numpy.random.Generator``, vectorised over
resamples in chunks so memory stays bounded (a chunk holds at most ``CHUNK_ELEMS`` resampled values).

* :func:`paired_delta` - the difference of two means measured on the *same* units (two models on the
  same questions, or on the same held-out blocks): the units are resampled with replacement, the same
  indices for both models, and the mean difference is recomputed per resample (optionally weighted, e.g.
  tokens per block). Percentile interval.
* :func:`stratified_paired_delta` - the same for the unweighted mean over strata of the per-stratum
  differences (the paper's Average column = the mean of the category accuracies): each stratum is
  resampled within itself, so every resample keeps the category sizes, as the statistic assumes.
* :func:`seed_interval` - the mean over seeds with a Student-t interval (see its docstring for why not
  a bootstrap).
* :func:`bootstrap` - the generic paired percentile bootstrap the others use; the boundary score S(b)
  over prompts is :func:`raycpt.diagnostics.scores.boundary_score_interval` on top of it.

Every interval is an :class:`Interval` (point, lo, hi, n, method); a difference counts as a change only
when its interval excludes 0 (:meth:`Interval.sign`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Iterator, Optional, Sequence

import numpy as np

DEFAULT_RESAMPLES = 2000
LEVEL = 0.95
CHUNK_ELEMS = 4_000_000  # resampled values per chunk (~32 MB of float64)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its ``level`` interval [lo, hi] from ``n`` resampled units (questions,
    blocks, prompts, seeds); ``lo``/``hi`` are NaN when there is no spread to measure (one seed)."""

    point: float
    lo: float
    hi: float
    n: int
    method: str
    level: float = LEVEL

    def sign(self) -> int:
        """+1 when the whole interval lies above 0, -1 when below, 0 when it contains 0 (or is undefined)."""
        if self.lo > 0:
            return 1
        if self.hi < 0:
            return -1
        return 0

    def to_dict(self) -> dict:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


def generator(seed) -> np.random.Generator:
    """``seed`` as a Generator (an int, None, or a Generator passed through)."""
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def resample_indices(n: int, resamples: int, rng: np.random.Generator, width: int = 1) -> Iterator[np.ndarray]:
    """Index arrays of shape (m, n), drawn uniformly from 0..n-1 with replacement, m rows at a time
    (``m * n * width <= CHUNK_ELEMS``), ``resamples`` rows in all, in drawing order."""
    rows = max(1, CHUNK_ELEMS // max(1, n * width))
    for start in range(0, resamples, rows):
        yield rng.integers(0, n, size=(min(rows, resamples - start), n))


def percentile_interval(replicates: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """The (1-level)/2 and (1+level)/2 quantiles of the replicates (linear interpolation, NaNs dropped)."""
    r = np.asarray(replicates, dtype=np.float64)
    r = r[~np.isnan(r)]
    if r.size == 0:
        return math.nan, math.nan
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(r, [a, 1.0 - a])
    return float(lo), float(hi)


def bootstrap_replicates(data: Sequence[np.ndarray], statistic: Callable[..., np.ndarray],
                         resamples: int = DEFAULT_RESAMPLES, seed=0) -> np.ndarray:
    """``statistic`` on ``resamples`` paired resamples of ``data`` (arrays of equal length on axis 0,
    resampled with the same indices). ``statistic(*arrays)`` gets arrays of shape (m, n, ...) and
    returns (m,): it is vectorised over the leading resample axis."""
    arrays = [np.asarray(a) for a in data]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError("paired bootstrap: the arrays differ in length")
    if n == 0:
        raise ValueError("bootstrap of nothing: no units to resample")
    width = max(int(np.prod(a.shape[1:])) for a in arrays)
    out = [np.asarray(statistic(*[a[idx] for a in arrays]), dtype=np.float64)
           for idx in resample_indices(n, resamples, generator(seed), width)]
    return np.concatenate(out)


def bootstrap(data: Sequence[np.ndarray], statistic: Callable[..., np.ndarray], resamples: int = DEFAULT_RESAMPLES,
              seed=0, level: float = LEVEL, method: str = "bootstrap") -> Interval:
    """Paired percentile bootstrap: the point estimate is ``statistic`` on the data itself (as one
    "resample"), the interval the percentiles of its replicates (:func:`bootstrap_replicates`)."""
    arrays = [np.asarray(a) for a in data]
    point = float(np.asarray(statistic(*[a[None] for a in arrays]))[0])
    lo, hi = percentile_interval(bootstrap_replicates(arrays, statistic, resamples, seed), level)
    return Interval(point, lo, hi, len(arrays[0]), method, level)


def _weighted_mean_diff(a, b, w):
    return ((a - b) * w).sum(axis=-1) / w.sum(axis=-1)


def paired_delta(a: Sequence[float], b: Sequence[float], weights: Optional[Sequence[float]] = None,
                 resamples: int = DEFAULT_RESAMPLES, seed=0, level: float = LEVEL, scale: float = 1.0) -> Interval:
    """``scale * (mean(a) - mean(b))`` over paired units (``weights``: a weighted mean, e.g. tokens per
    held-out block) with its paired percentile bootstrap interval. ``a[i]`` and ``b[i]`` belong to the
    same unit (question i answered by two models: 0/1 correct; block i's loss under two models)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    w = np.ones_like(a) if weights is None else np.asarray(weights, dtype=np.float64)
    iv = bootstrap([a, b, w], lambda x, y, z: scale * _weighted_mean_diff(x, y, z), resamples, seed, level,
                   "paired bootstrap")
    return iv


def stratified_paired_delta(a: Sequence[float], b: Sequence[float], strata: Sequence, resamples: int = DEFAULT_RESAMPLES,
                            seed=0, level: float = LEVEL, scale: float = 1.0) -> Interval:
    """``scale`` x the unweighted mean over strata of (mean(a) - mean(b)) within each stratum, with a
    paired percentile bootstrap that resamples each stratum within itself (its size kept)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    s = np.asarray(list(strata), dtype=object)
    if not (len(a) == len(b) == len(s)) or len(a) == 0:
        raise ValueError("stratified bootstrap: a, b and strata must be non-empty and of equal length")
    rng = generator(seed)
    groups = [np.flatnonzero(s == g) for g in dict.fromkeys(s.tolist())]
    point = scale * float(np.mean([(a[g] - b[g]).mean() for g in groups]))
    reps = np.zeros(resamples)
    for g in groups:  # strata one after the other, each with its own draws from the one generator
        d = a[g] - b[g]
        reps += np.concatenate([d[idx].mean(axis=1) for idx in resample_indices(len(d), resamples, rng)])
    lo, hi = percentile_interval(scale * reps / len(groups), level)
    return Interval(point, lo, hi, len(a), "stratified paired bootstrap", level)


def seed_interval(values: Sequence[float], level: float = LEVEL) -> Interval:
    """The mean over seeds with a Student-t interval: mean ± t_{(1+level)/2, k-1} · sd / sqrt(k).

    Not a bootstrap: with the k = 2-5 seeds a sweep can afford, resampling seeds has only C(2k-1, k)
    distinct resamples (10 for k = 3) and its percentile interval lies inside the range of the seeds,
    far too narrow; the t-interval accounts for estimating the spread from k values. One seed gives
    the value with NaN bounds (no spread to measure)."""
    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=np.float64)
    k = len(v)
    if k == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "t over seeds", level)
    mean = float(v.mean())
    if k == 1:
        return Interval(mean, math.nan, math.nan, 1, "t over seeds", level)
    from scipy.stats import t

    half = float(t.ppf((1.0 + level) / 2.0, k - 1)) * float(v.std(ddof=1)) / math.sqrt(k)
    return Interval(mean, mean - half, mean + half, k, "t over seeds", level)
