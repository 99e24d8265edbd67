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

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig, config_to_dict, save_config
from raycpt.errors import RaycptError, environment_error
from raycpt.models.stack import tied_embeddings
from raycpt.strategies import LayerPlan, build_plan
from raycpt.train.manifest import find_checkpoints, read_manifest
from raycpt.train.publish import publish_model, sweep_leftovers, verify_model_folder
from raycpt.train.worker_eval import EVAL_RESULT_FILE, EvalRequest
from raycpt.train.parallel import check_parallel, uses_fsdp
from raycpt.tracking import adopt_lost

FINAL_MODEL = "final_model"
log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    """What a training run produced."""

    run_dir: Path
    final_model_dir: Path
    losses: list[float]
    steps: list[int]
    tokens_per_s: float
    wall_s: float
    trainable_params: int
    frozen_params: int
    mlflow_run_id: Optional[str]
    plan: dict
    last_checkpoint: Optional[Path] = None
    resumed_from_step: Optional[int] = None
    step_times: list[float] = field(default_factory=list)
    reused: bool = False
    """True when ``--resume`` found the run finished and re-ran nothing (the figures are the saved ones)."""
    peak_memory_mb: Optional[float] = None
    """The largest per-step peak memory of rank 0 (:mod:`raycpt.train.peakmem`); None where it cannot be read."""
    trainable_per_step: Optional[int] = None
    """LISA: the parameters one step trains (γ layers + the always-trained ones); ``trainable_params`` counts
    every layer a draw can pick. None for other plans (every step trains ``trainable_params``)."""
    pid: Optional[int] = None
    """Rank 0's process id (its start event): trials that share a process (Ray Train's local mode in one
    reused Tune actor) share its resident memory, so a later trial's peak includes what earlier ones left."""

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        for k in ("run_dir", "final_model_dir", "last_checkpoint"):
            d[k] = None if d[k] is None else str(d[k])
        return d


# ------------------------------------------------------------------------------------ model, plan

def resolve_model_path(cfg: ExperimentConfig) -> str:
    """The local folder of ``cfg.model.ref`` (resolved once, on the driver); for ``plan.name=expand`` the
    expanded model built from it (:func:`raycpt.models.hybrid.expanded_model_folder`, cached)."""
    from raycpt.models.sources import resolve_model_path as resolve

    path = resolve(cfg.model)
    if cfg.plan.name == "expand":
        from raycpt.models.hybrid_expand import expand_groups, expanded_model_folder
        from transformers import AutoConfig

        expand_groups(AutoConfig.from_pretrained(path).num_hidden_layers, cfg.plan.expand_blocks)  # one line
        return str(expanded_model_folder(path, cfg.plan.expand_blocks, cfg.model.cache_dir))
    return path


def model_skeleton(model_path: str):
    """The model built on the meta device from its config: structure and counts, no weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(conf)
    return model


def position_limit(model_config) -> Optional[int]:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        v = getattr(model_config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def prepare_plan(cfg: ExperimentConfig, model_path: str) -> tuple[LayerPlan, dict, object]:
    """Build and check the plan on a meta-device copy; ``(plan, counts, model)``.

    Raises RaycptError for a bad plan or a ``data.seq_len`` beyond the model's position limit."""
    from raycpt.models.stack import LayerStack
    from raycpt.strategies import apply_plan

    model = model_skeleton(model_path)
    stack = LayerStack.of(model)
    plan = build_plan(cfg.plan, stack.num_layers, tied_embeddings=tied_embeddings(stack))
    limit = position_limit(model.config)
    if limit is not None and cfg.data.seq_len > limit:
        raise RaycptError(f"data.seq_len={cfg.data.seq_len} is beyond this model's limit of {limit} positions "
                          f"(max_position_embeddings); use data.seq_len <= {limit}")
    check_plan_parallel(plan, cfg.train)
    if plan.adapter == "lora":
        from raycpt.models.adapters import inject_lora

        inject_lora(model, plan)  # the rank and target checks, on the weightless copy
    counts = apply_plan(model, plan)
    return plan, counts, model


