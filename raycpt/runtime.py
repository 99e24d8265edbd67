"""Ray bootstrap: join a cluster when one is named, otherwise start a local Ray fit for this machine.

Only what this module started is shut down. Token authentication (on by default in Ray 2.60) is
disabled for the local Ray we start ourselves, so CLI clients on the same machine work; on a cluster
the caller's ``RAY_AUTH_MODE`` / token is left as it is.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
from typing import Iterator

from raycpt.config import RayConfig
from raycpt.usage import verbose

log = logging.getLogger(__name__)

QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # hub downloads and transformers' weight-loading tqdm bars
}
"""Environment defaults of the quiet mode (``setdefault``: a user's own setting wins)."""
QUIET_LOGGERS = ("ray.data._internal.progress",)
"""Python loggers lowered to ERROR in the quiet mode (Ray Data's "Progress bars disabled")."""


def quiet_environment() -> None:
    """Environment defaults that keep Ray quiet and offline-safe; never overrides a user's choice."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # MLflow's "creating tables" / "experiment does not exist" INFO lines are noise around our output
    os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not verbose():  # quiet by default; `raycpt --verbose` keeps all of it (errors always show)
        for key, value in QUIET_ENV.items():
            os.environ.setdefault(key, value)
        for name in QUIET_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


NOISE = (
    # Ray Data's actor pools always have max_restarts > 0 and their UDF in the object store: the driver's core
    # worker logs this (at level E) for every trace, though nothing is wrong
    re.compile(r"core_worker\.cc:\d+.*has constructor arguments in the object store and max_restarts > 0"),
)
"""Lines of native (C++) log output that the quiet mode drops from this process's stderr."""
_filtered = False


def filter_stderr(patterns) -> None:
    """Drop lines matching ``patterns`` from everything written to file descriptor 2 by this process
    (Python and native code alike); every other line passes through unchanged. Installed once. At exit
    the original stderr is restored and what is still in the pipe (a traceback) is forwarded first."""
    global _filtered
    if _filtered or not patterns:
        return
    try:
        real = os.dup(2)
        r, w = os.pipe()
        os.dup2(w, 2)
        os.close(w)
    except OSError:  # pragma: no cover - no usable fd 2
        return
    _filtered = True

    def pump() -> None:
        with os.fdopen(r, "rb", buffering=0) as src:
            for line in iter(src.readline, b""):
                text = line.decode("utf-8", "replace")
                if not any(p.search(text) for p in patterns):
                    os.write(real, line)

    thread = threading.Thread(target=pump, name="raycpt-stderr-filter", daemon=True)
    thread.start()

    def restore() -> None:
        try:
            sys.stderr.flush()
        except Exception:  # noqa: BLE001
            pass
        os.dup2(real, 2)  # closes the pipe's last write end: the pump drains and stops
        thread.join(timeout=5)

    atexit.register(restore)


def cluster_address(cfg: RayConfig) -> str | None:
    return cfg.address or os.environ.get("RAY_ADDRESS") or None


def init_ray(cfg: RayConfig) -> bool:
    """Initialise Ray once; return True when this call started it (and so must shut it down)."""
    import ray

    quiet_environment()
    if ray.is_initialized():
        return False
    address = cluster_address(cfg)
    if address:
        ray.init(address=address, log_to_driver=False, ignore_reinit_error=True)
        return True
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    num_cpus = cfg.num_cpus or max(4, os.cpu_count() or 1)
    ray.init(
        num_cpus=num_cpus,
        object_store_memory=cfg.object_store_memory,
        include_dashboard=cfg.include_dashboard,
        log_to_driver=False,
        logging_level=logging.ERROR,
        configure_logging=True,
    )
    try:
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    except Exception:  # pragma: no cover - older/newer Ray
        pass
    return True


@contextlib.contextmanager
def ray_session(cfg: RayConfig) -> Iterator[None]:
    """``with ray_session(cfg.ray): ...`` - Ray is up inside, and shut down after if we started it."""
    import ray

    started = init_ray(cfg)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
