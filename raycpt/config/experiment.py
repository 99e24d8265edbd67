"""``ExperimentConfig``: the root of the tree, one field per section."""

from __future__ import annotations

import re
from pathlib import Path
from dataclasses import dataclass, field
from typing import Optional

from raycpt.config.checks import check_field, check_names, check_rate, lr_tag, name_max
from raycpt.config.compare import CompareConfig
from raycpt.config.contribution import ContributionConfig
from raycpt.config.data import DataConfig
from raycpt.config.decide import DecideConfig
from raycpt.config.eval import EvalConfig
from raycpt.config.hybrid import HybridConfig
from raycpt.config.model import ModelConfig
from raycpt.config.plan import PLANS, PlanConfig
from raycpt.config.ray import RayConfig
from raycpt.config.report import ReportConfig
from raycpt.config.select import SelectConfig
from raycpt.config.sweep import SweepConfig, lr_multipliers
from raycpt.config.trace import TraceConfig
from raycpt.config.tracking import TrackingConfig
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
    decide: DecideConfig = field(default_factory=DecideConfig)
    """``raycpt decide``: the arms, horizons, seeds and learning-rate search of the decision-accuracy measurement."""

    def __post_init__(self):
        check_field(isinstance(self.name, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,100}", self.name) is not None
               and self.name not in (".", ".."), "name", self.name,
               "1-100 letters, digits, '-', '_' or '.' (it names run folders: no path separators)")
        check_rates(self)
        check_folder_names(self)


COMMANDS = ("contribution", "compare", "select", "sweep", "train", "trace", "hybrid", "eval", "decide")
"""The commands that make a run folder ``<command>-<name>-<8 hex>`` (the longest decides its length)."""


def check_rates(cfg: ExperimentConfig) -> None:
    """Every learning rate a command can hand the optimizer is one it can hold (:func:`check_rate`): ``train.lr``
    times each multiplier of ``sweep.lr_grid`` (with LoRA's scale under a budget), of ``contribution.lr_grid``, of the
    plan's per-layer and elite scales. ``train.lr`` alone is checked by its section."""
    lr, s, c, plan = cfg.train.lr, cfg.sweep, cfg.contribution, cfg.plan
    mults = lr_multipliers(s)
    made = [("sweep.lr_grid", m, f"train.lr x {m!r}", lr * m) for m in mults]  # (field, its value, how, the rate)
    if s.budget is not None:
        made += [("sweep.lora_lr_scale", s.lora_lr_scale, f"train.lr x {s.lora_lr_scale!r} x {m!r}",
                  lr * s.lora_lr_scale * m) for m in mults]
    for name, over in s.recipes.items():  # a recipe's own rate, times the grid's multipliers
        own = _number(over.get("train.lr") if isinstance(over, dict) else None)
        if own is not None:
            made += [(f"sweep.recipes.{name}.train.lr", own, f"{own!r} x {m!r}", own * m) for m in mults]
    made += [("contribution.lr_grid", m, f"train.lr x {m!r}", lr * m) for m in c.lr_grid or []]
    made += [(f"plan.lr_scales.{k}", v, f"train.lr x {v!r}", lr * v) for k, v in plan.lr_scales.items()]
    made += [(f"{where}.elite_lr_scale", v, f"train.lr x {v!r}", lr * v)
             for where, v in (("plan", plan.elite_lr_scale), ("contribution", c.elite_lr_scale))]
    for field_name, value, how, rate in made:
        check_rate(field_name, value, rate, f"; here {how} = {rate:.3g}, with train.lr={lr!r}")


def _number(value):
    """A recipe's value as a float (YAML reads ``1e-5`` as a string), or None."""
    try:
        return None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        return None


def longest_trial_names(cfg: ExperimentConfig) -> list[str]:
    """The longest trial name each sweep strategy can take (``<strategy>[-r<split>]-s<seed>-lr<m>``, the split for
    the registered plans that take one), the floor's ``full-s<seed>`` and the contribution's ``full-lr<m>``: the
    folder names a grid makes under its run folder."""
    s = cfg.sweep
    split = max((f"-r{r:g}" for r in s.splits), key=len, default="")
    seed = max((f"-s{int(x)}" for x in (s.seeds or []) + (s.floor_seeds or [])), key=len, default="")
    mults = lr_multipliers(s)
    lr = "" if mults == [1.0] else "-" + max((lr_tag(m) for m in mults), key=len)
    takes = lambda n: n in PLANS and bool(PLANS.info(n, "takes_split", False))  # noqa: E731 - as the grid decides
    names = [f"{name}{split if takes(name) else ''}{seed}{lr}" for name in [*s.strategies, *s.recipes, "full"]]
    names += [f"full-{lr_tag(m)}" for m in cfg.contribution.lr_grid or []]
    return names


def check_folder_names(cfg: ExperimentConfig) -> None:
    """Every name raycpt makes on disk from the config fits the file system's NAME_MAX: each component of
    ``tracking.run_root`` and ``data.store_dir``, the run folders (``<command>-<name>-<id>``) and the sweep's trial
    folders (:func:`longest_trial_names`)."""
    root = cfg.tracking.run_root
    limit = name_max(root)
    check_names("tracking.run_root", root, Path(root).expanduser().parts, limit, "a folder path")
    if cfg.data.store_dir:
        check_names("data.store_dir", cfg.data.store_dir, Path(cfg.data.store_dir).expanduser().parts,
                    name_max(cfg.data.store_dir), "a folder path")
    check_names("name", cfg.name, [f"{max(COMMANDS, key=len)}-{cfg.name}-12345678"], limit,
                "the run folder it names")
    check_names("sweep.strategies", cfg.sweep.strategies, longest_trial_names(cfg), limit,
                "the longest trial folder name of the sweep")
