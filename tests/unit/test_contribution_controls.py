"""Seed 003's two controls, on hand-worked numbers (no Ray): the full model answering k times (seeded
sampling of its choice distribution) and voting, and the elite-LR recipe against its lowest-layer control."""

import math

import numpy as np
import pytest

from raycpt.diagnostics import contribution as C
from raycpt.errors import RaycptError

LP = [math.log(0.5), math.log(0.25), math.log(0.125), math.log(0.125)]  # cdf 0.5, 0.75, 0.875, 1


@pytest.mark.parametrize("u, want", [(0.0, 0), (0.4999, 0), (0.5, 1), (0.74, 1), (0.8, 2), (0.9, 3), (0.9999, 3)])
def test_sample_choice_is_the_inverse_cdf_of_the_softmax(u, want):
    assert C.sample_choice(LP, 1.0, u) == want
    assert C.sample_choice([v + 3.0 for v in LP], 1.0, u) == want  # log-likelihoods: shift-invariant


def test_temperature_flattens_and_zero_is_the_argmax():
    # T = 2: p ~ sqrt(0.5, 0.25, 0.125, 0.125) = (0.7071, 0.5, 0.3536, 0.3536) / 1.9142 -> cdf 0.3694, 0.6306, 0.8153
    assert [C.sample_choice(LP, 2.0, u) for u in (0.36, 0.38, 0.62, 0.64, 0.81, 0.82)] == [0, 1, 1, 2, 2, 3]
    rng = np.random.default_rng(7)
    for _ in range(50):
        lp = list(rng.permutation([0.0, 0.1, 0.6, 2.0]) + rng.normal(size=4) * 0.01)  # the top two >= 0.05 apart
        greedy = int(np.argmax(lp))
        assert C.sample_choice(lp, 0.0, 0.3) == greedy
        assert all(C.sample_choice(lp, t, u) == greedy for t in (1e-3, 1e-6) for u in (0.0, 0.5, 0.999999))
    assert C.sample_choice([1.0, 3.0, 3.0, 0.0], 0.0, 0.99) == 1  # ties: the first maximum, like the prediction


def test_draws_are_seeded_per_question_and_follow_the_distribution():
    a = C.question_draws("q7", 5, seed=3)
    assert np.array_equal(a, C.question_draws("q7", 5, seed=3))
    assert not np.array_equal(a, C.question_draws("q7", 5, seed=4))
    assert not np.array_equal(a, C.question_draws("q8", 5, seed=3))
    one = C.sampled_answers({"q1": LP}, 4, 1.0, seed=0)
    more = C.sampled_answers({"q0": LP[::-1], "q1": LP}, 4, 1.0, seed=0)  # another question does not move q1's
    assert [m["q1"] for m in one] == [m["q1"] for m in more]
    many = C.sampled_answers({"q": LP}, 20000, 1.0, seed=1)
    freq = {c: sum(m["q"] == c for m in many) / 20000 for c in "ABCD"}
    assert freq == pytest.approx({"A": 0.5, "B": 0.25, "C": 0.125, "D": 0.125}, abs=0.015)


def test_sampled_vote_hand_example():
    sure = -1e4  # log-likelihood gap that no temperature <= 1 turns into a draw
    answers = {
        "q1": {"pred": "A", "gold": "A", "logprobs": [0.0, sure, sure, sure]},   # always A: right
        "q2": {"pred": "C", "gold": "B", "logprobs": [sure, sure, 0.0, sure]},   # always C: wrong
        "q3": {"pred": "A", "gold": "B", "logprobs": [0.0, 0.0, sure, sure]},    # A or B, half each
    }
    k, seed = 5, 11
    u = C.question_draws("q3", k, seed)
    picks = ["A" if x < 0.5 else "B" for x in u]  # by hand: cdf (0.5, 1.0)
    n_b = picks.count("B")
    vote_q3 = "B" if n_b > k - n_b else "A"  # k odd: no tie
    out = C.sampled_vote(answers, k, 1.0, seed)
    assert out["vote_acc"] == pytest.approx(100 * (1 + (vote_q3 == "B")) / 3)
    assert out["sample_acc"] == pytest.approx(100 * (1 + n_b / k) / 3)
    assert out["greedy_acc"] == pytest.approx(100 / 3) and out["num_questions"] == 3
    assert C.sampled_vote(answers, k, 0.0, seed)["vote_acc"] == pytest.approx(100 / 3)  # T=0: the greedy answers
    assert C.sampled_vote(answers, k, 1.0, seed) == out  # reproducible
    with pytest.raises(RaycptError, match="log-likelihoods"):
        C.sampled_vote({"q1": {"pred": "A", "gold": "A"}}, k, 1.0, seed)


