"""Run folders: one per command invocation, holding everything that command wrote.

``<run_root>/<command>-<name>-<id>/`` with ``config.yaml`` (the resolved config), tables, plots,
checkpoints and a ``state.json`` the command updates as it goes. ``--resume`` re-opens the newest
folder of the same command and name instead of making a new one. Files are written aside and
renamed into place (:func:`raycpt.io.atomic_write_text`), so an interrupted command never leaves half a file.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from raycpt.cluster import check_store
from raycpt.config import ExperimentConfig, save_config
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json, run_root
from raycpt.io import atomic_write_text  # noqa: F401 - re-export: their home is raycpt.io; code written before it imports them here
from raycpt.tracking import tracking_uri


def open_run_dir(cfg: ExperimentConfig, command: str, resume: bool = False) -> Path:
    """Create (or with ``resume``, re-open the newest) run folder for ``command`` and save the config.

    Makes ``cfg.tracking.run_root`` and ``cfg.tracking.uri`` absolute in place, so Ray workers (whose
    working directory differs, e.g. under ``ray job submit``) log to the same store.
    """
    check_store(cfg.tracking)
    root = run_root(cfg.tracking)
    cfg.tracking.run_root = str(root)
    cfg.tracking.uri = tracking_uri(cfg.tracking)
    root.mkdir(parents=True, exist_ok=True)
    prefix = f"{command}-{cfg.name}-"
    if resume:
        existing = sorted((p for p in root.glob(prefix + "*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if not existing:
            raise RaycptError(f"--resume: no earlier {command!r} run named {cfg.name!r} under {root}")
        run_dir = existing[-1]
    else:
        run_dir = root / f"{prefix}{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    return run_dir


def read_state(run_dir: Path) -> dict:
    p = Path(run_dir) / "state.json"
    return json.loads(p.read_text()) if p.is_file() else {}


def write_state(run_dir: Path, **updates) -> dict:
    state = read_state(run_dir)
    state.update(updates)
    atomic_write_json(Path(run_dir) / "state.json", state)
    return state
