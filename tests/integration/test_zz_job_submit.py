"""The cluster path on loopback: `ray start --head` on 127.0.0.1 (tests/integration/local_cluster.py: every
listener loopback), `ray job submit` a tiny sweep, wait for SUCCEEDED, check the MLflow store.

Named ``test_zz_*`` so it runs last, and the session's in-process Ray (the ``ray_local`` fixture) is shut
down first. The cluster is torn down on every exit path (its own processes only, by session id: never a plain
``ray stop``, which would end every Ray on the machine), by a reaper if this process is killed, and every wait is
bounded: the job agent gets 120 s to come up, the job 600 s, the whole test 900 s (pytest-timeout)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from local_cluster import LocalCluster, loopback
from raycpt.config import save_config
from raycpt.runs.location import locate
from test_sweep import tiny_sweep_config

AGENT_WAIT_S = 120


def _submit(c: LocalCluster, work: Path) -> str:
    """``ray job submit --no-wait``, retried while the head's job agent is not up yet (at most AGENT_WAIT_S)."""
    deadline = time.time() + AGENT_WAIT_S
    while True:
        sub = c.ray("job", "submit", "--address", c.dashboard, "--working-dir", str(work), "--no-wait", "--",
                    "python", "-m", "raycpt", "sweep", "sweep.yaml", "--splits", "0.5", "--strategies",
                    "train_shallow", timeout=60, check=False)
        if sub.returncode == 0 or "No available agent" not in sub.stdout + sub.stderr or time.time() > deadline:
            break
        time.sleep(3)
    assert sub.returncode == 0, sub.stdout[-2000:] + sub.stderr[-2000:]
    return re.search(r"raysubmit_\w+", sub.stdout).group(0)


@pytest.mark.timeout(900)
def test_ray_job_submit_tiny_sweep(tmp_path, tiny_dir):
    import mlflow

    cfg = tiny_sweep_config(tmp_path, tiny_dir, ["sweep.trace_first=false", "sweep.include_full=false",
                                                 "train.max_steps=2", "eval.modes=[logit]"])
    work = tmp_path / "job"
    work.mkdir()
    save_config(cfg, work / "sweep.yaml")

    import ray

    if ray.is_initialized():
        ray.shutdown()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    with LocalCluster(env, tmp_path, deadline_s=900) as c:
        c.start_head(num_cpus=4)
        job_id = _submit(c, work)
        status = ""
        deadline = time.time() + 600
        while time.time() < deadline:
            st = c.ray("job", "status", "--address", c.dashboard, job_id, timeout=60, check=False)
            status = re.sub(r"\x1b\[[0-9;]*m", "", st.stdout + st.stderr).upper()  # drop colours
            if any(s in status for s in ("SUCCEEDED", "FAILED", "STOPPED")):
                break
            time.sleep(3)
        logs = c.ray("job", "logs", "--address", c.dashboard, job_id, timeout=60, check=False).stdout
        sockets = c.listening()
    assert not c.leftovers, c.leftovers
    assert sockets and all(loopback(ip) for _, ip, _ in sockets), sockets
    assert "SUCCEEDED" in status, status[-1000:] + logs[-4000:]
    assert "sweep finished" in logs

    client = mlflow.tracking.MlflowClient(locate(cfg.tracking, check=False).uri)
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    runs = client.search_runs([exp.experiment_id])
    trials = [r for r in runs if r.data.tags.get("raycpt.trial")]
    assert [r.data.tags["raycpt.trial"] for r in trials] == ["train_shallow-r0.5"]
    assert all(r.info.status == "FINISHED" for r in runs)
    assert any(k.endswith("/logit") for k in trials[0].data.metrics)
