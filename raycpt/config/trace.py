"""``trace``: LayerTracer's prompt set, its metrics' settings, the split grid and the trace actors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from raycpt.config.checks import check_field


@dataclass
class TraceConfig:
    prompts: str = "builtin:wordnet-lexical"
    """Prompt set: ``builtin:wordnet-lexical`` (500 prompts, 10 groups) or a JSONL of {s1, s2, group}."""
    max_prompts: Optional[int] = None
    """Use only the first N prompts (None = all)."""
    top_k: int = 10
    """JS support: P's top-k tokens, both distributions renormalised over them; 0 = full vocabulary."""
    tau: float = 0.0
    """Task Particle threshold: layers with Ratio > tau form the interval."""
    eps: float = 1e-6
    """Epsilon of Ratio and dJS."""
    splits: list[float] = field(default_factory=lambda: [0.33, 0.5, 0.66])
    """Split ratios reported in the S(b) table."""
    grid: list[float] = field(default_factory=lambda: [0.2, 0.8, 0.05])
    """Search grid for the recommended split: [start, stop, step] (inclusive)."""
    batch_size: int = 16
    """Prompts per forward batch inside an actor."""
    num_actors: int = 1
    """Actors in the trace pool (each loads the model once); 1 with no cluster named = the driver's own process."""
    gpus_per_actor: float = 0.0
    """GPUs per trace actor (0 on CPU)."""
    cpus_per_actor: float = 1.0
    """CPUs per trace actor."""
    schedule: Literal["shared_context", "stacked", "per_layer"] = "shared_context"
    """Perturbation schedule (same numbers): zeroed context once per prefix group, or per prompt."""
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    """Weights dtype of the trace actors: float32 (bf16 moved per-layer mean dJS 5-25% in a stand-in); auto = model.dtype."""
    sb_aggregate: Literal["scaled", "mean", "median"] = "scaled"
    """Profiles behind S(b), its interval and the recommended split: ``scaled`` (each prompt's Ratio and dJS divided by
    their own mean over layers, then averaged: every prompt weighs the same; jackknife-t interval, coverage checked by
    benchmarks/bench_calibration.py), ``mean`` (004's raw mean; a few exploding prompts dominate it; BCa interval) or
    ``median``. The table shows the paper's mean-based S(b) beside it."""

    def __post_init__(self):
        check_field(self.top_k >= 0, "trace.top_k", self.top_k, "an integer >= 0 (0 = full vocabulary)")
        check_field(self.eps > 0, "trace.eps", self.eps, "a positive number")
        for r in self.splits:
            check_field(0 < r < 1, "trace.splits", r, "ratios strictly between 0 and 1")
        check_field(len(self.grid) == 3 and 0 < self.grid[0] <= self.grid[1] < 1 and self.grid[2] > 0,
               "trace.grid", self.grid, "[start, stop, step] with 0 < start <= stop < 1 and step > 0")
        check_field(self.batch_size >= 1, "trace.batch_size", self.batch_size, "an integer >= 1")
        check_field(self.num_actors >= 1, "trace.num_actors", self.num_actors, "an integer >= 1")
        check_field(self.max_prompts is None or self.max_prompts >= 1, "trace.max_prompts", self.max_prompts,
               "an integer >= 1 or null")


def trace_dtype(cfg) -> str:
    """The trace actors' weights dtype: ``trace.dtype``, or ``model.dtype`` when it is ``auto``."""
    return cfg.model.dtype if cfg.trace.dtype == "auto" else cfg.trace.dtype
