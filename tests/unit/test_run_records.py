"""The run folder as the record (:data:`raycpt.runs.records.RECORDS`) and its one projection into MLflow
(:func:`raycpt.runs.records.project`), against a real SQLite store, no Ray: each kind of record lands as written by
hand here; a replay with the run's :class:`raycpt.runs.records.Seen` adds nothing twice; ``raycpt runs sync`` of a
hand-made folder tree (a command, a unit nested under it, a unit that never began) makes the runs and ends them
with their folders' statuses, keeps the folder's own run id for another store, and two syncs at once make each run
once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _client(tmp_path, name="s"):
    from mlflow.tracking import MlflowClient

    from raycpt.config import TrackingConfig
    from raycpt.runs.location import locate
    from raycpt.runs.store import ensure_store

    where = locate(TrackingConfig(run_root=str(tmp_path / name), experiment="raycpt"))
    exp = ensure_store(where)
    return MlflowClient(where.uri), exp


def _content(client, run_id):
    run = client.get_run(run_id)
    series = {k: sorted((m.step, m.value) for m in client.get_metric_history(run_id, k)) for k in run.data.metrics}

    def files(folder=None):
        return [f for a in client.list_artifacts(run_id, folder) for f in (files(a.path) if a.is_dir else [a.path])]

    return dict(run.data.params), series, sorted(files()), {k: v for k, v in run.data.tags.items()
                                                            if not k.startswith("mlflow.")}


RECORDS = [
    {"params": {"lr": "3e-05", "plan": "full"}},
    {"metrics": {"loss": 2.5, "tokens_per_s": 10.0}, "step": 1},
    {"metrics": {"loss": 2.25}, "step": 2},
    {"points": [["contribution", 0, 0.5], ["contribution", 1, -0.25]]},
    {"tags": {"raycpt.plan": "layers 0-2"}},
    {"artifact": "curve.png", "dir": "summary"},
    {"artifact": "missing.png", "dir": None},
    {"table": {"a": [1, 2], "b": ["x", "y"]}, "file": "summary/deltas.json"},
    {"text": "ok", "file": "freeze_check/after_step_1.txt"},
    {"params": {"lr": "1e-3"}},  # a resumed run's changed value: the first one stays
]


def test_each_record_lands_as_written_and_a_replay_adds_nothing(tmp_path):
    from raycpt.runs.records import Seen, project

    client, exp = _client(tmp_path)
    run_id = client.create_run(exp, run_name="r").info.run_id
    (tmp_path / "curve.png").write_bytes(b"\x89PNG fake")
    sent = [project(client, run_id, rec, tmp_path) for rec in RECORDS]  # live: without looking first
    assert sent == [2, 2, 1, 2, 1, 1, 0, 1, 1, 0]
    params, series, files, tags = _content(client, run_id)
    assert params == {"lr": "3e-05", "plan": "full"}
    assert series == {"loss": [(1, 2.5), (2, 2.25)], "tokens_per_s": [(1, 10.0)],
                      "contribution": [(0, 0.5), (1, -0.25)]}
    assert files == ["freeze_check/after_step_1.txt", "summary/curve.png", "summary/deltas.json"]
    assert tags == {"raycpt.plan": "layers 0-2"}
    seen = Seen(client, run_id)
    assert [project(client, run_id, rec, tmp_path, seen) for rec in RECORDS] == [0] * len(RECORDS)
    assert _content(client, run_id) == (params, series, files, tags)
    table = json.loads(Path(client.download_artifacts(run_id, "summary/deltas.json", str(tmp_path / "d"))).read_text())
    assert table["columns"] == ["a", "b"] and table["data"] == [[1, "x"], [2, "y"]]


def _folder(tmp_path) -> Path:
    """A sweep-shaped folder written through :class:`raycpt.runs.run.Run` with no store (the server was gone from the
    start): the command, one trial that finished, one that never began."""
    from raycpt.config import load_config, save_config
    from raycpt.runs.folder import write_state
    from raycpt.runs.run import Run

    cfg = load_config(None, [f"tracking.run_root={tmp_path / 'runs'}"])
    run_dir = tmp_path / "runs" / "sweep-x-1"
    run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    write_state(run_dir, command="sweep", status="finished", run_name="sweep-x", tags={"raycpt.command": "sweep"})
    top = Run(cfg, "sweep", run_dir, None, None, False, None)
    top.log_params({"trials": "full,late"})
    top.note_children([(run_dir / "trials" / "full", "trial.json"), (run_dir / "trials" / "late", "trial.json")])
    (run_dir / "trials" / "late").mkdir(parents=True)  # its folder, with nothing in it (a folder gone is reported)
    unit = Run(cfg, "sweep", run_dir / "trials" / "full", None, None, False, None,
               meta_path=run_dir / "trials" / "full" / "trial.json",
               meta={"run_name": "full", "tags": {"raycpt.trial": "full"}})
    unit.log_metrics({"loss": 3.0}, step=1)
    unit.log_metrics({"heldout_loss": 2.75})
    with unit:
        pass  # ends: the meta says finished
    top.log_metrics({"sweep_wall_time_s": 12.0})
    return run_dir


def _sync(run_dir, uri=None):
    from raycpt.jobs.sync import sync_run

    return sync_run(None, [str(run_dir)], uri)


def test_sync_makes_the_tree_of_runs_once_with_their_statuses(tmp_path):
    from raycpt.runs.folder import read_state

    run_dir = _folder(tmp_path)
    line = _sync(run_dir)
    assert "a new run" in line and "1 nested run(s) (1 new run(s))" in line and "status FINISHED" in line, line
    client, exp = _client(tmp_path, "runs")
    runs = {r.info.run_name: r for r in client.search_runs([exp])}
    assert sorted(runs) == ["full", "sweep-x"]  # the trial that never began has no run
    top, full = runs["sweep-x"], runs["full"]
    assert full.data.tags["mlflow.parentRunId"] == top.info.run_id and full.data.tags["raycpt.trial"] == "full"
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert _content(client, full.info.run_id)[1] == {"loss": [(1, 3.0)], "heldout_loss": [(0, 2.75)]}
    assert _content(client, top.info.run_id)[:2] == ({"trials": "full,late"}, {"sweep_wall_time_s": [(0, 12.0)]})
    # the own store: the folder's state and the trial's meta now name the runs
    assert read_state(run_dir)["mlflow_run_id"] == top.info.run_id
    assert json.loads((run_dir / "trials" / "full" / "trial.json").read_text())["mlflow_run_id"] == full.info.run_id
    again = _sync(run_dir)
    assert ": 0 item(s) added, 1 nested run(s) (0 new run(s))" in again, again
    assert len(client.search_runs([exp])) == 2


def test_another_store_keeps_the_folders_own_run_id(tmp_path):
    from raycpt.runs.folder import read_state

    run_dir = _folder(tmp_path)
    _sync(run_dir)
    own = read_state(run_dir)["mlflow_run_id"]
    other = f"sqlite:///{tmp_path / 'other.db'}"
    _sync(run_dir, other)
    assert read_state(run_dir)["mlflow_run_id"] == own  # not rewritten for the other store
    synced = json.loads((run_dir / "synced.json").read_text())
    assert list(synced) == [other] and synced[other] != own
    assert ": 0 item(s) added" in _sync(run_dir, other)


def test_two_syncs_at_once_make_each_run_once(tmp_path):
    run_dir = _folder(tmp_path)
    code = "import sys; from raycpt.jobs.sync import sync_run; print(sync_run(None, [sys.argv[1]]))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=ROOT) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outs]
    client, exp = _client(tmp_path, "runs")
    runs = client.search_runs([exp])
    assert sorted(r.info.run_name for r in runs) == ["full", "sweep-x"]
    full = next(r for r in runs if r.info.run_name == "full")
    assert _content(client, full.info.run_id)[1] == {"loss": [(1, 3.0)], "heldout_loss": [(0, 2.75)]}
    assert sorted("0 item(s) added" in o[0] for o in outs) == [False, True]  # the second found it all there


def test_a_point_recorded_twice_is_in_the_store_twice_after_a_replay_and_once_more_adds_none(tmp_path):
    """Live logging keeps a point the job logged twice (a build's final loss from its training and its own end
    records): the store then holds it twice, and a replay, counting what the store has, makes the same history."""
    from raycpt.runs.records import Seen, project

    client, exp = _client(tmp_path)
    live, replay = (client.create_run(exp).info.run_id for _ in range(2))
    recs = [{"metrics": {"final_loss": 2.5}, "step": 0}, {"metrics": {"final_loss": 2.5, "x": 1.0}, "step": 0}]
    for rec in recs:
        project(client, live, rec, tmp_path)
    sent = []
    for _ in range(2):
        seen = Seen(client, replay)
        sent.append(sum(project(client, replay, rec, tmp_path, seen) for rec in recs))
    assert sent == [3, 0]

    def history(run_id, key):
        return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))

    assert history(live, "final_loss") == history(replay, "final_loss") == [(0, 2.5), (0, 2.5)]
    assert history(replay, "x") == [(0, 1.0)]


def test_a_sync_of_a_folder_that_lost_a_trial_and_a_file_names_both_and_is_not_a_success(tmp_path):
    """Issue 41: a finished sweep's folder with one trial folder and a summary file deleted synced as "FINISHED",
    naming neither. Now it syncs what is there and ends with one line naming what is gone (exit 2)."""
    import shutil

    from raycpt.config import load_config
    from raycpt.errors import RaycptError
    from raycpt.runs.run import Run

    run_dir = _folder(tmp_path)
    summary = run_dir / "summary" / "summary.json"
    summary.parent.mkdir()
    summary.write_text("{}")
    Run(load_config(None, [f"tracking.run_root={tmp_path / 'runs'}"]), "sweep", run_dir, None, None, False,
        None).log_artifact(summary, "summary")
    shutil.rmtree(run_dir / "trials" / "full")
    summary.unlink()
    with pytest.raises(RaycptError) as e:
        _sync(run_dir)
    line = str(e.value)
    assert line.startswith("runs sync: the folder lacks 2 thing(s) its records name, so the store lacks them too: ")
    assert f"{run_dir / 'summary' / 'summary.json'}" in line and f"{run_dir / 'trials' / 'full'}/ (a nested run" in line
    client, exp = _client(tmp_path, "runs")
    assert sorted(r.info.run_name for r in client.search_runs([exp])) == ["sweep-x"]  # what is there was synced
