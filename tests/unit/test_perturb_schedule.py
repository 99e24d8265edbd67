"""The shared-context perturbation schedule against the stacked one (and, in test_trace_metrics,
against a naive per-prompt reference), on tiny random models of every supported architecture.

The batch mixes two prefixes (BOS, and BOS + two extra tokens before s1), right-padded prompts of
different context and query lengths, one prompt whose prefix no other prompt shares and one whose
context is not contiguous (both take the stacked path inside the same batch). Both attention
implementations (eager, sdpa) are checked in float32: the shared schedule lays keys out at the
batch's full width, so every attention call reduces over the clean pass's key layout; P_t and JS
agree within 1e-6 absolute, and dJS within 1e-6 with eager. With sdpa a few dJS entries of the
second prefix group still differ by float32 rounding (seen: 1.0e-6 absolute on a value of 1.36,
7e-7 relative: dJS divides a JS difference of ~1e-10 by JS + eps), so dJS is held to 1e-6
relative there (rtol 1e-5 leaves a margin).
"""

import numpy as np
import pytest
import torch

from raycpt.diagnostics.perturb import perturbed_logits, plan_shared_context
from raycpt.diagnostics.prompts import EncodedPrompt, PromptRecord, collate, encode_prompts
from raycpt.diagnostics.tracer import trace_batch
from raycpt.models.stack import LayerStack
from tiny import tiny_model, tiny_tokenizer

RECORDS = [
    PromptRecord("Example: hot->Cold, big->Small;", " Query: fast->", "a"),
    PromptRecord("Example: up->Down;", " Query: in->", "a"),
    PromptRecord("Example: big->Large, quick->Fast, end->Finish;", " Query: begin->", "s"),
    PromptRecord("Ex: a->B;", " Q: c->", "s"),
    PromptRecord("Example: day->Night, wet->Dry;", " Query: good->", "a"),
]


def _shifted(e: EncodedPrompt, prefix: list[int], index: int) -> EncodedPrompt:
    """The same prompt with extra tokens after BOS (a different prefix before s1)."""
    k = len(prefix)
    return EncodedPrompt(index=index, group=e.group, input_ids=e.input_ids[:1] + prefix + e.input_ids[1:],
                         context=[p + k for p in e.context], query=[p + k for p in e.query], last=e.last + k)


def mixed_prompts() -> list[EncodedPrompt]:
    enc = encode_prompts(RECORDS, tiny_tokenizer())
    out = list(enc[:3])                                                    # prefix [BOS]
    out += [_shifted(e, [40, 41], 10 + i) for i, e in enumerate(enc[2:5])]  # prefix [BOS, 40, 41]
    out.append(_shifted(enc[3], [50], 20))                                 # a prefix no one else has
    hole = enc[4]                                                          # context with a hole
    out.append(EncodedPrompt(index=30, group="s", input_ids=hole.input_ids,
                             context=[p for p in hole.context if p != hole.context[3]], query=hole.query,
                             last=hole.last))
    return out


def tiny_hybrid(kind: str):
    from raycpt.models.hybrid.build import build_hybrid
    from raycpt.models.hybrid.plans import plan_hybrid, shorthand_segments
    import tempfile

    from tiny import save_tiny

    donor = str(save_tiny(tempfile.mkdtemp(prefix="i18-donor-"), "llama", 4, 32, seed=1))
    config = {"chunk_size": 16} if kind == "mamba2" else {}
    segs = shorthand_segments("new_shallow", donor, 4, 4, kind, config, init_seed=3)
    model, _ = build_hybrid(plan_hybrid(segs, donor, name="new_shallow"))
    return model.eval()


# (name, builder, shares keys/values)
MODELS = [
    ("llama", lambda: tiny_model("llama", 4, 32, seed=1), True),
    ("qwen2", lambda: tiny_model("qwen2", 4, 32, seed=1), True),
    ("qwen3", lambda: tiny_model("qwen3", 4, 32, seed=1), True),
    ("gemma3", lambda: tiny_model("gemma3", 6, 32, seed=1), True),  # sliding window 4, layer 5 global
    ("mamba2", lambda: tiny_model("mamba2", 3, 32, seed=1), False),
    ("nemotron_h", lambda: tiny_model("nemotron_h", 3, 32, seed=1), False),
    ("hybrid_llama_qwen3", lambda: tiny_hybrid("qwen3"), True),
    ("hybrid_llama_mamba2", lambda: tiny_hybrid("mamba2"), False),
]


@pytest.fixture(scope="module")
def prompts():
    return mixed_prompts()


