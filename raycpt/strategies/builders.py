"""The registered plans, in registration order (the order ``plan.name``'s error and ``raycpt plan show`` list
them): full, train_shallow, train_deep, blocks, layers, single, middle, elite, lisa, expand, spectrum, elo."""

from __future__ import annotations

import math
from pathlib import Path

from raycpt.errors import RaycptError
from raycpt.models.expansion import expand_positions
from raycpt.splits import check_split, rule_line
from raycpt.strategies.rankings import read_ranking
from raycpt.strategies.registry import PlanSpec, check_layer, register_plan


@register_plan("full")
def _full(pcfg, n: int) -> PlanSpec:
    if not getattr(pcfg, "full_non_layers", True):  # equal footing: the non-layer flags of every other plan
        return PlanSpec(range(n), notes=["full (equal footing): every decoder layer; embeddings, final norm and "
                                         "head as plan.train_* say, like every other plan"])
    return PlanSpec(range(n), train_embeddings=True, train_final_norm=True, train_head=True,
                    notes=["full: every parameter trains (embeddings, final norm and head included)"])


@register_plan("train_shallow", takes_split=True)
def _train_shallow(pcfg, n: int) -> PlanSpec:
    b = check_split(pcfg.split, n, "plan.split")
    return PlanSpec(range(0, b), notes=[f"split {pcfg.split:g}: {rule_line(pcfg.split, n)}; "
                                        f"layers 0..{b - 1} train, {b}..{n - 1} frozen"])


@register_plan("train_deep", takes_split=True)
def _train_deep(pcfg, n: int) -> PlanSpec:
    b = check_split(pcfg.split, n, "plan.split")
    return PlanSpec(range(b, n), notes=[f"split {pcfg.split:g}: {rule_line(pcfg.split, n)}; "
                                        f"layers 0..{b - 1} frozen, {b}..{n - 1} train"])


def block_sizes(num_layers: int, num_blocks: int) -> list[int]:
    """Equal contiguous blocks; the first ``N mod B`` blocks hold one layer more (numpy.array_split)."""
    base, extra = divmod(num_layers, num_blocks)
    return [base + (1 if j < extra else 0) for j in range(num_blocks)]


@register_plan("blocks")
def _blocks(pcfg, n: int) -> PlanSpec:
    pattern = pcfg.pattern
    if not pattern or any(c not in "01" for c in pattern):
        raise RaycptError(f"plan.pattern={pattern!r}: the blocks plan needs a 0/1 pattern such as 01100")
    if len(pattern) > n:
        raise RaycptError(f"plan.pattern={pattern!r} has {len(pattern)} blocks but the model has only {n} layers")
    sizes = block_sizes(n, len(pattern))
    layers, start, spans = [], 0, []
    for c, size in zip(pattern, sizes):
        if c == "1":
            layers.extend(range(start, start + size))
        spans.append(f"{start}-{start + size - 1}")
        start += size
    note = f"blocks of {'/'.join(map(str, sizes))} layers ({', '.join(spans)})"
    if n % len(pattern):
        note += f"; {n} layers do not divide into {len(pattern)} blocks: the first {n % len(pattern)} hold one more"
    return PlanSpec(layers, notes=[note])


@register_plan("layers")
def _layers(pcfg, n: int) -> PlanSpec:
    return PlanSpec(sorted({check_layer(i, n, "plan.layers") for i in pcfg.layers}))


@register_plan("single")
def _single(pcfg, n: int) -> PlanSpec:
    return PlanSpec([check_layer(pcfg.layer, n, "plan.layer")])


@register_plan("middle")
def _middle(pcfg, n: int) -> PlanSpec:
    k = pcfg.k
    if k > n:
        raise RaycptError(f"plan.k={k}: the middle plan cannot take {k} layers of a {n}-layer model")
    start = (n - k) // 2
    return PlanSpec(range(start, start + k), notes=[f"middle {k} of {n}: layers {start}..{start + k - 1}"])


@register_plan("elite")
def _elite(pcfg, n: int) -> PlanSpec:
    if not pcfg.ranking_file:
        raise RaycptError("plan.ranking_file is not set: the elite plan reads its top-k layers from a ranking "
                          "JSON (e.g. written by raycpt contribution)")
    ranking = read_ranking(pcfg.ranking_file, num_layers=n)
    pick = getattr(pcfg, "elite_pick", "top")
    elite = ranked_pick(ranking["ranking"], pcfg.k, pick, where=str(pcfg.ranking_file))
    scales = {i: float(pcfg.elite_lr_scale) for i in elite}
    rest = bool(getattr(pcfg, "elite_train_rest", False))
    layers = range(n) if rest else elite
    what = "top" if pick == "top" else "bottom (the lowest-contribution control)"
    note = f"elite {what}-{pcfg.k} of {Path(pcfg.ranking_file).name}: {elite} at lr x{pcfg.elite_lr_scale:g}"
    note += "; the other layers also train at lr x1" if rest else "; the other layers are frozen"
    return PlanSpec(layers, lr_scales=scales, notes=[note])


