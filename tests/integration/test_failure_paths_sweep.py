"""Issue 27 for ``raycpt sweep``, driven from outside: the tracking server (a real ``mlflow server``) killed by its
PID once the first trial has logged a step. Every trial finishes locally, the summary is written, one warning line
names the sweep folder and the sync command, exit 0; after a restart of the server on its store, ``raycpt runs
sync SWEEP_DIR`` ends every trial's run FINISHED with the step metrics of its ``train_metrics.jsonl``, and a second
sync adds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_failure_paths_train import _env, _free_port, _kill, _lines, _start_server
from test_sweep import tiny_sweep_config


def _wait_for_first_step(runs: Path, proc: subprocess.Popen, timeout: float = 500) -> Path:
    """The sweep folder, once a trial's ``train_metrics.jsonl`` holds a step record."""
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        for f in runs.glob("sweep-*/trials/*/train/train_metrics.jsonl"):
            if any(ln.startswith('{"step"') for ln in f.read_text().splitlines()):
                return f.parents[3]
        time.sleep(0.5)
    rc = proc.poll()
    raise AssertionError(f"no trial logged a step (exit {rc}): {proc.stderr.read()[-3000:] if rc is not None else ''}")


def _records(train_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (train_dir / "train_metrics.jsonl").read_text().splitlines()
            if ln.startswith('{"step"')]


def _points(client, run_id: str) -> int:
    """Every metric point of a run (each key's whole history)."""
    return sum(len(client.get_metric_history(run_id, k)) for k in client.get_run(run_id).data.metrics)


def _sync(sweep_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raycpt", "runs", "sync", str(sweep_dir)], capture_output=True,
                          text=True, env=_env(), timeout=300)


@pytest.mark.slow
def test_a_tracking_server_killed_mid_sweep_finishes_locally_then_syncs(tmp_path, tiny_dir):
    from mlflow.tracking import MlflowClient

    from raycpt.config import save_config

    port, store = _free_port(), tmp_path / "server"
    server = _start_server(store, port)
    uri = f"http://127.0.0.1:{port}"
    cfg = tiny_sweep_config(tmp_path, tiny_dir, ["sweep.trace_first=false", "train.max_steps=4",
                                                 f"tracking.uri={uri}"])
    args = ["sweep", str(save_config(cfg, tmp_path / "sweep.yaml")), "--splits", "0.5", "--strategies",
            "train_shallow"]
    sweep = subprocess.Popen([sys.executable, "-m", "raycpt", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=_env(RAYCPT_FAULTS=json.dumps({"step_sleep": 1.0})))
    try:
        sweep_dir = _wait_for_first_step(Path(cfg.tracking.run_root), sweep)
        _kill(server)  # by its PID, while the first trial trains
        out, err = sweep.communicate(timeout=900)
    finally:
        if sweep.poll() is None:
            sweep.kill()
        _kill(server)
    lines = _lines(err)
    assert sweep.returncode == 0 and "Traceback" not in err + out, (err + out)[-4000:]
    assert len(lines) == 1 and lines[0].startswith(f"warning: tracking server {uri} unreachable"), lines
    assert f"raycpt runs sync {sweep_dir}" in lines[0]
    names = ["full", "train_shallow-r0.5"]
    assert sorted(p.parent.name for p in sweep_dir.glob("trials/*/result.json")) == names
    assert (sweep_dir / "summary" / "deltas.csv").is_file()
    state = json.loads((sweep_dir / "state.json").read_text())
    assert state["status"] == "finished" and (sweep_dir / "tracking_lost.json").is_file()

    server = _start_server(store, port)  # the same server again, on its store
    try:
        client = MlflowClient(uri)
        r = _sync(sweep_dir)
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr[-3000:]
        parent = client.get_run(state["mlflow_run_id"])
        assert parent.info.status == "FINISHED"
        assert {f.path for f in client.list_artifacts(parent.info.run_id, "summary")} >= {"summary/deltas.csv"}
        points = {}
        for name in names:
            tdir = sweep_dir / "trials" / name
            run_id = json.loads((tdir / "trial.json").read_text())["mlflow_run_id"]
            run = client.get_run(run_id)
            assert run.info.status == "FINISHED" and run.data.tags["mlflow.parentRunId"] == parent.info.run_id
            records = _records(tdir / "train")
            assert [r["step"] for r in records] == [1, 2, 3, 4]
            for key in ("loss", "grad_norm", "lr"):
                hist = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
                assert hist == [(rec["step"], pytest.approx(rec[key], rel=1e-12)) for rec in records], (name, key)
            result = json.loads((tdir / "result.json").read_text())
            assert run.data.metrics["trainable_params"] == result["trainable_params"]
            # the trial's own end value (MLflow's latest is the last step's, a step metric of the same name)
            assert result["tokens_per_s"] in [m.value for m in client.get_metric_history(run_id, "tokens_per_s")]
            points[run_id] = _points(client, run_id)
        assert not (sweep_dir / "tracking_lost.json").exists()
        again = _sync(sweep_dir)  # a second sync adds nothing
        assert again.returncode == 0, again.stderr[-3000:]
        assert {rid: _points(client, rid) for rid in points} == points
    finally:
        _kill(server)