def test_analyze_scan_carries_the_sampled_vote():
    def ans(preds, lps=None):
        return {f"q{i + 1}": {"pred": p, "gold": "A", "correct": p == "A",
                              **({"logprobs": lps[i]} if lps else {})} for i, p in enumerate(preds)}

    sure = -1e4
    a, b = [0.0, sure, sure, sure], [sure, 0.0, sure, sure]
    base = {"score": 25.0, "answers": ans("ABBB")}
    full = {"score": 50.0, "answers": ans("AABB", [a, a, b, b])}
    singles = {0: {"score": 50.0, "answers": ans("AABB")}, 1: {"score": 75.0, "answers": ans("AAAB")}}
    out = C.analyze_scan(base, full, singles, num_layers=2, top_k=2, sample={"temperature": 1.0, "seed": 0})
    sv = out["sampled_vote"]
    assert sv["k"] == 2 and sv["vote_acc"] == pytest.approx(50.0) and sv["greedy_acc"] == pytest.approx(50.0)
    # top-2 vote (layer 1 AAAB first, layer 0 AABB; q3's tie goes to layer 1) = AAAB vs full's sampled vote
    # AABB: one discordant pair (q3, right only under the vote): +25 points, exact McNemar p = 1
    assert out["vote"]["vote_acc"] == pytest.approx(75.0)
    assert sv["paired"]["delta"] == pytest.approx(25.0) and sv["paired"]["p"] == 1.0
    assert sv["paired"]["num_questions"] == 4
    full_no_lp = {"score": 50.0, "answers": ans("AABB")}
    out = C.analyze_scan(base, full_no_lp, singles, num_layers=2, top_k=2, sample={"temperature": 1.0, "seed": 0})
    assert "logit or cloze" in out["sampled_vote"]["unavailable"]
    assert "sampled_vote" not in C.analyze_scan(base, full, singles, num_layers=2, top_k=2)


def test_answers_of_keeps_the_choice_loglikelihoods():
    qs = [{"id": "q1", "gold": "B", "logit": {"prediction": "A", "correct": False, "logprobs": [-1, -2, -3, -4]}}]
    assert C.answers_of(qs, "logit") == {"q1": {"pred": "A", "gold": "B", "correct": False,
                                                "logprobs": [-1.0, -2.0, -3.0, -4.0]}}


def test_elite_lr_control_hand_example():
    def ans(bits):
        return {f"q{i}": {"pred": "A" if c == "1" else "B", "gold": "A", "correct": c == "1"}
                for i, c in enumerate(bits)}

    full = {"score": 50.0, "answers": ans("1010")}
    top = {"score": 75.0, "answers": ans("1110"), "elite_layers": [1, 2]}
    bottom = {"score": 25.0, "answers": ans("0010"), "elite_layers": [0, 3]}
    out = C.elite_lr_control(full, top, bottom)
    assert (out["top_minus_full"], out["bottom_minus_full"], out["top_minus_bottom"]) == (25.0, -25.0, 50.0)
    assert out["top_layers"] == [1, 2] and out["bottom_layers"] == [0, 3]
    assert out["accuracy"] == {"num_questions": 4, "full": 50.0, "top": 75.0, "bottom": 25.0}
    # top vs bottom: q0, q1 right only under top (n10 = 2, n01 = 0): exact McNemar p = 2 * 0.5**2
    tb = out["paired"]["top-bottom"]
    assert tb["delta"] == pytest.approx(50.0) and tb["p"] == pytest.approx(0.5)
    # top vs full: one discordant pair (q1): p = 1
    assert out["paired"]["top-full"]["delta"] == pytest.approx(25.0) and out["paired"]["top-full"]["p"] == 1.0
    no_answers = C.elite_lr_control({"score": 1.0}, {"score": 3.0}, {"score": 0.5})
    assert no_answers["top_minus_bottom"] == 2.5 and "paired" not in no_answers


def test_vote_against_sampled_hand_example():
    sure = -1e4
    lp = {"A": [0.0, sure, sure, sure], "B": [sure, 0.0, sure, sure]}
    # the full model's argmax (T = 0, every draw the same): right on q0 only; the vote: right on q0, q1, q2
    answers = {f"q{i}": {"pred": p, "gold": "A", "logprobs": lp[p]} for i, p in enumerate("ABBB")}
    vote = {"q0": "A", "q1": "A", "q2": "A", "q3": "C"}
    out = C.vote_against_sampled(vote, answers, 3, {"temperature": 0.0, "seed": 5})
    # n10 = 2 (q1, q2), n01 = 0 of 4: +50 points, p = 2 * 0.5**2 = 0.5
    assert out["delta"] == pytest.approx(50.0) and out["p"] == pytest.approx(0.5) and out["num_questions"] == 4
    assert out["lo"] < 50.0 < out["hi"]
    worse = C.vote_against_sampled({q: "B" for q in answers}, answers, 3, {"temperature": 0.0, "seed": 5})
    assert worse["delta"] == pytest.approx(-25.0) and worse["p"] == 1.0  # q0 right only under the control


