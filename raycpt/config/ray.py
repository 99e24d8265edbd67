"""``ray``: where runs run (a local Ray sized for the machine, or the cluster ``RAY_ADDRESS`` names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional



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