def check_plan_parallel(plan: LayerPlan, tcfg) -> None:
    """LoRA under DDP or one worker (not FSDP); LISA on one worker (DDP's buckets are fixed when it wraps,
    and LISA changes what trains every interval)."""
    if plan.adapter == "lora" and uses_fsdp(tcfg.distributed, tcfg.num_workers):
        raise RaycptError("plan.adapter=lora runs under train.distributed=ddp (or one worker), not fsdp")
    if plan.is_lisa and tcfg.num_workers > 1:
        raise RaycptError(f"plan.name=lisa trains on one worker (train.num_workers={tcfg.num_workers}): "
                          "DDP fixes its gradient buckets when it wraps the model, and LISA redraws every interval")


def check_train_config(cfg: ExperimentConfig) -> None:
    t = cfg.train
    check_parallel(t.distributed, t.num_workers)
    check_worker_cpus(cfg)
    if t.use_gpu:
        import ray

        if ray.is_initialized() and ray.cluster_resources().get("GPU", 0) < t.num_workers:
            raise RaycptError(f"train.use_gpu=true with train.num_workers={t.num_workers}, but the Ray cluster has "
                              f"{int(ray.cluster_resources().get('GPU', 0))} GPU(s)")


def check_worker_cpus(cfg: ExperimentConfig) -> None:
    """One line, before Ray Train waits for them, when a local Ray can never hold the run's workers:
    ``train.num_workers`` x ``train.cpus_per_worker`` beyond its CPUs (Ray Train would wait at "starting
    workers" forever). A cluster (``ray.address`` / ``RAY_ADDRESS``) may grow, so it is not judged."""
    import ray

    from raycpt.runtime import cluster_address

    if not ray.is_initialized() or cluster_address(cfg.ray):
        return
    t = cfg.train
    have = float(ray.cluster_resources().get("CPU", 0))
    need = t.num_workers * float(t.cpus_per_worker)
    if need > have + 1e-9:
        raise RaycptError(f"train.num_workers={t.num_workers} x train.cpus_per_worker={t.cpus_per_worker:g} need "
                          f"{need:g} CPUs; this Ray has {have:g} (ray.num_cpus): lower train.num_workers or "
                          "train.cpus_per_worker, or raise ray.num_cpus")


# ------------------------------------------------------------------------------------ checkpoints

def latest_checkpoint(run_dir: Path, report: bool = False) -> Optional[tuple[int, Path]]:
    """The newest verified checkpoint of any attempt of this run: (step, folder). ``report``: one
    warning line for each checkpoint that fails its manifest check (and so is skipped)."""
    failed: list = []
    cps = find_checkpoints(Path(run_dir) / "ray", failed)
    if report:
        for folder, why in failed:
            log.warning("warning: skipping checkpoint %s: %s", folder, why)
    return cps[-1] if cps else None


def prune_checkpoints(run_dir: Path, keep: int) -> list[Path]:
    """Keep the newest ``keep`` complete checkpoints over all attempts; delete the rest (Ray prunes
    only the checkpoints it registered; one cut short by a worker kill is not)."""
    complete = find_checkpoints(Path(run_dir) / "ray")
    keep_set = {p.resolve() for _, p in complete[-keep:]}
    removed = []
    for d in Path(run_dir, "ray").glob("*/checkpoint_*"):
        if d.is_dir() and d.resolve() not in keep_set:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


# ------------------------------------------------------------------------------------ launch

def _make_absolute(cfg: ExperimentConfig) -> None:
    from raycpt.tracking import run_root, tracking_uri

    cfg.tracking.run_root = str(run_root(cfg.tracking))
    cfg.tracking.uri = tracking_uri(cfg.tracking)


def _faults_from_env() -> dict:
    text = os.environ.get("RAYCPT_FAULTS")
    if not text:
        return {}
    try:
        return dict(json.loads(text))
    except (ValueError, TypeError):
        raise RaycptError(f"RAYCPT_FAULTS is not a JSON object: {text!r}") from None


# ------------------------------------------------------------------------------------ data

def pack_corpus(cfg: ExperimentConfig, model_path: str, quiet: bool = True, rebuild: bool = False):
    """The packed-token store of ``cfg.data`` (packed now when missing; one line either way unless ``quiet``).
    No corpus pass: counts are the manifest's. Whether it is big enough for a run is :func:`packed_corpus`'s."""
    from raycpt.data.pack import describe_build, describe_hit, ensure_packed
    from raycpt.tracking import run_root

    store, built = ensure_packed(cfg.data, model_path, run_root(cfg.tracking), rebuild=rebuild, progress=not quiet)
    line = describe_build(store) if built else describe_hit(store)
    log.info(line)
    if not quiet:
        print(line, flush=True)
    return store


