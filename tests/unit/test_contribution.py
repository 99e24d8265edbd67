"""Contribution arithmetic, ranking, Spearman, Jaccard, majority vote on hand-worked examples (no Ray)."""

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from raycpt.diagnostics import contribution as C
from raycpt.errors import RaycptError


def test_contribution_hand_example():
    # base 0.40, full 0.50 -> gain 0.10
    scores = {0: 0.38, 1: 0.45, 2: 0.514, 3: 0.50}
    c = C.contributions(scores, base=0.40, full=0.50)
    assert c[0] == pytest.approx(-0.2)
    assert c[1] == pytest.approx(0.5)
    assert c[2] == pytest.approx(1.14)
    assert c[3] == pytest.approx(1.0)
    assert C.rank_layers(c) == [2, 3, 1, 0]
    assert C.count_above(c, 1.0) == 1          # 1.0 itself is not above
    s = C.summarize_scan(scores, 0.40, 0.50, num_layers=4)
    # relative depths (l + .5)/4: 0.125, 0.375, 0.625, 0.875 -> none within [0.4, 0.6]
    assert s["best_layer"] == 2 and s["num_above"] == 1 and math.isnan(s["band_mean"])
    s = C.summarize_scan({l: 0.4 + 0.01 * l for l in range(10)}, 0.40, 0.50, num_layers=10)
    # layers 4, 5 have depths .45, .55 -> in band; contributions 0.4 and 0.5
    assert s["band_mean"] == pytest.approx(0.45)


def test_contribution_undefined_when_full_equals_base():
    with pytest.raises(RaycptError, match="undefined"):
        C.contributions({0: 0.5}, base=0.3, full=0.3)


def naive_spearman(x, y):
    """1 - 6 sum d^2 / (n (n^2 - 1)) on ranks (no ties)."""
    rx = np.argsort(np.argsort(x))
    ry = np.argsort(np.argsort(y))
    n = len(x)
    return 1 - 6 * ((rx - ry) ** 2).sum() / (n * (n * n - 1))


def test_spearman_against_scipy_and_formula():
    rng = np.random.default_rng(1)
    x = rng.normal(size=12)
    y = x + rng.normal(size=12)
    a = {l: float(v) for l, v in enumerate(x)}
    b = {l: float(v) for l, v in enumerate(y)}
    rho, p = C.spearman(a, b)
    assert rho == pytest.approx(naive_spearman(x, y), abs=1e-12)
    ref = spearmanr(x, y)
    assert rho == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)
    # only common layers count; ties handled like scipy
    b2 = {**{l: float(round(v)) for l, v in b.items()}, 99: 5.0}
    rho2, p2 = C.spearman(a, b2)
    ref2 = spearmanr(x, [round(v) for v in y])
    assert rho2 == pytest.approx(ref2.statistic) and p2 == pytest.approx(ref2.pvalue)
    with pytest.raises(RaycptError):
        C.spearman({0: 1, 1: 2}, {0: 1, 1: 2})


def test_jaccard_of_newly_solved():
    base = {"q1": True, "q2": False, "q3": False, "q4": False, "q5": False}
    m10 = {"q1": True, "q2": True, "q3": True, "q4": False, "q5": False}
    m13 = {"q1": False, "q2": True, "q3": False, "q4": True, "q5": False}
    n10, n13 = C.newly_solved(base, m10), C.newly_solved(base, m13)
    assert n10 == {"q2", "q3"} and n13 == {"q2", "q4"}
    assert C.jaccard(n10, n13) == pytest.approx(1 / 3)
    sets = {10: n10, 13: n13, 2: {"q2"}}
    pj = C.pairwise_jaccard(sets)
    assert pj[(2, 10)] == pytest.approx(0.5) and pj[(2, 13)] == pytest.approx(0.5)
    assert C.mean_jaccard(sets) == pytest.approx((1 / 3 + 0.5 + 0.5) / 3)


def test_majority_vote_hand_example():
    # three models, best first
    m1 = {"a": "A", "b": "B", "c": "C", "d": "A"}
    m2 = {"a": "B", "b": "B", "c": "D", "d": None}
    m3 = {"a": "B", "b": "C", "c": "D", "d": "B"}
    vote = C.majority_vote([m1, m2, m3])
    # a: B twice; b: B twice; c: D twice; d: A vs B tie (m2 abstains) -> best-ranked model's A
    assert vote == {"a": "B", "b": "B", "c": "D", "d": "A"}
    gold = {"a": "B", "b": "B", "c": "C", "d": "A"}
    assert C.accuracy(vote, gold) == pytest.approx(0.75)
    assert C.accuracy(m1, gold) == pytest.approx(0.75)
    assert C.accuracy(m3, gold) == pytest.approx(0.25)
    assert C.majority_vote([m3]) == m3


