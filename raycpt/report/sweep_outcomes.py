"""A sweep trial's per-question data, read from its ``eval_result.json``: each question's outcome per task and
mode, the per-block held-out losses, and the document of each block (the sweep's ``heldout_docs.json``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from raycpt.tasks import CATEGORY_KEYS

def question_outcomes(questions: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, tuple[str, bool]]]]:
    """Per-question records (``EvalResult.questions``) -> ``{task: {mode: {question id: (category key, correct)}}}``.

    A mode is any key of a record whose value is a mapping with ``correct`` (``logit``, ``generate``,
    ``cloze``, ...); the category is mapped to its score key (``STEM`` -> ``stem``)."""
    out: dict[str, dict[str, dict[str, tuple[str, bool]]]] = {}
    for task, qs in questions.items():
        for q in qs:
            cat = CATEGORY_KEYS.get(q.get("category"), str(q.get("category")))
            for mode, rec in q.items():
                if isinstance(rec, dict) and "correct" in rec:
                    out.setdefault(task, {}).setdefault(mode, {})[str(q["id"])] = (cat, bool(rec["correct"]))
    return out


HELDOUT_DOCS_FILE = "heldout_docs.json"  # next to the sweep's heldout_blocks.json: the document of each block


def _heldout_docs_near(path: Path, blocks: Optional[list]) -> Optional[list]:
    """The held-out blocks' documents from ``heldout_docs.json`` in a folder above the trial's eval file
    (the sweep's run folder), when it has one entry per block."""
    if not blocks:
        return None
    for folder in list(path.parents)[:5]:
        f = folder / HELDOUT_DOCS_FILE
        if f.is_file():
            docs = json.loads(f.read_text(encoding="utf-8"))
            return docs if isinstance(docs, list) and len(docs) == len(blocks) else None
    return None


def load_outcomes(trial: dict) -> dict:
    """The trial result with ``outcomes`` (:func:`question_outcomes`) and the per-block held-out losses
    (``heldout_blocks``, ``heldout_weights``) read from its ``eval_file``; unchanged when it has none."""
    path = trial.get("eval_file")
    if not path or not Path(path).is_file():
        return trial
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    blocks = data.get("heldout_block_losses")
    out = {**trial, "outcomes": question_outcomes(data.get("questions") or {}),
           "heldout_blocks": blocks, "heldout_weights": data.get("heldout_block_weights")}
    docs = trial.get("heldout_docs") or _heldout_docs_near(Path(path), blocks)
    return {**out, "heldout_docs": docs} if docs else out
