"""SIGTERM ends a command KILLED also once Ray is up in the driver: Ray's core worker installs its own SIGTERM
handler when the driver connects (it logs and aborts, which would leave the MLflow run RUNNING), and raycpt puts
the command's handler back (``raycpt.runtime.init_ray``). A real process, a real local Ray, a real SQLite store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = """
import sys, time
from raycpt.config import RayConfig, load_config
from raycpt.runs.run import command_run
from raycpt.runtime import ray_session
cfg = load_config(None, ["tracking.run_root=" + sys.argv[1]])
try:
    with command_run(cfg, "train") as run, ray_session(RayConfig(num_cpus=1, object_store_memory=100_000_000)):
        print("ready", flush=True)
        time.sleep(120)
except KeyboardInterrupt:
    sys.exit(130)
"""


def test_sigterm_with_ray_up_ends_the_run_killed(tmp_path):
    from mlflow.tracking import MlflowClient

    env = dict(os.environ, PYTHONPATH=str(REPO), RAY_USAGE_STATS_ENABLED="0", RAY_ADDRESS="")
    p = subprocess.Popen([sys.executable, "-c", CODE, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "ready"
        os.kill(p.pid, signal.SIGTERM)
        assert p.wait(timeout=120) == 130
    finally:
        p.kill()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("raycpt").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]
    (run_dir,) = tmp_path.glob("train-*")
    assert json.loads((run_dir / "state.json").read_text())["status"] == "interrupted"
