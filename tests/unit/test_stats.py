"""Bootstrap and seed intervals, checked against an enumerated bootstrap, scipy, and hand arithmetic."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from naive_stats import naive_bca, naive_score_interval
from raycpt import stats as S
from raycpt.stats import (Interval, paired_delta, percentile_interval, resample_indices, seed_interval,
                          stratified_paired_delta)


def _exact_quantiles(values, level=0.95):
    """The percentile interval of the *exact* bootstrap distribution of the mean of ``values``:
    every one of the n**n index tuples enumerated, equally likely."""
    n = len(values)
    means = sorted(float(np.mean([values[i] for i in idx])) for idx in itertools.product(range(n), repeat=n))
    a = (1 - level) / 2
    # the a and 1-a quantiles of a discrete distribution with equal atoms (inverse of the CDF)
    return means[math.ceil(a * len(means)) - 1], means[math.ceil((1 - a) * len(means)) - 1]


def test_paired_delta_matches_the_enumerated_bootstrap():
    # two models on 4 questions: correct 0/1; differences (a - b) = [1, 0, 0, -1] ... and a lopsided one
    a = np.array([1, 1, 0, 1])
    b = np.array([0, 1, 0, 1])  # d = [1, 0, 0, 0]
    lo_x, hi_x = _exact_quantiles(list(a - b))
    # by hand: mean of 4 draws from {1, 0, 0, 0} is k/4 with k ~ Bin(4, 1/4): P(k=0) = 81/256 > 2.5%, so
    # the lower end is 0; P(k <= 2) = 243/256 = 0.949 < 97.5% <= P(k <= 3) = 255/256, so the upper end is 3/4
    assert (lo_x, hi_x) == (0.0, 0.75)
    iv = paired_delta(a, b, resamples=20000, seed=1)
    assert iv.point == pytest.approx(0.25) and iv.n == 4
    assert (iv.lo, iv.hi) == pytest.approx((lo_x, hi_x), abs=1e-12)


def test_constant_differences_have_a_zero_width_interval():
    iv = paired_delta([3.0, 2.0, 5.0], [1.0, 0.0, 3.0], resamples=500, seed=0)
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((2.0, 2.0, 2.0)) and iv.sign() == 1


@pytest.mark.parametrize("seed", [0, 7])
def test_paired_delta_agrees_with_scipy_bootstrap(seed):
    from scipy.stats import bootstrap

    rng = np.random.default_rng(100 + seed)
    a = (rng.random(200) < 0.55).astype(float)  # model A right on ~55% of 200 questions
    b = np.where(rng.random(200) < 0.8, a, 1 - a)  # model B agrees with A on ~80% of them
    ours = paired_delta(a, b, resamples=20000, seed=seed, scale=100.0)
    ref = bootstrap((a, b), lambda x, y, axis=-1: 100.0 * (x.mean(axis=axis) - y.mean(axis=axis)), paired=True,
                    method="percentile", n_resamples=20000, rng=np.random.default_rng(seed), vectorized=True)
    assert ours.point == pytest.approx(100.0 * (a.mean() - b.mean()))
    # Monte-Carlo tolerance: the standard error of a 2.5% quantile with 20000 resamples is ~0.1 points here
    se = ref.standard_error
    assert ours.lo == pytest.approx(ref.confidence_interval.low, abs=0.15 * se + 0.3)
    assert ours.hi == pytest.approx(ref.confidence_interval.high, abs=0.15 * se + 0.3)


def test_weighted_loss_delta_agrees_with_scipy_on_blocks():
    from scipy.stats import bootstrap

    rng = np.random.default_rng(3)
    la = 3.5 + 0.3 * rng.standard_normal(64)  # per-block losses of two models on the same 64 blocks
    lb = la + 0.05 + 0.1 * rng.standard_normal(64)
    w = rng.integers(50, 64, size=64).astype(float)  # tokens per block
    ours = paired_delta(lb, la, weights=w, resamples=20000, seed=2)

    def stat(x, y, z, axis=-1):
        return ((x - y) * z).sum(axis=axis) / z.sum(axis=axis)

    ref = bootstrap((lb, la, w), stat, paired=True, method="percentile", n_resamples=20000,
                    rng=np.random.default_rng(5), vectorized=True)
    assert ours.point == pytest.approx(float(((lb - la) * w).sum() / w.sum()))
    tol = 0.1 * ref.standard_error
    assert ours.lo == pytest.approx(ref.confidence_interval.low, abs=tol)
    assert ours.hi == pytest.approx(ref.confidence_interval.high, abs=tol)
    assert ours.sign() == 1  # a clear 0.05-nat gap on 64 blocks


def test_stratified_delta_keeps_strata_sizes_and_averages_strata():
    # two categories; within "x" model a is always right and b always wrong, within "y" they always tie
    a = np.array([1, 1, 1, 0, 1])
    b = np.array([0, 0, 0, 0, 1])
    cats = ["x", "x", "x", "y", "y"]
    iv = stratified_paired_delta(a, b, cats, resamples=300, seed=0, scale=100.0)
    # by hand: Δx = 100, Δy = 0, average of categories = 50 (not the pooled 60); every resample keeps
    # 3 questions of x and 2 of y, so every replicate is exactly 50 too
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((50.0, 50.0, 50.0))
    # a plain (pooled) resample would mix the strata and spread
    pooled = paired_delta(a, b, resamples=2000, seed=0, scale=100.0)
    assert pooled.point == pytest.approx(60.0) and pooled.hi - pooled.lo > 20


def test_stratified_delta_equals_the_plain_one_with_a_single_stratum():
    rng = np.random.default_rng(4)
    a, b = (rng.random(50) < 0.5).astype(float), (rng.random(50) < 0.4).astype(float)
    s = stratified_paired_delta(a, b, ["all"] * 50, resamples=1000, seed=9)
    p = paired_delta(a, b, resamples=1000, seed=9)
    assert (s.point, s.lo, s.hi) == pytest.approx((p.point, p.lo, p.hi))  # same draws, same statistic


def test_seed_interval_is_the_t_interval_by_hand():
    iv = seed_interval([40.0, 42.0, 47.0])
    # mean 43, sd = sqrt(((-3)^2 + (-1)^2 + 4^2) / 2) = sqrt(13); t_{0.975, 2} = 4.302652729911275
    half = 4.302652729911275 * math.sqrt(13) / math.sqrt(3)
    assert (iv.point, iv.lo, iv.hi, iv.n) == pytest.approx((43.0, 43 - half, 43 + half, 3))
    one = seed_interval([41.0])
    assert one.point == 41.0 and math.isnan(one.lo) and one.sign() == 0
    assert one.to_dict()["lo"] is None


def test_resample_indices_come_in_bounded_chunks_in_order():
    rng = np.random.default_rng(0)
    chunks = list(resample_indices(10, 2500, rng, width=1000))  # 4e6 / (10 * 1000) = 400 rows per chunk
    assert [c.shape for c in chunks] == [(400, 10)] * 6 + [(100, 10)]
    allidx = np.concatenate(chunks)
    assert allidx.min() >= 0 and allidx.max() <= 9
    assert percentile_interval(np.array([1.0, np.nan, 3.0]), 0.5) == pytest.approx((1.5, 2.5))


def test_interval_sign():
    assert Interval(1.0, 0.1, 2.0, 5, "m").sign() == 1
    assert Interval(-1.0, -2.0, -0.1, 5, "m").sign() == -1
    assert Interval(0.5, -0.1, 2.0, 5, "m").sign() == 0


# ------------------------------------------------------------------------------------------ S(b) over prompts
def _naive_s(ratio_rows, djs_rows, b):
    """S(b) the way the trace computes its point estimate: profiles -> min-max -> eq. 7, one loop."""
    from raycpt.diagnostics.scores import boundary_score, profiles

    prof = profiles(ratio_rows, djs_rows)
    return boundary_score(prof["tp_norm"], prof["ls_norm"], b)


def test_boundary_score_interval_resamples_prompts_and_recomputes_s_b():
    from raycpt.diagnostics.scores import boundary_score_interval

    rng = np.random.default_rng(11)
    ratio = rng.lognormal(0, 1, size=(9, 6))
    ratio[2, 4] = 1e5  # one exploding Ratio, as on Gemma 3
    djs = rng.lognormal(0, 1, size=(9, 6))
    ivs = boundary_score_interval(ratio, djs, [2, 3], resamples=400, seed=5)
    # the same draws, by a plain loop over resamples (one chunk: 400 x 9 x 6 values)
    idx = np.random.default_rng(5).integers(0, 9, size=(400, 9))
    for iv, b in zip(ivs, (2, 3)):
        reps = np.array([_naive_s(ratio[i], djs[i], b) for i in idx])
        point = _naive_s(ratio, djs, b)
        jack = np.array([_naive_s(np.delete(ratio, k, 0), np.delete(djs, k, 0), b) for k in range(9)])
        # was the percentile interval of these replicates; the issue (24): it can exclude its own point on
        # heavy-tailed prompts, so the interval is BCa (written out here by hand) widened to hold the point
        lo, hi = naive_bca(point, reps, jack)
        assert iv.point == pytest.approx(point, abs=1e-12)
        assert (iv.lo, iv.hi) == pytest.approx((lo, hi), abs=1e-12) and iv.n == 9
        assert iv.lo <= iv.point <= iv.hi


def test_boundary_score_interval_of_identical_prompts_is_a_point():
    from raycpt.diagnostics.scores import boundary_score_interval

    row_r, row_d = np.array([0.1, 0.5, 0.9, 0.2]), np.array([0.9, 0.3, 0.1, 0.0])
    (iv,) = boundary_score_interval(np.tile(row_r, (5, 1)), np.tile(row_d, (5, 1)), [2], resamples=50)
    # by hand, b = 2: tp^ = (0, 0.5, 1, 0.125), ls^ = (1, 1/3, 1/9, 0)
    # S = mean ls[0:2] + mean tp[2:] - mean tp[0:2] - mean ls[2:] = 2/3 + 0.5625 - 0.25 - 1/18
    s = 2 / 3 + 0.5625 - 0.25 - 1 / 18
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((s, s, s))


# ------------------------------------------------------------------------------ exact paired tests, issue 24
@pytest.mark.parametrize("n10, n01", [(4, 0), (0, 4), (7, 2), (12, 11), (0, 0), (30, 5), (1, 0)])
def test_mcnemar_exact_is_scipys_binomial_test(n10, n01):
    from scipy.stats import binomtest

    from raycpt.stats import mcnemar_exact

    ref = 1.0 if n10 + n01 == 0 else binomtest(n10, n10 + n01, 0.5).pvalue
    assert mcnemar_exact(n10, n01) == pytest.approx(ref, rel=1e-12)


def test_issue_example_four_to_zero_of_32_is_not_a_change():
    # the issue: 4 questions to 0 out of 32 was marked with a bootstrap [3.12, 25.00]; exact p = 2 / 2^4 = 0.125
    from raycpt.stats import paired_accuracy_delta

    a = np.zeros(32)
    a[:4] = 1
    iv = paired_accuracy_delta(a, np.zeros(32), scale=100.0)
    assert iv.p == pytest.approx(0.125) and iv.point == pytest.approx(12.5)
    assert iv.lo < 0 < iv.hi and iv.sign() == 0


def test_score_interval_matches_a_naive_grid_inversion():
    from raycpt.stats import paired_accuracy_delta

    rng = np.random.default_rng(3)
    a = (rng.random(60) < 0.5).astype(int)
    b = np.where(rng.random(60) < 0.85, a, 1 - a)
    iv = paired_accuracy_delta(a, b, scale=100.0)
    lo, hi = naive_score_interval(a, b)
    assert (iv.lo, iv.hi) == pytest.approx((lo, hi), abs=0.06)


def test_ratio_t_over_documents_is_scipys_t_on_document_means():
    from scipy.stats import ttest_1samp

    from raycpt.stats import ratio_delta_t

    rng = np.random.default_rng(4)
    docs = np.repeat(np.arange(10), 4)
    a = 3 + rng.standard_normal(40) + np.repeat(rng.standard_normal(10), 4)
    b = a + 0.1 + 0.3 * rng.standard_normal(40)
    iv = ratio_delta_t(a, b, clusters=docs)
    ref = ttest_1samp((a - b).reshape(10, 4).mean(1), 0.0)
    assert (iv.lo, iv.hi) == pytest.approx(tuple(ref.confidence_interval(0.95)), rel=1e-9)
    assert iv.p == pytest.approx(ref.pvalue, rel=1e-9) and iv.n == 10


def test_bca_holds_its_point_and_matches_scipy_on_a_mean():
    from scipy.stats import bootstrap as sp_bootstrap

    from raycpt.stats import bca_interval, bootstrap_replicates

    rng = np.random.default_rng(5)
    x = rng.lognormal(0, 1.2, 80)
    reps = bootstrap_replicates([x], lambda v: v.mean(-1), 20000, seed=1)
    jack = (x.sum() - x) / (len(x) - 1)
    lo, hi = bca_interval(x.mean(), reps, jack)
    ref = sp_bootstrap((x,), np.mean, method="BCa", n_resamples=20000, rng=np.random.default_rng(2)).confidence_interval
    assert lo == pytest.approx(ref.low, rel=0.03) and hi == pytest.approx(ref.high, rel=0.03)
    # a replicate cloud entirely above the point still gives an interval holding the point
    lo, hi = bca_interval(0.0, np.linspace(1, 2, 1000), np.linspace(-1, 1, 50))
    assert lo <= 0.0 <= hi


def test_spearman_exact_permutation_against_enumeration_and_too_few_splits():
    import itertools

    from scipy.stats import spearmanr

    from raycpt.stats import spearman_test

    x, y = [0.1, 0.3, 0.2, 0.5, 0.4, 0.7], [1.0, 2.5, 0.5, 4.0, 3.0, 3.5]
    res = spearman_test(x, y)
    rho = spearmanr(x, y).statistic
    # the exact two-sided p, enumerated here: share of the 720 orderings of y with |rho| >= the observed
    rhos = [spearmanr(x, p).statistic for p in itertools.permutations(y)]
    assert res["rho"] == pytest.approx(rho) and res["testable"]
    assert res["p"] == pytest.approx(np.mean(np.abs(rhos) >= abs(rho) - 1e-12))
    three = spearman_test([0.1, 0.2, 0.3], [1.0, 2.0, 3.0])  # n = 3: the smallest two-sided p is 1/3
    assert not three["testable"] and three["p"] is None and three["rho"] == pytest.approx(1.0)


def test_pooled_run_variance_and_test_against_scipy_t_by_hand():
    """Issue 36: three rows of 3, 3 and 2 runs. Pooled variance by hand: row means 2, 5, 1.5; squared
    deviations 1 + 0 + 1, 4 + 0 + 4, 0.25 + 0.25 -> 10.5 over df 2 + 2 + 1 = 5 -> 2.1. The test of row 2 against
    row 1 (means 5 - 2 = 3): se^2 = 2.1 (1/3 + 1/3) + unit variance 0.3, t on min(5, 40) = 5 df - scipy's t."""
    from scipy.stats import t as student

    from raycpt.stats import pooled_run_test, pooled_run_variance

    var, df = pooled_run_variance([[1.0, 2.0, 3.0], [3.0, 5.0, 7.0], [1.0, 2.0], [9.0], []])
    assert (var, df) == (pytest.approx(2.1), 5)
    assert pooled_run_variance([[1.0], [2.0]])[1] == 0  # one run per row: no run noise estimate
    se = np.sqrt(2.1 * 2 / 3 + 0.3)
    iv = pooled_run_test(3.0, 3, 3, var, df, 0.3, 40)
    half = student.ppf(0.975, 5) * se
    assert (iv.lo, iv.hi) == pytest.approx((3.0 - half, 3.0 + half))
    assert iv.p == pytest.approx(2 * student.sf(3.0 / se, 5))
    # scipy's pooled two-sample t (equal variances) when the run noise is all there is: rows 1 and 2 alone
    from scipy.stats import ttest_ind

    two = pooled_run_test(3.0, 3, 3, *pooled_run_variance([[1.0, 2.0, 3.0], [3.0, 5.0, 7.0]]))
    assert two.p == pytest.approx(ttest_ind([3.0, 5.0, 7.0], [1.0, 2.0, 3.0]).pvalue)


