"""Context masking (the paper's eq. 2): zero the context positions of the residual stream after
block i, finish the forward, read Q(i) at the traced position.

Nothing before block i+1 is recomputed: the clean pass (:meth:`LayerStack.trace`) is run once
and its states and per-block call arguments (masks, rotary tables) are reused. Two schedules give
the same distributions:

* ``per_layer``: for each i one :meth:`LayerStack.run_from` over the batch (blocks i+1..N-1);
* ``stacked``: one sweep over the blocks where block j runs, in a single call, every perturbation
  started below it (the rows of perturbation i join the batch at block i+1). The block count is the
  same (N(N+1)/2 rows-blocks per prompt); the calls are fewer and larger, which helps a GPU and,
  on a CPU, small batches.

Both run the head only at the traced position of each row.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from raycpt.diagnostics.lens import gather_last
from raycpt.models.stack import repeat_batch


def zero_context(hidden: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
    """h~_{l,i} = 0 for context positions i, h_{l,i} otherwise (a new tensor)."""
    return hidden.masked_fill(context_mask.to(hidden.device)[..., None], 0)


def perturbed_logits(stack, trace, context_mask: torch.Tensor, last: torch.Tensor,
                     schedule: str = "stacked", max_rows: int | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(i, logits of Q(i))`` (batch, vocab) float32 for i = -1 .. N-1.

    ``i = -1`` perturbs the embedding output; ``i = N-1`` perturbs after the last block (the
    traced position is a query position, so Q(N-1) = P exactly). ``max_rows`` caps the rows of a
    stacked call (None = all perturbations at once); beyond it the stacked sweep runs in groups.
    """
    n = stack.num_layers
    if schedule == "per_layer":
        for i in range(-1, n):
            h = zero_context(trace.hidden[i + 1], context_mask)
            yield i, stack.run_from(i, h, trace, positions=last).float()
        return
    if schedule != "stacked":
        raise ValueError(f"unknown schedule {schedule!r}")
    batch = trace.hidden[0].shape[0]
    per_call = n + 1 if max_rows is None else max(1, max_rows // batch)
    starts = list(range(-1, n))
    for g in range(0, len(starts), per_call):
        group = starts[g:g + per_call]
        yield from _stacked(stack, trace, context_mask, last, group)


def _stacked(stack, trace, context_mask, last, starts: list[int]) -> Iterator[tuple[int, torch.Tensor]]:
    """One sweep over blocks ``starts[0]+1 .. N-1``; perturbation i's rows join after block i."""
    n = stack.num_layers
    batch = trace.hidden[0].shape[0]
    h = None  # (k * batch, seq, d): rows of the perturbations started so far, oldest first
    active: list[int] = []
    for j in range(starts[0] + 1, n + 1):
        # perturbation i = j - 1 starts from the clean state after block j-1
        if j - 1 in starts:
            new = zero_context(trace.hidden[j], context_mask)
            h = new if h is None else torch.cat([h, new], dim=0)
            active.append(j - 1)
        if j == n:
            break
        reps = len(active)
        args = tuple(repeat_batch(a, reps, batch) for a in trace.layer_args[j])
        kwargs = {k: repeat_batch(v, reps, batch) for k, v in trace.layer_kwargs[j].items()}
        out = stack.layers[j](h, *args, **kwargs)
        h = out[0] if isinstance(out, (tuple, list)) else out
    h_last = gather_last(h, last.to(h.device).repeat(len(active)))
    for k, i in enumerate(active):  # one head call per perturbation bounds the (rows, vocab) buffer
        yield i, stack.lens(h_last[k * batch:(k + 1) * batch]).float()
