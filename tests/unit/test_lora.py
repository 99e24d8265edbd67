"""LoRA plans: adapters on exactly the plan's layers, merged weights equal W + (alpha/r) B A computed by hand,
a step moves only adapters, the freeze check knows adapters, the loop saves merged + peft adapters and resumes
exactly, the counts and the memory estimate see the adapters, a rank wider than a layer is refused."""

import copy
import json

import numpy as np
import pytest
import torch

from raycpt.config import PlanConfig, TrainConfig, config_to_dict, load_config
from raycpt.errors import RaycptError
from raycpt.models.adapters import (inject_lora, is_adapter_param, lora_trainable_params, merge_lora_,
                                    merged_state_dict)
from raycpt.strategies import apply_plan, build_plan, plan_table
from raycpt.train.worker import verify
from raycpt.train.worker.loop import run_loop
from worker_specs import worker_spec
from raycpt.train.worker.session import LocalSession
from raycpt.train.worker.steps import make_optimizer, make_scheduler, train_step
from tiny import tiny_config, tiny_model

H, I, KV = 32, 64, 16  # tiny_config: hidden 32, intermediate 2*32, 2 kv heads of head_dim 8


def _plan(pattern="0110", rank=4, alpha=8.0, targets=(), n=4, **kw):
    return build_plan(PlanConfig(name="blocks", pattern=pattern, adapter="lora", lora_rank=rank, lora_alpha=alpha,
                                 lora_targets=list(targets), **kw), n, tied_embeddings=True)


def _lora_model(plan, seed=0):
    model = tiny_model("llama", num_layers=plan.num_layers, seed=seed)
    inject_lora(model, plan)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # B starts at zero: give it values so the merge has something to add
        for n, p in model.named_parameters():
            if ".lora_B." in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return model


def _by_hand_params(rank, layers):
    # q (H->H), k (H->KV), v (H->KV), o (H->H), gate (H->I), up (H->I), down (I->H): r * (in + out) each
    per = rank * ((H + H) + (H + KV) + (H + KV) + (H + H) + (H + I) + (H + I) + (I + H))
    return per * len(layers)


def test_adapters_sit_on_exactly_the_plan_layers_and_count_by_hand():
    plan = _plan()  # 0110 over 4 layers: layers 1 and 2 (Mid-Block)
    assert plan.trainable_layers == (1, 2) and plan.adapter == "lora"
    model = tiny_model("llama", num_layers=4)
    assert lora_trainable_params(model, 4, plan.trainable_layers) == _by_hand_params(4, [1, 2])
    inject_lora(model, plan)
    layers_with = sorted({int(n.split(".")[2]) for n, _ in model.named_parameters() if is_adapter_param(n)})
    assert layers_with == [1, 2]
    counts = apply_plan(model, plan)
    assert counts["trainable"] == _by_hand_params(4, [1, 2])
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter_param(n) for n in trainable)
    tab = plan_table(model, plan)
    assert tab["trainable"] == counts["trainable"] and tab["frozen"] == counts["frozen"]
    assert "LoRA r=4" in plan.describe()


def test_only_named_targets_get_adapters():
    plan = _plan(pattern="1111", targets=["q_proj", "v_proj"])
    model = tiny_model("llama", num_layers=4)
    assert lora_trainable_params(model, 4, range(4), ["q_proj", "v_proj"]) == 4 * 4 * ((H + H) + (H + KV))
    inject_lora(model, plan)
    leaves = {n.split(".")[-4] for n, _ in model.named_parameters() if is_adapter_param(n)}
    assert leaves == {"q_proj", "v_proj"}


