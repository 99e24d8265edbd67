"""Dotted overrides (``train.lr=1e-4``): values parsed with YAML rules, set into the nested dict; and a
validated copy of a config with typed values set at dotted keys."""

from __future__ import annotations

import yaml

from raycpt.config.coerce import config_from_dict, config_to_dict
from raycpt.config.experiment import ExperimentConfig
from raycpt.config.yaml_io import LEADING_ZERO, YamlLoader
from raycpt.errors import RaycptError


def _parse_scalar(text: str):
    """Parse an override value with YAML rules (``1e-4`` -> float, ``[1,2]`` -> list, ``null``);
    an empty value is the empty string (null for an optional field)."""
    if not text.strip():
        return ""
    try:
        value = yaml.load(text, Loader=YamlLoader)
    except yaml.YAMLError:
        return text
    if isinstance(value, str) and not LEADING_ZERO.match(value):  # int fields still take "010" (-> 10)
        try:
            return float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return value
    return value


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply ``a.b.c=value`` overrides to a nested dict (in place) and return it."""
    for item in overrides:
        if "=" not in item:
            raise RaycptError(f"bad override {item!r}: expected dotted.key=value, e.g. train.lr=1e-4")
        key, _, text = item.partition("=")
        parts = [p for p in key.strip().split(".") if p]
        if not parts:
            raise RaycptError(f"bad override {item!r}: empty key")
        set_dotted(data, parts, _parse_scalar(text))
    return data


def set_dotted(data: dict, key, value) -> dict:
    """``data[a][b][c] = value`` for ``key`` ``"a.b.c"`` (or its parts), making the inner mappings."""
    parts = key.split(".") if isinstance(key, str) else list(key)
    node = data
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value
    return data


def config_with(cfg: ExperimentConfig, settings: dict) -> ExperimentConfig:
    """A validated copy of ``cfg`` with typed values set at dotted keys, e.g. ``{"plan.name": "single"}``
    (``cfg`` itself is untouched)."""
    data = config_to_dict(cfg)
    for key, value in settings.items():
        set_dotted(data, key, value)
    return config_from_dict(data)
