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
import json
import stat
import uuid
from pathlib import Path

from raycpt.cluster import check_store
from raycpt.config import ExperimentConfig, config_to_dict, load_config, save_config
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json, run_root
from raycpt.runtime import sigterm_as_interrupt
from raycpt.tracking import end_fluent_run, mark_lost, tracked, tracking_lost, tracking_uri

OPENING = "opening"  # state.json status of a folder whose MLflow run does not exist yet


def open_run_dir(cfg: ExperimentConfig, command: str, resume: bool = False) -> Path:
    """Create (or with ``resume``, re-open the newest) run folder for ``command`` and save the config.

    Makes ``cfg.tracking.run_root`` and ``cfg.tracking.uri`` absolute in place, so Ray workers (whose
    working directory differs, e.g. under ``ray job submit``) log to the same store. A re-opened
    folder keeps the ``config.yaml`` it was made with (see :func:`resume_changes`).
    """
    check_store(cfg.tracking)
    root = run_root(cfg.tracking)
    cfg.tracking.run_root = str(root)
    cfg.tracking.uri = tracking_uri(cfg.tracking)
    root.mkdir(parents=True, exist_ok=True)
    prefix = f"{command}-{cfg.name}-"
    if resume:  # a folder whose command never got its MLflow run is not "the newest run"
        existing = sorted((p for p in root.glob(prefix + "*") if p.is_dir() and not _never_started(p)),
                          key=lambda p: p.stat().st_mtime)
        if not existing:
            raise RaycptError(f"--resume: no earlier {command!r} run named {cfg.name!r} under {root}")
        run_dir = existing[-1]
        if (run_dir / "config.yaml").is_file():
            return run_dir
    else:
        run_dir = root / f"{prefix}{uuid.uuid4().hex[:8]}"
        run_dir.mkdir(parents=True)
    save_config(cfg, run_dir / "config.yaml")
    return run_dir


def _never_started(run_dir: Path) -> bool:
    return read_state(run_dir).get("status") == OPENING


RESUME_NEUTRAL = ("train.max_failures", "train.log_every", "train.keep_checkpoints", "train.cpus_per_worker",
                  "train.keep_finished_checkpoints", "train.publish", "sweep.keep_checkpoints")


