"""THE progress bar (a leaf: every layer may use it): a rich bar over ``total`` items the caller counts.

``with progress_bar("trace", 500, unit="prompts") as advance: ... advance(n)`` - a no-op ``advance`` when
``enabled`` is false. Extra ``fields`` (e.g. ``rate=""``) become columns the caller updates with
``advance(n, rate=...)``. The grid's and the training loop's file-polling progress (:mod:`raycpt.report.progress`)
and the model pull's step list draw with the same library; this is the one counting bar.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator


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
