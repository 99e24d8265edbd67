"""Checkpoints: what a folder holds, how it is verified, loaded without unpickling code, and published.

A checkpoint folder (``checkpoint_<step>``)::

    model/              HF safetensors folder + tokenizer, in the training dtype (bf16 when training
                        in bf16, else float32); a LoRA plan's merged weights (W + alpha/r B A)
    adapter/            LoRA plans only: the adapters in peft's layout (adapter_config.json,
                        adapter_model.safetensors, float32); a resume loads the base model + these
    train_state.pt      tensors only (loaded with ``torch.load(weights_only=True)``): optimizer and
                        scheduler state, every rank's torch/CUDA RNG state, and - when ``model/`` is
                        bf16 - the float32 master copy of the trainable parameters
    train_state.json    everything that is not a tensor: step, data position, loss history, plan,
                        every rank's numpy/python RNG state (as lists), the weights dtype
    manifest.json       written LAST: size and sha256 of every other file, the step, the
                        finite-weights flag

:func:`raycpt.train.ckpt.manifest.verify_checkpoint` checks a folder against its manifest (a cut upload, a truncated or
edited file, a missing manifest all fail, with the reason); resume (:func:`raycpt.train.ckpt.manifest.find_checkpoints`) and
publish (:func:`raycpt.train.driver.publish.publish_model`) use only folders that pass. A checkpoint is written only from
finite weights (:func:`raycpt.train.ckpt.manifest.all_finite`). ``final_model/`` is a copy of the verified checkpoint's
``model/`` files (a reflink where the filesystem can, else a byte copy) checked against the same
hashes; a hard link only when the checkpoint is deleted right after the publish
(``train.keep_finished_checkpoints: false``), so no kept checkpoint shares a file with the published model.

The last checkpoint of a run that will not keep its checkpoints (``final=True`` in :func:`checkpoint`) holds no
optimizer state: nothing trains from it again (a resume of a run killed after it evaluates and publishes), so
``train_state.pt`` carries ``optimizer: None`` and a resume that would train from it is refused.

Ray Tune's restore, which unpickles ``tuner.pkl``, is guarded by
:func:`raycpt.runs.folder.assert_private_folder`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from raycpt import errors  # disk_full and oserror_in_words looked up when called
from raycpt.errors import RaycptError
from raycpt.models.adapters import ADAPTER_DIR, merged_state_dict, save_adapter_folder
from raycpt.models.shards import read_shards, shards_problem, write_referencing_weights
from raycpt.strategies import LayerPlan
from raycpt.train.ckpt.manifest import MODEL_DIR, STATE_JSON, STATE_PT, all_finite, write_manifest
from raycpt.train.ckpt.rng import merge_rng, rng_state, split_rng


def json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float replaced by its string (``"nan"``, ``"inf"``), so that
    ``json.dumps(..., allow_nan=False)`` holds; ``float(x)`` still reads the strings back."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def weights_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The dtype checkpoints store weights in: bf16 when the loop trains in bf16 (see
    :func:`raycpt.train.worker.steps.autocast_for`), else float32."""
    if precision == "bf16" or (precision == "auto" and torch.device(device).type == "cuda"):
        return torch.bfloat16
    return torch.float32


