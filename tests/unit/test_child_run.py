"""A unit's run (:func:`raycpt.runs.run.open_child`): one MLflow run per unit across interruptions, ended with the
right status by its owner (the ``with`` block) alone."""

import json
import time

import pytest

from raycpt.config import TrackingConfig


def _store(tmp_path):
    import dataclasses

    from mlflow.tracking import MlflowClient

    from raycpt.config import ExperimentConfig
    from raycpt.runs.location import locate
    from raycpt.runs.store import ensure_store

    tcfg = TrackingConfig(run_root=str(tmp_path / "runs"), experiment="t")
    where = locate(tcfg)
    exp = ensure_store(where)
    tcfg.uri = where.uri
    client = MlflowClient(tcfg.uri)
    parent = client.create_run(exp, run_name="parent").info.run_id
    return client, exp, parent, dataclasses.replace(ExperimentConfig(), tracking=tcfg), where


def ChildRun(client, meta, exp, parent, name, tags=None, meta_data=None, cfg=None, where=None):
    from raycpt.runs.run import open_child

    return open_child(cfg, "sweep", meta.parent, meta.name, exp, parent, name, tags=tags, meta=meta_data,
                      location=where)


def test_interrupted_unit_continues_its_run_and_accumulates_time(tmp_path):
    client, exp, parent, cfg, where = _store(tmp_path)
    meta = tmp_path / "trial.json"
    with pytest.raises(KeyboardInterrupt):
        with ChildRun(client, meta, exp, parent, "a", tags={"k": "v"}, meta_data={"spec": {"x": 1}}, cfg=cfg,
                      where=where) as run:
            assert run.created
            first = run.run_id
            time.sleep(0.2)
            raise KeyboardInterrupt
    saved = json.loads(meta.read_text())
    assert saved["mlflow_run_id"] == first and saved["spec"] == {"x": 1} and saved["elapsed_before"] >= 0.2
    r = client.get_run(first)
    assert r.info.status == "KILLED" and r.data.tags["mlflow.parentRunId"] == parent and r.data.tags["k"] == "v"

    with ChildRun(client, meta, exp, parent, "a", cfg=cfg, where=where) as run:
        assert not run.created and run.run_id == first
        assert client.get_run(first).info.status == "RUNNING"
        assert run.elapsed >= saved["elapsed_before"]
    assert client.get_run(first).info.status == "FINISHED"
    runs = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent}'")
    assert [x.info.run_id for x in runs] == [first]  # never a second run for the same unit


def test_failure_ends_the_run_failed_and_reraises(tmp_path):
    client, exp, parent, cfg, where = _store(tmp_path)
    with pytest.raises(ValueError, match="boom"):
        with ChildRun(client, tmp_path / "b.json", exp, parent, "b", cfg=cfg, where=where) as run:
            raise ValueError("boom")
    assert client.get_run(run.run_id).info.status == "FAILED"