def resume_changes(run_dir: Path, cfg: ExperimentConfig, sections=("model", "data", "plan", "train"),
                   neutral=RESUME_NEUTRAL) -> list[str]:
    """``key: saved -> new`` for every setting of ``sections`` in which ``cfg`` differs from the
    ``config.yaml`` the run folder was made with (``neutral`` keys do not count: they change nothing
    a checkpoint depends on)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        return []
    try:
        saved = config_to_dict(load_config(path))
    except RaycptError as e:
        return [f"its config.yaml no longer loads ({e})"]
    new = config_to_dict(cfg)

    def flat(d, prefix=""):
        out = {}
        for k, v in d.items():
            key = f"{prefix}{k}"
            out.update(flat(v, key + ".") if isinstance(v, dict) and v else {key: v})
        return out

    a = {k: v for s in sections for k, v in flat(saved.get(s) or {}, s + ".").items()}
    b = {k: v for s in sections for k, v in flat(new.get(s) or {}, s + ".").items()}
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k) and k not in neutral]


def read_state(run_dir: Path) -> dict:
    p = Path(run_dir) / "state.json"
    try:
        return json.loads(p.read_text()) if p.is_file() else {}
    except ValueError:
        return {}


def write_state(run_dir: Path, **updates) -> dict:
    state = read_state(run_dir)
    state.update(updates)
    # a full disk must not leave a stale status behind (read_state takes a torn file as empty)
    atomic_write_json(Path(run_dir) / "state.json", state, in_place_when_full=True)
    return state


def refuse_existing_outputs(paths, overwrite: bool, flag: str = "--overwrite") -> None:
    """One line (before anything is written) when an output folder would replace a non-empty
    existing one, unless ``overwrite``: outputs never delete what the user had without asking."""
    for p in paths:
        p = Path(p)
        if p.exists() and not overwrite and (not p.is_dir() or any(p.iterdir())):
            raise RaycptError(f"{p} already exists and is not empty: nothing was written; pass {flag} to replace "
                              "it, or choose another folder")


class AttemptClock:
    """Wall time of one unit of work (a sweep trial) summed over all its attempts, including
    attempts that were killed (``kill -9``: nothing runs at the end of those).

    ``path`` (JSON) lists every attempt's ``start`` and ``last`` time; a daemon thread moves
    ``last`` forward every ``beat_s`` seconds, so a killed attempt counts up to its last beat
    (at most ``beat_s`` short). Use as ``with AttemptClock(path) as clock: ... clock.elapsed``."""

    def __init__(self, path: Path, beat_s: float = 2.0):
        self.path, self.beat_s = Path(path), float(beat_s)
        self._stop = None
        self._thread = None
        self.attempts: list[dict] = []

    def _write(self) -> None:
        import time

        self.attempts[-1]["last"] = time.time()
        atomic_write_json(self.path, {"attempts": self.attempts})

    def __enter__(self) -> "AttemptClock":
        import threading
        import time

        try:
            self.attempts = list(json.loads(self.path.read_text()).get("attempts", []))
        except (OSError, ValueError, AttributeError):
            self.attempts = []
        now = time.time()
        self.attempts.append({"start": now, "last": now})
        self._write()
        self._stop = threading.Event()

        def beat():
            while not self._stop.wait(self.beat_s):
                try:
                    self._write()
                except OSError:  # pragma: no cover - a full or vanished disk must not kill the trial
                    pass

        self._thread = threading.Thread(target=beat, name="raycpt-attempt-clock", daemon=True)
        self._thread.start()
        return self

    @property
    def elapsed(self) -> float:
        """Seconds over every attempt: earlier ones up to their last beat, this one up to now."""
        import time

        done = sum(max(0.0, float(a["last"]) - float(a["start"])) for a in self.attempts[:-1])
        return done + time.time() - float(self.attempts[-1]["start"])

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        self._thread.join(timeout=5)
        self._write()
        return False


def assert_private_folder(path) -> Path:
    """Refuse to restore from ``path`` when group or others can write it or anything in it.

    Ray Tune's restore (``Tuner.restore``) unpickles ``tuner.pkl`` and trial state from the run
    folder: whoever can write there can run code in the driver. Returns ``path`` when only its
    owner can write every entry; raises RaycptError naming the first offender otherwise."""
    path = Path(path)
    entries = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in entries:
        with contextlib.suppress(FileNotFoundError):
            st = p.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                mode = stat.S_IMODE(st.st_mode)
                raise RaycptError(
                    f"refusing to restore {path}: {p} is writable by group or others (mode {mode:o});"
                    f" Tune's restore unpickles files from this folder, so whoever can write there can run code here"
                    f" (chmod -R go-w {path} if you trust its contents)")
    return path


# ------------------------------------------------------------------------------------- the lifecycle
END_STATE = {"FINISHED": "finished", "FAILED": "failed", "KILLED": "interrupted"}


def end_status(exc_type, exc) -> str:
    """The MLflow status a command ends with: FINISHED, KILLED (Ctrl-C, SIGTERM, an interrupted grid) or FAILED."""
    if exc_type is None:
        return "FINISHED"
    if issubclass(exc_type, KeyboardInterrupt):
        return "KILLED"
    return "KILLED" if getattr(exc, "status", None) == "KILLED" else "FAILED"


def memo(path: Path, compute):
    """The finished-work memo: ``path``'s JSON when it exists (that work finished before), else
    ``compute()``, saved to ``path`` atomically (an interrupted computation leaves no file) and returned."""
    path = Path(path)
    if path.is_file():
        return json.loads(path.read_text())
    result = compute()
    atomic_write_json(path, result)
    return result


class CommandRun:
    """What a job's ``execute`` gets from :func:`command_run`: the run folder, the effective config and the
    command's MLflow run (``run_id``; its ``client``), with helpers to log into it and to keep state."""

    def __init__(self, cfg: ExperimentConfig, command: str, run_dir: Path, run_id: str, client, created: bool,
                 experiment_id: str):
        import time

        self.cfg, self.command, self.run_dir, self.run_id = cfg, command, Path(run_dir), run_id
        self.client, self.created, self.experiment_id = client, created, experiment_id
        self.t_start = time.time()

    parent_run_id = property(lambda self: self.run_id)  # the grid's children nest under it

    @contextlib.contextmanager
    def active(self):
        """The run as MLflow's active run (fluent ``log_metrics`` / ``log_artifact`` / nested children inside);
        left RUNNING afterwards: only :func:`command_run` ends it. Yields True; False (log nothing: the run folder
        has it, ``raycpt runs sync`` replays it) while the tracking server is gone or the run has no id."""
        import mlflow

        if tracking_lost() or self.run_id is None:
            yield False
            return
        mlflow.set_tracking_uri(self.cfg.tracking.uri)
        with mlflow.start_run(run_id=self.run_id):
            yield True
        self.client.update_run(self.run_id, status="RUNNING")

    def state(self, **updates) -> dict:
        """Update the folder's ``state.json``."""
        return write_state(self.run_dir, **updates)

    def end(self, status: str) -> None:
        """End every child run still RUNNING (a Tune trial stopped mid-way never reaches its own handlers),
        then the run itself, with ``status``; ``--resume`` sets them RUNNING again."""
        for child in self.client.search_runs([self.experiment_id],
                                             f"tags.mlflow.parentRunId = '{self.run_id}' and "
                                             "attributes.status = 'RUNNING'"):
            with contextlib.suppress(Exception):  # best effort while already failing
                self.client.set_terminated(child.info.run_id, status=status)
        self.client.set_terminated(self.run_id, status=status)


