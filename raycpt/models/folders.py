"""Model folders on disk: is a folder a model, which model a run folder published, and whether two
folders hold checkpoints of one architecture (``raycpt compare``'s precondition). Configs only: no weights."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from raycpt.errors import RaycptError, read_user_json


def is_model_folder(p: Path) -> bool:
    return (p / "config.json").is_file() and (any(p.glob("*.safetensors")) or any(p.glob("*.bin"))
                                              or any(p.glob("*.safetensors.index.json")))


def find_model_in_run(run_dir: Path) -> Optional[Path]:
    """The final model of a run folder (train run or sweep trial), or None.

    Looks for a ``final_model_dir`` recorded in ``result.json`` / ``state.json`` / ``train_result.json``,
    then for a ``final`` model folder, then for the newest model folder below the run folder."""
    run_dir = Path(run_dir)
    for name in ("result.json", "train_result.json", "state.json", "summary.json"):
        p = run_dir / name
        if p.is_file():
            try:
                data = read_user_json(p, "run file", shape=object)  # the bounded reader; a damaged one is skipped
            except RaycptError:
                continue
            fm = data.get("final_model_dir") if isinstance(data, dict) else None
            if fm and is_model_folder(Path(fm)):
                return Path(fm)
            if fm and is_model_folder(run_dir / fm):
                return run_dir / fm
    for cand in ("final", "final_model", "model"):
        if is_model_folder(run_dir / cand):
            return run_dir / cand
    found = [p.parent for p in run_dir.rglob("config.json") if is_model_folder(p.parent)]
    if not found:
        return None
    finals = [p for p in found if "final" in p.name]
    pool = finals or found
    return max(pool, key=lambda p: p.stat().st_mtime)


def check_pair(base_path: str, tuned_path: str) -> tuple[str, int]:
    """Architecture and layer count of both folders from their configs; RaycptError if they differ."""
    from transformers import AutoConfig

    ca, cb = AutoConfig.from_pretrained(base_path), AutoConfig.from_pretrained(tuned_path)
    ta, tb = getattr(ca, "model_type", None), getattr(cb, "model_type", None)
    if ta != tb:
        raise RaycptError(f"BASE and TUNED have different architectures: {ta!r} ({base_path}) vs {tb!r} "
                          f"({tuned_path}); compare needs two checkpoints of one architecture")
    na = getattr(ca, "num_hidden_layers", None)
    nb = getattr(cb, "num_hidden_layers", None)
    if na != nb:
        raise RaycptError(f"BASE and TUNED have different layer counts: {na} vs {nb}; compare needs two "
                          "checkpoints of one architecture")
    for key in ("hidden_size", "vocab_size", "intermediate_size"):
        va, vb = getattr(ca, key, None), getattr(cb, key, None)
        if va != vb:
            raise RaycptError(f"BASE and TUNED differ in {key}: {va} vs {vb}; compare needs one architecture")
    return ta, int(na)
