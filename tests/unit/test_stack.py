"""LayerStack on tiny random models of every supported architecture (no download, no Ray).

References are independent of LayerStack: the model's own forward (logits and
``output_hidden_states``), a raw ``torch`` forward hook, and for the attention architectures a
naive layer-by-layer forward written here (hand-built causal / sliding-window masks, the model's
rotary table, final norm and head).
"""

from __future__ import annotations

import pytest
import torch

from raycpt.models.stack import LayerStack
from tiny import ARCHS, tiny_model

ATOL = 1e-5
SEQ = 10
ATTENTION_ARCHS = ["llama", "qwen2", "qwen3", "gemma3"]


def batch(vocab: int = 128, seed: int = 0):
    """Two rows: one full, one left-padded by 3 (pad id 0, mask 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (2, SEQ), generator=g)
    mask = torch.ones(2, SEQ, dtype=torch.long)
    ids[1, :3] = 0
    mask[1, :3] = 0
    return ids, mask


@pytest.fixture(scope="module", params=ARCHS)
def arch_model(request):
    torch.manual_seed(0)
    return request.param, tiny_model(request.param, num_layers=4, hidden=32, seed=0)


def maxdiff(a, b) -> float:
    return (a - b).abs().max().item()


def test_trace_matches_hidden_states_and_lens_matches_logits(arch_model):
    arch, model = arch_model
    stack = LayerStack(model)
    assert stack.num_layers == 4 and len(stack.layers) == 4
    ids, mask = batch()
    with torch.no_grad():
        tr = stack.trace(ids, mask)
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    assert len(tr.hidden) == stack.num_layers + 1
    assert maxdiff(tr.logits, out.logits) <= ATOL
    # transformers' hidden_states: entries 0..N-1 are pre-norm (== ours); the last one is post-norm.
    # Mamba2Model differs: it records after each block only (no embedding entry), so it is ours shifted by one.
    shift = 1 if arch == "mamba2" else 0
    assert len(out.hidden_states) == stack.num_layers + 1
    for i in range(stack.num_layers - shift):
        assert maxdiff(tr.hidden[i + shift], out.hidden_states[i]) <= ATOL, (arch, i)
    assert maxdiff(stack.final_norm(tr.hidden[-1]), out.hidden_states[-1]) <= ATOL
    with torch.no_grad():
        assert maxdiff(stack.lens(tr.hidden[-1]), out.logits) <= ATOL


def test_run_from_every_layer_equals_full_forward(arch_model):
    arch, model = arch_model
    stack = LayerStack(model)
    ids, mask = batch(seed=1)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        tr = stack.trace(ids, mask)
        last = mask.sum(1) * 0 + SEQ - 1  # left padding: the last position is real in both rows
        for i in range(-1, stack.num_layers):
            out = stack.run_from(i, tr.hidden[i + 1], tr)
            assert out.shape == full.shape
            assert maxdiff(out, full) <= ATOL, (arch, i, maxdiff(out, full))
            at = stack.run_from(i, tr.hidden[i + 1], tr, positions=last)
            assert maxdiff(at, full[:, -1]) <= ATOL, (arch, i)
            # the trace batch repeated twice (how patching runs k variants at once)
            rep = stack.run_from(i, tr.hidden[i + 1].repeat(2, 1, 1), tr)
            assert maxdiff(rep, full.repeat(2, 1, 1)) <= ATOL, (arch, i)


def _naive_forward(model, ids, mask, zero_layer=None, zero_pos=()):
    """Embeddings -> layer by layer with hand-built masks -> norm -> head; optionally zero some
    positions of one layer's output. Attention architectures only (Llama / Qwen2 / Qwen3 / Gemma3)."""
    cfg = model.config
    dec = model.model
    n = cfg.num_hidden_layers
    h = dec.embed_tokens(ids)
    pos = torch.arange(ids.shape[1])[None]
    q = torch.arange(ids.shape[1])[:, None]
    k = torch.arange(ids.shape[1])[None, :]
    allowed = (k <= q)[None] & mask.bool()[:, None, :]
    neg = torch.finfo(h.dtype).min

    def additive(ok):
        return torch.where(ok, 0.0, neg)[:, None].to(h.dtype)

    masks = {"full_attention": additive(allowed)}
    if getattr(cfg, "sliding_window", None):
        masks["sliding_attention"] = additive(allowed & (q - k < cfg.sliding_window)[None])
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * n
    gemma = cfg.model_type == "gemma3_text"
    for i, layer in enumerate(dec.layers):
        pe = dec.rotary_emb(h, pos, types[i]) if gemma else dec.rotary_emb(h, pos)
        h = layer(h, attention_mask=masks[types[i]], position_embeddings=pe, position_ids=pos)
        h = h[0] if isinstance(h, tuple) else h
        if i == zero_layer:
            h = h.clone()
            h[:, list(zero_pos)] = 0
    logits = model.lm_head(dec.norm(h))
    cap = getattr(cfg, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


@pytest.mark.parametrize("arch", ATTENTION_ARCHS)
def test_naive_forward_reference_agrees_with_the_model(arch):
    model = tiny_model(arch, num_layers=4, hidden=32, seed=0)
    ids, mask = batch(seed=2)
    with torch.no_grad():
        ours = _naive_forward(model, ids, mask)
        theirs = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    valid = mask.bool()
    assert maxdiff(ours[valid], theirs[valid]) <= ATOL


ZERO = [5, 7]


def _zero(h):
    h = h.clone()
    h[:, ZERO] = 0
    return h


@pytest.mark.parametrize("layer", [0, 2])
def test_hook_zeroes_exactly_those_positions_and_respects_causality(arch_model, layer):
    arch, model = arch_model
    stack = LayerStack(model)
    ids, mask = batch(seed=3)
    with torch.no_grad():
        clean = stack.trace(ids, mask)
        with stack.hooks([(layer, _zero)]):
            hooked = stack.trace(ids, mask)
        after = stack.trace(ids, mask)  # hooks are gone on exit

        # a raw torch forward hook doing the same thing: the independent reference for the logits
        handle = stack.layers[layer].register_forward_hook(
            lambda m, a, o: (_zero(o[0]), *o[1:]) if isinstance(o, tuple) else _zero(o))
        try:
            raw = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        finally:
            handle.remove()

    assert maxdiff(after.logits, clean.logits) == 0.0
    assert maxdiff(hooked.logits, raw) <= ATOL
    out = hooked.hidden[layer + 1]
    others = [p for p in range(SEQ) if p not in ZERO]
    assert torch.all(out[:, ZERO] == 0)
    assert maxdiff(out[:, others], clean.hidden[layer + 1][:, others]) == 0.0
    # earlier layers untouched; later layers: positions before the first zeroed one untouched
    for j in range(layer + 1):
        assert maxdiff(hooked.hidden[j], clean.hidden[j]) == 0.0
    first = min(ZERO)
    for j in range(layer + 2, stack.num_layers + 1):
        assert maxdiff(hooked.hidden[j][:, :first], clean.hidden[j][:, :first]) <= ATOL, (arch, j)
    assert maxdiff(hooked.logits[:, :first], clean.logits[:, :first]) <= ATOL
    # ...and the zeroed positions do change the output there
    assert maxdiff(hooked.logits[:, first], clean.logits[:, first]) > 1e-4


@pytest.mark.parametrize("arch", ATTENTION_ARCHS)
def test_hook_matches_naive_forward_with_zeroed_positions(arch):
    model = tiny_model(arch, num_layers=4, hidden=32, seed=0)
    stack = LayerStack(model)
    ids, mask = batch(seed=4)
    with torch.no_grad():
        with stack.hooks([(1, _zero)]):
            hooked = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        naive = _naive_forward(model, ids, mask, zero_layer=1, zero_pos=ZERO)
        clean = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    valid = mask.bool()
    assert maxdiff(hooked[valid], naive[valid]) <= ATOL
    assert maxdiff(hooked[valid], clean[valid]) > 1e-4


def test_hook_on_embeddings_and_removal_on_error():
    model = tiny_model("llama", num_layers=2)
    stack = LayerStack(model)
    ids, mask = batch()
    with torch.no_grad():
        with stack.hooks([(-1, _zero)]):
            tr = stack.trace(ids, mask)
        assert torch.all(tr.hidden[0][:, ZERO] == 0)
        with pytest.raises(RuntimeError):
            with stack.hooks([(0, _zero)]):
                raise RuntimeError("boom")
        assert not stack.layers[0]._forward_hooks and not stack.embed._forward_hooks


def test_unknown_architecture_is_a_user_error():
    import transformers as T

    from raycpt.errors import RaycptError

    model = T.GPT2LMHeadModel(T.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    with pytest.raises(RaycptError, match="unsupported architecture 'gpt2'"):
        LayerStack(model)


def test_one_architecture_table_behind_the_layer_view_the_hybrid_kinds_and_the_memory_families():
    """The layer view, the hybrid layer kinds and the memory families all come from models.stack.TABLE, so
    they cannot disagree: ``mistral`` is a hybrid kind and a memory family, and LayerStack takes it."""
    import transformers as T

    from raycpt.models.hybrid.model import KINDS
    from raycpt.models.stack import ARCHITECTURES, TABLE, LayerStack
    from raycpt.train.driver.memory import FAMILY

    assert set(KINDS) <= set(TABLE) <= set(ARCHITECTURES)
    assert {TABLE[k].name for k in FAMILY if k in TABLE} == {a.name for a in TABLE.values() if a.memory}
    conf = T.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(conf).eval()
    stack = LayerStack(model)
    assert stack.num_layers == 3 and "mistral" in KINDS and FAMILY["mistral"] == "llama"
    ids = torch.randint(0, 64, (2, 7))
    tr = stack.trace(ids)
    torch.testing.assert_close(stack.lens(tr.hidden[-1]), model(ids).logits, rtol=1e-4, atol=1e-4)


def test_layer_stack_of_is_built_once_and_rebuilt_when_the_layers_change():
    import torch.nn as nn
    from transformers import LlamaConfig, LlamaForCausalLM

    from raycpt.models.stack import LayerStack

    cfg = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                      num_attention_heads=2, num_key_value_heads=2)
    model = LlamaForCausalLM(cfg)
    a = LayerStack.of(model)
    assert LayerStack.of(model) is a and a.num_layers == 3
    assert "_raycpt_layer_stack" not in "".join(model.state_dict())  # not a submodule, not saved
    model.model.layers = nn.ModuleList(list(model.model.layers)[:2])  # a build replaced the layer list
    b = LayerStack.of(model)
    assert b is not a and b.num_layers == 2 and b.layers is model.model.layers