def test_mean_sampling_variance_plain_and_stratified_by_hand():
    from raycpt.stats import mean_sampling_variance

    d = [1.0, 3.0, 2.0, 6.0]
    assert mean_sampling_variance(d) == (pytest.approx(np.var(d, ddof=1) / 4), 3)
    # strata a: [1, 3] (var 2), b: [2, 6] (var 8): (2/2 + 8/2) / 2^2 = 1.25 on 4 - 2 = 2 df
    assert mean_sampling_variance(d, ["a", "a", "b", "b"]) == (pytest.approx(1.25), 2)


def test_equal_count_split_on_28_and_30_layers():
    """Shallow at r trains b = floor(r N + 1/2) layers, deep at r' trains N - floor(r' N + 1/2); by hand:
    30 layers: 0.33 -> 10 (deep at 0.66: 30 - 20 = 10), 0.5 -> 15 (deep 0.5: 15), 0.66 -> 20 (deep 0.33: 20).
    28 layers: 0.33 -> 9, deep at 0.66 trains 28 - 18 = 10 and deep at 0.33 28 - 9 = 19: no partner for 0.33 or
    0.66; 0.5 -> 14 = 28 - 14. With 1/3, 2/3: 9 = 28 - 19 and 19 = 28 - 9."""
    from raycpt.splits import equal_count_split

    grid = [0.33, 0.5, 0.66]
    assert [equal_count_split(r, grid, 30) for r in grid] == [0.66, 0.5, 0.33]
    assert [equal_count_split(r, grid, 28) for r in grid] == [None, 0.5, None]
    thirds = [1 / 3, 1 / 2, 2 / 3]
    assert [equal_count_split(r, thirds, 28) for r in thirds] == [2 / 3, 1 / 2, 1 / 3]


