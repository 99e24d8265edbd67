"""A run folder and its ``state.json``: one folder per command invocation under the run root
(``<command>-<name>-<id>/``), re-opened by ``--resume``, the settings a resume may not change, the end status
on every exit path, and :func:`memo` (finished work read back when it matches its seal, never redone)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Optional

from raycpt.config import ExperimentConfig, config_to_dict, load_config, save_config
from raycpt.errors import RaycptError
from raycpt.io import atomic_write_json, seal_path, sealed_json_problem, write_sealed_json
from raycpt.runs.location import RunLocation, checked


OPENING = "opening"  # state.json status of a folder whose MLflow run does not exist yet


def open_run_dir(cfg: ExperimentConfig, command: str, where: RunLocation, resume: bool = False) -> Path:
    """Create (or with ``resume``, re-open the newest) run folder for ``command`` under ``where`` (the command's
    :class:`raycpt.runs.location.RunLocation`, its store checked) and save the config.

    Writes the location's absolute run root and URI into ``cfg.tracking`` (:meth:`RunLocation.pin`), so Ray workers
    (whose working directory differs, e.g. under ``ray job submit``) log to the same store. A re-opened
    folder keeps the ``config.yaml`` it was made with (see :func:`resume_changes`).
    """
    where = checked(where)
    root = where.root
    where.pin(cfg.tracking)
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


SWEEP_SECTIONS = ("model", "data", "trace", "plan", "train", "eval", "sweep", "report")
"""What defines a sweep's work (its trials, evaluations and summary): a ``--resume`` compares all of it."""


SWEEP_NEUTRAL = RESUME_NEUTRAL + (
    "train.cpus_per_worker", "trace.num_actors", "trace.cpus_per_actor", "trace.gpus_per_actor", "trace.batch_size",
    "eval.batch_size", "eval.cpus_per_task", "eval.gpus_per_task", "sweep.max_concurrent_trials",
    "sweep.cpus_per_trial", "sweep.data_cpus_per_trial", "sweep.trial_resources", "sweep.keep_checkpoints")
"""Keys that place or keep work without changing it (resources, concurrency, what is kept)."""


def check_resume_config(run_dir: Path, cfg: ExperimentConfig, sections=("model", "data", "plan", "train"),
                        neutral=RESUME_NEUTRAL, accept: bool = False, why: str = "") -> list[str]:
    """``--resume`` continues a run with the settings it was made with: one line naming every changed key (the
    first three, and how many more) unless ``accept`` (``--accept-changes``: a deliberate continuation), in which
    case the folder's ``config.yaml`` becomes ``cfg`` and ``state.json`` keeps the list (``config_changes``).
    ``why``: what a change would break, said in the line. The changes (empty: none)."""
    changed = resume_changes(run_dir, cfg, sections, neutral)
    if not changed:
        return []
    if not accept:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise RaycptError(f"--resume: {run_dir} was made with other settings: {'; '.join(changed[:3])}{more}. "
                          f"{why + ' ' if why else ''}Drop the change, start a new run without --resume, or pass "
                          "--accept-changes to continue this run with the new settings")
    earlier = list(read_state(run_dir).get("config_changes") or [])
    save_config(cfg, Path(run_dir) / "config.yaml")
    write_state(run_dir, config_changes=earlier + [{"time": time.time(), "changes": changed}])
    return changed


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
        self.attempts[-1]["last"] = time.time()
        atomic_write_json(self.path, {"attempts": self.attempts})

    def __enter__(self) -> "AttemptClock":
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


def read_memo(path: Path) -> Optional[dict]:
    """The memo file's object when it verifies (:func:`raycpt.io.sealed_json_problem`), else None."""
    if sealed_json_problem(path) is not None:
        return None
    return json.loads(Path(path).read_text(encoding="utf-8"))


def memo(path: Path, compute, say=None):
    """The finished-work memo: ``path``'s JSON object when it exists and verifies
    (:func:`raycpt.io.sealed_json_problem`: that work finished before), else ``compute()``, saved to ``path`` with
    its seal (:func:`raycpt.io.write_sealed_json`) and returned. A file that does not verify is moved aside
    (``<name>.refused-<n>``, kept for a look) with one line saying why (``say``, default stderr), and the work is
    done again."""
    path = Path(path)
    if path.exists() or seal_path(path).exists():
        why = sealed_json_problem(path) if path.exists() else "its file is missing"
        if why is None:
            return json.loads(path.read_text(encoding="utf-8"))
        n = 1
        while path.with_name(f"{path.name}.refused-{n}").exists():
            n += 1
        aside = path.with_name(f"{path.name}.refused-{n}")
        if path.exists():
            os.replace(path, aside)
        seal_path(path).unlink(missing_ok=True)
        (say or _warn_line)(f"warning: {path} refused ({why}); doing that work again"
                            + (f" (the refused file is kept as {aside.name})" if aside.exists() else ""))
    result = compute()
    write_sealed_json(path, result)
    return result


def _warn_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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


# ------------------------------------------------------------------------------------- who runs a folder
def process_started(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (field 22 of ``/proc/PID/stat``, clock ticks since boot; None: no such
    process, or no ``/proc``): with the pid, what names one process over a reboot-free lifetime (a pid is reused)."""
    try:
        stat_line = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    return stat_line.rsplit(")", 1)[-1].split()[19]


def owner() -> dict:
    """This process as the owner of a run folder (``state.json``'s ``owner``): host, pid and start time."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": process_started(os.getpid())}


def owner_gone(state: dict) -> Optional[str]:
    """Why the command that ran a folder whose ``state.json`` still says ``running`` is known to be gone (its process,
    on this host, no longer exists: it was killed, or could not write how it ended); None when it may still run (it
    does, or it ran on another host, or the folder names no owner)."""
    if state.get("status") != "running" or not isinstance(state.get("owner"), dict):
        return None
    who = state["owner"]
    if who.get("host") != socket.gethostname() or not isinstance(who.get("pid"), int):
        return None
    now = process_started(who["pid"])
    if now is not None and now == who.get("started"):
        return None
    return f"its command (pid {who['pid']}) ended without recording how (killed, or its folder could not be written)"


UNIT_SKIP = ("ray", "tune", "final_model", "checkpoints", "packed")
"""Folders under a run folder that hold no unit's state (Ray's and Tune's own, model files): not walked."""


def end_unit_states(run_dir: Path, state_status: str) -> set:
    """Every folder under ``run_dir`` (the run's own included) whose ``state.json`` or ``trial.json`` still says
    ``running`` says ``state_status`` (a unit stopped with its command never reaches its own end); the MLflow run ids
    every such file names, for the caller to end the ones still RUNNING."""
    ids = set()
    for here, dirs, files in os.walk(run_dir):
        dirs[:] = [d for d in dirs if d not in UNIT_SKIP and not d.startswith(("checkpoint", "."))]
        for name in ("state.json", "trial.json", "run.json"):
            if name not in files:
                continue
            path = Path(here) / name
            with contextlib.suppress(OSError, ValueError):
                doc = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(doc, dict):
                    continue
                if doc.get("mlflow_run_id"):
                    ids.add(doc["mlflow_run_id"])
                if doc.get("status") == "running":
                    atomic_write_json(path, {**doc, "status": state_status})
    return ids
