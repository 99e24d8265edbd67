"""The shared-context perturbation schedule against the stacked one (and, in test_trace_metrics,
against a naive per-prompt reference), on tiny random models of every supported architecture.

The batch mixes two prefixes (BOS, and BOS + two extra tokens before s1), right-padded prompts of
different context and query lengths, one prompt whose prefix no other prompt shares and one whose
context is not contiguous (both take the stacked path inside the same batch). Both attention
implementations (eager, sdpa) are checked in float32: the shared schedule lays keys out at the
batch's full width, so every attention call reduces over the clean pass's key layout; P_t and JS
agree within 1e-6 absolute. A few dJS entries still differ by float32 rounding (seen: 1.0e-6
absolute on a value of 1.36 with sdpa, 1.8e-6 on 1.51 with eager: dJS divides a JS difference of
~1e-10 by JS + eps), so dJS is held relative as well (eager rtol 1e-5, sdpa 1e-4).
"""

import numpy as np
import pytest
import torch

from raycpt.diagnostics.perturb import SUFFIX_CALL_COST, length_buckets, perturbed_logits, plan_shared_context
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
    # both round differently for the differently shaped calls of the two schedules (the shared one runs
    # one call per suffix length bucket): dJS (a JS difference divided by JS + eps) then moves by up to
    # ~2e-6 absolute / 4e-5 relative with sdpa (seen under load), 1.8e-6 absolute / 1.2e-6 relative with
    # eager (gemma3, on a value of 1.51)
    np.testing.assert_allclose(got["djs"], ref["djs"], rtol=1e-5 if attn == "eager" else 1e-4,
                               atol=1e-6 if attn == "eager" else 5e-6)
    assert (ref["js"][:, :-1] > 1e-9).mean() > 0.5  # the perturbation does something


def _positions_through_mlps(stack, fn) -> int:
    """Positions x rows that went through a decoder block's MLP (its work after attention) while ``fn`` ran."""
    count = [0]

    def hook(module, args):
        count[0] += args[0].shape[:-1].numel()

    handles = [layer.mlp.register_forward_pre_hook(hook) for layer in stack.layers]
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

        stacked = _positions_through_mlps(stack, run("stacked"))
        shared = _positions_through_mlps(stack, run("shared_context"))
    seq = batch["input_ids"].shape[1]
    blocks = n * (n + 1) // 2  # perturbation i runs blocks i+1..N-1; n of them run the last block
    assert stacked == blocks * 6 * seq
    # per group: one row of prefix + zeroed context, run at the batch's width (the clean pass's key
    # layout); per prompt: its suffix, in calls padded to their longest prompt at the least cost, and in
    # the last block's MLP only its traced position
    lengths = [p.last - p.context[-1] for p in prompts[:6]]
    padded = _least_padded(lengths, SUFFIX_CALL_COST)[0]
    assert shared == blocks * 2 * seq + (blocks - n) * padded + n * 6
    assert shared < stacked


def _partitions(items: list) -> list[list[list]]:
    """Every set partition of ``items`` (Bell(6) = 203 for six)."""
    if not items:
        return [[]]
    first, rest = items[0], items[1:]
    out = []
    for part in _partitions(rest):
        out.append([[first]] + part)
        for k in range(len(part)):
            out.append(part[:k] + [[first] + part[k]] + part[k + 1:])
    return out


def _least_padded(lengths: list[int], call_cost: float) -> tuple[int, float]:
    """Brute force over every partition of the rows: (padded positions, cost) of the cheapest."""
    best = min(_partitions(list(range(len(lengths)))),
               key=lambda part: sum(len(c) * max(lengths[r] for r in c) + call_cost for c in part))
    padded = sum(len(c) * max(lengths[r] for r in c) for c in best)
    return padded, padded + call_cost * len(best)


@pytest.mark.parametrize("seed", range(30))
def test_length_buckets_cost_the_least(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=int(rng.integers(1, 8))).tolist()
    call_cost = float(rng.choice([0, 1, 4, 20]))
    calls = length_buckets(lengths, call_cost)
    assert sorted(r for c in calls for r in c) == list(range(len(lengths)))  # each row in exactly one call
    cost = sum(len(c) * max(lengths[r] for r in c) + call_cost for c in calls)
    assert cost == pytest.approx(_least_padded(lengths, call_cost)[1])


def test_length_buckets_by_hand():
    assert length_buckets([4] * 15 + [6], 4) == [list(range(15)), [15]]  # 60 + 6 + 8 < 96 + 4
    assert length_buckets([5, 4, 4, 4], 4) == [[0, 1, 2, 3]]  # 20 + 4 < 12 + 5 + 8


