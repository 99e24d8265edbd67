"""LayerTracer scores (section 3 and appendix C.2 of "Freeze Deep, Train Shallow"), pure numpy/torch.

Per prompt, per decoder layer i = 0..N-1 (the paper's l = i + 1):

* ``Ratio(i) = |P_t(i) - P_t(i-1)| / (P_t(i) + eps)`` (eq. 1), P_t(-1) from the embedding output;
* ``JS(i) = JS(P || Q(i))`` (eqs. 3-5), natural log, on a top-k support: the k tokens most likely
  under P; both P and Q(i) are restricted to them and renormalised (k = 0: the full vocabulary).
  JS(-1) perturbs the embedding output;
* ``dJS(i) = |JS(i) - JS(i-1)| / (JS(i-1) + eps)`` (eq. 6).

Profiles: TP(i) = mean Ratio(i), LS(i) = mean dJS(i) over prompts (overall or per group), each
min-max normalised over layers. Split r -> b = floor(r * N + 1/2) (half up, the same rule as
the layer plans, :mod:`raycpt.splits`): shallow = layers [0, b), deep = [b, N). Boundary score (eq. 7)::

    S(b) = mean LS^[0:b) + mean TP^[b:N) - mean TP^[0:b) - mean LS^[b:N)

positive when the sensitive layers fall in the (trainable) shallow side and the task-execution
layers in the (frozen) deep side. The recommended split is the grid ratio with the largest S(b).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional, Sequence

import numpy as np
import torch

from raycpt.errors import RaycptError
from raycpt.splits import check_split, split_index
from raycpt.stats import (DEFAULT_RESAMPLES, LEVEL, Interval, bca_interval, bootstrap_replicates, jackknife_t_interval,
                          percentile_interval)

EPS = 1e-6


# ---------------------------------------------------------------------------------------- per prompt
def ratio(p_t: np.ndarray, eps: float = EPS) -> np.ndarray:
    """Ratio for each layer from P_t over [embedding, block 0, ..., block N-1]: (..., N+1) -> (..., N)."""
    p = np.asarray(p_t, dtype=np.float64)
    return np.abs(p[..., 1:] - p[..., :-1]) / (p[..., 1:] + eps)


def delta_js(js: np.ndarray, eps: float = EPS) -> np.ndarray:
    """dJS for each layer from JS over [embedding, block 0, ..., block N-1]: (..., N+1) -> (..., N)."""
    j = np.asarray(js, dtype=np.float64)
    return np.abs(j[..., 1:] - j[..., :-1]) / (j[..., :-1] + eps)


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JS(p || q) in nats over the last dim of two probability tensors (float64 inside)."""
    p = p.double()
    q = q.double()
    m = 0.5 * (p + q)
    kl_pm = (torch.special.xlogy(p, p) - torch.special.xlogy(p, m)).sum(-1)
    kl_qm = (torch.special.xlogy(q, q) - torch.special.xlogy(q, m)).sum(-1)
    return (0.5 * kl_pm + 0.5 * kl_qm).clamp_min(0.0)


def support(p_logits: torch.Tensor, top_k: int) -> Optional[torch.Tensor]:
    """Indices of P's top-k tokens (batch, k), or None for the full vocabulary (k = 0 or k >= V)."""
    if top_k < 0:
        raise RaycptError(f"top_k={top_k}: expected an integer >= 0 (0 = full vocabulary)")
    if top_k == 0 or top_k >= p_logits.shape[-1]:
        return None
    return torch.topk(p_logits, top_k, dim=-1).indices


def topk_js(p_logits: torch.Tensor, q_logits: torch.Tensor, top_k: int = 10,
            idx: Optional[torch.Tensor] = None) -> torch.Tensor:
    """JS(P || Q) on P's top-k support, both renormalised over it (softmax of the restricted logits,
    which equals taking the full softmax, keeping k entries and dividing by their sum). (batch,) float64."""
    if idx is None:
        idx = support(p_logits, top_k)
    if idx is not None:
        p_logits = p_logits.gather(-1, idx)
        q_logits = q_logits.gather(-1, idx.to(q_logits.device))
    p = torch.softmax(p_logits.double(), dim=-1)
    q = torch.softmax(q_logits.double(), dim=-1)
    return js_divergence(p, q)


