"""THE split rule: ratio r of an N-layer model -> boundary b = floor(r*N + 1/2) (half up, as 004's Table 9
reads: 28 layers at 1/3, 1/2, 2/3 give 9, 14, 19); shallow = layers [0, b), deep = [b, N).

The ratio is taken as the nearest fraction with a denominator up to 10^6 before rounding, so a decimal
(0.35 -> 7/20) or a float of an exact fraction (2/3 = 0.666...) lands on its exact half where it has one
instead of on a binary-float neighbour; :func:`parse_ratio` reads ``"2/3"`` as well as ``"0.66"``.

One function checks it with one message, for the plan registry (``train_shallow`` / ``train_deep``), the
trace's S(b) table and the sweep grid. A leaf module (errors only), so every layer can use it.
"""

from __future__ import annotations

import math
from fractions import Fraction

from raycpt.errors import RaycptError

MAX_DENOMINATOR = 10 ** 6


def exact_ratio(ratio) -> Fraction:
    """``ratio`` as a fraction: a Fraction or an int as is, a float as its nearest fraction with a
    denominator up to 10^6 (0.1 -> 1/10, 0.6666666666666666 -> 2/3)."""
    if isinstance(ratio, Fraction):
        return ratio
    return Fraction(ratio).limit_denominator(MAX_DENOMINATOR)


def split_index(ratio, num_layers: int) -> int:
    """b = floor(r * N + 1/2) (half up, not Python's half-to-even ``round``): the shallow side is layers [0, b)."""
    return int(math.floor(exact_ratio(ratio) * num_layers + Fraction(1, 2)))


RULE = "b = floor(r*N + 1/2)"
"""THE wording of the split rule, wherever it is printed (plans, docs, configs)."""


def rule_line(ratio, num_layers: int) -> str:
    """The rule with its numbers, e.g. ``b = floor(0.5*28 + 1/2) = 14``."""
    return f"b = floor({float(ratio):g}*{num_layers} + 1/2) = {split_index(ratio, num_layers)}"


def parse_ratio(text: str) -> float:
    """``"0.66"`` -> 0.66, ``"2/3"`` -> 0.666... (an exact fraction, which :func:`split_index` recovers);
    ValueError for anything else."""
    s = str(text).strip()
    if "/" in s:
        num, _, den = s.partition("/")
        try:
            value = Fraction(int(num.strip()), int(den.strip()))
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"{text!r} is not a ratio") from None
        return float(value)
    return float(s)


def check_split(r, num_layers: int, what: str = "split") -> int:
    """b for ratio ``r``, or a one-line RaycptError when r is not a ratio strictly between 0 and 1 or
    its boundary leaves the shallow or the deep side empty for this model."""
    check_ratio(r, what)
    b = split_index(r, num_layers)
    if b <= 0 or b >= num_layers:
        side = "shallow" if b <= 0 else "deep"
        raise RaycptError(f"{what}={r:g} gives b = floor({r:g}*{num_layers} + 1/2) = {b}, which leaves the {side} side "
                          f"empty for this {num_layers}-layer model; use a split in "
                          f"({0.5 / num_layers:.3g}, {1 - 0.5 / num_layers:.3g})")
    return b


def check_ratio(r, what: str = "split") -> float:
    """``r`` when it is a ratio strictly between 0 and 1 (the half of the rule that needs no model)."""
    if isinstance(r, bool) or not isinstance(r, (int, float)):
        raise RaycptError(f"{what}={r!r} is not a number: expected a ratio strictly between 0 and 1, e.g. 0.5")
    if not 0 < r < 1 or math.isnan(r):
        raise RaycptError(f"{what}={r!r} is outside (0, 1): expected a ratio strictly between 0 and 1 "
                          f"(shallow = layers [0, floor(r*N + 1/2)))")
    return float(r)


def equal_count_split(r, splits, num_layers: int):
    """The split r' among ``splits`` at which train_deep trains as many decoder layers as train_shallow at ``r``:
    shallow trains b = floor(r*N + 1/2), deep at r' trains N - floor(r'*N + 1/2); None when no listed split
    gives N - b' = b (on 30 layers 0.33 pairs with 0.66: 10 and 30 - 20; on 28 it does not: 9 against
    28 - 18 = 10, where 1/3 and 2/3 do: 9 and 28 - 19). The nearest to 1 - r first when several do."""
    b = split_index(r, num_layers)
    same = [s for s in splits if num_layers - split_index(s, num_layers) == b]
    return min(same, key=lambda s: abs(float(s) - (1 - float(r)))) if same else None
