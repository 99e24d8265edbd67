"""The config class of a hybrid (``model_type = "raycpt_hybrid"``), kept apart from the model.

This module imports only transformers' configuration code, so ``raycpt.models`` can register it
with ``AutoConfig`` the moment transformers' auto-config module is imported (cheap, no modeling
code). The model class is registered with ``AutoModelForCausalLM`` the first time a hybrid config
is instantiated - which ``AutoModelForCausalLM.from_pretrained(folder)`` always does before it
looks the model class up - through :data:`on_new_config`, a hook that ``raycpt.models`` sets when
it registers this class (it imports :mod:`raycpt.models.hybrid.model`, which registers the model class).
This module never imports the model module: the model depends on the config, not the reverse.
"""

from __future__ import annotations

from typing import Callable, Optional

from transformers.configuration_utils import PretrainedConfig

MODEL_TYPE = "raycpt_hybrid"

#: Called by every new :class:`RaycptHybridConfig`; ``raycpt.models`` sets it (with the config's
#: registration) to a function that makes sure the model class is registered. None: nothing to do.
on_new_config: Optional[Callable[[], None]] = None


class RaycptHybridConfig(PretrainedConfig):
    """Config of a hybrid: the head donor's config plus one entry per segment.

    ``segments`` entries: ``kind`` (model_type of the layers), ``count``, ``trainable``, ``source``
    (human-readable origin: ``new`` or ``<donor ref> [start, end)``) and ``config`` (a plain dict
    of that architecture's config, ``num_hidden_layers = count``, per-layer lists sliced).
    ``base`` is the head donor's config (embeddings, final norm, head, norm epsilon).
    ``max_position_embeddings`` is the smallest limit of any segment (None = no limit).
    """

    model_type = MODEL_TYPE

    def __init__(self, segments: Optional[list[dict]] = None, base: Optional[dict] = None, vocab_size: int = 128,
                 hidden_size: int = 32, tie_word_embeddings: bool = False, initializer_range: float = 0.02,
                 final_logit_softcapping: Optional[float] = None, max_position_embeddings: Optional[int] = None,
                 **kwargs):
        self.segments = list(segments or [])
        self.base = dict(base or {"model_type": "llama"})
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.initializer_range = initializer_range
        self.final_logit_softcapping = final_logit_softcapping
        self.max_position_embeddings = max_position_embeddings
        self.num_hidden_layers = sum(int(s["count"]) for s in self.segments)
        self.use_cache = False
        kwargs.pop("use_cache", None)
        kwargs.pop("num_hidden_layers", None)
        super().__init__(tie_word_embeddings=tie_word_embeddings, **kwargs)
        if on_new_config is not None:
            on_new_config()

    @property
    def layer_kinds(self) -> list[str]:
        """The kind of every layer, in order."""
        return [s["kind"] for s in self.segments for _ in range(int(s["count"]))]

    @property
    def trainable_layers(self) -> list[int]:
        """Indices of the layers in trainable segments."""
        out, i = [], 0
        for s in self.segments:
            n = int(s["count"])
            if s.get("trainable", True):
                out.extend(range(i, i + n))
            i += n
        return out

    def segment_bounds(self) -> list[tuple[int, int]]:
        """``[start, end)`` of every segment in hybrid layer indices."""
        out, i = [], 0
        for s in self.segments:
            out.append((i, i + int(s["count"])))
            i += int(s["count"])
        return out


def register_config() -> None:
    """Register the config class with ``AutoConfig`` (idempotent)."""
    from transformers.models.auto.configuration_auto import AutoConfig

    AutoConfig.register(MODEL_TYPE, RaycptHybridConfig, exist_ok=True)
