"""Live progress of a multi-trial job (sweep), read from the trial folders the trials write anyway.

The driver does not see the trials' stdout (they run in Ray actors, possibly on other nodes), but
every trial writes ``<trial>/train/train_metrics.jsonl`` (rank 0, one line per step and lifecycle
events), a phase note (:func:`raycpt.progress.write_phase`: the base row's evaluation, what a row's evaluation covers)
and ``<trial>/result.json`` when done. :func:`trial_state` turns those files into one line that names the phase
(starting, training, checkpointing, evaluating);
:class:`TrialsProgress` shows a bar over trials with the running trial's step, and prints one line
per finished trial; :class:`StepProgress` is ``raycpt train``'s bar over steps. Both are
:class:`FilePoller` s: a driver thread polling files. :func:`raycpt.progress.progress_bar` is the bar over counted
items (a trace's prompts, a compare's Ray tasks) that the driver advances itself. Works the same on a cluster whose run folder is on shared storage.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from raycpt.io import sealed_json_problem
from raycpt.progress import read_phase
from raycpt.runs.folder import read_memo
from raycpt.tasks import is_continuous

METRICS = Path("train") / "train_metrics.jsonl"
RESULT = "result.json"


@dataclass(frozen=True)
class TrialState:
    """``phase``: pending, starting, training, checkpointing, evaluating, done; ``step``/``loss`` while training;
    ``label`` (how the line names the trial, its name by default) and ``doing`` (what the phase covers) from the
    trial's phase note."""

    name: str
    phase: str
    step: int = 0
    loss: Optional[float] = None
    label: str = ""
    doing: str = ""


def _tail_records(path: Path, nbytes: int = 8192) -> list[dict]:
    """The JSON records in the last ``nbytes`` of a JSONL file (a partial first/last line is skipped)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - nbytes))
            chunk = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    out = []
    for line in chunk.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def trial_state(trial_dir: Path, name: Optional[str] = None) -> TrialState:
    """Where one trial is, from its files alone."""
    trial_dir = Path(trial_dir)
    name = name or trial_dir.name
    if (trial_dir / RESULT).is_file() and sealed_json_problem(trial_dir / RESULT) is None:  # what the grid skips as done
        return TrialState(name, "done")
    if not trial_dir.is_dir():
        return TrialState(name, "pending")
    note = read_phase(trial_dir) or {}
    step, loss, phase, logged = 0, None, note.get("phase", "starting"), False
    for rec in _tail_records(trial_dir / METRICS):
        logged = True
        if "loss" in rec and "step" in rec:
            step, loss, phase = int(rec["step"]), float(rec["loss"]), "training"
        elif rec.get("event") in ("start", "resume"):
            step, phase = int(rec.get("step", 0)), "training"
        elif rec.get("timing") == "checkpoint_begin":
            step, phase = int(rec.get("step", step)), "checkpointing"
        elif rec.get("timing") == "checkpoint" and phase == "checkpointing":
            phase = "training"
        elif rec.get("event") in ("evaluate", "finished"):
            phase = "evaluating"
    doing = str(note.get("evaluation", "")) if phase == "evaluating" and logged else \
        "" if logged else str(note.get("doing", ""))
    return TrialState(name, phase, step, loss, str(note.get("label", "")), doing)


STARTING = "loading the model, starting the training workers"
"""What a trained row's ``starting`` covers: its trial is placed, the model loads, the workers start."""


def describe(state: TrialState, max_steps: int) -> str:
    """One short line for the running trial that names its phase, e.g. ``train_deep-r0.5: training, step 5/8, loss
    3.912`` or ``base row: evaluating (48 questions, 30 held-out documents)``."""
    who = state.label or state.name
    if state.phase == "training":
        loss = "" if state.loss is None else f", loss {state.loss:.3f}"
        return f"{who}: training, step {state.step}/{max_steps}{loss}"
    if state.phase == "checkpointing":
        return f"{who}: checkpointing, step {state.step}/{max_steps}"
    doing = state.doing or (STARTING if state.phase == "starting" else "")
    return f"{who}: {state.phase}" + (f" ({doing})" if doing else "")