def topk_target_prob(logits: torch.Tensor, target: torch.Tensor, top_k: int,
                     lp: Optional[torch.Tensor] = None) -> torch.Tensor:
    """P_t under 004 §4.1's per-layer reading: each layer's distribution keeps only *its own* top-k
    tokens (renormalised over them); P_t is t*'s share there, 0 when t* is not among them. (rows, V)
    logits, (rows,) targets -> (rows,) float64. Over the full softmax P_t is never exactly 0, so
    Ratio(l) > 0 at every layer and the Task-Particle interval is every layer; under this reading a
    layer whose top-k lacks t* on both sides of it has Ratio = 0. ``lp``: the rows' float64 log-softmax when the
    caller has it (:func:`raycpt.diagnostics.lens.target_probs`: one full-vocabulary pass instead of two)."""
    lp = torch.log_softmax(logits, dim=-1, dtype=torch.float64) if lp is None else lp
    top, idx = torch.topk(lp, min(top_k, lp.shape[-1]), dim=-1)
    tgt = target.to(idx.device)[:, None]
    hit = (idx == tgt).any(-1)
    lt = lp.gather(-1, tgt)[:, 0]
    return torch.where(hit, torch.exp(lt - torch.logsumexp(top, dim=-1)), torch.zeros_like(lt))


def mass_outside(p_logits: torch.Tensor, q_logits: torch.Tensor, idx: Optional[torch.Tensor]) -> torch.Tensor:
    """The probability mass of Q *outside* P's top-k support (``idx``; 0 for the full vocabulary): what
    JS@k cannot see, because it renormalises both distributions over that support. (batch,) float64.

    ``1 - exp(logsumexp(Q's logits on the support) - logsumexp(all of Q's logits))``, the full-vocabulary
    normaliser in the logits' own dtype (float32 for a float32 model: no float64 copy and softmax of every
    perturbation's (batch, vocab) logits, which commit 79d9955 added to the trace's hot path; differs from the
    float64 softmax by ~1e-9), the support's k terms in float64."""
    if idx is None:
        return torch.zeros(q_logits.shape[0], dtype=torch.float64)
    lse = torch.logsumexp(q_logits, dim=-1).double()
    inside = torch.logsumexp(q_logits.gather(-1, idx.to(q_logits.device)).double(), dim=-1)
    return (1.0 - torch.exp(inside - lse)).clamp_min(0.0).cpu()


def tp_interval(ratio_row: np.ndarray, tau: float = 0.0) -> tuple[int, int, int]:
    """Task Particle of one prompt: (first, last, count) of the layers with Ratio > tau; (-1, -1, 0) if none."""
    hit = np.flatnonzero(np.asarray(ratio_row) > tau)
    if hit.size == 0:
        return -1, -1, 0
    return int(hit[0]), int(hit[-1]), int(hit.size)


# ---------------------------------------------------------------------------------------- profiles
def minmax(x: np.ndarray) -> np.ndarray:
    """Min-max normalisation over layers (last axis); a flat profile becomes all zeros."""
    x = np.asarray(x, dtype=np.float64)
    lo = x.min(axis=-1, keepdims=True)
    span = x.max(axis=-1, keepdims=True) - lo
    return np.where(span > 0, (x - lo) / np.where(span > 0, span, 1.0), 0.0)


AGGREGATES = ("scaled", "mean", "median")


def scaled(rows: np.ndarray) -> np.ndarray:
    """Each prompt's profile divided by its own mean over layers (last axis): every prompt then weighs the
    same in a mean over prompts, whatever its scale (a prompt whose P_t or JS is near 0 has Ratio or dJS
    up to 1e5 at every layer). An all-zero profile stays zero."""
    x = np.asarray(rows, dtype=np.float64)
    m = x.mean(axis=-1, keepdims=True)
    return np.where(m > 0, x / np.where(m > 0, m, 1.0), 0.0)


def _reduce(aggregate: str):
    """The per-layer reduction over prompts (axis -2) of an aggregate name."""
    if aggregate not in AGGREGATES:
        raise ValueError(f"aggregate={aggregate!r}: one of {', '.join(AGGREGATES)}")
    if aggregate == "median":
        return lambda x: np.median(x, axis=-2)
    if aggregate == "scaled":
        return lambda x: scaled(x).mean(axis=-2)
    return lambda x: x.mean(axis=-2)


def profiles(ratio_rows: np.ndarray, djs_rows: np.ndarray, groups: Optional[Sequence[str]] = None,
             aggregate: str = "mean") -> dict:
    """Mean Ratio (TP) and mean dJS (LS) per layer, overall and per group (first-seen group order).

    ``aggregate="median"`` takes the per-layer median instead; ``"scaled"`` the mean of each prompt's
    profile divided by its own mean over layers (:func:`scaled`). Neither is the paper's (004 averages the
    raw values); both are robust to the few prompts whose Ratio or dJS explodes when a probability or JS
    value is near 0, and the S(b) interval of ``"scaled"`` has its coverage measured.
    Returns ``{"tp", "ls", "tp_norm", "ls_norm", "groups": {g: {"tp", "ls", "n"}}}``."""
    f = _reduce(aggregate)
    r = np.asarray(ratio_rows, dtype=np.float64)
    d = np.asarray(djs_rows, dtype=np.float64)
    tp, ls = f(r), f(d)
    out = dict(tp=tp, ls=ls, tp_norm=minmax(tp), ls_norm=minmax(ls), groups={})
    if groups is not None:
        g_arr = np.asarray(list(groups), dtype=object)
        for g in dict.fromkeys(g_arr.tolist()):
            sel = g_arr == g
            out["groups"][g] = dict(tp=f(r[sel]), ls=f(d[sel]), n=int(sel.sum()))
    return out


