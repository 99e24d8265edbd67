"""Equal tuning: the learning-rate grid's trials, the pick on the validation slice (never on the held-out test
loss), and the validation slice itself: deterministic, never trained on, disjoint from the held-out documents."""

import json
import math

import pytest

from raycpt.config import ConfigError, load_config
from raycpt.config.sweep import SweepConfig, lr_multipliers
from raycpt.data.corpus import heldout_documents, is_heldout, iter_documents
from raycpt.data.validation import validation_documents
from raycpt.errors import RaycptError
from raycpt.jobs.sweep import TrialSpec, with_lr_grid
from raycpt.report.tuning import pick_by_validation, tuning_lines, tuning_markdown


def _t(method, mult, val, held, seed=None, lr0=1e-4):
    name = method + ("" if seed is None else f"-s{seed}")
    return {"name": f"{name}-lr{mult:g}", "base_name": name, "tune": method, "lr_mult": mult, "lr": lr0 * mult,
            "validation_loss": val, "heldout_loss": held, "group": method}


def test_the_pick_follows_the_validation_loss_not_the_held_out_loss():
    trials = [{"name": "base-row"},
              _t("full", 1 / 3, 4.0, 3.0), _t("full", 1.0, 3.9, 3.9), _t("full", 3.0, 3.95, 2.0),
              _t("lora", 1 / 3, 5.0, 5.0), _t("lora", 1.0, 4.8, 4.8), _t("lora", 3.0, 4.7, 4.7)]
    picked, table = pick_by_validation(trials)
    names = [t["name"] for t in picked]
    assert names == ["base-row", "full", "lora (untuned)"]  # issue 47: still at its grid's edge
    full = next(t for t in picked if t["name"] == "full")
    assert full["lr"] == pytest.approx(1e-4) and full["heldout_loss"] == 3.9  # not 2.0: that one has a worse val
    rows = {r["method"]: r for r in table}
    assert rows["full"]["picked_mult"] == 1.0 and not rows["full"]["edge"]
    assert rows["lora"]["picked_mult"] == 3.0 and rows["lora"]["edge"]  # the largest rate: flagged
    text = "\n".join(tuning_lines(table, "8 blocks"))
    assert "full: 3.33e-05 (val 4.0000) | 0.0001* (val 3.9000)" in text and "(untuned: at the grid's edge)" in text
    assert "| lora | 0.0003 | 4.7000 | 4.7000 | * (untuned: edge) |" in tuning_markdown(table)


def test_several_seeds_pick_one_rate_by_their_mean_and_ties_take_the_smaller_rate():
    trials = [_t("m", 1.0, 4.0, 4.0, seed=0), _t("m", 1.0, 3.0, 4.0, seed=1),  # mean 3.5
              _t("m", 3.0, 3.4, 4.0, seed=0), _t("m", 3.0, 3.7, 4.0, seed=1),  # mean 3.55
              _t("n", 1.0, 2.0, 1.0), _t("n", 3.0, 2.0, 1.0), _t("z", 1.0, math.nan, 1.0)]
    picked, table = pick_by_validation(trials)
    # two rates: every pick is one of the grid's edges, so the method is untuned (issue 47) and says so
    assert sorted(t["name"] for t in picked if t["tune"] == "m") == ["m-s0 (untuned)", "m-s1 (untuned)"]
    assert all(t["lr_mult"] == 1.0 for t in picked if t["tune"] == "m")
    assert next(r for r in table if r["method"] == "n")["picked_mult"] == 1.0
    z = next(r for r in table if r["method"] == "z")
    assert z["picked_lr"] is None and not any(t["tune"] == "z" for t in picked)


def test_the_grid_multiplies_each_rows_own_rate():
    specs = [TrialSpec(name="full", strategy="full"),
             TrialSpec(name="lora-r8", strategy="full", recipe={"plan.adapter": "lora", "train.lr": 3e-4})]
    grid = with_lr_grid(specs, [1 / 3, 1.0, 3.0], 3e-5)
    assert [t.name for t in grid] == ["full-lr0.333", "full-lr1", "full-lr3", "lora-r8-lr0.333", "lora-r8-lr1",
                                      "lora-r8-lr3"]
    assert [t.recipe["train.lr"] for t in grid] == pytest.approx([1e-5, 3e-5, 9e-5, 1e-4, 3e-4, 9e-4])
    assert {t.group for t in grid[:3]} == {"full"} and grid[4].base_name == "lora-r8" and grid[4].lr_mult == 1.0
    assert with_lr_grid(specs, [1.0], 3e-5) == specs
    assert lr_multipliers(SweepConfig()) == [1.0] and lr_multipliers(SweepConfig(budget="auto")) == \
        pytest.approx([1 / 3, 1, 3])