def ranked_pick(rows, k: int, pick: str = "top", where: str = "the ranking") -> list[int]:
    """The ``k`` layers an elite plan takes from a ranking's rows (``[{"layer", "score"}]``), sorted by index.

    ``top``: the first k of the ranking (best first, as :func:`read_ranking` orders it); ``bottom``: the k
    lowest finite scores (ties: the lower layer; layers without a score are never picked)."""
    if pick not in ("top", "bottom"):
        raise RaycptError(f"plan.elite_pick={pick!r}: use top or bottom")
    if pick == "top":
        order = [r["layer"] for r in rows]
    else:
        scored = [r for r in rows if r["score"] is not None and math.isfinite(r["score"])]
        order = [r["layer"] for r in sorted(scored, key=lambda r: (r["score"], r["layer"]))]
    if k > len(order):
        kind = "layers" if pick == "top" else "layers with a score"
        raise RaycptError(f"plan.k={k}: {where} lists only {len(order)} {kind}")
    return sorted(int(i) for i in order[:k])


@register_plan("lisa")
def _lisa(pcfg, n: int) -> PlanSpec:
    g, k = pcfg.lisa_layers, pcfg.lisa_interval
    if g > n:
        raise RaycptError(f"plan.lisa_layers={g}: LISA cannot draw {g} layers of a {n}-layer model")
    every = f"every {k} steps" if k is not None else "every max(1, train.max_steps // 4) steps (plan.lisa_interval null)"
    return PlanSpec(range(n), train_embeddings=True, train_final_norm=True, train_head=True,
                    notes=[f"lisa: {every} a seeded draw of {g} of the {n} layers trains (seed "
                           f"{pcfg.lisa_seed}); embeddings, final norm and head always train; AdamW state of the "
                           "layers is reset at each draw, theirs kept (LMFlow's LISATrainer)"])


@register_plan("expand")
def _expand(pcfg, n: int) -> PlanSpec:
    """Built on the EXPANDED model (N + P layers; the launcher builds it, ``expanded_model_folder``)."""
    p = pcfg.expand_blocks
    if n - p < p:
        raise RaycptError(f"plan.expand_blocks={p}: block expansion inserts between 1 and {n - p} blocks into a "
                          f"{n - p}-layer model (the plan is built on the expanded model of {n} layers)")
    new = expand_positions(n - p, p)
    return PlanSpec(new, notes=[f"expand: {p} identity copies (o_proj, down_proj zeroed) at layers {new} of the "
                                f"expanded {n}; the {n - p} original layers are frozen"])


@register_plan("spectrum")
def _spectrum(pcfg, n: int) -> PlanSpec:
    """Spectrum (per weight type): the matrices ``plan.matrices`` names, plus the input embeddings and the LM head
    (the authors' script always unfreezes both); the final norm and the other tensors of those layers stay frozen."""
    chosen: dict[int, list[str]] = {}
    for m in pcfg.matrices:
        layer, _, module = str(m).partition(".")
        chosen.setdefault(check_layer(int(layer), n, "plan.matrices layer"), []).append(module)
    if not chosen:
        raise RaycptError("plan.matrices is empty: the spectrum plan trains the matrices it names (raycpt sweep "
                          "--budget fills it from Spectrum's per-type SNR selection)")
    count = sum(len(v) for v in chosen.values())
    return PlanSpec(sorted(chosen), train_embeddings=True, train_final_norm=False, train_head=True,
                    matrices={i: tuple(sorted(set(v))) for i, v in chosen.items()},
                    notes=[f"spectrum: {count} matrices in {len(chosen)} layers train, plus the input embeddings and "
                           "the LM head (Spectrum's rule); every other tensor is frozen"])


@register_plan("elo")
def _elo(pcfg, n: int) -> PlanSpec:
    """ELO (EACL 2026): only the first and the last ``plan.elo_layers`` decoder layers train (1: layers 0, N-1)."""
    k = pcfg.elo_layers
    if 2 * k > n:
        raise RaycptError(f"plan.elo_layers={k}: the elo plan trains the first and the last {k} layers, {2 * k} of "
                          f"this {n}-layer model's {n}; use plan.elo_layers <= {n // 2}")
    layers = sorted(set(range(k)) | set(range(n - k, n)))
    return PlanSpec(layers, notes=[f"elo: the first and the last {k} layer(s), {layers}"])
