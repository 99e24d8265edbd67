"""Hybrid builds: pretrained donor layers and fresh layers of another kind in one causal LM.

A hybrid is an ordered list of *segments*. Each segment is either a layer range ``[start, end)``
copied from a pretrained donor, or ``count`` fresh layers of a named kind (a Mamba2 block, a
NemotronH block, or the decoder layer of a transformers architecture such as llama or qwen3),
initialised by that architecture's own init and, with ``init: identity`` (the default), then made an
identity on the residual stream: every projection that writes to the stream (``o_proj``,
``down_proj``, Mamba2's ``out_proj``; :attr:`LayerKind.residual_writes`) is zeroed, so a new hybrid's
first loss is that of its donor layers alone. Embeddings, final norm and head come from one donor
(the *head donor*). Every segment is marked trainable or frozen; :func:`hybrid_plan` turns the
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PretrainedConfig, PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from raycpt.config import ModelConfig
from raycpt.errors import RaycptError
from raycpt.models.hybrid_config import MODEL_TYPE, RaycptHybridConfig, register_config
from raycpt.models.sources import resolve_model_path
from raycpt.models.stack import TABLE, Architecture, register_architecture, tied_embeddings



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


_DROP_KEYS = ("architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype", "auto_map",
              "quantization_config", "id2label", "label2id")


def _layer_lists(cfg: PretrainedConfig) -> list[str]:
    """Config attributes that hold one entry per layer (sliced when a layer range is copied)."""
    n = cfg.num_hidden_layers
    d = cfg.to_dict()
    return [k for k, v in d.items() if isinstance(v, (list, tuple)) and len(v) == n and n > 1
            and k in ("layer_types", "layers_block_type", "mlp_only_layers", "sliding_window_pattern_list")]


def slice_config(cfg: PretrainedConfig, start: int, end: int) -> dict:
    """Plain dict of ``cfg`` describing only layers ``[start, end)`` of it."""
    d = {k: v for k, v in cfg.to_dict().items() if k not in _DROP_KEYS}
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

        Rotary modules (non-persistent buffers only) are rebuilt from their own config; Mamba2
        mixers get the S4D-real ``A_log``, ``D = 1`` and the ``dt_bias`` of their architectures.
        Assembly (:func:`build_hybrid`) overwrites every parameter with a donor's or with a fresh
        layer built by its own architecture's init, so this runs only for ``from_config``.
        """
        if "RotaryEmbedding" in type(module).__name__ and hasattr(module, "config"):
            fresh = type(module)(module.config)
            for name, buf in fresh.named_buffers(recurse=False):
                getattr(module, name).copy_(buf.to(getattr(module, name).device))
            return
        super()._init_weights(module)
        if all(hasattr(module, a) for a in ("A_log", "D", "dt_bias")):
            import math

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


# ------------------------------------------------------------------------------------------------
# the spec: segments -> resolved plan (configs only, no weights)


@dataclass
class Segment:
    """One resolved segment of a hybrid (configs only; no weights yet)."""

    kind: str
    """Layer kind (transformers model_type)."""
    count: int
    """Number of layers."""
    trainable: bool
    """Whether the segment trains."""
    config: dict
    """Plain config dict of the segment's architecture (``num_hidden_layers = count``)."""
    donor: Optional[str] = None
    """Donor reference (None = new layers)."""
    donor_path: Optional[str] = None
    """Resolved donor folder."""
    layers: Optional[tuple[int, int]] = None
    """Donor layer range [start, end)."""
    init_seed: int = 0
    """Seed of the fresh init (new layers)."""
    init: str = "identity"
    """New layers: ``identity`` (residual writes zeroed, :func:`zero_residual_writes`) or ``fresh``."""
    zero_writes: bool = False
    """Donor layers: zero their residual-stream projections after the copy (block expansion's identity copies)."""

    @property
    def source(self) -> str:
        return "new" if self.donor is None else f"{self.donor} [{self.layers[0]}, {self.layers[1]})"


