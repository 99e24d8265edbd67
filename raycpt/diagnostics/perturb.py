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
from typing import Iterator, Optional, Sequence

import torch

from raycpt.diagnostics.lens import at_least_float32, gather_last, lens_rows
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
        yield from _lens_of(stack, states, group)


def _lens_of(stack, states: dict[int, torch.Tensor], order: list[int]) -> Iterator[tuple[int, torch.Tensor]]:
    """``(i, lens(states[i]))`` in ``order``, several perturbations per head call: a head call on one batch's rows
    reads the whole (vocab, d) matrix for a few rows (SmolLM2-135M on one CPU thread: 31 GFLOP/s at 16 rows, 66
    at 341), while :func:`lens_rows` rows per call bound the (rows, vocab) buffer."""
    batch = states[order[0]].shape[0]
    per = max(1, lens_rows(stack) // max(1, batch))
    for s in range(0, len(order), per):
        part = order[s:s + per]
        logits = at_least_float32(stack.lens(torch.cat([states.pop(i) for i in part])))
        for k, i in enumerate(part):
            yield i, logits[k * batch:(k + 1) * batch]


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
SUFFIX_CALL_COST = 4
"""What one more suffix call per block costs, in padded positions. An estimate, not a measurement: on one CPU
thread with SmolLM2-135M a call's own work (its mask, rotary and key gathers, ~1 ms) is about what one padded
position costs across the ~15 perturbations a block runs on average; 4 leaves room for a GPU's launches."""


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
    buckets: list[list[int]]
    """Eligible rows (indices into ``eligible``) run in one suffix call, padded to the longest of them
    (:func:`length_buckets`)."""


def length_buckets(lengths: Sequence[int], call_cost: float = SUFFIX_CALL_COST) -> list[list[int]]:
    """Rows into calls, each padded to its longest row, at the least ``padded positions + call_cost per call``.

    Sorted by length, an optimal partition is a set of contiguous runs (moving a row to the call of
    longer rows never shortens a call), found by dynamic programming over the sorted rows. Returns row
    indices per call, shortest rows first, each call's rows in index order."""
    order = sorted(range(len(lengths)), key=lambda r: (lengths[r], r))
    best = [0.0] + [float("inf")] * len(order)
    cut = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for begin in range(end):
            cost = best[begin] + (end - begin) * lengths[order[end - 1]] + call_cost
            if cost < best[end]:
                best[end], cut[end] = cost, begin
    calls, end = [], len(order)
    while end > 0:
        calls.append(sorted(order[cut[end]:end]))
        end = cut[end]
    return calls[::-1]


def plan_shared_context(input_ids: torch.Tensor, context_mask: torch.Tensor, last: torch.Tensor,
                        min_group: int = 2, call_cost: float = SUFFIX_CALL_COST) -> SharedContextLayout:
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
                               start=start.to(dev), length=length.to(dev), pos=pos.to(dev),
                               buckets=length_buckets(length.tolist(), call_cost))


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


def _distinct(rows: Optional[torch.Tensor], new: torch.Tensor) -> tuple[torch.Tensor, int]:
    """``rows`` with ``new`` (1, ...) appended unless an equal row is there already; and ``new``'s row index."""
    if rows is None:
        return new, 0
    for k in range(rows.shape[0]):
        if torch.equal(rows[k], new[0]):
            return rows, k
    return torch.cat([rows, new], dim=0), rows.shape[0]