def packed_corpus(cfg: ExperimentConfig, model_path: str, quiet: bool = True, rebuild: bool = False):
    """:func:`pack_corpus`, checked to hold at least one micro-batch per worker of this run."""
    store = pack_corpus(cfg, model_path, quiet=quiet, rebuild=rebuild)
    t = cfg.train
    need = t.num_workers * t.micro_batch_size
    if store.num_blocks < need:
        raise RaycptError(f"data.corpus {list(cfg.data.corpus)} gives only {store.num_blocks} full "
                          f"{cfg.data.seq_len}-token blocks; {t.num_workers} worker(s) x "
                          f"train.micro_batch_size={t.micro_batch_size} need at least {need} (add documents or lower "
                          "data.seq_len)")
    return store


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


def run_training(cfg: ExperimentConfig, run=None, *, run_dir: Optional[Path] = None, resume: bool = False,
                 name: Optional[str] = None, progress: bool = False, faults: Optional[dict] = None,
                 callbacks: Optional[list] = None, evaluate: Optional[EvalRequest] = None,
                 in_process: bool = False) -> TrainResult:
    """Train ``cfg.model`` with ``cfg.plan`` on ``cfg.data`` under a Ray ``TorchTrainer``, recording into ``run``.

    ``run`` (a :class:`raycpt.runs.Run`: the ``raycpt train`` command's, or a grid trial's child) receives the
    params, metrics and files, and this function opens and ends no run; ``run_dir`` is the training folder (default
    the run's folder; a trial trains in ``<trial>/train``). ``run`` None: the ``raycpt train`` lifecycle
    (:func:`raycpt.runs.command_run`) around it, after every check (``--resume``: the newest run of this name).
    ``evaluate`` (an :class:`EvalRequest`) makes the workers evaluate the final weights with ``cfg.eval`` (each its
    share of the questions, gathered on rank 0) in the worker right after training (not with FSDP); read it with
    :func:`final_evaluation`. Needs Ray. ``in_process`` (a grid trial): a run of one CPU worker runs in this
    process, Train V2's local mode (:func:`local_mode`), instead of starting a worker group for it.

    The steps: :func:`_open_run` (the folder; a finished run resumed returns its saved result) ->
    :func:`_prepare` (validate, plan, checkpoint to resume, corpus) -> :func:`_log_start`, :func:`_fit` (the
    ``TorchTrainer``), :func:`_check_status` (NaN stop), :func:`_publish` (``final_model/``, pruning),
    :func:`_summarize` (loss curve, metrics, result)."""
    import ray

    from raycpt.runs import command_run

    if not ray.is_initialized():
        raise RuntimeError("run_training needs Ray: call it inside raycpt.runtime.ray_session(cfg.ray)")
    opts = dict(name=name, progress=progress, faults=faults, callbacks=callbacks, evaluate=evaluate,
                in_process=in_process)
    if run is None:  # `raycpt train` from the library: every check first, then the command's lifecycle
        prep = None if resume else _prepare(cfg, None, False, progress)  # a resume checks its folder's checkpoint
        with command_run(cfg, "train", resume=resume, run_name=name or f"train-{cfg.name}",
                         on_open=(lambda d: check_resume_settings(d, cfg)) if resume else None) as own:
            return _train_into(cfg, own, own.dir, resume, prep=prep, **opts)
    return _train_into(cfg, run, Path(run_dir) if run_dir is not None else run.dir, resume, **opts)


