"""THE command lifecycle (:func:`command_run`) and run folders: one per command invocation, holding
everything that command wrote.

``<run_root>/<command>-<name>-<id>/`` with ``config.yaml`` (the resolved config), tables, plots,
checkpoints and a ``state.json`` the command updates as it goes. ``--resume`` re-opens the newest
folder of the same command and name instead of making a new one. Files are written aside and
renamed into place (:func:`raycpt.io.atomic_write_text`), so an interrupted command never leaves half a file.

Every job runs inside :func:`command_run`: it opens (or re-opens) the folder, saves ``config.yaml``,
creates (or continues) the command's MLflow run, keeps ``state.json``, turns SIGTERM into Ctrl-C and
ends the run - and every child run it left RUNNING - FINISHED, FAILED or KILLED on every exit path.
:func:`memo` is the finished-work memo: work whose result file exists is read back, never redone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from raycpt import __version__
from raycpt.config import ExperimentConfig, save_config
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json
from raycpt.runs.folder import (END_STATE, OPENING, end_status, end_unit_states, open_run_dir, owner, read_state,
                                 write_state)
from raycpt.runs.lost import mark_lost, store_or_lost, tracked, tracking_lost
from raycpt.runs.records import append_record, clean_metrics, flatten, project
from raycpt.runs.location import RunLocation, checked, locate
from raycpt.runs.store import ensure_store, missing_run, store_unwritable
from raycpt.runs.trust import trusted_records
from raycpt.runtime import on_ray_death, sigterm_as_interrupt


class Run:
    """THE owner of one MLflow run and its folder: a command's (:func:`command_run` yields it) or a unit's inside
    one (a trial, a build: :meth:`child`). Jobs write their params, metrics, files and tables through it into the
    folder (:data:`raycpt.runs.records.RECORDS`); each record is projected into MLflow by the client, by run id, as it
    is written (:func:`raycpt.runs.records.project`), and again by ``raycpt runs sync`` from the folder, the same code.
    Nothing but its owner ever ends the run: :func:`command_run` for a command, the ``with`` block of
    :meth:`child` for a unit. ``run_id`` is None while the tracking server is gone (the sync makes the run).
    ``location``: where the command's runs live (:class:`raycpt.runs.location.RunLocation`, resolved once), carried
    to its units."""

    def __init__(self, cfg: ExperimentConfig, command: str, run_dir: Path, run_id: Optional[str], client,
                 created: bool, experiment_id: Optional[str], meta_path: Optional[Path] = None, meta=None,
                 location: Optional[RunLocation] = None):
        self.cfg, self.command, self.dir, self.run_id = cfg, command, Path(run_dir), run_id
        self.location = location
        self.client, self.created, self.experiment_id = client, created, experiment_id
        self.meta_path = Path(meta_path) if meta_path is not None else None
        self.meta: dict = meta if meta is not None else {}
        self.t_start = time.time()

    run_dir = property(lambda self: self.dir)
    parent_run_id = property(lambda self: self.run_id)  # what a unit's run nests under

    @property
    def elapsed(self) -> float:
        """Seconds spent on this run over all its attempts (a unit's earlier attempts from its meta file)."""
        return float(self.meta.get("elapsed_before", 0.0)) + time.time() - self.t_start

    # ---------------------------------------------------------------------------------------- records
    def live(self) -> bool:
        """Whether records go to MLflow now (the run exists and its server answers)."""
        return self.run_id is not None and self.client is not None and not tracking_lost()

    def record(self, rec: dict) -> None:
        """One record into the folder, then into the run (while its server answers)."""
        append_record(self.dir, rec)
        if self.live():
            tracked(project, self.client, self.run_id, rec, self.dir)

    def _rel(self, path) -> str:
        p = Path(path)
        try:
            return p.resolve().relative_to(self.dir.resolve()).as_posix()
        except ValueError:
            return str(p.resolve())

    def log_params(self, params: dict) -> None:
        self.record({"params": {k: str(v)[:500] for k, v in params.items() if v is not None}})

    def log_metrics(self, metrics: dict, step: Optional[int] = None) -> None:
        clean = clean_metrics(metrics)
        if clean:
            self.record({"metrics": clean, "step": int(step or 0)})

    def log_points(self, series) -> None:
        """``(key, step, value)`` points (one record: one MLflow call per 1000 points)."""
        pts = [[k, int(step), v] for key, step, value in series for k, v in clean_metrics({key: value}).items()]
        if pts:
            self.record({"points": pts})

    def set_tags(self, tags: dict) -> None:
        self.record({"tags": {k: str(v) for k, v in tags.items()}})

    def log_artifact(self, path, artifact_path: Optional[str] = None) -> None:
        """A file (or a folder's files) of the run; ``artifact_path`` the artifact folder it goes into."""
        self.record({"artifact": self._rel(path), "dir": artifact_path})

    def log_table(self, data: dict, artifact_file: str) -> None:
        self.record({"table": data, "file": artifact_file})

    def log_text(self, text: str, artifact_file: str) -> None:
        self.record({"text": text, "file": artifact_file})

    def log_inputs(self, records: list[dict]) -> None:
        """Dataset inputs and linked models (:func:`raycpt.runs.inputs.dataset_record`, :func:`~raycpt.runs.inputs.
        model_record`), each a record: never sent twice (the run's own are read first)."""
        for rec in records:
            self.record(rec)

    def note_children(self, entries) -> None:
        """``(folder, meta file)`` of units whose runs nest under this one (a grid's trials, a nested command):
        where ``raycpt runs sync`` finds them."""
        self.record({"children": [[self._rel(f), m] for f, m in entries]})

    # ---------------------------------------------------------------------------------------- units
    def child(self, name: str, folder: Path, tags: Optional[dict] = None, meta: Optional[dict] = None,
              meta_file: str = "run.json") -> "Run":
        """The run of one unit of this command (use as ``with run.child(...) as unit:``), nested under this run;
        see :func:`open_child`."""
        self.note_children([(Path(folder), meta_file)])
        return open_child(self.cfg, self.command, Path(folder), meta_file, self.experiment_id, self.run_id, name,
                          tags=tags, meta=meta, location=self.location)

    def __enter__(self) -> "Run":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        """A unit's end: FINISHED, KILLED (Ctrl-C; its time kept for the next attempt) or FAILED."""
        status = end_status(exc_type, exc)
        if status == "KILLED":
            self.meta["elapsed_before"] = self.elapsed
        self.meta["status"] = END_STATE[status]
        with contextlib.suppress(OSError):
            self.save_meta()
        if self.run_id is not None and not (status == "FINISHED" and tracking_lost()):  # sync ends it then
            tracked(self.client.set_terminated, self.run_id, status=status)
        return False

    def save_meta(self) -> None:
        if self.meta_path is not None:
            atomic_write_json(self.meta_path, self.meta)

    def state(self, **updates) -> dict:
        """Update the folder's ``state.json``."""
        return write_state(self.dir, **updates)

    def end(self, status: str) -> None:
        """End every run under this one still RUNNING, then the run itself, with ``status`` (``--resume`` sets them
        RUNNING again): its descendants in the store (a Tune trial stopped mid-way never reaches its own handlers,
        nor do the runs nested under it) and every run a unit folder under its folder names; every such folder's
        state that still says running says how it ended (:func:`raycpt.runs.folder.end_unit_states`; interrupted when
        the command finished: that unit did not)."""
        named = end_unit_states(self.dir, "interrupted" if status == "FINISHED" else END_STATE[status])
        for run_id in (running_under(self.client, self.experiment_id, self.run_id) | named) - {self.run_id}:
            with contextlib.suppress(Exception):  # best effort while already failing; a run of another store
                if self.client.get_run(run_id).info.status == "RUNNING":
                    self.client.set_terminated(run_id, status=status)
        self.client.set_terminated(self.run_id, status=status)


def running_under(client, experiment_id: str, run_id: str) -> set:
    """The runs of ``experiment_id`` still RUNNING whose chain of ``mlflow.parentRunId`` reaches ``run_id``."""
    running = {r.info.run_id: r.data.tags.get("mlflow.parentRunId")
               for r in client.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=50000)}
    parents: dict = {}

    def parent_of(rid):
        if rid in running:
            return running[rid]
        if rid not in parents:
            try:
                parents[rid] = client.get_run(rid).data.tags.get("mlflow.parentRunId")
            except Exception:  # noqa: BLE001 - a parent deleted from the store ends the chain
                parents[rid] = None
        return parents[rid]

    out = set()
    for rid in running:
        up, hops = parent_of(rid), 0
        while up and up != run_id and hops < 16:
            up, hops = parent_of(up), hops + 1
        if up == run_id:
            out.add(rid)
    return out


