"""LayerStack: the only module that knows where an architecture keeps its parts.

A causal LM is seen as ``embeddings -> decoder layers 0..N-1 -> final norm -> head``. This module
maps each supported architecture onto that view and offers three operations on top of it:

* :meth:`LayerStack.trace` - one clean forward that records the residual stream before block 0
  (the embedding output) and after every block, plus the exact per-layer call arguments the model
  itself built (masks, rotary position embeddings, sliding-window masks, ...);
* :meth:`LayerStack.lens` - the logit lens: final norm + head (+ the model's own logit soft-capping)
  applied to any residual-stream state;
* :meth:`LayerStack.run_from` - finish the forward from the state after block ``i`` (possibly
  modified), re-using the recorded per-layer arguments, so no earlier block is recomputed.

Recording the arguments each decoder layer actually received (a forward pre-hook with kwargs)
makes ``run_from`` architecture-agnostic: Gemma 3's per-layer sliding-window masks and dual rotary
tables, NemotronH's mixed Mamba2/attention/MLP blocks and Mamba2's mask all come from the model's
own forward rather than from code here that could drift from it.

Layer indexing: decoder layers are 0..N-1; index -1 is "before block 0" (the embedding output).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

# model_type -> (attribute path of the decoder inside the CausalLM, embeddings attr, layers attr,
# final-norm attr, head attr on the CausalLM). ``get_decoder()`` finds the decoder for all of them;
# the table is kept explicit so an unknown architecture fails loudly instead of guessing.
ARCHITECTURES: dict[str, dict[str, str]] = {
    "llama": dict(embed="embed_tokens", layers="layers", norm="norm", head="lm_head"),
    "qwen2": dict(embed="embed_tokens", layers="layers", norm="norm", head="lm_head"),
    "qwen3": dict(embed="embed_tokens", layers="layers", norm="norm", head="lm_head"),
    "gemma3_text": dict(embed="embed_tokens", layers="layers", norm="norm", head="lm_head"),
    "nemotron_h": dict(embed="embeddings", layers="layers", norm="norm_f", head="lm_head"),
    "mamba2": dict(embed="embeddings", layers="layers", norm="norm_f", head="lm_head"),
}


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
    logits: torch.Tensor
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
            from raycpt.errors import RaycptError

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

    # ------------------------------------------------------------------ structure
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tied_embeddings(self) -> bool:
        head_w = getattr(self.head, "weight", None)
        emb_w = getattr(self.embed, "weight", None)
        return head_w is not None and emb_w is not None and head_w.data_ptr() == emb_w.data_ptr()

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

    def trace(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> Trace:
        """Clean forward recording every residual state and every block's call arguments."""
        with self._record() as tr:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        tr.logits = out.logits
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
