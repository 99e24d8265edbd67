"""Issue 27 for sweeps, no Ray and no server: which runs ``raycpt runs sync SWEEP_DIR`` replays (and under which
ids and statuses), and a trial's child run made or ended while the tracking server is gone."""

import json

import pytest



def test_the_sync_plan_is_every_trial_that_trained_then_the_parent():
    from raycpt.jobs.sync import sweep_sync_plan

    state = {"command": "sweep", "mlflow_run_id": "P", "status": "finished"}
    trials = {
        "train_shallow-r0.5": {"meta": {"mlflow_run_id": "C2"}, "train_state": {"mlflow_run_id": "C2",
                                                                                 "status": "finished"},
                               "finished": True},
        "full": {"meta": {"mlflow_run_id": "C1"}, "train_state": {"mlflow_run_id": "C1", "status": "finished"},
                 "finished": True},
        "later": {"meta": {}, "train_state": {"mlflow_run_id": None, "status": "finished"}, "finished": True},
        "trained_not_evaluated": {"meta": {"mlflow_run_id": "C4"}, "train_state": {"status": "failed"},
                                  "finished": False},
        "never_started": {"meta": {"mlflow_run_id": "C5"}, "train_state": None, "finished": False},
    }
    plan = sweep_sync_plan(state, trials)
    by = {(i["kind"], i["name"]): (i["folder"], i["run_id"], i["parent_run_id"], i["status"]) for i in plan}
    assert by == {
        ("trial", "full"): ("trials/full/train", "C1", "P", "FINISHED"),
        ("trial", "later"): ("trials/later/train", None, "P", "FINISHED"),  # made while the server was gone
        ("trial", "train_shallow-r0.5"): ("trials/train_shallow-r0.5/train", "C2", "P", "FINISHED"),
        ("trial", "trained_not_evaluated"): ("trials/trained_not_evaluated/train", "C4", "P", "FAILED"),
        ("parent", ""): (".", "P", None, "FINISHED"),
    }
    assert plan[-1]["kind"] == "parent" and [i["name"] for i in plan[:-1]] == sorted(n for n in trials
                                                                                      if n != "never_started")
    # the trial's own trial.json wins over its training folder's state (a resumed trial keeps its first run)
    one = sweep_sync_plan(state, {"t": {"meta": {"mlflow_run_id": "A"}, "train_state": {"mlflow_run_id": "B"},
                                        "finished": False}})
    assert one[0]["run_id"] == "A" and one[0]["status"] is None
    interrupted = sweep_sync_plan({"mlflow_run_id": "P", "status": "interrupted"}, {})
    assert interrupted == [{"kind": "parent", "name": "", "folder": ".", "run_id": "P", "parent_run_id": None,
                            "status": "KILLED"}]


class _Client:
    """Records the calls of :class:`raycpt.tracking.ChildRun`; ``gone``: every call finds the server gone."""

    def __init__(self, gone=False):
        self.gone, self.calls = gone, []

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


def test_a_child_run_with_the_server_gone_runs_locally_and_keeps_its_id(fresh_lost, tmp_path):
    tr = fresh_lost
    meta = tmp_path / "trial.json"
    client = _Client(gone=True)  # the server went away before this trial: no run is made, nothing raises
    with tr.ChildRun(client, meta, "0", "P", "t", meta={"spec": {"name": "t"}}) as run:
        assert run.run_id is None and not run.created
    assert client.calls == ["create_run"] and tr.tracking_lost() is not None
    assert json.loads(meta.read_text()) == {"spec": {"name": "t"}}
    # a trial whose run exists (made before the server went): its id is kept, its end is left to the sync
    meta.write_text(json.dumps({"mlflow_run_id": "R0"}))
    client = _Client(gone=True)
    with tr.ChildRun(client, meta, None, "P", "t") as run:
        assert run.run_id == "R0"
    assert client.calls == [] and json.loads(meta.read_text())["mlflow_run_id"] == "R0"


def test_a_child_run_ends_in_the_store_while_it_answers(fresh_lost, tmp_path):
    tr = fresh_lost
    client = _Client()
    with tr.ChildRun(client, tmp_path / "trial.json", "0", "P", "t") as run:
        assert run.created and run.run_id == "R1"
    assert client.calls == ["create_run", "set_terminated"]
    with pytest.raises(ValueError):
        with tr.ChildRun(client, tmp_path / "trial.json", "0", "P", "t"):
            raise ValueError("a trial's bug")
    assert client.calls[2:] == ["update_run", "set_terminated"]


def test_store_or_lost_adopts_a_record_of_the_same_job_or_a_dead_server(fresh_lost, tmp_path, monkeypatch):
    import socket

    tr = fresh_lost
    from raycpt.config import TrackingConfig

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = TrackingConfig(uri=f"http://127.0.0.1:{port}", run_root=str(tmp_path / "root"))
    assert tr.store_or_lost(cfg, tmp_path) is None
    rec = json.loads((tmp_path / tr.LOST_FILE).read_text())
    assert rec["uri"] == cfg.uri and "no MLflow server answers" in rec["error"]
    monkeypatch.setattr(tr, "_lost", {})  # another trial process of the same sweep: the record is enough
    monkeypatch.setattr(tr, "ensure_store", lambda c: pytest.fail("the store must not be asked again"))
    assert tr.store_or_lost(cfg, tmp_path) is None and tr.tracking_lost()["uri"] == cfg.uri