def _train_into(cfg: ExperimentConfig, run, run_dir: Path, resume: bool, name=None, progress=False, faults=None,
                callbacks=None, evaluate=None, in_process=False, prep: Optional[_Prepared] = None) -> TrainResult:
    from raycpt.report.train import read_events
    from raycpt.runs import ended_state, write_state
    from raycpt.train.loop import STATUS_FILE
    from raycpt.train.metrics_log import METRICS_FILE

    t_start = time.time()
    state = _open_run(cfg, run_dir, resume)
    if resume and state.get("status") == "finished" and (run_dir / FINAL_MODEL / "config.json").is_file():
        why = verify_model_folder(run_dir / FINAL_MODEL)
        if why is None:
            return _result_from_files(run_dir, state)
        log.warning("warning: %s fails its manifest check (%s): publishing it again from the last verified checkpoint",
                    run_dir / FINAL_MODEL, why)
    prep = prep or _prepare(cfg, run_dir, resume, progress)  # every bad input fails here, before any record
    attempt = int(state.get("attempts", 0)) + 1
    ray_name = f"{name or 'train'}-{run_dir.name}-a{attempt}-{uuid.uuid4().hex[:6]}"
    (run_dir / STATUS_FILE).unlink(missing_ok=True)
    with ended_state(run_dir):
        write_state(run_dir, mlflow_run_id=run.run_id, attempts=attempt, status="running", ray_name=ray_name,
                    model_path=prep.model_path, plan=prep.plan.to_dict(), prepare_s=round(time.time() - t_start, 3))
        _log_start(cfg, run, run_dir, prep)
        loop_config = _loop_config(cfg, run_dir, prep, run, ray_name, faults, callbacks, evaluate)
        loop_config["local_mode"] = local_mode(cfg, in_process)
        if loop_config["local_mode"] and _base_shards(cfg, prep):  # checkpoints link the frozen layers too
            from raycpt.train.checkpoint import weights_dtype

            dtype = str(weights_dtype(cfg.train.precision, "cpu")).replace("torch.", "")
            loop_config["base_shards"] = str(_base_shards(cfg, prep)(dtype))
        clock = {"fit_start": time.time(), "local_mode": loop_config["local_mode"]}  # the phases' wall times
        _fit(cfg, run_dir, prep, loop_config, ray_name, progress, t_start)
        clock["fit_end"] = time.time()
        adopt_lost(run_dir, clock["fit_start"])  # a tracking server the workers found gone: the rest is local only
        _check_status(run_dir)
        ckpt_dir = _publish(run_dir, cfg.train.keep_checkpoints, _base_shards(cfg, prep),
                            link=not cfg.train.keep_finished_checkpoints)
        clock["published"] = time.time()
        res = _summarize(cfg, run, run_dir, prep, ckpt_dir, t_start)
        write_state(run_dir, status="finished", wall_s=res.wall_s, events=len(read_events(run_dir / METRICS_FILE)),
                    clock={**clock, "summarized": time.time(), "start": t_start})
    if not cfg.train.keep_finished_checkpoints:
        drop_checkpoints(run_dir)
    return res


def _base_shards(cfg: ExperimentConfig, prep: "_Prepared"):
    """With ``train.publish: reference``, a function of the checkpoint's weights dtype giving the base model's
    per-layer shards folder (written once per run root); None = publish by copy."""
    if cfg.train.publish != "reference":
        return None
    from raycpt.io import run_root
    from raycpt.models.shards import ensure_base_shards

    return lambda dtype: ensure_base_shards(prep.model_path, run_root(cfg.tracking) / "base_shards", dtype)


@contextlib.contextmanager
def base_shards_ahead(cfg: ExperimentConfig, model_path: str):
    """``with base_shards_ahead(cfg, model_path) as ready:`` - a grid whose trials run in local mode and publish by
    reference (``train.publish: reference``, set per trial by the sweep and the scan) links every trial to the
    base model's per-layer shards, written once per run root by whichever process needs them first: write them
    now, in a background thread, while the driver opens its run and Ray starts (that work leaves a core idle), and
    verify them there (their sha256s). ``ready()`` waits for them and returns the verified folders
    (:func:`raycpt.models.shards.checked_shards`, for the grid's ``shared`` dict: a trial process then trusts them
    while their files are unchanged); call it before the first trial. A failure here is the first trial's to meet
    again and report (it writes and verifies the shards itself); leaving the block waits for the thread."""
    import threading

    if not local_mode(cfg, in_process=True):
        yield lambda: {}
        return
    from raycpt.io import run_root
    from raycpt.models.shards import checked_shards, ensure_base_shards, read_shards
    from raycpt.train.checkpoint import weights_dtype

    dtype = str(weights_dtype(cfg.train.precision, "cpu")).replace("torch.", "")
    root = run_root(cfg.tracking) / "base_shards"

    def write() -> None:
        try:
            read_shards(ensure_base_shards(model_path, root, dtype))
        except Exception as e:  # noqa: BLE001 - the first trial writes them again and reports what fails
            log.debug("base shards ahead of the trials: %s", e)

    thread = threading.Thread(target=write, name="raycpt-base-shards", daemon=True)
    thread.start()

    def ready() -> dict:
        thread.join()
        return checked_shards()

    try:
        yield ready
    finally:
        thread.join()


