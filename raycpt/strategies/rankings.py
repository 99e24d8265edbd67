"""Layer ranking files (``raycpt.layer-ranking/1``, best first): written by ``raycpt contribution`` and the
selectors, read by the ``elite`` plan."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from raycpt.errors import RaycptError, read_user_text
from raycpt.io import atomic_write_json
from raycpt.strategies.registry import check_layer


RANKING_FORMAT = "raycpt.layer-ranking/1"


def write_ranking(path, model: str, num_layers: int, scores: dict[int, float], metric: str = "contribution",
                  extra: Optional[dict] = None) -> Path:
    """Write a layer ranking (best first) that the ``elite`` plan reads.

    Format (JSON)::

        {"format": "raycpt.layer-ranking/1", "model": "<ref>", "num_layers": N, "metric": "contribution",
         "ranking": [{"layer": 10, "score": 1.14}, {"layer": 12, "score": 1.12}, ...], ...extra}

    ``ranking`` is sorted by score, highest first (ties: lower layer first; NaN last); it may list a
    subset of the layers. Written atomically."""
    def key(item):
        i, s = item
        bad = s is None or not math.isfinite(float(s))
        return (1, 0.0, i) if bad else (0, -float(s), i)

    rows = []
    for i, s in sorted(((int(i), s) for i, s in scores.items()), key=key):
        check_layer(i, num_layers, "ranking layer")
        rows.append({"layer": i, "score": None if s is None or not math.isfinite(float(s)) else float(s)})
    doc = {"format": RANKING_FORMAT, "model": model, "num_layers": int(num_layers), "metric": metric,
           "ranking": rows}
    doc.update(extra or {})
    return atomic_write_json(Path(path), doc)


def read_ranking(path, num_layers: Optional[int] = None) -> dict:
    """Read and check a ranking file (see :func:`write_ranking`); the ranking comes back best first."""
    p = Path(path)
    text = read_user_text(p, "ranking file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise RaycptError(f"ranking file {p} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ranking"), list) or not doc["ranking"]:
        raise RaycptError(f"ranking file {p} needs a non-empty \"ranking\": [{{\"layer\": i, \"score\": x}}, ...]")
    n = doc.get("num_layers")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise RaycptError(f"ranking file {p}: \"num_layers\" is {n!r}; expected a positive integer")
    if num_layers is not None and n is not None and int(n) != num_layers:
        raise RaycptError(f"ranking file {p} is for a {n}-layer model, this model has {num_layers} layers")
    limit = num_layers if num_layers is not None else (int(n) if n is not None else None)
    seen, rows = set(), []
    for r in doc["ranking"]:
        if not isinstance(r, dict) or "layer" not in r:
            raise RaycptError(f"ranking file {p}: entry {r!r} needs a \"layer\"")
        i, s = r["layer"], r.get("score")
        if isinstance(i, bool) or not isinstance(i, int):
            raise RaycptError(f"ranking file {p}: layer {i!r} is not an integer")
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))):
            raise RaycptError(f"ranking file {p}: layer {i} has score {s!r}; expected a number or null")
        if limit is not None:
            check_layer(i, limit, f"ranking file {p.name}: layer")
        if i in seen:
            raise RaycptError(f"ranking file {p}: layer {i} is listed twice")
        seen.add(i)
        rows.append({"layer": int(i), "score": None if s is None else float(s)})

    def key(item):
        s = item["score"]
        return (1, 0.0, item["layer"]) if s is None or not math.isfinite(s) else (0, -s, item["layer"])

    doc["ranking"] = sorted(rows, key=key)
    return doc