def model_state(model, wrapped, fsdp: bool) -> dict:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        msd = get_model_state_dict(wrapped, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _retie(model, msd)
    return model.state_dict()


def _retie(model, msd: dict) -> dict:
    """Names of one shared Parameter (tied embeddings) point at one gathered tensor again, as in
    ``model.state_dict()``, so ``save_pretrained`` sees the tie and writes it once."""
    first: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first and name in msd and first[id(p)] in msd:
            msd[name] = msd[first[id(p)]]
        first.setdefault(id(p), name)
    return msd


def optim_state(wrapped, optimizer, fsdp: bool) -> dict:
    if fsdp:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(wrapped, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def _keyed_by_name(sd: dict) -> bool:
    keys = list(sd.get("state", {})) + [k for g in sd.get("param_groups", []) for k in g.get("params", [])]
    return bool(keys) and all(isinstance(k, str) for k in keys)


def optim_state_by_name(model, optimizer, sd: dict) -> dict:
    """A plain ``optimizer.state_dict()`` (parameters numbered in group order) keyed by parameter name, the
    form ``torch.distributed.checkpoint.state_dict`` reads: how a DDP checkpoint resumes under FSDP. The
    groups must match this optimizer's (the same plan builds the same groups); RaycptError otherwise."""
    names = {id(p): n for n, p in model.named_parameters()}
    saved, live = sd.get("param_groups", []), optimizer.param_groups
    if [len(g["params"]) for g in saved] != [len(g["params"]) for g in live]:
        raise RaycptError("the checkpoint's optimizer groups do not match this plan's "
                          f"({[len(g['params']) for g in saved]} vs {[len(g['params']) for g in live]} tensors): "
                          "resume it with the plan and train.distributed it was written with")
    number = {k: names[id(p)] for gs, gl in zip(saved, live) for k, p in zip(gs["params"], gl["params"])}
    return {"state": {number[k]: v for k, v in sd.get("state", {}).items()},
            "param_groups": [{**gs, "params": [number[k] for k in gs["params"]]} for gs in saved]}


def load_optim_state(model, optimizer, sd: dict, fsdp: bool) -> None:
    """Restore an optimizer from a checkpoint written by DDP (numbered) or FSDP (by name), under either."""
    if not fsdp and not _keyed_by_name(sd):
        optimizer.load_state_dict(sd)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    if not _keyed_by_name(sd):
        sd = optim_state_by_name(model, optimizer, sd)
    set_optimizer_state_dict(model, optimizer, optim_state_dict=sd, options=StateDictOptions(full_state_dict=True))


_model_state, _optim_state, _load_optim_state = model_state, optim_state, load_optim_state  # the old names


def save_model_folder(model, tokenizer, state_dict: Optional[dict], out: Path,
                      dtype: Optional[torch.dtype] = None) -> Path:
    """HF safetensors folder + tokenizer; ``dtype`` casts the floating weights (and says so in
    ``config.json``, so ``from_pretrained`` loads them as they are)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if dtype is not None and dtype != torch.float32:
        state_dict = state_dict if state_dict is not None else model.state_dict()
        state_dict = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() else v)
                      for k, v in state_dict.items()}
    model.save_pretrained(out, state_dict=state_dict, safe_serialization=True)
    if dtype is not None and dtype != torch.float32:  # save_pretrained writes the in-memory model's dtype
        conf = json.loads((out / "config.json").read_text(encoding="utf-8"))
        conf["dtype"] = str(dtype).replace("torch.", "")
        (out / "config.json").write_text(json.dumps(conf, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
    return out


def save_model_by_reference(model, tokenizer, state_dict: dict, out: Path, dtype: torch.dtype, shards) -> dict:
    """:func:`save_model_folder` whose weights equal to the base bit for bit are links to the base model's
    per-layer ``shards`` (:mod:`raycpt.models.shards`, in ``dtype``); the rest in one file, an index naming every
    tensor's file. ``out``'s final place must sit at the same depth (a sibling folder renamed into place).
    Returns the links' manifest entries (their sha256 as the shards recorded and checked it)."""
    why = shards_problem(shards)
    if why is not None:
        raise RaycptError(f"the base shards {shards} do not verify ({why}): remove that folder and run again")
    groups = read_shards(shards)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_model_folder(model, tokenizer, {}, out, dtype=dtype)  # config, generation config, tokenizer; no weights
    base_names = {t for g in groups.values() for t in g["tensors"]}
    seen, tensors = {}, {}
    for k, v in state_dict.items():  # a tied name (lm_head.weight) the base stores once is dropped, as HF does
        key = (v.data_ptr(), tuple(v.shape))
        if k not in base_names and key in seen:
            continue
        seen.setdefault(key, k)
        tensors[k] = v.detach().to("cpu", dtype) if v.is_floating_point() else v.detach().cpu()
    return write_referencing_weights(tensors, Path(shards), groups, out, out)


def write_checkpoint(folder, *, model, tokenizer, msd: dict, osd: dict, scheduler_state: dict, rngs: list[dict],
                     step: int, history: list[float], plan: dict, plan_text: str, data_pos: dict,
                     dtype: torch.dtype = torch.float32, base_shards=None) -> Path:
    """Write a complete checkpoint into ``folder`` (see the module docstring), manifest last. ``base_shards``:
    ``model/`` links the layers equal to the base to its shards (:func:`save_model_by_reference`; ``folder``
    is renamed to a sibling afterwards, so the relative links hold).

    ``msd`` must be finite (the caller checks with :func:`all_finite`)."""
    folder = Path(folder)
    known = {}
    if base_shards is not None:
        links = save_model_by_reference(model, tokenizer, msd, folder / MODEL_DIR, dtype, base_shards)
        known = {f"{MODEL_DIR}/{rel}": meta for rel, meta in links.items()}
    else:
        save_model_folder(model, tokenizer, msd, folder / MODEL_DIR, dtype=dtype)
    rng_tensors, rng_plain = split_rng(rngs)
    tensors = {"optimizer": osd, "scheduler": scheduler_state, "rng": rng_tensors}  # osd None: a final checkpoint
    lora, lisa = plan.get("adapter") == "lora", int(plan.get("lisa_layers") or 0) > 0
    if lora:  # model/ holds the merged weights; the adapters in peft's layout, for resume and for users
        save_adapter_folder(model, folder / ADAPTER_DIR, LayerPlan.from_dict(plan))
    if dtype != torch.float32 or lora:  # the float32 master weights of what trains (the rest is the base model)
        # LISA: every layer may have trained in an earlier interval, so all of them; LoRA: what trains besides the
        # adapters (embeddings, norm, head as the plan says; model/ is merged, so a resume starts from the base)
        names = {n for n, p in model.named_parameters() if p.requires_grad or lisa}
        tensors["master"] = {k: v.detach().to("cpu", torch.float32) for k, v in msd.items() if k in names}
    torch.save(tensors, folder / STATE_PT)
    summary = {"step": step, "loss": history[-1] if history else None, "data": data_pos, "plan": plan_text,
               "plan_dict": plan, "losses": list(history), "rng": rng_plain,
               "weights_dtype": str(dtype).replace("torch.", ""), "time": time.time()}
    (folder / STATE_JSON).write_text(json.dumps(json_safe(summary), indent=2, allow_nan=False), encoding="utf-8")
    write_manifest(folder, step, finite=True, extra={"weights_dtype": summary["weights_dtype"]}, known=known)
    return folder


def read_train_state(folder) -> dict:
    """The state a resume needs, loaded without unpickling code: ``train_state.pt`` with
    ``weights_only=True`` merged with ``train_state.json`` (keys: step, optimizer, scheduler, rng
    (per rank), losses, data, master (or None), weights_dtype)."""
    folder = Path(folder)
    try:
        tensors = torch.load(folder / STATE_PT, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - pickle.UnpicklingError for anything beyond tensors/containers
        raise RaycptError(f"checkpoint {folder}: {STATE_PT} holds more than tensors and plain containers, "
                          f"refused ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
    meta = json.loads((folder / STATE_JSON).read_text(encoding="utf-8"))
    return {"step": int(meta["step"]), "optimizer": tensors["optimizer"], "scheduler": tensors["scheduler"],
            "rng": merge_rng(tensors.get("rng") or {"torch": []}, meta.get("rng") or []),
            "losses": [float(x) for x in meta.get("losses", [])], "data": meta.get("data"),
            "master": tensors.get("master"), "weights_dtype": meta.get("weights_dtype", "float32")}


def load_master_weights(model, master: dict) -> None:
    """Put the float32 master copies (a bf16 checkpoint's trainable parameters) into ``model``."""
    params = dict(model.named_parameters())
    missing = [k for k in master if k not in params]
    if missing:
        raise RaycptError(f"checkpoint master weights name parameters this model lacks: {missing[:3]}")
    with torch.no_grad():
        for k, v in master.items():
            params[k].copy_(v)


@contextlib.contextmanager
def disk_errors_as_oserror(folder):
    """A write into ``folder`` that fails as a full disk or an unwritable folder, told in words only
    (:func:`raycpt.errors.oserror_in_words`) or as torch.save's bare ``RuntimeError`` on a file system with no
    space left (:func:`raycpt.errors.disk_full`), raises that ``OSError`` instead (the one line)."""
    try:
        yield
    except Exception as e:  # noqa: BLE001 - only a disk that refused is translated
        err = errors.oserror_in_words(e, folder)
        if isinstance(e, OSError) and e.errno is not None and not e.filename:  # pyarrow's: the errno, no path
            err = OSError(e.errno, e.strerror or os.strerror(e.errno), str(folder))
        if err is None and not isinstance(e, OSError) and errors.disk_full(folder):
            err = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(folder))
        if err is None:
            raise
        raise err from e


def checkpoint(session, model, wrapped, tokenizer, optimizer, scheduler, step, history, plan, fsdp, data_pos,
               metrics, dtype: torch.dtype = torch.float32, before_write=None, final: bool = False) -> Optional[str]:
    """Every rank calls this (state gathering may be collective); rank 0 writes, all report.

    Returns None when written, else why not (non-finite weights: nothing is written or reported). A write that
    fails (a full disk) removes its half-written folder. ``before_write(folder)``: a test's fault, on rank 0.
    ``final``: the run's last checkpoint, deleted when the run finishes: no optimizer state (every rank skips
    gathering it alike)."""
    if plan.adapter == "lora":  # the merged weights (DDP / one worker: LoRA never runs under FSDP)
        msd = merged_state_dict(model)
    else:
        msd = model_state(model, wrapped, fsdp)
    bad, total = all_finite(msd) if session.rank == 0 else (0, 0)
    bad, total = session.all_gather_object((bad, total))[0]
    if bad:
        del msd
        return f"{bad} of {total} weight tensors are not finite"
    osd = None if final else optim_state(wrapped, optimizer, fsdp)
    rngs = session.all_gather_object(rng_state())
    tmp = None
    if session.rank == 0:
        scratch = getattr(session, "checkpoint_scratch", lambda: None)()
        tmp = tempfile.mkdtemp(prefix=f".raycpt-ckpt-{step:06d}-" if scratch else f"raycpt-ckpt-{step:06d}-",
                               dir=scratch)
    try:
        if tmp is not None:
            if before_write is not None:
                before_write(tmp)
            with disk_errors_as_oserror(tmp):
                write_checkpoint(tmp, model=model, tokenizer=tokenizer, msd=msd, osd=osd,
                                 scheduler_state=scheduler.state_dict(), rngs=rngs, step=step, history=history,
                                 plan=plan.to_dict(), plan_text=plan.describe(), data_pos=data_pos, dtype=dtype,
                                 base_shards=getattr(session, "base_shards", None))
        del msd, osd
        session.report(metrics, tmp, step)
    finally:
        if tmp is not None and os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return None