def drop_checkpoints(run_dir: Path) -> list[Path]:
    """Delete every checkpoint of a finished run (weights and optimizer state): ``final_model/`` holds what it
    trained and nothing resumes a finished run (``train.keep_finished_checkpoints: false``)."""
    ray_dir = Path(run_dir, "ray")  # with the half-written ones a killed local-mode run left (.raycpt-ckpt-*)
    gone = [d for d in [*ray_dir.glob("*/checkpoint_*"), *ray_dir.glob("*/.raycpt-ckpt-*")] if d.is_dir()]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def _open_run(cfg: ExperimentConfig, run_dir: Path, resume: bool) -> dict:
    """The training folder (made; config saved unless a resume keeps the one it was made with; paths absolute)
    and its ``state.json``."""
    from raycpt.runs import read_state

    _make_absolute(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    sweep_leftovers(run_dir / FINAL_MODEL)  # a publish killed mid-way (kill -9) left its hidden copy
    if not (resume and (run_dir / "config.yaml").is_file()):  # a resume keeps the config it was made with
        save_config(cfg, run_dir / "config.yaml")
    return read_state(run_dir)


def _prepare(cfg: ExperimentConfig, run_dir: Optional[Path], resume: bool, progress: bool = False) -> _Prepared:
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
    store = packed_corpus(cfg, model_path, quiet=not progress)
    if resume_from is not None:
        check_resume_data(Path(resume_from), store)
    replay = replay_corpus(cfg, model_path, quiet=not progress)
    return _Prepared(model_path=model_path, plan=plan, counts=counts, resume_from=resume_from,
                     resumed_step=resumed_step, store=store, n_blocks=store.num_blocks, replay_store=replay)


def replay_corpus(cfg: ExperimentConfig, model_path: str, quiet: bool = True):
    """The packed store of ``data.replay.corpus`` (all of its documents, none held out), or None without replay."""
    r = cfg.data.replay
    if r.ratio <= 0:
        return None
    data = dataclasses.replace(cfg.data, corpus=list(r.corpus), max_documents=None, heldout_share=0.0)
    return packed_corpus(dataclasses.replace(cfg, data=data), model_path, quiet=quiet)


def _log_start(cfg: ExperimentConfig, run, run_dir: Path, prep: _Prepared) -> None:
    """The config, the plan and the corpus size on the run (a value the run has already is kept: a resumed run
    whose overrides changed a param)."""
    from raycpt.runs import config_params

    run.log_params(config_params(cfg))
    run.set_tags({"raycpt.plan": prep.plan.describe()[:5000], "raycpt.run_dir": str(run_dir)})
    run.log_params({"model_path": prep.model_path[:500], "corpus_blocks": prep.n_blocks,
                    "tokens_per_step": cfg.train.num_workers * cfg.train.grad_accum
                    * cfg.train.micro_batch_size * cfg.data.seq_len})


def _loop_config(cfg: ExperimentConfig, run_dir: Path, prep: _Prepared, run, ray_name: str,
                 faults: Optional[dict], callbacks: Optional[list], evaluate: Optional[EvalRequest]) -> dict:
    """The workers' config (:func:`raycpt.train.loop.run_loop`); an old evaluation file is removed."""
    from raycpt.train.callbacks import callbacks_for

    loop_config = {
        "cfg": config_to_dict(cfg), "model_path": prep.model_path, "plan": prep.plan.to_dict(), "run_dir": str(run_dir),
        "mlflow": {"uri": cfg.tracking.uri, "run_id": run.run_id if run.live() else None,
                   "records": str(run.dir)}, "resume_from": prep.resume_from,
        "store": str(prep.store.path), "store_build": prep.store.build_id, "store_key": prep.store.key,
        "store_identity": prep.store.identity, "checkpoint_root": str(run_dir / "ray" / ray_name), "faults": {**_faults_from_env(), **(faults or {})},
        "callbacks": list(callbacks or []) + callbacks_for(cfg, prep.model_path), "evaluate": evaluate,
    }
    if prep.replay_store is not None:
        loop_config.update(replay_store=str(prep.replay_store.path), replay_store_build=prep.replay_store.build_id)
    if evaluate:
        (Path(evaluate.out_dir) / EVAL_RESULT_FILE).unlink(missing_ok=True)
    return loop_config


def _fit(cfg: ExperimentConfig, run_dir: Path, prep: _Prepared, loop_config: dict, ray_name: str, progress: bool,
         t_start: float) -> None:
    """Build the ``TorchTrainer`` and run it with the step bar; a worker's RaycptError stays one line."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raycpt.report.progress import StepProgress
    from raycpt.train.failures import raycpt_failure_policy
    from raycpt.train.loop import train_loop_per_worker
    from raycpt.train.metrics_log import METRICS_FILE

    t = cfg.train
    resources = {"CPU": t.cpus_per_worker}
    if t.use_gpu:
        resources["GPU"] = 1
    scaling = ScalingConfig(num_workers=0) if loop_config.get("local_mode") else \
        ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu, resources_per_worker=resources)
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config=loop_config, scaling_config=scaling,
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


def local_mode(cfg: ExperimentConfig, in_process: bool) -> bool:
    """Whether the run uses Train V2's local mode (``ScalingConfig(num_workers=0)``: the same ``TorchTrainer`` and
    loop, in the calling process, no worker group): only in a process that holds the run's resources already (a
    grid trial, ``in_process``) and for one CPU worker (world size 1: nothing is distributed). A failure there
    ends the trial, which Tune retries from the last checkpoint (``train.max_failures`` counts worker restarts
    of a worker group only)."""
    t = cfg.train
    return bool(in_process) and t.num_workers == 1 and not t.use_gpu


def _check_status(run_dir: Path) -> None:
    """One line (RaycptError) when the workers stopped on a non-finite loss or gradient norm."""
    from raycpt.runs import write_state
    from raycpt.train.loop import STATUS_FILE

    status = _read_json(run_dir / STATUS_FILE)
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
    :func:`raycpt.train.checkpoint.publish_model`)."""
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
    from raycpt.io import atomic_write_json
    from raycpt.report.train import plot_loss_curve, read_events, read_step_records
    from raycpt.train.metrics_log import METRICS_FILE

    final_dir, plan = run_dir / FINAL_MODEL, prep.plan
    records, events = read_step_records(run_dir / METRICS_FILE), read_events(run_dir / METRICS_FILE)
    steps = [int(r["step"]) for r in records]
    losses = [float(r["loss"]) for r in records]
    times = [float(r["step_time_s"]) for r in records]
    tok_s = _tokens_per_s(records)
    png = plot_loss_curve(steps, losses, run_dir / "loss_curve.png",
                          title=f"{cfg.name}: {plan.name} [{plan.layer_map()}]")
    wall = time.time() - t_start  # this invocation (a resumed run: from the resume on)
    res = TrainResult(run_dir=run_dir, final_model_dir=final_dir, losses=losses, steps=steps, tokens_per_s=tok_s,
                      wall_s=wall, trainable_params=prep.counts["trainable"], frozen_params=prep.counts["frozen"],
                      mlflow_run_id=run.run_id, plan=plan.to_dict(), last_checkpoint=ckpt_dir,
                      resumed_from_step=prep.resumed_step, step_times=times, peak_memory_mb=peak_of(records),
                      trainable_per_step=per_step_trainable(plan, events), pid=_start_pid(events))
    atomic_write_json(run_dir / "train_result.json", res.to_dict())  # the run folder first, then the store
    run.log_artifact(png)
    run.log_params({"final_model_dir": str(final_dir)})
    run.set_tags({"raycpt.final_model_dir": str(final_dir)})
    run.log_metrics(final_metrics(res))
    return res


