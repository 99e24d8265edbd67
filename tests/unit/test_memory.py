"""The memory estimate: its activation model against autograd's own saved tensors, its arithmetic by
hand, the pre-launch refusal through the console script, and the loop's new settings end to end."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers as T

from raycpt.config import PlanConfig
from raycpt.errors import RaycptError
from raycpt.strategies import apply_plan, build_plan
from raycpt.train.driver.memory import check_fits, estimate_memory, layer_activation_floats, model_shape


def _saved_floats_per_token(model, tokens=48, batch=2, frozen=False) -> float:
    """Floats autograd saves in decoder layer 1 per token (parameters excluded, the layer input included);
    ``frozen``: the layer's parameters frozen, its input still needing a gradient (a frozen layer above a trained one)."""
    conf = model.config
    layer = model.model.layers[1]
    for p in layer.parameters():
        p.requires_grad_(not frozen)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return t

    x = torch.randn(batch, tokens, conf.hidden_size, requires_grad=True)
    pos = torch.arange(tokens)[None].expand(batch, -1)
    args = (x, pos, "full_attention") if conf.model_type == "gemma3_text" else (x, pos)
    pe = model.model.rotary_emb(*args)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
    return sum(seen.values()) / 4 / (batch * tokens)


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text"])
@pytest.mark.parametrize("dims", [(64, 128, 4, 2, 16), (96, 320, 6, 3, 16), (64, 192, 8, 8, 8)])
def test_activation_model_matches_what_autograd_saves(arch, dims, frozen):
    h, i, nh, nkv, hd = dims
    extra = {"sliding_window": 4096, "layer_types": ["full_attention"] * 2} if arch == "gemma3_text" else {}
    conf = T.AutoConfig.for_model(arch, vocab_size=64, num_hidden_layers=2, hidden_size=h, intermediate_size=i,
                                  num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
                                  max_position_embeddings=128, **extra)
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(conf).train()
    measured = _saved_floats_per_token(model, frozen=frozen)
    assert layer_activation_floats(model_shape(model), frozen=frozen) == pytest.approx(measured, rel=0.02)


def _shape():
    conf = T.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(conf)
    return model, model_shape(model)


def _plan(model, name, **kw):
    plan = build_plan(PlanConfig(name=name, split=0.5, **kw), 4, tied_embeddings=True)
    apply_plan(model, plan)
    return plan


def test_estimate_terms_by_hand():
    model, shape = _shape()
    layer = 4 * 64 * 16 * 2 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64  # q, o; k, v; mlp; two norms
    assert shape.layer_params == (layer,) * 4 and shape.embed_params == 64_000 and shape.tied
    total = 4 * layer + 64_000 + 64
    assert shape.total_params == total == sum(p.numel() for p in model.parameters())
    per_layer = 6 * 64 + 4 * 128 + 2 * 64 + 4 + 2 * 32 + 2 * 16 + 2  # the llama coefficients
    tokens = 3 * 32
    full = estimate_memory(shape, _plan(model, "full"), seq_len=32, micro_batch=3)
    assert full.terms["weights"] == 4 * total and full.terms["gradients"] == 4 * total
    assert full.terms["activations"] == 4 * per_layer * tokens * 4
    frozen_layer = 2 * 64 + 3 * 128 + 2 * 64 + 4 + 2 * 32 + 2 * 16 + 2  # no input of a frozen linear kept
    deep = estimate_memory(shape, _plan(model, "train_deep"), seq_len=32, micro_batch=3)
    shallow = estimate_memory(shape, _plan(model, "train_shallow"), seq_len=32, micro_batch=3)
    assert deep.terms["activations"] == 2 * per_layer * tokens * 4  # the frozen prefix keeps nothing
    # autograd runs through the frozen top, which keeps only what the input gradient needs
    assert shallow.terms["activations"] == (2 * per_layer + 2 * frozen_layer) * tokens * 4
    assert deep.terms["gradients"] == shallow.terms["gradients"] == 4 * 2 * layer
    ckpt = estimate_memory(shape, _plan(model, "full"), seq_len=32, micro_batch=3, activation_checkpointing=True)
    assert ckpt.terms["activations"] == (4 * 64 + per_layer) * tokens * 4
    plain = full.terms["logits"]
    chunked = estimate_memory(shape, _plan(model, "full"), seq_len=32, micro_batch=3, chunk_tokens=8).terms["logits"]
    assert plain == 2 * 64 * tokens * 4 + 3 * 4 * tokens * 1000
    assert chunked == 2 * 64 * tokens * 4 + 3 * 4 * 8 * 1000 + 4 * 64_000 + tokens * 64 * 4
    ddp = estimate_memory(shape, _plan(model, "full"), seq_len=32, micro_batch=3, world_size=4)
    fsdp = estimate_memory(shape, _plan(model, "full"), seq_len=32, micro_batch=3, world_size=4, distributed="fsdp")
    assert ddp.terms["gradients"] == 2 * full.terms["gradients"]  # DDP's buckets
    assert fsdp.terms["gradients"] == full.terms["gradients"] / 4
    t = full.terms
    assert full.total == pytest.approx(t["weights"] + 8 * total + max(t["activations"] + t["logits"],
                                       t["gradients"] + (t["optimizer"] - 8 * total)) + t["overhead"])