def open_child(cfg: ExperimentConfig, command: str, folder: Path, meta_file: str, experiment_id: Optional[str],
               parent_run_id: Optional[str], name: str, tags: Optional[dict] = None,
               meta: Optional[dict] = None, *, location: RunLocation) -> Run:
    """The run of one unit (a sweep or scan trial, a hybrid build), whose id is kept in ``folder/meta_file``, so an
    interrupted unit resumed later (in any process: a Tune trial's) continues the same run instead of opening a
    second one. ``experiment_id`` None (the server gone): no run yet, ``raycpt runs sync`` makes it from the meta
    (``run_name``, ``tags``). ``created`` says whether this call made the run. ``location``: the command's
    (:class:`raycpt.runs.location.RunLocation`, carried: its store's URI is the one the unit's run is made in)."""
    from mlflow.tracking import MlflowClient

    meta_path = Path(folder) / meta_file
    Path(folder).mkdir(parents=True, exist_ok=True)
    saved = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    client = MlflowClient(location.uri) if experiment_id is not None else None
    all_tags = {**({"mlflow.parentRunId": parent_run_id} if parent_run_id else {}), **node_tags(), **(tags or {})}
    run_id, created = saved.get("mlflow_run_id"), False
    if not run_id:
        made = tracked(client.create_run, experiment_id, run_name=name, tags=all_tags) if client else None
        run_id, created = (made.info.run_id if made is not None else None), made is not None
        saved = {**({"mlflow_run_id": run_id} if run_id else {}), "run_name": name, "tags": all_tags, **saved,
                 **(meta or {})}
    elif client is not None:
        tracked(client.update_run, run_id, status="RUNNING")
    saved.pop("status", None)
    atomic_write_json(meta_path, saved)
    return Run(cfg, command, Path(folder), run_id, client, created, experiment_id, meta_path=meta_path, meta=saved,
               location=location)