def final_metrics(res: TrainResult) -> dict:
    """The end-of-run metrics of a training run's MLflow run (``raycpt runs sync`` logs the same)."""
    out = {"final_loss": res.losses[-1] if res.losses else float("nan"), "wall_time_s": res.wall_s,
           "median_tokens_per_s": res.tokens_per_s}
    if res.peak_memory_mb is not None:
        out["peak_memory_mb"] = res.peak_memory_mb
    return out


def peak_of(records: list[dict]) -> Optional[float]:
    """The largest ``peak_memory_mb`` of the step records; None when no step has one."""
    peaks = [float(r["peak_memory_mb"]) for r in records if r.get("peak_memory_mb") is not None]
    return max(peaks) if peaks else None


def _start_pid(events: list[dict]) -> Optional[int]:
    pids = [e["pid"] for e in events if e.get("event") in ("start", "resume") and e.get("pid") is not None]
    return int(pids[-1]) if pids else None


def per_step_trainable(plan, events: list[dict]) -> Optional[int]:
    """LISA: the largest count one step trained (the start / resume and ``lisa_draw`` events); else None."""
    if not plan.is_lisa:
        return None
    counts = [int(e["trainable"]) for e in events
              if e.get("event") in ("start", "resume", "lisa_draw") and e.get("trainable") is not None]
    return max(counts) if counts else None


