"""LoRA adapters (peft) on the decoder layers a plan names: injected, counted, saved, merged.

A LoRA plan (``plan.adapter: lora``) freezes every base weight and adds, on each targeted ``nn.Linear``
of each of the plan's decoder layers, ``W x + (alpha / r) B A x`` with ``A`` (r x in) and ``B`` (out x r,
zero at the start, so the first loss is the base model's). Module paths come from
:class:`~raycpt.models.stack.LayerStack`, so any architecture it knows works; peft
(``inject_adapter_in_model``) replaces the modules in place and the model stays the same class.

* :func:`inject_lora` - the adapters, on exactly ``plan.trainable_layers`` (full module names, no regex);
* :func:`merged_state_dict` - the HF state dict of the merged model (``W + (alpha/r) B A``, plain names):
  what a checkpoint's ``model/`` and ``final_model/`` hold, loadable without peft;
* :func:`merge_lora_` - the same merge in place (training is over: the in-worker evaluation);
* :func:`adapter_state` / :func:`save_adapter_folder` / :func:`load_adapter_state` - the adapter tensors,
  in peft's own layout (``adapter_config.json`` + ``adapter_model.safetensors``, keys under
  ``base_model.model.``, so ``peft.PeftModel.from_pretrained(base, folder)`` reads it);
* :func:`lora_trainable_params` - the adapter parameter count of a rank and layer set, from the model's
  shapes alone (a meta-device skeleton works): what a budget picks the nearest rank with.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import torch

from raycpt.errors import RaycptError
from raycpt.models.stack import LayerStack

ADAPTER_DIR = "adapter"
ADAPTER_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
NAME = "default"


def is_adapter_param(name: str) -> bool:
    """A LoRA parameter name (``...lora_A.default.weight``, ``...lora_B...``)."""
    return ".lora_A." in name or ".lora_B." in name


def lora_targets(model, layers: Iterable[int], targets: Sequence[str] = ()) -> list[tuple[str, torch.nn.Linear]]:
    """``(full module name, module)`` of every ``nn.Linear`` that gets an adapter: inside decoder layers
    ``layers``, whose leaf name is in ``targets`` (empty = every linear module of the layer). RaycptError
    when a target name matches no linear module of some layer."""
    stack = LayerStack.of(model)
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for i in sorted(set(layers)):
        layer = stack.layers[i]
        found = [(f"{names[id(layer)]}.{sub}", m) for sub, m in layer.named_modules()
                 if isinstance(m, torch.nn.Linear) and (not targets or sub.rsplit(".", 1)[-1] in targets)]
        leaves = {n.rsplit(".", 1)[-1] for n, _ in found}
        missing = [t for t in targets if t not in leaves]
        if missing or not found:
            have = sorted({sub.rsplit(".", 1)[-1] for sub, m in layer.named_modules() if isinstance(m, torch.nn.Linear)})
            raise RaycptError(f"plan.lora_targets={list(targets)}: layer {i} has no linear module "
                              f"{missing[0] if missing else 'at all'!r}; its linear modules are {', '.join(have)}")
        out += found
    return out


def check_rank(modules: list[tuple[str, torch.nn.Linear]], rank: int) -> None:
    """RaycptError (one line) when the rank exceeds the smaller side of a targeted linear module."""
    for name, m in modules:
        width = min(m.in_features, m.out_features)
        if rank > width:
            raise RaycptError(f"plan.lora_rank={rank} is larger than the layer width: {name} is "
                              f"{m.in_features} -> {m.out_features}, so the rank can be at most {width}")


def lora_trainable_params(model, rank: int, layers: Iterable[int], targets: Sequence[str] = ()) -> int:
    """Adapter parameters of LoRA rank ``rank`` on ``layers``: ``r * (in + out)`` per targeted linear module
    (counted from shapes: a meta-device model works). Raises like :func:`check_rank` for a rank too large."""
    mods = lora_targets(model, layers, targets)
    check_rank(mods, rank)
    return sum(rank * (m.in_features + m.out_features) for _, m in mods)


def inject_lora(model, plan) -> list[str]:
    """Add LoRA adapters (rank ``plan.lora_rank``, alpha ``plan.lora_alpha``, scale alpha / r or with
    ``plan.lora_rslora`` alpha / sqrt(r), no dropout, no bias) to the
    targeted linear modules of ``plan.trainable_layers``, in place; returns their full names. The adapters
    follow the base weights' device and dtype; ``B`` starts at zero."""
    from peft import LoraConfig, inject_adapter_in_model

    mods = lora_targets(model, plan.trainable_layers, plan.lora_targets)
    check_rank(mods, plan.lora_rank)
    names = [n for n, _ in mods]
    conf = LoraConfig(r=int(plan.lora_rank), lora_alpha=float(plan.lora_alpha), target_modules=names,
                      lora_dropout=0.0, bias="none", use_rslora=bool(getattr(plan, "lora_rslora", False)))
    inject_adapter_in_model(conf, model, adapter_name=NAME)
    return names


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [(n, m) for n, m in model.named_modules() if isinstance(m, LoraLayer)]


