"""The analysis commands' sections: ``contribution`` (the single-layer scan), ``compare`` (base vs tuned per
layer), ``select`` (a layer selector's ranking)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional, Union

from raycpt.config.checks import check_distinct_tags, check_field, check_seed, lr_tag
from raycpt.registry import SELECTORS  # declared in raycpt.diagnostics, which the package root imports


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


@dataclass
class CompareConfig:
    """``raycpt compare``: base vs tuned per layer (its CLI options override these)."""

    prompts: Optional[str] = None
    """Prompt set: .jsonl of {text} or {s1, s2}, .txt (one per line) or builtin:wordnet-lexical;
    null = WordNet glosses."""
    max_prompts: int = 64
    """Prompts used for the representation metrics."""
    max_len: int = 64
    """Tokens per prompt (longer ones are cut)."""
    swap_blocks: Optional[int] = None
    """Layer swap: number of contiguous blocks (null = min(5, layers); 0 = no swaps)."""
    alpha: float = 1.0
    """Order of the matrix-based Renyi entropy (1 = von Neumann)."""
    outlier_factor: float = 10.0
    """Leave out massive-activation tokens (norm > factor x median token norm); 0 = keep all."""
    batch_size: int = 8
    """Prompts per forward batch of the hidden-state tasks."""

    def __post_init__(self):
        check_field(self.max_prompts >= 1, "compare.max_prompts", self.max_prompts, "an integer >= 1")
        check_field(self.max_len >= 2, "compare.max_len", self.max_len, "an integer >= 2")
        check_field(self.alpha > 0, "compare.alpha", self.alpha, "the Renyi order must be > 0 (1 = von Neumann)")
        check_field(self.outlier_factor == 0 or self.outlier_factor > 1, "compare.outlier_factor", self.outlier_factor,
               "0 (keep every token) or a factor > 1 of the median token norm")
        check_field(self.swap_blocks is None or self.swap_blocks >= 0, "compare.swap_blocks", self.swap_blocks,
               "an integer >= 0 (0 = no swaps) or null")
        check_field(self.batch_size >= 1, "compare.batch_size", self.batch_size, "an integer >= 1")


@dataclass
class SelectConfig:
    """``raycpt select``: a layer selector's scores per layer -> a ranking file (its CLI options override these)."""

    method: str = "bi"
    """Selector: a name of the selector registry (:data:`raycpt.registry.SELECTORS`; ``raycpt select --help`` lists
    them): bi (Block Influence on corpus blocks), snr (weight-only SNR, the mean over a layer's matrices),
    layertracer (LS^ - TP^ of a trace), random (seeded), elo (first and last layers first) or gradnorm (per-layer
    gradient norm of the LM loss on corpus blocks, AdaGradSelect-style)."""
    k: Optional[int] = None
    """Top-k layers named in the ranking file (its ``top_k``) and the plot; null = half the layers."""
    samples: int = 16
    """bi, gradnorm: corpus blocks of ``select.seq_len`` tokens (data.corpus, the model's tokenizer) the cosines average over."""
    seq_len: Optional[int] = None
    """bi, gradnorm: tokens per block; null = data.seq_len."""
    seed: int = 0
    """random: the seed of the draw (and of the spread sample of bi's documents)."""
    normalize: bool = False
    """snr: divide each matrix's SNR by its largest singular value, as Spectrum's script does."""

    def __post_init__(self):
        check_field(self.method in SELECTORS, "select.method", self.method, f"one of {SELECTORS.choices()}")
        check_field(self.samples >= 1, "select.samples", self.samples, "an integer >= 1")
        check_seed("select.seed", self.seed)
        check_field(self.seq_len is None or self.seq_len >= 2, "select.seq_len", self.seq_len, "an integer >= 2 or null")
