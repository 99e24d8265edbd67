"""Equal budget (``--budget``): every plan at the setting whose trainable count is nearest a parameter budget."""

from __future__ import annotations

from typing import Optional

from raycpt.errors import RaycptError
from raycpt.models.expansion import expand_trainable_params
from raycpt.strategies.lisa import lisa_trainable_params


def _nearest(candidates, count, budget: int):
    """The candidate whose ``count(c)`` is nearest ``budget`` (ties: the first, i.e. the smaller)."""
    return min(candidates, key=lambda c: abs(count(c) - budget))


def check_budget(budget: int, layer_params, total_params: int) -> int:
    """``--budget``: a trainable-parameter count between one layer's parameters and the whole model's."""
    smallest = min(int(x) for x in layer_params)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < smallest:
        raise RaycptError(f"--budget {budget!r} is below one layer's parameters ({smallest:,}): no plan fits it")
    if budget > total_params:
        raise RaycptError(f"--budget {budget:,} is above the model's {total_params:,} parameters")
    return budget


def spectrum_row(budget: int, spectrum: dict) -> dict:
    """Spectrum's row: the percent (1..100) whose per-type pick (:func:`raycpt.diagnostics.spectrum.spectrum_pick`
    semantics: the top ``int(n * percent / 100)`` of each type) plus the embeddings and head is nearest ``budget``.
    ``spectrum``: ``{"pick": percent -> [(layer, type)], "sizes": {(layer, type): parameters}, "base": embeddings
    + head}``."""
    pick, sizes, base = spectrum["pick"], spectrum["sizes"], int(spectrum["base"])
    count = lambda q: base + sum(sizes[m] for m in pick(q))  # noqa: E731
    q = _nearest(range(1, 101), count, budget)
    return {"name": f"spectrum-p{q}", "trainable": count(q),
            "settings": {"plan.name": "spectrum", "plan.matrices": [f"{i}.{t}" for i, t in sorted(pick(q))]}}


def budget_plans(budget: int, layer_params, non_layer_params: int, lora_per_rank: int, max_rank: int,
                 rankings: Optional[dict] = None, random_seeds=(0, 1, 2), lora_lr: Optional[float] = None,
                 spectrum: Optional[dict] = None) -> list[dict]:
    """The trials of an equal-budget comparison: per row ``{"name", "settings", "trainable"}`` (settings: dotted
    config keys -> typed values, a sweep recipe), each plan at the
    setting whose trainable count is nearest ``budget`` (ties: the smaller setting).

    ``layer_params``: parameters per decoder layer; ``non_layer_params``: embeddings + final norm + head (a tied
    matrix once; LISA always trains them); ``lora_per_rank``: LoRA parameters per unit of rank on every layer
    (``sum of in + out`` of the targeted linear modules), ``max_rank`` the smallest width; ``rankings``: method ->
    layers best first (e.g. ``{"bi": [...], "snr": [...]}``): their top-k, k nearest by cumulative count.
    Rows: ``train_shallow`` at b (layers [0, b)), ``train_deep`` at b' (layers [b', N)), ``<method>-top-k`` per
    ranking, ``random-k`` per seed (:func:`raycpt.diagnostics.selectors.random_scores`' draw: the top-k of
    ``default_rng(seed).random(N)``), ``lisa`` at gamma (its period derived from the run: ``plan.lisa_interval``
    null), ``lora`` at rank r on every layer (alpha 2r; at ``lora_lr`` when given: LoRA's usual rate), ``expand``
    at P, and with ``spectrum`` (:func:`spectrum_row`) Spectrum's per-type selection at the nearest percent."""
    import numpy as np

    sizes = [int(x) for x in layer_params]
    n = len(sizes)
    check_budget(budget, sizes, sum(sizes) + int(non_layer_params))
    b = _nearest(range(1, n), lambda k: sum(sizes[:k]), budget)
    d = _nearest(range(n - 1, 0, -1), lambda k: sum(sizes[k:]), budget)
    rows = [{"name": "layertracer-shallow", "settings": {"plan.name": "train_shallow", "plan.split": b / n},
             "trainable": sum(sizes[:b])},
            {"name": "layertracer-deep", "settings": {"plan.name": "train_deep", "plan.split": d / n},
             "trainable": sum(sizes[d:])}]
    orders = dict(rankings or {})
    for seed in random_seeds:
        draw = np.random.default_rng(int(seed)).random(n)
        orders[f"random{seed}"] = sorted(range(n), key=lambda i: (-draw[i], i))
    for name, order in orders.items():
        order = [int(i) for i in order]
        k = _nearest(range(1, len(order) + 1), lambda j: sum(sizes[i] for i in order[:j]), budget)
        top = sorted(order[:k])
        rows.append({"name": f"{name}-top{k}", "settings": {"plan.name": "layers", "plan.layers": top},
                     "trainable": sum(sizes[i] for i in top)})
    g = _nearest(range(1, n + 1), lambda j: lisa_trainable_params(sizes, non_layer_params, j), budget)
    r = _nearest(range(1, int(max_rank) + 1), lambda j: j * int(lora_per_rank), budget)
    p = _nearest(range(1, n + 1), lambda j: expand_trainable_params(sizes, j), budget)
    rows += [{"name": f"lisa-g{g}", "settings": {"plan.name": "lisa", "plan.lisa_layers": g},
              "trainable": lisa_trainable_params(sizes, non_layer_params, g)},
             {"name": f"lora-r{r}", "settings": {"plan.name": "full", "plan.full_non_layers": False,
                                                 "plan.adapter": "lora", "plan.lora_rank": r,
                                                 **({"train.lr": float(lora_lr)} if lora_lr else {})},
              "trainable": r * int(lora_per_rank)},
             {"name": f"expand-p{p}", "settings": {"plan.name": "expand", "plan.expand_blocks": p},
              "trainable": expand_trainable_params(sizes, p)}]
    if spectrum:
        rows.append(spectrum_row(budget, spectrum))
    return rows
