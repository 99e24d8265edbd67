"""benchmarks/bench_calibration.py --smoke runs the real summary code end to end and prints its five RESULT lines."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_mode_prints_the_five_results():
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_calibration.py"), "--smoke"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    names = re.findall(r"^RESULT (\S+) ([0-9.]+) target (<=|>=) ([0-9.]+) (PASS|FAIL)", out.stdout, re.M)
    assert [n[0] for n in names] == ["null_false_claim_rate", "power_5pt", "paired_ci_coverage", "sb_ci_coverage",
                                     "heldout_ci_coverage"]
    # the exact coverage of the paired interval does not depend on the smoke grid's luck: it holds there too
    cov = dict((n[0], float(n[1])) for n in names)
    assert cov["paired_ci_coverage"] >= 0.94
