"""The one check every config section's ``__post_init__`` makes: a condition, else a
:class:`~raycpt.errors.ConfigError` naming the field, the bad value and what is allowed."""

from __future__ import annotations

from typing import Any

from raycpt.errors import ConfigError


def check_field(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(name, value, allowed)
