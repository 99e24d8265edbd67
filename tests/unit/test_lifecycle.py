"""Every command runs under one lifecycle (``raycpt.runs.run.command_run``): it ends FINISHED on success, FAILED on
an error, KILLED on Ctrl-C and on SIGTERM, with every child run it left RUNNING ended the same way and nothing
left RUNNING, in a real SQLite MLflow store; ``state.json`` says so too.

Each command runs through the real CLI (``raycpt.entry.main``) with its real ``prepare`` (tiny models, tiny
settings); its job's ``execute`` (the row's :class:`raycpt.jobs.job.Job`) is replaced by a stub that opens a child run under the command's run (as trials and
per-model evaluations do) and then succeeds, raises, raises KeyboardInterrupt or sends this process SIGTERM -
the fault injected right after the run opens, so the test needs no Ray and takes seconds per case."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
import types
from pathlib import Path

import pytest
import yaml

from tiny import save_tiny

JOBS = ("sweep", "contribution", "hybrid run", "trace", "compare", "eval", "train")
OUTCOMES = {"success": ("FINISHED", "finished", 0), "error": ("FAILED", "failed", 2),
            "ctrl-c": ("KILLED", "interrupted", 130), "sigterm": ("KILLED", "interrupted", 130)}


class Injected(Exception):
    pass


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return str(save_tiny(root / "a", seed=1)), str(save_tiny(root / "b", seed=2))


def _argv(command: str, cfg: Path, models) -> list[str]:
    return {"sweep": ["sweep", str(cfg), "--splits", "0.5"], "contribution": ["contribution", str(cfg)],
            "hybrid run": ["hybrid", "run", str(cfg)], "trace": ["trace", str(cfg), "--splits", "0.5"],
            "compare": ["compare", str(cfg), *models], "eval": ["eval", str(cfg)], "train": ["train", str(cfg)]}[command]


def _config(tmp_path: Path, model: str) -> Path:
    cfg = {"name": "life", "model": {"ref": model}, "data": {"seq_len": 32, "max_documents": 100},
           "trace": {"max_prompts": 4, "batch_size": 4, "top_k": 5},
           "train": {"max_steps": 1, "micro_batch_size": 2}, "sweep": {"heldout_docs": 0},
           "eval": {"tasks": ["wordnet_mc"], "modes": ["logit"], "limit": 4, "batch_size": 4},
           "compare": {"max_prompts": 4, "max_len": 16}, "tracking": {"run_root": str(tmp_path / "runs")},
           "hybrid": {"depth": 4, "new_kind": "mamba2"}}
    path = tmp_path / "life.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _stub(outcome: str):
    def execute(*args, **kwargs):
        run = next(a for a in list(args) + list(kwargs.values()) if hasattr(a, "run_id") and hasattr(a, "client"))
        run.client.create_run(run.experiment_id, run_name="child", tags={"mlflow.parentRunId": run.run_id})
        if outcome == "error":
            raise Injected("boom")
        if outcome == "ctrl-c":
            raise KeyboardInterrupt
        if outcome == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)  # the handler interrupts this
            raise AssertionError("SIGTERM did not interrupt the command")
        return types.SimpleNamespace()

    return execute


@pytest.mark.parametrize("outcome", list(OUTCOMES))
@pytest.mark.parametrize("command", list(JOBS))
def test_every_command_ends_its_runs_on_every_exit_path(command, outcome, models, tmp_path, monkeypatch, capsys):
    from mlflow.tracking import MlflowClient

    from raycpt.cli import COMMANDS
    from raycpt.entry import main

    status, state, code = OUTCOMES[outcome]
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(COMMANDS[command].job.resolve(), "execute", _stub(outcome))
    monkeypatch.setitem(COMMANDS, command, dataclasses.replace(COMMANDS[command], render=lambda result, console: None))
    if outcome == "error":  # an unexpected error: the CLI lets it through, after the run has ended
        with pytest.raises(Injected):
            main(_argv(command, _config(tmp_path, models[0]), models))
    else:
        assert main(_argv(command, _config(tmp_path, models[0]), models)) == code, capsys.readouterr().err
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("raycpt").experiment_id])
    top = [r for r in runs if r.data.tags.get("raycpt.command") and "mlflow.parentRunId" not in r.data.tags]
    assert len(top) == 1 and len(runs) == 2, [(r.info.run_name, r.info.status) for r in runs]
    assert {r.info.status for r in runs} == {status}  # the command's run and its child; nothing RUNNING
    run_dir = next((tmp_path / "runs").glob(f"{command.split()[0]}-life-*"))
    saved = json.loads((run_dir / "state.json").read_text())
    assert saved["status"] == state and saved["mlflow_run_id"] == top[0].info.run_id
    assert signal.getsignal(signal.SIGTERM) == before  # the command's SIGTERM handler is gone again


def test_a_folder_that_never_got_its_mlflow_run_is_not_the_newest_for_resume(tmp_path):
    from raycpt.config import load_config
    from raycpt.runs.folder import OPENING, open_run_dir, write_state
    from raycpt.runs.location import locate
    from raycpt.runs.run import command_run

    cfg = load_config(None, [f"tracking.run_root={tmp_path}"])
    with command_run(cfg, "train") as run:
        started = run.run_dir
    time.sleep(0.05)
    fresh = load_config(None, [f"tracking.run_root={tmp_path}"])
    stillborn = open_run_dir(fresh, "train", locate(fresh.tracking))
    write_state(stillborn, status=OPENING)  # what a command killed before its MLflow run existed leaves
    again = load_config(None, [f"tracking.run_root={tmp_path}"])
    assert open_run_dir(again, "train", locate(again.tracking), resume=True) == started
