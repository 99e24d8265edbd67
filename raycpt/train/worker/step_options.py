"""What the training step reads from ``train.*``, decided in one place for the loop and the memory estimate:
the loss path (:func:`loss_chunk_tokens`), bf16 autocast (:func:`uses_bf16`), activation
checkpointing (:func:`check_checkpointing`, :func:`enable_activation_checkpointing`), and the fast path: the SDPA
kernel (:func:`resolve_sdpa_backend`, :func:`sdpa_context`, and :func:`sdpa_probe` for which one ran), fused AdamW (:func:`adamw_fused`) and
compiled decoder layers (:func:`compile_decoder_layers`). An option a device lacks falls back with one line (a
warning on this module's logger, returned to the caller to log)."""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator, Optional

import torch

from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack
from raycpt.train.worker.loss import chunked_supported, use_chunked

log = logging.getLogger(__name__)

#: the aten op each SDPA kernel dispatches to (the forward's; the profiler sees it by this name)
SDPA_OPS = {"aten::_scaled_dot_product_flash_attention": "flash",
            "aten::_scaled_dot_product_flash_attention_for_cpu": "flash_cpu",
            "aten::_scaled_dot_product_efficient_attention": "efficient",
            "aten::_scaled_dot_product_cudnn_attention": "cudnn",
            "aten::_scaled_dot_product_attention_math": "math"}
CUDA_ONLY_SDPA = ("efficient", "cudnn")


def uses_bf16(tcfg) -> bool:
    return tcfg.precision == "bf16" or (tcfg.precision == "auto" and tcfg.use_gpu)


def loss_chunk_tokens(tcfg, model, world_size: int) -> Optional[int]:
    """Tokens per chunk when the chunked loss runs, None for the plain path (``train.loss``). The same under
    FSDP2: the root (embeddings, head) stays gathered after the forward until its backward, so the loss
    reads the head's whole weight and its gradient is reduce-scattered with the root's."""
    why = chunked_supported(model)
    if tcfg.loss == "chunked" and why is not None:
        raise RaycptError(f"train.loss=chunked: this model cannot use the chunked loss: {why}; "
                          "use train.loss=auto or plain")
    if why is not None or not use_chunked(tcfg.loss, model.config.vocab_size):
        return None
    return tcfg.loss_chunk_tokens


def check_checkpointing(tcfg, model) -> None:
    if tcfg.activation_checkpointing and not getattr(model, "supports_gradient_checkpointing", False):
        raise RaycptError(f"train.activation_checkpointing=true: {type(model).__name__} has no gradient-checkpointing "
                          "support in transformers (supports_gradient_checkpointing is False); set it to false")


def enable_activation_checkpointing(model, tcfg) -> bool:
    """``train.activation_checkpointing``: the model's own ``gradient_checkpointing_enable`` (non-reentrant,
    so it composes with DDP and with a frozen prefix that runs under ``no_grad``)."""
    if not tcfg.activation_checkpointing:
        return False
    check_checkpointing(tcfg, model)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return True



def fallback(line: str) -> str:
    log.warning(line)
    return line


def resolve_sdpa_backend(backend: str, device: torch.device) -> tuple[str, Optional[str]]:
    """``train.sdpa_backend`` on this device: the kernel to force (``auto`` = none), and the fallback line if any
    (a CUDA-only kernel asked for on another device)."""
    if backend in CUDA_ONLY_SDPA and device.type != "cuda":
        return "auto", fallback(f"train.sdpa_backend={backend}: a CUDA kernel; {device.type} uses torch's own "
                                "choice (auto)")
    return backend, None


def sdpa_context(backend: str) -> contextlib.AbstractContextManager:
    """A resolved ``train.sdpa_backend`` as a context around the forward (``sdpa_kernel``; auto: nothing)."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kinds = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
             "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return sdpa_kernel([kinds[backend]])


def drain_collectives() -> None:
    """Wait until every collective this process issued on the default process group has finished on the group's
    own threads, profiling record included (a barrier: gloo's waits for all prior work to finish); a no-op without
    torch.distributed. Every rank must call it."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def sdpa_probe() -> Iterator[list[str]]:
    """Which SDPA kernels ran inside the block (torch's profiler, CPU-side op names: cheap enough for one step): the
    list yielded is filled on exit, ``["none"]`` when no SDPA op ran (eager attention, no attention layers).

    In a process group the block's collectives are drained (:func:`drain_collectives`, on every rank) before the
    profiler stops. A gloo collective started inside the block records its profiler event on the group's worker
    thread (``pt_gloo_runloop``) and ends that record *after* completing its future (``finishWorkGloo``:
    ``markCompleted`` then ``finish()``), so DDP's backward, which waits on the bucket futures, can return and the
    profiler can stop and free its event storage while that thread is still about to write the event's end time
    into it: a write after free, heap corruption or a SIGSEGV in ``pt_gloo_runloop``."""
    from torch.profiler import ProfilerActivity, profile

    found: list[str] = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        yield found
        drain_collectives()  # not on an exception: the other ranks may never reach it
    names = {e.name for e in prof.events()}
    found.extend(sorted({kind for op, kind in SDPA_OPS.items() if op in names}) or ["none"])


def adamw_fused(tcfg, device: torch.device) -> bool:
    """Whether to ask torch for fused AdamW (``train.fused_adamw``; None = on CUDA)."""
    return device.type == "cuda" if tcfg.fused_adamw is None else bool(tcfg.fused_adamw)


def compile_decoder_layers(model, tcfg, device: torch.device, backend: str = "inductor") -> Optional[str]:
    """``train.compile_layers``: each decoder layer's ``forward`` through ``torch.compile`` (in place: names, state
    dict and hooks unchanged; FSDP's and the frozen prefix's hooks stay eager). inductor is used on CUDA only
    here; elsewhere the layers run eagerly and the fallback line is returned. ``backend``: another torch.compile
    backend (tests use a recording one, which runs anywhere)."""
    if not tcfg.compile_layers:
        return None
    if backend == "inductor" and device.type != "cuda":
        return fallback(f"train.compile_layers=true: torch.compile (inductor) runs on CUDA here; {device.type} "
                        "runs the decoder layers eagerly")
    for layer in LayerStack.of(model).layers:
        layer.forward = torch.compile(layer.forward, backend=backend)
    return None
