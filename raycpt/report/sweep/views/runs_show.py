"""``raycpt runs show RUN_DIR`` in sections (:mod:`raycpt.report.sweep.views.sections` names them): by default an
overview short enough to read - the verdict in a few lines, the sweep's own compact table (at most
:data:`MAX_OVERVIEW_ROWS` rows) and which sections this sweep has, and how to print them; ``--section NAME`` prints one,
``--section all`` every one, in order. A section starts with a rule naming it and prints the same text alone as in
``all``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from raycpt.report.sweep.model import as_summary
from raycpt.report.sweep.views.format import table_modes
from raycpt.report.sweep.views.rich import (rich_base_table, rich_domain_general, rich_gains_table, rich_table,
                                            rich_trials_table, rich_verdict)
from raycpt.report.sweep.views.sections import ALL, OVERVIEW, SECTIONS
from raycpt.report.sweep.views.terminal import compact_table, compact_verdict

MAX_OVERVIEW_ROWS = 16


class PathLine(str):
    """A line that names a path or a command: printed unwrapped (the terminal folds it; a copy keeps it whole)."""


def section_body(name: str, summary, trials: list, run_dir: Path) -> list:
    """What section ``name`` holds (tables and lines), without its heading; empty: this sweep has none of it.
    ``summary``: a :class:`~raycpt.report.sweep.model.Summary` or its JSON form (summary.json read back)."""
    summary = as_summary(summary)
    if name == "tables":
        return [rich_table(task, rows, mode) for task, rows in summary.tables.items() for mode in table_modes(rows)]
    if name == "gains":
        return [rich_gains_table(task, g) for task, g in summary.split_gains.items() if g]
    if name == "domain":
        return rich_domain_general(summary.domain_general or [])
    if name == "base":
        return rich_base_table(summary)
    if name == "verdict":
        return rich_verdict(summary)
    if name == "runs":
        return runs_body(summary, trials, run_dir)
    raise KeyError(name)


def runs_body(summary, trials: list, run_dir: Path) -> list:
    """The runs table, the trace's split, the summary's files."""
    summary = as_summary(summary)
    out = [rich_trials_table(trials)] if trials else []
    if summary.recommended_split is not None:
        out.append(f"trace: recommended split r = {summary.recommended_split}")
    folder = run_dir / "summary"
    files = sorted(f.name for f in folder.iterdir() if f.suffix in (".md", ".csv", ".png")) if folder.is_dir() else []
    out.append(PathLine(f"summary: {folder} ({', '.join(files)})"))
    return out


def present_sections(summary, trials: list, run_dir: Path) -> list[str]:
    """The sections this sweep's summary holds, in order."""
    return [name for name in SECTIONS if section_body(name, summary, trials, run_dir)]


def section_items(name: str, summary, trials: list, run_dir: Path) -> list:
    """Section ``name``: a rule naming it, then its body."""
    from rich.rule import Rule

    return [Rule(f"{name}: {SECTIONS[name]}", align="left")] + section_body(name, summary, trials, run_dir)


def overview_items(summary, trials: list, run_dir: Path) -> list:
    """The verdict lines, the compact table (its first :data:`MAX_OVERVIEW_ROWS` rows), the trace's split, then which
    sections there are and the command that prints them."""
    summary = as_summary(summary)
    out: list = list(compact_verdict(summary))
    if summary.tables:
        task, rows = next(iter(summary.tables.items()))
        out.append(compact_table(replace(summary, tables={task: rows[:MAX_OVERVIEW_ROWS]})))
        if len(rows) > MAX_OVERVIEW_ROWS:
            out.append(f"... {len(rows) - MAX_OVERVIEW_ROWS} more rows: --section base (gain and forgetting), "
                       "--section runs (held-out loss)")
    if summary.recommended_split is not None:
        out.append(f"trace: recommended split r = {summary.recommended_split}")
    present = present_sections(summary, trials, run_dir)
    out.append(PathLine(f"Sections: {', '.join(present)}. Print one: raycpt runs show {run_dir} --section NAME; all "
                        f"of them: --section {ALL}"))
    return out


def show_items(section: str, summary, trials: list, run_dir: Path) -> list:
    """What ``runs show --section section`` prints: the overview, one section, or every section this sweep has."""
    summary = as_summary(summary)
    if section == OVERVIEW:
        return overview_items(summary, trials, run_dir)
    names = present_sections(summary, trials, run_dir) if section == ALL else [section]
    return [item for name in names for item in section_items(name, summary, trials, run_dir)]