def _tokens_per_s(records: list[dict]) -> float:
    if not records:
        return 0.0
    rates = sorted(float(r["tokens_per_s"]) for r in records)
    return rates[len(rates) // 2]  # median: robust to the first (warm-up) step


def _read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def check_resume_settings(run_dir: Path, cfg: ExperimentConfig) -> None:
    """``--resume`` continues a run with the settings it was made with; one line when ``cfg`` differs."""
    from raycpt.runs import resume_changes

    changed = resume_changes(run_dir, cfg)
    if changed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise RaycptError(f"--resume: {run_dir} was made with other settings: {'; '.join(changed[:3])}{more}. "
                          "A resume continues a run with its own settings (its learning-rate schedule depends on "
                          "them): drop the change, or start a new run without --resume")


def resume_data_mismatch(recorded: Optional[dict], store) -> Optional[str]:
    """None when a checkpoint's ``data`` record (``train_state.json``) names the packed store ``store``
    holds now, else what differs, in a few words. A record without a store (an older raycpt) passes."""
    rec = recorded or {}
    if rec.get("store_identity"):
        if rec.get("store_key") not in (None, store.key):
            return f"packed store {rec['store_key']}, now {store.key}"
        if rec["store_identity"] != store.identity:
            return f"corpus {rec['store_identity']}, now {store.identity} (the corpus files changed and were re-packed)"
        return None
    if rec.get("store_build") and rec["store_build"] != store.build_id:
        return f"store build {rec['store_build'][:12]}, now {store.build_id[:12]} (the corpus was re-packed)"
    return None


def check_resume_data(ckpt: Path, store) -> None:
    """One line when the checkpoint ``--resume`` would continue from was trained on another pack than ``store``:
    the remaining steps would silently read other tokens."""
    from raycpt.train.manifest import STATE_JSON

    why = resume_data_mismatch(_read_json(Path(ckpt) / STATE_JSON).get("data"), store)
    if why is not None:
        raise RaycptError(f"--resume: checkpoint {ckpt} was trained on other data ({why}): its remaining steps would "
                          "read other tokens. Start fresh: the same command without --resume makes a new run (or "
                          "restore the corpus it was trained on and re-pack it with `raycpt data prepare --rebuild`)")


def check_resume_run(run_dir: Path, cfg: ExperimentConfig, store) -> None:
    """``--resume`` of ``run_dir``: its settings (:func:`check_resume_settings`) and the pack its newest
    checkpoint read (:func:`check_resume_data`), before the run's MLflow run is touched."""
    check_resume_settings(run_dir, cfg)
    found = latest_checkpoint(run_dir)
    if found is not None:
        check_resume_data(found[1], store)


def _result_from_files(run_dir: Path, state: dict) -> TrainResult:
    d = _read_json(run_dir / "train_result.json")
    return TrainResult(run_dir=run_dir, final_model_dir=Path(d["final_model_dir"]), losses=d["losses"],
                       steps=d["steps"], tokens_per_s=d["tokens_per_s"], wall_s=d["wall_s"],
                       trainable_params=d["trainable_params"], frozen_params=d["frozen_params"],
                       mlflow_run_id=d.get("mlflow_run_id"), plan=d["plan"],
                       last_checkpoint=Path(d["last_checkpoint"]) if d.get("last_checkpoint") else None,
                       resumed_from_step=d.get("resumed_from_step"), step_times=d.get("step_times", []), reused=True,
                       peak_memory_mb=d.get("peak_memory_mb"), trainable_per_step=d.get("trainable_per_step"),
                       pid=d.get("pid"))


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


def eval_device(cuda_available: bool, in_ray_worker: bool, reserved_gpus: int) -> str:
    """Where a model may go: a GPU only when this process reserved one. Ray 2.60 no longer hides the GPUs
    from a task or actor that reserved none, so a CPU-only trial process on a GPU node would otherwise load
    onto ``cuda:0``, next to another trial's worker. Outside Ray workers (a driver, a plain process): any
    visible GPU."""
    if not cuda_available:
        return "cpu"
    if in_ray_worker and reserved_gpus == 0:
        return "cpu"
    return "cuda"


def reserved_device() -> str:
    """:func:`eval_device` of this process (a Ray worker's reserved GPUs from its runtime context)."""
    import torch

    in_worker, gpus = False, 0
    try:
        import ray

        if ray.is_initialized():
            ctx = ray.get_runtime_context()
            in_worker = ctx.worker.mode == ray.WORKER_MODE
            gpus = len(ctx.get_accelerator_ids().get("GPU", []))
    except Exception:  # noqa: BLE001 - no Ray context: a plain process
        in_worker = False
    return eval_device(torch.cuda.is_available(), in_worker, gpus)


def saved_dtype(model_dir) -> str:
    """The dtype a model folder published by a training run (it has a ``manifest.json``) stores its weights in
    (``config.json``), so that evaluating it scores the weights the training worker evaluated
    (:func:`raycpt.train.loop.eval_model`); ``auto`` for any other folder (a base model) or when it says none."""
    if not (Path(model_dir) / "manifest.json").is_file():
        return "auto"
    conf = _read_json(Path(model_dir) / "config.json")
    name = conf.get("dtype") or conf.get("torch_dtype")
    return name if name in ("float32", "bfloat16", "float16") else "auto"


def saved_model_load(model_dir) -> dict:
    """``load_model`` / ``evaluate_model`` keywords for evaluating a saved model folder, the one rule of every
    path that scores one (:func:`final_evaluation`, ``raycpt eval``): the dtype it was saved in
    (:func:`saved_dtype`) on this process's reserved device (:func:`reserved_device`)."""
    return {"dtype": saved_dtype(model_dir), "device": reserved_device()}


def final_evaluation(final_model_dir, eval_cfg, req: EvalRequest, threads: Optional[int] = None):
    """``(EvalResult, held-out loss or None)`` of a training run's final model.

    What the training worker wrote with ``run_training(evaluate=req)`` when it did (DDP and FSDP alike);
    else (the base model of a scan, a file from before) the same bridge runs here on the saved folder, loaded
    in the dtype it was saved in (:func:`saved_dtype`), with ``threads``
    torch threads, and the held-out loss on the blocks of ``req.heldout_path``; it then writes the same
    ``eval_result.json`` the worker would have (per-block held-out losses included), so a resumed trial
    reads it instead of evaluating again."""
    from raycpt.evaluate import evaluate_model
    from raycpt.evaluate.results import EvalResult
    from raycpt.io import atomic_write_json
    from raycpt.train.worker_eval import eval_result_record

    done = _read_json(Path(req.out_dir) / EVAL_RESULT_FILE)
    if done:
        return EvalResult.from_dict(done), done.get("heldout_loss")
    import torch

    from raycpt.models.sources import load_model

    if threads:
        torch.set_num_threads(threads)
    model, tok = load_model(str(final_model_dir), **saved_model_load(final_model_dir))
    ev = evaluate_model(model, eval_cfg, tokenizer=tok, out_dir=req.out_dir, name=req.name)
    record = eval_result_record(ev, model, req.heldout_path, eval_cfg.batch_size)
    atomic_write_json(Path(req.out_dir) / EVAL_RESULT_FILE, record)
    return ev, record["heldout_loss"]