def _shared_states(stack, trace, starts: list[int], layout: SharedContextLayout) -> dict[int, torch.Tensor]:
    """One sweep over blocks ``starts[0]+1 .. N-1`` where block j runs (a) each group's context
    trajectory of every active perturbation (prefix = clean states, context = 0 when it starts),
    recording its keys/values, then (b) the eligible prompts' suffix rows of every active
    perturbation against those keys/values, one call per length bucket. Returns {i: (E, d) traced states}.

    Trajectories are kept once per distinct state: a perturbation whose starting trajectory equals
    one already running (bitwise) shares its row from then on, since both run the same blocks on
    the same input. With an empty prefix and blocks that map 0 to 0 (no biases: Llama, SmolLM2) every
    trajectory is 0 and one row serves all perturbations; otherwise nothing is shared."""
    n = stack.num_layers
    dev = trace.hidden[0].device
    el = torch.tensor(layout.eligible, dtype=torch.long, device=dev)
    n_el = len(layout.eligible)
    group_of = layout.group_of.tolist()
    # (distinct, seq, d) per group. The trajectory is run at the batch's full width (positions past the
    # group's longest context are never seen by it: causality) so that every attention call reduces
    # over the same key layout as the clean pass and the numbers match it to the bit
    width, d = trace.hidden[0].shape[1], trace.hidden[0].shape[-1]
    traj: list[Optional[torch.Tensor]] = [None] * len(layout.groups)
    slot: list[list[int]] = [[] for _ in layout.groups]  # slot[g][a]: the row of traj[g] perturbation a runs on
    calls = []  # per suffix call: its rows (indices into eligible), their batch rows, positions (rows, M) and lengths
    for members in layout.buckets:
        rows = torch.tensor(members, dtype=torch.long, device=dev)
        m = int(layout.length[rows].max())
        calls.append((members, el[rows], layout.pos[rows, :m], layout.length[rows]))
    q: list[Optional[torch.Tensor]] = [None] * len(calls)  # per call (active * rows, M, d), perturbation-major
    active: list[int] = []
    for j in range(starts[0] + 1, n + 1):
        if j - 1 in starts:
            src = trace.hidden[j]
            for g, (row, c0, _end) in enumerate(layout.groups):
                new = src.new_zeros((1, width, d))
                new[:, :c0] = src[row:row + 1, :c0]
                traj[g], k = _distinct(traj[g], new)
                slot[g].append(k)
            for c, (members, batch_rows, pos, lengths) in enumerate(calls):
                new_q = src[batch_rows[:, None], pos]
                if q[c] is not None and q[c].dim() == 2:  # after the last block: the traced positions only
                    new_q = new_q[torch.arange(len(members), device=dev), lengths - 1]
                q[c] = new_q if q[c] is None else torch.cat([q[c], new_q], dim=0)
            active.append(j - 1)
        if j == n:
            break
        offset = [0]
        for t in traj[:-1]:
            offset.append(offset[-1] + t.shape[0])
        keys, values = [], []
        for g, (row, _c0, _end) in enumerate(layout.groups):
            traj[g], k, v = stack.run_prefix_block(j, traj[g], trace, row, width)
            keys.append(k)
            values.append(v)
        reps = len(active)
        past_k = None if any(k is None for k in keys) else torch.cat(keys, dim=0)  # (distinct rows, heads, width, hd)
        past_v = None if any(v is None for v in values) else torch.cat(values, dim=0)
        for c, (members, batch_rows, pos, lengths) in enumerate(calls):
            kv = torch.tensor([offset[group_of[e]] + slot[group_of[e]][a] for a in range(reps) for e in members],
                              dtype=torch.long, device=dev)
            reps_lengths = lengths.repeat(reps)
            q[c] = stack.run_suffix_block(j, q[c], trace, batch_rows.repeat(reps), pos.repeat(reps, 1), reps_lengths,
                                          _per_row(past_k, kv), _per_row(past_v, kv),
                                          read=reps_lengths - 1 if j == n - 1 else None)  # last block: (rows, d)
    out = trace.hidden[0].new_empty((len(active), n_el, d))
    for c, (members, _batch_rows, _pos, lengths) in enumerate(calls):
        h = q[c]
        if h.dim() == 3:  # no block ran (only the perturbation after the last block): read the traced positions
            h = h[torch.arange(h.shape[0], device=dev), lengths.repeat(len(active)) - 1]
        out[:, members] = h.reshape(len(active), len(members), d)
    return {i: out[k] for k, i in enumerate(active)}


def _per_row(past: Optional[torch.Tensor], index: torch.Tensor) -> Optional[torch.Tensor]:
    """``past[index]``; a view when there is one distinct trajectory (the block's cache copies it once)."""
    if past is None:
        return None
    if past.shape[0] == 1:
        return past.expand(index.shape[0], *past.shape[1:])
    return past[index]
