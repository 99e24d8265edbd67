"""``contribution``: the single-layer scan (each layer trained alone, contribution = gain(layer) / gain(full))."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from raycpt.config.checks import check_distinct_tags, check_field, check_seed, lr_tag


@dataclass
class ContributionConfig:
    """``raycpt contribution``: the single-layer training scan (one Tune trial per scanned layer)."""

    layers: Union[list[int], str] = "all"
    """Layers trained alone (plan ``single``): ``all``, ``every:K`` (every K-th layer) or a list of indices."""
    band: list[float] = field(default_factory=lambda: [0.4, 0.6])
    """Relative-depth band [lo, hi] marked in the plot and averaged in the table."""
    threshold: float = 1.0
    """Count the layers whose contribution exceeds this (1.0 = as good as full training)."""
    top_k: int = 7
    """Majority vote and Jaccard of newly solved questions over the top-k single-layer models."""
    against: Optional[str] = None
    """A ranking file to correlate with (Spearman), e.g. a scan on another corpus; null = none."""
    keep_models: bool = True
    """false = delete each trial's trained weights once measured (answers and L2 change are kept)."""
    score: Literal["accuracy", "gold_prob", "heldout_loss"] = "accuracy"
    """What a trial is judged by: accuracy = the benchmark's overall accuracy in the first mode; gold_prob =
    the mean probability of the gold letter among A-D in logit mode (moves with short runs); heldout_loss =
    minus the LM loss on ``heldout_docs`` documents after the first ``data.max_documents`` (never trained on)."""
    heldout_docs: int = 64
    """Documents of the held-out loss (``score: heldout_loss``)."""
    max_concurrent_trials: int = 1
    """Tune trials running at once."""
    cpus_per_trial: float = 1.0
    """CPUs reserved by a trial's driver (its TorchTrainer asks for its own workers)."""
    data_cpus_per_trial: float = 1.0
    """CPUs of a second bundle in each trial's placement group for the Ray Data tasks the trial launches."""
    sampled_vote: bool = True
    """Seed 003's control of the top-k vote: the full model answering k times by seeded sampling of its choice
    distribution, then voting (needs eval.modes[0] logit or cloze); reported with the paired test against the vote."""
    sample_temperature: float = 1.0
    """Temperature of that sampling (0 = the argmax answer every time)."""
    sample_seed: int = 0
    """Seed of that sampling (each question's draws depend only on it and the question id)."""
    elite_lr_control: bool = False
    """After the scan, two more trials: every layer trains, the top ``elite_k`` layers by contribution at lr x
    ``elite_lr_scale`` (plan elite, ``elite_pick: top``) and its control, the bottom ``elite_k`` (``elite_pick:
    bottom``); both against ``full`` with the paired McNemar test."""
    lr_grid: Optional[list[float]] = None
    """Seed 003's tuned-learning-rate baseline: before the scan, ``full`` trains at ``train.lr`` x each multiplier
    (Tune folder ``tune-lr``); the one with the lowest loss on a validation slice (``validation_docs`` documents,
    never trained on, none a held-out test document) sets ``train.lr`` for every scan trial, so single layers run at
    the strongest full baseline's rate. null = the scan runs at ``train.lr``."""
    validation_docs: int = 64
    """Documents of the validation slice ``lr_grid`` picks on."""
    elite_k: int = 5
    """Layers at the raised LR in each of the two elite trials (2 x elite_k <= the scanned layers)."""
    elite_lr_scale: float = 2.0
    """LR multiplier of those layers (> 0)."""

    def __post_init__(self):
        check_field(self.sample_temperature >= 0, "contribution.sample_temperature", self.sample_temperature,
               "a number >= 0 (0 = the argmax answer)")
        check_seed("contribution.sample_seed", self.sample_seed)
        check_field(self.elite_k >= 1, "contribution.elite_k", self.elite_k, "an integer >= 1")
        if self.lr_grid is not None:
            check_field(len(self.lr_grid) > 0 and all(isinstance(m, (int, float)) and not isinstance(m, bool) and m > 0
                                                 for m in self.lr_grid), "contribution.lr_grid", self.lr_grid,
                   "positive learning-rate multipliers, e.g. [0.333, 1, 3], or null")
            check_distinct_tags("contribution.lr_grid", self.lr_grid, lr_tag)
        check_field(self.validation_docs >= 1, "contribution.validation_docs", self.validation_docs, "an integer >= 1")
        check_field(self.elite_lr_scale > 0, "contribution.elite_lr_scale", self.elite_lr_scale, "a positive number")
        if isinstance(self.layers, str) and self.layers != "all":
            k = self.layers.split(":", 1)[1] if self.layers.startswith("every:") else ""
            check_field(k.isdigit() and int(k) >= 1, "contribution.layers", self.layers,
                   "all, a list of layer indices, or every:K with an integer K >= 1")
        check_field(not isinstance(self.layers, list) or len(self.layers) > 0, "contribution.layers", self.layers,
               "all, every:K or a non-empty list of layer indices")
        check_field(len(self.band) == 2 and 0 <= self.band[0] < self.band[1] <= 1, "contribution.band", self.band,
               "two relative depths [lo, hi] with 0 <= lo < hi <= 1")
        check_field(self.top_k >= 1, "contribution.top_k", self.top_k, "an integer >= 1")
        check_field(self.heldout_docs >= 1, "contribution.heldout_docs", self.heldout_docs, "an integer >= 1")
        check_field(self.max_concurrent_trials >= 1, "contribution.max_concurrent_trials", self.max_concurrent_trials,
               "an integer >= 1")

    def layer_list(self, num_layers: int) -> list[int]:
        """The scanned layers of an N-layer model, sorted; a layer outside 0..N-1 is a one-line error."""
        if self.layers == "all":
            return list(range(num_layers))
        if isinstance(self.layers, str):
            return list(range(0, num_layers, int(self.layers.split(":", 1)[1])))
        for i in self.layers:
            check_field(0 <= i < num_layers, "contribution.layers", i,
                   f"not a layer of this {num_layers}-layer model (0..{num_layers - 1})")
        return sorted(set(self.layers))
