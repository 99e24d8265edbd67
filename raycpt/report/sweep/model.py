"""The sweep summary as typed values (issue 46 item 3): :class:`Cell` (one value of a per-task table and its
comparison against ``full``), :class:`Row` (one row of a task's table) and :class:`Summary` (what ``summary.json``
holds). The numbers are computed as before (:mod:`raycpt.report.sweep.cells`, the verdict); these read them once and
the views read attributes, not string keys.

Each has ``from_json`` / ``to_json`` that round-trip ``summary.json`` exactly: the same keys in the same order with the
same values. A cell or row holds only some keys at some stages (a baseline row's cell has no ``p_adj``; the verdict adds
``raw_sign``, ``role``, ``claim``, ``family``): ``keys`` records which ones it has, in the order it has them, and
``to_json`` writes those. A key that is no field (a summary.json another version wrote) is kept in ``extra`` and
written back in its place: ``runs show`` reads an old sweep folder as before, and nothing is dropped.

Still plain JSON values inside :class:`Summary`: the split gains, domain versus general, the comparison against base,
the verdict and the flat records (their own types are the next step of the issue)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Optional

CELL_KEYS = ("value", "value_lo", "value_hi", "seeds", "delta", "lo", "hi", "sign", "method", "n", "p", "best",
             "raw_sign", "p_adj", "role", "claim", "family")
"""Every key a table cell (or a row's held-out / general Δ) may hold in summary.json."""


def _typed(cls, d: dict) -> dict:
    """``d`` as ``cls``'s keyword arguments: its fields, and every other key (a summary.json an older or newer version
    wrote) kept in ``extra``, so that nothing is dropped and ``to_json`` writes it back in its place."""
    names = {f.name for f in fields(cls)} - {"keys", "extra"}
    return {**{k: v for k, v in d.items() if k in names}, "extra": {k: v for k, v in d.items() if k not in names}}


def _get(obj, k: str):
    """Key ``k`` of a typed value: its field, or what ``extra`` kept."""
    return obj.extra[k] if k in obj.extra else getattr(obj, k)


@dataclass(frozen=True)
class Cell:
    """One (category, mode) value of a row and its Δ against ``full``.

    ``value`` (mean over the row's runs), ``value_lo`` / ``value_hi`` (its 95% t-interval with several runs),
    ``seeds`` (how many runs), ``delta`` / ``lo`` / ``hi`` (Δ against full and its 95% interval), ``sign`` (the
    verdict's mark after multiplicity control: +1 / -1 / 0, None untested), ``raw_sign`` (the interval's alone),
    ``method`` (what the interval covers), ``n`` (units), ``p`` / ``p_adj`` (raw / adjusted), ``best``, ``role``
    (primary / secondary / exploratory), ``claim`` (strategy / checkpoint), ``family`` (vs full / vs base)."""

    value: Optional[float] = None
    value_lo: Optional[float] = None
    value_hi: Optional[float] = None
    seeds: Optional[int] = None
    delta: Optional[float] = None
    lo: Optional[float] = None
    hi: Optional[float] = None
    sign: Optional[int] = None
    method: Optional[str] = None
    n: Optional[int] = None
    p: Optional[float] = None
    best: Optional[bool] = None
    raw_sign: Optional[int] = None
    p_adj: Optional[float] = None
    role: Optional[str] = None
    claim: Optional[str] = None
    family: Optional[str] = None
    keys: tuple[str, ...] = CELL_KEYS
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "Cell":
        return cls(**_typed(cls, d), keys=tuple(d))

    def to_json(self) -> dict:
        return {k: _get(self, k) for k in self.keys}

    @classmethod
    def delta_of(cls, d: Optional[dict], prefix: str = "") -> Optional["Cell"]:
        """A Δ with its interval and mark read off a part of the summary not typed yet (a gain's flat keys
        ``<prefix>``, ``<prefix>_lo``, ``_hi``, ``_sign``; a domain or base entry's ``delta``, ``lo``, ``hi``,
        ``sign``); None for None."""
        if d is None:
            return None
        if prefix:
            return cls(delta=d.get(prefix), lo=d.get(f"{prefix}_lo"), hi=d.get(f"{prefix}_hi"),
                       sign=d.get(f"{prefix}_sign"), keys=("delta", "lo", "hi", "sign"))
        return cls(delta=d.get("delta"), lo=d.get("lo"), hi=d.get("hi"), sign=d.get("sign"),
                   keys=("delta", "lo", "hi", "sign"))

    @property
    def interval(self) -> Optional[tuple[float, float]]:
        """The Δ's 95% interval, None without one."""
        return None if self.lo is None or self.hi is None else (self.lo, self.hi)

    @property
    def value_interval(self) -> Optional[tuple[float, float]]:
        """The value's 95% t-interval over runs, None with one run."""
        return None if self.value_lo is None or self.value_hi is None else (self.value_lo, self.value_hi)

    def unmarked(self) -> "Cell":
        """The same cell without the verdict's mark (checkpoint comparisons: no ▲ / ▼, issue 50)."""
        return replace(self, sign=None)


def _cell(d: Optional[dict]) -> Optional[Cell]:
    return None if d is None else Cell.from_json(d)


def _cell_json(c: Optional[Cell]) -> Optional[dict]:
    return None if c is None else c.to_json()


ROW_KEYS = ("name", "strategy", "split", "seeds", "cells", "final_loss", "heldout_loss", "heldout_delta",
            "general_loss", "general_delta", "heldout_best")


@dataclass(frozen=True)
class Row:
    """One row of a task's table: a plan (a trial, or the mean of its runs) with its cells by category and mode, the
    last step's training loss, the held-out loss and the general probe's loss, with their Δ against ``full`` (None for
    ``full`` itself), and ``heldout_best`` when the verdict found it best on the held-out loss."""

    name: str = ""
    strategy: Optional[str] = None
    split: Optional[float] = None
    seeds: tuple = ()
    cells: dict[str, dict[str, Cell]] = field(default_factory=dict)
    final_loss: Optional[float] = None
    heldout_loss: Optional[float] = None
    heldout_delta: Optional[Cell] = None
    general_loss: Optional[float] = None
    general_delta: Optional[Cell] = None
    heldout_best: Optional[bool] = None
    keys: tuple[str, ...] = ROW_KEYS[:-1]
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        kw = _typed(cls, d)
        kw["seeds"] = tuple(d.get("seeds") or ())
        kw["cells"] = {c: {m: Cell.from_json(x) for m, x in modes.items()}
                       for c, modes in (d.get("cells") or {}).items()}
        kw["heldout_delta"], kw["general_delta"] = _cell(d.get("heldout_delta")), _cell(d.get("general_delta"))
        return cls(**kw, keys=tuple(d))

    def to_json(self) -> dict:
        out = {}
        for k in self.keys:
            v = _get(self, k)
            if k == "seeds":
                v = list(v)
            elif k == "cells":
                v = {c: {m: x.to_json() for m, x in modes.items()} for c, modes in v.items()}
            elif k in ("heldout_delta", "general_delta"):
                v = _cell_json(v)
            out[k] = v
        return out

    def cell(self, category: str, mode: str) -> Optional[Cell]:
        """The (category, mode) cell, None when the row has none."""
        return self.cells.get(category, {}).get(mode)

    @property
    def runs(self) -> int:
        """How many runs the row averages (one when it names none)."""
        return len(self.seeds or [None])


SUMMARY_KEYS = ("tables", "split_gains", "domain_general", "base", "records", "roles", "verdict", "sb_vs_gain",
                "split_like_best", "horizon", "num_layers", "recommended_split", "trials", "tuning", "files")


@dataclass(frozen=True)
class Summary:
    """What a sweep's summary holds (``summary.json``): per task the rows of its table (:class:`Row`), the split
    gains, domain versus general, the comparison against base, the flat records, the tasks' roles, the verdict, S(b)
    against the gain, the splits the trace cannot tell apart, the horizon line; as written: the model's depth, the
    trace's recommended split and the trials (without per-question data)."""

    tables: dict[str, tuple[Row, ...]] = field(default_factory=dict)
    split_gains: dict = field(default_factory=dict)
    domain_general: list = field(default_factory=list)
    base: dict = field(default_factory=dict)
    records: list = field(default_factory=list)
    roles: dict = field(default_factory=dict)
    verdict: dict = field(default_factory=dict)
    sb_vs_gain: dict = field(default_factory=dict)
    split_like_best: dict = field(default_factory=dict)
    horizon: Optional[str] = None
    num_layers: Optional[int] = None
    recommended_split: Optional[float] = None
    trials: list = field(default_factory=list)
    tuning: Any = None
    files: list = field(default_factory=list)
    keys: tuple[str, ...] = SUMMARY_KEYS[:10]
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "Summary":
        kw = {k: _plain(v) for k, v in _typed(cls, d).items()}
        kw["tables"] = {task: tuple(Row.from_json(r) for r in rows) for task, rows in (d.get("tables") or {}).items()}
        return cls(**kw, keys=tuple(d))

    def to_json(self) -> dict:
        out = {}
        for k in self.keys:
            v = _get(self, k)
            out[k] = {task: [r.to_json() for r in rows] for task, rows in v.items()} if k == "tables" else v
        return out

    def written(self, **parts) -> "Summary":
        """The summary with ``parts`` set (what :func:`raycpt.report.sweep.summary.write_summary` adds: the model's
        depth, the trace's recommended split, the trials); a key it did not hold yet comes after the others, as a
        dict's ``update`` places it."""
        return replace(self, **{k: _plain(v) for k, v in parts.items()},
                       keys=self.keys + tuple(k for k in parts if k not in self.keys))

    def first_rows(self) -> tuple[Row, ...]:
        """The first task's rows (the task the compact views read), empty without tables."""
        return next(iter(self.tables.values()), ())


def _plain(v):
    """A JSON value as summary.json reads back: tuples as lists (the parts of :class:`Summary` not typed yet)."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def as_summary(summary) -> Summary:
    """``summary`` typed: a :class:`Summary` as it is, a summary dict (``build_summary``'s, or summary.json read
    back) through :meth:`Summary.from_json`."""
    return summary if isinstance(summary, Summary) else Summary.from_json(summary)


def as_rows(rows) -> tuple[Row, ...]:
    """A task's rows typed (dicts through :meth:`Row.from_json`)."""
    return tuple(r if isinstance(r, Row) else Row.from_json(r) for r in rows)
