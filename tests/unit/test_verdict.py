"""Multiplicity control and the best mark, against hand-worked examples."""

from __future__ import annotations

import pytest

from raycpt.report.sweep.family import _gate_graph, best_row, decide, graph_adjusted, legend, parse_primary
from raycpt.stats import benjamini_hochberg, holm


def test_holm_by_hand():
    # p = .01, .04, .03, .005 (m = 4): sorted .005 x4 = .02, .01 x3 = .03, .03 x2 = .06, .04 x1 = .04 -> running
    # max .02, .03, .06, .06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.2, None, 0.01]) == [pytest.approx(0.2), None, pytest.approx(0.02)]  # None does not count


def test_benjamini_hochberg_by_hand():
    # p = .01, .04, .03, .005: sorted .005 x4/1 = .02, .01 x4/2 = .02, .03 x4/3 = .04, .04 x4/4 = .04
    assert benjamini_hochberg([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.02, 0.04, 0.04, 0.02])


def test_graph_without_primary_is_holm():
    ps = [0.01, 0.04, 0.03, 0.005]
    w, g = _gate_graph([False] * 4)
    assert graph_adjusted(ps, w, g) == pytest.approx(holm(ps))


def test_gate_worked_by_hand():
    # two rows' primaries P1 (p = .01), P2 (p = .30) and two secondaries S1 (.012), S2 (.20), alpha .05.
    # Start: P1, P2 weight 1/2 each, S1, S2 weight 0.
    # Step 1: P1 has the smallest p/w = .02 -> adjusted .02; it passes 1/4 to P2 (P2: 3/4) and 1/8 to each S.
    # Step 2: p/w: P2 .30/.75 = .40, S1 .012/.125 = .096, S2 .20/.125 = 1.6 -> S1 at .096; S1 passes all to S2
    #   (S2: .25).
    # Step 3: P2 .40, S2 .20/.25 = .80 -> P2 at max(.096, .40) = .40; P2 passes .75 to S2 -> S2 weight 1.
    # Step 4: S2 at max(.40, .20) = .40.
    comps = [{"p": 0.01, "primary": True, "delta": 5.0}, {"p": 0.30, "primary": True, "delta": 1.0},
             {"p": 0.012, "primary": False, "delta": 3.0}, {"p": 0.20, "primary": False, "delta": -2.0}]
    out = decide(comps, "holm", 0.05)
    assert [c["p_adj"] for c in out] == pytest.approx([0.02, 0.40, 0.096, 0.40])
    # only the primary survives: S1's raw .012 would pass at .05 alone, not after the gate
    assert [c["sign"] for c in out] == [1, 0, 0, 0]
    assert [c["role"] for c in out] == ["primary", "primary", "secondary", "secondary"]
    # nothing primary rejected -> no secondary can be marked, however small its p
    out = decide([{"p": 0.5, "primary": True, "delta": 1.0}, {"p": 1e-9, "primary": False, "delta": 1.0}])
    assert [c["sign"] for c in out] == [0, 0]


def test_bh_option_and_signs():
    out = decide([{"p": 0.01, "delta": -1.0}, {"p": 0.04, "delta": 2.0}, {"p": 0.03, "delta": 1.0},
                  {"p": 0.005, "delta": 1.0}], "bh", 0.05)
    assert [c["sign"] for c in out] == [-1, 1, 1, 1]  # BH .02 .04 .04 .02 all < .05
    assert decide([{"p": None, "delta": 1.0}])[0]["sign"] is None
    with pytest.raises(ValueError):
        decide([{"p": 0.1, "delta": 1.0}], "nope")


def test_best_needs_to_beat_every_row():
    values = {"full": 40.0, "a": 47.0, "b": 45.0}
    # 3 rows, 3 pairs: alpha / 3 = .0167; a beats full (.001) but not b (.30): no clear best
    p = {frozenset(("a", "full")): 0.001, frozenset(("a", "b")): 0.30, frozenset(("b", "full")): 0.01}
    res = best_row(values, lambda x, y: p[frozenset((x, y))])
    assert res["best"] is None and res["top"] == "a" and res["runner_up"] == "b" and res["pairs"] == 3
    p[frozenset(("a", "b"))] = 0.01
    assert best_row(values, lambda x, y: p[frozenset((x, y))])["best"] == "a"
    # lower is better (held-out loss)
    assert best_row({"x": 3.1, "y": 3.5}, lambda a, b: 0.001, higher_is_better=False)["best"] == "x"


def test_primary_spec_and_legend():
    assert parse_primary("wordnet_mc/logit") == {"task": "wordnet_mc", "mode": "logit"}
    assert parse_primary("heldout_loss") == {"task": "heldout_loss", "mode": None}
    assert parse_primary(None) is None
    with pytest.raises(ValueError):
        parse_primary("wordnet_mc")
    lines = legend(["exact McNemar + score interval", "t over documents"], "wordnet_mc/logit", "holm", 0.05, 12)
    text = "\n".join(lines)
    assert "question sampling" in text and "document sampling" in text and "12 comparisons" in text
    assert "family-wise error <= 0.05" in text
    assert "false-discovery rate" in "\n".join(legend([], None, "bh"))


def test_against_base_comparisons_are_their_own_family_with_their_own_alpha():
    """Issue 50: no plan differs from full (p = 0.5 each: Holm 1.0), every row forgets (p = 0.004, 0.03 against base).
    Gated with the vs-full family the forgetting could never be marked; in its own family it is plain Holm:
    0.004 * 2 = 0.008 and max(0.008, 0.03 * 1) = 0.03, both below 0.05."""
    from raycpt.report.sweep.family import decide

    comps = [{"a": "s", "b": "full", "task": "heldout_loss", "mode": None, "delta": 0.01, "p": 0.5, "primary": True},
             {"a": "d", "b": "full", "task": "heldout_loss", "mode": None, "delta": 0.01, "p": 0.5, "primary": True},
             {"a": "s", "b": "base", "task": "general_loss", "mode": None, "delta": 0.2, "p": 0.004,
              "family": "vs base"},
             {"a": "d", "b": "base", "task": "general_loss", "mode": None, "delta": 0.2, "p": 0.03,
              "family": "vs base"}]
    out = decide(comps)
    assert [c["p_adj"] for c in out] == pytest.approx([1.0, 1.0, 0.008, 0.03])  # 0.5 x 2 = 1 in the vs-full family
    assert [c["sign"] for c in out] == [0, 0, 1, 1] and [c["family"] for c in out] == ["vs full"] * 2 + ["vs base"] * 2
