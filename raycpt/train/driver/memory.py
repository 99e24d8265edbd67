"""Estimated peak memory of one training worker, before anything launches (pure: no Ray, no device).

Terms (bytes per worker; ``T`` = micro_batch x seq_len tokens, ``P`` = trainable parameters):

* **weights**: every parameter in float32 (the loop loads float32 master weights). DDP under bf16
  autocast adds a 2-byte copy of the weights the autograd part uses (the cast cache and the copies
  saved for backward). FSDP2 (:mod:`raycpt.train.worker.parallel`): a 1/world float32 shard, plus the
  gathered buffers in the compute dtype (bf16 under the bf16 ``MixedPrecisionPolicy``, else float32):
  two layers (the one running and the one prefetched), the root (embeddings, final norm, head: it
  stays gathered from the forward to its backward), and in backward one layer's unsharded gradient
  with its float32 reduce copy. No autocast copies: the gathered weights are already bf16.
* **gradients**: ``4 P`` (FSDP: ``/ world``; FSDP2 reduce-scatters every micro-batch, so gradient
  accumulation keeps them sharded); DDP with more than one worker adds its bucket buffers
  (another ``4 P``: ``gradient_as_bucket_view`` is off).
* **optimizer**: AdamW's ``exp_avg`` and ``exp_avg_sq``, ``8 P`` (FSDP: ``/ world``), plus the
  step's temporaries (the foreach ``sqrt`` of ``4 P`` on a GPU; per tensor on a CPU).
* **activations**: only for the part that needs autograd, the layers from the first trainable one
  up (a frozen prefix runs under ``no_grad`` and keeps nothing: ``FrozenPrefix`` in
  ``train/worker/loop.py``); a frozen layer above a trainable one keeps only what its input gradient needs
  (:attr:`SavedPerToken.frozen`: a frozen linear saves no input). Per token and layer, the tensors autograd
  saves, a linear form in the config's
  hidden ``H``, intermediate ``I``, query width ``nh*hd``, key/value width ``nkv*hd``, head counts
  (:data:`SAVED`; counted with ``torch.autograd.graph.saved_tensors_hooks`` on one layer
  of each family with SDPA attention, so no ``T x T`` matrix). Under bf16 autocast most are bf16 and some
  stay float32 (norm inputs, the residual stream, RoPE'd q/k): :attr:`SavedPerToken.bf16_fp32` counts the
  float32 ones per token (the same saved-tensor count under autocast, real-size Llama and Qwen3
  layers, exact to the byte); other families use :data:`BF16_BYTES_PER_FLOAT`. Activation checkpointing keeps each
  layer's input only plus one layer recomputed in backward.
* **logits**: the LM head and loss. Plain: about :data:`PLAIN_LOGIT_COPIES` ``T x vocab`` float32
  buffers at the start of backward (logits, log-softmax, their gradients); chunked: the same per
  ``loss_chunk_tokens`` rows plus the head's weight gradient and the hidden-state gradient.
* **overhead**: allocator slack, a fraction of the activations, plus on a GPU the CUDA context,
  cuBLAS workspaces and NCCL buffers (:data:`GPU_CONTEXT_GB`).

LoRA plans (``plan.adapter: lora``): ``P`` is the adapter parameters (:data:`ModelShape.adapter_params`,
counted on the skeleton with the adapters injected) plus whatever non-layer part trains; the weights term
includes the adapters; activations are counted as for a full layer from the first adapted layer up (the
adapters' own ``r``-wide tensors are small next to them). LISA: ``P`` is the largest draw of ``gamma``
layers plus embeddings, final norm and head (the optimizer keeps no state for the layers out of the draw).

Peak = weights + optimizer states + max(activations + logits, gradients + step temporaries) +
overhead: activations are freed during backward as gradients fill up, so the two never coexist in
full. Calibrated on this CPU against the peak RSS of a real step (``benchmarks/bench_memory.py``);
the GPU constants are estimates, not measurements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from raycpt.errors import RaycptError
from raycpt.models.adapters import is_adapter_param
from raycpt.models.stack import TABLE, LayerStack, tied_embeddings
from raycpt.strategies import LayerPlan
from raycpt.train.worker.parallel import uses_fsdp

GB = 1e9
GPU_CONTEXT_GB = 1.5
PLAIN_LOGIT_COPIES = 3.0
CHUNK_LOGIT_COPIES = 3.0
SLACK = 0.05

@dataclass(frozen=True)
class SavedPerToken:
    """What autograd saves per token in one decoder layer of a family, as coefficients of
    ``(H, I, nh*hd, nh, nkv*hd, nkv, hd, 1)`` (counted with ``saved_tensors_hooks``: ``tests/unit/test_memory*.py``).

    ``floats``: a layer with something to train; ``frozen``: a frozen layer autograd runs through (a frozen top
    above trainable layers, train_shallow's deep half) keeps only what its input gradient needs (a frozen linear
    keeps no input). ``bf16_fp32`` / ``bf16_fp32_frozen``: under bf16 autocast, the extra bytes / 2 of the floats
    kept in float32 (None: :data:`BF16_BYTES_PER_FLOAT` per float)."""

    floats: tuple[float, ...]
    frozen: tuple[float, ...]
    bf16_fp32: Optional[tuple[float, ...]] = None
    bf16_fp32_frozen: Optional[tuple[float, ...]] = None


SAVED: dict[str, SavedPerToken] = {
    "llama": SavedPerToken((6, 4, 2, 1, 2, 0, 2, 2), (2, 3, 2, 1, 2, 0, 2, 2),
                           (7, 0, 0, 1, 0, 0, 2, 2), (2, 0, 0, 1, 0, 0, 2, 2)),
    "qwen3": SavedPerToken((6, 4, 4, 2, 4, 1, 2, 2), (2, 3, 3, 2, 3, 1, 2, 2),
                           (7, 0, 1, 2, 1, 1, 2, 2), (2, 0, 1, 2, 1, 1, 2, 2)),
    "gemma3": SavedPerToken((10, 4, 4, 2, 4, 1, 2, 6), (4, 3, 3, 2, 3, 1, 2, 4)),
}
BF16_BYTES_PER_FLOAT = 2.4  # families without bf16 coefficients (fitted on small shapes only)
FAMILY = {name: a.memory for a in TABLE.values() if a.memory for name in (a.name, *a.aliases)}
"""model_type -> memory family, from THE architecture table (:data:`raycpt.models.stack.TABLE`)."""

KNOBS = {
    "activations": "train.activation_checkpointing=true, or a smaller train.micro_batch_size / data.seq_len "
                   "(raise train.grad_accum to keep the tokens per step)",
    "logits": "train.loss=chunked with a smaller train.loss_chunk_tokens",
    "weights": "train.distributed=fsdp (shards the weights over the workers)",
    "gradients": "a plan with fewer trainable layers, or train.distributed=fsdp",
    "optimizer": "a plan with fewer trainable layers, or train.distributed=fsdp",
    "overhead": "a device with more memory",
}


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a model: its config numbers and its parameter counts."""

    family: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    num_layers: int
    layer_params: tuple[int, ...]
    embed_params: int
    head_params: int
    norm_params: int
    tied: bool
    adapter_params: tuple[int, ...] = ()
    """LoRA adapter parameters per decoder layer (a model with adapters injected; empty = none)."""

    @property
    def total_params(self) -> int:
        return sum(self.layer_params) + self.embed_params + self.norm_params + (0 if self.tied else self.head_params)


