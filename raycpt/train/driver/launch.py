"""``run_training(cfg)``: validate, pack (or reuse) the corpus, launch the ``TorchTrainer``, collect the result.

Order of work (so bad input ends with one line and no MLflow run): resolve the model on the driver
-> build the plan on a weightless (meta-device) copy of the model -> check ``data.seq_len``
against the model's position limit -> the packed-token store of the corpus (packed once per
corpus/tokenizer/seq_len, reused by every later run; empty or too small -> error) -> only then
open the MLflow run and call ``TorchTrainer.fit()``.

The trainer: ``ScalingConfig(num_workers, use_gpu, resources_per_worker={"CPU": cpus_per_worker})``
``RunConfig(name=<unique per attempt>, storage_path=<run_dir>/ray, FailureConfig(max_failures),
CheckpointConfig(num_to_keep))``, no Ray Datasets: each worker memory-maps the store and reads its
own share (:mod:`raycpt.data.stream`). It never calls ``ray.init``: the CLI
wraps it in :func:`raycpt.runtime.ray_session`, and inside a Ray Tune function trainable (Train V2
runs a TorchTrainer launched from a trial) it uses the cluster it is already on.

``resume=True`` picks the newest complete checkpoint under ``<run_dir>/ray`` and passes it to the
workers (``resume_from``; Ray's own ``resume_from_checkpoint`` is deprecated), continues the same
MLflow run (its id is kept in ``state.json``), and returns at once when the run had finished.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig, save_config
from raycpt.data.run_store import packed_corpus, replay_corpus
from raycpt.errors import RaycptError, environment_error
from raycpt.io import atomic_write_json, seal_path
from raycpt.models.shards import ensure_base_shards
from raycpt.report.progress import StepProgress
from raycpt.report.train import plot_loss_curve, read_events, read_step_records
from raycpt.runs.folder import ended_state, read_state, write_state
from raycpt.runs.run import TRAINING_SECTIONS, config_params
from raycpt.strategies import LayerPlan
from raycpt.runs.lost import adopt_lost
from raycpt.train.worker.callbacks import callbacks_for
from raycpt.train.ckpt.checkpoint import weights_dtype
from raycpt.train.driver.failures import raycpt_failure_policy
from raycpt.train.worker.loop import STATUS_FILE, train_loop_per_worker
from raycpt.train.worker.spec import StoreRef, TrackingTarget, WorkerSpec
from raycpt.train.ckpt.manifest import read_manifest
from raycpt.train.worker.metrics_log import METRICS_FILE
from raycpt.train.driver.prepare import check_train_config, local_mode, prepare_plan, resolve_model_path
from raycpt.train.driver.publish import drop_checkpoints, prune_checkpoints, publish_model, sweep_leftovers, verify_model_folder
from raycpt.train.driver.result import (TrainResult, read_json, result_from_files, start_pid, median_tokens_per_s,
                                 final_metrics, peak_of, per_step_trainable)
from raycpt.train.driver.resume import check_resume_data, latest_checkpoint
from raycpt.train.worker.evaluation import EVAL_RESULT_FILE, EvalRequest

FINAL_MODEL = "final_model"
log = logging.getLogger(__name__)


# ------------------------------------------------------------------------------------ launch

def _faults_from_env() -> dict:
    text = os.environ.get("RAYCPT_FAULTS")
    if not text:
        return {}
    try:
        return dict(json.loads(text))
    except (ValueError, TypeError):
        raise RaycptError(f"RAYCPT_FAULTS is not a JSON object: {text!r}") from None


@dataclass
class _Prepared:
    """What :func:`run_training` checked and built before any MLflow run exists."""

    model_path: str
    plan: LayerPlan
    counts: dict
    resume_from: Optional[str]
    resumed_step: Optional[int]
    store: object
    """The packed-token store (:class:`raycpt.data.store.StoreInfo`)."""
    n_blocks: int
    replay_store: object = None
    """The replay corpus's packed store (``data.replay``), or None."""