def boundary_scores(tp_norm: np.ndarray, ls_norm: np.ndarray, b: int) -> np.ndarray:
    """S(b) of profiles stacked on leading axes: (..., N) -> (...)."""
    tp = np.asarray(tp_norm, dtype=np.float64)
    ls = np.asarray(ls_norm, dtype=np.float64)
    n = tp.shape[-1]
    if not 0 < b < n:
        raise ValueError(f"b={b} must be in 1..{n - 1}")
    return ls[..., :b].mean(-1) + tp[..., b:].mean(-1) - tp[..., :b].mean(-1) - ls[..., b:].mean(-1)


def boundary_score(tp_norm: np.ndarray, ls_norm: np.ndarray, b: int) -> float:
    """S(b) = mean LS^[0:b) + mean TP^[b:N) - mean TP^[0:b) - mean LS^[b:N) (eq. 7, 0-based)."""
    return float(boundary_scores(tp_norm, ls_norm, b))


def _jackknife_rows(r: np.ndarray, d: np.ndarray, stat, aggregate: str) -> np.ndarray:
    """The statistic with each prompt left out in turn: (prompts, len(bs)). Means in closed form."""
    n = len(r)
    if aggregate in ("mean", "scaled"):
        if aggregate == "scaled":  # scaling is per prompt: leave-one-out means of the scaled rows
            r, d = scaled(r), scaled(d)
        lr = (r.sum(0)[None] - r) / (n - 1)
        ld = (d.sum(0)[None] - d) / (n - 1)
        return stat(lr[:, None], ld[:, None], "mean")
    keep = ~np.eye(n, dtype=bool)
    return np.concatenate([stat(r[keep[i]][None], d[keep[i]][None], aggregate) for i in range(n)])


def _s_statistic(bs: Sequence[int]):
    """S(b) for every b of ``bs`` from stacked prompt rows: stat(r, d, aggregate), (m, prompts, N) -> (m, len(bs))."""
    def stat(r, d, aggregate):
        f = _reduce(aggregate)
        tp, ls = minmax(f(r)), minmax(f(d))
        return np.stack([boundary_scores(tp, ls, b) for b in bs], axis=-1)
    return stat


METHODS = ("jackknife_t", "bca", "basic", "percentile")


