"""Where a run lives, resolved once: :class:`RunLocation` (the run root, absolute; the MLflow tracking URI; the
folders derived from the root) made by :func:`locate` where a command starts and carried from there, in
:class:`raycpt.jobs.job.Options`, the :class:`raycpt.runs.run.Run` and a grid's trial config, to everything that
records or reads under the run root. Nothing downstream reads ``tracking.run_root`` or ``tracking.uri`` again."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

from raycpt.errors import RaycptError
from raycpt.runs.store import check_store

PACKED, BASE_EVAL, BASE_SHARDS, DECISIONS, STORE_DB = "packed", "base_eval", "base_shards", "decisions", "mlflow.db"
"""The run root's shared folders (packed-token stores by default, the base row's cache, the base model's shards,
``raycpt decide``'s records) and the default SQLite store."""


@dataclass(frozen=True)
class RunLocation:
    """The run root and the MLflow store of one command, resolved once (:func:`locate`)."""

    root: Path
    """``tracking.run_root`` absolute (``~`` expanded, links resolved)."""
    uri: str
    """The MLflow URI: ``tracking.uri``, else ``$RAYCPT_TRACKING_URI``, else ``sqlite:///<root>/mlflow.db``; a
    relative SQLite path made absolute."""
    experiment: str = "raycpt"
    """``tracking.experiment``."""
    wait_s: float = 0.0
    """``tracking.wait_s``: how long the store's check waits for a server."""
    checked: bool = False
    """Whether the store was checked when the location was made (:func:`raycpt.runs.store.check_store`: the scheme,
    a server that answers, a writable run root)."""

    @property
    def packed(self) -> Path:
        """``<root>/packed``: the packed-token stores unless ``data.store_dir`` names another folder."""
        return self.root / PACKED

    @property
    def base_eval(self) -> Path:
        """``<root>/base_eval``: the base row's cache (:mod:`raycpt.jobs.base_row`)."""
        return self.root / BASE_EVAL

    @property
    def base_shards(self) -> Path:
        """``<root>/base_shards``: the base model's per-layer shards, written once per run root."""
        return self.root / BASE_SHARDS

    @property
    def decisions(self) -> Path:
        """``<root>/decisions``: ``raycpt decide``'s records (:mod:`raycpt.decide.record`)."""
        return self.root / DECISIONS

    def pin(self, tracking) -> None:
        """Write the resolved root and URI into ``tracking`` (a ``TrackingConfig``) in place: the config a run folder
        saves, and every Ray worker reads, names them absolute (a worker's working directory differs)."""
        tracking.run_root = str(self.root)
        tracking.uri = self.uri

    def as_dict(self) -> dict:
        """Plain values (a grid's trial config carries them to its trial processes): :func:`from_dict` reads them."""
        return {**dataclasses.asdict(self), "root": str(self.root)}


def from_dict(doc: dict) -> RunLocation:
    """The location :meth:`RunLocation.as_dict` wrote (nothing resolved again)."""
    return RunLocation(**{**doc, "root": Path(doc["root"])})


def resolve_root(run_root: str) -> Path:
    """``run_root`` absolute: ``~`` expanded, relative to the working directory, links resolved; one line when ``~``
    names a home folder this process does not have."""
    try:
        return Path(run_root).expanduser().resolve()
    except RuntimeError:  # pathlib's "Could not determine home directory."
        raise RaycptError(f"tracking.run_root {run_root!r}: ~ names the home folder, but this process has none "
                          "($HOME is not set): write the path in full") from None


def resolve_uri(uri, root: Path) -> str:
    """The MLflow URI: ``uri`` (the config's), or ``$RAYCPT_TRACKING_URI`` (which a cluster sets to its server), a
    relative SQLite path made absolute; else ``sqlite:////abs/root/mlflow.db``."""
    given = uri or os.environ.get("RAYCPT_TRACKING_URI")
    if not given:
        return f"sqlite:///{root / STORE_DB}"
    if given.startswith("sqlite:///") and not given.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(given[len("sqlite:///"):]).resolve())
    return given


def locate(tracking, check: bool = True) -> RunLocation:
    """THE resolver: the location of ``tracking`` (a ``TrackingConfig``), made once where a command starts; with
    ``check``, its store checked first (:func:`raycpt.runs.store.check_store`: one line for a bad scheme, a server
    that does not answer, an unwritable run root)."""
    root = resolve_root(tracking.run_root)
    where = RunLocation(root, resolve_uri(tracking.uri, root), tracking.experiment, tracking.wait_s)
    return checked(where) if check else where


def checked(where: RunLocation) -> RunLocation:
    """``where`` with its store checked (:func:`raycpt.runs.store.check_store`); one already checked as it is."""
    if where.checked:
        return where
    check_store(where)
    return dataclasses.replace(where, checked=True)
