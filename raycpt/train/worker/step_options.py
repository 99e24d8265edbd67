"""What the training step reads from ``train.*``, decided in one place for the loop and the memory estimate:
the loss path (:func:`loss_chunk_tokens`), bf16 autocast (:func:`uses_bf16`) and activation
checkpointing (:func:`check_checkpointing`, :func:`enable_activation_checkpointing`)."""

from __future__ import annotations

from typing import Optional

from raycpt.errors import RaycptError
from raycpt.train.worker.loss import chunked_supported, use_chunked


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

