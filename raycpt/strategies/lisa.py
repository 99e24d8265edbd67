"""LISA's schedule: which interval an optimizer step is in, the seeded draw of the layers that train in it, and
the trainable count of an interval."""

from __future__ import annotations

from raycpt.errors import RaycptError


def lisa_interval_index(step: int, interval: int) -> int:
    """The LISA interval of optimizer step ``step`` (1-based): steps 1..K are interval 0."""
    return (int(step) - 1) // int(interval)


def lisa_draw(seed: int, interval_index: int, candidates, gamma: int) -> tuple[int, ...]:
    """The layers LISA trains in interval ``interval_index``: ``gamma`` of ``candidates`` drawn without
    replacement by ``numpy.random.default_rng([seed, interval_index])``, sorted. A pure function of its
    arguments, so a resumed run redraws exactly the layers the interrupted one trained."""
    import numpy as np

    cands = sorted(int(i) for i in candidates)
    rng = np.random.default_rng([int(seed), int(interval_index)])
    return tuple(sorted(int(cands[i]) for i in rng.choice(len(cands), size=int(gamma), replace=False)))


def lisa_trainable_params(layer_params, non_layer_params: int, gamma: int) -> int:
    """Trainable parameters of a LISA interval, at most: the ``gamma`` largest layers of ``layer_params`` (a
    count per decoder layer) plus the always-trained embeddings, final norm and head (``non_layer_params``,
    a tied matrix once). With equal layers, every draw trains exactly this many."""
    sizes = sorted((int(x) for x in layer_params), reverse=True)
    if not 1 <= gamma <= len(sizes):
        raise RaycptError(f"lisa: gamma={gamma} must be between 1 and the {len(sizes)} layers")
    return sum(sizes[:gamma]) + int(non_layer_params)


def lisa_period(interval, max_steps) -> int:
    """LISA's K for a run of ``max_steps`` optimizer steps: ``interval`` when given (it must be below
    ``max_steps``: with K >= max_steps the first draw trains the whole run and LISA never switches), else
    ``max(1, max_steps // 4)``, at least 4 draws (3 switches). ``max_steps`` None: ``interval`` is needed."""
    if interval is None:
        if max_steps is None:
            raise RaycptError("plan.lisa_interval is null: K is derived from train.max_steps, which this caller "
                              "did not give; set plan.lisa_interval")
        return max(1, int(max_steps) // 4)
    if max_steps is not None and int(interval) >= int(max_steps):
        raise RaycptError(f"plan.lisa_interval={interval} is not below train.max_steps={max_steps}: LISA would train "
                          f"its first draw for the whole run and never switch; use plan.lisa_interval <= "
                          f"{max(1, int(max_steps) - 1)} or null (max_steps // 4 = {max(1, int(max_steps) // 4)})")
    return int(interval)
