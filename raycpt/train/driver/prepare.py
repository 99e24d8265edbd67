"""The launcher's checks before any run exists: the model resolved on the driver, its weightless skeleton, the layer
plan and its counts, ``data.seq_len`` against the position limit, the train settings and the workers' CPUs; every bad
input ends here in one line."""

from __future__ import annotations

from typing import Optional

from raycpt.config import ExperimentConfig
from raycpt.errors import RaycptError
from raycpt.models.adapters import inject_lora
from raycpt.models.expansion import expand_groups
from raycpt.models.hybrid.expand import expanded_model_folder
from raycpt.models.sources import resolve_model_path as resolve
from raycpt.models.stack import LayerStack, tied_embeddings
from raycpt.runtime import cluster_address
from raycpt.strategies import LayerPlan, apply_plan, build_plan
from raycpt.train.worker.parallel import check_parallel, uses_fsdp


def resolve_model_path(cfg: ExperimentConfig) -> str:
    """The local folder of ``cfg.model.ref`` (resolved once, on the driver); for ``plan.name=expand`` the
    expanded model built from it (:func:`raycpt.models.hybrid.model.expanded_model_folder`, cached)."""

    path = resolve(cfg.model)
    if cfg.plan.name == "expand":
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

    model = model_skeleton(model_path)
    stack = LayerStack.of(model)
    plan = build_plan(cfg.plan, stack.num_layers, tied_embeddings=tied_embeddings(stack), max_steps=cfg.train.max_steps,
                      seed=cfg.train.seed)
    limit = position_limit(model.config)
    if limit is not None and cfg.data.seq_len > limit:
        raise RaycptError(f"data.seq_len={cfg.data.seq_len} is beyond this model's limit of {limit} positions "
                          f"(max_position_embeddings); use data.seq_len <= {limit}")
    check_plan_parallel(plan, cfg.train)
    if plan.adapter == "lora":

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


    if not ray.is_initialized() or cluster_address(cfg.ray):
        return
    t = cfg.train
    have = float(ray.cluster_resources().get("CPU", 0))
    need = t.num_workers * float(t.cpus_per_worker)
    if need > have + 1e-9:
        raise RaycptError(f"train.num_workers={t.num_workers} x train.cpus_per_worker={t.cpus_per_worker:g} need "
                          f"{need:g} CPUs; this Ray has {have:g} (ray.num_cpus): lower train.num_workers or "
                          "train.cpus_per_worker, or raise ray.num_cpus")


def local_mode(cfg: ExperimentConfig, in_process: bool) -> bool:
    """Whether the run uses Train V2's local mode (``ScalingConfig(num_workers=0)``: the same ``TorchTrainer`` and
    loop, in the calling process, no worker group): only in a process that holds the run's resources already (a
    grid trial, ``in_process``) and for one CPU worker (world size 1: nothing is distributed). A failure there
    ends the trial, which Tune retries from the last checkpoint (``train.max_failures`` counts worker restarts
    of a worker group only)."""
    t = cfg.train
    return bool(in_process) and t.num_workers == 1 and not t.use_gpu
