"""THE reader of a run folder as a record, for every command that goes on from one: ``raycpt runs sync`` (it replays
the folder into a store), ``raycpt runs show`` (it prints what the folder holds) and ``--resume`` (it continues the
folder's run). :func:`read_tree` walks the folder and the units its records name (a grid's trials, a sweep's trace),
each folder's :data:`raycpt.runs.records.RECORDS` read by :func:`raycpt.runs.records.check_records` (every line's
checksum and shape checked) and its meta file (``state.json``, ``trial.json``) read as a JSON object;
:func:`trusted_records` turns what is damaged or missing into one line - which file, which line, what was kept - and
exit 2, unless ``--accept-damage`` says to go on with what was kept (then the line is a note the command says)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from raycpt.errors import RaycptError
from raycpt.runs.records import RecordFile, check_records

ACCEPT_FLAG = "--accept-damage"


class RecordDamaged(RaycptError):
    """A run folder's record is damaged or missing, and the command was not told to go on (exit 2)."""


def read_meta(path: Path) -> tuple[dict, Optional[str]]:
    """``(object, None)`` for a meta file that reads as a JSON object (``{}`` when there is none), else
    ``({}, why)``."""
    try:
        doc = json.loads(Path(path).read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}, None
    except UnicodeDecodeError as e:
        return {}, f"not UTF-8 (byte at offset {e.start})"
    except ValueError as e:
        return {}, f"not JSON ({str(e).split(':')[0]})"
    except OSError as e:
        return {}, f"cannot be read ({type(e).__name__})"
    if not isinstance(doc, dict):
        return {}, f"a JSON {type(doc).__name__}, not an object"
    return doc, None


@dataclass
class FolderRecord:
    """One run folder of the tree: its meta file (``meta``; ``{}`` when absent or damaged) and its records."""

    folder: Path
    meta_file: str
    meta: dict
    meta_problem: Optional[str]
    records: RecordFile

    @property
    def required(self) -> bool:
        """Whether the folder must hold its records: a command's folder (``state.json``) once its MLflow run exists
        (its config is its first record). A unit (a trial) may end having recorded nothing."""
        return self.meta_file == "state.json" and bool(self.meta.get("mlflow_run_id"))

    def problem(self) -> Optional[str]:
        """What is wrong with this folder's record, in one phrase (None: nothing)."""
        rf = self.records
        if self.meta_problem:
            return f"{self.folder / self.meta_file} is damaged ({self.meta_problem})"
        if rf.damaged:
            n, why = rf.damaged[0]
            more = f" (and {len(rf.damaged) - 1} more damaged line(s))" if len(rf.damaged) > 1 else ""
            where = f"line {n}" if n else "the file"
            return f"{rf.path} {where} is damaged: {why}{more}; {len(rf.kept)} of {rf.lines} record(s) kept"
        if rf.missing and self.required:
            return (f"{rf.path} is missing though {self.meta_file} names its run {self.meta['mlflow_run_id']}; "
                    "0 records kept")
        return None


def read_tree(run_dir: Path, meta_file: str = "state.json") -> list[FolderRecord]:
    """The run folder and every unit folder its records name (that exists), each read once, parents first."""
    out: list[FolderRecord] = []
    todo, seen = [(Path(run_dir), meta_file)], set()
    while todo:
        folder, mf = todo.pop(0)
        if (folder, mf) in seen:
            continue
        seen.add((folder, mf))
        meta, why = read_meta(folder / mf)
        rf = check_records(folder)
        out.append(FolderRecord(folder, mf, meta, why, rf))
        for rec in rf.kept:
            for rel, child_mf in rec.get("children", []):
                if (folder / rel).is_dir():
                    todo.append((folder / rel, child_mf))
    return out


def trusted_records(run_dir: Path, who: str, accept: bool = False,
                    say: Optional[Callable[[str], None]] = None) -> tuple[list[FolderRecord], str]:
    """The folder's tree (:func:`read_tree`) when nothing in it is damaged or missing; else one line
    (:class:`RecordDamaged`, exit 2) naming the first damaged file and line and what was kept, and how many other
    files are damaged - unless ``accept`` (``--accept-damage``), then ``(tree, note)``: the note (said through ``say``
    when given) tells what the command goes on with. The note is ``""`` when nothing is wrong."""
    tree = read_tree(run_dir)
    problems = [p for p in (f.problem() for f in tree) if p]
    if not problems:
        return tree, ""
    more = f" (and {len(problems) - 1} more damaged record file(s))" if len(problems) > 1 else ""
    if not accept:
        raise RecordDamaged(f"{who}: {problems[0]}{more}; nothing was done: restore the file from a copy, or pass "
                            f"{ACCEPT_FLAG} to go on with the records kept")
    note = f"damage accepted ({ACCEPT_FLAG}): {problems[0]}{more}"
    if say is not None:
        say(f"warning: {who}: {note}")
    return tree, note