def test_layout_by_hand(prompts):
    batch = collate(prompts, 0)
    lay = plan_shared_context(batch["input_ids"], batch["context_mask"], batch["last"])
    assert lay.eligible == [0, 1, 2, 3, 4, 5] and lay.fallback == [6, 7]
    ends = [prompts[b].context[-1] + 1 for b in range(6)]
    # group 0: prefix [BOS], c0 = 1, longest context = prompt 2; group 1: prefix [BOS, 40, 41], c0 = 3
    assert lay.groups == [(2, 1, ends[2]), (3, 3, ends[3])]
    assert lay.group_of.tolist() == [0, 0, 0, 1, 1, 1]
    assert lay.start.tolist() == ends
    assert lay.length.tolist() == [prompts[b].last - ends[b] + 1 for b in range(6)]
    assert lay.pos[0, :lay.length[0]].tolist() == list(range(ends[0], prompts[0].last + 1))
    assert int(lay.pos.max()) == batch["input_ids"].shape[1] - 1  # padding entries clamped into the batch


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name,build,shares", MODELS, ids=[m[0] for m in MODELS])
def test_shared_context_equals_stacked(prompts, name, build, shares, attn):
    model = build()
    if shares:
        model.set_attn_implementation(attn)
        for m in model.modules():  # the hybrid keeps one config per segment
            if type(m).__name__.endswith("Attention"):
                m.config._attn_implementation = attn
    elif attn == "sdpa":
        pytest.skip("recurrent models: one attention setting is enough")
    stack = LayerStack(model)
    batch = collate(prompts, 0)
    with torch.inference_mode():
        blocker = stack.kv_reuse_blocker(stack.trace(batch["input_ids"], batch["attention_mask"]))
    assert (blocker is None) == shares, blocker
    if name == "gemma3":
        windows = [len(p.context) for p in prompts]
        assert min(windows) > model.config.sliding_window  # the window cuts into the cached context
    ref = trace_batch(stack, batch, top_k=10, schedule="stacked")
    got = trace_batch(stack, batch, top_k=10, schedule="shared_context")
    assert np.array_equal(got["t_star"], ref["t_star"])
    np.testing.assert_allclose(got["p_t"], ref["p_t"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(got["js"], ref["js"], rtol=0, atol=1e-6)
    # sdpa rounds differently for the differently shaped calls of the two schedules: dJS (a JS difference
    # divided by JS + eps) then moves by up to ~2e-6 absolute / 4e-5 relative (seen under load); eager stays 1e-6
    np.testing.assert_allclose(got["djs"], ref["djs"], rtol=0 if attn == "eager" else 1e-4,
                               atol=1e-6 if attn == "eager" else 5e-6)
    assert (ref["js"][:, :-1] > 1e-9).mean() > 0.5  # the perturbation does something


def _rows_through_blocks(stack, fn) -> int:
    """Positions x rows that went through the decoder blocks while ``fn`` ran."""
    count = [0]

    def hook(module, args, kwargs):
        h = args[0] if args else kwargs["hidden_states"]
        count[0] += h.shape[0] * h.shape[1]

    handles = [layer.register_forward_pre_hook(hook, with_kwargs=True) for layer in stack.layers]
    try:
        fn()
    finally:
        for h in handles:
            h.remove()
    return count[0]


def test_shared_context_runs_the_context_once_per_group(prompts):
    stack = LayerStack(tiny_model("llama", 4, 32, seed=1))
    batch = collate(prompts[:6], 0)  # the two groups only
    n = stack.num_layers
    with torch.inference_mode():
        tr = stack.trace(batch["input_ids"], batch["attention_mask"])

        def run(schedule):
            return lambda: [None for _ in perturbed_logits(stack, tr, batch["context_mask"], batch["last"],
                                                           schedule=schedule, input_ids=batch["input_ids"])]

        stacked = _rows_through_blocks(stack, run("stacked"))
        shared = _rows_through_blocks(stack, run("shared_context"))
    seq = batch["input_ids"].shape[1]
    blocks = n * (n + 1) // 2  # perturbation i runs blocks i+1..N-1
    assert stacked == blocks * 6 * seq
    # per group: one row of prefix + zeroed context, run at the batch's width (the clean pass's key
    # layout); per prompt: its suffix, padded to the longest one
    width = max(p.last - p.context[-1] for p in prompts[:6])
    assert shared == blocks * (2 * seq + 6 * width)
    assert shared < stacked


def test_unknown_schedule_is_rejected(prompts):
    stack = LayerStack(tiny_model("llama", 2, 32, seed=1))
    with pytest.raises(ValueError, match="unknown schedule 'fast'"):
        trace_batch(stack, collate(prompts[:2], 0), schedule="fast")


def test_config_choice(tmp_path):
    from raycpt.config import ConfigError, load_config

    assert load_config(None, []).trace.schedule == "shared_context"
    assert load_config(None, ["trace.schedule=stacked"]).trace.schedule == "stacked"
    with pytest.raises(ConfigError, match="trace.schedule"):
        load_config(None, ["trace.schedule=fast"])