def _open_or_use(cfg: ExperimentConfig, command: str, where: RunLocation, run_dir, resume: bool) -> Path:
    if run_dir is None:
        return open_run_dir(cfg, command, where, resume=resume)
    where.pin(cfg.tracking)  # a folder given by the caller (a sweep's trace): paths absolute, config saved
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").is_file():
        save_config(cfg, run_dir / "config.yaml")
    return run_dir


def _start_run(cfg: ExperimentConfig, command: str, where: RunLocation, run_dir: Path, parent_run_id, run_name,
               params, tags, nested: bool = False) -> Run:
    """Create the command's MLflow run, or continue the one ``state.json`` names. A ``nested`` command (one whose
    folder lies inside another command's, e.g. a hybrid build's trace) runs locally when the tracking server is
    gone (:func:`raycpt.runs.lost.store_or_lost`): no run, ``raycpt runs sync`` makes it."""
    from mlflow.tracking import MlflowClient

    exp_id = store_or_lost(where, run_dir, time.time()) if nested else ensure_store(where)
    state = read_state(run_dir)
    keep = {"status": "finished" if state.get("status") == "finished" else "running"}  # the launcher's memo reads it
    name = run_name or run_dir.name
    all_tags = {"raycpt.command": command, "raycpt.run_dir": str(run_dir),
                **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {}),
                **({} if parent_run_id else {**version_tags(), **source_tags(command)}), **(tags or {})}
    if exp_id is None:
        write_state(run_dir, command=command, run_name=name, tags=all_tags, owner=owner(), **keep)
        return Run(cfg, command, run_dir, state.get("mlflow_run_id"), None, False, None, location=where)
    client = MlflowClient(where.uri)
    run_id = state.get("mlflow_run_id") or state.get("parent_run_id")
    created = not run_id
    if created:
        run_id = client.create_run(exp_id, run_name=name, tags=all_tags).info.run_id
    write_state(run_dir, command=command, mlflow_run_id=run_id, run_name=name, tags=all_tags, owner=owner(), **keep)
    run = Run(cfg, command, run_dir, run_id, client, created, exp_id, location=where)
    if created:  # a command inside another's (a sweep's trace) logs its own section and what it reads; its parent
        # holds the whole config, so a compare of the parent's children lines up their own params, not constants
        run.log_params(config_params(cfg, (command, "model", "data") if parent_run_id else None))
        if params:
            run.log_params(params)
    else:
        client.update_run(run_id, status="RUNNING")
    return run


