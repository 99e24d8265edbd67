"""A two-node Ray cluster on this machine (own process, ``ray.cluster_utils.Cluster``): the shared-storage
check runs on both nodes, and the sweep's trials land on the second node because their bundle asks for
its custom resource (``sweep.trial_resources``); both nodes always stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from test_sweep import tiny_sweep_config


def test_two_node_storage_check_and_trials_on_the_second_node(tmp_path, tiny_dir):
    import mlflow

    from raycpt.config import save_config

    cfg = tiny_sweep_config(tmp_path, tiny_dir, [
        "sweep.trace_first=false", "sweep.include_full=false", "train.max_steps=2", "eval.modes=[logit]", "sweep.max_concurrent_trials=2",
        "sweep.trial_resources={trial_node: 1}"])
    cfg_path = tmp_path / "sweep.yaml"
    save_config(cfg, cfg_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("two_node_sweep.py")), str(cfg_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:  # only this test's process group: its driver and the nodes it started
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err[-3000:]
    # the warning for concurrent trials on SQLite over several nodes, printed once
    assert err.count("concurrent trials on 2 nodes write one SQLite store") == 1
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT-JSON "))
    r = json.loads(line.split(" ", 1)[1])
    assert len(r["alive"]) == 2 and r["checked"] == r["alive"]
    assert r["trials"] == ["train_shallow-r0.5"]

    client = mlflow.tracking.MlflowClient(r["uri"])
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    children = [x for x in client.search_runs([exp.experiment_id])
                if x.data.tags.get("mlflow.parentRunId") == r["parent_run_id"]]
    assert len(children) == 1
    assert {c.data.tags["raycpt.node_id"] for c in children} == {r["second"]} != {r["head"]}
    assert all(c.info.status == "FINISHED" for c in children)
    # no token file left behind
    assert not list(Path(cfg.tracking.run_root).glob(".raycpt-storage-check-*"))
