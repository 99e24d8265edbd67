"""Uncertainty of the numbers raycpt reports, and the tests its verdict rests on.

Pure numpy (scipy for quantiles and the binomial), seeded with a ``numpy.random.Generator``, bootstraps
vectorised over resamples in chunks so memory stays bounded (a chunk holds at most ``CHUNK_ELEMS`` values).
Which method is calibrated where is shown by ``benchmarks/bench_calibration.py``.

* :func:`paired_accuracy_delta` - two models' 0/1 answers to the same questions: the exact McNemar
  p-value (:func:`mcnemar_exact`, the binomial test on the discordant questions) and the
  continuity-corrected Tango score interval (:func:`paired_score_bounds`; exact coverage >= 0.95 over
  32-400 questions with few discordant pairs, where the percentile bootstrap falls to ~0.90).
* :func:`ratio_delta_t` - a token-weighted mean difference of paired held-out blocks with a t-interval
  and p-value over documents (clusters), or over blocks without document ids.
* :func:`welch_run_test` - several seeds: a strategy against another, each plan's own run variance
  (Welch-Satterthwaite df of the run parts) plus the shared units' sampling noise (the sweep's verdict);
  :func:`pooled_run_test` - the same with run noise pooled over the sweep (:func:`pooled_run_variance`;
  assumes equal run variance across plans); :func:`seed_interval` - the t-interval over seeds alone.
* :func:`holm`, :func:`benjamini_hochberg`, :func:`adjust` - multiplicity control (the graphical, gated
  Holm of the sweep verdict is in :mod:`raycpt.report.sweep.family`).
* :func:`bca_interval`, :func:`spearman_test` (exact permutation p, or "not testable" when even a perfect
  agreement could not reach alpha), :func:`fieller_ratio` (a ratio's interval, bounded only when its
  denominator is clearly non-zero), :func:`stratified_mcnemar_p`.
* :func:`paired_delta`, :func:`stratified_paired_delta`, :func:`bootstrap` - percentile bootstraps (the
  S(b) interval over prompts builds on :func:`bootstrap_replicates`); exploratory where their coverage is
  not shown.

Every interval is an :class:`Interval` (point, lo, hi, n, method, level, p).
"""

from __future__ import annotations

import functools
import itertools
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
    p: Optional[float] = None  # the two-sided p-value of "no difference" when a test goes with the interval

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

    se = float(v.std(ddof=1)) / math.sqrt(k)
    half = float(t.ppf((1.0 + level) / 2.0, k - 1)) * se
    p = (1.0 if mean == 0 else 0.0) if se == 0 else float(2 * t.sf(abs(mean) / se, k - 1))
    return Interval(mean, mean - half, mean + half, k, "t over seeds", level, p)


# ------------------------------------------------------------------------------ exact paired tests (0/1 outcomes)
CC = 0.5  # continuity correction of the paired score interval (events); see paired_score_bounds
Z975 = 1.959963984540054  # the 97.5% standard normal quantile (level 0.95)


def _z(level: float) -> float:
    from scipy.stats import norm

    return Z975 if level == LEVEL else float(norm.ppf((1.0 + level) / 2.0))


def discordant(a: Sequence[float], b: Sequence[float]) -> tuple[int, int, int]:
    """(n10, n01, n) of two 0/1 outcome vectors on the same units: n10 = a right and b wrong, n01 = a wrong
    and b right, n = units."""
    x = np.asarray(a, dtype=bool)
    y = np.asarray(b, dtype=bool)
    if x.shape != y.shape:
        raise ValueError("paired outcomes: a and b differ in length")
    return int((x & ~y).sum()), int((~x & y).sum()), int(x.size)


def mcnemar_exact(n10, n01):
    """Two-sided exact McNemar p-value: the binomial test of n10 successes in n10 + n01 discordant pairs at
    1/2 (``min(1, 2 P(X <= min(n10, n01)))``, X ~ Bin(n10 + n01, 1/2); 1 without a discordant pair).
    Vectorised over arrays of counts."""
    from scipy.stats import binom

    b = np.asarray(n10)
    c = np.asarray(n01)
    m = b + c
    p = np.minimum(1.0, 2.0 * binom.cdf(np.minimum(b, c), m, 0.5))
    p = np.where(m == 0, 1.0, p)
    return float(p) if p.ndim == 0 else p


