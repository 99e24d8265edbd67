"""``cfg.plan`` -> :class:`LayerPlan`: the builder's layers with the config's flags, tied embeddings, LR scales,
the adapter and LISA settings, and the checks that a plan trains something."""

from __future__ import annotations

from raycpt.errors import RaycptError
from raycpt.strategies.apply import stack_of
from raycpt.strategies.lisa import lisa_period
from raycpt.strategies.plan import LayerPlan
from raycpt.strategies.registry import PLANS, check_layer


def build_plan(pcfg, num_layers: int, tied_embeddings: bool = False, max_steps=None, seed=None) -> LayerPlan:
    """Turn ``cfg.plan`` into a :class:`LayerPlan` for a model with ``num_layers`` decoder layers
    (``max_steps``: ``train.max_steps``, which LISA's period is checked against or derived from; ``seed``:
    ``train.seed``, LISA's draws' seed unless ``plan.lisa_seed`` is set).

    Raises RaycptError (one line) for an unknown plan, layers out of range, a split with an empty
    side, or a plan in which nothing trains."""
    name = pcfg.name
    spec = PLANS.get(name)(pcfg, num_layers)  # an unknown name: one line naming the registered plans
    layers = tuple(sorted(set(int(i) for i in spec.layers)))
    notes = list(spec.notes)
    emb = pcfg.train_embeddings if spec.train_embeddings is None else spec.train_embeddings
    norm = pcfg.train_final_norm if spec.train_final_norm is None else spec.train_final_norm
    head = pcfg.train_head if spec.train_head is None else spec.train_head
    if getattr(pcfg, "adapter", "none") == "lora" and (emb, norm, head) != (pcfg.train_embeddings,
                                                                           pcfg.train_final_norm, pcfg.train_head):
        emb, norm, head = pcfg.train_embeddings, pcfg.train_final_norm, pcfg.train_head
        notes.append("lora: embeddings, final norm and head train as plan.train_* say (the LoRA baseline "
                     "trains adapters only)")
    if tied_embeddings and emb != head:
        which = "plan.train_embeddings" if emb else "plan.train_head"
        notes.append(f"tied embeddings: the input embeddings and the LM head share one matrix, so {which}=true "
                     "trains both")
        emb = head = True
    elif tied_embeddings and emb:
        notes.append("tied embeddings: the input embeddings and the LM head are one shared matrix")
    scales = dict(spec.lr_scales)
    for key, s in (pcfg.lr_scales or {}).items():
        i = check_layer(key, num_layers, "plan.lr_scales layer")
        if i not in layers:
            notes.append(f"lr scale x{s:g} for layer {i} ignored: that layer is frozen")
            continue
        scales[i] = scales.get(i, 1.0) * float(s)
    scales = {i: s for i, s in scales.items() if i in layers and s != 1.0}
    if not layers and not (emb or norm or head):
        raise RaycptError(f"plan {name!r} trains nothing: no layer, and embeddings, final norm and head are frozen")
    return LayerPlan(name=name, num_layers=num_layers, trainable_layers=layers, lr_scales=scales,
                     train_embeddings=bool(emb), train_final_norm=bool(norm), train_head=bool(head),
                     tied_embeddings=bool(tied_embeddings), notes=tuple(notes), matrices=dict(spec.matrices),
                     **_extras(pcfg, name, layers, max_steps, seed))


def _extras(pcfg, name: str, layers, max_steps=None, seed=None) -> dict:
    """The adapter and LISA fields of a plan (none for a plain plan): LoRA's alpha (null: 2r) and rsLoRA switch,
    LISA's period (:func:`raycpt.strategies.lisa.lisa_period`)."""
    out: dict = {}
    if getattr(pcfg, "adapter", "none") == "lora":
        if name == "lisa":
            raise RaycptError("plan.adapter=lora with plan.name=lisa: LISA trains whole layers; use one or the other")
        if not layers:
            raise RaycptError(f"plan.adapter=lora: plan {name!r} names no decoder layer to put adapters on")
        alpha = 2.0 * int(pcfg.lora_rank) if pcfg.lora_alpha is None else float(pcfg.lora_alpha)
        out.update(adapter="lora", lora_rank=int(pcfg.lora_rank), lora_alpha=alpha,
                   lora_rslora=bool(getattr(pcfg, "lora_rslora", False)), lora_targets=tuple(pcfg.lora_targets))
    if name == "lisa":
        if pcfg.lr_scales:
            raise RaycptError("plan.lr_scales with plan.name=lisa: LISA trains every layer at lr x1")
        out.update(lisa_layers=int(pcfg.lisa_layers), lisa_interval=lisa_period(pcfg.lisa_interval, max_steps),
                   lisa_seed=int(pcfg.lisa_seed if pcfg.lisa_seed is not None else (seed or 0)))
    return out


def plan_for_model(pcfg, model) -> LayerPlan:
    stack = stack_of(model)
    return build_plan(pcfg, stack.num_layers, tied_embeddings=stack.tied_embeddings)
