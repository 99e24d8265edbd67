"""Issue 51, rule 7 on a real Ray (127.0.0.1): a Tune trial whose actor process is SIGKILLed (what Ray's memory
monitor does to the process it picks) is retried once, then recorded as that trial's failure; the other trials
finish; the grid ends in one line naming the trial, the cause and ``--resume``; the resume runs only that trial and
gives the numbers an uninterrupted trial gives."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture
def own_ray(monkeypatch):
    """A Ray of this test (4 CPUs, 127.0.0.1) whose worker processes import this module (PYTHONPATH holds its
    folder: a Tune trial rebuilds its spec class by module name); shut down even when the test fails."""
    import ray

    from raycpt.config import RayConfig
    from raycpt.runtime import init_ray

    if ray.is_initialized():
        pytest.skip("a Ray is already up in this process: its workers cannot import this test module")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    init_ray(RayConfig(num_cpus=4, object_store_memory=1_000_000_000))
    try:
        yield ray
    finally:
        ray.shutdown()


@dataclass(frozen=True)
class KillSpec:
    name: str
    kill_dir: str = ""  # set: SIGKILL this trial's process while <kill_dir>/<name>.kill exists

    def run(self, trial) -> dict:
        if self.kill_dir and (Path(self.kill_dir) / f"{self.name}.kill").exists():
            with open(Path(self.kill_dir) / f"{self.name}.attempts", "a") as f:
                f.write(f"{os.getpid()}\n")
            os.kill(os.getpid(), signal.SIGKILL)
        k = int(self.name[1:])
        return {"name": self.name, "value": sum(i * i for i in range(k + 1))}


def _grid(tmp_path, specs, resume=False):
    from raycpt.config import config_from_dict
    from raycpt.jobs.grid import Grid, grid_params, run_grid
    from raycpt.runs import command_run

    cfg = config_from_dict({"name": "g", "tracking": {"run_root": str(tmp_path / "runs"), "experiment": "grid"}})
    grid = Grid("sweep", specs, cpus=1.0)
    with command_run(cfg, "sweep", resume=resume, params=grid_params(specs)) as parent:
        return run_grid(parent, grid, resume=resume)


def test_a_sigkilled_trial_fails_alone_and_resume_completes_it(tmp_path, own_ray):
    from raycpt.jobs.grid import GridIncomplete

    kills = tmp_path / "kills"
    kills.mkdir()
    (kills / "t2.kill").write_text("")
    specs = [KillSpec("t1", str(kills)), KillSpec("t2", str(kills)), KillSpec("t3", str(kills))]
    with pytest.raises(GridIncomplete) as e:
        _grid(tmp_path, specs)
    msg = str(e.value)
    assert e.value.exit_code == 2 and "\n" not in msg, msg
    assert msg.startswith("sweep incomplete: t2 did not finish (t2: its process died") and "--resume" in msg, msg
    assert len((kills / "t2.attempts").read_text().split()) == 2  # the first attempt and one retry
    run_dir = next((tmp_path / "runs").glob("sweep-g-*"))
    assert json.loads((run_dir / "state.json").read_text())["status"] == "failed"
    assert sorted(p.parent.name for p in (run_dir / "trials").glob("*/result.json")) == ["t1", "t3"]

    (kills / "t2.kill").unlink()
    results = _grid(tmp_path, specs, resume=True)
    assert {n: r["value"] for n, r in results.items()} == {"t1": 0 + 1, "t2": 0 + 1 + 4, "t3": 0 + 1 + 4 + 9}

    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("grid")
    assert {r.info.status for r in client.search_runs([exp.experiment_id])} == {"FINISHED"}
