"""The cluster path on loopback: `ray start --head` on 127.0.0.1, `ray job submit` a tiny sweep, wait
for SUCCEEDED, check the MLflow store; `ray stop` always runs.

Named ``test_zz_*`` so it runs last, and the session's in-process Ray (the ``ray_local`` fixture) is shut
down first. ``ray stop`` ends every Ray on the machine, so the test stops its own cluster with
``ray stop`` scoped to the processes under its private ``--temp-dir`` (see ``_ray_stop``); CI's
``.ci/run`` runs a plain ``ray stop`` at the end as well."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

from test_sweep import tiny_sweep_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_stop(temp_dir, env) -> None:
    """`ray stop` for this cluster only: the processes whose command line names our temp dir."""
    import signal

    mine = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(temp_dir) in cmd:
            mine.append(int(pid))
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in mine:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        time.sleep(2)


def test_ray_job_submit_tiny_sweep(tmp_path, tiny_dir):
    import mlflow

    from raycpt.config import save_config

    cfg = tiny_sweep_config(tmp_path, tiny_dir, ["sweep.trace_first=false", "sweep.include_full=false",
                                                 "train.max_steps=2", "eval.modes=[logit]"])
    work = tmp_path / "job"
    work.mkdir()
    save_config(cfg, work / "sweep.yaml")

    import ray

    if ray.is_initialized():
        ray.shutdown()
    gcs_port, dash_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS",)}
    env.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0")
    # this interpreter's `ray` and `python` first, as in an activated venv (pytest may run without one)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    address = f"http://127.0.0.1:{dash_port}"
    import shutil
    import tempfile

    temp_dir = tempfile.mkdtemp(prefix="rcj", dir="/tmp")  # AF_UNIX socket paths must stay < 108 bytes
    try:
        start = subprocess.run(
            ["ray", "start", "--head", f"--port={gcs_port}", "--node-ip-address=127.0.0.1",
             "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
             "--num-cpus=4", "--object-store-memory=1000000000", "--disable-usage-stats", f"--temp-dir={temp_dir}"],
            env=env, capture_output=True, text=True, timeout=180)
        assert start.returncode == 0, start.stdout[-2000:] + start.stderr[-2000:]
        for _ in range(40):  # the dashboard's job agent comes up some seconds after `ray start` returns
            sub = subprocess.run(
                ["ray", "job", "submit", "--address", address, "--working-dir", str(work), "--no-wait", "--",
                 "python", "-m", "raycpt", "sweep", "sweep.yaml", "--splits", "0.5", "--strategies", "train_shallow"],
                env=env, capture_output=True, text=True, timeout=180)
            if sub.returncode == 0 or "No available agent" not in sub.stderr + sub.stdout:
                break
            time.sleep(3)
        assert sub.returncode == 0, sub.stdout[-2000:] + sub.stderr[-2000:]
        job_id = next(w.strip("'\"") for line in sub.stdout.splitlines() if "submitted successfully" in line
                      for w in line.split() if w.strip("'\"").startswith("raysubmit_"))
        status = ""
        deadline = time.time() + 600
        while time.time() < deadline:
            st = subprocess.run(["ray", "job", "status", "--address", address, job_id], env=env,
                                capture_output=True, text=True, timeout=60)
            status = re.sub(r"\x1b\[[0-9;]*m", "", st.stdout + st.stderr).upper()  # drop colours
            if any(s in status for s in ("SUCCEEDED", "FAILED", "STOPPED")):
                break
            time.sleep(3)
        logs = subprocess.run(["ray", "job", "logs", "--address", address, job_id], env=env,
                              capture_output=True, text=True, timeout=60).stdout
        assert "SUCCEEDED" in status, status[-1000:] + logs[-4000:]
        assert "sweep finished" in logs
    finally:
        _ray_stop(temp_dir, env)
        shutil.rmtree(temp_dir, ignore_errors=True)

    from raycpt.tracking import tracking_uri

    client = mlflow.tracking.MlflowClient(tracking_uri(cfg.tracking))
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags.get("raycpt.trial")]
    assert [r.data.tags["raycpt.trial"] for r in trials] == ["train_shallow-r0.5"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert any(k.endswith("/logit") for k in trials[0].data.metrics)