def run_training(cfg: ExperimentConfig, run, *, run_dir: Optional[Path] = None, resume: bool = False,
                 name: Optional[str] = None, progress: bool = False, faults: Optional[dict] = None,
                 callbacks: Optional[list] = None, evaluate: Optional[EvalRequest] = None,
                 in_process: bool = False) -> TrainResult:
    """Train ``cfg.model`` with ``cfg.plan`` on ``cfg.data`` under a Ray ``TorchTrainer``, recording into ``run``.

    ``run`` (a :class:`raycpt.runs.run.Run`: the ``raycpt train`` command's, or a grid trial's child) receives the
    params, metrics and files, and this function opens and ends no run; ``run_dir`` is the training folder (default
    the run's folder; a trial trains in ``<trial>/train``): the one lifecycle is the caller's (``raycpt train``'s
    job, :mod:`raycpt.jobs.train`, or the grid's trial).
    ``evaluate`` (an :class:`EvalRequest`) makes the workers evaluate the final weights with ``cfg.eval`` (each its
    share of the questions, gathered on rank 0) in the worker right after training (not with FSDP); read it with
    :func:`final_evaluation`. Needs Ray. ``in_process`` (a grid trial): a run of one CPU worker runs in this
    process, Train V2's local mode (:func:`local_mode`), instead of starting a worker group for it.

    The steps: :func:`_open_run` (the folder; a finished run resumed returns its saved result) ->
    :func:`_prepare` (validate, plan, checkpoint to resume, corpus) -> :func:`_log_start`, :func:`_fit` (the
    ``TorchTrainer``), :func:`_check_status` (NaN stop), :func:`_publish` (``final_model/``, pruning),
    :func:`_summarize` (loss curve, metrics, result)."""
    import ray

    if not ray.is_initialized():
        raise RuntimeError("run_training needs Ray: call it inside raycpt.runtime.ray_session(cfg.ray)")
    return _train_into(cfg, run, Path(run_dir) if run_dir is not None else run.dir, resume, name=name,
                       progress=progress, faults=faults, callbacks=callbacks, evaluate=evaluate, in_process=in_process)


def _train_into(cfg: ExperimentConfig, run, run_dir: Path, resume: bool, name=None, progress=False, faults=None,
                callbacks=None, evaluate=None, in_process=False) -> TrainResult:
    t_start, where = time.time(), run.location  # the command's, resolved once where it started
    state = _open_run(cfg, where, run_dir, resume)
    if resume and state.get("status") == "finished" and (run_dir / FINAL_MODEL / "config.json").is_file():
        why = verify_model_folder(run_dir / FINAL_MODEL)
        if why is None:
            return result_from_files(run_dir, state, read_step_records(run_dir / METRICS_FILE))
        log.warning("warning: %s fails its manifest check (%s): publishing it again from the last verified checkpoint",
                    run_dir / FINAL_MODEL, why)
    prep = _prepare(cfg, where.root, run_dir, resume, progress)  # every bad input fails here, before any record
    attempt = int(state.get("attempts", 0)) + 1
    ray_name = f"{name or 'train'}-{run_dir.name}-a{attempt}-{uuid.uuid4().hex[:6]}"
    (run_dir / STATUS_FILE).unlink(missing_ok=True)
    with ended_state(run_dir):
        write_state(run_dir, mlflow_run_id=run.run_id, attempts=attempt, status="running", ray_name=ray_name,
                    model_path=prep.model_path, plan=prep.plan.to_dict(), prepare_s=round(time.time() - t_start, 3))
        _log_start(cfg, run, run_dir, prep)
        spec = _worker_spec(cfg, run_dir, prep, run, ray_name, faults, callbacks, evaluate,
                            local_mode(cfg, in_process))
        clock = {"fit_start": time.time(), "local_mode": spec.local_mode}  # the phases' wall times
        _fit(cfg, run_dir, prep, spec, ray_name, progress, t_start)
        clock["fit_end"] = time.time()
        adopt_lost(run_dir, clock["fit_start"])  # a tracking server the workers found gone: the rest is local only
        _check_status(run_dir)
        ckpt_dir = _publish(run_dir, cfg.train.keep_checkpoints, _base_shards(cfg, where, prep),
                            link=not cfg.train.keep_finished_checkpoints)
        clock["published"] = time.time()
        res = _summarize(cfg, run, run_dir, prep, ckpt_dir, t_start)
        write_state(run_dir, status="finished", wall_s=res.wall_s, events=len(read_events(run_dir / METRICS_FILE)),
                    clock={**clock, "summarized": time.time(), "start": t_start})
    if not cfg.train.keep_finished_checkpoints:
        drop_checkpoints(run_dir)
    return res


def _base_shards(cfg: ExperimentConfig, where, prep: "_Prepared"):
    """With ``train.publish: reference``, a function of the checkpoint's weights dtype giving the base model's
    per-layer shards folder (written once per run root); None = publish by copy."""
    if cfg.train.publish != "reference":
        return None
    return lambda dtype: ensure_base_shards(prep.model_path, where.base_shards, dtype)


