"""The checks every config section's ``__post_init__`` makes: :func:`check_field` (a condition, else a
:class:`~raycpt.errors.ConfigError` naming the field, the bad value and what is allowed), and the rules of values
checked against what they will meet (issue 51): a rate the optimizer can hold (:func:`check_rate`), a seed every
generator takes (:func:`check_seed`), a name the file system can hold (:func:`check_names`), grid values whose trial
names differ (:func:`check_distinct_tags`, :func:`lr_tag`)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable

from raycpt.errors import ConfigError

SEED_MAX = 2**64 - 1
"""The widest seed every consumer takes: ``torch.manual_seed`` packs it into 64 bits (2**64 raises "Overflow when
unpacking long long"), numpy's ``default_rng([seed, ...])`` takes no negative seed, ``random.seed`` takes any."""
FLOAT32_TINY = 1.1754943508222875e-38
"""The smallest normal float32: a rate below it is 0 or denormal in the optimizer's float32 arithmetic (and its
warmup fractions of it are 0)."""
FLOAT32_MAX = 3.4028234663852886e38
"""The largest float32: a rate above it is infinite in the optimizer."""
NAME_MAX_DEFAULT = 255
"""NAME_MAX where the file system will not say (``os.pathconf`` unsupported)."""


def check_field(cond: bool, name: str, value: Any, allowed: str) -> None:
    if not cond:
        raise ConfigError(name, value, allowed)


def rate_ok(value: Any) -> bool:
    """A learning rate the optimizer's float32 arithmetic holds: not 0 or denormal once rounded (1e-320 is 0.0
    there), not infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and FLOAT32_TINY <= value <= FLOAT32_MAX


def check_rate(name: str, value: Any, rate: Any = None, how: str = "") -> None:
    """``rate`` (``value`` itself when None: a learning rate as the optimizer gets it, ``how`` says how it was made
    from ``value``, e.g. ``; train.lr x 3 = ...``) passes :func:`rate_ok`."""
    check_field(rate_ok(value if rate is None else rate), name, value, f"a positive learning rate between {FLOAT32_TINY:.3g} and {FLOAT32_MAX:.3g} (float32, what "
                f"the optimizer computes in; a smaller rate rounds to 0, a larger one is infinite){how}")


def check_seed(name: str, value: Any) -> None:
    """``value`` is a seed every generator takes: an integer in [0, :data:`SEED_MAX`]."""
    check_field(isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= SEED_MAX, name, value,
                f"an integer in [0, {SEED_MAX}] (2**64-1: torch.manual_seed's range; numpy's generators take no "
                "negative seed)")


def name_max(path) -> int:
    """NAME_MAX (bytes of one path component) of the file system that ``path`` is on, or would be on once made: asked
    of its nearest existing ancestor."""
    p = Path(os.path.abspath(os.path.expanduser(str(path))))
    for d in (p, *p.parents):
        if os.path.exists(d):  # False for a component too long to ask about
            try:
                return int(os.pathconf(d, "PC_NAME_MAX"))
            except (OSError, ValueError):
                return NAME_MAX_DEFAULT
    return NAME_MAX_DEFAULT


def check_names(name: str, value: Any, parts: Iterable[str], limit: int, what: str) -> None:
    """Every component in ``parts`` (bytes in UTF-8) fits ``limit`` (the file system's NAME_MAX)."""
    for part in parts:
        n = len(part.encode("utf-8", "surrogateescape"))
        check_field(n <= limit, name, value, f"{what}: {part[:40]!r}... is {n} bytes, longer than the {limit} bytes the "
                    "file system allows in one name (NAME_MAX)")


def lr_tag(m: float) -> str:
    """The trial-name suffix of a learning-rate multiplier (``<name>-lr<tag>``; 3 significant digits)."""
    return f"lr{float(m):.3g}"


def check_distinct_tags(name: str, values: list, tag) -> None:
    """The grid ``values`` of ``name`` give distinct trial-name suffixes ``tag(v)``: two values under one name would be
    one trial (the second read back as the first's result) reported as two."""
    seen: dict[str, Any] = {}
    for v in values:
        t = tag(v)
        check_field(t not in seen, name, values, f"values whose trial names differ: {seen.get(t)!r} and {v!r} are both "
                    f"named -{t} (names keep 3 significant digits)")
        seen[t] = v
