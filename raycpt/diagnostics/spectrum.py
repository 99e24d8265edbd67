"""Spectrum as its authors run it (Hartford et al. 2024, cognitivecomputations/spectrum ``spectrum.py``): per weight
type, not per layer.

A **weight type** is a module path inside a decoder layer (``self_attn.q_proj``, ``mlp.down_proj``, ...). Every
2-D weight of a type gets Spectrum's value: :func:`raycpt.diagnostics.selectors.matrix_snr` divided by the
matrix's largest singular value (the script's ``snr / max_singular_value``). Within each type the matrices are
ranked by that value and the top ``int(n * percent / 100)`` of the type's ``n`` matrices train (the script's
``generate_unfrozen_params_yaml``), plus the input embeddings and the LM head, which the script always unfreezes
(``^lm_head.weight$``, ``^model.embed_tokens.weight$``); the final norm is a type of one matrix, so no percent
below 100 picks it.

Where raycpt differs, on purpose and stated: 1-D weights (the layer norms) are not scanned, since a vector's one
singular value gives every norm the same value and the script's pick among them is then just the first layers
of its stable sort; and the order is defined for every value: ``+inf`` (no singular value at or below the
Marchenko-Pastur edge: all signal; the script replaces that zero noise sum by 1) ranks first, then finite values
descending, NaN last, ties by the lower layer (:func:`spectrum_order`).
"""

from __future__ import annotations

import math
from typing import Iterable

from raycpt.diagnostics.selectors import matrix_snr


def weight_types(layers) -> dict[tuple[int, str], object]:
    """``{(layer, module path): weight}`` for every 2-D ``<module>.weight`` of the decoder layers (shared tensors
    once)."""
    out, seen = {}, set()
    for i, layer in enumerate(layers):
        for name, p in layer.named_parameters():
            if p.dim() == 2 and name.endswith(".weight") and id(p) not in seen:
                seen.add(id(p))
                out[(i, name[: -len(".weight")])] = p
    return out


def spectrum_snr(layers) -> dict[tuple[int, str], float]:
    """Spectrum's value (SNR / s_max) of every matrix of :func:`weight_types`."""
    return {key: matrix_snr(w, normalize=True) for key, w in weight_types(layers).items()}


def spectrum_order(values: dict[int, float]) -> list[int]:
    """The layers of one weight type best first: ``+inf`` first, finite values descending, NaN (and ``-inf``)
    last; ties by the lower layer."""
    def key(i):
        v = float(values[i])
        if v == math.inf:
            return (0, 0.0, i)
        return (1, -v, i) if math.isfinite(v) else (2, 0.0, i)

    return sorted(values, key=key)


def spectrum_pick(snr: dict[tuple[int, str], float], percent: float) -> list[tuple[int, str]]:
    """The matrices Spectrum unfreezes at ``percent``: per weight type the top ``int(n * percent / 100)`` of its
    ``n`` matrices (:func:`spectrum_order`); sorted by (layer, type)."""
    by_type: dict[str, dict[int, float]] = {}
    for (i, t), v in snr.items():
        by_type.setdefault(t, {})[i] = v
    out = []
    for t, vals in by_type.items():
        out += [(i, t) for i in spectrum_order(vals)[: int(len(vals) * float(percent) / 100)]]
    return sorted(out)


def matrix_names(picked: Iterable[tuple[int, str]]) -> list[str]:
    """``plan.matrices`` entries (``<layer>.<module path>``) of picked matrices."""
    return [f"{i}.{t}" for i, t in sorted(picked)]
