"""The LM head and next-token cross-entropy over chunks of tokens: the full logits never exist.

The plain path (``model(input_ids=ids, labels=ids)``) materialises ``batch x seq x vocab`` logits,
then a float32 copy and its gradient: for 8 x 4096 tokens and Qwen3's 151,936-token vocabulary that
is ~5e9 values per tensor. :func:`chunked_lm_loss` computes the same loss as transformers'
``ForCausalLMLoss`` (labels shifted by one, ``-100`` ignored, the mean over the counted tokens,
logits in float32, Gemma's ``final_logit_softcapping`` applied) ``chunk_tokens`` rows at a time.

:class:`ChunkedLMLoss` is a ``torch.autograd.Function`` that computes the gradients in the forward
pass, chunk by chunk (``softmax - onehot``, through the softcap's derivative, then ``grad_h =
g @ W`` and ``grad_W += g^T @ h``), and keeps only ``grad_h`` (the size of the hidden states) and
``grad_W`` (the size of the head) for the backward, which scales them by the incoming gradient.
So the work is the plain path's three matmuls per token, and the memory is one chunk's logits
instead of all of them. Gradients that nobody needs are skipped: a frozen head gets no
``grad_W``; hidden states that do not require grad get no ``grad_h``. Tied embeddings need nothing
special: the head's weight is the embedding's Parameter and autograd adds both contributions.

:func:`model_loss` is the call the training loop makes: it runs the (possibly DDP-wrapped) model's
own forward (so DDP's hooks fire) with an empty ``logits_to_keep`` (the head projects no
position), captures the final hidden states with a forward hook on the decoder and applies
:func:`chunked_lm_loss` to them. :func:`chunked_supported` says whether a model's head is one this
module reproduces exactly (a plain ``Linear``, no extra logit scaling).
"""

from __future__ import annotations

from typing import Optional

import torch

IGNORE_INDEX = -100
DEFAULT_CHUNK_TOKENS = 1024
CHUNKED_VOCAB_THRESHOLD = 32768
"""``train.loss=auto`` uses the chunked loss for vocabularies at least this large."""

_SCALING_ATTRS = ("logit_scale", "logits_scaling", "output_multiplier_scale")


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """Position t predicts label t+1; the last position predicts nothing (as transformers pads it)."""
    pad = torch.full_like(labels[..., :1], IGNORE_INDEX)
    return torch.cat([labels[..., 1:], pad], dim=-1)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    dev = h.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return h.dtype


class ChunkedLMLoss(torch.autograd.Function):
    """``loss = mean CE(softcap(h @ W^T + b), y)`` over rows with ``y != -100``; gradients made in forward."""

    @staticmethod
    def forward(ctx, h, weight, bias, targets, chunk_tokens: int, softcap: Optional[float]):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        need_b = bias is not None and ctx.needs_input_grad[2]
        dtype = _compute_dtype(h)
        with torch.autocast(h.device.type, enabled=False):
            w = weight.to(dtype)
            b = bias.to(dtype) if bias is not None else None
            valid = targets != IGNORE_INDEX
            count = valid.sum().clamp(min=1).to(torch.float32)
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
            grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
            for s in range(0, h.shape[0], chunk_tokens):
                hc, yc, vc = h[s:s + chunk_tokens].to(dtype), targets[s:s + chunk_tokens], valid[s:s + chunk_tokens]
                z = hc @ w.t()
                if b is not None:
                    z = z + b
                z = z.float()
                if softcap is not None:
                    t = torch.tanh(z / softcap)
                    z = t * softcap
                lse = torch.logsumexp(z, dim=-1)
                safe_y = torch.where(vc, yc, torch.zeros_like(yc))
                picked = z.gather(1, safe_y[:, None])[:, 0]
                total += ((lse - picked) * vc).sum()
                if not (need_h or need_w or need_b):
                    continue
                g = torch.softmax(z, dim=-1)  # d loss_row / d z
                g[torch.arange(g.shape[0], device=g.device), safe_y] -= 1.0
                g *= (vc.float() / count)[:, None]
                if softcap is not None:
                    g *= 1.0 - t * t
                del z
                gd = g.to(dtype)
                if need_h:
                    grad_h[s:s + chunk_tokens] = (gd @ w).to(h.dtype)
                if need_w:
                    grad_w += (gd.t() @ hc).float()
                if need_b:
                    grad_b += g.sum(0)
        ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.weight_dtype = weight.dtype
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, grad_b = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if grad_h is not None else None
        gw = (grad_w * grad_out).to(ctx.weight_dtype) if grad_w is not None else None
        gb = (grad_b * grad_out).to(ctx.weight_dtype) if grad_b is not None else None
        return gh, gw, gb, None, None, None


def chunked_lm_loss(hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor,
                    chunk_tokens: int = DEFAULT_CHUNK_TOKENS, softcap: Optional[float] = None) -> torch.Tensor:
    """transformers' causal-LM loss of ``head(hidden)`` against ``labels`` (``(b, seq)``, ``-100`` ignored)."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    targets = shift_labels(labels).reshape(-1)
    h = hidden.reshape(-1, hidden.shape[-1])
    return ChunkedLMLoss.apply(h, head.weight, head.bias, targets, int(chunk_tokens), softcap)


def plain_lm_loss(hidden: torch.Tensor, head: torch.nn.Linear, labels: torch.Tensor,
                  softcap: Optional[float] = None) -> torch.Tensor:
    """The reference: full logits, then transformers' own ``ForCausalLMLoss``."""
    from transformers.loss.loss_utils import ForCausalLMLoss

    logits = head(hidden)
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    return ForCausalLMLoss(logits, labels, vocab_size=logits.shape[-1])


def softcap_of(model_config) -> Optional[float]:
    cap = getattr(model_config, "final_logit_softcapping", None)
    return float(cap) if cap else None


def chunked_supported(model) -> Optional[str]:
    """None when :func:`model_loss` reproduces this model's loss, else why not (one phrase)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        return f"its LM head is a {type(head).__name__}, not a plain Linear"
    for a in _SCALING_ATTRS:
        v = getattr(model.config, a, None)
        if isinstance(v, (int, float)) and v not in (0, 1):
            return f"it scales its logits ({a}={v})"
    if not hasattr(model, "get_decoder"):
        return "it has no get_decoder()"
    return None


def use_chunked(mode: str, vocab_size: int) -> bool:
    """``train.loss``: chunked / plain / auto (chunked when vocab >= :data:`CHUNKED_VOCAB_THRESHOLD`)."""
    return mode == "chunked" or (mode == "auto" and vocab_size >= CHUNKED_VOCAB_THRESHOLD)


def model_loss(wrapped, model, ids: torch.Tensor, chunk_tokens: Optional[int]) -> torch.Tensor:
    """The loss of one micro-batch through ``wrapped``'s own forward.

    ``chunk_tokens=None``: the plain path (``labels=ids``). Otherwise the head projects no position
    inside the forward and :func:`chunked_lm_loss` runs on the captured final hidden states."""
    if chunk_tokens is None:
        return wrapped(input_ids=ids, labels=ids, use_cache=False).loss
    box: list[torch.Tensor] = []

    def grab(module, args, output):
        box.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

    handle = model.get_decoder().register_forward_hook(grab)
    try:
        none = torch.zeros(0, dtype=torch.long, device=ids.device)
        wrapped(input_ids=ids, use_cache=False, logits_to_keep=none)
    finally:
        handle.remove()
    return chunked_lm_loss(box[-1], model.get_output_embeddings(), ids, chunk_tokens, softcap_of(model.config))

