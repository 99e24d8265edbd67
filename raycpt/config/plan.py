"""``plan``: which layers train (a name of the plan registry, :data:`raycpt.registry.PLANS`, and its settings)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Literal, Optional

from raycpt.config.checks import check_field, check_seed
from raycpt.registry import PLANS  # filled by @register_plan in raycpt.strategies, which the package root imports


@dataclass
class PlanConfig:
    name: str = "train_shallow"
    """Layer plan: a name of the ``@register_plan`` registry (see ``raycpt plan show``)."""
    split: float = 0.5
    """Split ratio r for train_shallow / train_deep: shallow = layers [0, b), b = floor(r*N + 1/2) (half up;
    exact fractions such as 2/3 accepted)."""
    pattern: str = ""
    """``blocks``: a 0/1 pattern over equal contiguous blocks, e.g. ``01100``."""
    layers: list[int] = field(default_factory=list)
    """``layers``: explicit list of trainable decoder layers (0-based)."""
    layer: int = 0
    """``single``: the one trainable layer."""
    k: int = 5
    """``elite``: top-k layers of the ranking; ``middle``: the middle k layers."""
    ranking_file: Optional[str] = None
    """``elite``: JSON ranking written by ``raycpt contribution``."""
    lr_scales: dict[int, float] = field(default_factory=dict)
    """Per-layer learning-rate multipliers {layer: scale}; combine with any plan."""
    elite_lr_scale: float = 1.0
    """``elite``: learning-rate multiplier for the elite layers."""
    elite_train_rest: bool = False
    """``elite``: also train the other layers at lr x1 (the "higher LR for elite layers" variant)."""
    elite_pick: Literal["top", "bottom"] = "top"
    """``elite``: ``top`` = the k highest-scored layers of the ranking; ``bottom`` = the k lowest-scored (seed
    003's control: the same k and LR scale on the least-contributing layers)."""
    train_embeddings: bool = False
    """Whether the input embeddings train (with tied embeddings this also trains the head)."""
    train_final_norm: bool = False
    """Whether the final norm trains."""
    train_head: bool = False
    """Whether the LM head trains (with tied embeddings: the shared matrix)."""
    full_non_layers: bool = True
    """``full``: also train the embeddings, final norm and head (full-parameter training); false = only its
    decoder layers, with the ``train_embeddings`` / ``train_final_norm`` / ``train_head`` of every other plan
    (the sweep sets false with ``sweep.equal_footing``)."""
    adapter: Literal["none", "lora"] = "none"
    """``lora``: train LoRA adapters (peft) on the plan's layers instead of their weights, which stay frozen;
    embeddings, final norm and head train as ``train_*`` say (also under ``full``); merged for evaluation."""
    lora_rank: int = 16
    """LoRA rank r (at most the smaller side of every targeted linear layer)."""
    lora_alpha: Optional[float] = None
    """LoRA alpha: the adapter's update is scaled by alpha / r (alpha / sqrt(r) with ``lora_rslora``); null = 2 x
    ``lora_rank`` (alpha tied to the rank: a scale of 2 at every rank, the usual LoRA setting), so a budget row's
    large rank does not shrink the update."""
    lora_rslora: bool = False
    """rsLoRA (Kalajdzievski 2023, peft's ``use_rslora``): scale by alpha / sqrt(r) instead of alpha / r."""
    lora_targets: list[str] = field(default_factory=list)
    """Linear modules inside a decoder layer that get adapters, by leaf name (e.g. ``[q_proj, v_proj]``); empty =
    every linear layer of the plan's decoder layers."""
    lisa_layers: int = 2
    """``lisa``: gamma, the decoder layers drawn to train in each interval (embeddings, final norm, head always train)."""
    lisa_interval: Optional[int] = None
    """``lisa``: K, optimizer steps between draws (steps 1..K use draw 0, K+1..2K draw 1, ...); it must be below
    ``train.max_steps`` (else LISA never switches: refused in one line). null = derived from the run,
    ``max(1, train.max_steps // 4)``: at least 4 draws (3 switches) in any run."""
    lisa_seed: Optional[int] = None
    """``lisa``: seed of the draws; draw j is a pure function of (lisa_seed, j). null = the run's ``train.seed``, so
    a sweep's seeds draw different layer schedules and LISA's run-to-run noise includes its draws (issue 50)."""
    elo_layers: int = 1
    """``elo`` (ELO, EACL 2026): the first and the last this many decoder layers train (1 = layers 0 and N-1)."""
    matrices: list[str] = field(default_factory=list)
    """``spectrum``: the decoder-layer matrices that train, each ``<layer>.<module path>`` (e.g.
    ``3.self_attn.q_proj``: that module's weight and bias); the input embeddings and the LM head train too
    (Spectrum's rule). ``raycpt sweep --budget`` fills it from Spectrum's per-type SNR selection."""
    expand_blocks: int = 2
    """``expand`` (LLaMA-Pro block expansion): P identity copies inserted, one after each of P equal groups of
    layers; only they train."""

    def __post_init__(self):
        check_field(self.lora_rank >= 1, "plan.lora_rank", self.lora_rank, "an integer >= 1")
        check_field(self.lora_alpha is None or self.lora_alpha > 0, "plan.lora_alpha", self.lora_alpha,
               "a positive number, or null (2 x plan.lora_rank)")
        check_field(self.lisa_layers >= 1, "plan.lisa_layers", self.lisa_layers, "an integer >= 1")
        check_field(self.lisa_interval is None or self.lisa_interval >= 1, "plan.lisa_interval", self.lisa_interval,
               "an integer >= 1, or null (train.max_steps // 4)")
        for m in self.matrices:
            head, _, rest = str(m).partition(".")
            check_field(head.isdigit() and bool(rest), "plan.matrices", m, "entries <layer>.<module path>, e.g. "
                   "3.self_attn.q_proj")
        check_field(self.elo_layers >= 1, "plan.elo_layers", self.elo_layers, "an integer >= 1")
        if self.lisa_seed is not None:  # None: the run's train.seed
            check_seed("plan.lisa_seed", self.lisa_seed)
        check_field(self.expand_blocks >= 1, "plan.expand_blocks", self.expand_blocks, "an integer >= 1")
        close = difflib.get_close_matches(self.name, PLANS.names(), n=1)
        check_field(self.name in PLANS, "plan.name", self.name,
               "one of " + PLANS.choices() + (f" (did you mean {close[0]!r}?)" if close else ""))
        check_field(0 < self.split < 1, "plan.split", self.split, "a ratio strictly between 0 and 1")
        check_field(all(c in "01" for c in self.pattern), "plan.pattern", self.pattern, "a string of 0 and 1, e.g. 01100")
        check_field(self.k >= 1, "plan.k", self.k, "an integer >= 1")
        check_field(self.elite_lr_scale > 0, "plan.elite_lr_scale", self.elite_lr_scale, "a positive number")
        check_field(self.elite_pick in ("top", "bottom"), "plan.elite_pick", self.elite_pick,
               "top (the k best-ranked layers) or bottom (the k lowest-scored: the control)")
        for k, v in self.lr_scales.items():
            check_field(v > 0, f"plan.lr_scales.{k}", v, "a positive multiplier")