@contextlib.contextmanager
def command_run(cfg: ExperimentConfig, command: str, location: Optional[RunLocation] = None, *, resume: bool = False,
                run_dir=None, parent=None, run_name=None, params=None, tags=None, on_open=None,
                accept_damage: bool = False):
    """THE lifecycle of a command: ``with command_run(cfg, "sweep", resume=...) as run: execute(plan, run)``.

    Opens the run folder (``<run_root>/<command>-<name>-<id>/``; ``--resume``: the newest one that got its
    MLflow run; ``run_dir``: that folder, e.g. a sweep's ``trace/``) with ``config.yaml``; ``on_open(run_dir)``
    may refuse it (one line) before anything is logged; a resumed folder's record is checked first
    (:func:`raycpt.runs.trust.trusted_records`: damaged or missing, one line and exit 2 unless ``accept_damage``).
    Creates the MLflow run (nested under ``parent``'s, a :class:`Run`; the config and ``params`` logged) or continues
    the one ``state.json`` names (``owner``: this process, :func:`raycpt.runs.folder.owner`). SIGTERM is Ctrl-C
    inside. On exit the run and every run under it left RUNNING (:meth:`Run.end`) end FINISHED (success), KILLED
    (Ctrl-C, SIGTERM, an interrupted grid) or FAILED (any other error); ``state.json`` says finished / interrupted /
    failed. Nothing is ever left RUNNING. ``location``: where the command's runs live, resolved once where it
    started (:class:`raycpt.runs.location.RunLocation`; None: :func:`raycpt.runs.location.locate` of ``cfg.tracking``
    now, its store checked)."""
    where = checked(location) if location is not None else locate(cfg.tracking)
    fresh, own = run_dir is None and not resume, run_dir is None  # own: the command's own folder, not a caller's
    run_dir = _open_or_use(cfg, command, where, run_dir, resume)
    if resume and own:  # the record a resume goes on from is checked before it is trusted
        trusted_records(run_dir, f"{command} --resume", accept_damage, say=_warn)
    if on_open is not None:  # a refusal here leaves the folder and its run as they were
        on_open(run_dir)
    if own and missing_run(where, read_state(run_dir).get("mlflow_run_id")):  # before any state is written
        raise RaycptError(f"--resume: the MLflow run {read_state(run_dir)['mlflow_run_id']} that {run_dir}/state.json "
                          f"names is not in the store {where.uri} (replaced, or the folder came from another "
                          f"run root); `raycpt runs sync {run_dir}` records the folder into it, then --resume again")
    if parent is not None:
        parent.note_children([(run_dir, "state.json")])
    with sigterm_as_interrupt():
        try:
            st = read_state(run_dir)  # a folder that finished with no run (its server was gone) stays finished
            if not st.get("mlflow_run_id") and st.get("status") in (None, OPENING):
                write_state(run_dir, status=OPENING)
            run = _start_run(cfg, command, where, run_dir, parent.run_id if parent is not None else None,
                             run_name, params, tags, nested=not own)
        except BaseException as e:
            _failed_start(where, run_dir, fresh, e)
            raise
        try:
            with on_ray_death(functools.partial(_ray_died, run)):
                yield run
        except BaseException as e:
            _end_on_error(run, e)
            raise
        _finish(run, own)


