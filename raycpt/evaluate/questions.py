"""Question files (JSONL in C-Eval format): read and checked, one clear line for anything wrong."""

from __future__ import annotations

import os
from pathlib import Path

from raycpt.errors import RaycptError, json_record, read_user_text
from raycpt.evaluate.answers import LETTERS
from raycpt.evaluate.registry import register_reader
from raycpt.tasks import CATEGORIES

QUESTION_FIELDS = ("question", "A", "B", "C", "D", "answer", "category")



@register_reader("questions")
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
    read_user_text(p, "question file")  # one line for a binary file, before the line-by-line checks
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
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
