"""Block expansion (LLaMA-Pro): identity copies of each group's last layer inserted into a base model, built as
a hybrid and cached."""

from __future__ import annotations

from pathlib import Path

from raycpt.errors import RaycptError
from raycpt.models.hybrid_build import build_hybrid, save_hybrid
from raycpt.models.hybrid_plans import _donor_config, plan_hybrid
from raycpt.models.model_cache import cache_root


# ------------------------------------------------------------------------------------------------
# block expansion (LLaMA-Pro)


def expand_groups(num_layers: int, blocks: int) -> list[tuple[int, int]]:
    """The ``blocks`` groups ``[start, end)`` of the ``num_layers`` base layers that each get one new block
    after them: equal contiguous groups, the first ``N mod P`` one layer longer (``numpy.array_split``)."""
    if not 1 <= blocks <= num_layers:
        raise RaycptError(f"plan.expand_blocks={blocks}: block expansion inserts between 1 and {num_layers} "
                          f"blocks into this {num_layers}-layer model")
    base, extra = divmod(num_layers, blocks)
    out, start = [], 0
    for g in range(blocks):
        size = base + (1 if g < extra else 0)
        out.append((start, start + size))
        start += size
    return out


def expand_positions(num_layers: int, blocks: int) -> list[int]:
    """Indices of the new blocks in the expanded model of ``num_layers + blocks`` layers (the copy of each
    group's last layer sits right after the group): N=4, P=2 -> [2, 5]."""
    return [end + g for g, (_, end) in enumerate(expand_groups(num_layers, blocks))]


def expand_segments(donor: str, num_layers: int, blocks: int) -> list[dict]:
    """Hybrid segments of a LLaMA-Pro expansion: each group of base layers (frozen), then a copy of the group's
    last layer with its residual-stream projections zeroed (``o_proj``, ``down_proj``: an identity), trainable."""
    segs = []
    for a, b in expand_groups(num_layers, blocks):
        segs.append({"donor": donor, "layers": [a, b], "trainable": False})
        segs.append({"donor": donor, "layers": [b - 1, b], "trainable": True, "zero_writes": True})
    return segs


def expand_trainable_params(layer_params, blocks: int) -> int:
    """Trainable parameters of a P-block expansion: the copied layers (each group's last), from a count per
    base decoder layer. What a budget picks the nearest P with."""
    sizes = [int(x) for x in layer_params]
    return sum(sizes[b - 1] for _, b in expand_groups(len(sizes), blocks))


def build_expanded(base_path: str, blocks: int, model_cfg=None):
    """``(model, tokenizer)``: the base model at ``base_path`` with ``blocks`` identity copies inserted
    (:func:`expand_segments`), assembled by :func:`build_hybrid` (HF-loadable, its first loss the base's)."""
    n = _donor_config(base_path).num_hidden_layers
    plan = plan_hybrid(expand_segments(base_path, n, blocks), base_path, name=f"expand{blocks}", model_cfg=model_cfg)
    return build_hybrid(plan)


EXPAND_MARK = "raycpt_expand.json"


def expanded_model_folder(base_path: str, blocks: int, cache_dir=None) -> Path:
    """The expanded model of ``base_path`` with ``blocks`` new blocks, built once into
    ``<cache>/expanded/<base>-x<P>-<hash>`` (written aside and renamed: :func:`save_hybrid`) and reused while
    the base folder's files are unchanged (the hash covers its path and its weight files' sizes and times)."""
    import hashlib
    import json

    base = Path(base_path).resolve()
    stamp = [str(base), str(int(blocks))] + [f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}"
                                             for f in sorted(base.glob("*.safetensors"))]
    key = hashlib.sha256("|".join(stamp).encode()).hexdigest()[:12]
    folder = cache_root(cache_dir) / "expanded" / f"{base.name}-x{int(blocks)}-{key}"
    if (folder / EXPAND_MARK).is_file() and (folder / "config.json").is_file():
        return folder
    model, tok = build_expanded(str(base), int(blocks))
    save_hybrid(model, tok, folder)
    mark = {"base": str(base), "blocks": int(blocks), "new_layers": list(model.config.trainable_layers)}
    (folder / EXPAND_MARK).write_text(json.dumps(mark, indent=2) + "\n", encoding="utf-8")
    return folder
