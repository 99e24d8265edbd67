"""The short sweep's ranking against the long one's (issue 47). Pure numpy/scipy; lower values are better (losses),
so "A beats B" means A's mean is lower.

* :func:`decision_accuracy` - DataDecide's decision accuracy (Magnusson et al., 2025): the share of the pairs of arms
  that the short horizon orders the same way as the long one, each arm by its seed mean; a pair the long horizon
  ties exactly has no order and is left out, a pair only the short horizon ties counts one half.
* :func:`kendall_tau` - the two rankings' Kendall tau-b (scipy's definition, ties included).
* :func:`win_probability` - the short sweep's probability that A beats B, from the verdict's own model: the seed
  means' difference over its Welch standard error (each arm its own run variance), Student t on the
  Welch-Satterthwaite df (:func:`raycpt.stats.welch_run_test`'s se and df).
* :func:`pair_calls` / :func:`calibration` - per pair: the short call, its probability, whether the long horizon
  separates the pair beyond its own run noise (Welch p < alpha) and which arm it puts first; the reliability table
  and the expected calibration error of those probabilities against what the long horizon shows.
* :func:`top1_regret` - how much worse the short pick is at the long horizon than the long horizon's best, in
  long-horizon run SDs (the root mean of the arms' run variances).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class Arm:
    """One arm at one horizon: its metric at each seed (lower is better)."""

    name: str
    values: tuple[float, ...]

    @property
    def mean(self) -> float:
        return float(np.mean(self.values)) if self.values else math.nan

    @property
    def var(self) -> float:
        """The sample run variance over seeds (ddof 1); NaN with fewer than two."""
        return float(np.var(self.values, ddof=1)) if len(self.values) > 1 else math.nan

    @property
    def k(self) -> int:
        return len(self.values)


def arm_stats(values: Mapping[str, Sequence[float]]) -> dict[str, Arm]:
    """``{name: Arm}`` from ``{name: per-seed values}``, non-finite values dropped."""
    return {n: Arm(n, tuple(float(x) for x in v if x is not None and math.isfinite(float(x))))
            for n, v in values.items()}


def _order(a: float, b: float) -> int:
    """-1 when a < b (a is better), +1 when a > b, 0 on a tie."""
    return int(a > b) - int(a < b)


def decision_accuracy(short: Mapping[str, float], long: Mapping[str, float],
                      pairs: Optional[Sequence[tuple[str, str]]] = None) -> tuple[float, int]:
    """``(accuracy, pairs counted)`` over ``pairs`` (default: every pair of arms both mappings hold): the share the
    short horizon orders as the long one does (see the module docstring for ties); NaN with no pair."""
    names = [n for n in short if n in long]
    pairs = list(itertools.combinations(names, 2)) if pairs is None else list(pairs)
    hits, counted = 0.0, 0
    for a, b in pairs:
        truth = _order(long[a], long[b])
        if truth == 0:
            continue
        call = _order(short[a], short[b])
        hits += 0.5 if call == 0 else float(call == truth)
        counted += 1
    return (hits / counted if counted else math.nan), counted


def kendall_tau(short: Mapping[str, float], long: Mapping[str, float]) -> float:
    """Kendall's tau-b between the two orderings of the arms both hold (NaN with fewer than two)."""
    names = [n for n in short if n in long]
    conc = disc = ties_s = ties_l = 0
    for a, b in itertools.combinations(names, 2):
        s, l = _order(short[a], short[b]), _order(long[a], long[b])
        if s == 0 and l == 0:
            continue
        if s == 0:
            ties_s += 1
        elif l == 0:
            ties_l += 1
        elif s == l:
            conc += 1
        else:
            disc += 1
    den = math.sqrt((conc + disc + ties_s) * (conc + disc + ties_l))
    return (conc - disc) / den if den > 0 else math.nan


def welch_se_df(a: Arm, b: Arm) -> tuple[float, float]:
    """The standard error of mean(a) - mean(b) with each arm's own run variance, and its Welch-Satterthwaite df."""
    parts = [(a.var / a.k, a.k - 1), (b.var / b.k, b.k - 1)]
    se2 = sum(v for v, _ in parts)
    den = sum(v * v / d for v, d in parts if v > 0 and d > 0)
    return math.sqrt(se2), (se2 * se2 / den if den > 0 else math.inf)


def win_probability(a: Arm, b: Arm) -> float:
    """P(a beats b) under the short sweep's Welch model: t_df.cdf((mean b - mean a) / se); 0.5 without run noise to
    measure (one seed), 1 or 0 when the runs do not vary and the means differ."""
    from scipy.stats import t

    if a.k < 2 or b.k < 2:
        return 0.5
    se, df = welch_se_df(a, b)
    diff = b.mean - a.mean
    if not se > 0:
        return 0.5 if diff == 0 else float(diff > 0)
    return float(t.cdf(diff / se, df))


def welch_p(a: Arm, b: Arm) -> float:
    """Welch's two-sided p-value of "a and b have the same mean" (1 without run noise to measure)."""
    from scipy.stats import t

    if a.k < 2 or b.k < 2:
        return 1.0
    se, df = welch_se_df(a, b)
    if not se > 0:
        return 1.0 if a.mean == b.mean else 0.0
    return float(2 * t.sf(abs(a.mean - b.mean) / se, df))