def _open_run(cfg: ExperimentConfig, where, run_dir: Path, resume: bool) -> dict:
    """The training folder (made; config saved unless a resume keeps the one it was made with; paths absolute:
    ``where``'s, the command's :class:`raycpt.runs.location.RunLocation`) and its ``state.json``."""
    where.pin(cfg.tracking)
    run_dir.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(run_dir / FINAL_MODEL)  # a publish killed mid-way (kill -9) left its hidden copy
    if not (resume and (run_dir / "config.yaml").is_file()):  # a resume keeps the config it was made with
        save_config(cfg, run_dir / "config.yaml")
    return read_state(run_dir)


def _prepare(cfg: ExperimentConfig, root: Path, run_dir: Optional[Path], resume: bool,
             progress: bool = False) -> _Prepared:
    """Validate the train settings, resolve the model, build the plan, find the checkpoint to resume,
    find (or pack) the corpus's packed store: every bad input fails here, before any MLflow run."""
    check_train_config(cfg)
    model_path = resolve_model_path(cfg)
    plan, counts, _ = prepare_plan(cfg, model_path)
    resume_from, resumed_step = None, None
    if resume:
        found = latest_checkpoint(run_dir, report=True)
        if found is not None:
            resumed_step, ckpt = found
            resume_from = str(ckpt)
    store = packed_corpus(cfg, model_path, root, quiet=not progress)
    replay = replay_corpus(cfg, model_path, root, quiet=not progress)
    if resume_from is not None:
        check_resume_data(Path(resume_from), store, replay)
    return _Prepared(model_path=model_path, plan=plan, counts=counts, resume_from=resume_from,
                     resumed_step=resumed_step, store=store, n_blocks=store.num_blocks, replay_store=replay)


def _log_start(cfg: ExperimentConfig, run, run_dir: Path, prep: _Prepared) -> None:
    """The config, the plan and the corpus size on the run (a value the run has already is kept: a resumed run
    whose overrides changed a param)."""
    run.log_params(config_params(cfg, TRAINING_SECTIONS))
    run.set_tags({"raycpt.plan": prep.plan.describe()[:5000], "raycpt.run_dir": str(run_dir)})
    run.log_params({"model_path": prep.model_path[:500], "corpus_blocks": prep.n_blocks,
                    "tokens_per_step": cfg.train.num_workers * cfg.train.grad_accum
                    * cfg.train.micro_batch_size * cfg.data.seq_len})


def _worker_spec(cfg: ExperimentConfig, run_dir: Path, prep: _Prepared, run, ray_name: str,
                 faults: Optional[dict], callbacks: Optional[list], evaluate: Optional[EvalRequest],
                 in_process: bool) -> WorkerSpec:
    """The one value the workers get (:class:`raycpt.train.worker.spec.WorkerSpec`); an old evaluation file is
    removed. In local mode with ``train.publish: reference`` the checkpoints link the frozen layers too."""
    base_shards = None
    if in_process and _base_shards(cfg, run.location, prep):
        dtype = str(weights_dtype(cfg.train.precision, "cpu")).replace("torch.", "")
        base_shards = str(_base_shards(cfg, run.location, prep)(dtype))
    if evaluate:
        (Path(evaluate.out_dir) / EVAL_RESULT_FILE).unlink(missing_ok=True)
        seal_path(Path(evaluate.out_dir) / EVAL_RESULT_FILE).unlink(missing_ok=True)
    return WorkerSpec(
        cfg=cfg, model_path=prep.model_path, plan=prep.plan, run_dir=str(run_dir),
        tracking=TrackingTarget(run.location.uri, run.run_id if run.live() else None, str(run.dir)),
        resume_from=prep.resume_from, checkpoint_root=str(run_dir / "ray" / ray_name),
        store=StoreRef.of(prep.store), replay=StoreRef.of(prep.replay_store) if prep.replay_store is not None else None,
        callbacks=tuple(list(callbacks or []) + callbacks_for(cfg, prep.model_path)), evaluate=evaluate,
        faults={**_faults_from_env(), **(faults or {})}, local_mode=in_process, base_shards=base_shards)


