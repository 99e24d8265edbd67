"""Layer selectors: one score per decoder layer, higher = "train this layer first"; pure torch/numpy, no Ray.

Each selector returns an ``(N,)`` float array; :func:`write_selection` writes it as a ranking file
(:func:`raycpt.strategies.write_ranking`) that ``plan.name=elite plan.ranking_file=...`` and the sweep read.

* **Block Influence** (ShortGPT, Men et al. 2024): ``BI_l = 1 - mean_t cos(x_l,t, y_l,t)`` where ``x_l`` is
  layer ``l``'s input hidden state and ``y_l`` its output, the mean over the non-pad tokens ``t`` of corpus
  samples. Captured with forward hooks on the decoder layers themselves (so it holds for the last layer too,
  whose output ``output_hidden_states`` only shows after the final norm). A high BI = the layer changes the
  residual stream a lot = important; ShortGPT removes the lowest-BI layers, so the highest train first.
* **Weight SNR** (Spectrum, Hartford et al. 2024), from the weights alone: for each 2-D weight ``W`` of a
  layer, singular values ``s`` (descending); noise ``sigma = IQR(s) / 1.349`` (quartiles by linear
  interpolation, numpy's default); Marchenko-Pastur edge ``sigma * (1 + sqrt(beta))``, ``beta`` = smaller /
  larger side of ``W``; ``SNR(W) = sum(s > edge) / sum(s <= edge)`` (``inf`` when no value is at or below the
  edge). A layer's score is the **mean over its 2-D matrices** (attention and MLP projections; 1-D norms are
  not matrices). Spectrum's script also divides each ``SNR(W)`` by ``s_max``; that is ``normalize=True``
  here, off by default because it makes the score depend on the weights' scale, which SNR itself does not.
* **LayerTracer profiles**: ``score_l = LS^_l - TP^_l`` (the min-max normalised Layer-wise Sensitivity and
  Task-Particle profiles of a trace). Then ``S(b) = mean score[0:b) - mean score[b:N)`` exactly (eq. 7
  regrouped), so the layers S(b) wants on the train side (sensitive, not task-executing) rank first.
* **Random**: a seeded uniform draw per layer (``numpy.random.default_rng(seed)``), the control.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

from raycpt.strategies import write_ranking


METHODS = ("bi", "snr", "layertracer", "random")
METRICS = {"bi": "block_influence", "snr": "weight_snr", "layertracer": "ls_norm_minus_tp_norm",
           "random": "random"}


# ------------------------------------------------------------------------------------ block influence
def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


@contextlib.contextmanager
def layer_cosines(layers) -> Iterator[dict]:
    """Forward hooks on every decoder layer recording, per call, ``cos(input, output)`` per token
    (float64, shape ``(batch, seq)``) under ``out[i]`` (a list, one entry per forward). Hooks are removed
    on exit, even on error. Decoder layers may return a tensor or a tuple (transformers 5 returns a tensor)."""
    out: dict[int, list] = {i: [] for i in range(len(layers))}
    handles = []

    def make(i):
        def hook(module, args, kwargs, output):
            x = args[0] if args else kwargs["hidden_states"]
            y = _first(output)
            out[i].append(torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=-1))
        return hook

    try:
        for i, layer in enumerate(layers):
            handles.append(layer.register_forward_hook(make(i), with_kwargs=True))
        yield out
    finally:
        for h in handles:
            h.remove()


def block_influence_from_cosines(cosines: dict, masks: list) -> np.ndarray:
    """``1 - mean cos`` per layer over the tokens where ``masks[k]`` (one per forward) is 1."""
    n = len(cosines)
    bi = np.zeros(n)
    for i in range(n):
        total, count = 0.0, 0
        for cos, m in zip(cosines[i], masks):
            keep = m.to(torch.bool)
            total += float(cos[keep].sum())
            count += int(keep.sum())
        bi[i] = 1.0 - total / count if count else math.nan
    return bi


@torch.no_grad()
def block_influence(model, layers, batches: Iterable[tuple[torch.Tensor, Optional[torch.Tensor]]]) -> np.ndarray:
    """Block Influence per decoder layer of ``model`` over ``batches`` of ``(input_ids, attention_mask)``
    (mask None = every token counts). ``layers``: the model's decoder layers (``LayerStack.layers``)."""
    masks = []
    with layer_cosines(layers) as cos:
        for ids, mask in batches:
            mask = torch.ones_like(ids) if mask is None else mask
            model(input_ids=ids, attention_mask=mask, use_cache=False)
            masks.append(mask)
    return block_influence_from_cosines(cos, masks)