def _delta(m) -> torch.Tensor:
    """``scaling * B @ A`` of one LoRA linear module, in float32."""
    a, b = m.lora_A[NAME].weight, m.lora_B[NAME].weight
    return (b.detach().float() @ a.detach().float()) * float(m.scaling[NAME])


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The model's state dict with every adapter merged into its base weight (``W + (alpha/r) B A``) under
    the plain module names, adapter tensors dropped: what ``from_pretrained`` of the base class loads."""
    sd = model.state_dict()
    out = {}
    for k, v in sd.items():
        if is_adapter_param(k):
            continue
        out[k.replace(".base_layer.", ".")] = v
    for name, m in _lora_layers(model):
        w = out[f"{name}.weight"]
        out[f"{name}.weight"] = (w.float() + _delta(m).to(w.device)).to(w.dtype)
    return out


def merge_lora_(model):
    """Merge every adapter into its base weight and put the plain ``nn.Linear`` back, in place (the same
    arithmetic as :func:`merged_state_dict`); returns ``model``, now without adapters."""
    for name, m in _lora_layers(model):
        base = m.base_layer
        with torch.no_grad():
            base.weight.copy_((base.weight.float() + _delta(m).to(base.weight.device)).to(base.weight.dtype))
        parent_name, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, leaf, base)
    if hasattr(model, "peft_config"):
        del model.peft_config
    return model


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter tensors in peft's saved layout (``base_model.model.<module>.lora_A.weight``), float32 on CPU."""
    from peft import get_peft_model_state_dict

    sd = get_peft_model_state_dict(model, adapter_name=NAME)
    return {PEFT_PREFIX + k: v.detach().to("cpu", torch.float32).contiguous() for k, v in sd.items()}


def save_adapter_folder(model, out, plan) -> Path:
    """``adapter_config.json`` + ``adapter_model.safetensors`` (peft's layout) into ``out``."""
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_state(model), str(out / ADAPTER_FILE))
    conf = model.peft_config[NAME].to_dict()
    conf = {k: (sorted(v) if isinstance(v, set) else v) for k, v in conf.items()}
    conf["base_model_name_or_path"] = None
    (out / "adapter_config.json").write_text(json.dumps(conf, indent=2, default=str) + "\n", encoding="utf-8")
    (out / "raycpt_plan.json").write_text(json.dumps({"plan": plan.name, "layers": list(plan.trainable_layers),
                                                      "describe": plan.describe()}, indent=2) + "\n", encoding="utf-8")
    return out


def load_adapter_state(model, folder) -> None:
    """Put the adapter tensors of a folder written by :func:`save_adapter_folder` into ``model`` (which has
    the same adapters injected); RaycptError when they do not match."""
    from safetensors.torch import load_file

    path = Path(folder) / ADAPTER_FILE
    if not path.is_file():
        raise RaycptError(f"checkpoint {Path(folder).parent}: no {ADAPTER_DIR}/{ADAPTER_FILE}; it was not written "
                          "by a LoRA plan's run")
    saved = {k[len(PEFT_PREFIX):] if k.startswith(PEFT_PREFIX) else k: v for k, v in load_file(str(path)).items()}
    params = {n.replace(f".{NAME}.", "."): p for n, p in model.named_parameters() if is_adapter_param(n)}
    if set(saved) != set(params):
        extra = sorted(set(saved) ^ set(params))[:2]
        raise RaycptError(f"checkpoint {Path(folder).parent}: its adapters do not match this plan's ({extra})")
    with torch.no_grad():
        for k, v in saved.items():
            params[k].copy_(v)

