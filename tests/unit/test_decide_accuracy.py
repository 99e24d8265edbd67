"""Issue 47's measures against independent references: hand cases, scipy's Kendall tau and Welch t-test, and a
synthetic validation curve whose optimum is known."""

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from raycpt.decide import (Arm, arm_stats, calibration, decide, decision_accuracy, extend_rates, kendall_tau,
                           pair_calls, rate_rows, top1_regret, win_probability)
from raycpt.decide.accuracy import PairCall, welch_p


def test_decision_accuracy_hand_case():
    # short orders a<b<c, long a<c<b: (a,b) and (a,c) agree, (b,c) flips -> 2/3 of 3 pairs
    assert decision_accuracy({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 3, "c": 2}) == (pytest.approx(2 / 3), 3)
    # a long-horizon tie has no order: left out; a short-only tie counts one half
    assert decision_accuracy({"a": 1, "b": 1, "c": 3}, {"a": 1, "b": 2, "c": 2}) == (pytest.approx(1.5 / 2), 2)
    # only the pairs asked for
    assert decision_accuracy({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 3, "c": 2}, [("b", "c")]) == (0.0, 1)


def test_decision_accuracy_matches_a_naive_count_of_pairs():
    rng = np.random.default_rng(3)
    for _ in range(50):
        s, l = rng.normal(size=7), rng.normal(size=7)
        names = [f"m{i}" for i in range(7)]
        pairs = list(itertools.combinations(range(7), 2))
        naive = sum((s[i] < s[j]) == (l[i] < l[j]) for i, j in pairs) / len(pairs)
        acc, n = decision_accuracy(dict(zip(names, s)), dict(zip(names, l)))
        assert n == 21 and acc == pytest.approx(naive)


@pytest.mark.parametrize("seed", range(20))
def test_kendall_tau_equals_scipy_with_ties(seed):
    rng = np.random.default_rng(seed)
    s, l = rng.integers(0, 4, size=8).astype(float), rng.integers(0, 4, size=8).astype(float)
    names = [str(i) for i in range(8)]
    ref = stats.kendalltau(s, l, variant="b").statistic
    got = kendall_tau(dict(zip(names, s)), dict(zip(names, l)))
    assert (math.isnan(ref) and math.isnan(got)) or got == pytest.approx(ref)


@pytest.mark.parametrize("seed", range(10))
def test_win_probability_is_welchs_one_sided_p(seed):
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 1, size=3), rng.normal(0.5, 2, size=4)
    # P(a beats b) = P(mean a < mean b): Welch's one-sided p of "a is greater" is the t-cdf at (mean b - mean a)/se
    ref = stats.ttest_ind(a, b, equal_var=False, alternative="greater").pvalue
    assert win_probability(Arm("a", tuple(a)), Arm("b", tuple(b))) == pytest.approx(ref, rel=1e-9)
    assert welch_p(Arm("a", tuple(a)), Arm("b", tuple(b))) == pytest.approx(
        stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)


def test_win_probability_without_run_noise_is_no_claim():
    assert win_probability(Arm("a", (1.0,)), Arm("b", (2.0,))) == 0.5
    assert win_probability(Arm("a", (1.0, 1.0)), Arm("b", (2.0, 2.0))) == 1.0


def test_calibration_error_hand_case():
    # four pairs: confidences 0.95, 0.95 (one right, one wrong), 0.55, 0.55 (both right); 5 bins of [0.5, 1]
    calls = [PairCall("a", "b", 0.95, "a", "a", 0.01, True), PairCall("a", "b", 0.05, "b", "a", 0.01, True),
             PairCall("c", "d", 0.55, "c", "c", 0.5, False), PairCall("c", "d", 0.45, "d", "d", 0.5, False),
             PairCall("e", "f", 0.9, "e", None, 1.0, False)]  # a long tie: left out
    ece, rows = calibration(calls, bins=5)
    # bin [0.9,1]: conf 0.95, correct 0.5 -> |0.45| x 2/4; bin [0.5,0.6): conf 0.55, correct 1.0 -> 0.45 x 2/4
    assert ece == pytest.approx(0.45)
    assert [(r["n"], r["correct"]) for r in rows] == [(2, 1.0), (2, 0.5)]


def test_top1_regret_in_long_run_sds():
    long = arm_stats({"a": [1.0, 1.2, 1.4], "b": [0.8, 1.0, 1.2], "c": [2.0, 2.2, 2.4]})
    # the short pick is a (mean 1.2); the long best is b (mean 1.0); every arm's run SD is 0.2
    regret, pick, best = top1_regret({"a": 0.1, "b": 0.2, "c": 0.3}, long)
    assert (pick, best) == ("a", "b") and regret == pytest.approx(1.0)


