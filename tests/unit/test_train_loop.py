"""The training loop without Ray: one step on tiny models, the optimizer's contents, the frozen
prefix running without autograd, exact resume from a checkpoint, the NaN stop."""

import copy
import json

import numpy as np
import pytest
import torch

from raycpt.config import PlanConfig, TrainConfig, config_to_dict, load_config
from raycpt.strategies import apply_plan, plan_for_model
from raycpt.train.worker.callbacks import StepCallback
from raycpt.train.worker.loop import micro_batches, run_loop
from worker_specs import worker_spec
from raycpt.train.worker.session import LocalSession
from raycpt.train.worker.steps import FrozenPrefix, make_optimizer, make_scheduler, train_step
from tiny import tiny_model


def _batch(seed=0, b=2, t=12, vocab=128):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, vocab, (b, t), generator=g)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("spec", [dict(name="train_shallow", split=0.5), dict(name="train_deep", split=0.5),
                                  dict(name="single", layer=2, train_final_norm=True)])
def test_one_step_moves_only_trainable(arch, spec):
    model = tiny_model(arch, num_layers=4)
    model.train()
    plan = plan_for_model(PlanConfig(**spec), model)
    apply_plan(model, plan)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    tcfg = TrainConfig(lr=1e-2, warmup_ratio=0.0, max_steps=4)
    opt = make_optimizer(model, plan, tcfg)
    sched = make_scheduler(opt, tcfg)
    FrozenPrefix(model, plan)
    out = train_step(model, opt, sched, _batch())
    assert np.isfinite(out["loss"]) and out["grad_norm"] > 0
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert not torch.equal(p, before[n]), f"{n} should have moved"
        else:
            assert torch.equal(p, before[n]), f"{n} is frozen but changed"
            assert p.grad is None
    # the optimizer holds exactly the trainable parameters, and state only for them
    in_opt = {id(p) for g in opt.param_groups for p in g["params"]}
    assert in_opt == {id(p) for p in model.parameters() if p.requires_grad}
    assert {id(p) for p in opt.state} == in_opt


def test_lr_scales_reach_optimizer_groups_through_the_schedule():
    model = tiny_model("llama", num_layers=4)
    plan = plan_for_model(PlanConfig(name="train_shallow", split=0.5, lr_scales={0: 4.0}), model)
    apply_plan(model, plan)
    tcfg = TrainConfig(lr=1e-3, warmup_ratio=0.5, max_steps=4)
    opt = make_optimizer(model, plan, tcfg)
    sched = make_scheduler(opt, tcfg)
    layer0 = {id(p) for p in model.get_decoder().layers[0].parameters()}
    for _ in range(2):
        train_step(model, opt, sched, _batch())
    for g in opt.param_groups:
        ids = {id(p) for p in g["params"]}
        scale = 4.0 if ids <= layer0 else 1.0
        assert ids <= layer0 or not (ids & layer0)
        assert g["lr_scale"] == scale
        # linear warmup over 2 steps, then linear decay to 0 at step 4: after 2 steps the factor is 1.0
        assert g["lr"] == pytest.approx(1e-3 * scale)
        assert g["betas"] == (0.9, 0.95) and g["weight_decay"] in (0.0, 0.01)


def test_frozen_prefix_runs_without_autograd():
    model = tiny_model("qwen2", num_layers=4)
    plan = plan_for_model(PlanConfig(name="train_deep", split=0.5), model)  # layers 0, 1 frozen
    apply_plan(model, plan)
    seen, outs = {}, {}
    layers = model.get_decoder().layers

    def rec(i):
        def hook(module, args, output):
            seen[i] = torch.is_grad_enabled()
            outs[i] = output[0] if isinstance(output, tuple) else output
        return hook

    hs = [layer.register_forward_hook(rec(i)) for i, layer in enumerate(layers)]
    prefix = FrozenPrefix(model, plan)
    assert prefix.active and prefix.prefix_layers == 2
    ids = _batch()[0]
    loss = model(input_ids=ids, labels=ids).loss
    assert seen == {0: False, 1: False, 2: True, 3: True}
    assert outs[1].grad_fn is None and outs[2].grad_fn is not None
    assert torch.is_grad_enabled()
    loss.backward()
    prefix.remove()
    # removing the hooks restores plain behaviour
    model(input_ids=ids, labels=ids)
    assert seen[0] is True
    for h in hs:
        h.remove()
    # a plan that trains the embeddings installs nothing
    full = plan_for_model(PlanConfig(name="full"), model)
    assert not FrozenPrefix(model, full).active


def test_micro_batches_skip_and_epochs():
    from raycpt.config import DataConfig
    from raycpt.data.stream import ArrayBlocks, EpochOrder

    blocks = np.arange(7 * 3).reshape(7, 3)
    data = DataConfig(shuffle_window=4)
    seq = [(e, b[:, 0].tolist()) for _, (e, b) in zip(range(5), micro_batches(ArrayBlocks(blocks), data, 2, 0, 1,
                                                                                seed=5, skip=0))]
    # 3 full micro-batches per epoch (one block is left out), each epoch in its own seeded order
    want = [(e, (3 * EpochOrder([7], 5, e, 4).full()[2 * k:2 * k + 2]).tolist()) for e, k in
            [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]]
    assert seq == want and seq[0][1] != seq[3][1]
    resumed = [(e, b[:, 0].tolist()) for _, (e, b) in zip(range(2), micro_batches(ArrayBlocks(blocks), data, 2, 0, 1,
                                                                                    seed=5, skip=3))]
    assert resumed == seq[3:5]
    # data.shuffle_seed wins over the train seed
    pinned = DataConfig(shuffle_window=4, shuffle_seed=5)
    _, first = next(micro_batches(ArrayBlocks(blocks), pinned, 2, 0, 1, seed=99, skip=0))
    assert first.dtype == torch.int64 and first[:, 0].tolist() == seq[0][1]