def test_analyze_scan_hand_example():
    # 4 questions, gold all "A"; base solves q1 only
    def ans(preds):
        return {f"q{i + 1}": {"pred": p, "gold": "A", "correct": p == "A"} for i, p in enumerate(preds)}

    base = {"score": 25.0, "answers": ans("ABBB"), "l2": [0, 0, 0, 0]}
    full = {"score": 50.0, "answers": ans("AABB"), "l2": [1.0, 2.0, 3.0, 4.0]}
    singles = {
        0: {"score": 25.0, "answers": ans("ABBB"), "l2": [5.0, 0, 0, 0]},
        1: {"score": 75.0, "answers": ans("AAAB"), "l2": [0, 6.0, 0, 0]},   # contribution 2.0
        2: {"score": 50.0, "answers": ans("ABBA"), "l2": [0, 0, 7.0, 0]},   # 1.0
        3: {"score": 50.0, "answers": ans("ABAB"), "l2": [0, 0, 0, 8.0]},   # 1.0
    }
    out = C.analyze_scan(base, full, singles, num_layers=4, top_k=3, against={0: 0.1, 1: 0.9, 2: 0.5, 3: 0.3})
    assert out["contribution"] == {0: 0.0, 1: 2.0, 2: 1.0, 3: 1.0}
    assert out["ranking"] == [1, 2, 3, 0] and out["top_k"] == [1, 2, 3] and out["num_above"] == 1
    assert out["l2_single"] == {0: 5.0, 1: 6.0, 2: 7.0, 3: 8.0} and out["l2_full"][3] == 4.0
    # newly solved: L1 {q2, q3}, L2 {q4}, L3 {q3}: J(1,2)=0, J(1,3)=1/2, J(2,3)=0
    assert out["jaccard"]["mean"] == pytest.approx(1 / 6)
    # vote over L1 AAAB, L2 ABBA, L3 ABAB: q1 A; q2 B (2 of 3); q3 A (L1, L3); q4 B (L1, L3) -> 2/4
    v = out["vote"]
    assert v["vote_acc"] == pytest.approx(50.0) and v["best_single_layer"] == 1 and v["best_single_acc"] == 75.0
    assert v["full_acc"] == 50.0 and v["base_acc"] == 25.0
    # Spearman of (0, 2, 1, 1) vs (0.1, 0.9, 0.5, 0.3)
    ref = spearmanr([0.0, 2.0, 1.0, 1.0], [0.1, 0.9, 0.5, 0.3])
    assert out["spearman"]["rho"] == pytest.approx(ref.statistic)


def test_gold_probability():
    lp = [math.log(0.5), math.log(0.25), math.log(0.125), math.log(0.125)]
    assert C.gold_probability(lp, 0) == pytest.approx(0.5)
    assert C.gold_probability([v - 7.0 for v in lp], 2) == pytest.approx(0.125)  # shift-invariant


def test_answers_of_every_mode():
    from raycpt.diagnostics.contribution import answers_of

    qs = [{"id": "q1", "gold": "B", "logit": {"prediction": "A", "correct": False},
           "cloze": {"prediction": "B", "correct": True},
           "generate": {"text": " B.", "extracted": "B", "correct": True}}]
    assert answers_of(qs, "logit") == {"q1": {"pred": "A", "gold": "B", "correct": False}}
    assert answers_of(qs, "cloze") == {"q1": {"pred": "B", "gold": "B", "correct": True}}
    assert answers_of(qs, "generate") == {"q1": {"pred": "B", "gold": "B", "correct": True}}


# ------------------------------------------------------------------------------ issue 24: intervals with a guard
def test_fieller_interval_is_the_set_of_ratios_a_t_test_accepts():
    import numpy as np
    from scipy.stats import ttest_1samp

    from raycpt.stats import fieller_ratio

    rng = np.random.default_rng(0)
    b = (rng.random(200) < 0.3).astype(float)  # full - base per question (0/1 gains)
    a = b * (rng.random(200) < 0.6)  # the layer recovers ~60% of them
    lo, hi, ok = fieller_ratio(a, b)
    grid = np.linspace(-1, 2, 30001)
    kept = [th for th in grid if ttest_1samp(a - th * b, 0.0).pvalue >= 0.05]
    assert ok and lo == pytest.approx(min(kept), abs=2e-4) and hi == pytest.approx(max(kept), abs=2e-4)


def test_contribution_guard_when_full_training_does_not_gain():
    from raycpt.diagnostics.contribution import contribution_intervals

    def res(correct):
        return {"answers": {f"q{i}": {"correct": bool(c), "pred": "A", "gold": "A"} for i, c in enumerate(correct)}}

    base = res([0] * 40)
    full = res([1, 1] + [0] * 38)  # 2 questions of 40: exact McNemar p = 0.5
    single = {3: res([1] + [0] * 39)}
    out = contribution_intervals(base, full, single)
    assert "contribution_guard" in out and "contribution_ci" not in out and "not above 0" in out["contribution_guard"]
    full = res([1] * 20 + [0] * 20)  # a clear gain: intervals come back
    out = contribution_intervals(base, full, {3: res([1] * 10 + [0] * 30)})
    lo, hi = out["contribution_ci"][3]
    assert lo < 0.5 < hi