def test_decide_separates_resolved_pairs():
    short = arm_stats({"a": [1.0, 1.1, 0.9], "b": [2.0, 2.1, 1.9], "c": [2.05, 1.95, 2.0]})
    long = arm_stats({"a": [1.0, 1.01, 0.99], "b": [3.0, 3.01, 2.99], "c": [2.9, 3.1, 3.05]})
    d = decide(short, long, "heldout_loss")
    calls = {(c.a, c.b): c for c in pair_calls(short, long)}
    assert calls[("a", "b")].resolved and calls[("a", "c")].resolved and not calls[("b", "c")].resolved
    assert (d.pairs_all, d.pairs_resolved) == (3, 2)
    assert d.accuracy_resolved == 1.0 and d.short_pick == d.long_best == "a"


def _search(opt: float, initial=(1 / 3, 1.0, 3.0), step=3.0, max_ext=3):
    """The search loop a job runs, on a curve with its minimum at ``opt``: loss = (log m - log opt)^2."""
    tried = {float(m): (math.log(m) - math.log(opt)) ** 2 for m in initial}
    while True:
        rows = rate_rows({"full": tried}, initial)
        nxt = extend_rates(rows, step, max_ext)
        if not nxt:
            return rows[0]
        tried[nxt["full"]] = (math.log(nxt["full"]) - math.log(opt)) ** 2


def test_edge_extension_finds_a_known_optimum():
    row = _search(30.0)  # 1/3, 1, 3 -> 9 -> 27 -> 81: 27 is interior (9 and 81 worse)
    assert row.tuned and row.picked == pytest.approx(27.0) and row.extensions == 3
    low = _search(0.02)  # down: 1/9, 1/27, 1/81 (0.0123 and 0.037 bracket 0.02): the nearest in log wins
    ref = min([1 / 3, 1 / 9, 1 / 27, 1 / 81], key=lambda m: abs(math.log(m) - math.log(0.02)))
    assert low.picked == pytest.approx(ref)
    assert _search(1.0).tuned and _search(1.0).extensions == 0  # interior at once: nothing added


def test_a_method_still_at_its_edge_after_the_bound_is_untuned():
    row = _search(1000.0, max_ext=2)
    assert not row.tuned and row.edge == "high" and row.extensions == 2 and row.picked == pytest.approx(27.0)


def test_a_diverged_rate_above_the_pick_makes_it_interior():
    rows = rate_rows({"lora": {1.0: 3.0, 3.0: 2.5, 9.0: float("nan")}}, [1, 3, 9])
    assert rows[0].picked == 3.0 and rows[0].tuned and extend_rates(rows) == {}


def test_the_decision_record_is_found_only_for_the_same_settings(tmp_path):
    """Issue 47 item 4: a sweep's verdict says whether its horizon was measured; the record a decide run leaves is
    read back for the same model, data, batch and steps only, and a damaged record counts as absent."""
    import json

    from raycpt.config import load_config
    from raycpt.decide import horizon_line, read_record, record_path

    cfg = load_config(None, [f"tracking.run_root={tmp_path}", "data.seq_len=96"])  # no shipped measurement
    folder = tmp_path / "decisions"
    assert "not measured" in horizon_line(8, read_record(folder, cfg, 8))
    assert "raycpt decide CONFIG" in horizon_line(8, None)
    path = record_path(folder, cfg, 8)
    path.parent.mkdir(parents=True)
    rec = {"short_steps": 8, "long_steps": 64, "passed": False, "accuracy_all": 0.619, "pairs_all": 21,
           "run_dir": "runs/decide-x"}
    path.write_text(json.dumps(rec))
    line = horizon_line(8, read_record(folder, cfg, 8))
    assert "does NOT predict a 64-step run (62% of 21 pairs" in line and "train.max_steps=64" in line
    assert read_record(folder, cfg, 16) is None  # another horizon
    assert read_record(folder, load_config(None, [f"tracking.run_root={tmp_path}", "data.seq_len=80"]), 8) is None
    assert "held at 64 steps" in horizon_line(8, {**rec, "passed": True, "accuracy_all": 0.95})
    path.write_text('{"short_steps": 8')  # damaged: absent
    assert read_record(folder, cfg, 8) is None