def _end_on_error(run: Run, e: BaseException) -> None:
    """A command that stopped on ``e``: ``state.json`` and the run end (FAILED / KILLED). The store failing too (a
    full disk, a read-only run root) raises the one line instead of a second traceback: the run folder holds every
    record, and ``raycpt runs sync`` ends the run once the store can be written."""
    status = end_status(type(e), e)
    with contextlib.suppress(Exception):  # best effort while already failing (a full disk)
        write_state(run.dir, status=END_STATE[status], **({} if status == "KILLED" else
                                                          {"error": f"{type(e).__name__}: {e}"[:500]}))
    cause, not_ended = store_unwritable(e), None
    if run.live():
        try:
            tracked(run.end, status)
        except Exception as end_error:  # noqa: BLE001 - the store failing as well: said in the one line
            not_ended = store_unwritable(end_error) or f"{type(end_error).__name__}: {str(end_error)[:200]}"
    sync = f"`raycpt runs sync {run.dir}` records and ends its MLflow run once the store can be written"
    if cause is not None:
        raise RaycptError(f"the MLflow store {run.location.uri} cannot be written ({cause}: is its folder "
                          f"read-only, or its disk full?); the run stopped, its folder {run.dir} holds every record: "
                          f"{sync}") from None
    if not_ended is not None and isinstance(e, RaycptError):
        raise RaycptError(f"{e} (the MLflow store cannot be written either ({not_ended}): {sync})") from None


def _ray_died(run: Run, line: str) -> None:
    """The private Ray's own processes died (:class:`raycpt.runtime.RayWatch`; this process is about to end):
    every ``state.json`` still ``running`` in the run's folder (a sweep's trials' too) says failed with the line,
    and the run and its children still RUNNING end FAILED."""
    error = line.removeprefix("error: ")[:500]
    for state in [run.dir / "state.json", *run.dir.glob("**/state.json")]:
        if read_state(state.parent).get("status") == "running":
            with contextlib.suppress(OSError):
                write_state(state.parent, status="failed", error=error)
    if run.live():
        run.end("FAILED")


def _finish(run: Run, own: bool) -> None:
    """A command that succeeded: its wall time, ``state.json`` finished, the run FINISHED (or, with the server
    gone, left for ``raycpt runs sync`` and one warning line)."""
    run.log_metrics({f"{run.command}_wall_time_s": time.time() - run.t_start})
    lost = tracking_lost()
    write_state(run.dir, status="finished", **({"tracking_lost": lost} if lost else {}))
    if lost:  # the run stays RUNNING in the store until `raycpt runs sync` replays the folder and ends it
        mark_lost(lost["uri"], lost.get("since_step"), lost.get("error", ""), run.dir)
        if own:  # a folder inside another command's (a trace of a sweep or a hybrid build) is synced with it
            note_lost_run(run.dir)
    elif run.run_id is not None:
        tracked(run.end, "FINISHED")


TRAINING_SECTIONS = ("model", "data", "plan", "train", "eval", "hybrid")
"""The config sections a training run reads: a trial's params are these (and its own identity), not the sections of
other commands (``compare.*``, ``contribution.*``, ...), which would fill MLflow's compare view with constants."""