def model_shape(model) -> ModelShape:
    """The shape of a (meta-device or real) causal LM."""
    conf = model.config
    stack = LayerStack.of(model)
    family = FAMILY.get(conf.model_type)
    if family is None:
        raise RaycptError(f"no memory model for architecture {conf.model_type!r}; known: {', '.join(sorted(FAMILY))}")
    heads = conf.num_attention_heads
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    tied = tied_embeddings(stack)

    adapters = tuple(sum(p.numel() for n, p in layer.named_parameters() if is_adapter_param(n))
                     for layer in stack.layers)
    return ModelShape(family=family, hidden=conf.hidden_size, intermediate=conf.intermediate_size, heads=heads,
                      kv_heads=getattr(conf, "num_key_value_heads", None) or heads,
                      head_dim=getattr(conf, "head_dim", None) or conf.hidden_size // heads,
                      vocab=conf.vocab_size, num_layers=stack.num_layers,
                      layer_params=tuple(count(layer) for layer in stack.layers), embed_params=count(stack.embed),
                      head_params=stack.head.weight.numel(), norm_params=count(stack.final_norm), tied=tied,
                      adapter_params=adapters if any(adapters) else ())


def layer_activation_floats(shape: ModelShape, frozen: bool = False) -> float:
    """Floats autograd keeps per token for one decoder layer (its input included); ``frozen``: a layer without
    trainable parameters that autograd runs through (:attr:`SavedPerToken.frozen`)."""
    saved = SAVED[shape.family]
    c = saved.frozen if frozen else saved.floats
    return float(sum(a * b for a, b in zip(c, _dims(shape))))


