"""Hybrid builds: pretrained donor layers and fresh layers of another kind in one causal LM.

A hybrid is an ordered list of *segments*. Each segment is either a layer range ``[start, end)``
copied from a pretrained donor, or ``count`` fresh layers of a named kind (a Mamba2 block, a
NemotronH block, or the decoder layer of a transformers architecture such as llama or qwen3),
initialised by that architecture's own init and, with ``init: identity`` (the default), then made an
identity on the residual stream: every projection that writes to the stream (``o_proj``,
``down_proj``, Mamba2's ``out_proj``; :attr:`LayerKind.residual_writes`) is zeroed, so a new hybrid's
first loss is that of its donor layers alone. Embeddings, final norm and head come from one donor
(the *head donor*). Every segment is marked trainable or frozen; :func:`raycpt.models.hybrid.build.hybrid_plan` turns the
flags into a ``layers`` plan for training.

The model is a real transformers model, :class:`RaycptHybridForCausalLM` (config
:class:`RaycptHybridConfig`, ``model_type = "raycpt_hybrid"``), registered with ``AutoConfig`` and
``AutoModelForCausalLM`` whenever :mod:`raycpt.models` is imported (see ``raycpt/models/__init__``),
so ``AutoModelForCausalLM.from_pretrained(folder)`` loads a saved hybrid without
``trust_remote_code`` in Ray workers and in lm-eval. Its decoder keeps one flat ``layers``
ModuleList, so :class:`~raycpt.models.stack.LayerStack`, layer plans, trace and sweep work on it
unchanged.

Each segment's layers get the inputs their architecture expects: attention layers a causal (or
sliding-window) mask from transformers' mask utilities and rotary position embeddings from a
rotary module of that segment's own config; Mamba2 layers the recurrent padding mask; NemotronH
blocks the mask of their block type. The model keeps no cache: ``generate`` recomputes the whole
prefix at every step (fine for the 16-token answers of the benchmarks, and exact).

Assembly copies weights module by module with key and shape checks (nanoGPT's
``from_pretrained`` habit) and asserts that every parameter of the hybrid was written once.
"""

from __future__ import annotations

import importlib
import inspect
import math
from typing import Optional

import torch
from torch import nn
from transformers import AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from raycpt.errors import RaycptError
from raycpt.models.hybrid.config import MODEL_TYPE, RaycptHybridConfig, register_config
from raycpt.models.stack import TABLE, Architecture, register_architecture



# ------------------------------------------------------------------------------------------------
# layer kinds


LayerKind = Architecture
"""A hybrid layer kind is a row of THE architecture table (:class:`raycpt.models.stack.Architecture`)."""
KINDS: dict[str, LayerKind] = dict(TABLE)
ALIASES = {alias: a.name for a in TABLE.values() for alias in a.aliases}


def layer_kind(name: str, what: str = "layer kind") -> LayerKind:
    """The :class:`LayerKind` called ``name`` (aliases allowed), or one clear error."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in KINDS:
        raise RaycptError(f"{what}={name!r}: unknown layer kind; known kinds: {', '.join(sorted(KINDS))}")
    return KINDS[key]


def _cls(kind: LayerKind, name: str):
    mod = importlib.import_module(f"transformers.models.{kind.module}.modeling_{kind.module}")
    return getattr(mod, name)


def _config_cls(model_type: str):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def sub_config(kind: str, data: dict) -> PretrainedConfig:
    """A config object of architecture ``kind`` from a plain dict."""
    data = {k: v for k, v in data.items() if k not in ("model_type", "transformers_version", "architectures",
                                                       "_name_or_path")}
    return _config_cls(kind).from_dict(data)


DROP_KEYS = ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype", "auto_map",
              "quantization_config", "id2label", "label2id")


def _layer_lists(cfg: PretrainedConfig) -> list[str]:
    """Config attributes that hold one entry per layer (sliced when a layer range is copied)."""
    n = cfg.num_hidden_layers
    d = cfg.to_dict()
    return [k for k, v in d.items() if isinstance(v, (list, tuple)) and len(v) == n and n > 1
            and k in ("layer_types", "layers_block_type", "mlp_only_layers", "sliding_window_pattern_list")]


def slice_config(cfg: PretrainedConfig, start: int, end: int) -> dict:
    """Plain dict of ``cfg`` describing only layers ``[start, end)`` of it."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in DROP_KEYS}
    for k in _layer_lists(cfg):
        d[k] = list(d[k])[start:end]
    d["num_hidden_layers"] = end - start
    d["model_type"] = cfg.model_type
    return d


# ------------------------------------------------------------------------------------------------
# the transformers config and model