def test_check_fits_names_the_biggest_term_and_its_knob():
    model, shape = _shape()
    est = estimate_memory(shape, _plan(model, "full"), seq_len=128, micro_batch=64)
    assert est.biggest == "activations"
    check_fits(est, est.total / 1e9 * 1.01)
    with pytest.raises(RaycptError, match=r"the biggest term is activations .*train.activation_checkpointing=true"):
        check_fits(est, est.total / 1e9 * 0.99)


def _cli(*args):
    exe = [sys.executable, "-c", "import sys; from raycpt.entry import _entry; sys.argv[0] = 'raycpt'; _entry()"]
    return subprocess.run(exe + list(args), capture_output=True, text=True, timeout=300)


def test_bad_inputs_through_the_console_script(tiny_dir, tmp_path):
    from test_hybrid import LAYERS, shorthand  # noqa: F401
    from raycpt.models.hybrid.build import save_hybrid

    r = _cli("plan", "show", f"model.ref={tiny_dir}", "plan.name=full", "train.device_memory_gb=0.0001")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "plan full does not fit" in r.stderr and "the biggest term is" in r.stderr
    r = _cli("plan", "show", f"model.ref={tiny_dir}", "train.loss_chunk_tokens=0")
    assert r.returncode == 2 and "train.loss_chunk_tokens=0" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    donor = tmp_path / "donor"
    from tiny import save_tiny

    save_tiny(donor, "llama", 4, 32, seed=1)
    model, tok = shorthand(str(donor), "new_deep", "nemotron_h")
    hyb = save_hybrid(model, tok, tmp_path / "hyb")
    r = _cli("plan", "show", f"model.ref={hyb}", "train.activation_checkpointing=true")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "RaycptHybridForCausalLM has no gradient-checkpointing support" in r.stderr
    ok = _cli("plan", "show", f"model.ref={tiny_dir}", "data.seq_len=32")
    assert ok.returncode == 0 and "memory: plan train_shallow" in ok.stdout and "estimated peak memory" in ok.stdout


def test_loop_with_chunked_loss_and_checkpointing_matches_the_plain_loop(tiny_dir, tmp_path):
    """Same blocks, same seed: the chunked loss and activation checkpointing change memory, not the losses;
    tokens/s per worker is logged (no MFU on a CPU without train.peak_tflops, with it: the arithmetic)."""
    from test_train_loop import _loop_config

    from raycpt.train.worker.loop import run_loop
    from worker_specs import worker_spec
    from raycpt.train.worker.metrics_log import METRICS_FILE
    from raycpt.train.worker.session import LocalSession

    blocks = np.random.default_rng(0).integers(4, 128, size=(16, 16)).astype(np.int32)
    runs = {}
    for name, extra in {"plain": dict(loss="plain"), "chunked": dict(loss="chunked", loss_chunk_tokens=5),
                        "ckpt": dict(loss="chunked", activation_checkpointing="true", peak_tflops=0.001)}.items():
        cfg = _loop_config(tiny_dir, tmp_path / name, dict(name="full"), max_steps=3, lr=0.01, micro_batch_size=2,
                           checkpoint_every=3, **extra)
        runs[name] = run_loop(worker_spec(cfg), LocalSession(blocks))
    assert runs["chunked"]["losses"] == pytest.approx(runs["plain"]["losses"], rel=1e-5)
    assert runs["ckpt"]["losses"] == pytest.approx(runs["plain"]["losses"], rel=1e-5)
    import json

    rec = [json.loads(line) for line in (tmp_path / "ckpt" / METRICS_FILE).read_text().splitlines()]
    steps = [r for r in rec if "loss" in r]
    assert all(r["tokens_per_s_per_worker"] == pytest.approx(2 * 16 / r["step_time_s"]) for r in steps)
    assert all("mfu" in r for r in steps)
    plain_rec = [json.loads(line) for line in (tmp_path / "plain" / METRICS_FILE).read_text().splitlines()]
    assert not any("mfu" in r for r in plain_rec)


def test_sweep_estimates_full_as_it_trains_under_equal_footing():
    """sweep.equal_footing: the pre-launch estimate of `full` counts its decoder layers only (as the trial
    trains it), so its optimizer term is the sum of the layers' parameters counted here by hand."""
    import dataclasses

    from raycpt.config import load_config
    from raycpt.train.driver.memory import _trainable
    from raycpt.train.driver.preflight import sweep_plans
    from tiny import tiny_model

    model = tiny_model("llama", num_layers=4)
    shape = model_shape(model)
    by_hand = sum(p.numel() for layer in model.model.layers for p in layer.parameters())
    cfg = load_config("configs/default.yaml")
    assert cfg.sweep.equal_footing
    full = [p for p in sweep_plans(cfg) if p.name == "full"][0]
    assert _trainable(shape, build_plan(full, 4, tied_embeddings=shape.tied)) == by_hand
    off = dataclasses.replace(cfg, sweep=dataclasses.replace(cfg.sweep, equal_footing=False))
    full_off = [p for p in sweep_plans(off) if p.name == "full"][0]
    assert _trainable(shape, build_plan(full_off, 4, tied_embeddings=shape.tied)) == sum(
        p.numel() for p in model.parameters())
