"""What the steps of the training loop share on one rank (:class:`WorkerState`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from raycpt.strategies import LayerPlan
from raycpt.train.worker.faults import FaultHooks
from raycpt.train.worker.metrics_log import MetricsLogger
from raycpt.train.worker.peakmem import StepPeak
from raycpt.train.worker.steps import FrozenPrefix


@dataclass
class WorkerState:
    """Everything the steps of :func:`run_loop` share on one rank."""

    config: dict
    session: Any
    cfg: Any
    rank: int
    world: int
    run_dir: Optional[Path]
    device: torch.device
    plan: LayerPlan
    fsdp: bool
    logger: Optional[MetricsLogger]
    faults: FaultHooks
    callbacks: list
    model: Any = None
    tokenizer: Any = None
    wrapped: Any = None
    optimizer: Any = None
    scheduler: Any = None
    params: list = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    prefix: Optional[FrozenPrefix] = None
    start_step: int = 0
    history: list = field(default_factory=list)
    step_times: list = field(default_factory=list)
    step_cpu: list = field(default_factory=list)  # this process's CPU seconds per step (all its threads)
    t_setup: float = field(default_factory=time.perf_counter)  # when this rank's setup began
    chunk_tokens: Optional[int] = None  # the chunked loss's rows per chunk; None = the plain loss
    flops_per_token: float = 0.0
    peak_flops: Optional[float] = None
    step_plan: Optional[LayerPlan] = None  # what trains now: ``plan`` itself, or LISA's current interval's draw
    step_plan_step: int = 1  # a step of step_plan's interval
    peak: Optional[StepPeak] = None  # this rank's per-step peak memory (:mod:`raycpt.train.worker.peakmem`)

    def start_step_of(self, state: Optional[dict]) -> int:
        """The step a checkpoint state was written at (0 without one); also where step_plan's interval is."""
        self.step_plan_step = max(int(state["step"]) if state is not None else 0, 1)
        return self.step_plan_step

