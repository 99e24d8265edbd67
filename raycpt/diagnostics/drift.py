"""Drift metrics: how far each decoder layer moved from a starting model (pure torch/numpy).

Per decoder layer, against the start:

* ``drift.dW.L{i}`` - ``||W_i(now) - W_i(start)||_F`` over all parameters of layer i;
* ``drift.rel_dW.L{i}`` - the same divided by ``||W_i(start)||_F``;
* ``drift.cka.L{i}`` - linear CKA between the layer's residual stream now and at the start, on a
  fixed probe batch (the shipped WordNet glosses, `builtin:wordnet-glosses`, the same tokens every time; massive-activation tokens, norm
  > 10x the median, left out as in ``raycpt compare``);

plus ``drift.dW.mean`` / ``drift.cka.min``. The training-time callback that computes them every
``train.drift_every`` steps, logs them and writes ``drift.json`` / ``drift.png`` is
:class:`raycpt.train.worker.callbacks.DriftCallback`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from raycpt.diagnostics.prompts import gloss_texts
from raycpt.diagnostics.similarity import layer_l2_change, linear_cka, massive_rows
from raycpt.models.stack import LayerStack

PROBE_PROMPTS = 8
PROBE_TOKENS = 32


def probe_ids(tokenizer, texts: list[str], max_len: int = PROBE_TOKENS) -> list[list[int]]:
    """Token ids of the probe texts, cut to ``max_len`` and then to a common length (no padding needed)."""
    seqs = [tokenizer(t, add_special_tokens=True)["input_ids"][:max_len] for t in texts]
    seqs = [s for s in seqs if len(s) >= 4]
    if not seqs:
        return []
    width = min(len(s) for s in seqs)
    return [list(s[:width]) for s in seqs]


@torch.no_grad()
def layer_states(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """Residual stream after every decoder block, as ``(tokens, d)`` float32 CPU matrices (BOS dropped)."""
    stack = LayerStack.of(model)
    was_training = model.training
    model.eval()
    try:
        tr = stack.trace(ids.to(next(model.parameters()).device))
    finally:
        model.train(was_training)
    return [h[:, 1:].reshape(-1, h.shape[-1]).float().cpu() for h in tr.hidden[1:]]


def layer_params(model) -> list[dict[str, torch.Tensor]]:
    """A float32 CPU copy of every decoder layer's parameters (name -> tensor)."""
    return [{n: p.detach().float().cpu().clone() for n, p in layer.named_parameters()}
            for layer in LayerStack.of(model).layers]


def drift_metrics(start_params, start_states, model, ids: torch.Tensor) -> dict[str, float]:
    """The drift metrics of ``model`` against the saved start (see the module docstring)."""
    stack = LayerStack.of(model)
    out: dict[str, float] = {}
    dws, ckas = [], []
    now = layer_states(model, ids) if start_states else []
    for i, layer in enumerate(stack.layers):
        dw = layer_l2_change(start_params[i], layer)
        ref = math.sqrt(sum(float((t.double() ** 2).sum()) for t in start_params[i].values()))
        out[f"drift.dW.L{i:02d}"] = dw
        out[f"drift.rel_dW.L{i:02d}"] = dw / ref if ref > 0 else float("nan")
        dws.append(dw)
        if start_states:
            keep = ~(massive_rows(start_states[i].numpy()) | massive_rows(now[i].numpy()))
            c = linear_cka(start_states[i][keep], now[i][keep])
            out[f"drift.cka.L{i:02d}"] = c
            ckas.append(c)
    out["drift.dW.mean"] = float(np.mean(dws)) if dws else float("nan")
    if ckas:
        out["drift.cka.min"] = float(np.nanmin(ckas))
    return out


def probe_texts(n: int) -> list[str]:
    """``n`` probe texts: the shipped WordNet glosses (``builtin:wordnet-glosses``), the same on every machine."""
    return gloss_texts(n)
