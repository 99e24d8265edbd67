"""Issue 27 for sweeps, no Ray and no server: a trial's child run (:func:`raycpt.runs.run.open_child`) made or ended
while the tracking server is gone, and the store probe of a trial process."""

import json

import pytest



class _Client:
    """Records the calls of a unit's run (:func:`raycpt.runs.run.open_child`); ``gone``: every call finds the server
    gone."""

    def __init__(self, gone=False):
        self.gone, self.calls, self.uris = gone, [], []

    def opened(self, uri):
        """``MlflowClient(uri)``: this client, the URI it was opened on kept."""
        self.uris.append(uri)
        return self

    def _call(self, name, *a, **k):
        self.calls.append(name)
        if self.gone:
            raise ConnectionRefusedError(111, "Connection refused")

    def create_run(self, *a, **k):
        self._call("create_run")
        from types import SimpleNamespace

        return SimpleNamespace(info=SimpleNamespace(run_id="R1"))

    def update_run(self, *a, **k):
        self._call("update_run")

    def set_terminated(self, *a, **k):
        self._call("set_terminated")


def _child(monkeypatch, client, meta, exp, parent, name, meta_data=None):
    import mlflow.tracking

    from raycpt.config import ExperimentConfig
    from raycpt.runs.run import open_child

    from raycpt.runs.location import RunLocation

    where = RunLocation(meta.parent / "runs", "http://127.0.0.1:9/")  # the command's, carried to the unit
    monkeypatch.setattr(mlflow.tracking, "MlflowClient", lambda uri, *a, **k: client.opened(uri))
    return open_child(ExperimentConfig(), "sweep", meta.parent, meta.name, exp, parent, name, meta=meta_data,
                      location=where)


def test_a_child_run_with_the_server_gone_runs_locally_and_keeps_its_id(fresh_lost, tmp_path, monkeypatch):
    tr = fresh_lost
    meta = tmp_path / "trial.json"
    client = _Client(gone=True)  # the server went away before this trial: no run is made, nothing raises
    with _child(monkeypatch, client, meta, "0", "P", "t", meta_data={"spec": {"name": "t"}}) as run:
        assert run.run_id is None and not run.created
    assert client.calls == ["create_run"] and tr.tracking_lost() is not None
    saved = json.loads(meta.read_text())  # what the sync makes the run from
    assert "mlflow_run_id" not in saved and saved["spec"] == {"name": "t"} and saved["run_name"] == "t"
    assert saved["tags"]["mlflow.parentRunId"] == "P" and saved["status"] == "finished"
    # a trial whose run exists (made before the server went): its id is kept, its end is left to the sync
    meta.write_text(json.dumps({"mlflow_run_id": "R0"}))
    client = _Client(gone=True)
    with _child(monkeypatch, client, meta, None, "P", "t") as run:
        assert run.run_id == "R0"
    assert client.calls == [] and json.loads(meta.read_text())["mlflow_run_id"] == "R0"


def test_a_child_run_ends_in_the_store_while_it_answers(fresh_lost, tmp_path, monkeypatch):
    client = _Client()
    with _child(monkeypatch, client, tmp_path / "trial.json", "0", "P", "t") as run:
        assert run.created and run.run_id == "R1"
    assert client.calls == ["create_run", "set_terminated"]
    assert client.uris == ["http://127.0.0.1:9/"]  # the carried location's store, not the config's (None) uri
    with pytest.raises(ValueError):
        with _child(monkeypatch, client, tmp_path / "trial.json", "0", "P", "t"):
            raise ValueError("a trial's bug")
    assert client.calls[2:] == ["update_run", "set_terminated"]


def test_store_or_lost_adopts_a_record_of_the_same_job_or_a_dead_server(fresh_lost, tmp_path, monkeypatch):
    import socket

    tr = fresh_lost
    from raycpt.config import TrackingConfig
    from raycpt.runs.location import locate

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = TrackingConfig(uri=f"http://127.0.0.1:{port}", run_root=str(tmp_path / "root"))
    where = locate(cfg, check=False)  # the trial's: the driver's, carried (its check is the trial's own)
    assert tr.store_or_lost(where, tmp_path) is None
    rec = json.loads((tmp_path / tr.LOST_FILE).read_text())
    assert rec["uri"] == cfg.uri and "no MLflow server answers" in rec["error"]
    monkeypatch.setattr(tr, "_lost", {})  # another trial process of the same sweep: the record is enough
    monkeypatch.setattr(tr, "ensure_store", lambda c: pytest.fail("the store must not be asked again"))
    assert tr.store_or_lost(where, tmp_path) is None and tr.tracking_lost()["uri"] == cfg.uri