def finished_line(result: dict) -> str:
    """One line per finished trial: training loss first -> last, held-out loss, average score per task
    (``G/L/C/Cn`` = generate / logit / cloze / cloze acc_norm), wall time."""
    losses = result.get("losses") or []
    parts = [result.get("name", "?")]
    if losses:
        parts.append(f"loss {losses[0]:.3f}->{losses[-1]:.3f}")
    if result.get("heldout_loss") is not None:
        parts.append(f"held-out {result['heldout_loss']:.3f}")
    if result.get("general_loss") is not None:
        parts.append(f"general {result['general_loss']:.3f}")
    avgs: dict[str, dict[str, float]] = {}
    for key, v in (result.get("scores") or {}).items():
        task, cat, mode = (key.split("/") + ["", ""])[:3]
        if cat == "average" and not is_continuous(mode):  # accuracies here; continuous scores: the summary
            avgs.setdefault(task, {})[mode] = v
    for task, modes in avgs.items():
        ms = [m for m in ("generate", "logit") if m in modes] + sorted(m for m in modes if m not in ("generate", "logit"))
        letter = {"cloze_norm": "Cn"}  # lm-eval's acc_norm of the cloze run, beside cloze's C
        parts.append(f"{task} {'/'.join(letter.get(m, m[0].upper()) for m in ms)} "
                     f"{'/'.join(f'{modes[m]:.2f}' for m in ms)}")
    if result.get("wall_s") is not None:
        parts.append(f"{result['wall_s']:.0f}s")
    return " ".join(parts)


class FilePoller:
    """A rich progress bar fed from files by a driver thread: subclasses give ``_bar()`` (the columns),
    ``_start(bar)`` (add the task) and ``_poll(bar, task)``; one last poll runs after the job ends."""

    interval = 0.5

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def __enter__(self):
        if self.enabled:
            self._before()
            self._thread = threading.Thread(target=self._run, name=f"raycpt-{type(self).__name__}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        with self._bar() as bar:
            task = self._start(bar)
            while True:
                stopping = self._stop.is_set()
                self._poll(bar, task)
                if stopping:
                    break
                self._stop.wait(self.interval)

    def _before(self) -> None:
        """Runs on the caller's thread before polling starts."""

    def _bar(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def _start(self, bar):  # pragma: no cover - abstract
        raise NotImplementedError

    def _poll(self, bar, task) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


class StepProgress(FilePoller):
    """``raycpt train``'s bar over optimizer steps, fed by rank 0's ``train_metrics.jsonl`` (read
    incrementally from where the last poll stopped)."""

    def __init__(self, path: Path, total: int, start: int, enabled: bool):
        super().__init__(enabled)
        self.path, self.total, self.start = Path(path), total, start
        self._pos = 0

    def _before(self) -> None:
        self._pos = self.path.stat().st_size if self.path.is_file() else 0

    def _bar(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
                        TimeElapsedColumn(), transient=False)

    def _start(self, bar):
        return bar.add_task("train", total=self.total, completed=self.start, info=f"starting: {STARTING}")

    def _poll(self, bar, task) -> None:
        if not self.path.is_file():
            return
        with open(self.path, encoding="utf-8") as f:
            f.seek(self._pos)
            chunk = f.read()
        done = chunk.rfind("\n") + 1  # a partly written last line waits for the next poll
        for line in chunk[:done].splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "loss" in r and "step" in r:
                bar.update(task, completed=r["step"],
                           info=f"loss {r['loss']:.4f}  {r.get('tokens_per_s', 0):,.0f} tok/s")
            elif r.get("event") == "resume":
                bar.update(task, completed=r.get("step", 0), info=f"resumed at step {r.get('step')}")
            elif r.get("timing") == "checkpoint_begin":
                bar.update(task, info=f"checkpointing, step {r.get('step')}")
            elif r.get("event") == "evaluate":
                bar.update(task, info="evaluating the final weights")
        self._pos += len(chunk[:done].encode("utf-8"))


class TrialsProgress(FilePoller):
    """A bar over a sweep's trials with the running trial's step; one line per finished trial."""

    def __init__(self, trials_root: Path, names: Sequence[str], max_steps: int, console=None, interval: float = 0.5):
        super().__init__(console is not None)
        self.root, self.names, self.max_steps = Path(trials_root), list(names), max_steps
        self.console, self.interval = console, interval
        self._reported: set[str] = set()

    def _before(self) -> None:
        # finished before (a resumed sweep): counted, not announced again
        self._reported = {n for n in self.names if trial_state(self.root / n, n).phase == "done"}

    def _bar(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        return Progress(TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("{task.fields[info]}"), console=self.console, transient=False)

    def _start(self, bar):
        return bar.add_task("trials", total=len(self.names), completed=len(self._reported), info="")

    def _poll(self, bar, task) -> None:
        running, done = [], 0
        for n in self.names:
            st = trial_state(self.root / n, n)
            if st.phase == "done":
                done += 1
                if n not in self._reported:
                    res = read_memo(self.root / n / RESULT)
                    if res is None:  # caught mid-write: announce it on the next poll
                        continue
                    self._reported.add(n)
                    bar.console.print(f"[green]done[/green] {finished_line(res)}", highlight=False)
            elif st.phase != "pending":
                running.append(describe(st, self.max_steps))
        bar.update(task, completed=done, info="; ".join(running))

