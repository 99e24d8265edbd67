"""``raycpt train``: one plan trained under a Ray ``TorchTrainer`` (:func:`raycpt.train.launch.run_training`),
inside the command's :func:`raycpt.runs.command_run`.

:func:`prepare` checks the train settings, the eval tasks and the memory of the plan before any run folder;
:func:`execute` trains (a finished run resumed with ``--resume`` is read back: the launcher's memo
``train_result.json``); the launcher continues the command's MLflow run.
"""

from __future__ import annotations

from raycpt.config import ExperimentConfig


def prepare(cfg: ExperimentConfig, console=None):
    """Every check before any run folder or MLflow run: the train settings, the plan and its memory estimate
    (printed to ``console``), the corpus packed (once) and big enough for this run; the packed store."""
    from raycpt.data.run_store import packed_corpus
    from raycpt.train.prepare import check_train_config, resolve_model_path
    from raycpt.train.preflight import preflight

    check_train_config(cfg)
    preflight(cfg, console)
    return packed_corpus(cfg, resolve_model_path(cfg), quiet=console is None)


def execute(cfg: ExperimentConfig, run, resume: bool = False, progress: bool = True):
    """Train in the run folder under the command's MLflow run; the :class:`raycpt.train.result.TrainResult`."""
    from raycpt.runtime import ray_session
    from raycpt.train.launch import run_training

    with ray_session(cfg.ray):
        return run_training(cfg, run, resume=resume, progress=progress)


def run_train(cfg: ExperimentConfig, resume: bool = False, console=None, progress: bool = True):
    """``raycpt train``: :func:`prepare`, then :func:`execute` in the command's run (``--resume``: the newest
    train run of this config, refused in one line when its saved settings differ or its newest checkpoint was
    trained on another pack of the corpus)."""
    from raycpt.runs import command_run
    from raycpt.train.resume import check_resume_run

    store = prepare(cfg, console)
    with command_run(cfg, "train", resume=resume, run_name=f"train-{cfg.name}",
                     on_open=(lambda d: check_resume_run(d, cfg, store)) if resume else None) as run:
        return execute(cfg, run, resume=resume, progress=progress)