def _dims(shape: ModelShape) -> tuple[int, ...]:
    return (shape.hidden, shape.intermediate, shape.heads * shape.head_dim, shape.heads,
            shape.kv_heads * shape.head_dim, shape.kv_heads, shape.head_dim, 1)


def layer_activation_bytes(shape: ModelShape, bf16: bool, frozen: bool = False) -> float:
    """Bytes autograd keeps per token for one decoder layer: 4 per float in float32; under bf16 autocast 2
    per float plus 2 more for each float kept in float32 (:attr:`SavedPerToken.bf16_fp32`; a frozen layer's:
    :attr:`SavedPerToken.bf16_fp32_frozen`)."""
    floats = layer_activation_floats(shape, frozen)
    if not bf16:
        return 4.0 * floats
    saved = SAVED[shape.family]
    extra = saved.bf16_fp32_frozen if frozen else saved.bf16_fp32
    if extra is None:
        return BF16_BYTES_PER_FLOAT * floats
    return 2.0 * floats + 2.0 * sum(a * b for a, b in zip(extra, _dims(shape)))


@dataclass
class MemoryEstimate:
    terms: dict[str, float]
    """Bytes per term (see the module docstring)."""
    total: float
    notes: list[str] = field(default_factory=list)

    @property
    def biggest(self) -> str:
        return max(self.terms, key=self.terms.get)

    def line(self) -> str:
        parts = ", ".join(f"{k} {v / GB:.2f}" for k, v in self.terms.items())
        return f"estimated peak memory per worker {self.total / GB:.2f} GB ({parts} GB)"


def _trainable(shape: ModelShape, plan: LayerPlan) -> int:
    """Trainable parameters: a LoRA plan's adapters instead of its layers' weights; LISA's largest draw."""
    if plan.adapter == "lora":
        if not shape.adapter_params:
            raise RaycptError(f"plan {plan.name!r} trains LoRA adapters: estimate it on a model with them injected")
        n = sum(shape.adapter_params[i] for i in plan.trainable_layers)
    elif plan.is_lisa:
        n = sum(sorted((shape.layer_params[i] for i in plan.trainable_layers), reverse=True)[:plan.lisa_layers])
    else:
        n = sum(shape.layer_params[i] for i in plan.trainable_layers)
    head_trains = plan.train_head or (shape.tied and plan.train_embeddings)
    n += shape.embed_params if plan.train_embeddings else 0
    n += shape.head_params if head_trains and not (shape.tied and plan.train_embeddings) else 0
    return n + (shape.norm_params if plan.train_final_norm else 0)


def _logit_bytes(shape: ModelShape, tokens: int, chunk_tokens: Optional[int], head_trains: bool, bpe: float) -> float:
    """Head + loss buffers at their peak; the final norm's saved tensors (2 H per token) included."""
    norm = 2 * shape.hidden * tokens * bpe
    if chunk_tokens is None:
        return norm + PLAIN_LOGIT_COPIES * 4.0 * tokens * shape.vocab
    rows = min(chunk_tokens, tokens)
    grad_w = 4.0 * shape.head_params if head_trains else 0.0
    return norm + CHUNK_LOGIT_COPIES * 4.0 * rows * shape.vocab + grad_w + tokens * shape.hidden * bpe


