"""Each method at its own optimum: the learning-rate search's edge-extension rule (issue 47).

A method runs at every multiplier of its starting grid; the one with the lowest validation loss is its pick (ties:
the smaller rate; a run without a finite loss - diverged, or not run - never wins). A pick at the grid's largest
rate extends the grid one step up (pick x ``step``), at its smallest one step down, and the search goes on until
the pick is interior - a rate on each side tried and worse - or the method has added ``max_extensions`` rates; a
method still at an edge then is *untuned*: its best rate may lie outside what was tried, so its row takes no part
in "best" or in marks. A rate above the pick whose run diverged counts as tried and worse: the pick is interior.
The held-out test loss never enters the choice (only the validation slice does).

Why a grid that grows at its edges and not Ray Tune's ASHA: the question is whether an 8-step ranking holds at 10x
the tokens, and ASHA's early stopping judges a rate by its loss after a few steps - exactly the short-horizon bias
being measured (a high rate always leads early). Every rate here runs the whole horizon, every grid point is a
Tune trial and an MLflow child run, the search is deterministic and resumable, and its cost is the number of rates
each method needs (docs/design.md, "The learning-rate search").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional


@dataclass(frozen=True)
class RateRow:
    """One method's search so far: the multipliers tried (ascending) with their validation losses."""

    method: str
    mults: tuple[float, ...]
    losses: tuple[float, ...]
    initial: tuple[float, ...] = ()
    """The starting grid (the rates beyond it are extensions)."""

    @property
    def picked(self) -> Optional[float]:
        scored = [(loss, m) for m, loss in zip(self.mults, self.losses) if math.isfinite(loss)]
        return min(scored)[1] if scored else None

    @property
    def edge(self) -> Optional[str]:
        """``"high"`` when the pick is the largest rate tried, ``"low"`` the smallest, None when interior (or
        nothing was picked)."""
        p = self.picked
        if p is None:
            return None
        if p == self.mults[-1]:
            return "high"
        if p == self.mults[0]:
            return "low"
        return None

    @property
    def extensions(self) -> int:
        init = {round(m, 12) for m in self.initial}
        return sum(1 for m in self.mults if round(m, 12) not in init)

    @property
    def tuned(self) -> bool:
        """The pick is interior: a rate on each side was tried and did worse."""
        return self.picked is not None and self.edge is None


def finite_mean(xs) -> float:
    """The mean of the finite values of ``xs`` (None and NaN left out); NaN when none: a rate's validation loss over
    the seeds that ran it."""
    vals = [float(x) for x in xs if x is not None and math.isfinite(float(x))]
    return sum(vals) / len(vals) if vals else math.nan


def rate_rows(losses: Mapping[str, Mapping[float, float]], initial) -> list[RateRow]:
    """``{method: {multiplier: validation loss}}`` -> one :class:`RateRow` per method (None/NaN = no finite loss)."""
    out = []
    for method, by_mult in losses.items():
        mults = tuple(sorted(float(m) for m in by_mult))
        vals = tuple(float(by_mult[m]) if by_mult[m] is not None else math.nan for m in sorted(by_mult))
        out.append(RateRow(method, mults, vals, tuple(sorted(float(m) for m in initial))))
    return out


def extend_rates(rows: list[RateRow], step: float = 3.0, max_extensions: int = 3) -> dict[str, float]:
    """The next multiplier of each method whose pick sits at an edge and that may still extend: ``{method: rate}``
    (pick x step above, pick / step below); empty when every method is interior or out of extensions."""
    if not step > 1:
        raise ValueError(f"step must be > 1, got {step}")
    nxt = {}
    for r in rows:
        if r.edge is None or r.extensions >= max_extensions:
            continue
        nxt[r.method] = r.picked * step if r.edge == "high" else r.picked / step
    return nxt
