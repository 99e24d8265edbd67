"""Issue 51, rule 7: a worker death is a trial's failure, not the grid's crash. Inline trials (no Ray) whose work's
process dies (Ray's ``OutOfMemoryError``, ``ActorDiedError``, Ray Train's "worker(s) were killed") are retried once
(Tune's ``FailureConfig``), then recorded as that trial's failure: the other trials finish, the command ends in one
line naming the trial, the cause and the ``--resume`` command (exit 2), the MLflow runs and ``state.json`` say so,
and ``--resume`` finishes with the numbers of an uninterrupted run. Any other error still ends the grid."""

import json
from dataclasses import dataclass

import pytest
import ray.exceptions as rex

from raycpt.config import config_from_dict

CALLS: list[str] = []
DEATHS = {"oom": lambda: rex.OutOfMemoryError("Task was killed due to the node running low on memory."),
          "actor": lambda: rex.ActorDiedError(),
          "train": lambda: RuntimeError("Training failed: worker(s) were killed (exit code -9)")}


@dataclass(frozen=True)
class Spec:
    name: str
    dies: str = ""  # a key of DEATHS
    times: int = 0  # deaths before it succeeds (99: always)

    def run(self, trial) -> dict:
        CALLS.append(self.name)
        if self.dies and CALLS.count(self.name) <= self.times:
            raise DEATHS[self.dies]()
        k = int(self.name[1:])
        return {"name": self.name, "value": sum(i * i for i in range(k + 1))}


def _run(tmp_path, specs, resume=False):
    from raycpt.jobs.grid import Grid, grid_params, run_grid
    from raycpt.runs import command_run

    cfg = config_from_dict({"name": "g", "tracking": {"run_root": str(tmp_path / "runs"), "experiment": "grid"}})
    grid = Grid("sweep", specs, inline=True)
    with command_run(cfg, "sweep", resume=resume, params=grid_params(specs)) as parent:
        return parent.run_dir, run_grid(parent, grid, resume=resume)


def _status(tmp_path) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grid")
    return {r.data.tags.get("raycpt.trial", "parent"): r.info.status for r in client.search_runs([exp.experiment_id])}


@pytest.mark.parametrize("dies, says", [("oom", "killed by Ray's memory monitor (out of memory)"),
                                        ("actor", "its process died (ActorDiedError)"),
                                        ("train", "worker(s) were killed")])
def test_a_trial_that_dies_every_time_fails_alone_and_resume_finishes_it(tmp_path, dies, says):
    from raycpt.jobs.grid import GridIncomplete

    CALLS.clear()
    with pytest.raises(GridIncomplete) as e:
        _run(tmp_path, [Spec("t1"), Spec("t2", dies, 99), Spec("t3")])
    msg = str(e.value)
    assert e.value.exit_code == 2 and e.value.status == "FAILED" and "\n" not in msg
    assert msg.startswith("sweep incomplete: t2 did not finish (t2: ") and says in msg and "2 attempt(s)" in msg
    assert "--resume" in msg and "raycpt sweep" in msg
    assert CALLS == ["t1", "t2", "t2", "t3"]  # retried once, then the grid went on to t3
    assert _status(tmp_path) == {"parent": "FAILED", "t1": "FINISHED", "t2": "FAILED", "t3": "FINISHED"}
    run_dir = next((tmp_path / "runs").glob("sweep-g-*"))
    assert json.loads((run_dir / "state.json").read_text())["status"] == "failed"

    CALLS.clear()
    _, resumed = _run(tmp_path, [Spec("t1"), Spec("t2"), Spec("t3")], resume=True)
    assert CALLS == ["t2"]  # only the failed trial runs again
    assert {n: r["value"] for n, r in resumed.items()} == {"t1": 0 + 1, "t2": 0 + 1 + 4, "t3": 0 + 1 + 4 + 9}
    assert set(_status(tmp_path).values()) == {"FINISHED"}


def test_a_trial_that_dies_once_is_retried_and_the_grid_finishes(tmp_path):
    CALLS.clear()
    _, results = _run(tmp_path, [Spec("t1"), Spec("t2", "oom", 1)])
    assert CALLS == ["t1", "t2", "t2"] and results["t2"]["value"] == 0 + 1 + 4
    assert set(_status(tmp_path).values()) == {"FINISHED"}


def test_a_wrapped_death_is_found_and_another_error_is_not_a_death():
    from raycpt.train.driver.failures import worker_death

    try:
        try:
            raise rex.ActorDiedError()
        except rex.RayError as inner:
            raise RuntimeError("trial failed") from inner
    except RuntimeError as outer:
        assert worker_death(outer) == "its process died (ActorDiedError)"
    assert worker_death(ValueError("boom")) is None
    assert worker_death(RuntimeError("the room is full")) is None
