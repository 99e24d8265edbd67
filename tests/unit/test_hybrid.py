"""Hybrid builds on tiny donors (no download, no Ray).

References are independent of the hybrid code: the donor model's own forward (a hybrid made only
of a donor's layers must reproduce it), the donor's per-layer input/output recorded by a raw
forward hook, a cross-entropy and a greedy decoding loop written here, and parameter counts summed
from the donor / fresh modules directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from raycpt.errors import RaycptError
from tiny import save_tiny, tiny_model

HIDDEN, LAYERS, SEQ = 32, 4, 10


def batch(seed: int = 0, vocab: int = 128):
    """Two rows: one full, one left-padded by 3 (pad id 0, mask 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (2, SEQ), generator=g)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    ids[1, :3] = 0
    mask[1, :3] = 0
    return ids, mask


@pytest.fixture(scope="module")
def donors(tmp_path_factory):
    root = tmp_path_factory.mktemp("donors")
    out = {}
    for arch in ("llama", "qwen3", "gemma3", "mamba2", "nemotron_h"):
        out[arch] = str(save_tiny(root / arch, arch, LAYERS, HIDDEN, seed=1))
    out["wide"] = str(save_tiny(root / "wide", "llama", LAYERS, 64, seed=2))
    return out


def build(segments, head):
    from raycpt.models.hybrid.build import build_hybrid
    from raycpt.models.hybrid.plans import plan_hybrid

    return build_hybrid(plan_hybrid(segments, head))


def shorthand(donor: str, placement: str, kind: str, depth: int = LAYERS, config=None):
    from raycpt.models.hybrid.build import build_hybrid
    from raycpt.models.hybrid.plans import plan_hybrid, shorthand_segments

    if config is None:  # short scan chunks: the pure-PyTorch Mamba2 scan pads every sequence to a chunk
        config = {"chunk_size": 16} if kind in ("mamba2", "nemotron_h") else {}
    segs = shorthand_segments(placement, donor, LAYERS, depth, kind, config, init_seed=3)
    return build_hybrid(plan_hybrid(segs, donor, name=placement))


