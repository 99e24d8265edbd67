"""The sections of ``raycpt runs show RUN_DIR``: their names and what each holds, and the choice of one. Names only (no
numpy, no rich): the CLI's help lists them at start-up; :mod:`raycpt.report.sweep.views.runs_show` draws them."""

from __future__ import annotations

from typing import Optional

from raycpt.errors import RaycptError

OVERVIEW, ALL = "overview", "all"
SECTIONS = {
    "tables": "accuracy per task, mode and category, Δ vs full",
    "gains": "S(b) against the realised gain of each split",
    "domain": "domain versus general: Average Δ vs full, held-out loss Δ",
    "base": "gain and forgetting against the untrained model",
    "verdict": "the whole verdict and its legend",
    "runs": "each run's losses, size, speed and memory; the summary's files",
}
"""Every section, in the order ``--section all`` prints them (a sweep has those its summary holds)."""
SECTION_HELP = (f"what to print: {OVERVIEW} (the default: the verdict, one table and the sections this sweep has), "
                f"one section ({', '.join(SECTIONS)}) or {ALL}")


def chosen_section(name: Optional[str], present: list[str]) -> str:
    """The section ``--section name`` asks for (None: the overview); one line (:class:`RaycptError`) for a name that
    is no section, or a section this sweep's summary does not hold (``present``: those it holds)."""
    if name is None:
        return OVERVIEW
    word = name.strip().lower()
    if word in (OVERVIEW, ALL) or word in present:
        return word
    if word in SECTIONS:
        raise RaycptError(f"runs show: this sweep has no {word} section ({SECTIONS[word]}); its sections: "
                          f"{', '.join(present)} (or --section {ALL})")
    raise RaycptError(f"runs show: --section {name!r} is not a section; give {OVERVIEW}, {', '.join(SECTIONS)} or "
                      f"{ALL}")
