"""Issue 46 item 3: a verdict statistic is one registered entry with its legend line. Each name below is what the
function of raycpt.stats puts on the interval it returns (called here on small data), the claim it supports is
the one its noise model allows (run-to-run noise inside: a strategy; sampling alone: two checkpoints), and the
legend prints the registered words for it."""

import pytest

from raycpt import stats
from raycpt.errors import RaycptError
from raycpt.registry import STATISTICS
from raycpt.report.sweep.family import legend
from raycpt.report.sweep.statistics import CHECKPOINT, STRATEGY, UNREGISTERED, claim_of, statistic

A, B = [1, 0, 1, 1, 0, 1], [0, 0, 1, 0, 0, 1]
CALLS = {  # name the interval carries -> (the function, its call), by hand from each function's contract
    "exact McNemar + score interval": (stats.paired_accuracy_delta, lambda: stats.paired_accuracy_delta(A, B)),
    "t over seeds": (stats.seed_interval, lambda: stats.seed_interval([1.0, 2.0, 4.0])),
    "t over blocks": (stats.ratio_delta_t, lambda: stats.ratio_delta_t([3.0, 2.0, 4.0], [2.5, 2.0, 3.0])),
    "t over documents": (stats.ratio_delta_t,
                         lambda: stats.ratio_delta_t([3.0, 2.0, 4.0, 1.0], [2.5, 2.0, 3.0, 1.5], clusters=[0, 0, 1, 2])),
    "paired t over questions": (stats.paired_mean_t, lambda: stats.paired_mean_t([0.3, 0.5, 0.9], [0.2, 0.6, 0.4])),
    "stratified paired bootstrap": (stats.stratified_paired_delta,
                                    lambda: stats.stratified_paired_delta(A, B, list("aabbab"), resamples=50)),
    "paired bootstrap": (stats.paired_delta, lambda: stats.paired_delta(A, B, resamples=50)),
    "runs per plan": (stats.welch_run_test, lambda: stats.welch_run_test(0.1, 0.01, 3, 0.02, 3)),
}
RUN_NOISE = {"runs per plan", "runs per plan + documents", "runs per plan + questions"}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_each_statistic_the_verdict_computes_is_registered_with_its_function(name):
    function, call = CALLS[name]
    assert call().method == name
    assert STATISTICS.get(name) is function


def test_the_registry_holds_these_statistics_and_no_other():
    assert set(STATISTICS.names()) == set(CALLS) | RUN_NOISE


@pytest.mark.parametrize("name", sorted(set(CALLS) | RUN_NOISE))
def test_a_claim_is_a_strategy_exactly_when_run_noise_is_inside(name):
    assert claim_of(name) == (STRATEGY if name in RUN_NOISE else CHECKPOINT)


def test_the_legend_prints_the_registered_words_and_says_so_for_an_unknown_method():
    names = sorted(STATISTICS.names()) + ["a method of another version"]
    lines = legend(names, None)
    for n in names:
        words = STATISTICS.entry(n).help if n in STATISTICS else UNREGISTERED
        assert f"[{n}] 95% interval covers {words}." in lines
    assert claim_of("a method of another version") == CHECKPOINT and claim_of(None) is None


def test_a_statistic_registered_twice_or_with_no_claim_is_refused():
    with pytest.raises(RaycptError, match="registered twice"):
        statistic("t over seeds", stats.seed_interval, CHECKPOINT, "again")
    with pytest.raises(ValueError, match="claim"):
        statistic("a new one", stats.seed_interval, "maybe", "words")
    assert "a new one" not in STATISTICS
