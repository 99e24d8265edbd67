"""Every rank's RNG states in a checkpoint: taken, split into tensors (``train_state.pt``) and plain lists
(``train_state.json``), merged back and set."""

from __future__ import annotations

import random

import numpy as np
import torch


def rng_state() -> dict:
    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    name, keys, pos, has_gauss, cached = st["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    version, internal, gauss = st["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    saved = st.get("cuda")
    if saved is not None and torch.cuda.is_available():
        # device i's state back on device i, for the devices both sides have: a restarted rank may see fewer
        # (a worker pinned to its one GPU now, eight at save time); restoring all would index a missing device
        for i in range(min(len(saved), torch.cuda.device_count())):
            torch.cuda.set_rng_state(saved[i], i)


def split_rng(rngs: list[dict]) -> tuple[dict, list[dict]]:
    """Every rank's RNG states -> (tensors for ``train_state.pt``, plain lists for the JSON)."""
    tensors = {"torch": [r["torch"] for r in rngs], "cuda": [list(r.get("cuda") or []) for r in rngs]}
    plain = []
    for r in rngs:
        name, keys, pos, has_gauss, cached = r["numpy"]
        version, internal, gauss = r["python"]
        plain.append({"numpy": [name, np.asarray(keys).tolist(), int(pos), int(has_gauss), float(cached)],
                      "python": [int(version), list(internal), gauss]})
    return tensors, plain


def merge_rng(tensors: dict, plain: list[dict]) -> list[dict]:
    out = []
    for i, p in enumerate(plain):
        cuda = tensors.get("cuda", [])[i] if i < len(tensors.get("cuda", [])) else []
        out.append({"torch": tensors["torch"][i], "numpy": p["numpy"], "python": p["python"], "cuda": cuda or None})
    return out
