"""The memory estimate under FSDP2 and bf16: the paper's Qwen3-0.6B shape, the bf16 activation bytes against
autograd's own saved tensors at real layer sizes, FSDP's gathered buffers by hand, one-worker FSDP refused."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import transformers as T

from raycpt.config import PlanConfig, TrainConfig, load_config
from raycpt.errors import RaycptError
from raycpt.strategies import apply_plan, build_plan
from raycpt.train.driver.memory import estimate_memory, layer_activation_bytes, model_shape
from raycpt.train.worker.parallel import check_parallel
from raycpt.train.worker.step_options import loss_chunk_tokens

QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
                 tie_word_embeddings=True)


def _cli(*args):
    exe = [sys.executable, "-c", "import sys; from raycpt.entry import _entry; sys.argv[0] = 'raycpt'; _entry()"]
    return subprocess.run(exe + list(args), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def qwen06(tmp_path_factory):
    """A folder with Qwen3-0.6B-Base's config only: the estimate needs the shape, not the weights."""
    d = tmp_path_factory.mktemp("qwen3-0.6b")
    T.Qwen3Config(**QWEN3_06B).save_pretrained(d)
    return d


def test_plan_show_of_the_cluster_config_under_fsdp_fits_an_h200_with_the_chunked_loss(qwen06):
    cfg = load_config("configs/qwen3-0.6b.yaml")
    assert cfg.train.device_memory_gb == 141  # the pre-launch check runs on a CPU head too
    r = _cli("plan", "show", "configs/qwen3-0.6b.yaml", "train.distributed=fsdp", f"model.ref={qwen06}",
             "plan.name=full", "eval.tasks=wordnet_mc")
    assert r.returncode == 0, r.stderr
    line = next(x for x in r.stdout.splitlines() if x.startswith("memory: plan full"))
    total = float(line.split("per worker ")[1].split(" GB")[0])
    logits = float(line.split("logits ")[1].split(",")[0])
    # the chunked loss: 1024 rows x 151,936 x 4 bytes x 3 copies = 1.9 GB plus the head's gradient
    assert total < 141 and logits < 4, line
    big = _cli("plan", "show", "configs/qwen3-0.6b.yaml", f"model.ref={qwen06}", "plan.name=full",
               "eval.tasks=wordnet_mc", "train.micro_batch_size=16")
    assert big.returncode == 2 and len(big.stderr.strip().splitlines()) == 1
    assert "plan full does not fit" in big.stderr and "> 141 GB" in big.stderr


def test_fsdp_with_one_worker_is_one_line_and_exit_2(tiny_dir):
    with pytest.raises(RaycptError, match="train.distributed=fsdp with train.num_workers=1"):
        check_parallel("fsdp", 1)
    check_parallel("fsdp", 2)
    check_parallel("ddp", 1)
    r = _cli("plan", "show", f"model.ref={tiny_dir}", "train.distributed=fsdp", "train.num_workers=1")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "FSDP shards over at least 2 workers" in r.stderr


def test_fsdp_keeps_the_chunked_loss():
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(T.Qwen3Config(**{**QWEN3_06B, "num_hidden_layers": 2}))
    t = TrainConfig(distributed="fsdp", num_workers=8, loss="auto", loss_chunk_tokens=512)
    assert loss_chunk_tokens(t, model, 8) == 512


def _saved_bytes_per_token(model, tokens=64, batch=2, frozen=False) -> float:
    """Bytes autograd saves in decoder layer 1 under CPU bf16 autocast, per token: parameters and their bf16
    casts, saved as they are or transposed (a per-layer cost, counted under weights) left out. ``frozen``: the
    layer's parameters frozen, its input still needing a gradient."""
    conf = model.config
    layer = model.model.layers[1]
    for p in layer.parameters():
        p.requires_grad_(not frozen)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {tuple(p.shape) for p in model.parameters() if p.dim() > 1}
    seen: dict[int, int] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and tuple(t.shape) not in shapes and tuple(t.shape[::-1]) not in shapes:
            seen[st.data_ptr()] = st.nbytes()
        return t

    x = torch.randn(batch, tokens, conf.hidden_size, requires_grad=True)
    pos = torch.arange(tokens)[None].expand(batch, -1)
    pe = model.model.rotary_emb(x, pos)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x, attention_mask=None, position_ids=pos, position_embeddings=pe)
    return sum(seen.values()) / (batch * tokens)


@pytest.mark.parametrize("arch, dims", [("qwen3", (1024, 3072, 16, 8, 128)), ("qwen3", (1536, 4096, 12, 4, 128)),
                                        ("llama", (2048, 5632, 32, 4, 64))])
def test_bf16_activation_bytes_match_autograd_at_real_layer_sizes(arch, dims):
    h, i, nh, nkv, hd = dims
    conf = T.AutoConfig.for_model(arch, vocab_size=64, num_hidden_layers=2, hidden_size=h, intermediate_size=i,
                                  num_attention_heads=nh, num_key_value_heads=nkv, head_dim=hd,
                                  max_position_embeddings=128)
    conf._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = T.AutoModelForCausalLM.from_config(conf).train()
    measured = _saved_bytes_per_token(model)
    assert layer_activation_bytes(model_shape(model), bf16=True) == pytest.approx(measured, rel=0.01)
    frozen = _saved_bytes_per_token(model, frozen=True)
    assert layer_activation_bytes(model_shape(model), bf16=True, frozen=True) == pytest.approx(frozen, rel=0.01)
    if dims[0] == 1024:  # the number: ~81 KiB per token per trainable Qwen3-0.6B layer
        assert measured / 1024 == pytest.approx(81.2, abs=0.5)


def test_fsdp_gathered_buffers_by_hand():
    conf = T.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)
    with torch.device("meta"):
        model = T.AutoModelForCausalLM.from_config(conf)
    shape = model_shape(model)
    layer, total = shape.layer_params[0], shape.total_params
    plan = build_plan(PlanConfig(name="train_deep", split=0.5), 4, tied_embeddings=True)
    apply_plan(model, plan)
    kw = dict(seq_len=32, micro_batch=3, world_size=4, distributed="fsdp")
    fp32 = estimate_memory(shape, plan, **kw)
    root = 64_000 + 64  # tied embeddings + final norm, gathered from forward to backward
    assert fp32.terms["weights"] == 4 * total / 4 + 4 * (2 * layer + root) + 4 * layer
    bf16 = estimate_memory(shape, plan, bf16=True, **kw)
    assert bf16.terms["weights"] == 4 * total / 4 + 2 * (2 * layer + root) + (2 + 4) * layer
    assert bf16.terms["gradients"] == 4 * 2 * layer / 4  # sharded, accumulation or not
