"""C-Eval and CMMLU from a local copy of their official releases (``eval.data_dir``), no hub.

The published layouts (the files of ``ceval-exam.zip`` and of ``cmmlu_v1_0_1.zip``):

* C-Eval: ``val/<subject>_val.csv`` with the header ``id,question,A,B,C,D,answer,explanation``
  (the validation split, which lm-eval's ``ceval-valid`` scores: test answers are not released);
* CMMLU: ``test/<subject>.csv`` with the header ``,Question,A,B,C,D,Answer`` (the first, unnamed
  column is the row number).

Subjects are the keys of the category maps (:data:`raycpt.tasks.CEVAL_CATEGORIES`, 52;
:data:`raycpt.tasks.CMMLU_CATEGORIES`, 67). **Required files**: every subject that runs - all of
the benchmark's subjects, or the ones ``eval.subjects`` names - must have its file; files of other
subjects, and other files, are ignored. Every required file is read and checked here (header,
answers A-D, no empty question or option) before anything runs, with one line naming the file
(and the line) for anything wrong.

Files are read with Python's ``csv`` module as text: no column is parsed as a number or a missing
value (pandas, behind ``datasets``' ``csv`` builder, would turn an option ``NA`` or ``None`` into
NaN and ``007`` into 7). The rows keep the hub datasets' column names (C-Eval ``id`` as an
integer, like the hub's ``int32``), so lm-eval's ``ceval-valid`` / ``cmmlu`` prompts and raycpt's
``ceval_gen`` / ``cmmlu_gen`` prompts render them unchanged.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from raycpt.errors import RaycptError, read_user_text
from raycpt.tasks import CEVAL_CATEGORIES, CMMLU_CATEGORIES

LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class Layout:
    """Where a benchmark's release keeps one subject's scored questions, and in what columns."""

    task: str
    """raycpt task name (``ceval`` / ``cmmlu``)."""
    title: str
    """Benchmark name in messages."""
    split: str
    """Split folder of the release, also the split name lm-eval's task reads."""
    pattern: str
    """File name of a subject inside ``split``."""
    header: tuple[str, ...]
    """The exact first line of every subject file."""
    question: str
    """Column of the question text."""
    answer: str
    """Column of the gold letter."""
    categories: dict
    """Subject -> category."""

    def file(self, folder: Path, subject: str) -> Path:
        return Path(folder) / self.split / self.pattern.format(subject=subject)

    @property
    def published(self) -> str:
        return f"{self.split}/{self.pattern.format(subject='<subject>')}"


LAYOUTS = {
    "ceval": Layout("ceval", "C-Eval", "val", "{subject}_val.csv",
                    ("id", "question", "A", "B", "C", "D", "answer", "explanation"), "question", "answer",
                    CEVAL_CATEGORIES),
    "cmmlu": Layout("cmmlu", "CMMLU", "test", "{subject}.csv", ("", "Question", "A", "B", "C", "D", "Answer"),
                    "Question", "Answer", CMMLU_CATEGORIES),
}


def layout(task: str) -> Layout:
    if task not in LAYOUTS:
        raise RaycptError(f"eval.data_dir: {task!r} has no local layout; local copies exist for "
                          f"{', '.join(LAYOUTS)}")
    return LAYOUTS[task]


def task_folders(data_dir, tasks: Sequence[str]) -> dict[str, Path]:
    """``eval.data_dir`` -> {task: release folder} for the local benchmarks among ``tasks``.

    A string is a folder holding one release per benchmark, ``<data_dir>/ceval`` and
    ``<data_dir>/cmmlu`` (each needed only when its task runs); a mapping names each release folder
    itself, ``{ceval: DIR, cmmlu: DIR}`` (tasks it names that do not run are ignored). None: {}.
    """
    if not data_dir:
        return {}
    if isinstance(data_dir, dict):
        for key in data_dir:
            layout(str(key))
        out = {t: Path(str(data_dir[t])).expanduser() for t in tasks if t in data_dir and data_dir[t]}
        where = {t: f"eval.data_dir.{t}" for t in out}
    else:
        root = Path(str(data_dir)).expanduser()
        if not root.is_dir():
            raise RaycptError(f"eval.data_dir={str(data_dir)!r}: not a folder (give a folder holding ceval/ and/or "
                              "cmmlu/, or {ceval: DIR, cmmlu: DIR})")
        out = {t: root / t for t in tasks if t in LAYOUTS}
        where = {t: f"eval.data_dir={str(data_dir)!r}" for t in out}
    for t, folder in out.items():
        if not folder.is_dir():
            lay = LAYOUTS[t]
            raise RaycptError(f"{where[t]}: {folder} is not a folder; expected a copy of the {lay.title} release "
                              f"({lay.published})")
    return {t: folder.resolve() for t, folder in out.items()}