def _open_or_use(cfg: ExperimentConfig, command: str, run_dir, resume: bool) -> Path:
    if run_dir is None:
        return open_run_dir(cfg, command, resume=resume)
    check_store(cfg.tracking)  # a folder given by the caller (a sweep's trace): paths absolute, config saved
    cfg.tracking.run_root = str(run_root(cfg.tracking))
    cfg.tracking.uri = tracking_uri(cfg.tracking)
    run_dir = Path(run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "config.yaml").is_file():
        save_config(cfg, run_dir / "config.yaml")
    return run_dir


def _start_run(cfg: ExperimentConfig, command: str, run_dir: Path, parent_run_id, run_name, params, tags,
               nested: bool = False):
    """Create the command's MLflow run, or continue the one ``state.json`` names; ``(run, created)``. A ``nested``
    command (one whose folder lies inside another command's, e.g. a hybrid build's trace) runs locally when the
    tracking server is gone (:func:`raycpt.tracking.store_or_lost`): no run, ``raycpt runs sync`` makes it."""
    import time

    import mlflow
    from mlflow.tracking import MlflowClient

    from raycpt.cluster import version_tags
    from raycpt.tracking import ensure_store, log_config, store_or_lost

    exp_id = store_or_lost(cfg.tracking, run_dir, time.time()) if nested else ensure_store(cfg.tracking)
    state = read_state(run_dir)
    if exp_id is None:
        write_state(run_dir, command=command, status="finished" if state.get("status") == "finished" else "running")
        return CommandRun(cfg, command, run_dir, state.get("mlflow_run_id"), MlflowClient(cfg.tracking.uri), False,
                          None)
    client = MlflowClient()
    run_id = state.get("mlflow_run_id") or state.get("parent_run_id")
    created = not run_id
    if created:
        nest = {"mlflow.parentRunId": parent_run_id} if parent_run_id else {}
        run_id = client.create_run(exp_id, run_name=run_name or run_dir.name,
                                   tags={"raycpt.command": command, "raycpt.run_dir": str(run_dir), **nest,
                                         **({} if parent_run_id else version_tags()), **(tags or {})}).info.run_id
    # a finished run re-opened stays "finished" until it ends again (the train launcher's memo reads it)
    write_state(run_dir, command=command, mlflow_run_id=run_id,
                status="finished" if state.get("status") == "finished" else "running")
    run = CommandRun(cfg, command, run_dir, run_id, client, created, exp_id)
    if created:
        with run.active():
            log_config(cfg)
            if params:
                mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
    else:
        client.update_run(run_id, status="RUNNING")
    return run


