"""Evaluation results as the paper's table (``Generate / Logit`` per category, ``/ Cloze`` when that
third mode ran) and as files.

Data in, text and files out: :func:`render_table` (rich tables), :func:`table_text`,
:func:`table_rows` and :func:`write_results` (``<stem>.csv``, ``<stem>_table.txt``,
``<stem>_questions.json``, written atomically). A result is anything with the fields of
:class:`raycpt.evaluate.EvalResult` (``name``, ``source``, ``scores``, ``counts``, ``seconds``,
``questions``); this module does not import the bridge, the bridge writes its files with it.
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from raycpt.io import atomic_write_json, atomic_write_text
from raycpt.tasks import CATEGORIES, CATEGORY_KEYS, SCORE_KEYS


def _fmt(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


MODES = ("generate", "logit", "cloze")
"""Column order of the table cells and the CSV: the papers' two, then cloze."""


def cell(result, task: str, key: str, cloze: Optional[bool] = None) -> str:
    """The paper's table cell ``Generate / Logit`` (``-`` for a mode not run), plus ``/ Cloze`` when
    ``cloze`` (default: when this result ran the cloze mode on ``task``)."""
    modes = result.scores.get(task, {})
    shown = MODES if (("cloze" in modes) if cloze is None else cloze) else MODES[:2]
    return " / ".join(_fmt(modes.get(m, {}).get(key)) for m in shown)


def table_rows(results: Sequence) -> list[dict]:
    """One row per (model, task): the table's cells plus the raw numbers, for CSV."""
    rows = []
    for r in results:
        for task in r.scores:
            row: dict[str, Any] = {"model": r.name, "task": task, "n": r.counts.get(task, {}).get("total", 0)}
            for key in SCORE_KEYS:
                for mode in MODES:
                    v = r.scores[task].get(mode, {}).get(key)
                    row[f"{key}_{mode}"] = "" if v is None else round(v, 4)
            rows.append(row)
    return rows


def render_table(results: Sequence):
    """A rich Table per task in the paper's layout: rows = models, columns = categories + Average."""
    from rich.table import Table

    tables = []
    tasks = list(dict.fromkeys(t for r in results for t in r.scores))
    for task in tasks:
        n = max((r.counts.get(task, {}).get("total", 0) for r in results), default=0)
        cloze = any("cloze" in r.scores.get(task, {}) for r in results)
        t = Table(title=f"{task}  ({'Generate / Logit / Cloze' if cloze else 'Generate / Logit'}, accuracy %, "
                        f"{n} questions)")
        t.add_column("model")
        for c in CATEGORIES:
            t.add_column(c, justify="center")
        t.add_column("Average", justify="center")
        for r in results:
            if task in r.scores:
                t.add_row(r.name, *[cell(r, task, CATEGORY_KEYS[c], cloze) for c in CATEGORIES],
                          cell(r, task, "average", cloze))
        tables.append(t)
    return tables


def table_text(results: Sequence, width: int = 140) -> str:
    from rich.console import Console

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for t in render_table(results):
        con.print(t)
    return buf.getvalue()


def write_results(results: Sequence, out_dir: str | os.PathLike, stem: str = "eval") -> dict[str, Path]:
    """Write ``<stem>.csv`` (the table), ``<stem>_table.txt`` and ``<stem>_questions.json``; atomic."""
    out = Path(out_dir)
    rows = table_rows(results)
    buf = io.StringIO()
    fields = ["model", "task", "n"] + [f"{k}_{m}" for k in SCORE_KEYS for m in MODES]
    w = csv.DictWriter(buf, fieldnames=fields)
    w.writeheader()
    w.writerows(rows)
    paths = {
        "csv": atomic_write_text(out / f"{stem}.csv", buf.getvalue()),
        "table": atomic_write_text(out / f"{stem}_table.txt", table_text(results)),
        "questions": atomic_write_json(out / f"{stem}_questions.json",
                                       [{"model": r.name, "source": r.source, "scores": r.scores,
                                         "counts": r.counts, "seconds": r.seconds, "questions": r.questions}
                                        for r in results]),
    }
    return paths