def load_donor(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()


# ------------------------------------------------------------------------------------------------ shape of a build

@pytest.mark.parametrize("placement", ["new_shallow", "new_deep"])
def test_shorthands_place_new_and_donor_layers(donors, placement):
    from raycpt.models.hybrid.plans import shorthand_segments

    segs = shorthand_segments(placement, donors["llama"], 30, 12, "mamba2")
    if placement == "new_shallow":  # new layers first (trained), the donor's DEEP layers after (frozen)
        assert segs[0]["new"] == "mamba2" and segs[0]["count"] == 6 and segs[0]["trainable"] is True
        assert segs[1]["layers"] == [24, 30] and segs[1]["trainable"] is False
    else:  # the donor's SHALLOW layers first (trained), new layers after (frozen)
        assert segs[0]["layers"] == [0, 6] and segs[0]["trainable"] is True
        assert segs[1]["new"] == "mamba2" and segs[1]["count"] == 6 and segs[1]["trainable"] is False


def test_segment_map_counts(donors):
    from raycpt.models.hybrid.build import hybrid_plan, param_counts, segment_rows

    model, _ = shorthand(donors["llama"], "new_shallow", "mamba2")
    donor = load_donor(donors["llama"])
    rows = {r["segment"]: r for r in segment_rows(model)}
    # donor layers 2..3 copied: their parameter count is the donor's own
    assert rows["1"]["params"] == sum(p.numel() for l in donor.model.layers[2:4] for p in l.parameters())
    assert rows["embed"]["params"] == donor.model.embed_tokens.weight.numel()
    assert rows["head"]["params"] == 0  # tied to the embeddings, counted once
    assert rows["0"]["kind"] == "mamba2" and rows["0"]["trainable"] is True and rows["1"]["trainable"] is False
    counts = param_counts(model)
    assert counts["total"] == sum(r["params"] for r in rows.values())
    assert hybrid_plan(model) == {"name": "layers", "layers": [0, 1]}
    assert model.config.layer_kinds == ["mamba2", "mamba2", "llama", "llama"]


# ------------------------------------------------------------------------------------------------ forward / backward

@pytest.mark.parametrize("placement, kind", [("new_shallow", "mamba2"), ("new_deep", "mamba2"), ("new_shallow", "qwen3"),
                                             ("new_deep", "qwen3"), ("new_shallow", "nemotron_h"),
                                             ("new_deep", "llama")])
def test_forward_backward(donors, placement, kind):
    model, _ = shorthand(donors["llama"], placement, kind)
    assert model.config.layer_kinds.count(kind) >= 2
    model.train()
    ids, mask = batch()
    labels = ids.masked_fill(mask == 0, -100)
    out = model(input_ids=ids, attention_mask=mask, labels=labels)
    # the loss is next-token cross-entropy over the real tokens (reference computed here)
    logits = out.logits[:, :-1].reshape(-1, out.logits.shape[-1])
    tgt = labels[:, 1:].reshape(-1)
    ref = torch.nn.functional.cross_entropy(logits, tgt, ignore_index=-100)
    torch.testing.assert_close(out.loss, ref)
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert torch.isfinite(p.grad).all(), name
    layers_with_grad = [i for i, l in enumerate(model.model.layers)
                        if any(p.grad is not None and p.grad.abs().sum() > 0 for p in l.parameters())]
    assert layers_with_grad == list(range(LAYERS))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3", "mamba2", "nemotron_h"])
def test_hybrid_of_donor_layers_reproduces_donor(donors, arch):
    """Two segments that re-assemble a donor's own layers give the donor's logits (masks, rotary,
    sliding windows, recurrent masks, NemotronH block types and Gemma's scaled embeddings included)."""
    model, _ = build([{"donor": donors[arch], "layers": [0, 2], "trainable": True},
                      {"donor": donors[arch], "layers": [2, LAYERS], "trainable": False}], donors[arch])
    donor = load_donor(donors[arch])
    ids, mask = batch(1)
    with torch.no_grad():
        ref = donor(input_ids=ids[:1]).logits
        got = model(input_ids=ids[:1]).logits
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-4)
        if arch != "gemma3":  # padded rows: compare the real positions (Gemma's bidirectional pad rules differ)
            ref_p = donor(input_ids=ids, attention_mask=mask, position_ids=_positions(mask)).logits
            got_p = model(input_ids=ids, attention_mask=mask).logits
            torch.testing.assert_close(got_p[mask.bool()], ref_p[mask.bool()], atol=1e-5, rtol=1e-4)


def _positions(mask):
    return (mask.cumsum(-1) - 1).clamp(min=0)


def test_copied_donor_layer_same_output_as_in_donor(donors):
    """Donor layer 3 sits at hybrid index 3 of new_shallow; fed the donor's own input to that layer
    (recorded by a raw forward hook on the donor) it returns the donor's output exactly."""
    from raycpt.models.stack import LayerStack

    model, _ = shorthand(donors["llama"], "new_shallow", "mamba2")
    donor = load_donor(donors["llama"])
    seen = {}

    def grab(module, args, kwargs, output):
        seen["in"] = args[0] if args else kwargs["hidden_states"]
        seen["out"] = output[0] if isinstance(output, tuple) else output

    ids, _ = batch(2)
    h = donor.model.layers[3].register_forward_hook(grab, with_kwargs=True)
    with torch.no_grad():
        donor(input_ids=ids)
    h.remove()
    stack = LayerStack(model)
    with torch.no_grad():
        tr = stack.trace(ids)
        out = stack.run_layer(3, seen["in"], tr)
    assert torch.equal(out, seen["out"])
    for (n1, p1), (n2, p2) in zip(model.model.layers[3].named_parameters(), donor.model.layers[3].named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)


