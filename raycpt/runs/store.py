"""The MLflow store a run root records into: its URI (SQLite in the run root by absolute path, or a server),
made once per root from a template of the installed MLflow's schema, checked writable, browsed at ``runs_url``."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Callable, Optional
from urllib.parse import urlparse, urlsplit

from raycpt.errors import RaycptError, ServerUnreachable
from raycpt.io import cache_root, seal_problem, write_seal


EXPERIMENT_KIND_TAG = "mlflow.experimentKind"


EXPERIMENT_KIND = "custom_model_development"
"""MLflow 3's UI picks an experiment's first view from this tag: model training opens on the runs table
(without it, MLflow 3.17 opens on the GenAI traces overview)."""


def ensure_store(where) -> str:
    """Create the store and the experiment from the driver; return the experiment id. A store that cannot be
    opened (a corrupt ``mlflow.db``, a file that is not a database, a database URI whose driver is not
    installed) is one line; a new SQLite store is created under a file lock, so two commands starting at
    once on a fresh run root do not race on its schema (one waits for the other). ``where``: the command's
    :class:`raycpt.runs.location.RunLocation`."""
    check_store(where)  # one line for a bad scheme, a server that does not answer, an unwritable run root
    uri = where.uri
    try:
        with _store_lock(uri):
            return _ensure_store(where.experiment, uri)
    except ModuleNotFoundError as e:
        raise RaycptError(f"tracking.uri {_safe_uri(uri)}: its database driver is not installed (no module "
                          f"{e.name!r}); pip install it (e.g. psycopg2-binary for postgresql://, pymysql for "
                          "mysql+pymysql://) or leave tracking.uri empty for SQLite in the run root") from None
    except Exception as e:  # noqa: BLE001 - only the store's own errors become one line
        if not _store_error(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise RaycptError(f"tracking.uri {_safe_uri(uri)}: the MLflow store cannot be opened ({first}); is it an "
                          "MLflow database? Move it aside (a new one is made) or name another store") from None


def _safe_uri(uri: str) -> str:
    """``uri`` without a password (``scheme://user:***@host/db``)."""
    parts = urlsplit(uri)
    if parts.password:
        return uri.replace(f":{parts.password}@", ":***@", 1)
    return uri


def _store_error(e: BaseException) -> bool:
    """An error of the store itself (SQLAlchemy, the DB-API, MLflow's own), not a bug of ours."""
    names = {c.__module__.split(".")[0] for c in type(e).__mro__}
    return bool(names & {"sqlalchemy", "sqlite3", "mlflow", "alembic", "psycopg2", "pymysql", "MySQLdb"})


@contextlib.contextmanager
def _store_lock(uri: str):
    """An exclusive ``flock`` on ``<db>.lock`` next to a SQLite store while it is created (no-op otherwise)."""
    if not uri.startswith("sqlite:///"):
        yield
        return
    import fcntl

    db = Path(uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(f".{db.name}.lock"), "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


STORE_TEMPLATES = "mlflow-store"
"""Folder of the user's cache (:func:`raycpt.io.cache_root`) holding one empty SQLite store per MLflow schema."""


def new_sqlite_store(db: Path) -> bool:
    """Make the new SQLite store ``db`` a copy of an empty store of this MLflow's schema, kept in the user's cache
    (made there once, by MLflow's own table creation and migrations, under a lock): a new run root then opens its
    store in milliseconds instead of replaying every schema migration (~5 s here). The template holds the tables
    at the newest revision and no experiment, so MLflow adds its Default experiment at the new store's first open,
    with that store's artifact root. Returns whether ``db`` was made; False (MLflow creates the store itself)
    when ``db`` exists or the template cannot be had."""
    if db.exists():
        return False
    try:
        template = _store_template()
        tmp = db.with_name(f".{db.name}.{os.getpid()}.tmp")
        shutil.copyfile(template, tmp)
        os.replace(tmp, db)
        return True
    except Exception:  # noqa: BLE001 - an older or newer MLflow without these helpers: the slow way
        return False


def _store_template() -> Path:
    import fcntl

    import mlflow
    import sqlalchemy
    from mlflow.store.db import utils as db_utils

    folder = cache_root() / STORE_TEMPLATES
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"mlflow-{mlflow.__version__}.db"  # a release's schema is fixed: its newest migration
    if path.is_file() and template_problem(path) is None:
        return path
    with open(folder / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        why = template_problem(path) if path.is_file() else None
        if why is not None:  # damaged or changed in the cache: it would be every new run root's store
            logging.getLogger(__name__).warning("warning: the cached MLflow store template %s does not verify (%s): "
                                                "made again", path, why)
            path.unlink()
        if not path.is_file():
            tmp = folder / f".{path.name}.{os.getpid()}.tmp"
            tmp.unlink(missing_ok=True)
            engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
            quiet = [logging.getLogger(n) for n in ("mlflow.store.db.utils", "alembic")]
            levels = [q.level for q in quiet]
            try:
                for q in quiet:  # no "creating tables" chatter around a command's own lines
                    q.setLevel(logging.WARNING)
                db_utils._initialize_tables(engine)
            finally:
                engine.dispose()
                for q, lv in zip(quiet, levels):
                    q.setLevel(lv)
            os.replace(tmp, path)
            write_seal(path)
    return path


def template_problem(path: Path) -> Optional[str]:
    """None when the cached store template verifies: its seal names its sha256 (a template changed after it was
    made, rows added or a table altered, does not match), and it is a whole SQLite database with MLflow's schema
    revision in it; else why not, in a few words (the seal: :func:`raycpt.io.seal_problem`)."""
    why = seal_problem(path, made="made")
    if why is not None:
        return why
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            if con.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                return "it is not a whole SQLite database"
            if con.execute("SELECT version_num FROM alembic_version").fetchone() is None:
                return "it holds no MLflow schema revision"
        finally:
            con.close()
    except (OSError, sqlite3.Error) as e:
        return f"it cannot be read as a SQLite database ({type(e).__name__})"
    return None


def _ensure_store(experiment: str, uri: str) -> str:
    import mlflow

    if uri.startswith("sqlite:///"):
        new_sqlite_store(Path(uri[len("sqlite:///"):]))
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient(uri)
    if client.get_experiment_by_name(experiment) is None and uri.startswith("sqlite:"):
        # artifacts next to the store, not in ./mlruns of whatever folder the command runs from
        art = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
        try:
            client.create_experiment(experiment, artifact_location=art)
        except Exception:  # noqa: BLE001 - another process created it first
            pass
    exp = mlflow.set_experiment(experiment)
    if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # the UI then opens on the runs table
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def runs_url(experiment_id: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """The MLflow UI's runs table of an experiment (parent runs with their children)."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs"


STORE_WRITE_ERRORS = ("unable to open database file", "attempt to write a readonly database",
                      "database or disk is full", "disk I/O error", "readonly database")
"""SQLite's words for a store it cannot write: its folder read-only (``chattr +i``, a read-only mount: the journal
cannot be made), its disk full, the device failing."""


def store_unwritable(e: Optional[BaseException]) -> Optional[str]:
    """SQLite's words (:data:`STORE_WRITE_ERRORS`) when ``e`` or its chain says the MLflow store cannot be written,
    else None."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        text = str(cur)
        found = next((w for w in STORE_WRITE_ERRORS if w in text), None)
        if found is not None and "OperationalError" in f"{type(cur).__name__} {text}":
            return found
        cur = cur.__cause__ or cur.__context__
    return None


def missing_run(where, run_id: Optional[str]) -> bool:
    """Whether the store at ``where`` (a :class:`raycpt.runs.location.RunLocation`) answers that it has no run
    ``run_id`` (a store replaced or deleted, a folder copied from another run root); False when it has it, or for no
    id."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if not run_id:
        return False
    ensure_store(where)
    try:
        MlflowClient(where.uri).get_run(run_id)
    except MlflowException as e:
        if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
        return True
    return False


#: schemes MLflow 3.x accepts as a tracking URI (the ``./mlruns`` file store is in maintenance mode)
TRACKING_SCHEMES = ("sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")


PROBE_TIMEOUT_S = 5.0


_checked: set[tuple[str, str]] = set()


# ------------------------------------------------------------------------------------- the store
def uri_scheme(uri: str) -> str:
    """``sqlite`` for ``sqlite:////x.db``, ``postgresql`` for ``postgresql+psycopg2://...``."""
    return urlparse(uri).scheme.split("+", 1)[0].lower()


def check_uri_scheme(uri: str) -> str:
    scheme = uri_scheme(uri)
    if scheme not in TRACKING_SCHEMES:
        raise RaycptError(
            f"tracking.uri {uri!r}: unknown scheme {scheme or '(none)'!r}; use http(s)://HOST:PORT (an MLflow "
            "server), sqlite:////abs/path/mlflow.db, a database URI, or leave it empty (SQLite in the run root)")
    return scheme


def probe_server(uri: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """One GET of the server's ``/health`` with a short timeout; raise one line if nothing answers."""
    url = uri.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - the user's own server
            r.read(64)
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):  # an authenticating proxy in front of MLflow: it answered
            return
        raise RaycptError(f"tracking.uri {uri}: {url} answered HTTP {e.code}; is this an MLflow server "
                          "(`mlflow server`, see cluster/README.md)?") from None
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        raise ServerUnreachable(f"tracking.uri {uri}: no MLflow server answers within {timeout:g} s ({reason}); start "
                          "one (cluster/README.md) or leave tracking.uri empty for SQLite in the run root") from None


def wait_for_server(uri: str, wait_s: float, poll_s: float = 2.0, say: Callable[[str], None] | None = None) -> None:
    """:func:`probe_server` until it answers or ``wait_s`` seconds have passed (``tracking.wait_s``: the RayJob's
    MLflow container may start after Ray's head is Ready), saying once that it waits; the last refusal, with the
    time waited, when it never answers. ``wait_s=0``: one probe."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            return probe_server(uri, timeout=min(PROBE_TIMEOUT_S, max(deadline - time.monotonic(), 0.5)))
        except ServerUnreachable as e:
            left = deadline - time.monotonic()
            if left <= 0:
                if wait_s > 0:
                    raise ServerUnreachable(f"{e} (waited {wait_s:g} s, tracking.wait_s)") from None
                raise
            if not said:
                (say or _stderr)(f"raycpt: waiting up to {wait_s:g} s for the MLflow server at {uri} (tracking.wait_s)")
                said = True
            time.sleep(min(poll_s, left))


def check_run_root(root: Path) -> None:
    """One line when the process could not create ``root`` or write in it. Creates nothing: a probe
    file is written (and removed) in ``root`` or, when it does not exist yet, its nearest existing parent,
    so a command refused later for another reason leaves no empty run root behind."""
    existing = root
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "Not a directory", str(existing))
        probe = existing / f".raycpt-write-check-{uuid.uuid4().hex[:8]}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RaycptError(f"tracking.run_root {str(root)!r} is not a writable folder "
                          f"({e.strerror or e}{': ' + str(e.filename) if e.filename else ''})") from None


def check_store(where) -> None:
    """Validate the tracking URI of ``where`` (a :class:`raycpt.runs.location.RunLocation`: its scheme; a server that
    answers, within ``where.wait_s`` seconds) and its run root (writable), once per process and setting. Caps
    MLflow's own HTTP retries (unless the user set them: 2 retries, backoff 1 s, 20 s per request; MLflow's defaults
    wait about 4 minutes) so a server that dies mid-run is found gone within seconds
    (:func:`raycpt.runs.lost.mark_lost`), and Ray workers started after this inherit them."""
    key = (str(where.root), where.uri)
    if key in _checked:
        return
    check_run_root(where.root)
    scheme = check_uri_scheme(where.uri)
    if scheme in ("http", "https"):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
        wait_for_server(where.uri, where.wait_s)
    _checked.add(key)


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def store_write_error(e: BaseException, uri: str) -> Optional[str]:
    """What the store said when it refused a write mid-way (a read-only or locked database, a full disk under
    it), as the bounded text of one line; None for an error that is not the store's own (a bug stays a bug)."""
    if not _store_error(e):
        return None
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return f"the MLflow store {_safe_uri(uri)} refused a write ({first})"
