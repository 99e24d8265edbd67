"""benchmarks/bench_calibration.py --smoke runs the real summary code end to end and prints its nine RESULT lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_mode_prints_the_nine_results_and_issue_50s():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_calibration.py"), "--smoke"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    names = re.findall(r"^RESULT (\S+) ([0-9.]+|inf) target (<=|>=) ([0-9.]+) (PASS|FAIL)", out.stdout, re.M)
    assert [n[0] for n in names] == ["null_false_claim_rate", "power_5pt", "paired_ci_coverage", "sb_ci_coverage",
                                     "heldout_ci_coverage", "null_false_claim_rate_run_noise",
                                     "null_false_claim_rate_seeds3", "seed_test_size", "mde_seeds3",
                                     "null_fwer_heterogeneous_run_noise", "floor_design_fwer", "floor_design_power_5sd",
                                     "against_base_null_rate", "forgetting_power_0p2"]
    assert re.search(r"^RESULT seed_test_size [0-9.]+ target <= 0\.0100 ", out.stdout, re.M)
    # the exact coverage of the paired interval does not depend on the smoke grid's luck: it holds there too
    cov = dict((n[0], float(n[1])) for n in names)
    assert cov["paired_ci_coverage"] >= 0.94


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_calibration", ROOT / "benchmarks" / "bench_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_null_sweeps_through_the_real_summary_rarely_claim_and_a_real_gain_is_found():
    """The verdict on null data: 30 simulated sweeps (every trial the same true accuracy) through the real
    build_summary. Under the old reading (any interval excluding 0) 72.5% of null sweeps claimed something, so
    ~22 of 30 would; at the controlled 5% the expected count is 1.5 (P(X > 5) < 0.002). The same code must still
    see a true +5-point gain on the primary (power 0.91 in the full benchmark): a verdict that never claims fails."""
    b = _bench()
    null, _ = b.run_sweeps(30, 0.01, 0.0, seed=11)
    assert null * 30 <= 5, f"{null * 30:.0f} of 30 null sweeps made a claim"
    power, _ = b.run_sweeps(10, 0.01, 0.05, seed=12)
    assert power >= 0.6, f"a true 5-point gain detected in {power * 10:.0f} of 10 sweeps"


def test_run_level_offsets_make_checkpoint_marks_but_no_strategy_claim():
    """Issue 36 at the default's shape (one seed): a run offset of 2 run SDs on every trial makes the old
    reading mark nearly every null sweep (checkpoint marks), and the verdict states none of them as a claim
    about strategies. At paper-check's shape (3 seeds) the pooled strategy test claims in at most 2 of 8 null
    sweeps with the same offsets (expected 0.4 at the 5% target; P(X > 2) < 0.01) and still finds a held-out
    gain of 20 run SDs in most sweeps: a verdict that never claims fails (5 SDs: the xfail below)."""
    b = _bench()
    strat, _, marks = b.run_noise_sweeps(4, "default", 2.0, 0.0, seed=21)
    assert strat == 0.0 and marks >= 0.75, (strat, marks)
    null, _, _ = b.run_noise_sweeps(8, "paper-check", 2.0, 0.0, seed=22)
    assert null * 8 <= 2
    power, _, _ = b.run_noise_sweeps(4, "paper-check", 1.0, 20.0, seed=23)
    assert power >= 0.75, power  # a verdict that never claims fails


@pytest.mark.xfail(strict=True, reason="issue 50's per-plan run noise (Welch-Satterthwaite: 2 df per row at 3 seeds) "
                   "holds its size under heterogeneous noise but finds a 5-run-SD gain in 0 of 4 sweeps (the pooled "
                   "model found it in ~all); 10 SDs: 3 of 4. A measured loss of power, left failing on purpose")
def test_paper_check_finds_a_five_run_sd_gain():
    power, _, _ = _bench().run_noise_sweeps(4, "paper-check", 1.0, 5.0, seed=23)
    assert power >= 0.75, power


def test_seed_test_size_is_at_most_its_target():
    """The strategy test's size at a Holm level (0.05 / 6), 3 seeds x 7 rows, under its own model: at most
    0.0100 (2000 comparisons per cell; MC half-width ~0.004)."""
    size, _, _ = _bench().seed_test_size(2000, seed=5)
    assert size <= 0.0100 + 0.004, size


def test_a_noise_floor_makes_strategy_claims_that_hold_their_size():
    """sweep.floor_seeds=[1,2] at the default's shape (issue 50: full 3 runs, every plan 2, each its own variance). Null sweeps
    with run offsets at 2 run SDs claim in at most 2 of 10 (expected <= 0.5 at the 5% target; P(X > 2) < 0.02),
    and a held-out gain of 40 run SDs (0.31 nats, the size of the default's shallow-vs-full gaps) is a strategy
    claim in most sweeps: a floor that never claims fails."""
    b = _bench()
    null, _, _ = b.run_noise_sweeps(10, "default+floor", 2.0, 0.0, seed=31)
    assert null * 10 <= 2, null
    power, _, _ = b.run_noise_sweeps(6, "default+floor", 1.0, 40.0, seed=32)
    assert power >= 0.66, power
