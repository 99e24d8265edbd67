"""Ray bootstrap: join a cluster when one is named, otherwise start a local Ray fit for this machine.

Only what this module started is shut down. Token authentication (on by default in Ray 2.60) is
disabled for the local Ray we start ourselves, so CLI clients on the same machine work; on a cluster
the caller's ``RAY_AUTH_MODE`` / token is left as it is.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

from raycpt.config import RayConfig

log = logging.getLogger(__name__)


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
        address="local",  # a new local Ray: never join a stray `ray start` cluster of this machine by accident
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