def _gathered_bytes(shape: ModelShape, plan: LayerPlan, bf16: bool) -> float:
    """FSDP2's unsharded buffers at their peak: two layers and the root in the compute dtype, one trainable
    layer's gradient in that dtype plus its float32 reduce-scatter input."""
    unsharded = 2.0 if bf16 else 4.0
    big = max(shape.layer_params) if shape.layer_params else 0
    root = shape.embed_params + shape.norm_params + (0 if shape.tied else shape.head_params)
    big_trained = max([shape.layer_params[i] for i in plan.trainable_layers] or [0])
    grad_copy = (unsharded + (4.0 if bf16 else 0.0)) * big_trained
    return unsharded * (2 * big + root) + grad_copy


def estimate_memory(shape: ModelShape, plan: LayerPlan, *, seq_len: int, micro_batch: int, bf16: bool = False,
                    gpu: bool = False, world_size: int = 1, distributed: str = "ddp",
                    chunk_tokens: Optional[int] = None, activation_checkpointing: bool = False) -> MemoryEstimate:
    """Peak bytes of one worker (see the module docstring). ``chunk_tokens=None`` = the plain loss."""
    tokens = seq_len * micro_batch
    fsdp = uses_fsdp(distributed, world_size)
    bpe = 2.4 if bf16 else 4.0  # bytes per saved activation float: bf16 matmul inputs, fp32 norm internals
    p_train = _trainable(shape, plan)
    shard = world_size if fsdp else 1
    first = plan.first_trainable
    autograd_layers = [] if first is None else list(range(max(0, first), shape.num_layers))
    big_layer = max(shape.layer_params) if shape.layer_params else 0
    weights = 4.0 * shape.total_params / shard + (_gathered_bytes(shape, plan, bf16) if fsdp else 0.0)
    if bf16 and not fsdp:
        weights += 2.0 * (sum(shape.layer_params[i] for i in autograd_layers) + shape.head_params)
    grads = 4.0 * p_train / shard * (2 if (world_size > 1 and not fsdp) else 1)
    states = 8.0 * p_train / shard
    step_tmp = 4.0 * p_train / shard if gpu else 8.0 * max([big_layer, shape.embed_params, shape.head_params])
    per_layer = layer_activation_bytes(shape, bf16) * tokens
    if activation_checkpointing and autograd_layers:
        acts = len(autograd_layers) * shape.hidden * tokens * bpe + per_layer
    else:  # a layer with something to train keeps its inputs (LoRA's adapted layers, LISA's candidates, Spectrum's)
        trains = set(plan.trainable_layers)
        frozen = sum(1 for i in autograd_layers if i not in trains)
        acts = (len(autograd_layers) - frozen) * per_layer + frozen * layer_activation_bytes(shape, bf16, True) * tokens
    head_trains = plan.train_head or (shape.tied and plan.train_embeddings)
    logits = _logit_bytes(shape, tokens, chunk_tokens, head_trains, bpe) if first is not None else 0.0
    overhead = SLACK * (acts + logits) + (GPU_CONTEXT_GB * GB if gpu else 0.0)
    terms = {"weights": weights, "gradients": grads, "optimizer": states + step_tmp, "activations": acts,
             "logits": logits, "overhead": overhead}
    total = weights + states + max(acts + logits, grads + step_tmp) + overhead
    notes = [] if gpu else []
    return MemoryEstimate(terms=terms, total=total, notes=notes)


def resident_after_step(shape: ModelShape, plan: LayerPlan, world_size: int = 1, distributed: str = "ddp") -> dict:
    """The terms of :func:`estimate_memory` that stay allocated after an optimizer step and
    ``zero_grad(set_to_none=True)``: the float32 weights and AdamW's two moments of the trainable parameters
    (gradients, activations, logits, the bf16 compute copies and the step's temporaries are freed by then)."""
    shard = world_size if distributed == "fsdp" and world_size > 1 else 1
    return {"weights": 4.0 * shape.total_params / shard, "optimizer": 8.0 * _trainable(shape, plan) / shard}


def check_fits(est: MemoryEstimate, device_gb: Optional[float], what: str = "the plan") -> None:
    """RaycptError (one line: the biggest term and the knob that shrinks it) when ``est`` exceeds the device."""
    if device_gb is None or est.total <= device_gb * GB:
        return
    big = est.biggest
    raise RaycptError(f"{what} does not fit: estimated {est.total / GB:.1f} GB per worker > {device_gb:g} GB of "
                      f"device memory; the biggest term is {big} ({est.terms[big] / GB:.1f} GB): try {KNOBS[big]}")