def boundary_score_interval(ratio_rows: np.ndarray, djs_rows: np.ndarray, bs: Sequence[int],
                            resamples: int = DEFAULT_RESAMPLES, seed=0, level: float = LEVEL,
                            aggregate: str = "mean", method: str = "bca") -> list[Interval]:
    """S(b) for each b in ``bs`` with an interval over prompts.

    S(b) is computed from per-layer profiles over prompts (``aggregate``: the paper's ``"mean"``, the
    per-prompt ``"scaled"`` mean of :func:`scaled`, or ``"median"``), min-max normalised (:func:`minmax`),
    then eq. 7. ``method``:

    - ``"jackknife_t"``: point -+ t_{n-1} times the prompt-jackknife standard error
      (:func:`raycpt.stats.jackknife_t_interval`; symmetric, the point inside, no resampling). With
      ``aggregate="scaled"`` this is the interval whose coverage ``benchmarks/bench_calibration.py`` checks
      (sb_ci_coverage); the sweep's default.
    - ``"bca"``: Efron's BCa over ``resamples`` prompt bootstraps (the same draw for every b), the point
      held inside. On the paper's mean with heavy-tailed prompts (infinite variance: the bootstrap of a mean
      is then inconsistent) it covers about 2 in 3.
    - ``"basic"``: the bias-corrected basic interval; ``"percentile"``: the plain percentile interval (can
      exclude its own point on such data)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}: one of {', '.join(METHODS)}")
    _reduce(aggregate)
    bs = [int(b) for b in bs]
    stat = _s_statistic(bs)
    r = np.asarray(ratio_rows, dtype=np.float64)
    d = np.asarray(djs_rows, dtype=np.float64)
    point = stat(r[None], d[None], aggregate)[0]
    reps = (bootstrap_replicates([r, d], lambda x, y: stat(x, y, aggregate), resamples, seed)
            if method != "jackknife_t" else None)
    jack = _jackknife_rows(r, d, stat, aggregate) if method in ("bca", "jackknife_t") and len(r) > 2 else None
    label = {"bca": "BCa bootstrap", "basic": "bias-corrected basic bootstrap", "percentile": "percentile bootstrap",
             "jackknife_t": "jackknife t"}[method]
    out = []
    for k in range(len(bs)):
        pt = float(point[k])
        if method == "jackknife_t":
            lo, hi = jackknife_t_interval(pt, jack[:, k], level) if jack is not None else (math.nan, math.nan)
        elif method == "basic":  # reflect the replicates around the point: removes the bias they show
            q_lo, q_hi = percentile_interval(reps[:, k], level)
            pt = 2 * pt - float(np.nanmean(reps[:, k]))
            lo, hi = min(2 * float(point[k]) - q_hi, pt), max(2 * float(point[k]) - q_lo, pt)
        elif jack is not None:
            lo, hi = bca_interval(pt, reps[:, k], jack[:, k], level)
        else:
            lo, hi = percentile_interval(reps[:, k], level)
        out.append(Interval(pt, lo, hi, len(r), f"{label} over prompts ({aggregate})", level))
    return out


def splits_like_best(ratio_rows: np.ndarray, djs_rows: np.ndarray, bs: Sequence[int],
                     resamples: int = DEFAULT_RESAMPLES, seed=0, level: float = LEVEL,
                     aggregate: str = "mean", method: str = "bootstrap") -> list[bool]:
    """For each b: whether S(b) is *not* distinguishable from the best of ``bs``: the one-sided ``level``
    bound of S(best) - S(b) over prompts reaches 0 (``method="bootstrap"``: the bootstrap quantile, the same
    draws for every b; ``"jackknife_t"``: the difference minus t_{level, n-1} times its jackknife standard
    error). The best itself is always in the set; a set of one says the data single it out."""
    bs = [int(b) for b in bs]
    stat = _s_statistic(bs)
    r = np.asarray(ratio_rows, dtype=np.float64)
    d = np.asarray(djs_rows, dtype=np.float64)
    point = stat(r[None], d[None], aggregate)[0]
    best = int(np.argmax(point))
    if method == "jackknife_t":
        jack = _jackknife_rows(r, d, stat, aggregate)
        gaps = jack[:, best][:, None] - jack
        lower = [jackknife_t_interval(float(point[best] - point[k]), gaps[:, k], level, one_sided=True)[0]
                 for k in range(len(bs))]
    else:
        reps = bootstrap_replicates([r, d], lambda x, y: stat(x, y, aggregate), resamples, seed)
        lower = np.quantile(reps[:, best][:, None] - reps, 1.0 - level, axis=0)
    return [bool(k == best or not lower[k] > 0) for k in range(len(bs))]


def grid_ratios(grid: Sequence[float]) -> list[float]:
    """[start, stop, step] -> start, start+step, ..., stop (inclusive; rounded to 10 decimals)."""
    start, stop, step = grid
    n = int(math.floor((stop - start) / step + 1e-9))
    return [round(start + k * step, 10) for k in range(n + 1)]


def split_table(tp_norm: np.ndarray, ls_norm: np.ndarray, ratios: Iterable[float]) -> list[dict]:
    """Table-9 rows: ratio, split layer b, S(b), and the four means that make it up."""
    tp = np.asarray(tp_norm, dtype=np.float64)
    ls = np.asarray(ls_norm, dtype=np.float64)
    n = tp.shape[-1]
    rows = []
    for r in ratios:
        b = check_split(r, n)
        rows.append(dict(ratio=float(r), split_layer=b, shallow_layers=f"0-{b - 1}", deep_layers=f"{b}-{n - 1}",
                         S=boundary_score(tp, ls, b), ls_shallow=float(ls[:b].mean()), tp_deep=float(tp[b:].mean()),
                         tp_shallow=float(tp[:b].mean()), ls_deep=float(ls[b:].mean())))
    return rows


def recommend_split(tp_norm: np.ndarray, ls_norm: np.ndarray, grid: Sequence[float]) -> dict:
    """The grid ratio with the largest S(b) (first one on ties); grid points whose b leaves a side
    empty are skipped. Returns ``{"ratio", "split_layer", "S", "scores": [(ratio, b, S), ...]}``."""
    n = np.asarray(tp_norm).shape[-1]
    scores = []
    for r in grid_ratios(grid):
        b = split_index(r, n)
        if 0 < b < n:
            scores.append((r, b, boundary_score(tp_norm, ls_norm, b)))
    if not scores:
        raise RaycptError(f"trace.grid {list(grid)} has no ratio with a non-empty shallow and deep side for a "
                          f"{n}-layer model")
    best = max(scores, key=lambda t: t[2])  # max keeps the first of equal scores
    return dict(ratio=best[0], split_layer=best[1], S=best[2], scores=scores)
