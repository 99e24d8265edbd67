"""``raycpt train``: one plan trained under a Ray ``TorchTrainer`` (:func:`raycpt.train.driver.launch.run_training`),
inside the command's :func:`raycpt.runs.run.command_run`; and ``raycpt plan show``, the plan's layer map without training.

:func:`prepare` checks the train settings, the eval tasks and the memory of the plan before any run folder;
:func:`execute` trains (a finished run resumed with ``--resume`` is read back: the launcher's memo
``train_result.json``); the launcher continues the command's MLflow run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from raycpt.config import ExperimentConfig
from raycpt.jobs.job import NoRun, Options, RunSpec, Steps
from raycpt.runtime import ray_session
from raycpt.strategies import plan_table
from raycpt.data.run_store import packed_corpus, replay_corpus
from raycpt.train.driver.launch import run_training
from raycpt.train.driver.prepare import check_train_config, prepare_plan, resolve_model_path
from raycpt.train.driver.resume import check_resume_run
from raycpt.train.driver.preflight import preflight


@dataclass
class TrainPlan:
    """What :func:`prepare` checked: the config and the packed store of its corpus."""

    cfg: ExperimentConfig
    store: Any
    replay: Any = None
    """The replay corpus's packed store (``data.replay``), or None."""


def prepare(cfg: ExperimentConfig, options: Options) -> TrainPlan:
    """Every check before any run folder or MLflow run: the train settings, the plan and its memory estimate
    (printed to the console), the corpus packed (once) and big enough for this run; the packed store."""
    check_train_config(cfg)
    preflight(cfg, options.console)
    model_path, quiet, root = resolve_model_path(cfg), options.console is None, options.located(cfg, check=False).root
    return TrainPlan(cfg, packed_corpus(cfg, model_path, root, quiet=quiet),
                     replay_corpus(cfg, model_path, root, quiet=quiet))


def run_spec(plan: TrainPlan, options: Options) -> RunSpec:
    """``--resume``: the newest train run of this config, refused in one line when its newest checkpoint was trained
    on another pack of either corpus or (unless ``--accept-changes``) its saved settings differ."""
    cfg, accept = plan.cfg, bool(options.get("accept_changes"))
    return RunSpec(cfg, "train", name=f"train-{cfg.name}",
                   on_open=(lambda d: check_resume_run(d, cfg, plan.store, plan.replay, accept))
                   if options.resume else None)


def execute(plan: TrainPlan, run, options: Options):
    """Train in the run folder under the command's MLflow run; the :class:`raycpt.train.driver.result.TrainResult`."""
    with ray_session(plan.cfg.ray):
        return run_training(plan.cfg, run, resume=options.resume, progress=options.progress)


TRAIN = Steps(prepare, execute, run_spec)


def show_plan(cfg: ExperimentConfig, options: Options):
    """``raycpt plan show``: ``(title, plan table)`` of ``cfg.plan`` on ``cfg.model`` (no training); the memory
    estimate is printed."""
    path = resolve_model_path(cfg)
    plan, _counts, skeleton = prepare_plan(cfg, path)
    tab = plan_table(skeleton, plan)
    preflight(cfg, options.console)
    return f"plan {plan.name} on {cfg.model.ref}", tab


PLAN_SHOW = NoRun(show_plan)
