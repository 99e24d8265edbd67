"""Where block expansion (LLaMA-Pro) puts its new layers: plain arithmetic on layer counts, no torch, so that the
plan registry (``strategies``, imported by ``import raycpt``) can use it. The model is built in
:mod:`raycpt.models.hybrid.expand`, which re-exports these."""

from __future__ import annotations

from raycpt.errors import RaycptError


def expand_groups(num_layers: int, blocks: int) -> list[tuple[int, int]]:
    """The ``blocks`` groups ``[start, end)`` of the ``num_layers`` base layers that each get one new block
    after them: equal contiguous groups, the first ``N mod P`` one layer longer (``numpy.array_split``)."""
    if not 1 <= blocks <= num_layers:
        raise RaycptError(f"plan.expand_blocks={blocks}: block expansion inserts between 1 and {num_layers} "
                          f"blocks into this {num_layers}-layer model")
    base, extra = divmod(num_layers, blocks)
    out, start = [], 0
    for g in range(blocks):
        size = base + (1 if g < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def expand_positions(num_layers: int, blocks: int) -> list[int]:
    """Indices of the new blocks in the expanded model of ``num_layers + blocks`` layers (the copy of each
    group's last layer sits right after the group): N=4, P=2 -> [2, 5]."""
    return [end + g for g, (_, end) in enumerate(expand_groups(num_layers, blocks))]


def expand_trainable_params(layer_params, blocks: int) -> int:
    """Trainable parameters of a P-block expansion: the copied layers (each group's last), from a count per
    base decoder layer. What a budget picks the nearest P with."""
    sizes = [int(x) for x in layer_params]
    return sum(sizes[b - 1] for _, b in expand_groups(len(sizes), blocks))