def _loop_config(tiny_dir, run_dir, plan_spec, **train):
    cfg = load_config(None, [f"model.ref={tiny_dir}", "data.seq_len=16"] +
                      [f"plan.{k}={v}" for k, v in plan_spec.items()] + [f"train.{k}={v}" for k, v in train.items()])
    from transformers import AutoConfig

    from raycpt.strategies import build_plan

    n = AutoConfig.from_pretrained(tiny_dir).num_hidden_layers
    plan = build_plan(cfg.plan, n, tied_embeddings=True)
    return {"cfg": config_to_dict(cfg), "model_path": str(tiny_dir), "plan": plan.to_dict(), "run_dir": str(run_dir),
            "torch_threads": 1}


def _blocks(n=64, t=16, seed=0):
    return np.random.default_rng(seed).integers(4, 128, size=(n, t)).astype(np.int32)


def test_resume_from_checkpoint_is_exact(tiny_dir, tmp_path):
    blocks = _blocks()
    common = dict(max_steps=6, checkpoint_every=3, lr=0.01, micro_batch_size=2, grad_accum=2, warmup_ratio=0.2)
    cfg = _loop_config(tiny_dir, tmp_path / "a", dict(name="train_deep", split=0.5), **common)
    sess = LocalSession(blocks, tmp_path / "a" / "ckpts")
    full = run_loop(worker_spec(cfg), sess)
    assert full["status"]["status"] == "finished" and len(full["losses"]) == 6
    ckpt3 = tmp_path / "a" / "ckpts" / "checkpoint_000003"
    state = json.loads((ckpt3 / "train_state.json").read_text())
    assert state["step"] == 3 and state["data"]["micro_batches_consumed"] == 6
    assert (ckpt3 / "model" / "model.safetensors").is_file()
    cfg_b = copy.deepcopy(cfg)
    cfg_b["run_dir"] = str(tmp_path / "b")
    cfg_b["resume_from"] = str(ckpt3)
    resumed = run_loop(worker_spec(cfg_b), LocalSession(blocks, tmp_path / "b" / "ckpts"))
    assert resumed["losses"] == full["losses"]  # history from the checkpoint + steps 4..6, bitwise equal
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "a" / "ckpts" / "checkpoint_000006" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "ckpts" / "checkpoint_000006" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_nonfinite_loss_stops_before_the_update(tiny_dir, tmp_path):
    cfg = _loop_config(tiny_dir, tmp_path, dict(name="train_shallow", split=0.5), max_steps=5, checkpoint_every=1,
                       lr=0.01, micro_batch_size=2)
    cfg["faults"] = {"nan_step": 3}
    sess = LocalSession(_blocks(), tmp_path / "ckpts")
    out = run_loop(worker_spec(cfg), sess)
    assert out["status"] == {"status": "nonfinite", "step": 3, "what": "loss", "value": "nan",
                             "last_checkpoint_step": 2}
    assert len(out["losses"]) == 2
    assert json.loads((tmp_path / "train_status.json").read_text())["step"] == 3
    assert sorted(p.name for p in (tmp_path / "ckpts").iterdir()) == ["checkpoint_000001", "checkpoint_000002"]


class _Counter(StepCallback):
    every = 2

    def __init__(self):
        self.calls = []

    def on_step_end(self, state):
        self.calls.append(state.step)
        return {"extra_metric": float(state.step)}


def test_step_callbacks_run_every_n(tiny_dir, tmp_path):
    cfg = _loop_config(tiny_dir, tmp_path, dict(name="single", layer=1), max_steps=5, checkpoint_every=10,
                       micro_batch_size=2)
    cb = _Counter()
    cfg["callbacks"] = [cb]
    run_loop(worker_spec(cfg), LocalSession(_blocks()))
    assert cb.calls == [2, 4]
    recs = [json.loads(line) for line in (tmp_path / "train_metrics.jsonl").read_text().splitlines()]
    assert [r.get("extra_metric") for r in recs if "loss" in r] == [None, 2.0, None, 4.0, None]


def test_a_worker_builds_the_layer_view_once(tiny_dir, tmp_path, monkeypatch):
    """Plan, optimizer groups, wrapping, freeze check and throughput all read one LayerStack per loaded model:
    counted by wrapping LayerStack.__init__, over a whole run with a checkpoint and a drift-free 3-step loop."""
    from raycpt.models import stack as stack_mod

    built = []
    orig = stack_mod.LayerStack.__init__

    def counting(self, model):
        built.append(id(model))
        orig(self, model)

    monkeypatch.setattr(stack_mod.LayerStack, "__init__", counting)
    cfg = _loop_config(tiny_dir, tmp_path, dict(name="train_shallow", split=0.5), max_steps=3, checkpoint_every=2,
                       micro_batch_size=2)
    out = run_loop(worker_spec(cfg), LocalSession(_blocks(), tmp_path / "ckpts"))
    assert out["status"]["status"] == "finished"
    assert len(built) == len(set(built)) == 1, f"{len(built)} layer views built for {len(set(built))} model(s)"
