"""ONE registry kind (lm-eval's ``Registry``): a name resolves in one place, the config checks names against it and
the CLI help reads it.

A :class:`Registry` maps a name to an object, with a one-line help and optional facts about it (``takes_split``,
``metric``...). Register with a decorator (``@PLANS.register("full", help=...)``) or a call
(``SELECTORS.register("bi", lazy("raycpt.diagnostics.selectors", "..."), help=...)``); an object given as a
:class:`raycpt.usage.Lazy` reference is imported on the first :meth:`Registry.get`, so a registry whose objects need
torch is still read (names, help) by ``raycpt config validate`` without it. A name registered twice is refused; an
unknown name is one line naming the choices.

The registries (a leaf: it imports only the error type and :class:`raycpt.usage.Lazy`):

* :data:`PLANS`: layer plans, ``(PlanConfig, num_layers) -> PlanSpec`` (:mod:`raycpt.strategies.builders`);
* :data:`SELECTORS`: layer selectors, ``SelectorInputs -> (N,) scores`` (declared in :mod:`raycpt.diagnostics`,
  implemented in :mod:`raycpt.diagnostics.selectors`);
* :data:`READERS`: benchmark data readers, ``path -> question rows`` (:mod:`raycpt.evaluate`);
* :data:`BENCHMARKS`: the shipped benchmarks, one YAML each (``raycpt/evaluate/benchmarks/*.yaml``, read by
  :mod:`raycpt.evaluate.registry`);
* :data:`STATISTICS`: the verdict's statistics, the name an interval carries -> the function computing it, with its
  legend line and claim (:mod:`raycpt.report.sweep.statistics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterator, Mapping

from raycpt.errors import RaycptError
from raycpt.usage import Lazy

_NOTHING = object()


@dataclass(frozen=True)
class Entry:
    """One registered name: the object (or a lazy reference to it), its one-line help and its facts."""

    name: str
    obj: Any
    help: str = ""
    info: Mapping[str, Any] = field(default_factory=dict)


class Registry:
    """Names -> objects of one kind (``kind`` names it in messages: ``"plan"``, ``"selector"``), in registration
    order."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, obj: Any = _NOTHING, *, help: str = "", **info: Any):
        """``register(name, obj, help=...)`` registers ``obj`` and returns it; without ``obj``, a decorator that
        registers the function or class it decorates. A name already registered is refused (one line)."""
        if obj is _NOTHING:
            def deco(target):
                self.register(name, target, help=help, **info)
                return target
            return deco
        if not isinstance(name, str) or not name.strip():
            raise RaycptError(f"{self.kind} name {name!r}: a non-empty string")
        if name in self._entries:
            raise RaycptError(f"{self.kind} {name!r} is registered twice (the first: {self._where(name)})")
        self._entries[name] = Entry(name, obj, " ".join(str(help).split()), MappingProxyType(dict(info)))
        return obj

    def _where(self, name: str) -> str:
        obj = self._entries[name].obj
        return f"{getattr(obj, 'module', getattr(obj, '__module__', '?'))}." \
               f"{getattr(obj, 'name', getattr(obj, '__qualname__', type(obj).__name__))}"

    # ------------------------------------------------------------------------------ reading
    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def entry(self, name: str) -> Entry:
        """The :class:`Entry` of ``name``; one line naming the choices for an unknown name."""
        if name not in self._entries:
            raise RaycptError(self.unknown(name))
        return self._entries[name]

    def get(self, name: str) -> Any:
        """The object registered as ``name`` (a lazy reference imported now, once); one line for an unknown name."""
        e = self.entry(name)
        if isinstance(e.obj, Lazy):
            e = self._entries[name] = Entry(e.name, e.obj.resolve(), e.help, e.info)
        return e.obj

    def names_with(self, key: str) -> tuple[str, ...]:
        """The names registered with a true fact ``key`` (``PLANS.names_with("takes_split")``), in order."""
        return tuple(n for n, e in self._entries.items() if e.info.get(key))

    def info(self, name: str, key: str, default: Any = None) -> Any:
        """A fact registered with ``name`` (``takes_split``, ``metric``...), or ``default``."""
        return self.entry(name).info.get(key, default)

    def unknown(self, name: Any) -> str:
        """The one line for a name not registered: ``unknown plan 'x': use one of full, train_shallow, ...``."""
        return f"unknown {self.kind} {name!r}: use one of {', '.join(self.names())}"

    def choices(self) -> str:
        """The names, comma-separated: what a config error lists as allowed."""
        return ", ".join(self.names())

    def describe(self) -> str:
        """Every name with its help, for an option's help text: ``bi (Block Influence), snr (weight SNR)``."""
        return ", ".join(f"{n} ({e.help})" if e.help else n for n, e in self._entries.items())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {self.choices()})"


PLANS = Registry("plan")
"""Layer plans: a builder ``(PlanConfig, num_layers) -> PlanSpec``; fact ``takes_split`` (reads ``plan.split``)."""
SELECTORS = Registry("selector")
"""Layer selectors: ``SelectorInputs -> (N,) scores``; facts ``metric`` (the ranking file's) and ``needs``."""
READERS = Registry("reader")
"""Benchmark data readers: ``reader(path) -> list of question rows`` (id, question, A-D, answer, category)."""
BENCHMARKS = Registry("benchmark")
"""The shipped benchmarks by name: a :class:`raycpt.evaluate.registry.Benchmark`, one YAML each."""
STATISTICS = Registry("verdict statistic")
"""The verdict's statistics by the name an interval carries: the :mod:`raycpt.stats` function that computes it; help:
what its 95% interval covers (the legend line); fact ``claim`` (strategy or checkpoint). Declared in
:mod:`raycpt.report.sweep.statistics`."""
