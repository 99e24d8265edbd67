"""Plans in the one registry: ``@register_plan`` puts a builder ``(PlanConfig, num_layers) -> PlanSpec`` under its
name in :data:`raycpt.registry.PLANS` (which the config checks ``plan.name`` against), with whether it takes a
split."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from raycpt.errors import RaycptError
from raycpt.registry import PLANS


@dataclass
class PlanSpec:
    """What a builder returns: trainable layers, optional scales and notes; flags None = from config."""

    layers: Iterable[int]
    lr_scales: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    train_embeddings: Optional[bool] = None
    train_final_norm: Optional[bool] = None
    train_head: Optional[bool] = None
    matrices: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """Layer -> the module paths that train in it (a matrix-level plan, Spectrum); a layer not named trains whole."""


def register_plan(name: str, takes_split: bool = False, help: str = ""):
    """Decorator: ``@register_plan("my_plan") def build(pcfg, num_layers) -> PlanSpec``. ``takes_split``: the
    plan reads ``plan.split`` (a sweep runs it at every split; the memory check at the first and the last)."""
    return PLANS.register(name, help=help, takes_split=bool(takes_split))


def takes_split(name: str) -> bool:
    """Whether the registered plan ``name`` reads ``plan.split`` (what the plan declared when registered)."""
    return name in PLANS and bool(PLANS.info(name, "takes_split", False))


def split_plans() -> list[str]:
    """The registered plans that take a split, in registration order."""
    return [n for n in PLANS.names() if takes_split(n)]


def check_layer(i: Any, n: int, what: str) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise RaycptError(f"{what}={i!r} is out of range: this model has layers 0..{n - 1}")
    return i
