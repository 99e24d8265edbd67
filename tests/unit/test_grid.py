"""The trial-grid driver without Ray (inline trials): one MLflow child per trial under one parent, Ctrl-C ends
the unfinished ones KILLED with one "continue with --resume" line, a resume redoes no finished trial and
continues the interrupted trial's run, an error ends both FAILED, nothing is left RUNNING."""

import json
from dataclasses import dataclass

import pytest

from raycpt.config import config_from_dict

CALLS: list[str] = []


@dataclass(frozen=True)
class Spec:
    name: str
    fail: str = ""

    def run(self, trial) -> dict:
        CALLS.append(self.name)
        if self.fail == "interrupt":
            raise KeyboardInterrupt
        if self.fail == "error":
            raise ValueError("boom")
        return {"name": self.name, "cfg_name": trial.cfg.name, "shared": trial.shared["x"]}


def _run(tmp_path, specs, resume=False):
    from raycpt.jobs.grid import Grid, grid_params, run_grid
    from raycpt.runs.run import command_run

    cfg = config_from_dict({"name": "g", "tracking": {"run_root": str(tmp_path / "runs"), "experiment": "grid"}})
    grid = Grid("sweep", specs, shared={"x": 7}, inline=True)
    with command_run(cfg, "sweep", resume=resume, params=grid_params(specs)) as parent:
        return parent.run_dir, parent.run_id, run_grid(parent, grid, resume=resume)


def _runs(tmp_path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grid")
    return client.search_runs([exp.experiment_id])


def test_interrupt_then_resume_keeps_one_child_per_trial(tmp_path):
    from raycpt.jobs.grid import GridIncomplete

    CALLS.clear()
    with pytest.raises(GridIncomplete) as e:
        _run(tmp_path, [Spec("a"), Spec("b", "interrupt"), Spec("c")])
    msg = str(e.value)
    assert e.value.exit_code == 130 and e.value.status == "KILLED" and "\n" not in msg
    assert "b, c did not finish" in msg and "continue with --resume" in msg
    status = {r.data.tags.get("raycpt.trial", "parent"): r.info.status for r in _runs(tmp_path)}
    assert status == {"parent": "KILLED", "a": "FINISHED", "b": "KILLED"}  # c never started

    CALLS.clear()
    run_dir, parent_id, results = _run(tmp_path, [Spec("a"), Spec("b"), Spec("c")], resume=True)
    assert CALLS == ["b", "c"]  # a finished before: read back, never redone
    assert list(results) == ["a", "b", "c"] and results["b"] == {"name": "b", "cfg_name": "g", "shared": 7}
    assert json.loads((run_dir / "trials" / "a" / "result.json").read_text())["name"] == "a"
    runs = _runs(tmp_path)
    children = [r.data.tags["raycpt.trial"] for r in runs if r.data.tags.get("mlflow.parentRunId") == parent_id]
    assert sorted(children) == ["a", "b", "c"] and len(runs) == 4  # the parent and one child per trial
    assert {r.info.status for r in runs} == {"FINISHED"}


def test_a_failing_trial_ends_child_and_parent_failed(tmp_path):
    CALLS.clear()
    with pytest.raises(ValueError, match="boom"):
        _run(tmp_path, [Spec("a", "error")])
    status = {r.data.tags.get("raycpt.trial", "parent"): r.info.status for r in _runs(tmp_path)}
    assert status == {"parent": "FAILED", "a": "FAILED"}


def test_seeded_sweep_trials_carry_seed_and_resume_skips_finished_seeds(tmp_path, monkeypatch):
    """TrialSpec.run for every seed of a plan, inline, with training replaced by a stub: each child run
    carries its seed (param and tag) and its own train.seed; after an interruption a resume reruns only
    the unfinished trial/seed."""
    from types import SimpleNamespace

    import raycpt.jobs.sweep as sweep
    from raycpt.jobs.grid import GridIncomplete

    seen: list[tuple[str, int]] = []
    stop = {"full-s2"}

    def fake_train_and_evaluate(trial, tcfg, name):
        if name in stop:
            raise KeyboardInterrupt
        seen.append((name, tcfg.train.seed))
        train = SimpleNamespace(trainable_params=1, frozen_params=0, tokens_per_s=1.0, losses=[2.0],
                                peak_memory_mb=None, trainable_per_step=None, pid=None, final_model_dir=str(trial.dir))
        return train, SimpleNamespace(metrics=lambda: {"wn/average/logit": 10.0 * tcfg.train.seed}), None

    monkeypatch.setattr(sweep, "train_and_evaluate", fake_train_and_evaluate)
    specs = sweep.plan_grid([0.5], [], 4, seeds=[1, 2])  # full only, at seeds 1 and 2
    assert [s.name for s in specs] == ["full-s1", "full-s2"]
    with pytest.raises(GridIncomplete):
        _run(tmp_path, specs)
    assert seen == [("full-s1", 1)]
    stop.clear()
    run_dir, parent_id, results = _run(tmp_path, specs, resume=True)
    assert seen == [("full-s1", 1), ("full-s2", 2)]  # full-s1 finished before: not rerun
    assert [(r["group"], r["seed"], r["scores"]["wn/average/logit"]) for r in results.values()] == \
        [("full", 1, 10.0), ("full", 2, 20.0)]
    children = {r.data.tags["raycpt.trial"]: r for r in _runs(tmp_path)
                if r.data.tags.get("mlflow.parentRunId") == parent_id}
    assert sorted(children) == ["full-s1", "full-s2"]
    for name, sd in (("full-s1", "1"), ("full-s2", "2")):
        assert children[name].data.params["seed"] == sd and children[name].data.tags["seed"] == sd
        assert children[name].info.status == "FINISHED"
