"""``ExperimentConfig``: the root of the tree, one field per section."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

from raycpt.config.analysis import CompareConfig, ContributionConfig, SelectConfig
from raycpt.config.checks import check_field
from raycpt.config.evaluation import EvalConfig
from raycpt.config.hybrid import HybridConfig
from raycpt.config.infra import RayConfig, TrackingConfig
from raycpt.config.inputs import DataConfig, ModelConfig
from raycpt.config.plan import PlanConfig
from raycpt.config.sweep import ReportConfig, SweepConfig
from raycpt.config.trace import TraceConfig
from raycpt.config.train import TrainConfig


@dataclass
class ExperimentConfig:
    name: str = "default"
    """Name of the experiment; run folders are ``<run_root>/<command>-<name>-<id>``."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    ray: RayConfig = field(default_factory=RayConfig)
    hybrid: Optional[HybridConfig] = None
    """Hybrid build spec (see ``raycpt hybrid``); None = not a hybrid experiment."""
    contribution: ContributionConfig = field(default_factory=ContributionConfig)
    compare: CompareConfig = field(default_factory=CompareConfig)
    report: ReportConfig = field(default_factory=ReportConfig)
    """How the sweep summary decides: the primary comparison and the multiplicity control."""
    select: SelectConfig = field(default_factory=SelectConfig)
    """``raycpt select``: which selector, how many layers, its corpus sample."""

    def __post_init__(self):
        check_field(isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", self.name) is not None
               and self.name not in (".", ".."), "name", self.name,
               "1-100 letters, digits, '-', '_' or '.' (it names run folders: no path separators)")