def test_paired_mean_t_is_scipys_paired_t_and_stratified_by_hand():
    """Issue 37's continuous scores: the plain paired t equals scipy's ttest_rel (p) and its confidence interval;
    the stratified one (the Average column of unequal categories) is the mean of the strata mean differences with
    se^2 = sum var_c / n_c / C^2 on n - C df, computed here by hand."""
    from scipy import stats as st

    rng = np.random.default_rng(3)
    a, b = rng.normal(0.3, 1, 40), rng.normal(0.0, 1, 40)
    iv = S.paired_mean_t(a, b, scale=100.0)
    ref = st.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    assert iv.p == pytest.approx(ref.pvalue, rel=1e-9)
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((100 * np.mean(a - b), 100 * ci.low, 100 * ci.high), rel=1e-9)
    strata = ["x"] * 10 + ["y"] * 30
    d = a - b
    dx, dy = d[:10], d[10:]
    point = (dx.mean() + dy.mean()) / 2
    se = np.sqrt((dx.var(ddof=1) / 10 + dy.var(ddof=1) / 30) / 4)
    q = st.t.ppf(0.975, 38)
    iv = S.paired_mean_t(a, b, strata)
    assert (iv.point, iv.lo, iv.hi) == pytest.approx((point, point - q * se, point + q * se), rel=1e-9)
    assert iv.p == pytest.approx(2 * st.t.sf(abs(point) / se, 38), rel=1e-9)
    assert S.paired_mean_t([1, 2], [1, 2]).p == 1.0