def _restricted_var(n10, n01, n, delta):
    """n x Var of (n10 - n01)/n under Delta = delta at the restricted maximum-likelihood cell probabilities
    (p10 = q + delta, p01 = q; q the positive root of 2n q^2 - B q - n01 delta (1 - delta) = 0)."""
    bb = n10 * (1 - delta) + n01 * (1 - 3 * delta) - 2 * (n - n10 - n01) * delta
    q = (bb + np.sqrt(np.maximum(bb * bb + 8 * n * n01 * delta * (1 - delta), 0.0))) / (4 * n)
    q = np.clip(q, np.maximum(0.0, -delta), (1 - delta) / 2)
    return np.maximum(2 * q + delta - delta * delta, 1e-300)


def _score_z(n10, n01, n, delta, cc: float = 0.0):
    """The score statistic of Delta = delta (|.| reduced by ``cc`` towards 0: a continuity correction)."""
    dev = n10 - n01 - n * delta
    dev = np.sign(dev) * np.maximum(np.abs(dev) - cc, 0.0)
    return dev / np.sqrt(n * _restricted_var(n10, n01, n, delta))


def paired_score_bounds(n10, n01, n, level: float = LEVEL, cc: float = CC, iters: int = 60):
    """Tango's (1998) asymptotic score interval for Delta = p10 - p01 of paired proportions: the deltas whose
    score statistic (variance at the restricted MLE) stays within the normal quantile. Vectorised over count
    arrays; bisection on each side of the point (the statistic is monotone in delta). Returns (lo, hi)."""
    b = np.asarray(n10, dtype=np.float64)
    c = np.asarray(n01, dtype=np.float64)
    nn = np.asarray(n, dtype=np.float64) * np.ones_like(b)
    z = _z(level)
    point = (b - c) / nn
    out = []
    for side in (-1, 1):
        inner, outer = point.copy(), np.full_like(point, float(side))
        for _ in range(iters):
            mid = 0.5 * (inner + outer)
            beyond = np.abs(_score_z(b, c, nn, mid, cc)) > z
            outer = np.where(beyond, mid, outer)
            inner = np.where(beyond, inner, mid)
        out.append(np.clip(0.5 * (inner + outer), -1.0, 1.0))
    lo, hi = np.minimum(out[0], point), np.maximum(out[1], point)
    return (float(lo), float(hi)) if lo.ndim == 0 else (lo, hi)


def paired_accuracy_delta(a: Sequence[float], b: Sequence[float], level: float = LEVEL,
                          scale: float = 1.0) -> Interval:
    """``scale * (mean(a) - mean(b))`` of two 0/1 outcome vectors on the same questions with the
    continuity-corrected score interval (:func:`paired_score_bounds`) and the exact McNemar p-value
    (:func:`mcnemar_exact`). Its coverage at few discordant pairs is shown exactly by
    ``benchmarks/bench_calibration.py`` (minimum over 32-400 questions and 0.5-20 expected discordant pairs)."""
    n10, n01, n = discordant(a, b)
    if n == 0:
        raise ValueError("paired accuracy of nothing: no questions")
    lo, hi, p = _paired_cached(n10, n01, n, level)
    return Interval(scale * (n10 - n01) / n, scale * lo, scale * hi, n, "exact McNemar + score interval", level, p)


@functools.lru_cache(maxsize=65536)
def _paired_cached(n10: int, n01: int, n: int, level: float) -> tuple[float, float, float]:
    """Bounds and p of (n10, n01, n): a sweep asks for the same counts many times (categories, modes)."""
    lo, hi = paired_score_bounds(n10, n01, n, level)
    return lo, hi, mcnemar_exact(n10, n01)


