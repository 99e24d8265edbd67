"""THE split rule: ratio r of an N-layer model -> boundary b = round(r*N); shallow = layers [0, b), deep = [b, N).

One function checks it with one message, for the plan registry (``train_shallow`` / ``train_deep``), the
trace's S(b) table and the sweep grid. A leaf module (errors only), so every layer can use it.
"""

from __future__ import annotations

import math

from raycpt.errors import RaycptError


def split_index(ratio: float, num_layers: int) -> int:
    """b = round(r * N): the shallow side is layers [0, b)."""
    return int(round(float(ratio) * num_layers))


def check_split(r, num_layers: int, what: str = "split") -> int:
    """b for ratio ``r``, or a one-line RaycptError when r is not a ratio strictly between 0 and 1 or
    its boundary leaves the shallow or the deep side empty for this model."""
    check_ratio(r, what)
    b = split_index(r, num_layers)
    if b <= 0 or b >= num_layers:
        side = "shallow" if b <= 0 else "deep"
        raise RaycptError(f"{what}={r:g} gives b = round({r:g}*{num_layers}) = {b}, which leaves the {side} side "
                          f"empty for this {num_layers}-layer model; use a split in "
                          f"({0.5 / num_layers:.3g}, {1 - 0.5 / num_layers:.3g})")
    return b


def check_ratio(r, what: str = "split") -> float:
    """``r`` when it is a ratio strictly between 0 and 1 (the half of the rule that needs no model)."""
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        raise RaycptError(f"{what}={r!r} is not a number: expected a ratio strictly between 0 and 1, e.g. 0.5")
    if not 0 < r < 1 or math.isnan(r):
        raise RaycptError(f"{what}={r!r} is outside (0, 1): expected a ratio strictly between 0 and 1 "
                          f"(shallow = layers [0, round(r*N)))")
    return float(r)
