"""A run trains exactly its plan: per layer, planned = trainable = in the optimizer = got a gradient; frozen unchanged.

Checked by the loop after wrapping, after every checkpoint load, and after the first step it runs
(:func:`check_setup`, :func:`check_step`), on every rank (FSDP: each rank looks at its own shards).
The planned set is read from the plan's fields, not from ``requires_grad``: layer ``i`` trains when
``i`` is in ``plan.trainable_layers``; ``embed`` with ``train_embeddings``; ``final_norm`` with
``train_final_norm``; ``head`` with ``train_head`` (a tied head is the embedding's tensor and is
counted under ``embed``, which then trains when either flag is on); parameters outside those parts only under ``full``.

Adapters (``plan.adapter: lora``): in a planned layer only its LoRA tensors are planned; its base weights count
as frozen, so "frozen bitwise unchanged" covers them; a planned layer without adapters, or adapters on a part
the plan does not name, is a mismatch. A matrix-level plan (``plan.matrices``, Spectrum): in a layer it names only
the named modules' tensors are planned. LISA: the loop checks the plan of each interval (:meth:`LayerPlan.at_step`,
the seeded draw) on the first step of every interval, so what trained equals the draw, interval by interval.

A mismatch raises :class:`~raycpt.errors.RaycptError` with one line naming the first part that
differs; :func:`table_text` is the per-part table the loop logs to MLflow on rank 0.

"Frozen bitwise unchanged" compares a fingerprint of each frozen tensor (this rank's shard) taken
before the step with one taken after: the tensor's bits read as integers, summed plainly and with
position weights, so any changed bit pattern changes the pair (short of a deliberate collision).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Optional

import torch

from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack, tied_embeddings
from raycpt.strategies import LayerPlan, adapter_ids, matrix_split

_INT_VIEW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class PartCheck:
    """One row: tensors of one part (``embed``, ``layers.3``, ``final_norm``, ``head``, ``other``)."""

    part: str
    tensors: int
    planned: int
    trainable: int
    in_optimizer: int
    got_grad: Optional[int] = None
    frozen_changed: Optional[int] = None
    adapters: int = 0
    """LoRA adapter tensors in this part."""
    adapters_expected: bool = False
    """The plan puts adapters on this part (a LoRA plan's trainable layer)."""

    def problem(self) -> Optional[str]:
        """What is wrong with this part, in a few words, or None."""
        if self.adapters_expected and not self.adapters:
            return "the plan puts LoRA adapters on it but it has none"
        if self.adapters and not self.adapters_expected:
            return f"it holds {self.adapters} LoRA adapter tensors the plan does not put there"
        if self.trainable != self.planned:
            return f"the plan trains {self.planned} of its {self.tensors} tensors but {self.trainable} require grad"
        if self.in_optimizer != self.planned:
            return f"the plan trains {self.planned} of its {self.tensors} tensors but the optimizer holds {self.in_optimizer}"
        if self.got_grad is not None and self.got_grad != self.planned:
            return f"the plan trains {self.planned} of its {self.tensors} tensors but {self.got_grad} received a gradient"
        if self.frozen_changed:
            return f"{self.frozen_changed} of its frozen tensors changed in the step"
        return None


def _planned_parts(plan: LayerPlan, parts: Iterable[str], tied: bool = False) -> dict[str, bool]:
    keep = {f"layers.{i}" for i in plan.trainable_layers}
    flags = {"embed": plan.train_embeddings or (tied and plan.train_head), "final_norm": plan.train_final_norm,
             "head": plan.train_head, "other": plan.name == "full"}
    return {p: (p in keep) if p.startswith("layers.") else bool(flags.get(p, False)) for p in parts}


def parts_of(model) -> dict[str, list[torch.nn.Parameter]]:
    """Parameters by part (shared tensors once, under the first part: a tied head under ``embed``)."""
    return LayerStack.of(model).named_parts()


def _optimizer_ids(optimizer) -> set[int]:
    return {id(p) for g in optimizer.param_groups for p in g["params"]}


def build_table(model, plan: LayerPlan, optimizer, grads: Optional[dict[int, bool]] = None,
                changed: Optional[set[int]] = None) -> list[PartCheck]:
    """The per-part rows of ``model`` (the plain or FSDP2-sharded model, not a DDP wrapper)."""
    stack = LayerStack.of(model)
    parts = stack.named_parts()
    planned = _planned_parts(plan, parts, tied=tied_embeddings(stack))
    in_opt = _optimizer_ids(optimizer)
    adapters = adapter_ids(model)
    restricted, chosen = matrix_split(model, plan)
    lora = plan.adapter == "lora"
    rows = []
    for part, params in parts.items():
        n_adapt = sum(id(p) in adapters for p in params)
        layer_with_adapters = lora and part.startswith("layers.") and planned[part]
        n_plan = (n_adapt if layer_with_adapters else len(params)) if planned[part] else 0
        if planned[part] and any(id(p) in restricted for p in params):  # a matrix-level plan: its named modules
            n_plan = sum(id(p) in chosen for p in params)
        rows.append(PartCheck(part=part, tensors=len(params), planned=n_plan,
                              trainable=sum(bool(p.requires_grad) for p in params),
                              in_optimizer=sum(id(p) in in_opt for p in params),
                              got_grad=None if grads is None else sum(bool(grads.get(id(p))) for p in params),
                              frozen_changed=None if changed is None else sum(id(p) in changed for p in params),
                              adapters=n_adapt, adapters_expected=layer_with_adapters))
    extra = in_opt - {id(p) for ps in parts.values() for p in ps}
    if extra:
        rows.append(PartCheck(part="(not in the model)", tensors=len(extra), planned=0, trainable=0,
                              in_optimizer=len(extra)))
    return rows


def raise_on_mismatch(rows: list[PartCheck], when: str) -> None:
    """RaycptError (one line, the first part that differs) when a row has a problem."""
    for r in rows:
        why = r.problem()
        if why is not None:
            raise RaycptError(f"freeze check {when}: {r.part}: {why}; the run would not train its plan, stopped")


def grad_presence(model) -> dict[int, bool]:
    """``id(param) -> it holds a gradient`` (call between backward and the optimizer step)."""
    return {id(p): p.grad is not None for p in model.parameters()}


def fingerprint(t: torch.Tensor) -> tuple[int, int]:
    """Two integers of a tensor's bits: their sum and their position-weighted sum."""
    local = getattr(t, "to_local", None)
    x = (local() if local is not None else t).detach().reshape(-1)
    if x.numel() == 0:
        return (0, 0)
    bits = x.contiguous().view(_INT_VIEW[x.element_size()]).to(torch.int64)
    weights = torch.arange(1, bits.numel() + 1, dtype=torch.int64, device=bits.device) % 65521 + 1
    return int(bits.sum()), int((bits * weights).sum())


def frozen_fingerprints(model) -> dict[int, tuple[int, int]]:
    return {id(p): fingerprint(p) for p in model.parameters() if not p.requires_grad}


def changed_since(model, before: dict[int, tuple[int, int]]) -> set[int]:
    """Ids of the frozen tensors whose fingerprint differs from ``before``."""
    return {id(p) for p in model.parameters() if id(p) in before and fingerprint(p) != before[id(p)]}


def check_setup(model, plan: LayerPlan, optimizer, when: str, resumed: bool = False) -> list[PartCheck]:
    """After wrapping / after a checkpoint load: planned = requires grad = in the optimizer, per part; a
    resumed optimizer holds state for exactly its parameters."""
    rows = build_table(model, plan, optimizer)
    raise_on_mismatch(rows, when)
    if resumed:
        with_state = {id(p) for p in optimizer.state}
        for part, params in parts_of(model).items():
            missing = [p for p in params if p.requires_grad and id(p) not in with_state]
            if missing:
                raise RaycptError(f"freeze check {when}: {part}: {len(missing)} trainable tensors have no optimizer "
                                  "state in the checkpoint; it was not written by this plan's run")
    return rows


def check_step(model, plan: LayerPlan, optimizer, grads: dict[int, bool], before: dict[int, tuple[int, int]],
               when: str = "after the first step") -> list[PartCheck]:
    """After the first step: also every planned tensor received a gradient and no frozen one changed."""
    rows = build_table(model, plan, optimizer, grads=grads, changed=changed_since(model, before))
    raise_on_mismatch(rows, when)
    return rows


def table_text(rows: list[PartCheck], when: str) -> str:
    """The rows as a fixed-width table (what MLflow keeps)."""
    head = ["part", "tensors", "planned", "trainable", "in_optimizer", "got_grad", "frozen_changed"]
    lines = [f"freeze check {when}", "  ".join(f"{h:>14}" for h in head)]
    for r in rows:
        d = asdict(r)
        lines.append("  ".join(f"{'-' if d[h] is None else d[h]!s:>14}" for h in head))
    return "\n".join(lines) + "\n"
