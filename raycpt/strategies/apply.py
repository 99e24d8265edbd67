"""A plan on a model: :func:`apply_plan` (the only code in raycpt that writes ``requires_grad``), the AdamW
parameter groups, and the rows ``raycpt plan show`` prints. The model modules (torch) are imported when a
model is in hand, so importing raycpt stays cheap."""

from __future__ import annotations

from typing import Callable, Optional

from raycpt.errors import RaycptError
from raycpt.strategies.plan import LayerPlan


def _part_flags(plan: LayerPlan) -> Callable[[str], bool]:
    keep = {f"layers.{i}" for i in plan.trainable_layers}

    def trains(part: str) -> bool:
        if part == "embed":
            return plan.train_embeddings
        if part == "final_norm":
            return plan.train_final_norm
        if part == "head":
            return plan.train_head
        if part == "other":  # rare non-layer parameters: only a full-parameter full (not the equal-footing one)
            return plan.name == "full" and plan.train_embeddings and plan.train_head and plan.train_final_norm
        return part in keep

    return trains


def stack_of(model):
    """``LayerStack.of(model)``: the one place the plans meet the model modules, imported here with a model in hand
    (``raycpt.models.stack`` imports torch, and ``import raycpt`` imports the plan registry)."""
    from raycpt.models.stack import LayerStack

    return LayerStack.of(model)


def matrix_split(model, plan: LayerPlan) -> tuple[set[int], set[int]]:
    """A matrix-level plan (``plan.matrices``): ``(restricted, chosen)``, the ids of every parameter of the layers
    it names and of those among them that train (the named modules' weight and bias). Both empty otherwise;
    a module a layer does not have is a one-line error."""
    restricted, chosen = set(), set()
    if not plan.matrices:
        return restricted, chosen
    layers = stack_of(model).layers
    for i, modules in plan.matrices.items():
        found = set()
        for name, p in layers[i].named_parameters():
            restricted.add(id(p))
            owner = name.rsplit(".", 1)[0]
            if owner in modules:
                chosen.add(id(p))
                found.add(owner)
        if set(modules) - found:
            raise RaycptError(f"plan.matrices: layer {i} has no module {sorted(set(modules) - found)[0]!r}")
    return restricted, chosen


def _check_depth(plan: LayerPlan, stack) -> None:
    if stack.num_layers != plan.num_layers:
        raise ValueError(f"plan {plan.name!r} was built for {plan.num_layers} layers, the model has {stack.num_layers}")


def apply_plan(model, plan: LayerPlan) -> dict[str, int]:
    """Set ``requires_grad`` on every parameter of ``model`` from ``plan``; return the counts.

    The only place in raycpt that writes ``requires_grad``. Parameters outside the stack's parts
    (rare) train only under ``full``. Returns ``{"trainable": n, "frozen": m, "total": n + m}``
    counting shared (tied) tensors once."""
    stack = stack_of(model)
    _check_depth(plan, stack)
    trains = _part_flags(plan)
    parts = stack.named_parts()
    adapters = adapter_ids(model)
    if plan.adapter == "lora" and not adapters:
        raise ValueError(f"plan {plan.name!r} trains LoRA adapters but the model has none: inject them first "
                         "(raycpt.models.adapters.inject_lora)")
    restricted, chosen = matrix_split(model, plan)
    for p in model.parameters():
        p.requires_grad_(False)
    for part, params in parts.items():
        if trains(part):
            only_adapters = plan.adapter == "lora" and part.startswith("layers.")
            for p in params:
                if (not only_adapters or id(p) in adapters) and (id(p) not in restricted or id(p) in chosen):
                    p.requires_grad_(True)
    return count_params(model)


def adapter_ids(model) -> set[int]:
    """Ids of the LoRA adapter parameters of ``model`` (empty without adapters)."""
    from raycpt.models.adapters import is_adapter_param

    return {id(p) for n, p in model.named_parameters() if is_adapter_param(n)}


def count_params(model) -> dict[str, int]:
    seen, trainable, frozen = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if p.requires_grad:
            trainable += p.numel()
        else:
            frozen += p.numel()
    return {"trainable": trainable, "frozen": frozen, "total": trainable + frozen}