def test_welch_run_test_is_welchs_t_test_and_adds_the_units_part_by_hand():
    """Issue 50: each plan's own run variance. Without unit noise it is scipy's unequal-variance t-test (interval
    and p); with it, se^2 gains the part and the df stays Welch's over the run parts (capped at the units' df); a
    fixed reference adds nothing."""
    import scipy.stats as st

    from raycpt.stats import welch_run_test

    a, b = [3.1, 2.4, 4.0, 3.3], [1.0, 1.9, 0.2]
    ref = st.ttest_ind(a, b, equal_var=False)
    ci = ref.confidence_interval(0.95)
    iv = welch_run_test(np.mean(a) - np.mean(b), np.var(a, ddof=1), 4, np.var(b, ddof=1), 3)
    assert iv.p == pytest.approx(ref.pvalue, rel=1e-10) and (iv.lo, iv.hi) == pytest.approx((ci.low, ci.high))
    va, vb, vu = np.var(a, ddof=1) / 4, np.var(b, ddof=1) / 3, 0.05
    df = ref.df  # scipy's Welch df of the runs alone (va + vb)^2 / (va^2 / 3 + vb^2 / 2), not grown by the unit part
    assert df == pytest.approx((va + vb) ** 2 / (va ** 2 / 3 + vb ** 2 / 2))
    d = np.mean(a) - np.mean(b)
    iv = welch_run_test(d, np.var(a, ddof=1), 4, np.var(b, ddof=1), 3, vu, 20)
    assert iv.p == pytest.approx(2 * st.t.sf(d / math.sqrt(va + vb + vu), df), rel=1e-10)
    half = st.t.ppf(0.975, df) * math.sqrt(va + vb + vu)
    assert (iv.lo, iv.hi) == pytest.approx((d - half, d + half))
    low = welch_run_test(d, np.var(a, ddof=1), 4, np.var(b, ddof=1), 3, vu, 1)  # the units' df caps it
    assert low.p == pytest.approx(2 * st.t.sf(d / math.sqrt(va + vb + vu), 1), rel=1e-10)
    # b fixed and a unit part: k_a - 1 df whatever the unit part's df (a small run variance cannot raise it)
    fixed = welch_run_test(np.mean(a) - 1.0, np.var(a, ddof=1), 4, 0.0, math.inf, vu, 127)
    assert fixed.p == pytest.approx(2 * st.t.sf(abs(np.mean(a) - 1.0) / math.sqrt(va + vu), 3), rel=1e-10)
    # b fixed (the untrained model): the one-sample t of a's runs against b's value
    one = welch_run_test(np.mean(a) - 1.0, np.var(a, ddof=1), 4, 0.0, math.inf)
    assert one.p == pytest.approx(st.ttest_1samp(a, 1.0).pvalue, rel=1e-10) and one.n == 5
