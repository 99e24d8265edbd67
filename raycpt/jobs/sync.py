"""``raycpt runs sync RUN_DIR``: replay a run folder into an MLflow store, for a run whose tracking server went away
mid-run, or into another store (``--tracking-uri``).

The folder is the record (:data:`raycpt.runs.records.RECORDS`): every param, metric point, tag, file and table its run
got, in order, and the units nested under it (a grid's trials, a sweep's trace: ``children`` records naming their
folders). The sync walks that tree and sends each record through the same :func:`raycpt.runs.records.project` that
logged it live, with the run's :class:`raycpt.runs.records.Seen` so nothing is sent twice: a second sync, or two at
once (they take turns on a lock in the folder), adds nothing. Each run ends with its folder's status.

Which run a folder syncs into: in its own store (the config's ``tracking.uri``), the run its meta file names when the
store has it, else a new one whose id the meta file then names (``raycpt.synced_from`` keeps the old one); in another
store, the run ``synced.json`` names for that store, else a new one recorded there: the folder's own run id is never
rewritten for another store.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

from raycpt.config import load_config
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json
from raycpt.jobs.job import NoRun, Options
from raycpt.runs.folder import END_STATE, end_unit_states, owner_gone, read_state, write_state
from raycpt.runs.lost import LOST_FILE
from raycpt.runs.records import Seen, project, read_records, record_kind, record_path
from raycpt.runs.run import running_under
from raycpt.runs.location import locate, resolve_uri
from raycpt.runs.store import ensure_store, store_write_error
from raycpt.runs.trust import read_meta, trusted_records

STATUS = {**{state: status for status, state in END_STATE.items()}, "nonfinite": "FAILED"}
"""A folder's ``state.json`` status -> its run's MLflow status: :data:`raycpt.runs.folder.END_STATE` read backwards (a
run stopped on a non-finite loss ended FAILED)."""
SYNCED = "synced.json"
"""In a run folder: the run it was synced into in each store other than its own (``{uri: run id}``)."""


@dataclass
class Store:
    """The store a sync writes into."""

    client: object
    experiment_id: str
    uri: str
    own: bool  # the folder's own store (its config's tracking.uri)
    runs: list = field(default_factory=list)  # (folder, run id, created, items sent) per run synced
    missing: list = field(default_factory=list)  # what the records name and the folder no longer holds
    ended: list = field(default_factory=list)  # why a folder still saying running was ended (its command is gone)


def _run_folder(rest) -> Path:
    if not rest:
        raise RaycptError("runs sync: name the run folder, e.g. raycpt runs sync RUNS/train-NAME-ID")
    run_dir = Path(rest[0]).expanduser().resolve()
    for need in ("config.yaml", "state.json"):
        if not (run_dir / need).is_file():
            raise RaycptError(f"runs sync: {run_dir} is not a raycpt run folder (it has no {need})")
    return run_dir


def _open_store(run_dir: Path, tracking_uri: Optional[str]) -> Store:
    from mlflow.tracking import MlflowClient

    own = locate(load_config(run_dir / "config.yaml").tracking, check=False)  # the run's own, resolved once
    where = replace(own, uri=resolve_uri(tracking_uri, own.root)) if tracking_uri else own
    exp_id = ensure_store(where)  # one line for a store that does not answer
    return Store(MlflowClient(where.uri), exp_id, where.uri, own=where.uri == own.uri)


def _read_json(path: Path) -> dict:
    return read_meta(path)[0]


def _target_run(store: Store, folder: Path, meta: dict, meta_path: Path, parent_id: Optional[str]) -> tuple[str, bool]:
    """``(run id, created)`` of the run ``folder`` syncs into (see the module docstring)."""
    from mlflow.exceptions import MlflowException

    old = meta.get("mlflow_run_id") if store.own else _read_json(folder / SYNCED).get(store.uri)
    if old:
        try:
            store.client.get_run(old)
            return old, False
        except MlflowException:
            pass
    tags = {k: v for k, v in (meta.get("tags") or {}).items() if k != "mlflow.parentRunId"}
    tags.update({"mlflow.parentRunId": parent_id} if parent_id else {})
    synced_from = meta.get("mlflow_run_id")
    run = store.client.create_run(store.experiment_id, run_name=meta.get("run_name") or folder.name,
                                  tags={**tags, **({"raycpt.synced_from": synced_from} if synced_from else {})})
    run_id = run.info.run_id
    if store.own:
        atomic_write_json(meta_path, {**_read_json(meta_path), "mlflow_run_id": run_id,
                                      **({"synced_from": synced_from} if synced_from else {})})
    else:
        atomic_write_json(folder / SYNCED, {**_read_json(folder / SYNCED), store.uri: run_id})
    return run_id, True


def sync_tree(store: Store, folder: Path, meta_file: str = "state.json", parent_id: Optional[str] = None,
              parent_status: Optional[str] = None) -> Optional[str]:
    """One run folder and the units its records name, into ``store``; the run id (None: nothing to sync)."""
    meta_path = folder / meta_file
    meta = _read_json(meta_path)
    gone = owner_gone(meta) if meta_file == "state.json" else None
    if gone:  # its command is dead and never said how it ended: the run ends FAILED, and the folder says why
        meta = write_state(folder, status="failed", error=gone)
        store.ended.append(gone)
    records = read_records(folder)
    if not meta and not records:  # a unit that never began
        return None
    run_id, created = _target_run(store, folder, meta, meta_path, parent_id)
    seen = Seen(store.client, run_id)
    sent, children = 0, []
    for rec in records:
        if record_kind(rec) == "children":
            children += [(folder / rel, mf) for rel, mf in rec["children"] if (folder / rel, mf) not in children]
        else:
            if record_kind(rec) == "artifact" and not record_path(folder, rec["artifact"]).exists():
                store.missing.append(str(record_path(folder, rec["artifact"])))
            sent += project(store.client, run_id, rec, folder, seen)
    status = STATUS.get(meta.get("status", "")) or parent_status
    for child, mf in children:
        if status == "FINISHED" and not child.is_dir():  # a finished run's units all ran: this one's was deleted
            store.missing.append(f"{child}/ (a nested run's folder)")
            continue
        sync_tree(store, child, mf, run_id, None if status == "FINISHED" else status)
    if status is not None:
        for rid in running_under(store.client, store.experiment_id, run_id):  # runs no folder names (a kill's)
            store.client.set_terminated(rid, status=status)
        store.client.set_terminated(run_id, status=status)
    store.runs.append((folder, run_id, created, sent))
    if meta_file == "state.json" and store.own:
        write_state(folder, tracking_lost=None, synced_to=store.uri)
        (folder / LOST_FILE).unlink(missing_ok=True)
    return run_id


@contextlib.contextmanager
def _sync_lock(run_dir: Path):
    """One sync of a folder at a time (a second waits, then finds everything there)."""
    with open(run_dir / ".sync.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def sync_run(cfg, rest=(), tracking_uri: Optional[str] = None, accept_damage: bool = False) -> str:
    """``raycpt runs sync RUN_DIR [--tracking-uri URI] [--accept-damage]``: the folder's records, and its units', into
    the store (``URI``, else the one the run was made with); the one line said. The records are checked first
    (:func:`raycpt.runs.trust.trusted_records`): a damaged or missing record file is one line and exit 2, nothing
    synced, unless ``accept_damage`` (then the line says what was kept). ``cfg`` (the command line's config) is not
    used: the folder's ``config.yaml`` is the run's."""
    del cfg
    run_dir = _run_folder(rest)
    _, note = trusted_records(run_dir, "runs sync", accept_damage)
    with _sync_lock(run_dir):
        store = _open_store(run_dir, tracking_uri)
        try:
            run_id = sync_tree(store, run_dir)
        except Exception as e:  # noqa: BLE001 - a write the store or the disk refused is one line; bugs stay loud
            why = store_write_error(e, store.uri) or (
                f"cannot write {e.filename or 'a file'}: {e.strerror or e} ({errno.errorcode.get(e.errno, '?')})"
                if isinstance(e, OSError) and e.errno is not None else None)
            if why is None:
                raise
            raise RaycptError(f"runs sync: {why}; make it writable (or free some space), then run raycpt runs sync "
                              f"{run_dir} again: what was synced stays, the rest is added once") from None
        ended = read_state(run_dir).get("status")
        if STATUS.get(ended):  # the run has ended: no unit folder under it may still say running
            end_unit_states(run_dir, ended if ended in ("failed", "interrupted") else
                            "interrupted" if ended == "finished" else "failed")
    if run_id is None:
        raise RaycptError(f"runs sync: {run_dir} holds no records to sync (it never started)")
    top = store.runs[-1]
    units = store.runs[:-1]
    new = sum(1 for r in units if r[2])
    sent = sum(r[3] for r in store.runs)
    status = STATUS.get(read_state(run_dir).get("status", ""), "unchanged")
    line = (f"synced {run_dir} into {'a new' if top[2] else 'its'} run {run_id} at {store.uri}: {sent} item(s) "
            f"added{f', {len(units)} nested run(s) ({new} new run(s))' if units else ''}, status {status}"
            f"{f' ({store.ended[0]})' if store.ended else ''}{f'; {note}' if note else ''}")
    if store.missing:  # not a success: the store now lacks what the folder lost
        gone = sorted(set(store.missing))
        raise RaycptError(f"runs sync: the folder lacks {len(gone)} thing(s) its records name, so the store lacks them "
                          f"too: {', '.join(gone[:4])}{' ...' if len(gone) > 4 else ''} (deleted or moved after the "
                          f"run?); restore them and sync again ({line})")
    return line


def _sync(cfg, options: Options) -> str:
    return sync_run(cfg, options.rest, options.get("tracking_uri"), bool(options.get("accept_damage")))


RUNS_SYNC = NoRun(_sync)
"""``raycpt runs sync``: a command that runs no experiment (it replays another command's folder)."""
