"""Issue 51, rule 5, end to end through the console script: a sweep interrupted during its base row names only the
trials that did not finish; resumed, then SIGINT and SIGKILL three seconds later during a trial (nothing of the
driver can end its runs), ``raycpt runs sync FOLDER`` ends every run and every state it left, and ``--resume``
completes the sweep with nothing RUNNING and one run per trial."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_sweep import tiny_sweep_config

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT),
           "RAYCPT_FAULTS": json.dumps({"step_sleep": 0.5})}
    env.pop("RAY_ADDRESS", None)
    return env


def _statuses(root: Path) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("raycpt")
    return {r.info.run_id: (r.data.tags.get("raycpt.trial") or "sweep", r.info.status)
            for r in client.search_runs([exp.experiment_id])}


def _running_states(run_dir: Path) -> list:
    return [str(p) for name in ("state.json", "trial.json") for p in run_dir.rglob(name)
            if json.loads(p.read_text()).get("status") == "running"]


def _interrupt(args: list[str], when, signals) -> tuple[int, str]:
    """Start the console script, wait for ``when()``, then send ``signals`` ((signal, seconds to wait before it), the
    last one to the whole process group); exit code and stderr."""
    p = subprocess.Popen([sys.executable, "-m", "raycpt", *args], env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    t0 = time.time()
    while p.poll() is None and not when() and time.time() - t0 < 400:
        time.sleep(0.3)
    assert p.poll() is None, "the sweep ended before it could be interrupted"
    for sig, wait in signals:
        time.sleep(wait)
        if sig == signal.SIGKILL:
            os.killpg(p.pid, sig)
        elif p.poll() is None:
            p.send_signal(sig)
    _, err = p.communicate(timeout=300)
    return p.returncode, err


@pytest.mark.slow
def test_interrupts_name_only_unfinished_trials_and_leave_nothing_running(tmp_path, tiny_dir):
    from raycpt.config import save_config

    cfg = tiny_sweep_config(tmp_path, tiny_dir, ["sweep.trace_first=false", "sweep.include_base=true",
                                                 "train.max_steps=6"])
    args = ["sweep", str(save_config(cfg, tmp_path / "sweep.yaml")), "--splits", "0.5", "--strategies",
            "train_shallow"]
    root = Path(cfg.tracking.run_root)
    trials = lambda: root.glob("sweep-tiny-*/trials")  # noqa: E731

    def in_base():
        return any((t / "base" / "trial.json").is_file() for t in trials())

    rc, err = _interrupt(args, in_base, [(signal.SIGINT, 0)])
    (run_dir,) = root.glob("sweep-tiny-*")
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert rc == 130 and len(lines) == 1, err[-3000:]
    named = lines[0].split("sweep interrupted: ", 1)[1].split(" did not finish")[0].split(", ")
    done = {p.parent.name for p in (run_dir / "trials").glob("*/result.json")}
    assert set(named) == {"base", "full", "train_shallow-r0.5"} - done, (lines, done)
    assert "RUNNING" not in {s for _, s in _statuses(root).values()} and _running_states(run_dir) == []

    def in_training():  # a trained trial past its first steps
        return any(json.loads(p.read_text()).get("status") == "running"
                   for p in (run_dir / "trials").glob("*/train/state.json"))

    rc, _ = _interrupt([*args, "--resume"], in_training, [(signal.SIGINT, 2), (signal.SIGKILL, 3)])
    assert rc == -signal.SIGKILL
    sync = subprocess.run([sys.executable, "-m", "raycpt", "runs", "sync", str(run_dir)], env=_env(),
                          capture_output=True, text=True, timeout=300)  # what a killed command's line advises
    assert sync.returncode == 0, sync.stderr[-2000:]
    assert "RUNNING" not in {s for _, s in _statuses(root).values()} and _running_states(run_dir) == []

    out = subprocess.run([sys.executable, "-m", "raycpt", *args, "--resume"], env=_env(), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = _statuses(root)
    assert sorted(t for t, _ in runs.values()) == ["base", "full", "sweep", "train_shallow-r0.5"]
    assert {s for _, s in runs.values()} == {"FINISHED"} and _running_states(run_dir) == []
