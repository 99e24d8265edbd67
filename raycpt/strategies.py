"""Layer plans: which decoder layers train, at what learning-rate scale, and whether embeddings,
final norm and head train.

A plan is chosen by registered name (``plan.name`` in the config); each builder maps
``(PlanConfig, num_layers)`` onto a :class:`LayerPlan`, a plain, model-agnostic value (layer indices,
per-layer LR scales, three flags and human-readable notes). Three functions apply it to a model:

* :func:`apply_plan` - the ONLY code in raycpt that writes ``requires_grad``;
* :func:`param_groups` - AdamW parameter groups over the trainable parameters only, one group per
  (LR scale, decay / no decay); norms and biases (1-D tensors) get no weight decay;
* :func:`plan_table` - the rows ``raycpt plan show`` prints (layer map, trainable/frozen counts).

Layer indexing: decoder layers are 0..N-1; ``split r`` puts layers [0, b) in the shallow side with
``b = floor(r * N + 1/2)`` (half up, :func:`raycpt.splits.split_index`: 0.5 * 5 -> 3; 2/3 of 28 -> 19).
Module paths always come from :class:`~raycpt.models.stack.LayerStack`.

Plans (papers: ``seeds/004`` train_shallow / train_deep; ``seeds/002`` Mid-Block patterns;
``seeds/003`` single layer, elite top-k, middle-5, higher LR for elite layers):

==============  ===============================================================================
full            every layer, embeddings, final norm and head (full-parameter training)
train_shallow   layers [0, b) train, [b, N) frozen
train_deep      layers [b, N) train, [0, b) frozen
blocks          a 0/1 pattern over equal contiguous blocks (``01100``: blocks 1 and 2 of 5 train);
                when N is not divisible by the pattern length the first ``N mod B`` blocks hold
                one layer more (``numpy.array_split``), e.g. N=30, ``0110`` -> 8, 8, 7, 7
layers          an explicit list of layers
single          one layer
elite           the top-k layers of a ranking file (see :func:`write_ranking`), trained with
                ``plan.elite_lr_scale``; ``plan.elite_train_rest`` also trains the others at scale 1;
                ``plan.elite_pick=bottom`` takes the k lowest-scored layers instead (003's control)
middle          the middle k layers: [(N - k) // 2, (N - k) // 2 + k) (28 layers, k=5 -> 11..15)
==============  ===============================================================================

``plan.lr_scales`` ({layer: multiplier}) combine with any plan; a scale on a frozen layer is
ignored with a note.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from raycpt.config import PLANS as CONFIG_PLANS
from raycpt.errors import RaycptError, read_user_text
from raycpt.splits import check_split, split_index  # noqa: F401 - split_index re-exported

# ------------------------------------------------------------------------------------ the value


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
    lora_targets: tuple[str, ...] = ()
    """Leaf names of the linear modules that get adapters; empty = every linear module of the layer."""
    lisa_layers: int = 0
    """``lisa``: gamma layers drawn per interval out of ``trainable_layers`` (the candidates); 0 = not LISA."""
    lisa_interval: int = 0
    lisa_seed: int = 0

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
            parts.append(f"LoRA r={self.lora_rank} alpha={self.lora_alpha:g} on "
                         f"{', '.join(self.lora_targets) or 'every linear module'} of those layers (their weights frozen)")
        if self.is_lisa:
            parts.append(f"LISA: {self.lisa_layers} of those layers per {self.lisa_interval} steps (seed {self.lisa_seed})")
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
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LayerPlan":
        d = dict(d)
        d["trainable_layers"] = tuple(int(i) for i in d["trainable_layers"])
        d["lr_scales"] = {int(k): float(v) for k, v in d.get("lr_scales", {}).items()}
        d["notes"] = tuple(d.get("notes", ()))
        d["lora_targets"] = tuple(d.get("lora_targets", ()))
        return cls(**d)


# ------------------------------------------------------------------------------------ registry

@dataclass
class PlanSpec:
    """What a builder returns: trainable layers, optional scales and notes; flags None = from config."""

    layers: Iterable[int]
    lr_scales: dict[int, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    train_embeddings: Optional[bool] = None
    train_final_norm: Optional[bool] = None
    train_head: Optional[bool] = None


PLANS: dict[str, Callable[[Any, int], PlanSpec]] = CONFIG_PLANS  # the one registry, which the config checks


def register_plan(name: str, takes_split: bool = False):
    """Decorator: ``@register_plan("my_plan") def build(pcfg, num_layers) -> PlanSpec``. ``takes_split``: the
    plan reads ``plan.split`` (a sweep runs it at every split; the memory check at the first and the last)."""

    def deco(fn):
        fn.takes_split = bool(takes_split)
        PLANS[name] = fn
        return fn

    return deco


def takes_split(name: str) -> bool:
    """Whether the registered plan ``name`` reads ``plan.split`` (what the plan declared when registered)."""
    return bool(getattr(PLANS.get(name), "takes_split", False))


def split_plans() -> list[str]:
    """The registered plans that take a split, in registration order."""
    return [n for n in PLANS if takes_split(n)]


def _check_layer(i: Any, n: int, what: str) -> int:
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise RaycptError(f"{what}={i!r} is out of range: this model has layers 0..{n - 1}")
    return i


@register_plan("full")
def _full(pcfg, n: int) -> PlanSpec:
    if not getattr(pcfg, "full_non_layers", True):  # equal footing: the non-layer flags of every other plan
        return PlanSpec(range(n), notes=["full (equal footing): every decoder layer; embeddings, final norm and "
                                         "head as plan.train_* say, like every other plan"])
    return PlanSpec(range(n), train_embeddings=True, train_final_norm=True, train_head=True,
                    notes=["full: every parameter trains (embeddings, final norm and head included)"])


@register_plan("train_shallow", takes_split=True)
def _train_shallow(pcfg, n: int) -> PlanSpec:
    b = check_split(pcfg.split, n, "plan.split")
    return PlanSpec(range(0, b), notes=[f"split {pcfg.split:g}: b = round({pcfg.split:g}*{n}) = {b}; "
                                        f"layers 0..{b - 1} train, {b}..{n - 1} frozen"])


@register_plan("train_deep", takes_split=True)
def _train_deep(pcfg, n: int) -> PlanSpec:
    b = check_split(pcfg.split, n, "plan.split")
    return PlanSpec(range(b, n), notes=[f"split {pcfg.split:g}: b = round({pcfg.split:g}*{n}) = {b}; "
                                        f"layers 0..{b - 1} frozen, {b}..{n - 1} train"])


def block_sizes(num_layers: int, num_blocks: int) -> list[int]:
    """Equal contiguous blocks; the first ``N mod B`` blocks hold one layer more (numpy.array_split)."""
    base, extra = divmod(num_layers, num_blocks)
    return [base + (1 if j < extra else 0) for j in range(num_blocks)]


@register_plan("blocks")
def _blocks(pcfg, n: int) -> PlanSpec:
    pattern = pcfg.pattern
    if not pattern or any(c not in "01" for c in pattern):
        raise RaycptError(f"plan.pattern={pattern!r}: the blocks plan needs a 0/1 pattern such as 01100")
    if len(pattern) > n:
        raise RaycptError(f"plan.pattern={pattern!r} has {len(pattern)} blocks but the model has only {n} layers")
    sizes = block_sizes(n, len(pattern))
    layers, start, spans = [], 0, []
    for c, size in zip(pattern, sizes):
        if c == "1":
            layers.extend(range(start, start + size))
        spans.append(f"{start}-{start + size - 1}")
        start += size
    note = f"blocks of {'/'.join(map(str, sizes))} layers ({', '.join(spans)})"
    if n % len(pattern):
        note += f"; {n} layers do not divide into {len(pattern)} blocks: the first {n % len(pattern)} hold one more"
    return PlanSpec(layers, notes=[note])


@register_plan("layers")
def _layers(pcfg, n: int) -> PlanSpec:
    return PlanSpec(sorted({_check_layer(i, n, "plan.layers") for i in pcfg.layers}))


@register_plan("single")
def _single(pcfg, n: int) -> PlanSpec:
    return PlanSpec([_check_layer(pcfg.layer, n, "plan.layer")])


@register_plan("middle")
def _middle(pcfg, n: int) -> PlanSpec:
    k = pcfg.k
    if k > n:
        raise RaycptError(f"plan.k={k}: the middle plan cannot take {k} layers of a {n}-layer model")
    start = (n - k) // 2
    return PlanSpec(range(start, start + k), notes=[f"middle {k} of {n}: layers {start}..{start + k - 1}"])


@register_plan("elite")
def _elite(pcfg, n: int) -> PlanSpec:
    if not pcfg.ranking_file:
        raise RaycptError("plan.ranking_file is not set: the elite plan reads its top-k layers from a ranking "
                          "JSON (e.g. written by raycpt contribution)")
    ranking = read_ranking(pcfg.ranking_file, num_layers=n)
    pick = getattr(pcfg, "elite_pick", "top")
    elite = ranked_pick(ranking["ranking"], pcfg.k, pick, where=str(pcfg.ranking_file))
    scales = {i: float(pcfg.elite_lr_scale) for i in elite}
    rest = bool(getattr(pcfg, "elite_train_rest", False))
    layers = range(n) if rest else elite
    what = "top" if pick == "top" else "bottom (the lowest-contribution control)"
    note = f"elite {what}-{pcfg.k} of {Path(pcfg.ranking_file).name}: {elite} at lr x{pcfg.elite_lr_scale:g}"
    note += "; the other layers also train at lr x1" if rest else "; the other layers are frozen"
    return PlanSpec(layers, lr_scales=scales, notes=[note])


def ranked_pick(rows, k: int, pick: str = "top", where: str = "the ranking") -> list[int]:
    """The ``k`` layers an elite plan takes from a ranking's rows (``[{"layer", "score"}]``), sorted by index.

    ``top``: the first k of the ranking (best first, as :func:`read_ranking` orders it); ``bottom``: the k
    lowest finite scores (ties: the lower layer; layers without a score are never picked)."""
    if pick not in ("top", "bottom"):
        raise RaycptError(f"plan.elite_pick={pick!r}: use top or bottom")
    if pick == "top":
        order = [r["layer"] for r in rows]
    else:
        scored = [r for r in rows if r["score"] is not None and math.isfinite(r["score"])]
        order = [r["layer"] for r in sorted(scored, key=lambda r: (r["score"], r["layer"]))]
    if k > len(order):
        kind = "layers" if pick == "top" else "layers with a score"
        raise RaycptError(f"plan.k={k}: {where} lists only {len(order)} {kind}")
    return sorted(int(i) for i in order[:k])


@register_plan("lisa")
def _lisa(pcfg, n: int) -> PlanSpec:
    g, k = pcfg.lisa_layers, pcfg.lisa_interval
    if g > n:
        raise RaycptError(f"plan.lisa_layers={g}: LISA cannot draw {g} layers of a {n}-layer model")
    return PlanSpec(range(n), train_embeddings=True, train_final_norm=True, train_head=True,
                    notes=[f"lisa: every {k} steps a seeded draw of {g} of the {n} layers trains (seed "
                           f"{pcfg.lisa_seed}); embeddings, final norm and head always train; AdamW state of the "
                           "layers is reset at each draw, theirs kept (LMFlow's LISATrainer)"])


@register_plan("expand")
def _expand(pcfg, n: int) -> PlanSpec:
    """Built on the EXPANDED model (N + P layers; the launcher builds it, ``expanded_model_folder``)."""
    from raycpt.models.hybrid_expand import expand_positions

    p = pcfg.expand_blocks
    if n - p < p:
        raise RaycptError(f"plan.expand_blocks={p}: block expansion inserts between 1 and {n - p} blocks into a "
                          f"{n - p}-layer model (the plan is built on the expanded model of {n} layers)")
    new = expand_positions(n - p, p)
    return PlanSpec(new, notes=[f"expand: {p} identity copies (o_proj, down_proj zeroed) at layers {new} of the "
                                f"expanded {n}; the {n - p} original layers are frozen"])


def lisa_interval_index(step: int, interval: int) -> int:
    """The LISA interval of optimizer step ``step`` (1-based): steps 1..K are interval 0."""
    return (int(step) - 1) // int(interval)


def lisa_draw(seed: int, interval_index: int, candidates, gamma: int) -> tuple[int, ...]:
    """The layers LISA trains in interval ``interval_index``: ``gamma`` of ``candidates`` drawn without
    replacement by ``numpy.random.default_rng([seed, interval_index])``, sorted. A pure function of its
    arguments, so a resumed run redraws exactly the layers the interrupted one trained."""
    import numpy as np

    cands = sorted(int(i) for i in candidates)
    rng = np.random.default_rng([int(seed), int(interval_index)])
    return tuple(sorted(int(cands[i]) for i in rng.choice(len(cands), size=int(gamma), replace=False)))


def lisa_trainable_params(layer_params, non_layer_params: int, gamma: int) -> int:
    """Trainable parameters of a LISA interval, at most: the ``gamma`` largest layers of ``layer_params`` (a
    count per decoder layer) plus the always-trained embeddings, final norm and head (``non_layer_params``,
    a tied matrix once). With equal layers, every draw trains exactly this many."""
    sizes = sorted((int(x) for x in layer_params), reverse=True)
    if not 1 <= gamma <= len(sizes):
        raise RaycptError(f"lisa: gamma={gamma} must be between 1 and the {len(sizes)} layers")
    return sum(sizes[:gamma]) + int(non_layer_params)


# ------------------------------------------------------------------------------------ build

def build_plan(pcfg, num_layers: int, tied_embeddings: bool = False) -> LayerPlan:
    """Turn ``cfg.plan`` into a :class:`LayerPlan` for a model with ``num_layers`` decoder layers.

    Raises RaycptError (one line) for an unknown plan, layers out of range, a split with an empty
    side, or a plan in which nothing trains."""
    name = pcfg.name
    if name not in PLANS:
        raise RaycptError(f"unknown plan {name!r}: use one of {', '.join(PLANS)}")
    spec = PLANS[name](pcfg, num_layers)
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
        i = _check_layer(key, num_layers, "plan.lr_scales layer")
        if i not in layers:
            notes.append(f"lr scale x{s:g} for layer {i} ignored: that layer is frozen")
            continue
        scales[i] = scales.get(i, 1.0) * float(s)
    scales = {i: s for i, s in scales.items() if i in layers and s != 1.0}
    if not layers and not (emb or norm or head):
        raise RaycptError(f"plan {name!r} trains nothing: no layer, and embeddings, final norm and head are frozen")
    return LayerPlan(name=name, num_layers=num_layers, trainable_layers=layers, lr_scales=scales,
                     train_embeddings=bool(emb), train_final_norm=bool(norm), train_head=bool(head),
                     tied_embeddings=bool(tied_embeddings), notes=tuple(notes), **_extras(pcfg, name, layers))


def _extras(pcfg, name: str, layers) -> dict:
    """The adapter and LISA fields of a plan (none for a plain plan)."""
    out: dict = {}
    if getattr(pcfg, "adapter", "none") == "lora":
        if name == "lisa":
            raise RaycptError("plan.adapter=lora with plan.name=lisa: LISA trains whole layers; use one or the other")
        if not layers:
            raise RaycptError(f"plan.adapter=lora: plan {name!r} names no decoder layer to put adapters on")
        out.update(adapter="lora", lora_rank=int(pcfg.lora_rank), lora_alpha=float(pcfg.lora_alpha),
                   lora_targets=tuple(pcfg.lora_targets))
    if name == "lisa":
        if pcfg.lr_scales:
            raise RaycptError("plan.lr_scales with plan.name=lisa: LISA trains every layer at lr x1")
        out.update(lisa_layers=int(pcfg.lisa_layers), lisa_interval=int(pcfg.lisa_interval),
                   lisa_seed=int(pcfg.lisa_seed))
    return out


def plan_for_model(pcfg, model) -> LayerPlan:
    from raycpt.models.stack import LayerStack, tied_embeddings

    stack = LayerStack.of(model)
    return build_plan(pcfg, stack.num_layers, tied_embeddings=tied_embeddings(stack))


# ------------------------------------------------------------------------------------ apply

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


def _check_depth(plan: LayerPlan, stack) -> None:
    if stack.num_layers != plan.num_layers:
        raise ValueError(f"plan {plan.name!r} was built for {plan.num_layers} layers, the model has {stack.num_layers}")


def apply_plan(model, plan: LayerPlan) -> dict[str, int]:
    """Set ``requires_grad`` on every parameter of ``model`` from ``plan``; return the counts.

    The only place in raycpt that writes ``requires_grad``. Parameters outside the stack's parts
    (rare) train only under ``full``. Returns ``{"trainable": n, "frozen": m, "total": n + m}``
    counting shared (tied) tensors once."""
    from raycpt.models.stack import LayerStack

    stack = LayerStack.of(model)
    _check_depth(plan, stack)
    trains = _part_flags(plan)
    parts = stack.named_parts()
    adapters = adapter_ids(model)
    if plan.adapter == "lora" and not adapters:
        raise ValueError(f"plan {plan.name!r} trains LoRA adapters but the model has none: inject them first "
                         "(raycpt.models.adapters.inject_lora)")
    for p in model.parameters():
        p.requires_grad_(False)
    for part, params in parts.items():
        if trains(part):
            only_adapters = plan.adapter == "lora" and part.startswith("layers.")
            for p in params:
                if not only_adapters or id(p) in adapters:
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
    from raycpt.models.stack import LayerStack

    stack = LayerStack.of(model)
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
    from raycpt.models.stack import LayerStack

    stack = LayerStack.of(model)
    _check_depth(plan, stack)
    trains = _part_flags(plan)
    rows, trainable, frozen = [], 0, 0
    adapters = adapter_ids(model)
    for part, params in stack.named_parts().items():
        on = trains(part)
        n = sum(p.numel() for p in params)
        lora = sum(p.numel() for p in params if id(p) in adapters)
        n_train = (lora if plan.adapter == "lora" and part.startswith("layers.") else n) if on else 0
        layer = int(part.split(".")[1]) if part.startswith("layers.") else None
        rows.append({"part": part, "layer": layer, "trainable": bool(on),
                     "lr_scale": (plan.lr_scale(layer) if layer is not None else 1.0) if on else None,
                     "params": n, "trainable_params": n_train, "tied": part == "head" and plan.tied_embeddings})
        trainable += n_train
        frozen += n - n_train
    return {"rows": rows, "trainable": trainable, "frozen": frozen, "total": trainable + frozen,
            "layer_map": plan.layer_map(), "notes": list(plan.notes), "plan": plan.describe()}


# ------------------------------------------------------------------------------------ rankings

RANKING_FORMAT = "raycpt.layer-ranking/1"


def write_ranking(path, model: str, num_layers: int, scores: dict[int, float], metric: str = "contribution",
                  extra: Optional[dict] = None) -> Path:
    """Write a layer ranking (best first) that the ``elite`` plan reads.

    Format (JSON)::

        {"format": "raycpt.layer-ranking/1", "model": "<ref>", "num_layers": N, "metric": "contribution",
         "ranking": [{"layer": 10, "score": 1.14}, {"layer": 12, "score": 1.12}, ...], ...extra}

    ``ranking`` is sorted by score, highest first (ties: lower layer first; NaN last); it may list a
    subset of the layers. Written atomically."""
    from raycpt.io import atomic_write_json

    def key(item):
        i, s = item
        bad = s is None or not math.isfinite(float(s))
        return (1, 0.0, i) if bad else (0, -float(s), i)

    rows = []
    for i, s in sorted(((int(i), s) for i, s in scores.items()), key=key):
        _check_layer(i, num_layers, "ranking layer")
        rows.append({"layer": i, "score": None if s is None or not math.isfinite(float(s)) else float(s)})
    doc = {"format": RANKING_FORMAT, "model": model, "num_layers": int(num_layers), "metric": metric,
           "ranking": rows}
    doc.update(extra or {})
    return atomic_write_json(Path(path), doc)


def read_ranking(path, num_layers: Optional[int] = None) -> dict:
    """Read and check a ranking file (see :func:`write_ranking`); the ranking comes back best first."""
    p = Path(path)
    text = read_user_text(p, "ranking file")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise RaycptError(f"ranking file {p} is not valid JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("ranking"), list) or not doc["ranking"]:
        raise RaycptError(f"ranking file {p} needs a non-empty \"ranking\": [{{\"layer\": i, \"score\": x}}, ...]")
    n = doc.get("num_layers")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise RaycptError(f"ranking file {p}: \"num_layers\" is {n!r}; expected a positive integer")
    if num_layers is not None and n is not None and int(n) != num_layers:
        raise RaycptError(f"ranking file {p} is for a {n}-layer model, this model has {num_layers} layers")
    limit = num_layers if num_layers is not None else (int(n) if n is not None else None)
    seen, rows = set(), []
    for r in doc["ranking"]:
        if not isinstance(r, dict) or "layer" not in r:
            raise RaycptError(f"ranking file {p}: entry {r!r} needs a \"layer\"")
        i, s = r["layer"], r.get("score")
        if isinstance(i, bool) or not isinstance(i, int):
            raise RaycptError(f"ranking file {p}: layer {i!r} is not an integer")
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float))):
            raise RaycptError(f"ranking file {p}: layer {i} has score {s!r}; expected a number or null")
        if limit is not None:
            _check_layer(i, limit, f"ranking file {p.name}: layer")
        if i in seen:
            raise RaycptError(f"ranking file {p}: layer {i} is listed twice")
        seen.add(i)
        rows.append({"layer": int(i), "score": None if s is None else float(s)})

    def key(item):
        s = item["score"]
        return (1, 0.0, item["layer"]) if s is None or not math.isfinite(s) else (0, -s, item["layer"])

    doc["ranking"] = sorted(rows, key=key)
    return doc


# ------------------------------------------------------------------------------------ equal budget

def _nearest(candidates, count, budget: int):
    """The candidate whose ``count(c)`` is nearest ``budget`` (ties: the first, i.e. the smaller)."""
    return min(candidates, key=lambda c: abs(count(c) - budget))


def check_budget(budget: int, layer_params, total_params: int) -> int:
    """``--budget``: a trainable-parameter count between one layer's parameters and the whole model's."""
    smallest = min(int(x) for x in layer_params)
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < smallest:
        raise RaycptError(f"--budget {budget!r} is below one layer's parameters ({smallest:,}): no plan fits it")
    if budget > total_params:
        raise RaycptError(f"--budget {budget:,} is above the model's {total_params:,} parameters")
    return budget


def budget_plans(budget: int, layer_params, non_layer_params: int, lora_per_rank: int, max_rank: int,
                 rankings: Optional[dict] = None, random_seeds=(0, 1, 2)) -> list[dict]:
    """The trials of an equal-budget comparison: per row ``{"name", "settings", "trainable"}`` (settings: dotted
    config keys -> typed values, a sweep recipe), each plan at the
    setting whose trainable count is nearest ``budget`` (ties: the smaller setting).

    ``layer_params``: parameters per decoder layer; ``non_layer_params``: embeddings + final norm + head (a tied
    matrix once; LISA always trains them); ``lora_per_rank``: LoRA parameters per unit of rank on every layer
    (``sum of in + out`` of the targeted linear modules), ``max_rank`` the smallest width; ``rankings``: method ->
    layers best first (e.g. ``{"bi": [...], "snr": [...]}``): their top-k, k nearest by cumulative count.
    Rows: ``train_shallow`` at b (layers [0, b)), ``train_deep`` at b' (layers [b', N)), ``<method>-top-k`` per
    ranking, ``random-k`` per seed (:func:`raycpt.diagnostics.selectors.random_scores`' draw: the top-k of
    ``default_rng(seed).random(N)``), ``lisa`` at gamma, ``lora`` at rank r on every layer, ``expand`` at P."""
    import numpy as np

    from raycpt.models.hybrid_expand import expand_trainable_params

    sizes = [int(x) for x in layer_params]
    n = len(sizes)
    check_budget(budget, sizes, sum(sizes) + int(non_layer_params))
    b = _nearest(range(1, n), lambda k: sum(sizes[:k]), budget)
    d = _nearest(range(n - 1, 0, -1), lambda k: sum(sizes[k:]), budget)
    rows = [{"name": "layertracer-shallow", "settings": {"plan.name": "train_shallow", "plan.split": b / n},
             "trainable": sum(sizes[:b])},
            {"name": "layertracer-deep", "settings": {"plan.name": "train_deep", "plan.split": d / n},
             "trainable": sum(sizes[d:])}]
    orders = dict(rankings or {})
    for seed in random_seeds:
        draw = np.random.default_rng(int(seed)).random(n)
        orders[f"random{seed}"] = sorted(range(n), key=lambda i: (-draw[i], i))
    for name, order in orders.items():
        order = [int(i) for i in order]
        k = _nearest(range(1, len(order) + 1), lambda j: sum(sizes[i] for i in order[:j]), budget)
        top = sorted(order[:k])
        rows.append({"name": f"{name}-top{k}", "settings": {"plan.name": "layers", "plan.layers": top},
                     "trainable": sum(sizes[i] for i in top)})
    g = _nearest(range(1, n + 1), lambda j: lisa_trainable_params(sizes, non_layer_params, j), budget)
    r = _nearest(range(1, int(max_rank) + 1), lambda j: j * int(lora_per_rank), budget)
    p = _nearest(range(1, n + 1), lambda j: expand_trainable_params(sizes, j), budget)
    rows += [{"name": f"lisa-g{g}", "settings": {"plan.name": "lisa", "plan.lisa_layers": g},
              "trainable": lisa_trainable_params(sizes, non_layer_params, g)},
             {"name": f"lora-r{r}", "settings": {"plan.name": "full", "plan.full_non_layers": False,
                                                 "plan.adapter": "lora", "plan.lora_rank": r},
              "trainable": r * int(lora_per_rank)},
             {"name": f"expand-p{p}", "settings": {"plan.name": "expand", "plan.expand_blocks": p},
              "trainable": expand_trainable_params(sizes, p)}]
    return rows
