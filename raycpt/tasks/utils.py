"""Python hooks referenced by the task YAMLs (``!function raycpt.tasks.utils.NAME``).

Imported by module name, not by file path, so the YAMLs work wherever raycpt is installed
(site-packages, an editable checkout, a ``ray job submit`` working-dir copy).
"""

from __future__ import annotations

from typing import Any

from lm_eval.api.filter import Filter

from raycpt.evaluate import WORDNET_MC_FILE, extract_choice, read_questions


def wordnet_mc_dataset(questions: str | None = None, **_: Any):
    """lm-eval ``custom_dataset``: the question file as a ``DatasetDict`` with a ``validation`` split.

    ``questions`` (from the task's ``dataset_kwargs``) names another file in the same format;
    default: the shipped ``raycpt/assets/wordnet_mc.jsonl``. Bad files raise ``RaycptError``.
    """
    import datasets

    rows = read_questions(questions or WORDNET_MC_FILE)
    return datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)})


class ChoiceFilter(Filter):
    """lm-eval filter: each generated text -> the extracted letter A-D, or "" when there is none."""

    def apply(self, resps, docs):
        return [[extract_choice(r if isinstance(r, str) else "") or "" for r in inst] for inst in resps]
