"""Throughput you can compare across plans and machines: tokens/s per worker and model FLOPs utilisation.

The FLOP model is the one ``benchmarks/bench_strategies.py`` checks against measured step times
(per token; a module's forward cost F = W + A, W = 2 x its weight count, A = 2 x seq x heads x
head_dim for causal attention): the forward through every layer and the head; activation gradients
from the head down to the first trainable module (W + 2A each); weight gradients of the trainable
modules only (W each, the head's when it trains). Recomputation under activation checkpointing is
not counted (it is model FLOPs utilisation, not hardware FLOPs).

MFU = flops_per_token x tokens/s per worker / the device's peak dense bf16 FLOP/s:
``train.peak_tflops`` when given, else :data:`GPU_PEAK_TFLOPS` by device name; none on a CPU.
"""

from __future__ import annotations

from typing import Optional

from raycpt.models.stack import LayerStack

GPU_PEAK_TFLOPS: dict[str, float] = {
    # dense bf16 tensor-core peaks from the vendors' data sheets (no sparsity)
    "H200": 989.0, "H100 SXM": 989.0, "H100 NVL": 835.0, "H100 PCIe": 756.0, "H100": 989.0, "H800": 989.0,
    "B200": 2250.0, "GH200": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "L40": 181.0, "A10G": 125.0,
    "A10": 125.0, "L4": 121.0, "A6000": 155.0, "V100": 125.0, "T4": 65.0,
}


def flops_per_token(model, plan, seq_len: int) -> float:
    """Training FLOPs per token of one step under ``plan`` (see the module docstring)."""
    stack = LayerStack.of(model)
    conf = model.config
    heads = getattr(conf, "num_attention_heads", None)  # None: no attention to count (Mamba2, raycpt hybrids)
    head_dim = (getattr(conf, "head_dim", None) or conf.hidden_size // heads) if heads else 0
    attn = 2 * seq_len * (heads or 0) * head_dim
    w_layer = [2 * sum(p.numel() for p in layer.parameters()) for layer in stack.layers]
    w_head = 2 * stack.head.weight.numel()
    cost = sum(w + attn for w in w_layer) + w_head
    first = plan.first_trainable
    if first is None:
        return float(cost)
    cost += w_head
    trains = set(plan.trainable_layers)
    for i in range(stack.num_layers - 1, max(first, 0) - 1, -1):
        cost += w_layer[i] + 2 * attn + (w_layer[i] if i in trains else 0)
    if plan.train_head:
        cost += w_head
    return float(cost)


def peak_flops(device_name: Optional[str], given_tflops: Optional[float] = None) -> Optional[float]:
    """Peak FLOP/s of one device: ``given_tflops`` if set, else the table by name (longest match), else None."""
    if given_tflops:
        return float(given_tflops) * 1e12
    if not device_name:
        return None
    hits = [k for k in GPU_PEAK_TFLOPS if k.lower() in device_name.lower()]
    return GPU_PEAK_TFLOPS[max(hits, key=len)] * 1e12 if hits else None


def device_name(device) -> Optional[str]:
    if getattr(device, "type", None) == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    return None


def throughput_metrics(tokens_per_step: int, world_size: int, step_s: float, fpt: float,
                       peak: Optional[float]) -> dict[str, float]:
    """``tokens_per_s_per_worker`` and, with a known peak, ``mfu`` (a fraction)."""
    per_worker = tokens_per_step / max(1, world_size) / step_s
    out = {"tokens_per_s_per_worker": per_worker}
    if peak:
        out["mfu"] = fpt * per_worker / peak
    return out
