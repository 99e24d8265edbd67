"""ChildRun: one MLflow run per unit across interruptions, ended with the right status."""

import json
import time

import pytest

from raycpt.config import TrackingConfig


def _store(tmp_path):
    from mlflow.tracking import MlflowClient

    from raycpt.tracking import ensure_store

    cfg = TrackingConfig(run_root=str(tmp_path / "runs"), experiment="t")
    exp = ensure_store(cfg)
    client = MlflowClient(cfg.uri)
    parent = client.create_run(exp, run_name="parent").info.run_id
    return client, exp, parent


def test_interrupted_unit_continues_its_run_and_accumulates_time(tmp_path):
    from raycpt.tracking import ChildRun

    client, exp, parent = _store(tmp_path)
    meta = tmp_path / "trial.json"
    with pytest.raises(KeyboardInterrupt):
        with ChildRun(client, meta, exp, parent, "a", tags={"k": "v"}, meta={"spec": {"x": 1}}) as run:
            assert run.created
            first = run.run_id
            time.sleep(0.2)
            raise KeyboardInterrupt
    saved = json.loads(meta.read_text())
    assert saved["mlflow_run_id"] == first and saved["spec"] == {"x": 1} and saved["elapsed_before"] >= 0.2
    r = client.get_run(first)
    assert r.info.status == "KILLED" and r.data.tags["mlflow.parentRunId"] == parent and r.data.tags["k"] == "v"

    with ChildRun(client, meta, exp, parent, "a") as run:
        assert not run.created and run.run_id == first
        assert client.get_run(first).info.status == "RUNNING"
        assert run.elapsed >= saved["elapsed_before"]
    assert client.get_run(first).info.status == "FINISHED"
    runs = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert [x.info.run_id for x in runs] == [first]  # never a second run for the same unit


def test_failure_ends_the_run_failed_and_reraises(tmp_path):
    from raycpt.tracking import ChildRun

    client, exp, parent = _store(tmp_path)
    with pytest.raises(ValueError, match="boom"):
        with ChildRun(client, tmp_path / "b.json", exp, parent, "b") as run:
            raise ValueError("boom")
    assert client.get_run(run.run_id).info.status == "FAILED"