def absolute_data_dir(data_dir):
    """``eval.data_dir`` with every folder absolute (``~`` expanded), in the same form (str or mapping)."""
    if not data_dir:
        return data_dir
    if isinstance(data_dir, dict):
        return {k: str(Path(str(v)).expanduser().resolve()) if v else v for k, v in data_dir.items()}
    return str(Path(str(data_dir)).expanduser().resolve())


def subjects_of(task: str, chosen: Optional[Sequence[str]] = None) -> list[str]:
    """The subjects that run: ``chosen`` (checked against the category map) or all, in sorted order."""
    table = layout(task).categories
    if not chosen:
        return sorted(table)
    unknown = [s for s in chosen if s not in table]
    if unknown:
        raise RaycptError(f"eval.subjects.{task}: unknown subject {unknown[0]!r}; {layout(task).title} has "
                          f"{len(table)} subjects, e.g. {', '.join(sorted(table)[:3])}")
    if len(set(chosen)) != len(chosen):
        raise RaycptError(f"eval.subjects.{task}: a subject is listed twice")
    return list(chosen)


def subject_files(task: str, folder: Path, subjects: Sequence[str]) -> dict[str, Path]:
    """{subject: file} for ``subjects``; one line naming the first missing file (and how many are missing)."""
    lay = layout(task)
    files = {s: lay.file(folder, s) for s in subjects}
    missing = [f for f in files.values() if not f.is_file()]
    if missing:
        more = f" ({len(missing)} of {len(files)} required subject files missing)" if len(missing) > 1 else ""
        raise RaycptError(f"eval.data_dir: {lay.title} copy {folder} lacks {missing[0]}{more}; the published layout "
                          f"is {lay.published} for every subject that runs (all {len(lay.categories)}, or "
                          f"those in eval.subjects.{task})")
    return files


def read_subject(task: str, path: str | Path) -> list[dict]:
    """The rows of one subject file as dicts keyed like the hub dataset; one line for anything wrong."""
    lay = layout(task)
    p = Path(path)
    text = read_user_text(p, f"eval.data_dir: {lay.title} subject file", encoding="utf-8-sig")  # the bounded reader
    reader = csv.reader(text.splitlines())
    header = tuple(next(reader, ()))
    if header != lay.header:
        raise RaycptError(f"eval.data_dir: {p} line 1 is {','.join(header)!r}; the {lay.title} release's header is "
                          f"{','.join(lay.header)!r}")
    rows = []
    for n, values in enumerate(reader, 2):
        if not values:
            continue
        if len(values) != len(header):
            raise RaycptError(f"eval.data_dir: {p} line {n} has {len(values)} fields, the header {len(header)}")
        rec = dict(zip(header, values))
        if rec[lay.answer].strip() not in LETTERS:
            raise RaycptError(f"eval.data_dir: {p} line {n} {lay.answer}={rec[lay.answer]!r}, allowed: A, B, C, D")
        empty = [k for k in (lay.question, *LETTERS) if rec[k].strip() == ""]
        if empty:
            raise RaycptError(f"eval.data_dir: {p} line {n} has an empty {empty[0]!r}")
        rec[lay.answer] = rec[lay.answer].strip()
        rows.append(_typed(task, rec, p, n))
    if not rows:
        raise RaycptError(f"eval.data_dir: {p} has no questions")
    return rows


def _typed(task: str, rec: dict, p: Path, n: int) -> dict:
    if task == "ceval":
        try:
            rec["id"] = int(rec["id"])
        except ValueError:
            raise RaycptError(f"eval.data_dir: {p} line {n} id={rec['id']!r} is not an integer") from None
    else:
        rec.pop("", None)  # the row number column
    return rec


def check_local(task: str, folder: Path, subjects: Optional[Sequence[str]] = None) -> dict[str, Path]:
    """Resolve and check one local benchmark: {subject: file}, every file read and checked."""
    files = subject_files(task, folder, subjects_of(task, subjects))
    for f in files.values():
        read_subject(task, f)
    return files
