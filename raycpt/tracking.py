"""MLflow as a projection of run folders: where the store lives, and the one translation of a run folder's
records into MLflow calls.

The default store is SQLite in the run root, by absolute path, created by the driver (:func:`ensure_store`) before
any trial logs, so concurrent first writers never race on the schema migration. A run's params, metrics, tags and
files are records in its folder (:data:`RECORDS`, written by :class:`raycpt.runs.Run`); :func:`project` sends one
record to MLflow by run id, live as it is written and again, the same function, for ``raycpt runs sync``. Only a
run's owner (:mod:`raycpt.runs`) starts and ends it. A server that stops answering (:func:`mark_lost`) leaves the
rest of the command local: the folder has it all. Inside Ray workers only rank 0 logs (the callers check the rank).
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import math
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any, Optional
from urllib.parse import urlsplit

from raycpt.cluster import check_store
from raycpt.config import TrackingConfig
from raycpt.errors import RaycptError, ServerUnreachable
from raycpt.io import atomic_write_json, cache_root, run_root

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
"""MLflow 3's UI picks an experiment's first view from this tag: model training opens on the runs table
(without it, MLflow 3.17 opens on the GenAI traces overview)."""


def tracking_uri(cfg: TrackingConfig) -> str:
    """The MLflow URI: the configured one (or ``$RAYCPT_TRACKING_URI``, which a cluster sets to its
    server), else ``sqlite:////abs/run_root/mlflow.db``."""
    if cfg.uri or os.environ.get("RAYCPT_TRACKING_URI"):
        uri = cfg.uri or os.environ["RAYCPT_TRACKING_URI"]
        if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
            uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).resolve())
        return uri
    return f"sqlite:///{run_root(cfg) / 'mlflow.db'}"


def ensure_store(cfg: TrackingConfig) -> str:
    """Create the store and the experiment from the driver; return the experiment id. A store that cannot be
    opened (a corrupt ``mlflow.db``, a file that is not a database, a database URI whose driver is not
    installed) is one line; a new SQLite store is created under a file lock, so two commands starting at
    once on a fresh run root do not race on its schema (one waits for the other)."""
    check_store(cfg)  # one line for a bad scheme, a server that does not answer, an unwritable run root
    uri = tracking_uri(cfg)
    try:
        with _store_lock(uri):
            return _ensure_store(cfg, uri)
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
    if path.is_file() and template_ok(path):
        return path
    with open(folder / ".lock", "a+") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        if path.is_file() and not template_ok(path):  # damaged in the cache: it would break every new run root
            logging.getLogger(__name__).warning("warning: the cached MLflow store template %s is damaged: made again",
                                                path)
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
    return path


def template_ok(path: Path) -> bool:
    """Whether the cached store template is a whole SQLite database with MLflow's schema revision in it."""
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            ok = con.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            return ok and con.execute("SELECT version_num FROM alembic_version").fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error:
        return False


def _ensure_store(cfg: TrackingConfig, uri: str) -> str:
    import mlflow

    if uri.startswith("sqlite:///"):
        new_sqlite_store(Path(uri[len("sqlite:///"):]))
    os.environ["MLFLOW_TRACKING_URI"] = uri
    mlflow.set_tracking_uri(uri)
    client = mlflow.tracking.MlflowClient(uri)
    if client.get_experiment_by_name(cfg.experiment) is None and uri.startswith("sqlite:"):
        # artifacts next to the store, not in ./mlruns of whatever folder the command runs from
        art = (Path(uri[len("sqlite:///"):]).parent / "mlartifacts").as_uri()
        try:
            client.create_experiment(cfg.experiment, artifact_location=art)
        except Exception:  # noqa: BLE001 - another process created it first
            pass
    exp = mlflow.set_experiment(cfg.experiment)
    if exp.tags.get(EXPERIMENT_KIND_TAG) != EXPERIMENT_KIND:  # the UI then opens on the runs table
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def runs_url(experiment_id: str, host: str = "127.0.0.1", port: int = 5000) -> str:
    """The MLflow UI's runs table of an experiment (parent runs with their children)."""
    return f"http://{host}:{port}/#/experiments/{experiment_id}/runs"


def flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def log_points(client, run_id: str, series) -> int:
    """``(key, step, value)`` points into a run, in batches of MLflow's 1000 per call (one call for a scan's 30
    layers instead of 30: 0.12 s -> 0.01 s per trial on SQLite, measured); only finite values, names as
    :func:`clean_metrics` makes them. Returns how many were logged."""
    from mlflow.entities import Metric

    ts = int(time.time() * 1000)
    points = [Metric(k, v, ts, int(step)) for key, step, value in series
              for k, v in clean_metrics({key: value}).items()]
    for i in range(0, len(points), 1000):
        client.log_batch(run_id, metrics=points[i:i + 1000])
    return len(points)


def clean_metrics(metrics: dict) -> dict[str, float]:
    """The finite numeric values of ``metrics`` as floats, names sanitised for MLflow (``/`` and ``.`` kept)."""
    clean = {}
    for k, v in metrics.items():
        try:
            f = float(v)
        except (TypeError, ValueError):
            continue
        if math.isfinite(f):
            clean[k.replace(" ", "_").replace("(", "").replace(")", "")] = f
    return clean


# ------------------------------------------------------------------------------------- a server that went away
LOST_FILE = "tracking_lost.json"
"""In a run folder: the tracking server stopped answering during this run (``uri``, ``since_step``, ``error``);
``raycpt runs sync RUN_DIR`` replays the folder into a store and removes it."""
_lost: dict = {}


def unreachable(e: BaseException) -> bool:
    """Whether ``e`` says the tracking server did not answer (refused, reset, timed out, retries exhausted), as
    opposed to an answer that refused the call (a bad request, a param that may not change)."""
    seen, cur = set(), e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        names = {c.__name__ for c in type(cur).__mro__}
        if names & {"ConnectionError", "ConnectTimeout", "ReadTimeout", "Timeout", "MaxRetryError",
                    "NewConnectionError", "ProtocolError", "RemoteDisconnected", "ConnectionRefusedError",
                    "ConnectionResetError", "TimeoutError"}:
            return True
        text = str(cur)
        if "API request to" in text and ("Max retries exceeded" in text or "Connection" in text):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


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


def missing_run(cfg: TrackingConfig, run_id: Optional[str]) -> bool:
    """Whether the store of ``cfg`` answers that it has no run ``run_id`` (a store replaced or deleted, a folder
    copied from another run root); False when it has it, or for no id."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    if not run_id:
        return False
    ensure_store(cfg)
    try:
        MlflowClient(tracking_uri(cfg)).get_run(run_id)
    except MlflowException as e:
        if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
            raise
        return True
    return False


def tracking_lost() -> Optional[dict]:
    """This process's record of a tracking server that stopped answering (None while it answers)."""
    return dict(_lost) if _lost else None


def mark_lost(uri: str, since_step: Optional[int] = None, error: str = "", run_dir=None) -> dict:
    """Record (once) that the server at ``uri`` stopped answering: later calls through :func:`tracked` are skipped
    and MLflow's own retries are turned off in this process, so nothing waits on it again; with ``run_dir`` the
    record is also written to its :data:`LOST_FILE` (the driver reads what a worker saw)."""
    if not _lost:
        _lost.update(uri=uri, since_step=since_step, error=str(error).splitlines()[0][:300] if error else "")
        os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
        os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = "5"
    if run_dir is not None and not (Path(run_dir) / LOST_FILE).is_file():
        try:
            atomic_write_json(Path(run_dir) / LOST_FILE, dict(_lost))
        except OSError:
            pass
    return dict(_lost)


def read_lost(run_dir) -> Optional[dict]:
    """A run folder's :data:`LOST_FILE` record, or None."""
    try:
        return json.loads((Path(run_dir) / LOST_FILE).read_text())
    except (OSError, ValueError):
        return None


def adopt_lost(run_dir, since: float = 0.0) -> Optional[dict]:
    """What a worker wrote to ``run_dir``'s :data:`LOST_FILE` at or after ``since`` (a file left by an earlier
    attempt that was never synced does not count), taken over by this process (then its own calls to the server
    are skipped too); None when the workers saw the server answer."""
    try:
        fresh = (Path(run_dir) / LOST_FILE).stat().st_mtime >= since
    except OSError:
        return None
    rec = read_lost(run_dir) if fresh else None
    if rec is not None:
        mark_lost(rec.get("uri", ""), rec.get("since_step"), rec.get("error", ""))
    return rec


