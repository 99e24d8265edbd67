"""Where runs are recorded (``tracking``: run folders, MLflow) and where they run (``ray``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycpt.errors import ConfigError


@dataclass
class TrackingConfig:
    run_root: str = "runs"
    """Folder holding one run folder per command (made absolute)."""
    uri: Optional[str] = None
    """MLflow tracking URI: ``http://HOST:PORT`` (an MLflow server; use it for concurrent trials and
    several clusters), ``sqlite:////abs/path.db``; None = ``$RAYCPT_TRACKING_URI`` if set, else
    ``sqlite:///<run_root>/mlflow.db``."""
    experiment: str = "raycpt"
    """MLflow experiment name."""
    wait_s: float = 0.0
    """Seconds to wait for an ``http(s)`` tracking server to answer ``/health`` before refusing with one line (a
    server started beside the job, like the RayJob's MLflow container); 0 = ask once (5 s timeout)."""

    def __post_init__(self):
        if not 0 <= self.wait_s <= 86_400:
            raise ConfigError("tracking.wait_s", self.wait_s, "seconds in [0, 86400] (0 = ask the server once)")


@dataclass
class RayConfig:
    address: Optional[str] = None
    """Ray address; None = ``$RAY_ADDRESS`` if set, else a local Ray sized for this machine."""
    num_cpus: Optional[int] = None
    """Local Ray logical CPUs (None = max(4, cores): fractional workers never starve data tasks)."""
    object_store_memory: int = 1_000_000_000
    """Local Ray object store bytes."""
    include_dashboard: bool = False
    """Start the dashboard with a local Ray."""
