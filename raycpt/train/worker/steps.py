"""The pieces of one optimizer step: the frozen prefix's grad-mode hooks, AdamW and its scheduler, autocast,
forward/backward over the micro-batches, clipping, and the seed (see :mod:`raycpt.train.worker.loop`)."""

from __future__ import annotations

import contextlib
import math
import random
from typing import Optional

import numpy as np
import torch

from raycpt.models.stack import LayerStack
from raycpt.strategies import LayerPlan, param_groups
from raycpt.train.worker.loss import model_loss
from raycpt.train.worker.parallel import clip_grad_norm


class FrozenPrefix:
    """Forward pre-hooks: grad mode off at the embeddings, back on at the first trainable module.

    Installed only when the embeddings are frozen. ``first`` is the plan's first trainable module
    (layer index, or N when only final norm/head train)."""

    def __init__(self, model, plan: LayerPlan):
        self.handles = []
        self.active = False
        first = plan.first_trainable
        if first is None or first < 0:
            return
        stack = LayerStack.of(model)
        resume_at = stack.layers[first] if first < stack.num_layers else stack.final_norm
        self._prev: list[bool] = []

        def off(module, args):
            self._prev.append(torch.is_grad_enabled())
            torch.set_grad_enabled(False)

        def on(module, args):
            torch.set_grad_enabled(self._prev.pop() if self._prev else True)

        # prepend: installed after wrapping, these run before FSDP2's own pre-forward of that module, so the
        # first trainable layer unshards and registers its backward hooks with grad mode back on
        self.handles = [stack.embed.register_forward_pre_hook(off, prepend=True),
                        resume_at.register_forward_pre_hook(on, prepend=True)]
        self.active = True
        self.prefix_layers = first

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []


def make_optimizer(model, plan: LayerPlan, tcfg, wrapped=None) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters only (per-layer LR groups; no decay on 1-D tensors)."""
    groups = param_groups(model, plan, tcfg.lr, tcfg.weight_decay, wrapped=wrapped)
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=tuple(tcfg.betas), weight_decay=tcfg.weight_decay)


def make_scheduler(optimizer, tcfg):
    from transformers import get_scheduler

    warmup = int(math.ceil(tcfg.warmup_ratio * tcfg.max_steps))
    return get_scheduler(tcfg.scheduler, optimizer, num_warmup_steps=warmup, num_training_steps=tcfg.max_steps)


def autocast_for(precision: str, device: torch.device):
    """bf16 autocast on GPU for ``auto``/``bf16``; float32 (no autocast) on CPU unless ``bf16``."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def trainable_params(module) -> list[torch.nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


def forward_backward(wrapped, micro_batches: list[torch.Tensor], precision: str, device: torch.device,
                     model=None, chunk_tokens: Optional[int] = None) -> torch.Tensor:
    """Loss and gradients of one optimizer step over ``micro_batches`` (each ``(b, seq)`` token ids).

    Returns the mean loss (a detached scalar). DDP gradients are synchronised on the last
    micro-batch only (``no_sync`` before). ``chunk_tokens``: the chunked LM-head loss
    (:func:`raycpt.train.worker.loss.model_loss`, through ``wrapped``'s forward; ``model`` is the bare
    module); None = the model's own loss over full logits."""
    n = len(micro_batches)
    total = torch.zeros((), device=device)
    try:
        for j, ids in enumerate(micro_batches):
            ids = ids.to(device, non_blocking=True)
            sync = j == n - 1 or not hasattr(wrapped, "no_sync")
            with (contextlib.nullcontext() if sync else wrapped.no_sync()):
                with autocast_for(precision, device):
                    loss = model_loss(wrapped, model if model is not None else wrapped, ids, chunk_tokens)
                loss = loss.float() / n
                loss.backward()
            total += loss.detach()
    finally:
        torch.set_grad_enabled(True)
    return total


def clip_and_norm(wrapped, params: list[torch.nn.Parameter], max_norm: float) -> float:
    """Clip (max_norm > 0) and return the total gradient norm of the trainable parameters (FSDP2's
    sharded gradients: the norm of the whole gradient, :func:`raycpt.train.worker.parallel.clip_grad_norm`)."""
    limit = max_norm if max_norm > 0 else float("inf")
    if any(hasattr(p, "to_local") for p in params):
        return clip_grad_norm(params, limit)
    return float(torch.nn.utils.clip_grad_norm_(params, limit))


def train_step(wrapped, optimizer, scheduler, micro_batches, precision="fp32", device=None, max_grad_norm=1.0,
               params=None, chunk_tokens: Optional[int] = None) -> dict[str, float]:
    """One complete optimizer step on one process (no cross-rank loss averaging): for tests/benchmarks."""
    device = device or torch.device("cpu")
    params = params if params is not None else trainable_params(wrapped)
    loss = float(forward_backward(wrapped, micro_batches, precision, device, chunk_tokens=chunk_tokens))
    gn = clip_and_norm(wrapped, params, max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss, "grad_norm": gn}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)