def _strip_wrappers(name: str) -> str:
    for w in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(w, "")
    return name[len("module."):] if name.startswith("module.") else name


def param_layer_index(model) -> dict[str, Optional[int]]:
    """Parameter name (as ``model.named_parameters()`` gives it) -> decoder layer index, None outside layers."""
    stack = stack_of(model)
    by_id: dict[int, Optional[int]] = {}
    for part, params in stack.named_parts().items():
        idx = int(part.split(".")[1]) if part.startswith("layers.") else None
        for p in params:
            by_id[id(p)] = idx
    return {n: by_id.get(id(p)) for n, p in model.named_parameters()}


def param_groups(model, plan: LayerPlan, lr: float, weight_decay: float,
                 wrapped=None) -> list[dict]:
    """AdamW groups over the trainable parameters only.

    One group per (LR scale, decay): ``lr = lr * scale``; 1-D tensors (norm weights, biases) get
    weight decay 0. ``model`` is the plain model, or the FSDP2-sharded one (``fully_shard`` wraps in place:
    the same names, each parameter a DTensor shard, so the groups come from the wrapped parameters
    themselves); ``wrapped`` (optional) takes the parameters from a wrapper instead, matched by name with
    wrapper prefixes (``module.``, FSDP1's ``_fsdp_wrapped_module.``) removed. Each group carries ``lr_scale``, ``decay`` and ``name``."""
    index = param_layer_index(model)
    source = wrapped if wrapped is not None else model
    groups: dict[tuple[float, bool], dict] = {}
    for name, p in source.named_parameters():
        if not p.requires_grad:
            continue
        clean = _strip_wrappers(name)
        if clean not in index:
            raise KeyError(f"parameter {name!r} ({clean!r}) not found in the plain model")
        layer = index[clean]
        scale = plan.lr_scale(layer) if layer is not None else 1.0
        decay = p.dim() >= 2
        key = (scale, decay)
        if key not in groups:
            groups[key] = {"params": [], "lr": lr * scale, "weight_decay": weight_decay if decay else 0.0,
                           "lr_scale": scale, "decay": decay,
                           "name": f"lr_x{scale:g}_{'decay' if decay else 'no_decay'}"}
        groups[key]["params"].append(p)
    return [groups[k] for k in sorted(groups, key=lambda k: (k[0], not k[1]))]


def plan_table(model, plan: LayerPlan) -> dict:
    """Rows for ``raycpt plan show``: one per part (embed, layers.i, final_norm, head) and the totals.

    ``{"rows": [{"part", "layer", "trainable", "lr_scale", "params"}], "trainable": n, "frozen": m,
    "total": n + m, "layer_map": "TT..", "notes": [...]}``. Counts do not need real weights (a model
    built on the meta device works) and count a tied matrix once, under ``embed``."""
    stack = stack_of(model)
    _check_depth(plan, stack)
    trains = _part_flags(plan)
    rows, trainable, frozen = [], 0, 0
    adapters = adapter_ids(model)
    restricted, chosen = matrix_split(model, plan)
    for part, params in stack.named_parts().items():
        on = trains(part)
        n = sum(p.numel() for p in params)
        lora = sum(p.numel() for p in params if id(p) in adapters)
        n_train = (lora if plan.adapter == "lora" and part.startswith("layers.") else n) if on else 0
        if on and any(id(p) in restricted for p in params):
            n_train = sum(p.numel() for p in params if id(p) in chosen)
        layer = int(part.split(".")[1]) if part.startswith("layers.") else None
        rows.append({"part": part, "layer": layer, "trainable": bool(on),
                     "lr_scale": (plan.lr_scale(layer) if layer is not None else 1.0) if on else None,
                     "params": n, "trainable_params": n_train, "tied": part == "head" and plan.tied_embeddings})
        trainable += n_train
        frozen += n - n_train
    return {"rows": rows, "trainable": trainable, "frozen": frozen, "total": trainable + frozen,
            "layer_map": plan.layer_map(), "notes": list(plan.notes), "plan": plan.describe()}
