"""Issue 27 for ``raycpt contribution`` and ``raycpt hybrid run``, no Ray and no server: the records their runs get
(pure functions of the run folder's files, the ones ``raycpt runs sync`` replays), what ``runs sync`` replays of a
grid folder, every MLflow write of the two jobs skipped once the server is gone, a nested command (a build's trace)
run locally, and the sync of hand-made contribution and hybrid folders into a SQLite store, twice."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

NAN = float("nan")



# ------------------------------------------------------------------------------------- the pure records
def test_a_scan_trial_records_its_cells_score_losses_and_per_layer_change():
    from raycpt.jobs.contribution import scan_params, scan_trial_records

    result = {"cells": {"wordnet_mc/acc/logit": 50.0}, "score": 50.0, "wall_s": 12.5, "gold_prob": None,
              "heldout_loss": 3.25, "l2": [0.0, 1.5, 0.0]}
    metrics, series = scan_trial_records(result)
    assert math.isnan(metrics.pop("gold_prob"))  # absent: NaN, which log_metrics leaves out
    assert metrics == {"wordnet_mc/acc/logit": 50.0, "score": 50.0, "wall_time_s": 12.5, "heldout_loss": 3.25}
    assert series == [("l2_change", 0, 0.0), ("l2_change", 1, 1.5), ("l2_change", 2, 0.0)]
    base = scan_trial_records({**result, "heldout_loss": None, "l2": None, "gold_prob": 0.25})
    assert math.isnan(base[0]["heldout_loss"]) and base[0]["gold_prob"] == 0.25 and base[1] == []
    assert scan_params({"name": "base", "kind": "base", "layer": None}) == {"kind": "base", "layer": ""}
    assert scan_params({"name": "single-L03", "kind": "single", "layer": 3}) == {"kind": "single", "layer": 3}


def test_the_scan_summary_records_read_the_analysis_or_its_json():
    from raycpt.jobs.contribution import scan_summary_records

    a = {"num_above": 1, "band_mean": 0.5, "outside_mean": 0.25, "base_score": 40.0, "full_score": 60.0,
         "vote": {"k": 2, "vote_acc": 55.0, "models": [1, 2]}, "jaccard": {"mean": 0.3, "pairs": []},
         "spearman": {"rho": 0.5, "p_value": 0.2, "layers": 2},
         "sampled_vote": {"k": 2, "paired": {"delta": 1.5, "exact": True}},
         "elite_lr_control": {"top-minus": 2.0, "note": "x"}, "contribution": {"2": 0.5, "0": -0.25}}
    metrics, series = scan_summary_records(a, 10.0)
    assert metrics == {"num_above": 1, "band_mean": 0.5, "outside_mean": 0.25, "base_score": 40.0,
                       "full_score": 60.0, "wall_time_s": 10.0, "vote.k": 2, "vote.vote_acc": 55.0,
                       "jaccard.mean": 0.3, "spearman.rho": 0.5, "spearman.p": 0.2, "sampled_vote.k": 2.0,
                       "sampled_vote.paired.delta": 1.5, "elite_lr_control.top_minus": 2.0}
    assert series == [("contribution", 2, 0.5), ("contribution", 0, -0.25)]
    # the live analysis keys its layers by int, summary.json by string: the same series
    assert scan_summary_records({**a, "contribution": {2: 0.5, 0: -0.25}}, 10.0)[1] == series


def test_a_build_records_its_params_cells_and_files():
    from raycpt.jobs.hybrid import build_params, build_records

    built = {"build": "new_shallow",
             "rows": [{"kind": "mamba2", "layers": "0-1", "trainable": True, "source": "new"},
                      {"kind": "llama", "layers": "2-3", "trainable": False, "source": "donor"},
                      {"kind": "embed", "layers": "-", "trainable": None, "source": "donor"}],
             "trainable_layers": [0, 1], "counts": {"total": 100, "trainable": 40}}
    assert build_params(built) == {"build": "new_shallow", "segments": "mamba2 0-1 train <- new | llama 2-3 frozen "
                                   "<- donor", "trainable_layers": "0,1", "params_total": 100,
                                   "params_trainable": 40}
    result = {"metrics": {"x/acc/logit": 25.0}, "final_loss": 2.5, "wall_s": 30.0,
              "trace": {"paths": {"profile": "/t/profile.png", "md": "/t/split_table.md", "csv": "/t/profiles.csv",
                                  "pq": "/t/per_prompt.parquet", "summary": "/t/summary.json"}}}
    metrics, files = build_records(result, [Path("/e/b.json"), Path("/e/a.json")])
    assert metrics == {"x/acc/logit": 25.0, "final_loss": 2.5, "hybrid_wall_s": 30.0}
    assert files == [("/t/profile.png", "trace"), ("/t/split_table.md", "trace"), ("/t/profiles.csv", "trace"),
                     ("/e/a.json", "eval"), ("/e/b.json", "eval")]


def test_the_hybrid_parent_records_every_build_and_its_trace_plots():
    from raycpt.jobs.hybrid import hybrid_artifacts, hybrid_summary_metrics

    summary = {"wall_s": 99.0, "builds": [{"build": "new_shallow", "metrics": {"t/acc/logit": 25.0}, "final_loss": 2.0},
                                          {"build": "new_deep", "metrics": {"t/acc/logit": 50.0}, "final_loss": 3.0}]}
    assert hybrid_summary_metrics(summary) == {"new_shallow/t/acc/logit": 25.0, "new_deep/t/acc/logit": 50.0,
                                               "new_shallow/final_loss": 2.0, "new_deep/final_loss": 3.0,
                                               "wall_time_s": 99.0}
    results = [{"build": "new_shallow", "trace": {"paths": {"p": "/r/b/profile.png", "m": "/r/b/split_table.md"}}}]
    assert hybrid_artifacts([Path("/r/hybrid.csv"), "/r/summary.json"], results) == [
        ("/r/hybrid.csv", ""), ("/r/summary.json", ""), ("/r/b/profile.png", "trace/new_shallow")]


def _trace_summary() -> dict:
    return {"model_path": "/m", "num_layers": 3, "num_prompts": 4, "seam_space_prompts": 1,
            "tp": [0.1, NAN, 0.3], "ls": [1.0, 2.0, 3.0], "tp_norm": [0.0, 0.5, 1.0], "ls_norm": [0.0, 0.5, 1.0],
            "median": {"tp": [0.2, 0.2, None], "ls": [1, 1, 1], "recommended": {"ratio": 0.5}},
            "groups": {"ant onym": {"tp": [1.0, 2.0, 3.0], "ls": [NAN, 0.0, 1.0]}},
            "split_table": [{"ratio": 0.5, "S": 0.7, "S_median": 0.6, "S_mean": 0.65, "S_lo": 0.1, "S_hi": 0.9}],
            "grid_scores": [[0.25, 1, 0.2], [0.5, 1, 0.7]], "recommended": {"ratio": 0.5, "split_layer": 1, "S": 0.7},
            "wall_s": 2.0, "answer_hit_rate": None}


def test_a_trace_records_its_finite_profiles_and_split_scores_from_its_summary():
    from raycpt.jobs.trace import trace_params, trace_records

    series, metrics = trace_records(_trace_summary())
    assert series == [("tp", 0, 0.1), ("tp", 2, 0.3), ("ls", 0, 1.0), ("ls", 1, 2.0), ("ls", 2, 3.0),
                      ("tp_norm", 0, 0.0), ("tp_norm", 1, 0.5), ("tp_norm", 2, 1.0),
                      ("ls_norm", 0, 0.0), ("ls_norm", 1, 0.5), ("ls_norm", 2, 1.0),
                      ("tp_median", 0, 0.2), ("tp_median", 1, 0.2), ("ls_median", 0, 1.0), ("ls_median", 1, 1.0),
                      ("ls_median", 2, 1.0), ("tp/ant_onym", 0, 1.0), ("tp/ant_onym", 1, 2.0), ("tp/ant_onym", 2, 3.0),
                      ("ls/ant_onym", 1, 0.0), ("ls/ant_onym", 2, 1.0)]
    assert metrics == {"S_b/0.5": 0.7, "S_b_median/0.5": 0.6, "S_b_mean/0.5": 0.65, "S_b_lo/0.5": 0.1,
                       "S_b_hi/0.5": 0.9, "recommended_split_median": 0.5, "S_b_grid/0.25": 0.2, "S_b_grid/0.5": 0.7,
                       "recommended_split": 0.5, "recommended_split_layer": 1, "recommended_S": 0.7, "wall_s": 2.0,
                       "prompts_per_s": 2.0}  # 4 prompts in 2 s; no hit rate
    assert trace_params(_trace_summary()) == {"trace.model_path": "/m", "trace.num_layers": 3, "trace.num_prompts": 4,
                                              "trace.seam_space_prompts": 1}


def test_missing_points_skip_a_value_already_there_and_match_series_by_step():
    from raycpt.jobs.sync import missing_points

    metrics = {"score": 50.0, "tokens_per_s": 10.0, "gold prob (x)": NAN, "heldout loss": 3.0, "wall": 5.0}
    series = [("l2_change", 0, 0.0), ("l2_change", 1, 1.5), ("l2_change", 2, 0.0)]
    have = {"score": [(0, 50.0)], "tokens_per_s": [(1, 9.0), (4, 10.0)], "l2_change": [(0, 0.0)], "wall": [(0, 4.0)]}
    # score is there; tokens_per_s has a point of that value (a step metric's); NaN is never logged; names are
    # cleaned as log_metrics cleans them; layer 2's 0.0 is not layer 0's
    assert missing_points(metrics, series, have) == [("heldout_loss", 0, 3.0), ("wall", 0, 5.0),
                                                     ("l2_change", 1, 1.5), ("l2_change", 2, 0.0)]
    done = {"heldout_loss": [(0, 3.0)], "wall": [(0, 5.0)], "l2_change": [(0, 0.0), (1, 1.5), (2, 0.0)], **{
        k: v for k, v in have.items() if k not in ("l2_change", "wall")}}
    assert missing_points(metrics, series, done) == []


# ------------------------------------------------------------------------------------- the plan
def test_the_grid_sync_plan_replays_trials_that_trained_or_finished_and_unrecorded_traces():
    from raycpt.jobs.sync import grid_sync_plan

    state = {"command": "contribution", "mlflow_run_id": "P", "status": "finished"}
    trials = {
        "base": {"meta": {"mlflow_run_id": "C0", "spec": {"name": "base", "kind": "base"}}, "train_state": None,
                 "finished": True},  # evaluated only: no training folder, its run still gets its records
        "full": {"meta": {"spec": {"name": "full", "kind": "full"}},
                 "train_state": {"mlflow_run_id": None, "status": "finished"}, "finished": True},
        "single-L01": {"meta": {"mlflow_run_id": "C2"}, "train_state": None, "finished": False},  # never began
        "single-L02": {"meta": {"mlflow_run_id": "C3"}, "train_state": {"status": "interrupted"}, "finished": False},
    }
    assert grid_sync_plan(state, trials) == [
        {"kind": "trial", "name": "base", "label": "base", "dir": "trials/base", "folder": None, "run_id": "C0",
         "parent_run_id": "P", "status": "FINISHED"},
        {"kind": "trial", "name": "full", "label": "full", "dir": "trials/full", "folder": "trials/full/train",
         "run_id": None, "parent_run_id": "P", "status": "FINISHED"},
        {"kind": "trial", "name": "single-L02", "label": "single-L02", "dir": "trials/single-L02",
         "folder": "trials/single-L02/train", "run_id": "C3", "parent_run_id": "P", "status": "KILLED"},
        {"kind": "parent", "name": "", "folder": ".", "run_id": "P", "parent_run_id": None, "status": "FINISHED"},
    ]
    lost = {"uri": "http://127.0.0.1:9"}
    builds = {
        "new_deep": {"meta": {"mlflow_run_id": "B1", "spec": {"name": "new_deep", "label": "llama-mamba2 (new_deep)"}},
                     "train_state": {"mlflow_run_id": "B1", "status": "finished"}, "finished": True,
                     "trace_state": {"mlflow_run_id": "T1", "status": "finished"}},  # recorded: not replayed
        "new_shallow": {"meta": {"spec": {"name": "new_shallow", "label": "mamba2-llama (new_shallow)"}},
                        "train_state": {"status": "finished"}, "finished": True,
                        "trace_state": {"status": "finished", "tracking_lost": lost}},
    }
    plan = grid_sync_plan({"mlflow_run_id": "P", "status": "failed"}, builds, "builds",
                          trace={"mlflow_run_id": "T0", "status": "finished", "tracking_lost": lost})
    assert plan == [
        {"kind": "trace", "name": "", "folder": "trace", "run_id": "T0", "parent_run_id": "P", "parent_trial": None,
         "status": "FINISHED"},
        {"kind": "trial", "name": "new_deep", "label": "llama-mamba2 (new_deep)", "dir": "builds/new_deep",
         "folder": "builds/new_deep/train", "run_id": "B1", "parent_run_id": "P", "status": "FINISHED"},
        {"kind": "trial", "name": "new_shallow", "label": "mamba2-llama (new_shallow)", "dir": "builds/new_shallow",
         "folder": "builds/new_shallow/train", "run_id": None, "parent_run_id": "P", "status": "FINISHED"},
        {"kind": "trace", "name": "new_shallow", "folder": "builds/new_shallow/trace", "run_id": None,
         "parent_run_id": None, "parent_trial": "new_shallow", "status": "FINISHED"},
        {"kind": "parent", "name": "", "folder": ".", "run_id": "P", "parent_run_id": None, "status": "FAILED"},
    ]
    recorded = grid_sync_plan({"mlflow_run_id": "P"}, {}, trace={"mlflow_run_id": "T0", "tracking_lost": None})
    assert [i["kind"] for i in recorded] == ["parent"] and recorded[0]["status"] is None


# ------------------------------------------------------------------------------------- the guards
class _Client:
    """Fails the test on any call: nothing may reach the store."""

    def __getattr__(self, name):
        return lambda *a, **k: pytest.fail(f"MLflow client call {name} with the server gone")


def _no_fluent(monkeypatch):
    import mlflow

    for name in ("start_run", "log_metrics", "log_metric", "log_artifact", "log_params", "log_param"):
        monkeypatch.setattr(mlflow, name, lambda *a, _n=name, **k: pytest.fail(f"mlflow.{_n} with the server gone"))


def test_the_two_jobs_log_nothing_once_the_server_is_gone(fresh_lost, monkeypatch, tmp_path):
    from raycpt.jobs.contribution import ScanTrial, _log_scan
    from raycpt.jobs.grid import Trial
    from raycpt.jobs.hybrid import _log_build, _log_build_params, _log_run
    from raycpt.runs import CommandRun

    tr = fresh_lost
    tr.mark_lost("http://127.0.0.1:9", error="refused")
    _no_fluent(monkeypatch)
    cfg = SimpleNamespace(tracking=SimpleNamespace(uri="http://127.0.0.1:9"))
    run = SimpleNamespace(run_id="C1", client=_Client(), meta={}, created=True)
    trial = Trial(cfg=cfg, dir=tmp_path, run=run, parent_run_id="P", shared={})
    ScanTrial._log(trial, {"cells": {}, "score": 1.0, "wall_s": 1.0, "gold_prob": None, "heldout_loss": 2.0,
                           "l2": [0.5]})
    _log_build_params(run, SimpleNamespace(to_dict=lambda: pytest.fail("params built with the server gone")))
    assert run.meta == {}  # not marked logged: the sync logs them
    _log_build(trial, {"metrics": {}, "final_loss": 1.0, "wall_s": 1.0, "trace": {"paths": {}}})
    parent = CommandRun(cfg, "hybrid", tmp_path, "P", _Client(), False, "0")
    _log_run(parent, {"wall_s": 1.0, "builds": []}, [])
    _log_scan(parent, {"num_above": 0, "band_mean": 0, "outside_mean": 0, "base_score": 0, "full_score": 0,
                       "contribution": {}}, [], 1.0)


def test_a_server_that_goes_away_inside_a_trial_log_is_recorded_not_raised(fresh_lost, monkeypatch, tmp_path):
    import mlflow

    from raycpt.jobs.contribution import ScanTrial
    from raycpt.jobs.grid import Trial

    tr = fresh_lost

    def refused(*a, **k):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(mlflow, "start_run", refused)
    cfg = SimpleNamespace(tracking=SimpleNamespace(uri="http://127.0.0.1:9"))
    trial = Trial(cfg=cfg, dir=tmp_path, run=SimpleNamespace(run_id="C1"), parent_run_id="P", shared={})
    ScanTrial._log(trial, {"cells": {}, "score": 1.0, "wall_s": 1.0, "gold_prob": None, "heldout_loss": None,
                           "l2": None})
    assert tr.tracking_lost() is not None


def test_a_nested_command_runs_locally_with_the_server_gone(fresh_lost, monkeypatch, tmp_path):
    import raycpt.runs as runs
    from raycpt.config import load_config

    tr = fresh_lost
    monkeypatch.setattr(runs, "check_store", lambda c: None)
    monkeypatch.setattr(runs, "LOST_RUNS", [])
    _no_fluent(monkeypatch)
    tr.mark_lost("http://127.0.0.1:9", error="refused")  # found gone by the build's training, before its trace
    cfg = load_config(None, [f"tracking.run_root={tmp_path}", "tracking.uri=http://127.0.0.1:9"])
    folder = tmp_path / "hybrid-x" / "builds" / "b" / "trace"
    with runs.command_run(cfg, "trace", run_dir=folder, parent_run_id=None) as run:
        assert run.run_id is None
        with run.active() as on:
            assert on is False
    state = json.loads((folder / "state.json").read_text())
    assert state["status"] == "finished" and state["command"] == "trace"
    assert state["tracking_lost"]["uri"] == cfg.tracking.uri
    assert (folder / tr.LOST_FILE).is_file()
    assert runs.LOST_RUNS == []  # no warning line of its own: the command around it (hybrid run) says it


# ------------------------------------------------------------------------------------- sync into a store
def _store_cfg(tmp_path):
    from raycpt.config import load_config

    root = tmp_path / "runs"
    return load_config(None, [f"tracking.run_root={root}", f"tracking.uri=sqlite:///{root / 'mlflow.db'}"])


def _write(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


def _train_folder(tdir: Path, cfg, records: list[dict]) -> None:
    from raycpt.config import save_config

    save_config(cfg, tdir / "config.yaml")
    _write(tdir / "state.json", {"command": "train", "status": "finished"})
    _write(tdir / "train_metrics.jsonl", "".join(json.dumps(r) + "\n" for r in records))


def _everything(client, run_id: str) -> tuple:
    """What a run holds: every metric point, its params, its artifact files, its status."""
    run = client.get_run(run_id)
    points = sorted((k, m.step, m.value) for k in run.data.metrics for m in client.get_metric_history(run_id, k))

    def files(path=None):
        return [f for a in client.list_artifacts(run_id, path) for f in (files(a.path) if a.is_dir else [a.path])]

    return points, dict(run.data.params), sorted(files()), run.info.status


def test_sync_replays_a_contribution_folder_once(fresh_lost, tmp_path):
    from mlflow.tracking import MlflowClient

    from raycpt.config import save_config
    from raycpt.jobs.sync import sync_run
    from raycpt.tracking import ensure_store, tracking_uri

    cfg = _store_cfg(tmp_path)
    exp = ensure_store(cfg.tracking)
    client = MlflowClient(tracking_uri(cfg.tracking))
    parent = client.create_run(exp, run_name="contribution-x").info.run_id  # made before the server went away
    base_run = client.create_run(exp, run_name="base", tags={"mlflow.parentRunId": parent}).info.run_id
    run_dir = Path(cfg.tracking.run_root) / "contribution-x-1"
    save_config(cfg, run_dir / "config.yaml")
    _write(run_dir / "state.json", {"command": "contribution", "status": "finished", "mlflow_run_id": parent,
                                    "wall_s": 42.0, "tracking_lost": {"uri": "u"},
                                    "artifacts": [["ranking.json", ""], ["plots/contribution.png", ""]]})
    _write(run_dir / "ranking.json", {"ranking": []})
    _write(run_dir / "plots" / "contribution.png", "png")
    _write(run_dir / "tracking_lost.json", {"uri": "u"})
    _write(run_dir / "summary.json", {"num_above": 1, "band_mean": 0.5, "outside_mean": 0.25, "base_score": 40.0,
                                      "full_score": 60.0, "contribution": {"1": 0.8, "0": 0.1}})
    trials = run_dir / "trials"
    _write(trials / "base" / "trial.json", {"mlflow_run_id": base_run, "spec": {"name": "base", "kind": "base",
                                                                                "layer": None}})
    _write(trials / "base" / "result.json", {"cells": {"t/acc/logit": 40.0}, "score": 40.0, "wall_s": 3.0,
                                             "gold_prob": None, "heldout_loss": 4.0, "l2": None})
    _write(trials / "full" / "trial.json", {"spec": {"name": "full", "kind": "full", "layer": None}})  # made offline
    _write(trials / "full" / "result.json", {"cells": {"t/acc/logit": 60.0}, "score": 60.0, "wall_s": 9.0,
                                             "gold_prob": None, "heldout_loss": 3.5, "l2": [0.0, 0.75]})
    _train_folder(trials / "full" / "train", cfg, [{"step": 1, "loss": 2.5, "lr": 0.01},
                                                    {"step": 2, "loss": 2.25, "lr": 0.01}])

    line = sync_run(cfg, [str(run_dir)])
    assert line.startswith(f"synced {run_dir} into its run {parent}") and "2 trial(s) (1 new run(s))" in line
    full_run = json.loads((trials / "full" / "trial.json").read_text())["mlflow_run_id"]
    got = {rid: _everything(client, rid) for rid in (parent, base_run, full_run)}
    points, params, arts, status = got[parent]
    assert status == "FINISHED" and arts == ["contribution.png", "ranking.json"]
    assert points == sorted([("base_score", 0, 40.0), ("band_mean", 0, 0.5), ("contribution", 0, 0.1),
                             ("contribution", 1, 0.8), ("full_score", 0, 60.0), ("num_above", 0, 1.0),
                             ("outside_mean", 0, 0.25), ("wall_time_s", 0, 42.0)])
    points, params, arts, status = got[base_run]
    assert status == "FINISHED" and params == {"kind": "base", "layer": ""}
    assert points == [("heldout_loss", 0, 4.0), ("score", 0, 40.0), ("t/acc/logit", 0, 40.0), ("wall_time_s", 0, 3.0)]
    run = client.get_run(full_run)
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["raycpt.trial"] == "full"
    assert run.data.tags["raycpt.command"] == "contribution" and run.info.run_name == "full"
    points, params, arts, status = got[full_run]
    assert status == "FINISHED" and (params["kind"], params["layer"]) == ("full", "")
    assert [p for p in points if p[0] in ("loss", "lr", "l2_change")] == [
        ("l2_change", 0, 0.0), ("l2_change", 1, 0.75), ("loss", 1, 2.5), ("loss", 2, 2.25), ("lr", 1, 0.01),
        ("lr", 2, 0.01)]
    assert {p for p in points if p[0] in ("score", "heldout_loss", "t/acc/logit")} == {
        ("score", 0, 60.0), ("heldout_loss", 0, 3.5), ("t/acc/logit", 0, 60.0)}
    assert not (run_dir / "tracking_lost.json").exists()
    assert json.loads((run_dir / "state.json").read_text())["tracking_lost"] is None

    sync_run(cfg, [str(run_dir)])  # a second sync adds nothing
    assert {rid: _everything(client, rid) for rid in got} == got


def test_sync_replays_a_hybrid_folder_with_a_trace_run_locally(fresh_lost, tmp_path):
    from mlflow.tracking import MlflowClient

    from raycpt.config import save_config
    from raycpt.jobs.sync import sync_run
    from raycpt.tracking import ensure_store, tracking_uri

    cfg = _store_cfg(tmp_path)
    ensure_store(cfg.tracking)
    client = MlflowClient(tracking_uri(cfg.tracking))
    run_dir = Path(cfg.tracking.run_root) / "hybrid-x-1"  # the server was gone from the start: no run at all
    save_config(cfg, run_dir / "config.yaml")
    _write(run_dir / "state.json", {"command": "hybrid", "status": "finished", "wall_s": 50.0,
                                    "artifacts": [["hybrid_table.txt", ""],
                                                  ["builds/new_shallow/trace/profile.png", "trace/new_shallow"]]})
    _write(run_dir / "hybrid_table.txt", "table")
    _write(run_dir / "summary.json", {"wall_s": 50.0, "builds": [{"build": "new_shallow", "final_loss": 2.0,
                                                                  "metrics": {"t/acc/logit": 25.0}}]})
    b = run_dir / "builds" / "new_shallow"
    _write(b / "build.json", {"spec": {"name": "new_shallow", "label": "mamba2-llama (new_shallow)"}})
    _write(b / "initial" / "segment_map.json", {"build": "new_shallow", "trainable_layers": [0], "counts": {"total": 9},
                                                "rows": [{"kind": "mamba2", "layers": "0", "trainable": True,
                                                          "source": "new"}]})
    _train_folder(b / "train", cfg, [{"step": 1, "loss": 3.0}])
    _write(b / "eval" / "eval-x.json", "{}")
    trace = b / "trace"
    save_config(cfg, trace / "config.yaml")
    _write(trace / "state.json", {"command": "trace", "status": "finished", "tracking_lost": {"uri": "u"},
                                  "artifacts": [["profile.png", "trace"], ["summary.json", "trace"]]})
    _write(trace / "summary.json", _trace_summary())
    _write(trace / "profile.png", "png")
    _write(b / "result.json", {"metrics": {"t/acc/logit": 25.0}, "final_loss": 2.0, "wall_s": 7.0,
                               "trace": {"paths": {"profile": str(trace / "profile.png"),
                                                   "summary": str(trace / "summary.json")}}})

    sync_run(cfg, [str(run_dir)])
    parent = json.loads((run_dir / "state.json").read_text())["mlflow_run_id"]
    build = json.loads((b / "build.json").read_text())["mlflow_run_id"]
    tstate = json.loads((trace / "state.json").read_text())
    trace_run = tstate["mlflow_run_id"]
    assert tstate["tracking_lost"] is None
    got = {rid: _everything(client, rid) for rid in (parent, build, trace_run)}
    points, _, arts, status = got[parent]
    assert status == "FINISHED" and arts == ["hybrid_table.txt", "trace/new_shallow/profile.png"]
    assert points == [("new_shallow/final_loss", 0, 2.0), ("new_shallow/t/acc/logit", 0, 25.0),
                      ("wall_time_s", 0, 50.0)]
    run = client.get_run(build)
    assert run.data.tags["mlflow.parentRunId"] == parent and run.data.tags["raycpt.build"] == "new_shallow"
    assert run.info.run_name == "mamba2-llama (new_shallow)"
    points, params, arts, status = got[build]
    assert status == "FINISHED" and arts == ["eval/eval-x.json", "segment_map.json", "trace/profile.png"]
    assert {k: params[k] for k in ("build", "segments", "trainable_layers", "params_total")} == {
        "build": "new_shallow", "segments": "mamba2 0 train <- new", "trainable_layers": "0", "params_total": "9"}
    assert {p for p in points if p[0] in ("loss", "final_loss", "hybrid_wall_s", "t/acc/logit")} == {
        ("loss", 1, 3.0), ("final_loss", 0, 2.0), ("hybrid_wall_s", 0, 7.0), ("t/acc/logit", 0, 25.0)}
    run = client.get_run(trace_run)
    assert run.data.tags["mlflow.parentRunId"] == build and run.info.run_name == f"trace-{cfg.name}"
    points, params, arts, status = got[trace_run]
    assert status == "FINISHED" and arts == ["trace/profile.png", "trace/summary.json"]
    assert params["trace.num_prompts"] == "4" and ("recommended_split", 0, 0.5) in points
    assert [p for p in points if p[0] == "tp"] == [("tp", 0, 0.1), ("tp", 2, 0.3)]

    sync_run(cfg, [str(run_dir)])  # a second sync adds nothing (the trace, recorded now, is not replayed)
    assert {rid: _everything(client, rid) for rid in got} == got
