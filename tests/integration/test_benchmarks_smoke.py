"""Benchmarks that cannot rot: every ``benchmarks/bench_*.py`` (found by name, so a benchmark added later is
covered without touching this file) runs its ``--smoke`` mode - tiny sizes, a tiny random model, seconds - and
must exit 0 and print its ``RESULT`` lines. The smoke numbers are not the claims (that is the full run)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted((REPO / "benchmarks").glob("bench_*.py"))
AT_ONCE = 2  # two smoke runs at a time: most of each is interpreter, torch and Ray start-up


def _smoke(path: Path) -> tuple[Path, subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    t0 = time.time()
    p = subprocess.run([sys.executable, str(path), "--smoke"], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=600)
    return path, p, time.time() - t0


@pytest.fixture(scope="module")
def smoke_runs():
    with ThreadPoolExecutor(AT_ONCE) as pool:
        return {path.name: (p, s) for path, p, s in pool.map(_smoke, BENCHMARKS)}


def test_every_benchmark_is_found():
    assert len(BENCHMARKS) >= 8 and REPO / "benchmarks" / "bench_strategies.py" in BENCHMARKS


@pytest.mark.parametrize("name", [p.name for p in BENCHMARKS])
def test_smoke_mode_runs_and_prints_its_results(name, smoke_runs):
    p, seconds = smoke_runs[name]
    results = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    assert p.returncode == 0, f"{name} --smoke exited {p.returncode} after {seconds:.0f}s:\n{p.stderr[-3000:]}"
    assert results, f"{name} --smoke printed no RESULT line:\n{p.stdout[-2000:]}"
    assert all(len(ln.split()) >= 3 for ln in results), results  # RESULT <name> <value> ...
