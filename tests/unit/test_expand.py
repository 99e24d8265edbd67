"""Block expansion (LLaMA-Pro): P identity copies (o_proj, down_proj zeroed) after P equal groups, built with the
hybrid machinery; the expanded model is HF-loadable and its first loss equals the base model's; after a step only
the new blocks changed; the plan, the cache and the bad inputs."""

import json

import numpy as np
import pytest
import torch
import transformers as T

from raycpt.config import PlanConfig, config_to_dict, load_config
from raycpt.errors import RaycptError
from raycpt.models.hybrid.build import save_hybrid
from raycpt.models.expansion import expand_groups, expand_positions, expand_trainable_params
from raycpt.models.hybrid.expand import (build_expanded,
                                         expanded_model_folder)
from raycpt.strategies import apply_plan, build_plan, plan_for_model
from raycpt.train.worker.loop import run_loop
from worker_specs import worker_spec
from raycpt.train.worker.session import LocalSession
from raycpt.train.worker.steps import make_optimizer, make_scheduler, train_step
from tiny import save_tiny


def test_positions_and_counts_by_hand():
    assert expand_groups(4, 2) == [(0, 2), (2, 4)] and expand_positions(4, 2) == [2, 5]
    assert expand_groups(5, 2) == [(0, 3), (3, 5)] and expand_positions(5, 2) == [3, 6]
    assert expand_positions(30, 3) == [10, 21, 32]  # LLaMA-Pro: one after every N/P layers
    assert expand_positions(4, 4) == [1, 3, 5, 7]
    assert expand_trainable_params([10, 20, 30, 40, 50], 2) == 30 + 50  # copies of layers 2 and 4
    with pytest.raises(RaycptError, match="between 1 and 4 blocks"):
        expand_groups(4, 5)


def _ids(seed=0):
    return torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # tied embeddings; untied with attention biases
def test_the_expanded_model_starts_as_the_base_model_and_reloads(tmp_path, arch):
    base_dir = save_tiny(tmp_path / "base", arch=arch, num_layers=4)
    base = T.AutoModelForCausalLM.from_pretrained(base_dir).eval()
    model, tok = build_expanded(str(base_dir), 2)
    assert len(model.model.layers) == 6 and list(model.config.trainable_layers) == [2, 5]
    bl = base.model.layers
    src = {0: 0, 1: 1, 2: 1, 3: 2, 4: 3, 5: 3}  # expanded layer -> the base layer it copies
    for i, j in src.items():
        for (n, p), (n2, q) in zip(model.model.layers[i].named_parameters(), bl[j].named_parameters()):
            assert n == n2
            if i in (2, 5) and (n.startswith("self_attn.o_proj") or n.startswith("mlp.down_proj")):
                assert not p.any(), n  # identity: the projections that write to the residual stream are zero
            else:
                assert torch.equal(p, q), (i, n)
    with torch.no_grad():
        want = base(_ids(), labels=_ids()).loss.item()
        got = model.eval()(_ids(), labels=_ids()).loss.item()
    assert abs(got - want) <= 1e-5 * abs(want)
    save_hybrid(model, tok, tmp_path / "expanded")
    again = T.AutoModelForCausalLM.from_pretrained(tmp_path / "expanded").eval()  # HF-loadable, no remote code
    with torch.no_grad():
        assert abs(again(_ids(), labels=_ids()).loss.item() - want) <= 1e-5 * abs(want)


def test_after_a_step_only_the_new_blocks_changed(tmp_path):
    base_dir = save_tiny(tmp_path / "base", num_layers=4)
    model, _ = build_expanded(str(base_dir), 2)
    model.train()
    plan = plan_for_model(PlanConfig(name="expand", expand_blocks=2), model)
    assert plan.trainable_layers == (2, 5) and plan.layer_map() == "..T..T"
    apply_plan(model, plan)
    from raycpt.config import TrainConfig

    tcfg = TrainConfig(lr=1e-2, max_steps=2, warmup_ratio=0.0)
    opt = make_optimizer(model, plan, tcfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model, opt, make_scheduler(opt, tcfg), [_ids()])
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and {int(n.split(".")[2]) for n in moved} == {2, 5}
    assert any("o_proj" in n for n in moved)  # the zeroed projections are the ones with a gradient at step 1


def test_the_launcher_builds_the_expanded_model_once_and_the_loop_trains_it(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYCPT_CACHE", str(tmp_path / "cache"))
    base_dir = save_tiny(tmp_path / "base", num_layers=4)
    from raycpt.train.driver.prepare import prepare_plan, resolve_model_path

    cfg = load_config(None, [f"model.ref={base_dir}", "data.seq_len=16", "plan.name=expand", "plan.expand_blocks=2",
                             "train.max_steps=3", "train.checkpoint_every=3", "train.lr=0.01",
                             "train.micro_batch_size=2", "train.warmup_ratio=0"])
    path = resolve_model_path(cfg)
    assert json.loads((tmp_path / "cache" / "expanded" / path.split("/")[-1] / "raycpt_expand.json").read_text()
                      )["new_layers"] == [2, 5]
    mtime = (tmp_path / "cache" / "expanded").stat().st_mtime_ns
    assert resolve_model_path(cfg) == path == str(expanded_model_folder(str(base_dir), 2))  # cached
    assert (tmp_path / "cache" / "expanded").stat().st_mtime_ns == mtime
    plan, counts, _ = prepare_plan(cfg, path)
    assert plan.trainable_layers == (2, 5)
    base = T.AutoModelForCausalLM.from_pretrained(base_dir)
    assert counts["trainable"] == expand_trainable_params([sum(p.numel() for p in layer.parameters())
                                                           for layer in base.model.layers], 2)
    blocks = np.random.default_rng(0).integers(4, 128, size=(32, 16)).astype(np.int32)
    out = run_loop(worker_spec({"cfg": config_to_dict(cfg), "model_path": path, "plan": plan.to_dict(),
                    "run_dir": str(tmp_path / "run"), "torch_threads": 1}),
                   LocalSession(blocks, tmp_path / "ckpts"))
    assert out["status"]["status"] == "finished"
    from raycpt.data.stream import ArrayBlocks
    from raycpt.train.worker.loop import micro_batches

    _, ids = next(micro_batches(ArrayBlocks(blocks), cfg.data, 2, 0, 1, cfg.train.seed, skip=0))
    with torch.no_grad():  # the loop's first loss (expanded model, step 1) is the base model's on that batch
        want = base.eval()(ids, labels=ids).loss.item()
    assert abs(out["losses"][0] - want) <= 1e-5 * abs(want)
    saved = T.AutoModelForCausalLM.from_pretrained(tmp_path / "ckpts" / "checkpoint_000003" / "model")
    assert len(saved.model.layers) == 6


def test_expand_bad_inputs_are_one_line(tmp_path):
    with pytest.raises(RaycptError, match="between 1 and 2 blocks"):
        build_plan(PlanConfig(name="expand", expand_blocks=3), 5)  # 5 = 2 base layers + 3: too many
    from raycpt.config import ConfigError

    with pytest.raises(ConfigError, match="plan.expand_blocks"):
        PlanConfig(name="expand", expand_blocks=0)
