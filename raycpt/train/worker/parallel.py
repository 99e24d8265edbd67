"""Data parallelism that raycpt applies itself: DDP or FSDP2, the same code over gloo (CPU) and NCCL (GPU).

Ray Train only starts the processes and the default process group (``TorchTrainer``); wrapping is
done here, not by ``ray.train.torch.prepare_model`` (whose FSDP refuses to run without CUDA and is
FSDP1, which renames parameters and builds views outside autograd under a frozen prefix).

* ``ddp``: ``DistributedDataParallel`` over the module (``device_ids`` on a GPU), parameter names
  prefixed with ``module.`` as usual. One worker: the bare module on its device.
* ``fsdp``: FSDP2 (:func:`torch.distributed.fsdp.fully_shard`) on every decoder layer, then on the
  root (embeddings, final norm, head: one group, so tied embeddings share one sharded tensor).
  ``fully_shard`` changes the module classes in place: the wrapped model *is* the model, parameter
  names stay the plain ones, each parameter becomes a ``DTensor`` holding this rank's 1/world shard.
  Frozen parameters stay frozen (no gradient, no reduce-scatter, no optimizer state). Under
  ``train.precision=bf16`` (or ``auto`` on a GPU) a :class:`MixedPrecisionPolicy` gathers and
  computes in bf16 and reduces gradients in float32; the sharded master weights stay float32.
  Gradient accumulation keeps FSDP's reduce-scatter on every micro-batch, so gradients stay sharded
  (the memory estimate counts one layer's unsharded gradient, not the model's).

FSDP needs at least two workers (one worker has nothing to shard: :func:`check_parallel`).
"""

from __future__ import annotations


import torch

from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack


def uses_fsdp(distributed: str, world_size: int) -> bool:
    """Whether the loop runs sharded by FSDP2: ``train.distributed=fsdp`` over more than one worker."""
    return distributed == "fsdp" and world_size > 1


def check_parallel(distributed: str, world_size: int) -> None:
    """One line when the wrapper cannot run on ``world_size`` workers."""
    if distributed == "fsdp" and world_size < 2:
        raise RaycptError(f"train.distributed=fsdp with train.num_workers={world_size}: FSDP shards over at least "
                          "2 workers; set train.num_workers>=2 or train.distributed=ddp")


def mixed_precision(bf16: bool):
    """FSDP2's policy: bf16 parameters in compute, float32 gradient reduction (None: no casting)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not bf16:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def shard_fsdp(model, device: torch.device, bf16: bool):
    """FSDP2 on each decoder layer, then the root; returns ``model`` (wrapped in place)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model.to(device)
    # the mesh of this run's device type (not whatever accelerator the host has: a CPU run on a GPU node is gloo)
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    mp = mixed_precision(bf16)
    for layer in LayerStack.of(model).layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    return model


def wrap_ddp(model, device: torch.device):
    from torch.nn.parallel import DistributedDataParallel

    model.to(device)
    ids = [device.index if device.index is not None else torch.cuda.current_device()] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def wrap_model(model, device: torch.device, distributed: str, world_size: int, bf16: bool = False):
    """The module the loop runs: the bare model (one worker), DDP, or the FSDP2-sharded model."""
    if distributed == "fsdp":
        check_parallel(distributed, world_size)
        return shard_fsdp(model, device, bf16)
    if world_size < 2:
        return model.to(device)
    return wrap_ddp(model, device)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly DTensor) parameter or gradient."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a collective for a DTensor: every rank must call it)."""
    full = getattr(t, "full_tensor", None)
    return full() if full is not None else t


def plain_name(name: str) -> str:
    """A parameter name without DDP's ``module.`` (FSDP2 keeps the plain names)."""
    for w in ("_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(w, "")
    return name[len("module."):] if name.startswith("module.") else name


def unwrap(wrapped):
    """The plain model under a DDP wrapper (FSDP2 wraps in place: the model itself)."""
    return getattr(wrapped, "module", wrapped) if type(wrapped).__name__ == "DistributedDataParallel" else wrapped


def clip_grad_norm(params: list, max_norm: float) -> float:
    """Total gradient norm of ``params``, clipped to ``max_norm`` (``inf``: measured only). FSDP2's DTensor
    gradients: the norm of the whole gradient (the per-shard norms reduced over the ranks), as torchtitan does."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    total = torch.nn.utils.get_total_norm(grads, 2.0)
    total = full_tensor(total)
    if max_norm != float("inf"):
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return float(total)
