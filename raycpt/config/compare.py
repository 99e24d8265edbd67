"""``compare``: base against tuned, per layer (CKA, cosine, entropy, effective rank, weight change, probes)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycpt.config.checks import check_field


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