# ------------------------------------------------------------------------------------ seed 003's L2 control
@pytest.mark.parametrize("n", [6, 12])
def test_l2_control_is_spearman_with_a_permutation_p_value(n):
    """rho equals scipy's Spearman; p equals scipy's permutation test over pairings (exact for n <= 8; for n = 12
    within the Monte-Carlo error of 20,000 permutations of both)."""
    from scipy import stats

    rng = np.random.default_rng(n)
    contrib = {i: float(v) for i, v in enumerate(rng.normal(size=n))}
    l2 = {i: 0.5 + 0.3 * float(v) + 0.2 * contrib[i] for i, v in enumerate(rng.random(n))}
    got = C.l2_control(contrib, l2, n_perm=20000)
    x, y = [contrib[i] for i in range(n)], [l2[i] for i in range(n)]
    assert got["rho"] == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
    def rho(a, b, axis=-1):  # Spearman along the last axis (vectorized: scipy's resamples in one call)
        ra, rb = stats.rankdata(a, axis=axis), stats.rankdata(b, axis=axis)
        ra, rb = ra - ra.mean(axis, keepdims=True), rb - rb.mean(axis, keepdims=True)
        return (ra * rb).sum(axis) / np.sqrt((ra ** 2).sum(axis) * (rb ** 2).sum(axis))

    ref = stats.permutation_test((x, y), rho, permutation_type="pairings", vectorized=True,
                                 n_resamples=math.inf if n <= 8 else 20000, alternative="two-sided", random_state=1)
    assert got["p"] == pytest.approx(ref.pvalue, abs=1e-12 if n <= 8 else 0.015)
    vals = np.array(y)
    assert got["l2_full_cv"] == pytest.approx(vals.std(ddof=1) / vals.mean())
    assert got["l2_full_max_over_min"] == pytest.approx(vals.max() / vals.min())


def test_l2_control_with_too_few_layers_says_so_and_the_report_prints_it():
    from raycpt.report.contribution import control_lines

    assert "unavailable" in C.l2_control({0: 1.0, 1: 2.0}, {0: 0.5, 1: 0.6})
    a = {"l2_control": C.l2_control({i: float(i) for i in range(5)}, {i: 1.0 + i for i in range(5)})}
    assert a["l2_control"]["rho"] == pytest.approx(1.0) and a["l2_control"]["p"] == pytest.approx(2 / 120)
    assert "rho between contribution and full training's per-layer L2 change = +1.000 over 5 layers" in \
        "\n".join(control_lines(a))


def test_the_tuned_learning_rate_baseline_sets_the_scans_rate(monkeypatch, tmp_path):
    """``contribution.lr_grid``: full runs at train.lr x each multiplier; the lowest validation loss (not the
    held-out one) sets train.lr for the scan; the trial configs carry the multiplied rate."""
    from raycpt.config import load_config
    from raycpt.jobs import contribution as J

    cfg = load_config(None, ["contribution.lr_grid=[0.5, 1, 2]", "train.lr=1e-4"])
    assert [J.scan_trial_config(cfg, J.ScanTrial("f", "full", lr_mult=m)).train.lr for m in (0.5, 2.0)] == \
        pytest.approx([5e-5, 2e-4])
    fake = {f"full-lr{m:g}": {"name": f"full-lr{m:g}", "tune": "full", "lr_mult": m, "lr": 1e-4 * m,
                              "validation_loss": v, "heldout_loss": h}
            for m, v, h in ((0.5, 4.2, 3.0), (1.0, 4.1, 4.1), (2.0, 4.3, 4.3))}
    monkeypatch.setattr(J, "run_grid", lambda *a, **k: fake)
    monkeypatch.setattr(J, "validation_blocks", lambda *a, **k: [[1, 2, 3]])

    class Run:
        run_dir = tmp_path
        params = {}

        def log_params(self, p):
            self.params.update(p)

    plan = J.ContributionPlan(cfg, "unused", 4, [0, 1], None, None)
    run = Run()
    row = J._tune_lr(plan, run, {}, False, None)
    assert row["picked_mult"] == 1.0 and cfg.train.lr == pytest.approx(1e-4) and run.params == {"tuned_lr/full": 1e-4}
    assert (tmp_path / "validation_blocks.json").is_file()
