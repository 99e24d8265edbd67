"""How the sweep summary writes a number, a delta with its interval and mark, and which columns a table has:
shared by the Markdown summary, the terminal tables and the plots."""

from __future__ import annotations

import math
from typing import Optional

from raycpt.report.sweep.cells import ordered_modes

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


def mark_of(sign: Optional[int], lower_is_better: bool = False) -> str:
    if not sign:
        return ""
    return MARK[-sign if lower_is_better else sign]


def fmt_delta(d: Optional[dict], digits: int = 2, lower_is_better: bool = False, short: bool = False) -> str:
    """``+5.00 [+1.25, +8.75] ▲``: a delta, its interval (when it has one) and the better/worse mark."""
    if not d or d.get("delta") is None:
        return "-"
    txt = f"{d['delta']:+.{digits}f}"
    if d.get("lo") is not None:
        lo, hi = (f"{d['lo']:+.{digits - 1 if short else digits}f}", f"{d['hi']:+.{digits - 1 if short else digits}f}")
        txt += f" [{lo},{hi}]" if short else f" [{lo}, {hi}]"
    return txt + mark_of(d.get("sign"), lower_is_better)


def fmt_value(x: dict) -> str:
    """A cell value (mean over seeds ``±`` the half-width of its 95% t-interval when there are several)."""
    txt = fmt(x["value"]) + ("*" if x.get("best") else "")
    if x.get("value_lo") is not None:
        txt += f" ±{(x['value_hi'] - x['value_lo']) / 2:.2f}"
    return txt


def row_categories(rows: list[dict]) -> list[str]:
    cats: list[str] = []
    for r in rows:
        cats += [c for c in r["cells"] if c not in cats]
    return cats


def table_modes(rows: list[dict]) -> list[str]:
    """The modes a task's rows hold, in display order (generate, logit, cloze, then any other)."""
    return ordered_modes({m for r in rows for c in r["cells"].values() for m in c})


def loss_columns(rows: list[dict], short: bool = False) -> list[tuple[str, str]]:
    """The loss columns present: the last training step's loss, the held-out loss and the general probe's loss."""
    cols = [("final_loss", "loss" if short else "final loss"), ("heldout_loss", "held-out" if short else "held-out loss"),
            ("general_loss", "general" if short else "general loss")]
    return [(k, label) for k, label in cols if any(r.get(k) is not None for r in rows)]


def fmt_p(p: Optional[float]) -> str:
    return "-" if p is None else f"{p:.3g}"
