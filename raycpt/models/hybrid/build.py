"""A hybrid assembled from its plan: donor weights copied module by module with key and shape checks, fresh
layers initialised (identity on the residual stream by default), saved atomically; and its summaries."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from raycpt.errors import RaycptError
from raycpt.models.hybrid.model import KINDS, LayerKind, RaycptHybridConfig, RaycptHybridForCausalLM, sub_config
from raycpt.models.hybrid.plans import HybridPlan, Segment, init_mode
from raycpt.models.sources import load_model
from raycpt.models.stack import LayerStack, tied_embeddings


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
    return tqdm(total=total, desc="assemble hybrid", unit="segment")


def save_hybrid(model: PreTrainedModel, tokenizer, folder: str | Path) -> Path:
    """Write model (safetensors) + tokenizer into ``folder`` atomically (write aside, rename)."""
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
