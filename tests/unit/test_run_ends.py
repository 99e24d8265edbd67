"""Issue 51, rule 5: every exit ends every run it opened and says what is true. An interrupt leaves no MLflow run
RUNNING (a unit's nested runs included) and no ``state.json`` / ``trial.json`` saying running; a command killed where
nothing of it can run (SIGKILL) is ended by the ``raycpt runs sync FOLDER`` its line advises, or by ``--resume``; the
interrupt line names exactly the trials that did not finish. Real SQLite MLflow stores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from raycpt.config import load_config
from raycpt.io import write_sealed_json

ROOT = Path(__file__).resolve().parents[2]


def _cfg(root: Path):
    return load_config(None, [f"tracking.run_root={root}", "name=ends"])


def _client(root: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def _statuses(root: Path) -> dict:
    client = _client(root)
    exp = client.get_experiment_by_name("raycpt")
    return {r.info.run_name: r.info.status for r in client.search_runs([exp.experiment_id])}


def _running_files(run_dir: Path) -> list:
    return [p for name in ("state.json", "trial.json") for p in run_dir.rglob(name)
            if json.loads(p.read_text()).get("status") == "running"]


def _open_unit_with_nested_run(run) -> None:
    """What a Tune trial stopped mid-way leaves: its unit run opened and never ended, a run nested under it, its
    training folder's state.json saying running."""
    from raycpt.runs.folder import write_state

    unit = run.child("trial", run.dir / "trials" / "t", meta_file="trial.json")
    run.client.create_run(run.experiment_id, run_name="nested", tags={"mlflow.parentRunId": unit.run_id})
    write_state(unit.dir / "train", status="running", mlflow_run_id=unit.run_id)


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_an_interrupt_or_a_failure_leaves_nothing_running(tmp_path, stop):
    from raycpt.runs.run import command_run

    root = tmp_path / "runs"
    with pytest.raises(stop):
        with command_run(_cfg(root), "sweep") as run:
            _open_unit_with_nested_run(run)
            raise stop("stopped")
    want = "KILLED" if stop is KeyboardInterrupt else "FAILED"
    assert _statuses(root) == {run.dir.name: want, "trial": want, "nested": want}
    assert _running_files(run.dir) == []
    assert json.loads((run.dir / "trials" / "t" / "train" / "state.json").read_text())["status"] == \
        ("interrupted" if stop is KeyboardInterrupt else "failed")


def _killed_command(tmp_path: Path) -> Path:
    """A command SIGKILLed mid-run in a process of its own (nothing of it can end its runs): the run folder."""
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_run_ends import _cfg, _open_unit_with_nested_run
        from raycpt.runs.run import command_run
        from pathlib import Path
        with command_run(_cfg(Path({str(tmp_path / 'runs')!r})), "sweep") as run:
            run.log_metrics({{"loss": 1.5}}, step=1)
            _open_unit_with_nested_run(run)
            print(run.dir, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == -9, out.stderr[-2000:]
    run_dir = Path(out.stdout.strip().splitlines()[-1])
    assert set(_statuses(tmp_path / "runs").values()) == {"RUNNING"}  # what a kill leaves
    assert json.loads((run_dir / "state.json").read_text())["status"] == "running"
    return run_dir


def test_the_sync_a_killed_command_advises_ends_every_run_it_left(tmp_path, capsys):
    from raycpt.entry import main

    run_dir = _killed_command(tmp_path)
    assert main(["runs", "sync", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "status FAILED" in out and "ended without recording how" in out, out
    assert _statuses(tmp_path / "runs") == {run_dir.name: "FAILED", "trial": "FAILED", "nested": "FAILED"}
    state = json.loads((run_dir / "state.json").read_text())
    assert state["status"] == "failed" and "ended without recording how" in state["error"]
    assert _running_files(run_dir) == []  # the unit's training folder says failed too


def test_a_resume_of_a_killed_command_ends_every_run_it_left(tmp_path):
    from raycpt.runs.run import command_run

    run_dir = _killed_command(tmp_path)
    with command_run(_cfg(tmp_path / "runs"), "sweep", resume=True) as run:
        assert run.dir == run_dir
    assert set(_statuses(tmp_path / "runs").values()) == {"FINISHED"}
    assert _running_files(run_dir) == []


def test_a_live_command_is_not_ended_by_a_sync(tmp_path):
    from raycpt.runs.folder import owner, owner_gone

    assert owner_gone({"status": "running", "owner": owner()}) is None  # this process: alive
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = owner_gone({"status": "running", "owner": {**owner(), "pid": int(dead.stdout)}})
    assert gone and f"pid {int(dead.stdout)}" in gone


# ------------------------------------------------------------------------------------- the interrupt line
@dataclass(frozen=True)
class Done:
    name: str

    def run(self, trial) -> dict:
        return {"name": self.name}


def test_the_interrupt_line_names_only_the_trials_without_a_result(tmp_path):
    from raycpt.jobs.grid import unfinished

    for name in ("base", "train_shallow-r0.5"):  # finished: their result.json is on disk
        (tmp_path / name).mkdir()
        write_sealed_json(tmp_path / name / "result.json", {"name": name})
    (tmp_path / "full").mkdir()  # started, never finished
    names = ["base", "full", "train_shallow-r0.5", "train_deep-r0.5"]
    results, missing = unfinished(tmp_path, names, {})  # an interrupt: the driver collected nothing
    assert missing == ["full", "train_deep-r0.5"]
    assert results == {"base": {"name": "base"}, "train_shallow-r0.5": {"name": "train_shallow-r0.5"}}
    results, missing = unfinished(tmp_path, names, {"full": {"name": "full"}, "train_deep-r0.5": {"x": 1}})
    assert missing == [] and results["full"] == {"name": "full"}


def test_an_interrupt_after_every_trial_finished_says_so(tmp_path, monkeypatch):
    from raycpt.config import config_from_dict
    from raycpt.jobs import grid as grid_mod
    from raycpt.runs.run import command_run

    real = grid_mod.run_trial

    def trial_then_interrupt(config):  # the SIGTERM that lands in the grid's wind-down, after the last result
        out = real(config)
        if config["spec"]["name"] == "b":
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(grid_mod, "run_trial", trial_then_interrupt)
    cfg = config_from_dict({"name": "g", "tracking": {"run_root": str(tmp_path / "runs")}})
    with pytest.raises(grid_mod.GridIncomplete) as e:
        with command_run(cfg, "sweep") as parent:
            grid_mod.run_grid(parent, grid_mod.Grid("sweep", [Done("a"), Done("b")], inline=True))
    assert e.value.status == "KILLED" and "interrupted after all 2 trials finished" in str(e.value)
    assert "did not finish" not in str(e.value)
