"""``decide``: whether a short sweep's decision holds at a longer horizon (issue 47): the arms, the horizons, the
seeds and the learning-rate search that puts every arm at its own optimum at every horizon."""

from __future__ import annotations

from dataclasses import dataclass, field

from raycpt.config.checks import check_distinct_tags, check_field, check_seed, lr_tag


def _default_arms() -> dict[str, dict]:
    return {"full": {"plan.name": "full"},
            "shallow-r0.33": {"plan.name": "train_shallow", "plan.split": 0.33},
            "deep-r0.67": {"plan.name": "train_deep", "plan.split": 0.67},
            "shallow-r0.5": {"plan.name": "train_shallow", "plan.split": 0.5},
            "deep-r0.5": {"plan.name": "train_deep", "plan.split": 0.5}}


@dataclass
class DecideConfig:
    arms: dict[str, dict] = field(default_factory=_default_arms)
    """The arms compared: {name: {dotted.key: value}} (a recipe each, as ``sweep.recipes``). Default: full, and
    train_shallow at r with train_deep at 1 - r (the same layer count) at two splits."""
    budget_arms: list[str] = field(default_factory=lambda: ["lora", "bi"])
    """Arms from the equal-budget rows (:func:`raycpt.strategies.budget_plans`) at the trainable count of
    train_shallow at ``budget_split``, by row prefix: ``lora`` (LoRA at the nearest rank, its rate centred at
    ``train.lr`` x ``sweep.lora_lr_scale``), ``bi``/``gradnorm``/``snr_layer``/``elo`` (that selector's top-k)."""
    budget_split: float = 0.33
    """The split whose train_shallow count the budget arms match."""
    horizons: list[float] = field(default_factory=lambda: [1.0, 8.0])
    """Token budgets as multiples of ``train.max_steps`` (the first is the short sweep, the last the long horizon
    whose ranking is the truth); each horizon trains ``round(train.max_steps x h)`` steps, its schedule scaled."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    """Seeds of every arm at every horizon (paired across arms: seed s is ``train.seed`` s in every arm)."""
    search_seeds: int = 1
    """The first this many seeds run the learning-rate search; the others run each arm's pick only."""
    lr_grid: list[float] = field(default_factory=lambda: [1 / 3, 1.0, 3.0])
    """Each arm's starting rates, multiples of its centre (``train.lr``, or its recipe's ``train.lr``)."""
    lr_step: float = 3.0
    """A pick at the grid's edge adds the next rate that way: pick x step, or pick / step."""
    max_extensions: int = 3
    """Rates an arm may add beyond ``lr_grid`` at one horizon; an arm still at an edge after them is *untuned*."""
    alpha: float = 0.05
    """Level at which the long horizon separates a pair beyond its own run noise (Welch)."""

    def __post_init__(self):
        check_field(isinstance(self.arms, dict) and all(
            isinstance(v, dict) and all(isinstance(k, str) and "." in k for k in v) for v in self.arms.values()),
            "decide.arms", self.arms, "a mapping of arm names to {dotted.key: value}, e.g. {full: {plan.name: full}}")
        check_field(len(self.arms) + len(self.budget_arms) >= 2, "decide.arms", list(self.arms),
                    "at least two arms in decide.arms and decide.budget_arms together")
        check_field(0 < self.budget_split < 1, "decide.budget_split", self.budget_split, "a ratio in (0, 1)")
        check_field(len(self.horizons) >= 2 and all(isinstance(h, (int, float)) and not isinstance(h, bool) and h > 0
                                                    for h in self.horizons)
                    and list(self.horizons) == sorted(set(self.horizons)), "decide.horizons", self.horizons,
                    "two or more increasing positive multiples of train.max_steps, e.g. [1, 8]")
        check_field(len(self.seeds) >= 2 and len(set(self.seeds)) == len(self.seeds), "decide.seeds", self.seeds,
                    "two or more distinct seeds (each arm's run noise needs two runs)")
        for sd in self.seeds:
            check_seed("decide.seeds", sd)
        check_field(isinstance(self.search_seeds, int) and 1 <= self.search_seeds <= len(self.seeds),
                    "decide.search_seeds", self.search_seeds, f"an integer in [1, {len(self.seeds)}]")
        check_field(len(self.lr_grid) >= 1 and all(isinstance(m, (int, float)) and m > 0 for m in self.lr_grid)
                    and len(set(self.lr_grid)) == len(self.lr_grid), "decide.lr_grid", self.lr_grid,
                    "distinct positive multipliers, e.g. [0.333, 1, 3]")
        check_distinct_tags("decide.lr_grid", self.lr_grid, lr_tag)
        check_field(self.lr_step > 1, "decide.lr_step", self.lr_step, "a factor > 1")
        check_field(isinstance(self.max_extensions, int) and self.max_extensions >= 0, "decide.max_extensions",
                    self.max_extensions, "an integer >= 0")
        check_field(0 < self.alpha < 1, "decide.alpha", self.alpha, "a level in (0, 1)")
