"""Naive statistical references shared by several test files, written from their textbook definitions (not from
raycpt's code): Tango's paired score interval by grid inversion, Efron's BCa ends."""

import numpy as np


def naive_score_interval(x, y, cc=0.5, z=1.959963984540054, step=5e-4):
    """Tango's score interval for p10 - p01 of paired 0/1 outcomes, written here from its definition: a grid
    of deltas, each kept when the (continuity-corrected) score statistic with the variance at the restricted
    MLE (found numerically, not by the closed form raycpt uses) stays within z."""
    from scipy.optimize import minimize_scalar

    x, y = np.asarray(x, bool), np.asarray(y, bool)
    n10, n01, n = int((x & ~y).sum()), int((~x & y).sum()), len(x)
    kept = []
    for d in np.arange(-1 + step, 1, step):
        lo_q, hi_q = max(0.0, -d), (1 - d) / 2

        def nll(q):
            return -(n10 * np.log(max(q + d, 1e-300)) + n01 * np.log(max(q, 1e-300))
                     + (n - n10 - n01) * np.log(max(1 - 2 * q - d, 1e-300)))
        q = minimize_scalar(nll, bounds=(lo_q, hi_q), method="bounded", options={"xatol": 1e-10}).x
        if max(abs(n10 - n01 - n * d) - cc, 0.0) <= z * np.sqrt(n * (2 * q + d - d * d)):
            kept.append(d)
    return 100 * min(kept), 100 * max(kept)


def naive_bca(point, reps, jack, level=0.95):
    """Efron's BCa ends, by the textbook: z0 from the share of replicates below the point, the acceleration
    from the jackknife's third moment; then the interval widened to hold the point."""
    from scipy.stats import norm

    z0 = norm.ppf((np.sum(reps < point) + 0.5 * np.sum(reps == point)) / len(reps))
    u = jack.mean() - jack
    a = np.sum(u ** 3) / (6 * np.sum(u ** 2) ** 1.5)
    qs = [norm.cdf(z0 + (z0 + z) / (1 - a * (z0 + z))) for z in norm.ppf([(1 - level) / 2, (1 + level) / 2])]
    lo, hi = np.quantile(reps, qs)
    return min(lo, point), max(hi, point)
