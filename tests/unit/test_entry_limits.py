"""Issue 51, rule 3: a config value is refused where it enters (``config validate``, and every command before any
work) when the code it feeds cannot take it. Each limit is first shown on the consumer itself (float32 rounding,
``torch.manual_seed``, the file system's NAME_MAX, the trial-name format), then the console script is shown to
refuse the value in one line, exit 2, and to accept the value at the edge."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _raycpt(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAYCPT_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-m", "raycpt", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def _one_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode == 2 and len(lines) == 1 and "Traceback" not in p.stderr + p.stdout, (p.returncode, p.stderr)
    return lines[0]


# ------------------------------------------------------------------------------------- the consumers' own limits
def test_the_limits_are_the_consumers():
    """What the rules rest on, measured on the consumers rather than taken from the code under test."""
    assert np.float32(3e-5 * 1e-320) == 0.0 and np.float32(1e-320) == 0.0  # the lr_grid=[1e-320]: a rate 0
    assert np.float32(1e-39) != 0.0 and np.float32(1e-39) < np.finfo(np.float32).tiny  # denormal: below the floor
    assert np.isinf(np.float32(1e39))
    torch.manual_seed(2**64 - 1)
    with pytest.raises((ValueError, RuntimeError)):
        torch.manual_seed(2**64)  # the train.seed=18446744073709551616
    with pytest.raises(ValueError):
        np.random.default_rng([-1, 0])  # numpy's seed sequences take no negative seed
    assert f"{1:.3g}" == f"{1.0001:.3g}" == "1"  # two multipliers, one trial name


def test_an_underflowing_rate_leaves_the_weights_unchanged():
    """Why a rate of 1e-320 is refused: AdamW at that rate does not move a float32 weight (the issue's run: loss
    4.067 -> 4.067), while the smallest accepted rate, applied to a weight of the same size, does."""
    for lr, moves in ((1e-320, False), (np.finfo(np.float32).tiny * 4, True)):
        w = torch.nn.Parameter(torch.full((4,), 1e-37))
        opt = torch.optim.AdamW([w], lr=float(lr), weight_decay=0.0)
        w.grad = torch.ones(4)
        before = w.detach().clone()
        opt.step()
        assert bool((w.detach() != before).any()) is moves, lr


# ------------------------------------------------------------------------------------- the one line at the door
@pytest.mark.parametrize("override, field, says", [
    ("train.lr=1e-320", "train.lr", "rounds to 0"),
    ("train.lr=1e39", "train.lr", "infinite"),
    ("sweep.lr_grid=[1e-320]", "sweep.lr_grid", "train.lr x 1e-320 = 0"),
    ("sweep.lr_grid=[1e-34]", "sweep.lr_grid", "train.lr x 1e-34 = 3e-39"),  # denormal in float32
    ("contribution.lr_grid=[1e-320, 1]", "contribution.lr_grid", "= 0"),
    ("plan.lr_scales={2: 1e-320}", "plan.lr_scales.2", "= 0"),
    ("train.seed=18446744073709551616", "train.seed", "[0, 18446744073709551615]"),
    ("train.seed=-1", "train.seed", "no negative seed"),
    ("sweep.seeds=[0, 18446744073709551616]", "sweep.seeds", "torch.manual_seed's range"),
    ("sweep.floor_seeds=[18446744073709551616]", "sweep.floor_seeds", "torch.manual_seed's range"),
    ("data.shuffle_seed=18446744073709551616", "data.shuffle_seed", "torch.manual_seed's range"),
    ("plan.lisa_seed=-3", "plan.lisa_seed", "no negative seed"),
    ("sweep.lr_grid=[1, 1.0001]", "sweep.lr_grid", "1.0 and 1.0001 are both named -lr1"),
    ("sweep.lr_grid=[0.3333, 0.33333]", "sweep.lr_grid", "both named -lr0.333"),
    ("contribution.lr_grid=[3, 3.001]", "contribution.lr_grid", "both named -lr3"),
])
def test_config_validate_refuses_in_one_line(tmp_path, override, field, says):
    line = _one_line(_raycpt("config", "validate", override, cwd=tmp_path))
    assert line.startswith(f"error: config error: {field}=") and says in line, line


@pytest.mark.parametrize("override", [
    "train.lr=1.2e-38", "train.seed=18446744073709551615", "sweep.seeds=[0, 18446744073709551615]",
    "sweep.lr_grid=[0.333, 1, 3]", "sweep.lr_grid=[1, 1.01]", "plan.lisa_seed=0",
])
def test_the_edge_values_pass(tmp_path, override):
    p = _raycpt("config", "validate", override, cwd=tmp_path)
    assert p.returncode == 0 and p.stdout.startswith("ok:"), p.stderr


def test_a_run_root_component_longer_than_name_max(tmp_path):
    """NAME_MAX is asked of the file system (and checked by making the folder): a component of NAME_MAX bytes is a
    folder, one byte more is ENAMETOOLONG; ``config validate`` and ``sweep`` refuse the second before any work (no
    folder made), and accept the first."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    ok_name, long_name = "r" * limit, "r" * (limit + 1)
    (tmp_path / "probe" / ok_name).mkdir(parents=True)
    with pytest.raises(OSError) as e:
        (tmp_path / "probe" / long_name).mkdir()
    assert e.value.errno == errno.ENAMETOOLONG
    bad_root = tmp_path / "runs" / long_name / "inner"
    for args in (("config", "validate"), ("sweep",), ("train",)):
        line = _one_line(_raycpt(*args, f"tracking.run_root={bad_root}", cwd=tmp_path))
        assert line.startswith("error: config error: tracking.run_root=") and f"longer than the {limit} bytes" in line
    assert not (tmp_path / "runs").exists()  # refused before any folder
    p = _raycpt("config", "validate", f"tracking.run_root={tmp_path / 'runs' / ok_name}", cwd=tmp_path)
    assert p.returncode == 0, p.stderr


def test_a_trial_name_longer_than_name_max(tmp_path):
    """A recipe whose trial folder (``<recipe>-s<seed>-lr<m>``) would pass NAME_MAX is refused at the door."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    name = "m" * (limit - len("-s18446744073709551615") + 1)  # the seed suffix takes it one byte past the limit
    recipe = f"sweep.recipes={{{name}: {{plan.name: middle}}}}"
    root = f"tracking.run_root={tmp_path / 'runs'}"
    line = _one_line(_raycpt("config", "validate", root, recipe, f"sweep.strategies=[{name}]",
                             "sweep.seeds=[18446744073709551615]", cwd=tmp_path))
    assert "the longest trial folder name of the sweep" in line and f"is {limit + 1} bytes" in line, line
    p = _raycpt("config", "validate", root, recipe, f"sweep.strategies=[{name}]", "sweep.seeds=[1844674407370955161]",
                cwd=tmp_path)  # one digit less: it fits
    assert p.returncode == 0, p.stderr


def test_sweep_refuses_colliding_grid_values_before_any_run(tmp_path):
    """The issue's ``sweep.lr_grid=[1,1.0001]``: refused before a run folder or MLflow store exists."""
    line = _one_line(_raycpt("sweep", f"tracking.run_root={tmp_path / 'runs'}", "sweep.lr_grid=[1,1.0001]",
                             cwd=tmp_path))
    assert "both named -lr1" in line
    assert not (tmp_path / "runs").exists()