@pytest.mark.parametrize("grid", [[0.5, 0, 2], [1, -3], []])
def test_a_grid_with_a_non_positive_value_is_one_line(grid):
    with pytest.raises(ConfigError, match="sweep.lr_grid"):
        load_config(None, [f"sweep.lr_grid={json.dumps(grid)}"])


@pytest.fixture
def corpus(tmp_path):
    f = tmp_path / "c.jsonl"
    docs = [f"document number {i} " + "word " * (i % 7) for i in range(3000)] + ["document number 5 "] * 3
    f.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return f


def test_the_validation_slice_is_never_trained_on_and_disjoint_from_the_held_out_test(corpus):
    cfg = load_config(None, [f"data.corpus=[{corpus}]", "data.max_documents=2900", "data.heldout_share=0.05"])
    test = heldout_documents(cfg.data, 64)
    val = validation_documents(cfg.data, 40, 64)
    assert len(val) == 40 and not set(val) & set(test)
    assert all(is_heldout(d, 0.05, 0) for d in val)  # the packer leaves every one of them out of training
    assert val == validation_documents(cfg.data, 40, 64)  # deterministic
    pool = [d for d in iter_documents(cfg.data.corpus, "text", 2900) if is_heldout(d, 0.05, 0)]
    assert len(pool) - 64 >= 40
    with pytest.raises(RaycptError, match="sweep.validation_docs=500"):
        validation_documents(cfg.data, 500, 64)


def test_the_tail_validation_slice_follows_the_held_out_tail(corpus):
    cfg = load_config(None, [f"data.corpus=[{corpus}]", "data.max_documents=2800", "data.heldout_share=0"])
    test = heldout_documents(cfg.data, 50)
    val = validation_documents(cfg.data, 30, 50)
    docs = list(iter_documents(cfg.data.corpus, "text", None))
    assert test == docs[2800:2850] and val == [d for d in docs[2850:2880] if d not in test]
    assert not set(val) & set(test)


def test_the_sweep_extends_an_edge_pick_until_it_is_interior(monkeypatch):
    """Issue 47 through the sweep's own rounds: a validation curve with its optimum at 25x the centre (full) and
    at 1x (lora); full climbs x3 per round (9, 27, then 81 is worse: 27 interior), lora stays as it was; each
    added rate runs every seed of its method; a bound of 2 leaves full untuned at 27."""
    import dataclasses

    from raycpt.config import load_config
    from raycpt.jobs import sweep as sweep_job
    from raycpt.jobs.grid import Grid

    opt = {"full": 25.0, "lora": 1.0}

    def fake_run_grid(run, grid, resume=False, console=None):
        out = {}
        for t in grid.specs:
            loss = (math.log(t.lr_mult) - math.log(opt[t.group])) ** 2
            out[t.name] = {"name": t.name, "tune": t.group, "lr_mult": t.lr_mult, "base_name": t.base_name,
                           "group": t.group, "lr": t.recipe["train.lr"], "validation_loss": loss, "seed": t.seed}
        calls.append([t.name for t in grid.specs])
        return out

    for bound, want, tuned in ((3, 27.0, True), (2, 27.0, False)):
        calls = []
        monkeypatch.setattr(sweep_job, "run_grid", fake_run_grid)
        cfg = load_config(None, ["sweep.lr_grid=[0.3333333333333333,1,3]", f"sweep.lr_max_extensions={bound}"])
        specs = sweep_job.with_lr_grid([sweep_job.TrialSpec(f"{m}-s{sd}", "full", seed=sd, group=m)
                                        for m in ("full", "lora") for sd in (0, 1)], cfg.sweep.lr_grid, 1e-4)
        first = fake_run_grid(None, Grid("sweep", specs))
        added = sweep_job.extend_lr_grid(None, Grid("sweep", specs), list(first.values()), cfg)
        assert calls[1:] == [["full-s0-lr9", "full-s1-lr9"], ["full-s0-lr27", "full-s1-lr27"]] + (
            [["full-s0-lr81", "full-s1-lr81"]] if bound == 3 else [])
        assert [a["lr"] for a in added if a["lr_mult"] == 9.0] == pytest.approx([9e-4, 9e-4])
        picked, table = pick_by_validation(list(first.values()) + added)
        rows = {r["method"]: r for r in table}
        assert rows["full"]["picked_mult"] == pytest.approx(want) and rows["full"]["untuned"] is (not tuned)
        assert rows["lora"]["picked_mult"] == 1.0 and not rows["lora"]["untuned"]
