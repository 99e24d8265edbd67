"""Sweep grid planning: validation against the model depth, de-duplication, trial configs."""

import pytest

from raycpt.config import ExperimentConfig
from raycpt.errors import RaycptError
from raycpt.jobs.sweep import TrialSpec, plan_grid, trial_config


def test_full_once_plus_every_strategy_at_every_split():
    specs = plan_grid([0.33, 0.5, 0.66], ["train_shallow", "train_deep"], 30)
    assert [s.name for s in specs] == ["full", "train_shallow-r0.33", "train_shallow-r0.5", "train_shallow-r0.66",
                                       "train_deep-r0.33", "train_deep-r0.5", "train_deep-r0.66"]
    # b = round(r * N), worked by hand for N = 30: 9.9 -> 10, 15, 19.8 -> 20
    assert [s.b for s in specs[1:4]] == [10, 15, 20]


def test_duplicate_splits_and_splits_with_the_same_boundary_are_dropped():
    specs = plan_grid([0.5, 0.5, 0.51], ["train_shallow"], 4)  # 0.5*4 = 2 and 0.51*4 = 2.04 -> 2
    assert [s.name for s in specs] == ["full", "train_shallow-r0.5"]


@pytest.mark.parametrize("bad,needle", [(0, "outside (0, 1)"), (1, "outside (0, 1)"), (-0.2, "outside (0, 1)"),
                                        (0.03, "shallow side empty"), (0.97, "deep side empty"),
                                        ("x", "not a number")])
def test_bad_splits_are_one_clear_line(bad, needle):
    with pytest.raises(RaycptError) as e:
        plan_grid([bad], ["train_shallow"], 12)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_unknown_strategy_names_the_allowed_ones():
    with pytest.raises(RaycptError, match="unknown sweep strategy 'train_middle'.*train_shallow"):
        plan_grid([0.5], ["train_middle"], 12)


def test_trial_config_applies_the_plan():
    cfg = ExperimentConfig()
    t = trial_config(cfg, TrialSpec(name="train_deep-r0.66", strategy="train_deep", split=0.66, b=20))
    assert (t.plan.name, t.plan.split) == ("train_deep", 0.66)
    assert cfg.plan.name == "train_shallow"  # the sweep config itself is untouched


def test_recipes_config_runs_through_the_sweep_grid(tmp_path):
    """configs/recipes.yaml: every recipe becomes one trial against full, and its plan resolves to the
    layers the papers name (hand-checked for a 30-layer model)."""
    from pathlib import Path

    from raycpt.config import load_config
    from raycpt.strategies import build_plan, write_ranking

    root = Path(__file__).resolve().parents[2]
    ranking = write_ranking(tmp_path / "ranking.json", "m", 30, {i: float(i % 7) + i / 100 for i in range(30)})
    cfg = load_config(root / "configs" / "recipes.yaml", [f"plan.ranking_file={ranking}"])
    specs = plan_grid(cfg.sweep.splits, cfg.sweep.strategies, 30, cfg.sweep.include_full, cfg.sweep.recipes)
    assert specs[0].name == "full" and [s.name for s in specs[1:]] == cfg.sweep.strategies
    plans = {s.name: build_plan(trial_config(cfg, s).plan, 30) for s in specs}
    trainable = {n: sorted(p.trainable_layers) for n, p in plans.items()}
    assert trainable["full"] == list(range(30))
    assert trainable["middle5"] == [12, 13, 14, 15, 16]  # the middle 5 of 30
    assert trainable["mid_01100"] == list(range(6, 18))  # blocks 2-3 of 5 equal blocks of 6
    # elite top-5 by score i % 7 + i/100: layers 27, 20, 13, 6 (score 6.x) then 26
    assert trainable["elite_top5"] == sorted([27, 20, 13, 6, 26])
    assert plans["elite_lr2_top5"].lr_scales.get(27) == 2.0 and trainable["elite_lr2_top5"] == list(range(30))
    # its control: the 5 lowest scores are i % 7 == 0 (0.00, 0.07, 0.14, 0.21, 0.28): layers 0, 7, 14, 21, 28
    bottom = plans["elite_lr2_bottom5"]
    assert sorted(i for i, s in bottom.lr_scales.items() if s == 2.0) == [0, 7, 14, 21, 28]
    assert trainable["elite_lr2_bottom5"] == list(range(30))


