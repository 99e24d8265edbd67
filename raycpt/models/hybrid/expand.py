"""Block expansion (LLaMA-Pro): identity copies of each group's last layer inserted into a base model, built as
a hybrid and cached."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from raycpt.models.expansion import expand_groups
from raycpt.models.hybrid.build import build_hybrid, save_hybrid
from raycpt.models.hybrid.plans import donor_config, plan_hybrid
from raycpt.models.model_cache import cache_root


# ------------------------------------------------------------------------------------------------
# block expansion (LLaMA-Pro)


def expand_segments(donor: str, num_layers: int, blocks: int) -> list[dict]:
    """Hybrid segments of a LLaMA-Pro expansion: each group of base layers (frozen), then a copy of the group's
    last layer with its residual-stream projections zeroed (``o_proj``, ``down_proj``: an identity), trainable."""
    segs = []
    for a, b in expand_groups(num_layers, blocks):
        segs.append({"donor": donor, "layers": [a, b], "trainable": False})
        segs.append({"donor": donor, "layers": [b - 1, b], "trainable": True, "zero_writes": True})
    return segs


def build_expanded(base_path: str, blocks: int, model_cfg=None):
    """``(model, tokenizer)``: the base model at ``base_path`` with ``blocks`` identity copies inserted
    (:func:`expand_segments`), assembled by :func:`build_hybrid` (HF-loadable, its first loss the base's)."""
    n = donor_config(base_path).num_hidden_layers
    plan = plan_hybrid(expand_segments(base_path, n, blocks), base_path, name=f"expand{blocks}", model_cfg=model_cfg)
    return build_hybrid(plan)


EXPAND_MARK = "raycpt_expand.json"


def expanded_model_folder(base_path: str, blocks: int, cache_dir=None) -> Path:
    """The expanded model of ``base_path`` with ``blocks`` new blocks, built once into
    ``<cache>/expanded/<base>-x<P>-<hash>`` (written aside and renamed: :func:`save_hybrid`) and reused while
    the base folder's files are unchanged (the hash covers its path and its weight files' sizes and times)."""
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
