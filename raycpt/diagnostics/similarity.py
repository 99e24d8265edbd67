"""Layer-wise similarity between two checkpoints of one architecture (base vs tuned).

Pure torch/numpy: no Ray, no MLflow. Everything a ``raycpt compare`` table shows is computed here.

Representation metrics take *token matrices*: ``X`` of shape ``(n, d)``, one row per token (or per
prompt after pooling), the residual stream after a decoder block (pre final norm).

* :func:`linear_cka` - linear centered kernel alignment (Kornblith et al. 2019):
  ``||Yc^T Xc||_F^2 / (||Xc^T Xc||_F ||Yc^T Yc||_F)`` with column-centered ``Xc, Yc``; 1 for identical
  representations, invariant to orthogonal transforms and isotropic scaling of either side.
* :func:`mean_cosine` - mean over rows of ``cos(x_i, y_i)`` (direction re-targeting, token by token).
* :func:`mean_shift` - ``||mean(X) - mean(Y)||_2`` (is the cloud transported elsewhere).
* :func:`matrix_entropy` - matrix-based alpha-order Renyi entropy (Giraldo, Rao & Principe 2014) of
  the linear Gram ``K = Z Z^T`` normalised to unit trace: ``S_a = log(sum_i l_i^a) / (1 - a)`` with
  ``l_i`` the eigenvalues of ``K / tr K`` (alpha = 1: von Neumann, ``-sum l log l``). Natural log, so
  an identity Gram of size n gives ``log n``; ``normalized=True`` divides by ``log n`` (range [0, 1]).
  *Prompt level*: Z = the tokens of one sequence (:func:`prompt_entropy`, averaged over prompts).
  *Dataset level*: Z = one mean-pooled row per sample (:func:`dataset_entropy`).
* :func:`effective_rank` - Roy & Vetterli (2007): ``exp(H(p))`` with ``p_i = s_i / sum_j s_j`` over
  the **singular values** ``s_i`` of the matrix (not their squares), natural log. A matrix with r
  equal non-zero singular values has effective rank exactly r.

Weight metrics take two models and use :class:`~raycpt.models.stack.LayerStack` for the decoder
layers; inside a layer, parameters are grouped by their leaf names (:func:`param_group`):
``q k v o`` (attention projections; ``attn`` = their joint Frobenius norm), ``mlp`` (gate/up/down or
fc), ``ssm`` (Mamba mixers), ``norm``, ``other``.

:func:`collect_states` runs one model over tokenised prompts and returns the per-layer token matrices
plus the layer-wise probe (logit-lens next-token accuracy per layer).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import numpy as np
import torch
from torch import nn

from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack

ArrayLike = "np.ndarray | torch.Tensor"


def _as64(x) -> torch.Tensor:
    if isinstance(x, np.ndarray):
        x = torch.from_numpy(x)
    x = x.detach()
    if x.dim() != 2:
        raise ValueError(f"expected a 2-D (samples, features) matrix, got shape {tuple(x.shape)}")
    return x.to(dtype=torch.float64, device="cpu")


# ------------------------------------------------------------------------------------- geometry
def linear_cka(x, y) -> float:
    """Linear CKA between ``x (n, d1)`` and ``y (n, d2)`` (rows are paired samples)."""
    x, y = _as64(x), _as64(y)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"CKA needs the same samples on both sides: {x.shape[0]} vs {y.shape[0]} rows")
    x = x - x.mean(0, keepdim=True)
    y = y - y.mean(0, keepdim=True)
    cross = torch.linalg.matrix_norm(y.T @ x) ** 2
    nx = torch.linalg.matrix_norm(x.T @ x)
    ny = torch.linalg.matrix_norm(y.T @ y)
    if nx == 0 or ny == 0:
        return float("nan")
    return float(cross / (nx * ny))


def mean_cosine(x, y, eps: float = 1e-12) -> float:
    """Mean over rows of the cosine similarity of ``x[i]`` and ``y[i]`` (same feature space)."""
    x, y = _as64(x), _as64(y)
    if x.shape != y.shape:
        raise ValueError(f"cosine needs equal shapes, got {tuple(x.shape)} and {tuple(y.shape)}")
    num = (x * y).sum(1)
    den = x.norm(dim=1) * y.norm(dim=1)
    return float((num / den.clamp_min(eps)).mean())


def mean_shift(x, y) -> float:
    """Euclidean distance between the mean rows of ``x`` and ``y``."""
    x, y = _as64(x), _as64(y)
    return float((x.mean(0) - y.mean(0)).norm())


# ------------------------------------------------------------------------------------- information
def gram_spectrum(z, center: bool = False) -> torch.Tensor:
    """Eigenvalues of ``Z Z^T / tr(Z Z^T)`` (non-negative, summing to 1), via singular values of Z."""
    z = _as64(z)
    if center:
        z = z - z.mean(0, keepdim=True)
    s2 = torch.linalg.svdvals(z) ** 2
    total = s2.sum()
    if total <= 0:
        return s2
    return s2 / total


def spectrum_entropy(lam, alpha: float = 1.0) -> float:
    """alpha-order Renyi entropy (natural log) of a probability spectrum ``lam`` (sums to 1)."""
    lam = torch.as_tensor(lam, dtype=torch.float64)
    lam = lam[lam > 0]
    if lam.numel() == 0:
        return float("nan")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if abs(alpha - 1.0) < 1e-9:
        return float(-(lam * lam.log()).sum())
    return float(torch.log((lam ** alpha).sum()) / (1.0 - alpha))


def matrix_entropy(z, alpha: float = 1.0, normalized: bool = False, center: bool = False) -> float:
    """Matrix-based alpha-order Renyi entropy of the linear Gram of ``z (n, d)`` (see module doc)."""
    n = _as64(z).shape[0]
    h = spectrum_entropy(gram_spectrum(z, center=center), alpha)
    if normalized:
        return h / math.log(n) if n > 1 else float("nan")
    return h


def prompt_entropy(prompts: Sequence, alpha: float = 1.0, normalized: bool = True) -> float:
    """Mean over prompts of the entropy of each prompt's token Gram (tokens of one sequence as samples).

    Normalised by ``log T`` by default so prompts of different lengths average on one [0, 1] scale."""
    vals = [matrix_entropy(p, alpha, normalized=normalized) for p in prompts if _as64(p).shape[0] > 1]
    return float(np.mean(vals)) if vals else float("nan")


def dataset_entropy(prompts: Sequence, alpha: float = 1.0, normalized: bool = True) -> float:
    """Entropy of the Gram across samples: one mean-pooled row per prompt."""
    pooled = torch.stack([_as64(p).mean(0) for p in prompts])
    return matrix_entropy(pooled, alpha, normalized=normalized)


def effective_rank(z, center: bool = False) -> float:
    """Roy & Vetterli effective rank: ``exp(-sum p log p)``, ``p = s / sum(s)`` over singular values."""
    z = _as64(z)
    if center:
        z = z - z.mean(0, keepdim=True)
    s = torch.linalg.svdvals(z)
    total = s.sum()
    if total <= 0:
        return 0.0
    p = s / total
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


# ------------------------------------------------------------------------------------- weights
_GROUPS = [
    ("q", re.compile(r"(^|\.)(q_proj|query|wq)$")),
    ("k", re.compile(r"(^|\.)(k_proj|key|wk)$")),
    ("v", re.compile(r"(^|\.)(v_proj|value|wv)$")),
    ("o", re.compile(r"(^|\.)(o_proj|out_proj|dense|wo)$")),
    ("mlp", re.compile(r"(^|\.)(gate_proj|up_proj|down_proj|fc1|fc2|c_fc|w1|w2|w3|experts|router|gate)$")),
    ("norm", re.compile(r"norm|ln_", re.I)),
]
WEIGHT_GROUPS = ("q", "k", "v", "o", "attn", "mlp", "ssm", "norm", "other", "total")


def param_group(name: str) -> str:
    """Group of a parameter inside one decoder layer, from its name (e.g. ``self_attn.q_proj.weight``).

    Attention ``out_proj`` counts as ``o`` only under an attention module; a Mamba mixer's
    ``in_proj/out_proj/conv1d/A_log/D/dt_bias`` are ``ssm``; a fused ``qkv_proj`` counts in ``attn``.
    """
    module = name.rsplit(".", 1)[0] if "." in name else ""
    leaf_module = module.rsplit(".", 1)[-1]
    attn_ctx = bool(re.search(r"attn|attention", module))
    if re.search(r"(^|\.)(qkv_proj|c_attn|query_key_value|Wqkv)$", module):
        return "qkv"
    for g, rx in _GROUPS:
        if g == "o" and leaf_module == "out_proj" and not attn_ctx:
            continue
        if g == "norm":
            if rx.search(leaf_module or name):
                return "norm"
            continue
        if rx.search(module):
            return g
    if re.search(r"mixer|mamba|ssm", name) and not attn_ctx:
        return "ssm"
    if re.search(r"mlp|feed_forward|ffn", name):
        return "mlp"
    return "other"


def check_compatible(model_a: nn.Module, model_b: nn.Module, what: str = "models") -> None:
    """Raise RaycptError unless both models share architecture, layer count and every parameter shape."""
    sa, sb = LayerStack(model_a), LayerStack(model_b)
    if sa.model_type != sb.model_type:
        raise RaycptError(f"{what} have different architectures: {sa.model_type!r} vs {sb.model_type!r}; "
                          "compare needs two checkpoints of one architecture")
    if sa.num_layers != sb.num_layers:
        raise RaycptError(f"{what} have different layer counts: {sa.num_layers} vs {sb.num_layers}; "
                          "compare needs two checkpoints of one architecture")
    pa = dict(model_a.named_parameters())
    pb = dict(model_b.named_parameters())
    if set(pa) != set(pb):
        diff = sorted(set(pa) ^ set(pb))
        raise RaycptError(f"{what} have different parameters (e.g. {diff[0]!r}); compare needs one architecture")
    for n, p in pa.items():
        if p.shape != pb[n].shape:
            raise RaycptError(f"{what} differ in the shape of {n}: {tuple(p.shape)} vs {tuple(pb[n].shape)}")


def layer_weight_change(layer_a: nn.Module, layer_b: nn.Module) -> dict[str, float]:
    """Frobenius distance per parameter group between two copies of one decoder layer.

    Returns ``q k v o attn mlp ssm norm other total`` (absolute ``||B - A||_F``, groups joined as the
    root of the summed squares; ``attn`` = q, k, v, o and fused qkv) and ``rel_<group>`` =
    ``||B - A||_F / ||A||_F`` for ``attn``, ``mlp`` and ``total``."""
    sq = {g: 0.0 for g in WEIGHT_GROUPS}
    ref = {g: 0.0 for g in WEIGHT_GROUPS}
    pb = dict(layer_b.named_parameters())
    for name, a in layer_a.named_parameters():
        b = pb[name]
        d = float(((b.detach().double().cpu() - a.detach().double().cpu()) ** 2).sum())
        r = float((a.detach().double().cpu() ** 2).sum())
        g = param_group(name)
        targets = [g, "total"]
        if g in ("q", "k", "v", "o", "qkv"):
            targets.append("attn")
        for t in targets:
            if t in sq:
                sq[t] += d
                ref[t] += r
    out = {g: math.sqrt(v) for g, v in sq.items()}
    for g in ("attn", "mlp", "total"):
        out[f"rel_{g}"] = math.sqrt(sq[g] / ref[g]) if ref[g] > 0 else float("nan")
    return out


def weight_change(model_a: nn.Module, model_b: nn.Module) -> list[dict[str, float]]:
    """Per decoder layer: :func:`layer_weight_change` between ``model_a`` (base) and ``model_b`` (tuned)."""
    check_compatible(model_a, model_b)
    sa, sb = LayerStack(model_a), LayerStack(model_b)
    return [layer_weight_change(sa.layers[i], sb.layers[i]) for i in range(sa.num_layers)]


def layer_l2_change(start: dict[str, torch.Tensor], layer: nn.Module) -> float:
    """``||W_now - W_start||_F`` over all parameters of one layer, against a saved ``named_parameters`` copy."""
    total = 0.0
    for name, p in layer.named_parameters():
        total += float(((p.detach().double().cpu() - start[name].double()) ** 2).sum())
    return math.sqrt(total)


@torch.no_grad()
def swap_layers(target: nn.Module, donor: nn.Module, layers: Iterable[int]) -> nn.Module:
    """Copy decoder layers ``layers`` of ``donor`` into ``target`` in place (parameters and buffers)."""
    check_compatible(target, donor)
    st, sd = LayerStack(target), LayerStack(donor)
    for i in layers:
        if not 0 <= i < st.num_layers:
            raise RaycptError(f"swap layer {i} is out of range: the model has layers 0..{st.num_layers - 1}")
        st.layers[i].load_state_dict(sd.layers[i].state_dict())
    return target


def layer_blocks(num_layers: int, num_blocks: int) -> list[list[int]]:
    """Split layers 0..N-1 into ``num_blocks`` contiguous, nearly equal blocks (as ``blocks`` plans do)."""
    if not 1 <= num_blocks <= num_layers:
        raise RaycptError(f"swap blocks={num_blocks} must be between 1 and the number of layers ({num_layers})")
    edges = [round(j * num_layers / num_blocks) for j in range(num_blocks + 1)]
    return [list(range(edges[j], edges[j + 1])) for j in range(num_blocks)]


# ------------------------------------------------------------------------------------- activations
@dataclass
class ModelStates:
    """What :func:`collect_states` recorded for one model on one prompt set.

    ``layers[l][p]`` is the ``(T_p, d)`` float32 token matrix of prompt ``p`` after block ``l``;
    ``probe_correct[l]`` counts positions whose logit-lens argmax after block ``l`` is the next token,
    out of ``probe_total`` positions (the last block's lens is the model's own prediction)."""

    layers: list[list[np.ndarray]]
    probe_correct: np.ndarray
    probe_total: int
    dropped_first: bool = False
    num_tokens: int = 0

    @property
    def probe_accuracy(self) -> np.ndarray:
        return self.probe_correct / max(self.probe_total, 1)

    def tokens(self, layer: int) -> np.ndarray:
        return np.concatenate(self.layers[layer], axis=0)


@torch.no_grad()
def collect_states(model: nn.Module, sequences: Sequence[Sequence[int]], batch_size: int = 8,
                   drop_first: bool = True, progress: Optional[callable] = None) -> ModelStates:
    """Residual stream after every decoder block for each token sequence, plus the layer-wise probe.

    ``drop_first`` leaves out position 0 from the token matrices (the BOS / attention-sink token,
    whose outlier norm would otherwise dominate CKA and entropy). The probe scores every position
    t < T-1 against token t+1. Batches are right-padded with an attention mask (causal models: a
    token never sees the padding after it)."""
    stack = LayerStack(model)
    device = next(model.parameters()).device
    n = stack.num_layers
    layers: list[list[np.ndarray]] = [[] for _ in range(n)]
    correct = np.zeros(n, dtype=np.int64)
    total = 0
    ntok = 0
    seqs = [list(s) for s in sequences]
    for start in range(0, len(seqs), batch_size):
        chunk = seqs[start:start + batch_size]
        width = max(len(s) for s in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for b, s in enumerate(chunk):
            ids[b, :len(s)] = torch.tensor(s, dtype=torch.long)
            mask[b, :len(s)] = 1
        ids, mask = ids.to(device), mask.to(device)
        tr = stack.trace(ids, mask)
        lens_ok = mask[:, 1:].bool()
        total += int(lens_ok.sum())
        for l in range(n):
            h = tr.hidden[l + 1]
            pred = stack.lens(h[:, :-1]).argmax(-1)
            correct[l] += int(((pred == ids[:, 1:]) & lens_ok).sum())
            hf = h.float().cpu().numpy()
            for b, s in enumerate(chunk):
                lo = 1 if drop_first and len(s) > 1 else 0
                layers[l].append(hf[b, lo:len(s)].copy())
        ntok += sum(len(s) - (1 if drop_first and len(s) > 1 else 0) for s in chunk)
        if progress is not None:
            progress(len(chunk))
    return ModelStates(layers=layers, probe_correct=correct, probe_total=total, dropped_first=drop_first,
                       num_tokens=ntok)


def massive_rows(x, factor: float = 10.0) -> np.ndarray:
    """Rows whose L2 norm exceeds ``factor`` x the median row norm (massive activations; 0 = none).

    LLMs put a few tokens (the attention sink and some delimiters) at norms 10-100x the others in
    their middle layers; left in, one such token decides linear CKA (~1.0 whatever the rest does)
    and the spectra behind entropy and effective rank."""
    x = np.asarray(x)
    if not factor or x.shape[0] == 0:
        return np.zeros(x.shape[0], dtype=bool)
    n = np.linalg.norm(x.astype(np.float64), axis=1)
    return n > factor * np.median(n)


def _split(mask: np.ndarray, prompts: Sequence[np.ndarray]) -> list[np.ndarray]:
    out, i = [], 0
    for p in prompts:
        out.append(mask[i:i + len(p)])
        i += len(p)
    return out


def model_metrics(states: ModelStates, alpha: float = 1.0, outlier_factor: float = 10.0) -> list[dict[str, float]]:
    """Per layer, one model: prompt / dataset entropy, effective rank of the token matrix, probe accuracy.

    Tokens flagged by :func:`massive_rows` (``outlier_factor``) are left out of the entropies and the
    effective rank; ``massive_tokens`` says how many."""
    out = []
    acc = states.probe_accuracy
    for l, prompts in enumerate(states.layers):
        allx = np.concatenate(prompts, axis=0)
        bad = massive_rows(allx, outlier_factor)
        kept = [p[~m] for p, m in zip(prompts, _split(bad, prompts))]
        kept_nonempty = [p for p in kept if len(p) > 0]
        out.append(dict(
            prompt_entropy=prompt_entropy(kept, alpha),
            dataset_entropy=dataset_entropy(kept_nonempty, alpha) if len(kept_nonempty) > 1 else float("nan"),
            effective_rank=effective_rank(allx[~bad]),
            probe_accuracy=float(acc[l]),
            massive_tokens=int(bad.sum()),
        ))
    return out


def pair_metrics(a: ModelStates, b: ModelStates, outlier_factor: float = 10.0) -> list[dict[str, float]]:
    """Per layer, base ``a`` vs tuned ``b`` on the same tokens: linear CKA, mean cosine, mean shift.

    Tokens that are massive activations (:func:`massive_rows`) in either model are left out on both
    sides; ``massive_tokens`` says how many."""
    if len(a.layers) != len(b.layers):
        raise RaycptError(f"models have different layer counts: {len(a.layers)} vs {len(b.layers)}")
    out = []
    for l in range(len(a.layers)):
        xa, xb = a.tokens(l), b.tokens(l)
        if xa.shape[0] != xb.shape[0]:
            raise RaycptError(f"layer {l}: the two models saw different token counts ({xa.shape[0]} vs "
                              f"{xb.shape[0]}); they must share one tokenizer")
        keep = ~(massive_rows(xa, outlier_factor) | massive_rows(xb, outlier_factor))
        xa, xb = xa[keep], xb[keep]
        out.append(dict(cka=linear_cka(xa, xb), cosine=mean_cosine(xa, xb), mean_shift=mean_shift(xa, xb),
                        massive_tokens_pair=int((~keep).sum())))
    return out