class RaycptHybridPreTrainedModel(PreTrainedModel):
    config_class = RaycptHybridConfig
    config: RaycptHybridConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _supports_flash_attn = False
    _supports_flex_attn = False
    _can_compile_fullgraph = False
    _no_split_modules = [k.layer_cls for k in KINDS.values()]

    @torch.no_grad()
    def _init_weights(self, module):
        """Generic init, plus what the layer kinds need that it does not cover.

        Rotary modules (non-persistent buffers only) are rebuilt from their own config, a scaled embedding's
        ``embed_scale`` (non-persistent) from its ``scalar_embed_scale``; Mamba2
        mixers get the S4D-real ``A_log``, ``D = 1`` and the ``dt_bias`` of their architectures.
        Assembly (:func:`build_hybrid`) overwrites every parameter with a donor's or with a fresh
        layer built by its own architecture's init, so this runs only for ``from_config``.
        """
        if hasattr(module, "scalar_embed_scale") and hasattr(module, "embed_scale"):  # Gemma's scaled embedding
            module.embed_scale.fill_(module.scalar_embed_scale)  # a non-persistent buffer: never in a checkpoint
        if "RotaryEmbedding" in type(module).__name__ and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name, buf in fresh.named_buffers(recurse=False):
                getattr(module, name).copy_(buf.to(getattr(module, name).device))
            return
        super()._init_weights(module)
        if all(hasattr(module, a) for a in ("A_log", "D", "dt_bias")):
            heads = module.A_log.shape[0]
            module.A_log.copy_(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))
            module.D.fill_(1.0)
            lo, hi = getattr(module, "time_step_min", 1e-3), getattr(module, "time_step_max", 0.1)
            floor = getattr(module, "time_step_floor", 1e-4)
            dt = torch.exp(torch.rand(heads) * (math.log(hi) - math.log(lo)) + math.log(lo)).clamp(min=floor)
            module.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))


class RaycptHybridModel(RaycptHybridPreTrainedModel):
    """Embeddings -> segments of layers -> final norm (the decoder; ``get_decoder()`` returns it)."""

    def __init__(self, config: RaycptHybridConfig):
        super().__init__(config)
        base_kind = layer_kind(config.base.get("model_type", "llama"), "hybrid head donor")
        base_cfg = sub_config(base_kind.name, config.base)
        pad = getattr(base_cfg, "pad_token_id", None)
        pad = pad if isinstance(pad, int) and 0 <= pad < config.vocab_size else None
        if base_kind.embed_cls:
            self.embed_tokens = _cls(base_kind, base_kind.embed_cls)(
                config.vocab_size, config.hidden_size, pad, embed_scale=config.hidden_size ** 0.5)
        else:
            self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, pad)
        self.norm = _cls(base_kind, base_kind.norm_cls)(config.hidden_size,
                                                         eps=getattr(base_cfg, base_kind.eps_attr))
        layers: list[nn.Module] = []
        rotary: dict[str, nn.Module] = {}
        self._seg_kinds: list[LayerKind] = []
        self._seg_cfgs: list[PretrainedConfig] = []
        for s, seg in enumerate(config.segments):
            kind = layer_kind(seg["kind"])
            cfg = sub_config(kind.name, seg["config"])
            try:
                cfg._attn_implementation = config._attn_implementation
            except Exception:  # pragma: no cover - an architecture without attention settings
                pass
            layer_cls = _cls(kind, kind.layer_cls)
            layers.extend(layer_cls(cfg, layer_idx=j) for j in range(int(seg["count"])))
            if kind.rotary_cls:
                rotary[str(s)] = _cls(kind, kind.rotary_cls)(cfg)
            self._seg_kinds.append(kind)
            self._seg_cfgs.append(cfg)
        self.layers = nn.ModuleList(layers)
        self.rotary = nn.ModuleDict(rotary)
        self.post_init()

    def get_input_embeddings(self):
        return self.embed_tokens

    def set_input_embeddings(self, value):
        self.embed_tokens = value

    # -------------------------------------------------------------- per-segment inputs
    def _segment_kwargs(self, s: int, h: torch.Tensor, attention_mask, position_ids) -> list[dict]:
        """Keyword arguments for every layer of segment ``s`` (masks and positions built once)."""
        from transformers.masking_utils import (LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING, create_causal_mask,
                                                create_recurrent_attention_mask)

        kind, cfg = self._seg_kinds[s], self._seg_cfgs[s]
        count = int(self.config.segments[s]["count"])
        mask_args = dict(config=cfg, inputs_embeds=h, attention_mask=attention_mask, cache=None,
                         position_ids=position_ids)
        if kind.call == "mamba2":
            mask = create_recurrent_attention_mask(config=cfg, inputs_embeds=h, attention_mask=attention_mask)
            return [dict(attention_mask=mask) for _ in range(count)]
        if kind.call == "nemotron_h":
            types = list(cfg.layers_block_type)
            masks = {"full_attention": create_causal_mask(**mask_args) if "full_attention" in types else None,
                     "linear_attention": create_recurrent_attention_mask(config=cfg, inputs_embeds=h,
                                                                         attention_mask=attention_mask)}
            return [dict(attention_mask=masks.get(t), position_ids=position_ids) for t in types]
        # attention kinds
        types = list(getattr(cfg, "layer_types", None) or ["full_attention"] * count)
        rot = self.rotary[str(s)]
        takes_type = "layer_type" in inspect.signature(rot.forward).parameters
        masks, pos_emb = {}, {}
        for t in sorted(set(types)):
            fn = LAYER_PATTERN_TO_MASK_FUNCTION_MAPPING.get(t, create_causal_mask)
            masks[t] = fn(**mask_args)
            pos_emb[t] = rot(h, position_ids, t) if takes_type else rot(h, position_ids)
        return [dict(attention_mask=masks[t], position_embeddings=pos_emb[t], position_ids=position_ids)
                for t in types]

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, inputs_embeds: Optional[torch.Tensor] = None,
                output_hidden_states: Optional[bool] = None, return_dict: Optional[bool] = None,
                **kwargs) -> BaseModelOutputWithPast:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids or inputs_embeds")
        h = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        if position_ids is None:
            position_ids = default_positions(attention_mask, h.shape[1], h.device)
        hidden = [h] if output_hidden_states else None
        i = 0
        for s, seg in enumerate(self.config.segments):
            for kw in self._segment_kwargs(s, h, attention_mask, position_ids):
                out = self.layers[i](h, **kw)
                h = out[0] if isinstance(out, (tuple, list)) else out
                i += 1
                if hidden is not None:
                    hidden.append(h)
        h = self.norm(h)
        if hidden is not None:  # transformers' convention: the last entry has the final norm applied
            hidden[-1] = h
        return BaseModelOutputWithPast(last_hidden_state=h, hidden_states=tuple(hidden) if hidden else None)