# ------------------------------------------------------------------------------------------------ save / load / stack

def test_save_load_identical_logits(donors, tmp_path):
    from transformers import AutoModelForCausalLM

    from raycpt.models.hybrid.build import save_hybrid

    model, tok = shorthand(donors["llama"], "new_deep", "nemotron_h")
    folder = save_hybrid(model, tok, tmp_path / "hyb")
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    again = AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(again).__name__ == "RaycptHybridForCausalLM"
    ids, mask = batch(3)
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids, attention_mask=mask).logits,
                           again(input_ids=ids, attention_mask=mask).logits)
    assert again.config.trainable_layers == [0, 1]  # new_deep: the donor's shallow layers train
    assert [s["kind"] for s in again.config.segments] == ["llama", "nemotron_h"]


def test_fresh_process_loads_hybrid_without_remote_code(donors, tmp_path):
    """A new process that only imports ``raycpt.models`` (as Ray workers and lm-eval callers do)
    loads a saved hybrid with plain AutoModelForCausalLM; and importing it stays cheap."""
    from raycpt.models.hybrid.build import save_hybrid

    model, tok = shorthand(donors["llama"], "new_shallow", "mamba2")
    folder = save_hybrid(model, tok, tmp_path / "hyb")
    code = ("import sys, importlib.util, raycpt.models.sources as s; "
            "cheap = 'transformers.modeling_utils' not in sys.modules; "
            "importlib.util.find_spec('transformers.models.auto.configuration_auto'); "  # a probe must not use it up
            "from transformers import AutoModelForCausalLM; "
            f"m = AutoModelForCausalLM.from_pretrained({str(folder)!r}, trust_remote_code=False); "
            "print(type(m).__name__, cheap)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-2:] == ["RaycptHybridForCausalLM", "True"]


@pytest.mark.parametrize("kind", ["mamba2", "qwen3"])
def test_layerstack_trace_and_run_from(donors, kind):
    from raycpt.models.stack import LayerStack

    model, _ = shorthand(donors["llama"], "new_shallow", kind)
    stack = LayerStack(model)
    assert stack.num_layers == LAYERS and stack.tied_embeddings
    assert stack.decoder is model.model and stack.layers is model.model.layers
    ids, mask = batch(4)
    with torch.no_grad():
        tr = stack.trace(ids, mask)
        assert torch.equal(stack.lens(tr.hidden[-1]), tr.logits)
        for i in range(-1, LAYERS):
            torch.testing.assert_close(stack.run_from(i, tr.hidden[i + 1], tr), tr.logits, atol=1e-5, rtol=1e-5)
        # repeated batch (k = 2) with one position per row
        h2 = torch.cat([tr.hidden[2], tr.hidden[2]])
        pos = torch.tensor([SEQ - 1] * 4)
        got = stack.run_from(1, h2, tr, positions=pos)
        torch.testing.assert_close(got, torch.cat([tr.logits[:, -1], tr.logits[:, -1]]), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------------ generate

@pytest.mark.parametrize("kind", ["mamba2", "qwen3"])
def test_generate_matches_naive_greedy_loop(donors, kind):
    model, _ = shorthand(donors["llama"], "new_deep", kind)
    ids, mask = batch(5)
    prompt = ids[:1]
    ref = prompt.clone()
    with torch.no_grad():
        for _ in range(6):  # naive greedy loop: full forward, argmax of the last position
            nxt = model(input_ids=ref).logits[:, -1].argmax(-1, keepdim=True)
            ref = torch.cat([ref, nxt], dim=1)
        seen = []
        h = model.register_forward_pre_hook(lambda m, a, k: seen.append(k.get("logits_to_keep")), with_kwargs=True)
        got = model.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None)
        h.remove()
        assert torch.equal(got, ref)
        assert seen == [1] * 6  # no cache: 6 full-prefix forwards, the head on the last position only
        # the same prompt left-padded inside a batch generates the same tokens
        short = prompt[:, 3:]
        single = model.generate(short, max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
        both = torch.stack([prompt[0], torch.cat([torch.zeros(3, dtype=torch.long), short[0]])])
        m2 = torch.stack([torch.ones(SEQ, dtype=torch.long), torch.cat([torch.zeros(3), torch.ones(SEQ - 3)]).long()])
        out = model.generate(both, attention_mask=m2, max_new_tokens=5, do_sample=False, pad_token_id=0,
                             eos_token_id=None)
        assert torch.equal(out[1, SEQ:], single[0, SEQ - 3:])
        assert torch.equal(out[0], got[0, :SEQ + 5])


# ------------------------------------------------------------------------------------------------ training

def test_training_step_leaves_frozen_segments_bitwise_unchanged(donors, tmp_path):
    """Two optimizer steps of the project's training loop (no Ray) with the hybrid's plan."""
    from raycpt.config import ExperimentConfig, PlanConfig, TrainConfig, config_to_dict
    from raycpt.models.hybrid.build import hybrid_plan, save_hybrid
    from raycpt.strategies import build_plan
    from raycpt.train.worker.loop import run_loop
    from worker_specs import worker_spec
    from raycpt.train.worker.session import LocalSession
    from safetensors.torch import load_file

    model, tok = shorthand(donors["llama"], "new_shallow", "mamba2")
    folder = save_hybrid(model, tok, tmp_path / "hyb")
    plan = build_plan(PlanConfig(**hybrid_plan(model)), LAYERS, tied_embeddings=True)
    assert plan.trainable_layers == (0, 1) and not plan.train_embeddings
    cfg = ExperimentConfig(train=TrainConfig(max_steps=2, micro_batch_size=2, lr=1e-2, warmup_ratio=0.0,
                                             checkpoint_every=2))
    blocks = np.random.default_rng(0).integers(4, 128, size=(8, 16))
    session = LocalSession(blocks, tmp_path / "ckpts")
    run_loop(worker_spec({"cfg": config_to_dict(cfg), "model_path": str(folder), "plan": plan.to_dict(), "run_dir": None,
              "mlflow": None, "torch_threads": 1}), session)
    ckpt = session.reports[-1][1]
    after = load_file(str(Path(ckpt) / "model" / "model.safetensors"))
    before = load_file(str(folder / "model.safetensors"))
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    for k in before:
        if k.startswith("model.layers.2.") or k.startswith("model.layers.3.") or "embed" in k or k.startswith("model.norm"):
            assert k not in changed, k  # frozen: bitwise unchanged
    assert any(k.startswith("model.layers.0.") for k in changed) and any(k.startswith("model.layers.1.") for k in changed)


# ------------------------------------------------------------------------------------------------ errors

def test_bad_specs_raise_one_clear_error(donors):
    from raycpt.models.hybrid.plans import plan_hybrid

    with pytest.raises(RaycptError, match="hidden size 64 .* has 32"):
        plan_hybrid([{"donor": donors["wide"], "layers": [0, 2]}], donors["llama"])
    with pytest.raises(RaycptError, match="unknown layer kind"):
        plan_hybrid([{"new": "mamba7", "count": 2}], donors["llama"])
    with pytest.raises(RaycptError, match=r"outside donor .* which has 4 layers"):
        plan_hybrid([{"donor": donors["llama"], "layers": [2, 9]}], donors["llama"])
    with pytest.raises(RaycptError, match="at least one segment"):
        plan_hybrid([], donors["llama"])
    with pytest.raises(RaycptError, match="hidden size 48"):
        plan_hybrid([{"new": "mamba2", "count": 2, "config": {"hidden_size": 48}}], donors["llama"])
    with pytest.raises(RaycptError, match=r"not a valid mamba2 config: .*num_heads \* head_dim"):
        plan_hybrid([{"new": "mamba2", "count": 2, "config": {"num_heads": 7}}], donors["llama"])


# ------------------------------------------------------------------------------------------------ CLI

def _yaml(tmp_path, donors, hybrid: dict, name="h.yaml") -> str:
    import yaml

    data = {"name": "t", "model": {"ref": donors["llama"]}, "tracking": {"run_root": str(tmp_path / "runs")},
            "hybrid": hybrid}
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_cli_hybrid_build_prints_segment_map(donors, tmp_path, capsys):
    from raycpt.entry import main

    cfg = _yaml(tmp_path, donors, {"depth": 4, "new_kind": "qwen3"})
    assert main(["hybrid", "build", cfg, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    donor = load_donor(donors["llama"])
    layer_params = sum(p.numel() for p in donor.model.layers[0].parameters())
    assert "qwen3-llama (new_shallow)" in out and "llama-qwen3 (new_deep)" in out
    assert f"{2 * layer_params:,}" in out  # two copied donor layers (a qwen3 layer differs: q/k norms)
    for b in ("new_shallow", "new_deep"):
        assert (tmp_path / "out" / b / "model.safetensors").is_file()
        assert (tmp_path / "out" / b / "segment_map.json").is_file()


@pytest.mark.parametrize("hybrid, overrides, expected", [
    ({"builds": ["custom"], "segments": [{"donor": "WIDE", "layers": [0, 2]}]}, [],
     "hidden size 64 but the head donor"),
    ({"new_kind": "mamba7"}, [], "unknown layer kind; known kinds:"),
    ({"builds": ["custom"], "segments": [{"donor": None, "layers": [2, 9], "trainable": False}]}, [],
     "outside donor"),
    ({"builds": ["custom"]}, [], "hybrid.segments=[]"),
    ({}, ["hybrid.depth=12"], "needs 6 donor layers but the donor has 4"),
])
def test_cli_bad_hybrid_specs_exit_2_with_one_line(donors, tmp_path, capsys, hybrid, overrides, expected):
    """Each bad spec ends `hybrid build` and `hybrid run` with one line and exit 2, before any run starts."""
    from raycpt.entry import main

    for command in ("build", "run"):
        _bad_spec(main, donors, tmp_path, capsys, hybrid, overrides, expected, command)


def _bad_spec(main, donors, tmp_path, capsys, hybrid, overrides, expected, command):

    segs = [dict(s, donor=donors["wide"] if s.get("donor") == "WIDE" else s.get("donor"))
            for s in hybrid.get("segments", [])]
    cfg = _yaml(tmp_path, donors, {**hybrid, "segments": segs})
    assert main(["hybrid", command, cfg, *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and expected in err, err
    assert not (tmp_path / "runs" / "mlflow.db").exists()  # nothing started: no MLflow store, no run


# ------------------------------------------------------------------------------------------------ init: identity

def _donor_only(path, a: int, b: int):
    """The donor's layers [a, b) alone with the donor's embeddings, final norm and head, built by hand:
    the donor's own class with ``num_hidden_layers = b - a`` and its state dict re-indexed."""
    import re

    donor = load_donor(path)
    data = donor.config.to_dict()
    data["num_hidden_layers"] = b - a
    if data.get("layer_types"):
        data["layer_types"] = data["layer_types"][a:b]
    model = type(donor)(type(donor.config).from_dict(data))
    sd = {}
    for k, v in donor.state_dict().items():
        m = re.match(r"model\.layers\.(\d+)\.(.*)", k)
        if m is None:
            sd[k] = v
        elif a <= int(m[1]) < b:
            sd[f"model.layers.{int(m[1]) - a}.{m[2]}"] = v
    model.load_state_dict(sd, strict=True)
    return model.eval()


_MOE = {"chunk_size": 16, "layers_block_type": ["moe", "full_attention"], "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "moe_shared_expert_intermediate_size": 16,
        "n_group": 1, "topk_group": 1}


@pytest.mark.parametrize("arch, placement, kind, config", [
    ("llama", "new_shallow", "mamba2", None), ("llama", "new_deep", "mamba2", None),
    ("llama", "new_deep", "qwen3", None), ("llama", "new_shallow", "nemotron_h", None),
    ("llama", "new_shallow", "nemotron_h", _MOE), ("gemma3", "new_deep", "gemma3_text", None),
    ("qwen3", "new_shallow", "llama", None)])
def test_identity_init_first_loss_is_the_donor_layers_alone(donors, arch, placement, kind, config):
    """hybrid.init=identity: before training, the hybrid's loss equals that of a model made of its donor
    layers alone (rel. 1e-5); fresh init gives a different loss (the check can fail)."""
    from raycpt.models.hybrid.build import build_hybrid
    from raycpt.models.hybrid.plans import plan_hybrid, shorthand_segments

    if config is None:
        config = {"chunk_size": 16} if kind in ("mamba2", "nemotron_h") else {}
    a, b = (2, LAYERS) if placement == "new_shallow" else (0, 2)
    ref = _donor_only(donors[arch], a, b)
    ids, _ = batch(6)
    with torch.no_grad():
        want = float(ref(input_ids=ids, labels=ids).loss)
    losses = {}
    for init in ("identity", "fresh"):
        segs = shorthand_segments(placement, donors[arch], LAYERS, LAYERS, kind, config, init_seed=3, init=init)
        model, _ = build_hybrid(plan_hybrid(segs, donors[arch], name=placement))
        assert model.config.layer_kinds.count(kind) >= 2
        with torch.no_grad():
            losses[init] = float(model(input_ids=ids, labels=ids).loss)
    assert abs(losses["identity"] - want) <= 1e-5 * abs(want), (losses, want)
    # fresh fails the same check (seen here: rel. 1.3e-4 to 6e-3 on these near-uniform tiny models)
    assert abs(losses["fresh"] - want) > 1e-5 * abs(want), (losses, want)


def test_identity_init_zeroes_only_the_residual_writes(donors):
    """The zeroed tensors are exactly the new layers' output projections; everything else keeps the
    architecture's init (the same seed gives the same tensors as a fresh build)."""
    shallow = {init: shorthand_segments_build(donors["llama"], init) for init in ("identity", "fresh")}
    ident, fresh = (dict(m.model.layers[:2].named_parameters()) for m in (shallow["identity"], shallow["fresh"]))
    zeroed = sorted(n for n, p in ident.items() if not torch.equal(p, fresh[n]))
    assert zeroed == ["0.mixer.out_proj.weight", "1.mixer.out_proj.weight"]
    assert all(float(ident[n].detach().abs().sum()) == 0.0 for n in zeroed)
    assert shallow["identity"].config.segments[0]["init"] == "identity"


def shorthand_segments_build(donor, init):
    from raycpt.models.hybrid.build import build_hybrid
    from raycpt.models.hybrid.plans import plan_hybrid, shorthand_segments

    segs = shorthand_segments("new_shallow", donor, LAYERS, LAYERS, "mamba2", {"chunk_size": 16}, init_seed=3,
                              init=init)
    return build_hybrid(plan_hybrid(segs, donor, name="new_shallow"))[0]


def test_bad_init_is_one_line_exit_2(donors, tmp_path, capsys):
    from raycpt.entry import main
    from raycpt.models.hybrid.plans import plan_hybrid

    cfg = _yaml(tmp_path, donors, {"depth": 4, "init": "zeros"})
    assert main(["hybrid", "build", cfg]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "hybrid.init='zeros'" in err and "identity, fresh" in err, err
    with pytest.raises(RaycptError, match=r"hybrid.segments\[0\].init='zero': unknown init; use identity"):
        plan_hybrid([{"new": "mamba2", "count": 2, "init": "zero"}], donors["llama"])
