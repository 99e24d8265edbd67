"""The MLflow UI opens on the runs: the experiment carries MLflow's model-training kind tag (read back
from the SQLite file itself), and `raycpt ui` prints the URL of the experiment's runs table, served by
the real `mlflow ui` it starts."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from raycpt.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _tag_in_db(db: Path, experiment: str) -> tuple[str, str]:
    with sqlite3.connect(db) as con:
        exp_id, = con.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
        rows = con.execute("SELECT value FROM experiment_tags WHERE experiment_id = ? AND key = ?",
                           (exp_id, "mlflow.experimentKind")).fetchall()
    return str(exp_id), [r[0] for r in rows]


def test_experiment_kind_tag_on_sqlite(tmp_path):
    from raycpt.tracking import ensure_store

    cfg = load_config(None, [f"tracking.run_root={tmp_path / 'runs'}", "tracking.experiment=kind-test"])
    exp_id = ensure_store(cfg.tracking)
    assert _tag_in_db(tmp_path / "runs" / "mlflow.db", "kind-test") == (exp_id, ["custom_model_development"])
    ensure_store(cfg.tracking)  # again: still exactly one tag
    assert _tag_in_db(tmp_path / "runs" / "mlflow.db", "kind-test")[1] == ["custom_model_development"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_raycpt_ui_prints_the_runs_url(tmp_path):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="300")
    p = subprocess.Popen([sys.executable, "-m", "raycpt", "ui", f"tracking.run_root={tmp_path / 'runs'}", "--port",
                          str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                         start_new_session=True)
    try:
        line = p.stdout.readline()
        exp_id, tags = _tag_in_db(tmp_path / "runs" / "mlflow.db", "raycpt")
        assert tags == ["custom_model_development"]
        assert f"http://127.0.0.1:{port}/#/experiments/{exp_id}/runs" in line.split(), line
        # the server behind the URL answers, and tells the UI the experiment's kind
        api = f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/experiments/get?experiment_id={exp_id}"
        deadline, body = time.time() + 240, None
        while time.time() < deadline and p.poll() is None:
            try:
                with urllib.request.urlopen(api, timeout=5) as r:
                    body = json.loads(r.read())
                break
            except OSError:
                time.sleep(1)
        assert body is not None, "mlflow ui did not answer"
        tags = {t["key"]: t["value"] for t in body["experiment"].get("tags", [])}
        assert tags["mlflow.experimentKind"] == "custom_model_development"
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
