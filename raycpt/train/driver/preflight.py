"""Before anything launches: the memory estimate of each plan a command will train, printed, and checked.

:func:`preflight` is the one call every training command (``train``, ``sweep``, ``contribution``,
``hybrid run``) and ``plan show`` make at their entry: it resolves the model, builds each plan on a
meta-device skeleton, prints :meth:`MemoryEstimate.line` and raises :class:`RaycptError` (one line,
exit 2) when a plan exceeds the device memory (``train.device_memory_gb``, else the GPU's own when
this process sees one) or when ``train.activation_checkpointing`` is asked of a model that cannot do
it. An architecture without a memory model (:data:`raycpt.train.driver.memory.FAMILY`) gets a note instead.

The settings that decide both the estimate and the loop's step come from
:mod:`raycpt.train.worker.step_options`.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from raycpt.config import ExperimentConfig, PlanConfig
from raycpt.evaluate import resolve_eval_tasks
from raycpt.strategies import takes_split
from raycpt.train.driver.prepare import prepare_plan, resolve_model_path
from raycpt.train.worker.parallel import check_parallel
from raycpt.train.driver.memory import FAMILY, MemoryEstimate, check_fits, estimate_memory, model_shape
from raycpt.train.worker.step_options import check_checkpointing, loss_chunk_tokens, uses_bf16


def device_memory_gb(tcfg) -> Optional[float]:
    """``train.device_memory_gb``, else this process's GPU 0 when training on GPUs and one is visible."""
    if tcfg.device_memory_gb is not None:
        return float(tcfg.device_memory_gb)
    if tcfg.use_gpu:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / 1e9
    return None


def estimate_plan(cfg: ExperimentConfig, skeleton, plan) -> MemoryEstimate:
    t = cfg.train
    check_parallel(t.distributed, t.num_workers)
    return estimate_memory(model_shape(skeleton), plan, seq_len=cfg.data.seq_len, micro_batch=t.micro_batch_size,
                           bf16=uses_bf16(t), gpu=t.use_gpu, world_size=t.num_workers, distributed=t.distributed,
                           chunk_tokens=loss_chunk_tokens(t, skeleton, t.num_workers),
                           activation_checkpointing=t.activation_checkpointing)


def preflight(cfg: ExperimentConfig, console=None, plans: Optional[list[PlanConfig]] = None
              ) -> list[tuple[str, MemoryEstimate]]:
    """Check the eval tasks and modes (one line for a bad one, before any trial starts: a trial would
    only find out after training), then estimate (and print) each plan's peak memory per worker; raise
    when one does not fit."""
    resolve_eval_tasks(cfg.eval)
    path = resolve_model_path(cfg)
    out = []
    for pc in plans or [cfg.plan]:
        plan, _, skeleton = prepare_plan(dataclasses.replace(cfg, plan=pc), path)
        check_checkpointing(cfg.train, skeleton)
        label = plan.name if plan.name == "full" else f"{plan.name} ({plan.layer_map()})"
        if skeleton.config.model_type not in FAMILY:
            if console is not None:
                console.print(f"memory: plan {label}: no estimate for architecture {skeleton.config.model_type!r} "
                              f"(known: {', '.join(sorted(FAMILY))})", markup=False, highlight=False, soft_wrap=True)
            continue
        est = estimate_plan(cfg, skeleton, plan)
        if console is not None:
            console.print(f"memory: plan {label}: {est.line()}", markup=False, highlight=False, soft_wrap=True)
        check_fits(est, device_memory_gb(cfg.train), what=f"plan {plan.name}")
        out.append((plan.name, est))
    return out


def sweep_plans(cfg: ExperimentConfig) -> list[PlanConfig]:
    """``full`` (when the sweep runs it) and each strategy at its largest-cost split (first and last split)."""
    s = cfg.sweep
    splits = sorted(set(s.splits)) or [cfg.plan.split]
    # as the trials train them (jobs/sweep.trial_config): under sweep.equal_footing `full` trains its decoder
    # layers only, not the embeddings, final norm and head
    base = dataclasses.replace(cfg.plan, full_non_layers=False) if s.equal_footing else cfg.plan
    out = [dataclasses.replace(base, name="full")] if s.include_full else []
    for name in s.strategies:
        if takes_split(name):
            out += [dataclasses.replace(base, name=name, split=r) for r in {splits[0], splits[-1]}]
    return out or [base]


def full_plan(cfg: ExperimentConfig) -> PlanConfig:
    """The ``full`` baseline (a contribution scan trains it next to single layers, which cost less)."""
    return dataclasses.replace(cfg.plan, name="full")
