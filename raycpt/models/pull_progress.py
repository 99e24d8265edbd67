"""The progress of a model pull (download, copy, conversion) on the driver's terminal."""

from __future__ import annotations

import io
from typing import Optional


class PullProgress:
    """A rich progress display: one line per step, a byte bar for copies. Silent when disabled."""

    def __init__(self, enabled: bool):
        self._p = None
        self._task = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._p = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(bar_width=20),
                               TextColumn("{task.fields[size]}"), TimeElapsedColumn(),
                               console=Console(stderr=True))
            self._p.start()

    def _finish(self):
        if self._task is not None:
            t = self._p.tasks[-1]
            self._p.update(self._task, total=t.total or 1, completed=t.total or 1)

    def step(self, text: str, total: Optional[int] = None):
        """Start a step; ``total`` bytes gives it a byte bar, otherwise it pulses until the next step."""
        if self._p is None:
            return
        self._finish()
        size = f"{total / 1e6:.0f} MB" if total else ""
        self._task = self._p.add_task(text[:60], total=total, size=size)

    def advance(self, n: int):
        if self._p is not None and self._task is not None:
            self._p.advance(self._task, n)

    def close(self, erase: bool = False):
        """Stop the display; ``erase`` (a failed pull): remove its lines, so the error line stands alone."""
        if self._p is not None:
            if erase and self._p.console.is_terminal:
                self._p.live.transient = True  # rich clears a transient display from the terminal when it stops
            elif erase:  # a pipe or a file: rich would write its final render (and a blank line) now; drop it
                self._p.console.file = io.StringIO()
            else:
                self._finish()
            self._p.stop()
            self._p = None
