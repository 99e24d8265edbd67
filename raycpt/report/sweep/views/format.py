"""How the sweep summary writes a number, a delta with its interval and mark (a typed
:class:`~raycpt.report.sweep.model.Cell`), and which categories and modes a table's rows have: shared by the Markdown
summary, the terminal tables and the plots (the columns of the main table: :mod:`raycpt.report.sweep.views.columns`)."""

from __future__ import annotations

import math
from typing import Optional, Sequence

from raycpt.report.sweep.cells import ordered_modes
from raycpt.report.sweep.model import Cell, Row

CATEGORY_LABEL = {"stem": "STEM", "social_science": "Social Science", "humanities": "Humanities", "other": "Other",
                  "average": "Average", "overall": "All questions"}
MODE_LETTER = {"generate": "G", "logit": "L", "cloze": "C"}


def fmt(v: Optional[float], sign: bool = False) -> str:
    """Scores are percentages already (as the eval bridge reports them)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:+.2f}" if sign else f"{v:.2f}"


def fmt_s(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.3f}"


MARK = {1: " ▲", -1: " ▼"}


def colour(sign: Optional[int], lower_is_better: bool = False) -> str:
    """The rich colour of a mark: green better, red worse, dim unmarked."""
    if not sign:
        return "dim"
    return "green" if (sign < 0 if lower_is_better else sign > 0) else "red"


def mark_of(sign: Optional[int], lower_is_better: bool = False) -> str:
    if not sign:
        return ""
    return MARK[-sign if lower_is_better else sign]


def fmt_delta(d: Optional[Cell], digits: int = 2, lower_is_better: bool = False, short: bool = False) -> str:
    """``+5.00 [+1.25, +8.75] ▲``: a delta, its interval (when it has one) and the better/worse mark."""
    if d is None or d.delta is None:
        return "-"
    txt = f"{d.delta:+.{digits}f}"
    if d.lo is not None:
        lo, hi = (f"{d.lo:+.{digits - 1 if short else digits}f}", f"{d.hi:+.{digits - 1 if short else digits}f}")
        txt += f" [{lo},{hi}]" if short else f" [{lo}, {hi}]"
    return txt + mark_of(d.sign, lower_is_better)


def fmt_pm(cell: Optional[Cell], digits: int, lower_is_better: bool = False) -> str:
    """``+0.512±0.021 ▲``: a delta, the half-width of its interval, the adjusted mark (the terminal's form)."""
    if cell is None or cell.delta is None:
        return "-"
    txt = f"{cell.delta:+.{digits}f}"
    if cell.lo is not None:
        txt += "±" + f"{(cell.hi - cell.lo) / 2:.{digits}f}".lstrip("0")
    return txt + mark_of(cell.sign, lower_is_better).strip()


def fmt_value(x: Cell) -> str:
    """A cell value (mean over seeds ``±`` the half-width of its 95% t-interval when there are several)."""
    txt = fmt(x.value) + ("*" if x.best else "")
    if x.value_lo is not None:
        txt += f" ±{(x.value_hi - x.value_lo) / 2:.2f}"
    return txt


def row_categories(rows: Sequence[Row]) -> list[str]:
    cats: list[str] = []
    for r in rows:
        cats += [c for c in r.cells if c not in cats]
    return cats


def table_modes(rows: Sequence[Row]) -> list[str]:
    """The modes a task's rows hold, in display order (generate, logit, cloze, then any other)."""
    return ordered_modes({m for r in rows for c in r.cells.values() for m in c})


def fmt_p(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3g}"