def test_merged_weights_equal_w_plus_alpha_over_r_times_b_a_by_hand():
    plan = _plan(rank=4, alpha=8.0)
    base = tiny_model("llama", num_layers=4).state_dict()
    model = _lora_model(plan)
    raw = dict(model.named_parameters())
    merged = merged_state_dict(model)
    assert set(merged) == set(base)  # plain HF names, no adapter tensors
    changed = 0
    for k, w in base.items():
        mod = k[:-len(".weight")] if k.endswith(".weight") else None
        a = raw.get(f"{mod}.lora_A.default.weight") if mod else None
        if a is None:
            assert torch.equal(merged[k], w), k
            continue
        b = raw[f"{mod}.lora_B.default.weight"].detach()
        want = w + (8.0 / 4) * torch.matmul(b.double(), a.detach().double()).float()  # by hand, in float64
        torch.testing.assert_close(merged[k], want, rtol=0, atol=1e-6)
        assert not torch.equal(merged[k], w)
        changed += 1
    assert changed == 2 * 7
    # the merged dict is a plain model: load it strictly into the base class, logits equal the adapted model's
    import transformers as T

    plain = T.AutoModelForCausalLM.from_config(tiny_config("llama", 4))
    plain.load_state_dict(merged, strict=True)
    ids = torch.randint(4, 128, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(plain.eval()(ids).logits, model.eval()(ids).logits, rtol=1e-5, atol=1e-5)
        other = copy.deepcopy(model)
        merge_lora_(other)  # in place: plain nn.Linear modules again, the same numbers
        assert not any(is_adapter_param(n) for n, _ in other.named_parameters())
        torch.testing.assert_close(other(ids).logits, plain(ids).logits, rtol=0, atol=0)


def test_one_lora_step_changes_only_adapter_weights_and_passes_the_freeze_check():
    plan = _plan()
    model = _lora_model(plan)
    model.train()
    apply_plan(model, plan)
    tcfg = TrainConfig(lr=1e-2, max_steps=3, warmup_ratio=0.0)
    opt = make_optimizer(model, plan, tcfg)
    sched = make_scheduler(opt, tcfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    verify.check_setup(model, plan, opt, "after wrapping")
    ids = [torch.randint(4, 128, (2, 12), generator=torch.Generator().manual_seed(0))]
    model(input_ids=ids[0], labels=ids[0]).loss.backward()
    grads, prints = verify.grad_presence(model), verify.frozen_fingerprints(model)
    opt.step()
    opt.zero_grad(set_to_none=True)
    rows = {r.part: r for r in verify.check_step(model, plan, opt, grads, prints)}
    assert rows["layers.1"].planned == rows["layers.1"].got_grad == 14  # 7 modules x (A, B)
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(is_adapter_param(n) for n in moved)
    assert {int(n.split(".")[2]) for n in moved} == {1, 2}
    train_step(model, opt, sched, ids)  # and once more through the loop's own step
    for n, p in model.named_parameters():
        if not is_adapter_param(n):
            assert torch.equal(p, before[n]), n


def test_the_freeze_check_refuses_adapters_on_the_wrong_layers():
    plan = _plan()  # layers 1, 2
    model = tiny_model("llama", num_layers=4)
    inject_lora(model, _plan(pattern="1000"))  # adapters on layer 0 instead
    apply_plan(model, _plan(pattern="1000"))
    opt = make_optimizer(model, _plan(pattern="1000"), TrainConfig())
    with pytest.raises(RaycptError, match=r"layers\.0: it holds 14 LoRA adapter tensors"):
        verify.check_setup(model, plan, opt, "after wrapping")


@pytest.mark.parametrize("rank,fine", [(16, True), (17, False)])
def test_a_rank_wider_than_the_narrowest_target_is_refused(rank, fine):
    plan = _plan(pattern="1111", rank=rank)
    with torch.device("meta"):
        import transformers as T

        model = T.AutoModelForCausalLM.from_config(tiny_config("llama", 4))
    if fine:  # k_proj / v_proj are 32 -> 16: rank 16 fits
        inject_lora(model, plan)
        return
    with pytest.raises(RaycptError, match=r"plan.lora_rank=17 is larger than the layer width: .*k_proj is 32 -> 16"):
        inject_lora(model, plan)
    with pytest.raises(RaycptError, match="larger than the layer width"):
        lora_trainable_params(model, rank, [0])


def test_an_unknown_target_is_one_line():
    with pytest.raises(RaycptError, match=r"no linear module 'qkv'.*q_proj"):
        inject_lora(tiny_model("llama", 4), _plan(targets=["qkv"]))


def test_lora_full_trains_layers_adapters_only_not_embeddings():
    plan = build_plan(PlanConfig(name="full", adapter="lora", lora_rank=2), 4, tied_embeddings=True)
    assert plan.trainable_layers == (0, 1, 2, 3)
    assert not (plan.train_embeddings or plan.train_head or plan.train_final_norm)
    assert any("lora:" in n for n in plan.notes)


def test_the_memory_estimate_counts_adapters_not_layer_weights():
    from raycpt.train.driver.memory import estimate_memory, model_shape

    plan = _plan()
    import transformers as T

    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(tiny_config("llama", 4))
    inject_lora(model, plan)
    shape = model_shape(model)
    est = estimate_memory(shape, plan, seq_len=16, micro_batch=2)
    p = _by_hand_params(4, [1, 2])
    assert est.terms["gradients"] == 4.0 * p  # one worker: 4 bytes per trainable parameter
    full = build_plan(PlanConfig(name="blocks", pattern="0110"), 4, tied_embeddings=True)
    assert estimate_memory(shape, full, seq_len=16, micro_batch=2).terms["gradients"] > est.terms["gradients"]


# ------------------------------------------------------------------------------------ the loop


def _loop_config(tiny_dir, run_dir, **train):
    cfg = load_config(None, [f"model.ref={tiny_dir}", "data.seq_len=16", "plan.name=blocks", "plan.pattern=0110",
                             "plan.adapter=lora", "plan.lora_rank=4", "plan.lora_alpha=8"] +
                      [f"train.{k}={v}" for k, v in train.items()])
    plan = build_plan(cfg.plan, 4, tied_embeddings=True)
    return {"cfg": config_to_dict(cfg), "model_path": str(tiny_dir), "plan": plan.to_dict(), "run_dir": str(run_dir),
            "torch_threads": 1}


def test_the_loop_saves_merged_weights_and_peft_adapters_and_resumes_exactly(tiny_dir, tmp_path):
    import transformers as T
    from peft import PeftModel
    from safetensors.torch import load_file

    blocks = np.random.default_rng(0).integers(4, 128, size=(64, 16)).astype(np.int32)
    cfg = _loop_config(tiny_dir, tmp_path / "a", max_steps=4, checkpoint_every=2, lr=0.01, micro_batch_size=2,
                       warmup_ratio=0.0)
    full = run_loop(worker_spec(cfg), LocalSession(blocks, tmp_path / "a" / "ckpts"))
    assert full["status"]["status"] == "finished" and len(full["losses"]) == 4
    assert full["counts"]["trainable"] == _by_hand_params(4, [1, 2])
    final = tmp_path / "a" / "ckpts" / "checkpoint_000004"
    merged = T.AutoModelForCausalLM.from_pretrained(final / "model").eval()  # plain HF weights, no peft
    base = T.AutoModelForCausalLM.from_pretrained(tiny_dir).eval()
    sd_m, sd_b = merged.state_dict(), base.state_dict()
    assert not any(is_adapter_param(k) for k in sd_m)
    for k in sd_b:  # frozen layers, embeddings, norms: bitwise the base; adapted linears moved
        adapted = (".layers.1." in k or ".layers.2." in k) and k.endswith("proj.weight")
        assert torch.equal(sd_m[k], sd_b[k]) != adapted, k
    # the adapter folder, read by peft itself onto the base model, gives the merged model's logits
    assert json.loads((final / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert len(load_file(str(final / "adapter" / "adapter_model.safetensors"))) == 2 * 2 * 7
    peft_model = PeftModel.from_pretrained(T.AutoModelForCausalLM.from_pretrained(tiny_dir), str(final / "adapter"))
    ids = torch.randint(4, 128, (2, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(peft_model.eval()(ids).logits, merged(ids).logits, rtol=1e-5, atol=1e-5)
    cfg_b = copy.deepcopy(cfg)
    cfg_b["run_dir"] = str(tmp_path / "b")
    cfg_b["resume_from"] = str(tmp_path / "a" / "ckpts" / "checkpoint_000002")
    resumed = run_loop(worker_spec(cfg_b), LocalSession(blocks, tmp_path / "b" / "ckpts"))
    assert resumed["losses"] == full["losses"]  # bitwise: base + adapters + optimizer state restored
    a = load_file(str(final / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "b" / "ckpts" / "checkpoint_000004" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_training_checkpoints_merged_bf16_weights_and_resumes_exactly(tiny_dir, tmp_path):
    """precision=bf16 (CPU autocast): model/ is the merged weights in bf16, the adapters stay float32 in
    adapter/, and a resume (base + adapters, not the bf16 merge) gives the same losses."""
    from safetensors.torch import load_file

    blocks = np.random.default_rng(0).integers(4, 128, size=(64, 16)).astype(np.int32)
    cfg = _loop_config(tiny_dir, tmp_path / "a", max_steps=4, checkpoint_every=2, lr=0.01, micro_batch_size=2,
                       warmup_ratio=0.0, precision="bf16")
    full = run_loop(worker_spec(cfg), LocalSession(blocks, tmp_path / "a" / "ck"))
    ck2 = tmp_path / "a" / "ck" / "checkpoint_000002"
    assert {v.dtype for v in load_file(str(ck2 / "model" / "model.safetensors")).values()} == {torch.bfloat16}
    assert {v.dtype for v in load_file(str(ck2 / "adapter" / "adapter_model.safetensors")).values()} == {torch.float32}
    cfg_b = copy.deepcopy(cfg)
    cfg_b.update(run_dir=str(tmp_path / "b"), resume_from=str(ck2))
    assert run_loop(worker_spec(cfg_b), LocalSession(blocks, tmp_path / "b" / "ck"))["losses"] == full["losses"]


@pytest.mark.parametrize("rank", [2, 8])
def test_alpha_defaults_to_twice_the_rank_and_rslora_scales_by_sqrt_r(rank):
    """peft's own ``scaling`` of every injected module: alpha / r = 2 at any rank with alpha null (2r);
    alpha / sqrt(r) = 2 sqrt(r) with rsLoRA."""
    from peft.tuners.lora import LoraLayer

    for rslora, want in ((False, 2.0), (True, 2.0 * rank / rank ** 0.5)):
        model = tiny_model("llama", num_layers=4)
        plan = build_plan(PlanConfig(name="blocks", pattern="0110", adapter="lora", lora_rank=rank,
                                     lora_rslora=rslora), 4)
        assert plan.lora_alpha == 2.0 * rank
        inject_lora(model, plan)
        scales = [float(m.scaling["default"]) for _, m in model.named_modules() if isinstance(m, LoraLayer)]
        assert len(scales) == 2 * 7 and scales == pytest.approx([want] * len(scales))