@contextlib.contextmanager
def command_run(cfg: ExperimentConfig, command: str, *, resume: bool = False, run_dir=None, parent_run_id=None,
                run_name=None, params=None, tags=None, on_open=None):
    """THE lifecycle of a command: ``with command_run(cfg, "sweep", resume=...) as run: execute(plan, run)``.

    Opens the run folder (``<run_root>/<command>-<name>-<id>/``; ``--resume``: the newest one that got its
    MLflow run; ``run_dir``: that folder, e.g. a sweep's ``trace/``) with ``config.yaml``; ``on_open(run_dir)``
    may refuse it (one line) before anything is logged. Creates the MLflow run (nested under
    ``parent_run_id``; the config and ``params`` logged) or continues the one ``state.json`` names. SIGTERM is
    Ctrl-C inside. On exit the run and every child left RUNNING end FINISHED (success), KILLED (Ctrl-C,
    SIGTERM, an interrupted grid) or FAILED (any other error); ``state.json`` says finished / interrupted /
    failed. Nothing is ever left RUNNING."""
    import time

    fresh, own = run_dir is None and not resume, run_dir is None  # own: the command's own folder, not a caller's
    run_dir = _open_or_use(cfg, command, run_dir, resume)
    if on_open is not None:  # a refusal here leaves the folder and its run as they were
        on_open(run_dir)
    with sigterm_as_interrupt():
        try:
            if not read_state(run_dir).get("mlflow_run_id"):
                write_state(run_dir, status=OPENING)
            run = _start_run(cfg, command, run_dir, parent_run_id, run_name, params, tags, nested=not own)
        except BaseException as e:
            _failed_start(cfg, run_dir, fresh, e)
            raise
        try:
            yield run
        except BaseException as e:
            status = end_status(type(e), e)
            with contextlib.suppress(Exception):
                write_state(run_dir, status=END_STATE[status], **({} if status == "KILLED" else
                                                                  {"error": f"{type(e).__name__}: {e}"[:500]}))
            _pop_active(run.run_id, status)
            tracked(run.end, status)
            raise
        tracked(run.client.log_metric, run.run_id, f"{command}_wall_time_s", time.time() - run.t_start)
        lost = tracking_lost()
        write_state(run_dir, status="finished", **({"tracking_lost": lost} if lost else {}))
        _pop_active(run.run_id, "FINISHED")
        if lost:  # the run stays RUNNING in the store until `raycpt runs sync` replays the folder and ends it
            mark_lost(lost["uri"], lost.get("since_step"), lost.get("error", ""), run_dir)
            if own:  # a folder inside another command's (a trace of a sweep or a hybrid build) is synced with it
                note_lost_run(run_dir)
        else:
            tracked(run.end, "FINISHED")


@contextlib.contextmanager
def ended_state(run_dir):
    """``state.json`` of ``run_dir`` never left ``running`` by an exception inside: failed (with the error) or
    interrupted (Ctrl-C, SIGTERM), as :func:`command_run` does for a command's own folder; for a folder whose
    work runs inside another command (a sweep trial's ``run_training``)."""
    try:
        yield
    except BaseException as e:
        status = end_status(type(e), e)
        with contextlib.suppress(Exception):  # best effort while already failing (a full disk)
            write_state(run_dir, status=END_STATE[status], **({} if status == "KILLED" else
                                                              {"error": f"{type(e).__name__}: {e}"[:500]}))
        raise


def _failed_start(cfg: ExperimentConfig, run_dir: Path, fresh: bool, exc: BaseException) -> None:
    """A command that failed before its job started: a new folder whose MLflow run never existed is removed
    (it would be nobody's run); a run already created (its config failed to log) ends FAILED / KILLED."""
    run_id = read_state(run_dir).get("mlflow_run_id")
    if run_id is None:
        if fresh:
            import shutil

            shutil.rmtree(run_dir, ignore_errors=True)
        return
    status = end_status(type(exc), exc)
    with contextlib.suppress(Exception):  # best effort while already failing
        write_state(run_dir, status=END_STATE[status], error=f"{type(exc).__name__}: {exc}"[:500])
        _pop_active(run_id, status)
        from mlflow.tracking import MlflowClient

        tracked(MlflowClient(cfg.tracking.uri).set_terminated, run_id, status=status)


def _pop_active(run_id: str, status: str) -> None:
    """Fluent runs left active (ours, and children started inside :meth:`CommandRun.active`) end with ``status``."""
    import mlflow

    if run_id is None:  # a run made while the server was gone has none (nothing of it is active)
        return
    active = mlflow.active_run()
    while active is not None and run_id in (active.info.run_id, active.data.tags.get("mlflow.parentRunId")):
        end_fluent_run(status)
        active = mlflow.active_run()


LOST_RUNS: list = []
"""Run folders of this process whose commands finished while their tracking server was gone (the CLI prints one
warning line per folder, :func:`raycpt.tracking.lost_line`)."""


def note_lost_run(run_dir) -> None:
    if Path(run_dir) not in LOST_RUNS:
        LOST_RUNS.append(Path(run_dir))
