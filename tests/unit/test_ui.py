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
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from raycpt.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _tag_in_db(db: Path, experiment: str) -> tuple[str, str]:
    with sqlite3.connect(db) as con:
        exp_id, = con.execute("SELECT experiment_id FROM experiments WHERE name = ?", (experiment,)).fetchone()
        rows = con.execute("SELECT value FROM experiment_tags WHERE experiment_id = ? AND key = ?",
                           (exp_id, "mlflow.experimentKind")).fetchall()
    return str(exp_id), [r[0] for r in rows]


def test_experiment_kind_tag_on_sqlite(tmp_path):
    from raycpt.runs.location import locate
    from raycpt.runs.store import ensure_store

    cfg = load_config(None, [f"tracking.run_root={tmp_path / 'runs'}", "tracking.experiment=kind-test"])
    exp_id = ensure_store(locate(cfg.tracking))
    assert _tag_in_db(tmp_path / "runs" / "mlflow.db", "kind-test") == (exp_id, ["custom_model_development"])
    ensure_store(locate(cfg.tracking))  # again: still exactly one tag
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


def _files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow  # starts the real mlflow ui: ~3 min on a contended 2-core machine
def test_raycpt_ui_serves_no_writable_artifact_store_and_still_shows_a_runs_files(tmp_path):
    """Issue 27: MLflow's default `ui` serves an unauthenticated artifact proxy writing under `<cwd>/mlartifacts`;
    `raycpt ui` refuses a local PUT (no such endpoint), writes nothing, and still serves a run's own files."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from raycpt.runs.location import locate
    from raycpt.runs.store import ensure_store

    runs, cwd = tmp_path / "runs", tmp_path / "cwd"
    cwd.mkdir()
    cfg = load_config(None, [f"tracking.run_root={runs}"])
    cfg.tracking.run_root = str(runs)
    exp_id = ensure_store(locate(cfg.tracking))
    client = MlflowClient(f"sqlite:///{runs / 'mlflow.db'}")
    run_id = client.create_run(exp_id).info.run_id
    (tmp_path / "notes.txt").write_text("logged by a run")
    client.log_artifact(run_id, str(tmp_path / "notes.txt"))
    mlflow.set_tracking_uri(None)
    before = _files_under(runs) | {f"cwd/{f}" for f in _files_under(cwd)}
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="300")
    p = subprocess.Popen([sys.executable, "-m", "raycpt", "ui", f"tracking.run_root={runs}", "--port", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=cwd, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, shown = time.time() + 240, None
        while time.time() < deadline and p.poll() is None:
            try:
                with urllib.request.urlopen(f"{base}/get-artifact?path=notes.txt&run_uuid={run_id}", timeout=5) as r:
                    shown = r.read().decode()
                break
            except OSError:
                time.sleep(1)
        assert shown == "logged by a run"  # the UI reads a run's files from the run's own artifact location
        codes = []
        for prefix in ("api", "ajax-api"):
            req = urllib.request.Request(f"{base}/{prefix}/2.0/mlflow-artifacts/artifacts/planted.txt", data=b"x",
                                         method="PUT")
            try:
                with urllib.request.urlopen(req, timeout=10) as r:
                    codes.append(r.status)
            except urllib.error.HTTPError as e:
                codes.append(e.code)
        assert all(c >= 400 for c in codes), codes  # MLflow's default answers 200 and writes the file
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=30)
    after = _files_under(runs) | {f"cwd/{f}" for f in _files_under(cwd)}
    assert not any("planted" in f for f in after) and not (cwd / "mlartifacts").exists()
    assert {f for f in after - before if not f.endswith(("-wal", "-shm", "-journal"))} == set()
