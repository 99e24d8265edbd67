"""The value a plan builds: :class:`LayerPlan` (layer indices, per-layer LR scales, three flags, notes, the
adapter and LISA settings), model-agnostic and serialisable."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from raycpt.strategies.lisa import lisa_draw, lisa_interval_index


@dataclass(frozen=True)
class LayerPlan:
    """What trains. Model-agnostic: apply it with :func:`apply_plan`."""

    name: str
    num_layers: int
    trainable_layers: tuple[int, ...]
    lr_scales: dict[int, float] = field(default_factory=dict)
    """Per-layer LR multiplier for trainable layers (missing = 1.0)."""
    train_embeddings: bool = False
    train_final_norm: bool = False
    train_head: bool = False
    tied_embeddings: bool = False
    notes: tuple[str, ...] = ()
    """What the plan decided that the config did not say (tied embeddings, ignored scales, ...)."""
    adapter: str = "none"
    """``lora``: the trainable layers train LoRA adapters only (:mod:`raycpt.models.adapters`); their weights
    stay frozen."""
    lora_rank: int = 0
    lora_alpha: float = 0.0
    lora_rslora: bool = False
    """rsLoRA: the update is scaled by alpha / sqrt(r) (peft's ``use_rslora``) instead of alpha / r."""
    lora_targets: tuple[str, ...] = ()
    """Leaf names of the linear modules that get adapters; empty = every linear module of the layer."""
    lisa_layers: int = 0
    """``lisa``: gamma layers drawn per interval out of ``trainable_layers`` (the candidates); 0 = not LISA."""
    lisa_interval: int = 0
    lisa_seed: int = 0
    matrices: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """A matrix-level plan (Spectrum): trainable layer -> the module paths that train in it (weight and bias); a
    trainable layer not named here trains whole."""

    @property
    def frozen_layers(self) -> tuple[int, ...]:
        keep = set(self.trainable_layers)
        return tuple(i for i in range(self.num_layers) if i not in keep)

    @property
    def is_lisa(self) -> bool:
        return self.lisa_layers > 0

    def at_step(self, step: int) -> "LayerPlan":
        """The plan that trains at optimizer step ``step`` (1-based): itself, or for LISA the interval's plan
        whose ``trainable_layers`` are :func:`lisa_draw` of interval ``(step - 1) // K``."""
        if not self.is_lisa:
            return self
        j = lisa_interval_index(step, self.lisa_interval)
        return dataclasses.replace(self, trainable_layers=lisa_draw(self.lisa_seed, j, self.trainable_layers,
                                                                   self.lisa_layers))

    def lr_scale(self, layer: int) -> float:
        return float(self.lr_scales.get(layer, 1.0))

    def layer_map(self) -> str:
        """One character per layer, layer 0 first: ``T`` trains, ``.`` frozen (e.g. ``TTTT....``)."""
        keep = set(self.trainable_layers)
        return "".join("T" if i in keep else "." for i in range(self.num_layers))

    @property
    def first_trainable(self) -> Optional[int]:
        """The lowest trainable module: -1 = the embeddings, i = layer i, N = only norm/head, None = nothing."""
        if self.train_embeddings:
            return -1
        if self.trainable_layers:
            return min(self.trainable_layers)
        if self.train_final_norm or self.train_head:
            return self.num_layers
        return None

    def describe(self) -> str:
        parts = [f"{self.name}: {len(self.trainable_layers)}/{self.num_layers} layers train [{self.layer_map()}]"]
        extra = [n for n, on in (("embeddings", self.train_embeddings), ("final_norm", self.train_final_norm),
                                 ("head", self.train_head)) if on]
        parts.append("also " + ", ".join(extra) if extra else "embeddings/final_norm/head frozen")
        if self.adapter == "lora":
            parts.append(f"{'rsLoRA' if self.lora_rslora else 'LoRA'} r={self.lora_rank} alpha={self.lora_alpha:g} on "
                         f"{', '.join(self.lora_targets) or 'every linear module'} of those layers (their weights frozen)")
        if self.is_lisa:
            parts.append(f"LISA: {self.lisa_layers} of those layers per {self.lisa_interval} steps (seed {self.lisa_seed})")
        if self.matrices:
            parts.append(f"only {sum(map(len, self.matrices.values()))} named matrices of those layers")
        scaled = {i: s for i, s in self.lr_scales.items() if s != 1.0}
        if scaled:
            parts.append("lr scales " + ", ".join(f"{i}:{s:g}" for i, s in sorted(scaled.items())))
        return "; ".join(parts)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["trainable_layers"] = list(self.trainable_layers)
        d["lr_scales"] = {str(k): v for k, v in self.lr_scales.items()}
        d["notes"] = list(self.notes)
        d["lora_targets"] = list(self.lora_targets)
        d["matrices"] = {str(k): list(v) for k, v in self.matrices.items()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LayerPlan":
        d = dict(d)
        d["trainable_layers"] = tuple(int(i) for i in d["trainable_layers"])
        d["lr_scales"] = {int(k): float(v) for k, v in d.get("lr_scales", {}).items()}
        d["notes"] = tuple(d.get("notes", ()))
        d["lora_targets"] = tuple(d.get("lora_targets", ()))
        d["matrices"] = {int(k): tuple(v) for k, v in d.get("matrices", {}).items()}
        return cls(**d)
