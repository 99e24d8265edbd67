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
* **ELO** (EACL 2026): the first and the last layers; the score is the distance from the middle layer.
* **Gradient norm** (AdaGradSelect, arXiv 2512.15764): per layer, the L2 norm of the LM loss's gradient with
  respect to the layer's parameters on corpus blocks, averaged over the batches.

The selectors are registered in :data:`raycpt.registry.SELECTORS` (declared in :mod:`raycpt.diagnostics`, so the
config and the CLI help read their names without torch); each score function here takes :class:`SelectorInputs`.

Spectrum as its authors run it (per weight type, not per layer) is :mod:`raycpt.diagnostics.spectrum`; ``snr``
here is the layer-level variant (the mean over a layer's matrices), kept under its own name.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

import numpy as np
import torch

from raycpt.errors import RaycptError
from raycpt.registry import SELECTORS
from raycpt.strategies import write_ranking


# ------------------------------------------------------------------------------------ the one path
@dataclass(frozen=True)
class SelectorInputs:
    """What a selector may read (each reads only what its registered ``needs`` names): the model and its decoder
    layers, corpus blocks as ``(B, T)`` token-id arrays with the batch size, a trace's normalised profiles, the
    number of layers, the seed and Spectrum's normalisation switch."""

    num_layers: int
    model: object = None
    layers: object = None
    blocks: object = None
    batch: int = 8
    tp_norm: object = None
    ls_norm: object = None
    seed: int = 0
    normalize: bool = False
    advance: Callable[[int], None] = field(default=lambda n: None)


def select_scores(method: str, inputs: SelectorInputs) -> np.ndarray:
    """The ``(N,)`` scores of the registered selector ``method``: the one path every caller takes."""
    scores = np.asarray(SELECTORS.get(method)(inputs), dtype=np.float64)
    if scores.shape != (inputs.num_layers,):
        raise RuntimeError(f"selector {method}: {scores.shape} scores for {inputs.num_layers} layers")
    return scores


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


def block_influence_of_blocks(x: SelectorInputs) -> np.ndarray:
    """Block Influence over corpus blocks of equal length, ``x.batch`` at a time (:func:`block_influence` per
    batch, averaged with the batches' block counts as weights: every token weighs the same)."""
    parts, sizes = [], []
    for s in range(0, len(x.blocks), x.batch):
        ids = torch.as_tensor(np.asarray(x.blocks[s:s + x.batch]), dtype=torch.long)
        parts.append(block_influence(x.model, x.layers, [(ids, None)]))
        sizes.append(len(ids))
        x.advance(len(ids))
    return np.average(np.stack(parts), axis=0, weights=sizes)


# ------------------------------------------------------------------------------------ weight SNR
def mp_edge(sigma: float, shape: tuple[int, int]) -> float:
    """Marchenko-Pastur upper edge of a noise matrix's singular values: ``sigma * (1 + sqrt(beta))``."""
    beta = min(shape) / max(shape)
    return float(sigma) * (1.0 + math.sqrt(beta))


_SVALS: dict[int, tuple] = {}  # id(weight) -> (weakref to it, content key, singular values)


def singular_values(weight: torch.Tensor) -> torch.Tensor:
    """float64 singular values of a 2-D weight, computed once per tensor and content: ``--budget`` ranks layers by
    their mean SNR and Spectrum ranks the same matrices per type, one SVD each. An entry counts only for the very
    tensor it was made from (a weak reference, so a reused id misses) and its content: the version counter,
    storage and float64 sum and sum of squares (a weight changed in place, through ``.data`` too, is decomposed
    again). At most 4,096 entries are kept."""
    w = weight.detach().to(torch.float64).cpu()
    key = (weight._version, weight.data_ptr(), float(w.sum()), float((w * w).sum()))
    hit = _SVALS.get(id(weight))
    if hit is not None and hit[0]() is weight and hit[1] == key:
        return hit[2]
    s = torch.linalg.svdvals(w)
    if len(_SVALS) >= 4096:
        _SVALS.clear()
    _SVALS[id(weight)] = (weakref.ref(weight), key, s)
    return s


def matrix_snr(weight: torch.Tensor, normalize: bool = False) -> float:
    """Spectrum's SNR of one 2-D matrix (see the module docstring); float64 singular values."""
    s = singular_values(weight)
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


def weight_snr_of(x: SelectorInputs) -> np.ndarray:
    """``snr``: :func:`weight_snr` of the layers."""
    return weight_snr(x.layers, normalize=x.normalize)


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


def layertracer_of(x: SelectorInputs) -> np.ndarray:
    """``layertracer``: :func:`layertracer_scores` of a trace's profiles."""
    return layertracer_scores(x.tp_norm, x.ls_norm)


def random_of(x: SelectorInputs) -> np.ndarray:
    """``random``: :func:`random_scores`."""
    return random_scores(x.num_layers, x.seed)


def random_scores(num_layers: int, seed: int) -> np.ndarray:
    """A seeded uniform score per layer: the random-k control (same seed, same ranking)."""
    return np.random.default_rng(int(seed)).random(int(num_layers))


# ------------------------------------------------------------------------------------ ELO, gradient norms
def elo_scores(num_layers: int) -> np.ndarray:
    """ELO (EACL 2026, train the first and the last layers): ``|l - (N - 1) / 2|``, the distance from the middle,
    so the top-2 are layers 0 and N-1 and a larger k adds the next layers in from both edges (ties: lower first)."""
    n = int(num_layers)
    if n < 2:
        raise RaycptError(f"select elo: ELO trains the first and the last layer; this model has {n} layer(s)")
    return np.abs(np.arange(n, dtype=np.float64) - (n - 1) / 2.0)


def elo_of(x: SelectorInputs) -> np.ndarray:
    """``elo``: :func:`elo_scores`."""
    return elo_scores(x.num_layers)


def layer_grad_norms(model, layers, ids: torch.Tensor) -> np.ndarray:
    """Per decoder layer, the L2 norm of the gradient of the language-model loss on ``ids`` (labels = inputs)
    with respect to all of that layer's parameters; the model's weights are not changed and its gradients are
    cleared."""
    params = [list(layer.parameters()) for layer in layers]
    flat = [p for ps in params for p in ps]
    saved = [p.requires_grad for p in flat]
    try:
        for p in flat:
            p.requires_grad_(True)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        grads = torch.autograd.grad(loss, flat, allow_unused=True)
    finally:
        for p, r in zip(flat, saved):
            p.requires_grad_(r)
    out, k = np.zeros(len(params)), 0
    for i, ps in enumerate(params):
        sq = 0.0
        for g in grads[k:k + len(ps)]:
            if g is not None:
                sq += float(g.detach().double().pow(2).sum())
        out[i], k = math.sqrt(sq), k + len(ps)
    return out


def gradient_norm_scores(x: SelectorInputs) -> np.ndarray:
    """AdaGradSelect-style (arXiv 2512.15764): the per-layer gradient norm of the LM loss, averaged over the corpus
    blocks ``x.batch`` at a time (weighted by the batches' block counts); the layers whose loss gradient is
    largest train first."""
    parts, sizes = [], []
    for s in range(0, len(x.blocks), x.batch):
        ids = torch.as_tensor(np.asarray(x.blocks[s:s + x.batch]), dtype=torch.long)
        parts.append(layer_grad_norms(x.model, x.layers, ids))
        sizes.append(len(ids))
        x.advance(len(ids))
    return np.average(np.stack(parts), axis=0, weights=sizes)


# ------------------------------------------------------------------------------------ rankings
def ranking_order(scores) -> list[int]:
    """The layers best first: score descending, ties lower layer first, NaN and infinities last."""
    s = np.asarray(scores, dtype=np.float64)
    return sorted(range(len(s)), key=lambda i: (0, -s[i], i) if np.isfinite(s[i]) else (1, 0.0, i))


def top_k(scores, k: int) -> list[int]:
    """The ``k`` best layers (:func:`ranking_order`), in layer order."""
    return sorted(ranking_order(scores)[:int(k)])


def write_selection(path, model: str, method: str, scores, k: Optional[int] = None,
                    extra: Optional[dict] = None) -> Path:
    """Write ``scores`` as a ranking file (best first) with the method, and ``k`` / the top-k when given."""
    s = np.asarray(scores, dtype=np.float64)
    more = {"method": method, **({"k": int(k), "top_k": top_k(s, k)} if k is not None else {}), **(extra or {})}
    return write_ranking(path, model, len(s), {i: float(v) for i, v in enumerate(s)}, metric=SELECTORS.info(method, "metric"),
                         extra=more)

