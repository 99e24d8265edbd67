"""Run folders: one per command invocation, holding everything that command wrote.

``<run_root>/<command>-<name>-<id>/`` with ``config.yaml`` (the resolved config), tables, plots,
checkpoints and a ``state.json`` the command updates as it goes. ``--resume`` re-opens the newest
folder of the same command and name instead of making a new one. Files are written aside and
renamed into place (:func:`raycpt.io.atomic_write_text`), so an interrupted command never leaves half a file.
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
from raycpt.tracking import tracking_uri


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
    if resume:
        existing = sorted((p for p in root.glob(prefix + "*") if p.is_dir()), key=lambda p: p.stat().st_mtime)
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


RESUME_NEUTRAL = ("train.max_failures", "train.log_every", "train.keep_checkpoints", "train.cpus_per_worker")


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
    return json.loads(p.read_text()) if p.is_file() else {}


def write_state(run_dir: Path, **updates) -> dict:
    state = read_state(run_dir)
    state.update(updates)
    atomic_write_json(Path(run_dir) / "state.json", state)
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
