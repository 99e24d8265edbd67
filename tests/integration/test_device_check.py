"""The prepared GPU check runs its CPU version end to end: every check reports, and every check passes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKS = {"facts", "memory_full", "memory_train_shallow", "memory_train_deep", "gradients_full",
          "gradients_train_shallow", "gradients_train_deep", "trace_dtype", "bf16_checkpoint_round_trip", "eval_paths",
          "train_killed_worker"}


@pytest.mark.slow  # 106 s: the device check's CPU stand-in runs every check of the prepared GPU script
def test_device_check_tiny_passes_every_check(tmp_path):
    out = tmp_path / "check.json"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "device_check.py"), "--tiny", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("CHECK ")]
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    results = json.loads(out.read_text())["results"]
    assert {x["check"] for x in results} == CHECKS and all(x["pass"] for x in results)
    assert len(lines) == len(CHECKS) and all(" PASS " in ln for ln in lines)
    trip = next(x for x in results if x["check"] == "bf16_checkpoint_round_trip")
    assert len(trip["losses"]) == 4