def test_the_default_reads_its_shipped_measurement_and_a_users_own_record_comes_first(tmp_path):
    """The embedded default's 8-step ranking was measured against 64 steps (raycpt decide, 2026-12-06: 18 of 21 pairs
    ordered alike, pick 6.5 run SDs from the best): the record ships in raycpt/assets/decisions under the key of
    configs/default.yaml, so a sweep of the default from a fresh clone says so first. If the default's settings
    change, its key changes and this test fails: measure again or drop the record."""
    import json
    from pathlib import Path

    from raycpt.config import load_config
    from raycpt.decide import horizon_line, read_record, record_path
    from raycpt.decide.record import SHIPPED

    repo = Path(__file__).resolve().parents[2]
    cfg = load_config(str(repo / "configs" / "default.yaml"), [f"tracking.run_root={tmp_path}"])
    folder = tmp_path / "decisions"
    shipped = sorted(p.name for p in SHIPPED.glob("*.json"))
    assert shipped == [record_path(folder, cfg, 8).name]
    doc = json.loads((SHIPPED / shipped[0]).read_text())  # strict JSON: no NaN
    assert doc["pairs_all"] == 21 and round(doc["accuracy_all"] * 21) == 18 and doc["passed"] is False
    line = horizon_line(8, read_record(folder, cfg, 8))
    assert line.startswith("Horizon: this 8-step ranking does NOT predict a 64-step run (86% of 21 pairs ordered alike, "
                           "its pick 6.5 run SDs from the 64-step best")
    assert "measured 2026-12-06" in line and line.endswith("train.max_steps=64.")
    own = record_path(folder, cfg, 8)
    own.parent.mkdir(parents=True)
    own.write_text(json.dumps({"short_steps": 8, "long_steps": 80, "passed": True, "accuracy_all": 1.0,
                               "pairs_all": 3, "run_dir": "runs/mine"}))
    assert "held at 80 steps" in horizon_line(8, read_record(folder, cfg, 8))  # the user's own measurement first
    own.write_text("{")  # damaged: the shipped measurement still applies
    assert "does NOT predict a 64-step run" in horizon_line(8, read_record(folder, cfg, 8))


def _outcome(short_means, long_means, sd=0.01, seed=0):
    """decision_outcome on simulated trials: each arm searched at 1/3, 1, 3 (1 best) at seed 0, its pick at 3 seeds."""
    import numpy as np

    from raycpt.config import load_config
    from raycpt.report.decide import decision_outcome

    rng = np.random.default_rng(seed)
    cfg = load_config(None, ["decide.seeds=[0,1,2]"])
    results, rows = {}, {}
    for h, means in ((1.0, short_means), (8.0, long_means)):
        for a, mu in means.items():
            draws = rng.normal(mu, sd, 3)
            for m in (1 / 3, 1.0, 3.0):
                for sd_i in ((0, 1, 2) if m == 1.0 else (0,)):
                    x = float(draws[sd_i]) + (0.0 if m == 1.0 else 0.5)
                    results[f"{a}-h{h:g}-{m:.3g}-s{sd_i}"] = {"tune": f"{a}-h{h:g}", "lr_mult": m, "seed": sd_i,
                                                              "heldout_loss": x, "validation_loss": x, "scores": {}}
        rows[h] = rate_rows({f"{a}-h{h:g}": {m: results[f"{a}-h{h:g}-{m:.3g}-s0"]["validation_loss"]
                                             for m in (1 / 3, 1.0, 3.0)} for a in means}, [1 / 3, 1.0, 3.0])
    return cfg, decision_outcome(results, rows, list(short_means), {1.0: 8, 8.0: 64}, cfg, resamples=100)


def test_a_short_ranking_unrelated_to_the_long_one_is_never_read_as_a_decision(tmp_path):
    """Null data: the long horizon reverses the short order. The verdict's first line says it does NOT predict, the
    record a sweep reads says so, and a sweep of the same settings opens with that line."""
    from types import SimpleNamespace

    from raycpt.config import config_with
    from raycpt.decide import horizon_line, read_record, record_path
    from raycpt.report.decide import headline, write_decision

    arms = [f"arm{i}" for i in range(6)]
    cfg, o = _outcome({a: 4.0 + 0.1 * i for i, a in enumerate(arms)}, {a: 4.5 - 0.1 * i for i, a in enumerate(arms)})
    assert o.results["decision_accuracy_all_pairs"]["value"] == 0.0 and not o.results["decision_accuracy_all_pairs"]["pass"]
    assert "does NOT predict" in headline(o)
    cfg = config_with(cfg, {"tracking.run_root": str(tmp_path / "runs"), "train.max_steps": 8})
    run = SimpleNamespace(run_dir=tmp_path / "runs" / "decide-x", log_artifact=lambda *a: None,
                          log_metrics=lambda *a: None)
    folder = tmp_path / "runs" / "decisions"
    write_decision(run, o, record_to=record_path(folder, cfg, 8))
    rec = read_record(folder, cfg, cfg.train.max_steps)  # what `raycpt sweep` with the same settings reads
    assert rec is not None and rec["passed"] is False and rec["long_steps"] == 64
    assert "does NOT predict a 64-step run (0% of 15 pairs" in horizon_line(cfg.train.max_steps, rec)


def test_picks_and_seeds_read_at_the_picked_rate_only():
    """The seed means come from the runs at each arm's pick (multiplier 1 here), never from the searched rates that
    lost (0.5 nats worse): a short mean that included them would be ~0.17 higher."""
    cfg, o = _outcome({"a": 4.0, "b": 4.2}, {"a": 3.9, "b": 4.1}, sd=0.0)
    assert o.values[1.0]["heldout_loss"]["a"] == pytest.approx([4.0, 4.0, 4.0])
    assert o.picks[1.0]["a"]["picked"] == 1.0 and o.picks[1.0]["a"]["tuned"]
