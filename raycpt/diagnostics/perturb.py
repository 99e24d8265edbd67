"""Context masking (the paper's eq. 2): zero the context positions of the residual stream after
block i, finish the forward, read Q(i) at the traced position.

Nothing before block i+1 is recomputed: the clean pass (:meth:`LayerStack.trace`) is run once
and its states and per-block call arguments (masks, rotary tables) are reused. Three schedules
give the same distributions:

* ``per_layer``: for each i one :meth:`LayerStack.run_from` over the batch (blocks i+1..N-1);
* ``stacked``: one sweep over the blocks where block j runs, in a single call, every perturbation
  started below it (the rows of perturbation i join the batch at block i+1). The block count is the
  same (N(N+1)/2 rows-blocks per prompt); the calls are fewer and larger, which helps a GPU and,
  on a CPU, small batches.
* ``shared_context`` (the default): the stacked sweep, but the zeroed context rows are computed
  once per group of prompts and perturbation instead of once per prompt. Under causal attention a
  context position sees only the positions before s1 (the same tokens, hence the same clean states,
  in every prompt of a group) and other context positions, which are all 0 after the zeroing; so
  for each i the context trajectory through blocks i+1..N-1 is the same for every prompt of the
  group, and the one computed for the group's longest context serves every shorter one (position
  p < L never saw positions >= L). Each prompt then runs only its own s2 positions through the
  later blocks, attending to that trajectory's keys/values. Prompts that share their prefix with no
  other prompt of the batch, or whose context is not one contiguous run, take the stacked path; so
  do all prompts of a model :meth:`LayerStack.kv_reuse_blocker` refuses (Mamba2 and NemotronH's
  recurrent mixers).

All run the head only at the traced position of each row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch

from raycpt.diagnostics.lens import at_least_float32, gather_last
from raycpt.models.stack import repeat_batch

SCHEDULES = ("shared_context", "stacked", "per_layer")


def zero_context(hidden: torch.Tensor, context_mask: torch.Tensor) -> torch.Tensor:
    """h~_{l,i} = 0 for context positions i, h_{l,i} otherwise (a new tensor)."""
    return hidden.masked_fill(context_mask.to(hidden.device)[..., None], 0)


def perturbed_logits(stack, trace, context_mask: torch.Tensor, last: torch.Tensor,
                     schedule: str = "shared_context", max_rows: int | None = None,
                     input_ids: Optional[torch.Tensor] = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield ``(i, logits of Q(i))`` (batch, vocab) float32 (float64 for a float64 model) for i = -1 .. N-1.

    ``i = -1`` perturbs the embedding output; ``i = N-1`` perturbs after the last block (the
    traced position is a query position, so Q(N-1) = P exactly). ``max_rows`` caps the rows of a
    stacked call (None = all perturbations at once); beyond it the sweep runs in groups of
    perturbations. ``shared_context`` needs ``input_ids`` (prompts are grouped by the exact tokens
    before their context); without them it runs the stacked schedule.
    """
    n = stack.num_layers
    if schedule == "per_layer":
        for i in range(-1, n):
            h = zero_context(trace.hidden[i + 1], context_mask)
            yield i, at_least_float32(stack.run_from(i, h, trace, positions=last))
        return
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}: expected one of {', '.join(SCHEDULES)}")
    layout = None
    if schedule == "shared_context" and input_ids is not None and stack.kv_reuse_blocker(trace) is None:
        layout = plan_shared_context(input_ids, context_mask, last)
    batch = trace.hidden[0].shape[0]
    per_call = n + 1 if max_rows is None else max(1, max_rows // batch)
    starts = list(range(-1, n))
    for g in range(0, len(starts), per_call):
        group = starts[g:g + per_call]
        if layout is None or not layout.eligible:
            states = _stacked_states(stack, trace, context_mask, last, group)
        else:
            states = _mixed_states(stack, trace, context_mask, last, group, layout)
        for i in group:  # one head call per perturbation bounds the (rows, vocab) buffer
            yield i, at_least_float32(stack.lens(states.pop(i)))


# ------------------------------------------------------------------------------------ stacked
def _stacked_states(stack, trace, context_mask, last, starts: list[int]) -> dict[int, torch.Tensor]:
    """One sweep over blocks ``starts[0]+1 .. N-1``; perturbation i's rows join after block i.
    Returns {i: state at the traced position after the last block} (batch, d)."""
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
    return {i: h_last[k * batch:(k + 1) * batch] for k, i in enumerate(active)}


# ------------------------------------------------------------------------------------ shared context
@dataclass
class SharedContextLayout:
    """How the prompts of a batch split into prefix | context | suffix for ``shared_context``.

    Prompt b's context is positions ``[c0, start[b])`` (one contiguous run), its prefix ``[0, c0)``,
    its suffix ``[start[b], last[b]]``. ``groups`` holds one ``(row, c0, end)`` per group of prompts
    with identical prefix tokens: the member with the longest context and that context's end."""

    eligible: list[int]
    """Batch rows run on a shared context trajectory."""
    fallback: list[int]
    """Batch rows run by the stacked schedule."""
    groups: list[tuple[int, int, int]]
    group_of: torch.Tensor
    """(E,) group index of each eligible row."""
    start: torch.Tensor
    """(E,) first suffix position (= context end) of each eligible row."""
    length: torch.Tensor
    """(E,) number of suffix positions of each eligible row."""
    pos: torch.Tensor
    """(E, M) absolute suffix positions, M = max length; padding entries clamped into the sequence."""


def plan_shared_context(input_ids: torch.Tensor, context_mask: torch.Tensor, last: torch.Tensor,
                        min_group: int = 2) -> SharedContextLayout:
    """Group the prompts of a right-padded batch by the exact tokens before their context.

    A prompt takes the stacked path (``fallback``) when its context is empty or not contiguous, or
    when fewer than ``min_group`` prompts of the batch share its prefix (a shared trajectory would
    then cost as much as the prompt's own rows)."""
    ids, cm, last_l = input_ids.cpu(), context_mask.cpu(), last.cpu().tolist()
    members: dict[tuple, list[int]] = {}
    spans: dict[int, tuple[int, int]] = {}
    fallback: list[int] = []
    for b in range(ids.shape[0]):
        ctx = torch.nonzero(cm[b]).flatten().tolist()
        if not ctx or ctx[-1] - ctx[0] + 1 != len(ctx) or last_l[b] <= ctx[-1]:
            fallback.append(b)
            continue
        spans[b] = (ctx[0], ctx[-1] + 1)
        members.setdefault(tuple(ids[b, :ctx[0]].tolist()), []).append(b)
    groups, eligible, group_of = [], [], []
    for rows in members.values():
        if len(rows) < min_group:
            fallback.extend(rows)
            continue
        rep = max(rows, key=lambda b: (spans[b][1], -b))
        for b in rows:
            eligible.append(b)
            group_of.append(len(groups))
        groups.append((rep, spans[rep][0], spans[rep][1]))
    start = torch.tensor([spans[b][1] for b in eligible], dtype=torch.long)
    length = torch.tensor([last_l[b] - spans[b][1] + 1 for b in eligible], dtype=torch.long)
    width = int(length.max()) if eligible else 0
    seq = ids.shape[1]
    pos = (start[:, None] + torch.arange(width)[None, :]).clamp(max=seq - 1)
    dev = input_ids.device
    return SharedContextLayout(eligible=eligible, fallback=sorted(fallback), groups=groups,
                               group_of=torch.tensor(group_of, dtype=torch.long, device=dev),
                               start=start.to(dev), length=length.to(dev), pos=pos.to(dev))


def _mixed_states(stack, trace, context_mask, last, starts, layout: SharedContextLayout) -> dict[int, torch.Tensor]:
    """Shared-context states for the eligible rows, stacked ones for the rest, in batch order."""
    shared = _shared_states(stack, trace, starts, layout)
    if not layout.fallback:
        return shared
    dev = trace.hidden[0].device
    fb = torch.tensor(layout.fallback, dtype=torch.long, device=dev)
    el = torch.tensor(layout.eligible, dtype=torch.long, device=dev)
    rest = _stacked_states(stack, stack.select_rows(trace, fb), context_mask[fb], last[fb], starts)
    out = {}
    for i in starts:
        h = shared[i].new_empty((trace.hidden[0].shape[0], shared[i].shape[-1]))
        h[el], h[fb] = shared[i], rest[i]
        out[i] = h
    return out


def _shared_states(stack, trace, starts: list[int], layout: SharedContextLayout) -> dict[int, torch.Tensor]:
    """One sweep over blocks ``starts[0]+1 .. N-1`` where block j runs (a) each group's context
    trajectory of every active perturbation (prefix = clean states, context = 0 when it starts),
    recording its keys/values, then (b) the eligible prompts' suffix rows of every active
    perturbation against those keys/values. Returns {i: (E, d) traced states}."""
    n = stack.num_layers
    dev = trace.hidden[0].device
    el = torch.tensor(layout.eligible, dtype=torch.long, device=dev)
    n_el = len(layout.eligible)
    # (active, seq, d) per group. The trajectory is run at the batch's full width (positions past the
    # group's longest context are never seen by it: causality) so that every attention call reduces
    # over the same key layout as the clean pass and the numbers match it to the bit
    width = trace.hidden[0].shape[1]
    traj: list[Optional[torch.Tensor]] = [None] * len(layout.groups)
    q = None  # (active * E, M, d), perturbation-major
    active: list[int] = []
    for j in range(starts[0] + 1, n + 1):
        if j - 1 in starts:
            src = trace.hidden[j]
            for g, (row, c0, _end) in enumerate(layout.groups):
                new = src.new_zeros((1, width, src.shape[-1]))
                new[:, :c0] = src[row:row + 1, :c0]
                traj[g] = new if traj[g] is None else torch.cat([traj[g], new], dim=0)
            new_q = src[el[:, None], layout.pos]
            q = new_q if q is None else torch.cat([q, new_q], dim=0)
            active.append(j - 1)
        if j == n:
            break
        keys, values = [], []
        for g, (row, _c0, _end) in enumerate(layout.groups):
            traj[g], k, v = stack.run_prefix_block(j, traj[g], trace, row, width)
            keys.append(k)
            values.append(v)
        reps = len(active)
        past_k, past_v = _rows_kv(keys, layout.group_of, reps), _rows_kv(values, layout.group_of, reps)
        q = stack.run_suffix_block(j, q, trace, el.repeat(reps), layout.pos.repeat(reps, 1),
                                   layout.length.repeat(reps), past_k, past_v)
    h_last = q[torch.arange(q.shape[0], device=dev), (layout.length - 1).repeat(len(active))]
    return {i: h_last[k * n_el:(k + 1) * n_el] for k, i in enumerate(active)}


def _rows_kv(per_group: list[Optional[torch.Tensor]], group_of: torch.Tensor, reps: int) -> Optional[torch.Tensor]:
    """Per-group (active, heads, end_g, hd) keys or values -> per suffix row (active * E, heads, K, hd),
    perturbation-major, padded with zeros to the longest group (the mask hides the padding)."""
    if any(x is None for x in per_group):
        return None
    width = max(x.shape[-2] for x in per_group)
    padded = torch.stack([torch.nn.functional.pad(x, (0, 0, 0, width - x.shape[-2])) for x in per_group])
    n_el = group_of.shape[0]
    g_idx = group_of.repeat(reps)
    a_idx = torch.arange(reps, device=group_of.device).repeat_interleave(n_el)
    return padded[g_idx, a_idx]