def _fit(cfg: ExperimentConfig, run_dir: Path, prep: _Prepared, spec: WorkerSpec, ray_name: str, progress: bool,
         t_start: float) -> None:
    """Build the ``TorchTrainer`` and run it with the step bar; a worker's RaycptError stays one line."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    t = cfg.train
    resources = {"CPU": t.cpus_per_worker}
    if t.use_gpu:
        resources["GPU"] = 1
    scaling = ScalingConfig(num_workers=0) if spec.local_mode else \
        ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu, resources_per_worker=resources)
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config={"spec": spec}, scaling_config=scaling,
        run_config=RunConfig(name=ray_name, storage_path=str(run_dir / "ray"),
                             failure_config=FailureConfig(max_failures=t.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=t.keep_checkpoints)),
    )
    with StepProgress(run_dir / METRICS_FILE, t.max_steps, prep.resumed_step or 0, progress):
        try:
            t_fit = time.time()
            with raycpt_failure_policy():  # a full disk or an unwritable root is not retried: one attempt
                trainer.fit()
            log.info("fit: %.1fs (prepare %.1fs)", time.time() - t_fit, t_fit - t_start)
        except Exception as e:  # noqa: BLE001 - Ray wraps worker errors; surface the cause in one line
            err = _training_error(e)
            if err is e:
                raise
            raise err from None


def _check_status(run_dir: Path) -> None:
    """One line (RaycptError) when the workers stopped on a non-finite loss or gradient norm."""
    status = read_json(run_dir / STATUS_FILE)
    if status.get("status") == "nonfinite":
        last = latest_checkpoint(run_dir)
        where = f"step {last[0]} at {last[1]}" if last else "none (no checkpoint was written before it)"
        write_state(run_dir, status="nonfinite")
        what = (f"the weights are not finite after its update ({status['value']}; is train.lr too high?)"
                if status["what"] == "weights" else f"the {status['what']} is {status['value']}")
        raise RaycptError(f"training stopped at step {status['step']}: {what}; the last good checkpoint is {where}")


def _publish(run_dir: Path, keep: int, base_shards=None, link: bool = False) -> Path:
    """Publish the newest checkpoint's model as ``final_model/`` and prune old checkpoints; the checkpoint.
    ``base_shards``: see :func:`_base_shards` (None = a verified copy, or reflink). ``link``: the checkpoints are
    deleted when the run finishes, so a local-mode checkpoint's files may become the published ones (hard links,
    :func:`raycpt.train.ckpt.checkpoint.publish_model`)."""
    found = latest_checkpoint(run_dir)
    ckpt_dir = found[1] if found else None
    if ckpt_dir is None:
        raise RuntimeError(f"training finished but left no checkpoint under {run_dir / 'ray'}")
    shards = base_shards((read_manifest(ckpt_dir) or {}).get("weights_dtype", "float32")) if base_shards else None
    published = publish_model(ckpt_dir, run_dir / FINAL_MODEL, base_shards=shards, link=link)
    log.info("final_model: %d files, %.0f MB by %s in %.2fs", published["files"], published["bytes"] / 1e6,
             published["how"], published["seconds"])
    prune_checkpoints(run_dir, keep)
    return ckpt_dir


def _summarize(cfg: ExperimentConfig, run, run_dir: Path, prep: _Prepared, ckpt_dir: Path,
               t_start: float) -> TrainResult:
    """The loss curve, final metrics and ``train_result.json`` from the workers' step records."""
    final_dir, plan = run_dir / FINAL_MODEL, prep.plan
    records, events = read_step_records(run_dir / METRICS_FILE), read_events(run_dir / METRICS_FILE)
    steps = [int(r["step"]) for r in records]
    losses = [float(r["loss"]) for r in records]
    times = [float(r["step_time_s"]) for r in records]
    tok_s = median_tokens_per_s(records)
    png = plot_loss_curve(steps, losses, run_dir / "loss_curve.png",
                          title=f"{cfg.name}: {plan.name} [{plan.layer_map()}]")
    wall = time.time() - t_start  # this invocation (a resumed run: from the resume on)
    res = TrainResult(run_dir=run_dir, final_model_dir=final_dir, losses=losses, steps=steps, tokens_per_s=tok_s,
                      wall_s=wall, trainable_params=prep.counts["trainable"], frozen_params=prep.counts["frozen"],
                      mlflow_run_id=run.run_id, plan=plan.to_dict(), last_checkpoint=ckpt_dir,
                      resumed_from_step=prep.resumed_step, step_times=times, peak_memory_mb=peak_of(records),
                      trainable_per_step=per_step_trainable(plan, events), pid=start_pid(events))
    atomic_write_json(run_dir / "train_result.json", res.to_dict())  # the run folder first, then the store
    run.log_artifact(png)
    run.log_params({"final_model_dir": str(final_dir)})
    run.set_tags({"raycpt.final_model_dir": str(final_dir)})
    run.log_metrics(final_metrics(res))
    return res


def _training_error(e: Exception) -> Exception:
    """Ray's TrainingFailedError carries the worker's exception; a RaycptError inside stays one line."""
    seen = set()
    cur: Optional[BaseException] = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, RaycptError):
            return cur
        if environment_error(cur) is not None:  # a full disk / unwritable folder in a worker: one line
            return environment_error(cur)
        nxt = getattr(cur, "cause", None) or cur.__cause__
        if nxt is None:
            errs = getattr(cur, "worker_failures", None)
            if isinstance(errs, dict) and errs:
                nxt = next(iter(errs.values()))
        cur = nxt
    return e