@pytest.mark.parametrize("arch,shared_rows", [("llama", 1), ("qwen2", None)])
def test_equal_trajectories_run_once(prompts, arch, shared_rows):
    """With no prefix (the context starts at position 0, as SmolLM2's prompts without a BOS do) every
    trajectory starts as a zero state. Llama's blocks have no biases and map 0 to 0, so one trajectory
    row serves all perturbations at every block; Qwen2's q/k/v biases move it, so none is shared.
    Both give the stacked schedule's numbers."""
    stripped = [EncodedPrompt(index=e.index, group=e.group, input_ids=e.input_ids[1:],
                              context=[p - 1 for p in e.context], query=[p - 1 for p in e.query], last=e.last - 1)
                for e in prompts[:3]]
    batch = collate(stripped, 0)
    model = tiny_model(arch, 4, 32, seed=1)
    biases = [m.bias for m in model.modules() if isinstance(m, torch.nn.Linear) and m.bias is not None]
    assert bool(biases) == (arch == "qwen2")
    with torch.no_grad():  # transformers starts biases at 0, which would map 0 to 0 as well
        for b in biases:
            b.normal_(0, 0.1, generator=torch.Generator().manual_seed(2))
    stack = LayerStack(model)
    n, seq = stack.num_layers, batch["input_ids"].shape[1]
    with torch.inference_mode():
        tr = stack.trace(batch["input_ids"], batch["attention_mask"])
        lay = plan_shared_context(batch["input_ids"], batch["context_mask"], batch["last"])
        assert [g[1] for g in lay.groups] == [0] and lay.fallback == []
        total = _positions_through_mlps(stack, lambda: list(perturbed_logits(
            stack, tr, batch["context_mask"], batch["last"], schedule="shared_context", input_ids=batch["input_ids"])))
    blocks = n * (n + 1) // 2
    padded = _least_padded([e.last - e.context[-1] for e in stripped], SUFFIX_CALL_COST)[0]
    trajectory_rows = n if shared_rows == 1 else blocks  # block j runs 1 row, or every active perturbation's
    assert total == (blocks - n) * padded + n * 3 + trajectory_rows * seq
    ref = trace_batch(stack, batch, top_k=10, schedule="stacked")
    got = trace_batch(stack, batch, top_k=10, schedule="shared_context")
    np.testing.assert_allclose(got["js"], ref["js"], rtol=0, atol=1e-6)
    assert (ref["js"][:, :-1] > 1e-9).mean() > 0.5


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


@pytest.mark.parametrize("arch,layers", [("llama", 4), ("gemma3", 6), ("qwen3", 4)])
def test_reading_one_position_is_the_whole_block(prompts, arch, layers):
    """``run_suffix_block(read=...)`` (the last block: the MLP on the read positions only) gives, at
    those positions, the whole block's output: every position still goes through attention and the MLP
    is position-wise. Gemma 3 adds norms around its MLP. Not always to the bit: a matrix product over
    fewer rows may take another kernel (these 32-wide models differ by float32 rounding; SmolLM2-135M's
    shapes gave the same bits in benchmarks/bench_trace.py's float32 line)."""
    stack = LayerStack(tiny_model(arch, layers, 32, seed=1))
    batch = collate(prompts[:3], 0)
    j = stack.num_layers - 1
    with torch.inference_mode():
        tr = stack.trace(batch["input_ids"], batch["attention_mask"])
        width = batch["input_ids"].shape[1]
        _, k, v = stack.run_prefix_block(j, tr.hidden[j][:1], tr, 0, width)
        rows = torch.tensor([0, 1, 2])
        lengths = torch.tensor([4, 2, 3])
        pos = torch.tensor([[5, 6, 7, 8]] * 3)
        hidden = tr.hidden[j][rows[:, None], pos]
        past = (k.expand(3, *k.shape[1:]), v.expand(3, *v.shape[1:]))
        whole = stack.run_suffix_block(j, hidden, tr, rows, pos, lengths, *past)
        read = stack.run_suffix_block(j, hidden, tr, rows, pos, lengths, *past, read=lengths - 1)
    assert read.shape == (3, whole.shape[-1])
    torch.testing.assert_close(read, whole[torch.arange(3), lengths - 1], rtol=1e-5, atol=1e-6)
    assert not torch.equal(read, hidden[torch.arange(3), lengths - 1])  # the block did something
