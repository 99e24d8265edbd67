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