# ------------------------------------------------------------------------------------ weight SNR
def mp_edge(sigma: float, shape: tuple[int, int]) -> float:
    """Marchenko-Pastur upper edge of a noise matrix's singular values: ``sigma * (1 + sqrt(beta))``."""
    beta = min(shape) / max(shape)
    return float(sigma) * (1.0 + math.sqrt(beta))


def matrix_snr(weight: torch.Tensor, normalize: bool = False) -> float:
    """Spectrum's SNR of one 2-D matrix (see the module docstring); float64 singular values."""
    s = torch.linalg.svdvals(weight.detach().to(torch.float64).cpu())
    q25, q75 = torch.quantile(s, 0.25).item(), torch.quantile(s, 0.75).item()
    edge = mp_edge((q75 - q25) / 1.349, tuple(weight.shape))
    signal, noise = float(s[s > edge].sum()), float(s[s <= edge].sum())
    snr = signal / noise if noise > 0 else math.inf
    return snr / float(s.max()) if normalize and float(s.max()) > 0 else snr


def layer_matrices(layer: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The layer's 2-D weights by name (shared tensors once)."""
    seen, out = set(), []
    for name, p in layer.named_parameters():
        if p.dim() == 2 and id(p) not in seen:
            seen.add(id(p))
            out.append((name, p))
    return out


def weight_snr(layers, normalize: bool = False) -> np.ndarray:
    """Per decoder layer: the mean of :func:`matrix_snr` over its 2-D weights (NaN for a layer without any)."""
    out = np.full(len(layers), math.nan)
    for i, layer in enumerate(layers):
        vals = [matrix_snr(w, normalize) for _, w in layer_matrices(layer)]
        if vals:
            out[i] = float(np.mean(vals))
    return out


# ------------------------------------------------------------------------------------ LayerTracer, random
def layertracer_scores(tp_norm, ls_norm) -> np.ndarray:
    """``LS^ - TP^`` per layer: ``S(b) = mean score[0:b) - mean score[b:N)`` (see the module docstring)."""
    return np.asarray(ls_norm, dtype=np.float64) - np.asarray(tp_norm, dtype=np.float64)


def random_scores(num_layers: int, seed: int) -> np.ndarray:
    """A seeded uniform score per layer: the random-k control (same seed, same ranking)."""
    return np.random.default_rng(int(seed)).random(int(num_layers))


# ------------------------------------------------------------------------------------ rankings
def top_k(scores, k: int) -> list[int]:
    """The ``k`` best layers (score descending, ties: lower layer first, NaN last), in layer order."""
    s = np.asarray(scores, dtype=np.float64)
    order = sorted(range(len(s)), key=lambda i: (0, -s[i], i) if np.isfinite(s[i]) else (1, 0.0, i))
    return sorted(order[:int(k)])


def write_selection(path, model: str, method: str, scores, k: Optional[int] = None,
                    extra: Optional[dict] = None) -> Path:
    """Write ``scores`` as a ranking file (best first) with the method, and ``k`` / the top-k when given."""
    s = np.asarray(scores, dtype=np.float64)
    more = {"method": method, **({"k": int(k), "top_k": top_k(s, k)} if k is not None else {}), **(extra or {})}
    return write_ranking(path, model, len(s), {i: float(v) for i, v in enumerate(s)}, metric=METRICS[method],
                         extra=more)