@dataclass
class HybridPlan:
    """A hybrid resolved against its donors' configs: what :func:`build_hybrid` will assemble."""

    name: str
    """Build name (``new_shallow``, ``new_deep``, ``custom``)."""
    segments: list[Segment]
    head_donor: str
    """Reference of the donor of embeddings, final norm and head."""
    head_path: str
    """Its resolved folder."""
    base: dict = field(default_factory=dict)
    """Head donor's config as a plain dict."""

    @property
    def num_layers(self) -> int:
        return sum(s.count for s in self.segments)

    @property
    def trainable_layers(self) -> list[int]:
        out, i = [], 0
        for s in self.segments:
            if s.trainable:
                out.extend(range(i, i + s.count))
            i += s.count
        return out


def resolve_donor(ref: str, model_cfg=None) -> str:
    """A donor reference -> its local folder, through the one resolver
    (:func:`raycpt.models.sources.resolve_model_path`) under ``model_cfg``'s cache and hub revision
    (a :class:`raycpt.config.ModelConfig`; None = the defaults)."""
    return resolve_model_path(model_cfg or ModelConfig(ref=str(ref)), str(ref))


def _donor_config(path: str) -> PretrainedConfig:
    return AutoConfig.from_pretrained(path)


def new_layer_config(kind: LayerKind, count: int, base: PretrainedConfig, overrides: dict) -> dict:
    """Config dict for ``count`` fresh layers of ``kind`` with the head donor's hidden size.

    Attention kinds inherit the donor's attention geometry when the donor is an attention model;
    Mamba2-style kinds get ``expand * hidden`` inner width in heads of 64 (or the largest of
    32/16/8 that divides it). ``overrides`` (the segment's ``config``) win over everything.
    """
    hidden = base.hidden_size
    d: dict[str, Any] = dict(hidden_size=hidden, vocab_size=8, num_hidden_layers=count,
                             initializer_range=getattr(base, "initializer_range", 0.02))
    base_kind = KINDS.get(ALIASES.get(base.model_type, base.model_type))
    if kind.call == "attention":
        if base_kind is not None and base_kind.call == "attention" and base_kind.name == kind.name:
            d.update(slice_config(base, 0, 1))
            d.update(hidden_size=hidden, vocab_size=8, num_hidden_layers=count)
            d.pop("layer_types", None)
        elif base_kind is not None and base_kind.call == "attention":
            for k in ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                      "max_position_embeddings", "rms_norm_eps", "rope_parameters", "hidden_act"):
                if getattr(base, k, None) is not None:
                    d[k] = getattr(base, k)
        else:
            heads = max(1, hidden // 64)
            while hidden % heads:
                heads -= 1
            d.update(num_attention_heads=heads, num_key_value_heads=heads, head_dim=hidden // heads,
                     intermediate_size=4 * hidden)
    elif kind.call in ("mamba2", "nemotron_h"):
        expand = int(overrides.get("expand", 2))
        inner = expand * hidden
        head_dim = int(overrides.get("head_dim" if kind.call == "mamba2" else "mamba_head_dim",
                                     next((c for c in (64, 32, 16, 8) if inner % c == 0), 1)))
        heads = max(1, inner // head_dim)
        if kind.call == "mamba2":
            d.update(expand=expand, head_dim=head_dim, num_heads=heads, state_size=64, n_groups=1)
        else:
            d.update(expand=expand, mamba_head_dim=head_dim, mamba_num_heads=heads, ssm_state_size=64, n_groups=1,
                     layers_block_type=(["linear_attention", "mlp"] * count)[:count],
                     intermediate_size=4 * hidden)
            heads_a = max(1, hidden // 64)
            while hidden % heads_a:
                heads_a -= 1
            d.update(num_attention_heads=heads_a, num_key_value_heads=heads_a, head_dim=hidden // heads_a)
        eps = getattr(base, "rms_norm_eps", None) or getattr(base, "layer_norm_epsilon", None)
        if eps:
            d["layer_norm_epsilon"] = eps
    d.update(overrides)
    d["num_hidden_layers"] = count
    d["model_type"] = kind.name
    return d


def shorthand_segments(build: str, donor: str, donor_layers: int, depth: Optional[int], new_kind: str,
                       new_config: Optional[dict] = None, init_seed: int = 0, init: str = "identity") -> list[dict]:
    """The paper's two builds as segment dicts (1:1 ratio: ``depth/2`` new + ``depth/2`` donor layers).

    ``new_shallow``: new layers first (trained), then the donor's *deep* layers (frozen).
    ``new_deep``: the donor's *shallow* layers first (trained), then new layers (frozen).
    """
    depth = donor_layers if depth is None else int(depth)
    if depth < 2 or depth % 2:
        raise RaycptError(f"hybrid.depth={depth}: must be an even number >= 2 (half new layers, half donor layers)")
    half = depth // 2
    if half > donor_layers:
        raise RaycptError(f"hybrid.depth={depth}: needs {half} donor layers but the donor has {donor_layers}; "
                          f"use a depth <= {2 * donor_layers}")
    new = dict(new=new_kind, count=half, config=dict(new_config or {}), init_seed=init_seed, init=init)
    if build == "new_shallow":
        return [dict(new, trainable=True), dict(donor=donor, layers=[donor_layers - half, donor_layers],
                                                trainable=False)]
    if build == "new_deep":
        return [dict(donor=donor, layers=[0, half], trainable=True), dict(new, trainable=False)]
    raise RaycptError(f"hybrid build {build!r}: unknown; use new_shallow, new_deep or custom")


def plan_hybrid(segments: list[dict], head_donor: str, name: str = "custom", model_cfg=None) -> HybridPlan:
    """Check and resolve a segment list against the donors' configs (no weights are loaded).

    Each segment dict is ``{donor, layers: [start, end), trainable}`` or
    ``{new: kind, count, trainable, init_seed?, init?, config?}`` (``init``: ``identity``, the default,
    or ``fresh``). Raises one :class:`RaycptError` per
    problem: empty list, unknown kind, a range outside the donor, a hidden-size mismatch.
    """
    if not segments:
        raise RaycptError("hybrid.segments=[]: a hybrid needs at least one segment "
                          "({donor: REF, layers: [start, end)} or {new: KIND, count: N})")
    head_path = resolve_donor(head_donor, model_cfg)
    base = _donor_config(head_path)
    layer_kind(base.model_type, f"hybrid head donor {head_donor!r} (model_type)")
    hidden = base.hidden_size
    donors: dict[str, tuple[str, PretrainedConfig]] = {str(head_donor): (head_path, base)}
    out: list[Segment] = []
    for i, seg in enumerate(segments):
        where = f"hybrid.segments[{i}]"
        seg = dict(seg)
        if seg.get("new"):
            kind = layer_kind(seg["new"], f"{where}.new")
            count = int(seg.get("count") or 0)
            if count < 1:
                raise RaycptError(f"{where}.count={seg.get('count')!r}: new layers need a count >= 1")
            overrides = dict(seg.get("config") or {})
            if int(overrides.get("hidden_size", hidden)) != hidden:
                raise RaycptError(f"{where} ({kind.name}, new) has hidden size {overrides['hidden_size']} but the "
                                  f"head donor {head_donor!r} has {hidden}: all segments must share one hidden size")
            cfg = new_layer_config(kind, count, base, overrides)
            try:
                sub = sub_config(kind.name, cfg)
            except Exception as e:  # transformers' config validators raise several types
                msg = " ".join(str(getattr(e, "__cause__", None) or e).split())
                raise RaycptError(f"{where}.config: not a valid {kind.name} config: {msg}") from None
            if sub.hidden_size != hidden:  # pragma: no cover - hidden_size is set from the donor above
                raise RaycptError(f"{where} ({kind.name}, new) has hidden size {sub.hidden_size} but the head donor "
                                  f"{head_donor!r} has {hidden}: all segments must share one hidden size")
            out.append(Segment(kind=kind.name, count=count, trainable=bool(seg.get("trainable", True)),
                               config=cfg, init_seed=int(seg.get("init_seed") or 0),
                               init=init_mode(seg.get("init"), f"{where}.init")))
            continue
        ref = seg.get("donor") or head_donor
        if str(ref) not in donors:
            path = resolve_donor(ref, model_cfg)
            donors[str(ref)] = (path, _donor_config(path))
        path, dcfg = donors[str(ref)]
        kind = layer_kind(dcfg.model_type, f"{where}.donor {ref!r} (model_type)")
        rng = seg.get("layers")
        n = dcfg.num_hidden_layers
        if not isinstance(rng, (list, tuple)) or len(rng) != 2:
            raise RaycptError(f"{where}.layers={rng!r}: give a donor layer range [start, end)")
        a, b = int(rng[0]), int(rng[1])
        if not (0 <= a < b <= n):
            raise RaycptError(f"{where}.layers=[{a}, {b}): outside donor {ref!r}, which has {n} layers "
                              f"(allowed: 0 <= start < end <= {n})")
        if dcfg.hidden_size != hidden:
            raise RaycptError(f"{where} (donor {ref!r} layers [{a}, {b})) has hidden size {dcfg.hidden_size} but "
                              f"the head donor {head_donor!r} has {hidden}: all segments must share one hidden size")
        out.append(Segment(kind=kind.name, count=b - a, trainable=bool(seg.get("trainable", True)),
                           config=slice_config(dcfg, a, b), donor=str(ref), donor_path=path, layers=(a, b),
                           zero_writes=bool(seg.get("zero_writes", False))))
    base_dict = {k: v for k, v in base.to_dict().items() if k not in _DROP_KEYS}
    return HybridPlan(name=name, segments=out, head_donor=str(head_donor), head_path=head_path, base=base_dict)


def plan_from_config(hcfg, build: str, model_ref: str, model_cfg=None) -> HybridPlan:
    """Resolve build ``build`` of a :class:`raycpt.config.HybridConfig` (``model_ref`` = default donor;
    ``model_cfg``: the :class:`raycpt.config.ModelConfig` whose cache and revision donors resolve under)."""
    donor = hcfg.donor or model_ref
    head = hcfg.head_donor or donor
    if build == "custom":
        segs = [{**vars(s), "init": s.init or hcfg.init} for s in hcfg.segments]
        return plan_hybrid(segs, head, name="custom", model_cfg=model_cfg)
    layer_kind(hcfg.new_kind, "hybrid.new_kind")
    path = resolve_donor(donor, model_cfg)
    n = _donor_config(path).num_hidden_layers
    segs = shorthand_segments(build, donor, n, hcfg.depth, hcfg.new_kind, hcfg.new_config, hcfg.init_seed,
                              hcfg.init)
    return plan_hybrid(segs, head, name=build, model_cfg=model_cfg)


# ------------------------------------------------------------------------------------------------
# assembly


def copy_module(dst: nn.Module, src: nn.Module, what: str) -> int:
    """Copy ``src``'s parameters and persistent buffers into ``dst``; keys and shapes must match.

    Returns the number of tensors copied."""
    sd_dst, sd_src = dst.state_dict(), src.state_dict()
    if set(sd_dst) != set(sd_src):
        missing, extra = sorted(set(sd_dst) - set(sd_src)), sorted(set(sd_src) - set(sd_dst))
        raise RaycptError(f"hybrid: cannot copy {what}: keys differ (missing {missing[:4]}, unexpected {extra[:4]})")
    with torch.no_grad():
        for k, v in sd_src.items():
            if sd_dst[k].shape != v.shape:
                raise RaycptError(f"hybrid: cannot copy {what}.{k}: shape {tuple(v.shape)} into "
                                  f"{tuple(sd_dst[k].shape)}")
            sd_dst[k].copy_(v)
    return len(sd_src)


INIT_MODES = ("identity", "fresh")


def init_mode(value, what: str = "hybrid.init") -> str:
    """``value`` as an init mode (None = ``identity``), or one clear error."""
    value = "identity" if value is None else str(value)
    if value not in INIT_MODES:
        raise RaycptError(f"{what}={value!r}: unknown init; use identity (new layers start as an identity on "
                          "the residual stream) or fresh (their architecture's own init)")
    return value


def zero_residual_writes(layer: nn.Module, kind: LayerKind) -> list[str]:
    """Zero every parameter of ``layer`` that writes to the residual stream (``kind.residual_writes``):
    the layer then returns its input unchanged. Returns the zeroed parameter names."""
    zeroed = []
    with torch.no_grad():
        for name, p in layer.named_parameters():
            owner = name.rsplit(".", 1)[0] if name.endswith((".weight", ".bias")) else name
            if owner in kind.residual_writes:
                p.zero_()
                zeroed.append(name)
    if not zeroed:  # pragma: no cover - a layer class whose module names changed
        raise RuntimeError(f"hybrid init identity: no residual-stream projection {kind.residual_writes} "
                           f"in a {kind.layer_cls}")
    return zeroed


def _fresh_layers(seg: Segment) -> nn.ModuleList:
    """``seg.count`` layers initialised by their own architecture's init (seeded); with
    ``seg.init == "identity"`` their residual-stream projections are then zeroed."""
    from transformers import AutoModel

    cfg = sub_config(seg.kind, dict(seg.config, vocab_size=8))
    torch.manual_seed(seg.init_seed)
    base = AutoModel.from_config(cfg, dtype=torch.float32)
    if init_mode(seg.init) == "identity":
        for layer in base.layers:
            zero_residual_writes(layer, KINDS[seg.kind])
    return base.layers


def build_hybrid(plan: HybridPlan, dtype: torch.dtype = torch.float32, progress: bool = False):
    """Assemble the hybrid of ``plan``: returns ``(model, tokenizer)`` (the head donor's tokenizer).

    Every parameter of the new model is written exactly once: embeddings, final norm and head from
    the head donor; donor layer ranges copied layer by layer; new layers from a freshly initialised
    model of their kind. Shapes are checked on every copy."""
    from transformers import AutoTokenizer

    from raycpt.models.sources import load_model

    head_model, _ = load_model(plan.head_path, dtype="float32", device="cpu")
    head_cfg = head_model.config
    config = RaycptHybridConfig(
        segments=[dict(kind=s.kind, count=s.count, trainable=s.trainable, source=s.source, config=s.config,
                       **({"init": s.init} if s.donor is None else {}),
                       **({"zero_writes": True} if s.zero_writes else {})) for s in plan.segments],
        base=plan.base, vocab_size=head_cfg.vocab_size, hidden_size=head_cfg.hidden_size,
        tie_word_embeddings=tied_embeddings(head_cfg),
        initializer_range=getattr(head_cfg, "initializer_range", 0.02),
        final_logit_softcapping=getattr(head_cfg, "final_logit_softcapping", None),
        max_position_embeddings=min((int(s.config["max_position_embeddings"]) for s in plan.segments
                                     if s.config.get("max_position_embeddings")), default=None),
        bos_token_id=getattr(head_cfg, "bos_token_id", None), eos_token_id=getattr(head_cfg, "eos_token_id", None),
        pad_token_id=getattr(head_cfg, "pad_token_id", None))
    model = RaycptHybridForCausalLM(config).to(torch.float32)
    from raycpt.models.stack import LayerStack

    head = LayerStack(head_model)
    written: set[str] = set()
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}

    def mark(module: nn.Module):
        for p in module.parameters():
            written.add(names[id(p)])

    copy_module(model.model.embed_tokens, head.embed, "embeddings")
    copy_module(model.model.norm, head.final_norm, "final norm")
    mark(model.model.embed_tokens)
    mark(model.model.norm)
    if not tied_embeddings(config):
        copy_module(model.lm_head, head.head, "head")
    mark(model.lm_head)
    donors: dict[str, Any] = {plan.head_path: head}
    i = 0
    bar = _progress(len(plan.segments), progress)
    for s, seg in enumerate(plan.segments):
        if seg.donor is None:
            src_layers = _fresh_layers(seg)
        else:
            if seg.donor_path not in donors:
                donors[seg.donor_path] = LayerStack(load_model(seg.donor_path, dtype="float32", device="cpu")[0])
            src_layers = donors[seg.donor_path].layers[seg.layers[0]:seg.layers[1]]
        for j, src in enumerate(src_layers):
            what = f"segment {s} layer {j} ({seg.source})"
            copy_module(model.model.layers[i], src, what)
            if seg.zero_writes:  # an identity copy (block expansion): the layer returns its input
                zero_residual_writes(model.model.layers[i], KINDS[seg.kind])
            mark(model.model.layers[i])
            i += 1
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    unwritten = [n for n in names.values() if n not in written]
    if unwritten:  # pragma: no cover - a bug in assembly, not user input
        raise RuntimeError(f"hybrid assembly left parameters unwritten: {unwritten[:5]}")
    model = model.to(dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(plan.head_path)
    del donors, head_model
    return model, tokenizer


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="assemble hybrid", unit="segment")


def save_hybrid(model: PreTrainedModel, tokenizer, folder: str | Path) -> Path:
    """Write model (safetensors) + tokenizer into ``folder`` atomically (write aside, rename)."""
    import os
    import shutil
    import uuid

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".{folder.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)
        os.replace(tmp, folder)  # a file in the way: NotADirectoryError / IsADirectoryError, and no tmp left
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


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

    from raycpt.models.sources import cache_root

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


# ------------------------------------------------------------------------------------------------
# summaries


def hybrid_plan(model_or_config) -> dict:
    """The layer plan of a hybrid: a ``layers`` plan listing the layers of its trainable segments."""
    cfg = getattr(model_or_config, "config", model_or_config)
    return {"name": "layers", "layers": list(cfg.trainable_layers)}


def segment_rows(model: RaycptHybridForCausalLM) -> list[dict]:
    """One row per part: embeddings, each segment, final norm, head (params counted once)."""
    rows = []
    seen: set[int] = set()

    def count(module) -> int:
        n = 0
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    inner = model.model
    rows.append(dict(segment="embed", kind=inner.config.base.get("model_type"), layers="-", source="head donor",
                     trainable=None, params=count(inner.embed_tokens)))
    for s, ((a, b), seg) in enumerate(zip(model.config.segment_bounds(), model.config.segments)):
        n = sum(count(inner.layers[j]) for j in range(a, b))
        rows.append(dict(segment=str(s), kind=seg["kind"], layers=f"[{a}, {b})", source=seg.get("source", ""),
                         trainable=bool(seg.get("trainable", True)), params=n))
    rows.append(dict(segment="norm", kind=inner.config.base.get("model_type"), layers="-", source="head donor",
                     trainable=None, params=count(inner.norm)))
    rows.append(dict(segment="head", kind="tied" if tied_embeddings(model.config) else "linear", layers="-",
                     source="head donor", trainable=None, params=count(model.lm_head)))
    return rows


def param_counts(model: nn.Module) -> dict[str, int]:
    """Total parameters and those in trainable segments / frozen segments (layers only)."""
    cfg = model.config
    layers = model.model.layers
    train = set(cfg.trainable_layers)
    t = sum(p.numel() for i, l in enumerate(layers) if i in train for p in l.parameters())
    f = sum(p.numel() for i, l in enumerate(layers) if i not in train for p in l.parameters())
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "trainable_layers": t, "frozen_layers": f, "other": total - t - f}
