"""``report``: how the sweep summary decides (the primary comparison, the multiplicity control)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from raycpt.config.checks import check_field


@dataclass
class ReportConfig:
    primary: str = "heldout_loss"
    """The pre-declared primary comparison of the sweep summary: ``task/mode`` (Average column against
    full, e.g. ``wordnet_mc/logit``) or ``heldout_loss``; every other comparison is secondary
    (exploratory) and can be marked only after a primary one is. Empty = none (one Holm family). The
    default is the held-out loss: on the short CPU sweep it is what moves (the benchmarks barely do)."""
    adjust: Literal["holm", "bh"] = "holm"
    """Multiplicity control over the sweep's comparisons: ``holm`` (family-wise error <= alpha over every
    mark; the primary gates the secondaries) or ``bh`` (Benjamini-Hochberg: false-discovery rate <= alpha)."""
    alpha: float = 0.05
    """The error rate of ``adjust`` (family-wise for holm, false-discovery rate for bh)."""

    def __post_init__(self):
        check_field(0 < self.alpha < 1, "report.alpha", self.alpha, "a rate strictly between 0 and 1, e.g. 0.05")
        parts = self.primary.split("/") if self.primary else []
        check_field(not self.primary or self.primary == "heldout_loss" or (len(parts) == 2 and all(parts)
                                                                      and parts[1] in ("logit", "generate", "cloze")),
               "report.primary", self.primary, "'task/mode' with mode logit, generate or cloze (e.g. "
               "wordnet_mc/logit), 'heldout_loss', or ''")
