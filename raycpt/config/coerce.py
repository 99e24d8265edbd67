"""Generic dict <-> dataclass with checks: each value coerced to its field's annotation (overrides arrive as
strings), unknown keys refused with the closest valid one, a section's error prefixed with its dotted path."""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from typing import Any, Literal, Union

from raycpt.config.experiment import ExperimentConfig
from raycpt.errors import ConfigError
from raycpt.splits import parse_ratio


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _type_name(tp) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin is list:
        inner = typing.get_args(tp)[0]
        plural = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}
        return f"a list of {plural[inner]}" if inner in plural else f"a list of {_type_name(inner)}"
    if origin is dict:
        k, v = typing.get_args(tp)
        return f"a mapping of {_type_name(k)} to {_type_name(v)}"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}.get(
        tp, getattr(tp, "__name__", str(tp)))


def _coerce(value: Any, tp, name: str):
    """Return ``value`` as type ``tp`` or raise ConfigError(name, value, allowed)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if value is None:
            return tp()
        if not isinstance(value, dict):
            raise ConfigError(name, value, "a mapping of " + ", ".join(_fields(tp)))
        return _build(tp, value, name)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if (value is None or value == "") and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1 and dataclasses.is_dataclass(non_none[0]):  # Optional[Section]: keep its own error
            return _coerce(value, non_none[0], name)
        last = None
        for a in non_none:
            try:
                return _coerce(value, a, name)
            except ConfigError as e:
                last = e
        raise ConfigError(name, value, _type_name(tp)) from last
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(name, value, "one of " + ", ".join(map(str, allowed)) + hint)
        return value
    if origin is list:
        (inner,) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and inner is not str:
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip() != ""]
            else:
                value = [value]
        elif isinstance(value, str) and inner is str:
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(name, value, _type_name(tp))
        return [_coerce(v, inner, name) for v in value]
    if origin is dict:
        kt, vt = typing.get_args(tp)
        if not isinstance(value, dict):
            raise ConfigError(name, value, _type_name(tp))
        return {_coerce(k, kt, f"{name}.{k}"): _coerce(v, vt, f"{name}.{k}") for k, v in value.items()}
    return _coerce_scalar(value, tp, name)


def _coerce_scalar(value: Any, tp, name: str):
    """``value`` as ``tp`` when that is bool, int, float, str or a plain dict (strings from overrides are
    parsed); any other ``tp`` passes ``value`` through. ConfigError(name, value, allowed) otherwise."""
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(name, value, "true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(name, value, "an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(name, value, "an integer")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(name, value, "a number")
        out = None
        if isinstance(value, (int, float, str)):
            try:
                out = parse_ratio(value) if isinstance(value, str) and "/" in value else float(value)
            except ValueError:
                pass
            except OverflowError:  # an integer beyond float range
                out = math.inf
        if out is None:
            raise ConfigError(name, value, "a number")
        if not math.isfinite(out):
            raise ConfigError(name, value, "a finite number (inf and nan are not accepted)")
        return out
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        if value is None:  # YAML reads a bare ~ (and null, or nothing) as null, not as the home folder
            raise ConfigError(name, value, "a string (YAML reads a bare ~ or an empty value as null: write the "
                                           "path in full, e.g. /home/me/runs, or quote it: '~/runs')")
        raise ConfigError(name, value, "a string")
    if tp is dict:
        if isinstance(value, dict):
            return value
        raise ConfigError(name, value, "a mapping")
    return value


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    fields = _fields(cls)
    kwargs = {}
    for key, value in data.items():
        key = str(key)
        full = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1, cutoff=0.5)
            hint = f"unknown key (did you mean {(prefix + '.' if prefix else '') + close[0]!r}?)" if close else \
                "unknown key; valid keys: " + ", ".join(fields)
            raise ConfigError(full, value, hint)
        kwargs[key] = _coerce(value, hints[key], full)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if prefix and not e.field.startswith(prefix):
            raise ConfigError(f"{prefix}.{e.field}", e.value, e.allowed) from None
        raise


def config_from_dict(data: dict | None) -> ExperimentConfig:
    """Build and validate an :class:`ExperimentConfig` from a plain dict."""
    return _build(ExperimentConfig, data or {})


def config_to_dict(cfg) -> dict:
    """Plain, YAML-safe dict of a config (dataclass) tree."""
    return dataclasses.asdict(cfg)