# ------------------------------------------------------------------------------ multiplicity control
def holm(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjusted p-values (family-wise error control): sort the m p-values, multiply the
    j-th smallest by (m - j + 1), take the running maximum, cap at 1. None entries stay None and do not
    count in m."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    m = len(idx)
    out: list[Optional[float]] = [None] * len(pvalues)
    run = 0.0
    for j, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        run = max(run, min(1.0, (m - j) * float(pvalues[i])))
        out[i] = run
    return out


def benjamini_hochberg(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Benjamini-Hochberg adjusted p-values (false-discovery-rate control under independence or positive
    dependence): the j-th smallest times m / j, the running minimum from the largest down, capped at 1."""
    idx = [i for i, p in enumerate(pvalues) if p is not None]
    m = len(idx)
    out: list[Optional[float]] = [None] * len(pvalues)
    run = 1.0
    order = sorted(idx, key=lambda i: pvalues[i])
    for j in range(m - 1, -1, -1):
        i = order[j]
        run = min(run, float(pvalues[i]) * m / (j + 1))
        out[i] = run
    return out


ADJUST = {"holm": holm, "bh": benjamini_hochberg}


def adjust(pvalues: Sequence[Optional[float]], method: str = "holm") -> list[Optional[float]]:
    """Adjusted p-values by ``method`` (``holm``: family-wise error; ``bh``: false discovery rate)."""
    if method not in ADJUST:
        raise ValueError(f"adjust method {method!r}: one of {', '.join(ADJUST)}")
    return ADJUST[method](pvalues)


# ------------------------------------------------------------------------------ run-to-run noise (several seeds)
def pooled_run_variance(groups: Sequence[Sequence[float]]) -> tuple[float, int]:
    """The run-to-run variance of a metric pooled over a sweep's rows: the squared deviations of every run's
    value from its own row's mean, summed over rows, over df = sum (k_i - 1) (a row of one run adds nothing).
    Stated model: run noise is exchangeable across plans (one variance for every row). (nan, 0) when no row
    has two runs."""
    ss, df = 0.0, 0
    for g in groups:
        v = np.asarray([x for x in g if x is not None and not math.isnan(x)], dtype=np.float64)
        if v.size > 1:
            ss += float(np.sum((v - v.mean()) ** 2))
            df += int(v.size) - 1
    return (ss / df if df else math.nan), df


def pooled_run_p(point, k_a, k_b, run_var, run_df, unit_var, unit_df, level: float = LEVEL):
    """(half-width, p) of the strategy test below; vectorised over numpy arrays of any of its inputs."""
    from scipy.stats import t

    se = np.sqrt(np.asarray(run_var, dtype=np.float64) * (1.0 / np.asarray(k_a) + 1.0 / np.asarray(k_b))
                 + np.asarray(unit_var, dtype=np.float64))
    df = np.minimum(np.asarray(run_df, dtype=np.float64), np.asarray(unit_df, dtype=np.float64))
    half = t.ppf((1.0 + level) / 2.0, df) * se
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(se > 0, 2 * t.sf(np.abs(point) / se, df), np.where(np.asarray(point) == 0, 1.0, 0.0))
    return half, p


def pooled_run_test(point: float, k_a: int, k_b: int, run_var: float, run_df: int, unit_var: float = 0.0,
                    unit_df: float = math.inf, level: float = LEVEL, method: str = "runs pooled") -> Interval:
    """Strategy a minus strategy b: ``point`` = mean of a's k_a runs minus mean of b's k_b runs, with an
    interval and p-value for run-to-run *and* unit-sampling noise.

    Model: run value = strategy mean + run offset (variance ``run_var``, the same for every plan, estimated by
    :func:`pooled_run_variance` with ``run_df`` degrees of freedom over the whole sweep) + the sampling error
    of the units (documents, questions) every run shares; ``unit_var`` is that error's variance for the
    difference of the run-averaged units (``unit_df`` its degrees of freedom). se^2 = run_var (1/k_a + 1/k_b)
    + unit_var, Student t with df = min(run_df, unit_df): a sum of two independent variance estimates
    referred to t on the smaller df is conservative (Mickey & Brown 1966), where Welch-Satterthwaite's df
    grows when the run variance is small by chance. Pooling gives run_df = sum (k_i - 1) (14 for 7 rows x 3
    seeds) where a per-pair test has k - 1 = 2. ``k_b = math.inf``: b is a fixed reference without run noise
    (the untrained model), so only a's runs carry it."""
    half, p = pooled_run_p(point, k_a, k_b, run_var, run_df, unit_var, unit_df, level)
    half, p = float(half), float(p)
    n = int(k_a + k_b) if math.isfinite(k_b) else int(k_a) + 1  # k_b infinite: a fixed reference (the base model)
    return Interval(point, point - half, point + half, n, method, level, p)


def welch_run_test(point: float, var_a: float, k_a: int, var_b: float, k_b: float, unit_var: float = 0.0,
                   unit_df: float = math.inf, level: float = LEVEL, method: str = "runs per plan") -> Interval:
    """Strategy a minus strategy b with each plan's *own* run variance (``var_a`` over its ``k_a`` >= 2 runs, the
    sample variance; ``var_b`` over ``k_b``): se^2 = var_a / k_a + var_b / k_b + ``unit_var`` (the shared units'
    sampling error), Student t on Welch's df of the *run* parts, (r_a + r_b)^2 / (r_a^2 / (k_a - 1) + r_b^2 / (k_b - 1))
    with r = var / k (between min(k - 1) and k_a + k_b - 2; k_a - 1 against a fixed b), capped at ``unit_df``. With
    ``unit_var`` 0 it is Welch's unequal-variance t-test. The unit part widens se but does not raise the df: a
    Welch-Satterthwaite df over all three parts grows towards the documents' df (127) whenever the run variance is
    small by chance, and at a Holm level (0.05 / 14) t falls from 16.7 on 2 df to 3.0; a row against the fixed base
    at 3 runs then rejected a true null at 3-6 x its level (issue 50: against_base_null_rate 0.21). The unit part
    is counted in the run variance too (each run's value holds its units' noise), so leaving its df out is
    conservative. ``k_b = math.inf``: b is a fixed reference (the untrained model) and adds nothing. No run
    variance is assumed shared between plans."""
    from scipy.stats import t

    runs = [(var_a / k_a, k_a - 1)] + ([(var_b / k_b, k_b - 1)] if math.isfinite(k_b) else [])
    se2 = sum(v for v, _ in runs) + unit_var
    den = sum(v * v / d for v, d in runs if v > 0 and d > 0)
    run_df = sum(v for v, _ in runs) ** 2 / den if den > 0 else float(sum(d for _, d in runs))
    df = min(run_df, unit_df) if unit_var > 0 else run_df
    n = int(k_a + k_b) if math.isfinite(k_b) else int(k_a) + 1
    if se2 <= 0:
        return Interval(point, point, point, n, method, level, 1.0 if point == 0 else 0.0)
    se = math.sqrt(se2)
    half = float(t.ppf((1.0 + level) / 2.0, df)) * se
    return Interval(point, point - half, point + half, n, method, level, float(2 * t.sf(abs(point) / se, df)))


def mean_sampling_variance(diffs: Sequence[float], strata: Optional[Sequence] = None) -> tuple[float, int]:
    """The sampling variance of a mean of per-unit differences and its df: var(d) / n with n - 1 df; with
    ``strata``, of the unweighted mean of the strata means: sum_c var_c / n_c / C^2 with n - C df."""
    d = np.asarray(diffs, dtype=np.float64)
    if strata is None:
        return (float(d.var(ddof=1)) / d.size if d.size > 1 else 0.0), max(d.size - 1, 0)
    s = np.asarray(list(strata), dtype=object)
    groups = [d[s == g] for g in dict.fromkeys(s.tolist())]
    var = sum(float(x.var(ddof=1)) / x.size if x.size > 1 else 0.0 for x in groups) / len(groups) ** 2
    return var, max(d.size - len(groups), 0)


def paired_mean_t(a: Sequence[float], b: Sequence[float], strata: Optional[Sequence] = None, level: float = LEVEL,
                  scale: float = 1.0) -> Interval:
    """``scale`` x the mean of paired differences a_i - b_i of a continuous per-unit score (a question's gold
    probability under two models), with a Student-t interval and two-sided p-value: se^2 and df from
    :func:`mean_sampling_variance` (n - 1 df; with ``strata``, the unweighted mean of the strata means, n - C df).
    A zero spread gives a point interval (p 1 when the difference is 0, else 0)."""
    from scipy.stats import t

    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if d.size == 0 or len(a) != len(b):
        raise ValueError("paired t: a and b must be non-empty and of equal length")
    if strata is None:
        point = float(d.mean())
    else:
        s = np.asarray(list(strata), dtype=object)
        point = float(np.mean([d[s == g].mean() for g in dict.fromkeys(s.tolist())]))
    var, df = mean_sampling_variance(d, strata)
    method = "paired t over questions"
    if df < 1:
        return Interval(scale * point, math.nan, math.nan, int(d.size), method, level)
    se = math.sqrt(var)
    if se == 0:
        return Interval(scale * point, scale * point, scale * point, int(d.size), method, level,
                        1.0 if point == 0 else 0.0)
    q = float(t.ppf((1.0 + level) / 2.0, df))
    p = float(2 * t.sf(abs(point) / se, df))
    return Interval(scale * point, scale * (point - q * se), scale * (point + q * se), int(d.size), method, level, p)


# ------------------------------------------------------------------------------ BCa and rank correlation
def bca_interval(point: float, replicates: np.ndarray, jackknife: np.ndarray, level: float = LEVEL
                 ) -> tuple[float, float]:
    """Efron's bias-corrected and accelerated interval from bootstrap ``replicates`` and leave-one-out
    ``jackknife`` values of the statistic; widened to hold ``point`` (BCa's bias correction can move both
    ends to one side of it on skewed data; the point is then the nearer end)."""
    from scipy.stats import norm

    r = np.asarray(replicates, dtype=np.float64)
    r = r[~np.isnan(r)]
    if r.size == 0:
        return math.nan, math.nan
    below = (np.sum(r < point) + 0.5 * np.sum(r == point)) / r.size
    z0 = float(norm.ppf(np.clip(below, 1.0 / (r.size + 1), r.size / (r.size + 1))))
    j = np.asarray(jackknife, dtype=np.float64)
    dj = j.mean() - j
    den = 6.0 * float(np.sum(dj ** 2)) ** 1.5
    acc = float(np.sum(dj ** 3)) / den if den > 0 else 0.0
    ends = []
    for q in ((1.0 - level) / 2.0, (1.0 + level) / 2.0):
        zq = norm.ppf(q)
        ends.append(float(norm.cdf(z0 + (z0 + zq) / (1.0 - acc * (z0 + zq)))))
    lo, hi = np.quantile(r, ends)
    return float(min(lo, point)), float(max(hi, point))


def jackknife_t_interval(point: float, jackknife: np.ndarray, level: float = LEVEL,
                         one_sided: bool = False) -> tuple[float, float]:
    """A studentised interval around ``point`` with the jackknife standard error: point -+ t_{n-1} * se,
    se^2 = (n-1)/n * sum (theta_(i) - mean theta_(.))^2 over the n leave-one-out values. For a mean it is
    the one-sample t-interval. ``one_sided``: (point - t_{level, n-1} * se, +inf). Symmetric, so the point
    is always inside; it needs no resampling. NaNs when fewer than 3 leave-one-out values."""
    from scipy.stats import t

    j = np.asarray(jackknife, dtype=np.float64)
    n = j.size
    if n < 3 or not np.isfinite(j).all():
        return math.nan, math.nan
    se = math.sqrt((n - 1) / n * float(np.sum((j - j.mean()) ** 2)))
    if one_sided:
        return float(point - t.ppf(level, n - 1) * se), math.inf
    half = float(t.ppf((1.0 + level) / 2.0, n - 1)) * se
    return float(point - half), float(point + half)


def spearman_test(x: Sequence[float], y: Sequence[float], alpha: float = 0.05, max_exact: int = 8,
                  resamples: int = 20000, seed=0) -> dict:
    """Spearman's rho of x and y with a two-sided permutation p-value: exact over all n! orderings of y
    when n <= ``max_exact``, Monte Carlo otherwise. ``testable`` is False when even a perfect rank agreement
    could not reach ``alpha`` (n = 3: the smallest two-sided p is 1/3); then ``p`` is None."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x), rankdata(y)
    n = len(rx)
    out = {"n": n, "rho": None, "p": None, "testable": False, "method": "exact permutation"}
    if n < 3 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return out
    rho = float(np.corrcoef(rx, ry)[0, 1])
    if n <= max_exact:
        perms = np.array(list(itertools.permutations(ry)))
    else:
        rng = generator(seed)
        perms = np.array([rng.permutation(ry) for _ in range(resamples)])
        out["method"] = "permutation (Monte Carlo)"
    cx = rx - rx.mean()
    rhos = (perms - perms.mean(1, keepdims=True)) @ cx / (np.sqrt((cx ** 2).sum()) *
                                                          np.sqrt(((perms - perms.mean(1, keepdims=True)) ** 2).sum(1)))
    smallest = float(np.mean(np.abs(rhos) >= np.max(np.abs(rhos)) - 1e-12))
    out.update(rho=rho, testable=smallest <= alpha)
    if out["testable"]:
        out["p"] = float(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))
    return out


def ratio_delta_se(a: Sequence[float], b: Sequence[float], clusters: Optional[Sequence] = None,
                   weights=None) -> tuple[float, float, int]:
    """(R, se, k) of :func:`ratio_delta_t`: the ratio estimator over the k clusters and its linearised standard
    error (NaN with one cluster)."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    g = np.arange(len(x)) if clusters is None else np.asarray(list(clusters))
    if not (len(x) == len(y) == len(w) == len(g)) or len(x) == 0:
        raise ValueError("ratio t: a, b, weights and clusters must be non-empty and of equal length")
    _, inv = np.unique(g, return_inverse=True)
    k = int(inv.max()) + 1
    dj = np.bincount(inv, weights=w * (x - y), minlength=k)
    wj = np.bincount(inv, weights=w, minlength=k)
    r = float(dj.sum() / wj.sum())
    if k < 2:
        return r, math.nan, k
    return r, math.sqrt(float(np.sum((dj - r * wj) ** 2)) / (k * (k - 1))) / float(wj.mean()), k


def ratio_delta_t(a: Sequence[float], b: Sequence[float], clusters: Optional[Sequence] = None, weights=None,
                  level: float = LEVEL, scale: float = 1.0) -> Interval:
    """The weighted mean difference of paired units (held-out block losses, token-weighted) with a t-interval
    and p-value over *clusters* (documents; each unit its own cluster without them): the ratio estimator
    R = sum_j D_j / sum_j W_j over the clusters' sums, its linearised variance
    sum_j (D_j - R W_j)^2 / (k (k - 1) mean(W)^2), k - 1 degrees of freedom. Blocks of one document share
    its difficulty; treating them as independent under-covers (``bench_calibration.py`` shows both)."""
    from scipy.stats import t

    r, se, k = ratio_delta_se(a, b, clusters, weights)
    what = "t over blocks" if clusters is None else "t over documents"
    if k < 2:
        return Interval(scale * r, math.nan, math.nan, k, what, level)
    if se == 0:
        return Interval(scale * r, scale * r, scale * r, k, what, level, 1.0 if r == 0 else 0.0)
    q = float(t.ppf((1.0 + level) / 2.0, k - 1))
    p = float(2 * t.sf(abs(r) / se, k - 1))
    return Interval(scale * r, scale * (r - q * se), scale * (r + q * se), k, what, level, p)


def stratified_mcnemar_p(a: Sequence[float], b: Sequence[float], strata: Sequence) -> float:
    """Two-sided p-value of "the mean over strata of the paired accuracy differences is 0": the z-statistic
    of mean_k (n10_k - n01_k) / n_k with its null variance sum_k (n10_k + n01_k) / n_k^2 / K^2 (McNemar's,
    stratum by stratum; normal approximation). 1 without a discordant pair."""
    from scipy.stats import norm

    x = np.asarray(a, dtype=bool)
    y = np.asarray(b, dtype=bool)
    s = np.asarray(list(strata), dtype=object)
    num, var = 0.0, 0.0
    groups = list(dict.fromkeys(s.tolist()))
    for g in groups:
        sel = s == g
        n10, n01, n = discordant(x[sel], y[sel])
        num += (n10 - n01) / n
        var += (n10 + n01) / n ** 2
    if var == 0:
        return 1.0
    return float(2 * norm.sf(abs(num) / math.sqrt(var)))


def fieller_ratio(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> tuple[float, float, bool]:
    """Fieller's interval for mean(a) / mean(b) of paired units (e.g. per question: layer-l model minus base,
    full model minus base): the thetas with (mean a - theta mean b)^2 <= t^2 var(mean a - theta mean b).
    Bounded (third value True) only when mean(b) differs from 0 at ``level`` - the guard a ratio needs:
    with a denominator indistinguishable from 0 (or of the other sign) the ratio's sign means nothing.
    Returns (lo, hi, bounded); (nan, nan, False) when unbounded."""
    from scipy.stats import t

    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    n = len(x)
    if n < 3 or len(y) != n:
        return math.nan, math.nan, False
    ma, mb = x.mean(), y.mean()
    c = np.cov(x, y, ddof=1) / n
    q = float(t.ppf((1.0 + level) / 2.0, n - 1)) ** 2
    qa = mb * mb - q * c[1, 1]
    if qa <= 0:
        return math.nan, math.nan, False
    qb = -2 * (ma * mb - q * c[0, 1])
    qc = ma * ma - q * c[0, 0]
    disc = qb * qb - 4 * qa * qc
    if disc < 0:
        return math.nan, math.nan, False
    r = math.sqrt(disc)
    return float((-qb - r) / (2 * qa)), float((-qb + r) / (2 * qa)), True
