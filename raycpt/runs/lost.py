"""A tracking server that stops answering: recorded once (``tracking_lost.json`` in the run folder), every later
MLflow call skipped, the run going on locally; ``raycpt runs sync`` replays the folder later."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from raycpt.errors import ServerUnreachable
from raycpt.io import atomic_write_json
from raycpt.runs.store import ensure_store


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


def store_or_lost(where, lost_dir, since: float = 0.0) -> Optional[str]:
    """The experiment id (:func:`ensure_store` of ``where``, a :class:`raycpt.runs.location.RunLocation`), or None
    when the tracking server is gone: found so by this process, by another one of the same job (``lost_dir``'s
    :data:`LOST_FILE`, written at or after ``since``), or not answering now (then recorded in ``lost_dir``). A job's
    later units (sweep trials) then run locally."""
    if tracking_lost() or adopt_lost(lost_dir, since):
        return None
    try:
        return ensure_store(where)
    except ServerUnreachable as e:
        mark_lost(where.uri, error=str(e), run_dir=lost_dir)
        return None
    except Exception as e:  # noqa: BLE001 - the probe passed, then the store's first call found it gone
        if not unreachable(e):
            raise
        mark_lost(where.uri, error=str(e), run_dir=lost_dir)
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
