"""What an evaluation returns: per-category scores (:func:`category_scores`), :class:`EvalResult`, and every
question's record out of lm-eval's samples."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Iterable

from raycpt.evaluate.answers import LETTERS
from raycpt.evaluate.spec import TaskSpec
from raycpt.tasks import CATEGORIES, CATEGORY_KEYS, subject_category



def category_scores(items: Iterable[tuple[str, bool]]) -> tuple[dict[str, float], dict[str, int]]:
    """``[(category, correct), ...]`` -> (scores in percent, question counts).

    Scores: one per category with questions (``stem``, ``social_science``, ``humanities``,
    ``other``), ``average`` = unweighted mean of those category scores (the paper's Average), and
    ``overall`` = percent correct over all questions. Counts: per category and ``total``.
    """
    return category_means(((cat, 100.0 * bool(ok)) for cat, ok in items))


def category_means(items: Iterable[tuple[str, float]]) -> tuple[dict[str, float], dict[str, int]]:
    """``[(category, value), ...]`` -> (the mean value per category, ``average`` = the unweighted mean of the
    category means, ``overall`` = the mean over all items; counts per category and ``total``):
    :func:`category_scores` for any per-question number (a continuous score, :data:`raycpt.tasks.CONTINUOUS`)."""
    sums: dict[str, float] = {}
    total: dict[str, int] = {}
    for cat, value in items:
        if cat not in CATEGORY_KEYS:
            raise ValueError(f"unknown category {cat!r}")
        k = CATEGORY_KEYS[cat]
        total[k] = total.get(k, 0) + 1
        sums[k] = sums.get(k, 0.0) + float(value)
    scores = {k: sums[k] / total[k] for k in (CATEGORY_KEYS[c] for c in CATEGORIES) if total.get(k)}
    n = sum(total.values())
    if scores:
        scores["average"] = sum(scores.values()) / len(scores)
        scores["overall"] = sum(sums.values()) / n
    counts = {**total, "total": n}
    return scores, counts


def continuous_scores(lls: list[float], gold: int, lengths: list[int]) -> dict[str, float]:
    """The :data:`CONTINUOUS` scores of one question from its options' log-likelihoods ``lls`` (nats), the gold
    option's index and each option's length in characters (lm-eval's ``acc_norm`` length): ``prob`` = 100 *
    exp(ll_gold) / sum_j exp(ll_j) (a softmax over the choices), ``logprob`` = ll_gold, ``logprob_char`` =
    ll_gold / len(gold option)."""
    top = max(lls)
    mass = math.exp(lls[gold] - top) / sum(math.exp(x - top) for x in lls)
    return {"prob": 100.0 * mass, "logprob": float(lls[gold]), "logprob_char": float(lls[gold]) / max(1, lengths[gold])}


@dataclass
class EvalResult:
    """Scores of one model: ``scores[task][mode][key]`` in percent, keys :data:`SCORE_KEYS`."""

    name: str
    source: str
    scores: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    questions: dict[str, list[dict]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat metrics named ``<task>/<category>/<mode>``, e.g. ``wordnet_mc/stem/logit``."""
        return {f"{task}/{key}/{mode}": v for task, modes in self.scores.items()
                for mode, sc in modes.items() for key, v in sc.items()}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "EvalResult":
        """Inverse of :meth:`to_dict`; extra keys (e.g. the flat ``metrics`` a training worker adds) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def option_lengths(sample: dict) -> list[int]:
    """Each option's length in characters: its continuation as lm-eval scored it (``arguments``: (context,
    continuation) per option), surrounding whitespace (the target delimiter) left out."""
    return [len(str(arg[1]).strip()) for arg in sample["arguments"]]


def records_logit(task_name: str, samples: list[dict], spec: TaskSpec, mode: str = "logit",
                   continuous: bool = True) -> dict[str, dict]:
    """Per question of a ``multiple_choice`` run (logit: the four letters; cloze: the four option
    texts): the log-likelihoods in option order, the first maximum as the prediction, ``correct``, and with
    ``continuous`` the :data:`raycpt.tasks.CONTINUOUS` scores from those log-likelihoods."""
    out = {}
    for s in samples:
        doc = s["doc"]
        lls = [float(r[0]) if isinstance(r, (list, tuple)) else float(r) for r in s["filtered_resps"]]
        best = max(range(len(lls)), key=lambda i: (lls[i], -i))  # first maximum, like numpy.argmax
        gold = LETTERS[int(s["target"])]
        key, base = question_key(task_name, s, spec)
        rec = {"prediction": LETTERS[best], "logprobs": lls, "correct": LETTERS[best] == gold}
        if continuous:
            rec.update(continuous_scores(lls, int(s["target"]), option_lengths(s)))
        if mode == "cloze" and "acc_norm" in s:  # lm-eval's own: log-likelihood over the option's characters
            rec["correct_norm"] = bool(s["acc_norm"])
        out[key] = {**base, "gold": gold, mode: rec}
    return out


def records_generate(task_name: str, samples: list[dict], spec: TaskSpec) -> dict[str, dict]:
    out = {}
    for s in samples:
        text = s["resps"][0][0] if s["resps"] and s["resps"][0] else ""
        filt = s["filtered_resps"]
        extracted = (filt[0] if isinstance(filt, list) else filt) or None
        gold = str(s["target"]).strip()
        key, base = question_key(task_name, s, spec)
        out[key] = {**base, "gold": gold,
                    "generate": {"text": text, "extracted": extracted, "correct": extracted == gold}}
    return out


def question_key(task_name: str, s: dict, spec: TaskSpec) -> tuple[str, dict]:
    doc = s["doc"]
    if spec.kind in ("hub", "local"):
        subject = re.sub(r"^(ceval-valid_|ceval_gen_|ceval_cloze_|cmmlu_gen_|cmmlu_cloze_|cmmlu_)", "", task_name)
        cat = subject_category(task_name)
        if cat is None:
            raise ValueError(f"no category for lm-eval task {task_name}")
        qid = f"{subject}-{int(s['doc_id']):04d}"
        question = doc.get("question") or doc.get("Question") or ""
        return qid, {"id": qid, "subject": subject, "category": cat, "question": question}
    base = {"id": str(doc["id"]), "category": doc["category"], "question": doc["question"]}
    if "subject" in doc:
        base["subject"] = doc["subject"]
    return str(doc["id"]), base
