"""LayerStack: the only module that knows where an architecture keeps its parts.

A causal LM is seen as ``embeddings -> decoder layers 0..N-1 -> final norm -> head``. This module
maps each supported architecture onto that view and offers three operations on top of it:

* :meth:`LayerStack.trace` - one clean forward that records the residual stream before block 0
  (the embedding output) and after every block, plus the exact per-layer call arguments the model
  itself built (masks, rotary position embeddings, sliding-window masks, ...);
* :meth:`LayerStack.lens` - the logit lens: final norm + head (+ the model's own logit soft-capping)
  applied to any residual-stream state;
* :meth:`LayerStack.run_from` - finish the forward from the state after block ``i`` (possibly
  modified), re-using the recorded per-layer arguments, so no earlier block is recomputed;
* :meth:`LayerStack.run_prefix_block` / :meth:`LayerStack.run_suffix_block` - run one block on the
  first positions of one recorded row (recording its keys/values), or on later positions of many
  rows against such recorded keys/values (the shared-context schedule of
  :mod:`raycpt.diagnostics.perturb`); :meth:`LayerStack.kv_reuse_blocker` says when a model cannot.

Recording the arguments each decoder layer actually received (a forward pre-hook with kwargs)
makes ``run_from`` architecture-agnostic: Gemma 3's per-layer sliding-window masks and dual rotary
tables, NemotronH's mixed Mamba2/attention/MLP blocks and Mamba2's mask all come from the model's
own forward rather than from code here that could drift from it.

Layer indexing: decoder layers are 0..N-1; index -1 is "before block 0" (the embedding output).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from raycpt.errors import RaycptError


@dataclass(frozen=True)
class Architecture:
    """THE architecture table's row: where a transformers architecture keeps its parts (the layer view),
    how to build and call one of its decoder layers (a hybrid layer kind) and its memory family.

    ``get_decoder()`` finds the decoder for all of them; the table is explicit so an unknown architecture
    fails loudly instead of guessing. :data:`raycpt.models.hybrid.model.KINDS` and
    :data:`raycpt.train.driver.memory.FAMILY` are derived from it."""

    name: str
    """transformers ``model_type``."""
    module: str
    """Package under ``transformers.models`` holding ``modeling_<module>.py``."""
    layer_cls: str
    """Decoder layer / block class."""
    call: str
    """Calling convention: ``attention`` (mask + rotary), ``mamba2`` (padding mask), ``nemotron_h``."""
    norm_cls: str
    """RMSNorm class of the architecture (final norm when this kind is the head donor)."""
    eps_attr: str
    """Config attribute holding the norm epsilon."""
    rotary_cls: Optional[str] = None
    """Rotary embedding class (attention kinds)."""
    embed_cls: Optional[str] = None
    """Embedding class when not a plain ``nn.Embedding`` (Gemma's scaled embedding)."""
    residual_writes: tuple[str, ...] = ("self_attn.o_proj", "mlp.down_proj")
    """Modules (or parameters) of one layer whose output is added to the residual stream: zeroed, a layer
    adds nothing (``hybrid.init: identity``). Gemma's post-norms map a zero input to zero."""
    parts: tuple[str, str, str, str] = ("embed_tokens", "layers", "norm", "lm_head")
    """Attribute names of (embeddings, decoder layers, final norm) on the decoder and the head on the CausalLM."""
    memory: Optional[str] = None
    """Memory family of :mod:`raycpt.train.driver.memory` (None: no memory model)."""
    aliases: tuple[str, ...] = ()
    """Other names for it (a hybrid layer kind's ``new: gemma3``; a multimodal config's ``model_type``)."""


_MAMBA_PARTS = ("embeddings", "layers", "norm_f", "lm_head")
TABLE: dict[str, Architecture] = {a.name: a for a in (
    Architecture("llama", "llama", "LlamaDecoderLayer", "attention", "LlamaRMSNorm", "rms_norm_eps",
                 "LlamaRotaryEmbedding", memory="llama"),
    Architecture("mistral", "mistral", "MistralDecoderLayer", "attention", "MistralRMSNorm", "rms_norm_eps",
                 "MistralRotaryEmbedding", memory="llama"),
    Architecture("qwen2", "qwen2", "Qwen2DecoderLayer", "attention", "Qwen2RMSNorm", "rms_norm_eps",
                 "Qwen2RotaryEmbedding", memory="llama"),
    Architecture("qwen3", "qwen3", "Qwen3DecoderLayer", "attention", "Qwen3RMSNorm", "rms_norm_eps",
                 "Qwen3RotaryEmbedding", memory="qwen3"),
    Architecture("gemma3_text", "gemma3", "Gemma3DecoderLayer", "attention", "Gemma3RMSNorm", "rms_norm_eps",
                 "Gemma3RotaryEmbedding", "Gemma3TextScaledWordEmbedding", memory="gemma3", aliases=("gemma3",)),
    Architecture("mamba2", "mamba2", "Mamba2Block", "mamba2", "Mamba2RMSNorm", "layer_norm_epsilon",
                 residual_writes=("mixer.out_proj",), parts=_MAMBA_PARTS, aliases=("mamba",)),
    # a NemotronH block has one mixer: Mamba2 (out_proj), attention (o_proj), MLP (down_proj) or MoE (routed
    # experts' down_proj parameter, the shared expert's down_proj, and the latent up-projection's bias)
    Architecture("nemotron_h", "nemotron_h", "NemotronHBlock", "nemotron_h", "NemotronHRMSNorm", "layer_norm_epsilon",
                 residual_writes=("mixer.out_proj", "mixer.o_proj", "mixer.down_proj", "mixer.experts.down_proj",
                                  "mixer.shared_experts.down_proj", "mixer.fc2_latent_proj"),
                 parts=_MAMBA_PARTS, aliases=("nemotron", "nemotronh")),
)}
"""THE architecture table (model_type -> :class:`Architecture`)."""
ARCHITECTURES: dict[str, dict[str, str]] = {
    a.name: dict(zip(("embed", "layers", "norm", "head"), a.parts)) for a in TABLE.values()}
"""The layer view of every architecture LayerStack knows (the table's ``parts``, plus registered ones)."""


def register_architecture(model_type: str, embed: str, layers: str, norm: str, head: str = "lm_head") -> None:
    """Teach LayerStack a new architecture (used by the hybrid model class)."""
    ARCHITECTURES[model_type] = dict(embed=embed, layers=layers, norm=norm, head=head)


@dataclass
class Trace:
    """What one clean forward recorded.

    ``hidden[i + 1]`` is the residual stream after block ``i`` (``hidden[0]`` = embedding output),
    all *before* the final norm; ``layer_args[i]`` / ``layer_kwargs[i]`` are the arguments block
    ``i`` was called with (its hidden-state argument removed).
    """

    hidden: list[torch.Tensor]
    logits: Optional[torch.Tensor]
    layer_args: list[tuple] = field(default_factory=list)
    layer_kwargs: list[dict] = field(default_factory=list)


def _first_tensor(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output


class LayerStack:
    """Uniform view of a causal LM as embeddings, N decoder layers, final norm and head."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.config = model.config
        model_type = getattr(model.config, "model_type", None)
        if model_type not in ARCHITECTURES:
            raise RaycptError(
                f"unsupported architecture {model_type!r}: LayerStack knows {', '.join(sorted(ARCHITECTURES))}")
        spec = ARCHITECTURES[model_type]
        self.model_type = model_type
        self.decoder = model.get_decoder()
        self.embed: nn.Module = getattr(self.decoder, spec["embed"])
        self.layers: nn.ModuleList = getattr(self.decoder, spec["layers"])
        self.final_norm: nn.Module = getattr(self.decoder, spec["norm"])
        self.head: nn.Module = getattr(model, spec["head"])
        self.softcap: Optional[float] = getattr(model.config, "final_logit_softcapping", None)

    @classmethod
    def of(cls, model: nn.Module) -> "LayerStack":
        """The one view of ``model``, built on first use and kept on the model (a training worker builds it
        once: the plan, the optimizer groups, the wrapping, the freeze check and the throughput model all
        read this one). Rebuilt when the decoder's layer list was replaced (a hybrid build, a block
        insertion), so a cached view never names modules the model no longer has."""
        view = model.__dict__.get("_raycpt_layer_stack")
        if view is not None and view.decoder is model.get_decoder() and view.layers is getattr(
                view.decoder, ARCHITECTURES[view.model_type]["layers"], None):
            return view
        view = cls(model)
        model.__dict__["_raycpt_layer_stack"] = view  # plain attribute: not a submodule, not in state_dict
        return view

    # ------------------------------------------------------------------ structure
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tied_embeddings(self) -> bool:
        return tied_embeddings(self)

    def named_parts(self) -> dict[str, list[nn.Parameter]]:
        """Parameters grouped as ``embed``, ``layers.{i}``, ``final_norm``, ``head`` (shared tensors once)."""
        seen: set[int] = set()
        parts: dict[str, list[nn.Parameter]] = {}

        def add(name, module):
            ps = []
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    ps.append(p)
            parts[name] = ps

        add("embed", self.embed)
        for i, layer in enumerate(self.layers):
            add(f"layers.{i}", layer)
        add("final_norm", self.final_norm)
        add("head", self.head)
        rest = [p for p in self.model.parameters() if id(p) not in seen]
        if rest:
            parts["other"] = rest
        return parts

    # ------------------------------------------------------------------ lens
    def lens(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logit lens: final norm, head and the model's own soft-capping, on a pre-norm state."""
        logits = self.head(self.final_norm(hidden))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    # ------------------------------------------------------------------ forward pieces
    @contextlib.contextmanager
    def _record(self) -> Iterator[Trace]:
        n = self.num_layers
        trace = Trace(hidden=[None] * (n + 1), logits=None, layer_args=[None] * n, layer_kwargs=[None] * n)
        handles = []

        def pre_hook(i):
            def fn(module, args, kwargs):
                if args:
                    h, rest = args[0], tuple(args[1:])
                    kw = dict(kwargs)
                else:
                    kw = dict(kwargs)
                    h = kw.pop("hidden_states")
                    rest = ()
                if i == 0:
                    trace.hidden[0] = h
                trace.layer_args[i] = rest
                trace.layer_kwargs[i] = kw
            return fn

        def post_hook(i):
            def fn(module, args, output):
                trace.hidden[i + 1] = _first_tensor(output)
            return fn

        try:
            for i, layer in enumerate(self.layers):
                handles.append(layer.register_forward_pre_hook(pre_hook(i), with_kwargs=True))
                handles.append(layer.register_forward_hook(post_hook(i)))
            yield trace
        finally:
            for h in handles:
                h.remove()

    def trace(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
              logits: bool = True) -> Trace:
        """Clean forward recording every residual state and every block's call arguments.

        ``logits=False`` leaves ``Trace.logits`` None and, where the model takes ``logits_to_keep``,
        runs the head on one position only (a caller that reads the lens of ``hidden`` saves the
        (batch, seq, vocab) product: for SmolLM2-135M the head costs as much as 8 of its 30 blocks)."""
        kwargs = {}
        if not logits and "logits_to_keep" in inspect.signature(self.model.forward).parameters:
            kwargs["logits_to_keep"] = 1
        with self._record() as tr:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs)
        tr.logits = out.logits if logits else None
        return tr

    def run_layer(self, i: int, hidden: torch.Tensor, trace: Trace) -> torch.Tensor:
        """Run decoder layer ``i`` on ``hidden`` with the arguments recorded in ``trace``."""
        return _first_tensor(self.layers[i](hidden, *trace.layer_args[i], **trace.layer_kwargs[i]))

    def run_from(self, layer: int, hidden: torch.Tensor, trace: Trace,
                 positions: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Finish the forward from the state after block ``layer`` (-1 = embedding output).

        Runs blocks ``layer+1 .. N-1`` only, then the final norm and head. ``positions`` (one index
        per batch row) restricts the head to those positions and returns ``(batch, vocab)``;
        otherwise ``(batch, seq, vocab)``. ``hidden`` may be a batch that repeats the trace's
        batch ``k`` times along dim 0; the recorded arguments are repeated to match.
        """
        batch = trace.hidden[0].shape[0]
        reps = hidden.shape[0] // batch
        h = hidden
        for j in range(layer + 1, self.num_layers):
            if reps == 1:
                h = self.run_layer(j, h, trace)
            else:
                args = tuple(repeat_batch(a, reps, batch) for a in trace.layer_args[j])
                kwargs = {k: repeat_batch(v, reps, batch) for k, v in trace.layer_kwargs[j].items()}
                h = _first_tensor(self.layers[j](h, *args, **kwargs))
        if positions is not None:
            h = h[torch.arange(h.shape[0], device=h.device), positions]
        return self.lens(h)

    # ------------------------------------------------------------------ shared-context blocks
    def kv_reuse_blocker(self, trace: Trace) -> Optional[str]:
        """Why this model cannot run later positions against handed-in keys/values (None = it can).

        Supported: blocks whose only cross-position operation is causal attention that calls
        ``cache.update(key, value, layer_idx, ...)`` (Llama, Qwen2, Qwen3, Gemma 3 and the raycpt
        hybrid of those), with the ``sdpa`` or ``eager`` attention implementation, plus
        position-wise blocks (NemotronH's MLP). Recurrent blocks (Mamba2 mixers) carry a conv and an
        SSM state per position instead, which these blocks do not take from outside here."""
        if getattr(self.config, "use_bidirectional_attention", False):
            return "bidirectional attention: context positions see later positions"
        for i, layer in enumerate(self.layers):
            recurrent = [type(m).__name__ for m in layer.modules() if "mamba" in type(m).__name__.lower()]
            if recurrent:
                return f"layer {i} is recurrent ({recurrent[0]}): its conv/SSM state is not handed in"
            impl = _attn_impl(layer)
            if impl is not None and impl not in ("sdpa", "eager"):
                return f"layer {i}: attention implementation {impl!r} (needs sdpa or eager)"
            if impl is not None and "cache" not in inspect.signature(layer.forward).parameters:
                return f"layer {i} ({type(layer).__name__}) takes no cache argument"
            unknown = set(trace.layer_kwargs[i]) - _SHARED_KWARGS
            if trace.layer_args[i] or unknown:
                return f"layer {i} takes arguments {sorted(unknown) or 'by position'} this schedule does not map"
            mask = trace.layer_kwargs[i].get("attention_mask")
            if mask is not None and (not isinstance(mask, torch.Tensor) or mask.dim() != 4):
                return f"layer {i} takes a mask that is not (batch, 1, query, key)"
        return None

    def run_prefix_block(self, i: int, hidden: torch.Tensor, trace: Trace, row: int,
                         length: int) -> tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
        """Block ``i`` on positions ``0..length-1`` of recorded row ``row`` (``hidden``: (k, length, d),
        any k states of those positions). Returns the output and the keys/values the block's
        attention computed (``(k, kv_heads, length, head_dim)`` after rotary; None without attention).

        Mask (causal, sliding window, padding) and rotary tables are the recorded ones of that row,
        cut to ``length``: the same absolute positions as in the clean pass."""
        cache = KVCache()
        kwargs = {}
        for key, v in trace.layer_kwargs[i].items():
            if key == "attention_mask" and v is not None:
                v = _row(v, row)[..., :length, :length]
            elif key == "position_embeddings":
                v = tuple(_row(x, row)[:, :length] for x in v)
            elif key == "position_ids" and v is not None:
                v = _row(v, row)[:, :length]
            kwargs[key] = v
        if "cache" in inspect.signature(self.layers[i].forward).parameters:
            kwargs["cache"] = cache
        out = _first_tensor(self.layers[i](hidden, **kwargs))
        return out, cache.key, cache.value

    def run_suffix_block(self, i: int, hidden: torch.Tensor, trace: Trace, rows: torch.Tensor, pos: torch.Tensor,
                         lengths: torch.Tensor, past_key: Optional[torch.Tensor],
                         past_value: Optional[torch.Tensor], read: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Block ``i`` on later positions of many rows, attending to handed-in keys/values.

        ``hidden`` (R, M, d): row r holds positions ``pos[r]`` (absolute, (R, M)) of recorded prompt
        ``rows[r]``, the first ``lengths[r]`` of them real (the rest padding, ignored). ``past_key`` /
        ``past_value`` (R, kv_heads, K, head_dim) hold keys/values for positions 0..K-1; row r uses
        those before its own first position ``pos[r, 0]``. The row's own keys/values are placed at
        their absolute positions, so every real query sees exactly the key layout and the mask row
        (causality, sliding window, padding) of the clean pass, taken from the recorded mask;
        rotary tables are the recorded ones at ``pos``.

        ``read`` (R,): only position ``read[r]`` of row r is wanted (the last block, where nothing else
        is read); the block's MLP then runs on those positions alone and the result is (R, d). Every
        position still goes through attention (their keys/values are the read position's, and
        attention called with fewer queries rounds differently); the MLP is position-wise (its rows
        the same up to a matrix kernel's rounding; bitwise at SmolLM2-135M's shapes)."""
        width = trace.hidden[0].shape[1]  # every position of the batch: the clean pass's key layout, to the bit
        real = torch.arange(pos.shape[1], device=pos.device)[None, :] < lengths[:, None]
        kwargs = {}
        for key, v in trace.layer_kwargs[i].items():
            if key == "attention_mask":
                v = _suffix_mask(v, rows, pos, real, width, hidden.dtype, _attn_impl(self.layers[i]))
            elif key == "position_embeddings":
                v = tuple(_take(x, rows, pos) for x in v)
            elif key == "position_ids" and v is not None:
                v = _take(v, rows, pos)
            kwargs[key] = v
        if "cache" in inspect.signature(self.layers[i].forward).parameters:
            kwargs["cache"] = KVCache(past_key, past_value, slots=pos, real=real, width=width)
        if read is None:
            return _first_tensor(self.layers[i](hidden, **kwargs))
        at, read = torch.arange(hidden.shape[0], device=hidden.device), read.to(hidden.device)
        with _mlp_only_at(self.layers[i], at, read):
            return _first_tensor(self.layers[i](hidden, **kwargs))[at, read]

    def select_rows(self, trace: Trace, idx: torch.Tensor) -> Trace:
        """The trace restricted to batch rows ``idx`` (states and recorded arguments alike)."""
        batch = trace.hidden[0].shape[0]
        return Trace(hidden=[h[idx] for h in trace.hidden], logits=None,
                     layer_args=[_select(a, idx, batch) for a in trace.layer_args],
                     layer_kwargs=[_select(k, idx, batch) for k in trace.layer_kwargs])

    @contextlib.contextmanager
    def hooks(self, fwd_hooks: list[tuple[int, Callable[[torch.Tensor], torch.Tensor]]]):
        """Temporarily replace the output of block ``i`` by ``fn(output)`` (i = -1: embedding output).

        Hooks are removed on exit, even on error (TransformerLens' ``model.hooks``)."""
        handles = []

        def make(fn):
            def hook(module, args, output):
                if isinstance(output, (tuple, list)):
                    return (fn(output[0]), *output[1:])
                return fn(output)
            return hook

        try:
            for i, fn in fwd_hooks:
                module = self.embed if i < 0 else self.layers[i]
                handles.append(module.register_forward_hook(make(fn)))
            yield self
        finally:
            for h in handles:
                h.remove()


def repeat_batch(x: Any, reps: int, batch: int) -> Any:
    """Repeat batch-shaped tensors (dim >= 2, leading dim = batch) ``reps`` times along dim 0.

    1-D tensors such as ``cache_position`` are per-position, not per-row, and stay as they are.
    Used to replay a trace's recorded layer arguments for several stacked perturbations."""
    if reps == 1:
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() >= 2 and x.shape[0] == batch:
            return x.repeat(reps, *([1] * (x.dim() - 1)))
        return x
    if isinstance(x, (tuple, list)):
        return type(x)(repeat_batch(v, reps, batch) for v in x)
    if isinstance(x, dict):
        return {k: repeat_batch(v, reps, batch) for k, v in x.items()}
    return x


# keyword arguments of a decoder layer that the shared-context blocks know how to cut and gather
_SHARED_KWARGS = {"attention_mask", "position_embeddings", "position_ids", "cache", "use_cache"}


class KVCache:
    """A stand-in for a transformers ``Cache`` during one call of one block.

    Every supported attention module calls ``cache.update(key, value, layer_idx, ...)`` with its
    new keys/values (after rotary, before the grouped-query repeat) and attends to what it returns.
    This one keeps the new ones (``key``, ``value``). Without ``past_key`` it returns them as they
    are; with it, it returns a (R, heads, width, hd) buffer holding ``past_key`` / ``past_value`` at
    positions 0..K-1 and the new ones of the ``real`` (R, M) entries written at their positions
    ``slots`` (R, M). Nothing persists between calls."""

    def __init__(self, past_key: Optional[torch.Tensor] = None, past_value: Optional[torch.Tensor] = None,
                 slots: Optional[torch.Tensor] = None, real: Optional[torch.Tensor] = None, width: int = 0):
        self.past_key, self.past_value, self.slots, self.real, self.width = past_key, past_value, slots, real, width
        self.key: Optional[torch.Tensor] = None
        self.value: Optional[torch.Tensor] = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int = 0, *args, **kwargs):
        self.key, self.value = key_states, value_states
        if self.past_key is None:
            return key_states, value_states
        return self._place(self.past_key, key_states), self._place(self.past_value, value_states)

    def _place(self, past: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        short = self.width - past.shape[-2]
        out = torch.nn.functional.pad(past, (0, 0, 0, short)) if short else past.clone()  # a new tensor either way
        r, q = torch.nonzero(self.real, as_tuple=True)
        out[r, :, self.slots[r, q]] = new[r, :, q]
        return out


@contextlib.contextmanager
def _mlp_only_at(layer: nn.Module, rows: torch.Tensor, cols: torch.Tensor) -> Iterator[None]:
    """While inside, ``layer.mlp`` runs on the (rows, cols) positions of its (R, M, d) input only, and hands back
    an (R, M, d) output that is 0 elsewhere (what the block adds there is never read). A layer without an ``mlp``
    submodule runs whole."""
    mlp = getattr(layer, "mlp", None)
    if not isinstance(mlp, nn.Module):
        yield
        return

    shape: list[torch.Size] = []

    def pre(module, args):
        x = args[0]
        shape.append(x.shape)
        return (x[rows, cols][:, None], *args[1:])

    def post(module, args, output):
        y = output[0] if isinstance(output, tuple) else output
        full = y.new_zeros(shape.pop())
        full[rows, cols] = y[:, 0]
        return (full, *output[1:]) if isinstance(output, tuple) else full

    handles = [mlp.register_forward_pre_hook(pre, prepend=True), mlp.register_forward_hook(post, prepend=True)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _row(x: torch.Tensor, row: int) -> torch.Tensor:
    """Row ``row`` of a recorded batch-shaped tensor, kept 1 long (broadcast tensors stay as they are)."""
    return x[row:row + 1] if x.shape[0] > 1 else x


def _take(x: torch.Tensor, rows: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``x[rows[r], pos[r, q]]`` for a recorded (batch or 1, seq, ...) tensor -> (R, M, ...)."""
    r = rows if x.shape[0] > 1 else torch.zeros_like(rows)
    return x[r[:, None], pos]


def _select(x: Any, idx: torch.Tensor, batch: int) -> Any:
    """Batch-shaped tensors (leading dim = batch, dim >= 2) restricted to rows ``idx``."""
    if isinstance(x, torch.Tensor):
        return x[idx.to(x.device)] if x.dim() >= 2 and x.shape[0] == batch else x
    if isinstance(x, (tuple, list)):
        return type(x)(_select(v, idx, batch) for v in x)
    if isinstance(x, dict):
        return {k: _select(v, idx, batch) for k, v in x.items()}
    return x


def _attn_impl(layer: nn.Module) -> Optional[str]:
    """The attention implementation a block's attention module runs (None: no attention module)."""
    for m in layer.modules():
        if type(m).__name__.endswith("Attention") and hasattr(m, "config"):
            return getattr(m.config, "_attn_implementation", None) or "eager"
    return None


def _suffix_mask(mask, rows, pos, real, width: int, dtype, impl: Optional[str]) -> torch.Tensor:
    """(R, 1, M, width) mask over absolute key positions for the suffix rows of
    :meth:`LayerStack.run_suffix_block`: a real query gets its row of the recorded mask, a padding
    query sees only position 0 (finite, never read). Bool, or additive where the model recorded an
    additive mask or attends eagerly."""
    dev = pos.device
    kk = torch.arange(width, device=dev)
    if mask is None:  # the model relied on is_causal: plain causal over absolute positions
        ok = kk[None, None, :] <= pos[:, :, None]
    else:
        r = (rows if mask.shape[0] > 1 else torch.zeros_like(rows))[:, None, None]
        allowed = mask if mask.dtype == torch.bool else mask == 0
        ok = allowed[r, 0, pos[:, :, None], kk[None, None, :]]
    ok = torch.where(real[:, :, None], ok, kk[None, None, :] == 0)[:, None]
    if (mask is not None and mask.dtype != torch.bool) or (mask is None and impl == "eager"):
        return torch.zeros(ok.shape, dtype=dtype, device=dev).masked_fill(~ok, torch.finfo(dtype).min)
    return ok


def tied_embeddings(obj) -> bool:
    """Whether the input embeddings and the LM head are one matrix. A :class:`LayerStack` or a model: by parameter
    identity (also right on the meta device, where data_ptr is 0); a config: its ``tie_word_embeddings``."""
    if isinstance(obj, nn.Module):
        obj = LayerStack.of(obj)
    if isinstance(obj, LayerStack):
        h = getattr(obj.head, "weight", None)
        e = getattr(obj.embed, "weight", None)
        return h is not None and h is e
    return bool(getattr(obj, "tie_word_embeddings", False))
