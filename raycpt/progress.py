"""THE progress bar (a leaf: every layer may use it): a rich bar over ``total`` items the caller counts.

``with progress_bar("trace", 500, unit="prompts") as advance: ... advance(n)`` - a no-op ``advance`` when
``enabled`` is false. Extra ``fields`` (e.g. ``rate=""``) become columns the caller updates with
``advance(n, rate=...)``. The grid's and the training loop's file-polling progress (:mod:`raycpt.report.progress`)
and the model pull's step list draw with the same library; this is the one counting bar.

A trial's phase note (:func:`write_phase`, ``<trial>/phase.json``) says what the trial is doing where its training
log does not: the base row's evaluation with its question and document counts, what a trained row's evaluation
will cover. The sweep's progress line reads it (:func:`raycpt.report.progress.trial_state`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Callable, Iterator, Optional

from raycpt.io import atomic_write_json

PHASE_FILE = "phase.json"


def write_phase(trial_dir: Path, phase: str, **detail) -> None:
    """Record what the trial in ``trial_dir`` is doing now (``phase``: starting, evaluating, ...) with ``detail``
    (``label``: how the line names the trial; ``doing``: what the phase covers; ``evaluation``: what the trial's
    evaluation will cover). Best effort: a note that cannot be written (a full disk) leaves the line as it was and
    the trial's own writes report the disk."""
    try:
        atomic_write_json(Path(trial_dir) / PHASE_FILE, {"phase": phase, **detail})
    except OSError:
        pass


def read_phase(trial_dir: Path) -> Optional[dict]:
    """The trial's phase note, or None when there is none (or it cannot be read: a progress line never fails)."""
    try:
        rec = json.loads((Path(trial_dir) / PHASE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("phase"), str) else None


@contextlib.contextmanager
def progress_bar(label: str, total: int, enabled: bool = True, unit: str = "", console=None, transient: bool = False,
                 **fields) -> Iterator[Callable[..., None]]:
    """A rich bar of ``total`` items; yields ``advance(n=1, **fields)``."""
    if not enabled:
        yield lambda n=1, **kw: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [TextColumn(label), BarColumn(), MofNCompleteColumn(), TextColumn(unit)]
    columns += [TextColumn("{task.fields[%s]}" % k) for k in fields] + [TimeElapsedColumn()]
    with Progress(*columns, console=console, transient=transient) as bar:
        task = bar.add_task(label, total=total, **fields)
        yield lambda n=1, **kw: bar.update(task, advance=n, **kw)