@dataclass(frozen=True)
class PairCall:
    """One pair of arms: what the short horizon says and what the long one shows."""

    a: str
    b: str
    p_short: float
    """The short sweep's P(a beats b) (:func:`win_probability`)."""
    short_first: Optional[str]
    """The arm with the lower short-horizon mean (None on a tie)."""
    long_first: Optional[str]
    """The arm with the lower long-horizon mean (None on a tie)."""
    long_p: float
    """Welch's p-value at the long horizon."""
    resolved: bool
    """The long horizon separates the pair beyond its own run noise (``long_p`` < alpha)."""

    @property
    def agree(self) -> Optional[bool]:
        if self.long_first is None:
            return None
        return self.short_first == self.long_first


def pair_calls(short: Mapping[str, Arm], long: Mapping[str, Arm], alpha: float = 0.05) -> list[PairCall]:
    """Every pair of the arms both horizons hold, in the short mapping's order."""
    names = [n for n in short if n in long]
    out = []
    for a, b in itertools.combinations(names, 2):
        sa, sb, la, lb = short[a], short[b], long[a], long[b]
        lp = welch_p(la, lb)
        out.append(PairCall(a, b, win_probability(sa, sb), _first(a, b, sa.mean, sb.mean), _first(a, b, la.mean, lb.mean),
                            lp, lp < alpha))
    return out


def _first(a: str, b: str, va: float, vb: float) -> Optional[str]:
    o = _order(va, vb)
    return a if o < 0 else b if o > 0 else None


def calibration(calls: Sequence[PairCall], bins: int = 5) -> tuple[float, list[dict]]:
    """``(ECE, reliability table)``: each pair's short-horizon probability that its more likely winner wins (folded to
    [0.5, 1], the call's confidence) against whether the long horizon's order agrees; pairs the long horizon ties are
    left out. Bins split [0.5, 1] evenly (the last bin closed); ECE = sum over bins of n_bin / n x |mean confidence -
    share correct|. Rows: ``{"lo", "hi", "n", "confidence", "correct"}`` (bins with pairs only)."""
    rows, total, ece = [], 0, 0.0
    conf, hit = [], []
    for c in calls:
        if c.long_first is None:
            continue
        p_a = c.p_short
        winner = c.a if p_a >= 0.5 else c.b
        conf.append(max(p_a, 1 - p_a))
        hit.append(1.0 if winner == c.long_first else 0.0)
    total = len(conf)
    edges = np.linspace(0.5, 1.0, bins + 1)
    for i in range(bins):
        lo, hi = float(edges[i]), float(edges[i + 1])
        idx = [j for j, x in enumerate(conf) if lo <= x < hi or (i == bins - 1 and x == hi)]
        if not idx:
            continue
        mc, mh = float(np.mean([conf[j] for j in idx])), float(np.mean([hit[j] for j in idx]))
        rows.append({"lo": lo, "hi": hi, "n": len(idx), "confidence": mc, "correct": mh})
        ece += len(idx) / total * abs(mc - mh)
    return (ece if total else math.nan), rows


def top1_regret(short: Mapping[str, float], long: Mapping[str, Arm]) -> tuple[float, str, str]:
    """``(regret in long-horizon run SDs, short pick, long best)``: (long mean of the short horizon's best arm - the
    long horizon's best mean) / sqrt(mean of the long arms' run variances). NaN without run noise to measure."""
    names = [n for n in short if n in long]
    pick = min(names, key=lambda n: (short[n], n))
    best = min(names, key=lambda n: (long[n].mean, n))
    variances = [long[n].var for n in names if long[n].k > 1]
    sd = math.sqrt(float(np.mean(variances))) if variances else math.nan
    gap = long[pick].mean - long[best].mean
    return (gap / sd if sd > 0 else (0.0 if gap == 0 else math.nan)), pick, best


@dataclass(frozen=True)
class Decision:
    """Everything :func:`decide` measures for one short metric against the long horizon's primary."""

    metric: str
    accuracy_all: float
    pairs_all: int
    accuracy_resolved: float
    pairs_resolved: int
    tau: float
    regret_sd: float
    short_pick: str
    long_best: str
    ece: float
    reliability: list = field(default_factory=list)
    calls: list = field(default_factory=list)


def decide(short: Mapping[str, Arm], long: Mapping[str, Arm], metric: str = "", alpha: float = 0.05,
           bins: int = 5) -> Decision:
    """All of the module's measures for one short-horizon metric (``short``) against the long horizon's (``long``)."""
    sm = {n: a.mean for n, a in short.items()}
    lm = {n: a.mean for n, a in long.items()}
    calls = pair_calls(short, long, alpha)
    acc, n = decision_accuracy(sm, lm)
    resolved = [(c.a, c.b) for c in calls if c.resolved]
    acc_r, n_r = decision_accuracy(sm, lm, resolved)
    regret, pick, best = top1_regret(sm, long)
    ece, table = calibration(calls, bins)
    return Decision(metric, acc, n, acc_r, n_r, kendall_tau(sm, lm), regret, pick, best, ece, table, calls)
