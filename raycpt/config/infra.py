"""Where runs are recorded (``tracking``: run folders, MLflow) and where they run (``ray``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