def store_or_lost(cfg: TrackingConfig, lost_dir, since: float = 0.0) -> Optional[str]:
    """The experiment id (:func:`ensure_store`), or None when the tracking server is gone: found so by this
    process, by another one of the same job (``lost_dir``'s :data:`LOST_FILE`, written at or after ``since``), or
    not answering now (then recorded in ``lost_dir``). A job's later units (sweep trials) then run locally."""
    if tracking_lost() or adopt_lost(lost_dir, since):
        return None
    try:
        return ensure_store(cfg)
    except ServerUnreachable as e:
        mark_lost(tracking_uri(cfg), error=str(e), run_dir=lost_dir)
        return None
    except Exception as e:  # noqa: BLE001 - the probe passed, then the store's first call found it gone
        if not unreachable(e):
            raise
        mark_lost(tracking_uri(cfg), error=str(e), run_dir=lost_dir)
        return None


def tracked(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (an MLflow call) unless the server was found gone (:func:`call_unless_lost`, the
    server named by ``MLFLOW_TRACKING_URI``)."""
    return call_unless_lost(fn, args, kwargs, os.environ.get("MLFLOW_TRACKING_URI", ""))


def call_unless_lost(fn, args: tuple, kwargs: dict, uri: str, step: Optional[int] = None, run_dir=None):
    """``fn(*args, **kwargs)`` (an MLflow call) unless the server at ``uri`` was found gone; the first call that
    finds it gone (it does not answer) records that (:func:`mark_lost`, with the step whose record did not arrive
    and, with ``run_dir``, in the run folder) and returns None instead of raising: the run goes on locally, later
    calls are skipped. Any other error is raised."""
    if _lost:
        return None
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - only a server that does not answer is swallowed
        if not unreachable(e):
            raise
        mark_lost(uri, step, str(e), run_dir)
        return None


def lost_line(run_dir, rec: Optional[dict] = None) -> str:
    """The one warning line of a run that finished while its tracking server was gone."""
    rec = rec or tracking_lost() or {}
    since = f"since step {rec['since_step']}" if rec.get("since_step") else "at the end of the run"
    return (f"warning: tracking server {rec.get('uri') or 'of this run'} unreachable {since}: results are in "
            f"{run_dir}; sync them with `raycpt runs sync {run_dir}` (add --tracking-uri URI for another store)")


# ------------------------------------------------------------------------------------- the projection
RECORDS = "records.jsonl"
"""In a run folder: every record its MLflow run gets (params, metrics, tags, files, tables, texts, children), one
JSON object a line, in order. The folder is the record; :func:`project` sends one record to MLflow, live as the job
writes it and again, the same code, for ``raycpt runs sync``."""


def record_kind(rec: dict) -> str:
    """The kind of a record: its one key among :data:`KINDS`."""
    for k in KINDS:
        if k in rec:
            return k
    raise ValueError(f"not a run record: {sorted(rec)}")


KINDS = ("params", "metrics", "points", "tags", "artifact", "table", "text", "children")


class Seen:
    """What a run in the store already has (params, metric points, artifact paths), read lazily: a record is
    projected only where the run lacks it, so a replay of a folder adds nothing twice. ``None`` in place of a
    :class:`Seen` (live logging) projects without looking."""

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id
        self._params: Optional[dict] = None
        self._tags: Optional[dict] = None
        self._history: dict[str, collections.Counter] = {}
        self._artifacts: dict[str, set] = {}

    def params(self) -> dict:
        if self._params is None:
            data = self.client.get_run(self.run_id).data
            self._params, self._tags = dict(data.params), dict(data.tags)
        return self._params

    def tags(self) -> dict:
        self.params()
        return self._tags

    def points(self, key: str) -> "collections.Counter":
        """The run's ``(step, value)`` points of ``key``, counted: a point the folder holds twice (logged twice live)
        is in the store twice, so a replay matches the store point for point."""
        if key not in self._history:
            self._history[key] = collections.Counter((m.step, m.value)
                                                     for m in self.client.get_metric_history(self.run_id, key))
        return self._history[key]

    def artifacts(self, folder: Optional[str]) -> set:
        key = folder or ""
        if key not in self._artifacts:
            self._artifacts[key] = {a.path for a in self.client.list_artifacts(self.run_id, folder or None)}
        return self._artifacts[key]


def record_path(base: Path, path: str) -> Path:
    """A record's file: relative to its run folder (``base``), or absolute."""
    p = Path(path)
    return p if p.is_absolute() else Path(base) / p


def project(client, run_id: str, rec: dict, base: Path, seen: Optional[Seen] = None) -> int:
    """THE translation of one run record into MLflow calls on ``run_id`` (the projection): live with
    ``seen`` None, in a replay with the run's :class:`Seen` (then only what the run lacks). ``base`` is the folder
    the record's files are relative to. Returns how many items were sent. A ``children`` record is the sync's
    (:func:`raycpt.runs.sync_tree`): nothing to send."""
    kind = record_kind(rec)
    if kind == "params":
        return _project_params(client, run_id, rec["params"], seen)
    if kind in ("metrics", "points"):
        pts = ([(k, int(rec.get("step") or 0), v) for k, v in rec["metrics"].items()] if kind == "metrics"
               else [tuple(p) for p in rec["points"]])
        if seen is not None:  # each point the store has already stands for one of the folder's
            pts = [(k, s, v) for k, s, v in pts if not _consume(seen.points(k), (s, float(v)))]
        return log_points(client, run_id, pts)
    if kind == "tags":
        from mlflow.entities import RunTag

        tags = {k: str(v)[:5000] for k, v in rec["tags"].items()}
        if seen is not None:
            tags = {k: v for k, v in tags.items() if seen.tags().get(k) != v}
            seen.tags().update(tags)
        if tags:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in tags.items()])
        return len(tags)
    if kind == "artifact":
        f, folder = record_path(base, rec["artifact"]), rec.get("dir")
        if not f.exists() or (seen is not None and (f"{folder}/{f.name}" if folder else f.name)
                              in seen.artifacts(folder)):
            return 0
        (client.log_artifacts if f.is_dir() else client.log_artifact)(run_id, str(f), folder)
        return 1
    if kind == "table":  # log_table appends to a table that exists: a resumed job's second summary is left out
        folder = str(Path(rec["file"]).parent) if "/" in rec["file"] else None
        if rec["file"] in (seen or Seen(client, run_id)).artifacts(folder):
            return 0
        client.log_table(run_id, data=rec["table"], artifact_file=rec["file"])
        return 1
    if kind == "text":
        folder = str(Path(rec["file"]).parent) if "/" in rec["file"] else None
        if seen is not None and rec["file"] in seen.artifacts(folder):
            return 0
        client.log_text(run_id, rec["text"], rec["file"])
        return 1
    return 0


