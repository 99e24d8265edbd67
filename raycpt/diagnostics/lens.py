"""Logit lens at the traced position: P_t(i), the probability of the final top-1 token t* when the
residual stream after block i is read out through the model's own final norm and head.

Index convention (as everywhere in raycpt): states ``hidden[0..N]`` are the embedding output
("before block 0", the paper's l = 0) and the outputs of blocks 0..N-1 (the paper's l = 1..N), all
before the final norm. ``P_t`` therefore has N+1 columns; column ``i + 1`` belongs to block ``i``.
The clean final distribution P is the lens of the last state, which is exactly the model's own
next-token distribution (final norm + head + soft-capping).
"""

from __future__ import annotations

from typing import Sequence

import torch

from raycpt.diagnostics.scores import topk_target_prob


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """Logits for the divergences: float32 from a bf16/float16/float32 model, float64 kept from a float64 one (the
    precision a float64 reference run, such as benchmarks/bench_trace.py's agreement check, asks for)."""
    return x if x.dtype == torch.float64 else x.float()


def gather_last(hidden: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``hidden[b, last[b]]`` for every row: (batch, seq, d) -> (batch, d)."""
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), last.to(hidden.device)]


def lens_rows(stack) -> int:
    """Rows per head call that keep its (rows, vocab) logits near 16M values (341 rows for SmolLM2's 49,152-token
    vocabulary, 64 for Gemma 3's 262k)."""
    vocab = getattr(stack.head, "out_features", None) or getattr(stack.config, "vocab_size", 65536)
    return max(1, (1 << 24) // int(vocab))


def final_logits(stack, hidden: Sequence[torch.Tensor], last: torch.Tensor) -> torch.Tensor:
    """Clean next-token logits at ``last`` (float32; float64 for a float64 model): the lens of the state after the
    last block."""
    return at_least_float32(stack.lens(gather_last(hidden[-1], last)))


def target_probs(stack, hidden: Sequence[torch.Tensor], last: torch.Tensor, target: torch.Tensor,
                 chunk_rows: int | None = None, top_k: int = 0):
    """P_t for every state: (batch, len(hidden)) float64, ``[b, j] = softmax(lens(hidden[j][b, last]))[target[b]]``
    (softmax taken in float64 over the model's logits).

    The head runs only on the traced position, several states per call (``chunk_rows`` rows at a
    time bounds the (rows, vocab) logits buffer; None = :func:`lens_rows`). With ``top_k`` > 0 also P_t under each layer's
    own top-k (returned second).
    """
    states = torch.stack([gather_last(h, last) for h in hidden], dim=1)  # (batch, L, d)
    b, n_states, d = states.shape
    flat = states.reshape(b * n_states, d)
    tgt = target.to(flat.device).repeat_interleave(n_states)
    if chunk_rows is None:
        chunk_rows = lens_rows(stack)
    out = torch.empty(b * n_states, dtype=torch.float64, device=flat.device)
    out_k = torch.empty_like(out) if top_k > 0 else None
    for s in range(0, flat.shape[0], chunk_rows):
        logits = stack.lens(flat[s:s + chunk_rows])
        logp = torch.log_softmax(logits, dim=-1, dtype=torch.float64)
        out[s:s + chunk_rows] = logp.gather(1, tgt[s:s + chunk_rows, None])[:, 0].exp()
        if out_k is not None:  # 004 §4.1: each layer's own top-k (raycpt.diagnostics.scores.topk_target_prob)
            out_k[s:s + chunk_rows] = topk_target_prob(logits, tgt[s:s + chunk_rows], top_k, lp=logp)
    if out_k is not None:
        return out.reshape(b, n_states), out_k.reshape(b, n_states)
    return out.reshape(b, n_states)
