"""Model references -> a local folder of plain safetensors + tokenizer (resolved once, on the driver).

(Interim: only local folders so far; hub ids, GGUF files and GGUF-in-wheel come next.)
"""

from __future__ import annotations

from pathlib import Path

import torch

from raycpt.errors import RaycptError


def pick_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def load_model(ref_or_path: str, dtype: str = "auto", device: str | None = None, cache_dir: str | None = None):
    """Load ``(model, tokenizer)`` from a model reference or a resolved folder, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = Path(ref_or_path)
    if not path.is_dir():
        raise RaycptError(f"model folder not found: {ref_or_path}")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(dtype, device)).to(device).eval()
    tok = AutoTokenizer.from_pretrained(path)
    return model, tok