def _consume(counts: "collections.Counter", point) -> bool:
    """Whether ``point`` is among ``counts`` (then one of it is used up)."""
    if counts[point] > 0:
        counts[point] -= 1
        return True
    return False


def _project_params(client, run_id: str, params: dict, seen: Optional[Seen]) -> int:
    """Params the run lacks; a value it has is never changed (MLflow refuses that: a resumed run re-logs its
    params, and a changed one keeps the value it was made with)."""
    from mlflow.entities import Param
    from mlflow.exceptions import MlflowException

    have = seen.params() if seen is not None else {}
    new = [Param(k, str(v)[:500]) for k, v in params.items() if v is not None and k not in have]
    sent = 0
    for i in range(0, len(new), 100):
        try:
            client.log_batch(run_id, params=new[i:i + 100])
            sent += len(new[i:i + 100])
        except MlflowException as e:
            if unreachable(e):
                raise
            for p in new[i:i + 100]:  # one param that may not change must not lose the others
                with contextlib.suppress(MlflowException):
                    client.log_param(run_id, p.key, p.value)
                    sent += 1
    if seen is not None:
        have.update({p.key: p.value for p in new})
    return sent


def read_records(folder: Path) -> list[dict]:
    """The records of a run folder, in order (a line cut short by a kill is left out)."""
    path = Path(folder) / RECORDS
    out = []
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and any(k in rec for k in KINDS):
                out.append(rec)
    return out


def append_record(folder: Path, rec: dict) -> None:
    """One record appended to ``folder``'s :data:`RECORDS` (one write of one line: a kill leaves at most that
    line cut short, which :func:`read_records` skips)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    line = json.dumps(rec, allow_nan=False, default=str) + "\n"
    with open(Path(folder) / RECORDS, "a", encoding="utf-8") as f:
        f.write(line)
