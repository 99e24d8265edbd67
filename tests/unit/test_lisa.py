"""LISA as a training-time plan: seeded draws (reproducible, uniform, a pure function of seed and interval),
the loop trains each interval's draw and nothing else among the layers, resets the layers' AdamW state at each
draw (LMFlow's LISATrainer), resumes to bitwise the same losses from a checkpoint inside an interval and at its
edge, and the freeze check runs per interval."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

from raycpt.config import PlanConfig, config_to_dict, load_config
from raycpt.errors import RaycptError
from raycpt.strategies import build_plan, lisa_draw, lisa_interval_index, lisa_trainable_params
from raycpt.train.worker.loop import run_loop
from worker_specs import worker_spec
from raycpt.train.worker.session import LocalSession

N, G, K = 4, 2, 2


def test_draws_are_reproducible_distinct_in_range_and_uniform():
    a = [lisa_draw(7, j, range(30), 3) for j in range(3000)]
    assert a == [lisa_draw(7, j, range(30), 3) for j in range(3000)]  # same seed, same draws, in any order
    assert a[5] == lisa_draw(7, 5, range(30), 3)
    assert all(len(set(d)) == 3 and list(d) == sorted(d) and all(0 <= i < 30 for i in d) for d in a)
    assert a != [lisa_draw(8, j, range(30), 3) for j in range(3000)]
    assert len(set(a)) > 2000  # 4060 possible triples: the draws vary between intervals
    freq = Counter(i for d in a for i in d)
    expect = 3000 * 3 / 30  # 300 per layer; sd ~ 16.4: a 5-sd band
    assert all(abs(freq[i] - expect) < 5 * np.sqrt(expect * (1 - 3 / 30)) for i in range(30)), freq


def test_steps_map_to_intervals_by_hand_and_the_plan_names_the_draw():
    assert [lisa_interval_index(s, 3) for s in range(1, 8)] == [0, 0, 0, 1, 1, 1, 2]
    plan = build_plan(PlanConfig(name="lisa", lisa_layers=2, lisa_interval=3, lisa_seed=4), 6, tied_embeddings=True)
    assert plan.trainable_layers == tuple(range(6)) and plan.train_embeddings and plan.train_head
    assert plan.train_final_norm and plan.is_lisa
    assert plan.at_step(1).trainable_layers == plan.at_step(3).trainable_layers == lisa_draw(4, 0, range(6), 2)
    assert plan.at_step(4).trainable_layers == lisa_draw(4, 1, range(6), 2)
    assert plan.at_step(4).train_embeddings


def test_bad_lisa_plans_are_one_line():
    with pytest.raises(RaycptError, match="cannot draw 5 layers of a 4-layer model"):
        build_plan(PlanConfig(name="lisa", lisa_layers=5), 4)
    with pytest.raises(RaycptError, match="lr_scales"):
        build_plan(PlanConfig(name="lisa", lr_scales={1: 2.0}), 4)


def test_lisa_trainable_params_by_hand():
    assert lisa_trainable_params([10, 30, 20, 30], 7, 2) == 30 + 30 + 7
    with pytest.raises(RaycptError):
        lisa_trainable_params([1, 2], 0, 3)


def _cfg(tiny_dir, run_dir, seed=3, **train):
    cfg = load_config(None, [f"model.ref={tiny_dir}", "data.seq_len=16", "plan.name=lisa", f"plan.lisa_layers={G}",
                             f"plan.lisa_interval={K}", f"plan.lisa_seed={seed}"] +
                      [f"train.{k}={v}" for k, v in train.items()])
    plan = build_plan(cfg.plan, N, tied_embeddings=True)
    return {"cfg": config_to_dict(cfg), "model_path": str(tiny_dir), "plan": plan.to_dict(), "run_dir": str(run_dir),
            "torch_threads": 1}


BLOCKS = np.random.default_rng(0).integers(4, 128, size=(64, 16)).astype(np.int32)
COMMON = dict(max_steps=6, checkpoint_every=1, lr=0.01, micro_batch_size=2, warmup_ratio=0.0)


def _weights(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model" / "model.safetensors"))


def test_each_interval_trains_its_draw_and_resets_layer_state(tiny_dir, tmp_path):
    out = run_loop(worker_spec(_cfg(tiny_dir, tmp_path, **COMMON)), LocalSession(BLOCKS, tmp_path / "ckpts"))
    assert out["status"]["status"] == "finished" and len(out["losses"]) == 6
    ck = lambda s: tmp_path / "ckpts" / f"checkpoint_{s:06d}"  # noqa: E731
    for j in range(3):  # interval j = steps 2j+1, 2j+2: compare the weights before and after it
        draw = set(lisa_draw(3, j, range(N), G))
        before = _weights(ck(2 * j)) if j else _weights_of_base(tiny_dir)
        after = _weights(ck(2 * j + 2))
        for k in after:
            layer = int(k.split(".")[2]) if ".layers." in k else None
            moved = not torch.equal(before[k], after[k])
            assert moved == (layer is None or layer in draw), (j, k)  # embeddings / final norm always train
        state = torch.load(ck(2 * j + 2) / "train_state.pt", weights_only=True)["optimizer"]["state"]
        assert len(state) == 9 * G + 2  # the draw's layers (9 tensors each) + embeddings (tied head) + final norm
    events = [json.loads(line) for line in (tmp_path / "train_metrics.jsonl").read_text().splitlines()]
    draws = [(e["step"], e["layers"]) for e in events if e.get("event") == "lisa_draw"]
    assert draws == [(3, list(lisa_draw(3, 1, range(N), G))), (5, list(lisa_draw(3, 2, range(N), G)))]
    steps = {e["step"]: e for e in events if "loss" in e}  # every step's draw among its metrics (lisa/layer_j)
    assert {s: [int(steps[s][f"lisa/layer_{j}"]) for j in range(G)] for s in range(1, 7)} == \
        {s: list(lisa_draw(3, (s - 1) // K, range(N), G)) for s in range(1, 7)}
    # the count one step trains, as the sweep's table shows it: G layers + the always-trained tensors, by hand
    from raycpt.report.train import read_events
    from raycpt.strategies import LayerPlan
    from raycpt.train.driver.result import per_step_trainable

    base = _weights_of_base(tiny_dir)
    one_layer = sum(v.numel() for k, v in base.items() if ".layers.0." in k)
    rest = sum(v.numel() for k, v in base.items() if ".layers." not in k)
    plan = LayerPlan.from_dict(_cfg(tiny_dir, tmp_path)["plan"])
    assert per_step_trainable(plan, read_events(tmp_path / "train_metrics.jsonl")) == G * one_layer + rest


def _weights_of_base(tiny_dir):
    from safetensors.torch import load_file

    return load_file(str(tiny_dir / "model.safetensors"))


@pytest.mark.parametrize("resume_at", [3, 4])  # inside interval 1 (steps 3-4), and at its edge
def test_a_resumed_run_gives_the_same_per_step_losses(tiny_dir, tmp_path, resume_at):
    full = run_loop(worker_spec(_cfg(tiny_dir, tmp_path / "a", **COMMON)), LocalSession(BLOCKS, tmp_path / "a" / "ckpts"))
    cfg = _cfg(tiny_dir, tmp_path / "b", **COMMON)
    cfg["resume_from"] = str(tmp_path / "a" / "ckpts" / f"checkpoint_{resume_at:06d}")
    resumed = run_loop(worker_spec(cfg), LocalSession(BLOCKS, tmp_path / "b" / "ckpts"))
    assert resumed["losses"] == full["losses"]
    a, b = _weights(tmp_path / "a" / "ckpts" / "checkpoint_000006"), _weights(tmp_path / "b" / "ckpts" /
                                                                                "checkpoint_000006")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_the_freeze_check_runs_per_interval(tiny_dir, tmp_path):
    d0, d1 = lisa_draw(3, 0, range(N), G), lisa_draw(3, 1, range(N), G)
    layer = next(i for i in d1 if i not in d0)  # trains from step 3 on, not before
    cfg = _cfg(tiny_dir, tmp_path, **COMMON)
    cfg["faults"] = {"drop_grad_layer": layer}
    with pytest.raises(RaycptError, match=rf"freeze check at the first step of LISA interval 1: layers\.{layer}: .* received a gradient"):
        run_loop(worker_spec(cfg), LocalSession(BLOCKS, tmp_path / "ckpts"))
    assert (tmp_path / "ckpts" / "checkpoint_000002").is_dir()  # interval 0 trained and checked fine
    assert not (tmp_path / "ckpts" / "checkpoint_000003").exists()


def test_lisa_on_several_workers_is_refused(tiny_dir):
    from raycpt.train.driver.prepare import prepare_plan

    cfg = load_config(None, [f"model.ref={tiny_dir}", "plan.name=lisa", "train.num_workers=2"])
    with pytest.raises(RaycptError, match="plan.name=lisa trains on one worker"):
        prepare_plan(cfg, str(tiny_dir))


def test_bf16_lisa_keeps_float32_masters_of_every_layer_and_resumes_exactly(tiny_dir, tmp_path):
    common = {**COMMON, "precision": "bf16"}
    full = run_loop(worker_spec(_cfg(tiny_dir, tmp_path / "a", **common)), LocalSession(BLOCKS, tmp_path / "a" / "ckpts"))
    ck = tmp_path / "a" / "ckpts" / "checkpoint_000004"
    master = torch.load(ck / "train_state.pt", weights_only=True)["master"]
    layers = {int(k.split(".")[2]) for k in master if ".layers." in k}
    assert layers == set(range(N))  # not only the current draw: earlier intervals trained the others
    cfg = _cfg(tiny_dir, tmp_path / "b", **common)
    cfg["resume_from"] = str(ck)
    assert run_loop(worker_spec(cfg), LocalSession(BLOCKS, tmp_path / "b" / "ckpts"))["losses"] == full["losses"]


def test_the_memory_estimate_counts_the_largest_draw():
    import transformers as T

    from raycpt.train.driver.memory import estimate_memory, model_shape
    from tiny import tiny_config

    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(tiny_config("llama", 4))
    plan = build_plan(PlanConfig(name="lisa", lisa_layers=2, lisa_interval=20), 4, tied_embeddings=True)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    non_layer = model.model.embed_tokens.weight.numel() + model.model.norm.weight.numel()  # tied head: once
    est = estimate_memory(model_shape(model), plan, seq_len=16, micro_batch=2)
    assert est.terms["gradients"] == 4.0 * (2 * layer + non_layer) == 4.0 * lisa_trainable_params([layer] * 4,
                                                                                                  non_layer, 2)


def test_lisa_period_is_derived_from_the_run_or_refused_when_it_never_switches():
    from raycpt.strategies.lisa import lisa_period

    assert [lisa_period(None, m) for m in (1, 3, 8, 100)] == [1, 1, 2, 25]  # max(1, max_steps // 4), by hand
    plan = build_plan(PlanConfig(name="lisa", lisa_layers=1), 4, max_steps=8)
    assert plan.lisa_interval == 2
    draws = {lisa_interval_index(s, plan.lisa_interval) for s in range(1, 9)}
    assert len(draws) - 1 == 3  # the default 8-step run switches 3 times
    assert build_plan(PlanConfig(name="lisa", lisa_interval=7), 4, max_steps=8).lisa_interval == 7
    for k in (8, 20):
        with pytest.raises(RaycptError, match=f"plan.lisa_interval={k} is not below train.max_steps=8"):
            build_plan(PlanConfig(name="lisa", lisa_interval=k), 4, max_steps=8)
    with pytest.raises(RaycptError, match="derived from train.max_steps"):
        build_plan(PlanConfig(name="lisa"), 4)


def test_lisa_draws_follow_the_run_seed_unless_lisa_seed_is_set():
    """Issue 50: plan.lisa_seed null takes train.seed, so a sweep's seeds draw different schedules; set, it wins."""
    import dataclasses

    pc = PlanConfig(name="lisa", lisa_layers=2, lisa_interval=3)
    p0, p7 = build_plan(pc, 12, seed=0), build_plan(pc, 12, seed=7)
    assert (p0.lisa_seed, p7.lisa_seed) == (0, 7)
    assert [lisa_draw(0, j, p0.trainable_layers, 2) for j in range(8)] != \
        [lisa_draw(7, j, p7.trainable_layers, 2) for j in range(8)]
    assert build_plan(dataclasses.replace(pc, lisa_seed=4), 12, seed=7).lisa_seed == 4
