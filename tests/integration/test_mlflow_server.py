"""A real ``mlflow server`` on 127.0.0.1 (free port, SQLite backend and artifact root in a temp folder) as
the store of a tiny sweep with two concurrent trials; everything is checked through the server's REST API."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from test_sweep import tiny_sweep_config


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` in its own process group; always stopped (the test asserts it is gone)."""
    port = _free_port()
    root = tmp_path / "mlflow-server"
    root.mkdir()
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts")],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=root)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 180
        while True:
            try:
                with urllib.request.urlopen(uri + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("mlflow server did not start: " + (root / "server.log").read_text()[-2000:])
            time.sleep(1)
        yield {"uri": uri, "root": root, "proc": proc}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:  # uvicorn waits for open keep-alive connections; the store is a temp folder
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        assert proc.poll() is not None  # the server is gone


def _api(uri: str, endpoint: str, body: dict | None = None, **query) -> dict:
    url = f"{uri}/api/2.0/mlflow/{endpoint}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_sweep_against_a_real_tracking_server(tmp_path, tiny_dir, ray_local, mlflow_server):
    import ray

    from raycpt.jobs.sweep import run_sweep

    uri = mlflow_server["uri"]
    cfg = tiny_sweep_config(tmp_path, tiny_dir, [
        f"tracking.uri={uri}", "train.max_steps=2", "sweep.trace_first=false", "sweep.max_concurrent_trials=2"])
    res = run_sweep(cfg, splits=[0.5], strategies=["train_shallow"])
    names = {"full", "train_shallow-r0.5"}
    assert {t["name"] for t in res.trials} == names

    exp = _api(uri, "experiments/get-by-name", experiment_name=cfg.tracking.experiment)["experiment"]
    runs = _api(uri, "runs/search", {"experiment_ids": [exp["experiment_id"]], "max_results": 1000})["runs"]
    tags = {r["info"]["run_id"]: {t["key"]: t["value"] for t in r["data"].get("tags", [])} for r in runs}
    parents = [r for r in runs if "mlflow.parentRunId" not in tags[r["info"]["run_id"]]]
    assert [p["info"]["run_id"] for p in parents] == [res.parent_run_id]
    children = {tags[r["info"]["run_id"]]["raycpt.trial"]: r for r in runs
                if tags[r["info"]["run_id"]].get("mlflow.parentRunId") == res.parent_run_id}
    assert set(children) == names and len(runs) == 1 + len(names)
    assert all(r["info"]["status"] == "FINISHED" for r in runs)  # nothing RUNNING

    # the two trials really overlapped in time (two concurrent trials)
    spans = [(int(r["info"]["start_time"]), int(r["info"]["end_time"])) for r in children.values()]
    assert max(s for s, _ in spans) < min(e for _, e in spans)

    # every eval metric of each trial, as the trial computed it (its result.json in the run folder)
    for t in res.trials:
        logged = {m["key"]: m["value"] for m in children[t["name"]]["data"]["metrics"]}
        assert t["scores"] and all(logged[k] == pytest.approx(v) for k, v in t["scores"].items())
        # system metrics of each logged step window, with the training step
        hist = _api(uri, "metrics/get-history", run_id=children[t["name"]]["info"]["run_id"],
                    metric_key="system/cpu_utilization_percentage")["metrics"]
        assert sorted(m["step"] for m in hist) == [1, 2] and all(0 <= m["value"] <= 100 for m in hist)
        assert logged["system/system_memory_usage_megabytes"] > 0 and logged["system/process_rss_megabytes"] > 0

    # parent: wall time and version tags
    ptags = tags[res.parent_run_id]
    assert ptags["raycpt.ray_version"] == ray.__version__ and "raycpt.torch_version" in ptags
    pmetrics = {m["key"]: m["value"] for m in parents[0]["data"].get("metrics", [])}
    assert pmetrics["sweep_wall_time_s"] > 0

    # summary artifacts live in the server's artifact store, byte for byte what the run folder holds
    assert parents[0]["info"]["artifact_uri"].startswith("mlflow-artifacts:")
    listed = {f["path"] for f in _api(uri, "artifacts/list", run_id=res.parent_run_id, path="summary")["files"]}
    assert {"summary/summary.md", "summary/summary.json"} <= listed
    on_server = list((mlflow_server["root"] / "artifacts").rglob("summary/summary.json"))
    assert len(on_server) == 1
    assert on_server[0].read_bytes() == (res.run_dir / "summary" / "summary.json").read_bytes()
    assert not (Path(cfg.tracking.run_root) / "mlflow.db").exists()  # no SQLite fallback