def config_params(cfg: ExperimentConfig, sections: Optional[tuple] = None) -> dict:
    """The config as flat params, prefixed by section (values cut to MLflow's limit): every section (a command's
    run), or only ``sections`` and the top-level values (a training run: :data:`TRAINING_SECTIONS`)."""
    flat = flatten(dataclasses.asdict(cfg))
    return {k: str(v)[:500] for k, v in flat.items()
            if sections is None or "." not in k or k.split(".")[0] in sections}


def _failed_start(where: RunLocation, run_dir: Path, fresh: bool, exc: BaseException) -> None:
    """A command that failed before its job started: a new folder whose MLflow run never existed is removed
    (it would be nobody's run); a run already created (its config failed to log) ends FAILED / KILLED."""
    run_id = read_state(run_dir).get("mlflow_run_id")
    if run_id is None:
        if fresh:
            shutil.rmtree(run_dir, ignore_errors=True)
        return
    status = end_status(type(exc), exc)
    with contextlib.suppress(Exception):  # best effort while already failing
        write_state(run_dir, status=END_STATE[status], error=f"{type(exc).__name__}: {exc}"[:500])
        from mlflow.tracking import MlflowClient

        tracked(MlflowClient(where.uri).set_terminated, run_id, status=status)


LOST_RUNS: list = []
"""Run folders of this process whose commands finished while their tracking server was gone (the CLI prints one
warning line per folder, :func:`raycpt.runs.lost.lost_line`)."""


def _warn(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def note_lost_run(run_dir) -> None:
    if Path(run_dir) not in LOST_RUNS:
        LOST_RUNS.append(Path(run_dir))


# ------------------------------------------------------------------------------------- tags
def git_commit() -> Optional[str]:
    """The commit of this checkout (or ``$RAYCPT_GIT_COMMIT``, baked into the image), else None."""
    if os.environ.get("RAYCPT_GIT_COMMIT"):
        return os.environ["RAYCPT_GIT_COMMIT"]
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def version_tags() -> dict[str, str]:
    """Tags for a parent run: raycpt, git commit, image, Ray, torch, CUDA, MLflow, transformers versions."""
    import mlflow
    import ray
    import torch

    try:
        raycpt_version = md.version("raycpt")
    except md.PackageNotFoundError:  # a working-dir job (ray job submit) of an uninstalled checkout
        raycpt_version = __version__
    tags = {"raycpt.version": raycpt_version, "raycpt.ray_version": ray.__version__,
            "raycpt.torch_version": torch.__version__, "raycpt.cuda_version": torch.version.cuda or "none",
            "raycpt.mlflow_version": mlflow.__version__, "raycpt.python_version": sys.version.split()[0]}
    try:
        tags["raycpt.transformers_version"] = md.version("transformers")
    except md.PackageNotFoundError:  # pragma: no cover - a dependency
        pass
    if torch.cuda.is_available():
        tags["raycpt.gpu"] = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    commit = git_commit()
    if commit:  # raycpt's name and MLflow's, which its run page shows as the source's commit
        tags["raycpt.git_commit"] = tags["mlflow.source.git.commit"] = commit
    if os.environ.get("RAYCPT_IMAGE"):
        tags["raycpt.image"] = os.environ["RAYCPT_IMAGE"]
    return tags


def source_tags(command: str) -> dict[str, str]:
    """MLflow's source tags of a command's run: ``mlflow.source.name`` (the command, as a user types it) and
    ``mlflow.source.type`` (a local program); the commit is :func:`version_tags`'."""
    return {"mlflow.source.name": f"raycpt {command}", "mlflow.source.type": "LOCAL"}


def node_tags() -> dict[str, str]:
    """``raycpt.node_id`` / ``raycpt.node_ip`` of the Ray node this process runs on (empty outside Ray)."""
    try:
        import ray

        if not ray.is_initialized():
            return {}
        ctx = ray.get_runtime_context()
        return {"raycpt.node_id": ctx.get_node_id(), "raycpt.node_ip": ray.util.get_node_ip_address()}
    except Exception:  # noqa: BLE001 - tags are informative; never fail a trial on them
        return {}