def default_positions(attention_mask: Optional[torch.Tensor], seq_len: int, device) -> torch.Tensor:
    """Position ids: 0..S-1, or counted over real tokens when a 2-D mask has padding (left padding)."""
    if attention_mask is not None and attention_mask.dim() == 2 and bool((attention_mask == 0).any()):
        pos = attention_mask.long().cumsum(-1) - 1
        return pos.clamp(min=0)[:, -seq_len:]
    return torch.arange(seq_len, device=device).unsqueeze(0)


class RaycptHybridForCausalLM(RaycptHybridPreTrainedModel, GenerationMixin):
    """Causal LM over a :class:`RaycptHybridModel`; no KV cache (generation recomputes the prefix)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: RaycptHybridConfig):
        super().__init__(config)
        self.model = RaycptHybridModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.embed_tokens

    def set_input_embeddings(self, value):
        self.model.embed_tokens = value

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def get_decoder(self):
        return self.model

    def set_decoder(self, decoder):
        self.model = decoder

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, inputs_embeds=None, logits_to_keep=None,
                                      **kwargs):
        """No cache: every step sees the whole sequence (positions are rebuilt from the mask); only the
        last position goes through the head (``logits_to_keep=1`` from ``generate``)."""
        out = {"input_ids": input_ids, "attention_mask": attention_mask}
        if logits_to_keep is not None:
            out["logits_to_keep"] = logits_to_keep
        return out

    def forward(self, input_ids: Optional[torch.LongTensor] = None, attention_mask: Optional[torch.Tensor] = None,
                position_ids: Optional[torch.LongTensor] = None, inputs_embeds: Optional[torch.Tensor] = None,
                labels: Optional[torch.LongTensor] = None, output_hidden_states: Optional[bool] = None,
                return_dict: Optional[bool] = None, logits_to_keep: int | torch.Tensor = 0,
                **kwargs) -> CausalLMOutputWithPast:
        for k in ("use_cache", "cache", "past_key_values", "cache_position", "output_attentions"):
            kwargs.pop(k, None)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         inputs_embeds=inputs_embeds, output_hidden_states=output_hidden_states)
        h = out.last_hidden_state
        sl = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(h[:, sl, :])
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        return CausalLMOutputWithPast(loss=loss, logits=logits, hidden_states=out.hidden_states)


_REGISTERED = False


def register() -> None:
    """Register the hybrid with AutoConfig / AutoModelForCausalLM and LayerStack (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    register_config()
    AutoModelForCausalLM.register(RaycptHybridConfig, RaycptHybridForCausalLM, exist_ok=True)
    register_architecture(MODEL_TYPE, embed="embed_tokens", layers="layers", norm="norm", head="lm_head")
    _REGISTERED = True


register()
