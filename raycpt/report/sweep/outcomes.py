"""A sweep trial's per-question data, read from its ``eval_result.json``: each question's outcome per task and
mode, the per-block held-out losses, and the document of each block (the sweep's ``heldout_docs.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from raycpt.errors import read_user_json
from raycpt.tasks import CATEGORY_KEYS, CONTINUOUS, continuous_mode

def question_outcomes(questions: dict[str, list[dict]]) -> dict[str, dict[str, dict[str, tuple[str, Any]]]]:
    """Per-question records (``EvalResult.questions``) -> ``{task: {mode: {question id: (category key, outcome)}}}``.

    A mode is any key of a record whose value is a mapping with ``correct`` (``logit``, ``generate``,
    ``cloze``, ...): its outcome is that bool; each continuous score the record holds
    (:data:`raycpt.tasks.CONTINUOUS`) is a mode of its own (``cloze.prob``) whose outcome is the
    float. The category is mapped to its score key (``STEM`` -> ``stem``)."""
    out: dict[str, dict[str, dict[str, tuple[str, Any]]]] = {}
    for task, qs in questions.items():
        for q in qs:
            cat = CATEGORY_KEYS.get(q.get("category"), str(q.get("category")))
            for mode, rec in q.items():
                if isinstance(rec, dict) and "correct" in rec:
                    out.setdefault(task, {}).setdefault(mode, {})[str(q["id"])] = (cat, bool(rec["correct"]))
                    for name in CONTINUOUS:
                        if rec.get(name) is not None:
                            out[task].setdefault(continuous_mode(mode, name), {})[str(q["id"])] = (
                                cat, float(rec[name]))
    return out


HELDOUT_DOCS_FILE = "heldout_docs.json"  # next to the sweep's heldout_blocks.json: the document of each block
PROBE_DOCS = {"heldout": HELDOUT_DOCS_FILE, "general": "general_docs.json"}
"""The document of each block of the held-out loss (domain) and of the general probe, in the sweep's folder."""


def _heldout_docs_near(path: Path, blocks: Optional[list], name: str = HELDOUT_DOCS_FILE) -> Optional[list]:
    """The held-out blocks' documents from ``heldout_docs.json`` (or ``name``) in a folder above the trial's eval
    file (the sweep's run folder), when it has one entry per block."""
    if not blocks:
        return None
    for folder in list(path.parents)[:5]:
        f = folder / name
        if f.is_file():
            docs = read_user_json(f, "held-out documents file", shape=object)
            return docs if isinstance(docs, list) and len(docs) == len(blocks) else None
    return None


def load_outcomes(trial: dict) -> dict:
    """The trial result with ``outcomes`` (:func:`question_outcomes`) and the per-block held-out losses
    (``heldout_blocks``, ``heldout_weights``, ``heldout_docs``) and the general probe's (``general_*``, and
    ``general_loss`` when the result lacks it) read from its ``eval_file``; unchanged when it has none."""
    path = trial.get("eval_file")
    if not path or not Path(path).is_file():
        return trial
    data = read_user_json(path, "trial evaluation file")  # the bounded reader: one line for a damaged file
    out = {**trial, "outcomes": question_outcomes(data.get("questions") or {})}
    for key, name in PROBE_DOCS.items():  # per-block losses of the held-out (domain) and general probes
        blocks = data.get(f"{key}_block_losses")
        out.update({f"{key}_blocks": blocks, f"{key}_weights": data.get(f"{key}_block_weights")})
        if out.get(f"{key}_loss") is None and data.get(f"{key}_loss") is not None:
            out[f"{key}_loss"] = data[f"{key}_loss"]
        docs = trial.get(f"{key}_docs") or _heldout_docs_near(Path(path), blocks, name)
        if docs:
            out[f"{key}_docs"] = docs
    return out
