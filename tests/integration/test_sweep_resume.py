"""SIGKILL the sweep driver mid-run, then --resume: every trial finishes exactly once, one MLflow
run per trial, nothing left RUNNING, and the finished trial is not redone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from test_sweep import tiny_sweep_config


def _cli(args: list[str], env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raycpt", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)


def _train_status(trial_dir: Path):
    try:
        return json.loads((trial_dir / "train" / "state.json").read_text()).get("status")
    except (OSError, ValueError):
        return None


def test_sigkill_driver_then_resume(tmp_path, tiny_dir):
    import mlflow

    from raycpt.config import save_config
    from raycpt.train.ckpt.manifest import checkpoint_step

    cfg = tiny_sweep_config(tmp_path, tiny_dir, ["sweep.trace_first=false", "train.max_steps=6",
                                                 "train.checkpoint_every=2"])
    cfg_path = save_config(cfg, tmp_path / "sweep.yaml")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # slow steps keep the window between a trial's first checkpoint and its end open for seconds: a kill that
    # lands after the last checkpoint (or a worker that outlives the driver by a moment) leaves nothing to resume
    env["RAYCPT_FAULTS"] = json.dumps({"step_sleep": 0.5})
    args = ["sweep", str(cfg_path), "--splits", "0.5", "--strategies", "train_shallow"]
    runs = Path(cfg.tracking.run_root)

    proc = _cli(args, env)
    deadline = time.time() + 400
    first_done = None
    killed = False
    while time.time() < deadline and proc.poll() is None:
        results = list(runs.glob("sweep-tiny-*/trials/*/result.json"))
        ckpts = list(runs.glob("sweep-tiny-*/trials/*/train/ray/**/checkpoint_*"))
        started = [p for p in runs.glob("sweep-tiny-*/trials/*/trial.json")
                   if not (p.parent / "result.json").exists()]
        training = [p for p in started if _train_status(p.parent) != "finished"]  # kill mid-training, not in
        # the trial's evaluation after its training finished (a resume then rightly reuses the finished training)
        early = [c for c in ckpts if training and str(training[0].parent) in str(c) and 0 <= checkpoint_step(c) < 6]
        if results and early:
            first_done = results[0]
            os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything it started
            killed = True
            break
        time.sleep(0.5)
    proc.wait(timeout=60)
    assert killed, "the sweep finished or timed out before it could be interrupted"
    first_mtime = first_done.stat().st_mtime

    out = subprocess.run([sys.executable, "-m", "raycpt", *args, "--resume"], env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]

    (run_dir,) = list(runs.glob("sweep-tiny-*"))
    names = sorted(p.parent.name for p in run_dir.glob("trials/*/result.json"))
    assert names == ["full", "train_shallow-r0.5"]
    assert first_done.stat().st_mtime == first_mtime  # the finished trial was not redone
    # the interrupted trial's training continued from its checkpoint rather than from step 0
    interrupted = [n for n in names if (run_dir / "trials" / n / "result.json") != first_done][0]
    train_state = json.loads((run_dir / "trials" / interrupted / "train" / "state.json").read_text())
    assert train_state.get("attempts", 1) >= 2
    result = json.loads((run_dir / "trials" / interrupted / "train" / "train_result.json").read_text())
    assert result["resumed_from_step"] and result["resumed_from_step"] >= 2

    from raycpt.runs.location import locate

    client = mlflow.tracking.MlflowClient(locate(cfg.tracking, check=False).uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    all_runs = client.search_runs([exp.experiment_id])
    per_trial = {}
    for r in all_runs:
        t = r.data.tags.get("raycpt.trial")
        if t:
            per_trial[t] = per_trial.get(t, 0) + 1
    assert per_trial == {"full": 1, "train_shallow-r0.5": 1}
    assert [r.info.status for r in all_runs if r.info.status == "RUNNING"] == []
    parents = [r for r in all_runs if r.data.tags.get("raycpt.command") == "sweep" and not r.data.tags.get("raycpt.trial")]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