def test_seeds_run_every_trial_once_per_seed_seed_major():
    specs = plan_grid([0.5], ["train_shallow"], 12, seeds=[3, 7])
    assert [s.name for s in specs] == ["full-s3", "train_shallow-r0.5-s3", "full-s7", "train_shallow-r0.5-s7"]
    assert [(s.seed, s.group) for s in specs] == [(3, "full"), (3, "train_shallow-r0.5"), (7, "full"),
                                                  (7, "train_shallow-r0.5")]
    assert specs[1].b == 6 and specs[3].split == 0.5
    # each run's config carries its seed (train.seed also seeds the data order when data.shuffle_seed is null)
    cfg = ExperimentConfig()
    assert [trial_config(cfg, s).train.seed for s in specs] == [3, 3, 7, 7]
    assert cfg.train.seed == 0
    # without seeds: today's names, the config's own train.seed
    plain = plan_grid([0.5], ["train_shallow"], 12)
    assert [s.name for s in plain] == ["full", "train_shallow-r0.5"] and plain[0].seed is None
    assert trial_config(load_seeded(), plain[0]).train.seed == 5


def load_seeded():
    from raycpt.config import load_config

    return load_config(None, ["train.seed=5"])


def test_seeded_spec_survives_the_ray_boundary():
    """The grid sends specs as dataclasses.asdict and rebuilds them with TrialSpec(**d)."""
    import dataclasses

    (s,) = [t for t in plan_grid([0.5], ["train_deep"], 12, seeds=[1]) if t.strategy == "train_deep"]
    assert TrialSpec(**dataclasses.asdict(s)) == s


def test_floor_seeds_run_full_at_each_and_every_plan_at_the_first():
    """sweep.floor_seeds (issue 50): after the grid, every row again at the first floor seed and full at each; every
    row's runs one cell, so every plan has its own run variance."""
    specs = plan_grid([0.5], ["train_shallow", "train_deep"], 12, floor_seeds=[1, 2], base_seed=0)
    assert [s.name for s in specs] == ["full", "train_shallow-r0.5", "train_deep-r0.5", "full-s1",
                                       "train_shallow-r0.5-s1", "train_deep-r0.5-s1", "full-s2"]
    assert [(s.seed, s.group) for s in specs] == [(0, "full"), (0, "train_shallow-r0.5"), (0, "train_deep-r0.5"),
                                                  (1, "full"), (1, "train_shallow-r0.5"), (1, "train_deep-r0.5"),
                                                  (2, "full")]
    cfg = ExperimentConfig()
    assert [trial_config(cfg, s).train.seed for s in specs] == [0, 0, 0, 1, 1, 1, 2]
    with pytest.raises(RaycptError, match=r"repeats train.seed \(0\)"):
        plan_grid([0.5], ["train_shallow"], 12, floor_seeds=[0, 1], base_seed=0)
    with pytest.raises(RaycptError, match="no full row"):
        plan_grid([0.5], ["train_shallow"], 12, include_full=False, floor_seeds=[1], base_seed=0)


@pytest.mark.parametrize("over, says", [
    (["sweep.floor_seeds=[]"], "non-empty list of distinct integers"),
    (["sweep.floor_seeds=[1,1]"], "non-empty list of distinct integers"),
    (["sweep.floor_seeds=[1]", "sweep.seeds=[0,1,2]"], "null when sweep.seeds is set"),
])
def test_floor_seeds_bad_values_are_one_line(over, says):
    from raycpt.config import load_config

    with pytest.raises(RaycptError, match=says) as e:
        load_config(None, over)
    assert "\n" not in str(e.value) and "sweep.floor_seeds" in str(e.value)
