"""One background thread that runs calls in submission order, so slow I/O (MLflow writes) leaves the
training step's critical path. Nothing here knows MLflow: the training loop's metrics sink submits
its ``log_batch`` calls and waits for them at the end of the loop."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable, Optional

log = logging.getLogger(__name__)
_STOP = object()


class BackgroundCalls:
    """``submit(fn, *args)`` returns at once; the calls run one by one on a daemon thread.

    A failing call is logged (once per kind of error) and does not stop later calls: tracking must
    never stop training. :meth:`close` waits for every queued call; ``errors`` counts the failures."""

    def __init__(self, maxsize: int = 10_000):
        self._q: "queue.Queue[Any]" = queue.Queue(maxsize=maxsize)
        self.errors = 0
        self.first_error: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._run, name="raycpt-background-calls", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        self._q.put((fn, args, kwargs))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is _STOP:
                return
            fn, args, kwargs = item
            try:
                fn(*args, **kwargs)
            except Exception as e:  # noqa: BLE001 - see the class docstring
                self.errors += 1
                if self.first_error is None:
                    self.first_error = e
                    log.warning("background call %s failed: %s", getattr(fn, "__name__", fn), e)

    def close(self, timeout: Optional[float] = None) -> None:
        self._q.put(_STOP)
        self._thread.join(timeout)
