"""``select``: a layer selector's ranking (the registered selectors of :mod:`raycpt.diagnostics`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycpt.config.checks import check_field, check_seed
from raycpt.registry import SELECTORS  # declared in raycpt.diagnostics, which the package root imports


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
