"""The FLOP model (:mod:`raycpt.train.worker.throughput`) against numbers it did not produce: prime-rl's published
(tokens/s, MFU) pairs for Qwen3-0.6B on one H100, and a hand count of a tiny Qwen3's matmuls."""

import pytest
import torch
import transformers as T

from raycpt.config import PlanConfig
from raycpt.strategies import plan_for_model
from raycpt.train.worker.throughput import flops_per_token, peak_flops

# Qwen3-0.6B's architecture (its config.json): 28 layers, hidden 1024, 16 query / 8 KV heads of 128, MLP 3072,
# vocabulary 151936, tied embeddings
QWEN3_06B = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True)
# PrimeIntellect-ai/prime-rl, benchmarks/results/BENCHMARKS.md at commit 30bf494fe5b44777ee10764ba8a32b579a91f65e
# (updated 2026-02-07), section "Qwen3-0.6B", rows "SFT Full | <seq> | Recompute | FA3 | 1 | 1 | 1xH100 HBM3":
# (seq, tokens/s, MFU in %). Their PerfCounter's peak for an "H100" device name (not NVL/PCIe) is 989e12 FLOP/s
# (dense bf16, NVIDIA's data sheet); activation recomputation is not counted in their MFU, nor in ours.
PRIME_RL_H100 = [(8192, 26_010, 16.8), (16384, 25_490, 23.7)]
H100_PEAK = 989e12


def _meta_model(**shape):
    conf = T.Qwen3Config(**shape)
    with torch.device("meta"):  # shapes only: no 2.4 GB of float32 weights
        return T.AutoModelForCausalLM.from_config(conf)


@pytest.mark.parametrize("seq,tokens_per_s,mfu_pct", PRIME_RL_H100)
def test_flop_model_reproduces_prime_rls_published_mfu_for_qwen3_0_6b(seq, tokens_per_s, mfu_pct):
    model = _meta_model(**QWEN3_06B)
    full = plan_for_model(PlanConfig(name="full"), model)
    assert peak_flops("NVIDIA H100 80GB HBM3") == H100_PEAK
    mfu = 100 * tokens_per_s * flops_per_token(model, full, seq) / H100_PEAK
    # published MFU is rounded to 0.1 points (0.3% of 16.8): within 1% of it
    assert mfu == pytest.approx(mfu_pct, rel=0.01), (seq, mfu)


def test_flop_model_at_the_papers_shape_is_the_issues_4_99_gflop_per_token():
    """6 x (matmul weights + head) + 6 x layers x heads x head_dim x seq, counted from the config by hand."""
    model = _meta_model(**QWEN3_06B)
    h, heads, kv, hd, inter, layers, vocab, seq = 1024, 16, 8, 128, 3072, 28, 151936, 4096
    per_layer = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter  # q, k, v, o, gate/up/down
    by_hand = 6 * (layers * per_layer + vocab * h) + 6 * layers * heads * hd * seq
    got = flops_per_token(model, plan_for_model(PlanConfig(name="full"), model), seq)
    assert got == by_hand
    assert got / 1e9 == pytest.approx(4.99, abs=0.005)


# a tiny Qwen3: hidden 32, 4 query heads and 2 KV heads of 8, MLP 64, 4 layers, vocabulary 128, tied; seq 64
TINY = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
SEQ = 64
# one layer's forward FLOPs per token, counted by hand (2 per multiply-add):
#   q_proj 32x32, k_proj 32x16, v_proj 32x16, o_proj 32x32   -> 2 x (1024 + 512 + 512 + 1024) = 6144
#   gate_proj 32x64, up_proj 32x64, down_proj 64x32          -> 2 x (2048 + 2048 + 2048)      = 12288
#   QK^T: 4 heads x 8 dims x 2 per key x 32 keys (causal: seq / 2 keys per query on average) = 2048
#   AV: the same                                                                                = 2048
#   (the norms' gains, RoPE and softmax are elementwise: not counted)
LAYER_W, LAYER_A = 6144 + 12288, 2048 + 2048
HEAD_W = 2 * 128 * 32  # lm_head 32 -> 128 (the embedding lookup is a gather: no FLOPs)
# backward: the input gradient of a matmul costs its forward again, its weight gradient once more; attention's
# backward is 4 matmuls (dS from dO V^T, dV, dQ, dK) = 2 x its forward
FORWARD = 4 * (LAYER_W + LAYER_A) + HEAD_W                   # 98304
TRAINED_LAYER_BWD = (LAYER_W + 2 * LAYER_A) + LAYER_W         # input and weight gradients: 45056
FROZEN_LAYER_BWD = LAYER_W + 2 * LAYER_A                      # input gradient only (a trained layer lies below): 26624
HAND = {
    # the head's input and (tied) weight gradients, every layer's both, down to the embeddings
    "full": FORWARD + 2 * HEAD_W + 4 * TRAINED_LAYER_BWD,
    # layers 2, 3 train; the backward stops at layer 2 (layers 0, 1 and the embeddings under no_grad)
    "train_deep": FORWARD + HEAD_W + 2 * TRAINED_LAYER_BWD,
    # layers 0, 1 train: the frozen 2, 3 above them still pass input gradients down
    "train_shallow": FORWARD + HEAD_W + 2 * FROZEN_LAYER_BWD + 2 * TRAINED_LAYER_BWD,
}


@pytest.mark.parametrize("name", list(HAND))
def test_flop_model_matches_a_hand_count_of_a_tiny_qwen3(name):
    assert (HAND["full"], HAND["train_deep"], HAND["train_shallow"]) == (294912, 196608, 249856)
    model = _meta_model(**TINY)
    spec = dict(name=name) if name == "full" else dict(name=name, split=0.5)
    assert flops_per_token(model, plan_for_model(PlanConfig(**spec), model), SEQ) == HAND[name]


def test_freeze_speed_up_bounds_at_the_papers_shape():
    """The FLOP bound of each plan's speed-up over full at seq 4096 (issue 49: deep <= ~1.45-1.5, shallow <=
    ~1.05-1.2): full / plan FLOPs, from the hand-counted terms of Qwen3-0.6B."""
    h, heads, kv, hd, inter, layers, vocab, seq = 1024, 16, 8, 128, 3072, 28, 151936, 4096
    w = 2 * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter)
    a, head = 2 * seq * heads * hd, 2 * vocab * h
    fwd = layers * (w + a) + head
    full = fwd + 2 * head + layers * (2 * w + 2 * a)
    deep = fwd + head + layers // 2 * (2 * w + 2 * a)
    shallow = fwd + head + layers // 2 * (w + 2 * a) + layers // 2 * (2 * w + 2 * a)
    model = _meta_model(**QWEN3_06B)
    got = {n: flops_per_token(model, plan_for_model(PlanConfig(name=n, split=0.5), model), seq)
           for n in ("full", "train_deep", "train_shallow")}
    assert got == {"full": full, "train_deep": deep, "train_shallow": shallow}
    assert full / deep == pytest.approx(1.500, abs=0.001) and full / shallow == pytest.approx(1.178, abs=0.001)
