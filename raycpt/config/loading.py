"""A config from a file (or the defaults) and overrides, and back to a file."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from raycpt.config.coerce import config_from_dict, config_to_dict
from raycpt.config.experiment import ExperimentConfig
from raycpt.config.overrides import apply_overrides
from raycpt.config.yaml_io import read_yaml


def load_config(path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> ExperimentConfig:
    """Load YAML (None = built-in defaults), apply dotted overrides, validate."""
    data = read_yaml(path) if path is not None else {}
    apply_overrides(data, list(overrides or []))
    return config_from_dict(data)


def save_config(cfg: ExperimentConfig, path: str | os.PathLike) -> Path:
    """Write ``cfg`` as YAML (atomically) and reload it as a check."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(p.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False, allow_unicode=True), encoding="utf-8")
    os.replace(tmp, p)
    if load_config(p) != cfg:  # pragma: no cover - a bug in the (de)serialiser, not user input
        raise RuntimeError(f"config written to {p} does not reload to the same object")
    return p
