"""``raycpt runs show RUN_DIR [--section NAME]``: a finished sweep's summary from its folder (no Ray, no MLflow,
nothing re-computed): an overview, or one section of it, or all of it - every per-category table, the S(b) gains,
domain versus general, gain and forgetting against the base, the whole verdict with its legend and the runs
(:mod:`raycpt.report.sweep.views.runs_show`, printed by :func:`raycpt.report.render.render_runs_show`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from raycpt.errors import RaycptError, read_user_json
from raycpt.jobs.job import NoRun, Options
from raycpt.report.sweep.outcomes import load_outcomes
from raycpt.report.sweep.views.runs_show import present_sections
from raycpt.report.sweep.views.sections import chosen_section
from raycpt.runs.trust import trusted_records


@dataclass
class ShownRun:
    """What ``runs show`` prints: the folder, its ``summary/summary.json``, its trials (per-block losses read) and the
    section asked for (``overview``, a section name or ``all``)."""

    run_dir: Path
    summary: dict
    trials: list
    section: str = "overview"


def show_run(rest=(), accept_damage: bool = False, section: Optional[str] = None) -> ShownRun:
    """The sweep folder ``rest[0]``, its summary and the ``section`` to print (None: the overview); one line for a
    missing argument, a folder that is not a sweep folder, one whose record is damaged or missing
    (:func:`raycpt.runs.trust.trusted_records`; ``accept_damage``: a warning line, then the summary), one whose sweep
    has not written its summary yet, or a section that is none or that this sweep does not have."""
    if len(rest) != 1:
        raise RaycptError("runs show: give one RUN_DIR (a sweep's run folder, e.g. runs/sweep-default-1234abcd)")
    run_dir = Path(rest[0]).expanduser().resolve()
    if not run_dir.is_dir():
        raise RaycptError(f"runs show: {run_dir} is not a folder")
    if (run_dir / "state.json").is_file():  # a sweep's folder: its record is checked before it is shown
        trusted_records(run_dir, "runs show", accept_damage, say=_warn)
    path = run_dir / "summary" / "summary.json"
    if not path.is_file():
        raise RaycptError(f"runs show: {run_dir} has no summary/summary.json (not a sweep folder, or its sweep has "
                          "not finished: raycpt sweep CONFIG --resume finishes it)")
    summary = read_user_json(path, "runs show: sweep summary")  # the bounded reader: one line for a damaged file
    trials = [load_outcomes(t) for t in summary.get("trials", [])]
    chosen = chosen_section(section, present_sections(summary, trials, run_dir))
    return ShownRun(run_dir, summary, trials, chosen)


def _show(cfg, options: Options) -> ShownRun:
    del cfg  # the folder's own summary is shown
    return show_run(options.rest, bool(options.get("accept_damage")), options.get("section"))


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


RUNS_SHOW = NoRun(_show)
"""``raycpt runs show``: a command that runs no experiment (it reads a sweep folder's summary)."""
