"""Issue 27 for ``raycpt contribution`` and ``raycpt hybrid run``, no Ray and no server: the records their runs get
(pure functions of their results), every record of the two jobs kept in the run folder and no MLflow call once the
server is gone, and a nested command (a build's trace) run locally. The sync of such folders is
``tests/unit/test_run_records.py``'s and ``tests/integration/test_run_owner.py``'s."""

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


# ------------------------------------------------------------------------------------- the guards
class _Client:
    """Fails the test on any call: nothing may reach the store (``gone``: every call finds the server gone)."""

    def __init__(self, gone=False):
        self.gone = gone

    def __getattr__(self, name):
        def call(*a, **k):
            if self.gone:
                raise ConnectionRefusedError(111, "Connection refused")
            pytest.fail(f"MLflow client call {name} with the server gone")

        return call


def _no_fluent(monkeypatch):
    import mlflow

    for name in ("start_run", "log_metrics", "log_metric", "log_artifact", "log_params", "log_param"):
        monkeypatch.setattr(mlflow, name, lambda *a, _n=name, **k: pytest.fail(f"mlflow.{_n} with the server gone"))


def test_the_two_jobs_record_into_their_folders_and_call_nothing_once_the_server_is_gone(fresh_lost, monkeypatch,
                                                                                        tmp_path):
    from raycpt.jobs.contribution import ScanTrial, _log_scan
    from raycpt.jobs.grid import Trial
    from raycpt.jobs.hybrid import _log_build, _log_build_params, _log_run
    from raycpt.runs.run import Run
    from raycpt.runs.records import read_records

    tr = fresh_lost
    tr.mark_lost("http://127.0.0.1:9", error="refused")
    _no_fluent(monkeypatch)
    cfg = SimpleNamespace(tracking=SimpleNamespace(uri="http://127.0.0.1:9"))
    client = _Client()
    run = Run(cfg, "contribution", tmp_path / "t", "C1", client, True, "0", meta_path=tmp_path / "t" / "trial.json")
    trial = Trial(cfg=cfg, dir=tmp_path / "t", run=run, parent_run_id="P", shared={})
    ScanTrial._log(trial, {"cells": {}, "score": 1.0, "wall_s": 1.0, "gold_prob": None, "heldout_loss": 2.0,
                           "l2": [0.5]})
    seg = tmp_path / "seg"
    seg.mkdir()
    _log_build_params(run, SimpleNamespace(to_dict=lambda: {"build": "b", "rows": [], "trainable_layers": [1],
                                                            "counts": {"total": 3}}, folder=seg))
    assert run.meta == {"params_logged": True}  # recorded in the folder: the sync sends them
    _log_build(trial, {"metrics": {}, "final_loss": 1.0, "wall_s": 1.0, "trace": {"paths": {}}})
    parent = Run(cfg, "hybrid", tmp_path, "P", _Client(), False, "0")
    _log_run(parent, {"wall_s": 1.0, "builds": []}, [])
    _log_scan(parent, {"num_above": 0, "band_mean": 0, "outside_mean": 0, "base_score": 0, "full_score": 0,
                       "contribution": {}}, [], 1.0)
    kinds = [next(iter(r)) for r in read_records(tmp_path / "t")]
    assert kinds == ["metrics", "points", "params", "artifact", "metrics"]
    assert read_records(tmp_path / "t")[0]["metrics"] == {"score": 1.0, "wall_time_s": 1.0, "heldout_loss": 2.0}
    assert [next(iter(r)) for r in read_records(tmp_path)] == ["metrics", "metrics"]  # no layer: no series
    # and _Client failed the test on any call: nothing went to the store


def test_a_server_that_goes_away_inside_a_trial_log_is_recorded_not_raised(fresh_lost, tmp_path):
    from raycpt.jobs.contribution import ScanTrial
    from raycpt.jobs.grid import Trial
    from raycpt.runs.run import Run
    from raycpt.runs.records import read_records

    tr = fresh_lost
    cfg = SimpleNamespace(tracking=SimpleNamespace(uri="http://127.0.0.1:9"))
    run = Run(cfg, "contribution", tmp_path, "C1", _Client(gone=True), True, "0")
    trial = Trial(cfg=cfg, dir=tmp_path, run=run, parent_run_id="P", shared={})
    ScanTrial._log(trial, {"cells": {}, "score": 1.0, "wall_s": 1.0, "gold_prob": None, "heldout_loss": None,
                           "l2": None})
    assert tr.tracking_lost() is not None
    assert read_records(tmp_path) == [{"metrics": {"score": 1.0, "wall_time_s": 1.0}, "step": 0}]


def test_a_nested_command_runs_locally_with_the_server_gone(fresh_lost, monkeypatch, tmp_path):
    import raycpt.runs.run as runs
    from raycpt.config import load_config
    from raycpt.runs.location import locate

    tr = fresh_lost
    monkeypatch.setattr(runs, "locate", lambda t: locate(t, check=False))  # the server is not asked
    monkeypatch.setattr(runs, "LOST_RUNS", [])
    _no_fluent(monkeypatch)
    tr.mark_lost("http://127.0.0.1:9", error="refused")  # found gone by the build's training, before its trace
    cfg = load_config(None, [f"tracking.run_root={tmp_path}", "tracking.uri=http://127.0.0.1:9"])
    folder = tmp_path / "hybrid-x" / "builds" / "b" / "trace"
    with runs.command_run(cfg, "trace", run_dir=folder) as run:
        assert run.run_id is None and not run.live()
        run.log_metrics({"x": 1.0})
    state = json.loads((folder / "state.json").read_text())
    assert state["status"] == "finished" and state["command"] == "trace"
    assert state["tracking_lost"]["uri"] == cfg.tracking.uri
    assert (folder / tr.LOST_FILE).is_file()
    assert runs.LOST_RUNS == []  # no warning line of its own: the command around it (hybrid run) says it
